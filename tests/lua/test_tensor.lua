-- test_tensor.lua: tensors outside capture (docs/lua-api.md, "Tensors"): shapes
-- 0-D to 4-D, tolist/tensor round trips, item, broadcasting, sum/mean, clone,
-- copy_, zero_, fill_, data_ptr identity, random numbers, close, memory
-- statistics.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_tensor.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local flat = H.flat

-- x rounded to the nearest f32, as a tensor stores it.
local function f32 (x) return (string.unpack("<f", string.pack("<f", x))) end

-- A nested table of the given shape whose entries are f(i), i = 0, 1, ...
-- in row-major order (a number for the empty shape).
local function nested (shape, f) return H.nest(f, shape) end

local SHAPE4 = {2, 3, 4, 5}

local function prefix (n)
  return table.move(SHAPE4, 1, n, 1, {})
end

TestTensor = {}

function TestTensor:tearDown ()
  collectgarbage("restart")
  lu.assertFalse(gc.is_capturing())
end

function TestTensor:test_device ()
  local d = gc.device()
  lu.assertTrue(d == "host" or d == "cuda", tostring(d))
  local want = os.getenv("GRAPHCAP_DEVICE")
  if want ~= nil and want ~= "" then lu.assertEquals(d, want) end
end

function TestTensor:test_shapes_0d_to_4d ()
  for nd = 0, 4 do
    local shape = prefix(nd)
    local numel = 1
    for _, n in ipairs(shape) do numel = numel * n end
    for _, t in ipairs{gc.zeros(shape), gc.ones(shape), gc.full(shape, 2.5),
                       gc.empty(shape), gc.rand(shape), gc.randn(shape)} do
      lu.assertEquals(t:shape(), shape)
      lu.assertEquals(t:dim(), nd)
      lu.assertEquals(t:numel(), numel)
      lu.assertEquals(t:dtype(), "f32")
    end
    local v = gc.full(shape, 2.5):tolist()
    if nd == 0 then
      lu.assertEquals(v, 2.5)
    else
      lu.assertEquals(type(v), "table")
      lu.assertEquals(#v, shape[1])
    end
    local all = flat(v)
    lu.assertEquals(#all, numel)
    for _, x in ipairs(all) do lu.assertEquals(x, 2.5) end
    lu.assertEquals(#flat(gc.zeros(shape):tolist()), numel)
    lu.assertEquals(flat(gc.ones(shape):tolist())[numel], 1)
  end
end

function TestTensor:test_tolist_roundtrip ()
  for nd = 1, 4 do
    local shape = prefix(nd)
    local src = nested(shape, function (i) return i * 0.1 - 3 end)
    local t = gc.tensor(src)
    lu.assertEquals(t:shape(), shape)
    local want = nested(shape, function (i) return f32(i * 0.1 - 3) end)
    lu.assertEquals(t:tolist(), want)                 -- outermost dimension first
    local u = gc.tensor(t:tolist())                   -- rebuilds t exactly
    lu.assertEquals(u:shape(), shape)
    lu.assertEquals(u:tolist(), want)
  end
  local s = gc.tensor(0.1)                            -- a number: 0-D
  lu.assertEquals(s:dim(), 0)
  lu.assertEquals(s:shape(), {})
  lu.assertEquals(s:tolist(), f32(0.1))
  lu.assertEquals(gc.tensor(s:tolist()):item(), f32(0.1))
  lu.assertEquals(gc.tensor({1, 2}, {dtype = "f32"}):dtype(), "f32")
end

function TestTensor:test_zero_size ()
  local a, b = gc.zeros{0}, gc.ones{2, 0}
  lu.assertEquals(a:numel(), 0)
  lu.assertEquals(a:shape(), {0})
  lu.assertEquals(a:tolist(), {})
  lu.assertEquals(b:tolist(), {{}, {}})
  lu.assertEquals(b:sum():item(), 0)
  lu.assertEquals((b + b):shape(), {2, 0})
end

function TestTensor:test_item ()
  lu.assertEquals(gc.tensor(-1.5):item(), -1.5)
  lu.assertEquals(gc.tensor{4}:item(), 4)
  lu.assertEquals(gc.tensor{{{7}}}:item(), 7)
  lu.assertEquals(gc.full({1, 1, 1, 1}, 3):item(), 3)
  lu.assertError(function () return gc.tensor{1, 2}:item() end)
  lu.assertError(function () return gc.zeros{0}:item() end)
end

function TestTensor:test_elementwise_and_scalars ()
  local a = gc.tensor{{1, 2, 3}, {4, 5, 6}}
  local b = gc.tensor{{6, -5, 4}, {-3, 2, -1}}
  lu.assertEquals((a + b):tolist(), {{7, -3, 7}, {1, 7, 5}})
  lu.assertEquals((a - b):tolist(), {{-5, 7, -1}, {7, 3, 7}})
  lu.assertEquals((a * b):tolist(), {{6, -10, 12}, {-12, 10, -6}})
  lu.assertEquals((-b):tolist(), {{-6, 5, -4}, {3, -2, 1}})
  lu.assertEquals((a + 1):tolist(), {{2, 3, 4}, {5, 6, 7}})
  lu.assertEquals((10 - a):tolist(), {{9, 8, 7}, {6, 5, 4}})
  lu.assertEquals((a - 0.5):tolist(), {{0.5, 1.5, 2.5}, {3.5, 4.5, 5.5}})
  lu.assertEquals((a * 0.5):tolist(), {{0.5, 1, 1.5}, {2, 2.5, 3}})
  lu.assertEquals((2 * a):tolist(), {{2, 4, 6}, {8, 10, 12}})
  lu.assertEquals((a * 0.1):tolist()[1][1], f32(f32(1) * f32(0.1)))
end

-- docs/semantics.md, "Tensors, broadcasting and autograd": a 0-D or one-element
-- operand, or a trailing-dimension row, broadcast (either side); other
-- mismatches are errors (test_errors.lua).
function TestTensor:test_broadcast ()
  local m = gc.tensor{{1, 2, 3}, {4, 5, 6}}
  local row = gc.tensor{10, 20, 30}
  local r = m + gc.tensor(10)
  lu.assertEquals(r:shape(), {2, 3})
  lu.assertEquals(r:tolist(), {{11, 12, 13}, {14, 15, 16}})
  lu.assertEquals((gc.tensor(10) - m):tolist(), {{9, 8, 7}, {6, 5, 4}})
  lu.assertEquals((gc.tensor{100} - m):tolist(), {{99, 98, 97}, {96, 95, 94}})
  lu.assertEquals((m * gc.tensor{{1000}}):tolist(), {{1000, 2000, 3000}, {4000, 5000, 6000}})
  lu.assertEquals((m + row):tolist(), {{11, 22, 33}, {14, 25, 36}})
  lu.assertEquals((row - m):tolist(), {{9, 18, 27}, {6, 15, 24}})
  local m4 = gc.tensor(nested({2, 1, 2, 3}, function (i) return i + 1 end))
  local p = m4 * row
  lu.assertEquals(p:shape(), {2, 1, 2, 3})
  lu.assertEquals(flat(p:tolist()), {10, 40, 90, 40, 100, 180, 70, 160, 270, 100, 220, 360})
  local z = gc.tensor(3) * gc.tensor(4)
  lu.assertEquals(z:dim(), 0)
  lu.assertEquals(z:item(), 12)
  lu.assertEquals((gc.tensor{1} + gc.tensor{1, 2, 3, 4}):tolist(), {2, 3, 4, 5})
end

function TestTensor:test_sum_mean ()
  local v = {}
  for i = 1, 1000 do v[i] = (i % 2 == 1) and 1000 + i or 1000 - i end
  local x = gc.tensor(v):view{10, 100}
  local s, m = x:sum(), x:mean()
  lu.assertEquals(s:dim(), 0)
  lu.assertEquals(m:shape(), {})
  -- every partial sum is an integer below 2^24: exact in any order
  lu.assertEquals(s:item(), 999500)
  lu.assertAlmostEquals(m:item(), 999.5, 999.5 * 1e-6)
  lu.assertEquals(gc.ones(SHAPE4):sum():item(), 120)
  lu.assertEquals(gc.ones(SHAPE4):mean():item(), 1)
  lu.assertEquals(s:sum():item(), 999500)
  lu.assertEquals(gc.tensor{-2, 4}:mean():item(), 1)
end

function TestTensor:test_clone_copy_zero_fill ()
  local a = gc.tensor{{1, -2, 3}, {-4, 5, -6}}
  local c = a:clone()
  lu.assertEquals(c:tolist(), a:tolist())
  lu.assertEquals(c:shape(), {2, 3})
  local b = gc.empty{6}
  lu.assertIs(b:copy_(a), b)              -- in-place ops return self
  lu.assertEquals(b:tolist(), {1, -2, 3, -4, 5, -6})
  lu.assertIs(a:zero_(), a)
  lu.assertEquals(a:tolist(), {{0, 0, 0}, {0, 0, 0}})
  lu.assertEquals(b:tolist(), {1, -2, 3, -4, 5, -6})   -- a copy, not an alias
  lu.assertEquals(c:tolist(), {{1, -2, 3}, {-4, 5, -6}})
  lu.assertIs(a:fill_(-2.5), a)
  lu.assertEquals(a:tolist(), {{-2.5, -2.5, -2.5}, {-2.5, -2.5, -2.5}})
  a:copy_(c)
  lu.assertEquals(a:tolist(), {{1, -2, 3}, {-4, 5, -6}})
end

function TestTensor:test_data_ptr_identity ()
  local t = gc.tensor{{1, 2, 3}, {4, 5, 6}}
  local p = t:data_ptr()
  lu.assertEquals(t:data_ptr(), p)
  lu.assertEquals(p % 256, 0)                        -- blocks are 256-byte aligned
  local v = t:view{3, 2}
  lu.assertEquals(v:shape(), {3, 2})
  lu.assertEquals(v:data_ptr(), p)                   -- a view shares storage
  local c = t:clone()
  lu.assertNotEquals(c:data_ptr(), p)                -- a clone does not
  v:fill_(7)
  lu.assertEquals(t:tolist(), {{7, 7, 7}, {7, 7, 7}})
  lu.assertEquals(c:tolist(), {{1, 2, 3}, {4, 5, 6}})
  t:close()                                          -- the view keeps the storage
  lu.assertEquals(v:view{6}:tolist(), {7, 7, 7, 7, 7, 7})
  lu.assertEquals(v:data_ptr(), p)
end

function TestTensor:test_rand_reproducible ()
  gc.manual_seed(1234)
  local a = gc.rand{1000}:tolist()
  local b = gc.rand{1000}:tolist()
  gc.manual_seed(1234)
  local a2 = gc.rand{1000}:tolist()
  lu.assertEquals(a2, a)                             -- same seed, same numbers
  lu.assertNotEquals(b, a)                           -- the generator advances
  local sum = 0
  for _, x in ipairs(a) do
    lu.assertTrue(x >= 0 and x < 1, tostring(x))
    sum = sum + x
  end
  lu.assertAlmostEquals(sum / #a, 0.5, 0.05)

  gc.manual_seed(99)
  local n1 = gc.randn{4096}:tolist()
  gc.manual_seed(99)
  local n2 = gc.randn{4096}:tolist()
  lu.assertEquals(n2, n1)
  local m, v = 0, 0
  for _, x in ipairs(n1) do m = m + x end
  m = m / #n1
  for _, x in ipairs(n1) do v = v + (x - m) ^ 2 end
  v = v / #n1
  lu.assertAlmostEquals(m, 0, 0.1)
  lu.assertAlmostEquals(v, 1, 0.1)
  gc.manual_seed(100)
  lu.assertNotEquals(gc.randn{4096}:tolist(), n1)
  lu.assertEquals(gc.rand{2, 3, 4}:shape(), {2, 3, 4})
end

function TestTensor:test_close ()
  local t = gc.ones{3}
  t:close()
  lu.assertErrorMsgContains("closed", function () return t:sum() end)
  lu.assertErrorMsgContains("closed", function () return t:tolist() end)
  lu.assertErrorMsgContains("closed", function () return t + 1 end)
  t:close()                                           -- closing twice is fine
  local keep
  do
    local u <close> = gc.ones{2}
    keep = u
    lu.assertEquals(u:tolist(), {1, 1})
  end
  lu.assertErrorMsgContains("closed", function () return keep:numel() end)
end

function TestTensor:test_memory_stats ()
  collectgarbage()
  collectgarbage("stop")          -- no finalizer may free a tensor meanwhile
  local s0 = gc.memory_stats()
  for _, k in ipairs{"reserved_bytes", "in_use_bytes", "peak_bytes", "blocks"} do
    lu.assertEquals(type(s0[k]), "number", k)
  end
  local t = gc.empty{1000}
  local s1 = gc.memory_stats()
  lu.assertTrue(s1.in_use_bytes >= s0.in_use_bytes + 4000)
  lu.assertEquals(s1.blocks, s0.blocks + 1)
  lu.assertTrue(s1.reserved_bytes >= s1.in_use_bytes)
  lu.assertTrue(s1.peak_bytes >= s1.in_use_bytes)
  t:close()
  local s2 = gc.memory_stats()
  lu.assertEquals(s2.in_use_bytes, s0.in_use_bytes)
  lu.assertEquals(s2.blocks, s0.blocks)
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
