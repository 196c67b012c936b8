-- test_faults.lua: allocation-failure injection through the Lua paths
-- (gc._test.fail_alloc, internal): for N = 1, 2, ... the N-th allocation of
-- the engine in a call fails. Every such call raises an error with a message
-- (never a crash), leaves parameters, .grad, the generator, live objects and
-- memory as they were, and then succeeds without injection. The walk ends
-- when the call makes fewer than N allocations. Cases: make_graphed_callables
-- on a Lua module and a built-in (plain, with order, with hooks, reusing
-- buffers, with pre/post warmup hooks) then a graphed step, an eager
-- training step with Adam, backward_dw called again after a failure, and a
-- backward of delayed wgrads run again after a failure.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_faults.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

-- A Lua module (Linear then GELU) and a built-in Linear, their parameters
-- and sample inputs.
local function model ()
  gc.manual_seed(5)
  local Block = gc.nn.Module("Block")
  function Block:init () self.lin = gc.nn.Linear(4, 8); self.act = gc.nn.GELU() end
  function Block:forward (x) return self.act(self.lin(x)) end
  local m = {Block(), gc.nn.Linear(8, 4)}
  local params = H.all_params(m)
  local sample = {{gc.randn({2, 4}, {requires_grad = true})},
                  {gc.randn({2, 8}, {requires_grad = true})}}
  return m, params, sample, gc.randn({2, 4}), gc.randn({2, 4})
end

local injected_total, compared = 0, 0

-- Walk the injection through call (which sets phase[1] to where it is);
-- undo frees what a successful call made. stable: every successful call
-- leaves the same parameters and .grad (no optimizer step), which must then
-- be a clean call's, also when a failure was absorbed. Returns the failures
-- injected.
local function walk (name, params, pool, call, undo, stable)
  local phase, ref = {}, nil
  local function check (what)
    if not ref then return end
    local now = H.state(params)
    compared = compared + 1
    lu.assertEquals(now.params, ref.params, what .. ": parameters differ from a clean call's")
    lu.assertEquals(now.grads, ref.grads, what .. ": .grad differs from a clean call's")
  end
  if stable then
    gc.manual_seed(42)
    call(phase)
    ref = H.state(params)
    undo()
  end
  for n = 1, 100000 do
    local was = H.state(params, pool)
    gc.manual_seed(42)
    phase[1] = "call"
    gc._test.fail_alloc(n)
    local ok, err = pcall(call, phase)
    local hit = gc._test.fail_alloc(0)
    local what = string.format("%s, N=%d, in %s", name, n, phase[1])
    if not hit then
      lu.assertTrue(ok, what .. ": failed with nothing injected: " .. tostring(err))
      check(what)
      undo()
      injected_total = injected_total + n - 1
      return n - 1
    end
    if not ok then
      lu.assertTrue(type(err) == "string" and #err > 0, what .. ": an error without a message")
      lu.assertFalse(gc.is_capturing(), what .. ": a capture was left open")
      H.assert_state(was, params, pool, what .. " (" .. err .. ")")
      H.assert_rng_untouched(what)
      gc.manual_seed(42)
      local ok2, err2 = pcall(call, phase)
      lu.assertTrue(ok2, what .. ": the call without injection failed: " .. tostring(err2))
    end
    check(what .. (ok and " (a failure absorbed)" or " (the call again)"))
    undo()
  end
  lu.fail(name .. ": the walk did not end")
end

-- make_graphed_callables with opts, then a forward and backward through
-- the graphed callables.
local function graphed_case (name, opts)
  local m, params, sample, x, target = model()
  local pool = gc.graph_pool_handle()
  opts.pool = pool
  local kept -- luacheck: ignore 231 (holds what a successful call made, until undo)
  local function call (phase)
    phase[1] = "make_graphed_callables"
    local G = gc.make_graphed_callables(m, sample, opts)
    phase[1] = "graphed forward"
    local y = G[2](G[1](x))
    phase[1] = "loss"
    local l = gc.F.mse_loss(y, target)
    phase[1] = "backward"
    l:backward()
    kept = G
  end
  local function undo ()
    kept = nil
    for _, p in ipairs(params) do p.grad = nil end
    for _, s in ipairs(sample) do s[1].grad = nil end
    collectgarbage()
  end
  lu.assertTrue(walk(name, params, pool, call, undo, true) > 0)
end

TestFaults = {tearDown = H.no_capture_left}

function TestFaults:test_graphed ()
  graphed_case("make_graphed_callables", {num_warmup_iters = 2})
end

function TestFaults:test_graphed_order ()
  graphed_case("make_graphed_callables with order", {num_warmup_iters = 1, order = {1, 2, -2, -1}})
end

function TestFaults:test_graphed_hooks ()
  local calls = 0
  local function hook () calls = calls + 1 end
  local per = {forward_pre_hooks = {hook}, forward_hooks = {hook},
               backward_pre_hooks = {hook}, backward_hooks = {hook}}
  graphed_case("make_graphed_callables with hooks", {
    num_warmup_iters = 1, capture_time_hooks = {per, per},
    pre_warmup_hook = hook, post_warmup_hook = hook})
  lu.assertTrue(calls > 0)
end

function TestFaults:test_graphed_reuse ()
  graphed_case("make_graphed_callables reusing buffers", {
    num_warmup_iters = 1, order = {1, 2, -2, -1}, reuse_graph_input_output_buffers = true})
end

function TestFaults:test_training_step ()
  local m, params, _, x, target = model()
  local opt = gc.optim.Adam(params, {lr = 1e-2})
  local function call (phase)
    phase[1] = "forward"
    local l = gc.F.mse_loss(m[2](m[1](x)), target)
    phase[1] = "backward"
    l:backward()
    phase[1] = "step"
    opt:step()
  end
  local function undo () opt:zero_grad() end
  lu.assertTrue(walk("training step", params, nil, call, undo) > 0)
end

-- backward_dw failing at each allocation, then called again: the grads are
-- a clean call's (a weight grad applied before the failure is not applied
-- twice), for delayed-wgrad Linears plain and in FP8, with and without
-- fuse_wgrad_accumulation.
function TestFaults:test_backward_dw_again ()
  local R = gc.fp8.DelayedScaling{amax_history_len = 2}
  for _, fp8 in ipairs({false, true}) do
    for _, fuse in ipairs({false, true}) do
      local function grads (m)
        return {(fuse and m.main_grad or m.weight.grad):tolist(), m.bias.grad:tolist()}
      end
      for n = 1, 1000 do
        local x, g = gc.randn({8, 16}), gc.randn({8, 32})
        local ms = {}
        for i = 1, 2 do
          gc.manual_seed(3)
          ms[i] = gc.nn.Linear(16, 32, {delay_wgrad = true, fuse_wgrad_accumulation = fuse})
          ms[i]:zero_grad()
          local y = fp8 and gc.fp8.autocast({recipe = R}, function () return ms[i](x) end)
                    or ms[i](x)
          y:backward(g)
        end
        ms[2]:backward_dw()
        gc._test.fail_alloc(n)
        local ok = pcall(ms[1].backward_dw, ms[1])
        local hit = gc._test.fail_alloc(0)
        local what = ("fp8 %s, fused %s, N=%d"):format(fp8, fuse, n)
        if not hit then
          lu.assertTrue(ok, what)
          H.assert_same(grads(ms[1]), grads(ms[2]), what)
          injected_total = injected_total + n - 1
          break
        end
        ms[1]:backward_dw()
        H.assert_same(grads(ms[1]), grads(ms[2]), what .. ", called again")
      end
    end
  end
