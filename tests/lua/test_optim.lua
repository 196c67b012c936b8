-- test_optim.lua: optimizers from Lua (docs/lua-api.md, "Optimizers"): SGD
-- (plain, momentum, weight_decay) and Adam (betas, eps, weight_decay) over one
-- and several steps against the same updates done in Lua double precision;
-- parameters without .grad are skipped (their state too); zero_grad variants;
-- unknown options and bad values are errors; a whole training step (forward
-- with Dropout, backward, step) captured in a gc.Graph and replayed equals the
-- same steps run eagerly, bit for bit; a small version of
-- examples/train_mlp.lua lowers its loss at least 10x in 200 steps.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_optim.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local assert_close, assert_bitwise, assert_err = H.assert_close, H.assert_bitwise, H.assert_err

-- ---------------------------------------------------------------------------
-- Helpers

local ATOL, RTOL = 1e-6, 1e-5   -- f32 updates against double ones

--[[
A problem with two parameters (a [2, 3] weight and a [3] bias) and the
loss 0.5 * sum(a * (p - t)^2) over each, whose grad is a * (p - t). The
reference keeps every parameter, and the optimizer state, in double.
]]
local SHAPES = {{2, 3}, {3}}

local function problem ()
  local ps, refs, targets, scales = {}, {}, {}, {}
  for i, shape in ipairs(SHAPES) do
    local n = shape[2] and shape[1] * shape[2] or shape[1]
    ps[i] = gc.tensor(H.nest(H.values(n, i, 1.0), shape), {requires_grad = true})
    refs[i] = H.flat(ps[i]:tolist())      -- the same f32 starting values, in double
    targets[i] = H.values(n, 3 * i, 0.5, 2)  -- far from p: grads keep their sign
    scales[i] = H.values(n, 5 * i, 0.4, 1)   -- positive weights
  end
  return ps, refs, targets, scales
end

-- The loss over the parameters 'which' (all by default), backpropagated.
local function backward (ps, targets, scales, which)
  local loss
  for i, p in ipairs(ps) do
    if which == nil or which[i] then
      local d = p - gc.tensor(H.nest(targets[i], p:shape()))
      local term = (d * d * gc.tensor(H.nest(scales[i], p:shape()))):sum() * 0.5
      loss = loss and loss + term or term
    end
  end
  loss:backward()
  return loss
end

local function ref_grad (ref, target, scale)
  local g = {}
  for j = 1, #ref do g[j] = scale[j] * (ref[j] - target[j]) end
  return g
end

-- One update of the double reference; state: {buf}, {m, v, t}.
local function ref_sgd (p, g, st, o)
  local lr, mu, wd = o.lr, o.momentum or 0, o.weight_decay or 0
  st.buf = st.buf or {}
  for j = 1, #p do
    local d = g[j] + wd * p[j]
    if mu ~= 0 then
      st.buf[j] = mu * (st.buf[j] or 0) + d
      d = st.buf[j]
    end
    p[j] = p[j] - lr * d
  end
end

local function ref_adam (p, g, st, o)
  local lr, eps, wd = o.lr or 1e-3, o.eps or 1e-8, o.weight_decay or 0
  local b1, b2 = (o.betas or {0.9, 0.999})[1], (o.betas or {0.9, 0.999})[2]
  st.m, st.v, st.t = st.m or {}, st.v or {}, (st.t or 0) + 1
  local bc1, bc2 = 1 - b1 ^ st.t, 1 - b2 ^ st.t
  for j = 1, #p do
    local gj = g[j] + wd * p[j]
    st.m[j] = b1 * (st.m[j] or 0) + (1 - b1) * gj
    st.v[j] = b2 * (st.v[j] or 0) + (1 - b2) * gj * gj
    p[j] = p[j] - (lr / bc1) * st.m[j] / (math.sqrt(st.v[j]) / math.sqrt(bc2) + eps)
  end
