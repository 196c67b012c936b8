-- graphcap.fsdp: sharded parameters (require "graphcap".fsdp), as PyTorch's
-- FullyShardedDataParallel with one unit per module:
--
--   local F = gc.fsdp.shard({l1, l2, l3} [, {group = g}])
--   local opt = gc.optim.Adam(F:parameters())   -- the shards
--   local y = F.units[3](F.units[2](F.units[1](x)))
--   loss:backward(); F:finish_grads(); opt:step()
--
-- Each parameter p of a unit's module (n elements) is kept as its 1/N shard
-- (N ranks in the group): p flattened and padded with zeros to m elements,
-- m = n rounded up to a multiple of N, shard r holding elements r*m/N ..
-- (r+1)*m/N - 1, a leaf the optimizer steps on. p's own storage is freed:
-- p (the same tensor, so modules keep it) moves onto the FSDP's arena, one
-- buffer of the size of its largest unit that every unit's full parameters
-- share, each unit's at the same address every time (graphs that read them
-- stay valid). Un-shard all-gathers a unit's shards into the arena; the unit
-- then holds it until another unit un-shards (re-shard is implicit: one unit
-- un-sharded at a time, as PyTorch FSDP with limit_all_gathers and one unit
-- in flight). So a rank holds its shards plus the largest unit, not the
-- model. After a unit's backward its full grads are reduce-scattered
-- (averaged) into the shards' grads and dropped.
--
-- A unit's call runs: un-shard, the module, and two autograd nodes around
-- it: before the module's backward un-shard (again, when another unit used
-- the arena since), after it the grads' reduce-scatter (nodes, not module
-- hooks: a module's backward hook runs before its parameters' grads when its
-- input needs none).
--
-- Saved tensors: the module's backward reads the parameters its forward
-- saved, which the arena held at the version its forward saw. Gathering a
-- unit again writes the same values while its shards are unchanged, so the
-- arena then gets back the version of that unit's earlier gather and the
-- saved tensors pass autograd's version check. When the shards changed in
-- between (an optimizer step between a forward and its backward) or the
-- full values were written, the gather gives a new version and the backward
-- fails with "modified by an inplace operation" instead of giving wrong
-- grads. Each gather of new values takes a version far (2^32) from every
-- earlier one.
--
-- The modules themselves are guarded: a forward pre-hook on each (and on
-- each module with parameters inside it) refuses a direct call unless the
-- arena holds its unit's current parameters, naming the unit to call.
-- F:capture_time_hooks() lifts the guards (make_graphed_callables refuses
-- modules with hooks) until graphing runs its first hook or a unit is
-- called.
--
-- Graphing: graph the modules (F.modules) with
-- capture_time_hooks = F:capture_time_hooks(): un-shard before each forward
-- and backward capture (warmup passes alike; no reduce-scatter: the grads of
-- graphing are make_graphed_callables' own). Then call the units as before:
-- the same un-shard and reduce-scatter run around each replay.

local core = require "graphcap.core"
local util = require "graphcap.util"
core._facade()

local ipairs, math, require, setmetatable, tostring, type =
      ipairs, math, require, setmetatable, tostring, type
_ENV = nil

local raise, options = util.raise, util.options
local nn = require "graphcap.nn"
local autograd = require "graphcap.autograd"

local fsdp = {}

local FSDP = {}
FSDP.__index = FSDP

local FRESH = 1 << 32  -- the distance between the versions of two gathers

-- Are unit u's shards as they were at its last gather?
local function shards_kept (u)
  if not u.seen then return false end
  for k, s in ipairs(u.shards) do
    if s._version ~= u.seen[k] then return false end
  end
  return true
end

-- Gather unit i's parameters into the arena unless they are there.
function FSDP:unshard (i)
  local u, arena = self._u[i], self._arena
  if #u.params == 0 then return end
  local kept = shards_kept(u)
  if self._owner == i and kept and arena._version == u.version then return end
  local prev = self._u[self._owner]
  -- the unit leaving the arena: were its values still those of its gather?
  if prev then prev.clean = arena._version == prev.version end
  local dist, opts = self._dist, {group = self.group}
  self._gc.no_grad(function ()  -- a parameter's values, not an op of the model
    for k in ipairs(u.params) do dist.all_gather(u.full[k], u.shards[k], opts) end
  end)
  if kept and u.clean then
    core._set_version(arena, u.version)  -- the values its saved tensors hold
  else
    self._clock = (self._clock > arena._version and self._clock or arena._version) + FRESH
    core._set_version(arena, self._clock)
    u.version, u.seen = self._clock, {}
    for k, s in ipairs(u.shards) do u.seen[k] = s._version end
  end
  u.clean = true
  self._owner = i
end

-- Average unit i's full grads over the group into its shards' grads and
-- drop the full grads (closed: a box of one read before is closed too).
function FSDP:reduce_grads (i)
  local u = self._u[i]
  local gc, dist, opts = self._gc, self._dist, {op = "avg", group = self.group}
  for k, p in ipairs(u.params) do
    local g = p.grad
    if g ~= nil then
      local s = u.shards[k]
      local part, whole = gc.empty(s:shape(), {dtype = s:dtype()}), u.padded(k, g)
      dist.reduce_scatter(part, whole, opts)
      if whole ~= g then whole:close() end
      if s.grad then
        s.grad = s.grad + part
        part:close()
      else
        s.grad = part
      end
      -- freed now, not when Lua collects: one unit's full grads at a time
      p.grad = nil
      g:close()
    end
  end
end

-- F:finish_grads(): reduce-scatter the full grads that no unit's backward
-- reduced (a graphed unit whose sample input needed no grad: its graph
-- gives its input no grad, so the node after its backward never runs). Call
-- it after backward, before the optimizer step.
function FSDP:finish_grads ()
  for i in ipairs(self._u) do self:reduce_grads(i) end
end

local Unit = nn.Module("FSDPUnit")

function Unit:init (module) self.module = module end

function Unit:forward (x, ...)
  local F, i, m, u = self._fsdp, self._index, self.module, self._u
  util.check_tensor("FSDPUnit", "input (argument #1)", x)
  F:_guard()
  F:unshard(i)
  if not (core.is_grad_enabled() and m.training) then return m(x, ...) end
  -- before the module's backward (on its output) un-shard; after it (on its
  -- input) reduce-scatter the grads
  local anchor = not x.requires_grad and u.params[1] or nil
  local y = m(autograd.on_backward("FSDPPostBackward", x, u.post, anchor), ...)
  return autograd.on_backward("FSDPPreBackward", y, u.pre)
