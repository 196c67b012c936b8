-- test_regressions.lua: one test per defect found by trying to break the
-- engine (bad inputs, lifetimes, re-entrancy), each failing before its fix.
--   build/graphcap tests/lua/test_regressions.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = dofile(debug.getinfo(1, "S").source:match("^@?(.-)[^/\\]*$") .. "helpers.lua")

TestRegressions = {tearDown = H.no_capture_left}

-- A Linear graphed with a sample input that needs no grad, called on an
-- activation that does: backward gives that input no grad (as TE and
-- PyTorch: the static input needed none at capture), the layer's
-- parameters get theirs, and nothing crashes.
function TestRegressions:test_input_needing_grad_only_at_replay ()
  gc.manual_seed(3)
  local lin, pre = gc.nn.Linear(4, 3), gc.nn.Linear(4, 4)
  local g = gc.make_graphed_callables(lin, {gc.randn({2, 4})}, {num_warmup_iters = 1})
  local x = pre(gc.randn({2, 4}))
  local y = g(x)
  lu.assertTrue(y.requires_grad)
  y:sum():backward()
  lu.assertNotNil(lin.weight.grad)
  lu.assertNotNil(lin.bias.grad)
  lu.assertNil(pre.weight.grad)
  -- the eager layer's own grads: the weight grad of sum(x W^T + b) is 2 ones
  H.assert_same(lin.bias.grad:tolist(), {2, 2, 2}, "bias grad")
end

-- A Lua function of 9 tensor arguments is graphed, called and
-- backpropagated through; so is a module called with 9 tensors.
function TestRegressions:test_nine_tensor_arguments ()
  local function sum (...)
    local s = ...
    for i = 2, select("#", ...) do s = s + select(i, ...) end
    return s
  end
  local a = {}
  for i = 1, 9 do a[i] = gc.full({2}, i, {requires_grad = true}) end
  local g = gc.make_graphed_callables(sum, a, {num_warmup_iters = 1})
  local y = g(table.unpack(a))
  H.assert_same(y:tolist(), {45, 45}, "graphed sum")
  y:sum():backward()
  H.assert_same(a[9].grad:tolist(), {1, 1}, "grad of argument 9")
  local M = gc.nn.Module("Sum9")
  function M:forward (...) return sum(...) end
  local m = M()
  H.assert_same(m(table.unpack(a)):tolist(), {45, 45}, "module call")
  local seq = gc.nn.Linear(2, 2)
  H.assert_err(function () return seq(table.unpack(a)) end, "Linear")
end

-- A graphed callable called with a tensor of another shape (same element
-- count) is refused, naming the argument and both shapes.
function TestRegressions:test_graphed_call_new_shape ()
  local lin = gc.nn.Linear(3, 4)
  local g = gc.make_graphed_callables(lin, {gc.randn({2, 3})}, {num_warmup_iters = 1})
  local msg = H.assert_err(function () return g(gc.randn({3, 2})) end,
                           "argument #1", "[3, 2]", "[2, 3]", "Linear")
  lu.assertStrContains(msg, "test_regressions.lua:")
  H.assert_err(function () return g(gc.randn({6})) end, "[6]", "[2, 3]")
  lu.assertEquals(g(gc.randn({2, 3})):shape(), {2, 4})
end

-- A graph closed during its own capture ends it: by a <close> variable
-- when an error leaves a manual capture, and by g:close() inside
-- g:capture(fn). The engine is not left capturing; the next capture and
-- make_graphed_callables work.
function TestRegressions:test_graph_closed_during_its_capture ()
  local x = gc.full({4}, 2)
  local ok, err = pcall(function ()
    local g <close> = gc.Graph()
    g:capture_begin()
    local _ = x * 3
    error("boom")
  end)
  lu.assertFalse(ok)
  lu.assertStrContains(err, "boom")
  lu.assertFalse(gc.is_capturing())
  local g2 = gc.Graph()
  lu.assertError(function () return g2:capture(function () g2:close(); return x * 3 end) end)
  lu.assertFalse(gc.is_capturing())
  local g3 = gc.Graph()
  local y = g3:capture(function () return x * 3 end)
  g3:replay()
  H.assert_same(y:tolist(), {6, 6, 6, 6}, "a later capture")
  local m = gc.make_graphed_callables(gc.nn.Linear(4, 2), {gc.randn({1, 4})}, {num_warmup_iters = 1})
  lu.assertEquals(m(gc.randn({1, 4})):shape(), {1, 2})