end

-- Run 'steps' steps of optimizer 'kind' with options o on the problem and on
-- its reference, checking grads and parameters after every step.
local function check_steps (kind, o, steps)
  local ps, refs, targets, scales = problem()
  local opt = gc.optim[kind](ps, o)
  local ref_step = kind == "SGD" and ref_sgd or ref_adam
  local states = {{}, {}}
  for s = 1, steps do
    opt:zero_grad()
    backward(ps, targets, scales)
    for i, p in ipairs(ps) do
      local g = ref_grad(refs[i], targets[i], scales[i])
      assert_close(p.grad:tolist(), g, ATOL, RTOL, kind .. " grad " .. i .. ", step " .. s)
      ref_step(refs[i], g, states[i], o)
    end
    lu.assertNil(opt:step())
    for i, p in ipairs(ps) do
      assert_close(p:tolist(), refs[i], ATOL, RTOL, kind .. " param " .. i .. ", step " .. s)
    end
  end
  return ps
end

-- ---------------------------------------------------------------------------

TestOptim = {}

function TestOptim:setUp ()
  gc.manual_seed(31)
end

function TestOptim:tearDown ()
  lu.assertTrue(gc.is_grad_enabled())
  lu.assertFalse(gc.is_capturing())
end

-- SGD ---------------------------------------------------------------------------

function TestOptim:test_sgd_one_step_by_hand ()
  local p = gc.tensor({1, -2, 0.5}, {requires_grad = true})
  local q = gc.tensor({{3}}, {requires_grad = true})
  local opt = gc.optim.SGD({p, q}, {lr = 0.5})
  lu.assertStrContains(tostring(opt), "SGD")
  p.grad = gc.tensor({0.5, -1, 2})
  q.grad = gc.tensor({{4}})
  opt:step()
  lu.assertEquals(p:tolist(), {0.75, -1.5, -0.5})
  lu.assertEquals(q:tolist(), {{1}})
  lu.assertEquals(p.grad:tolist(), {0.5, -1, 2})       -- step leaves .grad as it is
end

function TestOptim:test_sgd_one_step ()
  check_steps("SGD", {lr = 0.1}, 1)
end

function TestOptim:test_sgd_several_steps ()
  check_steps("SGD", {lr = 0.05}, 6)
end

function TestOptim:test_sgd_momentum ()
  check_steps("SGD", {lr = 0.05, momentum = 0.9}, 6)
end

function TestOptim:test_sgd_weight_decay ()
  check_steps("SGD", {lr = 0.05, weight_decay = 0.1}, 4)
end

function TestOptim:test_sgd_momentum_and_weight_decay ()
  check_steps("SGD", {lr = 0.02, momentum = 0.5, weight_decay = 0.3}, 5)
end

-- Adam ------------------------------------------------------------------------------

function TestOptim:test_adam_one_step ()
  -- the first step moves each entry by lr against the sign of its grad
  local ps = check_steps("Adam", {lr = 0.01}, 1)
  lu.assertStrContains(tostring(gc.optim.Adam(ps)), "Adam")
  local p = gc.tensor({1, -1}, {requires_grad = true})
  local opt = gc.optim.Adam({p})                       -- lr 1e-3 by default
  p.grad = gc.tensor({3, -0.25})
  opt:step()
  assert_close(p:tolist(), {1 - 1e-3, -1 + 1e-3}, 1e-7, 1e-6, "default lr")
end

function TestOptim:test_adam_several_steps ()
  check_steps("Adam", {lr = 0.01}, 6)
end

function TestOptim:test_adam_betas_eps_weight_decay ()
  check_steps("Adam", {lr = 0.02, betas = {0.8, 0.95}, eps = 1e-3, weight_decay = 0.05}, 6)
end

function TestOptim:test_adam_large_eps ()
  -- eps dominates sqrt(v): the update is close to lr * m / eps
  check_steps("Adam", {lr = 0.01, betas = {0.5, 0.6}, eps = 10}, 3)
