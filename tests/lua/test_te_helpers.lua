-- test_te_helpers.lua: TransformerEngine's helpers around make_graphed_callables:
-- is_graph_capturing (the whole call, warmup and hooks included), a graphed
-- call's cuda_graph_stream and cuda_graph_event (its forward and its
-- backward), the generator's state and several tracked states
-- (RNGStatesTracker: graphs advance them as eager steps do), and
-- gc.checkpoint (recomputation with the generators restored: graphed =
-- eager bit for bit).
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_te_helpers.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local assert_same, assert_err = H.assert_same, H.assert_err

local HERE = "test_te_helpers.lua"
local NAME = "model-parallel-rng"

-- ---------------------------------------------------------------------------

TestIsGraphCapturing = {}

-- True in every callback make_graphed_callables runs (forwards and
-- backwards of warmup and capture, the four hook groups, the warmup hooks,
-- progress), false before and after; is_capturing is true only inside a
-- capture, so never in a hook.
function TestIsGraphCapturing:test_whole_call ()
  local seen, capturing = {}, {}
  local function note (what)
    seen[#seen + 1] = what .. "=" .. tostring(gc.is_graph_capturing())
    capturing[what] = capturing[what] or gc.is_capturing()
  end
  local M = gc.nn.Module("Probe")
  function M:init () self.l = gc.nn.Linear(4, 4) end
  function M:forward (x)
    note("forward")
    return gc.autograd.on_backward("probe", self.l(x), function () note("backward") end)
  end
  local hooks = {{}}
  for _, g in ipairs(gc.hook_groups) do hooks[1][g] = {function () note(g) end} end
  lu.assertFalse(gc.is_graph_capturing())
  gc.make_graphed_callables(M(), {gc.ones({2, 4}, {requires_grad = true})}, {
    num_warmup_iters = 1, capture_time_hooks = hooks,
    pre_warmup_hook = function () note("pre_warmup") end,
    post_warmup_hook = function () note("post_warmup") end,
    progress = function () note("progress") end})
  lu.assertFalse(gc.is_graph_capturing())
  for _, s in ipairs(seen) do lu.assertStrContains(s, "=true") end
  lu.assertEquals(#seen, 2 * 2 + 2 * 4 + 2 + 4)  -- fwd/bwd, hooks, warmup hooks, progress
  lu.assertTrue(capturing.forward and capturing.backward)  -- in the captures
  for _, g in ipairs(gc.hook_groups) do lu.assertFalse(capturing[g], g) end
end

-- A failed call leaves it false; a plain capture does not set it.
function TestIsGraphCapturing:test_after_failure_and_plain_capture ()
  assert_err(function ()
    gc.make_graphed_callables(function () error("boom") end, {gc.ones({2})})
  end, HERE, "boom")
  lu.assertFalse(gc.is_graph_capturing())
  local in_capture
  gc.Graph():capture(function () in_capture = gc.is_graph_capturing() end)
  lu.assertFalse(in_capture)
end

-- ---------------------------------------------------------------------------

TestReplayStream = {}

-- A Linear then ReLU that records ev (external) between them, graphed.
local function recorder (ev)
  local M = gc.nn.Module("Rec")
  function M:init () self.l = gc.nn.Linear(4, 4) end
  function M:forward (x)
    local y = self.l(x)
    if ev then ev:record() end
    return gc.F.relu(y)
  end
  return M
end

local function step (f, x, opts)
  local y = f(x, opts)
  y:sum():backward()
  return y:tolist()
end

-- On another stream, with or without the event: the values and grads of a
-- replay on the current stream, bit for bit; forward and backward replay
-- on the given stream (the event recorded by the forward graph; the
-- backward, which does not record it, waits on the whole stream).
function TestReplayStream:test_same_values_forward_and_backward ()
  local ev = gc.Event({external = true})
  gc.manual_seed(3)
  local m = recorder(ev)()
  local x = H.input({3, 4}, 1, true)
  local g = gc.make_graphed_callables(m, {x})
  local s = gc.Stream()
  local ref = step(g, x)
  local gref, wref = x.grad:tolist(), m.l.weight.grad:tolist()
  for _, opts in ipairs({{cuda_graph_stream = s}, {cuda_graph_stream = s, cuda_graph_event = ev},
                         {cuda_graph_stream = gc.current_stream(), cuda_graph_event = ev}}) do
    x.grad, m.l.weight.grad, m.l.bias.grad = nil, nil, nil
    assert_same(step(g, x, opts), ref, "output")
    assert_same(x.grad:tolist(), gref, "input grad")
    assert_same(m.l.weight.grad:tolist(), wref, "weight grad")
  end
  lu.assertEquals(g:stats().fwd.replays, 4)
  lu.assertEquals(g:stats().bwd.replays, 4)
end

-- The call keeps its stream and event for its backward: closed between
-- the two, the backward still replays on them.
function TestReplayStream:test_closed_before_backward ()
  local ev = gc.Event({external = true})
  local m = recorder(ev)()
  local x = H.input({2, 4}, 2, true)
  local g = gc.make_graphed_callables(m, {x})
  local s = gc.Stream()
  local y = g(x, {cuda_graph_stream = s, cuda_graph_event = ev})
  s:close()
  ev:close()
  y:sum():backward()
  lu.assertNotNil(x.grad)
end

-- Entries of an order and graphed functions take them too, beside kwargs.
function TestReplayStream:test_entries_and_kwargs ()
  local s = gc.Stream()
  local f = gc.make_graphed_callables(function (a, kw) return a * kw.b end,
                                      {gc.ones({3})}, {sample_kwargs = {b = gc.ones({3})}})
  local y = f(gc.full({3}, 2), {b = gc.full({3}, 3), cuda_graph_stream = s})
  assert_same(y:tolist(), {6, 6, 6}, "kwargs and a stream")
  local mods = H.linears(2)
  local entries = gc.make_graphed_callables(mods, H.samples(2), {order = {1, 2, -2, -1}})
  local x = gc.ones({4, 8})
  local ref = entries[2](entries[1](x)):tolist()
  assert_same(entries[2](entries[1](x, {cuda_graph_stream = s}), {cuda_graph_stream = s}):tolist(),
              ref, "order entries")
end

-- Errors name the option, and a failed call changes nothing.
function TestReplayStream:test_errors ()
  local plain, ext = gc.Event(), gc.Event({external = true})
  local m = recorder(nil)()
  local x = gc.ones({2, 4})
  local g = gc.make_graphed_callables(m, {x})
  local s = gc.Stream()
  assert_err(function () return g(x, {cuda_graph_stream = 3}) end,
             HERE, "Rec: keyword argument 'cuda_graph_stream' must be a Stream, got number")
  local closed = gc.Stream()
  closed:close()
  assert_err(function () return g(x, {cuda_graph_stream = closed}) end,
             "'cuda_graph_stream' must be a Stream, got a closed stream")
  assert_err(function () return g(x, {cuda_graph_event = s}) end,
             "'cuda_graph_event' must be an Event, got graphcap.Stream")
  assert_err(function () return g(x, {cuda_graph_stream = s, cuda_graph_event = plain}) end,
             HERE, "graphed call of entry 1 (callable 1, Rec): cuda_graph_event is not an external "
             .. "event; record an external event (gc.Event{external = true}")
  assert_err(function () return g(x, {cuda_graph_stream = s, cuda_graph_event = ext}) end,
             "cuda_graph_event is not recorded by its forward graph")
  lu.assertEquals(g:stats().fwd.replays, 0)
  m:eval()  -- another mode: an eager call, which takes no replay options
  assert_err(function () return g(x, {cuda_graph_stream = s}) end,
             "cuda_graph_stream and cuda_graph_event are options of a graphed call, and it is not "
             .. "graphed in eval mode")
  local lin = gc.nn.Linear(4, 4)  -- never graphed
  assert_err(function () return lin(x, {cuda_graph_stream = s}) end,
             "Linear: cuda_graph_stream and cuda_graph_event are options of a graphed call")
  assert_err(function () return gc.Event({external = 1}) end,
             HERE, "Event: external must be a boolean, got integer")
  assert_err(function () return gc.Event({extern = true}) end, "Event: unknown option 'extern'")
end

-- An external event recorded in a capture is waited on after replays: a
-- capturing stream waiting on it is refused.
function TestReplayStream:test_external_event_in_capture ()
  local ev, other = gc.Event({external = true}), gc.Stream()
  local x = gc.ones({2})
  assert_err(function ()
    gc.Graph():capture(function ()
      local y = x * 2
      ev:record()
      other:wait_event(ev)
      return y
    end)
  end, HERE, "an external event recorded in the capture is waited on after a replay")
  lu.assertFalse(gc.is_capturing())
end

-- ---------------------------------------------------------------------------

TestRNGState = {}

function TestRNGState:test_get_and_set ()
  gc.manual_seed(11)
  local s = gc.get_rng_state()
  lu.assertEquals(s, {seed = 11, offset = 0})
  local a = gc.rand({5}):tolist()
  lu.assertEquals(gc.get_rng_state(), {seed = 11, offset = 5})
  gc.set_rng_state(s)
  assert_same(gc.rand({5}):tolist(), a, "the same draws")
  gc.set_rng_state({seed = -1, offset = 7})  -- 64-bit patterns round-trip
  lu.assertEquals(gc.get_rng_state(), {seed = -1, offset = 7})
  assert_err(function () gc.set_rng_state(3) end,
             HERE, "set_rng_state: the state must be a table {seed = n, offset = n}, got number")
  assert_err(function () gc.set_rng_state({seed = 1}) end,
             "set_rng_state: the state.offset must be an integer, got nil")
  assert_err(function () gc.set_rng_state({seed = 1, offset = 0, x = 1}) end,
             "the state has an unknown field 'x'")
end

-- Reading or writing the state is a host copy: refused in a capture.
function TestRNGState:test_refused_in_capture ()
  local s = gc.get_rng_state()
  local tr = gc.random.RNGStatesTracker()
  tr:add("a", 1)
  for what, f in pairs({get_rng_state = function () return gc.get_rng_state() end,
                        set_rng_state = function () gc.set_rng_state(s) end,
                        ["RNGStatesTracker:add"] = function () tr:add("b", 2) end,
                        ["RNGStatesTracker:get_states"] = function () return tr:get_states() end,
                        ["RNGStatesTracker:set_states"] = function () tr:set_states({}) end}) do
    assert_err(function () gc.Graph():capture(f) end,
               HERE, what .. ": not allowed while a capture is open")
    lu.assertFalse(gc.is_capturing())
  end
  lu.assertEquals(tr:get_states(), {a = {seed = 1, offset = 0}})
end

TestTracker = {}

function TestTracker:test_add_fork_states ()
  local tr = gc.random.RNGStatesTracker()
  lu.assertIs(getmetatable(gc.random.CudaRNGStatesTracker()), getmetatable(tr))
  lu.assertFalse(tr:is_initialized())
  tr:add(NAME, 1234)
  tr:add("data", 7)
  lu.assertTrue(tr:is_initialized())
  gc.manual_seed(1)
  local before = gc.get_rng_state()
  local a = tr:fork(NAME, function ()
    lu.assertEquals(gc.get_rng_state(), {seed = 1234, offset = 0})  -- the tracked state is in use
    return gc.rand({6})
  end)
  lu.assertEquals(gc.get_rng_state(), before)  -- the default generator drew nothing
  lu.assertEquals(tr:get_states(), {[NAME] = {seed = 1234, offset = 6}, data = {seed = 7, offset = 0}})
  local b = tr:fork(function () return gc.rand({6}) end)  -- Megatron's default name
  lu.assertEquals(tr:get_states()[NAME], {seed = 1234, offset = 12})
  gc.manual_seed(1234)
  local ref = gc.rand({12}):tolist()
  assert_same({table.unpack(ref, 1, 6)}, a:tolist(), "first fork")
  assert_same({table.unpack(ref, 7, 12)}, b:tolist(), "second fork")
  -- set_states: in place, new names added, others dropped (as Megatron's)
  tr:set_states({[NAME] = {seed = 1234, offset = 0}, new = {seed = 5, offset = 3}})
  lu.assertEquals(tr:get_states(), {[NAME] = {seed = 1234, offset = 0}, new = {seed = 5, offset = 3}})
  assert_same(tr:fork(NAME, function () return gc.rand({6}) end):tolist(), a:tolist(), "set back")
  tr:reset()
  lu.assertFalse(tr:is_initialized())
  lu.assertEquals(tr:get_states(), {})
end

function TestTracker:test_errors ()
  local tr = gc.random.RNGStatesTracker()
  tr:add(NAME, 1)
  assert_err(function () tr:add("other", 1) end, HERE, "RNGStatesTracker:add: seed 1 already exists")
  assert_err(function () tr:add(NAME, 2) end,
             "RNGStatesTracker:add: cuda rng state model-parallel-rng already exists")
  assert_err(function () tr:fork("nope", function () end) end,
             "RNGStatesTracker:fork: cuda rng state nope is not added")
  assert_err(function () tr:add(3, 1) end, "add: name must be a string, got number")
  assert_err(function () tr:add("x", 1.5) end, "add: seed must be an integer, got float")
  assert_err(function () tr:fork(NAME, 3) end, "fork: fn must be a function, got number")
  assert_err(function () tr.fork(3) end, "call it with ':'")
  assert_err(function () tr:set_states({a = {seed = 1}}) end,
             "set_states: states.a.offset must be an integer")
  lu.assertEquals(tr:get_states(), {[NAME] = {seed = 1, offset = 0}})  -- as before
  -- fn's error passes as raised; the generator in use comes back
  local before = gc.get_rng_state()
  assert_err(function () tr:fork(NAME, function () error("inner") end) end, HERE, "inner")
  lu.assertEquals(gc.get_rng_state(), before)
end

-- A Linear whose dropout draws from the tracked state (fork) and from the
-- default generator.
local function forked_dropout (tr)
  local M = gc.nn.Module("Forked")
  function M:init () self.l = gc.nn.Linear(8, 8) end
  function M:forward (x)
    local h = tr:fork(NAME, function () return gc.F.dropout(self.l(x), 0.5) end)
    return gc.F.dropout(h, 0.25)
  end
  return M
end

-- steps of training: each step's output, grads, and the states after.
local function train (m, g, x, steps, tr)
  local out = {}
  for i = 1, steps do
    m:zero_grad()
    x.grad = nil
    local y = g(x)
    y:sum():backward()
    out[i] = {y:tolist(), x.grad:tolist(), m.l.weight.grad:tolist()}
  end
  out.states, out.default = tr:get_states(), gc.get_rng_state()
  return out
end

-- Graphed replays draw from the tracked state and advance it as eager
-- steps do: the same masks, grads and states, bit for bit; graphing itself
-- leaves every state as it found it.
function TestTracker:test_graphed_advances_tracked_state ()
  local function run (graphed)
    local tr = gc.random.RNGStatesTracker()
    tr:add(NAME, 99)
    gc.manual_seed(5)
    local m = forked_dropout(tr)()
    local x = H.input({4, 8}, 3, true)
    local g = m
    if graphed then
      local states, default = tr:get_states(), gc.get_rng_state()
      g = gc.make_graphed_callables(m, {x}, {num_warmup_iters = 2})
      lu.assertEquals(tr:get_states(), states, "graphing drew from the tracked state")
      lu.assertEquals(gc.get_rng_state(), default, "graphing drew from the default generator")
    end
    return train(m, g, x, 3, tr)
  end
  local eager, graphed = run(false), run(true)
  assert_same(graphed, eager, "graphed vs eager")
  lu.assertEquals(graphed.states[NAME].offset, 3 * 4 * 8)
end

-- The graph keeps the tracked state's memory: a tracker reset (its
-- generator collected) leaves replays working.
function TestTracker:test_graph_outlives_tracker ()
  local tr = gc.random.RNGStatesTracker()
  tr:add(NAME, 3)
  local m = forked_dropout(tr)()
  local x = gc.ones({2, 8})
  local g = gc.make_graphed_callables(m, {x})
  tr:reset()
  collectgarbage()
  collectgarbage()
  local y = g(x)
  lu.assertEquals(#y:tolist(), 2)
end

-- A failed make_graphed_callables leaves the tracked states as they were.
function TestTracker:test_failed_call_leaves_states ()
  local tr = gc.random.RNGStatesTracker()
  tr:add(NAME, 8)
  local states, default = tr:get_states(), gc.get_rng_state()
  local f = function (x)
    local y = tr:fork(NAME, function () return gc.F.dropout(x, 0.5) end)
    if gc.is_capturing() then error("late failure") end
    return y
  end
  assert_err(function () gc.make_graphed_callables(f, {gc.ones({4})}) end, "late failure")
  lu.assertEquals(tr:get_states(), states)
  lu.assertEquals(gc.get_rng_state(), default)
end

-- ---------------------------------------------------------------------------

TestCheckpoint = {}

-- Two Linears with gelu and dropout between them: the checkpointed block.
local function block ()
  local B = gc.nn.Module("Block")
  function B:init () self.a, self.b = gc.nn.Linear(8, 16), gc.nn.Linear(16, 8) end
  function B:forward (x) return self.b(gc.F.dropout(gc.F.gelu(self.a(x)), 0.3)) end
  return B
end

-- A model running the block plainly or checkpointed.
local function model (ckpt)
  local M = gc.nn.Module("Model")
  function M:init () self.blk = block()() end
  function M:forward (x)
    if ckpt then return gc.checkpoint(self.blk, x) end
    return self.blk(x)
  end
  return M
end

local function grads_of (m)
  local out = {}
  for i, p in ipairs(m:parameters()) do out[i] = p.grad:tolist() end
  return out
end

-- Eager: a checkpointed block gives the plain block's values and grads bit
-- for bit (the recomputation draws the forward's dropout masks), and leaves
-- the generator where the plain run leaves it.
function TestCheckpoint:test_eager_equals_plain ()
  local res = {}
  for _, ckpt in ipairs({false, true}) do
    gc.manual_seed(21)
    local m = model(ckpt)()
    local x = H.input({4, 8}, 5, true)
    local y = m(x)
    lu.assertEquals(y.grad_fn, ckpt and "checkpoint" or "linear")
    y:sum():backward()
    res[#res + 1] = {y:tolist(), x.grad:tolist(), grads_of(m), gc.get_rng_state()}
  end
  assert_same(res[2], res[1], "checkpointed vs plain")
end

-- Graphed: the recomputation inside the captured backward restores the
-- generators on the device, so graphed steps equal eager checkpointed ones
-- bit for bit, with the tracker's state forked inside too.
function TestCheckpoint:test_graphed_equals_eager_with_tracker ()
  local function run (graphed)
    local tr = gc.random.RNGStatesTracker()
    tr:add(NAME, 17)
    gc.manual_seed(4)
    local M = gc.nn.Module("CkModel")
    function M:init () self.l = gc.nn.Linear(8, 8) end
    function M:forward (x)
      return gc.checkpoint(function (t)
        local h = tr:fork(NAME, function () return gc.F.dropout(self.l(t), 0.5) end)
        return gc.F.dropout(gc.F.gelu(h), 0.2)
      end, x)
    end
    local m = M()
    local x = H.input({4, 8}, 6, true)
    local g = graphed and gc.make_graphed_callables(m, {x}, {num_warmup_iters = 2}) or m
    return train(m, g, x, 3, tr)
  end
  local eager, graphed = run(false), run(true)
  assert_same(graphed, eager, "graphed vs eager")
end

-- Without grad recording it is fn(...); a module as fn whose input needs no
-- grad still gives its parameters grads; errors name the problem.
function TestCheckpoint:test_modes_and_errors ()
  local lin = gc.nn.Linear(4, 4)
  local x = gc.ones({2, 4})
  lu.assertNil(gc.no_grad(function () return gc.checkpoint(lin, x) end).grad_fn)
  gc.checkpoint(lin, x):sum():backward()
  lu.assertNotNil(lin.weight.grad)
  assert_err(function () return gc.checkpoint(3, x) end,
             HERE, "checkpoint: fn must be a function or a module, got number")
  assert_err(function () return gc.checkpoint(function (t) return lin(t) end, x) end,
             "checkpoint: no tensor argument requires grad")
  local xg = gc.ones({2, 4}, {requires_grad = true})
  assert_err(function () return gc.checkpoint(function (t) return t, t end, xg) end,
             "checkpoint: fn must return one tensor, got 2 values")
  assert_err(function () return gc.checkpoint(function () error("in fn") end, xg) end,
             HERE, "in fn")
  -- its inputs are saved: one written in place before backward is refused
  local inp = xg * 1
  local y = gc.checkpoint(function (t) return t * 2 end, inp)
  lu.assertEquals(y.grad_fn, "checkpoint")
  gc.no_grad(function () inp:fill_(0) end)
  assert_err(function () y:sum():backward() end, "modified by an inplace operation")
end

os.exit(lu.LuaUnit.run(), true)
