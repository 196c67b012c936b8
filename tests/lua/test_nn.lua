-- test_nn.lua: modules from Lua (docs/lua-api.md, "Modules"): the built-ins
-- (Linear with and without bias, ReLU, GELU, LayerNorm, Dropout, Sequential),
-- classes made with gc.nn.Module (init/forward, parameters in assignment order,
-- children, gc.nn.Parameter, buffers, dotted names, train/eval), the four
-- module hook kinds (order, arguments, removal), hooks and forwards that raise
-- (the error reaches the caller as raised, the module keeps working and
-- its grads are right), bad inputs (errors that name the op and the shapes),
-- delayed wgrad, zero_grad, closed modules.
--   build/graphcap tests/lua/test_nn.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
-- The shared helpers, from this file's directory (whatever the working directory).
local H = dofile(debug.getinfo(1, "S").source:match("^@?(.-)[^/\\]*$") .. "helpers.lua")
local assert_close, assert_bitwise, assert_err = H.assert_close, H.assert_bitwise, H.assert_err

local HERE = debug.getinfo(1, "S").short_src .. ":"  -- errors name the user's line

-- The tearDown of every class: grad mode was left on.
local function grad_mode_left_on ()
  lu.assertTrue(gc.is_grad_enabled())
end

-- ---------------------------------------------------------------------------
-- Helpers

local function input (shape, phase, requires_grad)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return gc.tensor(H.nest(H.values(n, phase or 0, 1.5), shape), {requires_grad = requires_grad})
end

