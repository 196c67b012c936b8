-- test_errors.lua: every error is a Lua error, never a crash, and leaves the
-- engine usable. What capture forbids (docs/semantics.md, "Capture rules"); a
-- capture function that raises; wrong states; closed objects; bad arguments:
-- wrong types, negative, huge and 5-D shapes, ragged tables, shape mismatches.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_errors.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

-- The engine still works: eager ops, read-back, synchronize, a capture.
local function assert_usable ()
  lu.assertFalse(gc.is_capturing())
  local x = gc.tensor{1, 2, 3, 4}
  lu.assertEquals((x + x):tolist(), {2, 4, 6, 8})
  gc.synchronize()
  local g, y = gc.Graph(), nil
  g:capture(function () y = x * 5 end)
  g:replay()
  lu.assertEquals(y:tolist(), {5, 10, 15, 20})
end

-- pcall(fn, ...) must fail with a string message (not a crash, not nil).
local function assert_fails (fn, ...)
  local ok, err = pcall(fn, ...)
  lu.assertFalse(ok, "expected an error")
  lu.assertEquals(type(err), "string")
  lu.assertTrue(#err > 0)
  return err
end

-- Every case fails with a string message: f() for each function f of cases,
-- or fn(v) for each value v when fn is given.
local function assert_all_fail (cases, fn)
  for i, c in ipairs(cases) do
    local ok, err
    if fn then ok, err = pcall(fn, c) else ok, err = pcall(c) end
    lu.assertFalse(ok, "case " .. i .. " did not fail")
    lu.assertEquals(type(err), "string", "case " .. i)
  end
end

-- {name, action(ctx)}: each is forbidden inside a capture.
-- ctx = {x = eager tensor, s2 = a stream not forked in, ev = an event
-- recorded on the default stream before the capture, y = made in capture}.
local FORBIDDEN = {
  {"synchronize", function () gc.synchronize() end},
  {"stream_synchronize", function () gc.current_stream():synchronize() end},
  {"other_stream_synchronize", function (c) c.s2:synchronize() end},
  {"event_synchronize", function (c) c.ev:synchronize() end},
  {"tolist", function (c) return c.x:tolist() end},
  {"tolist_captured", function (c) return c.y:tolist() end},
  {"item", function (c) return c.y:sum():item() end},
  {"tensor_from_data", function () return gc.tensor{1, 2, 3} end},
  {"unforked_stream", function (c) gc.with_stream(c.s2, function () c.x:fill_(9) end) end},
  {"alloc_outside_pool", function ()
    gc.with_stream(gc.default_stream(), function () return gc.empty{16} end)
  end},
  {"manual_seed", function () gc.manual_seed(3) end},
}

-- The action raises a capture error out of the capture function, the
-- capture ends, nothing is captured; caught inside the function instead,
-- the capture stays invalidated and g:capture still fails; then the engine,
-- the graph and the pool work again.
local function check_forbidden (action)
  local c = {x = gc.tensor{1, 2, 3, 4}, s2 = gc.Stream(), ev = gc.Event()}
  c.ev:record()
  local p = gc.graph_pool_handle()
  local g = gc.Graph()
  lu.assertErrorMsgContains("capture", g.capture, g, function ()
    c.y = c.x * 2
    action(c)
  end, {pool = p})
  lu.assertFalse(gc.is_capturing())
  lu.assertEquals(p:stats().graphs, 0)
  lu.assertErrorMsgContains("captur", g.replay, g)
  local caught
  lu.assertErrorMsgContains("capture", g.capture, g, function ()
    c.y = c.x * 2
    caught = not pcall(action, c)
  end, {pool = p})
  lu.assertTrue(caught)
  lu.assertFalse(gc.is_capturing())
  -- Eager, everything is allowed again.
  lu.assertEquals(c.x:tolist(), {1, 2, 3, 4})
  gc.synchronize()
  c.s2:synchronize()
  c.ev:synchronize()
  gc.manual_seed(1)
  gc.with_stream(c.s2, function () c.x:fill_(2) end)
  c.s2:synchronize()
  lu.assertEquals(gc.tensor{1}:item(), 1)
  local y
  g:capture(function () y = c.x * 5 end, {pool = p})
  g:replay()
  lu.assertEquals(y:tolist(), {10, 10, 10, 10})
  lu.assertEquals(p:stats().graphs, 1)
  assert_usable()
end

TestForbiddenInCapture = {tearDown = H.no_capture_left}

for _, case in ipairs(FORBIDDEN) do
  TestForbiddenInCapture["test_" .. case[1]] = function () check_forbidden(case[2]) end
end

TestCaptureErrors = {tearDown = H.no_capture_left}

-- A capture function that raises halfway: the capture is ended, the pool
-- stays consistent, and the error reaches the caller as raised.
function TestCaptureErrors:test_error_in_capture_fn ()
  local x = gc.ones{256}
  local p = gc.graph_pool_handle()
  local g = gc.Graph()
  collectgarbage()
  local before = p:stats()
  local function deep_failure () error("boom 42") end
  lu.assertErrorMsgContains("boom 42", g.capture, g, function ()
    local y = x * 2
    deep_failure()
    return y
  end, {pool = p})
  local _, err = pcall(g.capture, g, function () local _ = x + 1; deep_failure() end, {pool = p})
  lu.assertStrContains(err, "boom 42")
  lu.assertStrContains(err, "test_errors.lua:")  -- where deep_failure raised it
  lu.assertNotStrContains(err, "traceback")      -- the interpreter adds the one traceback
  lu.assertFalse(gc.is_capturing())
  lu.assertErrorMsgContains("captur", g.replay, g)
  collectgarbage(); collectgarbage()
  local after = p:stats()
  lu.assertEquals(after.graphs, 0)
  lu.assertEquals(after.in_use_bytes, before.in_use_bytes)
  lu.assertEquals(after.blocks, before.blocks)
  local y                                       -- the same graph and pool again
  g:capture(function () y = x * 3 end, {pool = p})
  g:replay()
  lu.assertEquals(y:sum():item(), 768)
  lu.assertEquals(p:stats().graphs, 1)
  assert_usable()
end

-- An engine error inside the capture function (a shape mismatch) is raised
-- like any other error; the capture ends cleanly.
function TestCaptureErrors:test_engine_error_in_capture_fn ()
  local a, b = gc.ones{2, 3}, gc.ones{3, 2}
  local g = gc.Graph()
  assert_fails(g.capture, g, function () return a + b end)
  lu.assertFalse(gc.is_capturing())
  local y
  g:capture(function () y = a * 4 end)
  g:replay()
  lu.assertEquals(y:tolist(), {{4, 4, 4}, {4, 4, 4}})
end

function TestCaptureErrors:test_capture_while_capturing ()
  local x = gc.tensor{1, 2, 3, 4}
  local g, g2, y = gc.Graph(), gc.Graph(), nil
  local ok, err
  g:capture(function ()
    ok, err = pcall(g2.capture, g2, function () end)
    y = x * 2                                   -- the open capture goes on
  end)
  lu.assertFalse(ok)
  lu.assertStrContains(tostring(err), "captur")
  g:replay()
  lu.assertEquals(y:tolist(), {2, 4, 6, 8})
  lu.assertErrorMsgContains("captur", g.capture, g, function () end) -- g is not empty
  g:replay()
  local y2
  g2:capture(function () y2 = x * 3 end)        -- g2 was never disturbed
  g2:replay()
  lu.assertEquals(y2:tolist(), {3, 6, 9, 12})
end

function TestCaptureErrors:test_replay_never_captured ()
  local g = gc.Graph()
  lu.assertErrorMsgContains("captur", g.replay, g)
  lu.assertErrorMsgContains("captur", g.replay, g)
  assert_usable()
end

function TestCaptureErrors:test_replay_after_reset ()
  local x = gc.ones{4}
  local g, y = gc.Graph(), nil
  g:capture(function () y = x * 2 end)
  g:replay()
  g:reset()
  lu.assertErrorMsgContains("captur", g.replay, g)
  lu.assertEquals(y:tolist(), {2, 2, 2, 2})
  assert_usable()
end

TestClosed = {tearDown = H.no_capture_left}

function TestClosed:test_tensor ()
  local t, u = gc.ones{2, 2}, gc.ones{2, 2}
  t:close()
  for _, f in ipairs{
    function () return t:sum() end, function () return t:mean() end,
    function () return t + 1 end, function () return 1 - t end, function () return -t end,
    function () return u * t end, function () return t:tolist() end,
    function () return t:item() end, function () return t:shape() end,
    function () return t:numel() end, function () return t:clone() end,
    function () return t:view{4} end, function () return t:fill_(1) end,
    function () return t:zero_() end, function () return t:copy_(u) end,
    function () return u:copy_(t) end, function () return t:data_ptr() end,
  } do
    lu.assertErrorMsgContains("closed", f)
  end
  t:close()
  lu.assertEquals(u:sum():item(), 4)
end

function TestClosed:test_tensor_in_capture ()
  local t = gc.ones{4}
  t:close()
  local g = gc.Graph()
  lu.assertErrorMsgContains("closed", g.capture, g, function () return t * 2 end)
  assert_usable()
end

function TestClosed:test_graph ()
  local g = gc.Graph()
  g:capture(function () local _ = gc.ones{4} * 2 end)
  g:close()
  lu.assertErrorMsgContains("closed", g.replay, g)
  lu.assertErrorMsgContains("closed", g.reset, g)
  lu.assertErrorMsgContains("closed", g.stats, g)
  lu.assertErrorMsgContains("closed", g.capture, g, function () end)
  g:close()
  assert_usable()
end

function TestClosed:test_pool ()
  local p = gc.graph_pool_handle()
  p:close()
  lu.assertErrorMsgContains("closed", p.stats, p)
  local g = gc.Graph()
  lu.assertErrorMsgContains("closed", g.capture, g, function () end, {pool = p})
  lu.assertFalse(gc.is_capturing())
  p:close()
  assert_usable()
end

-- regression: a closed tensor given to a module or entry was 'bad argument #2 to ?'
-- A closed tensor passed to a module or to a graphed entry is an error
-- naming the module (or entry) and the argument's position as the user
-- counts it, at the user's line; it was "bad argument #2 to '?'" (self
-- counted, no name) or named a line of graphed.lua.
function TestClosed:test_closed_tensor_argument_of_a_call ()
  local c = gc.randn({2, 3})
  c:close()
  local M = gc.nn.Module("Two")
  function M:forward (x) return x * 2, x end
  local lin, two = gc.nn.Linear(3, 3), M()
  local here = "test_errors.lua:"
  for _, m in ipairs{lin, two} do
    local msg = H.assert_err(function () local y = m(gc.randn({2, 3}), c); return y end,
                             m:type() .. ": argument #2 is a closed tensor")
    lu.assertStrContains(msg, here)
  end
  gc.make_graphed_callables(lin, {gc.randn({2, 3}, {requires_grad = true})}, {num_warmup_iters = 1})
  H.assert_err(function () local y = lin(c); return y end, "Linear: argument #1 is a closed tensor",
               here)
  local f = gc.make_graphed_callables(function (x) return x * 2, x * 3 end,
                                      {gc.randn({2, 3}, {requires_grad = true})},
                                      {num_warmup_iters = 1})
  H.assert_err(function () local y = f(c); return y end,
               "graphed call of entry 1: argument #1 is a closed tensor", here)
  local _, b = f(gc.ones({2, 3}))
  lu.assertEquals(b:tolist(), {{3, 3, 3}, {3, 3, 3}})
  lu.assertEquals(lin(gc.ones({2, 3})):shape(), {2, 3})
