-- graphcap.nn: modules (require "graphcap".nn). Every module is one
-- userdata type, graphcap.Module, whatever its class; a class is a table
-- of methods, callable to make an instance. Built-ins (Linear, ReLU, GELU,
-- LayerNorm, Dropout, Sequential) have a forward in C; gc.nn.Module(name)
-- makes a class whose instances run class:forward in Lua.

local core = require "graphcap.core"
local util = require "graphcap.util"
core._facade()

local select, setmetatable, type = select, setmetatable, type
_ENV = nil

local cnn = core._nn
local options, check = util.options, util.check

local nn = {}

-- The methods every module has (C), extended here; a class falls back on
-- them, and so does an instance after its fields and its class.
local Module = core._metatables.Module.__methods
nn.methods = Module

-- m:zero_grad([{set_to_none = true}])
Module.zero_grad = util.zero_grad(Module.zero_grad)

-- A class named 'name' whose call is ctor(class, ...) (entered through C,
-- util.entries says why).
local function class (name, ctor)
  return setmetatable({}, {__name = name, __index = Module, __call = util.entry(ctor)})
end

-- A built-in class, also known to the core (the class of a module it hands
-- back without a Lua value of its own).
local function builtin (name, ctor)
  local cls = class(name, ctor)
  core._classes[name] = cls
  return cls
end

local linear_options = {bias = true, delay_wgrad = true, fuse_wgrad_accumulation = true,
                        params_dtype = true}
local linear_aliases = {delay_wgrad_compute = "delay_wgrad"}  -- TE's names

-- Module m of 'where' with its parameters in dtype dt, TransformerEngine's
-- params_dtype ("f32", the default, or "bf16"): m:to(dt), so that the
-- values are those of an f32 module rounded.
local function params_dtype (where, m, dt)
  if dt == nil or dt == "f32" then return m end
  if dt ~= "bf16" then
    util.raise("%s: params_dtype must be \"f32\" or \"bf16\", got %s", where,
               type(dt) == "string" and "\"" .. dt .. "\"" or type(dt))
  end
  return m:to(dt)
end

-- gc.nn.Linear(in, out [, {bias = true, delay_wgrad = false,
--                          fuse_wgrad_accumulation = false, params_dtype = "f32"}])
-- delay_wgrad_compute (TransformerEngine's name) is delay_wgrad.
-- With fuse_wgrad_accumulation the weight grad accumulates into the
-- buffer m.main_grad (zeroed by m:zero_grad()), not into m.weight.grad.
nn.Linear = builtin("Linear", function (cls, i, o, opts)
  check("Linear", "in_features", i, "integer", nil)
  check("Linear", "out_features", o, "integer", nil)
  opts = options("Linear", util.aliases("Linear", opts, linear_aliases),
                 linear_options)
  return params_dtype("Linear", cnn.linear(cls, i, o,
                    check("Linear", "bias", opts.bias, "boolean", true),
                    check("Linear", "delay_wgrad", opts.delay_wgrad, "boolean",
                          false),
                    check("Linear", "fuse_wgrad_accumulation", opts.fuse_wgrad_accumulation,
                          "boolean", false)), opts.params_dtype)
end)

nn.ReLU = builtin("ReLU", function (cls) return cnn.relu(cls) end)
nn.GELU = builtin("GELU", function (cls) return cnn.gelu(cls) end)

local layer_norm_options = {eps = true, params_dtype = true}

-- gc.nn.LayerNorm(n [, {eps = 1e-5, params_dtype = "f32"}])
nn.LayerNorm = builtin("LayerNorm", function (cls, n, opts)
  check("LayerNorm", "normalized_shape", n, "integer", nil)
  opts = options("LayerNorm", opts, layer_norm_options)
  return params_dtype("LayerNorm", cnn.layer_norm(cls, n, check("LayerNorm", "eps", opts.eps,
                                                                "number", 1e-5)),
                      opts.params_dtype)
end)

-- gc.nn.Dropout([p = 0.5])
nn.Dropout = builtin("Dropout", function (cls, p)
  return cnn.dropout(cls, check("Dropout", "p", p, "number", 0.5))
end)

-- gc.nn.Sequential(m1, m2, ...) or gc.nn.Sequential({m1, m2, ...})
nn.Sequential = builtin("Sequential", function (cls, ...)
  local mods, n = {...}, select("#", ...)
  if n == 1 and type(mods[1]) == "table" then  -- one sequence
    mods = mods[1]
    n = #mods
  end
  return cnn.sequential(cls, mods, n)
end)

-- Transformer modules (TransformerEngine's names and options, params_dtype
-- among them). Inputs are [..., hidden]; TE's default layout is [seq, batch,
-- hidden].

