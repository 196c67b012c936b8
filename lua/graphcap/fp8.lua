-- graphcap.fp8: FP8 as TransformerEngine names it (require "graphcap".fp8):
-- the casts (gc.fp8.cast), the recipes DelayedScaling and
-- Float8CurrentScaling, gc.fp8.autocast (and its older name fp8_autocast),
-- gc.fp8.is_available, and m:fp8_state() on the modules. The core runs the
-- casts and keeps the scaling state on the device.

local core = require "graphcap.core"
local util = require "graphcap.util"
core._facade()
local nn = require "graphcap.nn"

local error, getmetatable, ipairs, math, setmetatable, string, table, tostring, type =
      error, getmetatable, ipairs, math, setmetatable, string, table, tostring, type
_ENV = nil

local cfp8 = core._fp8
local raise = util.raise

local fp8 = {}

-- TransformerEngine's Format: the names the recipes take.
fp8.Format = {E4M3 = "E4M3", E5M2 = "E5M2", HYBRID = "HYBRID"}

local cast_formats = {E4M3 = 0, E5M2 = 1}         -- gcap_fp8_format
local recipe_formats = {HYBRID = 0, E4M3 = 1}     -- gcap_fp8_recipe_format
local algos = {max = 0, most_recent = 1}          -- gcap_amax_algo

-- gc.fp8.cast(x, format [, scale = 1]) -> y, amax: x cast to FP8 at the
-- scale and back (q / scale as a float product), and the largest |x| (a 0-D
-- tensor). Not recorded by autograd.
function fp8.cast (x, format, scale)
  local f = cast_formats[format]
  if f == nil then
    raise("fp8.cast: format must be \"E4M3\" or \"E5M2\", got %s", tostring(format))
  end
  return cfp8.cast(x, f, util.check("fp8.cast", "scale", scale, "number", 1.0))
end

-- Recipes: objects of one class each, their fields checked when made.
local Recipe = {}
Recipe.__index = Recipe
Recipe.__name = "graphcap.fp8.Recipe"
function Recipe:__tostring ()
  if self.kind == "Float8CurrentScaling" then
    return string.format("Float8CurrentScaling(fp8_format=%s)", self.fp8_format)
  end
  return string.format("DelayedScaling(fp8_format=%s, margin=%s, amax_history_len=%d, "
                       .. "amax_compute_algo=%s)", self.fp8_format, tostring(self.margin),
                       self.amax_history_len, self.amax_compute_algo)
end

local function recipe_format (where, v)
  v = util.check(where, "fp8_format", v, "string", "HYBRID")
  if v == "E5M2" then raise("%s: fp8_format: Pure E5M2 training is not supported.", where) end
  if recipe_formats[v] == nil then
    raise("%s: fp8_format must be \"HYBRID\" or \"E4M3\", got \"%s\"", where, v)
  end
  return v
end

local delayed_options = {fp8_format = true, margin = true, amax_history_len = true,
                         amax_compute_algo = true}

-- gc.fp8.DelayedScaling{fp8_format = "HYBRID", margin = 0, amax_history_len = 1024,
--                       amax_compute_algo = "max"}
function fp8.DelayedScaling (opts)
  local W = "DelayedScaling"
  opts = util.options(W, opts, delayed_options)
  local margin = util.check(W, "margin", opts.margin, "number", 0)
  if margin ~= margin or margin == math.huge or margin == -math.huge then
    raise("%s: margin must be a finite number, got %s", W, tostring(margin))
  end
  local len = util.check(W, "amax_history_len", opts.amax_history_len, "integer", 1024)
  if len < 1 or len > 0x7fffffff then
    raise("%s: amax_history_len must be >= 1, got %d", W, len)
  end
  local algo = opts.amax_compute_algo
  if type(algo) == "function" then
    raise("%s: amax_compute_algo as a function is not supported; give \"max\" or "
          .. "\"most_recent\"", W)
  end
  algo = util.check(W, "amax_compute_algo", algo, "string", "max")
  if algos[algo] == nil then
    raise("%s: amax_compute_algo must be \"max\" or \"most_recent\", got \"%s\"", W, algo)
  end
  return setmetatable({kind = W, fp8_format = recipe_format(W, opts.fp8_format), margin = margin,
                       amax_history_len = len, amax_compute_algo = algo}, Recipe)
end

