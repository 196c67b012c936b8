-- test_dist_training.lua: training across ranks (docs/distributed.md,
-- "Training across ranks"), on 1, 2 and 4 ranks: examples/ddp.lua, ddp_whole.lua,
-- examples/fsdp.lua, examples/pipeline_parallel.lua and build/embed_dist
-- (each checks graphed = eager bit for bit and N ranks = one process on the
-- global batch within its stated tolerance; fsdp also its bytes per rank)
-- and dist_training_checks.lua, each run with mpirun (world size 1: alone)
-- and passed when it exits 0 having printed what it checks. Skipped in a
-- build without MPI.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_dist_training.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"

if not gc.dist.is_available() then
  print("1..0 # SKIP the distributed layer was not built (no MPI)")
  os.exit(77)
end

local HERE = debug.getinfo(1, "S").source:match("^@?(.-)[^/\\]*$")
local ROOT = HERE .. "../../"
local H = require "helpers"
local PROG = H.program  -- the graphcap program
local BUILD = PROG:match("^(.-)[^/]*$")
local AS_ROOT = io.popen("id -u"):read("l") == "0"

-- NCCL needs a GPU per rank: on cuda, runs of more ranks than this machine has
-- GPUs are skipped (a job on one GPU runs at world size 1).
local GPUS = math.huge
if gc.device() == "cuda" then
  local p = io.popen("nvidia-smi -L 2>/dev/null")
  GPUS = select(2, p:read("a"):gsub("GPU %d+:", ""))
  p:close()
end