-- gc.nn.LayerNormLinear(in, out [, {eps = 1e-5, bias = true,
--                                    return_layernorm_output = false}])
-- linear(layer_norm(x)); with return_layernorm_output a call returns the
-- output and the layer norm's output.
nn.LayerNormLinear = builtin("LayerNormLinear", function (cls, i, o, opts)
  local T = "LayerNormLinear"
  check(T, "in_features", i, "integer", nil)
  check(T, "out_features", o, "integer", nil)
  opts = options(T, opts, {eps = true, bias = true, return_layernorm_output = true,
                           params_dtype = true})
  return params_dtype(T, cnn.layer_norm_linear(cls, i, o, check(T, "eps", opts.eps, "number", 1e-5),
                               check(T, "bias", opts.bias, "boolean", true),
                               check(T, "return_layernorm_output", opts.return_layernorm_output,
                                     "boolean", false)), opts.params_dtype)
end)

-- gc.nn.LayerNormMLP(hidden, ffn_hidden [, {eps = 1e-5, bias = true,
--                                          activation = "gelu", checkpoint = false}])
-- fc2(gelu(fc1(layer_norm(x)))); checkpoint recomputes the activations in
-- backward instead of keeping them.
nn.LayerNormMLP = builtin("LayerNormMLP", function (cls, h, f, opts)
  local T = "LayerNormMLP"
  check(T, "hidden_size", h, "integer", nil)
  check(T, "ffn_hidden_size", f, "integer", nil)
  opts = options(T, opts, {eps = true, bias = true, activation = true, checkpoint = true,
                           params_dtype = true})
  local act = check(T, "activation", opts.activation, "string", "gelu")
  if act ~= "gelu" then
    util.raise("%s: activation must be \"gelu\", got \"%s\"", T, act)
  end
  return params_dtype(T, cnn.layer_norm_mlp(cls, h, f, check(T, "eps", opts.eps, "number", 1e-5),
                            check(T, "bias", opts.bias, "boolean", true),
                            check(T, "checkpoint", opts.checkpoint, "boolean", false)),
                      opts.params_dtype)
end)

-- attn_mask_type names -> the core's numbers
local mask_types = {no_mask = 0, causal = 1, arbitrary = 2}
local function mask_type (where, what, v, default)
  v = check(where, what, v, "string", default)
  if mask_types[v] == nil then
    util.raise("%s: %s must be \"causal\", \"arbitrary\" or \"no_mask\", got \"%s\"",
               where, what, v)
  end
  return mask_types[v]
end

