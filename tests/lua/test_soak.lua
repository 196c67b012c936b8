-- test_soak.lua: make_graphed_callables over and over keeps memory flat:
-- reserved bytes, live objects and resident memory (/proc/self/statm) at the
-- end equal those a third of the way in. GRAPHCAP_SOAK scales the count
-- (default 1: 300 graphings; `make soak`: 1,500).
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_soak.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

local SCALE = math.tointeger(tonumber(os.getenv("GRAPHCAP_SOAK") or "1")) or 1

local function resident ()
  local f = io.open("/proc/self/statm")
  if not f then return 0 end
  local _, pages = f:read("n", "n")
  f:close()
  return (pages or 0) * 4096
end

local function mark ()
  local live = H.live()
  return {reserved = gc.memory_stats().reserved_bytes + live.pool_reserved_bytes,
          objects = live.objects, rss = resident()}
end

-- Graph make() (a fresh callable each time) n times, one forward and
-- backward through each result; compare the end with a third of the way in.
local function soak (what, make)
  local n = 300 * SCALE
  local a
  for i = 1, n do
    if i == n // 3 then a = mark() end
    local m = make()
    local G = gc.make_graphed_callables({m}, {{gc.randn({4, 8}, {requires_grad = true})}},
                                        {num_warmup_iters = 1})
    G[1](gc.randn({4, 8})):sum():backward()
  end
  local b = mark()
  local per = (b.rss - a.rss) / (n - n // 3)
  print(string.format("# %s: %d graphings, reserved %d -> %d, objects %d -> %d, resident %+.0f "
                      .. "bytes each", what, n, a.reserved, b.reserved, a.objects, b.objects, per))
  lu.assertEquals(b.reserved, a.reserved, what .. ": reserved bytes grew")
  lu.assertEquals(b.objects, a.objects, what .. ": live objects grew")
  -- resident memory: loose (the C allocator's own growth, ASan's quarantine); a stranded
  -- segment is 2 MiB
  lu.assertTrue(per < 65536, what .. ": resident memory grew " .. per .. " bytes per graphing")
end

TestSoak = {tearDown = H.no_capture_left}

function TestSoak:test_graphing_builtin_module ()
  soak("built-in Linear", function () return gc.nn.Linear(8, 8) end)
end

function TestSoak:test_graphing_lua_module ()
  local M = gc.nn.Module("Soaked")
  function M:init () self.lin = gc.nn.Linear(8, 8) end
  function M:forward (x) return gc.F.relu(self.lin(x)) end
  soak("Lua module", function () return M() end)
end

-- regression: each graphing of a Lua callable stranded a 2 MiB segment
-- 2,000 make_graphed_callables of a Lua function and of a Lua module keep
-- the ordinary allocator's reserved bytes flat (each used to strand the
-- 2 MiB segment of its warmup stream, held by a collectable tensor).
function TestSoak:test_graphing_lua_callables_keeps_reserved_flat ()
  local x = gc.randn({2, 4})
  local M = gc.nn.Module("Twice")
  function M:forward (v) return v * 2 end
  local callables = {function (v) return v * 2 end, M()}
  local first
  for i = 1, 2000 do
    local g = gc.make_graphed_callables(callables[i % 2 + 1], {x}, {num_warmup_iters = 1})
    g(x)
    g = nil -- luacheck: ignore 311 (for the collector)
    if i % 100 == 0 then
      collectgarbage()
      collectgarbage()
      local r = gc.memory_stats().reserved_bytes
      first = first or r
      lu.assertEquals(r, first, "reserved bytes after " .. i .. " graphings")
    end
  end
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
