-- replay_overhead.lua: the cost of launching 1,000 small ops eagerly against
-- replaying them as one captured graph, both timed to completion, per op.
-- Usage: graphcap bench/replay_overhead.lua [ops = 1000] [reps = 20]
local gc = require "graphcap"

local nops = tonumber(arg[1]) or 1000
local reps = tonumber(arg[2]) or 20
local x = gc.ones({256})
local acc = gc.zeros({256})

local function work()          -- nops tiny kernels: acc = acc * 0.5 + x, alternating
  local y = acc
  for i = 1, nops // 2 do
    y = y * 0.5
    y = y + x
  end
  acc:copy_(y)
end

local function time(fn)        -- best of reps, to completion, in us per op
  local best = math.huge
  for _ = 1, reps do
    gc.synchronize()
    local t0 = gc.clock()
    fn()
    gc.synchronize()
    best = math.min(best, gc.clock() - t0)
  end
  return best * 1e6 / nops
end

work()                         -- warm up (kernel loading, allocator)
local eager = time(work)
local g = gc.Graph()
g:capture(work)
g:replay()
local replay = time(function() g:replay() end)
print(("%s: %d ops, eager %.3f us/op, replay %.3f us/op, replay/eager %.3f (graph: %d nodes)")
      :format(gc.device(), nops, eager, replay, replay / eager, g:stats().nodes))