end

-- Parameters without grads ------------------------------------------------------

function TestOptim:test_params_without_grad_are_skipped ()
  for _, kind in ipairs{"SGD", "Adam"} do
    local o = kind == "SGD" and {lr = 0.1, momentum = 0.9, weight_decay = 0.1}
              or {lr = 0.01, weight_decay = 0.1}
    local ps, refs, targets, scales = problem()
    local opt = gc.optim[kind](ps, o)
    local ref_step = kind == "SGD" and ref_sgd or ref_adam
    local states = {{}, {}}
    local before = ps[2]:tolist()
    -- steps 1-2: only ps[1] has a grad; ps[2] (and its state) must not move
    -- even with weight decay; from step 3 on, ps[2] starts from a fresh state
    for s = 1, 5 do
      opt:zero_grad()
      backward(ps, targets, scales, {true, s >= 3})
      if s < 3 then lu.assertNil(ps[2].grad) end
      for i = 1, 2 do
        if i == 1 or s >= 3 then
          ref_step(refs[i], ref_grad(refs[i], targets[i], scales[i]), states[i], o)
        end
      end
      opt:step()
      if s < 3 then
        assert_bitwise(ps[2]:tolist(), before, kind .. ": skipped param, step " .. s)
      end
      for i = 1, 2 do
        assert_close(ps[i]:tolist(), refs[i], ATOL, RTOL,
                     kind .. " param " .. i .. ", step " .. s)
      end
    end
  end
end

-- Adam: a param's first update comes with its own step count 1, whatever
-- the others' (PyTorch keeps one count per parameter).
function TestOptim:test_adam_late_grad_first_update ()
  local a = gc.tensor({1, 1}, {requires_grad = true})
  local b = gc.tensor({1, 1}, {requires_grad = true})
  local opt = gc.optim.Adam({a, b}, {lr = 0.1})
  for _ = 1, 3 do
    a.grad = gc.tensor({1, -1})
    opt:step()
  end
  b.grad = gc.tensor({0.5, -2})
  a.grad = nil
  local a_before = a:tolist()
  opt:step()
  assert_close(b:tolist(), {0.9, 1.1}, 1e-6, 1e-6, "first Adam update of b")
  assert_bitwise(a:tolist(), a_before, "a has no grad now")
end

-- A tied parameter (one tensor in two submodules) is stepped once per step
-- by an optimizer over m:parameters(), as in PyTorch (which lists it once).
function TestOptim:test_tied_parameter_stepped_once ()
  local shared = gc.ones({2}, {requires_grad = true})
  local m = H.tied(shared)
  local opt = gc.optim.SGD(m:parameters(), {lr = 0.1})
  m(gc.ones({2})):sum():backward()      -- d sum(x w w) / dw = 2 x w = 2
  lu.assertEquals(shared.grad:tolist(), {2, 2})
  opt:step()
  assert_close(shared:tolist(), {0.8, 0.8}, 1e-7, 1e-6, "one SGD step")
end

-- zero_grad -------------------------------------------------------------------------

