-- test_raise_everywhere.lua: make_graphed_callables with a callable or a
-- hook raising at every point it is called: each warmup iteration, each
-- capture, each capture-time hook kind (forward_pre, forward, backward_pre,
-- backward), pre/post_warmup_hook, each callable, each entry of an order
-- ({1, 2, -2, -1} and two chunks x two microbatches). After each failure the
-- error carries the raised message and names where it happened, no capture
-- is open, parameters, .grad, the generator, live objects and the pool are
-- as before, and the same call then succeeds.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_raise_everywhere.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

-- Every instrumented point counts down `left`; the one that reaches 0 raises.
local left, fired = 0, nil

local function point (label)
  if left > 0 then
    left = left - 1
    if left == 0 then
      fired = label
      error("boom at " .. label)
    end
  end
end

-- Two Lua callables (each a Linear; the first then a GELU), raising from
-- their forward, and hooks of every kind raising too.
local function setup (order)
  gc.manual_seed(9)
  local C = gc.nn.Module("Raiser")
  function C:init (i, n_in, n_out) self.i = i; self.lin = gc.nn.Linear(n_in, n_out) end
  function C:forward (x)
    point("forward of callable " .. self.i)
    local y = self.lin(x)
    if self.i == 1 then y = gc.F.gelu(y) end
    return y
  end
  local m = {C(1, 4, 8), C(2, 8, 4)}
  local hooks = {}
  for c = 1, 2 do
    hooks[c] = {}
    for _, kind in ipairs{"forward_pre_hooks", "forward_hooks", "backward_pre_hooks",
                          "backward_hooks"} do
      hooks[c][kind] = {function () point(kind .. " of callable " .. c) end}
    end
  end
  local sample = {}
  local ins = order and #order == 8 and {4, 4, 8, 8} or {4, 8}
  for i, n in ipairs(ins) do sample[i] = {gc.randn({2, n}, {requires_grad = true})} end
  local opts = {num_warmup_iters = 2, order = order, capture_time_hooks = hooks,
                pool = gc.graph_pool_handle(),
                pre_warmup_hook = function () point("pre_warmup_hook") end,
                post_warmup_hook = function () point("post_warmup_hook") end}
  return m, H.all_params(m), sample, opts
end

local raised_total = 0

-- Raise at point k = 1, 2, ... until make_graphed_callables runs through.
local function walk (name, order)
  local m, params, sample, opts = setup(order)
  local seen = {}
  for k = 1, 10000 do
    local was = H.state(params, opts.pool)
    gc.manual_seed(42)
    left, fired = k, nil
    local ok, err = pcall(gc.make_graphed_callables, m, sample, opts)
    left = 0
    if fired == nil then
      lu.assertTrue(ok, name .. ": failed with nothing raised: " .. tostring(err))
      raised_total = raised_total + k - 1
      return seen
    end
    local what = string.format("%s, raise %d (%s)", name, k, fired)
    lu.assertFalse(ok, what .. ": the error was swallowed")
    err = tostring(err)
    lu.assertStrContains(err, "boom at " .. fired, false, what)
    -- where: the phase (warmup/capture) or the hook, and the entry or callable.
    if not fired:find("warmup_hook") then
      lu.assertNotNil(err:find("warmup") or err:find("captur"), what .. ": no phase in: " .. err)
      lu.assertNotNil(err:find("entry") or err:find("callable"), what .. ": no entry in: " .. err)
    else
      lu.assertStrContains(err, fired:match("^(%w+_warmup_hook)"), false, what)
    end
    lu.assertFalse(gc.is_capturing(), what .. ": a capture was left open")
    H.assert_state(was, params, opts.pool, what)
    H.assert_rng_untouched(what)
    seen[fired] = (seen[fired] or 0) + 1
    local ok2, G = pcall(gc.make_graphed_callables, m, sample, opts)
    lu.assertTrue(ok2, what .. ": the same call then failed: " .. tostring(G))
    G = nil -- luacheck: ignore 311 (for the collector)
  end
  lu.fail(name .. ": the walk did not end")
end

-- Every kind of point was hit at least once (what each walk must cover).
local function covers (seen, want)
  for _, label in ipairs(want) do
    lu.assertTrue(seen[label] ~= nil and seen[label] > 0, "never raised at " .. label)
  end
end

local every = {"pre_warmup_hook", "post_warmup_hook"}
for c = 1, 2 do
  for _, kind in ipairs{"forward of callable", "forward_pre_hooks of callable",
                        "forward_hooks of callable", "backward_pre_hooks of callable",
                        "backward_hooks of callable"} do
    every[#every + 1] = kind .. " " .. c
  end
end

TestRaiseEverywhere = {tearDown = H.no_capture_left}

function TestRaiseEverywhere:test_no_order ()
  covers(walk("no order"), every)
end

function TestRaiseEverywhere:test_order_1_2_m2_m1 ()
  covers(walk("order {1, 2, -2, -1}", {1, 2, -2, -1}), every)
end

function TestRaiseEverywhere:test_two_chunks_two_microbatches ()
  covers(walk("order of 2 chunks x 2 microbatches", {1, 1, 2, -2, 2, -2, -1, -1}), every)
end

function TestRaiseEverywhere:test_zz_report ()
  print(string.format("# %d raises, each followed by the state check and a retry", raised_total))
  lu.assertTrue(raised_total > 0)
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
