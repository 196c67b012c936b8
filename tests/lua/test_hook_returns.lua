-- test_hook_returns.lua: module hooks that return values, as PyTorch's do
-- (docs/lua-api.md, "Modules"): a forward pre-hook's return replaces the
-- inputs, a forward hook's the output, a full backward pre-hook's the grad of
-- the output, a full backward hook's the grad of the input; nil keeps them.
-- Each replacement is compared bit for bit with the same computation done
-- without hooks (scaling by 2 is exact), the replaced grads also with central
-- differences; returns of the wrong kind, count, shape or dtype raise errors
-- naming the module, the hook kind and the user's line, after which the
-- module works as before. Hooks registered on a graphed module after
-- graphing replace values around its replay as well.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_hook_returns.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local assert_close, assert_bitwise, assert_err = H.assert_close, H.assert_bitwise, H.assert_err

local HERE = debug.getinfo(1, "S").short_src .. ":"  -- errors name the user's line

-- ---------------------------------------------------------------------------
-- Helpers

-- Fixed weights c of shape, for the loss sum(y * c).
local function weights (shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local c = H.values(n, 0.9)
  for i = 1, n do c[i] = c[i] + 0.5 end
  return gc.tensor(H.nest(c, shape))
end

local function loss (y)
  return (y * weights(y:shape())):sum()
end

-- A Linear(4, 3) then a GELU (not linear, so that central differences
-- check more than a product), with the same parameters each time.
local function model ()
  gc.manual_seed(21)
  return gc.nn.Sequential(gc.nn.Linear(4, 3), gc.nn.GELU())
end

-- {x.grad, weight.grad, bias.grad} as lists after loss(m(x)):backward().
local function grads (m, x)
  loss(m(x)):backward()
  local lin = m[1] or m
  return {x.grad:tolist(), lin.weight.grad:tolist(), lin.bias.grad:tolist()}
end

-- d loss(m(x)) / dx by central differences in f32, h = 1e-2 (the engine's
-- own ops, no grad recorded).
local function central_differences (m, x)
  local shape, xs = x:shape(), H.flat(x:tolist())
  local h, d = 1e-2, {}
  gc.no_grad(function ()
    for i = 1, #xs do
      local function at (v)
        local p = {table.unpack(xs)}
        p[i] = v
        return loss(m(gc.tensor(H.nest(p, shape)))):item()
      end
      d[i] = (at(xs[i] + h) - at(xs[i] - h)) / (2 * h)
    end
  end)
  return H.nest(d, shape)
end

-- k * v for nested lists.
local function scaled (v, k)
  if type(v) == "number" then return k * v end
  local r = {}
  for i, w in ipairs(v) do r[i] = scaled(w, k) end
  return r
end

-- ---------------------------------------------------------------------------

TestHookReturns = {}

function TestHookReturns:tearDown ()
  lu.assertTrue(gc.is_grad_enabled())
end

-- A pre-hook's tensor replaces the input; the next pre-hook is given that
-- same value, and its one-element sequence replaces it again; a hook
-- returning nil keeps what it was given.
function TestHookReturns:test_forward_pre_replaces_inputs ()
  local m = model()
  local x = H.input({2, 4}, 0.1)
  local want = m(x * 2 * 3)
  local seen = {}
  m:register_forward_pre_hook(function (_, a) seen[1] = a; return a * 2 end)
  m:register_forward_pre_hook(function (_, a) seen[2] = a; return nil end)
  m:register_forward_pre_hook(function (_, a) seen[3] = a; return {a * 3} end)
  m:register_forward_hook(function (_, args) seen[4] = args[1] end)
  local y = m(x)
  lu.assertIs(seen[1], x)
  lu.assertIs(seen[2], seen[3])
  assert_bitwise(seen[2]:tolist(), (x * 2):tolist(), "what the second pre-hook is given")
  assert_bitwise(seen[4]:tolist(), (x * 2 * 3):tolist(), "the forward hook's args")
  assert_bitwise(y:tolist(), want:tolist(), "output")
end

-- The pre-hook's sequence is the new argument list of a Lua forward: its
-- count may change, and the call's own values (a string here) are gone.
function TestHookReturns:test_forward_pre_replaces_lua_arguments ()
  local Sum = gc.nn.Module("Sum")
  local got
  function Sum:forward (...)
    got = table.pack(...)
    local s = got[1]
    for i = 2, got.n do s = s + got[i] end
    return s
  end
  local m = Sum()
  local a, b = H.input({2, 2}, 0.3), H.input({2, 2}, 0.7)
  m:register_forward_pre_hook(function (_, t) return {t, b, b} end)
  local y = m(a, "ignored")
  lu.assertEquals(got.n, 3)
  lu.assertIs(got[1], a)
  lu.assertIs(got[2], b)
  assert_bitwise(y:tolist(), (a + b + b):tolist(), "output")
end

-- A forward hook's tensor is what the call returns (the same Lua value),
-- and what the next forward hook is given; grads flow through it.
function TestHookReturns:test_forward_replaces_output ()
  local m, ref = model(), model()
  local x, xr = H.input({2, 4}, 0.2, true), H.input({2, 4}, 0.2, true)
  local returned, seen
  m:register_forward_hook(function (_, _, y) returned = y * 2; return returned end)
  m:register_forward_hook(function (_, _, y) seen = y end)
  local y = m(x)
  lu.assertIs(y, returned)
  lu.assertIs(seen, returned)
  local yr = ref(xr)
  assert_bitwise(y:tolist(), (yr * 2):tolist(), "output")
  local g, gr = grads(m, x), grads(ref, xr)
  for i = 1, 3 do assert_bitwise(g[i], scaled(gr[i], 2), "grad " .. i) end
end

-- A backward pre-hook's grad replaces grad_output: every grad below is
-- doubled, and the backward hook is given the doubled grad_output.
function TestHookReturns:test_backward_pre_replaces_grad_output ()
  local m, ref = model(), model()
  local x, xr = H.input({2, 4}, 0.4, true), H.input({2, 4}, 0.4, true)
  local given, doubled
  m:register_full_backward_pre_hook(function (_, go) doubled = go * 2; return {doubled} end)
  m:register_full_backward_hook(function (_, _, go) given = go end)
  local g, gr = grads(m, x), grads(ref, xr)
  lu.assertIs(given, doubled)
  for i = 1, 3 do assert_bitwise(g[i], scaled(gr[i], 2), "grad " .. i) end
  assert_close(g[1], scaled(central_differences(ref, xr), 2), 2e-3, 1e-2, "x.grad vs differences")
end

-- A backward hook's grad replaces grad_input: x's grad is exactly twice the
-- eager one (which matches central differences); the parameters' are not
-- touched.
function TestHookReturns:test_backward_replaces_grad_input ()
  local m, ref = model(), model()
  local x, xr = H.input({2, 4}, 0.5, true), H.input({2, 4}, 0.5, true)
  m:register_full_backward_hook(function (_, gi) return gi * 2 end)
  local g, gr = grads(m, x), grads(ref, xr)
  assert_bitwise(g[1], scaled(gr[1], 2), "x.grad")
  assert_bitwise(g[2], gr[2], "weight grad")
  assert_bitwise(g[3], gr[3], "bias grad")
  assert_close(gr[1], central_differences(ref, xr), 2e-3, 1e-2, "eager x.grad vs differences")
  assert_close(g[1], scaled(central_differences(ref, xr), 2), 4e-3, 1e-2,
               "x.grad vs twice the differences")
end

-- Hooks of all four kinds returning nil (or nothing) change nothing.
function TestHookReturns:test_nil_keeps ()
  local m, ref = model(), model()
  local x, xr = H.input({2, 4}, 0.6, true), H.input({2, 4}, 0.6, true)
  m:register_forward_pre_hook(function () return nil end)
  m:register_forward_hook(function () end)
  m:register_full_backward_pre_hook(function () return nil end)
  m:register_full_backward_hook(function () return end)
  assert_bitwise(m(x):tolist(), ref(xr):tolist(), "output")
  local g, gr = grads(m, x), grads(ref, xr)
  for i = 1, 3 do assert_bitwise(g[i], gr[i], "grad " .. i) end
end

-- Each wrong return raises an error naming the user's line, the module and
-- the hook kind; with the hook removed, the module gives the hook-free
-- output and grads again.
local WRONG = {
  {"register_forward_hook", function () return 3 end,
   "Sequential: a forward hook must return tensors, nil or tables of them, got number (hook "
   .. "defined at "},
  {"register_forward_hook", function (_, _, y) return {y, {k = "s"}} end,
   "Sequential: a forward hook must return tensors, nil or tables of them, got string (hook "
   .. "defined at "},
  {"register_forward_hook", function (_, _, y) return {[y] = y} end,
   "Sequential: a forward hook returned a table with a graphcap.Tensor key (keys are strings or "
   .. "integers) (hook defined at "},
  {"register_forward_pre_hook", function (_, a) return {a, "b"} end,
   "a forward pre-hook must return a tensor, a sequence of tensors or nothing, got string as "
   .. "element #2 of its sequence"},
  {"register_forward_pre_hook", function () local t = gc.zeros({2, 4}); t:close(); return t end,
   "a forward pre-hook must return a tensor, a sequence of tensors or nothing, got a closed tensor"},
  {"register_forward_pre_hook", function (_, a) return {a, a} end,
   "Sequential: expected 1 input, got 2"},
  {"register_full_backward_pre_hook", function (_, go) return go:sum() end,
   "Sequential: a backward pre-hook returned grad_output #1 of shape [] f32; expected shape "
   .. "[2, 3] f32, as the grad it replaces (hook defined at "},
  {"register_full_backward_pre_hook", function (_, go) return {go, go} end,
   "a backward pre-hook must return 1 grad_output (one per tensor output) or nothing, got 2 "
   .. "(hook defined at "},
  {"register_full_backward_pre_hook", function () return {} end,
   "a backward pre-hook must return 1 grad_output (one per tensor output) or nothing, got 0"},
  {"register_full_backward_pre_hook", function (_, go) return {go, n = "x"} end,
   "a backward pre-hook must return a tensor, a sequence of tensors or nothing, got a table "
   .. "whose n is x"},
  {"register_full_backward_hook", function (_, gi) return gc.zeros(gi:shape(), "bf16") end,
   "a backward hook returned grad_input #1 of shape [2, 4] bf16; expected shape [2, 4] f32"},
  {"register_full_backward_hook", function (_, gi) return gi, gi end,
   "a backward hook must return a tensor, a sequence of tensors or nothing, got 2 values"},
  {"register_full_backward_hook", function () return true end,
   "a backward hook must return a tensor, a sequence of tensors or nothing, got boolean"},
}

function TestHookReturns:test_wrong_returns ()
  for i, case in ipairs(WRONG) do
    local m, ref = model(), model()
    local x, xr = H.input({2, 4}, 0.8, true), H.input({2, 4}, 0.8, true)
    local h = m[case[1]](m, case[2])
    local msg = assert_err(function () grads(m, x) end, case[3])
    lu.assertStrContains(msg, HERE, false, "case " .. i .. ": the user's line")
    h:remove()
    m:zero_grad()
    x.grad = nil
    assert_bitwise(m(x):tolist(), ref(xr):tolist(), "case " .. i .. ": output after the error")
    local g, gr = grads(m, x), grads(ref, xr)
    for k = 1, 3 do assert_bitwise(g[k], gr[k], "case " .. i .. ": grad " .. k) end
  end
end

-- No input requires grad: a backward hook is given nil as grad_input, and
-- returning a grad for it is an error; returning nil is fine.
function TestHookReturns:test_backward_without_grad_input ()
  local m = model()
  local x = H.input({2, 4}, 0.9)
  local h = m:register_full_backward_hook(function (_, gi, go)
    lu.assertNil(gi)
    return go
  end)
  assert_err(function () loss(m(x)):backward() end, HERE,
             "Sequential: a backward hook returned a tensor as grad_input #1, but input #1 needs "
             .. "no grad: the entry must be absent (nil) (hook defined at " .. HERE)
  h:remove()
  m:zero_grad()
  m:register_full_backward_hook(function () return nil end)
  loss(m(x)):backward()
  lu.assertNotNil(m[1].weight.grad)
end

-- A module graphed without an order replays when called; hooks registered
-- after graphing run eagerly around the replay, and what they return takes
-- effect there too: the pre-hook's doubled input is copied into the static
-- input, the backward hook's doubled grad reaches x.
function TestHookReturns:test_graphed_module ()
  local m, ref = model(), model()
  local sample = H.input({2, 4}, 0.1, true)
  local G = gc.make_graphed_callables({m}, {{sample}})
  lu.assertIs(G[1], m)
  m:register_forward_pre_hook(function (_, a) return a * 2 end)
  m:register_full_backward_hook(function (_, gi) return gi * 2 end)
  local x, xr = H.input({2, 4}, 0.3, true), H.input({2, 4}, 0.3, true)
  local y = m(x)
  local xr2 = xr * 2
  local yr = ref(xr2)
  assert_bitwise(y:tolist(), yr:tolist(), "replayed output")
  loss(y):backward()
  loss(yr):backward()
  -- xr.grad is d loss / d (2 xr) times 2; the hook doubles it once more
  assert_bitwise(x.grad:tolist(), scaled(xr.grad:tolist(), 2), "x.grad")
  assert_bitwise(m[1].weight.grad:tolist(), ref[1].weight.grad:tolist(), "weight grad")
end

-- regression: a hook's map return was taken as no tensors, other keys dropped
-- A hook that returns a table which is not a sequence (a map, or a
-- sequence with other keys) is an error naming the key; a map was taken as
-- no tensors ("Linear: expected 1 input, got 0") and other keys were
-- dropped without a word.
function TestHookReturns:test_hook_returns_a_table_not_a_sequence ()
  local m = gc.nn.Linear(4, 3)
  local x = gc.randn({2, 4}, {requires_grad = true})
  local h = m:register_forward_pre_hook(function (_, a) return {a = a} end)
  H.assert_err(function () local y = m(x); return y end, "Linear: a forward pre-hook must return",
               "got a table that is not a sequence (key 'a')", "test_hook_returns.lua:")
  h:remove()
  h = m:register_full_backward_hook(function (_, gi) return {gi, extra = gi} end)
  H.assert_err(function () m(x):sum():backward() end, "Linear: a backward hook must return",
               "got a table that is not a sequence (key 'extra')")
  h:remove()
  lu.assertNil(x.grad)
  m(x):sum():backward()
  lu.assertEquals(x.grad:shape(), {2, 4})
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine
