-- graphcap: the Lua facade (require "graphcap") over the C core
-- (graphcap.core). The core checks arguments, owns lifetimes and
-- translates errors; what can be Lua without cost to speed is here.

local core = require "graphcap.core"
local util = require "graphcap.util"
core._facade()

local error, getmetatable, ipairs, math, pairs, pcall, table, type =
      error, getmetatable, ipairs, math, pairs, pcall, table, type

local gc = {}

for k, v in pairs(core) do  -- the core's functions; its _fields stay there
  if k:sub(1, 1) ~= "_" then gc[k] = v end
end

gc._test = core._test  -- internal: hooks for the library's own tests only
gc.nn = require "graphcap.nn"
gc.optim = require "graphcap.optim"
gc.autograd = require "graphcap.autograd"
gc.pipeline = require "graphcap.pipeline"
gc.ddp = require "graphcap.ddp"
gc.fsdp = require "graphcap.fsdp"
gc.make_graphed_callables = require "graphcap.graphed"
gc.cuda = require "graphcap.cuda"
gc.dist = require "graphcap.dist"
require "graphcap.tensor_str"  -- tostring(t): the values, as PyTorch prints them
require "graphcap.checkpoint"  -- state_dict and load_state_dict of modules and optimizers
local safetensors = require "graphcap.safetensors"
-- gc.save(path, tensors [, metadata]), gc.load(path) -> tensors,
-- gc.load_metadata(path) -> metadata: safetensors files
gc.save, gc.load, gc.load_metadata = safetensors.save, safetensors.load, safetensors.load_metadata
gc.fp8 = require "graphcap.fp8"
-- gc.random.RNGStatesTracker(), and the state of the generator in use
gc.random = require "graphcap.random"
gc.get_rng_state, gc.set_rng_state = gc.random.get_rng_state, gc.random.set_rng_state
-- gc.checkpoint(fn, ...): activations recomputed in backward
gc.checkpoint = require "graphcap.recompute"
-- gc.trace.start(path), gc.trace.stop(): Chrome trace-event JSON of warmup,
-- captures, capture-time hooks and replays (open it in Perfetto)
gc.trace = {start = core.trace_start, stop = core.trace_stop}
gc.trace_start, gc.trace_stop = nil, nil
_ENV = nil

local options, check, run, raise = util.options, util.check, util.run, util.raise
local mts = core._metatables

-- Check that v (argument or option 'what' of 'where') is nil (when
-- optional) or an object of class 'class' ("Tensor", "Stream", ...); the
-- error names the user's line.
local function check_object (where, what, v, class, optional)
  if (v == nil and optional) or getmetatable(v) == mts[class] then return v end
  local got = type(v)
  if type(v) == "userdata" and getmetatable(v) then got = getmetatable(v).__name or got end
  raise("%s: %s must be a %s, got %s", where, what, class, got)
end


-- Tensor constructors: the last argument is nil, a dtype name or
-- {dtype = "f32" | "bf16", requires_grad = bool}.

local tensor_options = {dtype = true, requires_grad = true}

-- The dtype and requires_grad of the options of 'where'.
local function tensor_opts (where, opts)
  if opts == nil or type(opts) == "string" then return opts, false end
  options(where, opts, tensor_options)
  return opts.dtype, check(where, "requires_grad", opts.requires_grad,
                           "boolean", false)
end

local function leaf (t, requires_grad)
  if requires_grad then t:requires_grad_(true) end
  return t
end

function gc.tensor (data, opts)
  local dt, rg = tensor_opts("tensor", opts)
  return leaf(core.tensor(data, dt), rg)
end

