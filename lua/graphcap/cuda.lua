-- graphcap.cuda (gc.cuda): CUDA kernels written in a Lua script, compiled
-- at run time with NVRTC and launched on tensors as custom ops: on the cuda
-- backend a kernel node (captured like any op), on the host backend the
-- kernel's Lua host twin in its place. NVRTC needs no GPU, so a kernel
-- compiles, and shows its compile errors, on both backends.

local core = require "graphcap.core"
local util = require "graphcap.util"

local getmetatable, ipairs, math, setmetatable, type =
      getmetatable, ipairs, math, setmetatable, type
_ENV = nil

core._facade()

local options, check, raise = util.options, util.check, util.raise
local tensor_mt = core._metatables.Tensor

local cuda = {}

local Kernel = {}
Kernel.__index = Kernel

local kernel_options = {host = true, options = true, signature = true}

-- gc.cuda.kernel(source, name [, {host = twin, options = {nvrtc options},
-- signature = {"ptr", "f32", ...}}]): compile the __global__ function
-- `name` (extern "C", or a C++ name expression) of `source`. Its parameter
-- types are the signature, or else read from its parameter list in the
-- source. twin(args...) runs on the host backend in the kernel's place with
-- the launch's arguments as the kernel sees them, now and at each replay.
function cuda.kernel (source, name, opts)
  check("gc.cuda.kernel", "source", source, "string")
  check("gc.cuda.kernel", "name", name, "string")
  opts = options("gc.cuda.kernel", opts, kernel_options)
  if opts.host ~= nil and type(opts.host) ~= "function" then
    raise("gc.cuda.kernel: option host must be a function (the host twin), got %s",
          type(opts.host))
  end
  local nv = opts.options or {}
  if type(nv) ~= "table" then
    raise("gc.cuda.kernel: option options must be a table of strings, got %s", type(nv))
  end
  local sig = opts.signature
  if sig ~= nil and type(sig) ~= "table" then
    raise("gc.cuda.kernel: option signature must be a table of type names, got %s", type(sig))
  end
  return setmetatable({name = name, host = opts.host,
                       _k = core.cuda_kernel(source, name, nv, sig)}, Kernel)
end

-- {x, y, z} from an integer or a table of 1 to 3 integers.
local function dims (where, what, v)
  if math.type(v) == "integer" then v = {v} end
  if type(v) ~= "table" or #v < 1 or #v > 3 then
    raise("%s: %s must be an integer or {x [, y [, z]]}, got %s", where, what,
          type(v) == "table" and "a table of " .. #v or math.type(v) or type(v))
  end
  local d, most = {1, 1, 1}, what == "block" and 1024 or 0x7fffffff
  for i = 1, #v do d[i] = check(where, what .. "[" .. i .. "]", v[i], "integer") end
  for i = 1, 3 do
    if d[i] < 1 or d[i] > most then
      raise("%s: %s sizes must be 1 to %d, got %d (entry %d)", where, what, most, d[i], i)
    end
  end
  return d
end

-- The tensors of option `what` (a sequence) of `where`.
local function tensors (where, what, v)
  if type(v) ~= "table" then raise("%s: %s must be a table of tensors, got %s", where, what,
                                   type(v)) end
  for i, t in ipairs(v) do
    if getmetatable(t) ~= tensor_mt then
      raise("%s: %s[%d] must be a tensor, got %s", where, what, i, type(t))
    end
  end
  return v
end

local launch_options = {grid = true, block = true, args = true, reads = true, writes = true,
                        shmem = true}

-- k:launch{grid =, block =, args = {tensors and numbers}, reads = {...},
-- writes = {...} [, shmem = bytes]}: on the current stream. Tensors are
-- passed as their device address, numbers converted to their parameters'
-- types (checked: integral and in range for an integer parameter).
-- writes names the tensors the kernel writes; reads defaults to the other
-- tensor arguments.
function Kernel:launch (t)
  if getmetatable(self) ~= Kernel then  -- k.launch{...}: self is the options
    raise("Kernel:launch: call it as k:launch{...}, got a %s for k", type(self))
  end
  local where = "kernel '" .. self.name .. "':launch"
  t = options(where, t, launch_options)
  local grid, block = dims(where, "grid", t.grid), dims(where, "block", t.block)
  local args = t.args or {}
  if type(args) ~= "table" then raise("%s: args must be a table, got %s", where, type(args)) end
  local packed = {n = #args}
  for i = 1, #args do
    local v = args[i]
    if getmetatable(v) ~= tensor_mt and type(v) ~= "number" then
      raise("%s: args[%d] must be a tensor or a number, got %s", where, i, type(v))
    end
    packed[i] = v
  end
  local writes = tensors(where, "writes", t.writes or {})
  local reads = t.reads
  if reads == nil then
    local written, seen = {}, {}
    for _, w in ipairs(writes) do written[w] = true end
    reads = {}
    for i = 1, #args do
      local v = args[i]
      if getmetatable(v) == tensor_mt and not written[v] and not seen[v] then
        seen[v] = true
        reads[#reads + 1] = v
      end
    end
  end
  reads = tensors(where, "reads", reads)
  local host = core.device() == "host"
  if host and self.host == nil then
    raise("%s: the host backend runs a kernel's host twin, and this one has none "
          .. "(gc.cuda.kernel's option host)", where)
  end
  local shmem = check(where, "shmem", t.shmem, "integer", 0)
  if shmem < 0 or shmem > 0xffffffff then  -- the driver takes an unsigned int
    raise("%s: shmem must be 0 to 2^32-1 bytes, got %d", where, shmem)
  end
  core.kernel_launch(self._k, grid, block, shmem, packed, reads, writes,
                     host and self.host or nil)
end

function Kernel:close () self._k:close() end
util.entries(Kernel)

return cuda
