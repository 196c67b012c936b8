-- bench_dist.lua: step times of distributed training, one JSON line per
-- configuration (printed by rank 0):
--   mpirun -np N build/graphcap [--device cuda] bench/bench_dist.lua [L H B ITERS [DTYPE]]
-- (alone it runs at world size 1). A stack of L x (Linear(H, H) + GELU) in
-- DTYPE (f32, the default, or bf16), batch B per rank, forward + backward of the mean square + SGD step:
--   local_eager / local / local_whole   no distribution, eagerly, each layer
--                graphed, the whole step in one gc.Graph (the baselines)
--   dp_eager     gc.ddp, eagerly
--   dp_graphed   gc.ddp graphed: each layer's all-reduces inside its backward graph
--   dp_outside   the plain layers graphed, the grads all-reduced after backward
--   dp_whole     gc.ddp, the whole step (all-reduces and SGD too) in one gc.Graph
--   fsdp_eager / fsdp_graphed   gc.fsdp (graphed with its capture-time hooks)
--   pp_local_eager / pp_local   the pipeline's 2 chunks and 4 microbatches on one rank
--                without gc.pipeline (each microbatch through both, then its
--                backward), eagerly and each chunk graphed (the baselines)
--   pp_eager / pp_graphed       2 chunks a stage, interleaved 1F1B, 4 microbatches
-- efficiency = the baseline of the same mode / config step time (1: the
-- communication is hidden, at a fixed batch per rank; for the pipeline, at
-- fixed chunks per rank); "baseline" names it.
local gc = require "graphcap"

if not gc.dist.is_available() then  -- a build without MPI
  print("bench_dist: graphcap was built without MPI")
  return
end
gc.dist.init()
local rank, N = gc.dist.rank(), gc.dist.world_size()
local L, H, B, ITERS = tonumber(arg[1] or 4), tonumber(arg[2] or 256), tonumber(arg[3] or 32),
                       tonumber(arg[4] or 20)
local DT = arg[5] or "f32"
assert(DT == "f32" or DT == "bf16", "bench_dist: DTYPE is f32 or bf16")

local function stack (n)
  gc.manual_seed(1)
  local ms = {}
  for i = 1, n do ms[i] = gc.nn.Sequential(gc.nn.Linear(H, H), gc.nn.GELU()):to(DT) end
  return ms
