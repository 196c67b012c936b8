-- test_shape_ops.lua: the shape ops (docs/lua-api.md, "Shape ops"):
-- t:reshape, t:transpose, t:permute, gc.split, gc.chunk and gc.cat against
-- references on flat lists, their grads by central differences, a captured
-- forward and backward replayed equal to eager bit for bit, and their errors.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_shape_ops.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

local HERE = debug.getinfo(1, "S").short_src .. ":"  -- errors name the user's line

-- The row-major offset of index idx (0-based entries) in shape.
local function offset (shape, idx)
  local o = 0
  for d = 1, #shape do o = o * shape[d] + idx[d] end
  return o
end

-- Every index of shape in row-major order, 0-based entries.
local function indices (shape)
  local out, idx = {}, {}
  local function walk (d)
    if d > #shape then out[#out + 1] = table.move(idx, 1, #shape, 1, {}); return end
    for i = 0, shape[d] - 1 do idx[d] = i; walk(d + 1) end
  end
  walk(1)
  return out
end

-- x (flat, of shape) permuted: result dim d is x's dim perm[d] (1-based).
local function ref_permute (x, shape, perm)
  local ys = {}
  for d = 1, #perm do ys[d] = shape[perm[d]] end
  local y = {}
  for k, idx in ipairs(indices(ys)) do
    local xi = {}
    for d = 1, #perm do xi[perm[d]] = idx[d] end
    y[k] = x[offset(shape, xi) + 1]
  end
  return y, ys
end

