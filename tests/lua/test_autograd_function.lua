-- test_autograd_function.lua: gc.autograd.Function (docs/lua-api.md,
-- "Custom autograd functions"): forward and backward composed of graphcap
-- ops, equal bit for bit to the same composition of built-in ops; a
-- finite-difference check; ctx.needs_input_grad, nil grads, saved tensors;
-- every error (wrong grads, errors raised in forward and backward, a saved
-- tensor modified in place), each leaving the Function usable; a Lua module
-- using Functions, graphed with make_graphed_callables and capture_time_hooks,
-- trained to the eager values bit for bit.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_autograd_function.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local nest, values = H.nest, H.values
local assert_close, assert_bitwise, assert_err = H.assert_close, H.assert_bitwise, H.assert_err

local HERE = debug.getinfo(1, "S").short_src .. ":"  -- errors name the user's line

-- ---------------------------------------------------------------------------
-- Functions

-- a * b + c, its grads g * b, g * a, g: what the built-in ops compute.
local MulAdd = gc.autograd.Function("MulAdd")
function MulAdd.forward (ctx, a, b, c)
  ctx:save_for_backward(a, b)
  return a * b + c
end
function MulAdd.backward (ctx, g)
  local a, b = ctx.saved_tensors[1], ctx.saved_tensors[2]
  local n = ctx.needs_input_grad
  return n[1] and g * b or nil, n[2] and g * a or nil, n[3] and g or nil
end

-- s * x^2 for a number s, its grad g * x * 2s.
local Square = gc.autograd.Function("ScaledSquare")
function Square.forward (ctx, x, s)
  ctx:save_for_backward(x)
  ctx.s = s
  return x * x * s
end
function Square.backward (ctx, g)
  return g * ctx.saved_tensors[1] * (2 * ctx.s), nil
end

-- A Function whose backward is the argument (a function of ctx, g), for the errors.
local function with_backward (name, bw)
  local F = gc.autograd.Function(name)
  function F.forward (_, x) return x * 2 end
  F.backward = bw
  return F
end

local function t2x3 (phase, rg)
  return gc.tensor(nest(values(6, phase), {2, 3}), {requires_grad = rg})
end

-- The Functions still work: MulAdd's output and grads as the built-in ops'.
local function assert_usable (what)
  local a, b = t2x3(7, true), t2x3(8, true)
  MulAdd.apply(a, b, b):sum():backward()
  local a2, b2 = t2x3(7, true), t2x3(8, true)
  local loss = (a2 * b2 + b2):sum()
  loss:backward()
  assert_bitwise(a.grad:tolist(), a2.grad:tolist(), what .. ": a.grad")
  assert_bitwise(b.grad:tolist(), b2.grad:tolist(), what .. ": b.grad")
  lu.assertTrue(gc.is_grad_enabled(), what .. ": grad mode")
end

TestFunction = {}

function TestFunction:test_equals_builtin_ops_bitwise ()
  local a, b, c = t2x3(1, true), t2x3(2, true), t2x3(3, true)
  local y = MulAdd.apply(a, b, c)
  lu.assertEquals(y.grad_fn, "MulAdd")
  lu.assertFalse(y.is_leaf)
  local dy = t2x3(4)
  local loss = (y * dy):sum()
  loss:backward()
  local a2, b2, c2 = t2x3(1, true), t2x3(2, true), t2x3(3, true)
  local y2 = a2 * b2 + c2
  loss = (y2 * dy):sum()
  loss:backward()
  assert_bitwise(y:tolist(), y2:tolist(), "output")
  assert_bitwise(a.grad:tolist(), a2.grad:tolist(), "a.grad")
  assert_bitwise(b.grad:tolist(), b2.grad:tolist(), "b.grad")
  assert_bitwise(c.grad:tolist(), c2.grad:tolist(), "c.grad")
end

function TestFunction:test_chained_and_shared_inputs ()
  -- the same leaf twice, and a Function's output into another: grads summed
  local x = t2x3(5, true)
  Square.apply(MulAdd.apply(x, x, x), 0.5):sum():backward()
  local x2 = t2x3(5, true)
  local h = x2 * x2 + x2
  local want = gc.no_grad(function () return (h * 2 * 0.5) end)
  want = gc.no_grad(function () return want * x2 + want * x2 + want end)
  assert_bitwise(x.grad:tolist(), want:tolist(), "x.grad")
