-- graphcap: the Lua facade (require "graphcap") over the C core
-- (graphcap.core). The core checks arguments, owns lifetimes and
-- translates errors; what can be Lua without cost to speed is here.

local core = require "graphcap.core"

local debug, error, pairs, pcall, string, table, tostring, type, xpcall =
      debug, error, pairs, pcall, string, table, tostring, type, xpcall
_ENV = nil

local gc = {}

for k, v in pairs(core) do  -- the core's functions; its _fields stay there
  if k:sub(1, 1) ~= "_" then gc[k] = v end
end

local none = {}  -- the options of a call given none (never written)

-- Check the options table 'opts' of 'where' against the names in 'known';
-- errors are raised at 'level' (as error's) of the function calling this.
local function options (where, opts, known, level)
  if opts == nil then return none end
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

-- Append a traceback to an error message unless it has one (from a nested
-- capture); called where the error was raised, it shows the whole stack.
local function traceback (msg)
  if type(msg) == "string" and not msg:find("\nstack traceback:\n", 1, true) then
    return debug.traceback(msg, 2)
  end
  return msg
end

-- xpcall(fn, traceback, ...) with its results packed.
local function run (fn, ...)
  return table.pack(xpcall(fn, traceback, ...))
end


-- Tensor constructors: the last argument is nil, a dtype name or
-- {dtype = "f32" | "bf16", requires_grad = bool}.

local tensor_options = {dtype = true, requires_grad = true}

local function dtype (where, opts)
  if opts == nil or type(opts) == "string" then return opts end
  options(where, opts, tensor_options, 3)
  if opts.requires_grad then
    error(where .. ": requires_grad is not supported by the binding yet", 3)
  end
  return opts.dtype
end

function gc.tensor (data, opts) return core.tensor(data, dtype("tensor", opts)) end
function gc.empty (shape, opts) return core.empty(shape, dtype("empty", opts)) end
function gc.zeros (shape, opts) return core.zeros(shape, dtype("zeros", opts)) end
function gc.ones (shape, opts) return core.ones(shape, dtype("ones", opts)) end
function gc.rand (shape, opts) return core.rand(shape, dtype("rand", opts)) end
function gc.randn (shape, opts) return core.randn(shape, dtype("randn", opts)) end

function gc.full (shape, v, opts)
  return core.full(shape, v, dtype("full", opts))
end


-- gc.with_stream(s, fn, ...): run fn(...) with s as the current stream and
-- return fn's results; the previous current stream comes back, also when
-- fn raises.
function gc.with_stream (s, fn, ...)
  local prev = core.current_stream()
  core.set_current_stream(s)
  local r = run(fn, ...)
  core.set_current_stream(prev)
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end


local Graph = core._metatables.Graph.__index
local capture_options = {pool = true, stream = true, name = true}

-- g:capture(fn [, {pool = p, stream = s, name = str}]): capture the work fn
-- launches into g and return fn's results. The capture always ends, also
-- when fn raises; then g is reset (it would hold part of fn's work) and
-- fn's error, with the traceback of where it was raised, wins over
-- capture_end's.
function Graph:capture (fn, opts)
  opts = options("Graph:capture", opts, capture_options, 2)
  if type(fn) ~= "function" then
    error("Graph:capture: fn must be a function, got " .. type(fn), 2)
  end
  if opts.name ~= nil then self:set_name(opts.name) end
  self:capture_begin(opts.pool, opts.stream)
  local r = run(fn)
  local ok, err = pcall(self.capture_end, self)
  if not r[1] then
    if ok then self:reset() end
    error(r[2], 0)
  end
  if not ok then error(err, 2) end
  return table.unpack(r, 2, r.n)
end


return gc
