-- test_graphed_stale.lua: graphed state that something rewrote before the
-- graph read it (docs/semantics.md, "make_graphed_callables", "What a graphed
-- backward checks"). Each program either gives eager's result bit for bit or
-- raises an error that names the entry, the tensor or call, and what to do:
-- a second forward before the first one's backward; a second backward of one
-- call (refused without retain_graph_in_backward, eager's grads with it); a
-- static input, a parameter or a returned output written between a call and
-- its backward; one sample tensor given for several arguments or entries, or
-- passed for another argument than its own; a parameter or a sample moved
-- onto other storage or dtype after graphing; a submodule's mode switched;
-- with reuse_graph_input_output_buffers, an output whose memory another
-- entry's graph has written since; with clone_param_grads_on_return =
-- false, a .grad that is the static grad buffer itself when the next
-- backward replays.
--   build/graphcap tests/lua/test_graphed_stale.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
-- The shared helpers, from this file's directory (whatever the working directory).
local H = dofile(debug.getinfo(1, "S").source:match("^@?(.-)[^/\\]*$") .. "helpers.lua")
local assert_err, assert_bitwise = H.assert_err, H.assert_bitwise

-- build() twice from one seed: a to run eagerly, b to graph.
local function pair (build)
  gc.manual_seed(1)
  local a = build()
  gc.manual_seed(1)
  return a, build()
end

local function linear () return gc.nn.Linear(4, 3) end

-- A [2, 4] tensor of values from phase, requiring grad unless told otherwise.
local function input (phase, grad)
  return gc.tensor(H.nest(H.values(8, phase), {2, 4}), {requires_grad = grad ~= false})
end

-- The grads of the parameters of m, then of the tensors xs.
local function grads (m, xs)
  local g = {}
  for _, p in ipairs(m:parameters()) do g[#g + 1] = p.grad and p.grad:tolist() or false end
  for _, x in ipairs(xs or {}) do g[#g + 1] = x.grad and x.grad:tolist() or false end
  return g
end

local function assert_grads (got, want, what)
  lu.assertEquals(#got, #want, what .. ": counts")
  for i = 1, #want do
    lu.assertNotEquals(want[i], false, what .. ": eager grad " .. i .. " missing")
    lu.assertNotEquals(got[i], false, what .. ": grad " .. i .. " missing")
    assert_bitwise(got[i], want[i], what .. ": grad " .. i)
  end
end

TestGraphedStale = {tearDown = H.no_capture_left}

-- ---------------------------------------------------------------------------
-- 1. A second forward of an entry before the first one's backward

function TestGraphedStale:test_second_forward_before_backward ()
  local a, b = pair(linear)
  local g = gc.make_graphed_callables(b, {input(0)})
  local x1, x2 = input(1), input(2)
  local y1 = g(x1)
  local y2 = g(x2)
  local msg = assert_err(function () y1:sum():backward() end,
                         "graphed backward of call 1 of entry 1 (callable 1, Linear)",
                         "overwritten by call 2 of that entry's forward",
                         "run a call's backward before the entry's next call")
  lu.assertStrContains(msg, "graph one entry per microbatch (order)")
  lu.assertNil(x1.grad, "the refused backward gave the input a grad")
  lu.assertEquals(grads(b), {false, false}, "the refused backward gave the parameters grads")
  -- reading y1 stays allowed: it views the static output, now call 2's
  assert_bitwise(y1:tolist(), y2:tolist(), "y1 after call 2")
  -- call 2's own backward is eager's
  y2:sum():backward()
  local ex2 = input(2)
  local e2 = a(ex2)
  assert_bitwise(y2:tolist(), e2:tolist(), "output of call 2")
  e2:sum():backward()
  assert_grads(grads(b, {x2}), grads(a, {ex2}), "backward of call 2")
end

-- A forward under no_grad overwrites the activations too; the error names
-- the first call after the one whose backward runs.
function TestGraphedStale:test_second_forward_without_grad ()
  local _, b = pair(linear)
  local g = gc.make_graphed_callables({b}, {{input(0)}}, {order = {1, -1}})[1]
  local y1 = g(input(1))
  gc.no_grad(function () g(input(2)) end)
  local y3 = g(input(3))
  assert_err(function () y1:sum():backward() end,
             "graphed backward of call 1 of entry 1 (callable 1, Linear)",
             "overwritten by call 2 of that entry's forward")
  y3:sum():backward()
  lu.assertNotNil(b:parameters()[1].grad, "call 3's backward ran")
end

-- One entry per microbatch: each call's backward reads its own activations.
function TestGraphedStale:test_one_entry_per_microbatch ()
  local a, b = pair(linear)
  local G = gc.make_graphed_callables({b}, {{input(0)}, {input(0)}}, {order = {1, 1, -1, -1}})
  local x1, x2 = input(1), input(2)
  local y1, y2 = G[1](x1), G[2](x2)
  y1:sum():backward()
  y2:sum():backward()
  local ex1, ex2 = input(1), input(2)
  a(ex1):sum():backward()
  a(ex2):sum():backward()
  assert_grads(grads(b, {x1, x2}), grads(a, {ex1, ex2}), "two microbatches")
end

-- ---------------------------------------------------------------------------
-- 2. A second backward of one call

-- The modules whose captured backward frees saved tensors it then reuses:
-- name, build, the shapes of the arguments, the output's shape.
local SECOND = {
  {"Linear+Dropout", function ()
     return gc.nn.Sequential(gc.nn.Linear(8, 16), gc.nn.Dropout(0.5), gc.nn.Linear(16, 8))
   end, {{3, 2, 8}}, {3, 2, 8}},
  {"LayerNormLinear", function () return gc.nn.LayerNormLinear(8, 8) end, {{3, 2, 8}}, {3, 2, 8}},
  {"LayerNormMLP", function () return gc.nn.LayerNormMLP(8, 16) end, {{3, 2, 8}}, {3, 2, 8}},
  {"MultiheadAttention", function () return gc.nn.MultiheadAttention(8, 2) end, {{3, 2, 8}},
   {3, 2, 8}},
  {"TransformerLayer", function () return gc.nn.TransformerLayer(8, 16, 2) end, {{3, 2, 8}},
   {3, 2, 8}},
  {"DotProductAttention", function () return gc.nn.DotProductAttention(2, 4) end,
   {{3, 2, 2, 4}, {3, 2, 2, 4}, {3, 2, 2, 4}}, {3, 2, 8}},
}

local function numel (shape)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  return n
end

-- Graph case c's module (with opts), and run `backwards` on an eager copy
-- and on the graphed one, the generator seeded alike before each forward:
-- backwards(y, dy) for y = m(args...). Returns the grads of the parameters
-- and arguments, eager then graphed, and the graphed run's error, then the
-- eager run's (or nil).
local function second_backward (c, opts, backwards)
  local name, build, shapes, out = table.unpack(c)
  local a, b = pair(build)
  local samples, args = {}, {}
  for i, sh in ipairs(shapes) do
    samples[i] = gc.zeros(sh, {requires_grad = true})
    args[i] = gc.tensor(H.nest(H.values(numel(sh), i), sh), {requires_grad = true})
  end
  local g = gc.make_graphed_callables(b, samples, opts)
  local dy = gc.tensor(H.nest(H.values(numel(out), 0.5), out))
  local function run (m)
    for _, x in ipairs(args) do x.grad = nil end
    gc.manual_seed(9)
    local ok, err = pcall(backwards, m(table.unpack(args)), dy)
    return grads(m == g and b or a, args), not ok and tostring(err) or nil, name
  end
  local eager, eager_err = run(a)
  local graphed, err = run(g)
  return eager, graphed, err, eager_err
end

local function twice (y, dy)
  y:backward(dy, {retain_graph = true})
  y:backward(dy * 2)
end

function TestGraphedStale:test_second_backward_needs_retain_graph_in_backward ()
  for _, c in ipairs(SECOND) do
    local name = c[1]
    local eager, graphed, err, eager_err = second_backward(c, nil, function (y, dy)
      y:backward(dy, {retain_graph = true})
    end)
    lu.assertNil(eager_err, name .. ": eager")
    lu.assertNil(err, name .. ": graphed")
    assert_grads(graphed, eager, name .. ": one backward")
    _, graphed, err, eager_err = second_backward(c, nil, twice)
    lu.assertNil(eager_err, name .. ": eager, twice")
    lu.assertNotNil(err, name .. ": a second backward without the option must fail")
    lu.assertStrContains(err, "graphed backward of call 1 of entry 1 (callable 1, ")
    lu.assertStrContains(err, "a second backward of one call")
    lu.assertStrContains(err, "retain_graph_in_backward = true")
    -- refused before it added anything: the first backward's grads
    assert_grads(graphed, eager, name .. ": after the refused backward")
  end
end

function TestGraphedStale:test_second_backward_with_retain_graph_in_backward ()
  for _, c in ipairs(SECOND) do
    local name = c[1]
    local eager, graphed, err, eager_err = second_backward(c, {retain_graph_in_backward = true},
                                                           twice)
    lu.assertNil(eager_err, name .. ": eager")
    lu.assertNil(err, name)
    if name == "TransformerLayer" then
      -- the input's grad: eager adds each of its two edges (residual, layer
      -- norm) into .grad, the graph hands their sum on (issue 21, case 12)
      local x = table.remove(graphed)
      H.assert_close(x, table.remove(eager), 1e-6, 1e-6, name .. ": input grad")
    end
    assert_grads(graphed, eager, name)
  end
end

-- Without retain_graph the first backward releases the call, as eager's.
function TestGraphedStale:test_second_backward_without_retain_graph ()
  local eager, graphed, err, eager_err = second_backward(
    SECOND[1], {retain_graph_in_backward = true}, function (y, dy)
      y:backward(dy)
      y:backward(dy)
    end)
  lu.assertNotNil(eager_err)
  lu.assertStrContains(eager_err, "trying to backward through the graph a second time ('linear'")
  lu.assertNotNil(err)
  lu.assertStrContains(err, "trying to backward through the graph a second time ('graphed'")
  assert_grads(graphed, eager, "after the refused backward")
end

-- ---------------------------------------------------------------------------
-- 3. What the backward graph reads, written between the call and its backward

local VERSION = "one of the variables needed for gradient computation has been modified by an "
                .. "inplace operation"

function TestGraphedStale:test_static_input_written_before_backward ()
  local a, b = pair(linear)
  local s = input(0)
  local g = gc.make_graphed_callables(b, {s})
  local y = g(s)
  gc.no_grad(function () s:fill_(0) end)
  local msg = assert_err(function () y:sum():backward() end,
                         "graphed backward of call 1 of entry 1 (callable 1, Linear): " .. VERSION,
                         "the [2, 4] f32 tensor it read as the static input of argument #1 is at "
                         .. "version")
  lu.assertStrContains(msg, "expected version")
  lu.assertNil(s.grad)
  lu.assertEquals(grads(b), {false, false})
  -- eager refuses the same program in the same words
  local e = input(0)
  local ey = a(e)
  gc.no_grad(function () e:fill_(0) end)
  assert_err(function () ey:sum():backward() end, "backward: " .. VERSION)
end

-- Called with another tensor, the sample is still what the graph reads.
function TestGraphedStale:test_sample_written_after_a_call_with_another_input ()
  local _, b = pair(linear)
  local s = input(0)
  local g = gc.make_graphed_callables(b, {s})
  local y = g(input(1))
  gc.no_grad(function () s:copy_(input(5, false)) end)
  assert_err(function () y:sum():backward() end,
             "graphed backward of call 1 of entry 1 (callable 1, Linear): " .. VERSION,
             "the static input of argument #1")
end

-- The call copied its input in: writing that tensor afterwards changes
-- nothing the backward reads, and the grads are those of the values given.
function TestGraphedStale:test_call_input_written_after_the_call ()
  local a, b = pair(linear)
  local g = gc.make_graphed_callables(b, {input(0)})
  local x = input(1)
  local y = g(x)
  gc.no_grad(function () x:fill_(7) end)
  y:sum():backward()
  local ex = input(1)
  a(ex):sum():backward()
  assert_grads(grads(b, {x}), grads(a, {ex}), "after writing the call's input")
end

function TestGraphedStale:test_parameter_written_before_backward ()
  local _, b = pair(linear)
  local g = gc.make_graphed_callables(b, {input(0)})
  local x = input(1)
  local y = g(x)
  gc.no_grad(function () b.weight:copy_(gc.ones({3, 4})) end)
  assert_err(function () y:sum():backward() end,
             "graphed backward of call 1 of entry 1 (callable 1, Linear): " .. VERSION,
             "the [3, 4] f32 tensor it read as parameter 'weight' is at version")
  lu.assertNil(x.grad)
  -- an optimizer step before the backward, on a parameter that gets no
  -- grad (frozen) but that the backward reads for the input's grad
  b.weight.requires_grad = false
  local g2 = gc.make_graphed_callables(b, {input(0)})
  y = g2(x)
  gc.no_grad(function () b.weight:fill_(0.5) end)
  assert_err(function () y:sum():backward() end, "parameter 'weight'", VERSION)
end

-- A layer norm's weight: its input grad reads it.
function TestGraphedStale:test_layer_norm_weight_written_before_backward ()
  local _, b = pair(function () return gc.nn.LayerNorm(4) end)
  local g = gc.make_graphed_callables(b, {input(0)})
  local x = input(1)
  local y = g(x)
  gc.no_grad(function () b.weight:fill_(2) end)
  assert_err(function () y:sum():backward() end,
             "graphed backward of call 1 of entry 1 (callable 1, LayerNorm): " .. VERSION,
             "the [4] f32 tensor it read as parameter 'weight' is at version")
  lu.assertNil(x.grad)
end

-- A returned output is a view of the static output: written before the
-- backward, refused where the backward graph reads it (relu saves its
-- result), as eager refuses; where it does not, eager's grads.
function TestGraphedStale:test_output_written_before_backward ()
  local function relu () return gc.nn.Sequential(gc.nn.Linear(4, 3), gc.nn.ReLU()) end
  local a, b = pair(relu)
  local g = gc.make_graphed_callables(b, {input(0)})
  local x = input(1)
  local y = g(x)
  gc.no_grad(function () y:fill_(0) end)
  assert_err(function () y:sum():backward() end,
             "graphed backward of call 1 of entry 1 (callable 1, Sequential): " .. VERSION,
             "the [2, 3] f32 tensor it read as output #1 is at version")
  lu.assertNil(x.grad)
  lu.assertEquals(grads(b), {false, false})
  local ey = a(input(1))
  gc.no_grad(function () ey:fill_(0) end)
  assert_err(function () ey:sum():backward() end, "backward: " .. VERSION, "saved by 'relu'")
  -- the output of a Linear is read by no backward
  local c, d = pair(linear)
  g = gc.make_graphed_callables(d, {input(0)})
  y = g(x)
  gc.no_grad(function () y:fill_(0) end)
  y:sum():backward()
  local ex = input(1)
  ey = c(ex)
  gc.no_grad(function () ey:fill_(0) end)
  ey:sum():backward()
  assert_grads(grads(d, {x}), grads(c, {ex}), "after writing a Linear's output")
end

-- What the backward graph does not read may change, as in eager: the grad
-- of x * 2 reads neither x nor anything else.
function TestGraphedStale:test_unread_input_written_before_backward ()
  local s = input(0)
  local g = gc.make_graphed_callables(function (x) return x * 2 end, {s})
  local y = g(s)
  gc.no_grad(function () s:fill_(3) end)
  y:sum():backward()
  assert_bitwise(s.grad:tolist(), gc.full({2, 4}, 2):tolist(), "grad of x * 2")
  local e = input(0)
  local ey = e * 2
  gc.no_grad(function () e:fill_(3) end)
  ey:sum():backward()
  assert_bitwise(s.grad:tolist(), e.grad:tolist(), "eager grad of x * 2")
end

-- ---------------------------------------------------------------------------
-- 4. One sample tensor given for several places: each its own static input

function TestGraphedStale:test_one_sample_for_two_arguments ()
  local function f (x, y) return x * 2 + y end
  local s = input(0)
  local g = gc.make_graphed_callables(f, {s, s})
  local a, b = input(1), input(2)
  local y = g(a, b)
  local ea, eb = input(1), input(2)
  local ey = f(ea, eb)
  assert_bitwise(y:tolist(), ey:tolist(), "g(a, b)")
  y:sum():backward()
  ey:sum():backward()
  assert_bitwise(a.grad:tolist(), ea.grad:tolist(), "grad of a")
  assert_bitwise(b.grad:tolist(), eb.grad:tolist(), "grad of b")
  -- the sample itself, for both: its grad sums both places', as eager's
  local ys = g(s, s)
  assert_bitwise(ys:tolist(), f(s, s):tolist(), "g(s, s)")
  ys:sum():backward()
  assert_bitwise(s.grad:tolist(), gc.full({2, 4}, 3):tolist(), "grad of s")
  -- a view of the sample's memory is the same place
  local v = gc.make_graphed_callables(f, {s, s:detach()})
  assert_bitwise(v(a, b):tolist(), ey:tolist(), "g(a, b), the second sample a detached view")
end

-- A loop building sample_args easily gives every entry the same tensor:
-- two callables, and the microbatches of an order.
function TestGraphedStale:test_one_sample_for_two_entries ()
  local function two () return {linear(), linear()} end
  local a, b = pair(two)
  local s = input(0)
  local G = gc.make_graphed_callables(b, {{s}, {s}})
  local x1, x2 = input(1), input(2)
  local y1 = G[1](x1)
  local y2 = G[2](x2)
  y1:sum():backward()
  y2:sum():backward()
  local ex1, ex2 = input(1), input(2)
  local ey1, ey2 = a[1](ex1), a[2](ex2)
  assert_bitwise(y1:tolist(), ey1:tolist(), "entry 1's output")
  ey1:sum():backward()
  ey2:sum():backward()
  assert_grads(grads(b[1], {x1}), grads(a[1], {ex1}), "entry 1")
  assert_grads(grads(b[2], {x2}), grads(a[2], {ex2}), "entry 2")

  local c, d = pair(linear)
  local M = gc.make_graphed_callables({d}, {{s}, {s}}, {order = {1, 1, -1, -1}})
  local m1, m2 = input(3), input(4)
  local z1, z2 = M[1](m1), M[2](m2)
  z1:sum():backward()
  z2:sum():backward()
  local em1, em2 = input(3), input(4)
  c(em1):sum():backward()
  c(em2):sum():backward()
  assert_grads(grads(d, {m1, m2}), grads(c, {em1, em2}), "two microbatches of one sample")
end

-- A call given the sample for another argument than its own: the copy of
-- the argument before it into the sample must not change what it gives.
function TestGraphedStale:test_sample_given_for_another_argument ()
  local function f (x, y) return x * 2 + y end
  local s = input(0)
  local g = gc.make_graphed_callables(f, {s, s}) -- s is the static input of #1 only
  local a = input(1)
  local es = input(0)
  assert_bitwise(g(a, s):tolist(), f(input(1), es):tolist(), "g(a, s)")
  assert_bitwise(s:tolist(), a:tolist(), "s, the static input of #1, holds a")
  -- two samples, given crosswise
  local s1, s2 = input(3), input(4)
  local h = gc.make_graphed_callables(f, {s1, s2})
  local y = h(s2, s1)
  assert_bitwise(y:tolist(), f(input(4), input(3)):tolist(), "h(s2, s1)")
  y:sum():backward()
  assert_bitwise(s2.grad:tolist(), gc.full({2, 4}, 2):tolist(), "grad of s2, given as x")
  assert_bitwise(s1.grad:tolist(), gc.full({2, 4}, 1):tolist(), "grad of s1, given as y")
end

-- ---------------------------------------------------------------------------
-- 5. Parameters moved after graphing: the graphs read the old memory

function TestGraphedStale:test_parameter_moved_by_set_ ()
  local a, b = pair(linear)
  local g = gc.make_graphed_callables(b, {input(0)})
  local old = b.weight:detach() -- keeps the storage the graphs read
  b.weight:set_(gc.full({3, 4}, 0.5))
  local msg = assert_err(function () g(input(1)) end,
                         "graphed call of entry 1 (callable 1, Linear): parameter 'weight' moved "
                         .. "since it was graphed (now [3, 4] f32 on other storage, graphed as "
                         .. "[3, 4] f32)",
                         "write new values into it in place (copy_), or graph it again")
  lu.assertStrContains(msg, "its graphs read the memory it had then")
  -- moved back, it replays again
  b.weight:set_(old)
  local x, ex = input(1), input(1)
  local y, ey = g(x), a(ex)
  assert_bitwise(y:tolist(), ey:tolist(), "output after moving it back")
  y:sum():backward()
  ey:sum():backward()
  assert_grads(grads(b, {x}), grads(a, {ex}), "after moving it back")
  -- moved, then graphed again: the new graphs read the new storage
  b.weight:set_(gc.full({3, 4}, 0.5))
  gc.no_grad(function () a.weight:fill_(0.5) end)
  g = gc.make_graphed_callables(b, {input(0)})
  assert_bitwise(g(input(2)):tolist(), a(input(2)):tolist(), "graphed again")
end

-- Moved between a call and its backward: the backward reads the storage
-- the call read, as the eager node reads the tensor it saved.
function TestGraphedStale:test_parameter_moved_before_backward ()
  local a, b = pair(linear)
  local g = gc.make_graphed_callables(b, {input(0)})
  local x, ex = input(1), input(1)
  local y, ey = g(x), a(ex)
  local function moved () -- storage written a few times: another version
    local w = gc.zeros({3, 4})
    for k = 1, 5 do w:fill_(k) end
    return w
  end
  b.weight:set_(moved())
  a.weight:set_(moved())
  y:sum():backward()
  ey:sum():backward()
  assert_grads(grads(b, {x}), grads(a, {ex}), "a backward after the move")
end

-- A sample moved: the graphs read its old storage, a call would copy into
-- the new one.
function TestGraphedStale:test_sample_moved_by_set_ ()
  local a, b = pair(linear)
  local s = input(0)
  local keep = s:detach()
  local g = gc.make_graphed_callables(b, {s})
  gc.no_grad(function () s:set_(gc.zeros({2, 4})) end)
  assert_err(function () g(input(1)) end,
             "graphed call of entry 1 (callable 1, Linear): the static input of argument #1 (its "
             .. "sample) moved since it was graphed (now [2, 4] f32 on other storage, graphed as "
             .. "[2, 4] f32)")
  s:set_(keep)
  assert_bitwise(g(input(1)):tolist(), a(input(1)):tolist(), "after moving it back")
end

function TestGraphedStale:test_module_converted_after_graphing ()
  local _, b = pair(function () return gc.nn.Sequential(gc.nn.LayerNorm(4), gc.nn.Linear(4, 3)) end)
  local g = gc.make_graphed_callables(b, {input(0)})
  b:to("bf16")
  assert_err(function () g(input(1)) end,
             "graphed call of entry 1 (callable 1, Sequential): parameter '0.weight' moved since "
             .. "it was graphed (now [4] bf16 on other storage, graphed as [4] f32)")
  -- and back: other storage still
  b:to("f32")
  assert_err(function () g(input(1)) end, "parameter '0.weight' moved since it was graphed",
             "on other storage")
  -- an order's entries check the same
  local _, c = pair(linear)
  local G = gc.make_graphed_callables({c}, {{input(0)}, {input(0)}}, {order = {1, 1, -1, -1}})
  c.bias:set_(gc.zeros({3}))
  assert_err(function () G[2](input(1)) end,
             "graphed call of entry 2 (callable 1, Linear): parameter 'bias' moved")
end

-- ---------------------------------------------------------------------------
-- 6. A submodule's mode switched after graphing: the call runs eagerly

function TestGraphedStale:test_child_mode_switched ()
  local function build ()
    return gc.nn.Sequential(gc.nn.Linear(4, 8), gc.nn.Dropout(0.5), gc.nn.Linear(8, 3))
  end
  local a, b = pair(build)
  local g = gc.make_graphed_callables(b, {input(0)})
  local function same (what)
    local x, ex = input(1), input(1)
    gc.manual_seed(5)
    local y = g(x)
    gc.manual_seed(5)
    local ey = a(ex)
    assert_bitwise(y:tolist(), ey:tolist(), what .. ": output")
    y:sum():backward()
    ey:sum():backward()
    assert_grads(grads(b, {x}), grads(a, {ex}), what)
  end
  -- only the Dropout in eval: the module's own flag still says training
  a["1"]:eval()
  b["1"]:eval()
  same("Dropout in eval")
  lu.assertEquals(g:stats().fwd.replays, 0, "the call ran eagerly")
  a["1"]:train()
  b["1"]:train()
  same("Dropout back in training")
  lu.assertEquals(g:stats().fwd.replays, 1, "the call replayed")
end

-- ---------------------------------------------------------------------------
-- 7. reuse_graph_input_output_buffers: an output whose memory was reused

local DEAD = "output #1 of graphed entry 1 refused: reuse_graph_input_output_buffers gave its "
             .. "memory back after the entry's backward, and another entry's graph has written "
             .. "it since"

-- Two chunks of one Linear(8, 8) each, two microbatches, 1F1B: microbatch
-- 2's forwards take the memory microbatch 1's gave back. Entries: chunk 1
-- mb 1, chunk 1 mb 2, chunk 2 mb 1, chunk 2 mb 2.
local function reused ()
  local function two () return {gc.nn.Linear(8, 8), gc.nn.Linear(8, 8)} end
  local a, b = pair(two)
  local s = {}
  for i = 1, 4 do s[i] = {gc.ones({4, 8}, {requires_grad = true})} end
  local G = gc.make_graphed_callables(b, s, {order = {1, 2, -2, -1, 1, 2, -2, -1},
                                            reuse_graph_input_output_buffers = true,
                                            num_warmup_iters = 1})
  return a, G
end

local function x8 (phase)
  return gc.tensor(H.nest(H.values(32, phase), {4, 8}), {requires_grad = true})
end

function TestGraphedStale:test_reused_output_is_refused ()
  local a, G = reused()
  local x1 = x8(1)
  local y1 = G[1](x1)
  local v1 = y1:tolist()
  G[3](y1):sum():backward() -- chunk 2, then chunk 1 of microbatch 1
  -- its memory is given back, but nothing has written it yet
  assert_bitwise(y1:tolist(), v1, "y1 after its backward")
  local x2 = x8(2)
  local y2 = G[2](x2) -- microbatch 2's chunk 1 writes where y1 was
  local msg = assert_err(function () return y1:tolist() end, "reading " .. DEAD)
  lu.assertStrContains(msg, "read or clone an output before then, or call its entry again")
  assert_err(function () return y1:sum() end, "reading " .. DEAD)
  assert_err(function () gc.no_grad(function () y1:zero_() end) end, "writing " .. DEAD)
  -- microbatch 2 computes what eager computes
  local ey2 = a[1](x8(2))
  assert_bitwise(y2:tolist(), ey2:tolist(), "microbatch 2's output")
  G[4](y2):sum():backward()
  -- a new call of entry 1 makes its outputs (every view of them) live again
  local y1b = G[1](x8(3))
  assert_bitwise(y1:tolist(), y1b:tolist(), "y1 after the next call of its entry")
  assert_bitwise(y1b:tolist(), a[1](x8(3)):tolist(), "the next call's output")
end

-- A call without grad has no backward to wait for: the next microbatch's
-- forward may take the memory at once.
function TestGraphedStale:test_reused_output_without_grad ()
  local a, G = reused()
  local y1 = gc.no_grad(function () return G[1](x8(1)) end)
  local c1 = y1:clone()
  gc.no_grad(function () return G[2](x8(2)) end)
  assert_err(function () return y1:tolist() end, "reading " .. DEAD)
  -- a clone taken before keeps the call's values
  assert_bitwise(c1:tolist(), a[1](x8(1)):tolist(), "the clone of y1")
end

-- ---------------------------------------------------------------------------
-- 8. clone_param_grads_on_return = false: .grad is the static buffer itself

-- Linear(1, 1) without bias, weight 1: the weight's grad is the input.
local function unit ()
  local m = gc.nn.Linear(1, 1, {bias = false})
  gc.no_grad(function () m.weight:fill_(1) end)
  return m
end

local function scalar (v) return gc.full({1, 1}, v) end

function TestGraphedStale:test_no_clone_second_backward_adds ()
  local a, b = pair(unit)
  local g = gc.make_graphed_callables(b, {scalar(0)}, {clone_param_grads_on_return = false})
  g(scalar(1)):sum():backward()
  local ptr = b.weight.grad:data_ptr()
  g(scalar(100)):sum():backward() -- no zero_grad between: eager adds
  a(scalar(1)):sum():backward()
  a(scalar(100)):sum():backward()
  assert_bitwise(b.weight.grad:tolist(), {{101}}, "two backwards")
  assert_bitwise(b.weight.grad:tolist(), a.weight.grad:tolist(), "two backwards, eager")
  lu.assertEquals(b.weight.grad:data_ptr(), ptr, "the grad is still the static buffer")
  -- zeroed in place, then a backward: that backward's grad alone
  b:zero_grad({set_to_none = false})
  a:zero_grad({set_to_none = false})
  g(scalar(7)):sum():backward()
  a(scalar(7)):sum():backward()
  assert_bitwise(b.weight.grad:tolist(), {{7}}, "after zero_grad in place")
  assert_bitwise(b.weight.grad:tolist(), a.weight.grad:tolist(), "after zero_grad, eager")
  lu.assertEquals(b.weight.grad:data_ptr(), ptr, "the grad is still the static buffer")
end

-- Training as TE's harness does it (grads zeroed in place, microbatches
-- accumulated), bit for bit against eager.
function TestGraphedStale:test_no_clone_training_in_place ()
  local function build ()
    return gc.nn.Sequential(gc.nn.Linear(8, 16), gc.nn.GELU(), gc.nn.Linear(16, 8))
  end
  local a, b = pair(build)
  gc.make_graphed_callables(b, {gc.ones({4, 8})}, {clone_param_grads_on_return = false})
  local function train (m)
    local opt = gc.optim.SGD(m:parameters(), {lr = 0.1})
    for step = 1, 3 do
      opt:zero_grad({set_to_none = step == 1})
      for mb = 1, 2 do
        local y = m(gc.tensor(H.nest(H.values(32, step * 10 + mb), {4, 8})))
        local loss = (y * gc.tensor(H.nest(H.values(32, -mb), {4, 8}))):sum()
        loss:backward()
      end
      opt:step()
    end
    return grads(m)
  end
  assert_grads(train(b), train(a), "three steps of two microbatches")
  for i, p in ipairs(b:parameters()) do
    assert_bitwise(p:tolist(), a:parameters()[i]:tolist(), "parameter " .. i)
  end
end

-- regression: the static grad handed on as .grad lived in the pool, where the
-- forward graph keeps its scratch: the next forward replay wrote over .grad,
-- and the next backward added to that (here, a bias grad of 0.364 where
-- eager gives 0); with two entries, each backward wrote over the other's
function TestGraphedStale:test_no_clone_grad_survives_the_next_forward ()
  local function build () return gc.nn.Sequential(gc.nn.Linear(2, 5), gc.nn.LayerNorm(5)) end
  local a, b = pair(build)
  local a2, b2 = pair(build)
  local G = gc.make_graphed_callables({b, b2}, {{gc.ones({3, 2})}, {gc.ones({3, 2})}},
                                      {clone_param_grads_on_return = false})
  local function call (m, phase) return m(gc.tensor(H.nest(H.values(6, phase), {3, 2}))) end
  for _, m in ipairs({G[1], G[2], a, a2}) do call(m, 1):sum():backward() end
  for _, m in ipairs({b, b2, a, a2}) do m:zero_grad({set_to_none = false}) end
  call(G[1], 2) -- a forward replay of each entry, and the other entry's backward
  call(G[2], 3):sum():backward()
  call(a2, 3):sum():backward()
  assert_grads(grads(b), grads(a), "entry 1 after the replays (zeros)")
  assert_grads(grads(b2), grads(a2), "entry 2")
  call(G[1], 4):sum():backward()
  call(a, 4):sum():backward()
  assert_grads(grads(b), grads(a), "entry 1 after its backward")
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