end

-- regression: a closed tensor in a sequence was 'bad argument #-1'
-- A closed tensor in a sequence (cat's tensors, a kernel launch's args,
-- reads or writes) was reported as "bad argument #-1": the error names
-- the entry now, and the call can be made again once it is replaced.
function TestClosed:test_closed_tensor_in_a_sequence_names_the_entry ()
  local here = debug.getinfo(1, "S").short_src .. ":"
  local a, z = gc.randn({2, 3}), gc.randn({2, 3})
  z:close()
  local ok, e = pcall(function () return gc.cat({a, z}) end)
  lu.assertFalse(ok)
  lu.assertStrContains(e, here)
  lu.assertStrContains(e, "cat: tensors[2] is a closed tensor")
  lu.assertEquals(gc.cat({a, a}):shape(), {4, 3})
  local SRC = [[
extern "C" __global__ void copy1(const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}
]]
  local k
  ok, k = pcall(gc.cuda.kernel, SRC, "copy1",
                {host = function (x, y, n) y:view({n}):copy_(x:view({n})) end})
  if not ok and tostring(k):find("NVRTC is not available", 1, true) then
    lu.skip("no NVRTC here")
  end
  assert(ok, k)
  local y = gc.zeros({2, 3})
  ok, e = pcall(function () k:launch{grid = 1, block = 6, args = {z, y, 6}, writes = {y}} end)
  lu.assertFalse(ok)
  lu.assertStrContains(e, here)
  lu.assertStrContains(e, "kernel launch: args[1] is a closed tensor")
  ok, e = pcall(function () k:launch{grid = 1, block = 6, args = {a, y, 6}, reads = {a, z},
                                     writes = {y}} end)
  lu.assertFalse(ok)
  lu.assertStrContains(e, "kernel launch: reads[2] is a closed tensor")
  lu.assertEquals(y:tolist(), gc.zeros({2, 3}):tolist())
  k:launch{grid = 1, block = 6, args = {a, y, 6}, writes = {y}}
  lu.assertEquals(y:tolist(), a:tolist())
