-- graphcap.tensor_str: tostring(t) as PyTorch prints a tensor (its
-- torch/_tensor_str.py): tensor([[ 0.1000, -2.0000], ...], dtype=bf16,
-- requires_grad=true). Four decimals, or integers with a dot, or
-- scientific notation where the magnitudes ask for it, as PyTorch chooses;
-- above 1000 elements each dim shows its first and last 3 entries around
-- "...". Where the values cannot be read (a capture is open, the tensor
-- is closed) it is the box's own description.

local core = require "graphcap.core"
core._facade()

local ipairs, math, pcall, string, table, type = ipairs, math, pcall, string, table, type
_ENV = nil

local Tensor = core._metatables.Tensor
local box_tostring = Tensor.__tostring

local PRECISION, THRESHOLD, EDGE, LINEWIDTH = 4, 1000, 3, 80
local gap = {}  -- the place of the entries a summary leaves out

-- The values of t as nested sequences; with summarize, a dim of more than
-- 2 * EDGE entries holds its first and last EDGE ones around gap.
local function gather (t, summarize)
  local d = t:dim()
  if d == 0 then return t:item() end
  local n = t:size(1)
  if not summarize or (d == 1 and n <= 2 * EDGE) then return t:tolist() end
  local out = {}
  local function add (i)
    if d == 1 then out[#out + 1] = t[i]:item() else out[#out + 1] = gather(t[i], true) end
  end
  if n > 2 * EDGE then
    for i = 1, EDGE do add(i) end
    out[#out + 1] = gap
    for i = n - EDGE + 1, n do add(i) end
  else
    for i = 1, n do add(i) end
  end
  return out
end

local function finite (v) return v == v and v ~= math.huge and v ~= -math.huge end

local function nonfinite_str (v)
  if v ~= v then return "nan" end
  return v > 0 and "inf" or "-inf"
end

-- PyTorch's _Formatter over the values v (nested): the mode and the width.
local function formatter (v)
  local vals = {}
  local function walk (x)
    if type(x) == "table" then
      for _, y in ipairs(x) do walk(y) end
    elseif x ~= gap and finite(x) and x ~= 0 then
      vals[#vals + 1] = x
    end
  end
  walk(v)
  local f = {int = true, sci = false, width = 1}
  if #vals == 0 then return f end
  local lo, hi = math.huge, 0
  for _, x in ipairs(vals) do
    local a = math.abs(x)
    if a < lo then lo = a end
    if a > hi then hi = a end
    if x ~= math.ceil(x) then f.int = false end
  end
  if f.int then
    f.sci = hi / lo > 1000 or hi > 1e8
  else
    f.sci = hi / lo > 1000 or hi > 1e8 or lo < 1e-4
  end
  for _, x in ipairs(vals) do
    local s
    if f.sci then s = string.format("%." .. PRECISION .. "e", x)
    elseif f.int then s = string.format("%.0f", x) .. "."
    else s = string.format("%." .. PRECISION .. "f", x) end
    if #s > f.width then f.width = #s end
  end
  return f
end

-- One value as the formatter f writes it, padded to its width.
local function format (f, x)
  local s
  if not finite(x) then s = nonfinite_str(x)
  elseif f.sci then s = string.format("%." .. PRECISION .. "e", x)
  elseif f.int then s = string.format("%.0f", x) .. "."
  else s = string.format("%." .. PRECISION .. "f", x) end
  return string.rep(" ", f.width - #s) .. s
end

-- The values v of a d-D tensor (d >= 1) at indent, as PyTorch lays them out.
local function layout (v, d, f, indent)
  local parts = {}
  if d == 1 then
    local per = math.max(1, (LINEWIDTH - indent) // (f.width + 2))
    local data, lines = {}, {}
    for _, x in ipairs(v) do data[#data + 1] = x == gap and " ..." or format(f, x) end
    for i = 1, #data, per do
      lines[#lines + 1] = table.concat(data, ", ", i, math.min(i + per - 1, #data))
    end
    return "[" .. table.concat(lines, ",\n" .. string.rep(" ", indent + 1)) .. "]"
  end
  for _, x in ipairs(v) do
    parts[#parts + 1] = x == gap and "..." or layout(x, d - 1, f, indent + 1)
  end
  return "[" .. table.concat(parts, "," .. string.rep("\n", d - 1) .. string.rep(" ", indent + 1))
         .. "]"
end

-- The suffixes after the values, each on the last line while it fits.
local function add_suffixes (s, suffixes, indent)
  local out = {s}
  local nl = s:match(".*()\n") or 0
  local last = #s - nl + 2
  for _, suffix in ipairs(suffixes) do
    if last + #suffix + 2 > LINEWIDTH then
      out[#out + 1] = ",\n" .. string.rep(" ", indent) .. suffix
      last = indent + #suffix
    else
      out[#out + 1] = ", " .. suffix
      last = last + #suffix + 2
    end
  end
  out[#out + 1] = ")"
  return table.concat(out)
end

local function tensor_str (t)
  local prefix, suffixes = "tensor(", {}
  local d = t:dim()
  local s
  if t:numel() == 0 then
    s = "[]"
    if d ~= 1 then
      local size = t:size()
      suffixes[#suffixes + 1] = "size=(" .. table.concat(size, ", ") .. (#size == 1 and ",)" or ")")
    end
  else
    local v = gather(t, t:numel() > THRESHOLD)
    local f = formatter(v)
    s = d == 0 and format(f, v) or layout(v, d, f, #prefix)
  end
  if t:dtype() ~= "f32" then suffixes[#suffixes + 1] = "dtype=" .. t:dtype() end
  if t.grad_fn then
    suffixes[#suffixes + 1] = "grad_fn=<" .. t.grad_fn .. ">"
  elseif t.requires_grad then
    suffixes[#suffixes + 1] = "requires_grad=true"
  end
  return add_suffixes(prefix .. s, suffixes, #prefix)
end

-- tostring(t): the values; the box's description where they cannot be read.
Tensor.__tostring = function (t)
  if core.is_capturing() then return box_tostring(t) end
  local ok, s = pcall(tensor_str, t)
  return ok and s or box_tostring(t)
end

return {format = tensor_str}