end
local function params (ms)
  local ps = {}
  for _, m in ipairs(ms) do for _, p in ipairs(m:parameters()) do ps[#ps + 1] = p end end
  return ps
end
local function samples (n, first_grad)
  local s = {}
  for i = 1, n do s[i] = {gc.zeros({B, H}, {dtype = DT, requires_grad = i > 1 or first_grad})} end
  return s
end

local x, y = gc.randn({B, H}, {dtype = DT}), gc.randn({B, H}, {dtype = DT})

-- microseconds per call of step, after 3 untimed calls; the same on all ranks
local function time_us (step)
  for _ = 1, 3 do step() end
  gc.dist.barrier()
  gc.synchronize()
  local t0 = gc.clock()
  for _ = 1, ITERS do step() end
  gc.synchronize()
  local t = gc.full({}, (gc.clock() - t0) * 1e6 / ITERS)
  gc.dist.all_reduce(t, {op = "max"})
  return t:item()
end

-- a training step of the calls cs over ps (finish: after backward)
local function trainer (cs, ps, finish)
  local opt = gc.optim.SGD(ps, {lr = 1e-3})
  return function ()
    opt:zero_grad()
    local h = x
    for _, c in ipairs(cs) do h = c(h) end
    gc.F.mse_loss(h, y):backward()
    if finish then finish() end
    opt:step()
  end
end

-- microseconds per replay of the step captured whole into one gc.Graph,
-- after 3 warm-up steps on a side stream (as PyTorch's whole-network capture)
local function whole_us (step)
  gc.with_stream(gc.Stream(), function () for _ = 1, 3 do step() end end)
  gc.synchronize()
  local g = gc.Graph()
  g:capture(step)
  return time_us(function () g:replay() end)
end

-- one JSON line; the efficiency against the baseline of the same mode: a
-- baseline config (its name in `baseline`) records itself
local base = {}
local function report (name, us, baseline)
  if baseline and base[baseline] == nil then base[baseline] = us end
  if rank == 0 then
    print(('{"config": "%s", "world_size": %d, "device": "%s", "dtype": "%s", "L": %d, "H": %d, '
           .. '"B": %d, "step_us": %.1f, "baseline": %s, "efficiency": %s}'):format(name, N,
           gc.device(), DT, L, H, B, us, baseline and ('"' .. baseline .. '"') or "null",
           baseline and ("%.3f"):format(base[baseline] / us) or "null"))
    io.stdout:flush()
  end
end

do
  local ms = stack(L)
  report("local_eager", time_us(trainer(ms, params(ms))), "local_eager")
end
do
  local ms = stack(L)
  report("local", time_us(trainer(gc.make_graphed_callables(ms, samples(L)), params(ms))), "local")
end
do
  local ms = stack(L)
  report("local_whole", whole_us(trainer(ms, params(ms))), "local_whole")
end
do
  local ms = stack(L)
  report("dp_eager", time_us(trainer(gc.ddp.wrap(ms), params(ms))), "local_eager")
end
do
  local ms = stack(L)
  local g = gc.make_graphed_callables(gc.ddp.wrap(ms), samples(L))
  report("dp_graphed", time_us(trainer(g, params(ms))), "local")
end
do
  local ms = stack(L)
  local ps = params(ms)
  report("dp_outside", time_us(trainer(gc.make_graphed_callables(ms, samples(L)), ps, function ()
    for _, p in ipairs(ps) do gc.dist.all_reduce(p.grad, {op = "avg"}) end
  end)), "local")
end
do
  local ms = stack(L)
  report("dp_whole", whole_us(trainer(gc.ddp.wrap(ms), params(ms))), "local_whole")
end
if (H * H) % N == 0 and H % N == 0 then
  local F = gc.fsdp.shard(stack(L))
  report("fsdp_eager", time_us(trainer(F.units, F:parameters(), function () F:finish_grads() end)),
         "local_eager")
  local G = gc.fsdp.shard(stack(L))
  gc.make_graphed_callables(G.modules, samples(L, true),
                            {capture_time_hooks = G:capture_time_hooks()})
  report("fsdp_graphed", time_us(trainer(G.units, G:parameters(),
                                         function () G:finish_grads() end)), "local")
end
do
  local V, M = 2, 4
  local order = gc.pipeline.order{stages = N, stage = rank, microbatches = M, chunks = V}
  local function pp (cs, call)
    local opt = gc.optim.SGD(params(cs), {lr = 1e-3})
    return function ()
      opt:zero_grad()
      gc.pipeline.run{stages = N, stage = rank, microbatches = M, chunks = V, call = call, dtype = DT,
                      input = function () return x end, shape = {B, H},
                      loss = function (_, h) return gc.F.mse_loss(h, y) end}
      opt:step()
    end
  end
  -- the same chunks and microbatches without the pipeline (each microbatch
  -- through the V chunks, then its backward): the baselines at one stage
  local function local_step (cs, call)
    local opt = gc.optim.SGD(params(cs), {lr = 1e-3})
    return function ()
      opt:zero_grad()
      for b = 1, M do
        local h = x
        for c = 1, V do h = call(c, b, h) end
        gc.F.mse_loss(h, y):backward()
      end
      opt:step()
    end
  end
  local ls = stack(V)
  report("pp_local_eager", time_us(local_step(ls, function (c, _, h) return ls[c](h) end)),
         "pp_local_eager")
  local lg = stack(V)
  local lgraphed = gc.make_graphed_callables(lg, samples(V))
  report("pp_local", time_us(local_step(lg, function (c, _, h) return lgraphed[c](h) end)),
         "pp_local")
  local cs = stack(V)
  report("pp_eager", time_us(pp(cs, function (c, _, h) return cs[c](h) end)), "pp_local_eager")
  local gs, sample = stack(V), {}
  for c = 1, V do
    for b = 1, M do
      sample[gc.pipeline.entry(c, b, M)] = {gc.zeros({B, H}, {dtype = DT,
                                                               requires_grad = rank + c > 1})}
    end
  end
  local entries = gc.make_graphed_callables(gs, sample, {order = order})
  report("pp_graphed", time_us(pp(gs, function (c, b, h)
    return entries[gc.pipeline.entry(c, b, M)](h)
  end)), "pp_local")
end
gc.dist.finalize()
