-- dist_training_checks.lua: checks of gc.ddp and gc.fsdp on N ranks, run by
-- test_dist_training.lua under mpirun (not a suite of its own). Each check
-- raises on failure, which ends the job with the rank's message; rank 0
-- prints one "ok <name>" line per check passed.
--   DDP: after an eager backward every rank holds the same grads, the average
--   of the grads each rank's rows give one process (as summed in rank order);
--   buckets (one all-reduce of the joined grads) give the grads of one
--   all-reduce per parameter bit for bit; graphed, a backward replay calls
--   no all_reduce from Lua and gives the
--   eager grads bit for bit (the all-reduces are nodes of the graphs), also
--   when backwards accumulate onto grads already there; delayed wgrads are
--   averaged after backward_dw, eager and graphed alike; ranks that use
--   different parameters average every one some rank used.
--   FSDP: a shard's grad is its chunk of the DDP grad (bit for bit: both
--   average in rank order); the full grads are dropped; bf16 shards too;
--   un-shard after a step gathers every rank's updated shard; a rank holds its shards and
--   one unit's full parameters; sizes not a multiple of N are padded; a
--   backward whose saved parameters changed fails; a module called directly
--   is refused unless its unit is gathered; an error for a group
--   without this rank.
--   Pipeline: 64 KB activations (sends that wait for their receive) run to
--   the end; bf16 activations (option dtype) give one process's losses; on
--   4 ranks, two pipelines of a 2 x 2 grid train alike.
local gc = require "graphcap"

gc.dist.init()
local rank, N = gc.dist.rank(), gc.dist.world_size()
local ROWS, W = 8, 8

local function check (cond, fmt, ...)
  if not cond then error(("rank %d: " .. fmt):format(rank, ...), 2) end
end
local function ok (name)
  if rank == 0 then print("ok " .. name) end
