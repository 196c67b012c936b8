-- bench_report.lua: the tables and the SVG chart of bench/RESULTS.md, from
-- the JSON lines of one or more runs of each side: bench/bench.lua
-- (graphcap) and bench/torch_graphed.py + bench/torch_scaling.py +
-- bench/torch_transformer.py + bench/torch_fp8.py (PyTorch).
--
--   lua5.4 bench/bench_report.lua [--svg chart.svg] --graphcap G1 [G2 ...] --torch T1 [T2 ...]
--   lua5.4 bench/bench_report.lua G.jsonl T.jsonl [chart.svg]       (one run each)
--
-- Run i of graphcap is paired with run i of PyTorch (both sides of one
-- `make bench`). Each cell gives the medians over the runs and their ratio
-- graphcap / PyTorch, then the smallest and largest ratio of a pair of runs:
-- "1.1e+03 / 2.9e+03 = **0.38** (0.31-0.41)". Prints the markdown tables;
-- writes the chart when asked.

local function usage ()
  io.stderr:write("usage: bench_report.lua [--svg chart.svg] --graphcap FILE... --torch FILE...\n"
                  .. "       bench_report.lua GRAPHCAP.jsonl TORCH.jsonl [chart.svg]\n")
  os.exit(2)
end

-- The command line: the files of each side, and the chart's path.
local function parse_args (a)
  local files, svg = {graphcap = {}, torch = {}}, nil
  if a[1] and not a[1]:match("^%-%-") then
    if not a[2] then usage() end
    return {graphcap = {a[1]}, torch = {a[2]}}, a[3]
  end
  local side, i = nil, 1
  while a[i] do
    if a[i] == "--svg" then svg, i = a[i + 1], i + 2
    elseif a[i] == "--graphcap" or a[i] == "--torch" then side, i = a[i]:sub(3), i + 1
    elseif side then files[side][#files[side] + 1], i = a[i], i + 1
    else usage() end
  end
  if #files.graphcap == 0 or #files.torch == 0 or (a[#a] == "--svg") then usage() end
  return files, svg
end

-- The flat JSON objects of a file, one per line that holds one.
local function records (path)
  local out = {}
  for line in io.lines(path) do
    if line:match("^%s*{") then
      local r = {}
      for k, v in line:gmatch('"([%w_]+)":%s*([^,}]+)') do
        r[k] = tonumber(v) or v:gsub('^"', ""):gsub('"$', "")
      end
      out[#out + 1] = r
    end
  end
  return out
end

local function config_key (r)
  return string.format("%s %dx%d, B %d", r.dtype, r.L, r.H, r.B)
end

-- The key of a transformer record, less graphcap's attn_impl: PyTorch's
-- record of the same configuration has this key.
local function transformer_key (r)
  return string.format("transformer %s L %d, d %d, %d heads, S %d, B %d", r.dtype, r.L, r.d,
                       r.heads, r.S, r.B)
end

-- The key of a line of the FP8 section (it has "fp8"): the model, its sizes
-- and the recipe ("none": bf16); the same on both sides (the attn_impl of
-- graphcap's transformer lines is left out).
local function fp8_key (r)
  local what
  if r.model == "gemm" then what = string.format("gemm %dx%dx%d", r.M, r.N, r.K)
  elseif r.model == "transformer" then what = transformer_key(r)
  else what = "mlp " .. config_key(r) end
  return string.format("fp8 section: %s, recipe %s", what, r.recipe)
end

-- The key of a record: configurations, scaling runs, microbatch runs,
-- fused-wgrad lines and the FP8 section's lines each have their own;
-- graphcap's transformer lines one per attn_impl (older runs have none).
local function key (r)
  if r.fp8 then return fp8_key(r) end
  if r.model == "transformer" then
    local k = transformer_key(r)
    return r.attn_impl and k .. ", attn " .. r.attn_impl or k
  end
  if r.fuse_wgrad_accumulation then return "fused " .. config_key(r) end
  if r.L then return config_key(r) end
  if r.callables then return string.format("scaling %d", r.callables) end
  if r.microbatches then return string.format("microbatches %d reuse %s", r.microbatches, r.reuse) end
end

-- One run: key -> its last record (a scaling warm-up line comes first and
-- is replaced), and the keys in order of first appearance.
local function run_of (path)
  local by, order = {}, {}
  for _, r in ipairs(records(path)) do
    local k = key(r)
    if k then
      if not by[k] then order[#order + 1] = k end
      by[k] = r
    end
  end
  return {by = by, order = order}
end

local function median (xs)
  local s = {}
  for i, x in ipairs(xs) do s[i] = x end
  table.sort(s)
  local n = #s
  if n == 0 then return nil end
  if n % 2 == 1 then return s[(n + 1) // 2] end
  return (s[n // 2] + s[n // 2 + 1]) / 2
end

local function minmax (xs)
  local lo, hi = math.huge, -math.huge
  for _, x in ipairs(xs) do lo, hi = math.min(lo, x), math.max(hi, x) end
  return lo, hi
end

local files, svgfile = parse_args(arg)
local G, T = {}, {}
for i, f in ipairs(files.graphcap) do G[i] = run_of(f) end
for i, f in ipairs(files.torch) do T[i] = run_of(f) end

-- The values of field f of key k over the runs of one side.
local function values (runs, k, f)
  local out = {}
  for _, run in ipairs(runs) do
    local r = run.by[k]
    if r and type(r[f]) == "number" then out[#out + 1] = r[f] end
  end
  return out
end

-- PyTorch's key for graphcap's key k: a transformer line's without the
-- attn_impl (the FP8 section's have none), any other's the same.
local function torch_key (k)
  local r = G[1].by[k]
  return r and r.model == "transformer" and not r.fp8 and transformer_key(r) or k
end

-- Ratio of field gf (graphcap) to field tf (PyTorch) of key k: the median
-- values, their ratio, and the ratios of paired runs.
local function ratio (k, gf, tf)
  local tk = torch_key(k)
  local gv, tv = values(G, k, gf), values(T, tk, tf or gf)
  if #gv == 0 or #tv == 0 then return nil end
  local pairs_ = {}
  for i = 1, math.min(#G, #T) do
    local a, b = G[i].by[k], T[i].by[tk]
    if a and b and type(a[gf]) == "number" and type(b[tf or gf]) == "number" then
      pairs_[#pairs_ + 1] = a[gf] / b[tf or gf]
    end
  end
  local gm, tm = median(gv), median(tv)
  local lo, hi = minmax(pairs_)
  if #pairs_ == 0 then lo, hi = gm / tm, gm / tm end
  return {g = gm, t = tm, r = gm / tm, lo = lo, hi = hi, n = #pairs_}
end

local function cell (x)
  if not x then return "-" end
  local s = string.format("%.3g / %.3g = **%.2f**", x.g, x.t, x.r)
  if x.n > 1 then s = s .. string.format(" (%.2f-%.2f)", x.lo, x.hi) end
  return s
end

-- The targets of graphcap / PyTorch, per field; `large` is the
-- compute-bound configuration (8 x 4096, batch 4096).
local function target (field, r)
  local large = r.H >= 4096
  if field == "eager_us" then return large and 1.0 or 0.35 end
  if field == "whole_graph_us" then return large and 1.0 or 0.8 end
  if field == "capture_s" then return 0.25 end
  if field == "graph_mem_mib" then return 1.0 end
  if field == "per_layer_vs_whole" then return (not large) and 0.85 or nil end
end

local out = {}
local function emit (s) out[#out + 1] = s end
local bars = {}
local function bar (label, x, tgt)
  if x then bars[#bars + 1] = {label = label, x = x, target = tgt} end
end

emit(string.format("Runs: %d of graphcap, %d of PyTorch; medians, ratio graphcap / PyTorch, "
                   .. "(smallest-largest ratio of paired runs).", #G, #T))
emit("")
local fields = {"eager_us", "graphed_per_layer_us", "whole_graph_us", "capture_s", "graph_mem_mib"}
emit("| config | " .. table.concat(fields, " | ") .. " | graphed per layer / PyTorch whole graph |")
emit("|---|" .. string.rep("---|", #fields + 1))
for _, k in ipairs(G[1].order) do
  local r = G[1].by[k]
  if r.L and not r.fuse_wgrad_accumulation and not r.model then
    local cells = {}
    for _, f in ipairs(fields) do
      local x = ratio(k, f)
      cells[#cells + 1] = cell(x)
      bar(k .. ": " .. f, x, target(f, r))
    end
    local pw = ratio(k, "graphed_per_layer_us", "whole_graph_us")
    cells[#cells + 1] = cell(pw)
    bar(k .. ": per layer / whole", pw, target("per_layer_vs_whole", r))
    emit("| " .. k .. " | " .. table.concat(cells, " | ") .. " |")
  end
end

emit("")
emit("| callables | capture_s | replay fwd+bwd us per callable | pool MiB, one shared pool | "
     .. "pool MiB, a pool per callable |")
emit("|---|---|---|---|---|")
for _, k in ipairs(G[1].order) do
  local r = G[1].by[k]
  if r.callables then
    local rep = ratio(k, "replay_fwd_bwd_us_per_callable")
    emit(string.format("| %d | %s | %s | %s | %s |", r.callables, cell(ratio(k, "capture_s")),
                       cell(rep), cell(ratio(k, "graph_mem_shared_mib")),
                       cell(ratio(k, "graph_mem_separate_pools_mib"))))
    bar(k .. ": replay per callable", rep, nil)
  end
end

-- The transformer section: the issue's targets are per-layer graphed <= 0.8
-- of PyTorch's on the launch-bound configuration (d 256) and <= 1.0 on the
-- compute-bound one, graph memory <= 1.0.
local function transformer_target (field, r)
  if field == "graphed_per_layer_us" then return r.d <= 256 and 0.8 or 1.0 end
  if field == "graph_mem_mib" then return 1.0 end
end
local tf = {}
for _, k in ipairs(G[1].order) do
  if G[1].by[k].model == "transformer" and not G[1].by[k].fp8 then tf[#tf + 1] = k end
end
if #tf > 0 then
  emit("")
  emit("| transformer | " .. table.concat(fields, " | ") .. " |")
  emit("|---|" .. string.rep("---|", #fields))
  for _, k in ipairs(tf) do
    local cells = {}
    for _, f in ipairs(fields) do
      local x = ratio(k, f)
      cells[#cells + 1] = cell(x)
      bar(k .. ": " .. f, x, transformer_target(f, G[1].by[k]))
    end
    emit("| " .. k .. " | " .. table.concat(cells, " | ") .. " |")
  end
end

-- The FP8 section: each line against PyTorch's of the same key (graphcap's
-- first, then PyTorch's that graphcap has not, as its "prequantized" GEMM),
-- and on each side the whole graph against that side's bf16 line of the
-- same model and sizes (recipe none): what FP8 gives there.
local f8, seen = {}, {}
for _, side in ipairs({G, T}) do
  for _, k in ipairs(side[1] and side[1].order or {}) do
    if side[1].by[k].fp8 and not seen[k] then f8[#f8 + 1], seen[k] = k, true end
  end
end
if #f8 > 0 then
  local f8fields = {"eager_us", "whole_graph_us", "graph_mem_mib"}
  emit("")
  emit("| fp8 section | " .. table.concat(f8fields, " | ")
       .. " | whole graph / bf16's, graphcap | whole graph / bf16's, PyTorch |")
  emit("|---|" .. string.rep("---|", #f8fields + 2))
  for _, k in ipairs(f8) do
    local cells = {}
    for _, f in ipairs(f8fields) do cells[#cells + 1] = cell(ratio(k, f)) end
    local bf16 = (k:gsub(", recipe [%w_]+$", ", recipe none"))
    for _, side in ipairs({G, T}) do
      local a = median(values(side, k, "whole_graph_us"))
      local b = median(values(side, bf16, "whole_graph_us"))
      cells[#cells + 1] = a and b and string.format("%.3g / %.3g = **%.2f**", a, b, a / b) or "-"
    end
    emit("| " .. k .. " | " .. table.concat(cells, " | ") .. " |")
  end
end

-- graphcap-only lines: fused wgrad (against PyTorch's per-layer graphs and
-- whole graph of the same configuration) and pool bytes per microbatch count.
local fused, micro = {}, {}
for _, k in ipairs(G[1].order) do
  local r = G[1].by[k]
  if r.fuse_wgrad_accumulation then fused[#fused + 1] = k end
  if r.microbatches then micro[#micro + 1] = k end
end
if #fused > 0 then
  emit("")
  emit("| fuse_wgrad_accumulation (graphcap) | eager_us | graphed_per_layer_us | "
       .. "/ PyTorch graphed per layer | / PyTorch whole graph |")
  emit("|---|---|---|---|---|")
  for _, k in ipairs(fused) do
    local base = config_key(G[1].by[k])
    local per = median(values(G, k, "graphed_per_layer_us"))
    local tper, twhole = median(values(T, base, "graphed_per_layer_us")),
                         median(values(T, base, "whole_graph_us"))
    if per and tper and twhole then
      emit(string.format("| %s | %.3g | %.3g | **%.2f** | **%.2f** |", base,
                         median(values(G, k, "eager_us")), per, per / tper, per / twhole))
    end
  end
end
if #micro > 0 then
  emit("")
  emit("| microbatches | reuse | pool MiB (median, min-max) |")
  emit("|---|---|---|")
  for _, k in ipairs(micro) do
    local r, v = G[1].by[k], values(G, k, "pool_mib")
    local lo, hi = minmax(v)
    emit(string.format("| %d | %s | %.3g (%.3g-%.3g) |", r.microbatches, r.reuse, median(v), lo, hi))
  end
end
print(table.concat(out, "\n"))

-- The chart: one bar per ratio (the median), a whisker from the smallest to
-- the largest ratio of paired runs, the target of that ratio as a mark, the
-- parity line at 1.0, and an x axis with ticks.
local function chart (path)
  local W, row, left, plotw, top = 980, 20, 360, 520, 58
  local xmax = 1.5
  for _, b in ipairs(bars) do xmax = math.max(xmax, math.min(b.x.hi, 2.5)) end
  xmax = math.ceil(xmax * 4) / 4
  local function X (v) return left + math.max(0, math.min(v, xmax)) / xmax * plotw end
  local H = top + row * #bars + 48
  local axis_y = top + row * #bars + 4
  local s = {}
  local function add (fmt, ...) s[#s + 1] = string.format(fmt, ...) end
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
      .. 'font-size="11">', W, H)
  add('<rect width="%d" height="%d" fill="white"/>', W, H)
  add('<text x="10" y="18" font-size="14" font-weight="bold">graphcap / PyTorch '
      .. 'make_graphed_callables, same model, same GPU (lower is better)</text>')
  add('<text x="10" y="36" fill="#444">bar: median of %d x %d runs; whisker: smallest to largest '
      .. 'ratio of paired runs; &#9660; target; green: at or below its target (parity where there '
      .. 'is none), red: above</text>', #G, #T)
  for v = 0, xmax + 1e-9, 0.25 do  -- grid and ticks
    add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e4e4e4"/>', X(v), top - 4, X(v), axis_y)
    add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#333"/>', X(v), axis_y, X(v), axis_y + 5)
    add('<text x="%.1f" y="%d" text-anchor="middle">%.2f</text>', X(v), axis_y + 17, v)
  end
  add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>', left, axis_y, left + plotw, axis_y)
  add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>', left, top - 4, left, axis_y)
  add('<text x="%d" y="%d" text-anchor="middle">ratio graphcap / PyTorch (time, or pool bytes '
      .. 'for graph_mem)</text>', left + plotw // 2, axis_y + 36)
  for i, b in ipairs(bars) do
    local y = top + (i - 1) * row
    local good = b.x.r <= (b.target or 1.0)
    add('<text x="%d" y="%d" text-anchor="end">%s</text>', left - 6, y + 13, b.label)
    add('<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>', left, y + 4, X(b.x.r) - left,
        row - 8, good and "#3a7" or "#c54")
    if b.x.n > 1 then
      local cy = y + row // 2
      add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#222"/>', X(b.x.lo), cy, X(b.x.hi), cy)
      add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#222"/>', X(b.x.lo), cy - 4, X(b.x.lo), cy + 4)
      add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#222"/>', X(b.x.hi), cy - 4, X(b.x.hi), cy + 4)
    end
    if b.target then
      add('<path d="M %.1f %d l -4 -6 h 8 z" fill="#236"/>', X(b.target), y + 6)
    end
    add('<text x="%.1f" y="%d">%.2f%s</text>', X(math.max(b.x.r, b.x.hi)) + 6, y + 13, b.x.r,
        b.x.hi > xmax and " (off the scale)" or "")
  end
  add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#000" stroke-width="1.5" '
      .. 'stroke-dasharray="5 3"/>', X(1), top - 8, X(1), axis_y)
  add('<text x="%.1f" y="%d" text-anchor="middle">1.0 = parity</text>', X(1), top - 11)
  add("</svg>")
  local f = assert(io.open(path, "w"))
  f:write(table.concat(s, "\n"), "\n")
  f:close()
end

if svgfile then chart(svgfile) end
