-- test_fuzz_diff.lua: differential fuzzer. Random small models (each
-- callable a Sequential of Linear/ReLU/GELU/LayerNorm/Dropout), random
-- options (num_warmup_iters, an order from a generator of valid pipeline
-- schedules, buffer reuse, delayed wgrad, eval mode, SGD or Adam): training
-- through make_graphed_callables must give the outputs, input grads,
-- parameter grads and parameters of eager training bit for bit. Seeded and
-- bounded (tests/lua/fuzz.lua): default 60 cases.
--   GRAPHCAP_FUZZ_SEED=7 GRAPHCAP_FUZZ_ITERS=500 LUA_PATH='tests/lua/?.lua;;'
--     build/graphcap tests/lua/test_fuzz_diff.lua

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local F = require "fuzz"

local ROWS, STEPS = 3, 2

-- A random valid order for K chunks of one layer and M microbatches: a
-- chunk's forwards follow the previous chunk's, its backwards the next
-- chunk's; with dw, a wgrad pass -(k + 0.5) right after each backward -k.
local function random_order (r, K, M, dw)
  local f, b, order = {}, {}, {}
  for k = 1, K do f[k], b[k] = 0, 0 end
  while #order < 2 * K * M * (dw and 1.5 or 1) do
    local moves = {}
    for k = 1, K do
      if f[k] < M and (k == 1 or f[k - 1] > f[k]) then moves[#moves + 1] = k end
      if b[k] < f[k] and (k == K or b[k + 1] > b[k]) then moves[#moves + 1] = -k end
    end
    local m = F.pick(r, moves)
    order[#order + 1] = m
    if m > 0 then f[m] = f[m] + 1 else
      b[-m] = b[-m] + 1
      if dw then order[#order + 1] = m - 0.5 end
    end
  end
  return order
end

-- The spec of one case, drawn from r.
local function random_case (r)
  local c = {K = r(3), warmup = r(4) - 1, training = r(5) > 1, adam = r(2) == 1}
  if r(2) == 1 then c.M = r(2) end -- with an order of M microbatches
  c.delay = c.M ~= nil and c.training and r(3) == 1
  c.reuse = c.M ~= nil and c.training and r(3) == 1
  c.dims, c.outs, c.layers = {}, {}, {}
  for k = 1, c.K do
    c.dims[k] = k == 1 and r(5) + 1 or c.outs[k - 1]
    local list, d = F.random_layers(r, c.dims[k], 6, {0, 0.25, 0.5})
    if c.delay and list[1][1] ~= "Linear" then -- a delayed-wgrad pass needs a Linear
      table.insert(list, 1, {"Linear", c.dims[k], c.dims[k], true})
    end
    c.layers[k], c.outs[k] = list, d
  end
  if c.M then c.order = random_order(r, c.K, c.M, c.delay) end
  return c
end

local function describe (c)
  return string.format("K=%d %s warmup=%d %s %s order=%s reuse=%s delay=%s", c.K,
                       F.describe_layers(c.layers), c.warmup, c.training and "train" or "eval",
                       c.adam and "Adam" or "SGD", c.order and table.concat(c.order, ",") or "none",
                       tostring(c.reuse), tostring(c.delay))
end

-- The callables of c, from generator seed s.
local function build (c, s)
  gc.manual_seed(s)
  local mods = {}
  for k = 1, c.K do
    mods[k] = F.sequential(gc, c.layers[k], {delay_wgrad = c.delay})
    if not c.training then mods[k]:eval() end
  end
  return mods
end

-- Train along c's walk: fwd(i, k) gives entry i's callable, dw(i, k) runs
-- its wgrad. Returns every value the comparison needs.
local function train (c, fwd, dw, params, data)
  local opt = c.adam and gc.optim.Adam(params, {lr = 1e-2}) or gc.optim.SGD(params, {lr = 0.1})
  local spec = {n = c.K, order = c.order, layers = {}, training = c.training}
  for k = 1, c.K do spec.layers[k] = 1 end
  local res = {}
  gc.manual_seed(77) -- dropout draws from here on, the same in both runs
  for step = 1, STEPS do
    opt:zero_grad()
    local xs, losses = {}, {}
    H.walk(spec,
      function (i, k)
        xs[i] = gc.tensor(data[step][i].x, {requires_grad = c.training})
        local y = fwd(i, k)(xs[i])
        res[#res + 1] = y:tolist()
        if c.training then losses[i] = (y * gc.tensor(data[step][i].dy)):sum() end
      end,
      function (i, k)
        losses[i]:backward()
        if c.delay and not c.order then dw(i, k) end
      end,
      function (i, k) dw(i, k) end)
    if c.training then
      for i = 1, #xs do res[#res + 1] = xs[i].grad and xs[i].grad:tolist() or "no grad" end
      for _, p in ipairs(params) do res[#res + 1] = p.grad and p.grad:tolist() or "no grad" end
      opt:step()
    end
  end
  for _, p in ipairs(params) do res[#res + 1] = p:tolist() end
  return res
end

local cases, compared = 0, 0

local function run_case (r, n)
  local c = random_case(r)
  local what = string.format("seed %d, case %d: %s", F.seed, n, describe(c))
  -- the entries: one per callable, or per (chunk, microbatch) with an order
  local entries = {}
  if c.order then
    H.walk({n = c.K, order = c.order, layers = (function ()
      local l = {} for k = 1, c.K do l[k] = 1 end return l end)()},
      function (i, k) entries[i] = k end, function () end)
  else
    for k = 1, c.K do entries[k] = k end
  end
  local data = {}
  gc.manual_seed(1000 + n)
  for step = 1, STEPS do
    data[step] = {}
    for i, k in ipairs(entries) do
      data[step][i] = {x = gc.randn({ROWS, c.dims[k]}):tolist(),
                       dy = gc.randn({ROWS, c.outs[k]}):tolist()}
    end
  end
  local s = 2000 + n
  local a, b = build(c, s), build(c, s)
  local eager = train(c, function (_, k) return a[k] end,
                      function (_, k) a[k]:backward_dw() end, H.all_params(a), data)
  local samples = {}
  for i, k in ipairs(entries) do
    samples[i] = {gc.zeros({ROWS, c.dims[k]}, {requires_grad = c.training})}
  end
  local opts = {num_warmup_iters = c.warmup, order = c.order,
                reuse_graph_input_output_buffers = c.reuse or nil}
  if c.order then
    opts.num_layers_per_chunk = {}
    for k = 1, c.K do opts.num_layers_per_chunk[k] = 1 end
  end
  local ok, G = pcall(gc.make_graphed_callables, b, samples, opts)
  if not ok then lu.fail(what .. ": make_graphed_callables failed: " .. tostring(G)) end
  local graphed = train(c, function (i) return G[i] end, function (i) G[i]:backward_dw() end,
                        H.all_params(b), data)
  lu.assertEquals(#graphed, #eager, what .. ": number of values")
  for j = 1, #eager do
    local same, err = pcall(H.assert_same, graphed[j], eager[j], "value " .. j)
    if not same then lu.fail(what .. ": graphed differs from eager: " .. tostring(err)) end
  end
  cases, compared = cases + 1, compared + #eager
end

TestFuzzDiff = {tearDown = H.no_capture_left}

function TestFuzzDiff:test_graphed_equals_eager ()
  local r, budget = F.rng(2), F.budget(60)
  F.announce(budget .. " cases")
  for n = 1, budget do run_case(r, n) end
  print(string.format("# seed %d: %d cases, %d tensors compared bitwise", F.seed, cases, compared))
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