function TestOptim:test_zero_grad_variants ()
  local ps, _, targets, scales = problem()
  local other = gc.ones({2}, {requires_grad = true})
  local opt = gc.optim.SGD(ps, {lr = 0.1})
  backward(ps, targets, scales)
  other:sum():backward()
  local ptrs = {}
  for i, p in ipairs(ps) do ptrs[i] = p.grad:data_ptr() end
  opt:zero_grad({set_to_none = false})
  for i, p in ipairs(ps) do
    lu.assertEquals(p.grad:data_ptr(), ptrs[i])       -- in place
    for _, v in ipairs(H.flat(p.grad:tolist())) do lu.assertEquals(v, 0) end
  end
  lu.assertEquals(other.grad:tolist(), {1, 1})       -- not one of its params
  -- a step over zero grads changes nothing (no weight decay, no momentum)
  local before = ps[1]:tolist()
  opt:step()
  assert_bitwise(ps[1]:tolist(), before, "step with zero grads")
  opt:zero_grad()
  for _, p in ipairs(ps) do lu.assertNil(p.grad) end
  opt:zero_grad()                                     -- nothing to clear
  backward(ps, targets, scales)
  opt:zero_grad({set_to_none = true})
  for _, p in ipairs(ps) do lu.assertNil(p.grad) end
  lu.assertNotNil(other.grad)
  assert_err(function () opt:zero_grad({set_to_none = "no"}) end,
             "zero_grad", "set_to_none must be a boolean")
  assert_err(function () opt:zero_grad({to_none = true}) end, "zero_grad", "unknown option 'to_none'")
  assert_err(function () opt:zero_grad(false) end, "options must be a table")
end

-- Errors ------------------------------------------------------------------------------

function TestOptim:test_unknown_options_and_bad_values ()
  local p = gc.ones({2}, {requires_grad = true})
  local P = {p}
  -- unknown option names
  assert_err(function () gc.optim.SGD(P, {lr = 0.1, momentun = 0.9}) end,
             "SGD", "unknown option 'momentun'")
  assert_err(function () gc.optim.SGD(P, {learning_rate = 0.1}) end, "unknown option")
  assert_err(function () gc.optim.SGD(P, {lr = 0.1, betas = {0.9, 0.9}}) end, "unknown option 'betas'")
  assert_err(function () gc.optim.Adam(P, {beta1 = 0.9}) end, "Adam", "unknown option 'beta1'")
  assert_err(function () gc.optim.Adam(P, {lr = 0.1, momentum = 0.9}) end, "unknown option 'momentum'")
  assert_err(function () gc.optim.Adam(P, {amsgrad = true}) end, "unknown option 'amsgrad'")
  -- bad values
  assert_err(function () gc.optim.SGD(P) end, "SGD", "lr is required")
  assert_err(function () gc.optim.SGD(P, {}) end, "lr is required")
  assert_err(function () gc.optim.SGD(P, {lr = "0.1"}) end, "lr must be a number", "string")
  assert_err(function () gc.optim.SGD(P, {lr = -0.1}) end, "SGD", ">= 0")
  assert_err(function () gc.optim.SGD(P, {lr = 0 / 0}) end, "SGD", ">= 0")
  assert_err(function () gc.optim.SGD(P, {lr = 0.1, momentum = -1}) end, "SGD", ">= 0")
  assert_err(function () gc.optim.SGD(P, {lr = 0.1, weight_decay = -1}) end, "SGD", ">= 0")
  assert_err(function () gc.optim.SGD(P, {lr = 0.1, momentum = true}) end, "momentum must be a number")
  assert_err(function () gc.optim.Adam(P, {lr = -1}) end, "Adam", "lr >= 0")
  assert_err(function () gc.optim.Adam(P, {betas = 0.9}) end, "betas", "two numbers")
  assert_err(function () gc.optim.Adam(P, {betas = {0.9}}) end, "betas", "two numbers")
  assert_err(function () gc.optim.Adam(P, {betas = {0.9, 0.99, 0.5}}) end, "betas", "two numbers")
  assert_err(function () gc.optim.Adam(P, {betas = {0.9, "x"}}) end, "betas", "two numbers")
  assert_err(function () gc.optim.Adam(P, {betas = {0.9, 1.0}}) end, "Adam", "betas in [0, 1)")
  assert_err(function () gc.optim.Adam(P, {betas = {-0.1, 0.9}}) end, "betas in [0, 1)")
  assert_err(function () gc.optim.Adam(P, {eps = -1e-8}) end, "eps >= 0")
  assert_err(function () gc.optim.Adam(P, {weight_decay = -0.5}) end, "weight_decay >= 0")
  assert_err(function () gc.optim.Adam(P, {eps = "small"}) end, "eps must be a number")
  -- bad params and options tables
  assert_err(function () gc.optim.SGD(P, 0.1) end, "SGD", "options must be a table")
  assert_err(function () gc.optim.SGD(p, {lr = 0.1}) end, "SGD", "params must be a sequence")
  assert_err(function () gc.optim.Adam(nil) end, "Adam", "params must be a sequence")
  assert_err(function () gc.optim.SGD({p, 3}, {lr = 0.1}) end, "SGD", "params[2]", "number")
  assert_err(function () gc.optim.Adam({p * 2}) end, "not a leaf", "'scale'")
  local c = gc.ones({1}, {requires_grad = true})
  c:close()
  assert_err(function () gc.optim.SGD({p, c}, {lr = 0.1}) end, "params[2]", "closed")
  -- boundary values are accepted; an empty list is an optimizer over nothing
  gc.optim.SGD(P, {lr = 0, momentum = 0, weight_decay = 0})
  gc.optim.Adam(P, {lr = 0, betas = {0, 0}, eps = 0})
  gc.optim.SGD({}, {lr = 1}):step()
