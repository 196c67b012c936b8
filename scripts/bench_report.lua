-- bench_report.lua: the ratio table and SVG chart of bench/RESULTS.md, from
-- the raw JSON lines of scripts/bench.lua (graphcap) and of PyTorch's
-- torch_graphed.py / torch_scaling.py, run side by side on one GPU.
-- Usage: lua5.4 scripts/bench_report.lua GRAPHCAP.log TORCH.log [chart.svg]
-- Prints the markdown tables; writes the chart when a path is given.

local gfile, tfile, svgfile = arg[1], arg[2], arg[3]
if not (gfile and tfile) then
  io.stderr:write("usage: bench_report.lua GRAPHCAP.log TORCH.log [chart.svg]\n")
  os.exit(2)
end

-- The flat JSON objects of a log, one per line that holds one.
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

local g, t = records(gfile), records(tfile)

local function key (r)
  if r.fuse_wgrad_accumulation then return nil end -- measured apart: see fused_rows
  if r.L then return string.format("%s %dx%d, B %d", r.dtype, r.L, r.H, r.B) end
  if r.callables then return string.format("scaling %d", r.callables) end
end

-- the last record of each configuration (the scaling warm-up run comes first)
local function index (rs)
  local by, order = {}, {}
  for _, r in ipairs(rs) do
    local k = key(r)
    if k then
      if not by[k] then order[#order + 1] = k end
      by[k] = r
    end
  end
  return by, order
end

local gby, gorder = index(g)
local tby = index(t)

local fields = {"eager_us", "graphed_per_layer_us", "whole_graph_us", "capture_s", "graph_mem_mib"}
local out = {}
local function emit (s) out[#out + 1] = s end

emit("| config | " .. table.concat(fields, " | ") .. " |")
emit("|---|" .. string.rep("---|", #fields))
local bars = {}
for _, k in ipairs(gorder) do
  local a, b = gby[k], tby[k]
  if a.L and b then
    local cells = {}
    for _, f in ipairs(fields) do
      local ratio = a[f] / b[f]
      cells[#cells + 1] = string.format("%.3g / %.3g = **%.2f**", a[f], b[f], ratio)
      bars[#bars + 1] = {label = k .. ": " .. f, ratio = ratio}
    end
    emit("| " .. k .. " | " .. table.concat(cells, " | ") .. " |")
  end
end
emit("")
emit("| callables | capture s (graphcap / PyTorch) | fwd+bwd replay us per callable | "
     .. "pool MiB shared (graphcap) | PyTorch graph MiB |")
emit("|---|---|---|---|---|")
for _, k in ipairs(gorder) do
  local a, b = gby[k], tby[k]
  if a.callables and b then
    emit(string.format("| %d | %.3g / %.3g = **%.2f** | %.3g / %.3g = **%.2f** | %.3g | %.3g |",
                       a.callables, a.capture_s, b.capture_s, a.capture_s / b.capture_s,
                       a.replay_fwd_bwd_us_per_callable, b.replay_fwd_bwd_us_per_callable,
                       a.replay_fwd_bwd_us_per_callable / b.replay_fwd_bwd_us_per_callable,
                       a.graph_mem_shared_mib, b.graph_mem_shared_mib))
    bars[#bars + 1] = {label = k .. ": replay per callable",
                       ratio = a.replay_fwd_bwd_us_per_callable / b.replay_fwd_bwd_us_per_callable}
  end
end

-- fuse_wgrad_accumulation lines (graphcap only): against PyTorch's graphed
-- per layer and whole graph of the same configuration.
local fused = {}
for _, r in ipairs(g) do
  if r.fuse_wgrad_accumulation then fused[#fused + 1] = r end
end
if #fused > 0 then
  emit("")
  emit("| fuse_wgrad_accumulation (graphcap) | eager_us | graphed_per_layer_us | "
       .. "/ PyTorch graphed per layer | / PyTorch whole graph |")
  emit("|---|---|---|---|---|")
  for _, r in ipairs(fused) do
    local b = tby[string.format("%s %dx%d, B %d", r.dtype, r.L, r.H, r.B)]
    if b then
      emit(string.format("| %s %dx%d, B %d | %.3g | %.3g | **%.2f** | **%.2f** |", r.dtype, r.L,
                         r.H, r.B, r.eager_us, r.graphed_per_layer_us,
                         r.graphed_per_layer_us / b.graphed_per_layer_us,
                         r.graphed_per_layer_us / b.whole_graph_us))
    end
  end
end
print(table.concat(out, "\n"))

-- Horizontal bars of graphcap / PyTorch, with the parity line at 1.
if svgfile then
  local W, row, left, scale = 900, 18, 380, 300 -- scale: pixels per 1.0
  local H = 40 + row * #bars
  local s = {string.format('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
                           .. 'font-family="sans-serif" font-size="11">', W, H),
             '<text x="10" y="16" font-size="13">graphcap / PyTorch (lower is better; '
               .. 'the line is parity)</text>'}
  for i, b in ipairs(bars) do
    local y = 24 + (i - 1) * row
    local w = math.min(b.ratio, 1.6) * scale
    local color = b.ratio <= 1 and "#3a7" or "#c54"
    s[#s + 1] = string.format('<text x="%d" y="%d" text-anchor="end">%s</text>', left - 6,
                              y + 12, b.label)
    s[#s + 1] = string.format('<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>', left,
                              y + 2, w, row - 5, color)
    s[#s + 1] = string.format('<text x="%.1f" y="%d">%.2f</text>', left + w + 4, y + 12, b.ratio)
  end
  s[#s + 1] = string.format('<line x1="%d" y1="20" x2="%d" y2="%d" stroke="#333" '
                            .. 'stroke-dasharray="4 3"/>', left + scale, left + scale, H - 4)
  s[#s + 1] = "</svg>"
  local f = assert(io.open(svgfile, "w"))
  f:write(table.concat(s, "\n"), "\n")
  f:close()
end