end

-- F:parameters() -> the shards, unit by unit (what the optimizer steps on)
function FSDP:parameters ()
  local out = {}
  for _, u in ipairs(self._u) do
    for _, s in ipairs(u.shards) do out[#out + 1] = s end
  end
  return out
end

-- The guard of unit i on module m (F.modules[i], or one of its modules
-- with parameters; 'path' names it): a forward pre-hook that refuses a call
-- while the arena does not hold unit i's current parameters (another
-- unit's, or values gathered before its shards changed).
function FSDP:_guard_hook (i, m, path)
  local u = self._u[i]
  return function ()
    if self._owner == i and shards_kept(u) then return end
    raise("fsdp: %s (%s) is called directly, but the parameters of unit %d are not gathered "
          .. "(%s): call the unit, F.units[%d], which gathers them", path, m:type(), i,
          self._owner ~= i
          and ("the arena holds unit " .. tostring(self._owner) .. "'s")
          or "its shards changed since they were gathered", i)
  end
end

-- Register the guards of every unit (F.modules[i] and each of its modules
-- that holds parameters), unless they are there.
function FSDP:_guard ()
  if self._guards then return end
  local gs = {}
  for i, u in ipairs(self._u) do
    local top = "F.modules[" .. i .. "]"
    local function walk (m, name)
      if #m:parameters() == 0 then return end
      local path = name and ("module '" .. name .. "' of " .. top) or top
      gs[#gs + 1] = m:register_forward_pre_hook(self:_guard_hook(i, m, path))
      for _, nc in ipairs(m:named_children()) do
        walk(nc[2], name and name .. "." .. nc[1] or nc[1])
      end
    end
    if #u.params > 0 then walk(self.modules[i]) end
  end
  self._guards = gs
end

-- Remove the guards (make_graphed_callables refuses modules with hooks).
function FSDP:_unguard ()
  for _, h in ipairs(self._guards or {}) do h:remove() end
  self._guards = nil
end

-- F:capture_time_hooks() -> the capture_time_hooks option for graphing
-- F.modules: un-shard before each forward and backward. The guards are
-- lifted until graphing runs its first hook (make_graphed_callables checks
-- that the modules have none before it starts) or a unit is called.
function FSDP:capture_time_hooks ()
  self:_unguard()
  local hooks = {}
  for i, _ in ipairs(self._u) do
    local unshard = function ()
      self:_guard()
      self:unshard(i)
    end
    hooks[i] = {forward_pre_hooks = {unshard}, backward_pre_hooks = {unshard}}
  end
  return hooks
end

-- F:memory() -> {shard_bytes, shard_grad_bytes, full_bytes, model_bytes}:
-- the bytes of the shards and their grads on this rank, of the arena (the
-- full parameters of one unit at a time), and of the whole model's
-- parameters
function FSDP:memory ()
  local r = {shard_bytes = 0, shard_grad_bytes = 0, model_bytes = 0,
             full_bytes = self._arena and util.nbytes(self._arena) or 0}
  for _, u in ipairs(self._u) do
    for k, p in ipairs(u.params) do
      local s = u.shards[k]
      r.shard_bytes = r.shard_bytes + util.nbytes(s)
      if s.grad then r.shard_grad_bytes = r.shard_grad_bytes + util.nbytes(s.grad) end
      r.model_bytes = r.model_bytes + util.nbytes(p)
    end
  end
  return r
end

local shard_options = {group = true}

-- t (n elements) flattened and padded with zeros to m elements
util.entries(FSDP)

local function pad (gc, t, n, m)
  local v = t:view({n})
  if m == n then return v end
  return gc.cat({v, gc.zeros({m - n}, {dtype = t:dtype()})})
end

-- fsdp.shard(modules [, {group = world}]) -> F: F.modules (the modules),
-- F.units (a unit module per module, to call in their place), F.group.
-- Every rank's parameters start as the group's first rank's.
function fsdp.shard (modules, opts)
  opts = options("fsdp.shard", opts, shard_options)
  local gc = require "graphcap"
  local dist, group, N, root = util.dist_group("fsdp.shard", opts.group)
  if type(modules) ~= "table" or #modules == 0 then
    raise("fsdp.shard: expected a non-empty sequence of modules, got %s", type(modules))
  end
  local owner, dtype = {}, nil  -- parameter -> {module index, name}: each is sharded once
  for i, m in ipairs(modules) do  -- all checked before any parameter changes
    if not nn.is_module(m) then raise("fsdp.shard: entry %d is not a module", i) end
    for _, np in ipairs(m:named_parameters()) do
      local o = owner[np[2]]
      if o ~= nil then
        raise("fsdp.shard: parameter '%s' of module %d (%s) is also parameter '%s' of module "
              .. "%d; a parameter can be in one unit only", np[1], i, tostring(m), o[2], o[1])
      end
      owner[np[2]] = {i, np[1]}
      dtype = dtype or np[2]:dtype()
      if np[2]:dtype() ~= dtype then  -- the units share one arena of one dtype
        raise("fsdp.shard: parameter '%s' of module %d (%s) is %s, the parameters before it %s; "
              .. "the units' parameters must have one dtype (convert with m:to)",
              np[1], i, tostring(m), np[2]:dtype(), dtype)
      end
    end
  end
  local F = setmetatable({modules = modules, units = {}, group = group, _u = {}, _dist = dist,
                          _gc = gc, _clock = 0}, FSDP)
  -- each unit's full parameters at offsets of the arena, each padded
  local size, layout = 0, {}
  for i, m in ipairs(modules) do
    local at, offs = 0, {}
    for k, p in ipairs(m:parameters()) do
      offs[k] = at
      at = at + (p:numel() + N - 1) // N * N
    end
    layout[i], size = offs, math.max(size, at)
  end
  F._arena = size > 0 and gc.empty({size}, {dtype = dtype}) or nil
  for i, m in ipairs(modules) do
    local u = {params = m:parameters(), shards = {}, full = {}, sizes = {}, clean = true}
    for k, p in ipairs(u.params) do
      local n = p:numel()
      local padded = (n + N - 1) // N * N
      u.sizes[k] = padded
      gc.no_grad(function ()
        dist.broadcast(p, root, {group = group})
        local s = gc.empty({padded // N}, {dtype = dtype})
        -- this rank's chunk: every rank holds the same p, so max is exact
        dist.reduce_scatter(s, pad(gc, p, n, padded), {op = "max", group = group})
        u.shards[k] = s:requires_grad_(true)
      end)
      u.full[k] = gc.empty({padded}, {dtype = dtype}):set_(F._arena, layout[i][k])
      p:set_(F._arena, layout[i][k])  -- its own storage is freed
    end
    u.padded = function (k, g) return pad(gc, g, g:numel(), u.sizes[k]) end
    u.post = function () F:reduce_grads(i) end
    u.pre = function () F:unshard(i) end
    F._u[i] = u
    local unit = Unit(m)
    unit._fsdp, unit._index, unit._u = F, i, u
    F.units[i] = unit
  end
  F:unshard(1)
  F:_guard()
  return F
end

return fsdp
