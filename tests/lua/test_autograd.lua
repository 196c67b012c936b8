-- test_autograd.lua: autograd from Lua (docs/lua-api.md, "Autograd"):
-- t.requires_grad (assignable on leaves only), t.grad (nil, then a tensor that
-- keeps its Lua value; assignable), t.grad_fn, t.is_leaf, t:detach(),
-- t:backward() with and without a grad and with {retain_graph = true}, its
-- errors; gc.no_grad; the gradients of every gc.F op and of matmul against
-- values worked out by hand or by central differences of a double-precision Lua
-- reference; a backward captured in a gc.Graph replays to the eager .grad bit
-- for bit.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_autograd.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local flat, nest, values = H.flat, H.nest, H.values
local assert_close, assert_bitwise, assert_err = H.assert_close, H.assert_bitwise, H.assert_err

local HERE = debug.getinfo(1, "S").short_src .. ":"  -- errors name the user's line

-- ---------------------------------------------------------------------------
-- Helpers

local gradcheck = H.gradcheck  -- op against a double-precision reference

-- Double-precision references on flat lists, rows over the last dimension.

local function ref_linear (x, w, b, nin, nout)
  local rows, y = #x // nin, {}
  for r = 0, rows - 1 do
    for o = 0, nout - 1 do
      local s = b and b[o + 1] or 0
      for i = 0, nin - 1 do s = s + x[r * nin + i + 1] * w[o * nin + i + 1] end
      y[r * nout + o + 1] = s
    end
  end
  return y
end

local function ref_matmul (a, b, m, k, n)
  local y = {}
  for i = 0, m - 1 do
    for j = 0, n - 1 do
      local s = 0
      for l = 0, k - 1 do s = s + a[i * k + l + 1] * b[l * n + j + 1] end
      y[i * n + j + 1] = s
    end
  end
  return y
end

local GELU_C, GELU_K = math.sqrt(2 / math.pi), 0.044715
local function gelu1 (x)
  return 0.5 * x * (1 + math.tanh(GELU_C * (x + GELU_K * x * x * x)))
end

local function map (xs, f)
  local y = {}
  for i, x in ipairs(xs) do y[i] = f(x) end
  return y
end

local function ref_layer_norm (x, w, b, cols, eps)
  local y = {}
  for r = 0, #x // cols - 1 do
    local mean, var = 0, 0
    for c = 1, cols do mean = mean + x[r * cols + c] end
    mean = mean / cols
    for c = 1, cols do var = var + (x[r * cols + c] - mean) ^ 2 end
    var = var / cols
    local rstd = 1 / math.sqrt(var + eps)
    for c = 1, cols do
      local v = (x[r * cols + c] - mean) * rstd
      if w then v = v * w[c] end
      if b then v = v + b[c] end
      y[r * cols + c] = v
    end
  end
  return y
end

local function ref_softmax (x, cols)
  local y = {}
  for r = 0, #x // cols - 1 do
    local mx, s = -math.huge, 0
    for c = 1, cols do mx = math.max(mx, x[r * cols + c]) end
    for c = 1, cols do s = s + math.exp(x[r * cols + c] - mx) end
    for c = 1, cols do y[r * cols + c] = math.exp(x[r * cols + c] - mx) / s end
  end
  return y
end

-- ---------------------------------------------------------------------------

TestAutograd = {}

function TestAutograd:setUp ()
  gc.manual_seed(1234)
end

function TestAutograd:tearDown ()
  lu.assertTrue(gc.is_grad_enabled())
  lu.assertFalse(gc.is_capturing())
end

-- requires_grad -------------------------------------------------------------

function TestAutograd:test_requires_grad_read_and_assign_on_leaf ()
  local t = gc.zeros({2, 3})
  lu.assertFalse(t.requires_grad)
  lu.assertTrue(gc.ones({2}, {requires_grad = true}).requires_grad)
  lu.assertFalse(gc.ones({2}, {requires_grad = false}).requires_grad)
  t.requires_grad = true
  lu.assertTrue(t.requires_grad)
  lu.assertTrue(t.is_leaf)
  local y = t * 2
  lu.assertTrue(y.requires_grad)           -- recorded because t requires grad
  t.requires_grad = false
  lu.assertFalse(t.requires_grad)
  local z = t * 2
  lu.assertFalse(z.requires_grad)          -- nothing recorded any more
  lu.assertNil(z.grad_fn)
  lu.assertIs(t:requires_grad_(), t)       -- the method form returns t
  lu.assertTrue(t.requires_grad)
  t:requires_grad_(false)
  lu.assertFalse(t.requires_grad)
  assert_err(function () t.requires_grad = 1 end, "requires_grad must be a boolean", "number")
  assert_err(function () t.requires_grad = nil end, "requires_grad must be a boolean")
  lu.assertFalse(t.requires_grad)
end

function TestAutograd:test_requires_grad_assign_on_non_leaf_errors ()
  local x = gc.tensor({1, 2}, {requires_grad = true})
  local y = x * x
  lu.assertTrue(y.requires_grad)
  local msg = assert_err(function () y.requires_grad = false end,
                         "requires_grad", "only leaves", "'mul'", "detach")
  lu.assertStrContains(msg, HERE)   -- points at the user's line
  assert_err(function () y.requires_grad = true end, "only leaves")
  assert_err(function () y:requires_grad_(false) end, "only leaves")
  lu.assertTrue(y.requires_grad)                    -- unchanged
  lu.assertEquals(y.grad_fn, "mul")
  y:sum():backward()                                -- and still differentiable
  lu.assertEquals(x.grad:tolist(), {2, 4})
end

function TestAutograd:test_unknown_field_assignment_errors ()
  local t = gc.zeros({2})
  assert_err(function () t.foo = 1 end, "no assignable field 'foo'")
  assert_err(function () t.is_leaf = false end, "no assignable field 'is_leaf'")
  lu.assertNil(t.foo)
  lu.assertTrue(t.is_leaf)
end

-- grad ------------------------------------------------------------------------

function TestAutograd:test_grad_nil_then_tensor_with_one_lua_value ()
  local x = gc.tensor({{1, 2}, {3, 4}}, {requires_grad = true})
  lu.assertNil(x.grad)
  local s = (x * x):sum()
  lu.assertNil(x.grad)                     -- nothing until backward
  s:backward()
  local g = x.grad
  lu.assertNotNil(g)
  lu.assertEquals(g:shape(), {2, 2})
  lu.assertEquals(g:dtype(), "f32")
  lu.assertEquals(g:tolist(), {{2, 4}, {6, 8}})
  lu.assertTrue(rawequal(x.grad, g))       -- the same Lua value while it lives
  lu.assertTrue(rawequal(x.grad, x.grad))
  lu.assertFalse(g.requires_grad)
  lu.assertTrue(g.is_leaf)
  local ptr = g:data_ptr()
  ;(x * 3):sum():backward()                -- accumulates in place
  lu.assertTrue(rawequal(x.grad, g))
  lu.assertEquals(x.grad:data_ptr(), ptr)
  lu.assertEquals(g:tolist(), {{5, 7}, {9, 11}})
