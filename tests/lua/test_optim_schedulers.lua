-- test_optim_schedulers.lua: gc.optim.AdamW and the learning-rate schedulers
-- (docs/lua-api.md, "Optimizers"): AdamW against PyTorch's update rule worked
-- by hand, each scheduler against the rates PyTorch's formulas give (the
-- derivations are written beside the numbers), their errors, and a step
-- captured once that follows a schedule bit for bit as eager steps do.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_optim_schedulers.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

local HERE = debug.getinfo(1, "S").short_src .. ":"  -- errors name the user's line
local sched = gc.optim.lr_scheduler

-- x rounded to the nearest f32, as a tensor stores it.
local function f32 (x) return (string.unpack("<f", string.pack("<f", x))) end

-- The rates a scheduler sets: the optimizer's after construction, then
-- after each of n steps.
local function rates (opt, s, n)
  local r = {opt:get_lr()}
  lu.assertEquals(s:get_last_lr(), {r[1]})
  for _ = 1, n do
    opt:step()
    s:step()
    r[#r + 1] = opt:get_lr()
    lu.assertEquals(s:get_last_lr(), {r[#r]})
  end
  return r
end

local function param (values) return gc.tensor(values, {requires_grad = true}) end

TestOptimSchedulers = {}

function TestOptimSchedulers:tearDown ()
  lu.assertFalse(gc.is_capturing())
end

-- ---------------------------------------------------------------------------
-- AdamW

-- PyTorch's AdamW, step t (from 1), in double:
--   p = p (1 - lr wd); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
--   p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
-- Worked for p = 1, g = 0.5 and PyTorch's defaults (lr 1e-3, betas 0.9 and
-- 0.999, eps 1e-8, weight decay 1e-2), step 1:
--   p = 1 (1 - 1e-5) = 0.99999; m = 0.1 * 0.5 = 0.05; v = 0.001 * 0.25 = 0.00025;
--   m / (1 - 0.9) = 0.5, v / (1 - 0.999) = 0.25, sqrt 0.5;
--   p = 0.99999 - 1e-3 * 0.5 / (0.5 + 1e-8) = 0.99899000002.
-- Step 2, g = -0.25: m = 0.045 - 0.025 = 0.02; v = 0.00024975 + 0.0000625 =
--   0.00031225; bias corrections 1 - 0.81 = 0.19 and 1 - 0.998001 = 0.001999;
--   p = 0.99899000002 * 0.99999 - 1e-3 * (0.02 / 0.19) / (sqrt(0.00031225 / 0.001999) + 1e-8)
--     = 0.99898001012 - 0.00026633703 = 0.99871367309.
function TestOptimSchedulers:test_adamw_by_hand ()
  local p = param({1, 2})
  local opt = gc.optim.AdamW({p})
  lu.assertEquals(opt:get_lr(), 1e-3)
  p.grad = gc.tensor({0.5, 0.5})
  opt:step()
  H.assert_close(p:tolist(), {0.99899000002, 2 * 0.99999 - 1e-3 * 0.5 / (0.5 + 1e-8)}, 0, 2e-7,
                 "AdamW step 1")
  p.grad = gc.tensor({-0.25, -0.25})
  opt:step()
  H.assert_close({p:tolist()[1]}, {0.99871367309}, 0, 2e-7, "AdamW step 2")
end

-- The same rule over several steps, options given, against the double
-- reference; a parameter without a grad is skipped.
function TestOptimSchedulers:test_adamw_steps_against_reference ()
  local lr, b1, b2, eps, wd = 0.05, 0.8, 0.95, 1e-6, 0.1
  local init = H.values(6, 0.4, 1.0)
  local p, q = param(init), param({3})
  local opt = gc.optim.AdamW({p, q}, {lr = lr, betas = {b1, b2}, eps = eps, weight_decay = wd})
  local want, m, v = {}, {}, {}
  for i = 1, 6 do want[i], m[i], v[i] = f32(init[i]), 0, 0 end
  for t = 1, 5 do
    local g = H.values(6, t, 0.7)
    p.grad = gc.tensor(g)
    opt:step()
    for i = 1, 6 do
      local gi = f32(g[i])
      want[i] = want[i] * (1 - lr * wd)
      m[i] = b1 * m[i] + (1 - b1) * gi
      v[i] = b2 * v[i] + (1 - b2) * gi * gi
      want[i] = want[i] - lr / (1 - b1 ^ t) * m[i] / (math.sqrt(v[i]) / math.sqrt(1 - b2 ^ t) + eps)
    end
    H.assert_close(p:tolist(), want, 1e-6, 1e-5, "AdamW step " .. t)
  end
  lu.assertEquals(q:tolist(), {3})
end

-- With no weight decay AdamW is Adam, bit for bit; with some they differ
-- (decoupled against L2).
function TestOptimSchedulers:test_adamw_is_adam_without_decay ()
  local a, b = param(H.values(5, 0.1)), param(H.values(5, 0.1))
  local oa, ob = gc.optim.Adam({a}, {lr = 0.01}), gc.optim.AdamW({b}, {lr = 0.01, weight_decay = 0})
  for t = 1, 3 do
    a.grad, b.grad = gc.tensor(H.values(5, t)), gc.tensor(H.values(5, t))
    oa:step()
    ob:step()
  end
  H.assert_bitwise(b:tolist(), a:tolist(), "AdamW(wd 0) = Adam")
  local c, d = param({1}), param({1})
  local oc, od = gc.optim.Adam({c}, {weight_decay = 0.5}), gc.optim.AdamW({d}, {weight_decay = 0.5})
  c.grad, d.grad = gc.tensor({0.1}), gc.tensor({0.1})
  oc:step()
  od:step()
  lu.assertNotEquals(c:tolist()[1], d:tolist()[1])
end

function TestOptimSchedulers:test_optimizer_options_and_lr ()
  local p = param({1})
  local opt = gc.optim.AdamW({p}, {capturable = true})  -- PyTorch's option, always so here
  lu.assertEquals(tostring(opt), "graphcap.Optimizer(AdamW, lr=0.001)")
  opt:set_lr(0.25)
  lu.assertEquals(opt:get_lr(), 0.25)
  H.assert_err(function () gc.optim.AdamW({p}, {amsgrad = true}) end, HERE, "AdamW: unknown option 'amsgrad'")
  H.assert_err(function () gc.optim.AdamW({p}, {betas = {0.9}}) end, HERE,
               "AdamW: betas must be a sequence of two numbers")
  H.assert_err(function () gc.optim.AdamW({p}, {weight_decay = -1}) end, HERE, "AdamW: weight_decay is -1")
  H.assert_err(function () gc.optim.AdamW({p}, {capturable = 1}) end, HERE,
               "AdamW: capturable must be a boolean, got integer")
  H.assert_err(function () opt:set_lr(-0.5) end, HERE, "set_lr: lr is -0.5; need lr >= 0")
  H.assert_err(function () opt:set_lr("x") end, HERE, "set_lr: lr must be a number, got string")
  lu.assertEquals(opt:get_lr(), 0.25)
  lu.assertEquals(gc.optim.SGD({p}, {lr = 0.1, capturable = false}):get_lr(), 0.1)
end

-- The rate is set on the device between steps: a capture refuses it (and is
-- invalidated, as for every call that capture forbids).
function TestOptimSchedulers:test_set_lr_refused_in_capture ()
  local p = param({1})
  local opt = gc.optim.SGD({p}, {lr = 0.1})
  local g = gc.Graph()
  H.assert_err(function () g:capture(function () opt:set_lr(0.2) end) end, HERE,
               "set_lr: setting the learning rate is not allowed while a capture is open")
  lu.assertEquals(opt:get_lr(), 0.1)
end

-- ---------------------------------------------------------------------------
-- Schedulers against PyTorch's formulas

-- LambdaLR: lr = base_lr * lr_lambda(epoch); base 0.1, lambda 0.95^epoch.
function TestOptimSchedulers:test_lambda_lr ()
  local opt = gc.optim.SGD({param({0})}, {lr = 0.1})
  local s = sched.LambdaLR(opt, function (e) return 0.95 ^ e end)
  lu.assertEquals(s.last_epoch, 0)
  lu.assertEquals(s.base_lrs, {0.1})
  -- 0.1, 0.1 * 0.95, 0.1 * 0.9025, 0.1 * 0.857375, 0.1 * 0.81450625
  H.assert_close(rates(opt, s, 4), {0.1, 0.095, 0.09025, 0.0857375, 0.081450625}, 0, 1e-15,
                 "LambdaLR")
  -- a sequence of one function is PyTorch's list of one per group
  local opt2 = gc.optim.SGD({param({0})}, {lr = 2})
  H.assert_close(rates(opt2, sched.LambdaLR(opt2, {function (e) return 1 / (e + 1) end}), 3),
                 {2, 1, 2 / 3, 0.5}, 0, 1e-15, "LambdaLR of a list")
end

-- LinearLR with PyTorch's defaults (start 1/3, end 1, 5 iterations), base 0.1:
-- lr = 0.1 * (1/3 + (2/3) * min(5, e) / 5):
-- e = 0: 0.1/3; 1: 0.1 * 7/15; 2: 0.06; 3: 0.1 * 11/15; 4: 0.1 * 13/15; then 0.1.
-- (step() takes PyTorch's chainable form, lr * (1 + (2/3) / (5/3 + (e - 1) * 2/3)),
-- equal up to rounding.)
function TestOptimSchedulers:test_linear_lr ()
  local opt = gc.optim.SGD({param({0})}, {lr = 0.1})
  local s = sched.LinearLR(opt)
  H.assert_close(rates(opt, s, 7),
                 {0.1 / 3, 0.1 * 7 / 15, 0.06, 0.1 * 11 / 15, 0.1 * 13 / 15, 0.1, 0.1, 0.1}, 0,
                 1e-14, "LinearLR")
  -- PyTorch's documented example: lr 0.05, start 0.5, 4 iterations
  local opt2 = gc.optim.SGD({param({0})}, {lr = 0.05})
  H.assert_close(rates(opt2, sched.LinearLR(opt2, {start_factor = 0.5, total_iters = 4}), 5),
                 {0.025, 0.03125, 0.0375, 0.04375, 0.05, 0.05}, 0, 1e-14, "LinearLR example")
  -- decaying: start 1, end 0.5 over 2: 1, 0.75, 0.5
  local opt3 = gc.optim.SGD({param({0})}, {lr = 1})
  H.assert_close(rates(opt3, sched.LinearLR(opt3, {start_factor = 1, end_factor = 0.5,
                                                   total_iters = 2}), 3),
                 {1, 0.75, 0.5, 0.5}, 0, 1e-15, "LinearLR decay")
end

-- CosineAnnealingLR, T_max 4, eta_min 0.01, base 0.1:
-- lr = 0.01 + 0.09 * (1 + cos(pi e / 4)) / 2:
-- e = 0: 0.1; 1: 0.01 + 0.045 * (1 + sqrt(2)/2); 2: 0.055; 3: 0.01 + 0.045 * (1 - sqrt(2)/2);
-- 4: 0.01; past T_max the cosine goes on (PyTorch, without restarts):
-- 5: as 3; 6: 0.055; 8: 0.1.
function TestOptimSchedulers:test_cosine_annealing_lr ()
  local opt = gc.optim.Adam({param({0})}, {lr = 0.1})
  local s = sched.CosineAnnealingLR(opt, 4, {eta_min = 0.01})
  local r2 = math.sqrt(2) / 2
  H.assert_close(rates(opt, s, 8),
                 {0.1, 0.01 + 0.045 * (1 + r2), 0.055, 0.01 + 0.045 * (1 - r2), 0.01,
                  0.01 + 0.045 * (1 - r2), 0.055, 0.01 + 0.045 * (1 + r2), 0.1}, 1e-16, 1e-13,
                 "CosineAnnealingLR")
  -- eta_min 0 by default: T_max 2, base 1: 1, 0.5, 0
  local opt2 = gc.optim.SGD({param({0})}, {lr = 1})
  H.assert_close(rates(opt2, sched.CosineAnnealingLR(opt2, 2), 2), {1, 0.5, 0}, 1e-16, 1e-15,
                 "CosineAnnealingLR to 0")
end

-- SequentialLR: a linear warmup (start 0.1, 2 iterations) then a cosine
-- (T_max 3) from milestone 2, base 1:
-- epoch 0: 1 * 0.1; 1: 1 * (0.1 + 0.9 * 1/2) = 0.55; at the milestone the
-- cosine restarts from its closed form at 0: 1; then (1 + cos(pi/3)) / 2 = 0.75,
-- (1 + cos(2 pi/3)) / 2 = 0.25, (1 + cos(pi)) / 2 = 0.
function TestOptimSchedulers:test_sequential_lr ()
  local opt = gc.optim.AdamW({param({0})}, {lr = 1})
  local warm = sched.LinearLR(opt, {start_factor = 0.1, total_iters = 2})
  local cos = sched.CosineAnnealingLR(opt, 3)
  local s = sched.SequentialLR(opt, {warm, cos}, {2})
  H.assert_close(rates(opt, s, 5), {0.1, 0.55, 1, 0.75, 0.25, 0}, 1e-15, 1e-14, "SequentialLR")
  -- three phases, a LambdaLR last: lambda e -> 0.5^e from milestone 4
  local opt2 = gc.optim.SGD({param({0})}, {lr = 0.2})
  local s2 = sched.SequentialLR(opt2, {sched.LambdaLR(opt2, function () return 1 end),
                                       sched.LinearLR(opt2, {start_factor = 0.5, total_iters = 2}),
                                       sched.LambdaLR(opt2, function (e) return 0.5 ^ e end)},
                                {2, 4})
  -- 0.2, 0.2 | 0.2 * 0.5, 0.2 * 0.75 | 0.2, 0.1, 0.05
  H.assert_close(rates(opt2, s2, 6), {0.2, 0.2, 0.1, 0.15, 0.2, 0.1, 0.05}, 1e-16, 1e-14,
                 "SequentialLR in three")
end

function TestOptimSchedulers:test_scheduler_errors ()
  local opt = gc.optim.SGD({param({0})}, {lr = 0.1})
  H.assert_err(function () return sched.LinearLR(opt, {start_factor = 0}) end, HERE,
               "LinearLR: start_factor must be in (0, 1], got 0")
  H.assert_err(function () return sched.LinearLR(opt, {end_factor = 2}) end, HERE,
               "LinearLR: end_factor must be in [0, 1], got 2")
  H.assert_err(function () return sched.LinearLR(opt, {total_iters = 2.5}) end, HERE,
               "LinearLR: total_iters must be an integer, got float")
  H.assert_err(function () return sched.LinearLR(opt, {warmup = 3}) end, HERE,
               "LinearLR: unknown option 'warmup'")
  H.assert_err(function () return sched.CosineAnnealingLR(opt) end, HERE,
               "CosineAnnealingLR: T_max is required")
  H.assert_err(function () return sched.CosineAnnealingLR(opt, 0) end, HERE,
               "CosineAnnealingLR: T_max must be a positive integer, got 0")
  H.assert_err(function () return sched.LambdaLR(opt, 3) end, HERE,
               "LambdaLR: lr_lambda must be a function (or a sequence of one), got number")
  H.assert_err(function () return sched.LambdaLR({}, function () return 1 end) end, HERE,
               "LambdaLR: optimizer must be a gc.optim optimizer, got table")
  local bad = sched.LambdaLR(opt, function (e) return e > 0 and "x" or 1 end)
  H.assert_err(function () bad:step() end, HERE,
               "LambdaLR: lr_lambda(1) returned a string; expected a number")
  local neg = sched.LambdaLR(opt, function (e) return 1 - e end)
  neg:step()
  H.assert_err(function () neg:step() end, HERE, "set_lr: lr is -0.1; need lr >= 0")
  local other = gc.optim.SGD({param({0})}, {lr = 1})
  local a, b = sched.LinearLR(opt), sched.LinearLR(other)
  H.assert_err(function () return sched.SequentialLR(opt, {a, b}, {2}) end, HERE,
               "SequentialLR: schedulers[2] belongs to another optimizer")
  H.assert_err(function () return sched.SequentialLR(opt, {a}, {2}) end, HERE,
               "SequentialLR: expected 0 milestones (one fewer than the schedulers), got 1")
  H.assert_err(function () return sched.SequentialLR(opt, {a, 3}, {2}) end, HERE,
               "SequentialLR: schedulers[2] is a number, not a scheduler")
  H.assert_err(function () return sched.SequentialLR(opt, {}, {}) end, HERE,
               "SequentialLR: schedulers must be a non-empty sequence of schedulers")
  -- a schedule steps between captures, not inside one
  local s = sched.LinearLR(opt)
  H.assert_err(function () gc.Graph():capture(function () s:step() end) end, HERE,
               "set_lr: setting the learning rate is not allowed while a capture is open")
end

-- ---------------------------------------------------------------------------
-- A captured step follows the schedule

-- Two copies of the parameters: one stepped eagerly, one by a graph captured
-- once (a warm-up eager step first, as PyTorch's recipe, so that the .grad
-- tensors and the state exist); the same grads each step; each optimizer's
-- own scheduler. The replayed parameters equal the eager ones bit for bit,
-- also where the rate moves every step and Adam's bias correction with it.
local function captured_schedule_case (what, make_opt, make_sched, steps)
  local init = {H.values(12, 0.3, 1.0), H.values(4, 0.9, 0.5)}
  local function params ()
    return {param(H.nest(init[1], {3, 4})), param(init[2])}
  end
  local pe, pg = params(), params()
  local oe, og = make_opt(pe), make_opt(pg)
  local se, sg = make_sched(oe), make_sched(og)
  local function grads (k)
    return {gc.tensor(H.nest(H.values(12, k, 0.8), {3, 4})), gc.tensor(H.values(4, k + 0.5, 0.3))}
  end
  for i, g in ipairs(grads(0)) do  -- the warm-up step
    pe[i].grad, pg[i].grad = g:clone(), g:clone()
  end
  oe:step(); se:step()
  og:step(); sg:step()
  local graph = gc.Graph()
  graph:capture(function () og:step() end)
  for k = 1, steps do
    for i, g in ipairs(grads(k)) do
      pe[i].grad = g
      pg[i].grad:copy_(g)  -- into the .grad the graph reads
    end
    oe:step()
    graph:replay()
    for i = 1, 2 do
      H.assert_bitwise(pg[i]:tolist(), pe[i]:tolist(), what .. ": parameter " .. i .. " after step " .. k)
    end
    se:step()
    sg:step()
    lu.assertEquals(og:get_lr(), oe:get_lr())
  end
  return pe
end

function TestOptimSchedulers:test_captured_step_follows_schedule ()
  local seq = function (o)
    return sched.SequentialLR(o, {sched.LinearLR(o, {start_factor = 0.2, total_iters = 3}),
                                  sched.CosineAnnealingLR(o, 5, {eta_min = 1e-4})}, {3})
  end
  local moved = captured_schedule_case("AdamW, warmup then cosine",
    function (p) return gc.optim.AdamW(p, {lr = 0.01}) end, seq, 9)
  lu.assertNotEquals(moved[2]:tolist(), H.values(4, 0.9, 0.5))
  captured_schedule_case("Adam, LinearLR",
    function (p) return gc.optim.Adam(p, {lr = 0.02, weight_decay = 0.01}) end,
    function (o) return sched.LinearLR(o, {start_factor = 0.5, total_iters = 4}) end, 6)
  captured_schedule_case("SGD momentum, LambdaLR",
    function (p) return gc.optim.SGD(p, {lr = 0.1, momentum = 0.9}) end,
    function (o) return sched.LambdaLR(o, function (e) return 0.9 ^ e end) end, 6)
end

-- The whole training step (forward, backward, AdamW step) captured into one
-- graph and replayed with a schedule between replays equals eager steps bit
-- for bit.
function TestOptimSchedulers:test_captured_training_step_with_schedule ()
  local function model () return gc.nn.Sequential(gc.nn.Linear(4, 8), gc.nn.GELU(), gc.nn.Linear(8, 2)) end
  local me, mg = model(), model()
  H.copy_params(mg, me)
  local oe, og = gc.optim.AdamW(me:parameters(), {lr = 0.01}), gc.optim.AdamW(mg:parameters(), {lr = 0.01})
  local function make (o)
    return sched.SequentialLR(o, {sched.LinearLR(o, {start_factor = 0.1, total_iters = 2}),
                                  sched.CosineAnnealingLR(o, 4)}, {2})
  end
  local se, sg = make(oe), make(og)
  local x, y = gc.zeros(5, 4), gc.zeros(5, 2)
  local function batch (k)
    x:copy_(gc.tensor(H.nest(H.values(20, k, 1.0), {5, 4})))
    y:copy_(gc.tensor(H.nest(H.values(10, k + 0.3, 1.0), {5, 2})))
  end
  local function step (m, o)
    o:zero_grad({set_to_none = false})
    local loss = gc.F.mse_loss(m(x), y)
    loss:backward()
    o:step()
    return loss
  end
  batch(0)  -- a warm-up step each: .grad and the optimizer state exist before the capture
  step(me, oe); se:step()
  step(mg, og); sg:step()
  local lg
  local graph = gc.Graph()
  graph:capture(function () lg = step(mg, og) end)
  for k = 1, 6 do
    batch(k)
    local le = step(me, oe)
    graph:replay()
    lu.assertEquals(lg:item(), le:item(), "loss of step " .. k)
    for i, p in ipairs(mg:parameters()) do
      H.assert_bitwise(p:tolist(), me:parameters()[i]:tolist(), "parameter " .. i .. " after step " .. k)
    end
    se:step()
    sg:step()
  end
end

os.exit(lu.LuaUnit.run(), true)
