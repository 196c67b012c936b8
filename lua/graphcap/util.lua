-- graphcap.util: helpers shared by the facade's modules (option tables,
-- protected calls).

local error, math, pairs, pcall, string, table, tostring, type =
      error, math, pairs, pcall, string, table, tostring, type
_ENV = nil

local util = {}

util.none = {}  -- the options of a call given none (never written)

-- Check the options table 'opts' of 'where' against the names in 'known';
-- errors are raised at 'level' (as error's) of the function calling this.
function util.options (where, opts, known, level)
  if opts == nil then return util.none end
  if type(opts) ~= "table" then
    error(string.format("%s: options must be a table, got %s",
                        where, type(opts)), level + 1)
  end
  for k in pairs(opts) do
    if not known[k] then
      error(string.format("%s: unknown option '%s'", where, tostring(k)),
            level + 1)
    end
  end
  return opts
end

-- opts with each name of 'aliases' (another spelling, such as
-- TransformerEngine's) renamed to the name it stands for, in a new table
-- when there is one to rename; giving both spellings is an error, raised at
-- 'level' of the function calling this.
function util.aliases (where, opts, aliases, level)
  if type(opts) ~= "table" then return opts end
  local out = opts
  for alias, name in pairs(aliases) do
    if opts[alias] ~= nil then
      if opts[name] ~= nil then
        error(string.format("%s: options '%s' and '%s' are one option (%s is "
                            .. "TransformerEngine's name); give one of them",
                            where, name, alias, alias), level + 1)
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
-- when v is nil; errors are raised at 'level' of the function calling this.
function util.check (where, what, v, kind, default, level)
  if v == nil then
    if default == nil then
      error(string.format("%s: %s is required", where, what), level + 1)
    end
    return default
  end
  local ok
  if kind == "integer" then ok = math.type(v) == "integer"
  else ok = type(v) == kind end
  if not ok then
    error(string.format("%s: %s must be %s %s, got %s", where, what,
                        kind == "integer" and "an" or "a", kind,
                        math.type(v) or type(v)), level + 1)
  end
  return v
end

-- zero_grad([{set_to_none = true}]) over a C zero_grad(self, set_to_none),
-- for modules and optimizers alike.
local zero_grad_options = {set_to_none = true}
function util.zero_grad (czero)
  return function (self, opts)
    opts = util.options("zero_grad", opts, zero_grad_options, 2)
    return czero(self, util.check("zero_grad", "set_to_none", opts.set_to_none,
                                  "boolean", true, 2))
  end
end

-- pcall(fn, ...) with its results packed. The error, re-raised as it is
-- (error(r[2], 0)), keeps the position where it was raised; the
-- interpreter then adds the one traceback.
function util.run (fn, ...)
  return table.pack(pcall(fn, ...))
end

return util
