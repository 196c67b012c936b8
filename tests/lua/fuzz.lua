-- fuzz.lua: what the fuzzers share (not a suite; require "fuzz"): the seed
-- and budget from the environment, and a seeded generator.
--   GRAPHCAP_FUZZ_SEED   the seed (default 1; `make fuzz` passes a new one)
--   GRAPHCAP_FUZZ_ITERS  the budget: operations or cases (each fuzzer has its default)
-- A failure message names the seed and the case, so that
--   GRAPHCAP_FUZZ_SEED=s LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_fuzz_*.lua
-- reproduces it.

local F = {}

F.seed = math.tointeger(tonumber(os.getenv("GRAPHCAP_FUZZ_SEED") or "1")) or 1

function F.budget (default)
  return math.tointeger(tonumber(os.getenv("GRAPHCAP_FUZZ_ITERS") or "")) or default
end

-- A generator of its own, seeded: F.rng(salt) -> r; r(n) in 1..n, r() in [0, 1).
function F.rng (salt)
  local st = (F.seed * 1103515245 + (salt or 0) * 2654435761 + 12345) & 0x7fffffffffffffff
  return function (n)
    st = (st * 6364136223846793005 + 1442695040888963407) & 0xffffffffffffffff
    local x = (st >> 11) / (1 << 53)
    if n then return 1 + math.floor(x * n) end
    return x
  end
end

-- Print the seed before the run, so that a crash's log has it too.
function F.announce (what)
  io.stdout:write(string.format("# GRAPHCAP_FUZZ_SEED=%d GRAPHCAP_FUZZ_ITERS: %s\n", F.seed, what))
  io.stdout:flush()
end

-- One entry of the list t.
function F.pick (r, t)
  return t[r(#t)]
end

-- A random layer list of one to three layers on width d, drawn from r: each
-- {"Linear", in, out, bias}, {"Dropout", p} (p from ps), or {kind, d} for
-- ReLU, GELU and LayerNorm; Linear widths in 2..maxw. Returns the list and
-- the width it ends with.
function F.random_layers (r, d, maxw, ps)
  local list = {}
  for _ = 1, r(3) do
    local kind = F.pick(r, {"Linear", "Linear", "ReLU", "GELU", "LayerNorm", "Dropout"})
    if kind == "Linear" then
      local o = r(maxw - 1) + 1
      list[#list + 1] = {kind, d, o, r(3) > 1}
      d = o
    elseif kind == "Dropout" then list[#list + 1] = {kind, F.pick(r, ps)}
    else list[#list + 1] = {kind, d} end
  end
  return list, d
end

-- "[Linear:4:3:true ReLU:3]" for each layer list of lists.
function F.describe_layers (lists)
  local parts = {}
  for k = 1, #lists do
    local ls = {}
    for _, l in ipairs(lists[k]) do
      local t = {}
      for j, v in ipairs(l) do t[j] = tostring(v) end
      ls[#ls + 1] = table.concat(t, ":")
    end
    parts[#parts + 1] = "[" .. table.concat(ls, " ") .. "]"
  end
  return table.concat(parts, " ")
end

-- The Sequential of a layer list (linear_opts: more options of each Linear).
function F.sequential (gc, list, linear_opts)
  local mods = {}
  for _, l in ipairs(list) do
    local opts = {bias = l[4]}
    for k, v in pairs(linear_opts or {}) do opts[k] = v end
    if l[1] == "Linear" then mods[#mods + 1] = gc.nn.Linear(l[2], l[3], opts)
    elseif l[1] == "Dropout" then mods[#mods + 1] = gc.nn.Dropout(l[2])
    elseif l[1] == "LayerNorm" then mods[#mods + 1] = gc.nn.LayerNorm(l[2])
    else mods[#mods + 1] = gc.nn[l[1]]() end
  end
  return gc.nn.Sequential(table.unpack(mods))
end

return F