-- Entries lo .. lo + len - 1 (0-based) of dim d of x (flat, of shape).
local function ref_slice (x, shape, d, lo, len)
  local ys = table.move(shape, 1, #shape, 1, {})
  ys[d] = len
  local y = {}
  for k, idx in ipairs(indices(ys)) do
    local xi = table.move(idx, 1, #idx, 1, {})
    xi[d] = xi[d] + lo
    y[k] = x[offset(shape, xi) + 1]
  end
  return y
end

TestShapeOps = {tearDown = H.no_capture_left}

function TestShapeOps:test_reshape_is_a_view ()
  local x = gc.tensor(H.nest(H.values(24), {2, 3, 4}))
  local y = x:reshape{4, 6}
  lu.assertEquals(y:shape(), {4, 6})
  lu.assertEquals(y:data_ptr(), x:data_ptr())
  lu.assertEquals(H.flat(y:tolist()), H.flat(x:tolist()))
  lu.assertEquals(x:reshape{-1, 3, 2}:shape(), {4, 3, 2})
  lu.assertEquals(x:reshape{2, -1}:shape(), {2, 12})
  H.assert_err(function () return x:reshape{5, -1} end,
               HERE, "reshape: no size for entry #2 makes 24 elements")
  H.assert_err(function () return x:reshape{-1, -1} end,
               HERE, "reshape: entries #1 and #2 are both -1 (one may be)")
  H.assert_err(function () return x:reshape{-2, 12} end,
               HERE, "reshape: shape entry #1 must be a non-negative integer or -1, got -2")
  H.assert_err(function () return x:reshape{5, 5} end,
               HERE, "view: cannot view a tensor of shape [2, 3, 4] (24 elements) with 25 elements")
end

function TestShapeOps:test_transpose_and_permute_values_and_grads ()
  local shape = {2, 3, 4, 5}
  local n = 2 * 3 * 4 * 5
  for _, perm in ipairs{{1, 2, 4, 3}, {4, 3, 2, 1}, {2, 4, 1, 3}, {1, 2, 3, 4}} do
    H.gradcheck("permute " .. table.concat(perm, ","), {{shape, H.values(n, 0.1)}},
                function (x) return x:permute(table.unpack(perm)) end,
                function (x) return (ref_permute(x, shape, perm)) end)
  end
  H.gradcheck("transpose(-1, -2) 3-D", {{{3, 4, 5}, H.values(60, 0.2)}},
              function (x) return x:transpose(-1, -2) end,
              function (x) return (ref_permute(x, {3, 4, 5}, {1, 3, 2})) end)
  H.gradcheck("transpose(1, 2) 2-D", {{{3, 7}, H.values(21, 0.3)}},
              function (x) return x:transpose(1, 2) end,
              function (x) return (ref_permute(x, {3, 7}, {2, 1})) end)
  local y = gc.zeros{2, 3, 4}:permute(3, 1, 2)
  lu.assertEquals(y:shape(), {4, 2, 3})
end

function TestShapeOps:test_split_chunk_cat_values_and_grads ()
  local shape = {2, 7, 3}
  local n = 2 * 7 * 3
  -- split into 3 + 3 + 1 along dim 2; every piece weighs in the loss
  H.gradcheck("cat(split)", {{shape, H.values(n, 0.4)}},
              function (x)
                local p = gc.split(x, 3, 2)
                lu.assertEquals(#p, 3)
                lu.assertEquals(p[3]:shape(), {2, 1, 3})
                return gc.cat({p[3] * 2, p[1], p[2] * -1}, 2)
              end,
              function (x)
                local a, b, c = ref_slice(x, shape, 2, 0, 3), ref_slice(x, shape, 2, 3, 3),
                                ref_slice(x, shape, 2, 6, 1)
                local y = {}  -- cat along dim 2 of [2,1,3], [2,3,3], [2,3,3]
                for o = 0, 1 do
                  for j = 0, 6 do
                    for i = 0, 2 do
                      local v
                      if j < 1 then v = 2 * c[(o * 1 + j) * 3 + i + 1]
                      elseif j < 4 then v = a[(o * 3 + j - 1) * 3 + i + 1]
                      else v = -b[(o * 3 + j - 4) * 3 + i + 1] end
                      y[#y + 1] = v
                    end
                  end
                end
                return y
              end)
  -- a piece that is never used gets no grad and costs nothing
  H.gradcheck("chunk, last dim, one piece used", {{{4, 6}, H.values(24, 0.5)}},
              function (x)
                local p = gc.chunk(x, 3, -1)
                lu.assertEquals(#p, 3)
                return p[2]
              end,
              function (x) return ref_slice(x, {4, 6}, 2, 2, 2) end)
  -- chunk's sizes follow PyTorch: 5 entries in 3 chunks are 2 + 2 + 1; 4 in 3: 2 + 2
  local p = gc.chunk(gc.zeros{5}, 3)
  lu.assertEquals({#p, p[1]:shape()[1], p[3]:shape()[1]}, {3, 2, 1})
  lu.assertEquals(#gc.chunk(gc.zeros{4}, 3), 2)
  lu.assertEquals(#gc.split(gc.zeros{0, 2}, 2), 0)
  -- cat of inputs of which only some need grads
  local a = gc.tensor({{1, 2}}, {requires_grad = true})
  local b = gc.tensor({{3, 4}, {5, 6}})
  local c = gc.cat({a, b})
  lu.assertEquals(c:tolist(), {{1, 2}, {3, 4}, {5, 6}})
  c:sum():backward()
  lu.assertEquals(a.grad:tolist(), {{1, 1}})
  lu.assertNil(b.grad)
end

-- A forward and backward through every shape op, captured, replays to
-- what eager code computes, bit for bit, on new inputs too.
function TestShapeOps:test_capture_replays_equal_eager ()
  local x = gc.tensor(H.nest(H.values(2 * 4 * 6, 0.7), {2, 4, 6}), {requires_grad = true})
  local w = gc.tensor(H.nest(H.values(4 * 6 * 2, 1.1), {6, 4, 2}))
  local function loss ()
    local q, k = table.unpack(gc.chunk(x, 2, -1))          -- [2,4,3] each
    local t = gc.cat({q:transpose(1, 2), k:permute(2, 1, 3)}, 3):reshape{4, 2, 6}
    return (t:permute(3, 1, 2) * w):sum()
  end
  local l = loss()
  l:backward()
  local want_l, want_g = l:tolist(), x.grad:tolist()
  x.grad = nil
  local g, lg = gc.Graph(), nil
  g:capture(function () lg = loss(); lg:backward() end)
  g:replay()
  H.assert_bitwise(lg:tolist(), want_l, "loss")
  H.assert_bitwise(x.grad:tolist(), want_g, "grad")
  gc.no_grad(function () x:copy_(gc.tensor(H.nest(H.values(48, 2.3), {2, 4, 6}))) end)
  x.grad = nil
  l = loss()
  l:backward()
  want_l, want_g = l:tolist(), x.grad:tolist()
  g:replay()
  H.assert_bitwise(lg:tolist(), want_l, "loss on new inputs")
  H.assert_bitwise(x.grad:tolist(), want_g, "grad on new inputs")
end

function TestShapeOps:test_errors ()
  local x = gc.zeros{2, 3}
  H.assert_err(function () return x:transpose(1, 3) end,
               HERE, "transpose: dim 3 is out of range for a 2-D tensor (dims count from 1")
  H.assert_err(function () return x:transpose(0, 1) end, HERE, "transpose: dim 0 is out of range")
  H.assert_err(function () return x:permute(1) end,
               HERE, "permute: expected 2 dims for a 2-D tensor, got 1")
  H.assert_err(function () return x:permute(1, 1) end,
               HERE, "permute: dim 1 appears twice (arguments 1 and 2)")
  H.assert_err(function () return gc.split(x, 0, 2) end,
               HERE, "split: the size of a piece must be positive, got 0")
  H.assert_err(function () return gc.chunk(x, 0) end,
               HERE, "chunk: the number of chunks must be a positive int, got 0")
  H.assert_err(function () return gc.split(gc.tensor(1), 1) end,
               HERE, "split: a 0-D tensor has no dim to split")
  H.assert_err(function () return gc.cat({x, gc.zeros{2, 4}}) end,
               HERE, "cat: tensor 2 is f32 [2, 4], tensor 1 is f32 [2, 3]")
  H.assert_err(function () return gc.cat({x, gc.zeros({2, 3}, {dtype = "bf16"})}, 2) end,
               HERE, "cat: tensor 2 is bf16 [2, 3]")
  H.assert_err(function () return gc.cat({x, 3}) end,
               HERE, "cat: entry 2 of the sequence is a number, not a tensor")
  H.assert_err(function () return gc.cat({}) end,
               HERE, "cat: expected a sequence of 1 to 64 tensors, got 0 entries")
  -- after the errors, x is as it was and the ops still work
  lu.assertEquals(gc.cat({x, x}, 2):shape(), {2, 6})
end

-- regression: split's piece count overflowed; narrow's range errors overflowed
-- A split whose piece size is near math.maxinteger is one piece (the count
-- overflowed to none), and narrow's range errors speak of Lua's dims and
-- entries (from 1), whatever the start, without overflow.
function TestShapeOps:test_split_huge_size_and_narrow_ranges ()
  local x = gc.randn({2, 3})
  local p = gc.split(x, math.maxinteger)
  lu.assertEquals(#p, 1)
  lu.assertEquals(p[1]:tolist(), x:tolist())
  lu.assertEquals(#gc.split(x, math.maxinteger, 2), 1)
  local here = debug.getinfo(1, "S").short_src .. ":"
  local ok, e = pcall(gc.narrow, x, 2, 3, 2)
  lu.assertFalse(ok)
  lu.assertStrContains(e, "narrow: start 3 and length 2 do not fit dim 2 of size 3")
  for _, c in ipairs({{math.mininteger, 1}, {0, 1}, {math.maxinteger, 2}, {1, -1},
                      {2, math.maxinteger}}) do
    ok, e = pcall(function () return gc.narrow(x, 1, c[1], c[2]) end)
    lu.assertFalse(ok)
    lu.assertStrContains(e, here)
    lu.assertStrContains(e, ("narrow: start %d and length %d do not fit dim 1 of size 2"):format(c[1], c[2]))
  end
  lu.assertEquals(gc.narrow(x, 1, 2, 1):tolist(), {x:tolist()[2]})
end

os.exit(lu.LuaUnit.run(), true)