end

function TestAutograd:test_grad_assign_nil_and_tensor ()
  local x = gc.tensor({{1, 2}, {3, 4}}, {requires_grad = true})
  x:sum():backward()
  lu.assertNotNil(x.grad)
  x.grad = nil
  lu.assertNil(x.grad)
  local z = gc.full({2, 2}, 0.5)
  x.grad = z
  lu.assertNotNil(x.grad)
  lu.assertEquals(x.grad:data_ptr(), z:data_ptr())   -- the tensor itself, not a copy
  lu.assertEquals(x.grad:tolist(), {{0.5, 0.5}, {0.5, 0.5}})
  ;(x * 2):sum():backward()                          -- accumulates into it
  lu.assertEquals(z:tolist(), {{2.5, 2.5}, {2.5, 2.5}})
  x.grad = nil
  lu.assertNil(x.grad)
  lu.assertEquals(z:tolist(), {{2.5, 2.5}, {2.5, 2.5}})  -- z itself lives on
  -- a grad can be given to a tensor that does not require grad, too
  local u = gc.zeros({3})
  u.grad = gc.ones({3})
  lu.assertEquals(u.grad:tolist(), {1, 1, 1})
end

-- x.grad = z makes z (that Lua value) x's grad, as in PyTorch (x.grad is z).
function TestAutograd:test_grad_assigned_reads_back_same_lua_value ()
  local x = gc.tensor({1, 2}, {requires_grad = true})
  local z = gc.ones({2})
  x.grad = z
  lu.assertTrue(rawequal(x.grad, z),
                "x.grad = z; x.grad is a different Lua value than z")
end

