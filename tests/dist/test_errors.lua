-- test_errors.lua: the errors of gc.dist that every rank raises alike (so
-- no rank is left waiting): calls before init, init twice, wrong dtypes
-- and sizes, bad options, closed tensors; _any's flags and counts; debug
-- mode naming the op and the ranks that disagree (collectives, any, barrier
-- and finalize, send/recv); everything still
-- usable afterwards; and after finalize, calls and replays of captured
-- collectives fail.
--   LUA_PATH='tests/dist/?.lua;;' \
--     mpirun -np 2 build/graphcap --device host tests/dist/test_errors.lua

local gc = require "graphcap"
local T = require "harness"

-- before init: no T.test (its barrier needs init)
assert(not gc.dist.is_initialized())
for _, call in ipairs({
  {"rank", function () return gc.dist.rank() end},
  {"all_reduce", function () gc.dist.all_reduce(gc.ones({2})) end},
  {"barrier", function () gc.dist.barrier() end},
  {"new_group", function () gc.dist.new_group({0}) end},
  {"set_debug", function () gc.dist.set_debug(true) end},
  {"finalize", function () gc.dist.finalize() end},
}) do
  local ok, err = pcall(call[2])
  assert(not ok and err:find(call[1] .. ": the distributed runtime is not initialised", 1, true)
         and err:find("test_errors.lua", 1, true), tostring(err))
end
assert(gc.dist.world() == nil)

gc.dist.init()
local rank, n = gc.dist.rank(), gc.dist.world_size()

T.test("init twice, and options of init", function ()
  T.fails(function () gc.dist.init() end, {"init: the distributed runtime is already initialised"},
          "init twice")
  T.fails(function () gc.dist.init({backend = "nccl"}) end, {"init: unknown option 'backend'"},
          "init option")
end)

T.test("dtype and size errors name the op and the sizes", function ()
  local t = gc.ones({3})
  T.fails(function () gc.dist.all_gather(gc.zeros({3 * n}, {dtype = "bf16"}), t) end,
          {"all_gather: out is bf16 and t is f32"}, "all_gather dtype")
  T.fails(function () gc.dist.all_gather(gc.zeros({3 * n + 1}), t) end,
          {"all_gather: out has " .. (3 * n + 1) .. " elements, expected " .. 3 * n}, "all_gather size")
  T.fails(function () gc.dist.reduce_scatter(gc.zeros({2}), gc.zeros({2 * n + 1})) end,
          {"reduce_scatter: t has " .. (2 * n + 1) .. " elements, expected " .. 2 * n},
          "reduce_scatter size")
  T.fails(function () gc.dist.reduce_scatter(gc.zeros({3}, {dtype = "bf16"}), gc.zeros({3 * n})) end,
          {"reduce_scatter: out is bf16 and t is f32"}, "reduce_scatter dtype")
end)

T.test("bad arguments and options", function ()
  T.fails(function () gc.dist.all_reduce(gc.ones({2}), {op = "min"}) end,
          {"all_reduce: op must be \"sum\", \"avg\" or \"max\", got \"min\""}, "op")
  T.fails(function () gc.dist.all_reduce(gc.ones({2}), {grp = 1}) end,
          {"all_reduce: unknown option 'grp'"}, "option")
  T.fails(function () gc.dist.broadcast(gc.ones({2}), "0") end,
          {"broadcast: root must be a rank (an integer), got string"}, "root type")
  T.fails(function () gc.dist.broadcast(gc.ones({2}), -1) end,
          {"broadcast: root -1 is out of range (world size " .. n .. ")"}, "root range")
  local c = gc.ones({2})
  c:close()
  T.fails(function () gc.dist.all_reduce(c) end, {"closed"}, "closed tensor")
  T.fails(function () gc.dist.all_reduce(gc.ones({2}), {group = 3}) end, {"all_reduce"},
          "group not a group")
  T.fails(function () gc.dist.set_debug(1) end, {"boolean"}, "set_debug(1)")
end)

T.test("recv of more elements than were sent fails, naming both sizes", function ()
  -- pairs (0, 1), (2, 3): the even rank sends 2 elements, the odd one waits for 4
  local peer = rank % 2 == 0 and rank + 1 or rank - 1
  if peer >= n then return end
  if rank % 2 == 0 then
    gc.dist.send(gc.full({2}, 7), peer)
  else
    local t = gc.zeros({4})
    T.fails(function () gc.dist.recv(t, peer) end,
            {"recv: got 8 bytes from rank " .. peer .. ", expected 16 (t's 4 f32 elements)"},
            "short message")
  end
end)

