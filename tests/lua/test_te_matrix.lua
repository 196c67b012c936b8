-- test_te_matrix.lua: TransformerEngine's test matrix for graphed
-- callables, on graphcap's transformer modules. For each module kind, three
-- layers trained for 3 SGD steps of 2 microbatches each (grads accumulated,
-- zero_grad without set_to_none) give the same params, grads and last output
-- bit for bit whether run eagerly, graphed as one callable (a Sequential of
-- the three) or graphed layer by layer; f32 and bf16. Data is laid out
-- [seq, batch, hidden]; warmup samples are ones, real data random.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_te_matrix.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

-- Tiny dims: seq 4, batch 2, hidden 16 (2 heads of 8), ffn 32.
local S, B, HID, HEADS, FFN = 4, 2, 16, 2, 32
local WARMUP = 10

-- One layer of each kind, from the generator as it stands.
local KINDS = {
  linear = function () return gc.nn.Linear(HID, HID) end,
  layernorm_linear = function () return gc.nn.LayerNormLinear(HID, HID) end,
  layernorm_mlp_nocheckpoint = function () return gc.nn.LayerNormMLP(HID, FFN) end,
  layernorm_mlp_checkpoint = function ()
    return gc.nn.LayerNormMLP(HID, FFN, {checkpoint = true})
  end,
  mha = function ()
    return gc.nn.MultiheadAttention(HID, HEADS, {attention_dropout = 0.0, input_layernorm = true})
  end,
  transformer = function ()
    return gc.nn.TransformerLayer(HID, FFN, HEADS, {hidden_dropout = 0.0, attention_dropout = 0.0})
  end,
  -- with dropout: graphed replays draw what eager calls draw
  transformer_dropout = function ()
    return gc.nn.TransformerLayer(HID, FFN, HEADS, {hidden_dropout = 0.1, attention_dropout = 0.1})
  end,
}

-- Three layers of `kind` in dtype dt, from seed 7.
local function layers (kind, dt)
  gc.manual_seed(7)
  local mods = {}
  for i = 1, 3 do
    mods[i] = KINDS[kind]()
    mods[i]:to(dt)
  end
  return mods
end

local function sample (dt)
  return gc.ones({S, B, HID}, {dtype = dt, requires_grad = true})
end

-- Train `model` (callable on x) over the layers' parameters `params`:
-- the nested values of every param, grad and the last output.
local function train (model, params, dt)
  local opt = gc.optim.SGD(params, {lr = 1e-3})
  local y
  gc.manual_seed(12)
  for _ = 1, 3 do
    opt:zero_grad({set_to_none = false})
    for _ = 1, 2 do
      local x = gc.randn({S, B, HID}, {dtype = dt, requires_grad = true})
      y = model(x);
      (y * gc.randn({S, B, HID}, {dtype = dt})):sum():backward()
    end
    opt:step()
  end
  local res = {out = y:tolist(), params = {}, grads = {}}
  for i, p in ipairs(params) do
    res.params[i] = p:tolist()
    res.grads[i] = p.grad:tolist()
  end
  return res
end

-- The result of training `kind` in dt under graph mode "none", "full" or
-- "individual".
local function run (kind, dt, mode)
  local mods = layers(kind, dt)
  local seq = gc.nn.Sequential(mods)
  local graphed = {}  -- the graphed modules, replayed by each call
  if mode == "full" then
    graphed = {gc.make_graphed_callables(seq, {sample(dt)}, {num_warmup_iters = WARMUP})}
  elseif mode == "individual" then
    local samples = {}
    for i = 1, #mods do samples[i] = {sample(dt)} end
    graphed = gc.make_graphed_callables(mods, samples, {num_warmup_iters = WARMUP})
  end
  local res = train(seq, H.all_params(mods), dt)
  for i, g in ipairs(graphed) do  -- 6 calls, each a forward and a backward replay
    lu.assertEquals(g:stats().fwd.replays, 6, mode .. " entry " .. i .. ": forward replays")
    lu.assertEquals(g:stats().bwd.replays, 6, mode .. " entry " .. i .. ": backward replays")
  end
  return res
