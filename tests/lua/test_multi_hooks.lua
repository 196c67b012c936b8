-- test_multi_hooks.lua: module hooks on a call of several inputs and
-- outputs, as PyTorch's full hooks (docs/lua-api.md, "Module hooks"). A
-- module Pair(x, z) returns {p = x * z, q = x * x}, nil, x:detach(). A
-- forward hook is given those values as the forward returned them and may
-- replace them whole; a backward pre-hook is given the grads of the three
-- tensor outputs as one sequence (map entries in sorted key order, nil for
-- the detached one) and may replace them; a backward hook is given the
-- grads of both inputs and may replace them. Replaced grads are compared bit
-- for bit with the hook-free ones (scaling by 2 is exact) and with central
-- differences of the loss computed in Lua; wrong returns are errors naming
-- the module, the hook kind, the entry and where the hook was defined.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_multi_hooks.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local assert_close, assert_bitwise, assert_err = H.assert_close, H.assert_bitwise, H.assert_err

local HERE = debug.getinfo(1, "S").short_src .. ":"  -- errors name the user's line

local SHAPE = {2, 3}
local XS, ZS, CS = H.values(6, 0.3, 1.2), H.values(6, 1.7, 0.9), H.values(6, 2.9, 1.1)

local Pair = gc.nn.Module("Pair")
function Pair:forward (x, z)
  return {q = x * x, p = x * z}, nil, x:detach()
end

local function inputs (z_grad)
  return gc.tensor(H.nest(XS, SHAPE), {requires_grad = true}),
         gc.tensor(H.nest(ZS, SHAPE), {requires_grad = z_grad ~= false})
end

-- loss = kp * sum(c * p) + kq * sum(q)
local function loss (o, kp, kq)
  local c = gc.tensor(H.nest(CS, SHAPE))
  return (o.p * c):sum() * (kp or 1) + o.q:sum() * (kq or 1)
end

-- The same loss in Lua doubles at the flat lists xs, zs.
local function loss_lua (xs, zs, kp, kq)
  local s = 0
  for i = 1, #xs do s = s + kp * CS[i] * xs[i] * zs[i] + kq * xs[i] * xs[i] end
  return s
end

-- Central differences of loss_lua with respect to x and z.
local function differences (kp, kq)
  local xs, zs = {table.unpack(XS)}, {table.unpack(ZS)}
  local f = function () return loss_lua(xs, zs, kp, kq) end
  return H.numgrad(f, xs), H.numgrad(f, zs)
end

local function scaled (v, k)
  local r = {}
  for i, w in ipairs(H.flat(v)) do r[i] = k * w end
  return r
end

-- x.grad and z.grad (flat; nil for none) of a hook-free call.
local function reference (kp, kq)
  local x, z = inputs()
  loss((Pair()(x, z)), kp, kq):backward()
  return H.flat(x.grad:tolist()), H.flat(z.grad:tolist())
end

TestMultiHooks = {}

-- The forward hook is given the values the forward returned (the same
-- table), its return replaces them whole, and grads flow through it.
function TestMultiHooks:test_forward_hook_sees_and_replaces ()
  local m, x, z = Pair(), inputs()
  local seen
  m:register_forward_hook(function (_, args, ...)
    seen = table.pack(...)
    lu.assertIs(args[1], x)
    lu.assertIs(args[2], z)
  end)
  local o, none, d = m(x, z)
  lu.assertEquals(seen.n, 3)
  lu.assertIs(seen[1], o)
  lu.assertNil(seen[2])
  lu.assertIs(seen[3], d)
  lu.assertNil(none)
  -- replaced whole, by another structure
  local new
  m:register_forward_hook(function (_, _, out)
    new = {both = {out.p * 2, out.q}}
    return new, out.q
  end)
  local r, q = m(x, z)
  lu.assertIs(r, new)
  lu.assertIs(q, new.both[2])
  loss({p = r.both[1], q = q}):backward()
  local gx, gz = reference(2, 1)
  assert_bitwise(x.grad:tolist(), gx, "x.grad through the replaced outputs")
  assert_bitwise(z.grad:tolist(), gz, "z.grad through the replaced outputs")
end

