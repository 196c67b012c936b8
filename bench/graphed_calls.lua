-- graphed_calls.lua: n pairs of graphed calls of the scaling run's model
-- (Linear(64, 64) + GELU, batch 8): one under no_grad, one with backward.
-- For instruction counts of the call path; the cost of one pair is the
-- difference of two runs divided by the difference of their n:
--   valgrind --tool=callgrind build/graphcap bench/graphed_calls.lua 200
--   valgrind --tool=callgrind build/graphcap bench/graphed_calls.lua 400
-- Usage: graphcap bench/graphed_calls.lua [n = 100]
local gc = require "graphcap"

local n = tonumber(arg[1]) or 100
local m = gc.nn.Sequential(gc.nn.Linear(64, 64), gc.nn.GELU())
local graphed = gc.make_graphed_callables(m, {gc.randn({8, 64}, {requires_grad = true})})
local h = gc.randn({8, 64}, {requires_grad = true})
local gout = gc.ones({8, 64})
gc.no_grad(function () for _ = 1, n do graphed(h) end end)
for _ = 1, n do graphed(h):backward(gout) end
gc.synchronize()