end
local function flat (t) return t:view({t:numel()}):tolist() end
local function same (a, b, what)
  check(#a == #b, "%s: %d values, want %d", what, #a, #b)
  for i = 1, #b do check(a[i] == b[i], "%s[%d]: %.9g, want %.9g", what, i, a[i], b[i]) end
end

local function layers ()
  gc.manual_seed(4)
  return {gc.nn.Sequential(gc.nn.Linear(W, W), gc.nn.GELU()), gc.nn.Linear(W, W)}
end
local function params (ls)
  local ps = {}
  for _, l in ipairs(ls) do for _, p in ipairs(l:parameters()) do ps[#ps + 1] = p end end
  return ps
end
local function rows (phase, first, last)
  local t = {}
  for i = first, last do
    t[#t + 1] = {}
    for j = 1, W do t[#t][j] = math.cos(0.53 * (i * W + j) + phase) end
  end
  return gc.tensor(t)
end
local per = ROWS // N
local function mine (phase, r) return rows(phase, r * per + 1, (r + 1) * per) end
local function backward (ls, x, y) gc.F.mse_loss(ls[2](ls[1](x)), y):backward() end

-- DDP eager: the average over the ranks of each rank's own grads
local ddp = gc.ddp.wrap(layers())
backward(ddp, mine(0, rank), mine(1, rank))
local want = {}
for r = 0, N - 1 do  -- what each rank's rows give, summed in rank order
  local ls = layers()
  backward(ls, mine(0, r), mine(1, r))
  for k, p in ipairs(params(ls)) do want[k] = want[k] and want[k] + p.grad or p.grad end
end
for k, p in ipairs(params(ddp)) do
  local avg = want[k] * gc.full({}, 1 / N)
  local got, exp = flat(p.grad), flat(avg)
  for i = 1, #exp do
    check(math.abs(got[i] - exp[i]) <= 1e-7 * (1 + math.abs(exp[i])),
          "ddp grad %d[%d]: %.9g, want the ranks' average %.9g", k, i, got[i], exp[i])
  end
  local all = gc.empty({N * p:numel()})
  gc.dist.all_gather(all, p.grad)
  local v = flat(all)
  for i = 1, #v do check(v[i] == v[(i - 1) % p:numel() + 1], "ddp grad %d differs across ranks", k) end
end
ok("ddp eager grads are the ranks' average, the same on every rank")

-- DDP buckets: a module's grads joined into one all-reduce (bucket_cap_mb
-- = 25) give the grads of one all-reduce per parameter (0) bit for bit; a
-- cap below a module's size splits it (modules of 4 and 2 parameters)
do
  local all_reduce = gc.dist.all_reduce
  local function grads (cap)
    local calls = 0
    gc.dist.all_reduce = function (...) calls = calls + 1; return all_reduce(...) end
    gc.manual_seed(7)
    local D = gc.ddp.wrap({gc.nn.Sequential(gc.nn.Linear(W, W), gc.nn.GELU(), gc.nn.Linear(W, W)),
                           gc.nn.Linear(W, W)}, {bucket_cap_mb = cap})
    local okb, err = pcall(backward, D, mine(0, rank), mine(1, rank))
    gc.dist.all_reduce = all_reduce
    if not okb then error(err, 0) end
    local gs = {}
    for k, p in ipairs(params(D)) do gs[k] = flat(p.grad) end
    return gs, calls
  end
  local each, n_each = grads(0)
  local joined, n_joined = grads(nil)
  -- 300 bytes: a weight (256 bytes) and its bias (32), so the first module in two
  local split, n_split = grads(300 / (1024 * 1024))
  check(n_each == 6 and n_joined == 2 and n_split == 3,
        "ddp all_reduce calls: %d per parameter (want 6), %d bucketed (want 2), %d split (want 3)",
        n_each, n_joined, n_split)
  for k = 1, #each do
    same(joined[k], each[k], "bucketed ddp grad " .. k)
    same(split[k], each[k], "split-bucket ddp grad " .. k)
  end
  local e = select(2, pcall(gc.ddp.wrap, layers(), {bucket_cap_mb = -1}))
  check(tostring(e):find("ddp.wrap: bucket_cap_mb must be a finite number >= 0, got -1", 1, true),
        "got %s", e)
end
ok("ddp buckets give the per-parameter grads bit for bit, one all-reduce per bucket")

-- DDP graphed: the all-reduces are in the backward graphs: at replay no
-- all_reduce is called from Lua, yet the grads are the eager (averaged) ones
local sample = {{gc.zeros({per, W})}, {gc.zeros({per, W}, {requires_grad = true})}}
local G = gc.make_graphed_callables(gc.ddp.wrap(layers()), sample)
local all_reduce, calls = gc.dist.all_reduce, 0
gc.dist.all_reduce = function (...) calls = calls + 1; return all_reduce(...) end
backward(G, mine(0, rank), mine(1, rank))
gc.dist.all_reduce = all_reduce
check(calls == 0, "%d all_reduce calls from Lua during a replayed backward", calls)
local gp = params(G)
for k, p in ipairs(params(ddp)) do same(flat(gp[k].grad), flat(p.grad), "graphed ddp grad " .. k) end
ok("ddp graphed: the all-reduces replay inside the backward graphs, grads = eager")

-- DDP with gradient accumulation: three backwards onto grads already there
-- (another on each rank) give graphed the eager grads bit for bit: each
-- backward averages its own grads, then adds them to those before, as a
-- graphed replay adds its averaged static grads (eager once averaged the
-- sums: the grads there before were averaged too, and the same grads summed
-- in another order differ in the last bits)
do
  local function accumulated (graphed)
    local ls = layers()
    local D = gc.ddp.wrap(ls)
    for k, p in ipairs(params(ls)) do p.grad = gc.full(p:shape(), 0.25 * (rank + k)) end
    if graphed then D = gc.make_graphed_callables(D, sample) end
    for phase = 0, 2 do backward(D, mine(2 * phase, rank), mine(2 * phase + 1, rank)) end
    local gs = {}
    for k, p in ipairs(params(ls)) do gs[k] = flat(p.grad) end
    return gs
  end
  local e, g = accumulated(false), accumulated(true)
  for k = 1, #e do same(g[k], e[k], "accumulated graphed ddp grad " .. k) end
end
ok("ddp accumulated backwards: graphed grads = eager bit for bit")

-- DDP with delayed-wgrad Linears: the weight grads backward_dw adds are
-- averaged over the ranks too (they once stayed each rank's own), eagerly
-- and graphed (no order: the graphed modules' backward_dw; an order with
-- -k.5 entries: the entries' backward_dw), each backward_dw its own grads:
-- two microbatches, graphed = eager bit for bit, eager = the ranks' average
do
  local function delayed ()
    gc.manual_seed(11)
    return {gc.nn.Sequential(gc.nn.Linear(W, W, {delay_wgrad = true}), gc.nn.GELU()),
            gc.nn.Linear(W, W, {delay_wgrad = true})}
  end
  -- two microbatches, each: forward, backward, then the delayed wgrads
  local function train (first, second, r)
    for b = 1, 2 do
      gc.F.mse_loss(second(b)(first(b)(mine(2 * b, r))), mine(2 * b + 1, r)):backward()
      second(b):backward_dw()
      first(b):backward_dw()
    end
  end
  local function grads (ls)
    local gs = {}
    for k, p in ipairs(params(ls)) do gs[k] = flat(p.grad) end
    return gs
  end
  local function run (how)
    local ls = delayed()
    local D = gc.ddp.wrap(ls)
    if how == "eager" then
      train(function () return D[1] end, function () return D[2] end, rank)
    elseif how == "graphed" then
      local graphed = gc.make_graphed_callables(D, sample)
      train(function () return graphed[1] end, function () return graphed[2] end, rank)
    else  -- an order of two chunks and two microbatches, with their wgrads
      local graphed = gc.make_graphed_callables(D, {{gc.zeros({per, W})}, {gc.zeros({per, W})},
                                                    {gc.zeros({per, W}, {requires_grad = true})},
                                                    {gc.zeros({per, W}, {requires_grad = true})}},
                                                {order = {1, 2, -2, -2.5, -1, -1.5, 1, 2, -2, -2.5, -1, -1.5},
                                                 num_layers_per_chunk = {1, 1}})
      train(function (b) return graphed[gc.pipeline.entry(1, b, 2)] end,
            function (b) return graphed[gc.pipeline.entry(2, b, 2)] end, rank)
    end
    return grads(ls)
  end
  local eager = run("eager")
  local summed = {}
  for r = 0, N - 1 do
    local ls = delayed()
    train(function () return ls[1] end, function () return ls[2] end, r)
    for k, p in ipairs(params(ls)) do summed[k] = summed[k] and summed[k] + p.grad or p.grad end
  end
  for k, g in ipairs(eager) do
    local exp = flat(summed[k] * gc.full({}, 1 / N))
    for i = 1, #exp do
      check(math.abs(g[i] - exp[i]) <= 1e-6 * (1 + math.abs(exp[i])),
            "ddp delayed-wgrad grad %d[%d]: %.9g, want the ranks' average %.9g", k, i, g[i], exp[i])
    end
  end
  for _, how in ipairs{"graphed", "order"} do
    local g = run(how)
    for k = 1, #eager do same(g[k], eager[k], how .. " ddp delayed-wgrad grad " .. k) end
  end
end
ok("ddp delayed wgrads are averaged after backward_dw, eager and graphed alike")

-- DDP with ranks that use different parameters (as torch's DDP with
-- find_unused_parameters): the even ranks use a, the odd ones b (of
-- another size), none c. Every rank gets the average over all ranks of
-- a's and b's grads, zero where a rank did not use them; c keeps no grad;
-- two backwards accumulate; graphed equals eager bit for bit. (The ranks
-- once averaged one's grad of a with the other's of b, or failed with
-- MPI_ERR_TRUNCATE.)
do
  local Branches = gc.nn.Module("Branches")
  function Branches:init ()
    self.a, self.b, self.c = gc.nn.Linear(W, 2), gc.nn.Linear(W, 3), gc.nn.Linear(W, 2)
  end
  function Branches:forward (x) return (rank % 2 == 0 and self.a or self.b)(x) end
  local function grads (graphed)
    gc.manual_seed(9)
    local m = Branches()
    local d = gc.ddp.wrap(m)
    if graphed then d = gc.make_graphed_callables(d, {gc.zeros({per, W})}) end
    for phase = 0, 1 do gc.F.mse_loss(d(mine(phase, rank)), gc.zeros({per, rank % 2 == 0 and 2 or 3})):backward() end
    local gs = {}
    for _, np in ipairs(m:named_parameters()) do gs[np[1]] = np[2].grad and flat(np[2].grad) end
    return gs
  end
  local summed = {}  -- what each rank's rows give one process, summed in rank order, over N
  for r = 0, N - 1 do
    gc.manual_seed(9)
    local m = Branches()
    local l = r % 2 == 0 and m.a or m.b
    for phase = 0, 1 do
      local step = {}
      gc.F.mse_loss(l(mine(phase, r)), gc.zeros({per, r % 2 == 0 and 2 or 3})):backward()
      for _, np in ipairs(l:named_parameters()) do step[np[1]] = np[2].grad:clone(); np[2].grad = nil end
      for name, g in pairs(step) do
        local key = (r % 2 == 0 and "a." or "b.") .. name .. phase
        summed[key] = summed[key] and summed[key] + g or g
      end
    end
  end
  local eager, graphed = grads(false), grads(true)
  for _, name in ipairs{"a.weight", "a.bias", "b.weight", "b.bias"} do
    if summed[name .. 0] then
      local avg = summed[name .. 0] * gc.full({}, 1 / N) + summed[name .. 1] * gc.full({}, 1 / N)
      local got, exp = eager[name], flat(avg)
      check(got ~= nil, "ddp grad of %s: none", name)
      for i = 1, #exp do
        check(math.abs(got[i] - exp[i]) <= 1e-6 * (1 + math.abs(exp[i])),
              "ddp grad of %s[%d] with unused parameters: %.9g, want %.9g", name, i, got[i], exp[i])
      end
    end
    same(graphed[name] or {}, eager[name] or {}, "graphed ddp grad of " .. name)
  end
  check(eager["c.weight"] == nil and eager["c.bias"] == nil and graphed["c.weight"] == nil,
        "ddp: a parameter no rank used got a grad")
end
ok("ddp ranks using different parameters average them all, zeros for the unused")

-- FSDP: shard grads are chunks of the DDP grads; full grads dropped. The
-- FSDP's guard hooks keep its Linear and GELU apart, where DDP's unhooked
-- pair runs as one GEMM with a GELU epilogue: on host the epilogue is the
-- gelu kernel's arithmetic (equal bit for bit), on cuda cuBLASLt's own (a
-- few ulp apart), so there the grads agree within f32 rounding.
local F = gc.fsdp.shard(layers())
backward(F.units, mine(0, rank), mine(1, rank))
F:finish_grads()
local shards = F:parameters()
for k, p in ipairs(params(ddp)) do
  local g, n = flat(p.grad), p:numel() // N
  local chunk = {}
  for i = rank * n + 1, (rank + 1) * n do chunk[#chunk + 1] = g[i] end
  local got = flat(shards[k].grad)
  if gc.device() == "host" then same(got, chunk, "fsdp shard grad " .. k) end
  for i = 1, #chunk do
    check(math.abs(got[i] - chunk[i]) <= 1e-6 * (1 + math.abs(chunk[i])),
          "fsdp shard grad %d[%d]: %.9g, want DDP's %.9g", k, i, got[i], chunk[i])
  end
end
for k, p in ipairs(params(F.modules)) do check(p.grad == nil, "fsdp full grad %d kept", k) end
ok("fsdp shard grads are this rank's chunks of the averaged grads; full grads dropped")

-- FSDP in bf16 (its arena, shards and padding in the parameters' dtype):
-- the shard grads are chunks of bf16 DDP's, within bf16's rounding (the
-- pair runs apart under FSDP's hooks, so GELU's input is rounded to bf16
-- there); a unit mixing dtypes is refused.
do
  local function bf16_layers ()
    local ls = layers()
    for _, l in ipairs(ls) do l:to("bf16") end
    return ls
  end
  local x, y = mine(0, rank):to("bf16"), mine(1, rank):to("bf16")
  local D = gc.ddp.wrap(bf16_layers())
  backward(D, x, y)
  local Fb = gc.fsdp.shard(bf16_layers())
  backward(Fb.units, x, y)
  Fb:finish_grads()
  local sh = Fb:parameters()
  for k, p in ipairs(params(D)) do
    check(sh[k]:dtype() == "bf16" and sh[k].grad:dtype() == "bf16", "bf16 fsdp shard %d dtype", k)
    local g, n = flat(p.grad), p:numel() // N
    local got = flat(sh[k].grad)
    for i = 1, n do
      local ref = g[rank * n + i]
      check(math.abs(got[i] - ref) <= 1e-3 + 2e-2 * math.abs(ref),
            "bf16 fsdp shard grad %d[%d]: %.9g, want DDP's %.9g", k, i, got[i], ref)
    end
  end
  local mixed = layers()
  mixed[2]:to("bf16")
  local okm, err = pcall(gc.fsdp.shard, mixed)
  check(not okm and tostring(err):find("fsdp.shard: parameter 'weight' of module 2 (Linear) is "
                                       .. "bf16, the parameters before it f32", 1, true),
        "fsdp with mixed dtypes: %s", tostring(err))
end
ok("fsdp in bf16: shard grads are chunks of DDP's; mixed dtypes refused")

-- a step changes the shards; the next forward gathers them all
local opt = gc.optim.SGD(shards, {lr = 0.5})
opt:step()
F.units[1](mine(0, rank))
for k, p in ipairs(params({F.modules[1]})) do
  local all = gc.empty({p:numel()})
  gc.dist.all_gather(all, shards[k])
  same(flat(p), flat(all), "un-sharded parameter " .. k)
end
ok("fsdp un-shard after a step gathers every rank's updated shard")

-- Pipeline: activations of 64 KB (past MPI's eager sends: a send waits for
-- its receive) on every rank as one pipeline, and on 4 ranks as a 2 x 2
-- grid: pipelines {0, 1} and {2, 3} (gc.dist groups) fed alike train alike,
-- which the data-parallel groups {0, 2} and {1, 3} compare.
local function pipeline_step (P, stage, group)
  local B, H = 64, 256
  gc.manual_seed(8)
  local cs = {gc.nn.Linear(H, H), gc.nn.Linear(H, H)}
  local x, y = gc.randn({B, H}), gc.randn({B, H})
  local sgd = gc.optim.SGD(params(cs), {lr = 0.1})
  gc.pipeline.run{stages = P, stage = stage, microbatches = 4, chunks = 2, group = group,
                  call = function (c, _, h) return cs[c](h) end, input = function () return x end,
                  loss = function (_, h) return gc.F.mse_loss(h, y) end, shape = {B, H}}
  sgd:step()
  return cs
end
pipeline_step(N, rank)
ok("pipeline of 64 KB activations ran")

-- A bf16 pipeline (option dtype): the last stage's losses are those of the
-- same layers run in one process, bit for bit; without the option a send
-- is refused, naming the dtype to set.
do
  local B, H, M = 16, 32, math.max(2, N)  -- interleaving needs M >= stages
  gc.manual_seed(9)
  local cs = {gc.nn.Linear(H, H):to("bf16"), gc.nn.Linear(H, H):to("bf16")}
  local x, y = gc.randn({B, H}, {dtype = "bf16"}), gc.randn({B, H}, {dtype = "bf16"})
  local function run (dtype)
    return gc.pipeline.run{stages = N, stage = rank, microbatches = M, chunks = 2, dtype = dtype,
                           call = function (c, _, h) return cs[c](h) end,
                           input = function () return x end, shape = {B, H},
                           loss = function (_, h) return gc.F.mse_loss(h, y) end}
  end
  local losses = run("bf16")
  if rank == N - 1 then
    local ref = gc.no_grad(function ()
      local h = x
      for c = 1, 2 do for _ = 1, N do h = cs[c](h) end end
      return gc.F.mse_loss(h, y):item()
    end)
    for b = 1, M do check(losses[b]:item() == ref, "bf16 pipeline loss %d: %.9g, want %.9g", b,
                          losses[b]:item(), ref) end
  end
  if N > 1 and rank == 0 then
    local okr, err = pcall(run, nil)
    check(not okr and tostring(err):find("pipeline.run: the activation of virtual stage 0 "
                                         .. "(microbatch 1) to send is bf16, but the activations' "
                                         .. "dtype is f32 (set the option dtype)", 1, true),
          "bf16 activations without dtype: %s", tostring(err))
  end
  ok("bf16 pipeline with option dtype equals one process")
end
if N == 4 then
  local pp = {gc.dist.new_group({0, 1}), gc.dist.new_group({2, 3})}
  local dp = {gc.dist.new_group({0, 2}), gc.dist.new_group({1, 3})}
  local cs = pipeline_step(2, rank % 2, pp[rank // 2 + 1])
  for k, p in ipairs(params(cs)) do
    local both = gc.empty({2 * p:numel()})
    gc.dist.all_gather(both, p:view({p:numel()}), {group = dp[rank % 2 + 1]})
    local v, n = flat(both), p:numel()
    for i = 1, n do check(v[i] == v[n + i], "grid: parameter %d differs between the pipelines", k) end
  end
  ok("pipelines as groups of a 2 x 2 grid")
end

-- FSDP memory: a rank holds its shards and one arena of the largest unit's
-- full parameters, not the model (4 units of 16640 bytes); training adds
-- no full-size parameter buffer
do
  local H = 64
  local function big ()
    gc.manual_seed(6)
    local ls = {}
    for i = 1, 4 do ls[i] = gc.nn.Linear(H, H) end
    return ls
  end
  collectgarbage(); collectgarbage()  -- boxes freed by their finalizers, then collected
  local before = gc.memory_stats().in_use_bytes
  local B = gc.fsdp.shard(big())
  collectgarbage(); collectgarbage()
  local held = gc.memory_stats().in_use_bytes - before
  local m = B:memory()
  local unit = 4 * ((H * H + N - 1) // N * N + (H + N - 1) // N * N)
  check(m.full_bytes == unit, "fsdp arena %d bytes, want one unit's %d", m.full_bytes, unit)
  check(m.model_bytes == 4 * 4 * (H * H + H), "fsdp model bytes %d", m.model_bytes)
  local bound = m.shard_bytes + m.full_bytes + 512 * 9  -- 8 shards and the arena, rounded
  check(held <= bound, "fsdp shard holds %d bytes, want at most shards %d + arena %d (+ rounding)",
        held, m.shard_bytes, m.full_bytes)
  local x = gc.randn({2, H})
  local sgd = gc.optim.SGD(B:parameters(), {lr = 0.1})
  local peak = 0
  for _ = 1, 2 do
    sgd:zero_grad()
    collectgarbage()
    gc.reset_peak_memory_stats()
    local h = x
    for _, u in ipairs(B.units) do h = u(h) end
    h:sum():backward()
    B:finish_grads()
    sgd:step()
    h = nil -- luacheck: ignore 311 (for the collector)
    peak = math.max(peak, gc.memory_stats().peak_bytes - before)
  end
  sgd:zero_grad()
  collectgarbage()
  local after = gc.memory_stats().in_use_bytes - before
  check(after <= bound, "fsdp holds %d bytes after training, want at most %d", after, bound)
  -- a step's peak: shards, their grads, the arena, one unit's full grads
  -- (reduce-scattered and dropped after its backward), and a little for
  -- activations and temporaries (2 rows)
  local top = 2 * m.shard_bytes + 2 * m.full_bytes + 16384
  check(peak <= top, "fsdp step peak %d bytes, want at most %d", peak, top)
  if rank == 0 then
    print(("fsdp bytes held on a rank: %d (shards %d + arena %d; the model is %d); a step's "
           .. "peak %d"):format(held, m.shard_bytes, m.full_bytes, m.model_bytes, peak))
  end
end
ok("fsdp holds its shards and one unit's full parameters")

-- FSDP of parameters whose sizes are not multiples of N (padded shards):
-- the shard grads are the DDP grads' chunks, padding zero, and a step
-- gathers every rank's part
do
  local function odd ()
    gc.manual_seed(5)
    return {gc.nn.Sequential(gc.nn.Linear(W, 3), gc.nn.GELU()), gc.nn.Linear(3, W, {bias = false})}
  end
  local D = gc.ddp.wrap(odd())
  backward(D, mine(0, rank), mine(1, rank))
  local P = gc.fsdp.shard(odd())
  backward(P.units, mine(0, rank), mine(1, rank))
  P:finish_grads()
  local sh = P:parameters()
  for k, p in ipairs(params(D)) do
    local g, n = flat(p.grad), (p:numel() + N - 1) // N
    local chunk = {}
    for i = rank * n + 1, (rank + 1) * n do chunk[#chunk + 1] = g[i] or 0 end
    same(flat(sh[k].grad), chunk, "padded fsdp shard grad " .. k)
  end
  gc.optim.SGD(sh, {lr = 0.5}):step()
  gc.optim.SGD(params(D), {lr = 0.5}):step()
  gc.no_grad(function () P.units[2](P.units[1](mine(0, rank))) end)
  local dp = params(D)
  same(flat(params({P.modules[2]})[1]), flat(dp[3]), "padded un-sharded parameter")
end
ok("fsdp pads parameters whose size is not a multiple of the ranks")

-- FSDP with two microbatches in flight (both forwards, then the backwards
-- in reverse, as a pipeline does): each backward gathers its unit again and
-- the saved tensors pass; the shard grads equal those of one microbatch at
-- a time (two terms: their sum does not depend on the order)
do
  local function run (interleaved)
    local S = gc.fsdp.shard(layers())
    local function loss (phase)
      return gc.F.mse_loss(S.units[2](S.units[1](mine(phase, rank))), mine(phase + 1, rank))
    end
    if interleaved then
      local a, b = loss(0), loss(2)
      b:backward(); a:backward()
    else
      loss(0):backward(); loss(2):backward()
    end
    S:finish_grads()
    local gs = {}
    for k, sh in ipairs(S:parameters()) do gs[k] = flat(sh.grad) end
    return gs
  end
  local one, two = run(false), run(true)
  for k = 1, #one do same(two[k], one[k], "fsdp shard grad with microbatches in flight " .. k) end
end
ok("fsdp microbatches in flight share the arena and give the same grads")

-- FSDP saved tensors: the normal schedule re-gathers a unit before its
-- backward with the version its forward saw; a step on the shards between
-- a forward and its backward changes the values the backward saved, and
-- the backward fails instead of giving wrong grads
do
  local S = gc.fsdp.shard(layers())
  local function loss () return gc.F.mse_loss(S.units[2](S.units[1](mine(0, rank))), mine(1, rank)) end
  loss():backward()  -- unit 1 gathered again before its backward: it passes
  S:finish_grads()
  local l = loss()
  gc.optim.SGD(S:parameters(), {lr = 0.5}):step()
  local okb, err = pcall(function () l:backward() end)
  check(not okb and tostring(err):find("modified by an inplace operation", 1, true),
        "backward after a step on the shards: %s", tostring(err))
end
ok("fsdp backward after its shards changed fails the version check")

-- FSDP modules called directly (not through their units): refused while
-- the arena holds another unit's parameters, or values gathered before the
-- unit's shards changed, naming the module (a submodule too) and the unit
-- to call; allowed while the unit's parameters are gathered. Graphed the
-- same, once graphing is done (graphing lifts the guards, whose hooks
-- make_graphed_callables would refuse, until its first capture-time hook).
-- (A direct call once computed with another unit's weights.)
do
  local function refused (fn, what, expect)
    local okc, err = pcall(fn)
    check(not okc and tostring(err):find(expect, 1, true), "%s: %s", what, tostring(err))
  end
  local function direct (S, label)
    local x = mine(0, rank)
    local h = S.units[1](x)
    local y = S.units[2](h)
    refused(function () return S.modules[1](x) end, label .. ": module 1 after unit 2",
            "fsdp: F.modules[1] (" .. S.modules[1]:type() .. ") is called directly, but the "
            .. "parameters of unit 1 are not gathered (the arena holds unit 2's): call the unit, "
            .. "F.units[1], which gathers them")
    refused(function () return S.modules[1]:named_children()[1][2](x) end,
            label .. ": a submodule of module 1", "fsdp: module '0' of F.modules[1] (Linear) is "
            .. "called directly, but the parameters of unit 1 are not gathered")
    same(flat(S.modules[2](h)), flat(y), label .. ": module 2 while gathered")
    for _, sh in ipairs(S:parameters()) do gc.no_grad(function () sh:copy_(sh * gc.full({}, 0.5)) end) end
    refused(function () return S.modules[2](x) end, label .. ": module 2 after its shards changed",
            "(its shards changed since they were gathered): call the unit, F.units[2]")
    S.units[2](h)  -- gathers again
    S.modules[2](h)
  end
  direct(gc.fsdp.shard(layers()), "eager")
  local S = gc.fsdp.shard(layers())
  gc.make_graphed_callables(S.modules, sample, {capture_time_hooks = S:capture_time_hooks()})
  direct(S, "graphed")
end
ok("fsdp modules called directly are refused unless their unit's parameters are gathered")

if N > 1 then
  local g = gc.dist.new_group({0})
  if rank ~= 0 then
    local e2 = select(2, pcall(gc.ddp.wrap, layers(), {group = g}))
    check(tostring(e2):find("ddp.wrap: rank " .. rank .. " is not in the group (world ranks 0)",
                            1, true), "got %s", e2)
  end
  ok("fsdp and ddp errors name the group")
end
gc.dist.finalize()
