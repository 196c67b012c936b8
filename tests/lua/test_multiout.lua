-- test_multiout.lua: modules and functions with several outputs (tensors,
-- nil, and tables of them). A Lua module called directly returns what its
-- forward returned, unchanged: the same Lua values in the same places, whose
-- grads flow back as if the forward had been called as a plain function
-- (bit for bit); a module inside a Sequential, one with forward or backward
-- hooks, and a graphed callable still take one output tensor, and say so.
--   build/graphcap tests/lua/test_multiout.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = dofile(debug.getinfo(1, "S").source:match("^@?(.-)[^/\\]*$") .. "helpers.lua")
local assert_bitwise, assert_err = H.assert_bitwise, H.assert_err

local HERE = debug.getinfo(1, "S").short_src .. ":"  -- errors name the user's line

local function input (phase)
  return gc.tensor(H.nest(H.values(12, phase, 1.5), {3, 4}), {requires_grad = true})
end

-- A module of one Linear(4, 4) whose forward returns what 'shape' says.
local Multi = gc.nn.Module("Multi")
function Multi:init (shape)
  gc.manual_seed(3)
  self.lin = gc.nn.Linear(4, 4)
  self.shape = shape
end
function Multi:forward (x)
  local h = self.lin(x)
  local a, b = h * 2, gc.F.gelu(h)
  if self.shape == "two" then return a, b
  elseif self.shape == "nil" then return a, nil, b
  elseif self.shape == "seq" then return {a, b}
  elseif self.shape == "map" then return {main = a, aux = {b, x:detach()}}
  elseif self.shape == "none" then return nil
  end
  return a
end

-- The loss of several outputs: sum(a) + sum(b * b)
local function loss (a, b)
  return a:sum() + (b * b):sum()
end

-- The same module's forward as a plain Lua function (no module call).
local function direct (m, x)
  return Multi.forward(m, x)
end

TestMultiOut = {}

function TestMultiOut:test_several_values_and_nil ()
  for _, shape in ipairs{"two", "nil"} do
    local m, x = Multi(shape), input(0)
    local r = table.pack(m(x))
    lu.assertEquals(r.n, shape == "two" and 2 or 3, shape)
    local a, b = r[1], r[r.n]
    if shape == "nil" then lu.assertNil(r[2]) end
    loss(a, b):backward()
    local gw, gx = m.lin.weight.grad:tolist(), x.grad:tolist()
    -- the forward called as a function: the same values and grads, bit for bit
    local m2, x2 = Multi(shape), input(0)
    local r2 = table.pack(direct(m2, x2))
    assert_bitwise(a:tolist(), r2[1]:tolist(), shape .. " a")
    assert_bitwise(b:tolist(), r2[r2.n]:tolist(), shape .. " b")
    loss(r2[1], r2[r2.n]):backward()
    assert_bitwise(gw, m2.lin.weight.grad:tolist(), shape .. " weight grad")
    assert_bitwise(gx, x2.grad:tolist(), shape .. " input grad")
  end
end

function TestMultiOut:test_tables_keep_their_structure ()
  local m, x = Multi("seq"), input(1)
  local t = m(x)
  lu.assertEquals(#t, 2)
  loss(t[1], t[2]):backward()
  local m2, x2 = Multi("seq"), input(1)
  local t2 = direct(m2, x2)
  loss(t2[1], t2[2]):backward()
  assert_bitwise(m.lin.weight.grad:tolist(), m2.lin.weight.grad:tolist(), "seq weight grad")
  local mm = Multi("map")
  local d = mm(x)
  lu.assertIs(d.aux[2].requires_grad, false)
  assert_bitwise(d.main:tolist(), t[1]:tolist(), "map main")
  assert_bitwise(d.aux[1]:tolist(), t[2]:tolist(), "map aux")
  lu.assertEquals(select("#", Multi("none")(x)), 1)
  lu.assertNil((Multi("none")(x)))
end

function TestMultiOut:test_bad_results_and_limits ()
  local R = gc.nn.Module("Bad")
  local what
  function R:forward (x)
    if what == "number" then return x, 3
    elseif what == "key" then return {[true] = x}
    elseif what == "closed" then local t = gc.ones({1}); t:close(); return {x, t}
    elseif what == "nothing" then return nil
    end
    return x, x
  end
  local r = R()
  for w, msg in pairs{number = "Bad:forward must return tensors, nil or tables of them, got number",
                      key = "Bad:forward returned a table with a boolean key",
                      closed = "Bad:forward returned a closed tensor",
                      nothing = "Bad:forward returned no tensor and took none"} do
    what = w
    if w == "nothing" then
      assert_err(function () return r() end, HERE, msg)
    else
      assert_err(function () return r(gc.ones({2})) end, HERE, msg)
    end
  end
  what = nil
  local a, b = r(gc.ones({2}))                      -- still usable
  lu.assertNotNil(b)
  lu.assertIs(a, b)
  -- hooks that see the output take one tensor
  local h = r:register_forward_hook(function () end)
  assert_err(function () return r(gc.ones({2})) end, HERE,
             "Bad:forward must return one tensor: the module has forward or backward hooks")
  h:remove()
  lu.assertNotNil(select(2, r(gc.ones({2}))))
end
os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