-- With backward hooks the call's tensors are aliases: the structure the
-- forward (or a forward hook) gave comes back with them in place.
function TestMultiHooks:test_structure_with_backward_hooks ()
  local m, x, z = Pair(), inputs()
  m:register_forward_hook(function (_, _, out, _, d) return {out.q, {d, nil, out.p}} end)
  m:register_full_backward_pre_hook(function () end)
  local r = m(x, z)
  lu.assertEquals(#r, 2)
  lu.assertEquals(r[1].grad_fn, "backward_hook")
  lu.assertNil(r[2][2])
  assert_bitwise(r[2][3]:tolist(), (x * z):tolist(), "p")
  assert_bitwise(r[2][1]:tolist(), x:tolist(), "the detached x")
end

-- The backward pre-hook gets the grads of the tensor outputs in order (p,
-- q: sorted keys; the detached one nil); doubling p's doubles its share.
function TestMultiHooks:test_backward_pre_hook_replaces_grads ()
  local m, x, z = Pair(), inputs()
  local given, bw_go
  m:register_full_backward_pre_hook(function (_, go)
    given = go
    return table.pack(go[1] * 2, go[2], nil)
  end)
  m:register_full_backward_hook(function (_, _, go) bw_go = go end)
  loss((m(x, z))):backward()
  lu.assertEquals(given.n, 3)
  lu.assertNil(given[3])
  assert_bitwise(given[1]:tolist(), gc.tensor(H.nest(CS, SHAPE)):tolist(),
                 "grad of p (sorted first)")
  assert_bitwise(given[2]:tolist(), H.nest(H.values(6, 0, 0, 1), SHAPE), "grad of q (ones)")
  lu.assertEquals(bw_go.n, 3)
  assert_bitwise(bw_go[1]:tolist(), scaled(given[1]:tolist(), 2),
                 "the backward hook sees the doubled grad")
  local gx, gz = reference(2, 1)
  assert_bitwise(x.grad:tolist(), gx, "x.grad")
  assert_bitwise(z.grad:tolist(), gz, "z.grad")
  local dx, dz = differences(2, 1)
  assert_close(x.grad:tolist(), dx, 1e-4, 1e-4, "x.grad vs differences")
  assert_close(z.grad:tolist(), dz, 1e-4, 1e-4, "z.grad vs differences")
end

-- The backward hook gets the grads of every input and replaces each: x's
-- doubled, z's kept; nil for one drops it.
function TestMultiHooks:test_backward_hook_replaces_every_input ()
  local m, x, z = Pair(), inputs()
  local given
  local h = m:register_full_backward_hook(function (_, gi)
    given = gi
    return {gi[1] * 2, gi[2]}
  end)
  loss((m(x, z))):backward()
  lu.assertEquals(given.n, 2)
  local gx, gz = reference(1, 1)
  assert_bitwise(given[1]:tolist(), gx, "grad_input[1] as computed")
  assert_bitwise(given[2]:tolist(), gz, "grad_input[2] as computed")
  assert_bitwise(x.grad:tolist(), scaled(gx, 2), "x.grad doubled")
  assert_bitwise(z.grad:tolist(), gz, "z.grad kept")
  local dx, dz = differences(1, 1)
  assert_close(x.grad:tolist(), scaled(dx, 2), 1e-4, 1e-4, "x.grad vs twice the differences")
  assert_close(z.grad:tolist(), dz, 1e-4, 1e-4, "z.grad vs differences")
  h:remove()
  x.grad, z.grad = nil, nil
  m:register_full_backward_hook(function (_, gi) return {nil, gi[2], n = 2} end)
  loss((m(x, z))):backward()
  lu.assertNil(x.grad)
  assert_bitwise(z.grad:tolist(), gz, "z.grad when x's is dropped")
end

-- An input that needs no grad is nil in grad_input, and must stay nil.
function TestMultiHooks:test_input_without_grad ()
  local m, x, z = Pair(), inputs(false)
  local given
  m:register_full_backward_hook(function (_, gi) given = gi end)
  loss((m(x, z))):backward()
  lu.assertEquals(given.n, 2)
  lu.assertNotNil(given[1])
  lu.assertNil(given[2])
end

-- Map outputs flatten in sorted key order (integers, then strings), not in
-- Lua's table order: the grads a backward pre-hook is given follow it.
function TestMultiHooks:test_map_order ()
  local M = gc.nn.Module("Keys")
  local names = {"zeta", "b", "alpha", "m", "c10", "c9", "Q"}
  function M:forward (x)
    local r = {[2] = x * 2, [1] = x * 1}
    for i, k in ipairs(names) do r[k] = x * (i + 2) end
    return r
  end
  local m, x = M(), gc.tensor({1, 1}, {requires_grad = true})
  local got
  m:register_full_backward_pre_hook(function (_, go) got = go end)
  local r = m(x)
  local l = r[1]:sum() * 1
  for k, v in pairs(r) do
    if k ~= 1 then l = l + v:sum() * (type(k) == "number" and k or #k + 10) end
  end
  l:backward()
  local want = {1, 2}
  local sorted = {table.unpack(names)}
  table.sort(sorted)
  for _, k in ipairs(sorted) do want[#want + 1] = #k + 10 end
  lu.assertEquals(got.n, #want)
  for i, w in ipairs(want) do lu.assertEquals(got[i]:tolist(), {w, w}, "entry " .. i) end
end

-- Wrong returns: errors naming the module, the hook kind, the entry and
-- the hook's line; the module then works as before.
local WRONG = {
  {"register_full_backward_pre_hook", function (_, go) return go[1] end,
   "Pair: a backward pre-hook must return 3 grad_outputs (one per tensor output) or nothing, got "
   .. "1"},
  {"register_full_backward_pre_hook", function (_, go) return {go[1], go[1]:sum(), nil, n = 3} end,
   "Pair: a backward pre-hook returned grad_output #2 of shape [] f32; expected shape [2, 3] f32"},
  {"register_full_backward_pre_hook", function (_, go) return {go[1], go[2], go[1]} end,
   "Pair: a backward pre-hook returned a tensor as grad_output #3, but tensor output #3 needs "
   .. "no grad"},
  {"register_full_backward_pre_hook", function (_, go) return {go[1], go[2], nil, n = 3, x = 1} end,
   "a backward pre-hook must return a sequence of tensors (nil where none) or nothing, got a "
   .. "table that is not a sequence (key 'x')"},
  {"register_full_backward_pre_hook", function (_, go) return {go[1], "g", nil, n = 3} end,
   "got string as element #2 of its sequence"},
  {"register_full_backward_hook", function (_, gi) return {gi[1]} end,
   "Pair: a backward hook must return 2 grad_inputs (one per input) or nothing, got 1"},
  {"register_full_backward_hook", function (_, gi) return gi[1], gi[2] end,
   "Pair: a backward hook must return a sequence of tensors (nil where none) or nothing, got 2 "
   .. "values"},
  {"register_full_backward_hook",
   function (_, gi) return {gi[2], gc.zeros(gi[1]:shape(), "bf16")} end,
   "Pair: a backward hook returned grad_input #2 of shape [2, 3] bf16; expected shape [2, 3] f32"},
  {"register_forward_hook", function (_, _, o) return o, gc.nn.Linear(1, 1) end,
   "Pair: a forward hook must return tensors, nil or tables of them, got graphcap.Module"},
}

function TestMultiHooks:test_wrong_returns ()
  local gx, gz = reference(1, 1)
  for i, case in ipairs(WRONG) do
    local m, x, z = Pair(), inputs()
    local h = m[case[1]](m, case[2])
    local msg = assert_err(function () loss((m(x, z))):backward() end, case[3])
    lu.assertStrContains(msg, "(hook defined at " .. HERE, false, "case " .. i .. ": the hook")
    lu.assertStrContains(msg, HERE, false, "case " .. i .. ": the user's line")
    h:remove()
    x.grad, z.grad = nil, nil
    loss((m(x, z))):backward()
    assert_bitwise(x.grad:tolist(), gx, "case " .. i .. ": x.grad after the error")
    assert_bitwise(z.grad:tolist(), gz, "case " .. i .. ": z.grad after the error")
  end
end

-- Registration takes the function alone: PyTorch's options are errors, not
-- dropped without a word.
function TestMultiHooks:test_register_options_refused ()
  local m = Pair()
  for _, reg in ipairs{"register_forward_pre_hook", "register_forward_hook",
                       "register_full_backward_pre_hook", "register_full_backward_hook"} do
    assert_err(function () m[reg](m, function () end, {prepend = true}) end, HERE,
               "Pair: a ", " takes no options (PyTorch's prepend, with_kwargs, always_call are "
               .. "not supported), got table after the function")
  end
  local x, z = inputs()
  local o = m(x, z)                                     -- no hook was registered
  lu.assertEquals(o.p.grad_fn, "mul")
end

-- Hooks registered on a graphed module run around its replay: the forward
-- hook is given the outputs in the structure captured, and the backward
-- pre-hook's doubled grads reach the inputs, as in the eager call.
function TestMultiHooks:test_graphed_module ()
  local m = Pair()
  local sx, sz = inputs()
  gc.make_graphed_callables({m}, {{sx, sz}})
  local seen
  m:register_forward_hook(function (_, _, ...) seen = table.pack(...) end)
  m:register_full_backward_pre_hook(function (_, go) return {go[1] * 2, go[2], nil, n = 3} end)
  local x, z = inputs()
  local o = m(x, z)
  lu.assertEquals(seen.n, 3)
  lu.assertNil(seen[2])
  assert_bitwise(seen[1].p:tolist(), (x * z):tolist(), "the hook's p")
  loss(o):backward()
  local gx, gz = reference(2, 1)
  assert_bitwise(x.grad:tolist(), gx, "x.grad")
  assert_bitwise(z.grad:tolist(), gz, "z.grad")
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine
