-- test_module_hooks.lua: the four module hook kinds from Lua (docs/lua-api.md,
-- "Modules"): their order and arguments, nested modules, no_grad and forward
-- calls, removal, and hooks that raise (the error reaches the caller as
-- raised, the module keeps working and its grads are right). Hooks that
-- return values: test_hook_returns.lua; on calls of several inputs and
-- outputs: test_multi_hooks.lua.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_module_hooks.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local assert_close, assert_bitwise, assert_err = H.assert_close, H.assert_bitwise, H.assert_err
local HERE = debug.getinfo(1, "S").short_src .. ":"  -- errors name the user's line

-- ---------------------------------------------------------------------------
-- Hooks

TestHooks = {tearDown = H.grad_mode_left_on}

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
  local x = H.input({4, 3}, 0.3, true)
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
  H.backward_weighted(y)
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
  local x = H.input({1, 2})
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
  H.copy_params(ref, m)
  local log = {}
  log_hooks(m, log)
  local x, xr = H.input({4, 3}, 0.1, true), H.input({4, 3}, 0.1, true)
  local y, yr = m(x), ref(xr)
  assert_bitwise(y:tolist(), yr:tolist(), "output")
  H.backward_weighted(y)
  H.backward_weighted(yr)
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
  local y = seq(H.input({3, 2}, 0, true))
  lu.assertEquals(kinds(log), "outer.forward_pre inner.forward_pre inner.forward outer.forward")
  H.backward_weighted(y)
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
  local x, z = H.input({3, 2}, 0.1, true), H.input({3, 2}, 0.2, true)
  seq(x)
  lu.assertIs(seen[1], x)
  local outer = gc.nn.Linear(2, 2)
  outer:register_forward_pre_hook(function ()
    coroutine.wrap(function () seq(z) end)()
  end)
  outer(x)
  lu.assertIs(seen[2], z)
  -- a module returning its argument gives back that same value
  local x1 = H.input({2})
  lu.assertIs(gc.nn.Sequential()(x1), x1)
end

function TestHooks:test_input_without_grad ()
  local m = gc.nn.Linear(2, 2)
  local log = {}
  log_hooks(m, log)
  H.backward_weighted(m(H.input({3, 2})))
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
  local y = gc.no_grad(function () return m(H.input({1, 2}, 0, true)) end)
  lu.assertEquals(kinds(log), "forward_pre forward")
  lu.assertNil(y.grad_fn)
end

function TestHooks:test_forward_method_skips_forward_hooks ()
  local m = gc.nn.Linear(2, 2)
  local log = {}
  log_hooks(m, log)
  m:forward(H.input({1, 2}))
  lu.assertEquals(kinds(log), "")
  m(H.input({1, 2}))
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
  H.backward_weighted(m(H.input({2, 2}, 0, true)))
  lu.assertEquals(kinds(log), "forward_pre backward")
  for k = 1, 4 do h[k]:remove() end
  for k = 1, 4 do h[k]:remove() end
  log = {}
  H.backward_weighted(m(H.input({2, 2}, 0, true)))
  lu.assertEquals(#log, 0)
  -- several of one kind run in registration order; removing one keeps the rest
  local order = {}
  local hs = {}
  for i = 1, 3 do
    hs[i] = m:register_forward_hook(function () order[#order + 1] = i end)
  end
  hs[2]:remove()
  m(H.input({1, 2}))
  lu.assertEquals(order, {1, 3})
  assert_err(function () m:register_forward_hook(42) end, "function expected")
end

-- A hook registered by a hook of its kind runs from the next call on, as
-- PyTorch's (it walks a snapshot of the hooks); it used to run in the same
-- call. The forward hooks and the backward ones likewise.
function TestHooks:test_hook_registered_by_a_hook_runs_next_call ()
  local m = gc.nn.Linear(2, 2)
  local order = {}
  local hook_kinds = {"forward_pre_hook", "forward_hook", "full_backward_pre_hook",
                      "full_backward_hook"}
  for _, kind in ipairs(hook_kinds) do
    local added = false
    m["register_" .. kind](m, function ()
      order[#order + 1] = kind
      if not added then
        added = true
        m["register_" .. kind](m, function () order[#order + 1] = "new " .. kind end)
      end
    end)
  end
  H.backward_weighted(m(H.input({2, 2}, 0, true)))
  lu.assertEquals(order, hook_kinds)
  order = {}
  H.backward_weighted(m(H.input({2, 2}, 0, true)))
  lu.assertEquals(order, {"forward_pre_hook", "new forward_pre_hook", "forward_hook",
                          "new forward_hook", "full_backward_pre_hook",
                          "new full_backward_pre_hook", "full_backward_hook",
                          "new full_backward_hook"})
end

-- A hook stays registered when its handle is dropped and collected.
function TestHooks:test_hook_lives_without_handle ()
  local m = gc.nn.Linear(2, 2)
  local n = 0
  m:register_forward_hook(function () n = n + 1 end)
  collectgarbage()
  collectgarbage()
  m(H.input({1, 2}))
  lu.assertEquals(n, 1)
end

-- A hook of kind k that raises: its message reaches the caller as raised;
-- nothing is left half done: with the hook removed the module trains as a
-- hook-free one would, bit for bit.
local function check_raising_hook (k)
  gc.manual_seed(21)
  local m, ref = gc.nn.Linear(4, 3), gc.nn.Linear(4, 3)
  H.copy_params(ref, m)
  local log = {}
  log_hooks(m, log)
  local bad = m[KINDS[k][2]](m, function () error("hook " .. k .. " failed") end)
  local x = H.input({2, 4}, 0.4, true)
  local msg
  if k <= 2 then
    msg = assert_err(function () return m(x) end, "hook " .. k .. " failed")
    lu.assertEquals(kinds(log), k == 1 and "forward_pre" or "forward_pre forward")
  else
    local y = m(x)
    msg = assert_err(function () H.backward_weighted(y) end, "hook " .. k .. " failed")
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
  H.backward_weighted(y)
  local yr = ref(x:detach())
  H.backward_weighted(yr)
  assert_bitwise(y:tolist(), yr:tolist(), "output after a failed hook")
  assert_bitwise(m.weight.grad:tolist(), ref.weight.grad:tolist(), "weight grad")
  assert_bitwise(m.bias.grad:tolist(), ref.bias.grad:tolist(), "bias grad")
  -- and x's grad is that of one step exactly
  local xr = x:detach():clone()
  xr.requires_grad = true
  H.backward_weighted(ref(xr))
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
  local ok, e = pcall(s, H.input({1, 2}))
  lu.assertFalse(ok)
  lu.assertIs(e, obj)
  h:remove()
  h = g:register_forward_hook(function () error("child hook") end)
  lu.assertNotStrContains(assert_err(function () s(H.input({1, 2})) end, "child hook", HERE),
                          "stack traceback:")
  h:remove()
  lu.assertEquals(s(H.input({1, 2})):shape(), {1, 2})
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
