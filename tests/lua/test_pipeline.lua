-- test_pipeline.lua: gc.pipeline, the pipeline schedules (docs/distributed.md,
-- "Pipeline parallel"). Orders equal schedules written out by hand (1F1B on 4
-- stages, interleaved 1F1B on 2 stages x 2 chunks x 4 microbatches, Megatron's
-- own example of 2 stages x 2 chunks with groups of 3 and 5 microbatches);
-- every order of a sweep of stages x chunks x microbatches x group sizes is
-- accepted by make_graphed_callables' order check, has M forwards and M
-- backwards per chunk, and together with the other stages' orders runs to
-- the end when each step waits for the activation or grad it receives; bad
-- options are errors naming the option.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_pipeline.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local assert_err = H.assert_err

local pipeline = gc.pipeline

TestPipeline = {}

-- 1F1B, 4 stages, 6 microbatches: stage r runs 3 - r forwards first.
function TestPipeline:test_1f1b_by_hand ()
  local want = {
    [0] = {1, 1, 1, 1, -1, 1, -1, 1, -1, -1, -1, -1},
    [1] = {1, 1, 1, -1, 1, -1, 1, -1, 1, -1, -1, -1},
    [2] = {1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, -1},
    [3] = {1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1},
  }
  for r = 0, 3 do
    lu.assertEquals(pipeline.order{stages = 4, stage = r, microbatches = 6}, want[r])
  end
  -- fewer microbatches than warmup forwards: all forwards, then all backwards
  lu.assertEquals(pipeline.order{stages = 4, stage = 0, microbatches = 2}, {1, 1, -1, -1})
  -- one stage: forward and backward in turn
  lu.assertEquals(pipeline.order{stages = 1, stage = 0, microbatches = 3}, {1, -1, 1, -1, 1, -1})
end

-- Interleaved, 2 stages x 2 chunks x 4 microbatches (groups of 2): stage 0
-- runs 2 * 1 + 1 * 2 = 4 warmup forwards, stage 1 runs 2; backwards visit
-- chunk 2 before chunk 1.
function TestPipeline:test_interleaved_by_hand ()
  lu.assertEquals(pipeline.schedule_table(4, 2, 2),
                  {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {3, 1}, {4, 1}, {3, 2}, {4, 2}})
  lu.assertEquals(pipeline.order{stages = 2, stage = 0, microbatches = 4, chunks = 2},
                  {1, 1, 2, 2, 1, -2, 1, -2, 2, -1, 2, -1, -2, -2, -1, -1})
  lu.assertEquals(pipeline.order{stages = 2, stage = 1, microbatches = 4, chunks = 2},
                  {1, 1, 2, -2, 2, -2, 1, -1, 1, -1, 2, -2, 2, -2, -1, -1})
  -- delayed wgrad: each backward followed by its chunk's wgrad
  lu.assertEquals(pipeline.order{stages = 2, stage = 1, microbatches = 2, chunks = 2,
                                 delay_wgrad = true},
                  {1, 1, 2, -2, -2.5, 2, -2, -2.5, -1, -1.5, -1, -1.5})
  -- chunks = 1 but interleaved: warmup 2 * (P - r - 1), not P - r - 1
  lu.assertEquals(pipeline.order{stages = 2, stage = 0, microbatches = 4, interleaved = true},
                  {1, 1, 1, -1, 1, -1, -1, -1})
end

-- Megatron's documented example (convert_schedule_table_to_order): 2 stages,
-- 2 chunks, groups of 3, 5 microbatches, stage 0 (5 warmup forwards).
function TestPipeline:test_megatron_example ()
  lu.assertEquals(pipeline.order{stages = 2, stage = 0, microbatches = 5, chunks = 2,
                                 group_size = 3},
                  {1, 1, 1, 2, 2, 2, -2, 1, -2, 1, -2, 2, -1, 2, -1, -1, -2, -2, -1, -1})
end

-- Each chunk's forwards and backwards as make_graphed_callables numbers them.
function TestPipeline:test_steps_and_entries ()
  local steps = pipeline.steps({1, 2, -2, -2.5, 1, -1, -1.5, 2, -2, -1})
  lu.assertEquals(steps[1], {kind = "forward", chunk = 1, microbatch = 1})
  lu.assertEquals(steps[3], {kind = "backward", chunk = 2, microbatch = 1})
  lu.assertEquals(steps[4], {kind = "wgrad", chunk = 2, microbatch = 1})
  lu.assertEquals(steps[5], {kind = "forward", chunk = 1, microbatch = 2})
  lu.assertEquals(steps[10], {kind = "backward", chunk = 1, microbatch = 2})
  lu.assertEquals(pipeline.entry(1, 1, 3), 1)
  lu.assertEquals(pipeline.entry(2, 3, 3), 6)
  -- chunks of 2 and 1 layers, 2 microbatches: chunk 1 holds entries 1..4
  lu.assertEquals(pipeline.entry(1, 2, 2, 1, {2, 1}), 3)
  lu.assertEquals(pipeline.entry(2, 2, 2, 1, {2, 1}), 6)
