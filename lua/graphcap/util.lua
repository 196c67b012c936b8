-- graphcap.util: helpers shared by the facade's modules (option tables,
-- protected calls).

local core = require "graphcap.core"

local debug, error, getmetatable, math, pairs, pcall, require, string, table, tostring, type =
      debug, error, getmetatable, math, pairs, pcall, require, string, table, tostring, type
_ENV = nil

core._facade()

local util = {}

-- Raise msg (string.format(fmt, ...)) at the user's line: the first caller
-- outside the facade, as the binding finds it for its own errors.
function util.raise (fmt, ...)
  error(core._where() .. string.format(fmt, ...), 0)
end
local raise = util.raise

-- f, or each Lua function of the table t (a module's functions, a class's
-- methods), entered through a C function (core._entry): Lua drops the frame
-- of a function that tail-calls a Lua function, so `return gc.nn.Linear(0,
-- 2)` would otherwise have its errors name the caller's caller's line.
util.entry = core._entry
function util.entries (t)
  for k, v in pairs(t) do
    if type(v) == "function" and debug.getinfo(v, "S").what ~= "C" then t[k] = core._entry(v) end
  end
  return t
end

util.none = {}  -- the options of a call given none (never written)

-- Check the options table 'opts' of 'where' against the names in 'known'.
function util.options (where, opts, known)
  if opts == nil then return util.none end
  if type(opts) ~= "table" then
    raise("%s: options must be a table, got %s", where, type(opts))
  end
  for k in pairs(opts) do
    if not known[k] then
      raise("%s: unknown option '%s'", where, tostring(k))
    end
  end
  return opts
end

-- opts with each name of 'aliases' (another spelling, such as
-- TransformerEngine's) renamed to the name it stands for, in a new table
-- when there is one to rename; giving both spellings is an error.
function util.aliases (where, opts, aliases)
  if type(opts) ~= "table" then return opts end
  local out = opts
  for alias, name in pairs(aliases) do
    if opts[alias] ~= nil then
      if opts[name] ~= nil then
        raise("%s: options '%s' and '%s' are one option (%s is TransformerEngine's name); "
              .. "give one of them", where, name, alias, alias)
      end
      if out == opts then
        out = {}
        for k, v in pairs(opts) do out[k] = v end
      end
      out[name], out[alias] = opts[alias], nil
    end
  end
  return out
end

-- The value v of option or argument 'what' of 'where', checked to be of
-- Lua type 'kind' ("boolean", "number", "integer", "string"), or 'default'
-- when v is nil.
function util.check (where, what, v, kind, default)
  if v == nil then
    if default == nil then
      raise("%s: %s is required", where, what)
    end
    return default
  end
  local ok
  if kind == "integer" then ok = math.type(v) == "integer"
  else ok = type(v) == kind end
  if not ok then
    raise("%s: %s must be %s %s, got %s", where, what, kind == "integer" and "an" or "a",
          kind, math.type(v) or type(v))
  end
  return v
end

-- v, checked to be a Tensor: argument 'what' of 'where'.
function util.check_tensor (where, what, v)
  if getmetatable(v) ~= core._metatables.Tensor then
    local mt = getmetatable(v)
    raise("%s: %s must be a Tensor, got %s", where, what,
          type(v) == "userdata" and type(mt) == "table" and mt.__name or type(v))
  end
  return v
end

-- The bytes of t's elements (4 an element in f32, 2 in bf16).
function util.nbytes (t) return (t:dtype() == "bf16" and 2 or 4) * t:numel() end

-- zero_grad([{set_to_none = true}]) over a C zero_grad(self, set_to_none),
-- for modules and optimizers alike (its argument errors name zero_grad).
local zero_grad_options = {set_to_none = true}
function util.zero_grad (zero_grad)
  return function (self, opts)
    opts = util.options("zero_grad", opts, zero_grad_options)
    return zero_grad(self, util.check("zero_grad", "set_to_none", opts.set_to_none,
                                      "boolean", true))
  end
end

-- The option 'group' of 'where' (ddp, fsdp): gc.dist initialised, and g nil
-- (the world) or a gc.dist group holding this rank. Returns gc.dist, g, the
-- group's size and its first world rank.
function util.dist_group (where, g)
  local dist = require("graphcap").dist
  if not dist.is_initialized() then raise("%s: call gc.dist.init() first", where) end
  if g == nil then return dist, nil, dist.world_size(), 0 end
  if getmetatable(g) ~= core._metatables.DistGroup then
    raise("%s: option group must be a gc.dist group, got %s", where, type(g))
  end
  if g:rank() < 0 then
    raise("%s: rank %d is not in the group (world ranks %s)", where, dist.rank(),
          table.concat(g:ranks(), ", "))
  end
  return dist, g, g:size(), g:ranks()[1]
end

-- pcall(fn, ...) with its results packed. The error, re-raised as it is
-- (error(r[2], 0)), keeps the position where it was raised; the
-- interpreter then adds the one traceback.
function util.run (fn, ...)
  return table.pack(pcall(fn, ...))
end

return util
