-- bench.lua: graphcap's side of bench/torch_graphed.py (PyTorch's
-- make_graphed_callables on the same model), run on a GPU by `make bench`.
-- A stack of L x (Linear(H, H) + GELU), batch B, forward + backward of the
-- sum; one JSON line per configuration with the same fields as that script,
-- then the scaling runs (one JSON line each); `transformer` runs the
-- transformer section (bench/torch_transformer.py is PyTorch's side), with
-- each attention implementation or only the one named after it; `fp8` runs
-- the FP8 section (bench/torch_fp8.py is PyTorch's side), `fp8 tiny` the
-- same at sizes the host backend runs in seconds.
-- Usage: graphcap bench/bench.lua [configs|scaling|transformer [IMPL]|fp8 [tiny]|all]
local gc = require "graphcap"

local USAGE = "usage: graphcap bench/bench.lua "
              .. "[configs|scaling|transformer [IMPL]|fp8 [tiny]|all]\n"
local what = arg[1] or "all"
local impls = what == "transformer" and arg[2] and {arg[2]} or {"auto", "composed", "fused"}
local tiny = what == "fp8" and arg[2] == "tiny"
if what == "fp8" and arg[2] and not tiny then
  io.stderr:write(USAGE)
  os.exit(1)
end

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

-- The FP8 section runs each measurement in bf16 (fp8 false) and under an
-- FP8 autocast with a recipe of these names (TransformerEngine's, with
-- their defaults): fp8 is false or one of the names. Other sections pass
-- nil: their lines stay as they were.
local RECIPES = {"DelayedScaling", "Float8CurrentScaling"}
local function recipe_of (fp8) return fp8 and gc.fp8[fp8]{} or nil end

-- fn, or fn under an FP8 autocast of the recipe object r.
local function fp8_wrap (fn, r)
  if not r then return fn end
  return function () return gc.fp8.autocast({recipe = r}, fn) end
end

-- Prints a line: "model" first (when not nil), then the pairs of `fields`
-- in order ({"L", L, "H", H, ...}); when fp8 is not nil (the FP8 section),
-- "fp8" (true or false) and "recipe" ("none" in bf16) after "dtype".
local function emit (model, fp8, fields)
  local t, order = {}, {}
  local function put (k, v) t[k], order[#order + 1] = v, k end
  if model then put("model", model) end
  for i = 1, #fields, 2 do
    put(fields[i], fields[i + 1])
    if fields[i] == "dtype" and fp8 ~= nil then
      put("fp8", fp8 ~= false)
      put("recipe", fp8 or "none")
    end
  end
  json(t, order)
end

-- One sample input of [B, H] per callable.
local function samples (n, B, H, dt)
  local sample = {}
  for i = 1, n do sample[i] = {gc.randn({B, H}, {requires_grad = true, dtype = dt})} end
  return sample
end

-- make_graphed_callables of mods in a pool of their own (captured under an
-- FP8 autocast of recipe r, if given), timed to completion: the graphed
-- callables, seconds, bytes the pool reserves.
local function graph_timed (mods, sample, r)
  local pool = gc.graph_pool_handle()
  gc.synchronize()
  local t0 = gc.clock()
  local graphed = gc.make_graphed_callables(mods, sample, {pool = pool, fp8_enabled = r ~= nil,
                                                           fp8_recipe = r})
  gc.synchronize()
  return graphed, gc.clock() - t0, pool:stats().reserved_bytes
end

-- us per call of fn, after 10 untimed calls.
local function warm_us (fn, iters)
  for _ = 1, 10 do fn() end
  return time_us(fn, iters)
end

-- us per step of `layers` on x (under an FP8 autocast of recipe r, if
-- given), after 10 untimed steps.
local function step_us (layers, x, iters, r)
  return warm_us(fp8_wrap(function () step(layers, x) end, r), iters)
end

-- fn captured as one graph, warmed up by 3 calls on a side stream first (an
-- FP8 autocast makes its modules' state there), `before` run between the
-- two: the mean time of one replay after 10 untimed ones, and the bytes the
-- graph's pool reserves.
local function graph_us (fn, iters, before)
  local s = gc.Stream()
  gc.with_stream(s, function () for _ = 1, 3 do fn() end end)
  gc.synchronize()
  if before then before() end
  local g = gc.Graph()
  g:capture(fn)
  local us = warm_us(function () g:replay() end, iters)
  return us, g:pool():stats().reserved_bytes
end

-- The mean time of one replay of the whole step on mods captured as one
-- graph (under an FP8 autocast of recipe r, if given), and the graph's
-- pool bytes.
local function whole_graph_us (mods, x, iters, r)
  return graph_us(fp8_wrap(function () step(mods, x) end, r), iters, function ()
    for _, m in ipairs(mods) do m:zero_grad() end
    x.grad = nil
  end)
end

-- fp8: nil (the configs section), or as RECIPES says (the FP8 section).
local function bench (L, H, B, iters, dt, fp8)
  local r = recipe_of(fp8)
  gc.manual_seed(0)
  local x = gc.randn({B, H}, {requires_grad = true, dtype = dt})
  local layers = stack(L, H, dt)
  local eager_us = step_us(layers, x, iters, r)

  -- one graphed callable per layer, all in one pool
  local graphed, capture_s, graph_mem = graph_timed(layers, samples(L, B, H, dt), r)
  local graphed_us = step_us(graphed, x, iters)

  -- the whole step as one graph, on fresh modules
  local whole_us = whole_graph_us(stack(L, H, dt), x, iters, r)

  emit(fp8 ~= nil and "mlp" or nil, fp8,
       {"L", L, "H", H, "B", B, "dtype", dt == "bf16" and "bfloat16" or "float32",
        "eager_us", eager_us, "graphed_per_layer_us", graphed_us, "whole_graph_us", whole_us,
        "capture_s", capture_s, "graph_mem_mib", mib(graph_mem), "graphcap", gc.version()})
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

-- fp8: nil (the transformer section), or as RECIPES says (the FP8 section:
-- the layers' linears run FP8, the attention bf16, as TransformerEngine's).
local function bench_transformer (impl, L, d, heads, S, B, iters, fp8)
  local r = recipe_of(fp8)
  gc.manual_seed(0)
  local x = gc.randn({S, B, d}, {requires_grad = true, dtype = "bf16"})
  local eager_us = step_us(tstack(L, d, heads, impl), x, iters, r)
  local sample = {}
  for i = 1, L do sample[i] = {gc.randn({S, B, d}, {requires_grad = true, dtype = "bf16"})} end
  local layers = tstack(L, d, heads, impl)
  local graphed, capture_s, graph_mem = graph_timed(layers, sample, r)
  local graphed_us = step_us(graphed, x, iters)
  local whole_us = whole_graph_us(tstack(L, d, heads, impl), x, iters, r)
  emit("transformer", fp8,
       {"L", L, "d", d, "heads", heads, "S", S, "B", B, "dtype", "bfloat16", "attn_impl", impl,
        "eager_us", eager_us, "graphed_per_layer_us", graphed_us, "whole_graph_us", whole_us,
        "capture_s", capture_s, "graph_mem_mib", mib(graph_mem), "graphcap", gc.version()})
end

-- The FP8 section's GEMM, [M, K] x [K, N]: Linear(K, N, bias = false) in
-- bf16 on x [M, K], forward only, nothing recorded for autograd; eager, and
-- one call captured as a graph, whose replays carry no launch cost.
-- tflops: 2 M N K over the time of a replay. fp8 as RECIPES says.
local function bench_gemm (M, N, K, iters, fp8)
  local r = recipe_of(fp8)
  gc.manual_seed(0)
  local lin = gc.nn.Linear(K, N, {bias = false}):to("bf16")
  local x = gc.randn({M, K}, {dtype = "bf16"})
  local fwd = fp8_wrap(function () return lin(x) end, r)
  local function call () return gc.no_grad(fwd) end
  local eager_us = warm_us(call, iters)
  local whole_us, graph_mem = graph_us(call, iters)
  emit("gemm", fp8, {"M", M, "N", N, "K", K, "dtype", "bfloat16", "eager_us", eager_us,
                     "whole_graph_us", whole_us, "tflops", 2 * M * N * K / whole_us * 1e-6,
                     "graph_mem_mib", mib(graph_mem), "graphcap", gc.version()})
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
-- The FP8 section: the GEMM, the MLP of `configs` at its large size and the
-- compute-bound transformer, each in bf16 and then under each recipe (its
-- line says which), so that ratios come from the lines of one run. `fp8
-- tiny`: the same at sizes the host backend runs in seconds. Skipped where
-- FP8 is not available (a GPU before compute capability 8.9).
local fp8_skipped = false
if what == "fp8" or what == "all" then
  local ok, why = gc.fp8.is_available()
  local n, gemm_iters = 8192, 50
  local mlp = {8, 4096, 4096, 100}        -- L, H, B, iters
  local tf = {12, 768, 12, 1024, 8, 20}   -- L, d, heads, S, B, iters
  if tiny then n, gemm_iters, mlp, tf = 64, 3, {2, 64, 32, 3}, {2, 64, 2, 16, 2, 3} end
  local modes = {false, table.unpack(RECIPES)}
  if not ok then
    fp8_skipped = true
    io.stderr:write("bench: fp8 section skipped: " .. tostring(why) .. "\n")
    modes = {}
  end
  for _, fp8 in ipairs(modes) do
    add("fp8 section, gemm %dx%dx%d, %d iters, fp8 %s", bench_gemm, n, n, n, gemm_iters, fp8)
  end
  for _, fp8 in ipairs(modes) do
    add("fp8 section, mlp L=%d H=%d B=%d, %d iters, %s, fp8 %s", bench, mlp[1], mlp[2], mlp[3],
        mlp[4], "bf16", fp8)
  end
  for _, fp8 in ipairs(modes) do
    add("fp8 section, transformer %s: L=%d d=%d heads=%d S=%d B=%d, %d iters, fp8 %s",
        bench_transformer, "auto", tf[1], tf[2], tf[3], tf[4], tf[5], tf[6], fp8)
  end
end
if #runs == 0 and not fp8_skipped then
  io.stderr:write(USAGE)
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