end

function TestOptim:test_closed_optimizer ()
  local p = gc.ones({2}, {requires_grad = true})
  local opt = gc.optim.SGD({p}, {lr = 0.1})
  opt:close()
  opt:close()                                       -- twice: fine
  lu.assertStrContains(tostring(opt), "closed")
  p.grad = gc.ones({2})
  assert_err(function () opt:step() end, "optimizer is closed")
  assert_err(function () opt:zero_grad() end, "optimizer is closed")
  lu.assertEquals(p:tolist(), {1, 1})
  lu.assertNotNil(p.grad)
end

-- Captured training steps -------------------------------------------------------------

local B, IN, HID, OUT = 16, 4, 16, 1

-- The data: y = gelu(x . 0.5) + a little noise, from the engine's generator.
local function data ()
  gc.manual_seed(0)
  local x = gc.randn({B, IN})
  local y = gc.no_grad(function ()
    return gc.F.gelu(gc.matmul(x, gc.ones({IN, OUT}) * 0.5)) + gc.randn({B, OUT}) * 0.01
  end)
  return x, y
end

local function model ()
  gc.manual_seed(1)
  return gc.nn.Sequential(gc.nn.Linear(IN, HID), gc.nn.GELU(), gc.nn.Dropout(0.25),
                          gc.nn.Linear(HID, HID), gc.nn.ReLU(), gc.nn.LayerNorm(HID),
                          gc.nn.Linear(HID, OUT))
end

local function params_of (m)
  local out = {}
  for i, p in ipairs(m:parameters()) do out[i] = p:tolist() end
  return out
end

-- 'steps' steps run eagerly, and the same captured once and replayed
-- (after 'warmup' eager steps; 0: the very first step is captured).
-- Returns both runs' losses per step and final parameters.
local function eager_vs_graphed (make_opt, steps, warmup)
  local x, y = data()
  local function step (m, opt, zero_opts)
    opt:zero_grad(zero_opts)
    local loss = gc.F.mse_loss(m(x), y)
    loss:backward()
    opt:step()
    return loss
  end
  -- eager
  local m1 = model()
  local opt1 = make_opt(m1:parameters())
  gc.manual_seed(7)
  local eager_losses = {}
  for s = 1, steps do eager_losses[s] = step(m1, opt1):item() end
  -- graphed
  local m2 = model()
  local opt2 = make_opt(m2:parameters())
  gc.manual_seed(7)
  local graphed_losses = {}
  for s = 1, warmup do graphed_losses[s] = step(m2, opt2):item() end
  local g, loss2 = gc.Graph(), nil
  g:capture(function () loss2 = step(m2, opt2, {set_to_none = false}) end)
  for s = warmup + 1, steps do
    g:replay()
    graphed_losses[s] = loss2:item()
  end
  lu.assertTrue(g:stats().nodes > 0)
  return eager_losses, graphed_losses, params_of(m1), params_of(m2), m1, m2