end

TestBadInput = {tearDown = H.no_capture_left}

function TestBadInput:test_wrong_types ()
  local x = gc.ones{2, 3}
  local g, s = gc.Graph(), gc.Stream()
  local cases = {
    function () return gc.zeros("abc") end,
    function () return gc.zeros() end,
    function () return gc.zeros{2, "x"} end,
    function () return gc.zeros{2.5} end,
    function () return gc.ones{true} end,
    function () return gc.full({2}, "x") end,
    function () return gc.full({2}, {}) end,
    function () return gc.rand(7, {7}) end,  -- sizes then a table of sizes
    function () return gc.tensor("str") end,
    function () return gc.tensor(true) end,
    function () return gc.tensor() end,
    function () return gc.tensor{1, "a"} end,
    function () return gc.tensor{{1, 2}, {3, {}}} end,
    function () return gc.zeros({2}, {dtype = "f64"}) end,
    function () return x + "str" end,
    function () return "str" * x end,
    function () return x + {} end,
    function () return x - true end,
    function () return x * g end,
    function () return x:fill_("x") end,
    function () return x:view("x") end,
    function () return x:view{2, "a"} end,
    function () return x:copy_(5) end,
    function () return x:copy_(g) end,
    function () return x.sum(g) end,
    function () return g.replay(x) end,
    function () return g:capture(42) end,
    function () return g:capture(function () end, 42) end,
    function () return g:capture(function () end, {pool = 42}) end,
    function () return g:capture(function () end, {stream = x}) end,
    function () return gc.with_stream(42, function () end) end,
    function () return gc.Event():record(42) end,
    function () return s:wait_event(x) end,
    function () return gc.manual_seed("seed") end,
  }
  assert_all_fail(cases)
  assert_usable()