end

function TestFunction:test_finite_differences ()
  local xs = values(6, 9)
  local dys = values(6, 10)
  local s = 1.5
  local x = gc.tensor(nest(xs, {2, 3}), {requires_grad = true})
  local loss = (Square.apply(x, s) * gc.tensor(nest(dys, {2, 3}))):sum()
  loss:backward()
  local function L ()  -- the loss in double precision
    local v = 0
    for j = 1, #xs do v = v + dys[j] * s * xs[j] * xs[j] end
    return v
  end
  local g = H.numgrad(L, xs)
  assert_close(x.grad:tolist(), nest(g, {2, 3}), 2e-5, 2e-4, "x.grad")
end

function TestFunction:test_needs_input_grad ()
  local seen
  local F = gc.autograd.Function("Seen")
  function F.forward (ctx, x, w, k)
    seen = ctx.needs_input_grad
    ctx.kept = x * 1  -- freed with the node (the suite's check of live objects)
    lu.assertFalse(gc.is_grad_enabled())  -- forward records nothing
    return x * w * k
  end
  function F.backward (ctx, g)
    seen = {ctx.needs_input_grad[1], ctx.needs_input_grad[2], ctx.needs_input_grad[3]}
    return g, g, nil
  end
  local x, w = t2x3(1, true), t2x3(2)
  local y = F.apply(x, w, 3)
  lu.assertEquals(seen, {true, false, false})
  lu.assertTrue(gc.is_grad_enabled())
  y:sum():backward()
  lu.assertEquals(seen, {true, false, false})
  lu.assertNil(w.grad)  -- the grad of an input that needs none is dropped
  assert_bitwise(x.grad:tolist(), gc.ones({2, 3}):tolist(), "x.grad")
  -- under no_grad, or with no input requiring grad: no node
  local z = gc.no_grad(F.apply, x, w, 2)
  lu.assertEquals(seen, {false, false, false})
  lu.assertNil(z.grad_fn)
  lu.assertNil(F.apply(w, w, 2).grad_fn)
end

function TestFunction:test_nil_grads ()
  local F = gc.autograd.Function("OnlyFirst")
  function F.forward (_, a, b) return a + b end
  function F.backward (_, g) return g * 3, nil end
  local a, b = t2x3(1, true), t2x3(2, true)
  F.apply(a, b):sum():backward()
  lu.assertNil(b.grad)
  assert_bitwise(a.grad:tolist(), gc.full({2, 3}, 3):tolist(), "a.grad")
end

function TestFunction:test_output_is_an_input ()
  -- forward may return its argument: the output is a new tensor of the graph
  local F = gc.autograd.Function("Identity")
  function F.forward (_, x) return x end
  function F.backward (_, g) return g * 2 end
  local x = t2x3(1, true)
  local y = F.apply(x)
  lu.assertTrue(x.is_leaf)
  lu.assertEquals(y.grad_fn, "Identity")
  y:sum():backward()
  assert_bitwise(x.grad:tolist(), gc.full({2, 3}, 2):tolist(), "x.grad")
end

function TestFunction:test_saved_tensors_freed_without_retain_graph ()
  local x = t2x3(1, true)
  local y = Square.apply(x, 2)
  y:sum():backward({retain_graph = true})
  y:sum():backward()
  assert_bitwise(x.grad:tolist(), (x * 8):tolist(), "x.grad after two backwards")
  assert_err(function () y:sum():backward() end, "backward through the graph a second time",
             "ScaledSquare")
end

-- regression: a grad for a number argument was checked against a shape it never had
-- A Function's backward that returns a grad for an argument that is not a
-- tensor (a number): the grad is dropped, as for any input that needs none;
-- it was checked against a shape the number never had ("the input is []
-- f32"), an error for any grad but a scalar one.
function TestFunction:test_function_grad_for_a_number_argument ()
  local F = gc.autograd.Function("Scale")
  F.forward = function (_, s, x) return x * s end
  F.backward = function (_, g) return g, g * 3 end
  local x = gc.ones({2, 3}, {requires_grad = true})
  local y = F.apply(3, x)
  y:sum():backward()
  lu.assertEquals(x.grad:tolist(), {{3, 3, 3}, {3, 3, 3}})
  F.backward = function (_, g) return g:sum(), g * 3 end
  F.apply(3, x):sum():backward()
  lu.assertEquals(x.grad:tolist(), {{6, 6, 6}, {6, 6, 6}})
end

-- ---------------------------------------------------------------------------
-- Errors: each names the Function and the user's line, and leaves it usable

TestFunctionErrors = {}

function TestFunctionErrors:test_wrong_number_of_grads ()
  local F = with_backward("TwoGrads", function (_, g) return g, g end)
  local x = t2x3(1, true)
  local y = F.apply(x)
  local line = debug.getinfo(1, "l").currentline + 1
  assert_err(function () y:sum():backward() end,
             HERE .. line .. ":", "TwoGrads.backward returned 2 value(s); expected 1")
  lu.assertNil(x.grad)
  assert_usable("after a wrong number of grads")
end

function TestFunctionErrors:test_grad_not_a_tensor ()
  local F = with_backward("NumGrad", function () return 1 end)
  local x = t2x3(1, true)
  assert_err(function () F.apply(x):sum():backward() end,
             "NumGrad.backward: grad #1 must be a Tensor or nil, got number")
  lu.assertNil(x.grad)
  assert_usable("after a non-tensor grad")
end

function TestFunctionErrors:test_grad_of_wrong_shape_or_dtype ()
  local F = with_backward("Shape", function (_, g) return g:sum() end)
  local x = t2x3(1, true)
  assert_err(function () F.apply(x):sum():backward() end, "backward of 'Shape'",
             "grad of input #1 is [] f32; the input is [2, 3] f32")
  local D = with_backward("Dtype", function () return gc.zeros({2, 3}, "bf16") end)
  assert_err(function () D.apply(x):sum():backward() end, "backward of 'Dtype'",
             "is [2, 3] bf16; the input is [2, 3] f32")
  lu.assertNil(x.grad)
  assert_usable("after a grad of the wrong shape")
end

function TestFunctionErrors:test_error_in_forward ()
  local F = gc.autograd.Function("Bad")
  function F.forward () error("forward failed here") end
  function F.backward (_, g) return g end
  local line = debug.getinfo(1, "l").currentline - 2
  assert_err(function () F.apply(t2x3(1, true)) end, HERE .. line .. ": forward failed here")
  lu.assertTrue(gc.is_grad_enabled())  -- restored
  local R = gc.autograd.Function("Many")
  function R.forward (_, x) return x, x end
  function R.backward (_, g) return g end
  assert_err(function () R.apply(t2x3(1, true)) end, "Many.forward must return one Tensor",
             "2 values")
  assert_usable("after errors in forward")
end

function TestFunctionErrors:test_error_in_backward ()
  local F = with_backward("Raises", function () error("backward failed here") end)
  local line = debug.getinfo(1, "l").currentline - 1
  local x = t2x3(1, true)
  local y = F.apply(x)
  assert_err(function () y:sum():backward() end, HERE .. line .. ": backward failed here")
  lu.assertNil(x.grad)
  assert_usable("after an error in backward")
end

function TestFunctionErrors:test_save_for_backward_of_non_tensors ()
  local F = gc.autograd.Function("SavesNumber")
  function F.forward (ctx, x)
    ctx:save_for_backward(x, 3)
    return x * 2
  end
  function F.backward (_, g) return g end
  local line = debug.getinfo(1, "l").currentline - 4
  assert_err(function () F.apply(t2x3(1, true)) end, HERE .. line .. ":",
             "save_for_backward: argument #2 must be a Tensor, got number")
  local Seven = gc.autograd.Function("SavesSeven")
  function Seven.forward (ctx, x)
    ctx:save_for_backward(x, x, x, x, x, x, x)
    return x * 2
  end
  Seven.backward = F.backward
  line = debug.getinfo(1, "l").currentline + 1
  assert_err(function () Seven.apply(t2x3(1, true)) end, HERE .. line .. ":",
             "SavesSeven: 7 tensors saved for backward; at most 6")
  assert_usable("after save_for_backward of a number")
end

function TestFunctionErrors:test_saved_tensor_modified_in_place ()
  local x, w = t2x3(1, true), t2x3(2)
  local y = MulAdd.apply(x, w, x)
  w:fill_(1)
  assert_err(function () y:sum():backward() end, "modified by an inplace operation", "MulAdd")
  lu.assertNil(x.grad)
  assert_err(function () gc.autograd.Function(1) end, "name must be a string")
  assert_usable("after a saved tensor changed")
end

-- regression: a Function's closed tensors were 'bad argument #-1', naming no Function
-- A Function whose forward returns or saves a closed tensor, closes its
-- input, or whose backward returns a closed grad, is an error naming the
-- Function and the tensor's role, not an argument of an internal call; the
-- Function works afterwards.
function TestFunctionErrors:test_function_closed_tensors ()
  local F = gc.autograd.Function("Cl")
  F.backward = function (_, g) return g * 2 end
  local function apply () return F.apply(gc.randn({2}, {requires_grad = true})) end
  F.forward = function (_, x) local y = x * 2; y:close(); return y end
  H.assert_err(apply, "Cl.forward returned a closed tensor")
  F.forward = function (_, x) local y = x * 2; x:close(); return y end
  H.assert_err(apply, "Cl: input #1 of forward was closed")
  F.forward = function (ctx, x) local z = x * 1; ctx:save_for_backward(z); z:close(); return x * 2 end
  H.assert_err(apply, "Cl: saved tensor #1 was closed")
  F.forward = function (_, x) return x * 2 end
  F.backward = function (_, g) local r = g * 2; r:close(); return r end
  local x = gc.randn({2}, {requires_grad = true})
  local msg = H.assert_err(function () F.apply(x):sum():backward() end,
                           "Cl.backward: grad #1 is a closed tensor")
  lu.assertStrContains(msg, "test_autograd_function.lua:")
  lu.assertNil(x.grad)
  F.backward = function (_, g) return g * 2 end
  F.apply(x):sum():backward()
  lu.assertEquals(x.grad:tolist(), {2, 2})
end

-- regression: save_for_backward outside forward was accepted and never used
-- ctx:save_for_backward outside its Function's forward (in backward, or on
-- a ctx kept after apply) is an error: it was accepted and never used.
function TestFunctionErrors:test_save_for_backward_outside_forward ()
  local F = gc.autograd.Function("Late")
  local kept
  F.forward = function (ctx, x) kept = ctx; return x * 2 end
  F.backward = function (ctx, g) ctx:save_for_backward(g); return g * 2 end
  local x = gc.ones({2}, {requires_grad = true})
  local y = F.apply(x)
  H.assert_err(function () kept:save_for_backward(x) end,
               "save_for_backward: only inside Late.forward", "test_autograd_function.lua:")
  H.assert_err(function () y:sum():backward() end, "save_for_backward: only inside Late.forward")
  lu.assertNil(x.grad)
  F.backward = function (_, g) return g * 2 end
  F.apply(x):sum():backward()
  lu.assertEquals(x.grad:tolist(), {2, 2})
end

-- regression: a Function's name longer than its node's grad_fn was cut short
-- A Function's name is its node's grad_fn: one too long for the node (or
-- with a zero byte) is refused when the Function is made; it was cut short
-- in grad_fn and in the errors of its backward.
function TestFunctionErrors:test_function_name_fits_its_node ()
  H.assert_err(function () gc.autograd.Function(string.rep("n", 64)) end,
               "autograd.Function: name must be 1 to 63 bytes without a zero byte, got 64 bytes",
               "test_autograd_function.lua:")
  H.assert_err(function () gc.autograd.Function("a\0b") end, "without a zero byte")
  H.assert_err(function () gc.autograd.Function("") end, "got 0 bytes")
  local name = string.rep("n", 63)
  local F = gc.autograd.Function(name)
  F.forward = function (_, x) return x * 2 end
  F.backward = function (_, g) return g * 2 end
  lu.assertEquals(F.apply(gc.ones({2}, {requires_grad = true})).grad_fn, name)
end

-- regression: over 4096 arguments was 'bad argument #3 to _fn_record' in the facade
-- A Function applied to more arguments than its node takes (4096) is an
-- error naming the Function, at the caller's line; it was "bad argument #3
-- to '_fn_record' (out of range)" at a line of graphcap.autograd.
function TestFunctionErrors:test_function_too_many_arguments ()
  local F = gc.autograd.Function("Many")
  F.forward = function (_, x) return x * 2 end
  F.backward = function (_, g) return g end
  local a = {gc.ones({2}, {requires_grad = true})}
  for i = 2, 4097 do a[i] = i end
  H.assert_err(function () local y = F.apply(table.unpack(a)); return y end,
               "Many.apply: 4097 arguments; at most 4096", "test_autograd_function.lua:")
  lu.assertEquals(F.apply(a[1]).grad_fn, "Many")
end

-- ---------------------------------------------------------------------------
-- Graphed: a Lua module of Functions, make_graphed_callables, SGD

local LR, STEPS = 0.05, 3

-- Linear(8, 8) then MulAdd(h, h, x) then ScaledSquare(., 0.25)
local Net = gc.nn.Module("FnNet")
function Net:init ()
  self.lin = gc.nn.Linear(8, 8)
  self.gain = gc.nn.Parameter(gc.full({4, 8}, 0.5))
end
function Net:forward (x)
  local h = self.lin(x)
  return Square.apply(MulAdd.apply(h, self.gain, x), 0.25)
end

local function train (m, call)
  local opt = gc.optim.SGD(m:parameters(), {lr = LR})
  local outs, xgrads = {}, {}
  for step = 1, STEPS do
    opt:zero_grad()
    local x = gc.tensor(nest(values(32, step), {4, 8}), {requires_grad = true})
    local y = call(x)
    outs[step] = y:tolist()
    local loss = (y * gc.tensor(nest(values(32, -step), {4, 8}))):sum()
    loss:backward()
    xgrads[step] = x.grad:tolist()
    opt:step()
  end
  local ps = {}
  for i, p in ipairs(m:parameters()) do ps[i] = p:tolist() end
  return {outs = outs, xgrads = xgrads, params = ps}
end

TestFunctionGraphed = {}
function TestFunctionGraphed:tearDown () H.no_capture_left() end

function TestFunctionGraphed:test_graphed_equals_eager ()
  gc.manual_seed(3)
  local eager_m = Net()
  local eager = train(eager_m, function (x) return eager_m(x) end)
  gc.manual_seed(3)
  local m = Net()
  local log = {}
  local hooks = {}
  for _, g in ipairs{"forward_pre_hooks", "forward_hooks", "backward_pre_hooks",
                     "backward_hooks"} do
    hooks[g] = {function () log[#log + 1] = g end}
  end
  local G = gc.make_graphed_callables(m, {gc.ones({4, 8}, {requires_grad = true})},
                                      {num_warmup_iters = 2, capture_time_hooks = {hooks}})
  local one = {"forward_pre_hooks", "forward_hooks", "backward_pre_hooks", "backward_hooks"}
  local want = {}  -- two warmup iterations and the capture
  for i = 1, 3 * #one do want[i] = one[(i - 1) % #one + 1] end
  lu.assertEquals(log, want)
  local graphed = train(m, function (x) return G(x) end)
  for s = 1, STEPS do
    assert_bitwise(graphed.outs[s], eager.outs[s], "output of step " .. s)
    assert_bitwise(graphed.xgrads[s], eager.xgrads[s], "input grad of step " .. s)
  end
  lu.assertEquals(#graphed.params, 3)
  for i = 1, #eager.params do
    assert_bitwise(graphed.params[i], eager.params[i], "parameter " .. i)
  end
  G:close()
end

function TestFunctionGraphed:test_error_in_backward_at_capture ()
  -- the capture of the backward fails with the user's error; nothing is left open
  local M = gc.nn.Module("FailingFn")
  local F = with_backward("FailsInCapture", function () error("no backward") end)
  function M:init () self.w = gc.nn.Parameter(gc.ones({4, 8})) end
  function M:forward (x) return F.apply(x * self.w) end
  local m = M()
  assert_err(function ()
    gc.make_graphed_callables(m, {gc.ones({4, 8}, {requires_grad = true})})
  end, "no backward")
  lu.assertFalse(gc.is_capturing())
  assert_usable("after a failed capture")
end

os.exit(lu.LuaUnit.run(), true)
