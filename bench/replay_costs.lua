-- replay_costs.lua: the host time of each piece of a graphed callable's
-- replay, through the Lua API, on the scaling run's model (Linear(64, 64) +
-- GELU, batch 8): a graph launch, a tensor copy, a graphed forward alone
-- (copy-in and the forward graph), and a graphed forward + backward.
-- Each is the best of reps runs of n calls, timed to completion, in us.
-- Usage: graphcap bench/replay_costs.lua [n = 2000] [reps = 5]
local gc = require "graphcap"

local n, reps = tonumber(arg[1]) or 2000, tonumber(arg[2]) or 5

local function per_call (fn)
  local best = math.huge
  for _ = 1, reps do
    gc.synchronize()
    local t0 = gc.clock()
    for _ = 1, n do fn() end
    gc.synchronize()
    best = math.min(best, gc.clock() - t0)
  end
  return best * 1e6 / n
end

local x, y = gc.randn({8, 64}), gc.zeros({8, 64})
local g = gc.Graph()
g:capture(function () y:copy_(x) end)
local launch = per_call(function () g:replay() end)
local copy = per_call(function () y:copy_(x) end)

local m = gc.nn.Sequential(gc.nn.Linear(64, 64), gc.nn.GELU())
local graphed = gc.make_graphed_callables(m, {gc.randn({8, 64}, {requires_grad = true})})
local h = gc.randn({8, 64}, {requires_grad = true})
local fwd = per_call(function () gc.no_grad(function () graphed(h) end) end)
local gout = gc.ones({8, 64})
local fwd_bwd = per_call(function () graphed(h):backward(gout) end)
print(("%s: graph launch %.2f us, copy %.2f us, graphed forward (no grad) %.2f us, "
       .. "graphed forward + backward %.2f us"):format(gc.device(), launch, copy, fwd, fwd_bwd))