T.test("any: flags or'd over the ranks, at once also while capturing; counts that differ fail everywhere", function ()
  -- flag k set on rank k only (k < n), and flag n + 1 on no rank
  local mine = {}
  for k = 1, n + 1 do mine[k] = k - 1 == rank end
  local got
  local g = gc.Graph()
  g:capture(function () got = gc.dist._any(mine) end)  -- no op of the stream: nothing recorded
  for k = 1, n do if got[k] ~= true then error("any: flag " .. k .. " is not set") end end
  if got[n + 1] ~= false or #got ~= n + 1 then error("any: the flag no rank set") end
  g:replay()
  T.fails(function () gc.dist._any(rank == 0 and {true} or {true, false}) end,
          {"any: the ranks of the group give different numbers of flags: rank 0 gives 1, rank 1 gives 2"},
          "flag counts")
  T.fails(function () gc.dist._any({true}, 3) end, {"any: group (argument #2) must be a gc.dist group"},
          "group")
  local t = gc.ones({2})
  gc.dist.all_reduce(t)
  T.eq(t, {n, n}, "all_reduce after any")
end)

T.test("debug mode names the op and the ranks that disagree", function ()
  gc.dist.set_debug(true)
  -- shapes: rank 0 [4], the others [2, 4]
  local t = rank == 0 and gc.ones({4}) or gc.ones({2, 4})
  local err = T.fails(function () gc.dist.all_reduce(t) end,
                      {"all_reduce: ranks of the group disagree (debug mode): rank 0 called all_reduce(sum) f32 [4]",
                       "called all_reduce(sum) f32 [2, 4]"}, "shape mismatch")
  if n > 2 and not err:find("ranks 1, 2", 1, true) then error("the ranks are not listed: " .. err) end
  -- ops: the last rank broadcasts while the others all_reduce
  local ok, e2 = pcall(function ()
    if rank == n - 1 then gc.dist.broadcast(gc.ones({4}), 0) else gc.dist.all_reduce(gc.ones({4})) end
  end)
  if ok or not e2:find("rank " .. (n - 1) .. " called broadcast f32 [4] root 0", 1, true) then
    error("op mismatch: " .. tostring(e2))
  end
  -- any takes part: a rank there while the others all_reduce is named
  local oka, ea = pcall(function ()
    if rank == n - 1 then gc.dist._any({true, false}) else gc.dist.all_reduce(gc.ones({4})) end
  end)
  if oka or not ea:find("rank " .. (n - 1) .. " called any of 2 flags", 1, true) then
    error("any against all_reduce: " .. tostring(ea))
  end
  -- barrier and finalize take part: a rank there is named, and finalize fails (still initialised)
  for _, call in ipairs({"barrier", "finalize"}) do
    local okc, ec = pcall(function ()
      if rank == n - 1 then gc.dist[call]() else gc.dist.all_reduce(gc.ones({4})) end
    end)
    if okc or not ec:find("rank " .. (n - 1) .. " called " .. call, 1, true)
       or not ec:find("called all_reduce(sum) f32 [4]", 1, true) then
      error(call .. " against all_reduce: " .. tostring(ec))
    end
    if not gc.dist.is_initialized() then error("a refused finalize finalized") end
  end
  -- send/recv: the pair disagrees on the element count
  if rank < 2 then
    local peer = 1 - rank
    local e3 = T.fails(function ()
      if rank == 0 then gc.dist.send(gc.ones({3}), peer) else gc.dist.recv(gc.zeros({5}), peer) end
    end, {"its peer rank " .. peer .. " called"}, "send/recv mismatch")
    if not e3:find(rank == 0 and "send: rank 0 called send f32 [3]" or "recv: rank 1 called recv f32 [5]", 1, true) then
      error("send/recv message: " .. e3)
    end
  end
  -- agreeing calls pass, in debug mode too
  local u = gc.ones({4})
  gc.dist.all_reduce(u)
  T.eq(u, {n, n, n, n}, "all_reduce in debug mode")
  gc.dist.set_debug(false)
end)

T.final("after finalize: calls fail, and so do replays of captured collectives", function ()
  local x = gc.ones({2})
  local g = gc.Graph()
  g:capture(function () gc.dist.all_reduce(x) end)
  g:replay()
  T.eq(x, {n, n}, "replayed before finalize")
  local grp = gc.dist.world()
  gc.dist.finalize()
  assert(not gc.dist.is_initialized())
  T.fails(function () gc.dist.all_reduce(x) end,
          {"all_reduce: the distributed runtime is not initialised (it was finalized)"}, "after")
  T.fails(function () g:replay() end, {"all_reduce: the distributed runtime was finalized"},
          "replay after finalize")
  T.fails(function () gc.dist.init() end, {"init: the distributed runtime was finalized"},
          "init after finalize")
  T.fails(function () gc.dist.finalize() end, {"finalize"}, "finalize twice")
  if grp:size() ~= n then error("a group handle after finalize") end
end)
