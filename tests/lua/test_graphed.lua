-- test_graphed.lua: make_graphed_callables (docs/semantics.md; the cases of
-- TransformerEngine's own tests). Graphed training equals eager training bit
-- for bit (parameters, grads, outputs; 3 SGD steps of 2 accumulation
-- microbatches): per-callable and whole-model graphing, without an order and
-- with pipeline orders (returned entries), with input/output buffer reuse, with
-- delayed wgrad (backward_dw). Parameter grads: cloned on return (TE tests 6,
-- 7), aliases when clone_param_grads_on_return = false (test 9), the policy
-- fixed at the call (test 10). One pool for all graphs of a call; stats();
-- reset(); eager fallback when the training flag differs; kwargs; Lua function
-- callables; eval mode; hooks registered after graphing; a weight tied
-- within a callable over accumulated microbatches.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_graphed.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local walk, all_params, assert_same = H.walk, H.all_params, H.assert_same

local STEPS, MICRO, LR = 3, 2, 0.1

-- A {rows, cols} nested table of irregular values; phase picks the values.
local function data (rows, cols, phase)
  local m = {}
  for i = 1, rows do
    m[i] = {}
    for j = 1, cols do
      m[i][j] = math.sin(0.37 * ((i - 1) * cols + j) + 1.3 * phase) * 1.25 + 0.1 * math.cos(phase)
    end
  end
  return m
end

-- Every element finite, and not all zero.
local function assert_sane (t, what)
  local nonzero = false
  local function walk_t (v)
    if type(v) == "table" then
      for _, e in ipairs(v) do walk_t(e) end
    else
      lu.assertTrue(v == v and v > -math.huge and v < math.huge, what .. ": not finite")
      if v ~= 0 then nonzero = true end
    end
  end
  walk_t(t)
  lu.assertTrue(nonzero, what .. ": all zero")
end

local function values (ts)
  local v = {}
  for i, t in ipairs(ts) do v[i] = t:tolist() end
  return v
end

local function grads_of (ps)
  local g = {}
  for i, p in ipairs(ps) do
    lu.assertNotNil(p.grad, "parameter " .. i .. " has no grad")
    g[i] = p.grad:tolist()
  end
  return g
end

-- build() twice: a (eager) and b (to graph), b given a's parameter values
-- by copy_ (b is built from another seed, so the copy matters).
local function pair (build)
  gc.manual_seed(1)
  local a = build()
  gc.manual_seed(2)
  local b = build()
  local pa, pb = all_params(a), all_params(b)
  lu.assertEquals(#pa, #pb)
  gc.no_grad(function ()
    for i = 1, #pa do pb[i]:copy_(pa[i]) end
  end)
  for i = 1, #pa do assert_same(pb[i]:tolist(), pa[i]:tolist(), "copied parameter " .. i) end
  return a, b
end

-- Two Linear+GELU callables, 8 -> 16 -> 8.
local DIMS2, OUTS2 = {8, 16}, {16, 8}
local function two_layers (lin_opts)
  return function ()
    return {gc.nn.Sequential(gc.nn.Linear(8, 16, lin_opts), gc.nn.GELU()),
            gc.nn.Sequential(gc.nn.Linear(16, 8, lin_opts), gc.nn.GELU())}
  end
end

-- Three: 8 -> 16 -> 8 -> 8.
local DIMS3, OUTS3 = {8, 16, 8}, {16, 8, 8}
local function three_layers ()
  return {gc.nn.Sequential(gc.nn.Linear(8, 16), gc.nn.GELU()),
          gc.nn.Sequential(gc.nn.Linear(16, 8), gc.nn.GELU()),
          gc.nn.Sequential(gc.nn.Linear(8, 8), gc.nn.GELU())}
end

-- The compared state of a run.
local function compare (eager, graphed)
  lu.assertEquals(#graphed.params, #eager.params)
  for i = 1, #eager.params do
    assert_same(graphed.params[i], eager.params[i], "parameter " .. i)
    assert_same(graphed.grads[i], eager.grads[i], "grad " .. i)
    assert_sane(eager.grads[i], "eager grad " .. i)
  end
  lu.assertEquals(#graphed.outs, #eager.outs)
  for i = 1, #eager.outs do
    assert_same(graphed.outs[i], eager.outs[i], "output " .. i)
    assert_sane(eager.outs[i], "eager output " .. i)
  end
  for i, g in pairs(eager.xgrads or {}) do
    assert_same(graphed.xgrads[i], g, "input grad of entry " .. i)
  end
end

-- Chained training: y = calls[n](...calls[1](x)); loss = sum(y * dy);
-- STEPS steps of SGD, each over MICRO accumulated microbatches.
local function train_chain (calls, params, zero_opts)
  local opt = gc.optim.SGD(params, {lr = LR})
  local res = {outs = {}}
  for step = 1, STEPS do
    opt:zero_grad(zero_opts)
    for mb = 1, MICRO do
      local phase = step * 10 + mb
      local y = gc.tensor(data(4, 8, phase))
      for _, f in ipairs(calls) do y = f(y) end
      res.outs[1] = y:tolist()
      local loss = (y * gc.tensor(data(4, 8, -phase))):sum()
      loss:backward()
    end
    res.grads = grads_of(params)
    opt:step()
  end
  res.params = values(params)
  return res
end

-- The callable of each entry, and one sample list per entry (its own
-- tensor, requiring grad).
local function order_samples (cfg)
  local callable_of, s = {}, {}
  walk(cfg, function (i, c) callable_of[i] = c end, function () end, function () end)
  for i = 1, #callable_of do
    s[i] = {gc.ones({4, cfg.dims[callable_of[i]]}, {requires_grad = true})}
  end
  return s, callable_of
end

-- Pipeline-style training along cfg.order, as TE's interleaved test: every
-- entry gets its own input (a leaf requiring grad) and grad weights; a
-- backward entry runs sum(y * dy):backward(); a wgrad entry runs
-- backward_dw. cfg.walks passes of the order per step (microbatches
-- accumulate). fwd(i, c) -> the callable to call; dw(i, c) runs a wgrad.
local function train_order (cfg, fwd, dw, params)
  local opt = gc.optim.SGD(params, {lr = LR})
  local res = {outs = {}, xgrads = {}}
  for step = 1, STEPS do
    opt:zero_grad(cfg.zero)
    for w = 1, cfg.walks do
      local xs, losses = {}, {}
      walk(cfg,
           function (i, c)
             local phase = step * 100 + w * 10 + i
             xs[i] = gc.tensor(data(4, cfg.dims[c], phase), {requires_grad = true})
             local y = fwd(i, c)(xs[i])
             res.outs[i] = y:tolist()  -- now: with buffer reuse it is valid until its backward
             losses[i] = (y * gc.tensor(data(4, cfg.outs[c], -phase))):sum()
           end,
           function (i) losses[i]:backward() end,
           function (i, c) dw(i, c) end)
      for i, x in pairs(xs) do
        lu.assertNotNil(x.grad, "input of entry " .. i .. " got no grad")
        res.xgrads[i] = x.grad:tolist()
      end
    end
    res.grads = grads_of(params)
    opt:step()
  end
  res.params = values(params)
  return res
end

-- One eager pass through every callable, so that every parameter owns a
-- .grad (TE's harness preallocates them and zeroes them in place).
local function own_grads (mods, cfg)
  for c, m in ipairs(mods) do
    local y = m(gc.tensor(data(4, cfg.dims[c], 0)))
    y:sum():backward()
    m:backward_dw()
  end
end

-- Graph a copy of build() along cfg (plus opts), train both, compare.
-- cfg.zero: the options of zero_grad; with set_to_none = false, the
-- parameters get their own .grad first. Returns the graphed entries.
local function check_order (cfg, build, opts)
  local a, b = pair(build)
  if cfg.zero and cfg.zero.set_to_none == false then
    own_grads(a, cfg)
    own_grads(b, cfg)
  end
  local s, callable_of = order_samples(cfg)
  local o = {order = cfg.order, num_layers_per_chunk = cfg.nlpc}
  for k, v in pairs(opts or {}) do o[k] = v end
  local G = gc.make_graphed_callables(b, s, o)
  lu.assertEquals(#G, #s)
  for i = 1, #G do lu.assertNotIs(G[i], b[callable_of[i]]) end
  local eager = train_order(cfg, function (_, c) return a[c] end,
                            function (_, c) a[c]:backward_dw() end, all_params(a))
  local graphed = train_order(cfg, function (i) return G[i] end,
                              function (i) G[i]:backward_dw() end, all_params(b))
  compare(eager, graphed)
  return G
end

TestGraphed = {tearDown = H.no_capture_left}

-- ---------------------------------------------------------------------------
-- Graphed training equals eager training, bit for bit

function TestGraphed:test_per_callable_no_order ()
  local a, b = pair(two_layers())
  local G = gc.make_graphed_callables(b, {{gc.ones({4, 8}, {requires_grad = true})},
                                          {gc.ones({4, 16}, {requires_grad = true})}})
  lu.assertEquals(#G, 2)
  lu.assertIs(G[1], b[1])
  lu.assertIs(G[2], b[2])
  compare(train_chain(a, all_params(a)), train_chain(G, all_params(b)))
end

-- TE's harness zeroes grads in place (set_to_none = false).
function TestGraphed:test_per_callable_zero_grad_in_place ()
  local a, b = pair(two_layers())
  local G = gc.make_graphed_callables(b, {{gc.ones({4, 8}, {requires_grad = true})},
                                          {gc.ones({4, 16}, {requires_grad = true})}},
                                      {num_warmup_iters = 2})
  local z = {set_to_none = false}
  compare(train_chain(a, all_params(a), z), train_chain(G, all_params(b), z))
end

function TestGraphed:test_whole_model ()
  local function build ()
    return {gc.nn.Sequential(gc.nn.Linear(8, 16), gc.nn.GELU(), gc.nn.Linear(16, 8), gc.nn.GELU())}
  end
  local a, b = pair(build)
  local G = gc.make_graphed_callables(b[1], {gc.ones({4, 8})})
  lu.assertIs(G, b[1])
  compare(train_chain(a, all_params(a)), train_chain({G}, all_params(b)))
end

function TestGraphed:test_retain_graph_in_backward ()
  local a, b = pair(two_layers())
  local G = gc.make_graphed_callables(b, {{gc.ones({4, 8}, {requires_grad = true})},
                                          {gc.ones({4, 16}, {requires_grad = true})}},
                                      {retain_graph_in_backward = true})
  compare(train_chain(a, all_params(a)), train_chain(G, all_params(b)))
end

-- order {1, 2, -2, -1}: one microbatch per pass of the order, two passes a step.
function TestGraphed:test_order_one_microbatch ()
  check_order({order = {1, 2, -2, -1}, layers = {1, 1}, dims = DIMS2, outs = OUTS2, walks = 2},
              two_layers())
end

-- Two microbatches interleaved: F1 F2 F1 F2 B2 B1 B2 B1.
function TestGraphed:test_order_two_microbatches ()
  check_order({order = {1, 2, 1, 2, -2, -1, -2, -1}, layers = {1, 1}, nlpc = {1, 1},
               dims = DIMS2, outs = OUTS2, walks = 1}, two_layers())
end

-- A chunk of two layers (callables 1, 2) and a chunk of one (callable 3).
function TestGraphed:test_order_chunk_of_two_layers ()
  check_order({order = {1, 2, -2, -1}, layers = {2, 1}, nlpc = {2, 1},
               dims = DIMS3, outs = OUTS3, walks = 2}, three_layers)
end

-- 1F1B: microbatch 2's forwards reuse microbatch 1's static inputs.
function TestGraphed:test_order_reuse_buffers ()
  check_order({order = {1, 2, -2, -1, 1, 2, -2, -1}, layers = {1, 1}, nlpc = {1, 1},
               dims = DIMS2, outs = OUTS2, walks = 1}, two_layers(),
              {reuse_graph_input_output_buffers = true})
end

function TestGraphed:test_order_reuse_buffers_interleaved ()
  check_order({order = {1, 2, 1, 2, -2, -1, -2, -1}, layers = {1, 1}, nlpc = {1, 1},
               dims = DIMS2, outs = OUTS2, walks = 1}, two_layers(),
              {reuse_graph_input_output_buffers = true})
end

-- TE test 14: reuse without cloning parameter grads. As in TE's harness
-- the parameters own their .grad and it is zeroed in place: a grad left to
-- nil would become the static buffer itself, which reuse hands back to the
-- pool (TE §2.9 (c), §2.12).
function TestGraphed:test_order_reuse_buffers_no_param_grad_clone ()
  check_order({order = {1, 2, -2, -1, 1, 2, -2, -1}, layers = {1, 1}, nlpc = {1, 1},
               dims = DIMS2, outs = OUTS2, walks = 1, zero = {set_to_none = false}}, two_layers(),
              {reuse_graph_input_output_buffers = true, clone_param_grads_on_return = false})
end

-- TE test 13 with the grads zeroed in place.
function TestGraphed:test_order_reuse_buffers_zero_in_place ()
  check_order({order = {1, 2, 1, 2, -2, -1, -2, -1}, layers = {1, 1}, nlpc = {1, 1},
               dims = DIMS2, outs = OUTS2, walks = 1, zero = {set_to_none = false}}, two_layers(),
              {reuse_graph_input_output_buffers = true})
end

-- Delayed wgrad: -(k + 0.5) entries; the entry's backward_dw() replays it.
function TestGraphed:test_delayed_wgrad ()
  local G = check_order({order = {1, 2, -2, -2.5, -1, -1.5, 1, 2, -2, -2.5, -1, -1.5},
                         layers = {1, 1}, nlpc = {1, 1}, dims = DIMS2, outs = OUTS2, walks = 1},
                        two_layers({delay_wgrad = true}))
  for i = 1, #G do
    local st = G[i]:stats()
    lu.assertNotNil(st.bwd_dw, "entry " .. i .. " has no wgrad graph")
    lu.assertTrue(st.bwd_dw.nodes > 0)
    lu.assertTrue(st.bwd_dw.replays >= STEPS)
  end
end

-- Without backward_dw the weight grads stay missing (the backward left them).
function TestGraphed:test_delayed_wgrad_needs_backward_dw ()
  local _, b = pair(two_layers({delay_wgrad = true}))
  local cfg = {order = {1, 2, -2, -2.5, -1, -1.5}, layers = {1, 1}, nlpc = {1, 1}, dims = DIMS2}
  local s = order_samples(cfg)
  local G = gc.make_graphed_callables(b, s, {order = cfg.order, num_layers_per_chunk = cfg.nlpc})
  local y1 = G[1](gc.tensor(data(4, 8, 1)))
  local y2 = G[2](gc.tensor(data(4, 16, 2)))
  y2:sum():backward()
  local w2 = b[2]:parameters()[1]
  lu.assertNil(w2.grad)
  G[2]:backward_dw()
  lu.assertNotNil(w2.grad)
  y1:sum():backward()
  G[1]:backward_dw()
  lu.assertNotNil(b[1]:parameters()[1].grad)
end

-- A Lua function is graphed too; its result is a new callable object.
function TestGraphed:test_function_callable ()
  local function f (x) return gc.F.gelu(x) * 2 + x end
  local G = gc.make_graphed_callables(f, {gc.ones({4, 8}, {requires_grad = true})})
  lu.assertNotIs(G, f)
  for k = 1, 3 do
    local xg = gc.tensor(data(4, 8, k), {requires_grad = true})
    local xe = gc.tensor(data(4, 8, k), {requires_grad = true})
    local yg, ye = G(xg), f(xe)
    assert_same(yg:tolist(), ye:tolist(), "output " .. k)
    yg:sum():backward()
    ye:sum():backward()
    assert_same(xg.grad:tolist(), xe.grad:tolist(), "input grad " .. k)
  end
end

-- Calling with the sample tensor itself (same address: no copy-in).
function TestGraphed:test_call_with_sample_tensor ()
  local a, b = pair(two_layers())
  local x = gc.tensor(data(4, 8, 5))
  local G = gc.make_graphed_callables(b[1], {x})
  x:copy_(gc.tensor(data(4, 8, 6)))
  assert_same(G(x):tolist(), a[1](x):tolist(), "output")
end

-- Eval mode: forwards only, equal to eager eval.
function TestGraphed:test_eval_mode ()
  local a, b = pair(two_layers())
  for c = 1, 2 do
    a[c]:eval()
    b[c]:eval()
  end
  local G = gc.make_graphed_callables(b, {{gc.ones({4, 8})}, {gc.ones({4, 16})}})
  for i = 1, 2 do
    lu.assertNil(G[i]:stats().bwd)
    lu.assertNil(G[i]:stats().bwd_dw)
  end
  for k = 1, 3 do
    local x = gc.tensor(data(4, 8, k))
    assert_same(G[2](G[1](x)):tolist(), a[2](a[1](x)):tolist(), "output " .. k)
  end
end

-- ---------------------------------------------------------------------------
-- Parameter grads on return (TE tests 6, 7, 9, 10)

local function linear_pair (bias)
  return pair(function () return {gc.nn.Linear(8, 8, {bias = bias})} end)
end

-- One forward and backward with an input that does not require grad.
local function pass (m, k)
  local y = m(gc.tensor(data(4, 8, k)))
  local loss = (y * gc.tensor(data(4, 8, -k))):sum()
  loss:backward()
end

-- Test 6: the grad of the first pass is owned: a second replay changes
-- neither its storage nor its values, and the second grad is a new tensor.
function TestGraphed:test_param_grads_owned ()
  local a, b = linear_pair(false)
  local G = gc.make_graphed_callables(b[1], {gc.ones({4, 8})})
  local w = b[1]:parameters()[1]
  pass(G, 1)
  local g1 = w.grad
  local v1, p1 = g1:tolist(), g1:data_ptr()
  b[1]:zero_grad()
  lu.assertNil(w.grad)
  pass(G, 2)
  local g2 = w.grad
  assert_same(g1:tolist(), v1, "first grad after the second replay")
  lu.assertEquals(g1:data_ptr(), p1)
  lu.assertNotEquals(g2:data_ptr(), p1)
  pass(a[1], 2)
  assert_same(g2:tolist(), a[1]:parameters()[1].grad:tolist(), "second grad")
  -- a third replay leaves the second grad alone too
  local v2 = g2:tolist()
  b[1]:zero_grad()
  pass(G, 3)
  assert_same(g2:tolist(), v2, "second grad after the third replay")
end

-- Test 7: two backward passes accumulate exactly as eager ones.
function TestGraphed:test_param_grads_accumulate ()
  local a, b = linear_pair(true)
  local G = gc.make_graphed_callables(b[1], {gc.ones({4, 8})})
  for k = 1, 3 do
    pass(G, k)
    pass(a[1], k)
    local pa, pb = a[1]:parameters(), b[1]:parameters()
    for i = 1, #pa do assert_same(pb[i].grad:tolist(), pa[i].grad:tolist(), "grad " .. i .. " after " .. k) end
  end
end

-- Test 9: clone_param_grads_on_return = false: the grad is the static
-- buffer, the same storage every time.
function TestGraphed:test_param_grads_alias_without_clone ()
  local a, b = linear_pair(false)
  local G = gc.make_graphed_callables(b[1], {gc.ones({4, 8})}, {clone_param_grads_on_return = false})
  local w = b[1]:parameters()[1]
  pass(G, 1)
  pass(a[1], 1)
  assert_same(w.grad:tolist(), a[1]:parameters()[1].grad:tolist(), "first grad")
  local p1 = w.grad:data_ptr()
  b[1]:zero_grad()
  pass(G, 2)
  lu.assertEquals(w.grad:data_ptr(), p1)
end

-- Test 10 (our form): the policy is fixed at the call; changing the options
-- table afterwards changes nothing.
function TestGraphed:test_param_grad_policy_fixed_at_call ()
  local _, b = linear_pair(false)
  local opts = {clone_param_grads_on_return = true}
  local G = gc.make_graphed_callables(b[1], {gc.ones({4, 8})}, opts)
  opts.clone_param_grads_on_return = false
  local w = b[1]:parameters()[1]
  pass(G, 1)
  local g1 = w.grad
  local v1, p1 = g1:tolist(), g1:data_ptr()
  b[1]:zero_grad()
  pass(G, 2)
  lu.assertNotEquals(w.grad:data_ptr(), p1)
  assert_same(g1:tolist(), v1, "first grad")
end

-- ---------------------------------------------------------------------------
-- The parameter grads of one graphed backward go out as few launches as
-- may be (copies into new .grad tensors, or adds into existing ones, a few
-- tensors per launch); the values and .grad identities are those of one
-- accumulation per parameter.

-- One {4, d} sample per entry, requiring grad.
local function samples_of (dims)
  local s = {}
  for i, d in ipairs(dims) do s[i] = {gc.ones({4, d}, {requires_grad = true})} end
  return s
end

-- The elementwise sum a + b of two nested tables, by the engine's own add.
local function added (a, b)
  return (gc.tensor(a) + gc.tensor(b)):tolist()
end

-- Three Linears (six parameters: more than one launch holds) and a GELU.
local function deep ()
  return {gc.nn.Sequential(gc.nn.Linear(8, 8), gc.nn.GELU(), gc.nn.Linear(8, 8),
                           gc.nn.Linear(8, 8)),
          gc.nn.Sequential(gc.nn.Linear(8, 8), gc.nn.GELU())}
end

local function chain_pass (calls, k)
  local y = gc.tensor(data(4, 8, k))
  for _, f in ipairs(calls) do y = f(y) end
  ;(y * gc.tensor(data(4, 8, -k))):sum():backward()
end

function TestGraphed:test_param_grads_first_then_accumulated ()
  local a, b = pair(deep)
  local G = gc.make_graphed_callables(b, samples_of({8, 8}))
  local pa, pb = all_params(a), all_params(b)
  lu.assertEquals(#pb, 8)
  local g = {}
  for k = 1, 2 do   -- each pass alone, from no .grad: the copies
    for _, m in ipairs(b) do m:zero_grad() end
    for _, m in ipairs(a) do m:zero_grad() end
    chain_pass(G, k)
    chain_pass(a, k)
    g[k] = grads_of(pb)
    for i = 1, #pa do assert_same(g[k][i], pa[i].grad:tolist(), "pass " .. k .. " grad " .. i) end
  end
  -- both passes: the second adds into the .grad the first made
  for _, m in ipairs(b) do m:zero_grad() end
  chain_pass(G, 1)
  local made = {}
  for i, p in ipairs(pb) do made[i] = {t = p.grad, ptr = p.grad:data_ptr()} end
  chain_pass(G, 2)
  for i, p in ipairs(pb) do
    assert_same(p.grad:tolist(), added(g[1][i], g[2][i]), "accumulated grad " .. i)
    lu.assertTrue(rawequal(p.grad, made[i].t), "grad " .. i .. " is still the first pass's tensor")
    lu.assertEquals(p.grad:data_ptr(), made[i].ptr)
  end
  -- .grad tensors the user set are added into, in place
  local set = {}
  for i, p in ipairs(pb) do
    local v = H.nest(H.values(#H.flat(g[1][i]), i, 0.5), p:shape())
    set[i] = {t = gc.tensor(v), v = v}
    p.grad = set[i].t
  end
  local ptrs = {}
  for i, p in ipairs(pb) do ptrs[i] = p.grad:data_ptr() end
  chain_pass(G, 1)
  for i, p in ipairs(pb) do
    lu.assertTrue(rawequal(p.grad, set[i].t), "grad " .. i .. " is the tensor set")
    lu.assertEquals(p.grad:data_ptr(), ptrs[i])
    assert_same(p.grad:tolist(), added(set[i].v, g[1][i]), "grad " .. i .. " added into")
  end
  -- the copies made from no .grad own their storage: later passes leave them
  for _, m in ipairs(b) do m:zero_grad() end
  chain_pass(G, 1)
  local first = {}
  for i, p in ipairs(pb) do first[i] = p.grad end
  for _, m in ipairs(b) do m:zero_grad() end
  chain_pass(G, 2)
  for i = 1, #pb do assert_same(first[i]:tolist(), g[1][i], "first grad " .. i .. " kept") end
end

-- y = x * w + b, its w and b given.
local Affine = gc.nn.Module("Affine")
function Affine:init (w, b) self.w = w; self.b = b end
function Affine:forward (x) return x * self.w + self.b end

-- Two callables sharing both parameters: each backward adds into the grads
-- the other one made, as eager backward does.
function TestGraphed:test_param_shared_by_two_callables ()
  local function build ()
    local w = gc.tensor(H.values(8, 0.3, 1, 0.5), {requires_grad = true})
    local bias = gc.tensor(H.values(8, 1.1, 0.2), {requires_grad = true})
    return {Affine(w, bias), Affine(w, bias)}, {w, bias}
  end
  local a, pa = build()
  local b, pb = build()
  local G = gc.make_graphed_callables(b, samples_of({8, 8}))
  for round = 1, 2 do   -- from no .grad, then into the .grad of round 1
    chain_pass(G, round)
    chain_pass(a, round)
    for i = 1, 2 do
      assert_same(pb[i].grad:tolist(), pa[i].grad:tolist(), "round " .. round .. " grad " .. i)
      assert_sane(pb[i].grad:tolist(), "grad " .. i)
    end
  end
end

-- regression: eager backward added each of a tied weight's grads into .grad by itself, where
-- the graphed backward adds their sum once: 3 accumulated microbatches differed by 1.9e-6
-- A weight used twice in one callable (tied): its grads are summed first,
-- then added once into .grad, as in PyTorch, eagerly and in the captured
-- backward alike; so 3 accumulated microbatches give bitwise equal grads.
function TestGraphed:test_tied_weight_accumulated_microbatches ()
  local Tied = gc.nn.Module("TiedLinear")
  function Tied:init (w, b) self.w = w; self.b = b end
  function Tied:forward (x)
    return gc.F.linear(gc.F.gelu(gc.F.linear(x, self.w, self.b)), self.w, self.b) * self.b
  end
  local function build ()
    return Tied(gc.tensor(H.nest(H.values(64, 0.3, 0.4), {8, 8}), {requires_grad = true}),
                gc.tensor(H.values(8, 1.1, 0.3, 0.2), {requires_grad = true}))
  end
  local a, b = build(), build()
  local G = gc.make_graphed_callables(b, {gc.ones({4, 8}, {requires_grad = true})})
  for mb = 1, 3 do
    for _, m in ipairs{a, G} do
      local y = m(gc.tensor(data(4, 8, mb), {requires_grad = true}))
      ;(y * gc.tensor(data(4, 8, -mb))):sum():backward()
    end
    assert_same(b.w.grad:tolist(), a.w.grad:tolist(), "microbatch " .. mb .. " weight grad")
    assert_same(b.b.grad:tolist(), a.b.grad:tolist(), "microbatch " .. mb .. " bias grad")
  end
  assert_sane(a.w.grad:tolist(), "weight grad")
end

-- A backward hook registered after graphing runs after the graphed
-- backward: the parameter grads it reads are already accumulated.
function TestGraphed:test_backward_hook_sees_accumulated_grads ()
  local _, b = pair(deep)
  local G = gc.make_graphed_callables(b, samples_of({8, 8}))
  local pb = b[2]:parameters()
  local seen
  b[2]:register_full_backward_hook(function ()
    seen = {}
    for i, p in ipairs(pb) do seen[i] = p.grad and p.grad:tolist() or false end
  end)
  for round = 1, 2 do
    local x = gc.tensor(data(4, 8, round), {requires_grad = true})
    local y = G[2](G[1](x))
    ;(y * gc.tensor(data(4, 8, -round))):sum():backward()
    lu.assertNotNil(seen, "the hook ran")
    for i, p in ipairs(pb) do assert_same(seen[i], p.grad:tolist(), "round " .. round .. " grad " .. i) end
  end
end

-- ---------------------------------------------------------------------------
-- Pools, stats, reset

local function same_width ()
  return {gc.nn.Sequential(gc.nn.Linear(8, 8), gc.nn.GELU()),
          gc.nn.Sequential(gc.nn.Linear(8, 8), gc.nn.GELU()),
          gc.nn.Sequential(gc.nn.Linear(8, 8), gc.nn.GELU())}
end

-- All graphs of one call share one pool, and that takes less than the same
-- graphs captured one callable per pool.
function TestGraphed:test_one_pool_for_the_call ()
  gc.manual_seed(1)
  local mods = same_width()
  local shared = gc.graph_pool_handle()
  local G = gc.make_graphed_callables(mods, samples_of({8, 8, 8}), {pool = shared})
  local st = shared:stats()
  lu.assertEquals(st.graphs, 6)
  for i = 1, 3 do lu.assertEquals(G[i]:stats().pool_reserved_bytes, st.reserved_bytes) end
  gc.manual_seed(1)
  local sep = same_width()
  local keep, pools, sum = {}, {}, 0
  for i = 1, 3 do
    pools[i] = gc.graph_pool_handle()
    keep[i] = gc.make_graphed_callables(sep[i], {gc.ones({4, 8}, {requires_grad = true})},
                                        {pool = pools[i]})
    lu.assertEquals(pools[i]:stats().graphs, 2)
    sum = sum + pools[i]:stats().reserved_bytes
  end
  print(string.format("# one shared pool: %d bytes reserved; one pool per callable: %d bytes in all",
                      st.reserved_bytes, sum))
  lu.assertTrue(st.reserved_bytes > 0)
  lu.assertTrue(st.reserved_bytes < sum,
                string.format("shared %d is not less than separate %d", st.reserved_bytes, sum))
  -- everything still replays
  local y = G[3](G[2](G[1](gc.full({4, 8}, 0.5))))
  y:sum():backward()
  for i = 1, 3 do keep[i](gc.full({4, 8}, 0.5)):sum():backward() end
end

-- Without opts.pool the call makes one pool of its own, shared by all.
function TestGraphed:test_internal_pool_shared ()
  gc.manual_seed(1)
  local G = gc.make_graphed_callables(same_width(), samples_of({8, 8, 8}))
  local r = G[1]:stats().pool_reserved_bytes
  lu.assertTrue(r > 0)
  lu.assertEquals(G[2]:stats().pool_reserved_bytes, r)
  lu.assertEquals(G[3]:stats().pool_reserved_bytes, r)
end

function TestGraphed:test_stats ()
  local _, b = pair(two_layers())
  local pool = gc.graph_pool_handle()
  local G = gc.make_graphed_callables(b, samples_of(DIMS2), {pool = pool})
  for i = 1, 2 do
    local st = G[i]:stats()
    for _, k in ipairs({"fwd", "bwd"}) do
      lu.assertEquals(type(st[k]), "table", k)
      for _, f in ipairs({"nodes", "capture_ms", "instantiate_ms", "pool_bytes", "replays"}) do
        lu.assertEquals(type(st[k][f]), "number", k .. "." .. f)
        lu.assertTrue(st[k][f] >= 0, k .. "." .. f)
      end
      lu.assertTrue(st[k].nodes > 0, k .. ".nodes")
    end
    lu.assertNil(st.bwd_dw)
    lu.assertEquals(type(st.pool_reserved_bytes), "number")
    lu.assertTrue(st.pool_reserved_bytes > 0)
    lu.assertEquals(st.pool_reserved_bytes, pool:stats().reserved_bytes)
  end
  local f0, b0 = G[1]:stats().fwd.replays, G[1]:stats().bwd.replays
  for _ = 1, 3 do
    local y = G[2](G[1](gc.full({4, 8}, 0.5)))
    y:sum():backward()
  end
  lu.assertEquals(G[1]:stats().fwd.replays, f0 + 3)
  lu.assertEquals(G[1]:stats().bwd.replays, b0 + 3)
  G[1](gc.full({4, 8}, 0.5))  -- a forward alone
  lu.assertEquals(G[1]:stats().fwd.replays, f0 + 4)
  lu.assertEquals(G[1]:stats().bwd.replays, b0 + 3)
end

-- reset() frees an entry's graphs; calling the entry afterwards is an error.
function TestGraphed:test_reset_entry ()
  local _, b = pair(two_layers())
  local pool = gc.graph_pool_handle()
  local G = gc.make_graphed_callables(b, samples_of(DIMS2), {pool = pool, order = {1, 2, -2, -1}})
  lu.assertEquals(pool:stats().graphs, 4)
  G[1]:reset()
  lu.assertEquals(pool:stats().graphs, 2)
  local ok, err = pcall(G[1], gc.full({4, 8}, 0.5))
  lu.assertFalse(ok, "a reset entry was called")
  lu.assertStrContains(err, "reset")
  -- the other entry still works
  local y = G[2](gc.full({4, 16}, 0.5))
  y:sum():backward()
  G[2]:reset()
  lu.assertEquals(pool:stats().graphs, 0)
  lu.assertFalse(pcall(G[2], gc.full({4, 16}, 0.5)))
end

function TestGraphed:test_reset_function_entry ()
  local pool = gc.graph_pool_handle()
  local G = gc.make_graphed_callables(function (x) return gc.F.gelu(x) end,
                                      {gc.ones({4, 8}, {requires_grad = true})}, {pool = pool})
  lu.assertEquals(pool:stats().graphs, 2)
  G(gc.full({4, 8}, 0.5))
  G:reset()
  lu.assertEquals(pool:stats().graphs, 0)
  local ok, err = pcall(G, gc.full({4, 8}, 0.5))
  lu.assertFalse(ok)
  lu.assertStrContains(err, "reset")
end

-- reset() gives the entry's static buffers (outputs, grads) back to the pool
-- while the entry object lives, as TransformerEngine's since its #3427: once
-- every entry is reset and the caller's outputs are gone, no pool byte is in
-- use. They used to stay until the graphed object was collected.
function TestGraphed:test_reset_gives_static_buffers_back ()
  local _, b = pair(two_layers())
  local pool = gc.graph_pool_handle()
  local G = gc.make_graphed_callables(b, samples_of(DIMS2), {pool = pool, order = {1, 2, -2, -1}})
  local y = G[2](G[1](gc.full({4, 8}, 0.5)))
  y:sum():backward()
  y = nil -- luacheck: ignore y
  collectgarbage()
  collectgarbage()
  local full = pool:stats().in_use_bytes
  lu.assertTrue(full > 0)
  G[1]:reset()
  local half = pool:stats().in_use_bytes
  lu.assertTrue(half > 0 and half < full, string.format("in use: %d, then %d", full, half))
  G[2]:reset()
  lu.assertEquals(pool:stats().in_use_bytes, 0)
  H.assert_err(function () return G[1](gc.full({4, 8}, 0.5)) end, "was reset")
  -- a replay whose backward comes after the reset: an error, its buffers gone
  local f = gc.make_graphed_callables(function (x) return x * 2, x * 3 end,
                                      {gc.ones({4, 8}, {requires_grad = true})}, {pool = pool})
  local g = gc.make_graphed_callables(b[1], samples_of(DIMS2)[1], {pool = pool})
  local x = gc.full({4, 8}, 0.5, {requires_grad = true})
  local u, v = f(x)
  local w = g(x)
  f:reset()
  g:reset()
  H.assert_err(function () (u + v):sum():backward() end, "graphed backward: entry 1 was reset")
  H.assert_err(function () w:sum():backward() end, "graphed backward: entry 1 was reset")
  lu.assertNil(x.grad)
end

-- The warmup keeps no output longer than it needs (TransformerEngine#3427),
-- measured in the hooks as the ordinary allocator's bytes in use (outputs of
-- 64 KiB). In training an entry's outputs, their grads and saved tensors are
-- gone once its backward consumed them, before its backward hooks run: the
-- bytes in use are those before its forward (backwards run in reverse, so
-- the earlier entries' outputs are still alive, as they must be). In eval
-- an entry's outputs are gone before the next callable's forward: at most
-- one callable's outputs are alive, where the eval warmup used to keep all
-- of one iteration's.
local function warmup_in_use (training)
  gc.manual_seed(1)
  local mods = {gc.nn.Linear(8, 256), gc.nn.Linear(256, 256), gc.nn.Linear(256, 8)}
  local samples = {}
  for c, d in ipairs({8, 256, 256}) do
    mods[c]:train(training)
    samples[c] = {gc.ones({64, d}, {requires_grad = training})}
  end
  local base, seen = nil, {}
  local function probe (what)
    seen[what] = {}
    return function ()
      local v = seen[what]
      v[#v + 1] = gc.memory_stats().in_use_bytes
    end
  end
  local hooks = {}
  for c = 1, 3 do
    hooks[c] = {forward_pre_hooks = {probe("forward_pre " .. c)},
                backward_hooks = {probe("backward " .. c)}}
  end
  gc.make_graphed_callables(mods, samples, {num_warmup_iters = 2, capture_time_hooks = hooks,
                            pre_warmup_hook = function () base = gc.memory_stats().in_use_bytes end})
  for c = 1, 3 do
    local pre, post = seen["forward_pre " .. c], seen["backward " .. c]
    lu.assertEquals(#pre, 3) -- two warmup iterations, then the capture
    lu.assertEquals(#post, training and 3 or 0)
    for it = 1, 2 do
      if training then
        lu.assertEquals(post[it], pre[it], string.format("iteration %d, after the backward of "
                        .. "callable %d: bytes in use beyond those before its forward", it, c))
      else
        lu.assertEquals(pre[it], base, string.format("iteration %d, before the forward of "
                        .. "callable %d: bytes in use beyond those before the warmup", it, c))
      end
    end
  end
  lu.assertEquals(seen["forward_pre 1"][1], base)
end

function TestGraphed:test_warmup_frees_consumed_outputs ()
  warmup_in_use(true)
end

function TestGraphed:test_eval_warmup_keeps_one_callables_outputs ()
  warmup_in_use(false)
end

-- A module entry (no order) has reset() too; its graphs go.
function TestGraphed:test_reset_module_entry ()
  local _, b = pair(two_layers())
  local pool = gc.graph_pool_handle()
  local G = gc.make_graphed_callables(b, samples_of(DIMS2), {pool = pool})
  lu.assertEquals(pool:stats().graphs, 4)
  G[2]:reset()
  lu.assertEquals(pool:stats().graphs, 2)
  G[1]:reset()
  lu.assertEquals(pool:stats().graphs, 0)
  -- a call of a reset module is an error, as TransformerEngine's, not an
  -- eager forward; graphed again, it replays again
  local x = gc.randn({4, DIMS2[1]})
  H.assert_err(function () return b[1](x) end,
               "entry 1 (callable 1, Sequential) was reset; its graphs are gone")
  local G2 = gc.make_graphed_callables(b, samples_of(DIMS2), {pool = pool})
  lu.assertEquals(pool:stats().graphs, 4)
  lu.assertEquals(G2[1](x):tolist(), b[1](x):tolist())
end

-- A plain function has no training flag: beside eval-mode modules it is
-- graphed in eval mode too (forward only), not refused as a mode mix; beside
-- training-mode modules it gets a backward graph.
function TestGraphed:test_function_takes_the_modules_mode ()
  local m = gc.nn.Linear(4, 4)
  m:eval()
  local G = gc.make_graphed_callables({m, function (x) return x * 2 end},
                                      {{gc.randn({2, 4})}, {gc.randn({2, 4})}})
  lu.assertEquals(G[2](gc.ones({2, 4})):tolist(), {{2, 2, 2, 2}, {2, 2, 2, 2}})
  lu.assertNil(G[2]:stats().bwd)
  local G2 = gc.make_graphed_callables({function (x) return x * 2 end, gc.nn.Linear(4, 4)},
                                       {{gc.randn({2, 4}, {requires_grad = true})},
                                        {gc.randn({2, 4}, {requires_grad = true})}})
  lu.assertNotNil(G2[1]:stats().bwd)
end

-- ---------------------------------------------------------------------------
-- Training flag, kwargs, hooks after graphing

local forward_calls = 0
local Counted = gc.nn.Module("Counted")
function Counted:init ()
  self.lin = gc.nn.Linear(8, 8)
  self.drop = gc.nn.Dropout(0.5)
end
function Counted:forward (x)
  forward_calls = forward_calls + 1
  return self.drop(self.lin(x))
end

-- A module whose training flag differs from the one at capture runs its
-- forward eagerly (the Lua forward runs; eval dropout is the identity);
-- back in training mode it replays again.
function TestGraphed:test_training_flag_mismatch_runs_eagerly ()
  local a, b = pair(function () return {Counted()} end)
  a, b = a[1], b[1]
  local G = gc.make_graphed_callables(b, {gc.ones({4, 8}, {requires_grad = true})})
  lu.assertIs(G, b)
  local x = gc.tensor(data(4, 8, 1))
  local n = forward_calls
  G(x)
  G(x)
  lu.assertEquals(forward_calls, n, "a replay ran the Lua forward")
  b:eval()
  a:eval()
  local yb = b(x):tolist()
  lu.assertEquals(forward_calls, n + 1, "eval call did not run eagerly")
  assert_same(yb, a(x):tolist(), "eval output vs eager eval")
  assert_same(yb, a.lin(x):tolist(), "eval output vs the Linear alone")
  b:train()
  n = forward_calls
  G(x):sum():backward()
  lu.assertEquals(forward_calls, n, "back in training mode it did not replay")
end

-- Graphed again in the other mode, a module keeps both graphs, as
-- TransformerEngine's wrapper of a wrapper: training calls replay the
-- training graph and eval calls the eval graph (the Lua forward runs in
-- neither), each equal to eager in its mode; the methods act on the graph of
-- the current mode, reset() frees both. The second graphing used to replace
-- the first: training calls then ran eagerly.
function TestGraphed:test_graphed_in_both_modes ()
  local a, b = pair(function () return {Counted()} end)
  a, b = a[1], b[1]
  local x0 = gc.ones({4, 8}, {requires_grad = true})
  gc.make_graphed_callables(b, {x0})
  b:eval()
  gc.make_graphed_callables(b, {x0})
  collectgarbage()
  collectgarbage() -- the training graph lives on with the module
  local n = forward_calls
  for k = 1, 2 do
    local x = gc.tensor(data(4, 8, k))
    for _, m in ipairs({a, b}) do m:train() end
    gc.manual_seed(7 + k)
    local yb = b(x)
    gc.manual_seed(7 + k)
    local ya = a(x)
    lu.assertEquals(yb.grad_fn, "graphed", "training call " .. k .. " did not replay")
    assert_same(yb:tolist(), ya:tolist(), "training output " .. k)
    yb:sum():backward()
    ya:sum():backward()
    for _, m in ipairs({a, b}) do m:eval() end
    local eb = b(x)
    assert_same(eb:tolist(), a(x):tolist(), "eval output " .. k)
    assert_same(eb:tolist(), a.lin(x):tolist(), "eval output " .. k .. " vs the Linear alone")
  end
  lu.assertEquals(forward_calls - n, 2 * 2, "a graphed call ran the Lua forward") -- a's calls
  assert_same(b.lin.weight.grad:tolist(), a.lin.weight.grad:tolist(), "weight grad")
  lu.assertEquals(b:stats().fwd.replays, 2, "eval graph's replays")
  lu.assertNil(b:stats().bwd, "the eval graph has a backward")
  b:train()
  lu.assertEquals(b:stats().fwd.replays, 2, "training graph's replays")
  lu.assertNotNil(b:stats().bwd, "the training graph has no backward")
  -- graphed again in training mode: the new training graph replaces the old
  local pool = gc.graph_pool_handle()
  gc.make_graphed_callables(b, {x0}, {pool = pool})
  b(gc.tensor(data(4, 8, 3)))
  lu.assertEquals(b:stats().fwd.replays, 1, "the new training graph did not replay")
  b:eval()
  lu.assertEquals(b:stats().fwd.replays, 2, "the eval graph is gone")
  b:reset()
  H.assert_err(function () return b(x0) end, "was reset")
  b:train()
  H.assert_err(function () return b(x0) end, "was reset")
end

-- A module that returns another structure in each mode, graphed in both:
-- each mode's replays come back in the structure of that mode's graph.
local Moody = gc.nn.Module("Moody")
function Moody:init () self.lin = gc.nn.Linear(8, 8) end
function Moody:forward (x)
  local y = self.lin(x)
  if self.training then return {y = y, twice = y * 2} end
  return y
end

function TestGraphed:test_graphed_in_both_modes_keeps_each_structure ()
  gc.manual_seed(3)
  local m = Moody()
  local x = gc.tensor(data(4, 8, 1))
  gc.make_graphed_callables(m, {gc.ones({4, 8}, {requires_grad = true})})
  m:eval()
  gc.make_graphed_callables(m, {gc.ones({4, 8})})
  local want = m.lin(x):tolist()
  local e = m(x)
  lu.assertNil(e.grad_fn, "eval output")
  assert_same(e:tolist(), want, "eval output")
  m:train()
  local t = m(x)
  lu.assertEquals(type(t), "table", "training output")
  lu.assertEquals(t.y.grad_fn, "graphed output")
  assert_same(t.y:tolist(), want, "training output y")
  lu.assertEquals(m:stats().fwd.replays, 1)
end

local Masked = gc.nn.Module("Masked")
function Masked:init () self.lin = gc.nn.Linear(8, 8) end
function Masked:forward (x, kw) return self.lin(x) * kw.scale + kw.shift end

local function kwargs (k)
  return {scale = gc.tensor(data(4, 8, k + 10)), shift = gc.tensor(data(4, 8, k + 20))}
end

-- Both modes' graphs take one kwargs map: other sample keys in the other
-- mode are refused, naming sample_kwargs and both key lists.
function TestGraphed:test_graphed_in_both_modes_same_kwargs ()
  local _, b = pair(function () return {Masked()} end)
  b = b[1]
  gc.make_graphed_callables(b, {gc.ones({4, 8}, {requires_grad = true})},
                            {sample_kwargs = {scale = gc.ones({4, 8}), shift = gc.zeros({4, 8})}})
  b:eval()
  H.assert_err(function ()
    gc.make_graphed_callables(b, {gc.ones({4, 8})}, {sample_kwargs = {scale = gc.ones({4, 8})}})
  end, "sample_kwargs of callable 1 has the keys {scale}, but Masked is graphed in training mode "
       .. "with {scale, shift}")
  local G = gc.make_graphed_callables(b, {gc.ones({4, 8})}, {sample_kwargs = {
    scale = gc.ones({4, 8}), shift = gc.zeros({4, 8})}})
  lu.assertIs(G, b)
end

-- sample_kwargs: the map comes as the last argument, at capture and replay;
-- its values are read at replay, by name.
function TestGraphed:test_sample_kwargs ()
  local a, b = pair(function () return {Masked()} end)
  a, b = a[1], b[1]
  local G = gc.make_graphed_callables(b, {gc.ones({4, 8}, {requires_grad = true})},
                                      {sample_kwargs = {scale = gc.ones({4, 8}), shift = gc.zeros({4, 8})}})
  lu.assertIs(G, b)
  for k = 1, 3 do
    local x, kw = gc.tensor(data(4, 8, k)), kwargs(k)
    local yg, ye = G(x, kw), a(x, kw)
    assert_same(yg:tolist(), ye:tolist(), "output " .. k)
    yg:sum():backward()
    ye:sum():backward()
  end
  local pa, pb = a:parameters(), b:parameters()
  for i = 1, #pa do assert_same(pb[i].grad:tolist(), pa[i].grad:tolist(), "grad " .. i) end
end

function TestGraphed:test_sample_kwargs_missing_key ()
  local _, b = pair(function () return {Masked()} end)
  local G = gc.make_graphed_callables(b[1], {gc.ones({4, 8}, {requires_grad = true})},
                                      {sample_kwargs = {scale = gc.ones({4, 8}), shift = gc.zeros({4, 8})}})
  local ok, err = pcall(G, gc.tensor(data(4, 8, 1)), {scale = gc.ones({4, 8})})
  lu.assertFalse(ok, "a missing kwarg was accepted")
  lu.assertStrContains(err, "shift")
end

function TestGraphed:test_sample_kwargs_extra_keys_ignored ()
  local a, b = pair(function () return {Masked()} end)
  local G = gc.make_graphed_callables(b[1], {gc.ones({4, 8}, {requires_grad = true})},
                                      {sample_kwargs = {scale = gc.ones({4, 8}), shift = gc.zeros({4, 8})}})
  local x, kw = gc.tensor(data(4, 8, 2)), kwargs(2)
  local want = a[1](x, kw):tolist()
  kw.unused = gc.ones({3})
  kw.also_unused = 7
  assert_same(G(x, kw):tolist(), want, "output with extra keys")
end

-- Several callables: a sequence of maps (or false) parallel to sample_args.
function TestGraphed:test_sample_kwargs_sequence ()
  local function build () return {gc.nn.Linear(8, 8), Masked()} end
  local a, b = pair(build)
  local G = gc.make_graphed_callables(b, {{gc.ones({4, 8}, {requires_grad = true})},
                                          {gc.ones({4, 8}, {requires_grad = true})}},
                                      {sample_kwargs = {false, {scale = gc.ones({4, 8}),
                                                                shift = gc.zeros({4, 8})}}})
  for k = 1, 2 do
    local x, kw = gc.tensor(data(4, 8, k)), kwargs(k)
    local yg, ye = G[2](G[1](x), kw), a[2](a[1](x), kw)
    assert_same(yg:tolist(), ye:tolist(), "output " .. k)
    yg:sum():backward()
    ye:sum():backward()
  end
  local pa, pb = all_params(a), all_params(b)
  for i = 1, #pa do assert_same(pb[i].grad:tolist(), pa[i].grad:tolist(), "grad " .. i) end
end

-- Hooks registered after graphing run eagerly around each replay.
function TestGraphed:test_hooks_after_graphing_run_on_replay ()
  local _, b = linear_pair(true)
  local G = gc.make_graphed_callables(b[1], {gc.ones({4, 8}, {requires_grad = true})})
  local n, capturing = 0, false
  local h = b[1]:register_forward_hook(function ()
    n = n + 1
    capturing = capturing or gc.is_capturing()
  end)
  G(gc.full({4, 8}, 0.5))
  G(gc.full({4, 8}, 0.25)):sum():backward()
  lu.assertEquals(n, 2)
  lu.assertFalse(capturing)
  h:remove()
  G(gc.full({4, 8}, 0.5))
  lu.assertEquals(n, 2)
end

-- regression: a node no grad reached ran with a NULL grad (a segfault)
-- A Linear graphed with a sample input that needs no grad, called on an
-- activation that does: backward gives that input no grad (as TE and
-- PyTorch: the static input needed none at capture), the layer's
-- parameters get theirs, and nothing crashes.
function TestGraphed:test_input_needing_grad_only_at_replay ()
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

-- regression: module and graphed calls held their tensors in arrays of 8
-- A Lua function of 9 tensor arguments is graphed, called and
-- backpropagated through; so is a module called with 9 tensors.
function TestGraphed:test_nine_tensor_arguments ()
  local function sum (...)
    local s = ...
    for i = 2, select("#", ...) do s = s + select(i, ...) end
    return s
  end
  local a = {}
  for i = 1, 9 do a[i] = gc.full({2}, i, {requires_grad = true}) end
  local g = gc.make_graphed_callables(sum, a, {num_warmup_iters = 1})
  local y = g(table.unpack(a))
  H.assert_same(y:tolist(), {45, 45}, "graphed sum")
  y:sum():backward()
  H.assert_same(a[9].grad:tolist(), {1, 1}, "grad of argument 9")
  local M = gc.nn.Module("Sum9")
  function M:forward (...) return sum(...) end
  local m = M()
  H.assert_same(m(table.unpack(a)):tolist(), {45, 45}, "module call")
  local seq = gc.nn.Linear(2, 2)
  H.assert_err(function () return seq(table.unpack(a)) end, "Linear")
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
