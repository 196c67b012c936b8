-- test_fp8_graphed.lua: make_graphed_callables' FP8 options (docs/lua-api.md,
-- "FP8"): graphed = eager bit for bit over several steps with
-- DelayedScaling, the FP8 state equal after them, also with an order;
-- graphing leaves the state as it was; weight caching across microbatches
-- with is_first_microbatch; delayed wgrads; the options' errors.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_fp8_graphed.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

local same = H.assert_same

local R = gc.fp8.DelayedScaling{amax_history_len = 3}

local function model (seed)
  gc.manual_seed(seed)
  return gc.nn.Sequential(gc.nn.LayerNormLinear(16, 32), gc.nn.GELU(), gc.nn.Linear(32, 16))
end

local function states (m)
  return {m[1]:fp8_state(), m[3]:fp8_state()}
end

local function grads (m)
  local out = {}
  for i, p in ipairs(m:parameters()) do out[i] = p.grad:tolist() end
  return out
end

TestFp8Graphed = {}

function TestFp8Graphed:test_graphed_equals_eager ()
  local eager, graphed = model(5), model(5)
  local x0 = gc.randn({8, 16}, {requires_grad = true})
  gc.make_graphed_callables(graphed, {x0}, {fp8_enabled = true, fp8_recipe = R})
  same(states(graphed)[1].input.amax_history, {0, 0, 0}, "graphing left the state")
  lu.assertEquals(states(graphed)[1].input.scale, 1)
  for step = 1, 4 do
    gc.manual_seed(100 + step)
    local x = gc.randn({8, 16}) * gc.tensor(step)
    H.fp8_step_pair(eager, graphed, R, x, gc.randn({8, 16}), "step " .. step)
    same(grads(graphed), grads(eager), "param grads " .. step)
    same(states(graphed), states(eager), "fp8_state " .. step)
  end
end

function TestFp8Graphed:test_order_and_per_callable_flags ()
  local function two (seed)
    gc.manual_seed(seed)
    return {gc.nn.Linear(16, 16), gc.nn.Linear(16, 16)}
  end
  local e, g = two(7), two(7)
  local s = {{gc.randn({8, 16}, {requires_grad = true})}, {gc.randn({8, 16}, {requires_grad = true})}}
  local G = gc.make_graphed_callables(g, s, {order = {1, 2, -2, -1}, enabled = {true, false},
                                             recipe = R})
  for step = 1, 3 do
    local x = gc.randn({8, 16}, {requires_grad = true})
    local ye = gc.fp8.autocast({recipe = R}, function () return e[1](x) end)
    local ze = e[2](ye)
    local yg = G[1](x)
    local zg = G[2](yg)
    H.assert_bitwise(zg:tolist(), ze:tolist(), "z " .. step)
    ze:sum():backward()
    zg:sum():backward()
    same(g[1]:fp8_state(), e[1]:fp8_state(), "state " .. step)
  end
  lu.assertEquals(g[2]:fp8_state().input.scale, 1, "callable 2 ran without FP8")
  same(g[2]:fp8_state().input.amax_history, {}, "no history")
end

function TestFp8Graphed:test_state_put_back_and_false_accepted ()
  local m = model(9)
  local x = gc.randn({8, 16}, {requires_grad = true})
  gc.fp8.autocast({recipe = R}, function () m(x):sum():backward() end)
  local before = states(m)
  gc.make_graphed_callables(m, {x}, {fp8_enabled = true, fp8_recipe = R, num_warmup_iters = 2})
  same(states(m), before, "the state as before the call")
  local plain = gc.nn.Linear(16, 16)
  gc.make_graphed_callables(plain, {x}, {fp8_enabled = false, fp8_weight_caching = false,
                                         fp8_group = nil})
  lu.assertEquals(plain(x).grad_fn, "graphed")
end

function TestFp8Graphed:test_weight_caching ()
  gc.manual_seed(12)
  local lin = gc.nn.Linear(16, 16)
  local x = gc.randn({8, 16})
  gc.make_graphed_callables(lin, {x}, {fp8_enabled = true, fp8_recipe = R,
                                       fp8_weight_caching = true})
  local function want (xs, wt, st)
    return gc.F.linear((gc.fp8.cast(xs, "E4M3", st.input.scale)),
                       (gc.fp8.cast(wt, "E4M3", st.weight.scale)), lin.bias:detach()):tolist()
  end
  local w1 = lin.weight:detach():clone()
  local x1, x2, x3 = gc.randn({8, 16}), gc.randn({8, 16}) * gc.tensor(2), gc.randn({8, 16})
  local st = lin:fp8_state()
  H.assert_fp8_gemm(lin(x1, {is_first_microbatch = true}):tolist(), want(x1, w1, st), "mb 1")
  local wst = lin:fp8_state().weight
  gc.no_grad(function () lin.weight:copy_(lin.weight * gc.tensor(3)) end)
  st = lin:fp8_state()
  local y2 = lin(x2, {is_first_microbatch = false})
  H.assert_fp8_gemm(y2:tolist(), want(x2, w1, {input = st.input, weight = {scale = 1}}),
                   "mb 2 uses the cached weight")
  same(lin:fp8_state().weight, wst, "a cached weight's role stays")
  st = lin:fp8_state()
  H.assert_fp8_gemm(lin(x3, {is_first_microbatch = true}):tolist(),
                   want(x3, lin.weight:detach(), st), "mb 3 follows the new weight")
  H.assert_err(function () lin(x3) end, "`is_first_microbatch` boolean kwarg must be provided")
  H.assert_err(function () lin(x3, {is_first_microbatch = 1}) end,
               "is_first_microbatch must be a boolean, got number")
  lu.assertEquals(lin(x3, {is_first_microbatch = false}):shape(), {8, 16}, "usable after")
