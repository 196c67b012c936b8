-- test_transformer.lua: the transformer modules' Lua API: parameters and
-- children under TE's names, what the layers compute (against the same
-- composition written with graphcap's ops), keyword masks, Embedding,
-- checkpointing inside graphs, and the errors of options and calls (each
-- naming the module and the thing, at the caller's line, the module usable
-- afterwards).
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_transformer.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

local S, B, HID, HEADS = 4, 2, 16, 2
local D = HID // HEADS

TestTransformer = {tearDown = H.no_capture_left}

local function names (m)
  local out = {}
  for i, p in ipairs(m:named_parameters()) do out[i] = p[1] end
  return out
end

function TestTransformer:test_parameter_and_child_names ()
  lu.assertEquals(names(gc.nn.LayerNormLinear(8, 4)),
                  {"layer_norm_weight", "layer_norm_bias", "weight", "bias"})
  lu.assertEquals(names(gc.nn.LayerNormMLP(8, 12, {bias = false})),
                  {"layer_norm_weight", "layer_norm_bias", "fc1_weight", "fc2_weight"})
  lu.assertEquals(names(gc.nn.MultiheadAttention(HID, HEADS)),
                  {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"})
  local l = gc.nn.TransformerLayer(HID, 32, HEADS)
  lu.assertEquals(names(l), {
    "self_attention.layernorm_qkv.layer_norm_weight", "self_attention.layernorm_qkv.layer_norm_bias",
    "self_attention.layernorm_qkv.weight", "self_attention.layernorm_qkv.bias",
    "self_attention.proj.weight", "self_attention.proj.bias",
    "layernorm_mlp.layer_norm_weight", "layernorm_mlp.layer_norm_bias",
    "layernorm_mlp.fc1_weight", "layernorm_mlp.fc1_bias",
    "layernorm_mlp.fc2_weight", "layernorm_mlp.fc2_bias"})
  lu.assertEquals(l.self_attention.core_attention:type(), "DotProductAttention")
  lu.assertEquals(l.layernorm_mlp:type(), "LayerNormMLP")
  lu.assertEquals(names(gc.nn.DotProductAttention(2, 8)), {})
  lu.assertEquals(gc.nn.Embedding(10, 4).weight:shape(), {10, 4})
end

-- A TransformerLayer computes its pre-LN formula: the same values as the
-- composition of graphcap's functions over its parameters (bitwise on the
-- host, where both run the same kernels in the same order).
function TestTransformer:test_transformer_layer_formula ()
  gc.manual_seed(2)
  local l = gc.nn.TransformerLayer(HID, 32, HEADS, {hidden_dropout = 0, attention_dropout = 0})
  local x = gc.randn({S, B, HID})
  local a, m = l.self_attention, l.layernorm_mlp
  local q = a.layernorm_qkv
  local F = gc.F
  local qkv = F.linear(F.layer_norm(x, q.layer_norm_weight, q.layer_norm_bias), q.weight, q.bias)
  local parts = gc.split(qkv:reshape({S, B, HEADS, 3 * D}), D, 4)
  local function bhsd (t) return t:permute(2, 3, 1, 4) end
  local o = F.scaled_dot_product_attention(bhsd(parts[1]), bhsd(parts[2]), bhsd(parts[3]),
                                           {is_causal = true})
  local h = F.linear(o:permute(3, 1, 2, 4):reshape({S, B, HID}), a.proj.weight, a.proj.bias) + x
  local f = F.linear(F.gelu(F.linear(F.layer_norm(h, m.layer_norm_weight, m.layer_norm_bias),
                                     m.fc1_weight, m.fc1_bias)), m.fc2_weight, m.fc2_bias)
  H.assert_close(l(x):tolist(), (f + h):tolist(), 1e-6, 1e-5, "TransformerLayer")
end

-- Causal attention: position i does not depend on later positions.
function TestTransformer:test_causal ()
  gc.manual_seed(3)
  local l = gc.nn.TransformerLayer(HID, 32, HEADS, {hidden_dropout = 0, attention_dropout = 0})
  local x = gc.randn({S, B, HID})
  local y1 = l(x):tolist()
  local rows = gc.split(x, 1, 1)
  local x2 = gc.cat({rows[1], rows[2], rows[3], gc.randn({1, B, HID})}, 1)
  local y2 = l(x2):tolist()
  for s = 1, S - 1 do H.assert_bitwise(y2[s], y1[s], "position " .. s) end
  lu.assertNotEquals(y2[S], y1[S])
end

-- An arbitrary mask through the keyword map, nonzero = masked out: a mask
-- of the causal pattern gives the causal layer's values.
function TestTransformer:test_mask_keyword ()
  local function layer (mt)
    gc.manual_seed(4)
    return gc.nn.TransformerLayer(HID, 32, HEADS, {self_attn_mask_type = mt, hidden_dropout = 0,
                                                   attention_dropout = 0})
  end
  local m = {}
  for i = 1, S do
    m[i] = {}
    for j = 1, S do m[i][j] = j > i and 1 or 0 end
  end
  local mask = gc.tensor({{m}})  -- [1, 1, S, S]
  gc.manual_seed(5)
  local x = gc.randn({S, B, HID})
  H.assert_bitwise(layer("arbitrary")(x, {attention_mask = mask}):tolist(),
                   layer("causal")(x):tolist(), "mask = causal")
  local none = layer("no_mask")(x):tolist()
  H.assert_bitwise(layer("arbitrary")(x, {attention_mask = gc.zeros({1, 1, S, S})}):tolist(), none,
                   "zero mask = no mask")
  -- DotProductAttention takes the mask the same way
  local dpa = gc.nn.DotProductAttention(HEADS, D, {attn_mask_type = "arbitrary"})
  local q = gc.randn({S, B, HEADS, D})
  H.assert_bitwise(dpa(q, q, q, {attention_mask = mask}):tolist(),
                   gc.nn.DotProductAttention(HEADS, D)(q, q, q):tolist(), "DotProductAttention")
end

-- A checkpointed LayerNormMLP's graphed backward recomputes the MLP: it
-- holds more kernels than the plain one's, and its grads are equal to the
-- eager checkpointed ones (test_te_matrix.lua trains them).
-- A checkpointed LayerNormMLP whose parameter was written in place after its
-- forward refuses its backward as PyTorch refuses a saved tensor's, naming
-- the parameter (its recomputation would read the new values); the module
-- not checkpointed refuses too.
function TestTransformer:test_checkpoint_parameter_written_after_forward ()
  for _, ckpt in ipairs({true, false}) do
    local m = gc.nn.LayerNormMLP(HID, 32, {checkpoint = ckpt})
    local x = gc.randn({S, B, HID}, {requires_grad = true})
    local y = m(x)
    gc.no_grad(function () m.fc1_weight:copy_(m.fc1_weight * gc.tensor(2)) end)
    local err = H.assert_err(function () y:sum():backward() end,
                             "one of the variables needed for gradient computation has been "
                             .. "modified by an inplace operation")
    if ckpt then lu.assertStrContains(err, "parameter fc1_weight of the checkpointed") end
  end
end

function TestTransformer:test_checkpoint_recomputes_in_graph ()
  local function bwd_nodes (ckpt)
    gc.manual_seed(1)
    local m = gc.nn.LayerNormMLP(HID, 32, {checkpoint = ckpt})
    gc.make_graphed_callables(m, {gc.ones({S, B, HID}, {requires_grad = true})})
    return m:stats().bwd.nodes
  end
  lu.assertTrue(bwd_nodes(true) > bwd_nodes(false))
end

-- Embedding: rows by id; grads summed per row; graphed equal to eager.
function TestTransformer:test_embedding ()
  gc.manual_seed(6)
  local e = gc.nn.Embedding(5, 3)
  local ids = gc.tensor({{0, 4}, {4, 2}})
  local y = e(ids)
  lu.assertEquals(y:shape(), {2, 2, 3})
  local w = e.weight:tolist()
  H.assert_bitwise(y:tolist()[2][1], w[5], "row 4")
  y:sum():backward()
  local g = e.weight.grad:tolist()
  lu.assertEquals(g, {{1, 1, 1}, {0, 0, 0}, {1, 1, 1}, {0, 0, 0}, {2, 2, 2}})
  gc.manual_seed(6)
  local eg = gc.nn.Embedding(5, 3)
  gc.make_graphed_callables(eg, {gc.zeros({2, 2})})
  local y2 = eg(ids)
  H.assert_bitwise(y2:tolist(), y:tolist(), "graphed")
  y2:sum():backward()
  H.assert_bitwise(eg.weight.grad:tolist(), g, "graphed grad")
end

-- return_layernorm_output: two outputs, the second the layer norm's; graphed,
-- both replay and the grads through both equal eager's.
function TestTransformer:test_return_layernorm_output ()
  local function run (graphed)
    gc.manual_seed(7)
    local m = gc.nn.LayerNormLinear(HID, 8, {return_layernorm_output = true})
    if graphed then gc.make_graphed_callables(m, {gc.ones({S, B, HID}, {requires_grad = true})}) end
    local x = gc.randn({S, B, HID}, {requires_grad = true})
    local y, ln = m(x)
    lu.assertEquals(y:shape(), {S, B, 8})
    lu.assertEquals(ln:shape(), {S, B, HID})
    H.assert_bitwise(ln:tolist(),
                     gc.F.layer_norm(x, m.layer_norm_weight, m.layer_norm_bias):tolist(), "ln");
    (y:sum() + (ln * ln):sum()):backward()
    return {y:tolist(), ln:tolist(), x.grad:tolist(), m.weight.grad:tolist(),
            m.layer_norm_weight.grad:tolist()}
  end
  H.assert_same(run(true), run(false), "graphed")
end

-- attn_impl reaches the attention: "fused" and "composed" layers of the
-- same parameters agree on outputs and input grads (f32, within rounding).
function TestTransformer:test_attn_impl ()
  local x = gc.randn({S, B, HID})
  local y, g = {}, {}
  for _, impl in ipairs({"composed", "fused", "auto"}) do
    gc.manual_seed(3)
    local l = gc.nn.TransformerLayer(HID, 32, HEADS, {hidden_dropout = 0, attention_dropout = 0,
                                                      attn_impl = impl})
    local xi = x:clone():requires_grad_(true)
    y[impl] = l(xi)
    y[impl]:sum():backward()
    g[impl] = xi.grad
  end
  for _, impl in ipairs({"fused", "auto"}) do
    H.assert_close(y[impl]:tolist(), y.composed:tolist(), 1e-5, 1e-4, impl .. " output")
    H.assert_close(g[impl]:tolist(), g.composed:tolist(), 1e-5, 1e-4, impl .. " grad")
  end
end

-- Where cuDNN takes the call (bf16 on cuda), MultiheadAttention's core
-- attention reads q, k and v in place from the qkv projection: the values of
-- the split path (which a hook on core_attention makes it take) within
-- bf16's rounding, forward and every grad; graphed equals eager bit for bit.
function TestTransformer:test_packed_attention_equals_split ()
  local S2, B2, HID2, H2 = 16, 2, 128, 2 -- head dim 64
  local function run (hooked, graphed)
    gc.manual_seed(5)
    local l = gc.nn.TransformerLayer(HID2, 2 * HID2, H2, {hidden_dropout = 0,
                                                          attention_dropout = 0}):to("bf16")
    if hooked then l.self_attention.core_attention:register_forward_hook(function () end) end
    gc.manual_seed(6)
    local x = gc.randn({S2, B2, HID2}, {dtype = "bf16", requires_grad = true})
    local w = gc.randn({S2, B2, HID2}, {dtype = "bf16"})
    lu.assertNil(l:attention_stats()) -- no call yet
    local f = l
    if graphed then
      f = gc.make_graphed_callables(l, {gc.randn({S2, B2, HID2}, {dtype = "bf16",
                                                                  requires_grad = true})})
    end
    local y = f(x)
    local loss = (y * w):sum()
    loss:backward()
    local qkv = l.self_attention.layernorm_qkv
    return {y = y:tolist(), dx = x.grad:tolist(), dw = qkv.weight.grad:tolist(),
            dln = qkv.layer_norm_weight.grad:tolist(), stats = l:attention_stats()}
  end
  local packed, split = run(false), run(true)
  if gc.device() == "cuda" then -- cuDNN: packed, unless a hook asks for q, k and v
    lu.assertEquals(packed.stats, {impl = "cudnn", packed = true})
    lu.assertEquals(split.stats, {impl = "cudnn", packed = false, why = "core_attention has hooks "
                                  .. "or a graph of its own, so q, k and v are split for its call"})
  else -- the host runs the composition, and says why
    lu.assertEquals(packed.stats, {impl = "composed", packed = false, why = "the host backend "
                                   .. "has no cuDNN (it runs the composition, the reference)"})
  end
  for _, k in ipairs({"y", "dx", "dw", "dln"}) do
    H.assert_close(packed[k], split[k], 3e-2, 3e-2, k .. ": packed against split")
  end
  local g = run(false, true)
  lu.assertEquals(g.stats, packed.stats) -- as it ran at capture
  for _, k in ipairs({"y", "dx", "dw", "dln"}) do
    H.assert_bitwise(g[k], packed[k], k .. ": graphed against eager")
  end
end

-- attention_stats says which implementation an attention module's last
-- call ran, and why cuDNN did not; a failed call leaves them as they were.
function TestTransformer:test_attention_stats ()
  local q = gc.randn({S, B, HEADS, D})
  for _, impl in ipairs({"composed", "fused"}) do
    local a = gc.nn.DotProductAttention(HEADS, D, {attn_impl = impl})
    lu.assertNil(a:attention_stats())
    a(q, q, q)
    lu.assertEquals(a:attention_stats(), {impl = impl, packed = false, why = "impl '" .. impl
                                          .. "' asks for the " .. (impl == "fused" and
                                          "own fused kernels" or "composition")})
  end
  local mha = gc.nn.MultiheadAttention(HID, HEADS, {attention_dropout = 0})
  mha(gc.randn({S, B, HID}))
  local st = mha:attention_stats() -- f32: cuDNN takes bf16 alone
  lu.assertEquals({st.impl, st.packed}, {"composed", false})
  lu.assertNil(gc.nn.Linear(2, 2):attention_stats())
  local a = gc.nn.DotProductAttention(HEADS, D, {attn_impl = "fused"})
  a(q, q, q)
  local was = a:attention_stats()
  lu.assertFalse(pcall(a, q, q, gc.randn({S, B, HEADS, D + 1})))
  lu.assertEquals(a:attention_stats(), was)
end

-- Errors name the module and the thing, at the caller's line; the module
-- stays usable.
function TestTransformer:test_errors ()
  local padding = {self_attn_mask_type = "padding"}
  local line = debug.getinfo(1, "l").currentline
  local function at (n) return "test_transformer.lua:" .. (line + n) .. ":" end
  H.assert_err(function () local r = gc.nn.TransformerLayer(HID, 32, HEADS, {fuse_qkv_params = true}); return r end,
               at(2), "TransformerLayer: unknown option 'fuse_qkv_params'")
  H.assert_err(function () local r = gc.nn.TransformerLayer(HID, 32, HEADS, padding); return r end,
               at(4), 'TransformerLayer: self_attn_mask_type must be "causal", "arbitrary" or "no_mask", got "padding"')
  H.assert_err(function () local r = gc.nn.TransformerLayer(10, 32, 4); return r end,
               at(6), "TransformerLayer: hidden_size 10 is not a multiple of num_attention_heads 4")
  H.assert_err(function () local r = gc.nn.LayerNormMLP(8, 8, {activation = "relu"}); return r end,
               at(8), 'LayerNormMLP: activation must be "gelu", got "relu"')
  H.assert_err(function () local r = gc.nn.DotProductAttention(2, 8, {attention_dropout = 1}); return r end,
               at(10), "DotProductAttention: attention_dropout must be in [0, 1), got 1")
  H.assert_err(function () local r = gc.nn.Embedding(0, 4); return r end,
               at(12), "Embedding: num_embeddings must be positive, got 0")
  H.assert_err(function () local r = gc.nn.MultiheadAttention(HID, 2.5); return r end,
               at(14), "MultiheadAttention: num_attention_heads must be an integer, got float")
  H.assert_err(function () local r = gc.nn.TransformerLayer(HID, 32, HEADS, {attn_impl = "flash"}); return r end,
               at(16), 'TransformerLayer: attn_impl must be "auto", "fused", "composed" or "cudnn", got "flash"')
  H.assert_err(function () local r = gc.nn.DotProductAttention(2, 256, {attn_impl = "fused"}); return r end,
               at(18), "DotProductAttention: attn_impl fused takes kv_channels up to 128, got 256")
  local l = gc.nn.TransformerLayer(HID, 32, HEADS, {self_attn_mask_type = "arbitrary"})
  local x = gc.randn({S, B, HID})
  line = debug.getinfo(1, "l").currentline
  H.assert_err(function () local r = l(x); return r end, at(1),
               "TransformerLayer: self_attn_mask_type 'arbitrary' takes x and attention_mask (2 inputs), got 1")
  H.assert_err(function () local r = l(x, {mask = x}); return r end, at(3),
               "TransformerLayer: unknown keyword argument 'mask'")
  H.assert_err(function () local r = l(x, {attention_mask = 1}); return r end, at(5),
               "TransformerLayer: keyword argument 'attention_mask' must be a tensor, got number")
  H.assert_err(function () local r = l(x, {attention_mask = x, 7}); return r end, at(7),
               "TransformerLayer: unknown keyword argument number")
  local c = gc.nn.TransformerLayer(HID, 32, HEADS)
  H.assert_err(function () local r = c(x, {attention_mask = gc.zeros({1, 1, S, S})}); return r end, at(10),
               "TransformerLayer: self_attn_mask_type 'causal' takes x (1 input) and no attention_mask, got 2")
  H.assert_err(function () local r = gc.nn.LayerNormMLP(8, 8)(x, {}); return r end, at(12),
               "LayerNormMLP: argument #2 must be a tensor, got table")
  H.assert_err(function () local r = gc.nn.DotProductAttention(HEADS, D)(x, x, x); return r end, at(14),
               "DotProductAttention: q must be [seq, batch, 2 heads, 8 channels], got [4, 2, 16]")
  -- still usable
  lu.assertEquals(l(x, {attention_mask = gc.zeros({1, 1, S, S})}):shape(), {S, B, HID})
  lu.assertEquals(c(x):shape(), {S, B, HID})
end

-- regression: a NaN or negative eps made every output NaN; padding_idx was ignored
-- A NaN or negative layer norm epsilon (every output NaN) is refused when
-- the module is made, as is an option Embedding does not have (padding_idx
-- was ignored: its row still got grads).
function TestTransformer:test_transformer_eps_and_embedding_options ()
  local here = debug.getinfo(1, "S").short_src .. ":"
  local cases = {
    {function (v) return gc.nn.LayerNormLinear(4, 3, {eps = v}) end, "LayerNormLinear: eps"},
    {function (v) return gc.nn.LayerNormMLP(4, 8, {eps = v}) end, "LayerNormMLP: eps"},
    {function (v) return gc.nn.MultiheadAttention(4, 2, {layernorm_epsilon = v}) end,
     "MultiheadAttention: layernorm_epsilon"},
    {function (v) return gc.nn.TransformerLayer(4, 8, 2, {layernorm_epsilon = v}) end,
     "TransformerLayer: layernorm_epsilon"},
  }
  for _, c in ipairs(cases) do
    for _, v in ipairs({0 / 0, -1e-5, math.huge}) do
      local ok, e = pcall(c[1], v)
      lu.assertFalse(ok, c[2] .. " " .. tostring(v))
      lu.assertStrContains(e, here)
      lu.assertStrContains(e, c[2] .. " must be a finite number >= 0, got ")
    end
    lu.assertNotNil(c[1](0))
  end
  local ok, e = pcall(function () return gc.nn.Embedding(3, 4, {padding_idx = 0}) end)
  lu.assertFalse(ok)
  lu.assertStrContains(e, here)
  lu.assertStrContains(e, "Embedding: unknown option 'padding_idx'")
  lu.assertEquals(gc.nn.Embedding(3, 4)(gc.tensor({2})):shape(), {1, 4})
end

-- regression: a bf16 input to an f32 layer said only 'got input [3, 2, 4]'
-- A transformer layer given bf16 input (its parameters f32): the layer
-- norm's error gives each operand's dtype.
function TestTransformer:test_layer_norm_dtype_error_names_the_dtypes ()
  local here = debug.getinfo(1, "S").short_src .. ":"
  local m = gc.nn.LayerNormLinear(4, 3)
  local ok, e = pcall(function () return m(gc.randn({2, 4}, {dtype = "bf16"})) end)
  lu.assertFalse(ok)
  lu.assertStrContains(e, here)
  lu.assertStrContains(e, "got input bf16 [2, 4], weight f32 [4], bias f32 [4]")
  lu.assertEquals(m(gc.randn({2, 4})):shape(), {2, 3})
end

-- regression: another hidden size failed inside the qkv projection, naming 'linear'
-- MultiheadAttention (and TransformerLayer through it) given x of another
-- hidden size failed inside its qkv projection, naming "linear" and a
-- weight [12, 4] the caller never made: the module names itself and hidden.
function TestTransformer:test_attention_layers_check_the_hidden_size ()
  local here = debug.getinfo(1, "S").short_src .. ":"
  for _, m in ipairs({gc.nn.MultiheadAttention(4, 2), gc.nn.TransformerLayer(4, 8, 2)}) do
    local ok, e = pcall(function () return m(gc.randn({3, 2, 5})) end)
    lu.assertFalse(ok)
    lu.assertStrContains(e, here)
    lu.assertStrContains(e, "MultiheadAttention: x must be [seq, batch, hidden 4], got [3, 2, 5]")
    lu.assertEquals(m(gc.randn({3, 2, 4})):shape(), {3, 2, 4})
  end
end

os.exit(lu.LuaUnit.run(), true)