end

function TestBadInput:test_bad_shapes ()
  local huge = 1 << 40
  local cases = {
    function () return gc.zeros{-1} end,
    function () return gc.zeros{2, -3} end,
    function () return gc.empty{huge, huge} end,              -- numel overflows
    function () return gc.ones{1 << 31, 1 << 31, 1 << 31} end,
    function () return gc.empty{math.maxinteger} end,         -- bytes overflow
    function () return gc.zeros{1 / 0} end,
    function () return gc.zeros{0 / 0} end,
    function () return gc.zeros{1, 1, 1, 1, 1} end,           -- 5-D
    function () return gc.rand{1, 2, 1, 2, 1} end,
    function () return gc.tensor{{{{{1}}}}} end,
    function () return gc.ones{4}:view{1, 1, 1, 1, 4} end,
    function () return gc.ones{4}:view{-2, -2} end,
    function () return gc.ones{6}:view{4} end,
  }
  assert_all_fail(cases)
  assert_usable()
end

function TestBadInput:test_ragged_tables ()
  local cases = {
    {{1, 2}, {3}},
    {1, {2}},
    {{1}, 2},
    {{{1, 2}, {3, 4}}, {{5, 6}}},
    {{{1, 2}, {3, 4}}, {{5, 6}, {7}}},
    {{}, {1}},
  }
  assert_all_fail(cases, gc.tensor)
  assert_usable()
end

function TestBadInput:test_shape_mismatch ()
  local a = gc.ones{2, 3}
  local cases = {
    function () return a + gc.ones{3, 2} end,       -- same numel, other shape
    function () return a - gc.ones{2} end,          -- a row of the wrong length
    function () return gc.ones{2} * a end,
    function () return a * gc.ones{6} end,          -- numel 6, not a row of a
    function () return gc.ones{6} + a end,
    function () return a + gc.ones{2, 3, 1} end,
    function () return a:copy_(gc.ones{5}) end,     -- numel differs
    function () return a:view{4} end,
    function () return a:item() end,
  }
  for i, f in ipairs(cases) do
    assert_fails(f)
    lu.assertEquals(a:sum():item(), 6, "case " .. i .. " wrote into a")
  end
  assert_usable()
end

