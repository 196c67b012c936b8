-- test_graphed_stale.lua: graphed state that something rewrote before the
-- graph read it (docs/semantics.md, "make_graphed_callables", "What a graphed
-- backward checks"). Each program either gives eager's result bit for bit or
-- raises an error that names the entry, the tensor or call, and what to do:
-- a second forward before the first one's backward.
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

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
