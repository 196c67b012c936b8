-- test_capture_time_hooks.lua: capture_time_hooks of make_graphed_callables
-- (docs/semantics.md, "capture_time_hooks"; the cases of TransformerEngine's
-- own test of them, and more). For order = nil and order = {1, 2, -2, -1}, and
-- for three callables, two chunks x three microbatches, chunks of several
-- layers, delayed wgrad and eval mode: the exact sequence of (callable, group)
-- events, the original module passed (same Lua value), is_capturing() false
-- inside every hook, (num_warmup_iters + 1) calls per group and pass, none on
-- replay. Map-form groups run in sorted id order; pre/post warmup hooks run
-- once; a hook that raises aborts cleanly and the modules still train eagerly;
-- a hook returning anything but nothing/nil is rejected.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_capture_time_hooks.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local linears, samples, walk = H.linears, H.samples, H.walk
local all_params, assert_same = H.all_params, H.assert_same

local W = 2  -- num_warmup_iters, as in the TE test
local GROUPS = {"forward_pre_hooks", "forward_hooks", "backward_pre_hooks", "backward_hooks"}

-- The entries of list, reps times over.
local function repeated (list, reps)
  local all = {}
  for _ = 1, reps do
    for _, v in ipairs(list) do all[#all + 1] = v end
  end
  return all
end

-- The events of one pass of the TE seed test (two modules, both orders).
local SEED_EVENTS = {"1 forward_pre_hooks", "1 forward_hooks", "2 forward_pre_hooks",
                     "2 forward_hooks", "2 backward_pre_hooks", "2 backward_hooks",
                     "1 backward_pre_hooks", "1 backward_hooks"}

-- The hook events of one walk, repeated reps times.
local function expected_events (spec, reps)
  local one = {}
  walk(spec,
       function (_, c)
         one[#one + 1] = c .. " forward_pre_hooks"
         one[#one + 1] = c .. " forward_hooks"
       end,
       function (_, c)
         one[#one + 1] = c .. " backward_pre_hooks"
         one[#one + 1] = c .. " backward_hooks"
       end)
  return repeated(one, reps)
end

-- capture_time_hooks for callables: every group of every callable logs
-- "c group" and records what it got; rec.log, rec.calls.
local function recorder (callables)
  local rec = {log = {}, calls = {}, hooks = {}}
  for c, m in ipairs(callables) do
    local entry = {}
    for _, g in ipairs(GROUPS) do
      entry[g] = {function (mod)
        rec.log[#rec.log + 1] = c .. " " .. g
        rec.calls[#rec.calls + 1] = {event = c .. " " .. g, got = mod, want = m,
                                     capturing = gc.is_capturing()}
      end}
    end
    rec.hooks[c] = entry
  end
  return rec
end

-- Every recorded call got the original callable and ran outside capture.
local function check_calls (rec)
  lu.assertTrue(#rec.calls > 0)
  for i, call in ipairs(rec.calls) do
    lu.assertIs(call.got, call.want, "call " .. i .. " (" .. call.event .. ") got another value")
    lu.assertFalse(call.capturing, "call " .. i .. " (" .. call.event .. ") ran while capturing")
  end
end

-- Counts of each event in a log.
local function counts (log)
  local n = {}
  for _, ev in ipairs(log) do n[ev] = (n[ev] or 0) + 1 end
  return n
end

-- Replay the graphed entries `rounds` times along the schedule (every
-- forward, then its backward by y:sum():backward(), delayed wgrads by
-- backward_dw()).
local function replay (entries, spec, rounds)
  for _ = 1, rounds do
    local outs = {}
    walk(spec,
         function (i) outs[i] = entries[i](gc.full({4, 8}, 0.25 * i)) end,
         function (i) outs[i]:sum():backward() end,
         function (i) entries[i]:backward_dw() end)
  end
end

-- Graph `mods` with recording hooks along spec, check the events, replay a
-- few times, check nothing more ran; returns the graphed entries and rec.
local function graph_and_check (mods, spec, nentries, extra)
  local rec = recorder(mods)
  local opts = {num_warmup_iters = W, capture_time_hooks = rec.hooks, order = spec.order,
                num_layers_per_chunk = spec.nlpc}
  for k, v in pairs(extra or {}) do opts[k] = v end
  local G = gc.make_graphed_callables(mods, samples(nentries), opts)
  lu.assertEquals(type(G), "table")
  lu.assertEquals(#G, nentries)
  lu.assertEquals(rec.log, expected_events(spec, W + 1))
  check_calls(rec)
  local before = #rec.log
  replay(G, spec, 3)
  lu.assertEquals(#rec.log, before, "hooks ran on replay")
  return G, rec
end

TestHooks = {tearDown = H.no_capture_left}

-- The TE seed test: two Linear(8, 8), order = nil.
function TestHooks:test_two_modules_no_order ()
  local mods = linears(2)
  local rec = recorder(mods)
  local G = gc.make_graphed_callables(mods, samples(2),
                                      {num_warmup_iters = W, capture_time_hooks = rec.hooks})
  lu.assertEquals(rec.log, repeated(SEED_EVENTS, W + 1))
  check_calls(rec)
  for ev, n in pairs(counts(rec.log)) do lu.assertEquals(n, W + 1, ev) end
  -- without an order the entries are the modules themselves
  lu.assertIs(G[1], mods[1])
  lu.assertIs(G[2], mods[2])
  local before = #rec.log
  for _ = 1, 3 do  -- replay: forwards, then backwards, chained
    local y = G[2](G[1](gc.full({4, 8}, 0.5)))
    y:sum():backward()
  end
  lu.assertEquals(#rec.log, before, "hooks ran on replay")
end

-- The TE seed test with order = {1, 2, -2, -1}: the same events.
function TestHooks:test_two_modules_order ()
  local mods = linears(2)
  local rec = recorder(mods)
  local G = gc.make_graphed_callables(mods, samples(2),
                                      {num_warmup_iters = W, capture_time_hooks = rec.hooks,
                                       order = {1, 2, -2, -1}})
  lu.assertEquals(rec.log, repeated(SEED_EVENTS, W + 1))
  check_calls(rec)
  -- with an order, entries are new callable objects
  lu.assertEquals(#G, 2)
  lu.assertNotIs(G[1], mods[1])
  lu.assertNotIs(G[2], mods[2])
  local before = #rec.log
  replay(G, {n = 2, order = {1, 2, -2, -1}, layers = {1, 1}}, 3)
  lu.assertEquals(#rec.log, before, "hooks ran on replay")
end

function TestHooks:test_three_modules_no_order ()
  local mods = linears(3)
  local spec = {n = 3}
  local _, rec = graph_and_check(mods, spec, 3)
  lu.assertEquals(rec.log[1], "1 forward_pre_hooks")
  lu.assertEquals(rec.log[7], "3 backward_pre_hooks")
  lu.assertEquals(rec.log[12], "1 backward_hooks")
  lu.assertEquals(#rec.log, 12 * (W + 1))
  for ev, n in pairs(counts(rec.log)) do lu.assertEquals(n, W + 1, ev) end
end

function TestHooks:test_three_modules_order ()
  local mods = linears(3)
  local spec = {n = 3, order = {1, 2, 3, -3, -2, -1}, layers = {1, 1, 1}}
  local _, rec = graph_and_check(mods, spec, 3)
  lu.assertEquals(#rec.log, 12 * (W + 1))
  for ev, n in pairs(counts(rec.log)) do lu.assertEquals(n, W + 1, ev) end
end

-- TE's worked example: two 1-layer chunks, three microbatches. Hooks fire
-- once per entry, in order sequence, keyed by the entry's callable.
function TestHooks:test_two_chunks_three_microbatches ()
  local order = {1, 2, 1, 2, -2, -1, 1, 2, -2, -1, -2, -1}
  local mods = linears(2)
  local spec = {n = 2, order = order, layers = {1, 1}, nlpc = {1, 1}}
  local _, rec = graph_and_check(mods, spec, 6)
  -- the first iteration spelled out
  local first = {}
  for _, v in ipairs(order) do
    local c = math.abs(v)
    if v > 0 then
      first[#first + 1] = c .. " forward_pre_hooks"
      first[#first + 1] = c .. " forward_hooks"
    else
      first[#first + 1] = c .. " backward_pre_hooks"
      first[#first + 1] = c .. " backward_hooks"
    end
  end
  lu.assertEquals({table.unpack(rec.log, 1, #first)}, first)
  lu.assertEquals(#rec.log, #first * (W + 1))
  -- per callable and group: three microbatches x (W + 1)
  for ev, n in pairs(counts(rec.log)) do lu.assertEquals(n, 3 * (W + 1), ev) end
end

-- Chunks of several layers: chunk 1 = callables 1, 2; chunk 2 = callable 3.
-- Forward of a chunk runs its layers in order, backward in reverse.
function TestHooks:test_chunk_of_two_layers ()
  local mods = linears(3)
  local spec = {n = 3, order = {1, 2, -2, -1}, layers = {2, 1}, nlpc = {2, 1}}
  local _, rec = graph_and_check(mods, spec, 3)
  lu.assertEquals({table.unpack(rec.log, 1, 12)},
                  {"1 forward_pre_hooks", "1 forward_hooks", "2 forward_pre_hooks", "2 forward_hooks",
                   "3 forward_pre_hooks", "3 forward_hooks", "3 backward_pre_hooks", "3 backward_hooks",
                   "2 backward_pre_hooks", "2 backward_hooks", "1 backward_pre_hooks", "1 backward_hooks"})
end

-- Delayed wgrad: no hooks around the wgrad passes; backward_dw() on replay
-- runs none either.
function TestHooks:test_delayed_wgrad_order ()
  local mods = linears(2, {delay_wgrad = true})
  local spec = {n = 2, order = {1, 2, -2, -2.5, -1, -1.5}, layers = {1, 1}, nlpc = {1, 1}}
  local G, rec = graph_and_check(mods, spec, 2)
  lu.assertEquals(#rec.log, 8 * (W + 1))
  for i = 1, 2 do lu.assertNotNil(G[i]:stats().bwd_dw, "entry " .. i .. " has no wgrad graph") end
end

-- Eval mode: forwards only; backward hooks never run, also not on replay.
function TestHooks:test_eval_no_order ()
  local mods = linears(2)
  for _, m in ipairs(mods) do m:eval() end
  local spec = {n = 2, training = false}
  local G, rec = graph_and_check(mods, spec, 2)
  local one = {"1 forward_pre_hooks", "1 forward_hooks", "2 forward_pre_hooks", "2 forward_hooks"}
  local want = {}
  for _ = 1, W + 1 do
    for _, ev in ipairs(one) do want[#want + 1] = ev end
  end
  lu.assertEquals(rec.log, want)
  for _, ev in ipairs(rec.log) do lu.assertNil(ev:find("backward", 1, true), ev) end
  for i = 1, 2 do lu.assertNil(G[i]:stats().bwd) end
end

-- Eval mode with an order: negative entries are skipped.
function TestHooks:test_eval_with_order ()
  local mods = linears(2)
  for _, m in ipairs(mods) do m:eval() end
  local spec = {n = 2, order = {1, 2, -2, -1}, layers = {1, 1}, training = false}
  local _, rec = graph_and_check(mods, spec, 2)
  lu.assertEquals(#rec.log, 4 * (W + 1))
  for _, ev in ipairs(rec.log) do lu.assertNil(ev:find("backward", 1, true), ev) end
end

-- The default num_warmup_iters is 3: four calls per group.
function TestHooks:test_default_warmup_iters ()
  local mods = linears(2)
  local rec = recorder(mods)
  gc.make_graphed_callables(mods, samples(2), {capture_time_hooks = rec.hooks})
  for ev, n in pairs(counts(rec.log)) do lu.assertEquals(n, 4, ev) end
  lu.assertEquals(#rec.log, 8 * 4)
end

-- num_warmup_iters = 0: the hooks run once, at capture.
function TestHooks:test_zero_warmup_iters ()
  local mods = linears(2)
  local rec = recorder(mods)
  local G = gc.make_graphed_callables(mods, samples(2),
                                      {num_warmup_iters = 0, capture_time_hooks = rec.hooks})
  lu.assertEquals(rec.log, expected_events({n = 2}, 1))
  check_calls(rec)
  replay(G, {n = 2}, 2)
  lu.assertEquals(#rec.log, 8)
end

-- A group given as a map runs in sorted id order; sequences in index order.
function TestHooks:test_map_groups_sorted_ids ()
  local mods = linears(1)
  local log = {}
  local function h (id)
    return function (m)
      lu.assertIs(m, mods[1])
      log[#log + 1] = id
    end
  end
  local hooks = {{
    forward_pre_hooks = {zeta = h("zeta"), alpha = h("alpha"), mid = h("mid")},
    forward_hooks = {h("f1"), h("f2"), h("f3")},
    backward_pre_hooks = {["b-2"] = h("b-2"), ["b-10"] = h("b-10"), B = h("B")},
    backward_hooks = {only = h("only")},
  }}
  local G = gc.make_graphed_callables(mods[1], {gc.ones({4, 8}, {requires_grad = true})},
                                      {num_warmup_iters = W, capture_time_hooks = hooks})
  lu.assertIs(G, mods[1])
  -- "B" < "b-10" < "b-2" in string order
  local one = {"alpha", "mid", "zeta", "f1", "f2", "f3", "B", "b-10", "b-2", "only"}
  local want = {}
  for _ = 1, W + 1 do
    for _, id in ipairs(one) do want[#want + 1] = id end
  end
  lu.assertEquals(log, want)
  local y = G(gc.full({4, 8}, 0.5))
  y:sum():backward()
  lu.assertEquals(#log, #want)
end

-- Entries may be false, hold any subset of groups, or empty groups.
function TestHooks:test_false_entries_and_subsets ()
  local mods = linears(3)
  local log = {}
  local hooks = {
    false,
    {forward_hooks = {function (m) lu.assertIs(m, mods[2]); log[#log + 1] = "2 fwd" end},
     backward_pre_hooks = {}},
    {backward_hooks = {function (m) lu.assertIs(m, mods[3]); log[#log + 1] = "3 bwd" end}},
  }
  local G = gc.make_graphed_callables(mods, samples(3),
                                      {num_warmup_iters = W, capture_time_hooks = hooks})
  local want = {}
  for _ = 1, W + 1 do
    want[#want + 1] = "2 fwd"
    want[#want + 1] = "3 bwd"
  end
  lu.assertEquals(log, want)
  replay(G, {n = 3}, 2)
  lu.assertEquals(#log, #want)
end

-- A single callable takes a sequence of one entry.
function TestHooks:test_single_callable ()
  local m = linears(1)[1]
  local rec = recorder({m})
  local G = gc.make_graphed_callables(m, {gc.ones({4, 8}, {requires_grad = true})},
                                      {num_warmup_iters = W, capture_time_hooks = rec.hooks})
  lu.assertIs(G, m)
  lu.assertEquals(rec.log, expected_events({n = 1}, W + 1))
  check_calls(rec)
  for _ = 1, 3 do G(gc.full({4, 8}, 0.5)):sum():backward() end
  lu.assertEquals(#rec.log, 4 * (W + 1))
end

-- A Lua function callable: its hooks get the function itself.
function TestHooks:test_function_callable ()
  local f = function (x) return gc.F.gelu(x) * 2 end
  local rec = recorder({f})
  local G = gc.make_graphed_callables(f, {gc.ones({4, 8}, {requires_grad = true})},
                                      {num_warmup_iters = W, capture_time_hooks = rec.hooks})
  lu.assertNotIs(G, f)
  lu.assertEquals(rec.log, expected_events({n = 1}, W + 1))
  check_calls(rec)
  local x = gc.full({4, 8}, 0.5, {requires_grad = true})
  G(x):sum():backward()
  lu.assertEquals(#rec.log, 4 * (W + 1))
end

-- pre_warmup_hook and post_warmup_hook: once each, around the whole warmup
-- (before the first and after the last warmup capture-time hook, before the
-- capture's hooks), outside capture.
function TestHooks:test_pre_post_warmup_hooks_once ()
  local mods = linears(2)
  local rec = recorder(mods)
  local pre, post = 0, 0
  local G = gc.make_graphed_callables(mods, samples(2), {
    num_warmup_iters = W, capture_time_hooks = rec.hooks,
    pre_warmup_hook = function ()
      pre = pre + 1
      lu.assertFalse(gc.is_capturing())
      rec.log[#rec.log + 1] = "pre"
    end,
    post_warmup_hook = function ()
      post = post + 1
      lu.assertFalse(gc.is_capturing())
      rec.log[#rec.log + 1] = "post"
    end,
  })
  lu.assertEquals(pre, 1)
  lu.assertEquals(post, 1)
  local want = {"pre"}
  local warm = expected_events({n = 2}, W)
  for _, ev in ipairs(warm) do want[#want + 1] = ev end
  want[#want + 1] = "post"
  for _, ev in ipairs(expected_events({n = 2}, 1)) do want[#want + 1] = ev end
  lu.assertEquals(rec.log, want)
  replay(G, {n = 2}, 2)
  lu.assertEquals(pre, 1)
  lu.assertEquals(post, 1)
end

-- With an order, too.
function TestHooks:test_pre_post_warmup_hooks_once_with_order ()
  local mods = linears(2)
  local pre, post = 0, 0
  gc.make_graphed_callables(mods, samples(6), {
    num_warmup_iters = W, order = {1, 2, 1, 2, -2, -1, 1, 2, -2, -1, -2, -1},
    num_layers_per_chunk = {1, 1},
    pre_warmup_hook = function () pre = pre + 1 end,
    post_warmup_hook = function () post = post + 1 end,
  })
  lu.assertEquals(pre, 1)
  lu.assertEquals(post, 1)
end

-- ---------------------------------------------------------------------------
-- A hook that raises: the call fails with the hook's message (its position,
-- no traceback pasted in); the modules are not graphed and still train eagerly, with
-- their .grad as before the call.

local function grads_of (ps)
  local g = {}
  for i, p in ipairs(ps) do g[i] = p.grad and p.grad:tolist() or false end
  return g
end

local function assert_same_grads (ga, gb, what)
  lu.assertEquals(#ga, #gb, what)
  for i = 1, #ga do
    lu.assertEquals(ga[i] == false, gb[i] == false, what .. ": grad " .. i .. " nil on one side only")
    if ga[i] then assert_same(ga[i], gb[i], what .. ": grad " .. i) end
  end
end

-- Two chained Linear(8, 8) (a) and an identical twin (b).
local function twin_pair ()
  local a = linears(2)
  gc.manual_seed(99)
  local b = {gc.nn.Linear(8, 8), gc.nn.Linear(8, 8)}
  for i = 1, 2 do H.copy_params(b[i], a[i]) end
  return a, b
end

local X = {}
for i = 1, 4 do
  X[i] = {}
  for j = 1, 8 do X[i][j] = math.sin(i * 8 + j) end
end

-- One eager forward and backward of the chain; returns the output values.
local function eager_pass (mods, scale)
  local y = mods[2](mods[1](gc.tensor(X) * scale))
  local out = y:tolist()
  local loss = (y * y):sum()
  loss:backward()
  return out
end

-- twin_pair() after one eager pass each, and mods' .grad values then.
local function trained_twins ()
  local mods, twin = twin_pair()
  eager_pass(mods, 1)
  eager_pass(twin, 1)
  return mods, twin, grads_of(all_params(mods))
end

-- mods failed to be graphed; twin never went through it. Their grads must
-- agree with the snapshot, then both train eagerly in lockstep.
local function check_trains_eagerly (mods, twin, grads_before)
  lu.assertFalse(gc.is_capturing())
  local pa, pb = all_params(mods), all_params(twin)
  assert_same_grads(grads_of(pa), grads_before, ".grad after the failed call")
  assert_same_grads(grads_of(pa), grads_of(pb), ".grad vs the twin")
  local oa, ob = gc.optim.SGD(pa, {lr = 0.1}), gc.optim.SGD(pb, {lr = 0.1})
  for step = 1, 2 do
    oa:step()
    ob:step()
    assert_same(eager_pass(mods, step), eager_pass(twin, step), "output of step " .. step)
    for i = 1, #pa do assert_same(pa[i]:tolist(), pb[i]:tolist(), "param " .. i) end
    assert_same_grads(grads_of(pa), grads_of(pb), "grads of step " .. step)
    oa:zero_grad()
    ob:zero_grad()
  end
end

local function assert_raised (err, msg)
  lu.assertEquals(type(err), "string")
  lu.assertStrContains(err, msg)
  lu.assertStrContains(err, "test_capture_time_hooks.lua:")  -- where the hook raised it
  lu.assertNotStrContains(err, "traceback")      -- the interpreter adds the one traceback
end

function TestHooks:test_raising_hook_in_warmup ()
  local mods, twin, before = trained_twins()
  local log = {}
  local hooks = {
    {forward_pre_hooks = {function () log[#log + 1] = "1 forward_pre_hooks" end},
     forward_hooks = {function () log[#log + 1] = "1 forward_hooks" end}},
    {forward_pre_hooks = {function ()
      log[#log + 1] = "2 forward_pre_hooks"
      error("hook exploded in warmup")
    end},
     backward_hooks = {function () log[#log + 1] = "2 backward_hooks" end}},
  }
  local ok, err = pcall(gc.make_graphed_callables, mods, samples(2),
                        {num_warmup_iters = W, capture_time_hooks = hooks})
  lu.assertFalse(ok)
  assert_raised(err, "hook exploded in warmup")
  lu.assertEquals(log, {"1 forward_pre_hooks", "1 forward_hooks", "2 forward_pre_hooks"})
  check_trains_eagerly(mods, twin, before)
end

-- The hook raises on its (W + 1)-th call: at capture, after every other
-- graph of the call was captured.
function TestHooks:test_raising_hook_at_capture ()
  local mods, twin, before = trained_twins()
  local rec = recorder(mods)
  local calls = 0
  rec.hooks[1].backward_hooks = {function ()
    calls = calls + 1
    rec.log[#rec.log + 1] = "1 backward_hooks"
    if calls == W + 1 then error("hook exploded at capture") end
  end}
  local pool = gc.graph_pool_handle()
  local ok, err = pcall(gc.make_graphed_callables, mods, samples(2),
                        {num_warmup_iters = W, capture_time_hooks = rec.hooks, pool = pool})
  lu.assertFalse(ok)
  assert_raised(err, "hook exploded at capture")
  lu.assertEquals(calls, W + 1)
  lu.assertEquals(rec.log, expected_events({n = 2}, W + 1))  -- it was the last hook
  lu.assertEquals(pool:stats().graphs, 0)
  check_trains_eagerly(mods, twin, before)
end

function TestHooks:test_raising_hook_with_order ()
  local mods, twin, before = trained_twins()
  local calls = 0
  local hooks = {false, {backward_pre_hooks = {function ()
    calls = calls + 1
    if calls == 2 then error("hook exploded in the second iteration") end
  end}}}
  local ok, err = pcall(gc.make_graphed_callables, mods, samples(2),
                        {num_warmup_iters = W, capture_time_hooks = hooks, order = {1, 2, -2, -1}})
  lu.assertFalse(ok)
  assert_raised(err, "hook exploded in the second iteration")
  check_trains_eagerly(mods, twin, before)
end

function TestHooks:test_raising_pre_warmup_hook ()
  local mods, twin, before = trained_twins()
  local rec = recorder(mods)
  local ok, err = pcall(gc.make_graphed_callables, mods, samples(2), {
    num_warmup_iters = W, capture_time_hooks = rec.hooks,
    pre_warmup_hook = function () error("pre_warmup_hook exploded") end,
  })
  lu.assertFalse(ok)
  assert_raised(err, "pre_warmup_hook exploded")
  lu.assertEquals(rec.log, {})
  check_trains_eagerly(mods, twin, before)
end

-- A graphcap error raised inside a callback (a capture-time hook at warmup
-- and at capture, progress, the warmup hooks) reaches the caller as raised,
-- its text once, with where it ran appended as for a Lua error. The engine's
-- message used to be appended instead (the error's own text again, in
-- parentheses), and a warmup hook's error came with no account at all.
local BAD = "add: shapes [2, 3] and [4, 5] do not broadcast"
local function bad_add () return gc.ones({2, 3}) + gc.ones({4, 5}) end

local function callback_error (opts, where, raised)
  opts.num_warmup_iters = W
  local ok, err = pcall(gc.make_graphed_callables, linears(1)[1],
                        {gc.ones({4, 8}, {requires_grad = true})}, opts)
  lu.assertFalse(ok)
  assert_raised(err, raised or BAD)
  local _, n = err:gsub((raised or BAD):gsub("%p", "%%%0"), "")
  lu.assertEquals(n, 1, "the error's text is repeated: " .. err)
  local tail = " (make_graphed_callables: " .. where .. ")"
  lu.assertEquals(err:sub(-#tail), tail)
end

function TestHooks:test_graphcap_error_in_a_hook_at_warmup ()
  callback_error({capture_time_hooks = {{forward_hooks = {function () bad_add() end}}}},
                 "capture_time_hooks forward_hooks #1 of callable 1 (Linear) failed in the warmup")
end

function TestHooks:test_graphcap_error_in_a_hook_at_capture ()
  local calls = 0
  callback_error({capture_time_hooks = {{backward_hooks = {function ()
    calls = calls + 1
    if calls == W + 1 then bad_add() end
  end}}}}, "capture_time_hooks backward_hooks #1 of callable 1 (Linear) failed in the capture")
end

function TestHooks:test_graphcap_error_in_progress ()
  callback_error({progress = function () bad_add() end},
                 "the progress callback stopped the warmup at 1 of " .. 2 * W)
end

function TestHooks:test_errors_in_warmup_hooks ()
  for _, name in ipairs({"pre_warmup_hook", "post_warmup_hook"}) do
    callback_error({[name] = function () bad_add() end}, name .. " failed")
    callback_error({[name] = function () error("exploded") end}, name .. " failed", "exploded")
  end
end

-- After a failed call the same modules can be graphed again.
function TestHooks:test_graph_again_after_failure ()
  local mods = linears(2)
  local hooks = {{forward_hooks = {function () error("first attempt fails") end}}, false}
  lu.assertFalse(pcall(gc.make_graphed_callables, mods, samples(2),
                       {num_warmup_iters = W, capture_time_hooks = hooks}))
  local rec = recorder(mods)
  local G = gc.make_graphed_callables(mods, samples(2),
                                      {num_warmup_iters = W, capture_time_hooks = rec.hooks})
  lu.assertEquals(rec.log, expected_events({n = 2}, W + 1))
  replay(G, {n = 2}, 2)
  lu.assertEquals(#rec.log, 8 * (W + 1))
end

-- ---------------------------------------------------------------------------
-- A hook must return nothing or nil.

-- Graph two modules with `hook` as callable 2's `group`; it must fail with
-- "capture_time_hooks <group> must not return a value" at the hook's first
-- call, leaving the modules usable.
local function check_rejected (group, hook)
  local mods, twin, before = trained_twins()
  local calls = 0
  local hooks = {false, {[group] = {function (m)
    calls = calls + 1
    return hook(m)
  end}}}
  local ok, err = pcall(gc.make_graphed_callables, mods, samples(2),
                        {num_warmup_iters = W, capture_time_hooks = hooks})
  lu.assertFalse(ok, "a hook returning a value was accepted")
  lu.assertEquals(type(err), "string")
  lu.assertStrContains(err, "capture_time_hooks " .. group .. " must not return a value")
  lu.assertEquals(calls, 1)
  check_trains_eagerly(mods, twin, before)
end

function TestHooks:test_return_false_rejected ()
  check_rejected("forward_pre_hooks", function () return false end)
end

function TestHooks:test_return_zero_rejected ()
  check_rejected("forward_hooks", function () return 0 end)
end

function TestHooks:test_return_empty_string_rejected ()
  check_rejected("backward_pre_hooks", function () return "" end)
end

function TestHooks:test_return_table_rejected ()
  check_rejected("backward_hooks", function () return {} end)
end

function TestHooks:test_return_nil_and_value_rejected ()
  check_rejected("forward_hooks", function () return nil, 1 end)
end

function TestHooks:test_return_module_rejected ()
  check_rejected("forward_pre_hooks", function (m) return m end)
end

-- Returning nothing or a single nil is fine.
function TestHooks:test_return_nil_accepted ()
  local mods = linears(2)
  local n = 0
  local hooks = {{forward_hooks = {function () n = n + 1; return nil end}},
                 {backward_hooks = {function () n = n + 1; return end}}}
  gc.make_graphed_callables(mods, samples(2), {num_warmup_iters = W, capture_time_hooks = hooks})
  lu.assertEquals(n, 2 * (W + 1))
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