end

-- Stage r's order, with every stage's, runs to the end when a forward waits
-- for its input activation (from the virtual stage before) and a backward
-- for its output grad (from the virtual stage after); sends never wait.
-- A backward also waits for its own forward. Returns nil, or a message
-- naming where it stuck.
local function stalls (P, V, orders)
  local done, pos = {}, {}
  local function key (kind, r, c, b) return kind .. r .. ":" .. c .. ":" .. b end
  local steps = {}
  for r = 0, P - 1 do
    steps[r], pos[r] = pipeline.steps(orders[r]), 1
  end
  local progress = true
  while progress do
    progress = false
    for r = 0, P - 1 do
      local s = steps[r][pos[r]]
      if s then
        local c, b, ready = s.chunk, s.microbatch, true
        local v = (c - 1) * P + r  -- virtual stage, 0-based
        if s.kind == "forward" and v > 0 then
          local pr, pc = (v - 1) % P, (v - 1) // P + 1
          ready = done[key("F", pr, pc, b)]
        elseif s.kind == "backward" then
          ready = done[key("F", r, c, b)]  -- its own forward first
          if v < P * V - 1 then
            local nr, nc = (v + 1) % P, (v + 1) // P + 1
            ready = ready and done[key("B", nr, nc, b)]
          end
        end
        if ready then
          done[key(s.kind == "forward" and "F" or "B", r, c, b)] = true
          pos[r] = pos[r] + 1
          progress = true
        end
      end
    end
  end
  for r = 0, P - 1 do
    if pos[r] <= #steps[r] then return ("stage %d stuck at step %d"):format(r, pos[r]) end
  end
end

-- make_graphed_callables accepts the order (its checker names a bad position).
local function graphs (order, V, M)
  local chunks, sample = {}, {}
  for c = 1, V do
    chunks[c] = gc.nn.Linear(2, 2)
    for b = 1, M do sample[(c - 1) * M + b] = {gc.zeros({1, 2}, {requires_grad = true})} end
  end
  local ok, err = pcall(gc.make_graphed_callables, chunks, sample,
                        {order = order, num_warmup_iters = 0})
  return ok, err
end

function TestPipeline:test_sweep ()
  local checked, graphed = 0, 0
  for P = 1, 4 do
    for V = 1, 3 do
      for M = P, 8 do
        for G = P, M do
          local rest = M % G
          local fine = not (rest > 0 and rest < P)
          if fine and (V > 1 or G == P) then
            local orders = {}
            for r = 0, P - 1 do
              local o = pipeline.order{stages = P, stage = r, microbatches = M, chunks = V,
                                       group_size = V > 1 and G or nil}
              orders[r] = o
              local f, b = {}, {}
              for _, s in ipairs(pipeline.steps(o)) do
                local t = s.kind == "forward" and f or b
                t[s.chunk] = (t[s.chunk] or 0) + 1
                if s.kind == "backward" then
                  lu.assertTrue(s.microbatch <= f[s.chunk], "a backward before its forward")
                end
              end
              for c = 1, V do
                lu.assertEquals({f[c], b[c]}, {M, M}, ("P%d V%d M%d G%d"):format(P, V, M, G))
              end
              -- the engine's own check, on a few sizes (each graphs V * M entries)
              if M <= 4 and (r == 0 or r == P - 1) then
                local ok, err = graphs(o, V, M)
                lu.assertTrue(ok, err)
                graphed = graphed + 1
              end
            end
            lu.assertNil(stalls(P, V, orders), ("P%d V%d M%d G%d"):format(P, V, M, G))
            checked = checked + 1
          end
        end
      end
    end
  end
  print(("# %d schedules checked, %d orders graphed"):format(checked, graphed))
  lu.assertTrue(checked > 50)
end

-- The stall check finds schedules that cannot run (2 stages x 2 chunks, one
-- microbatch: virtual stages 0..3 are stage 0 chunk 1, stage 1 chunk 1,
-- stage 0 chunk 2, stage 1 chunk 2): stage 0 starting with chunk 2 waits on
-- stage 1, which waits on stage 0's chunk 1; stage 1 running chunk 2's
-- backward before its forward waits on itself.
function TestPipeline:test_stall_detected ()
  lu.assertNil(stalls(2, 2, {[0] = {1, 2, -2, -1}, [1] = {1, 2, -2, -1}}))
  lu.assertNotNil(stalls(2, 2, {[0] = {2, 1, -2, -1}, [1] = {1, 2, -2, -1}}))
  lu.assertNotNil(stalls(2, 2, {[0] = {1, 2, -2, -1}, [1] = {1, -2, 2, -1}}))