end

local function check_eager_vs_graphed (make_opt, steps, warmup)
  local l1, l2, p1, p2 = eager_vs_graphed(make_opt, steps, warmup)
  assert_bitwise(l2, l1, "losses per step")
  for i = 1, #p1 do assert_bitwise(p2[i], p1[i], "parameter " .. i) end
  lu.assertTrue(l1[steps] < l1[1], "the loss went down: " .. l1[1] .. " -> " .. l1[steps])
end

function TestOptim:test_captured_step_equals_eager_adam ()
  check_eager_vs_graphed(function (ps) return gc.optim.Adam(ps, {lr = 3e-3}) end, 8, 1)
end

function TestOptim:test_captured_step_equals_eager_sgd_momentum ()
  check_eager_vs_graphed(function (ps)
    return gc.optim.SGD(ps, {lr = 0.05, momentum = 0.9, weight_decay = 1e-3})
  end, 8, 1)
end

-- The very first step captured: optimizer state exists from construction,
-- and .grad is made inside the capture.
function TestOptim:test_captured_first_step_equals_eager ()
  check_eager_vs_graphed(function (ps)
    return gc.optim.Adam(ps, {lr = 3e-3, betas = {0.8, 0.99}, weight_decay = 0.01})
  end, 6, 0)
  check_eager_vs_graphed(function (ps) return gc.optim.SGD(ps, {lr = 0.05, momentum = 0.5}) end,
                         6, 0)
end

-- Dropout really draws fresh masks at each replay: without reseeding, a
-- second graphed run differs from the first (so the equality above is not
-- that of a model whose dropout does nothing).
function TestOptim:test_replays_draw_fresh_dropout_masks ()
  local x = gc.ones({4, 32})
  local d = gc.nn.Dropout(0.5)
  gc.manual_seed(5)
  local eager = {d(x):tolist(), d(x):tolist()}
  local g, y = gc.Graph(), nil
  gc.manual_seed(5)
  g:capture(function () y = d(x) end)
  g:replay()
  local r1 = y:tolist()
  g:replay()
  local r2 = y:tolist()
  assert_bitwise(r1, eager[1], "replay 1")
  assert_bitwise(r2, eager[2], "replay 2")
  local differ = false
  for i, v in ipairs(H.flat(r1)) do if v ~= H.flat(r2)[i] then differ = true end end
  lu.assertTrue(differ, "two replays drew the same mask")
end

-- A small examples/train_mlp.lua: 200 Adam steps lower the loss 10x or more.
function TestOptim:test_train_mlp_small ()
  local x, y = data()
  gc.manual_seed(1)
  local m = gc.nn.Sequential(gc.nn.Linear(IN, 32), gc.nn.GELU(), gc.nn.Dropout(0.1),
                             gc.nn.Linear(32, 32), gc.nn.GELU(), gc.nn.Linear(32, OUT))
  local opt = gc.optim.Adam(m:parameters(), {lr = 3e-3})
  gc.manual_seed(7)
  local first, last
  for s = 1, 200 do
    opt:zero_grad()
    local loss = gc.F.mse_loss(m(x), y)
    loss:backward()
    opt:step()
    if s == 1 then first = loss:item() end
    last = loss:item()
  end
  lu.assertTrue(first == first and last == last, "NaN loss")
  lu.assertTrue(last * 10 <= first, string.format("loss %.6g -> %.6g: not 10x lower", first, last))
  -- in eval mode (no dropout) the fit holds too
  m:eval()
  local final = gc.no_grad(function () return gc.F.mse_loss(m(x), y):item() end)
  lu.assertTrue(final * 10 <= first, string.format("eval loss %.6g vs first %.6g", final, first))
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
