-- test_groups.lua: sub-groups as a data x pipeline grid (2 x 2 at 4 ranks,
-- 1 x 2 at 2): collectives within rows and columns, global roots and peers,
-- group ranks in the order given, and the errors of non-members, of roots
-- and peers outside the group, of bad rank lists, and (debug mode) of ranks
-- that give new_group different lists.
--   LUA_PATH='tests/dist/?.lua;;' \
--     mpirun -np 4 --oversubscribe build/graphcap --device host tests/dist/test_groups.lua

local gc = require "graphcap"
local T = require "harness"

gc.dist.init()
local rank, n = gc.dist.rank(), gc.dist.world_size()
assert(n % 2 == 0, "run with an even number of ranks")
local row, col = rank // 2, rank % 2

-- every rank makes every group, in one order (new_group is collective)
local rows, cols = {}, {}
for r = 0, n // 2 - 1 do rows[r] = gc.dist.new_group({2 * r, 2 * r + 1}) end
for c = 0, 1 do
  local ranks = {}
  for r = 0, n // 2 - 1 do ranks[#ranks + 1] = 2 * r + c end
  cols[c] = gc.dist.new_group(ranks)
end
local mine_row, mine_col = rows[row], cols[col]

T.test("group rank, size and ranks", function ()
  if mine_row:rank() ~= col or mine_row:size() ~= 2 then error("row group rank/size") end
  if mine_col:rank() ~= row or mine_col:size() ~= n // 2 then error("column group rank/size") end
  local rr = mine_row:ranks()
  if rr[1] ~= 2 * row or rr[2] ~= 2 * row + 1 then error("row group ranks") end
  for r, g in pairs(rows) do
    if r ~= row and g:rank() ~= -1 then error("a non-member's group rank is not -1") end
  end
end)

T.test("all_reduce within a row, all_gather within a column", function ()
  local t = gc.full({3}, rank + 1)
  gc.dist.all_reduce(t, {group = mine_row})
  local s = (2 * row + 1) + (2 * row + 2)
  T.eq(t, {s, s, s}, "row sum")
  local out = gc.zeros({n // 2, 2})
  gc.dist.all_gather(out, gc.tensor({rank, rank * 10}), {group = mine_col})
  local want = {}
  for r = 0, n // 2 - 1 do
    want[#want + 1] = 2 * r + col
    want[#want + 1] = (2 * r + col) * 10
  end
  T.eq(out, want, "column gather")
end)

T.test("broadcast in a column from a global root; send/recv in a row by global peer", function ()
  local root = (n // 2 - 1) * 2 + col -- the column's last rank
  local t = gc.full({2}, rank)
  gc.dist.broadcast(t, root, {group = mine_col})
  T.eq(t, {root, root}, "broadcast from " .. root)
  local peer = 2 * row + (1 - col)
  local got = gc.zeros({2})
  if col == 0 then
    gc.dist.send(gc.full({2}, rank + 0.5), peer, {group = mine_row})
  else
    gc.dist.recv(got, peer, {group = mine_row})
    T.eq(got, {peer + 0.5, peer + 0.5}, "recv from " .. peer)
  end
end)

T.test("group ranks follow the order given", function ()
  local rev = {}
  for r = n - 1, 0, -1 do rev[#rev + 1] = r end
  local g = gc.dist.new_group(rev)
  if g:rank() ~= n - 1 - rank then error("reversed group rank") end
  local out = gc.zeros({n})
  gc.dist.all_gather(out, gc.tensor({rank}), {group = g})
  T.eq(out, rev, "gather in the reversed group")
end)

T.test("errors: non-member, root/peer outside the group, bad rank lists", function ()
  local other = rows[(row + 1) % (n // 2)]
  if other ~= mine_row then
    T.fails(function () gc.dist.all_reduce(gc.ones({2}), {group = other}) end,
            {"all_reduce", "rank " .. rank .. " is not in the group"}, "non-member")
  end
  T.fails(function () gc.dist.broadcast(gc.ones({2}), 2 * row + 1 - col, {group = mine_col}) end,
          {"broadcast: root", "is not in the group"}, "root outside the column")
  T.fails(function () gc.dist.send(gc.ones({2}), n, {group = mine_row}) end,
          {"send: peer " .. n .. " is out of range (world size " .. n .. ")"}, "peer out of range")
  T.fails(function () gc.dist.recv(gc.ones({2}), rank) end,
          {"recv: peer " .. rank .. " is this rank itself"}, "recv from itself")
  T.fails(function () gc.dist.new_group({0, n}) end,
          {"new_group: ranks[2] = " .. n .. " is out of range"}, "new_group out of range")
  T.fails(function () gc.dist.new_group({1, 0, 1}) end,
          {"new_group: rank 1 is given twice"}, "new_group twice")
  T.fails(function () gc.dist.new_group({}) end, {"new_group"}, "empty new_group")
  T.fails(function () gc.dist.new_group({0.5}) end, {"new_group: ranks[1] must be a rank"},
          "new_group of a fraction")
  -- the groups still work after the failed calls
  local t = gc.ones({1})
  gc.dist.all_reduce(t, {group = mine_row})
  T.eq(t, {2}, "row sum after errors")
end)

T.test("debug mode: ranks giving new_group different lists are named", function ()
  gc.dist.set_debug(true)
  T.fails(function () gc.dist.new_group(rank == 0 and {0, 1} or {1, 0}) end,
          {"new_group: ranks disagree on the group (debug mode): rank 0 gave [0, 1]; rank 1 gave [1, 0]"},
          "order")
  T.fails(function () gc.dist.new_group(rank == 0 and {0} or {0, 1}) end,
          {"new_group: ranks disagree on the group (debug mode): rank 0 gave a list of 1, rank 1 of 2"},
          "size")
  local g = gc.dist.new_group({1, 0})
  if g:rank() ~= (rank == 1 and 0 or rank == 0 and 1 or -1) then error("agreed group in debug mode") end
  gc.dist.set_debug(false)
end)

T.done()
