-- pipeline_parallel.lua: a model of 2 x N layers on N pipeline stages
-- (mpirun -np 2 build/graphcap examples/pipeline_parallel.lua; alone it runs
-- as one stage), interleaved: stage r holds chunk 1 = layer r + 1 and chunk
-- 2 = layer N + r + 1, and runs Megatron's interleaved 1F1B order over 4
-- microbatches, sending activations forward and grads back with
-- gc.dist.send/recv. Checks: each stage's chunks graphed with that order
-- train to the eager values bit for bit; the stages together train to what
-- one process does with the whole model on the whole batch
-- (|a - b| <= 1e-6 + 1e-5 |b|).
local gc = require "graphcap"

if not gc.dist.is_available() then  -- a build without MPI
  print("pipeline_parallel: graphcap was built without MPI")
  return
end
gc.dist.init()
local rank, P = gc.dist.rank(), gc.dist.world_size()
local V, M, B, W, STEPS = 2, 4, 2, 8, 3
local schedule = {stages = P, stage = rank, microbatches = M, chunks = V}
local order = gc.pipeline.order(schedule)

-- all P * V layers, alike on every rank; stage r keeps layers r + 1, P + r + 1
local function model ()
  gc.manual_seed(5)
  local ls = {}
  for v = 1, P * V do ls[v] = gc.nn.Sequential(gc.nn.Linear(W, W), gc.nn.GELU()) end
  return ls
end
local function mine (ls)
  local cs = {}
  for c = 1, V do cs[c] = ls[(c - 1) * P + rank + 1] end
  return cs
end
local function params (ls)
  local ps = {}
  for _, l in ipairs(ls) do for _, p in ipairs(l:parameters()) do ps[#ps + 1] = p end end
  return ps
end
local function flat (ps)
  local v = {}
  for _, p in ipairs(ps) do
    for _, e in ipairs(p:view({p:numel()}):tolist()) do v[#v + 1] = e end
  end
  return v
end

local function rows (phase, first, last)
  local t = {}
  for i = first, last do
    t[#t + 1] = {}
    for j = 1, W do t[#t][j] = math.sin(0.37 * (i * W + j) + phase) end
  end
  return gc.tensor(t)
end
local xs, ts = {}, {}
for b = 1, M do xs[b], ts[b] = rows(0, (b - 1) * B + 1, b * B), rows(1, (b - 1) * B + 1, b * B) end
local inv_m = gc.full({}, 1 / M)  -- the microbatches' mean losses average to the batch's

local function train (chunks, call)
  local opt = gc.optim.SGD(params(chunks), {lr = 0.1})
  for _ = 1, STEPS do
    opt:zero_grad()
    gc.pipeline.run{stages = P, stage = rank, microbatches = M, chunks = V, call = call,
                    input = function (b) return xs[b] end, shape = {B, W},
                    loss = function (b, y) return gc.F.mse_loss(y, ts[b]) * inv_m end}
    opt:step()
  end
  return flat(params(chunks))
end

local eager_chunks = mine(model())
local eager = train(eager_chunks, function (c, _, x) return eager_chunks[c](x) end)

local graphed_chunks, sample = mine(model()), {}
for c = 1, V do
  for b = 1, M do  -- the first virtual stage reads data, which needs no grad
    sample[gc.pipeline.entry(c, b, M)] = {gc.zeros({B, W}, {requires_grad = rank + c > 1})}
  end
end
local entries = gc.make_graphed_callables(graphed_chunks, sample, {order = order})
local replayed = train(graphed_chunks, function (c, b, x)
  return entries[gc.pipeline.entry(c, b, M)](x)
end)

local same = #eager == #replayed
for i = 1, #eager do same = same and eager[i] == replayed[i] end

-- one process: every layer in turn on the whole batch
local whole = model()
local ref = mine(whole)
local opt = gc.optim.SGD(params(whole), {lr = 0.1})
local gx, gy = rows(0, 1, M * B), rows(1, 1, M * B)
for _ = 1, STEPS do
  opt:zero_grad()
  local h = gx
  for _, l in ipairs(whole) do h = l(h) end
  gc.F.mse_loss(h, gy):backward()
  opt:step()
end
local want, worst, close = flat(params(ref)), 0, true
for i = 1, #want do
  local d = math.abs(eager[i] - want[i])
  worst = math.max(worst, d)
  close = close and d <= 1e-6 + 1e-5 * math.abs(want[i])
end

print(("pipeline stage %d of %d: order %s"):format(rank, P, table.concat(order, " ")))
print(("pipeline stage %d: graphed chunks %s the eager ones bit for bit; vs one process on the "
       .. "global batch: largest difference %.3g (%s)"):format(rank,
       same and "equal" or "DIFFER from", worst,
       close and "within 1e-6 + 1e-5|ref|" or "OUT OF TOLERANCE"))
gc.dist.finalize()
if not (same and close) then os.exit(1) end
