-- test_module.lua: the module object from Lua (docs/lua-api.md, "Modules"):
-- classes made with gc.nn.Module (init/forward, parameters in assignment
-- order, children, gc.nn.Parameter, buffers, dotted names, train/eval,
-- zero_grad); forwards that raise (the error reaches the caller as raised,
-- the module keeps working and its grads are right) or return what a call
-- may not; closed modules.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_module.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local assert_bitwise, assert_err = H.assert_bitwise, H.assert_err
local HERE = debug.getinfo(1, "S").short_src .. ":"  -- errors name the user's line

-- ---------------------------------------------------------------------------
-- Lua module classes

TestModule = {tearDown = H.grad_mode_left_on}

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
  net(H.input({3, 2}, 0.5, true)):sum():backward()
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
  local x = H.input({4, 4})
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
  net(H.input({2, 3})):sum():backward()
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
  net(H.input({2, 3})):sum():backward()
  net:zero_grad({set_to_none = true})
  for _, p in ipairs(ps) do lu.assertNil(p.grad) end
  assert_err(function () net:zero_grad({set_to_none = 1}) end, "set_to_none must be a boolean")
  assert_err(function () net:zero_grad({none = true}) end, "zero_grad", "unknown option 'none'")
  assert_err(function () net:zero_grad(true) end, "options must be a table")
end

-- ---------------------------------------------------------------------------
-- Errors

TestErrors = {tearDown = H.grad_mode_left_on}

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
  H.copy_params(ref, m.lin)
  local x = H.input({2, 3}, 0.6, true)
  m.fail = true
  local msg = assert_err(function () return m(x) end, "flaky forward failed", HERE)
  lu.assertNotStrContains(msg, "stack traceback:")
  lu.assertNil(x.grad)
  lu.assertNil(m.lin.weight.grad)
  lu.assertTrue(gc.is_grad_enabled())
  m.fail = false
  H.backward_weighted(m(x))
  local xr = H.input({2, 3}, 0.6, true)
  H.backward_weighted(gc.F.gelu(ref(xr)))
  assert_bitwise(m.lin.weight.grad:tolist(), ref.weight.grad:tolist(), "weight grad")
  assert_bitwise(m.lin.bias.grad:tolist(), ref.bias.grad:tolist(), "bias grad")
  assert_bitwise(x.grad:tolist(), xr.grad:tolist(), "input grad")
  -- through a parent and a Sequential too
  local P = gc.nn.Module("Parent")
  function P:init (c) self.c = c end
  function P:forward (v) return self.c(v) + 1 end
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

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