-- A tensor cannot be its own grad (PyTorch: "can't assign Variable as its
-- own grad"): accepted, backward would accumulate into the leaf's own data
-- (and the tensor would hold a reference to itself).
function TestAutograd:test_grad_cannot_be_the_tensor_itself ()
  local x = gc.tensor({1, 2}, {requires_grad = true})
  local ok = pcall(function () x.grad = x end)
  ;(x * 3):sum():backward()
  local v = x:tolist()
  x.grad = nil                  -- no self-reference left behind either way
  lu.assertTrue(not ok and v[1] == 1 and v[2] == 2,
                string.format("x.grad = x was %s; after backward x = {%g, %g} (was {1, 2})",
                              ok and "accepted" or "refused", v[1], v[2]))
  lu.assertStrContains(select(2, pcall(function () x.grad = x end)), "grad")
  lu.assertNil(x.grad)
end

function TestAutograd:test_grad_assign_wrong_shape_or_type_errors ()
  local x = gc.tensor({{1, 2}, {3, 4}}, {requires_grad = true})
  local keep = gc.ones({2, 2})
  x.grad = keep
  assert_err(function () x.grad = gc.zeros({3}) end, "grad", "[3]", "[2, 2]")
  assert_err(function () x.grad = gc.zeros({4}) end, "[4]", "[2, 2]")
  assert_err(function () x.grad = gc.zeros({2, 2}, "bf16") end, "bf16", "f32")
  assert_err(function () x.grad = 3 end, "grad must be a tensor or nil", "number")
  assert_err(function () x.grad = {} end, "grad must be a tensor or nil", "table")
  lu.assertEquals(x.grad:data_ptr(), keep:data_ptr())   -- unchanged by the failures
  lu.assertEquals(x.grad:tolist(), {{1, 1}, {1, 1}})
end

-- grad_fn, is_leaf, detach ----------------------------------------------------

function TestAutograd:test_grad_fn_names ()
  local x = gc.tensor({{0.5, -1}, {2, 0.25}}, {requires_grad = true})
  local w = gc.tensor({{1, 2}, {3, 4}}, {requires_grad = true})
  local b = gc.tensor({0.5, 0.5}, {requires_grad = true})
  lu.assertNil(x.grad_fn)
  local cases = {
    {x + x, "add"}, {x - x, "sub"}, {x * x, "mul"}, {x * 2, "scale"}, {2 * x, "scale"},
    {-x, "neg"}, {x:sum(), "sum"}, {x:mean(), "mean"}, {x + 1, "add"},
    {gc.matmul(x, w), "matmul"}, {x:matmul(w), "matmul"},
    {gc.F.linear(x, w, b), "linear"}, {gc.F.linear(x, w), "linear"},
    {gc.F.relu(x), "relu"}, {x:relu(), "relu"}, {gc.F.gelu(x), "gelu"},
    {gc.F.layer_norm(x), "layer_norm"}, {gc.F.softmax(x), "softmax"},
    {x:softmax(), "softmax"}, {gc.F.dropout(x, 0.5), "dropout"},
    {gc.F.mse_loss(x, w), "mean"},          -- mean((x - w)^2), recorded op by op
    {gc.F.cross_entropy(x, gc.tensor({0, 1})), "cross_entropy"},
    {x:view({4}), "view"},
  }
  for i, c in ipairs(cases) do
    lu.assertEquals(c[1].grad_fn, c[2], "case " .. i)
    lu.assertFalse(c[1].is_leaf, "case " .. i)
    lu.assertTrue(c[1].requires_grad, "case " .. i)
  end
  -- nothing that requires grad: nothing recorded
  local p = gc.ones({2, 2})
  for _, y in ipairs{p * p, gc.F.relu(p), gc.matmul(p, p), p:sum()} do
    lu.assertNil(y.grad_fn)
    lu.assertTrue(y.is_leaf)
    lu.assertFalse(y.requires_grad)
  end
end

function TestAutograd:test_is_leaf ()
  local x = gc.ones({2}, {requires_grad = true})
  local c = gc.ones({2})
  lu.assertTrue(x.is_leaf)
  lu.assertTrue(c.is_leaf)
  lu.assertFalse((x * c).is_leaf)
  lu.assertTrue((c * c).is_leaf)
  lu.assertTrue(x:clone():detach().is_leaf)
  lu.assertNil(x.no_such_field)            -- other names read as nil
end

function TestAutograd:test_detach ()
  local x = gc.tensor({1, 2, 3}, {requires_grad = true})
  local y = x * x
  local d = y:detach()
  lu.assertTrue(d.is_leaf)
  lu.assertFalse(d.requires_grad)
  lu.assertNil(d.grad_fn)
  lu.assertEquals(d:data_ptr(), y:data_ptr())     -- shares storage
  lu.assertEquals(d:tolist(), {1, 4, 9})
  lu.assertEquals(y.grad_fn, "mul")               -- y itself unchanged
  -- the detached tensor cuts the graph: only the direct path reaches x
  local s = (d * x):sum()                         -- d treated as a constant
  s:backward()
  lu.assertEquals(x.grad:tolist(), {1, 4, 9})
  -- a detached leaf copy of a leaf shares its storage too
  local dx = x:detach()
  gc.no_grad(function () dx:fill_(7) end)
  lu.assertEquals(x:tolist(), {7, 7, 7})
  dx.requires_grad = true                         -- and can require grad itself
  lu.assertTrue(dx.requires_grad)
  lu.assertTrue(x.requires_grad)
end

-- backward ------------------------------------------------------------------------

function TestAutograd:test_backward_scalar_without_grad ()
  local x = gc.tensor({1, -2, 3}, {requires_grad = true})
  local s = (x * x):mean()
  lu.assertEquals(s:dim(), 0)
  lu.assertNil(s:backward())
  assert_close(flat(x.grad:tolist()), {2 / 3, -4 / 3, 2}, 1e-6, 1e-6, "d mean(x^2)")
  -- a one-element tensor of any rank needs no grad either
  local z = gc.tensor({{2}}, {requires_grad = true})
  ;(z * z):backward()
  lu.assertEquals(z.grad:tolist(), {{4}})
  -- backward of a leaf itself accumulates the grad into it
  local l = gc.tensor({5}, {requires_grad = true})
  l:backward()
  lu.assertEquals(l.grad:tolist(), {1})
end

function TestAutograd:test_backward_with_grad ()
  local x = gc.tensor({{1, 2, 3}, {4, 5, 6}}, {requires_grad = true})
  local y = x * x                                   -- dy/dx = 2x
  local g = gc.tensor({{1, 0.5, -1}, {2, 0, 0.25}})
  y:backward(g)
  lu.assertEquals(x.grad:tolist(), {{2, 2, -6}, {16, 0, 3}})
  lu.assertEquals(g:tolist(), {{1, 0.5, -1}, {2, 0, 0.25}})  -- the given grad is untouched
  -- the same with an options table as well
  local x2 = gc.tensor({1, 2}, {requires_grad = true})
  ;(x2 * 3):backward(gc.tensor({1, -1}), {retain_graph = false})
  lu.assertEquals(x2.grad:tolist(), {3, -3})
end

-- The leaf grads of one node may go out together (one launch); values are
-- those of one accumulation after the other, also when .grad tensors share
-- storage (then they must not go out together).
function TestAutograd:test_leaf_grads_of_one_node ()
  local w = gc.tensor(H.values(6, 0.2), {requires_grad = true})
  local b = gc.tensor(H.values(6, 1.7), {requires_grad = true})
  local function pass () ((w * b) * gc.tensor(H.values(6, 2.9))):sum():backward() end
  pass()   -- first grads, both from one mul node
  local gw, gb = w.grad:tolist(), b.grad:tolist()
  local w0, b0 = gc.tensor(H.values(6, 4.1)), gc.tensor(H.values(6, 5.3))
  w.grad, b.grad = w0, b0
  pass()
  lu.assertTrue(rawequal(w.grad, w0))
  lu.assertTrue(rawequal(b.grad, b0))
  H.assert_same(w.grad:tolist(), (gc.tensor(H.values(6, 4.1)) + gc.tensor(gw)):tolist(), "w.grad")
  H.assert_same(b.grad:tolist(), (gc.tensor(H.values(6, 5.3)) + gc.tensor(gb)):tolist(), "b.grad")
  -- two leaves of one add node whose grads are one storage: both adds land
  local x = gc.ones({4096}, {requires_grad = true})
  local y = gc.ones({4096}, {requires_grad = true})
  local shared = gc.ones({4096})
  x.grad = shared
  y.grad = shared:view({4096})
  ;(x + y):sum():backward()
  H.assert_same(shared:tolist(), H.flat(gc.full({4096}, 3):tolist()), "shared grad storage")
end

function TestAutograd:test_backward_retain_graph ()
  local x = gc.tensor({1, 2}, {requires_grad = true})
  local s = (x * x):sum()
  s:backward({retain_graph = true})
  lu.assertEquals(x.grad:tolist(), {2, 4})
  s:backward({retain_graph = true})
  lu.assertEquals(x.grad:tolist(), {4, 8})
  s:backward(nil, {retain_graph = true})
  lu.assertEquals(x.grad:tolist(), {6, 8 + 4})
  s:backward()                                        -- the last may free
  lu.assertEquals(x.grad:tolist(), {8, 16})
  local msg = assert_err(function () s:backward() end, "second time")
  lu.assertStrContains(msg, "retain_graph")
  lu.assertEquals(x.grad:tolist(), {8, 16})           -- the failed one added nothing
  -- with a given grad too
  local y = x * x
  y:backward(gc.ones({2}), {retain_graph = true})
  y:backward(gc.ones({2}))
  lu.assertEquals(x.grad:tolist(), {12, 24})
  assert_err(function () y:backward(gc.ones({2})) end, "second time")
end

function TestAutograd:test_second_backward_errors ()
  local x = gc.tensor({{1, 2}, {3, 4}}, {requires_grad = true})
  local w = gc.tensor({{1, 0}, {0, 1}}, {requires_grad = true})
  local loss = gc.F.gelu(gc.F.linear(x, w)):sum()
  loss:backward()
  local gx = x.grad:tolist()
  local msg = assert_err(function () loss:backward() end, "backward", "second time")
  lu.assertStrContains(msg, HERE)
  lu.assertEquals(x.grad:tolist(), gx)
  -- an op on a freed graph is still usable forward; a fresh graph backprops
  local loss2 = gc.F.gelu(gc.F.linear(x, w)):sum()
  loss2:backward()
  assert_close(flat(x.grad:tolist()), map(flat(gx), function (v) return 2 * v end),
               1e-6, 1e-6, "second fresh backward")
end

function TestAutograd:test_nonscalar_backward_without_grad_errors ()
  local x = gc.ones({2, 3}, {requires_grad = true})
  local y = x * 2
  local msg = assert_err(function () y:backward() end, "backward", "[2, 3]")
  lu.assertStrContains(msg, "one-element")
  assert_err(function () y:backward({retain_graph = true}) end, "[2, 3]")
  lu.assertNil(x.grad)
  y:backward(gc.ones({2, 3}))                            -- with a grad it works
  lu.assertEquals(x.grad:tolist(), {{2, 2, 2}, {2, 2, 2}})
end

function TestAutograd:test_backward_bad_arguments ()
  local x = gc.ones({2}, {requires_grad = true})
  local y = x * 2
  assert_err(function () y:backward(gc.ones({3})) end, "backward", "[3]", "[2]")
  assert_err(function () y:backward(gc.ones({2, 1})) end, "[2, 1]", "[2]")
  assert_err(function () y:backward(gc.ones({2}, "bf16")) end, "bf16")
  assert_err(function () y:backward(gc.ones({2}), {retain = true}) end,
             "backward", "unknown option 'retain'")
  assert_err(function () y:backward(gc.ones({2}), {retain_graph = 1}) end,
             "retain_graph must be a boolean")
  assert_err(function () y:backward(5) end, "backward: grad must be a Tensor", HERE)
  assert_err(function () gc.ones({2}):sum():backward() end, "does not require grad")
  lu.assertNil(x.grad)
  y:backward(gc.ones({2}))                               -- the graph was never spent
  lu.assertEquals(x.grad:tolist(), {2, 2})
end

function TestAutograd:test_backward_diamond_and_reuse ()
  -- x feeds two paths that join; grads from both must add up
  local x = gc.tensor({0.5, -1.5, 2}, {requires_grad = true})
  local a = x * x                -- 2x
  local b = x * 3                -- 3
  local s = (a + b - x):sum()    -- 2x + 3 - 1
  s:backward()
  lu.assertEquals(x.grad:tolist(), {3, -1, 6})
end

-- no_grad ---------------------------------------------------------------------------

function TestAutograd:test_no_grad_returns_fn_results ()
  local a, b, c, d = gc.no_grad(function (p, q, r) return p, q, r, "x" end, 1, nil, 3)
  lu.assertEquals({a, b, c, d}, {1, nil, 3, "x"})
  lu.assertEquals(select("#", gc.no_grad(function () return 1, nil, nil end)), 3)
  lu.assertEquals(select("#", gc.no_grad(function () end)), 0)
  local t = gc.ones({2}, {requires_grad = true})
  local y = gc.no_grad(function (u) return u * 2 end, t)
  lu.assertEquals(y:tolist(), {2, 2})
end

function TestAutograd:test_no_grad_records_nothing ()
  local x = gc.tensor({1, 2}, {requires_grad = true})
  local w = gc.tensor({{1, 2}, {3, 4}}, {requires_grad = true})
  local lin = gc.nn.Linear(2, 2)
  local seen
  local ys = {gc.no_grad(function ()
    seen = gc.is_grad_enabled()
    return x * x, gc.F.linear(x, w), gc.F.gelu(x), (x + x):sum(), lin(x),
           gc.F.dropout(x, 0.5), gc.F.mse_loss(x, x * 2)
  end)}
  lu.assertFalse(seen)
  lu.assertTrue(gc.is_grad_enabled())
  lu.assertEquals(#ys, 7)
  for i, y in ipairs(ys) do
    lu.assertFalse(y.requires_grad, "result " .. i)
    lu.assertNil(y.grad_fn, "result " .. i)
    lu.assertTrue(y.is_leaf, "result " .. i)
  end
  lu.assertEquals(ys[1]:tolist(), {1, 4})
  assert_err(function () ys[4]:backward() end, "does not require grad")
  -- outside, recording is back
  lu.assertEquals((x * x).grad_fn, "mul")
  -- leaves requiring grad can be changed in place only there
  assert_err(function () x:fill_(0) end, "fill_", "no_grad")
  gc.no_grad(function () x:fill_(0) end)
  lu.assertEquals(x:tolist(), {0, 0})
end

function TestAutograd:test_no_grad_restores_mode_when_fn_errors ()
  local ok, e = pcall(gc.no_grad, function () error("boom in no_grad") end)
  lu.assertFalse(ok)
  lu.assertStrContains(e, "boom in no_grad")
  lu.assertNotStrContains(e, "stack traceback:")
  lu.assertStrContains(e, HERE)
  lu.assertTrue(gc.is_grad_enabled())
  -- an error object that is not a string comes back as it is
  local obj = {code = 7}
  local ok2, e2 = pcall(gc.no_grad, function () error(obj) end)
  lu.assertFalse(ok2)
  lu.assertIs(e2, obj)
  lu.assertTrue(gc.is_grad_enabled())
  -- an engine error raised inside, too
  assert_err(function ()
    gc.no_grad(function () return gc.zeros({2}) + gc.zeros({3}) end)
  end, "add")
  lu.assertTrue(gc.is_grad_enabled())
  local x = gc.ones({2}, {requires_grad = true})
  lu.assertEquals((x * x).grad_fn, "mul")
end

function TestAutograd:test_no_grad_nested_and_enable_grad ()
  local x = gc.ones({2}, {requires_grad = true})
  gc.no_grad(function ()
    gc.no_grad(function () lu.assertFalse(gc.is_grad_enabled()) end)
    lu.assertFalse(gc.is_grad_enabled())            -- inner restored "off"
    local y = gc.enable_grad(function ()
      lu.assertTrue(gc.is_grad_enabled())
      return x * x
    end)
    lu.assertEquals(y.grad_fn, "mul")
    lu.assertFalse(gc.is_grad_enabled())
    pcall(gc.enable_grad, function () error("x") end)
    lu.assertFalse(gc.is_grad_enabled())            -- restored after an error
  end)
  lu.assertTrue(gc.is_grad_enabled())
  assert_err(function () gc.no_grad(42) end, "no_grad", "function", "number")
  assert_err(function () gc.no_grad() end, "no_grad", "function")
  lu.assertTrue(gc.is_grad_enabled())
end

-- Gradients of the ops ----------------------------------------------------------------

function TestAutograd:test_grad_linear_by_hand ()
  -- y = x W^T + b; loss = sum(y): dx = column sums of W, dW = sum of x rows, db = rows
  local x = gc.tensor({{1, 2}, {-1, 0.5}}, {requires_grad = true})
  local w = gc.tensor({{3, 4}, {5, 6}, {-1, 0}}, {requires_grad = true})
  local b = gc.tensor({0.5, -0.5, 1}, {requires_grad = true})
  local y = gc.F.linear(x, w, b)
  lu.assertEquals(y:tolist(), {{11.5, 16.5, 0}, {-0.5, -2.5, 2}})
  y:sum():backward()
  lu.assertEquals(x.grad:tolist(), {{7, 10}, {7, 10}})
  lu.assertEquals(w.grad:tolist(), {{0, 2.5}, {0, 2.5}, {0, 2.5}})
  lu.assertEquals(b.grad:tolist(), {2, 2, 2})
end

function TestAutograd:test_grad_linear ()
  local nin, nout = 4, 3
  gradcheck("linear", {{{2, 3, nin}, values(24, 0.1)}, {{nout, nin}, values(12, 1.3)},
                       {{nout}, values(3, 2.2)}},
            function (x, w, b) return gc.F.linear(x, w, b) end,
            function (x, w, b) return ref_linear(x, w, b, nin, nout) end)
end

function TestAutograd:test_grad_linear_without_bias ()
  gradcheck("linear (no bias)", {{{5, 3}, values(15, 0.4)}, {{2, 3}, values(6, 2.0)}},
            function (x, w) return gc.F.linear(x, w) end,
            function (x, w) return ref_linear(x, w, nil, 3, 2) end)
  -- input without grad: only the weight's
  gradcheck("linear (weight only)", {{{3, 2}, values(6, 0.9), grad = false},
                                     {{4, 2}, values(8, 0.2)}},
            function (x, w) return gc.F.linear(x, w) end,
            function (x, w) return ref_linear(x, w, nil, 2, 4) end)
end

function TestAutograd:test_grad_matmul ()
  gradcheck("matmul", {{{3, 4}, values(12, 0.5)}, {{4, 2}, values(8, 1.7)}},
            gc.matmul,
            function (a, b) return ref_matmul(a, b, 3, 4, 2) end)
  -- by hand: d sum(A B) / dA = rows of B summed, / dB = columns of A summed
  local a = gc.tensor({{1, 2}, {3, 4}}, {requires_grad = true})
  local b = gc.tensor({{5, 6}, {7, 8}}, {requires_grad = true})
  gc.matmul(a, b):sum():backward()
  lu.assertEquals(a.grad:tolist(), {{11, 15}, {11, 15}})
  lu.assertEquals(b.grad:tolist(), {{4, 4}, {6, 6}})
end

function TestAutograd:test_grad_relu ()
  local v = {-1.5, 0.25, 2, -0.5, 3, -0.125}
  gradcheck("relu", {{{2, 3}, v}}, gc.F.relu,
            function (x) return map(x, function (t) return math.max(t, 0) end) end)
  local x = gc.tensor(v, {requires_grad = true})
  gc.F.relu(x):sum():backward()
  lu.assertEquals(x.grad:tolist(), {0, 1, 1, 0, 1, 0})
end

function TestAutograd:test_grad_gelu ()
  local v = values(12, 0.2, 2.5)
  gradcheck("gelu", {{{3, 4}, v}}, gc.F.gelu, function (x) return map(x, gelu1) end)
  -- by hand at 0: gelu'(0) = 0.5
  local z = gc.zeros({1}, {requires_grad = true})
  gc.F.gelu(z):sum():backward()
  lu.assertEquals(z.grad:tolist(), {0.5})
end

function TestAutograd:test_grad_layer_norm ()
  local cols = 5
  gradcheck("layer_norm", {{{3, cols}, values(15, 0.6, 2)}, {{cols}, values(cols, 1.1)},
                           {{cols}, values(cols, 2.9)}},
            function (x, w, b) return gc.F.layer_norm(x, w, b) end,
            function (x, w, b) return ref_layer_norm(x, w, b, cols, 1e-5) end,
            {atol = 1e-4, rtol = 1e-3})
end

function TestAutograd:test_grad_layer_norm_without_affine_and_eps ()
  local cols = 4
  gradcheck("layer_norm (no affine)", {{{2, cols}, values(8, 0.3, 1.5)}},
            function (x) return gc.F.layer_norm(x) end,
            function (x) return ref_layer_norm(x, nil, nil, cols, 1e-5) end,
            {atol = 1e-4, rtol = 1e-3})
  gradcheck("layer_norm (eps 0.5)", {{{2, cols}, values(8, 0.8)}},
            function (x) return gc.F.layer_norm(x, nil, nil, 0.5) end,
            function (x) return ref_layer_norm(x, nil, nil, cols, 0.5) end,
            {atol = 1e-4, rtol = 1e-3})
end

function TestAutograd:test_grad_softmax ()
  gradcheck("softmax", {{{3, 4}, values(12, 0.9, 2)}}, gc.F.softmax,
            function (x) return ref_softmax(x, 4) end)
  gradcheck("softmax dim 2", {{{2, 3}, values(6, 0.1)}},
            function (x) return gc.F.softmax(x, 2) end,
            function (x) return ref_softmax(x, 3) end)
  -- the sum of a softmax row is 1 whatever x: its grad is 0
  local x = gc.tensor({{1, 2, 3}}, {requires_grad = true})
  gc.F.softmax(x):sum():backward()
  assert_close(flat(x.grad:tolist()), {0, 0, 0}, 1e-6, 0, "d sum(softmax)")
  assert_err(function () gc.F.softmax(x, 1) end, "softmax", "last dimension")
end

function TestAutograd:test_grad_dropout ()
  gc.manual_seed(99)
  local n = 64
  local v = values(n, 0.4, 2)
  for i = 1, n do if v[i] == 0 then v[i] = 1 end end
  local x = gc.tensor({v}, {requires_grad = true})
  local xv = flat(x:tolist())
  local y = gc.F.dropout(x, 0.5)
  lu.assertEquals(y.grad_fn, "dropout")
  local yv = flat(y:tolist())
  local c = values(n, 1.0)
  local mask, kept = {}, 0
  for i = 1, n do
    if yv[i] == 0 then mask[i] = 0
    else
      lu.assertEquals(yv[i], xv[i] * 2, "kept entries are scaled by 1/(1-p)")
      mask[i] = 2
      kept = kept + 1
    end
  end
  lu.assertTrue(kept > 0 and kept < n, "some kept, some dropped: " .. kept)
  ;(y * gc.tensor({c})):sum():backward()
  local want = {}
  for i = 1, n do want[i] = c[i] * mask[i] end
  assert_close(flat(x.grad:tolist()), want, 1e-6, 1e-6, "dropout grad")
  -- p = 0.25: kept entries scaled by 4/3, grad the same mask
  local x2 = gc.tensor({v}, {requires_grad = true})
  local y2 = gc.F.dropout(x2, 0.25)
  y2:sum():backward()
  local y2v, g2 = flat(y2:tolist()), flat(x2.grad:tolist())
  for i = 1, n do
    if y2v[i] == 0 then lu.assertEquals(g2[i], 0)
    else
      assert_close({y2v[i]}, {xv[i] / 0.75}, 1e-6, 1e-6, "scaled entry")
      assert_close({g2[i]}, {1 / 0.75}, 1e-6, 1e-6, "kept grad")
    end
  end
end

function TestAutograd:test_grad_dropout_identity_cases ()
  local v = values(6, 0.2)
  -- not training, or p = 0: the identity, and its grad passes through
  gradcheck("dropout (eval)", {{{2, 3}, v}},
            function (x) return gc.F.dropout(x, 0.5, false) end,
            function (x) return x end)
  gradcheck("dropout (p = 0)", {{{2, 3}, v}},
            function (x) return gc.F.dropout(x, 0) end,
            function (x) return x end)
  -- p = 1: everything dropped, grad 0
  local x = gc.tensor(v, {requires_grad = true})
  local y = gc.F.dropout(x, 1)
  lu.assertEquals(y:tolist(), {0, 0, 0, 0, 0, 0})
  y:sum():backward()
  lu.assertEquals(x.grad:tolist(), {0, 0, 0, 0, 0, 0})
  assert_err(function () gc.F.dropout(x, 1.5) end, "dropout", "[0, 1]")
end

function TestAutograd:test_grad_mse_loss ()
  local n = 6
  gradcheck("mse_loss", {{{2, 3}, values(n, 0.1, 2)}, {{2, 3}, values(n, 2.5)}},
            gc.F.mse_loss,
            function (a, b)
              local s = 0
              for i = 1, n do s = s + (a[i] - b[i]) ^ 2 end
              return {s / n}
            end)
  -- by hand: d/dinput = 2 (input - target) / N, d/dtarget the negative
  local a = gc.tensor({1, 2, 3, 4}, {requires_grad = true})
  local b = gc.tensor({0, 2, 5, 3}, {requires_grad = true})
  local l = gc.F.mse_loss(a, b)
  lu.assertEquals(l:item(), (1 + 0 + 4 + 1) / 4)
  l:backward()
  lu.assertEquals(a.grad:tolist(), {0.5, 0, -1, 0.5})
  lu.assertEquals(b.grad:tolist(), {-0.5, 0, 1, -0.5})
end

function TestAutograd:test_grad_cross_entropy ()
  local N, C = 3, 4
  local target = {2, 0, 3}   -- class indices, counted from 0
  local function ref (x)
    local s = 0
    for r = 0, N - 1 do
      local mx, z = -math.huge, 0
      for c = 1, C do mx = math.max(mx, x[r * C + c]) end
      for c = 1, C do z = z + math.exp(x[r * C + c] - mx) end
      s = s + (math.log(z) + mx - x[r * C + target[r + 1] + 1])
    end
    return {s / N}
  end
  gradcheck("cross_entropy", {{{N, C}, values(N * C, 0.5, 2)}},
            function (x) return gc.F.cross_entropy(x, gc.tensor(target)) end, ref)
  -- by hand: uniform logits give loss log C and grad (1/C - onehot) / N
  local x = gc.zeros({2, 2}, {requires_grad = true})
  local l = gc.F.cross_entropy(x, gc.tensor({1, 0}))
  assert_close({l:item()}, {math.log(2)}, 1e-6, 1e-6, "loss")
  l:backward()
  lu.assertEquals(x.grad:tolist(), {{0.25, -0.25}, {-0.25, 0.25}})
end

function TestAutograd:test_grad_composite_chain ()
  -- mse(layer_norm(gelu(x W^T + b)) , t): the ops chained, against differences
  local nin, nout, rows = 3, 4, 2
  local tv = values(rows * nout, 0.7)
  gradcheck("chain", {{{rows, nin}, values(rows * nin, 0.2, 1.5)},
                      {{nout, nin}, values(nout * nin, 1.4)},
                      {{nout}, values(nout, 3.0, 0.5)}},
            function (x, w, b)
              local h = gc.F.layer_norm(gc.F.gelu(gc.F.linear(x, w, b)))
              return gc.F.mse_loss(h, gc.tensor(nest(tv, {rows, nout})))
            end,
            function (x, w, b)
              local h = ref_layer_norm(map(ref_linear(x, w, b, nin, nout), gelu1),
                                       nil, nil, nout, 1e-5)
              local s = 0
              for i = 1, #h do s = s + (h[i] - tv[i]) ^ 2 end
              return {s / #h}
            end,
            {atol = 1e-4, rtol = 1e-3})
end

function TestAutograd:test_grad_other_ranks_and_broadcasts ()
  local LN = {atol = 1e-4, rtol = 1e-3}
  gradcheck("linear 1-D", {{{3}, values(3, 0.1)}, {{2, 3}, values(6, 1.3)}, {{2}, values(2, 2.2)}},
            function (x, w, b) return gc.F.linear(x, w, b) end,
            function (x, w, b) return ref_linear(x, w, b, 3, 2) end)
  gradcheck("linear 4-D", {{{2, 1, 2, 3}, values(12, 0.1)}, {{2, 3}, values(6, 1.3)},
                           {{2}, values(2, 2.2)}},
            function (x, w, b) return gc.F.linear(x, w, b) end,
            function (x, w, b) return ref_linear(x, w, b, 3, 2) end)
  gradcheck("layer_norm 1-D", {{{5}, values(5, 0.6, 2)}, {{5}, values(5, 1.1)},
                               {{5}, values(5, 2.9)}},
            function (x, w, b) return gc.F.layer_norm(x, w, b) end,
            function (x, w, b) return ref_layer_norm(x, w, b, 5, 1e-5) end, LN)
  gradcheck("layer_norm 3-D, weight only", {{{2, 2, 3}, values(12, 0.6, 2)}, {{3}, values(3, 1.1)}},
            function (x, w) return gc.F.layer_norm(x, w) end,
            function (x, w) return ref_layer_norm(x, w, nil, 3, 1e-5) end, LN)
  gradcheck("layer_norm, bias only", {{{2, 3}, values(6, 0.2, 2)}, {{3}, values(3, 2.9)}},
            function (x, b) return gc.F.layer_norm(x, nil, b) end,
            function (x, b) return ref_layer_norm(x, nil, b, 3, 1e-5) end, LN)
  gradcheck("softmax 1-D", {{{4}, values(4, 0.9, 2)}}, gc.F.softmax,
            function (x) return ref_softmax(x, 4) end)
  gradcheck("softmax 3-D", {{{2, 2, 3}, values(12, 0.9, 2)}}, gc.F.softmax,
            function (x) return ref_softmax(x, 3) end)
  gradcheck("gelu 0-D", {{{}, {0.7}}}, gc.F.gelu, function (x) return map(x, gelu1) end)
  local function bcast (f, n) -- y[i] = f(a[i], b[(i - 1) % #b + 1])
    return function (a, b)
      local y = {}
      for i = 1, n do y[i] = f(a[i], b[(i - 1) % #b + 1]) end
      return y
    end
  end
  gradcheck("bias row add", {{{3, 2}, values(6, 0.1)}, {{2}, values(2, 1)}},
            function (a, b) return a + b end, bcast(function (u, v) return u + v end, 6))
  gradcheck("row minus matrix", {{{3, 2}, values(6, 0.1)}, {{2}, values(2, 1)}},
            function (a, b) return b - a end, bcast(function (u, v) return v - u end, 6))
  gradcheck("[1, n] row mul", {{{3, 2}, values(6, 0.1)}, {{1, 2}, values(2, 1)}},
            function (a, b) return a * b end, bcast(function (u, v) return u * v end, 6))
  gradcheck("0-D mul", {{{3, 2}, values(6, 0.1)}, {{}, {1.5}}},
            function (a, b) return a * b end, bcast(function (u, v) return u * v end, 6))
  gradcheck("one-element sub", {{{3, 2}, values(6, 0.1)}, {{1}, {0.5}}},
            function (a, b) return a - b end, bcast(function (u, v) return u - v end, 6))
  gradcheck("view", {{{2, 3}, values(6, 0.1)}},
            function (a) return a:view({3, 2}) * a:view({3, 2}) end,
            function (a) return map(a, function (u) return u * u end) end)
end

-- Captured backward -------------------------------------------------------------------

-- A small network's loss, with the leaves it trains.
local function net ()
  local x = gc.tensor(nest(values(12, 0.3, 1.5), {3, 4}))
  local w1 = gc.tensor(nest(values(20, 1.1, 0.5), {5, 4}), {requires_grad = true})
  local b1 = gc.tensor(values(5, 2.1, 0.1), {requires_grad = true})
  local w2 = gc.tensor(nest(values(10, 0.6, 0.5), {2, 5}), {requires_grad = true})
  local t = gc.tensor(nest(values(6, 1.9), {3, 2}))
  local leaves = {w1, b1, w2}
  local function loss ()
    local h = gc.F.layer_norm(gc.F.gelu(gc.F.linear(x, w1, b1)))
    local y = gc.F.softmax(gc.matmul(h, w2:view({5, 2})) * 1.5)
    return gc.F.mse_loss(y, t) + gc.F.relu(h):mean() * 0.1
  end
  return x, leaves, loss
end

local function grads (leaves)
  local g = {}
  for i, p in ipairs(leaves) do g[i] = p.grad:tolist() end
  return g
end

function TestAutograd:test_captured_backward_replays_eager_bitwise ()
  local x, leaves, loss = net()
  loss():backward()
  local eager = grads(leaves)
  for _, p in ipairs(leaves) do p.grad:zero_() end
  local g = gc.Graph()
  g:capture(function ()
    for _, p in ipairs(leaves) do p.grad:zero_() end
    loss():backward()
  end)
  for _, p in ipairs(leaves) do p.grad:fill_(42) end   -- replay must overwrite this
  for _ = 1, 2 do
    g:replay()
    for i, p in ipairs(leaves) do assert_bitwise(p.grad:tolist(), eager[i], "grad " .. i) end
  end
  -- new input contents, same memory: the replay reads them
  x:copy_(gc.tensor(nest(values(12, 2.7, 1.5), {3, 4})))
  g:replay()
  local replayed = grads(leaves)
  for _, p in ipairs(leaves) do p.grad:zero_() end
  loss():backward()                         -- eager, into the same .grad tensors
  local eager2 = grads(leaves)
  for i = 1, #leaves do assert_bitwise(replayed[i], eager2[i], "grad " .. i .. " (new x)") end
  lu.assertNotEquals(flat(eager2[1])[1], flat(eager[1])[1])
end

-- The very first backward captured: .grad is allocated inside the capture.
function TestAutograd:test_captured_first_backward_bitwise ()
  local _, leaves, loss = net()
  loss():backward()
  local eager = grads(leaves)
  for _, p in ipairs(leaves) do p.grad = nil end
  local g = gc.Graph()
  g:capture(function () loss():backward() end)
  for _, p in ipairs(leaves) do lu.assertNotNil(p.grad) end
  g:replay()
  for i, p in ipairs(leaves) do assert_bitwise(p.grad:tolist(), eager[i], "grad " .. i) end
  g:replay()   -- the captured backward made .grad: replays overwrite, not add
  for i, p in ipairs(leaves) do assert_bitwise(p.grad:tolist(), eager[i], "grad " .. i) end
end

-- Accumulating replays equal accumulating eager backwards.
function TestAutograd:test_captured_backward_accumulates_like_eager ()
  local _, leaves, loss = net()
  for _ = 1, 3 do loss():backward() end
  local eager = grads(leaves)
  for _, p in ipairs(leaves) do p.grad = nil end
  loss():backward()                          -- .grad exists before the capture
  local g = gc.Graph()
  g:capture(function () loss():backward() end)
  g:replay()
  g:replay()
  for i, p in ipairs(leaves) do assert_bitwise(p.grad:tolist(), eager[i], "grad " .. i) end
end

-- regression: cross_entropy took targets that are no class id
-- cross_entropy refuses class ids that are not integers in 0..C-1.
function TestAutograd:test_cross_entropy_refuses_bad_targets ()
  local x = gc.randn({3, 4}, {requires_grad = true})
  for _, t in ipairs({{0, 1.5, 2}, {0, 0 / 0, 1}, {0, 4, 1}, {-1, 0, 1}}) do
    H.assert_err(function () return gc.F.cross_entropy(x, gc.tensor(t)) end,
                 "cross_entropy: the target of row ", "not a class id", "0..3")
  end
  local loss = gc.F.cross_entropy(x, gc.tensor({0, 3, 1}))
  loss:backward()
  lu.assertEquals(x.grad:shape(), {3, 4})
end

-- regression: a saved tensor changed in place gave a wrong gradient without a word
-- A tensor autograd saved, changed in place before backward: the backward
-- raises PyTorch's error (naming the op and the versions) instead of a
-- wrong gradient; copy_, zero_ and fill_ each bump the storage's version,
-- which views share.
function TestAutograd:test_inplace_change_of_saved_tensor ()
  local a = gc.tensor({{1, 2}, {3, 4}}, {requires_grad = true})
  for _, change in ipairs({function (t) t:fill_(3) end, function (t) t:zero_() end,
                           function (t) t:copy_(gc.ones({2, 2})) end}) do
    local h = a * 2
    local y = (h * h):sum()
    local v = h._version
    change(h)
    lu.assertEquals(h._version, v + 1)
    local msg = H.assert_err(function () y:backward() end,
                             "modified by an inplace operation", "'mul'", "version")
    lu.assertStrContains(msg, "test_autograd.lua:")
  end
  lu.assertNil(a.grad)
  local h = a * 2
  local y = (h * h):sum()
  y:backward()  -- untouched: 8 a
  H.assert_same(a.grad:tolist(), {{8, 16}, {24, 32}}, "grad")
  local w = gc.ones({2})
  local view = w:view({1, 2})
  view:fill_(2)
  lu.assertEquals(w._version, view._version)
end

-- regression: add, sub, sum, mean, relu and mul refused a backward after a write into a tensor
-- their backward never reads
-- Each op saves only what its backward reads, as PyTorch's derivative
-- formulas: add, sub (of a tensor or a number), sum and mean save nothing
-- but shapes; mul saves an operand only for the other's grad; relu saves
-- its result, not its input; linear and matmul save x only for the weight's
-- grad and the weight only for x's. A write into anything else before
-- backward gives the grads of the unwritten run; a write into what was saved
-- is still refused, naming the op.
function TestAutograd:test_saved_only_what_backward_reads ()
  local xv, tv = H.values(6, 0.3), H.values(2, 1.1)
  local function lin () -- a Linear's weight and bias, fresh
    return gc.tensor(H.nest(H.values(6, 0.7), {2, 3}), {requires_grad = true}),
           gc.tensor(H.values(2, 2.1), {requires_grad = true})
  end
  for _, op in ipairs{"add", "sub", "add of a number", "sub of a number"} do
    local function run (write)
      local w, b = lin()
      local x, t = gc.tensor(H.nest(xv, {2, 3})), gc.tensor(tv)
      local h = gc.F.linear(x, w, b)
      local y = (op == "add" and h + t) or (op == "sub" and h - t) or
                (op == "add of a number" and h + 2) or 2 - h
      local yv = y:tolist()
      if write then t:fill_(7); h:fill_(-3) end
      y:backward(gc.tensor(H.nest(H.values(4, 0.5), {2, 2})))
      return {w.grad:tolist(), b.grad:tolist(), yv}
    end
    local want, got = run(false), run(true)
    for i = 1, 3 do H.assert_same(got[i], want[i], op .. " #" .. i) end
  end
  for _, op in ipairs{"sum", "mean", "relu"} do
    local x = gc.tensor(H.values(6, 0.9), {requires_grad = true})
    local h = x * 3
    local y = (op == "sum" and h:sum()) or (op == "mean" and h:mean()) or gc.F.relu(h):sum()
    h:fill_(-1) -- what relu read; it kept its result
    y:backward()
    local want = {}
    for i, v in ipairs(H.values(6, 0.9)) do
      want[i] = (op == "sum" and 3) or (op == "mean" and 3 / 6) or (v > 0 and 3 or 0)
    end
    assert_close(x.grad:tolist(), want, 1e-7, 1e-6, op)
  end
  local x = gc.tensor(H.values(4, 0.2), {requires_grad = true})
  local r = gc.F.relu(x * 1)
  local y = r:sum()
  r:fill_(1)
  assert_err(function () y:backward() end, "modified by an inplace operation", "'relu'")
  -- mul by a tensor that needs no grad: x's grad reads only c
  local c = gc.tensor(H.values(4, 1.9))
  y = (x * c):sum()
  gc.no_grad(function () x:fill_(9) end)
  y:backward()
  H.assert_same(x.grad:tolist(), c:tolist(), "mul's grad")
  y = (x * c):sum()
  c:fill_(2)
  assert_err(function () y:backward() end, "modified by an inplace operation", "'mul'")
  -- linear and matmul with a frozen weight: x's grad reads only the weight
  for _, op in ipairs{"linear", "matmul"} do
    local w = gc.tensor(H.nest(H.values(6, 0.4), op == "linear" and {2, 3} or {3, 2}))
    local xs = gc.tensor(H.nest(H.values(6, 0.8), {2, 3}), {requires_grad = true})
    local function f () return op == "linear" and gc.F.linear(xs, w) or gc.matmul(xs, w) end
    local g = gc.tensor(H.nest(H.values(4, 1.5), {2, 2}))
    f():backward(g)
    local want = xs.grad:tolist()
    xs.grad = nil
    local out = f()
    gc.no_grad(function () xs:fill_(5) end)
    out:backward(g)
    H.assert_same(xs.grad:tolist(), want, op .. "'s input grad")
    out = f()
    w:fill_(1)
    assert_err(function () out:backward(g) end, "modified by an inplace operation", "'" .. op .. "'")
  end
  -- a graph that saved nothing may run backward again without retain_graph, as in PyTorch
  local z = gc.tensor(H.values(3, 0.1), {requires_grad = true})
  local s = (z + 1):sum()
  s:backward()
  s:backward()
  H.assert_same(z.grad:tolist(), {2, 2, 2}, "two backwards through add and sum")
  s = (z * z):sum()
  s:backward()
  assert_err(function () s:backward() end, "second time", "'mul' has freed its saved tensors")
  -- and a linear of an input that needs no grad keeps that input for the weight's grad
  local w, b = lin()
  local xd = gc.tensor(H.nest(xv, {2, 3}))
  local out = gc.F.linear(xd, w, b)
  xd:fill_(0)
  assert_err(function () out:sum():backward() end, "modified by an inplace operation", "'linear'")
end

-- regression: clone and copy_ cut the graph, leaving x.grad zero eagerly and graphed
-- clone passes its grad on unchanged (PyTorch's CloneBackward), eagerly and
-- graphed; copy_ gives the source the grad, converted to its dtype, and the
-- written tensor's old history zeros (CopyBackwards), as fill_ and zero_
-- give theirs (FillBackward).
function TestAutograd:test_clone_and_copy_are_differentiable ()
  local w = gc.tensor(H.values(4, 0.7))
  local wv = w:tolist()
  local x = gc.tensor(H.values(4, 0.2), {requires_grad = true})
  local c = x:clone()
  lu.assertEquals(c.grad_fn, "clone")
  lu.assertFalse(c.is_leaf)
  ;(c * w):sum():backward()
  H.assert_same(x.grad:tolist(), wv, "grad through clone")
  local G = gc.make_graphed_callables(function (u) return u:clone() * w end,
                                      {gc.ones({4}, {requires_grad = true})})
  local xg = gc.tensor(H.values(4, 0.2), {requires_grad = true})
  G(xg):sum():backward()
  H.assert_same(xg.grad:tolist(), wv, "grad through a graphed clone")
  -- copy_ into a tensor that needs no grad, of another dtype too
  for _, dt in ipairs{"f32", "bf16"} do
    local xs = gc.tensor(H.values(4, 0.2), {requires_grad = true})
    local y = gc.zeros({2, 2}, {dtype = dt})
    lu.assertTrue(rawequal(y:copy_(xs), y))
    lu.assertEquals(y.grad_fn, "copy_")
    lu.assertTrue(y.requires_grad)
    ;(y * gc.tensor(H.nest(wv, {2, 2}), {dtype = dt})):sum():backward()
    lu.assertEquals(xs.grad:dtype(), "f32")
    lu.assertEquals(xs.grad:shape(), {4})
    H.assert_same(xs.grad:tolist(), gc.tensor(wv, {dtype = dt}):tolist(), dt .. " copy_'s grad")
    lu.assertEquals(xs.grad:dtype(), "f32")
  end
  -- y's history before the write gets zeros
  for _, write in ipairs{"copy_", "fill_", "zero_"} do
    local a = gc.tensor(H.values(4, 1.3), {requires_grad = true})
    local xs = gc.tensor(H.values(4, 0.2), {requires_grad = true})
    local h = a * 2
    if write == "copy_" then h:copy_(xs) elseif write == "fill_" then h:fill_(3) else h:zero_() end
    lu.assertEquals(h.grad_fn, write)
    ;(h * w):sum():backward()
    H.assert_same(a.grad:tolist(), {0, 0, 0, 0}, write .. ": the old history's grad")
    if write == "copy_" then H.assert_same(xs.grad:tolist(), wv, "copy_'s source") end
  end
  -- a view cannot take a recorded write (its base would keep its history)
  local h = x * 2
  local made_by, version = h.grad_fn, h._version
  for _, f in ipairs{function () h:view({2, 2}):copy_(gc.ones({2, 2})) end,
                     function () h:view({4}):fill_(1) end,
                     function () gc.zeros({4}):view({2, 2}):copy_(x) end} do
    assert_err(f, "autograd cannot record an in-place write into a view", "no_grad")
  end
  lu.assertEquals(h._version, version) -- refused before writing
  gc.no_grad(function () h:view({4}):copy_(x) end)
  lu.assertEquals(h.grad_fn, made_by)
  lu.assertEquals(h._version, version + 1)
end

-- regression: a write through a view of a leaf that requires grad changed the leaf unseen
-- An in-place write through a view of a leaf that requires grad is refused,
-- as on the leaf itself (PyTorch's rule); under no_grad it goes through.
function TestAutograd:test_inplace_through_a_view_of_a_leaf ()
  local w = gc.ones({2, 2}, {requires_grad = true})
  H.assert_err(function () w:view({4}):fill_(5) end, "fill_: a leaf that requires grad, or a view of one,")
  H.assert_err(function () w:view({4}):view({2, 2}):zero_() end, "zero_:", "a view of one")
  lu.assertEquals(w:tolist(), {{1, 1}, {1, 1}})
  gc.no_grad(function () w:view({4}):fill_(3) end)
  lu.assertEquals(w:tolist(), {{3, 3}, {3, 3}})
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
