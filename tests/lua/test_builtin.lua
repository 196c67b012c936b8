-- test_builtin.lua: the built-in modules from Lua (docs/lua-api.md,
-- "Modules"): Linear with and without bias, ReLU, GELU, LayerNorm, Dropout,
-- Sequential and its Linear + GELU fusion; bad inputs (errors that name the
-- op and the shapes); Linear's delayed wgrad and its fused wgrad
-- accumulation (TE's fuse_wgrad_accumulation).
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_builtin.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local assert_close, assert_bitwise, assert_err = H.assert_close, H.assert_bitwise, H.assert_err
local HERE = debug.getinfo(1, "S").short_src .. ":"  -- errors name the user's line

-- ---------------------------------------------------------------------------
-- Built-in modules

TestBuiltins = {tearDown = H.grad_mode_left_on}

function TestBuiltins:setUp ()
  gc.manual_seed(11)
end

function TestBuiltins:test_linear_fields_and_forward ()
  local m = gc.nn.Linear(3, 2)
  lu.assertTrue(gc.nn.is_module(m))
  lu.assertIs(gc.nn.class_of(m), gc.nn.Linear)
  lu.assertEquals(m:type(), "Linear")
  lu.assertEquals(tostring(m), "Linear")
  lu.assertEquals(m.weight:shape(), {2, 3})
  lu.assertEquals(m.bias:shape(), {2})
  for _, p in ipairs{m.weight, m.bias} do
    lu.assertTrue(p.requires_grad)
    lu.assertTrue(p.is_leaf)
    lu.assertNil(p.grad)
    for _, v in ipairs(H.flat(p:tolist())) do       -- U(-1/sqrt(in), 1/sqrt(in))
      lu.assertTrue(math.abs(v) <= 1 / math.sqrt(3), "init bound: " .. v)
    end
  end
  local ps = m:parameters()
  lu.assertEquals(#ps, 2)
  lu.assertTrue(rawequal(ps[1], m.weight))
  lu.assertTrue(rawequal(ps[2], m.bias))
  local named = m:named_parameters()
  lu.assertEquals(named[1][1], "weight")
  lu.assertEquals(named[2][1], "bias")
  lu.assertTrue(rawequal(named[1][2], m.weight))
  lu.assertTrue(m.training)
  -- y = x W^T + b
  local x = H.input({4, 3}, 0.2)
  local y = m(x)
  lu.assertEquals(y:shape(), {4, 2})
  local xv, w, b = x:tolist(), m.weight:tolist(), m.bias:tolist()
  local want = {}
  for r = 1, 4 do
    want[r] = {}
    for o = 1, 2 do
      local s = b[o]
      for i = 1, 3 do s = s + xv[r][i] * w[o][i] end
      want[r][o] = s
    end
  end
  assert_close(y:tolist(), want, 1e-6, 1e-5, "Linear forward")
  assert_bitwise(m:forward(x):tolist(), y:tolist(), "m:forward equals m()")
  assert_bitwise(gc.F.linear(x, m.weight, m.bias):tolist(), y:tolist(), "F.linear")
  -- a 3-D input: [..., in]
  lu.assertEquals(m(H.input({2, 5, 3})):shape(), {2, 5, 2})
  -- grads reach weight and bias
  y:sum():backward()
  lu.assertEquals(m.weight.grad:shape(), {2, 3})
  lu.assertEquals(m.bias.grad:tolist(), {4, 4})
end

function TestBuiltins:test_linear_without_bias ()
  local m = gc.nn.Linear(3, 4, {bias = false})
  lu.assertNil(m.bias)
  lu.assertEquals(m.weight:shape(), {4, 3})
  lu.assertEquals(#m:parameters(), 1)
  lu.assertEquals(m:named_parameters()[1][1], "weight")
  local x = H.input({2, 3})
  assert_bitwise(m(x):tolist(), gc.F.linear(x, m.weight):tolist(), "no-bias forward")
  lu.assertEquals(#gc.nn.Linear(3, 4, {bias = true}):parameters(), 2)
end

function TestBuiltins:test_linear_bad_arguments ()
  assert_err(function () gc.nn.Linear(3.5, 2) end, "Linear", "in_features", "integer")
  assert_err(function () gc.nn.Linear(3) end, "Linear", "out_features", "required")
  assert_err(function () gc.nn.Linear(0, 2) end, "Linear", "positive")
  assert_err(function () gc.nn.Linear(2, 2, {bais = false}) end, "Linear", "unknown option 'bais'")
  assert_err(function () gc.nn.Linear(2, 2, {bias = 1}) end, "bias must be a boolean")
end

function TestBuiltins:test_relu_gelu ()
  local x = gc.tensor({{-2, -0.5, 0, 0.5, 3}})
  lu.assertEquals(gc.nn.ReLU()(x):tolist(), {{0, 0, 0, 0.5, 3}})
  local g = gc.nn.GELU()(x)
  local c, k = math.sqrt(2 / math.pi), 0.044715
  local want = {}
  for i, v in ipairs(x:tolist()[1]) do
    want[i] = 0.5 * v * (1 + math.tanh(c * (v + k * v ^ 3)))
  end
  assert_close(g:tolist()[1], want, 1e-6, 1e-5, "GELU")
  lu.assertEquals(#gc.nn.ReLU():parameters(), 0)
  lu.assertEquals(gc.nn.GELU():type(), "GELU")
end

function TestBuiltins:test_layer_norm ()
  local m = gc.nn.LayerNorm(4)
  lu.assertEquals(m.weight:tolist(), {1, 1, 1, 1})
  lu.assertEquals(m.bias:tolist(), {0, 0, 0, 0})
  lu.assertEquals(m:named_parameters()[1][1], "weight")
  lu.assertEquals(m:named_parameters()[2][1], "bias")
  local x = gc.tensor({{1, 2, 3, 4}, {-1, -1, 1, 1}})
  local y = m(x):tolist()
  for r = 1, 2 do
    local mean, var = 0, 0
    for c = 1, 4 do mean = mean + y[r][c] end
    mean = mean / 4
    for c = 1, 4 do var = var + (y[r][c] - mean) ^ 2 end
    assert_close({mean, var / 4}, {0, 1}, 1e-5, 1e-4, "row " .. r)
  end
  assert_close(y[2], {-1, -1, 1, 1}, 1e-5, 1e-5, "row 2")
  -- weight and bias apply
  gc.no_grad(function () m.weight:fill_(2); m.bias:fill_(0.5) end)
  assert_close(m(x):tolist()[2], {-1.5, -1.5, 2.5, 2.5}, 1e-5, 1e-5, "affine")
  -- eps option
  local big = gc.nn.LayerNorm(4, {eps = 1})
  assert_close(big(gc.tensor({{-1, -1, 1, 1}})):tolist()[1],
               {-1 / math.sqrt(2), -1 / math.sqrt(2), 1 / math.sqrt(2), 1 / math.sqrt(2)},
               1e-6, 1e-5, "eps 1")
  assert_err(function () gc.nn.LayerNorm(4, {epsilon = 1}) end, "unknown option 'epsilon'")
  assert_err(function () m(gc.ones({2, 3})) end, "layer_norm", "[2, 3]")
end

function TestBuiltins:test_dropout_train_and_eval ()
  local d = gc.nn.Dropout(0.5)
  lu.assertTrue(d.training)
  local x = H.input({8, 8}, 0.1, true)
  local y = d(x)
  local xv, yv = H.flat(x:tolist()), H.flat(y:tolist())
  local zeros = 0
  for i = 1, #xv do
    if yv[i] == 0 then zeros = zeros + 1 else lu.assertEquals(yv[i], xv[i] * 2) end
  end
  lu.assertTrue(zeros > 0 and zeros < #xv, "dropped " .. zeros)
  lu.assertIs(d:eval(), d)
  lu.assertFalse(d.training)
  local e = d(x)                                 -- identity in eval
  assert_bitwise(e:tolist(), x:tolist(), "Dropout in eval")
  e:sum():backward()
  assert_bitwise(x.grad:tolist(), gc.ones({8, 8}):tolist(), "identity grad")
  d:train()
  lu.assertTrue(d.training)
  assert_err(function () gc.nn.Dropout(1.5) end, "Dropout", "[0, 1]")
  assert_err(function () gc.nn.Dropout("half") end, "Dropout", "p must be a number")
  lu.assertEquals(#gc.nn.Dropout():parameters(), 0)
end

function TestBuiltins:test_sequential_children_and_forward ()
  local a, r, b = gc.nn.Linear(3, 4), gc.nn.ReLU(), gc.nn.Linear(4, 2)
  local s = gc.nn.Sequential(a, r, b)
  lu.assertEquals(s:type(), "Sequential")
  lu.assertIs(s[1], a)
  lu.assertIs(s[2], r)
  lu.assertIs(s[3], b)
  lu.assertNil(s[4])
  local ch = s:children()
  lu.assertEquals(#ch, 3)
  lu.assertIs(ch[1], a)
  lu.assertIs(ch[3], b)
  local names = {}
  for i, p in ipairs(s:named_parameters()) do names[i] = p[1] end
  lu.assertEquals(names, {"0.weight", "0.bias", "2.weight", "2.bias"})
  local ps = s:parameters()
  lu.assertTrue(rawequal(ps[1], a.weight))
  lu.assertTrue(rawequal(ps[4], b.bias))
  local x = H.input({5, 3})
  assert_bitwise(s(x):tolist(), b(r(a(x))):tolist(), "Sequential = composition")
  -- the table form, and nesting
  local s2 = gc.nn.Sequential({gc.nn.Linear(2, 2), gc.nn.GELU()})
  lu.assertEquals(s2[2]:type(), "GELU")
  local outer = gc.nn.Sequential(s2, gc.nn.Linear(2, 1))
  names = {}
  for i, p in ipairs(outer:named_parameters()) do names[i] = p[1] end
  lu.assertEquals(names, {"0.0.weight", "0.0.bias", "1.weight", "1.bias"})
  lu.assertEquals(outer(H.input({3, 2})):shape(), {3, 1})
  -- empty: the identity
  local x1 = H.input({2})
  lu.assertIs(gc.nn.Sequential()(x1), x1)
  assert_err(function () gc.nn.Sequential(a, 3) end, "Sequential", "module #2", "number")
end

-- Values and grads of the fused pair against the two ops: bitwise on the
-- host, where both run the same reference code; on cuda the gelu runs in
-- cuBLASLt's epilogue and the bias grad in the gelu's backward pass.
local function assert_fused_equal (got, want, what)
  if gc.device() == "host" then
    assert_bitwise(got, want, what)
  else
    assert_close(got, want, 1e-5, 1e-4, what)
  end
end

-- A Linear then a GELU in a Sequential run as one op (one GEMM with a gelu
-- epilogue) while nothing can see the Linear's output; the values and grads
-- are those of F.gelu(F.linear(...)).
function TestBuiltins:test_sequential_fuses_linear_gelu ()
  for _, bias in ipairs{true, false} do
    local s = gc.nn.Sequential(gc.nn.Linear(6, 8, {bias = bias}), gc.nn.GELU(), gc.nn.Linear(8, 3))
    local r = gc.nn.Linear(6, 8, {bias = bias})
    H.copy_params(r, s[1])
    local x, xr = H.input({2, 5, 6}, 0.2, true), H.input({2, 5, 6}, 0.2, true)
    local h = gc.nn.Sequential(s[1], s[2])(x)
    lu.assertEquals(h.grad_fn, "linear_gelu")
    local y = s(x)
    local want = s[3](gc.F.gelu(gc.F.linear(xr, r.weight, r.bias)))
    assert_fused_equal(y:tolist(), want:tolist(), "output")
    H.backward_weighted(y)
    H.backward_weighted(want)
    assert_fused_equal(x.grad:tolist(), xr.grad:tolist(), "input grad")
    assert_fused_equal(s[1].weight.grad:tolist(), r.weight.grad:tolist(), "weight grad")
    if bias then
      assert_fused_equal(s[1].bias.grad:tolist(), r.bias.grad:tolist(), "bias grad")
    end
    -- the functional form is the same op
    local f = gc.F.linear_gelu(x, r.weight, r.bias)
    lu.assertEquals(f.grad_fn, "linear_gelu")
    assert_bitwise(f:tolist(), h:tolist(), "F.linear_gelu")
  end
end

-- A hook on either module keeps the pair apart, so the hook sees the
-- Linear's own output.
function TestBuiltins:test_hook_keeps_linear_gelu_apart ()
  local s = gc.nn.Sequential(gc.nn.Linear(4, 4), gc.nn.GELU())
  local seen
  local hd = s[1]:register_forward_hook(function (_, _, out) seen = out end)
  local y = s(H.input({3, 4}, 0.5, true))
  lu.assertEquals(y.grad_fn, "gelu")
  lu.assertEquals(seen.grad_fn, "linear")
  hd:remove()
  lu.assertEquals(s(H.input({3, 4}, 0.5, true)).grad_fn, "linear_gelu")
  hd = s[2]:register_forward_pre_hook(function () end)
  lu.assertEquals(s(H.input({3, 4}, 0.5, true)).grad_fn, "gelu")
  hd:remove()
  -- GELU first, or a Linear without a GELU after it: nothing to fuse
  lu.assertEquals(gc.nn.Sequential(gc.nn.GELU(), gc.nn.Linear(4, 4))(H.input({3, 4}, 0.5, true)).grad_fn,
                  "linear")
  lu.assertEquals(gc.nn.Sequential(gc.nn.Linear(4, 4), gc.nn.ReLU())(H.input({3, 4}, 0.5, true)).grad_fn,
                  "relu")
end

-- ---------------------------------------------------------------------------
-- Errors

TestBuiltinErrors = {tearDown = H.grad_mode_left_on}

function TestBuiltinErrors:setUp ()
  gc.manual_seed(14)
end

function TestBuiltinErrors:test_bad_inputs_name_op_and_shapes ()
  local lin = gc.nn.Linear(3, 2)
  assert_err(function () lin(gc.ones({4, 5})) end, HERE, "linear", "[4, 5]", "[2, 3]")
  assert_err(function () gc.F.mse_loss(gc.ones({2, 3}), gc.ones({3, 2})) end,
             HERE, "mse_loss", "[2, 3]", "[3, 2]")
  assert_err(function () return gc.ones({3}) + gc.ones({2}) end, HERE, "add", "[3]", "[2]")
  assert_err(function () return gc.ones({2, 3}) * gc.ones({3, 2}) end, "mul", "[2, 3]", "[3, 2]")
  assert_err(function () return gc.matmul(gc.ones({2, 3}), gc.ones({2, 3})) end,
             "matmul", "[2, 3]")
  assert_err(function () gc.F.cross_entropy(gc.ones({2, 3}), gc.ones({3})) end,
             "cross_entropy", "[2, 3]", "[3]")
  assert_err(function () lin(gc.ones({2, 3}), gc.ones({2, 3})) end, "Linear", "1 input", "2")
  assert_err(function () lin() end, "Linear", "1 input")
  assert_err(function () lin(3) end, "Linear", "argument #1 must be a tensor", "number")
  assert_err(function () gc.nn.ReLU()({}) end, "ReLU", "must be a tensor", "table")
  -- the module still works
  lu.assertEquals(lin(gc.ones({4, 3})):shape(), {4, 2})
end

function TestBuiltinErrors:test_dtype_mix_errors ()
  local a, b = gc.ones({2, 3}), gc.ones({2, 3}, "bf16")
  lu.assertEquals(b:dtype(), "bf16")
  assert_err(function () return a + b end, "add", "f32", "bf16")
  assert_err(function () return b * a end, "mul", "bf16", "f32")
  assert_err(function () return a - b end, "sub", "bf16")
  assert_err(function () return gc.matmul(b, gc.ones({3, 2})) end, "matmul", "bf16", "f32")
  local lin = gc.nn.Linear(3, 2)
  assert_err(function () return lin(b) end, "linear", "bf16", "f32")
  lu.assertEquals(lin(a):dtype(), "f32")
end

-- mse_loss's own name in its dtype error (it is computed through sub).
function TestBuiltinErrors:test_dtype_mix_mse_loss_names_op ()
  local a, b = gc.ones({2, 3}), gc.ones({2, 3}, "bf16")
  assert_err(function () return gc.F.mse_loss(a, b) end, "bf16", "f32")
  assert_err(function () return gc.F.mse_loss(a, b) end, "mse_loss")
end

function TestBuiltinErrors:test_requires_grad_of_module_output ()
  local lin = gc.nn.Linear(2, 2)
  local y = lin(gc.ones({1, 2}))
  assert_err(function () y.requires_grad = false end, HERE, "requires_grad", "only leaves",
             "'linear'")
  lu.assertTrue(y.requires_grad)
  y:sum():backward()
  lu.assertNotNil(lin.weight.grad)
  -- a parameter can be frozen: then it gets no grad
  lin:zero_grad()
  lin.weight.requires_grad = false
  lin(gc.ones({1, 2})):sum():backward()
  lu.assertNil(lin.weight.grad)
  lu.assertNotNil(lin.bias.grad)
end

-- ---------------------------------------------------------------------------
-- Delayed wgrad

TestDelayWgrad = {}

function TestDelayWgrad:setUp ()
  gc.manual_seed(15)
end

local function delayed_pair (bias)
  local d = gc.nn.Linear(4, 3, {delay_wgrad = true, bias = bias})
  local r = gc.nn.Linear(4, 3, {bias = bias})
  H.copy_params(r, d)
  return d, r
end

function TestDelayWgrad:test_backward_dw_equals_ordinary_bitwise ()
  local d, r = delayed_pair(true)
  d:backward_dw()                                  -- nothing pending: nothing happens
  lu.assertNil(d.weight.grad)
  local xd, xr = H.input({2, 5, 4}, 0.3, true), H.input({2, 5, 4}, 0.3, true)
  local yd, yr = d(xd), r(xr)
  assert_bitwise(yd:tolist(), yr:tolist(), "forward")
  H.backward_weighted(yd)
  H.backward_weighted(yr)
  lu.assertNil(d.weight.grad)                      -- deferred
  lu.assertNil(d.bias.grad)
  lu.assertNotNil(xd.grad)                         -- the input grad is not
  assert_bitwise(xd.grad:tolist(), xr.grad:tolist(), "input grad")
  d:backward_dw()
  lu.assertNotNil(d.weight.grad)
  lu.assertEquals(d.weight.grad:shape(), {3, 4})
  assert_bitwise(d.weight.grad:tolist(), r.weight.grad:tolist(), "weight grad")
  assert_bitwise(d.bias.grad:tolist(), r.bias.grad:tolist(), "bias grad")
  d:backward_dw()                                  -- drained: adds nothing
  assert_bitwise(d.weight.grad:tolist(), r.weight.grad:tolist(), "weight grad after a 2nd dw")
end

function TestDelayWgrad:test_without_bias_and_input_grad ()
  local d, r = delayed_pair(false)
  lu.assertNil(d.bias)
  local x = H.input({3, 4}, 1.0)
  H.backward_weighted(d(x))
  H.backward_weighted(r(x))
  lu.assertNil(d.weight.grad)
  d:backward_dw()
  assert_bitwise(d.weight.grad:tolist(), r.weight.grad:tolist(), "weight grad")
end

-- A weight frozen at the forward: the node keeps no input for it (only the
-- weight's grad reads it), so backward_dw gives the bias its grad and the
-- weight none, also when the weight is unfrozen before backward_dw.
function TestDelayWgrad:test_weight_frozen_at_the_forward ()
  local d, r = delayed_pair(true)
  d.weight.requires_grad, r.weight.requires_grad = false, false
  local x = H.input({3, 4}, 0.6, true)
  H.backward_weighted(d(x))
  H.backward_weighted(r(x))
  d.weight.requires_grad = true
  d:backward_dw()
  lu.assertNil(d.weight.grad)
  assert_bitwise(d.bias.grad:tolist(), r.bias.grad:tolist(), "bias grad")
end

function TestDelayWgrad:test_two_steps_through_a_container ()
  local d, r = delayed_pair(true)
  local seq = gc.nn.Sequential(d, gc.nn.GELU())
  local ref = gc.nn.Sequential(r, gc.nn.GELU())
  for k = 1, 2 do
    H.backward_weighted(seq(H.input({2, 4}, k)))
    H.backward_weighted(ref(H.input({2, 4}, k)))
  end
  lu.assertNil(d.weight.grad)
  seq:backward_dw()                                -- oldest first, accumulating
  assert_bitwise(d.weight.grad:tolist(), r.weight.grad:tolist(), "weight grad")
  assert_bitwise(d.bias.grad:tolist(), r.bias.grad:tolist(), "bias grad")
  -- zero_grad and a third step
  seq:zero_grad({set_to_none = false})
  ref:zero_grad({set_to_none = false})
  H.backward_weighted(seq(H.input({2, 4}, 7)))
  H.backward_weighted(ref(H.input({2, 4}, 7)))
  for _, v in ipairs(H.flat(d.weight.grad:tolist())) do lu.assertEquals(v, 0) end
  seq:backward_dw()
  assert_bitwise(d.weight.grad:tolist(), r.weight.grad:tolist(), "weight grad, step 3")
end

function TestDelayWgrad:test_bad_option ()
  assert_err(function () gc.nn.Linear(2, 2, {delay_wgrad = "yes"}) end,
             "delay_wgrad must be a boolean")
end

-- ---------------------------------------------------------------------------
-- Fused wgrad accumulation (TE's fuse_wgrad_accumulation)

TestFuseWgrad = {tearDown = H.grad_mode_left_on}

function TestFuseWgrad:setUp ()
  gc.manual_seed(17)
end

-- A fused Linear and an ordinary one with the same parameters.
local function fused_pair (opts)
  opts = opts or {}
  local f = gc.nn.Linear(4, 3, {fuse_wgrad_accumulation = true, delay_wgrad = opts.delay_wgrad})
  local r = gc.nn.Linear(4, 3)
  H.copy_params(r, f)
  return f, r
end

-- main_grad gathers what weight.grad would over several backwards; the
-- bias grad and the input grad are unchanged; weight.grad stays nil.
function TestFuseWgrad:test_accumulates_into_main_grad ()
  local f, r = fused_pair()
  lu.assertEquals(f.main_grad:shape(), {3, 4})
  for _, v in ipairs(H.flat(f.main_grad:tolist())) do lu.assertEquals(v, 0) end
  local xf, xr = H.input({2, 5, 4}, 0.4, true), H.input({2, 5, 4}, 0.4, true)
  for _ = 1, 3 do
    H.backward_weighted(f(xf))
    H.backward_weighted(r(xr))
  end
  lu.assertNil(f.weight.grad)
  assert_fused_equal(f.main_grad:tolist(), r.weight.grad:tolist(), "main_grad")
  assert_bitwise(f.bias.grad:tolist(), r.bias.grad:tolist(), "bias grad")
  assert_bitwise(xf.grad:tolist(), xr.grad:tolist(), "input grad")
  -- zero_grad zeroes it in place; the bias grad goes as usual
  local mg = f.main_grad
  f:zero_grad()
  lu.assertIs(f.main_grad, mg)
  for _, v in ipairs(H.flat(mg:tolist())) do lu.assertEquals(v, 0) end
  lu.assertNil(f.bias.grad)
end

-- Through the Linear + GELU fusion of a Sequential, and with delayed wgrad
-- (backward_dw accumulates into main_grad).
function TestFuseWgrad:test_in_sequential_and_delayed ()
  for _, delay in ipairs{false, true} do
    local f, r = fused_pair({delay_wgrad = delay})
    local sf, sr = gc.nn.Sequential(f, gc.nn.GELU()), gc.nn.Sequential(r, gc.nn.GELU())
    for k = 1, 2 do
      H.backward_weighted(sf(H.input({6, 4}, k)))
      H.backward_weighted(sr(H.input({6, 4}, k)))
    end
    if delay then
      for _, v in ipairs(H.flat(f.main_grad:tolist())) do lu.assertEquals(v, 0) end
      lu.assertNil(f.bias.grad)
      sf:backward_dw()
    end
    lu.assertNil(f.weight.grad)
    assert_fused_equal(f.main_grad:tolist(), r.weight.grad:tolist(), "main_grad")
    assert_fused_equal(f.bias.grad:tolist(), r.bias.grad:tolist(), "bias grad")
  end
end

-- Graphed: the backward graph accumulates into main_grad on every replay;
-- the weight, which gets no grad, leaves the graph's surface.
function TestFuseWgrad:test_graphed_replays_accumulate ()
  local f, r = fused_pair()
  local sf = gc.nn.Sequential(f, gc.nn.GELU())
  local sr = gc.nn.Sequential(r, gc.nn.GELU())
  local g = gc.make_graphed_callables(sf, {gc.randn({6, 4}, {requires_grad = true})})
  f:zero_grad()                                    -- warmup and capture accumulated into it
  for k = 1, 3 do
    H.backward_weighted(g(H.input({6, 4}, k, true)))
    H.backward_weighted(sr(H.input({6, 4}, k, true)))
  end
  lu.assertNil(f.weight.grad)
  assert_fused_equal(f.main_grad:tolist(), r.weight.grad:tolist(), "main_grad after 3 replays")
  assert_fused_equal(f.bias.grad:tolist(), r.bias.grad:tolist(), "bias grad after 3 replays")
end

-- Frozen parameters get nothing from backward_dw either, as in the ordinary
-- backward: no .grad, and main_grad untouched.
function TestFuseWgrad:test_delayed_frozen_parameters ()
  for _, fuse in ipairs{false, true} do
    local d = gc.nn.Linear(4, 3, {delay_wgrad = true, fuse_wgrad_accumulation = fuse})
    d.weight.requires_grad = false
    d.bias.requires_grad = false
    local x = H.input({5, 4}, 0.2, true)
    H.backward_weighted(gc.nn.Sequential(d, gc.nn.GELU())(x))
    d:backward_dw()
    lu.assertNil(d.weight.grad)
    lu.assertNil(d.bias.grad)
    if fuse then
      for _, v in ipairs(H.flat(d.main_grad:tolist())) do lu.assertEquals(v, 0) end
    end
    lu.assertNotNil(x.grad)
  end
end

-- An empty batch: the bias grad of the fused Linear + GELU is zeros.
function TestFuseWgrad:test_empty_batch_bias_grad ()
  local s = gc.nn.Sequential(gc.nn.Linear(4, 8), gc.nn.GELU())
  local y = s(gc.zeros({0, 4}))
  lu.assertEquals(y.grad_fn, "linear_gelu")
  y:sum():backward()
  lu.assertEquals(s[1].bias.grad:tolist(), {0, 0, 0, 0, 0, 0, 0, 0})
  lu.assertEquals(H.flat(s[1].weight.grad:tolist()), H.flat(gc.zeros({8, 4}):tolist()))
end

function TestFuseWgrad:test_to_bf16_and_bad_option ()
  local f = gc.nn.Linear(4, 3, {fuse_wgrad_accumulation = true})
  f:to("bf16")
  lu.assertEquals(f.main_grad:dtype(), "bf16")
  f(gc.randn({2, 4}, {dtype = "bf16"})):sum():backward()
  lu.assertNil(f.weight.grad)
  local nonzero = 0
  for _, v in ipairs(H.flat(f.main_grad:tolist())) do
    if v ~= 0 then nonzero = nonzero + 1 end
  end
  lu.assertTrue(nonzero > 0, "main_grad got the bf16 weight grad")
  assert_err(function () gc.nn.Linear(2, 2, {fuse_wgrad_accumulation = 1}) end,
             "fuse_wgrad_accumulation must be a boolean")
end

-- regression: a graphed fused-wgrad Linear without input grads recorded no backward
-- A bias-free Linear with fuse_wgrad_accumulation, graphed with a data
-- input that needs no grad: the graphed output requires grad and main_grad
-- accumulates as it does eagerly (bitwise on one backend).
function TestFuseWgrad:test_fused_wgrad_without_input_grad ()
  local opts = {bias = false, fuse_wgrad_accumulation = true}
  gc.manual_seed(5)
  local eager, graphed = gc.nn.Linear(4, 3, opts), gc.nn.Linear(4, 3, opts)
  gc.no_grad(function () graphed.weight:copy_(eager.weight) end)
  local x = gc.randn({2, 4})
  local g = gc.make_graphed_callables(graphed, {gc.randn({2, 4})}, {num_warmup_iters = 1})
  for _ = 1, 2 do
    eager(x):sum():backward()
    local y = g(x)
    lu.assertTrue(y.requires_grad, "graphed output must require grad")
    y:sum():backward()
  end
  H.assert_bitwise(graphed.main_grad:tolist(), eager.main_grad:tolist(), "main_grad")
  lu.assertNotEquals(eager.main_grad:tolist()[1][1], 0)
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