end

-- A bias-free Linear with fuse_wgrad_accumulation, graphed with a data
-- input that needs no grad: the graphed output requires grad and main_grad
-- accumulates as it does eagerly (bitwise on one backend).
function TestRegressions:test_fused_wgrad_without_input_grad ()
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

-- 2,000 make_graphed_callables of a Lua function and of a Lua module keep
-- the ordinary allocator's reserved bytes flat (each used to strand the
-- 2 MiB segment of its warmup stream, held by a collectable tensor).
function TestRegressions:test_graphing_lua_callables_keeps_reserved_flat ()
  local x = gc.randn({2, 4})
  local M = gc.nn.Module("Twice")
  function M:forward (v) return v * 2 end
  local callables = {function (v) return v * 2 end, M()}
  local first
  for i = 1, 2000 do
    local g = gc.make_graphed_callables(callables[i % 2 + 1], {x}, {num_warmup_iters = 1})
    g(x)
    g = nil
    if i % 100 == 0 then
      collectgarbage()
      collectgarbage()
      local r = gc.memory_stats().reserved_bytes
      first = first or r
      lu.assertEquals(r, first, "reserved bytes after " .. i .. " graphings")
    end
  end
end

-- A tensor that outlives the stream it was made on gives its memory back
-- once it goes.
function TestRegressions:test_tensor_outliving_its_stream ()
  collectgarbage()
  local before = gc.memory_stats().reserved_bytes
  for _ = 1, 20 do
    local s = gc.Stream()
    local t = gc.with_stream(s, function () return gc.randn({1024}) end)
    s:close()
    lu.assertEquals(#t:tolist(), 1024)
    t:close()
  end
  lu.assertEquals(gc.memory_stats().reserved_bytes, before)
end

-- A failed make_graphed_callables of a Lua callable leaves the caller's
-- pool as before once the collector has the tensors the callable made.
function TestRegressions:test_failed_graphing_leaves_pool_as_before ()
  local pool = gc.graph_pool_handle()
  local before = pool:stats()
  local n = 0
  local function late (v)
    n = n + 1
    local y = v * 2
    if n == 2 then error("late failure") end
    return y
  end
  local ok, err = pcall(gc.make_graphed_callables, late, {gc.randn({2, 4})},
                        {num_warmup_iters = 1, pool = pool})
  lu.assertFalse(ok)
  lu.assertStrContains(tostring(err), "late failure")
  collectgarbage()
  collectgarbage()
  local after = pool:stats()
  lu.assertEquals(after.reserved_bytes, before.reserved_bytes)
  lu.assertEquals(after.in_use_bytes, before.in_use_bytes)
  lu.assertEquals(after.blocks, before.blocks)
  lu.assertEquals(after.graphs, 0)
end

-- cross_entropy refuses class ids that are not integers in 0..C-1.
function TestRegressions:test_cross_entropy_refuses_bad_targets ()
  local x = gc.randn({3, 4}, {requires_grad = true})
  for _, t in ipairs({{0, 1.5, 2}, {0, 0 / 0, 1}, {0, 4, 1}, {-1, 0, 1}}) do
    H.assert_err(function () return gc.F.cross_entropy(x, gc.tensor(t)) end,
                 "cross_entropy: the target of row ", "not a class id", "0..3")
  end
  local loss = gc.F.cross_entropy(x, gc.tensor({0, 3, 1}))
  loss:backward()
  lu.assertEquals(x.grad:shape(), {3, 4})
end

-- A tensor autograd saved, changed in place before backward: the backward
-- raises PyTorch's error (naming the op and the versions) instead of a
-- wrong gradient; copy_, zero_ and fill_ each bump the storage's version,
-- which views share.
function TestRegressions:test_inplace_change_of_saved_tensor ()
  local a = gc.tensor({{1, 2}, {3, 4}}, {requires_grad = true})
  for _, change in ipairs({function (t) t:fill_(3) end, function (t) t:zero_() end,
                           function (t) t:copy_(gc.ones({2, 2})) end}) do
    local h = a * 2
    local y = (h * h):sum()
    local v = h._version
    change(h)
    lu.assertEquals(h._version, v + 1)
    local msg = H.assert_err(function () y:backward() end,
                             "modified by an inplace operation", "'mul'", "version")
    lu.assertStrContains(msg, "test_regressions.lua:")
  end
  lu.assertNil(a.grad)
  local h = a * 2
  local y = (h * h):sum()
  y:backward()  -- untouched: 8 a
  H.assert_same(a.grad:tolist(), {{8, 16}, {24, 32}}, "grad")
  local w = gc.ones({2})
  local view = w:view({1, 2})
  view:fill_(2)
  lu.assertEquals(w._version, view._version)
end

-- Found by reading the docs against the tree: a dim given to sum/mean was
-- ignored; an integer num_layers_per_chunk without order, an option of the
-- wrong type and a closed pool passed through Graph:capture were named in
-- the wrong words or at the facade's line.
function TestRegressions:test_docs_review_findings ()
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

-- An in-place write through a view of a leaf that requires grad is refused,
-- as on the leaf itself (PyTorch's rule); under no_grad it goes through.
function TestRegressions:test_inplace_through_a_view_of_a_leaf ()
  local w = gc.ones({2, 2}, {requires_grad = true})
  H.assert_err(function () w:view({4}):fill_(5) end, "fill_: a leaf that requires grad, or a view of one,")
  H.assert_err(function () w:view({4}):view({2, 2}):zero_() end, "zero_:", "a view of one")
  lu.assertEquals(w:tolist(), {{1, 1}, {1, 1}})
  gc.no_grad(function () w:view({4}):fill_(3) end)
  lu.assertEquals(w:tolist(), {{3, 3}, {3, 3}})
end

-- A Function whose forward returns or saves a closed tensor, closes its
-- input, or whose backward returns a closed grad, is an error naming the
-- Function and the tensor's role, not an argument of an internal call; the
-- Function works afterwards.
function TestRegressions:test_function_closed_tensors ()
  local F = gc.autograd.Function("Cl")
  F.backward = function (_, g) return g * 2 end
  local function apply () return F.apply(gc.randn({2}, {requires_grad = true})) end
  F.forward = function (_, x) local y = x * 2; y:close(); return y end
  H.assert_err(apply, "Cl.forward returned a closed tensor")
  F.forward = function (_, x) local y = x * 2; x:close(); return y end
  H.assert_err(apply, "Cl: input #1 of forward was closed")
  F.forward = function (ctx, x) local z = x * 1; ctx:save_for_backward(z); z:close(); return x * 2 end
  H.assert_err(apply, "Cl: saved tensor #1 was closed")
  F.forward = function (_, x) return x * 2 end
  F.backward = function (_, g) local r = g * 2; r:close(); return r end
  local x = gc.randn({2}, {requires_grad = true})
  local msg = H.assert_err(function () F.apply(x):sum():backward() end,
                           "Cl.backward: grad #1 is a closed tensor")
  lu.assertStrContains(msg, "test_regressions.lua:")
  lu.assertNil(x.grad)
  F.backward = function (_, g) return g * 2 end
  F.apply(x):sum():backward()
  lu.assertEquals(x.grad:tolist(), {2, 2})
end

-- A closed tensor passed to a module or to a graphed entry is an error
-- naming the module (or entry) and the argument's position as the user
-- counts it, at the user's line; it was "bad argument #2 to '?'" (self
-- counted, no name) or named a line of graphed.lua.
function TestRegressions:test_closed_tensor_argument_of_a_call ()
  local c = gc.randn({2, 3})
  c:close()
  local M = gc.nn.Module("Two")
  function M:forward (x) return x * 2, x end
  local lin, two = gc.nn.Linear(3, 3), M()
  local here = "test_regressions.lua:"
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
  local a, b = f(gc.ones({2, 3}))
  lu.assertEquals(b:tolist(), {{3, 3, 3}, {3, 3, 3}})
  lu.assertEquals(lin(gc.ones({2, 3})):shape(), {2, 3})
end

-- A Function's backward that returns a grad for an argument that is not a
-- tensor (a number): the grad is dropped, as for any input that needs none;
-- it was checked against a shape the number never had ("the input is []
-- f32"), an error for any grad but a scalar one.
function TestRegressions:test_function_grad_for_a_number_argument ()
  local F = gc.autograd.Function("Scale")
  F.forward = function (_, s, x) return x * s end
  F.backward = function (_, g) return g, g * 3 end
  local x = gc.ones({2, 3}, {requires_grad = true})
  local y = F.apply(3, x)
  y:sum():backward()
  lu.assertEquals(x.grad:tolist(), {{3, 3, 3}, {3, 3, 3}})
  F.backward = function (_, g) return g:sum(), g * 3 end
  F.apply(3, x):sum():backward()
  lu.assertEquals(x.grad:tolist(), {{6, 6, 6}, {6, 6, 6}})
end

-- A hook that returns a table which is not a sequence (a map, or a
-- sequence with other keys) is an error naming the key; a map was taken as
-- no tensors ("Linear: expected 1 input, got 0") and other keys were
-- dropped without a word.
function TestRegressions:test_hook_returns_a_table_not_a_sequence ()
  local m = gc.nn.Linear(4, 3)
  local x = gc.randn({2, 4}, {requires_grad = true})
  local h = m:register_forward_pre_hook(function (_, a) return {a = a} end)
  H.assert_err(function () local y = m(x); return y end, "Linear: a forward pre-hook must return",
               "got a table that is not a sequence (key 'a')", "test_regressions.lua:")
  h:remove()
  h = m:register_full_backward_hook(function (_, gi) return {gi, extra = gi} end)
  H.assert_err(function () m(x):sum():backward() end, "Linear: a backward hook must return",
               "got a table that is not a sequence (key 'extra')")
  h:remove()
  lu.assertNil(x.grad)
  m(x):sum():backward()
  lu.assertEquals(x.grad:shape(), {2, 4})
end

-- A table given last to a graphed entry that was graphed without
-- sample_kwargs is an argument of the wrong type, not a kwargs map: an
-- extra {} was dropped without a word, and {x} in place of x was "expected
-- 1 tensor arguments, got 0".
function TestRegressions:test_graphed_entry_table_argument_without_kwargs ()
  local f = gc.make_graphed_callables(function (x) return x * 2, {x * 3} end,
                                      {gc.randn({2, 3}, {requires_grad = true})},
                                      {num_warmup_iters = 1})
  local x = gc.ones({2, 3})
  H.assert_err(function () local y = f(x, {}); return y end,
               "graphed call of entry 1: argument #2 must be a tensor, got table", "test_regressions.lua:")
  H.assert_err(function () local y = f({x}); return y end,
               "graphed call of entry 1: argument #1 must be a tensor, got table")
  local a, b = f(x)
  lu.assertEquals(b[1]:tolist(), {{3, 3, 3}, {3, 3, 3}})
end

-- ctx:save_for_backward outside its Function's forward (in backward, or on
-- a ctx kept after apply) is an error: it was accepted and never used.
function TestRegressions:test_save_for_backward_outside_forward ()
  local F = gc.autograd.Function("Late")
  local kept
  F.forward = function (ctx, x) kept = ctx; return x * 2 end
  F.backward = function (ctx, g) ctx:save_for_backward(g); return g * 2 end
  local x = gc.ones({2}, {requires_grad = true})
  local y = F.apply(x)
  H.assert_err(function () kept:save_for_backward(x) end,
               "save_for_backward: only inside Late.forward", "test_regressions.lua:")
  H.assert_err(function () y:sum():backward() end, "save_for_backward: only inside Late.forward")
  lu.assertNil(x.grad)
  F.backward = function (_, g) return g * 2 end
  F.apply(x):sum():backward()
  lu.assertEquals(x.grad:tolist(), {2, 2})
end

-- A Function's name is its node's grad_fn: one too long for the node (or
-- with a zero byte) is refused when the Function is made; it was cut short
-- in grad_fn and in the errors of its backward.
function TestRegressions:test_function_name_fits_its_node ()
  H.assert_err(function () gc.autograd.Function(string.rep("n", 64)) end,
               "autograd.Function: name must be 1 to 63 bytes without a zero byte, got 64 bytes",
               "test_regressions.lua:")
  H.assert_err(function () gc.autograd.Function("a\0b") end, "without a zero byte")
  H.assert_err(function () gc.autograd.Function("") end, "got 0 bytes")
  local name = string.rep("n", 63)
  local F = gc.autograd.Function(name)
  F.forward = function (_, x) return x * 2 end
  F.backward = function (_, g) return g * 2 end
  lu.assertEquals(F.apply(gc.ones({2}, {requires_grad = true})).grad_fn, name)
end

-- A Function applied to more arguments than its node takes (4096) is an
-- error naming the Function, at the caller's line; it was "bad argument #3
-- to '_fn_record' (out of range)" at a line of graphcap.autograd.
function TestRegressions:test_function_too_many_arguments ()
  local F = gc.autograd.Function("Many")
  F.forward = function (_, x) return x * 2 end
  F.backward = function (_, g) return g end
  local a = {gc.ones({2}, {requires_grad = true})}
  for i = 2, 4097 do a[i] = i end
  H.assert_err(function () local y = F.apply(table.unpack(a)); return y end,
               "Many.apply: 4097 arguments; at most 4096", "test_regressions.lua:")
  lu.assertEquals(F.apply(a[1]).grad_fn, "Many")
end

-- A graphed function that reaches a module through a closure: the graphed
-- backward gives grads to arguments and parameters only, so the closed-over
-- weight would get grads in warmup and never again (lost after zero_grad).
-- Refused, naming it; passing the module itself works.
function TestRegressions:test_closure_parameters_refused ()
  local lin = gc.nn.Linear(4, 4)
  local msg = H.assert_err(function ()
    gc.make_graphed_callables(function (a) return lin(a) end,
                              {gc.randn({2, 4}, {requires_grad = true})})
  end, "warmup forward of entry 1 (callable 1, function)", "neither an argument nor a parameter")
  lu.assertStrContains(msg, debug.getinfo(1, "S").short_src .. ":")
  lu.assertNil(lin.weight.grad)
  -- work on the closed-over module under no_grad has no grad to lose
  local G = gc.make_graphed_callables(function (a) return gc.no_grad(function () return lin(a) end) * a end,
                                      {gc.randn({2, 4}, {requires_grad = true})})
  lu.assertEquals(G(gc.ones({2, 4})):shape(), {2, 4})
  local g = gc.make_graphed_callables(lin, {gc.randn({2, 4}, {requires_grad = true})})
  g(gc.randn({2, 4})):sum():backward()
  lu.assertNotNil(lin.weight.grad)
end

-- gc.zeros and gc.ones of a shape too large were refused under the name 'full' (the engine
-- call they share); the binding's own limit said 'shape has too many elements'.
function TestRegressions:test_too_large_shape_names_the_constructor ()
  for _, name in ipairs({"zeros", "ones", "empty", "rand"}) do
    H.assert_err(function () gc[name]({1 << 30, 1 << 20}) end,
                 name .. ": shape is too large (more than 2^40 elements)")
  end
  H.assert_err(function () gc.full({1 << 40, 2}, 3) end, "full: shape is too large")
  lu.assertEquals(gc.zeros({2, 3}):shape(), {2, 3})
end

-- A graphed callable with two outputs that require grad: when the backward reached the node
-- of the last output without a grad (here through a Function whose backward gives none),
-- the grads of the other output were dropped and the backward graph never replayed, so
-- the parameters and the input got no grad at all, without a word.
function TestRegressions:test_output_without_grad_keeps_the_others ()
  local Two = gc.nn.Module("Two")
  function Two:init () self.a = gc.nn.Linear(3, 3); self.b = gc.nn.Linear(3, 3) end
  function Two:forward (x) return self.a(x), self.b(x) end
  local Stop = gc.autograd.Function("Stop")
  function Stop.forward (_, t) return t * 1 end
  function Stop.backward () return nil end
  local function step (f, m)
    gc.manual_seed(5)
    local x = gc.randn({2, 3}, {requires_grad = true})
    local y1, y2 = f(x)
    ;(Stop.apply(y2):sum() + y1:sum()):backward()
    return m.a.weight.grad:tolist(), m.a.bias.grad:tolist(), x.grad:tolist()
  end
  gc.manual_seed(1)
  local eager = Two()
  gc.manual_seed(1)
  local m = Two()
  local G = gc.make_graphed_callables(m, {gc.randn({2, 3}, {requires_grad = true})})
  local ew, eb, ex = step(eager, eager)
  for _ = 1, 2 do
    m.a.weight.grad, m.a.bias.grad = nil, nil
    local w, b, x = step(G, m)
    lu.assertEquals(w, ew)
    lu.assertEquals(b, eb)
    lu.assertEquals(x, ex)
  end
end

-- A split whose piece size is near math.maxinteger is one piece (the count
-- overflowed to none), and narrow's range errors speak of Lua's dims and
-- entries (from 1), whatever the start, without overflow.
function TestRegressions:test_split_huge_size_and_narrow_ranges ()
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

-- A NaN or negative layer norm epsilon (every output NaN) is refused when
-- the module is made, as is an option Embedding does not have (padding_idx
-- was ignored: its row still got grads).
function TestRegressions:test_transformer_eps_and_embedding_options ()
  local here = debug.getinfo(1, "S").short_src .. ":"
  local cases = {
    {function (v) return gc.nn.LayerNormLinear(4, 3, {eps = v}) end, "LayerNormLinear: eps"},
    {function (v) return gc.nn.LayerNormMLP(4, 8, {eps = v}) end, "LayerNormMLP: eps"},
    {function (v) return gc.nn.MultiheadAttention(4, 2, {layernorm_epsilon = v}) end,
     "MultiheadAttention: layernorm_epsilon"},
    {function (v) return gc.nn.TransformerLayer(4, 8, 2, {layernorm_epsilon = v}) end,
     "TransformerLayer: layernorm_epsilon"},
  }
  for _, c in ipairs(cases) do
    for _, v in ipairs({0 / 0, -1e-5, math.huge}) do
      local ok, e = pcall(c[1], v)
      lu.assertFalse(ok, c[2] .. " " .. tostring(v))
      lu.assertStrContains(e, here)
      lu.assertStrContains(e, c[2] .. " must be a finite number >= 0, got ")
    end
    lu.assertNotNil(c[1](0))
  end
  local ok, e = pcall(function () return gc.nn.Embedding(3, 4, {padding_idx = 0}) end)
  lu.assertFalse(ok)
  lu.assertStrContains(e, here)
  lu.assertStrContains(e, "Embedding: unknown option 'padding_idx'")
  lu.assertEquals(gc.nn.Embedding(3, 4)(gc.tensor({2})):shape(), {1, 4})
end

-- A kernel launch with a negative shared memory size ran (wrapped to 4 GiB
-- as the driver's unsigned int); out-of-range grid and block sizes named no
-- kernel. Both are refused at the caller's line, naming the kernel.
function TestRegressions:test_kernel_launch_ranges_name_the_kernel ()
  local SRC = [[
extern "C" __global__ void fill1(float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 1.0f;
}
]]
  local ok, k = pcall(gc.cuda.kernel, SRC, "fill1",
                      {host = function (y, n) y:view({n}):copy_(gc.ones({n})) end})
  if not ok and tostring(k):find("NVRTC is not available", 1, true) then
    lu.skip("no NVRTC here")
  end
  assert(ok, k)
  local here = debug.getinfo(1, "S").short_src .. ":"
  local y = gc.zeros({4})
  local bad = {
    {{grid = 1, block = 4, shmem = -1}, "kernel 'fill1':launch: shmem must be 0 to 2^32-1 bytes, got -1"},
    {{grid = 1, block = 4, shmem = 1 << 32}, "shmem must be 0 to 2^32-1 bytes, got 4294967296"},
    {{grid = 0, block = 4}, "kernel 'fill1':launch: grid sizes must be 1 to 2147483647, got 0 (entry 1)"},
    {{grid = {1, -2}, block = 4}, "kernel 'fill1':launch: grid sizes must be 1 to 2147483647, got -2 (entry 2)"},
    {{grid = 1, block = 1025}, "kernel 'fill1':launch: block sizes must be 1 to 1024, got 1025 (entry 1)"},
  }
  for _, c in ipairs(bad) do
    local t = c[1]
    t.args, t.writes = {y, 4}, {y}
    local e
    ok, e = pcall(function () k:launch(t) end)
    lu.assertFalse(ok, c[2])
    lu.assertStrContains(e, here)
    lu.assertStrContains(e, c[2])
  end
  lu.assertEquals(y:tolist(), {0, 0, 0, 0})
  k:launch{grid = 1, block = 4, shmem = 0, args = {y, 4}, writes = {y}}
  lu.assertEquals(y:tolist(), {1, 1, 1, 1})
end

-- A closed tensor in a sequence (cat's tensors, a kernel launch's args,
-- reads or writes) was reported as "bad argument #-1": the error names
-- the entry now, and the call can be made again once it is replaced.
function TestRegressions:test_closed_tensor_in_a_sequence_names_the_entry ()
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

-- A transformer layer given bf16 input (its parameters f32) said only
-- "got input [3, 2, 4]": the layer norm's error gives each operand's dtype.
function TestRegressions:test_layer_norm_dtype_error_names_the_dtypes ()
  local here = debug.getinfo(1, "S").short_src .. ":"
  local m = gc.nn.LayerNormLinear(4, 3)
  local ok, e = pcall(function () return m(gc.randn({2, 4}, {dtype = "bf16"})) end)
  lu.assertFalse(ok)
  lu.assertStrContains(e, here)
  lu.assertStrContains(e, "got input bf16 [2, 4], weight f32 [4], bias f32 [4]")
  lu.assertEquals(m(gc.randn({2, 4})):shape(), {2, 3})
end

-- MultiheadAttention (and TransformerLayer through it) given x of another
-- hidden size failed inside its qkv projection, naming "linear" and a
-- weight [12, 4] the caller never made: the module names itself and hidden.
function TestRegressions:test_attention_layers_check_the_hidden_size ()
  local here = debug.getinfo(1, "S").short_src .. ":"
  for _, m in ipairs({gc.nn.MultiheadAttention(4, 2), gc.nn.TransformerLayer(4, 8, 2)}) do
    local ok, e = pcall(function () return m(gc.randn({3, 2, 5})) end)
    lu.assertFalse(ok)
    lu.assertStrContains(e, here)
    lu.assertStrContains(e, "MultiheadAttention: x must be [seq, batch, hidden 4], got [3, 2, 5]")
    lu.assertEquals(m(gc.randn({3, 2, 4})):shape(), {3, 2, 4})
  end
end

-- k.launch{...} (a dot for the colon) named "kernel 'nil'": the error
-- says how to call it.
function TestRegressions:test_kernel_launch_called_with_a_dot ()
  local ok, k = pcall(gc.cuda.kernel, [[
extern "C" __global__ void nop1(int n) {}
]], "nop1", {host = function () end})
  if not ok and tostring(k):find("NVRTC is not available", 1, true) then
    lu.skip("no NVRTC here")
  end
  assert(ok, k)
  local here = debug.getinfo(1, "S").short_src .. ":"
  local e
  ok, e = pcall(function () k.launch{grid = 1, block = 1, args = {1}} end)
  lu.assertFalse(ok)
  lu.assertStrContains(e, here)
  lu.assertStrContains(e, "Kernel:launch: call it as k:launch{...}, got a table for k")
  lu.assertNotStrContains(e, "'nil'")
  k:launch{grid = 1, block = 1, args = {1}}
end

-- A kernel's source, name or option holding a NUL byte was cut there
-- without a word (the source's rest never compiled): it is refused.
function TestRegressions:test_kernel_strings_with_a_nul_byte ()
  local src = 'extern "C" __global__ void f(int a) {}\n'
  local ok, k = pcall(gc.cuda.kernel, src, "f")
  if not ok and tostring(k):find("NVRTC is not available", 1, true) then
    lu.skip("no NVRTC here")
  end
  assert(ok, k)
  local here = debug.getinfo(1, "S").short_src .. ":"
  for _, c in ipairs({{src .. "\0#error never read", "f", {}, "source holds a NUL byte at 40"},
                      {src, "f\0g", {}, "name holds a NUL byte at 2"},
                      {src, "f", {"-w\0x"}, "an option holds a NUL byte at 3"}}) do
    local e
    ok, e = pcall(function () return gc.cuda.kernel(c[1], c[2], {options = c[3]}) end)
    lu.assertFalse(ok, c[4])
    lu.assertStrContains(e, here)
    lu.assertStrContains(e, "gc.cuda.kernel: " .. c[4])
  end
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