end

function TestPipeline:test_errors ()
  local function o (t) return function () return pipeline.order(t) end end
  assert_err(o{stages = 2, stage = 2, microbatches = 4}, "stage must be an integer in 0..1")
  assert_err(o{stages = 0, stage = 0, microbatches = 4}, "stages must be a positive integer")
  assert_err(o{stages = 2, stage = 0, microbatches = 4, chunks = 2, interleaved = false},
             "2 chunks need the interleaved schedule")
  assert_err(o{stages = 2, stage = 0, microbatches = 4, chunks = 2, group_size = 5},
             "must be in 2..4 (stages..microbatches), got 5")
  assert_err(o{stages = 4, stage = 0, microbatches = 6, chunks = 2, group_size = 4},
             "the last group of microbatches holds 2")
  assert_err(o{stages = 2, stage = 0, microbatches = 4, chunk = 2}, "unknown option 'chunk'")
  assert_err(function () return pipeline.steps({1, 0}) end, "order[2] must be a non-zero number")
  assert_err(function () return pipeline.entry(1, 4, 3) end, "microbatch 4 of 3")
  local function run (t) return function () return pipeline.run(t) end end
  local f = function () end
  assert_err(run{stages = 2, stage = 2, microbatches = 2, call = f, input = f, loss = f},
             "pipeline.run: stage must be an integer in 0..1")
  assert_err(run{stages = 2, stage = 0, microbatches = 2, call = f, input = f},
             "pipeline.run: call, input and loss must be functions")
  assert_err(run{stages = 1, stage = 0, microbatches = 2, call = f, input = f, loss = f,
                 delay_wgrad = true}, "pipeline.run: unknown option 'delay_wgrad'")
end

-- pipeline.run on one stage (every hand-off local): 2 chunks x 4
-- microbatches in the interleaved order, eagerly, equals the whole model run
-- microbatch after microbatch bit for bit (grads accumulate in the same
-- microbatch order); the chunks graphed with that order equal the eager
-- chunks bit for bit over 2 SGD steps.
local B, W, V, M = 2, 4, 2, 4

local function chunks ()
  gc.manual_seed(3)
  local cs = {}
  for c = 1, V do cs[c] = gc.nn.Sequential(gc.nn.Linear(W, W), gc.nn.GELU()) end
  return cs
end

local function step_values (cs)
  local v = {}
  for _, c in ipairs(cs) do
    for _, p in ipairs(c:parameters()) do v[#v + 1] = p:tolist() end
  end
  return v
end

local xs, ts = {}, {}
for b = 1, M do
  xs[b] = gc.tensor(H.nest(H.values(B * W, b), {B, W}))
  ts[b] = gc.tensor(H.nest(H.values(B * W, 10 + b, 0.5), {B, W}))
end
local function loss (b, y) return gc.F.mse_loss(y, ts[b]) end

local function pipeline_step (call, opt)
  opt:zero_grad()
  pipeline.run{stages = 1, stage = 0, microbatches = M, chunks = V, call = call,
               input = function (b) return xs[b] end, loss = loss, shape = {B, W}}
  opt:step()
end

local function params (cs)
  local ps = {}
  for _, c in ipairs(cs) do for _, p in ipairs(c:parameters()) do ps[#ps + 1] = p end end
  return ps
end

function TestPipeline:test_run_one_stage ()
  local order = pipeline.order{stages = 1, stage = 0, microbatches = M, chunks = V}
  local ref, eager, graphed = chunks(), chunks(), chunks()
  local sample = {}
  for e = 1, V * M do sample[e] = {gc.zeros({B, W}, {requires_grad = e > M})} end
  local entries = gc.make_graphed_callables(graphed, sample, {order = order})
  local opts = {{ref, "ref"}, {eager, "eager"}, {graphed, "graphed"}}
  for _, o in ipairs(opts) do o[3] = gc.optim.SGD(params(o[1]), {lr = 0.1}) end
  for _ = 1, 2 do
    opts[1][3]:zero_grad()
    for b = 1, M do loss(b, ref[2](ref[1](xs[b]))):backward() end
    opts[1][3]:step()
    pipeline_step(function (c, _, x) return eager[c](x) end, opts[2][3])
    pipeline_step(function (c, b, x) return entries[pipeline.entry(c, b, M)](x) end, opts[3][3])
  end
  H.assert_bitwise(step_values(eager), step_values(ref), "eager pipeline vs the whole model")
  H.assert_bitwise(step_values(graphed), step_values(eager), "graphed vs eager pipeline")
  lu.assertNotEquals(step_values(eager)[1], step_values(chunks())[1])  -- it trained
end

os.exit(lu.LuaUnit.run(), true)
