-- ddp_whole.lua: data-parallel training with the whole step in one graph
-- (mpirun -np N build/graphcap examples/ddp_whole.lua; alone it runs as one
-- rank). The step -- zero_grad, forward, backward with gc.ddp's bucket
-- all-reduces, the optimizer step -- is captured once into a gc.Graph, as
-- PyTorch's whole-network capture; each later step copies its rows into the
-- static input and replays: one launch a step, the fastest path where no
-- hook has to run between layers. Checks: the replayed steps train to what
-- the same eager DDP steps give, bit for bit, and N ranks to what one
-- process gives on the global batch (within f32 rounding: |a - b| <= 1e-6 +
-- 1e-5 |b|).
local gc = require "graphcap"

if not gc.dist.is_available() then  -- a build without MPI
  print("ddp_whole: graphcap was built without MPI")
  return
end
gc.dist.init()
local rank, N = gc.dist.rank(), gc.dist.world_size()
local ROWS, IN, HID, OUT, STEPS = 8, 8, 16, 4, 5
assert(ROWS % N == 0, "the world size must divide 8")
local per = ROWS // N

local function model ()
  gc.manual_seed(7)
  return gc.nn.Sequential(gc.nn.Linear(IN, HID), gc.nn.GELU(), gc.nn.Linear(HID, HID), gc.nn.GELU(),
                          gc.nn.Linear(HID, OUT))
end

-- rows first..last of step k's global batch (the same values on every rank)
local function rows (width, phase, k, first, last)
  local t = {}
  for i = first, last do
    t[#t + 1] = {}
    for j = 1, width do t[#t][j] = math.sin(0.37 * (i * width + j) + phase + k) end
  end
  return gc.tensor(t)
end
local function mine (width, phase, k)
  return rows(width, phase, k, rank * per + 1, (rank + 1) * per)
end

local function step (m, opt, x, y)
  opt:zero_grad()
  gc.F.mse_loss(m(x), y):backward()
  opt:step()
end

local function flat (m)
  local v = {}
  for _, p in ipairs(m:parameters()) do
    for _, e in ipairs(p:view({p:numel()}):tolist()) do v[#v + 1] = e end
  end
  return v
end

-- eager DDP steps
local eager = gc.ddp.wrap(model())
local eager_opt = gc.optim.SGD(eager:parameters(), {lr = 0.1})
for k = 1, STEPS do step(eager, eager_opt, mine(IN, 0, k), mine(OUT, 1, k)) end

-- the same steps, captured once and replayed: the grads are made inside the
-- capture (zero_grad leaves none), so each replay writes them afresh
local whole = gc.ddp.wrap(model())
local whole_opt = gc.optim.SGD(whole:parameters(), {lr = 0.1})
local sx, sy = gc.zeros({per, IN}), gc.zeros({per, OUT})
local g = gc.Graph()
g:capture(function () step(whole, whole_opt, sx, sy) end)
for k = 1, STEPS do
  sx:copy_(mine(IN, 0, k))
  sy:copy_(mine(OUT, 1, k))
  g:replay()
end

local a, b = flat(eager), flat(whole)
local same = #a == #b
for i = 1, #a do same = same and a[i] == b[i] end

-- one process on the whole batch
local single = model()
local single_opt = gc.optim.SGD(single:parameters(), {lr = 0.1})
for k = 1, STEPS do
  step(single, single_opt, rows(IN, 0, k, 1, ROWS), rows(OUT, 1, k, 1, ROWS))
end
local s, worst, close = flat(single), 0, true
for i = 1, #s do
  local d = math.abs(b[i] - s[i])
  worst = math.max(worst, d)
  close = close and d <= 1e-6 + 1e-5 * math.abs(s[i])
end

if rank == 0 then
  print(("ddp_whole: %d ranks x %d rows, %d steps, each one replay of one graph"):format(
    N, per, STEPS))
  print(("ddp_whole: replayed parameters %s the eager DDP ones bit for bit"):format(
    same and "equal" or "DIFFER from"))
  print(("ddp_whole: %d ranks vs one process on the global batch: largest difference %.3g (%s)")
    :format(N, worst, close and "within 1e-6 + 1e-5|ref|" or "OUT OF TOLERANCE"))
end
gc.dist.finalize()
if not (same and close) then os.exit(1) end
