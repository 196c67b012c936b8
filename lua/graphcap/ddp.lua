-- graphcap.ddp: data parallel training (require "graphcap".ddp), as
-- PyTorch's DistributedDataParallel: every rank holds the whole model and a
-- part of the batch; after backward each parameter's grad is the average of
-- the ranks' grads.
--
--   local layers = gc.ddp.wrap({l1, l2, l3} [, {group = g}])
--
-- wraps each module in a DDP module (a bucket: the module's parameters)
-- whose forward runs the module on its input passed through a grad-sync
-- node. Backward reaches that node once the module's own backward is done,
-- its parameter grads accumulated; the node then all-reduces (average over
-- the group) each of them in place, while the layers before it still run
-- their backward. Graphed with make_graphed_callables (graph the wrappers),
-- the node runs inside the captured backward, so each callable's
-- all-reduces are recorded into its backward graph and run at each replay.
--
-- An input that needs no grad (the first layer's data) still gets its sync
-- node: the node then takes the module's first parameter as a second input,
-- so its output needs a grad and its backward runs; it gives no grad to
-- either. Wrapping broadcasts every parameter from the group's first rank,
-- so that all ranks start alike.

local core = require "graphcap.core"
local util = require "graphcap.util"
core._facade()

local ipairs, require, type = ipairs, require, type
_ENV = nil

local raise, options = util.raise, util.options
local nn = require "graphcap.nn"
local autograd = require "graphcap.autograd"

local ddp = {}

local DDP = nn.Module("DDP")

function DDP:init (module, group)
  self.module = module
  self._bucket = module:parameters()
  -- all-reduce (average) the bucket's grads over the group, in place
  local dist, opts, bucket = require("graphcap").dist, {op = "avg", group = group}, self._bucket
  self._sync = function ()
    for _, p in ipairs(bucket) do
      if p.grad ~= nil then dist.all_reduce(p.grad, opts) end
    end
  end
end

function DDP:forward (x, ...)
  local bucket = self._bucket
  if #bucket == 0 or not core.is_grad_enabled() then return self.module(x, ...) end
  local anchor = not x.requires_grad and bucket[1] or nil
  return self.module(autograd.on_backward("DDPGradSync", x, self._sync, anchor), ...)
end

local wrap_options = {group = true, broadcast = true}

-- ddp.wrap(modules [, {group = world, broadcast = true}]) -> a sequence of
-- DDP modules, one per module (or one DDP module for one module).
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
    out[i] = DDP(m, group)
  end
  return one and out[1] or out
end

return ddp
