-- basics.lua: capture a few ops into graphs that share a pool, replay them,
-- and watch the engine refuse a replay order that would corrupt memory.
local gc = require "graphcap"

print(("graphcap %s on the %s backend"):format(gc.version(), gc.device()))

local x = gc.tensor({{1, 2, 3}, {4, 5, 6}})   -- static input: replays read what it holds
local w = gc.tensor({0.5, -1, 2})             -- a row, broadcast over x's rows
local pool = gc.graph_pool_handle()           -- one private pool for both graphs

local h, total
local g1, g2 = gc.Graph(), gc.Graph()
g1:capture(function() h = x * w + 1 end, {pool = pool, name = "affine"})
g2:capture(function() total = (h * h):sum() end, {pool = pool, name = "energy"})

for step = 1, 3 do
  x:fill_(step)                               -- new data into the static input
  g1:replay()                                 -- one launch each; h and total are rewritten
  g2:replay()
  print(("step %d: h[1] = {%s}, sum(h^2) = %g"):format(
    step, table.concat(h:tolist()[1], ", "), total:item()))
end

local ps, s1 = pool:stats(), g1:stats()
print(("pool: %d bytes reserved, %d graphs; 'affine': %d nodes, captured in %.3f ms")
      :format(ps.reserved_bytes, ps.graphs, s1.nodes, s1.capture_ms))

-- Graphs sharing a pool must replay in an order where none overwrites what
-- another still has to read. 'produce' keeps a; 'consume' reads a and frees
-- it; 'scratch', captured later, reuses a's memory for a temporary.
local a, s, pool2 = nil, nil, gc.graph_pool_handle()
local produce, consume, scratch = gc.Graph(), gc.Graph(), gc.Graph()
produce:capture(function() a = x * 3 end, {pool = pool2, name = "produce"})
consume:capture(function() s = a:sum(); a:close() end, {pool = pool2, name = "consume"})
scratch:capture(function() local t = x * 5; t:fill_(0) end, {pool = pool2, name = "scratch"})
produce:replay(); consume:replay(); scratch:replay()
print(("capture order: sum(3x) = %g"):format(s:item()))
produce:replay(); scratch:replay()
local ok, err = pcall(consume.replay, consume)
print("out of order: " .. (ok and "allowed?!" or err))