end

local function check (kind, dt)
  local eager = run(kind, dt, "none")
  for _, mode in ipairs({"full", "individual"}) do
    local got = run(kind, dt, mode)
    H.assert_same(got.out, eager.out, kind .. " " .. dt .. " " .. mode .. ": output")
    H.assert_same(got.params, eager.params, kind .. " " .. dt .. " " .. mode .. ": params")
    H.assert_same(got.grads, eager.grads, kind .. " " .. dt .. " " .. mode .. ": grads")
  end
  return eager
end

TestTEMatrix = {tearDown = H.no_capture_left}

-- One test per kind and dtype, named as TE's parametrization.
for kind in pairs(KINDS) do
  for _, dt in ipairs({"f32", "bf16"}) do
    TestTEMatrix["test_" .. kind .. "_" .. dt] = function () check(kind, dt) end
  end
end

-- The harness can fail: a graphed model whose layers were built from
-- another seed differs from eager.
function TestTEMatrix:test_harness_sees_a_difference ()
  local eager = run("layernorm_mlp_nocheckpoint", "f32", "none")
  local mods = layers("layernorm_mlp_nocheckpoint", "f32")
  gc.no_grad(function () mods[2].fc1_weight:copy_(mods[2].fc1_weight * 1.5) end)
  local got = train(gc.nn.Sequential(mods), H.all_params(mods), "f32")
  lu.assertFalse(pcall(H.assert_same, got.params, eager.params, "params"))
end

-- Checkpointing changes what is kept, not the values: a checkpointed
-- LayerNormMLP trains as the plain one does (within rounding of a
-- different schedule of the same kernels: here equal bit for bit on host).
function TestTEMatrix:test_checkpoint_matches_plain ()
  local plain = run("layernorm_mlp_nocheckpoint", "f32", "none")
  local ckpt = run("layernorm_mlp_checkpoint", "f32", "none")
  H.assert_close(ckpt.params, plain.params, 1e-6, 1e-5, "params")
  H.assert_close(ckpt.grads, plain.grads, 1e-6, 1e-5, "grads")
  H.assert_close(ckpt.out, plain.out, 1e-6, 1e-5, "output")
end

-- A checkpointed call keeps one node over the whole MLP; a plain one, its
-- last linear.
function TestTEMatrix:test_checkpoint_is_one_node ()
  gc.manual_seed(1)
  local x = gc.randn({S, B, HID}, {requires_grad = true})
  lu.assertEquals(gc.nn.LayerNormMLP(HID, FFN, {checkpoint = true})(x).grad_fn, "LayerNormMLP")
  lu.assertEquals(gc.nn.LayerNormMLP(HID, FFN)(x).grad_fn, "linear")
end

