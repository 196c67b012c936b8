-- graphcap.fsdp: sharded parameters (require "graphcap".fsdp), as PyTorch's
-- FullyShardedDataParallel with one unit per module:
--
--   local F = gc.fsdp.shard({l1, l2, l3} [, {group = g}])
--   local opt = gc.optim.Adam(F:parameters())   -- the shards
--   local y = F.units[3](F.units[2](F.units[1](x)))
--   loss:backward(); F:finish_grads(); opt:step()
--
-- Each parameter p of a unit's module is kept as its 1/N shard (N ranks in
-- the group; shard r holds elements r*n/N .. (r+1)*n/N - 1 of p flattened,
-- so n must be a multiple of N), a leaf the optimizer steps on. p itself is
-- the full buffer: un-shard all-gathers the shards into it (its address
-- never changes, so graphs that read it stay valid), re-shard drops its
-- values (the next un-shard gathers again). After a unit's backward its full
-- grads are reduce-scattered (averaged) into the shards' grads and dropped.
--
-- A unit's call runs: un-shard, the module, and two autograd nodes around
-- it: before the module's backward un-shard, after it the grads'
-- reduce-scatter and re-shard (nodes, not module hooks: a module's backward
-- hook runs before its parameters' grads when its input needs none). The
-- full values stay until every forward of the unit has had its backward
-- (microbatches in flight keep them: their backward reads them).
--
-- Graphing: graph the modules (F.modules) with
-- capture_time_hooks = F:capture_time_hooks(): un-shard before each forward
-- and backward capture, re-shard once every forward has had its backward
-- (warmup passes alike; no reduce-scatter: the grads of graphing are
-- make_graphed_callables' own). Then call the units
-- as before: the same un-shard, reduce-scatter and re-shard run around each
-- replay.

local core = require "graphcap.core"
local util = require "graphcap.util"
core._facade()

local ipairs, require, setmetatable, tostring, type =
      ipairs, require, setmetatable, tostring, type
_ENV = nil

local raise, options = util.raise, util.options
local nn = require "graphcap.nn"
local autograd = require "graphcap.autograd"

local fsdp = {}

local FSDP = {}
FSDP.__index = FSDP

-- Gather unit i's parameters unless their full values are there.
function FSDP:unshard (i)
  local u = self._u[i]
  if u.full then return end
  local dist, opts = self._dist, {group = self.group}
  self._gc.no_grad(function ()  -- a parameter's values, not an op of the model
    for k in ipairs(u.params) do dist.all_gather(u.flat[k], u.shards[k], opts) end
  end)
  u.full = true
end

-- Drop unit i's full values (kept in place: graphs hold their address).
function FSDP:reshard (i)
  self._u[i].full = false
end

-- Average unit i's full grads over the group into its shards' grads and
-- drop the full grads.
function FSDP:reduce_grads (i)
  local u = self._u[i]
  local dist, opts = self._dist, {op = "avg", group = self.group}
  for k, p in ipairs(u.params) do
    local g = p.grad
    if g ~= nil then
      local s = u.shards[k]
      local part = self._gc.empty(s:shape())
      dist.reduce_scatter(part, g:view({g:numel()}), opts)
      s.grad = s.grad and s.grad + part or part
      p.grad = nil
    end
  end
end

-- F:finish_grads(): reduce-scatter the full grads that no unit's backward
-- reduced (a graphed unit whose sample input needed no grad: its graph
-- gives its input no grad, so the node after its backward never runs) and
-- re-shard every unit. Call it after backward, before the optimizer step.
function FSDP:finish_grads ()
  for i, u in ipairs(self._u) do
    self:reduce_grads(i)
    u.pending = 0
    self:reshard(i)
  end
end

-- A forward of unit i that will have a backward starts / its backward ends.
local function begin_fwd (self, i) self._u[i].pending = self._u[i].pending + 1 end
local function end_bwd (self, i)
  local u = self._u[i]
  u.pending = u.pending - 1
  if u.pending <= 0 then
    u.pending = 0
    self:reshard(i)
  end
end

local Unit = nn.Module("FSDPUnit")

function Unit:init (module) self.module = module end

function Unit:forward (x, ...)
  local F, i, m = self._fsdp, self._index, self.module
  F:unshard(i)
  if not (core.is_grad_enabled() and m.training) then
    local y = m(x, ...)
    if self._u.pending == 0 then F:reshard(i) end
    return y
  end
  begin_fwd(F, i)
  local u = self._u
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

-- F:capture_time_hooks() -> the capture_time_hooks option for graphing
-- F.modules: un-shard before each forward and backward, re-shard once every
-- forward of a module has had its backward.
function FSDP:capture_time_hooks ()
  local hooks = {}
  for i, _ in ipairs(self._u) do
    hooks[i] = {
      forward_pre_hooks = {function (m)
        self:unshard(i)
        if m.training then begin_fwd(self, i) end
      end},
      backward_pre_hooks = {function () self:unshard(i) end},
      backward_hooks = {function () end_bwd(self, i) end},
    }
  end
  return hooks
end

-- F:memory() -> {shard_bytes, shard_grad_bytes, full_bytes}: the bytes of
-- the shards and their grads on this rank, and of the full buffers
function FSDP:memory ()
  local r = {shard_bytes = 0, shard_grad_bytes = 0, full_bytes = 0}
  for _, u in ipairs(self._u) do
    for k, p in ipairs(u.params) do
      local s = u.shards[k]
      r.shard_bytes = r.shard_bytes + 4 * s:numel()
      if s.grad then r.shard_grad_bytes = r.shard_grad_bytes + 4 * s.grad:numel() end
      r.full_bytes = r.full_bytes + 4 * p:numel()
    end
  end
  return r
end

local shard_options = {group = true}

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
  for i, m in ipairs(modules) do  -- all checked before any parameter changes
    if not nn.is_module(m) then raise("fsdp.shard: entry %d is not a module", i) end
    for _, np in ipairs(m:named_parameters()) do
      if np[2]:numel() % N ~= 0 then
        raise("fsdp.shard: parameter '%s' of module %d (%s) has %d elements, not a multiple of "
              .. "the %d ranks", np[1], i, tostring(m), np[2]:numel(), N)
      end
    end
  end
  local F = setmetatable({modules = modules, units = {}, group = group, _u = {}, _dist = dist,
                          _gc = gc}, FSDP)
  for i, m in ipairs(modules) do
    local u = {params = m:parameters(), shards = {}, flat = {}, full = true, pending = 0}
    for k, p in ipairs(u.params) do
      local n = p:numel()
      u.flat[k] = p:view({n})
      gc.no_grad(function ()
        dist.broadcast(p, root, {group = group})
        local s = gc.empty({n // N})
        -- this rank's chunk: every rank holds the same p, so max is exact
        dist.reduce_scatter(s, u.flat[k], {op = "max", group = group})
        u.shards[k] = s:requires_grad_(true)
      end)
    end
    u.post = function () F:reduce_grads(i); end_bwd(F, i) end
    u.pre = function () F:unshard(i) end
    F._u[i] = u
    local unit = Unit(m)
    unit._fsdp, unit._index, unit._u = F, i, u
    F.units[i] = unit
  end
  return F
end

return fsdp
