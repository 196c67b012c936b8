-- graphcap.ddp: data parallel training (require "graphcap".ddp), as
-- PyTorch's DistributedDataParallel: every rank holds the whole model and a
-- part of the batch; after backward each parameter's grad is the average of
-- the ranks' grads.
--
--   local layers = gc.ddp.wrap({l1, l2, l3} [, {group = g}])
--
-- wraps each module in a DDP module whose forward runs the module on its
-- input passed through a grad-sync node. Backward reaches that node once the
-- module's own backward is done, its parameter grads accumulated; the node
-- then averages them over the group in buckets, while the layers before it
-- still run their backward. A bucket is a run of the module's parameters of
-- at most bucket_cap_mb MB (default 25, as torch's DDP; a larger parameter
-- is a bucket alone; 0: one bucket per parameter): its grads are joined into
-- one flat tensor, all-reduced (average) with one call, each grad then its
-- piece of it (a bucket of one grad is reduced in place).
-- The average is elementwise, so the grads are bit for bit those of one
-- all-reduce per parameter. A node on each output sets the grads already
-- there aside before the module's backward; after the sync they get the
-- averaged new ones added, so that accumulated backwards average only
-- their own grads, as graphed replays do (their static grads, added to
-- .grad after the replay). Graphed with make_graphed_callables (graph the
-- wrappers), the node runs inside the captured backward, so each callable's
-- all-reduces are recorded into its backward graph and run at each replay.
--
-- The grads of delayed-wgrad Linears come in backward_dw: the backward
-- sync leaves them out, and m:backward_dw() averages them after the
-- module's (make_graphed_callables runs the same around a replay of the
-- delayed-wgrad graph, m:_backward_dw_around).
--
-- An input that needs no grad (the first layer's data) still gets its sync
-- node: the node then takes the module's first parameter as a second input,
-- so its output needs a grad and its backward runs; it gives no grad to
-- either. Wrapping broadcasts every parameter from the group's first rank,
-- so that all ranks start alike.

local core = require "graphcap.core"
local util = require "graphcap.util"
core._facade()

local error, getmetatable, ipairs, math, pcall, require, table, tostring, type =
      error, getmetatable, ipairs, math, pcall, require, table, tostring, type
_ENV = nil

local raise, options = util.raise, util.options
local nn = require "graphcap.nn"
local autograd = require "graphcap.autograd"

local ddp = {}

local DDP = nn.Module("DDP")
local TENSOR = core._metatables.Tensor

local MAX_JOIN = 64  -- the most tensors gc.cat joins

-- The indices of ps in runs of one dtype (gc.cat joins one), of at most
-- cap bytes and MAX_JOIN tensors
local function buckets_of (ps, cap)
  local out, cur, bytes = {}, {}, 0
  for k, p in ipairs(ps) do
    local b = util.nbytes(p)
    if #cur > 0 and (bytes + b > cap or #cur == MAX_JOIN or p:dtype() ~= ps[cur[1]]:dtype()) then
      out[#out + 1], cur, bytes = cur, {}, 0
    end
    cur[#cur + 1], bytes = k, bytes + b
  end
  if #cur > 0 then out[#out + 1] = cur end
  return out
end

-- All-reduce (average) the grads of a bucket (indices of ps) over the
-- group: the grads of the parameters that have one on some rank (used[k])
-- joined into one flat tensor, zeros where this rank has none, one call;
-- each grad is then its piece of the flat tensor (one copy: the piece
-- becomes the grad, where copying it back into the old grad took two). A
-- parameter that gets its grad so (none here, one on another rank) keeps
-- it, unless it needs none here.
local function sync_bucket (gc, ps, bucket, used, opts)
  local gs, ks = {}, {}
  for _, k in ipairs(bucket) do
    if used[k] then
      local p = ps[k]
      local g = p.grad or gc.zeros(p:shape(), {dtype = p:dtype()})
      gs[#gs + 1], ks[#gs + 1] = g:view({g:numel()}), k
    end
  end
  if #gs == 1 then
    gc.dist.all_reduce(gs[1], opts)
  elseif #gs > 1 then
    local flat, at = gc.cat(gs), 1
    gc.dist.all_reduce(flat, opts)
    for j, g in ipairs(gs) do
      gs[j] = gc.narrow(flat, 1, at, g:numel())
      at = at + g:numel()
    end
  end
  for j, k in ipairs(ks) do  -- (a bucket of one reduced its grad in place: it stays)
    local p = ps[k]
    if (#gs > 1 and p.grad ~= nil) or (p.grad == nil and p.requires_grad) then
      p.grad = gs[j]:view(p:shape())
    end
  end
end

-- Average the grads of the parameters ps (in buckets) over the group, as
-- torch's DDP with find_unused_parameters: the ranks first tell each other
-- which parameters have a grad (on the host, so also while capturing); one
-- that none has keeps none, the others are reduced on every rank, this
-- rank's grad zero where it has none.
local function sync (gc, ps, buckets, opts)
  local has = {}
  for k, p in ipairs(ps) do has[k] = p.grad ~= nil end
  local used = gc.dist._any(has, opts.group)
  for _, b in ipairs(buckets) do sync_bucket(gc, ps, b, used, opts) end
end

-- The grads of ps set aside into held before a backward of the module
-- (once, at the first of its outputs that backward reaches), so that the
-- sync sees that backward's own grads.
local function set_aside (ps, held)
  if held.on then return end
  held.on = true
  for k, p in ipairs(ps) do
    held[k] = p.grad
    p.grad = nil
  end
end

-- After the sync: each grad set aside gets the averaged new one added in
-- place (as a graphed backward adds its averaged static grads).
local function add_back (gc, ps, held)
  if not held.on then return end
  held.on = false
  gc.no_grad(function ()
    for k, p in ipairs(ps) do
      local old, new = held[k], p.grad
      held[k] = nil
      if old ~= nil then
        if new ~= nil then old:copy_(old + new) end
        p.grad = old
      end
    end
  end)
end

-- The parameters (a set) of the delayed-wgrad Linears in m (m or below):
-- their grads come in backward_dw, not in backward.
local function delayed_of (m)
  local out, seen = {}, {}
  local function walk (d)
    if seen[d] then return end
    seen[d] = true
    local children = d:named_children()
    if #children == 0 and d:_has_delayed_wgrad() then
      for _, p in ipairs(d:parameters()) do out[p] = true end
    end
    for _, nc in ipairs(children) do walk(nc[2]) end
  end
  walk(m)
  return out
end

-- A set of parameters synced together (after backward, or after
-- backward_dw): the parameters, their buckets, the grads set aside.
local function part (ps, cap)
  return {ps = ps, buckets = buckets_of(ps, cap), held = {on = false}}
end

function DDP:init (module, group, cap)
  self.module = module
  self._params = module:parameters()
  local gc, opts, delayed, now, later = require "graphcap", {op = "avg", group = group},
                                          delayed_of(module), {}, {}
  for _, p in ipairs(self._params) do
    local to = delayed[p] and later or now
    to[#to + 1] = p
  end
  local bwd, dw = part(now, cap), part(later, cap)
  self._aside = function () set_aside(bwd.ps, bwd.held) end
  self._sync = function ()
    sync(gc, bwd.ps, bwd.buckets, opts)
    add_back(gc, bwd.ps, bwd.held)
  end
  -- the delayed wgrads: run() (eager, or a graphed replay) computes them
  self._dw = function (run)
    if #dw.ps == 0 then return run() end
    set_aside(dw.ps, dw.held)
    local ok, err = pcall(run)
    if ok then ok, err = pcall(sync, gc, dw.ps, dw.buckets, opts) end
    add_back(gc, dw.ps, dw.held)
    if not ok then error(err, 0) end
  end
end

-- m:backward_dw(): the delayed weight grads of the module's delayed-wgrad
-- Linears, averaged over the group as backward averages the others (each
-- call its own grads, then added to those before).
function DDP:backward_dw ()
  self._dw(function () self.module:backward_dw() end)
end

-- What make_graphed_callables runs around the replay of a DDP callable's
-- delayed-wgrad graph, run (TransformerEngine triggers its wgrad reduce
-- hooks so after the replay): the same sync as an eager backward_dw.
function DDP:_backward_dw_around (run)
  self._dw(run)
end

-- The outputs ..., each tensor that needs a grad passed through a node
-- whose backward sets the grads aside (fn).
local function aside_outputs (fn, ...)
  local r = table.pack(...)
  for i = 1, r.n do
    local y = r[i]
    if getmetatable(y) == TENSOR and y.requires_grad then
      r[i] = autograd.on_backward("DDPGradAside", y, fn)
    end
  end
  return table.unpack(r, 1, r.n)
end

function DDP:forward (x, ...)
  util.check_tensor("DDP", "input (argument #1)", x)
  local ps = self._params
  if #ps == 0 or not core.is_grad_enabled() then return self.module(x, ...) end
  local anchor = not x.requires_grad and ps[1] or nil
  return aside_outputs(self._aside,
                       self.module(autograd.on_backward("DDPGradSync", x, self._sync, anchor), ...))
end

local wrap_options = {group = true, broadcast = true, bucket_cap_mb = true}

-- ddp.wrap(modules [, {group = world, broadcast = true, bucket_cap_mb = 25}])
-- -> a sequence of DDP modules, one per module (or one DDP module for one
-- module).
function ddp.wrap (modules, opts)
  opts = options("ddp.wrap", opts, wrap_options)
  local gc = require "graphcap"
  local dist, group, _, root = util.dist_group("ddp.wrap", opts.group)
  local one = nn.is_module(modules)
  local list = one and {modules} or modules
  if type(list) ~= "table" or #list == 0 then
    raise("ddp.wrap: expected a module or a non-empty sequence of modules, got %s",
          type(modules))
  end
  local bcast = util.check("ddp.wrap", "broadcast", opts.broadcast, "boolean", true)
  local cap = util.check("ddp.wrap", "bucket_cap_mb", opts.bucket_cap_mb, "number", 25)
  if not (cap >= 0 and cap < math.huge) then
    raise("ddp.wrap: bucket_cap_mb must be a finite number >= 0, got %s", tostring(cap))
  end
  for i, m in ipairs(list) do  -- all checked before any parameter changes
    if not nn.is_module(m) then raise("ddp.wrap: entry %d is not a module", i) end
  end
  local out = {}
  for i, m in ipairs(list) do
    if bcast then
      gc.no_grad(function ()
        for _, p in ipairs(m:parameters()) do dist.broadcast(p, root, {group = group}) end
      end)
    end
    out[i] = DDP(m, group, cap * 1024 * 1024)
  end
  return one and out[1] or out
end

return ddp