end

-- regression: a call that failed (its arguments, a hook) left its is_first_microbatch for the next
function TestFp8Graphed:test_failed_call_leaves_no_flag ()
  local lin = gc.nn.Linear(16, 16)
  local x = gc.randn({8, 16})
  local E = gc.make_graphed_callables({lin}, {{x}}, {fp8_enabled = true, fp8_recipe = R,
                                                     fp8_weight_caching = true})
  local need = "`is_first_microbatch` boolean kwarg must be provided"
  H.assert_err(function () lin(x, "no", {is_first_microbatch = false}) end, "must be a tensor")
  H.assert_err(function () lin(x) end, need)
  H.assert_err(function () E[1](x, "no", {is_first_microbatch = true}) end, "must be a tensor")
  H.assert_err(function () E[1](x) end, need)
  local h = lin:register_forward_pre_hook(function () error("pre-hook fails") end)
  H.assert_err(function () lin(x, {is_first_microbatch = false}) end, "pre-hook fails")
  h:remove()
  H.assert_err(function () lin(x) end, need)
  lu.assertEquals(lin(x, {is_first_microbatch = true}):shape(), {8, 16}, "usable after")
end

function TestFp8Graphed:test_option_errors ()
  local m = model(3)
  local x = gc.randn({8, 16}, {requires_grad = true})
  local function mgc (opts) return function () gc.make_graphed_callables(m, {x}, opts) end end
  H.assert_err(mgc{fp8_enabled = {true, true}},
               "fp8_enabled length (2) must match modules length (1)")
  H.assert_err(mgc{fp8_enabled = "yes"}, "fp8_enabled must be a bool or a sequence of bools")
  H.assert_err(mgc{fp8_enabled = true, fp8_recipe = {}}, "option fp8_recipe must be a recipe")
  H.assert_err(mgc{fp8_weight_caching = true}, "fp8_weight_caching needs fp8_enabled")
  H.assert_err(mgc{fp8_enabled = true, enabled = true}, "options 'fp8_enabled' and 'enabled' are one")
  H.assert_err(mgc{fp8_enabled = true, fp8_calibrating = true}, "fp8_calibrating is not supported")
  H.assert_err(function ()
    gc.make_graphed_callables(gc.nn.Linear(12, 16), {gc.randn({8, 12})}, {fp8_enabled = true})
  end, "warmup forward of entry 1", "Linear: FP8 execution requires")
  lu.assertEquals(m(x):shape(), {8, 16}, "usable after the errors")
  H.assert_err(function () m(x, {is_first_microbatch = true}) end,
               "must be a tensor, got table")
end

-- A delayed-wgrad FP8 Linear graphed (its wgrad GEMM in the backward_dw
-- graph, on the FP8 operands its backward graph queued) gives the eager
-- one's grads bit for bit, step after step.
function TestFp8Graphed:test_delayed_wgrad ()
  local function lin ()
    gc.manual_seed(9)
    return gc.nn.Linear(16, 32, {delay_wgrad = true})
  end
  local eager, graphed = lin(), lin()
  local G = gc.make_graphed_callables(graphed, {gc.randn({8, 16}, {requires_grad = true})},
                                      {fp8_enabled = true, fp8_recipe = R})
  for step = 1, 3 do
    gc.manual_seed(200 + step)
    local x, g = gc.randn({8, 16}) * gc.tensor(step), gc.randn({8, 32})
    H.fp8_step_pair(eager, G, R, x, g, "step " .. step)
    lu.assertNil(graphed.weight.grad, "weight grad before backward_dw")
    eager:backward_dw()
    G:backward_dw()
    same(grads(graphed), grads(eager), "param grads " .. step)
    same(graphed:fp8_state(), eager:fp8_state(), "fp8_state " .. step)
  end
end

os.exit(lu.LuaUnit.run(), true)