-- Copy src's parameters into dst's (same structure).
local function copy_params (dst, src)
  local d, s = dst:parameters(), src:parameters()
  lu.assertEquals(#d, #s)
  gc.no_grad(function ()
    for i = 1, #d do d[i]:copy_(s[i]) end
  end)
end

-- sum(y * c) for fixed weights c of y's shape, backpropagated.
local function backward_weighted (y)
  local n = y:numel()
  local c = H.values(n, 0.9)
  for i = 1, n do c[i] = c[i] + 0.5 end
  ;(y * gc.tensor(H.nest(c, y:shape()))):sum():backward()
end

-- ---------------------------------------------------------------------------
-- Built-in modules

TestBuiltins = {tearDown = grad_mode_left_on}

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
  local x = input({4, 3}, 0.2)
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
  lu.assertEquals(m(input({2, 5, 3})):shape(), {2, 5, 2})
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
  local x = input({2, 3})
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
  local x = input({8, 8}, 0.1, true)
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
  local x = input({5, 3})
  assert_bitwise(s(x):tolist(), b(r(a(x))):tolist(), "Sequential = composition")
  -- the table form, and nesting
  local s2 = gc.nn.Sequential({gc.nn.Linear(2, 2), gc.nn.GELU()})
  lu.assertEquals(s2[2]:type(), "GELU")
  local outer = gc.nn.Sequential(s2, gc.nn.Linear(2, 1))
  names = {}
  for i, p in ipairs(outer:named_parameters()) do names[i] = p[1] end
  lu.assertEquals(names, {"0.0.weight", "0.0.bias", "1.weight", "1.bias"})
  lu.assertEquals(outer(input({3, 2})):shape(), {3, 1})
  -- empty: the identity
  local x1 = input({2})
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
    copy_params(r, s[1])
    local x, xr = input({2, 5, 6}, 0.2, true), input({2, 5, 6}, 0.2, true)
    local h = gc.nn.Sequential(s[1], s[2])(x)
    lu.assertEquals(h.grad_fn, "linear_gelu")
    local y = s(x)
    local want = s[3](gc.F.gelu(gc.F.linear(xr, r.weight, r.bias)))
    assert_fused_equal(y:tolist(), want:tolist(), "output")
    backward_weighted(y)
    backward_weighted(want)
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
  local y = s(input({3, 4}, 0.5, true))
  lu.assertEquals(y.grad_fn, "gelu")
  lu.assertEquals(seen.grad_fn, "linear")
  hd:remove()
  lu.assertEquals(s(input({3, 4}, 0.5, true)).grad_fn, "linear_gelu")
  hd = s[2]:register_forward_pre_hook(function () end)
  lu.assertEquals(s(input({3, 4}, 0.5, true)).grad_fn, "gelu")
  hd:remove()
  -- GELU first, or a Linear without a GELU after it: nothing to fuse
  lu.assertEquals(gc.nn.Sequential(gc.nn.GELU(), gc.nn.Linear(4, 4))(input({3, 4}, 0.5, true)).grad_fn,
                  "linear")
  lu.assertEquals(gc.nn.Sequential(gc.nn.Linear(4, 4), gc.nn.ReLU())(input({3, 4}, 0.5, true)).grad_fn,
                  "relu")
end

-- ---------------------------------------------------------------------------
-- Lua module classes

TestModule = {tearDown = grad_mode_left_on}

function TestModule:setUp ()
  gc.manual_seed(12)
end

function TestModule:test_init_and_forward ()
  local Affine = gc.nn.Module("Affine")
  function Affine:init (n, scale)
    self.scale = scale
    self.w = gc.full({n}, scale, {requires_grad = true})
  end
  function Affine:forward (x, shift)
    self.seen = x
    return x * self.w + (shift or 0)
  end
  local m = Affine(3, 2)
  lu.assertTrue(gc.nn.is_module(m))
  lu.assertIs(gc.nn.class_of(m), Affine)
  lu.assertEquals(m:type(), "Affine")
  lu.assertEquals(tostring(m), "Affine")
  lu.assertEquals(m.scale, 2)
  local x = gc.tensor({1, 2, 3})
  local y = m(x)
  lu.assertIs(m.seen, x)                          -- forward got the same Lua value
  lu.assertEquals(y:tolist(), {2, 4, 6})
  lu.assertEquals(m(x, 1):tolist(), {3, 5, 7})    -- non-tensor arguments pass through
  lu.assertEquals(m:forward(x):tolist(), {2, 4, 6})
  y:sum():backward()
  lu.assertEquals(m.w.grad:tolist(), {1, 2, 3})
  -- a forward returning a tensor it holds gives that very Lua value
  local Hold = gc.nn.Module("Hold")
  function Hold:init () self.t = gc.ones({2}) end
  function Hold:forward () return self.t end
  local h = Hold()
  lu.assertIs(h(), h.t)
  -- the default name
  lu.assertEquals(gc.nn.Module()():type(), "Module")
end

function TestModule:test_parameters_in_assignment_order ()
  local M = gc.nn.Module("Order")
  function M:init ()
    self.zeta = gc.ones({1}, {requires_grad = true})
    self.alpha = gc.ones({2}, {requires_grad = true})
    self.plain = gc.ones({3})                         -- not a parameter
    self.mid = gc.nn.Parameter(gc.zeros({4}))         -- marked explicitly
    self.n = 5
  end
  local m = M()
  local ps, names = m:parameters(), {}
  for i, p in ipairs(m:named_parameters()) do names[i] = p[1] end
  lu.assertEquals(names, {"zeta", "alpha", "mid"})
  lu.assertEquals(#ps, 3)
  lu.assertTrue(rawequal(ps[1], m.zeta))
  lu.assertTrue(rawequal(ps[2], m.alpha))
  lu.assertTrue(rawequal(ps[3], m.mid))
  lu.assertTrue(m.mid.requires_grad)
  lu.assertTrue(m.mid.is_leaf)
  lu.assertFalse(m.plain.requires_grad)
  lu.assertEquals(m.n, 5)
  -- assigned after init, too
  m.late = gc.ones({1}, {requires_grad = true})
  lu.assertEquals(m:named_parameters()[4][1], "late")
  -- a registered name cannot be reassigned; the same value again is fine
  local keep = m.zeta
  m.zeta = keep
  assert_err(function () m.zeta = gc.ones({1}, {requires_grad = true}) end,
             "Order", "'zeta'", "registered parameter")
  lu.assertIs(m.zeta, keep)
  -- plain fields can be reassigned freely
  m.plain = 7
  lu.assertEquals(m.plain, 7)
  assert_err(function () m.training = false end, "training cannot be assigned")
end

function TestModule:test_parameter_of_non_leaf ()
  local x = gc.ones({3}, {requires_grad = true})
  local y = x * 2
  local p = gc.nn.Parameter(y)
  lu.assertTrue(p.is_leaf)
  lu.assertTrue(p.requires_grad)
  lu.assertEquals(p:data_ptr(), y:data_ptr())   -- shares the data
  lu.assertEquals(p:tolist(), {2, 2, 2})
  local M = gc.nn.Module("P")
  local m = M()
  m.p = p
  lu.assertTrue(rawequal(m:parameters()[1], p))
  -- a non-leaf assigned as it is stays a plain field
  m.q = x * 3
  lu.assertEquals(#m:parameters(), 1)
end

function TestModule:test_children_and_dotted_names ()
  local Block = gc.nn.Module("Block")
  function Block:init (n)
    self.lin = gc.nn.Linear(n, n)
    self.gain = gc.ones({n}, {requires_grad = true})
    self.norm = gc.nn.LayerNorm(n)
  end
  function Block:forward (x) return self.norm(self.lin(x)) * self.gain end
  local Net = gc.nn.Module("Net")
  function Net:init ()
    self.first = Block(2)
    self.scale = gc.ones({1}, {requires_grad = true})
    self.second = Block(2)
  end
  function Net:forward (x) return self.second(self.first(x)) * self.scale end
  local net = Net()
  local names = {}
  for i, p in ipairs(net:named_parameters()) do names[i] = p[1] end
  -- own parameters first, then each child's, depth first, in assignment order
  lu.assertEquals(names, {
    "scale",
    "first.gain", "first.lin.weight", "first.lin.bias", "first.norm.weight", "first.norm.bias",
    "second.gain", "second.lin.weight", "second.lin.bias", "second.norm.weight",
    "second.norm.bias"})
  local ps = net:parameters()
  lu.assertTrue(rawequal(ps[3], net.first.lin.weight))
  lu.assertTrue(rawequal(ps[7], net.second.gain))
  local ch = net:children()
  lu.assertEquals(#ch, 2)
  lu.assertIs(ch[1], net.first)
  lu.assertIs(ch[2], net.second)
  local nch = net:named_children()
  lu.assertEquals(nch[1][1], "first")
  lu.assertEquals(nch[2][1], "second")
  lu.assertIs(nch[2][2], net.second)
  local bch = net.first:named_children()
  lu.assertEquals({bch[1][1], bch[2][1]}, {"lin", "norm"})
  -- a module cannot contain itself
  assert_err(function () net.first.loop = net end, "cycle")
  -- it runs and every parameter gets a grad
  net(input({3, 2}, 0.5, true)):sum():backward()
  for i, p in ipairs(ps) do lu.assertNotNil(p.grad, names[i]) end
end

-- A parameter shared by two submodules (weight tying) is one parameter:
-- PyTorch's parameters()/named_parameters() list it once, under its first
-- name, so that an optimizer steps it once.
function TestModule:test_shared_parameter_listed_once ()
  local shared = gc.ones({2}, {requires_grad = true})
  local m = H.tied(shared)
  local names = {}
  for i, p in ipairs(m:named_parameters()) do names[i] = p[1] end
  lu.assertEquals(names, {"t1.w"})
  lu.assertEquals(#m:parameters(), 1)
end

-- The same child module registered under two names: its parameters once.
function TestModule:test_shared_child_listed_once ()
  local lin = gc.nn.Linear(2, 2)
  local Twice = gc.nn.Module("Twice")
  function Twice:init () self.a = lin; self.b = lin end
  function Twice:forward (x) return self.b(self.a(x)) end
  local m = Twice()
  lu.assertIs(m.a, m.b)
  local names = {}
  for i, p in ipairs(m:named_parameters()) do names[i] = p[1] end
  lu.assertEquals(names, {"a.weight", "a.bias"})
end

function TestModule:test_register_buffer ()
  local M = gc.nn.Module("Buf")
  function M:init ()
    self.w = gc.ones({2}, {requires_grad = true})
    self:register_buffer("running", gc.zeros({2}))
    self.child = gc.nn.Linear(2, 2)
    self.child:register_buffer("stat", gc.full({1}, 3))
  end
  function M:forward (x) return x * self.w + self.running end
  local m = M()
  lu.assertEquals(#m:parameters(), 3)             -- w, child.weight, child.bias
  for _, p in ipairs(m:parameters()) do lu.assertFalse(rawequal(p, m.running)) end
  local bs = m:buffers()
  lu.assertEquals(#bs, 2)
  lu.assertTrue(rawequal(bs[1], m.running))
  local nb = m:named_buffers()
  lu.assertEquals(nb[1][1], "running")
  lu.assertEquals(nb[2][1], "child.stat")
  lu.assertEquals(nb[2][2]:tolist(), {3})
  lu.assertFalse(m.running.requires_grad)
  assert_err(function () m:register_buffer("w", gc.zeros({2})) end, "'w'", "registered")
  assert_err(function () m:register_buffer("running", gc.zeros({2})) end, "'running'")
  assert_err(function () m.running = gc.zeros({2}) end, "registered buffer")
  m(gc.ones({2})):sum():backward()
  lu.assertNil(m.running.grad)
  m:zero_grad()
  lu.assertEquals(m.running:tolist(), {0, 0})
end

function TestModule:test_train_eval_propagate ()
  local Inner = gc.nn.Module("Inner")
  function Inner:init () self.drop = gc.nn.Dropout(0.5) end
  function Inner:forward (x) return self.drop(x) end
  local Outer = gc.nn.Module("Outer")
  function Outer:init ()
    self.inner = Inner()
    self.seq = gc.nn.Sequential(gc.nn.Linear(4, 4), gc.nn.Dropout(0.5))
  end
  function Outer:forward (x) return self.seq(self.inner(x)) end
  local m = Outer()
  local all = {m, m.inner, m.inner.drop, m.seq, m.seq[1], m.seq[2]}
  for _, c in ipairs(all) do lu.assertTrue(c.training) end
  lu.assertIs(m:eval(), m)
  for i, c in ipairs(all) do lu.assertFalse(c.training, "module " .. i) end
  local x = input({4, 4})
  assert_bitwise(m.inner(x):tolist(), x:tolist(), "eval dropout")
  lu.assertIs(m:train(), m)
  for _, c in ipairs(all) do lu.assertTrue(c.training) end
  m:train(false)
  for _, c in ipairs(all) do lu.assertFalse(c.training) end
  m:train(true)
  m.inner:eval()                                  -- a subtree only
  lu.assertTrue(m.training)
  lu.assertFalse(m.inner.drop.training)
  lu.assertTrue(m.seq[2].training)
  assert_err(function () m:train("yes") end, "must be a boolean")
end

function TestModule:test_zero_grad ()
  local net = gc.nn.Sequential(gc.nn.Linear(3, 3), gc.nn.GELU(), gc.nn.Linear(3, 2))
  net(input({2, 3})):sum():backward()
  local ps = net:parameters()
  local ptrs = {}
  for i, p in ipairs(ps) do
    lu.assertNotNil(p.grad)
    ptrs[i] = p.grad:data_ptr()
  end
  net:zero_grad({set_to_none = false})
  for i, p in ipairs(ps) do
    lu.assertNotNil(p.grad)
    lu.assertEquals(p.grad:data_ptr(), ptrs[i])   -- zeroed in place
    for _, v in ipairs(H.flat(p.grad:tolist())) do lu.assertEquals(v, 0) end
  end
  net:zero_grad()
  for _, p in ipairs(ps) do lu.assertNil(p.grad) end
  net:zero_grad()                                 -- nothing to clear: fine
  net(input({2, 3})):sum():backward()
  net:zero_grad({set_to_none = true})
  for _, p in ipairs(ps) do lu.assertNil(p.grad) end
  assert_err(function () net:zero_grad({set_to_none = 1}) end, "set_to_none must be a boolean")
  assert_err(function () net:zero_grad({none = true}) end, "zero_grad", "unknown option 'none'")
  assert_err(function () net:zero_grad(true) end, "options must be a table")
end

-- ---------------------------------------------------------------------------
-- Hooks

TestHooks = {tearDown = grad_mode_left_on}

function TestHooks:setUp ()
  gc.manual_seed(13)
end

-- Register the four kinds on m (out of order), each logging to 'log'
-- {kind, args...}; returns the handles.
local KINDS = {
  {"forward_pre", "register_forward_pre_hook"},
  {"forward", "register_forward_hook"},
  {"backward_pre", "register_full_backward_pre_hook"},
  {"backward", "register_full_backward_hook"},
}

local function log_hooks (m, log, tag)
  local h = {}
  for _, k in ipairs{4, 2, 3, 1} do
    h[k] = m[KINDS[k][2]](m, function (...)
      log[#log + 1] = {kind = (tag or "") .. KINDS[k][1], n = select("#", ...), ...}
    end)
  end
  return h
end

local function kinds (log)
  local k = {}
  for i, e in ipairs(log) do k[i] = e.kind end
  return table.concat(k, " ")
end

function TestHooks:test_order_and_arguments ()
  local m = gc.nn.Linear(3, 2)
  local log = {}
  log_hooks(m, log)
  local x = input({4, 3}, 0.3, true)
  local y = m(x)
  lu.assertEquals(kinds(log), "forward_pre forward")
  -- forward_pre(module, args...)
  lu.assertEquals(log[1].n, 2)
  lu.assertIs(log[1][1], m)
  lu.assertIs(log[1][2], x)
  -- forward(module, args, output)
  lu.assertEquals(log[2].n, 3)
  lu.assertIs(log[2][1], m)
  lu.assertEquals(type(log[2][2]), "table")
  lu.assertEquals(#log[2][2], 1)
  assert_bitwise(log[2][2][1]:tolist(), x:tolist(), "forward hook input")
  assert_bitwise(log[2][3]:tolist(), y:tolist(), "forward hook output")
  backward_weighted(y)
  lu.assertEquals(kinds(log), "forward_pre forward backward_pre backward")
  -- backward_pre(module, grad_output)
  lu.assertEquals(log[3].n, 2)
  lu.assertIs(log[3][1], m)
  lu.assertEquals(log[3][2]:shape(), {4, 2})
  -- backward(module, grad_input, grad_output)
  lu.assertEquals(log[4].n, 3)
  lu.assertIs(log[4][1], m)
  lu.assertEquals(log[4][2]:shape(), {4, 3})
  assert_bitwise(log[4][2]:tolist(), x.grad:tolist(), "grad_input is x's grad")
  assert_bitwise(log[4][3]:tolist(), log[3][2]:tolist(), "same grad_output")
  -- grad_output is d loss / d y = the weights of backward_weighted
  local c = H.values(8, 0.9)
  for i = 1, 8 do c[i] = c[i] + 0.5 end
  assert_close(log[3][2]:tolist(), H.nest(c, {4, 2}), 0, 1e-6, "grad_output")
end

-- Without backward hooks, the forward hook sees the caller's values.
function TestHooks:test_forward_hook_same_lua_values ()
  local m = gc.nn.Linear(2, 2)
  local seen = {}
  m:register_forward_pre_hook(function (_, a) seen.pre = a end)
  m:register_forward_hook(function (_, args, out) seen.args, seen.out = args, out end)
  local x = input({1, 2})
  local y = m(x)
  lu.assertIs(seen.pre, x)
  lu.assertIs(seen.args[1], x)
  lu.assertIs(seen.out, y)
  -- a Lua module: all its arguments, tensors or not
  local L = gc.nn.Module("L")
  function L:forward (a) return a end
  local l = L()
  l:register_forward_pre_hook(function (...) seen.all = table.pack(...) end)
  l(x, "k", 3)
  lu.assertEquals(seen.all.n, 4)
  lu.assertIs(seen.all[1], l)
  lu.assertIs(seen.all[2], x)
  lu.assertEquals({seen.all[3], seen.all[4]}, {"k", 3})
end

function TestHooks:test_hooks_leave_results_unchanged ()
  local m, ref = gc.nn.Linear(3, 2), gc.nn.Linear(3, 2)
  copy_params(ref, m)
  local log = {}
  log_hooks(m, log)
  local x, xr = input({4, 3}, 0.1, true), input({4, 3}, 0.1, true)
  local y, yr = m(x), ref(xr)
  assert_bitwise(y:tolist(), yr:tolist(), "output")
  backward_weighted(y)
  backward_weighted(yr)
  assert_bitwise(x.grad:tolist(), xr.grad:tolist(), "input grad")
  assert_bitwise(m.weight.grad:tolist(), ref.weight.grad:tolist(), "weight grad")
  assert_bitwise(m.bias.grad:tolist(), ref.bias.grad:tolist(), "bias grad")
end

function TestHooks:test_nested_order ()
  local lin = gc.nn.Linear(2, 2)
  local seq = gc.nn.Sequential(lin)
  local log = {}
  log_hooks(seq, log, "outer.")
  log_hooks(lin, log, "inner.")
  local y = seq(input({3, 2}, 0, true))
  lu.assertEquals(kinds(log), "outer.forward_pre inner.forward_pre inner.forward outer.forward")
  backward_weighted(y)
  lu.assertEquals(kinds(log), "outer.forward_pre inner.forward_pre inner.forward outer.forward "
                  .. "outer.backward_pre inner.backward_pre inner.backward outer.backward")
end

-- A child's hook sees the very value passed to its container, also when
-- the container is called again from a coroutine inside an outer hook.
function TestHooks:test_child_hook_sees_the_callers_value ()
  local lin = gc.nn.Linear(2, 2)
  local seq = gc.nn.Sequential(lin)
  local seen = {}
  lin:register_forward_pre_hook(function (_, a) seen[#seen + 1] = a end)
  local x, z = input({3, 2}, 0.1, true), input({3, 2}, 0.2, true)
  seq(x)
  lu.assertIs(seen[1], x)
  local outer = gc.nn.Linear(2, 2)
  outer:register_forward_pre_hook(function ()
    coroutine.wrap(function () seq(z) end)()
  end)
  outer(x)
  lu.assertIs(seen[2], z)
  -- a module returning its argument gives back that same value
  local x1 = input({2})
  lu.assertIs(gc.nn.Sequential()(x1), x1)
end

function TestHooks:test_input_without_grad ()
  local m = gc.nn.Linear(2, 2)
  local log = {}
  log_hooks(m, log)
  backward_weighted(m(input({3, 2})))
  lu.assertEquals(kinds(log), "forward_pre forward backward_pre backward")
  lu.assertEquals(log[4].n, 3)
  lu.assertNil(log[4][2])                       -- no grad_input
  lu.assertEquals(log[4][3]:shape(), {3, 2})
  lu.assertNotNil(m.weight.grad)
end

function TestHooks:test_no_grad_runs_forward_hooks_only ()
  local m = gc.nn.Linear(2, 2)
  local log = {}
  log_hooks(m, log)
  local y = gc.no_grad(function () return m(input({1, 2}, 0, true)) end)
  lu.assertEquals(kinds(log), "forward_pre forward")
  lu.assertNil(y.grad_fn)
end

function TestHooks:test_forward_method_skips_forward_hooks ()
  local m = gc.nn.Linear(2, 2)
  local log = {}
  log_hooks(m, log)
  m:forward(input({1, 2}))
  lu.assertEquals(kinds(log), "")
  m(input({1, 2}))
  lu.assertEquals(kinds(log), "forward_pre forward")
end

function TestHooks:test_remove_stops_hook_idempotent ()
  local m = gc.nn.Linear(2, 2)
  local log = {}
  local h = log_hooks(m, log)
  lu.assertStrContains(tostring(h[1]), "HookHandle")
  h[2]:remove()
  h[3]:remove()
  h[3]:remove()                                 -- twice: harmless
  lu.assertStrContains(tostring(h[3]), "removed")
  backward_weighted(m(input({2, 2}, 0, true)))
  lu.assertEquals(kinds(log), "forward_pre backward")
  for k = 1, 4 do h[k]:remove() end
  for k = 1, 4 do h[k]:remove() end
  log = {}
  backward_weighted(m(input({2, 2}, 0, true)))
  lu.assertEquals(#log, 0)
  -- several of one kind run in registration order; removing one keeps the rest
  local order = {}
  local hs = {}
  for i = 1, 3 do
    hs[i] = m:register_forward_hook(function () order[#order + 1] = i end)
  end
  hs[2]:remove()
  m(input({1, 2}))
  lu.assertEquals(order, {1, 3})
  assert_err(function () m:register_forward_hook(42) end, "function expected")
end

-- A hook stays registered when its handle is dropped and collected.
function TestHooks:test_hook_lives_without_handle ()
  local m = gc.nn.Linear(2, 2)
  local n = 0
  m:register_forward_hook(function () n = n + 1 end)
  collectgarbage()
  collectgarbage()
  m(input({1, 2}))
  lu.assertEquals(n, 1)
end

-- A hook of kind k that raises: its message reaches the caller as raised;
-- nothing is left half done: with the hook removed the module trains as a
-- hook-free one would, bit for bit.
local function check_raising_hook (k)
  gc.manual_seed(21)
  local m, ref = gc.nn.Linear(4, 3), gc.nn.Linear(4, 3)
  copy_params(ref, m)
  local log = {}
  log_hooks(m, log)
  local bad = m[KINDS[k][2]](m, function () error("hook " .. k .. " failed") end)
  local x = input({2, 4}, 0.4, true)
  local msg
  if k <= 2 then
    msg = assert_err(function () return m(x) end, "hook " .. k .. " failed")
    lu.assertEquals(kinds(log), k == 1 and "forward_pre" or "forward_pre forward")
  else
    local y = m(x)
    msg = assert_err(function () backward_weighted(y) end, "hook " .. k .. " failed")
    lu.assertEquals(kinds(log), k == 3 and "forward_pre forward backward_pre"
                                or "forward_pre forward backward_pre backward")
  end
  lu.assertStrContains(msg, HERE)                       -- where it was raised
  lu.assertNotStrContains(msg, "stack traceback:")      -- the interpreter adds the one traceback
  lu.assertNil(x.grad)                                  -- x's grad comes after all hooks
  if k <= 3 then
    lu.assertNil(m.weight.grad)                         -- nothing reached the leaves
    lu.assertNil(m.bias.grad)
  end
  lu.assertTrue(gc.is_grad_enabled())
  bad:remove()
  m:zero_grad()              -- a failed backward hook may have left the weight grad
  local log2 = {}
  log_hooks(m, log2, "2.")
  local y = m(x)
  backward_weighted(y)
  local yr = ref(x:detach())
  backward_weighted(yr)
  assert_bitwise(y:tolist(), yr:tolist(), "output after a failed hook")
  assert_bitwise(m.weight.grad:tolist(), ref.weight.grad:tolist(), "weight grad")
  assert_bitwise(m.bias.grad:tolist(), ref.bias.grad:tolist(), "bias grad")
  -- and x's grad is that of one step exactly
  local xr = x:detach():clone()
  xr.requires_grad = true
  backward_weighted(ref(xr))
  assert_bitwise(x.grad:tolist(), xr.grad:tolist(), "input grad")
  lu.assertEquals(kinds(log2), "2.forward_pre 2.forward 2.backward_pre 2.backward")
end

function TestHooks:test_raising_forward_pre_hook () check_raising_hook(1) end
function TestHooks:test_raising_forward_hook () check_raising_hook(2) end
function TestHooks:test_raising_backward_pre_hook () check_raising_hook(3) end
function TestHooks:test_raising_backward_hook () check_raising_hook(4) end

-- A raising hook on a child inside a Sequential, and an error object that
-- is not a string.
function TestHooks:test_raising_hook_in_child_and_error_object ()
  local lin, g = gc.nn.Linear(2, 2), gc.nn.GELU()
  local s = gc.nn.Sequential(lin, g)
  local obj = {why = "object"}
  local h = g:register_forward_pre_hook(function () error(obj) end)
  local ok, e = pcall(s, input({1, 2}))
  lu.assertFalse(ok)
  lu.assertIs(e, obj)
  h:remove()
  h = g:register_forward_hook(function () error("child hook") end)
  lu.assertNotStrContains(assert_err(function () s(input({1, 2})) end, "child hook", HERE),
                          "stack traceback:")
  h:remove()
  lu.assertEquals(s(input({1, 2})):shape(), {1, 2})
end

-- ---------------------------------------------------------------------------
-- Errors

TestErrors = {tearDown = grad_mode_left_on}

function TestErrors:setUp ()
  gc.manual_seed(14)
end

-- A Lua forward that raises midway (after recording ops on its input and
-- parameters): the message reaches the caller as raised; the next
-- call and backward give exactly one step's grads.
function TestErrors:test_raising_forward_leaves_clean_state ()
  local M = gc.nn.Module("Flaky")
  function M:init () self.lin = gc.nn.Linear(3, 2); self.fail = false end
  function M:forward (x)
    local h = self.lin(x)
    if self.fail then error("flaky forward failed") end
    return gc.F.gelu(h)
  end
  local m = M()
  local ref = gc.nn.Linear(3, 2)
  copy_params(ref, m.lin)
  local x = input({2, 3}, 0.6, true)
  m.fail = true
  local msg = assert_err(function () return m(x) end, "flaky forward failed", HERE)
  lu.assertNotStrContains(msg, "stack traceback:")
  lu.assertNil(x.grad)
  lu.assertNil(m.lin.weight.grad)
  lu.assertTrue(gc.is_grad_enabled())
  m.fail = false
  backward_weighted(m(x))
  local xr = input({2, 3}, 0.6, true)
  backward_weighted(gc.F.gelu(ref(xr)))
  assert_bitwise(m.lin.weight.grad:tolist(), ref.weight.grad:tolist(), "weight grad")
  assert_bitwise(m.lin.bias.grad:tolist(), ref.bias.grad:tolist(), "bias grad")
  assert_bitwise(x.grad:tolist(), xr.grad:tolist(), "input grad")
  -- through a parent and a Sequential too
  local P = gc.nn.Module("Parent")
  function P:init (c) self.c = c end
  function P:forward (x) return self.c(x) + 1 end
  local p = P(m)
  local s = gc.nn.Sequential(p)
  m.fail = true
  assert_err(function () return s(x) end, "flaky forward failed")
  m.fail = false
  lu.assertEquals(s(x):shape(), {2, 2})
  -- an error object is passed as it is
  local obj = {}
  function M:forward () error(obj) end
  local ok, e = pcall(m, x)
  lu.assertFalse(ok)
  lu.assertIs(e, obj)
end

function TestErrors:test_forward_returning_non_tensor ()
  local R = gc.nn.Module("Returner")
  function R:forward (x, what)
    if what == "nil" then return nil
    elseif what == "number" then return 3
    elseif what == "two" then return x, x
    elseif what == "none" then return
    elseif what == "string" then return "y"
    elseif what == "closed" then local t = gc.ones({1}); t:close(); return t
    end
    return x
  end
  local r = R()
  local x = gc.ones({2}, {requires_grad = true})
  -- a direct call may return several values, nil or tables (test_multiout.lua); not these
  for what, got in pairs{number = "must return tensors, nil or tables of them, got number",
                         string = "got string", closed = "closed tensor"} do
    assert_err(function () return r(x, what) end, "Returner:forward", got)
  end
  -- inside a Sequential the module passes one tensor on
  local s = gc.nn.Sequential(r)
  r.what = nil
  for what, got in pairs{["nil"] = "gave 1 outputs (absent)", two = "gave 2 outputs",
                         none = "gave 0 outputs"} do
    function R.forward (_, y) if what == "two" then return y, y elseif what == "nil" then
      return nil end end
    assert_err(function () return s(x) end, "Sequential: module #1 (Returner) " .. got,
               "a Sequential passes one tensor from module to module")
  end
  R.forward = function (_, y) return y end
  lu.assertIs(r(x), x)                               -- still usable
  local N = gc.nn.Module("NoForward")
  assert_err(function () return N()(x) end, "NoForward:forward is not defined")
end

function TestErrors:test_bad_inputs_name_op_and_shapes ()
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

function TestErrors:test_dtype_mix_errors ()
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
function TestErrors:test_dtype_mix_mse_loss_names_op ()
  local a, b = gc.ones({2, 3}), gc.ones({2, 3}, "bf16")
  assert_err(function () return gc.F.mse_loss(a, b) end, "bf16", "f32")
  assert_err(function () return gc.F.mse_loss(a, b) end, "mse_loss")
end

function TestErrors:test_requires_grad_of_module_output ()
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

function TestErrors:test_closed_module ()
  local m = gc.nn.Linear(2, 2)
  local x = gc.ones({1, 2})
  lu.assertNil(m:close())
  lu.assertNil(m:close())                          -- twice: fine
  lu.assertStrContains(tostring(m), "closed")
  local uses = {
    function () return m(x) end,
    function () return m:forward(x) end,
    function () return m:parameters() end,
    function () return m:named_parameters() end,
    function () return m:children() end,
    function () return m.training end,
    function () return m:train() end,
    function () return m:eval() end,
    function () return m:zero_grad() end,
    function () return m:backward_dw() end,
    function () return m:register_forward_hook(function () end) end,
    function () return m:register_buffer("b", gc.zeros({1})) end,
    function () m.extra = gc.ones({1}, {requires_grad = true}) end,
  }
  for i, f in ipairs(uses) do
    local ok, e = pcall(f)
    lu.assertFalse(ok, "use " .. i .. " of a closed module succeeded")
    lu.assertStrContains(tostring(e), "module is closed", false, "use " .. i)
  end
  assert_err(function () gc.nn.Sequential(m) end, "closed module")
  -- a Lua class instance, and <close>
  local L = gc.nn.Module("L")
  function L:forward (t) return t end
  local keep
  do
    local l <close> = L()
    keep = l
    lu.assertIs(l(x), x)
  end
  assert_err(function () return keep(x) end, "module is closed")
  -- hooks of a closed module are gone; removing them later is harmless
  local m2 = gc.nn.Linear(2, 2)
  local n = 0
  local h = m2:register_forward_hook(function () n = n + 1 end)
  m2:close()
  h:remove()
  lu.assertEquals(n, 0)
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
  copy_params(r, d)
  return d, r
end

function TestDelayWgrad:test_backward_dw_equals_ordinary_bitwise ()
  local d, r = delayed_pair(true)
  d:backward_dw()                                  -- nothing pending: nothing happens
  lu.assertNil(d.weight.grad)
  local xd, xr = input({2, 5, 4}, 0.3, true), input({2, 5, 4}, 0.3, true)
  local yd, yr = d(xd), r(xr)
  assert_bitwise(yd:tolist(), yr:tolist(), "forward")
  backward_weighted(yd)
  backward_weighted(yr)
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
  local x = input({3, 4}, 1.0)
  backward_weighted(d(x))
  backward_weighted(r(x))
  lu.assertNil(d.weight.grad)
  d:backward_dw()
  assert_bitwise(d.weight.grad:tolist(), r.weight.grad:tolist(), "weight grad")
end

function TestDelayWgrad:test_two_steps_through_a_container ()
  local d, r = delayed_pair(true)
  local seq = gc.nn.Sequential(d, gc.nn.GELU())
  local ref = gc.nn.Sequential(r, gc.nn.GELU())
  for k = 1, 2 do
    backward_weighted(seq(input({2, 4}, k)))
    backward_weighted(ref(input({2, 4}, k)))
  end
  lu.assertNil(d.weight.grad)
  seq:backward_dw()                                -- oldest first, accumulating
  assert_bitwise(d.weight.grad:tolist(), r.weight.grad:tolist(), "weight grad")
  assert_bitwise(d.bias.grad:tolist(), r.bias.grad:tolist(), "bias grad")
  -- zero_grad and a third step
  seq:zero_grad({set_to_none = false})
  ref:zero_grad({set_to_none = false})
  backward_weighted(seq(input({2, 4}, 7)))
  backward_weighted(ref(input({2, 4}, 7)))
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

TestFuseWgrad = {tearDown = grad_mode_left_on}

function TestFuseWgrad:setUp ()
  gc.manual_seed(17)
end

-- A fused Linear and an ordinary one with the same parameters.
local function fused_pair (opts)
  opts = opts or {}
  local f = gc.nn.Linear(4, 3, {fuse_wgrad_accumulation = true, delay_wgrad = opts.delay_wgrad})
  local r = gc.nn.Linear(4, 3)
  copy_params(r, f)
  return f, r
end

-- main_grad gathers what weight.grad would over several backwards; the
-- bias grad and the input grad are unchanged; weight.grad stays nil.
function TestFuseWgrad:test_accumulates_into_main_grad ()
  local f, r = fused_pair()
  lu.assertEquals(f.main_grad:shape(), {3, 4})
  for _, v in ipairs(H.flat(f.main_grad:tolist())) do lu.assertEquals(v, 0) end
  local xf, xr = input({2, 5, 4}, 0.4, true), input({2, 5, 4}, 0.4, true)
  for _ = 1, 3 do
    backward_weighted(f(xf))
    backward_weighted(r(xr))
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
      backward_weighted(sf(input({6, 4}, k)))
      backward_weighted(sr(input({6, 4}, k)))
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
    backward_weighted(g(input({6, 4}, k, true)))
    backward_weighted(sr(input({6, 4}, k, true)))
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
    local x = input({5, 4}, 0.2, true)
    backward_weighted(gc.nn.Sequential(d, gc.nn.GELU())(x))
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
