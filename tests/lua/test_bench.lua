-- test_bench.lua: bench/bench.lua's FP8 section at its tiny sizes (`fp8
-- tiny`) runs on this backend and prints one JSON line per measurement:
-- the GEMM, the MLP and the transformer, each in bf16 (recipe "none") and
-- under each recipe, with the fields of PyTorch's side (bench/torch_fp8.py);
-- bench/bench_report.lua makes its FP8 table from such lines; a bad size
-- argument is refused with the usage line.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_bench.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

local ROOT = debug.getinfo(1, "S").source:match("^@?(.-)[^/\\]*$") .. "../../"
local BENCH = ROOT .. "bench/bench.lua"

-- Run the graphcap program on this backend with the words `args`: stdout,
-- stderr and whether it exited 0.
local function run (args)
  local words = {}
  for i, a in ipairs(args) do words[i] = H.quote(a) end
  local outf, errf = os.tmpname(), os.tmpname()
  local ok = os.execute(string.format("%s --device %s %s >%s 2>%s", H.quote(H.program),
                                      gc.device(), table.concat(words, " "), outf, errf))
  return H.slurp(outf), H.slurp(errf), ok == true
end

-- The tiny FP8 section's stdout, run once for the suite.
local tiny_out
local function tiny ()
  local available, why = gc.fp8.is_available()
  lu.skipIf(not available, "FP8 is not available here: " .. tostring(why))
  if not tiny_out then
    local out, err, ok = run({BENCH, "fp8", "tiny"})
    lu.assertTrue(ok, "bench.lua fp8 tiny exited non-zero:\n" .. err)
    tiny_out = out
  end
  return tiny_out
end

-- The fields every line has, and each model's own.
local COMMON = {"model", "dtype", "fp8", "recipe", "eager_us", "whole_graph_us", "graph_mem_mib",
                "graphcap"}
local OWN = {
  gemm = {M = 64, N = 64, K = 64},
  mlp = {L = 2, H = 64, B = 32},
  transformer = {L = 2, d = 64, heads = 2, S = 16, B = 2},
}
local TIMES = {gemm = {"tflops"}, mlp = {"graphed_per_layer_us", "capture_s"},
               transformer = {"graphed_per_layer_us", "capture_s"}}

TestBench = {}

function TestBench.test_fp8_tiny_lines ()
  local seen, n = {}, 0
  for line in tiny():gmatch("[^\n]+") do
    lu.assertEquals(line:sub(1, 1), "{", "stdout has only JSON lines: " .. line)
    local j = H.json_decode(line)
    for _, k in ipairs(COMMON) do lu.assertNotNil(j[k], k .. " in " .. line) end
    lu.assertNotNil(OWN[j.model], "model " .. tostring(j.model))
    for k, v in pairs(OWN[j.model]) do lu.assertEquals(j[k], v, k .. " in " .. line) end
    lu.assertEquals(j.dtype, "bfloat16", line)
    lu.assertEquals(type(j.fp8), "boolean", line)
    lu.assertEquals(j.fp8, j.recipe ~= "none", line)
    for _, k in ipairs({"eager_us", "whole_graph_us", table.unpack(TIMES[j.model])}) do
      lu.assertTrue(type(j[k]) == "number" and j[k] > 0, k .. " in " .. line)
    end
    lu.assertTrue(j.graph_mem_mib >= 0, line)
    if j.model == "transformer" then lu.assertEquals(j.attn_impl, "auto", line) end
    local key = j.model .. " " .. j.recipe
    lu.assertNil(seen[key], "one line each: " .. key)
    seen[key], n = true, n + 1
  end
  for model in pairs(OWN) do
    for _, recipe in ipairs({"none", "DelayedScaling", "Float8CurrentScaling"}) do
      lu.assertTrue(seen[model .. " " .. recipe], model .. " " .. recipe)
    end
  end
  lu.assertEquals(n, 9)
end

-- The report of one run against itself: the FP8 table has a row per line,
-- each ratio to the other side 1, and FP8's rows against their bf16 line.
function TestBench.test_report_fp8_table ()
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(tiny())
  f:close()
  local out, err, ok = run({ROOT .. "bench/bench_report.lua", path, path})
  os.remove(path)
  lu.assertTrue(ok, err)
  local rows = {}
  for row in out:gmatch("\n(| fp8 section: [^\n]*)") do rows[#rows + 1] = row end
  lu.assertEquals(#rows, 9, out)
  lu.assertStrContains(out, "| fp8 section | eager_us | whole_graph_us | graph_mem_mib |")
  for _, row in ipairs(rows) do
    local _, ones = row:gsub("%*%*1%.00%*%*", "")
    lu.assertTrue(ones >= 3, row) -- eager_us, whole_graph_us and graph_mem_mib against itself
    if row:find("recipe none", 1, true) then lu.assertTrue(ones == 5, row) end
  end
  lu.assertStrContains(out, "fp8 section: gemm 64x64x64, recipe DelayedScaling")
  lu.assertStrContains(out, "fp8 section: mlp bfloat16 2x64, B 32, recipe Float8CurrentScaling")
  lu.assertStrContains(out, "fp8 section: transformer bfloat16 L 2, d 64, 2 heads, S 16, B 2, "
                       .. "recipe none")
end

function TestBench.test_fp8_bad_size_is_refused ()
  local out, err, ok = run({BENCH, "fp8", "huge"})
  lu.assertFalse(ok)
  lu.assertEquals(out, "")
  lu.assertStrContains(err, "usage: graphcap bench/bench.lua [configs|scaling|transformer [IMPL]|"
                       .. "fp8 [tiny]|all]")
end

os.exit(lu.LuaUnit.run(), true)
