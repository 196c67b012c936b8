-- test_storage_ops.lua: t:set_ (a tensor moved onto another's storage),
-- the internal core._set_version (gc.fsdp's), gc.narrow and gc.reset_peak_memory_stats (docs/lua-api.md):
-- values, addresses, versions and errors; a failed call leaves the tensor
-- as it was.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_storage_ops.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local core = require "graphcap.core"

TestStorageOps = {}

function TestStorageOps:test_set_moves_onto_the_source_at_an_offset ()
  local src = gc.tensor({1, 2, 3, 4, 5, 6, 7, 8})
  local t = gc.zeros({2, 3})
  lu.assertIs(t:set_(src, 2), t)
  lu.assertEquals(t:shape(), {2, 3})
  lu.assertEquals(t:tolist(), {{3, 4, 5}, {6, 7, 8}})
  lu.assertEquals(t:data_ptr(), src:data_ptr() + 2 * 4)
  gc.no_grad(function () t:fill_(0) end)  -- writes src's elements, and its version
  lu.assertEquals(src:tolist(), {1, 2, 0, 0, 0, 0, 0, 0})
  lu.assertEquals(t._version, src._version)
  local u = gc.zeros({8})
  u:set_(src)
  lu.assertEquals(u:data_ptr(), src:data_ptr())
end

function TestStorageOps:test_set_frees_the_old_storage ()
  collectgarbage()
  local src = gc.zeros({1024})
  local t = gc.zeros({1024})
  local before = gc.memory_stats().in_use_bytes
  t:set_(src)
  lu.assertEquals(gc.memory_stats().in_use_bytes, before - 4096)
  local v = gc.zeros({4})
  local w = v:view({2, 2})  -- a view keeps the old storage
  v:set_(src, 4)
  lu.assertEquals(w:tolist(), {{0, 0}, {0, 0}})
  lu.assertNotEquals(w:data_ptr(), v:data_ptr())
end

function TestStorageOps:test_set_errors_leave_the_tensor ()
  local src, t = gc.zeros({8}), gc.ones({6})
  local at = t:data_ptr()
  lu.assertErrorMsgContains("set_: elements 4 .. 9 (counting from 0) of a source of 8 elements (the tensor has 6)",
                            function () t:set_(src, 4) end)
  lu.assertErrorMsgContains("set_: elements -1 .. 4", function () t:set_(src, -1) end)
  lu.assertErrorMsgContains("set_: the source is bf16, the tensor f32",
                            function () t:set_(gc.zeros({8}, {dtype = "bf16"})) end)
  lu.assertEquals(t:data_ptr(), at)
  lu.assertEquals(t:tolist(), {1, 1, 1, 1, 1, 1})
  local g = gc.Graph()
  lu.assertErrorMsgContains("set_ (moving a tensor onto other storage) is not allowed while a "
                            .. "capture is open", function ()
    g:capture(function () t:set_(src) end)
  end)
  lu.assertEquals(t:data_ptr(), at)
end

function TestStorageOps:test_set_version_restores_what_a_backward_saved ()
  local w = gc.ones({3}, {requires_grad = true})
  local p = gc.zeros({3})
  local x = gc.tensor({1, 2, 3}, {requires_grad = true})
  gc.no_grad(function () p:copy_(w) end)
  local v = p._version
  local y = (x * p):sum()
  gc.no_grad(function () p:copy_(w) end)  -- the same values written again
  lu.assertEquals(p._version, v + 1)
  core._set_version(p, v)
  y:backward()
  lu.assertEquals(x.grad:tolist(), {1, 1, 1})
  -- without it the check fails
  local z = (x * p):sum()
  gc.no_grad(function () p:copy_(w) end)
  lu.assertErrorMsgContains("modified by an inplace operation", function () z:backward() end)
  lu.assertErrorMsgContains("a version is not negative", function () core._set_version(p, -1) end)
  lu.assertNil(p._set_version, "not a method: no script hides a write with it")
end

function TestStorageOps:test_narrow ()
  local t = gc.tensor({{1, 2, 3, 4}, {5, 6, 7, 8}})
  lu.assertEquals(gc.narrow(t, 2, 2, 2):tolist(), {{2, 3}, {6, 7}})
  lu.assertEquals(gc.narrow(t, 1, 2, 1):tolist(), {{5, 6, 7, 8}})
  lu.assertEquals(gc.narrow(t, -1, 4, 1):tolist(), {{4}, {8}})
  lu.assertErrorMsgContains("narrow:", function () gc.narrow(t, 2, 4, 2) end)
  lu.assertErrorMsgContains("narrow:", function () gc.narrow(t, 3, 1, 1) end)
  lu.assertErrorMsgContains("narrow: a 0-D tensor",
                            function () gc.narrow(gc.full({}, 1), 1, 1, 1) end)
  -- its grad flows back into the entries it took
  local x = gc.tensor({1, 2, 3, 4}, {requires_grad = true})
  gc.narrow(x, 1, 2, 2):sum():backward()
  lu.assertEquals(x.grad:tolist(), {0, 1, 1, 0})
end

function TestStorageOps:test_reset_peak ()
  collectgarbage()
  do local _ = gc.zeros({4096}) end
  collectgarbage()
  local m = gc.memory_stats()
  lu.assertTrue(m.peak_bytes >= m.in_use_bytes + 4 * 4096)
  gc.reset_peak_memory_stats()
  lu.assertEquals(gc.memory_stats().peak_bytes, m.in_use_bytes)
  local small = gc.zeros({16})
  lu.assertEquals(gc.memory_stats().peak_bytes, gc.memory_stats().in_use_bytes)
  lu.assertNotNil(small)
end

os.exit(lu.LuaUnit.run(), true)
