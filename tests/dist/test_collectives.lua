-- test_collectives.lua: every collective's values on the host backend, at
-- the world size mpirun gives (2 and 4 in make test): all_reduce (sum, avg,
-- max; f32 bitwise against a float fold in rank order, bf16), all_gather,
-- reduce_scatter, broadcast from each root, send/recv around a ring, and
-- the all_reduce result equal on every rank bit for bit.
--   LUA_PATH='tests/dist/?.lua;;' \
--     mpirun -np 2 build/graphcap --device host tests/dist/test_collectives.lua

local gc = require "graphcap"
local T = require "harness"

gc.dist.init()
local rank, n = gc.dist.rank(), gc.dist.world_size()
local M = 5

-- x rounded to float, as f32 storage holds it
local function f32 (x) return (string.unpack("f", string.pack("f", x))) end

-- rank r's contribution: M floats that no power of two scales into another
local function x_of (r)
  local v = {}
  for i = 1, M do v[i] = f32((r + 1) / 7 + (i - 1) * 0.3 - (r % 2) * 1.25) end
  return v
end

-- the fold of every rank's x_of(r)[i] in rank order, in float
local function fold (op)
  local out = {}
  for i = 1, M do
    local acc = x_of(0)[i]
    for r = 1, n - 1 do
      local x = x_of(r)[i]
      if op == "max" then acc = math.max(acc, x) else acc = f32(acc + x) end
    end
    out[i] = op == "avg" and f32(acc / n) or acc
  end
  return out
end

for _, op in ipairs({"sum", "avg", "max"}) do
  T.test("all_reduce " .. op .. " f32: the float fold in rank order, bit for bit", function ()
    local t = gc.tensor(x_of(rank))
    gc.dist.all_reduce(t, op ~= "sum" and {op = op} or nil)
    T.eq(t, fold(op), "all_reduce " .. op)
  end)
end

T.test("all_reduce bf16: small integers, exact", function ()
  local t = gc.full({2, 3}, rank + 1, {dtype = "bf16"})
  gc.dist.all_reduce(t, {op = "sum"})
  local want = {}
  for i = 1, 6 do want[i] = n * (n + 1) / 2 end
  T.eq(t, want, "bf16 sum")
  if t:dtype() ~= "bf16" then error("the dtype changed") end
end)

T.test("all_reduce: every rank holds the same bits", function ()
  local t = gc.tensor(x_of(rank))
  gc.dist.all_reduce(t, {op = "avg"})
  local all = gc.zeros({n, M})
  gc.dist.all_gather(all, t)
  local got = T.flat(all)
  for r = 1, n - 1 do
    for i = 1, M do
      if got[r * M + i] ~= got[i] then
        error(string.format("rank %d's element %d differs from rank 0's", r, i))
      end
    end
  end
end)

T.test("all_gather: every rank's t, rank-major, into an out of any shape", function ()
  local out = gc.zeros({n, M})
  gc.dist.all_gather(out, gc.tensor(x_of(rank)))
  local want = {}
  for r = 0, n - 1 do for _, v in ipairs(x_of(r)) do want[#want + 1] = v end end
  T.eq(out, want, "all_gather")
  local flat = gc.zeros({n * M})
  gc.dist.all_gather(flat, gc.tensor(x_of(rank)))
  T.eq(flat, want, "all_gather into a 1-D out")
end)

T.test("reduce_scatter: this rank's chunk, summed in rank order", function ()
  local big = {}
  for j = 0, n - 1 do          -- chunk j of this rank's t: x_of(rank) shifted by j
    for i = 1, M do big[#big + 1] = f32(x_of(rank)[i] + j) end
  end
  local out = gc.zeros({M})
  gc.dist.reduce_scatter(out, gc.tensor(big))
  local want = {}
  for i = 1, M do
    local acc = f32(x_of(0)[i] + rank)
    for r = 1, n - 1 do acc = f32(acc + f32(x_of(r)[i] + rank)) end
    want[i] = acc
  end
  T.eq(out, want, "reduce_scatter sum")
  local mx = gc.zeros({M})
  gc.dist.reduce_scatter(mx, gc.tensor(big), {op = "max"})
  for i = 1, M do
    local acc = f32(x_of(0)[i] + rank)
    for r = 1, n - 1 do acc = math.max(acc, f32(x_of(r)[i] + rank)) end
    want[i] = acc
  end
  T.eq(mx, want, "reduce_scatter max")
end)

T.test("broadcast: root's t on every rank, for each root", function ()
  for root = 0, n - 1 do
    local t = gc.tensor(x_of(rank))
    gc.dist.broadcast(t, root)
    T.eq(t, x_of(root), "broadcast from " .. root)
  end
end)

T.test("send/recv around a ring (even ranks send first)", function ()
  local to, from = (rank + 1) % n, (rank - 1) % n
  local got = gc.zeros({M})
  if rank % 2 == 0 then
    gc.dist.send(gc.tensor(x_of(rank)), to)
    gc.dist.recv(got, from)
  else
    gc.dist.recv(got, from)
    gc.dist.send(gc.tensor(x_of(rank)), to)
  end
  T.eq(got, x_of(from), "recv from " .. from)
end)

T.test("rank, world_size, local_rank, the world group", function ()
  local w = gc.dist.world()
  if w:size() ~= n or w:rank() ~= rank then error("the world group is not the world") end
  if gc.dist.world() ~= w then error("gc.dist.world() is not one value") end
  local lr = gc.dist.local_rank()
  if lr < 0 or lr >= n then error("local rank " .. lr .. " out of range") end
  for i, r in ipairs(w:ranks()) do
    if r ~= i - 1 then error("world ranks out of order") end
  end
end)

T.done()
