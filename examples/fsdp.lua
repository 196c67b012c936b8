-- fsdp.lua: sharded parameters on N ranks (mpirun -np N build/graphcap
-- examples/fsdp.lua; alone it runs as one rank). Each rank keeps 1/N of
-- every parameter and trains with Adam on its shards; before a layer's
-- forward its shards are gathered into the full parameter, after its
-- backward the grads are reduce-scattered into the shards' grads.
-- Checks: the layers graphed with capture_time_hooks doing the real un-shard
-- (the units share one arena), then run with the same work around each
-- replay, train to the eager values bit for bit; N ranks train to what one process does on
-- the whole batch (|a - b| <= 1e-5 + 1e-4 |b|: Adam divides each grad by its
-- running size, so a grad near zero that differs in its last bits, summed
-- in another order, moves its parameter by up to a few lr * 1e-4); the bytes of parameters,
-- grads and Adam state on a rank are at most 1/N of one process's plus what
-- the allocator's rounding adds to the optimizer's state (blocks are
-- multiples of 512 bytes: at most 512 for each of its 3 tensors a parameter);
-- the full parameters are one arena of the largest unit's size.
local gc = require "graphcap"

if not gc.dist.is_available() then  -- a build without MPI
  print("fsdp: graphcap was built without MPI")
  return
end
gc.dist.init()
local rank, N = gc.dist.rank(), gc.dist.world_size()
local ROWS, IN, HID, OUT, STEPS = 8, 64, 64, 32, 3
assert(ROWS % N == 0 and OUT % N == 0, "the world size must divide 8")

local function layers ()
  gc.manual_seed(9)
  return {gc.nn.Sequential(gc.nn.Linear(IN, HID), gc.nn.GELU()),
          gc.nn.Sequential(gc.nn.Linear(HID, HID), gc.nn.GELU()), gc.nn.Linear(HID, OUT)}
end

local function rows (width, phase, first, last)
  local t = {}
  for i = first, last do
    t[#t + 1] = {}
    for j = 1, width do t[#t][j] = math.sin(0.37 * (i * width + j) + phase) end
  end
  return gc.tensor(t)
end
local per = ROWS // N
local x, y = rows(IN, 0, rank * per + 1, (rank + 1) * per), rows(OUT, 1, rank * per + 1, (rank + 1) * per)

local function flat (ps)
  local v = {}
  for _, p in ipairs(ps) do
    for _, e in ipairs(p:view({p:numel()}):tolist()) do v[#v + 1] = e end
  end
  return v
end

-- STEPS Adam steps of the three calls on (input, target); the bytes of the
-- optimizer's state (allocated when it is made)
local function train (calls, params, input, target, finish)
  local before = gc.memory_stats().in_use_bytes
  local opt = gc.optim.Adam(params, {lr = 0.01})
  local state = gc.memory_stats().in_use_bytes - before
  for _ = 1, STEPS do
    opt:zero_grad()
    gc.F.mse_loss(calls[3](calls[2](calls[1](input))), target):backward()
    if finish then finish() end
    opt:step()
  end
  return state
end

-- eager: the units run their hooks around the modules
local E = gc.fsdp.shard(layers())
local adam_bytes = train(E.units, E:parameters(), x, y, function () E:finish_grads() end)
local mem = E:memory()

-- graphed: capture-time hooks un-shard before each capture
local G = gc.fsdp.shard(layers())
gc.make_graphed_callables(G.modules, {{gc.zeros({per, IN}, {requires_grad = true})},
  {gc.zeros({per, HID}, {requires_grad = true})}, {gc.zeros({per, HID}, {requires_grad = true})}},
  {capture_time_hooks = G:capture_time_hooks()})
train(G.units, G:parameters(), x, y, function () G:finish_grads() end)

local e, g = flat(E:parameters()), flat(G:parameters())
local same = #e == #g
for i = 1, #e do same = same and e[i] == g[i] end

-- one process on the whole batch; its shards are this rank's part of it
local one = layers()
local ps = {}
for _, l in ipairs(one) do for _, p in ipairs(l:parameters()) do ps[#ps + 1] = p end end
local one_adam = train(one, ps, rows(IN, 0, 1, ROWS), rows(OUT, 1, 1, ROWS))
local worst, close, k = 0, true, 0
for _, p in ipairs(ps) do
  local v, n = p:view({p:numel()}):tolist(), p:numel() // N
  for j = rank * n + 1, (rank + 1) * n do
    k = k + 1
    local d = math.abs(e[k] - v[j])
    worst = math.max(worst, d)
    close = close and d <= 1e-5 + 1e-4 * math.abs(v[j])
  end
end

local full = 0
for _, p in ipairs(ps) do full = full + 4 * p:numel() end
local mine = mem.shard_bytes + mem.shard_grad_bytes + adam_bytes
local whole = full + full + one_adam
local small = mine <= whole / N + 3 * 512 * #ps
-- the full parameters: one arena of the largest unit's (each padded to a
-- multiple of N), not the model's
local largest = 0
for _, l in ipairs(one) do
  local b = 0
  for _, p in ipairs(l:parameters()) do b = b + 4 * ((p:numel() + N - 1) // N * N) end
  largest = math.max(largest, b)
end
small = small and mem.full_bytes == largest and largest < full

print(("fsdp rank %d: params %d + grads %d + Adam %d = %d bytes; one process: %d (1/%d: %d); "
       .. "full parameters: one arena of %d (the largest unit; the model has %d)"):format(rank,
       mem.shard_bytes, mem.shard_grad_bytes, adam_bytes, mine, whole, N, whole // N,
       mem.full_bytes, full))
if rank == 0 then
  print(("fsdp: graphed shards %s the eager ones bit for bit"):format(
    same and "equal" or "DIFFER from"))
  print(("fsdp: %d ranks vs one process on the global batch: largest difference %.3g (%s)"):format(
    N, worst, close and "within 1e-5 + 1e-4|ref|" or "OUT OF TOLERANCE"))
end
gc.dist.finalize()
if not (same and close and small) then os.exit(1) end
