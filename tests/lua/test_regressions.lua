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

os.exit(lu.LuaUnit.run())
