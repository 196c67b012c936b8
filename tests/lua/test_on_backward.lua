-- test_on_backward.lua: gc.autograd.on_backward, the identity node whose
-- backward runs a function (what gc.ddp and gc.fsdp run their collectives
-- from): it runs after the backward of everything computed from its output,
-- the parameter grads of a module called on it accumulated; it passes the
-- grad on unchanged; with an anchor it runs when its input needs no grad,
-- giving no grad to either; inside a graphed callable what it launches is
-- captured and replayed, and the function is not called at replay.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_on_backward.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

TestOnBackward = {}

local function linear ()
  gc.manual_seed(2)
  return gc.nn.Linear(3, 2)
end
local x0 = gc.tensor({{1, 2, 3}, {-1, 0.5, 2}})

function TestOnBackward:test_after_the_module ()
  local l, seen = linear(), nil
  local x = x0:clone():requires_grad_(true)
  local y = l(gc.autograd.on_backward("Probe", x, function ()
    seen = l.weight.grad and l.weight.grad:tolist()
  end))
  y:sum():backward()
  lu.assertNotNil(seen, "the weight's grad was not there when the node ran")
  H.assert_bitwise(seen, l.weight.grad:tolist(), "weight grad at the node")
  -- the grad passes through unchanged: x.grad equals the plain module's
  local m, x2 = linear(), x0:clone():requires_grad_(true)
  m(x2):sum():backward()
  H.assert_bitwise(x.grad:tolist(), x2.grad:tolist(), "input grad")
end

function TestOnBackward:test_anchor ()
  local l, runs = linear(), 0
  local y = l(gc.autograd.on_backward("Probe", x0, function () runs = runs + 1 end, l.weight))
  y:sum():backward()
  lu.assertEquals(runs, 1)
  local m = linear()
  m(x0):sum():backward()
  H.assert_bitwise(l.weight.grad:tolist(), m.weight.grad:tolist(), "the anchor gets no grad")
  -- without an anchor an input that needs no grad records no node
  local z = gc.autograd.on_backward("Probe", x0, function () runs = runs + 1 end)
  lu.assertFalse(z.requires_grad)
end

-- Inside a graphed callable: the function doubles the weight's grad; the
-- replayed backward doubles it without calling the function.
function TestOnBackward:test_graphed ()
  local Doubled = gc.nn.Module("Doubled")
  local runs = 0
  function Doubled:init () self.l = linear() end
  function Doubled:forward (x)
    local w = self.l.weight
    return self.l(gc.autograd.on_backward("Double", x, function ()
      runs = runs + 1
      w.grad:copy_(w.grad + w.grad)
    end, w))
  end
  local eager, graphed = Doubled(), Doubled()
  eager(x0):sum():backward()
  local G = gc.make_graphed_callables(graphed, {gc.zeros({2, 3})})
  graphed:zero_grad()
  runs = 0
  G(x0):sum():backward()
  lu.assertEquals(runs, 0)
  H.assert_bitwise(graphed.l.weight.grad:tolist(), eager.l.weight.grad:tolist(), "doubled grad")
  local plain = linear()
  plain(x0):sum():backward()
  lu.assertEquals(graphed.l.weight.grad:tolist()[1][1], 2 * plain.weight.grad:tolist()[1][1])
end

-- The node is named as given (its grad_fn); a name a node cannot take and
-- an error raised by the function are errors of the call, the latter from
-- backward as it was raised; the next backward runs normally.
function TestOnBackward:test_name_and_errors ()
  local x = x0:clone():requires_grad_(true)
  lu.assertEquals(gc.autograd.on_backward("Named", x, print).grad_fn, "Named")
  H.assert_err(function () gc.autograd.on_backward(("n"):rep(64), x, print) end,
               "on_backward: name must be 1 to 63 bytes without a zero byte, got 64 bytes")
  local fail = true
  local y = gc.autograd.on_backward("Probe", x, function ()
    if fail then error("probe failed", 0) end
  end)
  H.assert_err(function () y:sum():backward({retain_graph = true}) end, "probe failed")
  fail = false
  y:sum():backward()
  H.assert_bitwise(x.grad:tolist(), gc.ones({2, 3}):tolist(), "the grad after the retry")
end

os.exit(lu.LuaUnit.run(), true)
