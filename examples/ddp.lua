-- ddp.lua: data parallel training on N ranks (mpirun -np N build/graphcap
-- examples/ddp.lua; alone it runs as one rank). Each rank trains three
-- layers on its rows of a global batch of 8; gc.ddp averages the grads over
-- the ranks, one bucket per layer, as soon as that layer's backward is done.
-- Checks: the layers graphed with make_graphed_callables (each layer's
-- all-reduces captured in its backward graph) train to the eager values bit
-- for bit, and N ranks train to what one process does on the whole batch
-- (within f32 rounding: |a - b| <= 1e-6 + 1e-5 |b|).
local gc = require "graphcap"

if not gc.dist.is_available() then  -- a build without MPI
  print("ddp: graphcap was built without MPI")
  return
end
gc.dist.init()
local rank, N = gc.dist.rank(), gc.dist.world_size()
local ROWS, IN, HID, OUT, STEPS = 8, 8, 16, 4, 3
assert(ROWS % N == 0, "the world size must divide 8")

local function layers ()
  gc.manual_seed(7)
  return {gc.nn.Sequential(gc.nn.Linear(IN, HID), gc.nn.GELU()),
          gc.nn.Sequential(gc.nn.Linear(HID, HID), gc.nn.GELU()), gc.nn.Linear(HID, OUT)}
end

-- rows first..last of the global batch (the same values on every rank)
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

local function train (ls, input, target)
  local ps = {}
  for _, l in ipairs(ls) do for _, p in ipairs(l:parameters()) do ps[#ps + 1] = p end end
  local opt = gc.optim.SGD(ps, {lr = 0.1})
  for _ = 1, STEPS do
    opt:zero_grad()
    gc.F.mse_loss(ls[3](ls[2](ls[1](input))), target):backward()
    opt:step()
  end
  local v = {}
  for _, p in ipairs(ps) do
    for _, e in ipairs(p:view({p:numel()}):tolist()) do v[#v + 1] = e end
  end
  return v
end

local eager = train(gc.ddp.wrap(layers()), x, y)

local wrapped = gc.ddp.wrap(layers())
local graphed = gc.make_graphed_callables(wrapped, {{gc.zeros({per, IN})},
  {gc.zeros({per, HID}, {requires_grad = true})}, {gc.zeros({per, HID}, {requires_grad = true})}})
local bwd_nodes = graphed[3]:stats().bwd.nodes
local replayed = train(graphed, x, y)

local same = #eager == #replayed
for i = 1, #eager do same = same and eager[i] == replayed[i] end

-- one process on the whole batch
local gx, gy = rows(IN, 0, 1, ROWS), rows(OUT, 1, 1, ROWS)
local single = train(layers(), gx, gy)
local worst, close = 0, true
for i = 1, #single do
  local d = math.abs(eager[i] - single[i])
  worst = math.max(worst, d)
  close = close and d <= 1e-6 + 1e-5 * math.abs(single[i])
end

if rank == 0 then
  print(("ddp: %d ranks x %d rows, %d steps; layer 3's backward graph: %d nodes"):format(
    N, per, STEPS, bwd_nodes))
  print(("ddp: graphed parameters %s the eager ones bit for bit"):format(
    same and "equal" or "DIFFER from"))
  print(("ddp: %d ranks vs one process on the global batch: largest difference %.3g (%s)"):format(
    N, worst, close and "within 1e-6 + 1e-5|ref|" or "OUT OF TOLERANCE"))
end
gc.dist.finalize()
if not (same and close) then os.exit(1) end