-- attn_impl names -> the core's numbers: "auto" (cuDNN where it runs, the
-- composition elsewhere), "composed" (matmul, softmax, matmul), "fused" (the
-- flash kernels), "cudnn" (cuDNN's flash attention, on cuda)
local attn_impls = {auto = 0, composed = 1, fused = 2, cudnn = 3}
local function attn_impl (where, v)
  v = check(where, "attn_impl", v, "string", "auto")
  if attn_impls[v] == nil then
    util.raise("%s: attn_impl must be \"auto\", \"fused\", \"composed\" or \"cudnn\", got \"%s\"",
               where, v)
  end
  return attn_impls[v]
end

-- The attention modules take the attention_mask as a keyword tensor:
-- m(q, k, v, {attention_mask = mask}), layer(x, {attention_mask = mask}).
local attention_kwargs = {"attention_mask"}

-- gc.nn.DotProductAttention(num_attention_heads, kv_channels
--   [, {attn_mask_type = "causal", attention_dropout = 0, attn_impl = "auto"}])
-- m(q, k, v [, {attention_mask = mask}]): q, k, v [seq, batch, heads,
-- channels] -> [seq, batch, heads * channels].
nn.DotProductAttention = builtin("DotProductAttention", function (cls, h, ch, opts)
  local T = "DotProductAttention"
  check(T, "num_attention_heads", h, "integer", nil)
  check(T, "kv_channels", ch, "integer", nil)
  opts = options(T, opts, {attn_mask_type = true, attention_dropout = true, attn_impl = true})
  return cnn.dot_product_attention(cls, h, ch,
                                   mask_type(T, "attn_mask_type", opts.attn_mask_type, "causal"),
                                   check(T, "attention_dropout", opts.attention_dropout, "number",
                                         0.0),
                                   attn_impl(T, opts.attn_impl))
end)
nn.DotProductAttention.kwargs = attention_kwargs

local layer_options = {attn_mask_type = true, attention_dropout = true, layernorm_epsilon = true,
                       bias = true, input_layernorm = true, attn_impl = true, params_dtype = true}

-- gc.nn.MultiheadAttention(hidden_size, num_attention_heads
--   [, {attn_mask_type = "causal", attention_dropout = 0.1, input_layernorm = false,
--       layernorm_epsilon = 1e-5, bias = true, attn_impl = "auto"}])
-- m(x [, {attention_mask = mask}]): x [seq, batch, hidden].
nn.MultiheadAttention = builtin("MultiheadAttention", function (cls, hid, h, opts)
  local T = "MultiheadAttention"
  check(T, "hidden_size", hid, "integer", nil)
  check(T, "num_attention_heads", h, "integer", nil)
  opts = options(T, opts, layer_options)
  return params_dtype(T, cnn.multihead_attention(cls, hid, h,
                                 mask_type(T, "attn_mask_type", opts.attn_mask_type, "causal"),
                                 check(T, "attention_dropout", opts.attention_dropout, "number",
                                       0.1), 0.0,
                                 check(T, "layernorm_epsilon", opts.layernorm_epsilon, "number",
                                       1e-5),
                                 check(T, "bias", opts.bias, "boolean", true),
                                 check(T, "input_layernorm", opts.input_layernorm, "boolean",
                                       false),
                                 attn_impl(T, opts.attn_impl)), opts.params_dtype)
end)
nn.MultiheadAttention.kwargs = attention_kwargs

-- gc.nn.TransformerLayer(hidden_size, ffn_hidden_size, num_attention_heads
--   [, {self_attn_mask_type = "causal", hidden_dropout = 0.1, attention_dropout = 0.1,
--       layernorm_epsilon = 1e-5, bias = true, attn_impl = "auto"}])
-- layer(x [, {attention_mask = mask}]): pre-LN, x [seq, batch, hidden].
nn.TransformerLayer = builtin("TransformerLayer", function (cls, hid, ffn, h, opts)
  local T = "TransformerLayer"
  check(T, "hidden_size", hid, "integer", nil)
  check(T, "ffn_hidden_size", ffn, "integer", nil)
  check(T, "num_attention_heads", h, "integer", nil)
  opts = options(T, opts, {self_attn_mask_type = true, hidden_dropout = true,
                           attention_dropout = true, layernorm_epsilon = true, bias = true,
                           attn_impl = true, params_dtype = true})
  return params_dtype(T, cnn.transformer_layer(cls, hid, ffn, h,
                               mask_type(T, "self_attn_mask_type", opts.self_attn_mask_type,
                                         "causal"),
                               check(T, "attention_dropout", opts.attention_dropout, "number",
                                     0.1),
                               check(T, "hidden_dropout", opts.hidden_dropout, "number", 0.1),
                               check(T, "layernorm_epsilon", opts.layernorm_epsilon, "number",
                                     1e-5),
                               check(T, "bias", opts.bias, "boolean", true),
                               attn_impl(T, opts.attn_impl)), opts.params_dtype)
end)
nn.TransformerLayer.kwargs = attention_kwargs

-- gc.nn.Embedding(num_embeddings, embedding_dim): weight [num, dim] from
-- N(0, 1); m(ids) -> [..., dim], ids held as numbers. It has no options:
-- one given (PyTorch's padding_idx, max_norm, ...) is refused, not ignored.
nn.Embedding = builtin("Embedding", function (cls, n, d, opts)
  check("Embedding", "num_embeddings", n, "integer", nil)
  check("Embedding", "embedding_dim", d, "integer", nil)
  options("Embedding", opts, {})
  return cnn.embedding(cls, n, d)
end)

-- gc.nn.Module(name) -> a class: define class:init(...) and
-- class:forward(...); class(...) makes an instance and runs init on it.
-- Assigning a module or a tensor that requires grad (or gc.nn.Parameter(t))
-- to a field of an instance registers a child or a parameter, in order.
function nn.Module (name)
  name = check("Module", "name", name, "string", "Module")
  return class(name, function (cls, ...)
    local self = cnn.module(cls, name)
    local init = cls.init
    if init ~= nil then init(self, ...) end
    return self
  end)
end

-- gc.nn.Parameter(t) -> t marked as a parameter (requires grad, registered
-- when assigned to a module field); a non-leaf gives a leaf sharing its data.
nn.Parameter = cnn.parameter

-- gc.nn.is_module(v) -> true for any module (built-in or Lua class)
nn.is_module = cnn.is_module

-- gc.nn.class_of(m) -> the class of module m (nil for one the core made
-- without a class)
nn.class_of = cnn.class_of

return nn
