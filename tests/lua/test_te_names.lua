-- test_te_names.lua: TransformerEngine's spellings of the options a user
-- ports (docs/lua-api.md, "Names from TransformerEngine"): Linear's
-- delay_wgrad_compute for delay_wgrad, and make_graphed_callables' _order,
-- _num_layers_per_chunk and _reuse_graph_input_output_buffers. Each acts
-- exactly as the name it stands for (bitwise equal training), giving both
-- spellings is an error naming both, and the caller's option table is left
-- as it was. The modules' params_dtype is m:to(dtype) at construction.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_te_names.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

-- Two linears, 8 -> 16 -> 8, built from seed 11 with Linear options lopts.
local function two_linears (lopts)
  gc.manual_seed(11)
  return {gc.nn.Linear(8, 16, lopts), gc.nn.Linear(16, 8, lopts)}
end

local DIMS = {8, 16}
-- Two chunks of one layer, two microbatches, delayed wgrad (1F1B).
local CFG = {order = {1, 2, -2, -2.5, -1, -1.5, 1, 2, -2, -2.5, -1, -1.5},
             layers = {1, 1}}

-- One sample per entry: entries 1, 2 are chunk 1's microbatches, 3, 4 chunk 2's.
local function samples ()
  local s = {}
  for i = 1, 4 do s[i] = {gc.zeros({4, DIMS[(i - 1) // 2 + 1]}, {requires_grad = true})} end
  return s
end

-- Walk CFG's order twice over the graphed entries G and return every
-- output, input grad and parameter grad as nested tables.
local function train (G, mods)
  local res = {}
  gc.manual_seed(5)
  for _ = 1, 2 do
    local xs, losses = {}, {}
    H.walk(CFG,
           function (i, c)
             xs[i] = gc.randn({4, DIMS[c]}, {requires_grad = true})
             local y = G[i](xs[i])
             res[#res + 1] = y:tolist()
             losses[i] = (y * gc.randn(y:shape())):sum()
           end,
           function (i) losses[i]:backward() end,
           function (i) G[i]:backward_dw() end)
    for i = 1, #xs do res[#res + 1] = xs[i].grad:tolist() end
  end
  for _, m in ipairs(mods) do
    for _, p in ipairs(m:parameters()) do res[#res + 1] = p.grad:tolist() end
  end
  return res
end

-- Graph two_linears(lopts) with opts and train it.
local function graph_and_train (lopts, opts)
  local mods = two_linears(lopts)
  local G = gc.make_graphed_callables(mods, samples(), opts)
  lu.assertEquals(#G, 4)
  for i = 1, 4 do lu.assertNotNil(G[i]:stats().bwd_dw, "entry " .. i .. " has no wgrad graph") end
  return train(G, mods)
end

-- An error raised by fn that names every string of ...
local function assert_error_names (fn, ...)
  local ok, err = pcall(fn)
  lu.assertFalse(ok, "no error")
  err = tostring(err)
  for _, s in ipairs({...}) do lu.assertStrContains(err, s) end
  return err
end

TestTENames = {tearDown = H.no_capture_left}

-- delay_wgrad_compute: the backward leaves the weight grad to backward_dw,
-- and the grads then equal those of delay_wgrad = true, bit for bit.
function TestTENames:test_linear_delay_wgrad_compute ()
  local function run (lopts)
    gc.manual_seed(3)
    local m = gc.nn.Linear(8, 4, lopts)
    local x = gc.randn({5, 8}, {requires_grad = true})
    m(x):sum():backward()
    local before = m.weight.grad
    m:backward_dw()
    return before, m.weight.grad:tolist(), m.bias.grad:tolist(), x.grad:tolist()
  end
  local b1, w1, bias1, x1 = run({delay_wgrad_compute = true})
  local b2, w2, bias2, x2 = run({delay_wgrad = true})
  lu.assertNil(b1, "delay_wgrad_compute: the weight grad must wait for backward_dw")
  lu.assertNil(b2)
  lu.assertEquals(w1, w2)
  lu.assertEquals(bias1, bias2)
  lu.assertEquals(x1, x2)
  local b3 = run({delay_wgrad_compute = false})
  lu.assertNotNil(b3, "delay_wgrad_compute = false computes the weight grad in backward")
end

function TestTENames:test_linear_both_spellings ()
  assert_error_names(function ()
    gc.nn.Linear(8, 4, {delay_wgrad = true, delay_wgrad_compute = true})
  end, "Linear", "'delay_wgrad'", "'delay_wgrad_compute'", "test_te_names.lua")
end

-- The checks of the option apply under either name.
function TestTENames:test_linear_alias_type_checked ()
  assert_error_names(function ()
    gc.nn.Linear(8, 4, {delay_wgrad_compute = "yes"})
  end, "Linear", "delay_wgrad", "boolean")
end

-- _order and _num_layers_per_chunk graph what order and
-- num_layers_per_chunk do (four entries, one wgrad graph each), and with
-- delay_wgrad_compute the training equals the one spelled our way.
function TestTENames:test_order_spellings ()
  local te_opts = {_order = CFG.order, _num_layers_per_chunk = {1, 1}}
  local te = graph_and_train({delay_wgrad_compute = true}, te_opts)
  local ours = graph_and_train({delay_wgrad = true},
                               {order = CFG.order, num_layers_per_chunk = {1, 1}})
  lu.assertEquals(#te, #ours)
  for i = 1, #ours do lu.assertEquals(te[i], ours[i], "value " .. i .. " differs") end
  lu.assertIs(te_opts._order, CFG.order, "the caller's options were changed")
  lu.assertNil(te_opts.order, "the caller's options were changed")
end

-- _reuse_graph_input_output_buffers is reuse_graph_input_output_buffers:
-- the same training, and the same rule (it needs an order).
function TestTENames:test_reuse_spelling ()
  local lopts = {delay_wgrad = true}
  local te = graph_and_train(lopts, {_order = CFG.order, _num_layers_per_chunk = {1, 1},
                                     _reuse_graph_input_output_buffers = true})
  local ours = graph_and_train(lopts, {order = CFG.order, num_layers_per_chunk = {1, 1},
                                       reuse_graph_input_output_buffers = true})
  for i = 1, #ours do lu.assertEquals(te[i], ours[i], "value " .. i .. " differs") end
  assert_error_names(function ()
    gc.make_graphed_callables(two_linears(), {{gc.zeros({4, 8}, {requires_grad = true})},
                                              {gc.zeros({4, 16}, {requires_grad = true})}},
                              {_reuse_graph_input_output_buffers = true})
  end, "reuse_graph_input_output_buffers", "order")
end

function TestTENames:test_both_spellings ()
  local cases = {
    {order = CFG.order, _order = CFG.order},
    {num_layers_per_chunk = 1, _num_layers_per_chunk = 1, order = CFG.order},
    {reuse_graph_input_output_buffers = true, _reuse_graph_input_output_buffers = false},
  }
  local names = {"order", "num_layers_per_chunk", "reuse_graph_input_output_buffers"}
  for i, opts in ipairs(cases) do
    local pool = gc.graph_pool_handle()
    opts.pool = pool
    assert_error_names(function ()
      gc.make_graphed_callables(two_linears({delay_wgrad = true}), samples(), opts)
    end, "make_graphed_callables", "'" .. names[i] .. "'", "'_" .. names[i] .. "'",
         "test_te_names.lua")
    lu.assertEquals(pool:stats().graphs, 0)
  end
end

-- Other underscore names are still unknown options.
function TestTENames:test_unknown_underscore_option ()
  assert_error_names(function ()
    gc.make_graphed_callables(two_linears(), {{gc.zeros({4, 8})}, {gc.zeros({4, 16})}},
                              {_num_warmup_iters = 2})
  end, "unknown option '_num_warmup_iters'")
end

-- params_dtype (TE's option of its modules) makes the parameters in that
-- dtype: the same values as the module made in f32 and converted with
-- m:to, bitwise; the module then runs on inputs of that dtype.
function TestTENames:test_params_dtype ()
  local makers = {
    Linear = function (o) return gc.nn.Linear(4, 6, o) end,
    LayerNorm = function (o) return gc.nn.LayerNorm(4, o) end,
    LayerNormLinear = function (o) return gc.nn.LayerNormLinear(4, 6, o) end,
    LayerNormMLP = function (o) return gc.nn.LayerNormMLP(4, 8, o) end,
    MultiheadAttention = function (o)
      o.attention_dropout = 0
      return gc.nn.MultiheadAttention(4, 2, o)
    end,
    TransformerLayer = function (o)
      o.attention_dropout, o.hidden_dropout = 0, 0
      return gc.nn.TransformerLayer(4, 8, 2, o)
    end,
  }
  for name, make in pairs(makers) do
    gc.manual_seed(21)
    local a = make({params_dtype = "bf16"})
    gc.manual_seed(21)
    local b = make({}):to("bf16")
    local pa, pb = a:parameters(), b:parameters()
    lu.assertEquals(#pa, #pb, name)
    for i = 1, #pa do
      lu.assertEquals(pa[i]:dtype(), "bf16", name)
      H.assert_bitwise(pa[i]:tolist(), pb[i]:tolist(), name .. " parameter " .. i)
    end
    local x = gc.randn({3, 1, 4}, "bf16")
    local y = a(x)
    lu.assertEquals(y:dtype(), "bf16", name)
    H.assert_bitwise(y:tolist(), b(x):tolist(), name .. " output")
    gc.manual_seed(21)
    lu.assertEquals(make({params_dtype = "f32"}):parameters()[1]:dtype(), "f32", name)
  end
  local ok, err = pcall(gc.nn.LayerNormMLP, 4, 8, {params_dtype = "fp16"})
  lu.assertFalse(ok)
  lu.assertStrContains(err, "LayerNormMLP: params_dtype must be \"f32\" or \"bf16\", got \"fp16\"")
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