-- Run cmd (a list of words after mpirun's) on n ranks (n = 1: alone);
-- returns its output and whether it exited 0. Each run is limited to 120 s
-- (then killed), so that a hang fails; the output goes through a file, which
-- a rank left behind cannot hold open as it could a pipe.
local function launch (n, cmd)
  if n > GPUS then lu.skip(("%d ranks need %d GPUs; this machine has %d"):format(n, n, GPUS)) end
  local words = {"timeout", "-k", "5", "120"}
  if n > 1 then
    words[#words + 1] = "mpirun"
    if AS_ROOT then words[#words + 1] = "--allow-run-as-root" end
    words[#words + 1] = "--oversubscribe"
    words[#words + 1] = "-np " .. n
  end
  for _, w in ipairs(cmd) do words[#words + 1] = ("%q"):format(w) end
  local log = os.tmpname()
  local ok = H.execute(table.concat(words, " ") .. (" </dev/null >%q 2>&1"):format(log), {log})
  local f = io.open(log)
  local out = f and f:read("a") or ""
  if f then f:close() end
  os.remove(log)
  return out, ok == true
end

local function script (n, path)
  return launch(n, {PROG, "--device", gc.device(), ROOT .. path})
end

-- out holds each of the strings, count times (one per rank, or once)
local function expect (out, ok, count, ...)
  lu.assertTrue(ok, "exited non-zero:\n" .. out)
  for _, s in ipairs{...} do
    local seen, at = 0, 1
    while true do
      local i, j = out:find(s, at, true)
      if not i then break end
      seen, at = seen + 1, j + 1
    end
    lu.assertEquals(seen, count, ("'%s' in:\n%s"):format(s, out))
  end
end

TestDistTraining = {}

for _, n in ipairs{1, 2, 4} do
  TestDistTraining["test_ddp_" .. n] = function ()
    local out, ok = script(n, "examples/ddp.lua")
    expect(out, ok, 1, "graphed parameters equal the eager ones bit for bit",
           ("ddp: %d ranks vs one process on the global batch"):format(n),
           "within 1e-6 + 1e-5|ref|")
  end
  TestDistTraining["test_ddp_whole_" .. n] = function ()
    local out, ok = script(n, "examples/ddp_whole.lua")
    expect(out, ok, 1, "replayed parameters equal the eager DDP ones bit for bit",
           ("ddp_whole: %d ranks vs one process on the global batch"):format(n),
           "within 1e-6 + 1e-5|ref|")
  end
  -- the benchmark, tiny: a line per config, each with the baseline of its
  -- mode and an efficiency
  TestDistTraining["test_bench_dist_" .. n] = function ()
    local out, ok = launch(n, {PROG, "--device", gc.device(), ROOT .. "bench/bench_dist.lua",
                               "2", "16", "4", "2"})
    lu.assertTrue(ok, "exited non-zero:\n" .. out)
    local want = {local_eager = "local_eager", ["local"] = "local", local_whole = "local_whole",
                  dp_eager = "local_eager", dp_graphed = "local", dp_outside = "local",
                  dp_whole = "local_whole", fsdp_eager = "local_eager", fsdp_graphed = "local",
                  pp_local_eager = "pp_local_eager", pp_local = "pp_local",
                  pp_eager = "pp_local_eager", pp_graphed = "pp_local"}
    local seen = 0
    for line in out:gmatch("[^\n]+") do
      local j = line:sub(1, 1) == "{" and H.json_decode(line)
      if j then
        lu.assertNotNil(want[j.config], "config " .. tostring(j.config))
        lu.assertEquals(j.world_size, n)
        lu.assertTrue(j.step_us > 0, line)
        -- JSON's null decodes to a sentinel table
        lu.assertEquals(j.baseline, want[j.config], line)
        lu.assertEquals(j.dtype, "f32", line)
        lu.assertTrue(type(j.efficiency) == "number" and j.efficiency > 0, line)
        seen = seen + 1
      end
    end
    lu.assertEquals(seen, 13, out)
  end
  TestDistTraining["test_fsdp_" .. n] = function ()
    local out, ok = script(n, "examples/fsdp.lua")
    expect(out, ok, 1, "graphed shards equal the eager ones bit for bit", "within 1e-5 + 1e-4|ref|")
    expect(out, ok, n, ("(1/%d: "):format(n))
  end
  TestDistTraining["test_pipeline_" .. n] = function ()
    local out, ok = script(n, "examples/pipeline_parallel.lua")
    expect(out, ok, n, "graphed chunks equal the eager ones bit for bit", "within 1e-6 + 1e-5|ref|")
  end
  TestDistTraining["test_checks_" .. n] = function ()
    local out, ok = script(n, "tests/lua/dist_training_checks.lua")
    expect(out, ok, 1, "ok ddp eager grads", "ok ddp buckets", "ok ddp graphed",
           "ok ddp accumulated backwards", "ok ddp delayed wgrads",
           "ok ddp ranks using different parameters",
           "ok fsdp shard grads", "ok fsdp in bf16",
           "ok fsdp un-shard", "ok fsdp holds its shards and one unit's full parameters",
           "ok fsdp pads parameters", "ok fsdp microbatches in flight",
           "ok fsdp backward after its shards changed", "ok fsdp modules called directly")
    expect(out, ok, 1, "ok pipeline of 64 KB activations ran",
           "ok bf16 pipeline with option dtype equals one process")
    if n > 1 then expect(out, ok, 1, "ok fsdp and ddp errors") end
    if n == 4 then expect(out, ok, 1, "ok pipelines as groups of a 2 x 2 grid") end
  end
  TestDistTraining["test_embed_dist_" .. n] = function ()
    local prog = BUILD .. "embed_dist"
    if not io.open(prog) then lu.skip("no " .. prog) end
    local out, ok = launch(n, {prog})
    expect(out, ok, n, "graphed shards equal the eager ones bit for bit", "within 1e-6 + 1e-5|ref|")
  end
end

-- The examples fail (exit non-zero, naming what differs) when a check fails:
-- fsdp with its all-gathers turned into sums breaks every check.
function TestDistTraining:test_failures_are_reported ()
  local f = os.tmpname()
  local h = io.open(f, "w")
  h:write(([[
local gc = require "graphcap"
local all_gather = gc.dist.all_gather
gc.dist.all_gather = function (out, t, o)
  all_gather(out, t, o)
  gc.no_grad(function () out:copy_(out + out) end)
end
dofile(%q)
]]):format(ROOT .. "examples/fsdp.lua"))
  h:close()
  local out, ok = launch(2, {PROG, "--device", gc.device(), f})
  os.remove(f)
  lu.assertTrue(not ok, "exited 0:\n" .. out)
  lu.assertStrContains(out, "OUT OF TOLERANCE")
end

os.exit(lu.LuaUnit.run(), true)