-- Embedding, TE's matrix way: an Embedding then two TransformerLayers,
-- graphed as one callable or layer by layer (the embedding's input is ids,
-- which need no grad), trained as the other kinds; equal to eager bit for
-- bit, f32 and bf16.
local function embedding_run (dt, mode)
  gc.manual_seed(9)
  local mods = {gc.nn.Embedding(11, HID):to(dt)}
  for i = 2, 3 do mods[i] = KINDS.transformer():to(dt) end
  local seq = gc.nn.Sequential(mods)
  local function ids ()
    local t = {}
    for s = 1, S do
      t[s] = {}
      for b = 1, B do t[s][b] = math.random(0, 10) end
    end
    return gc.tensor(t)
  end
  if mode == "full" then
    gc.make_graphed_callables(seq, {ids()}, {num_warmup_iters = WARMUP})
  elseif mode == "individual" then
    gc.make_graphed_callables(mods, {{ids()}, {sample(dt)}, {sample(dt)}},
                              {num_warmup_iters = WARMUP})
  end
  local params = H.all_params(mods)
  local opt = gc.optim.SGD(params, {lr = 1e-3})
  local y
  gc.manual_seed(12)
  math.randomseed(12)
  for _ = 1, 3 do
    opt:zero_grad({set_to_none = false})
    for _ = 1, 2 do
      y = seq(ids());
      (y * gc.randn({S, B, HID}, {dtype = dt})):sum():backward()
    end
    opt:step()
  end
  local res = {y:tolist()}
  for _, p in ipairs(params) do res[#res + 1] = {p:tolist(), p.grad:tolist()} end
  return res
end

for _, dt in ipairs({"f32", "bf16"}) do
  TestTEMatrix["test_embedding_" .. dt] = function ()
    local eager = embedding_run(dt, "none")
    for _, mode in ipairs({"full", "individual"}) do
      H.assert_same(embedding_run(dt, mode), eager, "Embedding " .. dt .. " " .. mode)
    end
  end
end

-- A random attention mask [B, 1, S, S] of 0 and 1 (1: masked out), from
-- Lua's generator; the diagonal is never masked, so no row is empty.
local function random_mask (dt)
  local m = {}
  for b = 1, B do
    m[b] = {{}}
    for i = 1, S do
      m[b][1][i] = {}
      for j = 1, S do m[b][1][i][j] = (i ~= j and math.random() < 0.5) and 1 or 0 end
    end
  end
  return gc.tensor(m, dt)
end

-- TE's DotProductAttention test: q, k, v require grad, 10 warmup
-- iterations, 3 forward and backward replays equal to eager calls.
local function dpa_case (mask_type, dt)
  local D = HID // HEADS
  local function qkv ()
    local t = {}
    for i = 1, 3 do t[i] = gc.randn({S, B, HEADS, D}, {dtype = dt, requires_grad = true}) end
    return t
  end
  local function run3 (f)
    gc.manual_seed(21)
    local res = {}
    for _ = 1, 3 do
      local x = qkv()
      local y = f(x[1], x[2], x[3]);
      (y * gc.randn(y:shape(), {dtype = dt})):sum():backward()
      res[#res + 1] = {y:tolist(), x[1].grad:tolist(), x[2].grad:tolist(), x[3].grad:tolist()}
    end
    return res
  end
  local opts = {attn_mask_type = mask_type}
  local eager = run3(gc.nn.DotProductAttention(HEADS, D, opts))
  local samples = qkv()
  for i = 1, 3 do samples[i] = gc.ones({S, B, HEADS, D}, {dtype = dt, requires_grad = true}) end
  local g = gc.make_graphed_callables(gc.nn.DotProductAttention(HEADS, D, opts), samples,
                                      {num_warmup_iters = 10})
  local got = run3(g)
  lu.assertEquals(g:stats().fwd.replays, 3)
  lu.assertEquals(g:stats().bwd.replays, 3)
  H.assert_same(got, eager, "DotProductAttention " .. mask_type .. " " .. dt)
  lu.assertEquals(#eager[1][1], S)
  lu.assertEquals(#eager[1][1][1][1], HID)  -- [S, B, H * D]
end

for _, mt in ipairs({"causal", "no_mask"}) do
  for _, dt in ipairs({"f32", "bf16"}) do
    TestTEMatrix["test_dot_product_attention_" .. mt .. "_" .. dt] = function () dpa_case(mt, dt) end
  end
end

-- TE's kwargs test: a TransformerLayer with self_attn_mask_type
-- "arbitrary" graphed with the mask in sample_kwargs and allow_unused_input;
-- replays with fresh random masks match eager calls, outputs and grads.
function TestTEMatrix:test_transformer_layer_kwargs ()
  local function layer ()
    gc.manual_seed(3)
    return gc.nn.TransformerLayer(HID, FFN, HEADS, {self_attn_mask_type = "arbitrary",
                                                    hidden_dropout = 0, attention_dropout = 0})
  end
  local function run3 (f, params)
    gc.manual_seed(8)
    math.randomseed(8)
    local res = {}
    for _ = 1, 3 do
      local x = gc.randn({S, B, HID}, {requires_grad = true})
      local y = f(x, {attention_mask = random_mask()});
      (y * gc.randn({S, B, HID})):sum():backward()
      res[#res + 1] = {y:tolist(), x.grad:tolist()}
    end
    for _, p in ipairs(params) do res[#res + 1] = p.grad:tolist() end
    return res
  end
  local m = layer()
  local eager = run3(m, m:parameters())
  local g = layer()
  math.randomseed(1)
  gc.make_graphed_callables(g, {gc.ones({S, B, HID}, {requires_grad = true})},
                            {sample_kwargs = {attention_mask = random_mask()},
                             allow_unused_input = true, num_warmup_iters = 3})
  local got = run3(g, g:parameters())
  lu.assertEquals(g:stats().fwd.replays, 3)
  H.assert_same(got, eager, "TransformerLayer with attention_mask")
  -- the masks matter: without one the result differs
  local plain = layer()
  local ok = pcall(H.assert_same, run3(function (x) return plain(x, {attention_mask =
                                         gc.zeros({B, 1, S, S})}) end, plain:parameters()), eager, "")
  lu.assertFalse(ok, "a zero mask gave the same results as random masks")
end

-- capture_time_hooks and order with TransformerLayers: 2 chunks of one
-- layer, 2 microbatches, 1F1B; hooks run at construction (never during a
-- capture, never at replay) and training matches eager bit for bit.
function TestTEMatrix:test_transformer_layers_order_and_hooks ()
  local CFG = {order = {1, 2, -2, 1, -1, 2, -2, -1}, layers = {1, 1}}
  local function layer_pair ()
    gc.manual_seed(4)
    return {gc.nn.TransformerLayer(HID, FFN, HEADS, {hidden_dropout = 0.1, attention_dropout = 0.1}),
            gc.nn.TransformerLayer(HID, FFN, HEADS, {hidden_dropout = 0.1, attention_dropout = 0.1})}
  end
  local function train_steps (call, mods)
    local res = {}
    gc.manual_seed(6)
    for _ = 1, 2 do
      local xs, losses = {}, {}
      H.walk(CFG, function (i, c)
                    xs[i] = gc.randn({S, B, HID}, {requires_grad = true})
                    local y = call(i, c, xs[i])
                    res[#res + 1] = y:tolist()
                    losses[i] = (y * gc.randn({S, B, HID})):sum()
                  end,
             function (i) losses[i]:backward() end)
      for i = 1, #xs do res[#res + 1] = xs[i].grad:tolist() end
    end
    for _, p in ipairs(H.all_params(mods)) do res[#res + 1] = p.grad:tolist() end
    return res
  end
  local eager_mods = layer_pair()
  local eager = train_steps(function (_, c, x) return eager_mods[c](x) end, eager_mods)
  local mods = layer_pair()
  local calls, capturing = {}, 0
  local function hook (name)
    return function (m)
      calls[#calls + 1] = name .. ":" .. m:type()
      if gc.is_capturing() then capturing = capturing + 1 end
    end
  end
  local hooks = {}
  for c = 1, 2 do
    hooks[c] = {forward_pre_hooks = {hook("fwd_pre" .. c)},
                backward_hooks = {hook("bwd" .. c)}}
  end
  local samples = {}
  for i = 1, 4 do samples[i] = {gc.ones({S, B, HID}, {requires_grad = true})} end
  local G = gc.make_graphed_callables(mods, samples, {order = CFG.order,
                                                      num_layers_per_chunk = {1, 1},
                                                      capture_time_hooks = hooks,
                                                      num_warmup_iters = 2})
  lu.assertEquals(#G, 4)
  lu.assertEquals(capturing, 0)
  local n = #calls
  -- each hook ran around every warmup and capture pass of its callable's
  -- entries: (2 warmups + 1 capture) x 2 microbatches
  for c = 1, 2 do
    local k = 0
    for _, v in ipairs(calls) do if v == "fwd_pre" .. c .. ":TransformerLayer" then k = k + 1 end end
    lu.assertEquals(k, 6, "forward pre-hook of callable " .. c)
  end
  local got = train_steps(function (i, _, x) return G[i](x) end, mods)
  lu.assertEquals(#calls, n, "a capture-time hook ran at replay")
  H.assert_same(got, eager, "TransformerLayers with order and capture_time_hooks")
end

os.exit(lu.LuaUnit.run(), true)
