-- bench.lua: graphcap's side of bench/torch_graphed.py (PyTorch's
-- make_graphed_callables on the same model), run on a GPU by `make bench`.
-- A stack of L x (Linear(H, H) + GELU), batch B, forward + backward of the
-- sum; one JSON line per configuration with the same fields as that script,
-- then the scaling runs (one JSON line each); `transformer` runs the
-- transformer section (bench/torch_transformer.py is PyTorch's side), with
-- each attention implementation or only the one named after it.
-- Usage: graphcap bench/bench.lua [configs|scaling|transformer [IMPL]|all]
local gc = require "graphcap"

local what = arg[1] or "all"
local impls = arg[2] and {arg[2]} or {"auto", "composed", "fused"}

local function json (t, order)
  local parts = {}
  for _, k in ipairs(order) do
    local v = t[k]
    if type(v) == "string" then v = '"' .. v .. '"'
    elseif math.type(v) == "float" then v = string.format("%.4g", v) end
    parts[#parts + 1] = string.format('"%s": %s', k, tostring(v))
  end
  print("{" .. table.concat(parts, ", ") .. "}")
  io.stdout:flush()
end

local function stack (L, H, dt, linear_opts)
  local mods = {}
  for i = 1, L do
    mods[i] = gc.nn.Sequential(gc.nn.Linear(H, H, linear_opts), gc.nn.GELU()):to(dt or "f32")
  end
  return mods
end

local function step (mods, x)
  local h = x
  for _, m in ipairs(mods) do h = m(h) end
  h:sum():backward()
end

-- microseconds per call of fn, timed to completion over iters calls
local function time_us (fn, iters)
  gc.synchronize()
  local t0 = gc.clock()
  for _ = 1, iters do fn() end
  gc.synchronize()
  return (gc.clock() - t0) * 1e6 / iters
end

local function mib (bytes) return bytes / 2 ^ 20 end

-- One sample input of [B, H] per callable.
local function samples (n, B, H, dt)
  local sample = {}
  for i = 1, n do sample[i] = {gc.randn({B, H}, {requires_grad = true, dtype = dt})} end
  return sample
end

-- make_graphed_callables of mods in a pool of their own, timed to
-- completion: the graphed callables, seconds, bytes the pool reserves.
local function graph_timed (mods, sample)
  local pool = gc.graph_pool_handle()
  gc.synchronize()
  local t0 = gc.clock()
  local graphed = gc.make_graphed_callables(mods, sample, {pool = pool})
  gc.synchronize()
  return graphed, gc.clock() - t0, pool:stats().reserved_bytes
end

-- us per step of `layers` on x, after 10 untimed steps.
local function step_us (layers, x, iters)
  local function run () step(layers, x) end
  for _ = 1, 10 do run() end
  return time_us(run, iters)
end

-- The mean time of one replay of the whole step on mods captured as one
-- graph, warmed up on a side stream first.
local function whole_graph_us (mods, x, iters)
  local s = gc.Stream()
  gc.with_stream(s, function () for _ = 1, 3 do step(mods, x) end end)
  gc.synchronize()
  for _, m in ipairs(mods) do m:zero_grad() end
  x.grad = nil
  local g = gc.Graph()
  g:capture(function () step(mods, x) end)
  for _ = 1, 10 do g:replay() end
  return time_us(function () g:replay() end, iters)
end

local function bench (L, H, B, iters, dt)
  gc.manual_seed(0)
  local x = gc.randn({B, H}, {requires_grad = true, dtype = dt})
  local layers = stack(L, H, dt)
  local eager_us = step_us(layers, x, iters)

  -- one graphed callable per layer, all in one pool
  local graphed, capture_s, graph_mem = graph_timed(layers, samples(L, B, H, dt))
  local graphed_us = step_us(graphed, x, iters)

  -- the whole step as one graph, on fresh modules
  local whole_us = whole_graph_us(stack(L, H, dt), x, iters)

  json({L = L, H = H, B = B, dtype = dt == "bf16" and "bfloat16" or "float32", eager_us = eager_us,
        graphed_per_layer_us = graphed_us, whole_graph_us = whole_us,
        capture_s = capture_s, graph_mem_mib = mib(graph_mem), graphcap = gc.version()},
       {"L", "H", "B", "dtype", "eager_us", "graphed_per_layer_us", "whole_graph_us",
        "capture_s", "graph_mem_mib", "graphcap"})
end

-- Scaling: N callables of Linear(64, 64) + GELU, batch 8 (host cost dominates).
local function scaling (N)
  local H, B, iters = 64, 8, 50
  gc.manual_seed(0)
  local mods = stack(N, H)
  local sample = samples(N, B, H)
  local g, cap, shared = graph_timed(mods, sample)
  local x = gc.randn({B, H}, {requires_grad = true})
  for _ = 1, 3 do step(g, x) end
  local per_callable = time_us(function () step(g, x) end, iters) / N
  local mods2, separate = stack(N, H), 0
  for i = 1, N do
    local p = gc.graph_pool_handle()
    gc.make_graphed_callables(mods2[i], sample[i], {pool = p})
    separate = separate + p:stats().reserved_bytes
  end
  json({callables = N, capture_s = cap, replay_fwd_bwd_us_per_callable = per_callable,
        graph_mem_shared_mib = mib(shared), graph_mem_separate_pools_mib = mib(separate)},
       {"callables", "capture_s", "replay_fwd_bwd_us_per_callable", "graph_mem_shared_mib",
        "graph_mem_separate_pools_mib"})
end

-- Pool bytes against microbatches, with and without buffer reuse: two
-- one-layer chunks, M microbatches, each run forward then backward (1F1B).
local function microbatches (M, reuse)
  local H, B = 256, 64
  gc.manual_seed(0)
  local mods = stack(2, H)
  local order = {}
  for _ = 1, M do
    for _, v in ipairs({1, 2, -2, -1}) do order[#order + 1] = v end
  end
  local sample = samples(2 * M, B, H)
  local pool = gc.graph_pool_handle()
  gc.make_graphed_callables(mods, sample, {pool = pool, order = order,
                                           num_layers_per_chunk = {1, 1},
                                           reuse_graph_input_output_buffers = reuse})
  json({microbatches = M, reuse = tostring(reuse), pool_mib = mib(pool:stats().reserved_bytes)},
       {"microbatches", "reuse", "pool_mib"})
end

-- The same model with TE's fuse_wgrad_accumulation: weight grads accumulate
-- into each Linear's main_grad inside the weight-grad GEMM (a graphed
-- backward does it in the graph), so .grad holds only the biases' grads.
-- Measured apart from the reference's fields, since .grad differs.
local function bench_fused_wgrad (L, H, B, iters, dt)
  gc.manual_seed(0)
  local x = gc.randn({B, H}, {requires_grad = true, dtype = dt})
  local layers = stack(L, H, dt, {fuse_wgrad_accumulation = true})
  local eager_us = step_us(layers, x, iters)
  local graphed_us = step_us(graph_timed(layers, samples(L, B, H, dt)), x, iters)
  json({L = L, H = H, B = B, dtype = dt == "bf16" and "bfloat16" or "float32",
        fuse_wgrad_accumulation = "true", eager_us = eager_us, graphed_per_layer_us = graphed_us},
       {"L", "H", "B", "dtype", "fuse_wgrad_accumulation", "eager_us", "graphed_per_layer_us"})
end

-- The transformer section, beside bench/torch_transformer.py: L pre-LN
-- TransformerLayers (d, 4d MLP, causal self-attention of attn_impl `impl`,
-- no dropout) on x [S, B, d] in bf16, forward and backward of the sum:
-- eager, one graphed callable per layer, and the whole step as one graph.
local function tstack (L, d, heads, impl)
  local mods = {}
  for i = 1, L do
    mods[i] = gc.nn.TransformerLayer(d, 4 * d, heads, {self_attn_mask_type = "causal",
                                                       hidden_dropout = 0, attention_dropout = 0,
                                                       attn_impl = impl})
    mods[i]:to("bf16")
  end
  return mods
end

local function bench_transformer (impl, L, d, heads, S, B, iters)
  gc.manual_seed(0)
  local x = gc.randn({S, B, d}, {requires_grad = true, dtype = "bf16"})
  local eager_us = step_us(tstack(L, d, heads, impl), x, iters)
  local sample = {}
  for i = 1, L do sample[i] = {gc.randn({S, B, d}, {requires_grad = true, dtype = "bf16"})} end
  local layers = tstack(L, d, heads, impl)
  local graphed, capture_s, graph_mem = graph_timed(layers, sample)
  local graphed_us = step_us(graphed, x, iters)
  local whole_us = whole_graph_us(tstack(L, d, heads, impl), x, iters)
  json({model = "transformer", L = L, d = d, heads = heads, S = S, B = B, dtype = "bfloat16",
        attn_impl = impl, eager_us = eager_us, graphed_per_layer_us = graphed_us,
        whole_graph_us = whole_us, capture_s = capture_s, graph_mem_mib = mib(graph_mem),
        graphcap = gc.version()},
       {"model", "L", "d", "heads", "S", "B", "dtype", "attn_impl", "eager_us",
        "graphed_per_layer_us", "whole_graph_us", "capture_s", "graph_mem_mib", "graphcap"})
end

-- The runs, in order: a label (a format of the arguments), the function,
-- its arguments. Each announces itself on stderr, and its time once done;
-- stdout has only the JSON lines.
local runs = {}
local function add (fmt, fn, ...)
  runs[#runs + 1] = {label = fmt:format(...), fn = fn, args = table.pack(...)}
end
local CONFIG, FUSED = "L=%d H=%d B=%d, %d iters, %s", "fused wgrad: L=%d H=%d B=%d, %d iters, %s"

if what == "configs" or what == "all" then
  for _, dt in ipairs({"f32", "bf16"}) do
    add(CONFIG, bench, 24, 1024, 32, 300, dt)  -- the first call in the process includes cuBLAS start-up
    add(CONFIG, bench, 96, 512, 16, 300, dt)
    add(CONFIG, bench, 8, 4096, 4096, dt == "f32" and 20 or 100, dt)
  end
  for _, dt in ipairs({"f32", "bf16"}) do
    add(FUSED, bench_fused_wgrad, 24, 1024, 32, 300, dt)
    add(FUSED, bench_fused_wgrad, 96, 512, 16, 300, dt)
  end
end
if what == "scaling" or what == "all" then
  add("scaling: %d callables (warm-up)", scaling, 8)  -- warm the process, as the reference does
  for _, n in ipairs({8, 32, 128, 512}) do add("scaling: %d callables", scaling, n) end
  for _, m in ipairs({1, 2, 4, 8}) do
    add("microbatches: %d, reuse %s", microbatches, m, false)
    add("microbatches: %d, reuse %s", microbatches, m, true)
  end
end
if what == "transformer" or what == "all" then
  -- each configuration with both attentions; few steps keep the section
  -- short (each time is the mean of `iters` steps after 10 untimed ones)
  local TF = "transformer %s: L=%d d=%d heads=%d S=%d B=%d, %d iters, bf16"
  for _, impl in ipairs(impls) do
    add(TF, bench_transformer, impl, 24, 256, 4, 128, 4, 100)  -- launch-bound
    add(TF, bench_transformer, impl, 12, 768, 12, 1024, 8, 20) -- compute-bound
  end
end
if #runs == 0 then
  io.stderr:write("usage: graphcap bench/bench.lua [configs|scaling|transformer [IMPL]|all]\n")
  os.exit(1)
end

for i, r in ipairs(runs) do
  io.stderr:write(("bench: [%d/%d] %s ..."):format(i, #runs, r.label))
  io.stderr:flush()
  local t0 = gc.clock()
  r.fn(table.unpack(r.args, 1, r.args.n))
  collectgarbage() -- the run's modules and graphs give their memory back before the next
  io.stderr:write((" %.1f s\n"):format(gc.clock() - t0))
end
