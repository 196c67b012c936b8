-- test_fp8_amax.lua: an FP8 autocast with an amax_reduction_group, on the
-- host backend at the world size mpirun gives (2 and 4 in make test). Each
-- rank feeds a Linear its own input, so the amaxes differ; the all-reduce
-- (max) before each scale update gives every rank the same scales and
-- histories, those of the largest amax, as TransformerEngine's does. Without
-- the group each rank keeps its own.
--   LUA_PATH='tests/dist/?.lua;;' \
--     mpirun -np 2 build/graphcap --device host tests/dist/test_fp8_amax.lua

local gc = require "graphcap"
local T = require "harness"

gc.dist.init()
local rank, n = gc.dist.rank(), gc.dist.world_size()

-- A Linear(16, 16) from one seed on every rank, and rank r's input, whose
-- amax grows with r.
local function linear ()
  gc.manual_seed(3)
  return gc.nn.Linear(16, 16)
end
local function input (r)
  gc.manual_seed(10)
  return gc.rand({16, 16}) * (r + 1)
end

-- The largest magnitude of t's elements.
local function amax (t)
  local m = 0
  for _, v in ipairs(T.flat(t)) do m = math.max(m, math.abs(v)) end
  return m
end

-- Two steps of forward and backward under the autocast; the module's state.
local function steps (group)
  local m = linear()
  local recipe = gc.fp8.DelayedScaling{amax_history_len = 4}
  for _ = 1, 2 do
    gc.fp8.autocast({enabled = true, recipe = recipe, amax_reduction_group = group}, function ()
      m(input(rank)):sum():backward()
    end)
  end
  return m:fp8_state()
end

-- The numbers of a state as one flat sequence: each role's scale, then its
-- history, in a fixed order.
local function flat (st)
  local out = {}
  for _, role in ipairs({"input", "weight", "grad_output"}) do
    out[#out + 1] = st[role].scale
    for _, a in ipairs(st[role].amax_history) do out[#out + 1] = a end
  end
  return out
end

-- Every rank's flat state, gathered: a sequence of n sequences.
local function gather (v)
  local all = gc.zeros({n, #v})
  gc.dist.all_gather(all, gc.tensor(v))
  return all:tolist()
end

T.test("amax_reduction_group: every rank gets the same scales and histories", function ()
  local all = gather(flat(steps(gc.dist.world())))
  for r = 2, n do
    for i, v in ipairs(all[1]) do
      if all[r][i] ~= v then
        error(string.format("rank %d's value %d is %.9g, rank 0's %.9g", r - 1, i, all[r][i], v))
      end
    end
  end
end)

T.test("amax_reduction_group: the input's amax is the largest rank's", function ()
  local st = steps(gc.dist.world())
  local want = amax(input(n - 1))
  if st.input.amax_history[1] ~= want then
    error(string.format("input amax %.9g, want the last rank's %.9g", st.input.amax_history[1],
                        want))
  end
end)

T.test("without a group, each rank keeps its own input amax", function ()
  local st = steps(nil)
  local want = amax(input(rank))
  if st.input.amax_history[1] ~= want then
    error(string.format("rank %d: input amax %.9g, want its own %.9g", rank,
                        st.input.amax_history[1], want))
  end
end)

T.done()
gc.dist.finalize()
