-- test_binding.lua: what the binding keeps to itself and what every class
-- of boxes shares: a graphed module's kwargs keys are no field of the
-- module (and come off again when graphing fails); every class closes the
-- same way (idempotent, "(closed)", "<what> is closed"); errors raised deep
-- in the facade name the caller's line.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_binding.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

local HERE = debug.getinfo(1, "S").short_src

-- A module whose forward takes an optional kwargs map {scale, shift}.
local Masked = gc.nn.Module("Masked")
function Masked:init () self.lin = gc.nn.Linear(8, 8) end
function Masked:forward (x, kw)
  local y = self.lin(x)
  if kw then y = y * kw.scale + kw.shift end
  return y
end

local function kwargs ()
  return {scale = gc.full({4, 8}, 2), shift = gc.ones({4, 8})}
end

TestBinding = {}

-- The keys travel in the module's box, not in a field the user can see:
-- a field of that name is the user's, before and after graphing.
function TestBinding:test_kwargs_keys_are_no_field ()
  gc.manual_seed(3)
  local m = Masked()
  m.graphed_kwargs = "mine"
  local G = gc.make_graphed_callables(m, {gc.ones({4, 8}, {requires_grad = true})},
                                      {sample_kwargs = kwargs()})
  lu.assertIs(G, m)
  lu.assertEquals(m.graphed_kwargs, "mine")
  local x = gc.full({4, 8}, 0.5)
  local want = m.lin(x) * gc.full({4, 8}, 2) + gc.ones({4, 8})
  H.assert_bitwise(G(x, kwargs()):tolist(), want:tolist(), "graphed output")
end

-- Graphing that fails leaves the module as it was: called without a kwargs
-- map it runs eagerly, as before.
function TestBinding:test_failed_graphing_takes_the_keys_off ()
  gc.manual_seed(3)
  local m = Masked()
  local x = gc.full({4, 8}, 0.5)
  local want = m(x):tolist()
  H.assert_err(function ()
    gc.make_graphed_callables(m, {gc.ones({4, 8}, {requires_grad = true})},
                              {sample_kwargs = kwargs(), capture_time_hooks = {
                                {forward_hooks = {function () error("hook failed") end}}}})
  end, "hook failed")
  H.assert_bitwise(m(x):tolist(), want, "eager output after the failed call")
end

-- Every class: close twice, tostring says "(closed)", a method says which
-- object is closed.
function TestBinding:test_every_class_closes_alike ()
  local p = gc.zeros({2}, {requires_grad = true})
  local lin = gc.nn.Linear(2, 2)
  local G = gc.make_graphed_callables(gc.nn.Linear(2, 2), {gc.ones({1, 2})}).graphed_callables
  local cases = {
    {gc.zeros({2}), "graphcap.Tensor", "tensor is closed", function (o) return o:numel() end},
    {gc.Stream(), "graphcap.Stream", "stream is closed", function (o) o:synchronize() end},
    {gc.Event(), "graphcap.Event", "event is closed", function (o) o:synchronize() end},
    {gc.graph_pool_handle(), "graphcap.Pool", "pool is closed", function (o) return o:stats() end},
    {gc.Graph(), "graphcap.Graph", "graph is closed", function (o) return o:name() end},
    {lin, "graphcap.Module", "module is closed", function (o) return o:parameters() end},
    {gc.optim.SGD({p}, {lr = 0.1}), "graphcap.Optimizer", "optimizer is closed",
     function (o) o:step() end},
    {G, nil, "graphed callables are closed", function (o) return o:stats(1) end},
  }
  for _, c in ipairs(cases) do
    local o, name, closed, use = c[1], c[2], c[3], c[4]
    o:close()
    o:close()
    if name then lu.assertEquals(tostring(o), name .. " (closed)") end
    H.assert_err(function () use(o) end, closed, HERE .. ":")
  end
end

-- A facade function reached through tail calls still names the caller's line.
function TestBinding:test_facade_errors_name_the_callers_line ()
  local line = debug.getinfo(1, "l").currentline + 1
  H.assert_err(function () gc.no_grad(42) end, HERE .. ":" .. line .. ": no_grad: fn must be a function")
  line = debug.getinfo(1, "l").currentline + 1
  H.assert_err(function () gc.nn.Linear(2, 2, {bias = 1}) end, HERE .. ":" .. line .. ": Linear: bias")
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
