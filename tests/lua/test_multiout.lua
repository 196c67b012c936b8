-- test_multiout.lua: modules and functions with several outputs (tensors,
-- nil, and tables of them). A Lua module called directly returns what its
-- forward returned, unchanged: the same Lua values in the same places, whose
-- grads flow back as if the forward had been called as a plain function
-- (bit for bit); a module inside a Sequential still takes one output tensor,
-- and says so; graphed callables return the structure they captured. Hooks
-- on modules of several outputs: test_multi_hooks.lua.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_multiout.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
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
                      closed = "Bad:forward returned a closed tensor"} do
    what = w
    assert_err(function () return r(gc.ones({2})) end, HERE, msg)
  end
  what = "nothing"                                  -- no tensor in, none out: nil
  lu.assertEquals(select("#", r()), 1)
  lu.assertNil((r()))
  what = nil
  local a, b = r(gc.ones({2}))                      -- still usable
  lu.assertNotNil(b)
  lu.assertIs(a, b)
end
-- ---------------------------------------------------------------------------
-- Graphed callables return what the callable returned at capture

local function is_tensor (v)
  return getmetatable(v) == getmetatable(gc.ones({1}))
end

-- Values of the outputs of one call (nested tables of numbers; nil stays nil).
local function values_of (v)
  if v == nil then return nil end
  if is_tensor(v) then return v:tolist() end
  local t = {}
  for k, x in pairs(v) do t[k] = values_of(x) end
  return t
end

local function assert_same_values (got, want, what)
  lu.assertEquals(type(got), type(want), what)
  if type(want) ~= "table" then return end
  if type(want[1]) == "number" or type(want[1]) == "table" and type(want[1][1]) == "number" then
    assert_bitwise(got, want, what)
    return
  end
  for k, x in pairs(want) do assert_same_values(got[k], x, what .. "." .. tostring(k)) end
  for k in pairs(got) do lu.assertNotNil(want[k], what .. ": extra key " .. tostring(k)) end
end

TestGraphedMultiOut = {tearDown = H.no_capture_left}

-- A function of several outputs with nil among them, and capture_time_hooks:
-- each replay returns the same places, nil where it returned nil; one
-- backward over a loss of two outputs equals eager bit for bit.
function TestGraphedMultiOut:test_function_several_values_and_nil ()
  local function f (x) return x * 2, nil, gc.F.gelu(x), x:detach() end
  local ran = 0
  local hook = function () ran = ran + 1 end
  local g = gc.make_graphed_callables(f, {input(9)}, {capture_time_hooks =
    {{forward_pre_hooks = {hook}, forward_hooks = {hook}, backward_pre_hooks = {hook},
      backward_hooks = {hook}}}})
  local at_capture = ran
  lu.assertTrue(at_capture >= 4)
  local st = g:stats()
  lu.assertEquals(st.outputs, 4)
  lu.assertEquals(st.grad_outputs, 2)         -- x:detach() needs none: it has no grad buffer
  for step = 1, 3 do
    local xg, xe = input(step), input(step)
    local rg, re = table.pack(g(xg)), table.pack(f(xe))
    lu.assertEquals(rg.n, 4)
    lu.assertNil(rg[2])
    lu.assertFalse(rg[4].requires_grad)
    for k = 1, 4 do assert_same_values(values_of(rg[k]), values_of(re[k]), "output " .. k) end
    -- step 2: only gelu(x)'s grad arrives; the other static grad is zeros
    local function l (r) return step == 2 and (r[3] * r[3]):sum() or loss(r[1], r[3]) end
    l(rg):backward()
    l(re):backward()
    assert_bitwise(xg.grad:tolist(), xe.grad:tolist(), "input grad, step " .. step)
  end
  lu.assertEquals(ran, at_capture)            -- hooks run while graphing only
end

-- A Lua module of a map output, graphed in place: m(x) replays and returns
-- the map; grads flow through both of its tensors.
local Chunk = gc.nn.Module("Chunk")
function Chunk:init (opts)
  gc.manual_seed(7)
  self.lin = gc.nn.Linear(4, 4, opts)
end
function Chunk:forward (x)
  local h = self.lin(x)
  return {main = gc.F.gelu(h), aux = {h * 2, h:detach()}}
end

local function chunk_loss (out)
  return loss(out.aux[1], out.main)
end

function TestGraphedMultiOut:test_module_map_graphed_in_place ()
  local a, b = Chunk(), Chunk()
  gc.make_graphed_callables(b, {input(0)})
  for step = 1, 2 do
    local xa, xb = input(step), input(step)
    local oa, ob = a(xa), b(xb)
    assert_same_values(values_of(ob), values_of(oa), "outputs")
    chunk_loss(oa):backward()
    chunk_loss(ob):backward()
    assert_bitwise(xb.grad:tolist(), xa.grad:tolist(), "input grad")
  end
  assert_bitwise(b.lin.weight.grad:tolist(), a.lin.weight.grad:tolist(), "weight grad")
  assert_bitwise(b.lin.bias.grad:tolist(), a.lin.bias.grad:tolist(), "bias grad")
end