-- gc.fp8.Float8CurrentScaling{fp8_format = "HYBRID"}
function fp8.Float8CurrentScaling (opts)
  local W = "Float8CurrentScaling"
  opts = util.options(W, opts, {fp8_format = true})
  return setmetatable({kind = W, fp8_format = recipe_format(W, opts.fp8_format)}, Recipe)
end

-- gc.fp8.is_recipe(v): whether v is a recipe object
function fp8.is_recipe (v)
  return getmetatable(v) == Recipe
end

-- v, checked to be a recipe (nil: DelayedScaling's defaults), for option
-- 'what' of 'where'
function fp8.check_recipe (where, what, v)
  if v == nil then return fp8.DelayedScaling() end
  if getmetatable(v) ~= Recipe then
    local mt = getmetatable(v)
    raise("%s: %s must be a recipe object (gc.fp8.DelayedScaling{...} or "
          .. "gc.fp8.Float8CurrentScaling{...}), got %s", where, what,
          type(mt) == "table" and type(mt.__name) == "string" and mt.__name or type(v))
  end
  return v
end

-- gc.fp8.is_available() -> true, or false and the reason
fp8.is_available = cfp8.is_available

-- The engine's autocast as the facade set it last ({enabled = false} at
-- first), put back when an autocast ends.
local current = {enabled = false}

local function apply (s)
  if not s.enabled then return cfp8.set_autocast(false) end
  local r = s.recipe
  local kind = r.kind == "DelayedScaling" and 0 or 1
  cfp8.set_autocast(true, kind, recipe_formats[r.fp8_format], r.margin or 0,
                    r.amax_history_len or 1024, algos[r.amax_compute_algo or "max"], s.group)
end

-- The settings of an autocast call's options, checked ('where' names it).
local autocast_options = {enabled = true, recipe = true, amax_reduction_group = true,
                          calibrating = true}
local autocast_aliases = {fp8_recipe = "recipe", fp8_group = "amax_reduction_group"}

function fp8.settings (where, opts)
  opts = util.options(where, util.aliases(where, opts, autocast_aliases), autocast_options)
  local s = {enabled = util.check(where, "enabled", opts.enabled, "boolean", true)}
  if util.check(where, "calibrating", opts.calibrating, "boolean", false) then
    raise("%s: calibrating is not supported", where)
  end
  s.recipe = fp8.check_recipe(where, "recipe", opts.recipe)
  local g = opts.amax_reduction_group
  if g ~= nil and getmetatable(g) ~= core._metatables.DistGroup then
    raise("%s: amax_reduction_group must be a gc.dist group, got %s", where, type(g))
  end
  s.group = g
  return s
end

-- Run fn(...) with the engine's autocast set to s; the previous one comes
-- back, also when fn raises.
function fp8.with_settings (s, fn, ...)
  local prev = current
  apply(s)
  current = s
  local r = util.run(fn, ...)
  current = prev
  apply(prev)
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

-- gc.fp8.autocast([{enabled = true, recipe = r, amax_reduction_group = g}], fn, ...)
-- -> fn(...)'s results: inside, the FP8-capable modules run their GEMMs in
-- FP8 with r (DelayedScaling's defaults without one). TransformerEngine's
-- older spellings fp8_recipe and fp8_group are accepted, and so is its older
-- name fp8_autocast.
function fp8.autocast (opts, fn, ...)
  if type(opts) == "function" then return fp8.autocast(nil, opts, fn, ...) end
  local s = fp8.settings("fp8.autocast", opts)
  if type(fn) ~= "function" then
    raise("fp8.autocast: fn must be a function, got %s", type(fn))
  end
  return fp8.with_settings(s, fn, ...)
end
fp8.fp8_autocast = fp8.autocast

-- m:fp8_state() -> {input = {scale = s, amax_history = {...}}, weight = ...,
-- grad_output = ...} of a module with one FP8 GEMM, {fc1 = ..., fc2 = ...}
-- for LayerNormMLP; nil for a module with no FP8 GEMM of its own.
local roles = {"input", "weight", "grad_output"}
local function gemm_state (m, g)
  local t = {}
  for r, name in ipairs(roles) do
    local scale, hist = cfp8.state(m, g, r - 1)
    t[name] = {scale = scale, amax_history = hist}
  end
  return t
end

nn.methods.fp8_state = function (m)
  local n = cfp8.gemms(m)
  if n == 0 then return nil end
  if n == 1 then return gemm_state(m, 0) end
  return {fc1 = gemm_state(m, 0), fc2 = gemm_state(m, 1)}
end

return fp8
