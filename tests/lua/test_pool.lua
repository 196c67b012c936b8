-- test_pool.lua: pools shared by graphs (docs/semantics.md, "Pools and the
-- replay-order check"): a shared pool reserves less than separate ones and each
-- graph still computes the right thing; the replay-order check (the canonical
-- G1/G3/G4 case); pool stats and the count of live graphs; graphs and pools
-- collected during a capture; a closed pool used again.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_pool.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
require "helpers"  -- also the check that no test leaves an object alive

-- Capture out = sum((x * k) * x) into pool p, through two temporaries that
-- go back to the pool as soon as they are closed.
local function capture_sum_kxx (g, p, x, k)
  local out
  g:capture(function ()
    local t <close> = x * k
    local u <close> = t * x
    out = u:sum()
  end, {pool = p})
  return out
end

-- The canonical case: shared pool p; G1 writes X and keeps it; G3 reads X
-- and drops it (its block is free again); G4 allocates a temporary, which
-- gets X's block, and writes it. g4_pool: G4's pool when not p.
local function canonical (g4_pool)
  local c = {x = gc.ones{256}, p = gc.graph_pool_handle()}
  c.g1, c.g3, c.g4 = gc.Graph(), gc.Graph(), gc.Graph()
  local X
  c.g1:capture(function () X = c.x * 2 end, {pool = c.p, name = "G1"})
  local px = X:data_ptr()
  c.g3:capture(function ()
    c.y = X * 10
    X:close()
    X = nil
  end, {pool = c.p, name = "G3"})
  c.g4:capture(function ()
    local T <close> = gc.full({256}, 7)
    c.reused = T:data_ptr() == px
    c.w = T:sum()
  end, {pool = g4_pool or c.p, name = "G4"})
  return c
end

TestPool = {}

function TestPool:tearDown ()
  gc.set_replay_check(true)
  lu.assertFalse(gc.is_capturing())
end

function TestPool:test_shared_pool_reserves_less ()
  local x = gc.ones{1024}
  local pa, pb, ps = gc.graph_pool_handle(), gc.graph_pool_handle(), gc.graph_pool_handle()
  local ga, gb, gc_, gd = gc.Graph(), gc.Graph(), gc.Graph(), gc.Graph()
  local oa = capture_sum_kxx(ga, pa, x, 2)      -- separate pools
  local ob = capture_sum_kxx(gb, pb, x, 3)
  local oc = capture_sum_kxx(gc_, ps, x, 2)     -- the same two graphs, one pool
  local od = capture_sum_kxx(gd, ps, x, 3)
  local sa, sb, ss = pa:stats(), pb:stats(), ps:stats()
  print(string.format("# reserved: shared pool %d bytes, separate pools %d + %d = %d bytes",
                      ss.reserved_bytes, sa.reserved_bytes, sb.reserved_bytes,
                      sa.reserved_bytes + sb.reserved_bytes))
  lu.assertTrue(sa.reserved_bytes > 0 and sb.reserved_bytes > 0)
  lu.assertTrue(ss.reserved_bytes < sa.reserved_bytes + sb.reserved_bytes)
  lu.assertEquals(ss.graphs, 2)
  for round = 1, 2 do                           -- capture order, new inputs
    x:fill_(round)
    gc_:replay(); gd:replay(); ga:replay(); gb:replay()
    local xx = 1024 * round * round
    lu.assertEquals(oc:item(), 2 * xx)
    lu.assertEquals(od:item(), 3 * xx)
    lu.assertEquals(oa:item(), 2 * xx)
    lu.assertEquals(ob:item(), 3 * xx)
  end
end

function TestPool:test_replay_order_check ()
  local c = canonical()
  lu.assertTrue(c.reused, "G4's temporary did not get X's freed block")
  for _ = 1, 2 do                               -- capture order, repeated
    c.g1:replay(); c.g3:replay(); c.g4:replay()
    lu.assertEquals(c.y:tolist()[1], 20)
    lu.assertEquals(c.w:item(), 7 * 256)
  end
  c.g1:replay(); c.g1:replay(); c.g3:replay(); c.g4:replay() -- G1 twice: fine
  c.x:fill_(3)
  c.g1:replay()
  c.g4:replay()
  local before = c.g3:stats().replays
  lu.assertErrorMsgContains("G3", c.g3.replay, c.g3)   -- names both graphs
  lu.assertErrorMsgContains("G4", c.g3.replay, c.g3)
  local _, msg = pcall(c.g3.replay, c.g3)
  print("# refused: " .. tostring(msg):gsub("\n", "\n# "))
  lu.assertEquals(c.g3:stats().replays, before)        -- refused replays do not count
  lu.assertEquals(c.y:tolist()[1], 20)                 -- and did not run
  c.g1:replay(); c.g3:replay()                         -- G1 rewrote X: fine again
  lu.assertEquals(c.y:tolist()[1], 60)
  c.g4:replay(); c.g1:replay(); c.g3:replay(); c.g4:replay()
  lu.assertEquals(c.y:tolist()[256], 60)
end

function TestPool:test_replay_check_off ()
  local c = canonical()
  lu.assertTrue(c.reused)
  gc.set_replay_check(false)
  c.g1:replay(); c.g4:replay(); c.g3:replay()          -- not checked:
  lu.assertEquals(c.y:tolist()[1], 70)                 -- G3 read G4's temporary
  gc.set_replay_check(true)
  c.g1:replay(); c.g3:replay(); c.g4:replay()
  lu.assertEquals(c.y:tolist()[1], 20)
  c.g1:replay(); c.g4:replay()
  lu.assertErrorMsgContains("G4", c.g3.replay, c.g3)   -- on again
end

function TestPool:test_replay_check_allows_disjoint ()
  local c = canonical(gc.graph_pool_handle())           -- G4 in a pool of its own
  lu.assertFalse(c.reused)
  c.g1:replay(); c.g4:replay(); c.g3:replay()
  lu.assertEquals(c.y:tolist()[1], 20)
  c.g4:replay(); c.g3:replay()
  lu.assertEquals(c.y:tolist()[1], 20)
  lu.assertEquals(c.w:item(), 7 * 256)
end

function TestPool:test_pool_stats_and_graph_count ()
  local p = gc.graph_pool_handle()
  local s = p:stats()
  for _, k in ipairs{"reserved_bytes", "in_use_bytes", "peak_bytes", "blocks", "graphs"} do
    lu.assertEquals(type(s[k]), "number", k)
  end
  lu.assertEquals(s.in_use_bytes, 0)
  lu.assertEquals(s.blocks, 0)
  lu.assertEquals(s.graphs, 0)
  local g1, g2, g3 = gc.Graph(), gc.Graph(), gc.Graph()
  local y1, y2, y3
  g1:capture(function () y1 = gc.full({256}, 1) end, {pool = p})
  g2:capture(function () y2 = gc.full({256}, 2) end, {pool = p})
  g3:capture(function () y3 = gc.full({256}, 3) end, {pool = p})
  lu.assertIs(g1:pool(), p)
  s = p:stats()
  lu.assertEquals(s.graphs, 3)
  lu.assertEquals(s.blocks, 3)
  lu.assertTrue(s.in_use_bytes >= 3 * 1024)
  lu.assertTrue(s.reserved_bytes >= s.in_use_bytes and s.peak_bytes >= s.in_use_bytes)
  lu.assertEquals(g1:stats().pool_bytes > 0, true)
  g1:reset()
  lu.assertEquals(p:stats().graphs, 2)
  g2:close()
  lu.assertEquals(p:stats().graphs, 1)
  g3 = nil                                     -- luacheck: ignore 311 (collected: no longer live)
  collectgarbage(); collectgarbage()
  lu.assertEquals(p:stats().graphs, 0)
  lu.assertEquals(p:stats().blocks, 3)         -- the outputs are alive
  y1:close(); y2:close(); y3:close()
  s = p:stats()
  lu.assertEquals(s.in_use_bytes, 0)
  lu.assertEquals(s.blocks, 0)
  lu.assertTrue(s.peak_bytes >= 3 * 1024)
end

-- A graph or pool the collector finalizes (or the script closes) during a
-- capture is destroyed only after the capture ends.
function TestPool:test_collected_during_capture ()
  local x = gc.tensor{1, 2, 3, 4}
  local gold, pold = gc.Graph(), gc.graph_pool_handle()
  local yold
  gold:capture(function () yold = x * 3 end, {pool = pold})
  gold:replay()
  local gclosed = gc.Graph()
  gclosed:capture(function () local _ = x + 1 end)
  local p = gc.graph_pool_handle()
  local g, z = gc.Graph(), nil
  g:capture(function ()
    local y = x * 2
    do local _ = gc.Graph() end                -- an empty graph, garbage at once
    gold, pold = nil, nil                      -- luacheck: ignore 311 (a captured graph and its pool)
    gclosed:close()
    p = nil                                    -- the handle of this capture's pool
    collectgarbage(); collectgarbage()
    lu.assertTrue(gc.is_capturing())
    z = y + x                                  -- the capture goes on
  end, {pool = p})
  lu.assertFalse(gc.is_capturing())
  g:replay()
  lu.assertEquals(z:tolist(), {3, 6, 9, 12})
  lu.assertEquals(yold:tolist(), {3, 6, 9, 12})  -- its memory lives on
  collectgarbage(); collectgarbage()
  g:replay()
  lu.assertEquals(z:tolist(), {3, 6, 9, 12})
  lu.assertEquals(g:pool():stats().graphs, 1)
end

-- Garbage eager tensors freed by the collector during a capture do not
-- disturb it (a free is not an allocation outside the pool).
function TestPool:test_eager_garbage_collected_during_capture ()
  local x = gc.tensor{1, 2, 3, 4}
  for _ = 1, 20 do local _ = gc.ones{64} + 1 end
  local g, y = gc.Graph(), nil
  g:capture(function ()
    collectgarbage(); collectgarbage()
    y = x * 2
  end)
  g:replay()
  lu.assertEquals(y:tolist(), {2, 4, 6, 8})
end

function TestPool:test_closed_pool ()
  local x = gc.ones{4}
  local p = gc.graph_pool_handle()
  local g, y = gc.Graph(), nil
  g:capture(function () y = x * 2 end, {pool = p})
  p:close()
  lu.assertErrorMsgContains("closed", p.stats, p)
  local h = gc.Graph()
  lu.assertErrorMsgContains("closed", h.capture, h, function () end, {pool = p})
  lu.assertFalse(gc.is_capturing())
  p:close()
  g:replay()                                    -- the graph keeps its pool
  lu.assertEquals(y:tolist(), {2, 2, 2, 2})
  do
    local q <close> = gc.graph_pool_handle()
    local w
    h:capture(function () w = x * 3 end, {pool = q})  -- h was not disturbed
    h:replay()
    lu.assertEquals(w:tolist(), {3, 3, 3, 3})
  end
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
