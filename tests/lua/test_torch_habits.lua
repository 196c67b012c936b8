-- test_torch_habits.lua: tensors as a PyTorch user reaches for them
-- (docs/lua-api.md, "Tensors"): t.shape (and t:shape()), t:size, #t, t[i] as
-- a view and t[i] = v, / and ^ with their grads, the comparison masks and
-- Lua's < refused, factories taking sizes as arguments, tostring(t) with the
-- values.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_torch_habits.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

local HERE = debug.getinfo(1, "S").short_src .. ":"  -- errors name the user's line

-- x rounded to the nearest f32, as a tensor stores it.
local function f32 (x) return (string.unpack("<f", string.pack("<f", x))) end

TestTorchHabits = {}

function TestTorchHabits:tearDown ()
  lu.assertFalse(gc.is_capturing())
  gc.set_grad_enabled(true)
end

-- ---------------------------------------------------------------------------
-- Sizes

function TestTorchHabits:test_shape_field_and_method ()
  local t = gc.zeros({2, 3, 4})
  local s = t.shape
  lu.assertEquals(#s, 3)
  lu.assertEquals({s[1], s[2], s[3]}, {2, 3, 4})
  lu.assertTrue(s == t:size())            -- sizes compare by value
  lu.assertTrue(s == {2, 3, 4})
  lu.assertFalse(s == {2, 3})
  lu.assertFalse(s == {2, 3, 5})
  lu.assertEquals(tostring(s), "{2, 3, 4}")
  local m = t:shape()                     -- the method still works: a plain sequence
  lu.assertEquals(m, {2, 3, 4})
  lu.assertNil(getmetatable(m))
  m[1] = 99                               -- a copy: the tensor keeps its shape
  lu.assertEquals(t.shape[1], 2)
  lu.assertEquals(gc.tensor(1.5).shape, {})
  lu.assertEquals(#gc.tensor(1.5).shape, 0)
  local ok = pcall(function () t.shape = {6, 4} end)
  lu.assertFalse(ok)
end

-- t:to(dtype), t:float(), t:bfloat16(): t itself in its own dtype, else a
-- converted copy the grad flows back through, converted; a bad dtype names
-- the method and the caller's line.
function TestTorchHabits:test_to_float_bfloat16 ()
  local x = gc.tensor({{1.00390625, -2}, {3, 1e-3}}, {requires_grad = true})
  lu.assertTrue(rawequal(x:float(), x))
  lu.assertTrue(rawequal(x:to("f32"), x))
  local b = x:bfloat16()
  lu.assertEquals(b:dtype(), "bf16")
  lu.assertTrue(b.requires_grad)
  lu.assertEquals(b:tolist(), {{1.0, -2}, {3, 0.00099945068359375}}) -- rounded to bf16
  local back = b:float()
  lu.assertEquals(back:dtype(), "f32")
  local loss = (back * gc.tensor({{1, 2}, {3, 4}})):sum()
  loss:backward()
  lu.assertEquals(x.grad:tolist(), {{1, 2}, {3, 4}})
  lu.assertEquals(x.grad:dtype(), "f32")
  H.assert_err(function () return x:to("f16") end, HERE,
               'to: dtype must be "f32" or "bf16", got f16')
end

function TestTorchHabits:test_size_dim_numel_len ()
  local t = gc.ones(2, 3, 5)
  lu.assertEquals(t:size(), {2, 3, 5})
  lu.assertEquals(t:size(1), 2)
  lu.assertEquals(t:size(3), 5)
  lu.assertEquals(t:size(-1), 5)
  lu.assertEquals(t:size(-3), 2)
  lu.assertEquals(t:dim(), 3)
  lu.assertEquals(t:numel(), 30)
  lu.assertEquals(#t, 2)                  -- PyTorch's len(t)
  H.assert_err(function () return t:size(4) end,
               HERE, "size: dim 4 is out of range for a 3-D tensor (dims count from 1; -1 is the last)")
  H.assert_err(function () return t:size(0) end, HERE, "size: dim 0 is out of range")
  H.assert_err(function () return #gc.tensor(2) end, HERE, "#t: a 0-D tensor has no length")
end

-- ---------------------------------------------------------------------------
-- t[i]

function TestTorchHabits:test_index_reads_entries_as_views ()
  local t = gc.tensor({{1, 2, 3}, {4, 5, 6}})
  lu.assertEquals(t[1]:tolist(), {1, 2, 3})
  lu.assertEquals(t[2]:tolist(), {4, 5, 6})
  lu.assertEquals(t[-1]:tolist(), {4, 5, 6})
  lu.assertEquals(t[-2]:tolist(), {1, 2, 3})
  lu.assertEquals(t[2][3]:item(), 6)
  lu.assertEquals(t[2][3]:dim(), 0)
  lu.assertEquals(t[1].shape, {3})
  -- a view: its storage is t's, 3 floats in; writes through it show in t
  lu.assertEquals(t[2]:data_ptr(), t:data_ptr() + 3 * 4)
  t[2]:fill_(7)
  lu.assertEquals(t:tolist(), {{1, 2, 3}, {7, 7, 7}})
  local v0 = t._version
  t[1]:zero_()
  lu.assertEquals(t._version, v0 + 1)     -- one storage, one version counter
  -- 4-D, bf16
  local u = gc.tensor(H.nest(H.values(120, 0.1), {2, 3, 4, 5}), "bf16")
  local want = u:tolist()
  lu.assertEquals(u[2][3]:tolist(), want[2][3])
  lu.assertEquals(u[-1][-1][-1]:tolist(), want[2][3][4])
  lu.assertEquals(u[1]:dtype(), "bf16")
  -- fields and methods keep working beside the indices
  local w = gc.ones({2}, {requires_grad = true})
  lu.assertTrue(w.requires_grad)
  lu.assertTrue(w.is_leaf)
  lu.assertNil(w.grad)
  lu.assertEquals(w:sum():item(), 2)
  lu.assertNil(w.no_such_field)
end

function TestTorchHabits:test_index_errors_name_the_size ()
  local t = gc.zeros(3, 2)
  H.assert_err(function () return t[4] end, HERE,
               "t[i]: index 4 is out of range for dim 1 of size 3 (indices count from 1; -1 is the last)")
  H.assert_err(function () return t[0] end, HERE, "t[i]: index 0 is out of range for dim 1 of size 3")
  H.assert_err(function () return t[-4] end, HERE, "t[i]: index -4 is out of range for dim 1 of size 3")
  H.assert_err(function () return t[1.5] end, HERE,
               "t[i]: a tensor's index is an integer (from 1; -1 is the last), got 1.5")
  H.assert_err(function () return gc.tensor(1)[1] end, HERE,
               "t[i]: index 1 of a 0-D tensor (it has no dims to index)")
  H.assert_err(function () return gc.zeros(0, 2)[1] end, HERE,
               "index 1 is out of range for dim 1 of size 0")
  H.assert_err(function () t[4] = 1 end, HERE, "t[i] = v: index 4 is out of range for dim 1 of size 3")
end

function TestTorchHabits:test_index_assigns ()
  local t = gc.zeros(3, 2)
  t[1] = 5
  t[-1] = gc.tensor({1, 2})
  t[2] = gc.tensor({8, 9}, "bf16")        -- converted, as copy_ does
  lu.assertEquals(t:tolist(), {{5, 5}, {8, 9}, {1, 2}})
  local m = gc.zeros(2, 2, 2)
  m[2][1] = 3                             -- a view of a view, written in place
  lu.assertEquals(m:tolist(), {{{0, 0}, {0, 0}}, {{3, 3}, {0, 0}}})
  m[1] = gc.tensor({{1, 2}, {3, 4}})
  lu.assertEquals(m[1]:tolist(), {{1, 2}, {3, 4}})
  H.assert_err(function () t[1] = gc.tensor({1, 2, 3}) end, HERE,
               "t[i] = v: v has 3 elements, entry 1 of the tensor has 2")
  H.assert_err(function () t[1] = "x" end, HERE, "t[i] = v: v must be a number or a tensor, got string")
  H.assert_err(function () t.no_such = 1 end, HERE, "has no assignable field 'no_such'")
end

-- t[i] = v writes as fill_ and copy_ do, under their autograd rules.
function TestTorchHabits:test_index_assign_autograd_rules ()
  local w = gc.zeros({2, 3}, {requires_grad = true})
  H.assert_err(function () w[1] = 1 end, HERE,
               "t[i] = v: fill_: a leaf that requires grad, or a view of one, cannot be modified "
               .. "in place while grad is recorded (wrap it in no_grad)")
  gc.no_grad(function () w[1] = 2 end)
  lu.assertEquals(w:tolist(), {{2, 2, 2}, {0, 0, 0}})
  local h = w * 1                         -- not a leaf: a recorded write into its view is refused
  H.assert_err(function () h[2] = gc.ones(3) end, HERE,
               "t[i] = v: copy_: autograd cannot record an in-place write into a view")
  -- a write bumps the version a backward checks
  local a = gc.tensor({1, 2, 3}, {requires_grad = true})
  local b = gc.tensor({{4, 5, 6}, {7, 8, 9}})
  local y = a * b[1]                       -- saves b[1], a view of b
  b[1] = 0
  H.assert_err(function () y:sum():backward() end, HERE,
               "modified by an inplace operation", "saved by 'mul'")
end

-- The grad of an entry goes into that entry of the whole.
function TestTorchHabits:test_index_grads ()
  local x = gc.tensor(H.nest(H.values(12, 0.4), {3, 4}), {requires_grad = true})
  local y = x[2] * gc.tensor({1, 2, 3, 4}) + x[-1]:sum()
  lu.assertEquals(y.grad_fn, "add")
  y:sum():backward()
  lu.assertEquals(x.grad:tolist(), {{0, 0, 0, 0}, {1, 2, 3, 4}, {4, 4, 4, 4}})
  lu.assertEquals(x[1].grad_fn, "select")
end

-- Ops read an entry where it lies, at an offset of the storage that the
-- allocator's alignment does not give (here 15 floats in): the same values
-- as from an aligned copy, within rounding (a GEMM may pick another
-- algorithm for a less aligned operand).
function TestTorchHabits:test_ops_on_entries ()
  local x = gc.tensor(H.nest(H.values(45, 0.2), {3, 3, 5}), {requires_grad = true})
  local w = gc.tensor(H.nest(H.values(20, 0.7), {4, 5}))
  local b = gc.tensor(H.values(4, 1.1))
  local e = x[2]
  lu.assertEquals(e:data_ptr() - x:data_ptr(), 15 * 4)
  local c = e:detach():clone()
  local function ops (t)
    return {gc.F.linear(t, w, b):tolist(), gc.matmul(t, w:transpose(1, 2)):tolist(),
            gc.F.layer_norm(t):tolist(), gc.F.softmax(t):tolist(), (t * 2 + 1):tolist()}
  end
  H.assert_close(ops(e), ops(c), 1e-6, 1e-5, "ops on x[2]")
  gc.F.linear(e, w, b):sum():backward()
  H.assert_close(x.grad[2]:tolist(), gc.ones(3, 4):matmul(w):tolist(), 1e-6, 1e-5, "grad of x[2]")
  lu.assertEquals(x.grad[1]:tolist(), gc.zeros(3, 5):tolist())
end

-- ---------------------------------------------------------------------------
-- / and ^

function TestTorchHabits:test_div_values ()
  local a, b = gc.tensor({1, 2, 3}), gc.tensor({4, 8, 16})
  lu.assertEquals((a / b):tolist(), {0.25, 0.25, f32(3 / 16)})
  lu.assertEquals((a / 4):tolist(), {0.25, 0.5, 0.75})
  lu.assertEquals((12 / a):tolist(), {12, 6, 4})
  lu.assertEquals((a / 3):tolist(), {f32(1 / 3), f32(2 / 3), 1})  -- a true division, not * (1/3)
  local m = gc.tensor({{2, 4}, {6, 8}})
  lu.assertEquals((m / gc.tensor({2, 4})):tolist(), {{1, 1}, {3, 2}})  -- a row broadcasts
  lu.assertEquals((a / 0):tolist(), {math.huge, math.huge, math.huge})
  H.assert_err(function () return m / gc.tensor({1, 2, 3}) end, HERE,
               "div: shapes [2, 2] and [3] do not broadcast")
  H.assert_err(function () return a / gc.tensor({1, 2, 3}, "bf16") end, HERE,
               "div: dtypes differ (f32 and bf16)")
end

function TestTorchHabits:test_pow_values ()
  local a = gc.tensor({1, 2, 3, 0.5})
  lu.assertEquals((a ^ 2):tolist(), {1, 4, 9, 0.25})
  lu.assertEquals((2 ^ a):tolist(), {2, 4, 8, f32(math.sqrt(2))})
  lu.assertEquals((a ^ gc.tensor({3, 2, 1, -1})):tolist(), {1, 4, 3, 2})
  lu.assertEquals((a ^ 0.5):tolist()[2], f32(math.sqrt(2)))
  local r = (gc.tensor(-8) ^ (1 / 3)):item()
  lu.assertTrue(r ~= r)                   -- a negative base to a fraction is NaN, as pow
end

-- Grads against central differences of the same ops in double.
function TestTorchHabits:test_div_pow_grads ()
  local av, bv = H.values(6, 0.3, 1.0, 1.5), H.values(6, 1.1, 0.5, 1.0)
  local function each (f)
    return function (x, y)
      local r = {}
      for i = 1, math.max(#x, #y) do r[i] = f(x[(i - 1) % #x + 1], y[(i - 1) % #y + 1]) end
      return r
    end
  end
  H.gradcheck("div", {{{2, 3}, av}, {{2, 3}, bv}}, function (x, y) return x / y end,
              each(function (x, y) return x / y end))
  H.gradcheck("div by a row", {{{2, 3}, av}, {{3}, {1.5, -2, 0.75}}},
              function (x, y) return x / y end, each(function (x, y) return x / y end))
  H.gradcheck("pow", {{{2, 3}, av}, {{2, 3}, bv}}, function (x, y) return x ^ y end,
              each(function (x, y) return x ^ y end), {rtol = 1e-3})
  H.gradcheck("pow 0-D exponent", {{{2, 3}, av}, {{}, {1.7}}}, function (x, y) return x ^ y end,
              each(function (x, y) return x ^ y end), {rtol = 1e-3})
  H.gradcheck("pow 0-D base", {{{}, {1.3}}, {{2, 3}, bv}}, function (x, y) return x ^ y end,
              each(function (x, y) return x ^ y end), {rtol = 1e-3})
  local x = gc.tensor({1, 2}, {requires_grad = true})
  ;(x ^ 3 + 1 / x):sum():backward()       -- numbers on either side
  H.assert_close(x.grad:tolist(), {3 - 1, 12 - 0.25}, 1e-6, 1e-6, "x^3 + 1/x")
end

-- PyTorch's special cases: no grad into the base through an exponent of 0,
-- none into the exponent through a base of 0 (exponent >= 0).
function TestTorchHabits:test_pow_grad_at_zero ()
  local a = gc.tensor({0, 0, 2}, {requires_grad = true})
  local b = gc.tensor({0, 2, 0}, {requires_grad = true})
  ;(a ^ b):sum():backward()
  lu.assertEquals(a.grad:tolist(), {0, 0, 0})
  lu.assertEquals(b.grad:tolist(), {0, 0, f32(math.log(2))})
end

-- ---------------------------------------------------------------------------
-- Comparisons

function TestTorchHabits:test_comparison_masks ()
  local a = gc.tensor({1, 2, 3, 4})
  local b = gc.tensor({4, 2, 1, 4})
  lu.assertEquals(a:lt(b):tolist(), {1, 0, 0, 0})
  lu.assertEquals(a:le(b):tolist(), {1, 1, 0, 1})
  lu.assertEquals(a:gt(b):tolist(), {0, 0, 1, 0})
  lu.assertEquals(a:ge(b):tolist(), {0, 1, 1, 1})
  lu.assertEquals(a:eq(b):tolist(), {0, 1, 0, 1})
  lu.assertEquals(a:ne(b):tolist(), {1, 0, 1, 0})
  lu.assertEquals(a:gt(2.5):tolist(), {0, 0, 1, 1})
  lu.assertEquals(gc.tensor({{1, 5}, {7, 0}}):ge(gc.tensor({2, 5})):tolist(), {{0, 1}, {1, 0}})
  local nan = gc.tensor({0 / 0, 1})
  lu.assertEquals(nan:eq(nan):tolist(), {0, 1})
  lu.assertEquals(nan:ne(nan):tolist(), {1, 0})
  -- f32 masks with no grad, from any dtype
  local x = gc.tensor({-1, 1}, {requires_grad = true})
  local m = x:gt(0)
  lu.assertEquals(m:dtype(), "f32")
  lu.assertFalse(m.requires_grad)
  lu.assertNil(m.grad_fn)
  lu.assertEquals(gc.tensor({1, 3}, "bf16"):lt(gc.tensor({2, 2}, "bf16")):dtype(), "f32")
  H.assert_err(function () return a:lt(gc.tensor({1, 2, 3})) end, HERE,
               "lt: shapes [4] and [3] do not broadcast")
end

function TestTorchHabits:test_lua_comparison_refused ()
  local a, b = gc.tensor({1}), gc.tensor({2})
  local want = "tensors do not compare with Lua's <, <=, > or >= (they give a boolean): "
               .. "t:lt(u), t:le(u), t:gt(u), t:ge(u), t:eq(u), t:ne(u) give masks of 0 and 1"
  H.assert_err(function () return a < b end, HERE, want)
  H.assert_err(function () return a <= b end, HERE, want)
  H.assert_err(function () return a > 1 end, HERE, want)
  H.assert_err(function () return 1 >= a end, HERE, want)
  lu.assertTrue(a == a)                   -- == stays identity (Lua's == gives a boolean)
  lu.assertFalse(a == gc.tensor({1}))
end

-- A comparison's mask is what every mask option takes.
function TestTorchHabits:test_masks_in_mask_options ()
  local x = gc.tensor(H.nest(H.values(12, 0.6, 2.0), {3, 4}))
  local neg = x:lt(0)
  local vals, maskv = x:tolist(), neg:tolist()
  local filled = x:masked_fill(neg, 0):tolist()
  for i = 1, 3 do
    for j = 1, 4 do
      lu.assertEquals(filled[i][j], maskv[i][j] == 1 and 0 or vals[i][j])
    end
  end
  local explicit = gc.tensor(maskv)
  H.assert_bitwise(gc.F.softmax(x, {mask_bool = neg}):tolist(),
                   gc.F.softmax(x, {mask_bool = explicit}):tolist(), "softmax mask_bool")
  local q = gc.tensor(H.nest(H.values(24, 0.2), {2, 3, 4}))
  local scores_mask = gc.tensor(H.nest(H.values(9, 1.3), {3, 3})):gt(0.2)
  H.assert_bitwise(gc.F.scaled_dot_product_attention(q, q, q, {attn_mask_bool = scores_mask}):tolist(),
                   gc.F.scaled_dot_product_attention(q, q, q,
                     {attn_mask_bool = gc.tensor(scores_mask:tolist())}):tolist(),
                   "attention attn_mask_bool")
end

-- ---------------------------------------------------------------------------
-- Factories

function TestTorchHabits:test_factories_take_sizes ()
  for _, name in ipairs({"zeros", "ones", "empty", "rand", "randn"}) do
    local t = gc[name](8, 16)
    lu.assertEquals(t:shape(), {8, 16}, name)
    lu.assertEquals(gc[name](5):shape(), {5}, name)
    lu.assertEquals(gc[name]({}):shape(), {}, name)
    local b = gc[name](2, 3, "bf16")
    lu.assertEquals({b:shape(), b:dtype()}, {{2, 3}, "bf16"}, name)
    local g = gc[name](2, 3, {requires_grad = true, dtype = "bf16"})
    lu.assertEquals({g:shape(), g:dtype(), g.requires_grad}, {{2, 3}, "bf16", true}, name)
  end
  gc.manual_seed(7)
  local a = gc.randn(8, 16)
  gc.manual_seed(7)
  H.assert_bitwise(gc.randn({8, 16}):tolist(), a:tolist(), "randn(8, 16) = randn({8, 16})")
  lu.assertEquals(gc.ones(2, 2):tolist(), {{1, 1}, {1, 1}})
  lu.assertEquals(gc.full({2, 2}, 1.5):tolist(), {{1.5, 1.5}, {1.5, 1.5}})
end

function TestTorchHabits:test_factory_errors ()
  H.assert_err(function () return gc.zeros() end, HERE,
               "zeros: shape must be a table of sizes, or the sizes as arguments "
               .. "(gc.zeros({2, 3}) or gc.zeros(2, 3)), got nil")
  H.assert_err(function () return gc.randn(2, {3}) end, HERE,
               "randn: give the shape as one table or as sizes, not both (argument #2 is a table of sizes)")
  H.assert_err(function () return gc.ones(2, 3, "f32", 4) end, HERE,
               "ones: expected (size, ... [, opts]), got argument #4 (integer) after the options")
  H.assert_err(function () return gc.rand({2}, {}, 3) end, HERE, "rand: expected (shape [, opts]), got 3 arguments")
  H.assert_err(function () return gc.zeros(2, -1) end, HERE,
               "zeros: shape entry #2 must be a non-negative integer, got -1")
  H.assert_err(function () return gc.zeros(2.5) end, HERE,
               "zeros: shape entry #1 must be a non-negative integer, got 2.5")
  H.assert_err(function () return gc.empty(2, {dtype = "f64"}) end, HERE, "unknown dtype 'f64'")
  H.assert_err(function () return gc.full(8, 16, 1.5) end, HERE,
               "full: the shape is one table of sizes (torch.full's size), as in gc.full({2, 3}, v); "
               .. "got a number first")
end

-- ---------------------------------------------------------------------------
-- tostring

function TestTorchHabits:test_tostring_as_pytorch ()
  lu.assertEquals(tostring(gc.tensor({{1, 2}, {3, 4}})), "tensor([[1., 2.],\n        [3., 4.]])")
  lu.assertEquals(tostring(gc.tensor({1.5, -2.25, 10})), "tensor([ 1.5000, -2.2500, 10.0000])")
  lu.assertEquals(tostring(gc.tensor(3.5)), "tensor(3.5000)")
  lu.assertEquals(tostring(gc.tensor(-2)), "tensor(-2.)")
  lu.assertEquals(tostring(gc.tensor({1e-5, 1, 200})), "tensor([1.0000e-05, 1.0000e+00, 2.0000e+02])")
  lu.assertEquals(tostring(gc.tensor({1, 1e9})), "tensor([1.0000e+00, 1.0000e+09])")
  lu.assertEquals(tostring(gc.zeros(3)), "tensor([0., 0., 0.])")
  lu.assertEquals(tostring(gc.tensor({0 / 0, 1 / 0, -1 / 0, 1})), "tensor([nan, inf, -inf, 1.])")
  lu.assertEquals(tostring(gc.tensor({0.5, 2}, "bf16")), "tensor([0.5000, 2.0000], dtype=bf16)")
  lu.assertEquals(tostring(gc.ones({2}, {requires_grad = true})), "tensor([1., 1.], requires_grad=true)")
  local x = gc.ones({2}, {requires_grad = true})
  lu.assertEquals(tostring(x * 2), "tensor([2., 2.], grad_fn=<scale>)")
  lu.assertEquals(tostring(gc.zeros(2, 0)), "tensor([], size=(2, 0))")
  lu.assertEquals(tostring(gc.zeros(0)), "tensor([])")
  lu.assertEquals(tostring(gc.zeros(2, 1, 2)), "tensor([[[0., 0.]],\n\n        [[0., 0.]]])")
  -- a long row wraps at 80 columns, as PyTorch's linewidth
  lu.assertEquals(tostring(gc.full({12}, 0.5)),
                  "tensor([0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000,\n"
                  .. "        0.5000, 0.5000, 0.5000])")
end

-- Above 1000 elements each dim shows its first and last 3 entries.
function TestTorchHabits:test_tostring_summarizes ()
  local t = gc.tensor(H.nest(function (i) return 1000 + i end, {40, 50}))
  lu.assertEquals(tostring(t), table.concat({
    "tensor([[1000., 1001., 1002.,  ..., 1047., 1048., 1049.],",
    "        [1050., 1051., 1052.,  ..., 1097., 1098., 1099.],",
    "        [1100., 1101., 1102.,  ..., 1147., 1148., 1149.],",
    "        ...,",
    "        [2850., 2851., 2852.,  ..., 2897., 2898., 2899.],",
    "        [2900., 2901., 2902.,  ..., 2947., 2948., 2949.],",
    "        [2950., 2951., 2952.,  ..., 2997., 2998., 2999.]])"}, "\n"))
  -- magnitudes 1000 apart: scientific notation, as PyTorch (rows wrap at 80 columns)
  local s = tostring(gc.tensor(H.nest(function (i) return i end, {40, 50})))
  lu.assertStrContains(s, "tensor([[0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 4.7000e+01, 4.8000e+01,\n"
                          .. "         4.9000e+01],\n")
  local v = gc.full({1001}, 2)
  lu.assertEquals(tostring(v), "tensor([2., 2., 2.,  ..., 2., 2., 2.])")
end

-- Where the values cannot be read, the box's description: a closed tensor,
-- and inside a capture (reading back would invalidate it).
function TestTorchHabits:test_tostring_without_values ()
  local t = gc.zeros(2, 3)
  local s
  local g = gc.Graph()
  g:capture(function () s = tostring(t) end)
  lu.assertEquals(s, "graphcap.Tensor(shape={2,3}, dtype=f32)")
  g:replay()                              -- the capture was not invalidated
  t:close()
  lu.assertEquals(tostring(t), "graphcap.Tensor (closed)")
end

-- ---------------------------------------------------------------------------
-- Captured

-- Entries, / and ^ inside a captured graph replay as they ran eagerly.
function TestTorchHabits:test_captured_bitwise ()
  local x = gc.tensor(H.nest(H.values(12, 0.9, 1.0, 2.0), {3, 4}))
  local y = gc.tensor(H.nest(H.values(4, 0.1, 0.5, 1.0), {4}))
  local function f (a, b)
    local r = (a[2] / b) ^ 2 + a[-1]:gt(2) * (2 ^ b)
    return r / a[1]
  end
  local eager = f(x, y):tolist()
  local out
  local g = gc.Graph()
  g:capture(function () out = f(x, y) end)
  g:replay()
  H.assert_bitwise(out:tolist(), eager, "replay")
  x:copy_(x * 0.5)                        -- new inputs in place: the replay follows
  g:replay()
  H.assert_bitwise(out:tolist(), f(x, y):tolist(), "replay after new inputs")
end

os.exit(lu.LuaUnit.run(), true)
