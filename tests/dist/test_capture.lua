-- test_capture.lua: collectives captured into graphs on the host backend
-- (recorded as nodes, run at each replay): replays with new inputs equal
-- the eager run bit for bit; send/recv between stages replay in step; the
-- replay-order check sees a collective's write; what capture forbids
-- (barrier, new_group, finalize) is refused; the graph dump names the collectives.
--   LUA_PATH='tests/dist/?.lua;;' \
--     mpirun -np 2 build/graphcap --device host tests/dist/test_capture.lua

local gc = require "graphcap"
local T = require "harness"

gc.dist.init()
local rank, n = gc.dist.rank(), gc.dist.world_size()

-- rank's input of step s
local function input (s)
  local v = {}
  for i = 1, 6 do v[i] = (rank + 1) * 0.37 + s * 1.1 - i * 0.21 end
  return gc.tensor(v)
end

-- The step: h = x * x, averaged over the ranks, gathered, and a loss of the
-- gather reduce-scattered back; returns the tensors it leaves.
local function step (x)
  local h = x * x
  gc.dist.all_reduce(h, {op = "avg"})
  local all = gc.zeros({n, 6})
  gc.dist.all_gather(all, h)
  local back = gc.zeros({6})
  local big = gc.zeros({n * 6})
  gc.dist.all_gather(big, x + h)
  gc.dist.reduce_scatter(back, big * big, {op = "sum"}) -- n*6 / n = 6 per rank
  return h, all, back
end

T.test("captured collectives replay with new inputs, equal to eager bit for bit", function ()
  local x = input(0)
  local g = gc.Graph()
  local h, all, back
  g:capture(function () h, all, back = step(x) end)
  local nodes = g:stats().nodes
  if nodes < 5 then error("the graph holds " .. nodes .. " nodes; the collectives are missing") end
  for s = 1, 3 do
    x:copy_(input(s))
    g:replay()
    local eh, eall, eback = step(input(s))
    T.eq(h, T.flat(eh), "h at step " .. s)
    T.eq(all, T.flat(eall), "all at step " .. s)
    T.eq(back, T.flat(eback), "back at step " .. s)
  end
end)

T.test("send/recv captured on both sides replay in step", function ()
  local peer = rank % 2 == 0 and rank + 1 or rank - 1
  if peer >= n then return end
  local buf, out = gc.zeros({4}), nil
  local x = gc.full({4}, 0)
  local g = gc.Graph()
  g:capture(function ()
    if rank % 2 == 0 then gc.dist.send(x * 3, peer)
    else gc.dist.recv(buf, peer); out = buf + 1 end
  end)
  for s = 1, 3 do
    x:fill_(rank + s)
    g:replay()
    if rank % 2 == 1 then
      local want = {}
      for i = 1, 4 do want[i] = (peer + s) * 3 + 1 end
      T.eq(out, want, "stage output at step " .. s)
    end
  end
end)

T.test("the replay-order check sees a collective's write", function ()
  local x = gc.ones({64})
  local p = gc.graph_pool_handle()
  local g1, g2, g3 = gc.Graph(), gc.Graph(), gc.Graph()
  local h, z
  g1:capture(function () h = x * 2 end, {pool = p, name = "G1"})
  g2:capture(function () gc.dist.all_reduce(h) end, {pool = p, name = "AR"})
  g3:capture(function () z = h * 1 end, {pool = p, name = "G3"})
  g1:replay(); g2:replay(); g3:replay()
  T.eq(z:sum(), {64 * 2 * n}, "z after G1, AR, G3")
  g1:replay()
  T.fails(function () g3:replay() end, {"G3", "AR"}, "G3 without AR")
  g2:replay(); g3:replay()
end)

T.test("barrier, new_group, finalize during a capture are refused", function ()
  for _, call in ipairs({
    {"barrier", function () gc.dist.barrier() end},
    {"new_group", function () gc.dist.new_group({0}) end},
    {"finalize", function () gc.dist.finalize() end},
  }) do
    local g = gc.Graph()
    T.fails(function () g:capture(call[2]) end, {call[1]}, call[1] .. " in capture")
    if gc.is_capturing() then error("the capture is still open") end
    if not gc.dist.is_initialized() then error(call[1] .. " in capture finalized") end
  end
end)

T.test("the dump of a captured graph names its collectives", function ()
  local x = gc.ones({8})
  local g = gc.Graph()
  g:capture(function () gc.dist.all_reduce(x, {op = "max"}) end)
  local path = os.tmpname()
  g:debug_dump(path)
  local f = assert(io.open(path))
  local dot = f:read("a")
  f:close()
  os.remove(path)
  if not dot:find("all_reduce", 1, true) or not dot:find("op: max", 1, true) then
    error("the dump does not name the all_reduce: " .. dot)
  end
end)

T.done()