-- The shape and options of factory 'where': a table of sizes then the
-- options (gc.zeros({2, 3}, opts)), or the sizes as arguments then the
-- options (gc.zeros(2, 3, opts), PyTorch's torch.zeros(2, 3)).
local function shape_args (where, ...)
  local a = table.pack(...)
  if type(a[1]) ~= "number" then
    if type(a[1]) ~= "table" then
      raise("%s: shape must be a table of sizes, or the sizes as arguments "
            .. "(gc.%s({2, 3}) or gc.%s(2, 3)), got %s", where, where, where, type(a[1]))
    end
    if a.n > 2 then raise("%s: expected (shape [, opts]), got %d arguments", where, a.n) end
    return a[1], a[2]
  end
  local shape, i = {}, 1
  while i <= a.n and type(a[i]) == "number" do
    shape[i] = a[i]
    i = i + 1
  end
  local opts = a[i]
  if type(opts) == "table" and opts[1] ~= nil then
    raise("%s: give the shape as one table or as sizes, not both (argument #%d is a table of "
          .. "sizes)", where, i)
  end
  if a.n > i then
    raise("%s: expected (size, ... [, opts]), got argument #%d (%s) after the options", where,
          i + 1, math.type(a[i + 1]) or type(a[i + 1]))
  end
  return shape, opts
end

-- gc.empty/zeros/ones/rand/randn(shape [, opts]) or (size1, size2, ... [, opts])
for _, name in ipairs({"empty", "zeros", "ones", "rand", "randn"}) do
  local make = core[name]
  gc[name] = function (...)
    local shape, opts = shape_args(name, ...)
    local dt, rg = tensor_opts(name, opts)
    return leaf(make(shape, dt), rg)
  end
end

-- gc.full(shape, v [, opts]): the shape is one table, as torch.full's size
-- is one tuple, so that a size and the fill value never mix.
function gc.full (shape, v, opts)
  if type(shape) == "number" then
    raise("full: the shape is one table of sizes (torch.full's size), as in "
          .. "gc.full({2, 3}, v); got a number first")
  end
  local dt, rg = tensor_opts("full", opts)
  return leaf(core.full(shape, v, dt), rg)
end


-- gc.frombytes(s, shape [, opts]): a new tensor whose elements are the raw
-- bytes of the string s, as t:tobytes() gives them (little-endian, 4 bytes
-- an element in f32, 2 in bf16).
function gc.frombytes (s, shape, opts)
  local dt, rg = tensor_opts("frombytes", opts)
  if type(s) ~= "string" then raise("frombytes: s must be a string, got %s", type(s)) end
  local t = core.empty(shape, dt)
  local n = util.nbytes(t)
  if #s ~= n then
    raise("frombytes: %d bytes, but a tensor of %d %s elements holds %d", #s, t:numel(),
          t:dtype(), n)
  end
  return leaf(t:_write_bytes(s), rg)
end


-- Autograd

local Tensor = core._metatables.Tensor.__methods
local backward = Tensor.backward
local backward_options = {retain_graph = true}

-- t:backward([grad [, {retain_graph = false}]]); t:backward(opts) also
-- works when there is no grad to give.
function Tensor.backward (self, grad, opts)
  if getmetatable(self) ~= mts.Tensor then  -- t.backward(): no t
    raise("backward: call it as t:backward(), got a %s for t", type(self))
  end
  if opts == nil and type(grad) == "table" then grad, opts = nil, grad end
  opts = options("backward", opts, backward_options)
  check_object("backward", "grad", grad, "Tensor", true)
  return backward(self, grad, check("backward", "retain_graph",
                                    opts.retain_graph, "boolean", false))
end

-- t:to(dtype), t:float(), t:bfloat16(): t itself when it has that dtype,
-- else a converted copy whose grad flows back to t converted, as PyTorch's
-- (logits:float() before a loss, say).
function Tensor.to (self, dtype)
  check_object("to", "t", self, "Tensor")
  if dtype ~= "f32" and dtype ~= "bf16" then
    raise("to: dtype must be \"f32\" or \"bf16\", got %s", dtype)
  end
  if self:dtype() == dtype then return self end
  return core.empty(self:size(), dtype):copy_(self)
end
function Tensor.float (self) return Tensor.to(self, "f32") end
function Tensor.bfloat16 (self) return Tensor.to(self, "bf16") end

-- Run fn(...) with grad recording set to 'on' and return its results;
-- the previous setting comes back, also when fn raises.
local function with_grad (where, on, fn, ...)
  if type(fn) ~= "function" then
    raise("%s: fn must be a function, got %s", where, type(fn))
  end
  local prev = core.set_grad_enabled(on)
  local r = run(fn, ...)
  core.set_grad_enabled(prev)
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

-- gc.no_grad(fn, ...): fn(...) without recording autograd
function gc.no_grad (fn, ...) return with_grad("no_grad", false, fn, ...) end

-- gc.enable_grad(fn, ...): fn(...) recording autograd (inside no_grad)
function gc.enable_grad (fn, ...)
  return with_grad("enable_grad", true, fn, ...)
end


-- gc.Event([{external = false}]): an external event recorded inside a
-- capture is a node of the graph, recorded at each replay (PyTorch's
-- Event(external=True)), as a graphed call's cuda_graph_event is.
local event_options = {external = true}
function gc.Event (opts)
  opts = options("Event", opts, event_options)
  return core.Event(check("Event", "external", opts.external, "boolean", false))
end


-- gc.with_stream(s, fn, ...): run fn(...) with s as the current stream and
-- return fn's results; the previous current stream comes back, also when
-- fn raises.
function gc.with_stream (s, fn, ...)
  check_object("with_stream", "s", s, "Stream")
  if type(fn) ~= "function" then
    raise("with_stream: fn must be a function, got %s", type(fn))
  end
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
-- fn's error, as raised, wins over capture_end's.
function Graph:capture (fn, opts)
  opts = options("Graph:capture", opts, capture_options)
  if type(fn) ~= "function" then
    raise("Graph:capture: fn must be a function, got %s", type(fn))
  end
  check_object("Graph:capture", "option pool", opts.pool, "Pool", true)
  check_object("Graph:capture", "option stream", opts.stream, "Stream", true)
  if opts.name ~= nil then self:set_name(opts.name) end
  self:capture_begin(opts.pool, opts.stream)
  local r = run(fn)
  local ok, err = pcall(self.capture_end, self)
  if not r[1] then
    if ok then self:reset() end
    error(r[2], 0)
  end
  if not ok then error(err, 0) end  -- it names the user's line already
  return table.unpack(r, 2, r.n)
end

-- The facade's functions and the Lua methods of the core's objects are
-- entered through C, so that a script's tail call into them keeps its frame
-- and their errors name its line (util.entries).
for _, t in ipairs({gc, gc.nn, gc.optim, gc.optim.lr_scheduler, gc.autograd, gc.pipeline, gc.ddp,
                    gc.fsdp, gc.cuda, gc.dist, gc.fp8, gc.random}) do
  util.entries(t)
end
for _, mt in pairs(mts) do
  local methods = mt.__methods or mt.__index
  if type(methods) == "table" then util.entries(methods) end
end

return gc