-- regression: sum/mean ignored a dim; options and a closed pool were named wrongly
-- Found by reading the docs against the tree: a dim given to sum/mean was
-- ignored; an integer num_layers_per_chunk without order, an option of the
-- wrong type and a closed pool passed through Graph:capture were named in
-- the wrong words or at the facade's line.
function TestBadInput:test_docs_review_findings ()
  local here = debug.getinfo(1, "S").short_src .. ":"
  local msg = H.assert_err(function () return gc.ones({2, 3}):sum(1) end,
                           "sum: reduces every element", "a dim argument is not supported")
  lu.assertStrContains(msg, here)
  H.assert_err(function () return gc.ones({2, 3}):mean(2) end, "mean: reduces every element")
  lu.assertEquals(gc.ones({2, 3}):sum():item(), 6)
  H.assert_err(function ()
    gc.make_graphed_callables(gc.nn.Linear(2, 2), {gc.randn({1, 2})}, {num_layers_per_chunk = 1})
  end, "num_layers_per_chunk needs order")
  H.assert_err(function ()
    gc.make_graphed_callables(gc.nn.Linear(2, 2), {gc.randn({1, 2})}, {num_warmup_iters = "x"})
  end, "option num_warmup_iters must be an integer, got string")
  local p = gc.graph_pool_handle()
  p:close()
  msg = H.assert_err(function () gc.Graph():capture(function () end, {pool = p}) end,
                     "pool is closed")
  lu.assertStrContains(msg, here)
end

-- regression: zeros, ones and rand of a too large shape were refused as 'full'
-- gc.zeros and gc.ones of a shape too large were refused under the name 'full' (the engine
-- call they share); the binding's own limit said 'shape has too many elements'.
function TestBadInput:test_too_large_shape_names_the_constructor ()
  for _, name in ipairs({"zeros", "ones", "empty", "rand"}) do
    H.assert_err(function () gc[name]({1 << 30, 1 << 20}) end,
                 name .. ": shape is too large (more than 2^40 elements)")
  end
  H.assert_err(function () gc.full({1 << 40, 2}, 3) end, "full: shape is too large")
  lu.assertEquals(gc.zeros({2, 3}):shape(), {2, 3})
end

-- A facade call reached by a tail call names the line of that call: Lua
-- reuses the frame of a function that tail-calls a Lua function, and the
-- errors named the caller's caller. Constructors, functions of gc, Lua
-- methods of tensors and modules, graphed entries.
local function tail_linear () return gc.nn.Linear(0, 2) end
local function tail_zeros () return gc.zeros({2}, {dtype = "f64"}) end
local function tail_backward (t) return t:backward() end
local function tail_zero_grad (m) return m:zero_grad({set_to_none = 1}) end
local function tail_entry (f) return f(gc.ones({3})) end

function TestBadInput:test_tail_calls_name_their_line ()
  local src = debug.getinfo(1, "S").short_src
  local function line_of (f) return src .. ":" .. debug.getinfo(f, "S").linedefined .. ":" end
  local f = gc.make_graphed_callables(function (x) return x * 2 end, {gc.ones({2})})
  local cases = {
    {function () local m = tail_linear(); return m end, tail_linear,
     "Linear: in and out features must be positive"},
    {function () local t = tail_zeros(); return t end, tail_zeros, "dtype"},
    {function () tail_backward(gc.ones({2})) end, tail_backward, "does not require grad"},
    {function () tail_zero_grad(gc.nn.Linear(2, 2)) end, tail_zero_grad, "set_to_none"},
    {function () local y = tail_entry(f); return y end, tail_entry, "[3]"},
  }
  for i, c in ipairs(cases) do
    local msg = H.assert_err(c[1], c[3])
    lu.assertEquals(msg:sub(1, #line_of(c[2])), line_of(c[2]), "case " .. i .. ": " .. msg)
  end
end

-- t.backward() (a dot) passes no tensor: the error names the user's line
-- (it named the facade's, graphcap:98) and says how to call it; the same for
-- a Lua method of a module called so.
function TestBadInput:test_dot_call_of_backward ()
  local here = debug.getinfo(1, "S").short_src .. ":"
  local x = gc.ones({2}, {requires_grad = true})
  local loss = x:sum()
  local msg = H.assert_err(function () loss.backward() end,
                           "backward: call it as t:backward(), got a nil for t")
  lu.assertEquals(msg:sub(1, #here), here)
  msg = H.assert_err(function () gc.nn.Linear(2, 2).zero_grad() end,
                     "bad argument #1 to 'zero_grad' (graphcap.Module expected, got nil)")
  lu.assertEquals(msg:sub(1, #here), here)
  loss:backward()
  lu.assertEquals(x.grad:tolist(), {1, 1})
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
