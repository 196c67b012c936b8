-- test_graphed_errors.lua: the error paths of make_graphed_callables
-- (docs/semantics.md; TransformerEngine's checks, and more where "Differences
-- from TransformerEngine and PyTorch" says so), each its own test, each
-- checking what the message names: hook tables, module hooks of the four kinds
-- (on the callable and on a submodule), buffers that require grad, sample
-- arguments, train/eval mixes, unused inputs, buffer reuse, option names, and
-- every rule of `order` (the error names the position). Every failing call must
-- leave no live graph and no block in use in the pool it was given; a failed
-- call also leaves .grad values, parameters and the generator as they were.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_graphed_errors.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local linears, samples, assert_same = H.linears, H.samples, H.assert_same

-- Call make_graphed_callables(callables, sample_args, opts) with a pool of
-- our own in opts (unless opts has one); it must fail with a string that
-- contains every one of `...`, end no capture, and leave the pool without
-- graphs or blocks in use. Returns the message.
local function expect_error (callables, sample_args, opts, ...)
  opts = opts or {}
  if opts.pool == nil then opts.pool = gc.graph_pool_handle() end
  local pool = opts.pool
  local ok, err = pcall(gc.make_graphed_callables, callables, sample_args, opts)
  lu.assertFalse(ok, "make_graphed_callables should have failed")
  lu.assertEquals(type(err), "string")
  for _, s in ipairs({...}) do lu.assertStrContains(err, s) end
  lu.assertFalse(gc.is_capturing())
  collectgarbage() -- a Lua forward's intermediate tensors are garbage, not held
  local st = pool:stats()
  lu.assertEquals(st.graphs, 0, "live graphs left in the pool: " .. err)
  lu.assertEquals(st.in_use_bytes, 0, "pool blocks left in use: " .. err)
  return err
end

-- Two chunks' worth of Linear(8, 8) and samples for `order`.
local function order_error (order, ncallables, nentries, extra, ...)
  local opts = {order = order, num_warmup_iters = 1}
  for k, v in pairs(extra or {}) do opts[k] = v end
  local mods = linears(ncallables, extra and extra.module_opts)
  opts.module_opts = nil
  return expect_error(mods, samples(nentries), opts, ...)
end

local function noop () end

TestGraphedErrors = {tearDown = H.no_capture_left}

-- ---------------------------------------------------------------------------
-- capture_time_hooks tables (checked before any work)

function TestGraphedErrors:test_hooks_too_few_entries ()
  expect_error(linears(2), samples(2), {capture_time_hooks = {{forward_hooks = {noop}}}},
               "capture_time_hooks", "callable")
end

function TestGraphedErrors:test_hooks_too_many_entries ()
  expect_error(linears(2), samples(2), {capture_time_hooks = {false, false, false}},
               "capture_time_hooks", "callable")
end

-- One per callable, not per entry of the order.
function TestGraphedErrors:test_hooks_one_per_entry_of_order ()
  expect_error(linears(2), samples(4),
               {order = {1, 2, 1, 2, -2, -1, -2, -1}, capture_time_hooks = {false, false, false, false}},
               "capture_time_hooks", "callable")
end

-- A single callable still takes a sequence of one entry.
function TestGraphedErrors:test_hooks_single_callable_not_a_sequence ()
  local ran = 0
  expect_error(linears(1)[1], {gc.ones({4, 8})},
               {capture_time_hooks = {forward_hooks = {function () ran = ran + 1 end}}},
               "capture_time_hooks")
  lu.assertEquals(ran, 0)
end

function TestGraphedErrors:test_hooks_unknown_group ()
  local err = expect_error(linears(2), samples(2),
                           {capture_time_hooks = {false, {backward_post_hooks = {noop}}}},
                           "capture_time_hooks", "backward_post_hooks")
  lu.assertNotNil(err)
end

-- A group is a sequence or a map, not both; checked before any hook runs.
-- Hook ids are integers or strings (TransformerEngine's {hook_id: fn}):
-- another kind of key is refused before any work.
function TestGraphedErrors:test_hooks_bad_id ()
  local ran = 0
  local function h () ran = ran + 1 end
  expect_error(linears(2), samples(2),
               {capture_time_hooks = {{forward_pre_hooks = {h, [true] = h}}, false}},
               "capture_time_hooks[1].forward_pre_hooks has an id true that is neither an integer "
               .. "nor a string")
  expect_error(linears(2), samples(2),
               {capture_time_hooks = {{forward_pre_hooks = {[0] = h, second = 42}}, false}},
               'capture_time_hooks[1].forward_pre_hooks["second"] must be a function, got number')
  lu.assertEquals(ran, 0)
end

-- The order of a group: integer ids ascending (from 0 as TE users number
-- them, or a sequence), then string ids sorted; a mix is one group.
function TestGraphedErrors:test_hooks_id_order ()
  local seen = {}
  local function tag (t) return function () seen[#seen + 1] = t end end
  local grp = {[2] = tag("2"), [0] = tag("0"), zeta = tag("zeta"), alpha = tag("alpha"),
               [1] = tag("1")}
  gc.make_graphed_callables(linears(1), samples(1),
                            {num_warmup_iters = 1, capture_time_hooks = {{forward_pre_hooks = grp}}})
  lu.assertEquals(seen, {"0", "1", "2", "alpha", "zeta", "0", "1", "2", "alpha", "zeta"})
end

function TestGraphedErrors:test_hooks_entry_not_a_table ()
  expect_error(linears(2), samples(2), {capture_time_hooks = {true, false}}, "capture_time_hooks")
end

function TestGraphedErrors:test_hooks_not_a_function ()
  local ran = 0
  expect_error(linears(2), samples(2),
               {capture_time_hooks = {{forward_hooks = {function () ran = ran + 1 end, 42}}, false}},
               "capture_time_hooks", "forward_hooks")
  lu.assertEquals(ran, 0)
end

-- ---------------------------------------------------------------------------
-- Module hooks registered before graphing: rejected, naming the module and
-- the kind; on the callable itself and on a submodule.

local KINDS = {
  {"register_forward_pre_hook", "forward pre-hook"},
  {"register_forward_hook", "forward hook"},
  {"register_full_backward_pre_hook", "backward pre-hook"},
  {"register_full_backward_hook", "backward hook"},
}

local function check_module_hook (kind, on_submodule)
  gc.manual_seed(1)
  local ran = 0
  local m, target, name
  if on_submodule then
    target = gc.nn.GELU()
    m = gc.nn.Sequential(gc.nn.Linear(8, 8), target)
    name = "GELU"
  else
    m = gc.nn.Linear(8, 8)
    target, name = m, "Linear"
  end
  target[KINDS[kind][1]](target, function () ran = ran + 1 end)
  local err = expect_error(m, {gc.ones({4, 8}, {requires_grad = true})}, {},
                           KINDS[kind][2], name)
  for k = 1, #KINDS do
    if k ~= kind then lu.assertNotStrContains(err, KINDS[k][2]) end
  end
  lu.assertEquals(ran, 0)
end

function TestGraphedErrors:test_forward_pre_hook_on_callable () check_module_hook(1, false) end
function TestGraphedErrors:test_forward_hook_on_callable () check_module_hook(2, false) end
function TestGraphedErrors:test_backward_pre_hook_on_callable () check_module_hook(3, false) end
function TestGraphedErrors:test_backward_hook_on_callable () check_module_hook(4, false) end
function TestGraphedErrors:test_forward_pre_hook_on_submodule () check_module_hook(1, true) end
function TestGraphedErrors:test_forward_hook_on_submodule () check_module_hook(2, true) end
function TestGraphedErrors:test_backward_pre_hook_on_submodule () check_module_hook(3, true) end
function TestGraphedErrors:test_backward_hook_on_submodule () check_module_hook(4, true) end

-- In a list of callables, the second one's hook is found too.
function TestGraphedErrors:test_module_hook_on_second_callable ()
  local mods = linears(2)
  mods[2]:register_forward_hook(noop)
  expect_error(mods, samples(2), {}, "forward hook", "Linear")
end

-- A removed hook is no obstacle.
function TestGraphedErrors:test_removed_hook_accepted ()
  local m = linears(1)[1]
  local h = m:register_forward_hook(noop)
  h:remove()
  local G = gc.make_graphed_callables(m, {gc.ones({4, 8}, {requires_grad = true})},
                                      {num_warmup_iters = 1})
  lu.assertIs(G, m)
end

-- ---------------------------------------------------------------------------
-- Buffers

function TestGraphedErrors:test_buffer_requires_grad ()
  local m = linears(1)[1]
  m:register_buffer("running", gc.zeros({8}, {requires_grad = true}))
  expect_error(m, {gc.ones({4, 8})}, {}, "running", "requires grad")
end

function TestGraphedErrors:test_submodule_buffer_requires_grad ()
  gc.manual_seed(1)
  local inner = gc.nn.Linear(8, 8)
  inner:register_buffer("stash", gc.zeros({8}, {requires_grad = true}))
  local m = gc.nn.Sequential(inner, gc.nn.GELU())
  expect_error(m, {gc.ones({4, 8})}, {}, "stash", "requires grad")
end

function TestGraphedErrors:test_buffer_without_grad_accepted ()
  local m = linears(1)[1]
  m:register_buffer("running", gc.zeros({8}))
  gc.make_graphed_callables(m, {gc.ones({4, 8})}, {num_warmup_iters = 1})
end

-- ---------------------------------------------------------------------------
-- Callables, sample arguments, modes

function TestGraphedErrors:test_no_callables ()
  expect_error({}, {}, {}, "callable")
end

function TestGraphedErrors:test_not_a_callable ()
  local mods = linears(1)
  expect_error({mods[1], 42}, samples(2), {}, "callable")
end

function TestGraphedErrors:test_sample_arg_number ()
  expect_error(linears(1)[1], {gc.ones({4, 8}), 3}, {}, "sample_args", "tensor")
end

function TestGraphedErrors:test_sample_arg_string ()
  expect_error(linears(2), {{gc.ones({4, 8})}, {"x"}}, {}, "sample_args", "tensor")
end

function TestGraphedErrors:test_sample_arg_table ()
  expect_error(linears(1)[1], {{1, 2, 3}}, {}, "sample_args", "tensor")
end

function TestGraphedErrors:test_sample_args_too_few ()
  expect_error(linears(2), samples(1), {}, "sample_args")
end

function TestGraphedErrors:test_sample_args_too_many ()
  expect_error(linears(2), samples(3), {}, "sample_args")
end

-- With an order: one per (chunk, microbatch, layer).
function TestGraphedErrors:test_sample_args_wrong_count_with_order ()
  order_error({1, 2, -2, -1}, 2, 3, {num_layers_per_chunk = {1, 1}}, "sample_args")
end

function TestGraphedErrors:test_sample_args_indivisible_with_order ()
  order_error({1, 2, -2, -1}, 2, 3, nil, "sample_args")
end

-- sample_kwargs of several callables: one map (or false) per callable, or per
-- entry with an order; more or fewer is TransformerEngine's ValueError.
function TestGraphedErrors:test_sample_kwargs_too_many ()
  expect_error(linears(2), samples(2), {sample_kwargs = {false, false, {b = gc.ones({8})}}},
               "sample_kwargs has 3 entries, but there are 2 callables")
end

function TestGraphedErrors:test_sample_kwargs_too_few ()
  expect_error(linears(2), samples(2), {sample_kwargs = {{b = gc.ones({8})}}},
               "sample_kwargs has 1 entry, but there are 2 callables")
end

function TestGraphedErrors:test_sample_kwargs_map_for_several_callables ()
  expect_error(linears(2), samples(2), {sample_kwargs = {b = gc.ones({8})}},
               "sample_kwargs must be a sequence with one map (or false) per callable, got a key b")
end

function TestGraphedErrors:test_sample_kwargs_count_with_order ()
  local mods = linears(1)
  expect_error(mods, samples(2), {order = {1, 1, -1, -1}, sample_kwargs = {false}},
               "sample_kwargs has 1 entry, but there are 2 sample_args entries (one map or "
               .. "false per entry)")
  local G = gc.make_graphed_callables(mods, samples(2), {order = {1, 1, -1, -1},
                                      num_warmup_iters = 1, sample_kwargs = {false, false}})
  lu.assertEquals(#G, 2)
end

-- A module closed by its own capture-time hook cannot be returned or replay:
-- refused at the user's line, naming it (the facade's line and an internal
-- 'newindex' were named), with no graph or pool block left.
function TestGraphedErrors:test_module_closed_by_its_hook ()
  local here = debug.getinfo(1, "S").short_src .. ":"
  local m = linears(1)[1]
  local msg = expect_error(m, {gc.ones({4, 8})}, {capture_time_hooks = {
    {forward_hooks = {function (mod) mod:close() end}}}},
    "make_graphed_callables: callable 1 (Linear) was closed during the call")
  lu.assertEquals(msg:sub(1, #here), here)
  lu.assertEquals(tostring(m), "graphcap.Module (closed)")
end

-- A sample argument that requires grad must be a leaf.
function TestGraphedErrors:test_sample_arg_not_a_leaf ()
  local x = gc.ones({4, 8}, {requires_grad = true}) * 2
  expect_error(linears(1)[1], {x}, {}, "leaf")
end

function TestGraphedErrors:test_train_eval_mix ()
  local mods = linears(2)
  mods[2]:eval()
  expect_error(mods, samples(2), {}, "training", "eval")
end

-- Two inputs, the second unused.
local TwoIn = gc.nn.Module("TwoIn")
function TwoIn:init () self.lin = gc.nn.Linear(8, 8) end
function TwoIn:forward (x, y) return self.lin(x) end  -- luacheck: ignore y

function TestGraphedErrors:test_unused_input ()
  gc.manual_seed(1)
  local m = TwoIn()
  expect_error(m, {gc.ones({4, 8}, {requires_grad = true}), gc.ones({4, 8}, {requires_grad = true})},
               {num_warmup_iters = 2}, "allow_unused_input", "requires grad")
end

function TestGraphedErrors:test_unused_input_allowed ()
  gc.manual_seed(1)
  local m = TwoIn()
  local G = gc.make_graphed_callables(m, {gc.ones({4, 8}, {requires_grad = true}),
                                          gc.ones({4, 8}, {requires_grad = true})},
                                      {num_warmup_iters = 2, allow_unused_input = true})
  lu.assertIs(G, m)
  local x = gc.full({4, 8}, 0.5, {requires_grad = true})
  local y = gc.full({4, 8}, 0.25, {requires_grad = true})
  local want = m.lin(x):tolist()
  local out = G(x, y)
  lu.assertEquals(out:tolist(), want)
  out:sum():backward()
  lu.assertNotNil(x.grad)
  lu.assertNil(y.grad)
end

-- regression: a parameter that first got a grad after warmup iteration 1 was pruned and
-- silently never trained
-- A module whose forward uses a child from its n-th call on (late), or
-- only in its first call (early): the set of parameters getting a grad
-- changes between warmup iterations, an error naming the parameter and
-- the iterations, with the parameters' .grad as before.
local Gated = gc.nn.Module("Gated")
function Gated:init (from, to)
  self.lin, self.extra = gc.nn.Linear(8, 8), gc.nn.Linear(8, 8)
  self.calls, self.from, self.to = 0, from, to
end
function Gated:forward (x)
  self.calls = self.calls + 1
  local y = self.lin(x)
  if self.calls >= self.from and self.calls <= self.to then y = self.extra(y) end
  return y
end

function TestGraphedErrors:test_param_grad_appears_after_first_iteration ()
  gc.manual_seed(1)
  local m = Gated(2, math.huge)
  local ps = m:parameters()
  ps[3].grad = gc.full({8, 8}, 7)
  local before = H.state(ps)
  local err = expect_error(m, {gc.ones({4, 8}, {requires_grad = true})}, {},
                           "warmup backward of entry 1 (callable 1, Gated)",
                           "the set of parameters getting a grad changed between warmup iterations",
                           "parameter 'extra.weight' got a grad in warmup iteration 2 but none in iteration 1")
  lu.assertStrContains(err, "from the first warmup iteration on")
  H.assert_state(before, ps, nil, "after the failed call", {live = true, heap = true})
end

function TestGraphedErrors:test_param_grad_vanishes_after_first_iteration ()
  gc.manual_seed(1)
  local m = Gated(1, 2)
  expect_error(m, {gc.ones({4, 8}, {requires_grad = true})}, {},
               "the set of parameters getting a grad changed between warmup iterations",
               "parameter 'extra.weight' got a grad in warmup iteration 1 but none in iteration 3")
end

-- regression: with one warmup iteration, a parameter that first got its grad at capture was
-- silently never trained, and one that lost it kept its warmup grad's place
function TestGraphedErrors:test_param_grad_appears_at_capture ()
  gc.manual_seed(1)
  local m = Gated(2, math.huge)
  local ps = m:parameters()
  ps[3].grad = gc.full({8, 8}, 7)
  local before = H.state(ps)
  expect_error(m, {gc.ones({4, 8}, {requires_grad = true})}, {num_warmup_iters = 1},
               "backward capture of entry 1 (callable 1, Gated)",
               "the set of parameters getting a grad changed between the warmup and the capture",
               "parameter 'extra.weight' got a grad at capture but none in the warmup (1 iteration)")
  H.assert_state(before, ps, nil, "after the failed call", {live = true, heap = true})
  -- from its third call on the child is used in every call: graphed again, it works
  local G = gc.make_graphed_callables(m, {gc.ones({4, 8}, {requires_grad = true})},
                                      {num_warmup_iters = 1})
  G(gc.ones({4, 8}, {requires_grad = true})):sum():backward()
  lu.assertNotNil(ps[3].grad)
end

function TestGraphedErrors:test_param_grad_vanishes_at_capture ()
  gc.manual_seed(1)
  local m = Gated(1, 1)
  expect_error(m, {gc.ones({4, 8}, {requires_grad = true})}, {num_warmup_iters = 1},
               "backward capture of entry 1 (callable 1, Gated)",
               "parameter 'extra.weight' got a grad in the warmup (1 iteration) but none at capture")
end

function TestGraphedErrors:test_reuse_without_order ()
  expect_error(linears(2), samples(2), {reuse_graph_input_output_buffers = true},
               "reuse_graph_input_output_buffers", "order")
end

function TestGraphedErrors:test_reuse_in_eval ()
  local mods = linears(2)
  for _, m in ipairs(mods) do m:eval() end
  expect_error(mods, samples(2), {reuse_graph_input_output_buffers = true, order = {1, 2, -2, -1}},
               "reuse_graph_input_output_buffers", "training")
end

-- ---------------------------------------------------------------------------
-- Options

function TestGraphedErrors:test_unknown_option ()
  expect_error(linears(2), samples(2), {num_warmup_iter = 2}, "num_warmup_iter", "option")
end

function TestGraphedErrors:test_option_in_both_spellings ()
  -- TE's spelling _order is order (test_te_names.lua); both at once is an error
  expect_error(linears(2), samples(2), {_order = {1, 2, -2, -1}, order = {1, 2, -2, -1}},
               "'_order'", "'order'", "one of them")
end

function TestGraphedErrors:test_options_not_a_table ()
  local ok, err = pcall(gc.make_graphed_callables, linears(1)[1], {gc.ones({4, 8})}, 3)
  lu.assertFalse(ok)
  lu.assertStrContains(err, "option")
end

function TestGraphedErrors:test_negative_warmup_iters ()
  expect_error(linears(2), samples(2), {num_warmup_iters = -1}, "num_warmup_iters")
end

function TestGraphedErrors:test_num_layers_per_chunk_without_order ()
  expect_error(linears(2), samples(2), {num_layers_per_chunk = {1, 1}}, "num_layers_per_chunk")
end

-- ---------------------------------------------------------------------------
-- order (fully validated; the error names the position)

function TestGraphedErrors:test_order_zero ()
  order_error({1, 0, -1}, 1, 1, nil, "position 2")
end

function TestGraphedErrors:test_order_fractional_forward ()
  order_error({1, 1.5, -1}, 1, 1, nil, "position 2", "1.5")
end

function TestGraphedErrors:test_order_quarter ()
  order_error({1, -1, -1.25}, 1, 1, nil, "position 3", "-1.25")
end

function TestGraphedErrors:test_order_entry_beyond_largest_forward ()
  order_error({1, 2, -3, -2, -1}, 2, 2, nil, "position 3")
end

function TestGraphedErrors:test_order_backward_first ()
  order_error({-1, 1}, 1, 1, nil, "position 1")
end

-- The 2nd backward of chunk 1 before its 2nd forward.
function TestGraphedErrors:test_order_backward_before_its_forward ()
  order_error({1, -1, -1, 1}, 1, 2, nil, "position 3")
end

function TestGraphedErrors:test_order_no_forward ()
  order_error({-1}, 1, 1, nil, "forward")
end

function TestGraphedErrors:test_order_empty ()
  order_error({}, 1, 1, nil, "order")
end

function TestGraphedErrors:test_order_not_numbers ()
  order_error({1, "x", -1}, 1, 1, nil, "order")
end

-- Chunk 1 has two microbatches, chunk 2 one.
function TestGraphedErrors:test_order_uneven_microbatches ()
  order_error({1, 1, 2, -1, -1, -2}, 2, 4, nil, "chunk 2")
end

-- Chunk 1: two forwards, one backward.
function TestGraphedErrors:test_order_missing_backward ()
  order_error({1, 2, -2, -1, 1, 2, -2}, 2, 4, nil, "chunk 1")
end

-- A delayed wgrad must follow a backward of its chunk.
function TestGraphedErrors:test_order_wgrad_before_backward ()
  order_error({1, -1.5, -1}, 1, 1, {module_opts = {delay_wgrad = true}}, "position 2")
end

function TestGraphedErrors:test_order_wgrad_twice ()
  order_error({1, -1, -1.5, -1.5}, 1, 1, {module_opts = {delay_wgrad = true}}, "position 4")
end

function TestGraphedErrors:test_order_wgrad_of_other_chunk ()
  order_error({1, 2, -2, -1.5, -1}, 2, 2, {module_opts = {delay_wgrad = true}}, "position 4")
end

-- A wgrad entry for a module without a delayed-wgrad Linear.
function TestGraphedErrors:test_order_wgrad_without_delay_wgrad ()
  order_error({1, -1, -1.5}, 1, 1, nil, "delay_wgrad")
end

-- The order has wgrad entries, but none for chunk 1's delayed-wgrad Linear.
function TestGraphedErrors:test_order_delay_wgrad_without_its_wgrad ()
  order_error({1, 2, -2, -2.5, -1}, 2, 2, {module_opts = {delay_wgrad = true}}, "wgrad")
end

function TestGraphedErrors:test_order_layers_do_not_sum ()
  order_error({1, -1}, 2, 2, {num_layers_per_chunk = {1}}, "num_layers_per_chunk")
end

function TestGraphedErrors:test_order_layers_sum_too_high ()
  order_error({1, 2, -2, -1}, 2, 3, {num_layers_per_chunk = {2, 1}}, "num_layers_per_chunk")
end

function TestGraphedErrors:test_order_layers_wrong_length ()
  order_error({1, 2, -2, -1}, 2, 2, {num_layers_per_chunk = {1, 1, 1}}, "num_layers_per_chunk")
end

-- TE accepts [1, 1, -1, -2] for two 1-layer chunks and captures chunk 2's
-- slot with chunk 1's callable; we name the first bad position.
function TestGraphedErrors:test_order_wrong_mapping_te_accepts ()
  order_error({1, 1, -1, -2}, 2, 2, nil, "position 4")
end

function TestGraphedErrors:test_order_wrong_mapping_with_layers ()
  order_error({1, 1, -1, -2}, 2, 2, {num_layers_per_chunk = {1, 1}}, "position 4")
end

-- ---------------------------------------------------------------------------
-- Rollback: a failed call leaves .grad values, parameters, the generator
-- and the pool as they were.

-- Values of the tensors (false for a nil .grad) and their grads.
local function state_of (tensors)
  local s = {}
  for i, t in ipairs(tensors) do
    s[i] = {value = t:tolist(), grad = t.grad and t.grad:tolist() or false,
            grad_ptr = t.grad and t.grad:data_ptr() or false}
  end
  return s
end

local function assert_state (tensors, before, what)
  local now = state_of(tensors)
  for i = 1, #before do
    assert_same(now[i].value, before[i].value, what .. ": value " .. i)
    lu.assertEquals(now[i].grad == false, before[i].grad == false, what .. ": grad " .. i .. " appeared or vanished")
    if before[i].grad then
      assert_same(now[i].grad, before[i].grad, what .. ": grad " .. i)
    end
  end
end

-- fail(pool) must raise; the generator, the tensors' values and grads and
-- the pool must be as before.
local function check_rollback (tensors, fail, ...)
  local before = state_of(tensors)
  local pool = gc.graph_pool_handle()
  gc.manual_seed(7)
  local ok, err = pcall(fail, pool)
  lu.assertFalse(ok, "the call should have failed")
  for _, s in ipairs({...}) do lu.assertStrContains(err, s) end
  local after_failed = gc.rand({32}):tolist()
  gc.manual_seed(7)
  local fresh = gc.rand({32}):tolist()
  assert_same(after_failed, fresh, "generator after the failed call")
  assert_state(tensors, before, "after the failed call")
  local st = pool:stats()
  lu.assertEquals(st.graphs, 0)
  lu.assertEquals(st.in_use_bytes, 0)
  lu.assertFalse(gc.is_capturing())
  return pool, err
end

local function params_and (mods, extra)
  local ts = {}
  for _, m in ipairs(mods) do
    for _, p in ipairs(m:parameters()) do ts[#ts + 1] = p end
  end
  for _, t in ipairs(extra or {}) do ts[#ts + 1] = t end
  return ts
end

-- Linear + Dropout + GELU: warmup draws random numbers.
local function dropout_models (n)
  gc.manual_seed(3)
  local mods = {}
  for c = 1, n do
    mods[c] = gc.nn.Sequential(gc.nn.Linear(8, 8), gc.nn.Dropout(0.25), gc.nn.GELU())
  end
  return mods
end

-- Give every parameter (and the samples) a .grad by an eager pass.
local function eager_grads (mods, xs)
  for c, m in ipairs(mods) do
    local y = m(xs[c][1])
    y:sum():backward()
  end
end

-- Fails in the first warmup backward (unused input); Dropout drew numbers.
local DropTwoIn = gc.nn.Module("DropTwoIn")
function DropTwoIn:init ()
  self.lin = gc.nn.Linear(8, 8)
  self.drop = gc.nn.Dropout(0.25)
end
function DropTwoIn:forward (x, y) return self.drop(self.lin(x)) end  -- luacheck: ignore y

function TestGraphedErrors:test_rollback_after_warmup_failure ()
  gc.manual_seed(3)
  local m = DropTwoIn()
  local x = gc.ones({4, 8}, {requires_grad = true})
  local y = gc.ones({4, 8}, {requires_grad = true})
  m(x, y):sum():backward()
  lu.assertNotNil(x.grad)
  check_rollback(params_and({m}, {x, y}), function (pool)
    return gc.make_graphed_callables(m, {x, y}, {pool = pool, num_warmup_iters = 2})
  end, "allow_unused_input")
end

-- Fails at capture: a hook raises on its (num_warmup_iters + 1)-th call,
-- the last of the capture.
function TestGraphedErrors:test_rollback_after_capture_failure ()
  local mods = dropout_models(2)
  local xs = samples(2)
  eager_grads(mods, xs)
  local calls = 0
  local hooks = {{backward_hooks = {function ()
    calls = calls + 1
    if calls == 3 then error("raised at capture") end
  end}}, false}
  check_rollback(params_and(mods, {xs[1][1], xs[2][1]}), function (pool)
    return gc.make_graphed_callables(mods, xs, {pool = pool, num_warmup_iters = 2,
                                                capture_time_hooks = hooks})
  end, "raised at capture")
  lu.assertEquals(calls, 3)
end

-- Fails at the end of capture (a delayed-wgrad entry without its wgrad).
function TestGraphedErrors:test_rollback_after_late_order_failure ()
  gc.manual_seed(3)
  local mods = {gc.nn.Sequential(gc.nn.Linear(8, 8, {delay_wgrad = true}), gc.nn.Dropout(0.25)),
                gc.nn.Sequential(gc.nn.Linear(8, 8, {delay_wgrad = true}), gc.nn.Dropout(0.25))}
  local xs = samples(2)
  for c = 1, 2 do
    local y = mods[c](xs[c][1])
    y:sum():backward()
    mods[c]:backward_dw()
  end
  check_rollback(params_and(mods, {xs[1][1], xs[2][1]}), function (pool)
    return gc.make_graphed_callables(mods, xs, {pool = pool, num_warmup_iters = 2,
                                                order = {1, 2, -2, -2.5, -1},
                                                num_layers_per_chunk = {1, 1}})
  end, "wgrad")
end

-- A pool whose free blocks hold non-zero values (so that reading a block
-- nobody wrote shows).
local function dirty_pool ()
  local pool = gc.graph_pool_handle()
  do
    local x = gc.full({64, 64}, 3)
    local g, y = gc.Graph(), nil
    g:capture(function () y = x * 2 + x end, {pool = pool})
    g:replay()
    lu.assertEquals(y:sum():item(), 9 * 64 * 64)
    y = nil  -- luacheck: ignore y
    g:reset()
  end
  collectgarbage()
  collectgarbage()
  lu.assertEquals(pool:stats().in_use_bytes, 0)
  return pool
end

-- After the same late failure the modules' delayed wgrad works eagerly as
-- in an identical pair that never went through the call: nothing the
-- captured backward queued for backward_dw stays queued.
function TestGraphedErrors:test_delayed_wgrad_usable_after_failed_call ()
  local function build ()
    return {gc.nn.Sequential(gc.nn.Linear(8, 8, {delay_wgrad = true}), gc.nn.GELU()),
            gc.nn.Sequential(gc.nn.Linear(8, 8, {delay_wgrad = true}), gc.nn.GELU())}
  end
  gc.manual_seed(3)
  local mods = build()
  gc.manual_seed(4)
  local twin = build()
  gc.no_grad(function ()
    for c = 1, 2 do
      for i, p in ipairs(twin[c]:parameters()) do p:copy_(mods[c]:parameters()[i]) end
    end
  end)
  local pool = dirty_pool()
  local ok, err = pcall(gc.make_graphed_callables, mods, samples(2),
                        {pool = pool, num_warmup_iters = 1, order = {1, 2, -2, -2.5, -1},
                         num_layers_per_chunk = {1, 1}})
  lu.assertFalse(ok)
  lu.assertStrContains(err, "wgrad")
  for _, ms in ipairs({mods, twin}) do
    for c = 1, 2 do
      local y = ms[c](gc.full({4, 8}, 0.5 * c))
      y:sum():backward()
      ms[c]:backward_dw()
    end
  end
  local pa, pb = params_and(mods), params_and(twin)
  for i = 1, #pa do
    lu.assertNotNil(pa[i].grad)
    assert_same(pa[i].grad:tolist(), pb[i].grad:tolist(), "grad " .. i .. " after the failed call")
  end
end

-- A callable with delayed wgrads still queued from an eager backward is
-- refused (graphed, its backward_dw would replay graphs and never compute
-- them), naming the callable and what to call; the queue is kept, and after
-- backward_dw the call goes through.
function TestGraphedErrors:test_pending_delayed_wgrad_refused ()
  gc.manual_seed(5)
  local m = gc.nn.Sequential(gc.nn.Linear(8, 8, {delay_wgrad = true}), gc.nn.GELU())
  m(gc.full({4, 8}, 0.5)):sum():backward()
  m(gc.full({4, 8}, 0.25)):sum():backward()
  local ok, err = pcall(gc.make_graphed_callables, m, {gc.randn({4, 8}, {requires_grad = true})})
  lu.assertFalse(ok)
  lu.assertStrContains(err, "make_graphed_callables: callable 1 (Sequential) has 2 delayed weight "
                       .. "grads queued by an earlier backward: call its backward_dw() first")
  local w = m:parameters()[1]
  lu.assertNil(w.grad)
  m:backward_dw()
  lu.assertNotNil(w.grad, "the queue was kept")
  local G = gc.make_graphed_callables(m, {gc.randn({4, 8}, {requires_grad = true})})
  lu.assertNotNil(G)
end

-- Fails before any work (a bad order).
function TestGraphedErrors:test_rollback_after_order_error ()
  local mods = dropout_models(2)
  local xs = samples(2)
  eager_grads(mods, xs)
  check_rollback(params_and(mods, {xs[1][1], xs[2][1]}), function (pool)
    return gc.make_graphed_callables(mods, xs, {pool = pool, order = {1, 1, -1, -2}})
  end, "position 4")
end

-- A hook returning a value, in the second warmup iteration.
function TestGraphedErrors:test_rollback_after_hook_return ()
  local mods = dropout_models(2)
  local xs = samples(2)
  eager_grads(mods, xs)
  local calls = 0
  local hooks = {false, {forward_hooks = {function ()
    calls = calls + 1
    if calls == 2 then return true end
  end}}}
  check_rollback(params_and(mods, {xs[1][1], xs[2][1]}), function (pool)
    return gc.make_graphed_callables(mods, xs, {pool = pool, num_warmup_iters = 2,
                                                capture_time_hooks = hooks})
  end, "capture_time_hooks forward_hooks must not return a value")
end

-- "pools (all but their peak) as before" (docs/semantics.md, "Rollback on
-- failure"): also what a fresh pool holds reserved after a call that failed at
-- capture.
function TestGraphedErrors:test_failed_call_pool_reserved_as_before ()
  local mods = dropout_models(2)
  local pool = gc.graph_pool_handle()
  local before = pool:stats()
  local calls = 0
  local hooks = {{backward_hooks = {function ()
    calls = calls + 1
    if calls == 2 then error("raised at capture") end
  end}}, false}
  lu.assertFalse(pcall(gc.make_graphed_callables, mods, samples(2),
                       {pool = pool, num_warmup_iters = 1, capture_time_hooks = hooks}))
  local after = pool:stats()
  print(string.format("# pool before: reserved %d, in use %d, blocks %d; after the failed call: "
                      .. "reserved %d, in use %d, blocks %d, peak %d",
                      before.reserved_bytes, before.in_use_bytes, before.blocks,
                      after.reserved_bytes, after.in_use_bytes, after.blocks, after.peak_bytes))
  lu.assertEquals(after.graphs, before.graphs)
  lu.assertEquals(after.in_use_bytes, before.in_use_bytes)
  lu.assertEquals(after.blocks, before.blocks)
  lu.assertEquals(after.reserved_bytes, before.reserved_bytes)
end

-- After any of these failures the modules still graph fine.
function TestGraphedErrors:test_graphs_after_failures ()
  local mods = linears(2)
  expect_error(mods, samples(2), {order = {1, 0, -1}}, "position 2")
  expect_error(mods, samples(2), {capture_time_hooks = {false}}, "capture_time_hooks")
  local G = gc.make_graphed_callables(mods, samples(2), {num_warmup_iters = 1})
  lu.assertIs(G[1], mods[1])
  local y = G[2](G[1](gc.full({4, 8}, 0.5)))
  y:sum():backward()
  lu.assertNotNil(mods[1]:parameters()[1].grad)
end

-- regression: the replay read a [3, 2] or [6] tensor as the captured [2, 3]
-- A graphed callable called with a tensor of another shape (same element
-- count) is refused, naming the argument and both shapes.
function TestGraphedErrors:test_graphed_call_new_shape ()
  local lin = gc.nn.Linear(3, 4)
  local g = gc.make_graphed_callables(lin, {gc.randn({2, 3})}, {num_warmup_iters = 1})
  local msg = H.assert_err(function () return g(gc.randn({3, 2})) end,
                           "argument #1", "[3, 2]", "[2, 3]", "Linear")
  lu.assertStrContains(msg, "test_graphed_errors.lua:")
  H.assert_err(function () return g(gc.randn({6})) end, "[6]", "[2, 3]")
  lu.assertEquals(g(gc.randn({2, 3})):shape(), {2, 4})
end

-- regression: a failed graphing left a segment reserved in the caller's pool
-- A failed make_graphed_callables of a Lua callable leaves the caller's
-- pool as before once the collector has the tensors the callable made.
function TestGraphedErrors:test_failed_graphing_leaves_pool_as_before ()
  local pool = gc.graph_pool_handle()
  local before = pool:stats()
  local n = 0
  local function late (v)
    n = n + 1
    local y = v * 2
    if n == 2 then error("late failure") end
    return y
  end
  local ok, err = pcall(gc.make_graphed_callables, late, {gc.randn({2, 4})},
                        {num_warmup_iters = 1, pool = pool})
  lu.assertFalse(ok)
  lu.assertStrContains(tostring(err), "late failure")
  collectgarbage()
  collectgarbage()
  local after = pool:stats()
  lu.assertEquals(after.reserved_bytes, before.reserved_bytes)
  lu.assertEquals(after.in_use_bytes, before.in_use_bytes)
  lu.assertEquals(after.blocks, before.blocks)
  lu.assertEquals(after.graphs, 0)
end

-- regression: a table argument to an entry without sample_kwargs was dropped or misread
-- A table given last to a graphed entry that was graphed without
-- sample_kwargs is an argument of the wrong type, not a kwargs map: an
-- extra {} was dropped without a word, and {x} in place of x was "expected
-- 1 tensor arguments, got 0".
function TestGraphedErrors:test_graphed_entry_table_argument_without_kwargs ()
  local f = gc.make_graphed_callables(function (x) return x * 2, {x * 3} end,
                                      {gc.randn({2, 3}, {requires_grad = true})},
                                      {num_warmup_iters = 1})
  local x = gc.ones({2, 3})
  H.assert_err(function () local y = f(x, {}); return y end,
               "graphed call of entry 1: argument #2 must be a tensor, got table", "test_graphed_errors.lua:")
  H.assert_err(function () local y = f({x}); return y end,
               "graphed call of entry 1: argument #1 must be a tensor, got table")
  local _, b = f(x)
  lu.assertEquals(b[1]:tolist(), {{3, 3, 3}, {3, 3, 3}})
end

-- regression: a module reached through a closure lost its grads after warmup
-- A graphed function that reaches a module through a closure: the graphed
-- backward gives grads to arguments and parameters only, so the closed-over
-- weight would get grads in warmup and never again (lost after zero_grad).
-- Refused, naming it; passing the module itself works.
function TestGraphedErrors:test_closure_parameters_refused ()
  local lin = gc.nn.Linear(4, 4)
  local msg = H.assert_err(function ()
    gc.make_graphed_callables(function (a) return lin(a) end,
                              {gc.randn({2, 4}, {requires_grad = true})})
  end, "warmup forward of entry 1 (callable 1, function)", "neither an argument nor a parameter")
  lu.assertStrContains(msg, debug.getinfo(1, "S").short_src .. ":")
  lu.assertNil(lin.weight.grad)
  -- work on the closed-over module under no_grad has no grad to lose
  local G = gc.make_graphed_callables(function (a) return gc.no_grad(function () return lin(a) end) * a end,
                                      {gc.randn({2, 4}, {requires_grad = true})})
  lu.assertEquals(G(gc.ones({2, 4})):shape(), {2, 4})
  local g = gc.make_graphed_callables(lin, {gc.randn({2, 4}, {requires_grad = true})})
  g(gc.randn({2, 4})):sum():backward()
  lu.assertNotNil(lin.weight.grad)
end

-- regression: (API fuzzer) no tensor at all sorted a NULL list with qsort (UB, seen by asan)
-- Graphing callables that have no parameter with no sample tensor must fail
-- cleanly (ReLU needs its input) and the same with a tensor then work.
function TestGraphedErrors:test_graphing_with_no_tensor_at_all ()
  H.assert_err(function () gc.make_graphed_callables({gc.nn.ReLU()}, {{}}) end,
               "expected 1 input, got 0")
  local G = gc.make_graphed_callables({gc.nn.ReLU()}, {{gc.randn({2, 2})}})
  lu.assertEquals(G[1](gc.tensor({{-1, 2}, {3, -4}})):tolist(), {{0, 2}, {3, 0}})
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
