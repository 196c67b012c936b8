-- test_graphed_mix.lua: the graphed call path's features combined, as a
-- user would combine them (docs/semantics.md, "make_graphed_callables",
-- "What a graphed backward checks"): reset beside reuse_graph_input_output_buffers
-- and pending calls, delayed wgrad beside later calls, a submodule's mode
-- beside the replay options. Each program gives eager's result bit for bit
-- or raises an error that names the entry and what to do, and the objects
-- stay usable after it.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_graphed_mix.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

local function grads (ps)
  local out = {}
  for i, p in ipairs(ps) do out[i] = p.grad and p.grad:tolist() or "none" end
  return out
end

-- A Linear(8, 8) to run eagerly and its twin graphed as two microbatch
-- entries sharing their static inputs (reuse), order {1, -1, 1, -1}.
local function reused ()
  gc.manual_seed(1)
  local a = gc.nn.Linear(8, 8)
  gc.manual_seed(1)
  local b = gc.nn.Linear(8, 8)
  local G = gc.make_graphed_callables({b}, H.samples(2), {order = {1, -1, 1, -1},
                                                          reuse_graph_input_output_buffers = true})
  return a, b, G
end

TestGraphedMix = {tearDown = H.no_capture_left}

-- regression: with reuse, entry 2's replay after entry 1's reset marked its freed output dead: a crash
function TestGraphedMix:test_reuse_then_reset_one_entry ()
  local a, b, G = reused()
  local x = gc.randn({4, 8}, {requires_grad = true})
  local y1 = G[1](x)
  y1:sum():backward()
  G[1]:reset()
  x.grad, b.weight.grad, b.bias.grad = nil, nil, nil
  local y2, want = G[2](x), a(x)
  H.assert_bitwise(y2:tolist(), want:tolist(), "entry 2 after entry 1's reset")
  y2:sum():backward()
  local xg = x.grad:tolist()
  x.grad = nil
  want:sum():backward()
  H.assert_bitwise(xg, x.grad:tolist(), "input grad")
  H.assert_same(grads(b:parameters()), grads(a:parameters()), "parameter grads")
  -- the view of entry 1's output kept across the reset: entry 2's graphs wrote its memory
  H.assert_err(function () return y1:tolist() end, "reading output #1 of graphed entry 1 refused")
end

-- regression: a call pending at entry 1's reset refused entry 2 (shared inputs) while it lived
function TestGraphedMix:test_reset_with_a_call_pending ()
  local a, b, G = reused()
  local x = gc.randn({4, 8}, {requires_grad = true})
  local y1 = G[1](x)
  G[1]:reset()
  H.assert_err(function () y1:sum():backward() end,
               "graphed backward: entry 1 was reset after call 1 (callable 1, Linear)",
               "run a call's backward before resetting its entry")
  local y2, want = G[2](x), a(x)
  H.assert_bitwise(y2:tolist(), want:tolist(), "entry 2 with entry 1's call alive")
  x.grad = nil
  y2:sum():backward()
  local xg = x.grad:tolist()
  x.grad = nil
  want:sum():backward()
  H.assert_bitwise(xg, x.grad:tolist(), "input grad")
  H.assert_same(grads(b:parameters()), grads(a:parameters()), "parameter grads")
  lu.assertNotNil(y1)
end

-- A delayed-wgrad Linear(8, 8) to run eagerly and its graphed twin.
local function delayed (opts)
  gc.manual_seed(1)
  local a = gc.nn.Linear(8, 8, {delay_wgrad = true})
  gc.manual_seed(1)
  local b = gc.nn.Linear(8, 8, {delay_wgrad = true})
  gc.make_graphed_callables(b, {gc.ones({4, 8}, {requires_grad = true})}, opts)
  return a, b
end

-- regression: backward_dw replayed with no wgrad due (2x eager's grads) or after a later call
function TestGraphedMix:test_backward_dw_as_eager_queue ()
  for _, clone in ipairs({true, false}) do
    local a, b = delayed({clone_param_grads_on_return = clone})
    local x1, x2 = gc.randn({4, 8}), gc.randn({4, 8})
    b:backward_dw() -- nothing due: nothing happens, as eagerly
    a:backward_dw()
    H.assert_same(grads(b:parameters()), grads(a:parameters()), "before any backward")
    b(x1):sum():backward()
    a(x1):sum():backward()
    b:backward_dw()
    b:backward_dw() -- drained: adds nothing
    a:backward_dw()
    a:backward_dw()
    H.assert_same(grads(b:parameters()), grads(a:parameters()), "twice")
    b(x1):sum():backward()
    a(x1):sum():backward()
    H.assert_err(function () return b(x2) end,
                 "graphed call of entry 1 (callable 1, Linear): the delayed wgrad of call 2 has "
                 .. "not run", "call backward_dw() of the entry before its next call")
    b:backward_dw() -- usable after: the wgrad of call 2, then call 3
    a:backward_dw()
    b(x2):sum():backward()
    a(x2):sum():backward()
    b:backward_dw()
    a:backward_dw()
    H.assert_same(grads(b:parameters()), grads(a:parameters()), "after the refusal")
  end
end

-- regression: a second backward of one call overwrote the grads the first's delayed wgrad reads
function TestGraphedMix:test_backward_twice_before_backward_dw ()
  local a, b = delayed({retain_graph_in_backward = true})
  local x = gc.randn({4, 8})
  local y, ye = b(x), a(x)
  y:sum():backward({retain_graph = true})
  ye:sum():backward({retain_graph = true})
  H.assert_err(function () (y * gc.tensor(2)):sum():backward() end,
               "graphed backward of call 1 of entry 1 (callable 1, Linear): the delayed wgrad of "
               .. "call 1's backward has not run", "call backward_dw() of the entry between")
  b:backward_dw()
  a:backward_dw()
  H.assert_same(grads(b:parameters()), grads(a:parameters()), "the first backward's wgrad")
  ;(y * gc.tensor(2)):sum():backward()
  ;(ye * gc.tensor(2)):sum():backward()
  b:backward_dw()
  a:backward_dw()
  H.assert_same(grads(b:parameters()), grads(a:parameters()), "then the second's")
end

-- regression: with a submodule switched, the error said the module itself was in eval mode
function TestGraphedMix:test_stream_with_a_submodule_switched ()
  local m = gc.nn.Sequential(gc.nn.Linear(8, 8), gc.nn.Dropout(0.5))
  local E = gc.make_graphed_callables({m}, {{gc.ones({4, 8}, {requires_grad = true})}})
  local s = gc.Stream()
  m[2]:eval()
  H.assert_err(function () return E[1](gc.ones({4, 8}), {cuda_graph_stream = s}) end,
               "graphed call of entry 1 (callable 1, Sequential): cuda_graph_stream and "
               .. "cuda_graph_event are options of a replay, but submodule '1' is in eval mode, "
               .. "graphed in training mode (it runs eagerly)")
  m[2]:train()
  lu.assertEquals(E[1](gc.ones({4, 8}), {cuda_graph_stream = s}).grad_fn, "graphed")
end

os.exit(lu.LuaUnit.run(), true)