end

-- A backward of delayed-wgrad Linears failing at each allocation, then run
-- again: the failed one's queued wgrad is taken back, so backward_dw gives a
-- clean run's grads (plain, and FP8 under both recipes); under
-- DelayedScaling the grad's amax and scale update are taken back too, so
-- the FP8 state after the retry is the clean run's.
function TestFaults:test_backward_again_queues_once ()
  local recipes = {false, gc.fp8.Float8CurrentScaling(), gc.fp8.DelayedScaling{amax_history_len = 4}}
  for _, recipe in ipairs(recipes) do
    local function step (m, x, g, once)
      local y = recipe and gc.fp8.autocast({recipe = recipe}, function () return m(x) end) or m(x)
      return once(y, g)
    end
    local function grads (m, x)
      return {m.weight.grad:tolist(), m.bias.grad:tolist(), x.grad:tolist(),
              recipe and m:fp8_state() or {}}
    end
    for n = 1, 1000 do
      local ms, xs = {}, {}
      gc.manual_seed(6)
      local x0, g = gc.randn({8, 16}), gc.randn({8, 32})
      for i = 1, 2 do
        gc.manual_seed(3)
        ms[i] = gc.nn.Linear(16, 32, {delay_wgrad = true})
        xs[i] = x0:clone():requires_grad_(true)
      end
      for _ = 1, 2 do -- a second step: the first's scales are in use
        step(ms[2], xs[2], g, function (y) y:backward(g) end)
        ms[2]:backward_dw()
      end
      step(ms[1], xs[1], g, function (y) y:backward(g) end)
      ms[1]:backward_dw()
      local what = ("recipe %s, N=%d"):format(recipe, n)
      local hit = step(ms[1], xs[1], g, function (y)
        gc._test.fail_alloc(n)
        local ok = pcall(y.backward, y, g, {retain_graph = true})
        local h = gc._test.fail_alloc(0)
        lu.assertTrue(ok or h, what)
        if h and not ok then y:backward(g) end
        return h
      end)
      ms[1]:backward_dw()
      H.assert_same(grads(ms[1], xs[1]), grads(ms[2], xs[2]), what)
      if not hit then
        injected_total = injected_total + n - 1
        break
      end
    end
  end
end

function TestFaults:test_zz_report ()
  print(string.format("# %d allocation failures injected; %d successful calls' results "
                      .. "compared with a clean call's", injected_total, compared))
  lu.assertTrue(injected_total > 0)
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