-- Walk an order: fwd(entry, chunk, slot) -> the slot's loss; bwd runs the
-- loss of the chunk's oldest forward; dw(entry, chunk) a delayed wgrad.
-- Entry of chunk k, microbatch b: (k - 1) * mbs + b.
local function walk (order, mbs, fwd, dw)
  local nf, nb, nd, slots, losses, n = {0, 0}, {0, 0}, {0, 0}, {{}, {}}, {}, 0
  for _, v in ipairs(order) do
    local k = math.floor(math.abs(v))
    if v > 0 then
      n, nf[k] = n + 1, nf[k] + 1
      slots[k][nf[k]] = n
      losses[n] = fwd((k - 1) * mbs + (nf[k] - 1) % mbs + 1, k, n)
    elseif v == -k then
      nb[k] = nb[k] + 1
      losses[slots[k][nb[k]]]:backward()
    else
      nd[k] = nd[k] + 1
      dw((k - 1) * mbs + (nd[k] - 1) % mbs + 1, k)
    end
  end
end

-- Two Chunks along an order, graphed (entries) and eager: outputs, input
-- grads and parameter grads bit for bit.
local function check_order (order, mbs, opts, lin_opts)
  local a, b = {Chunk(lin_opts), Chunk(lin_opts)}, {Chunk(lin_opts), Chunk(lin_opts)}
  local samples = {}
  for i = 1, 2 * mbs do samples[i] = {input(50 + i)} end
  opts.order = order
  local G = gc.make_graphed_callables(b, samples, opts)
  for i = 1, #G do
    lu.assertEquals(G[i]:stats().outputs, 3)       -- main, aux[1], aux[2]
    lu.assertEquals(G[i]:stats().grad_outputs, 2)  -- not aux[2], h detached
  end
  local res = {}
  for _, side in ipairs{"eager", "graphed"} do
    local r = {outs = {}, xs = {}}
    res[side] = r
    walk(order, mbs,
         function (i, k, slot)
           local x = input(slot)
           r.xs[slot] = x
           local out = side == "eager" and a[k](x) or G[i](x)
           r.outs[slot] = values_of(out)            -- read now: reused buffers change later
           return chunk_loss(out)
         end,
         function (i, k) if side == "eager" then a[k]:backward_dw() else G[i]:backward_dw() end end)
  end
  for slot, o in pairs(res.eager.outs) do
    assert_same_values(res.graphed.outs[slot], o, "outputs of forward " .. slot)
    assert_bitwise(res.graphed.xs[slot].grad:tolist(), res.eager.xs[slot].grad:tolist(),
                   "input grad of forward " .. slot)
  end
  for k = 1, 2 do
    local pa, pb = a[k]:parameters(), b[k]:parameters()
    for j = 1, #pa do
      lu.assertNotNil(pa[j].grad)
      assert_bitwise(pb[j].grad:tolist(), pa[j].grad:tolist(), "chunk " .. k .. " grad " .. j)
    end
  end
end

function TestGraphedMultiOut:test_order_and_reuse ()
  check_order({1, 2, -2, 1, -1, 2, -2, -1}, 2, {reuse_graph_input_output_buffers = true})
end

function TestGraphedMultiOut:test_order_delayed_wgrad ()
  check_order({1, 2, -2, -2.5, -1, -1.5}, 1, {}, {delay_wgrad = true})
end

-- A replay that would give another count of outputs than the capture's
-- structure has: not possible through the engine, but a structure of
-- another graphing is checked against the count.
function TestGraphedMultiOut:test_single_output_unchanged ()
  local g = gc.make_graphed_callables(function (x) return x * 3 end, {input(0)})
  local y = g(input(1))
  lu.assertTrue(is_tensor(y))
  lu.assertEquals(g:stats().outputs, 1)
  lu.assertEquals(g:stats().grad_outputs, 1)
end

-- An entry of a module in another mode than at capture runs its forward
-- eagerly and returns what that forward returned (here another structure).
function TestGraphedMultiOut:test_other_mode_returns_eager_structure ()
  local M = gc.nn.Module("Moded")
  function M:init () gc.manual_seed(3) self.lin = gc.nn.Linear(4, 4) end
  function M:forward (x)
    local h = self.lin(x)
    if self.training then return {main = h, aux = h * 2} end
    return h, nil, h * 3
  end
  local a, b = M(), M()
  local G = gc.make_graphed_callables({a, b}, {{input(1)}, {input(2)}}, {order = {1, 2, -2, -1}})
  local x = input(3)
  local t = G[1](x)
  assert_bitwise(t.aux:tolist(), (a.lin(x) * 2):tolist(), "aux")
  a:eval()
  local r = table.pack(G[1](x))
  lu.assertEquals(r.n, 3)
  lu.assertNil(r[2])
  assert_bitwise(r[3]:tolist(), (a.lin(x) * 3):tolist(), "eval output 3")
end

-- regression: an output without a grad dropped the other outputs' grads
-- A graphed callable with two outputs that require grad: when the backward reached the node
-- of the last output without a grad (here through a Function whose backward gives none),
-- the grads of the other output were dropped and the backward graph never replayed, so
-- the parameters and the input got no grad at all, without a word.
function TestGraphedMultiOut:test_output_without_grad_keeps_the_others ()
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

os.exit(lu.LuaUnit.run(), true)
