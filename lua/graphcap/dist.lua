-- graphcap.dist: several processes on MPI (and NCCL on cuda), as gc.dist.
-- Launch with `mpirun -np N build/graphcap script.lua`; every rank runs the
-- script. Collectives run on the current stream like kernels and are
-- captured into graphs; root and peer are global ranks, as in
-- torch.distributed.

local core = require "graphcap.core"
local util = require "graphcap.util"
core._facade()

local getmetatable, type = getmetatable, type
_ENV = nil

local cdist = core._dist
local options, raise = util.options, util.raise
local GROUP = core._metatables.DistGroup

-- The group g of op (the option group, or barrier's argument): nil (the
-- world) or a gc.dist group, checked here so that the error names it.
local function group_of (op, g, what)
  if g ~= nil and getmetatable(g) ~= GROUP then
    raise("%s: %s must be a gc.dist group (gc.dist.new_group, gc.dist.world), got %s", op,
          what or "option group", type(g))
  end
  return g
end

local dist = {
  is_initialized = cdist.is_initialized,
  is_available = cdist.available,
  rank = cdist.rank,
  world_size = cdist.world_size,
  local_rank = cdist.local_rank,
  finalize = cdist.finalize,
  set_debug = cdist.set_debug,
  new_group = cdist.new_group,
}

local init_options = {}

-- gc.dist.init([opts]): MPI, ranks, one GPU per rank and its NCCL
-- communicator. An error when called twice.
function dist.init (opts)
  options("init", opts, init_options)
  cdist.init()
end

-- gc.dist.world() -> the group of every rank (one value, as torch's WORLD)
local world
function dist.world ()
  world = world or cdist.world()
  return world
end

-- gc.dist.barrier([group])
function dist.barrier (group)
  cdist.barrier(group_of("barrier", group, "group (argument #1)"))
end

-- gc.dist._any(flags [, group]) -> flags (booleans) or'd over the ranks,
-- exchanged on the host at once, also while capturing (gc.ddp's question:
-- which parameters got a grad on some rank)
function dist._any (flags, group)
  return cdist.any(flags, group_of("any", group, "group (argument #2)"))
end

local reduce_options = {op = true, group = true}
local group_options = {group = true}

-- The option table of collective op, each name in allowed, its group checked.
local function collective_options (op, opts, allowed)
  opts = options(op, opts, allowed)
  group_of(op, opts.group)
  return opts
end

-- gc.dist.all_reduce(t [, {op = "sum" | "avg" | "max", group = g}]), in place
function dist.all_reduce (t, opts)
  opts = collective_options("all_reduce", opts, reduce_options)
  cdist.all_reduce(t, opts.op or "sum", opts.group)
end

-- gc.dist.all_gather(out, t [, {group = g}]): out = every rank's t, rank-major
function dist.all_gather (out, t, opts)
  opts = collective_options("all_gather", opts, group_options)
  cdist.all_gather(out, t, opts.group)
end

-- gc.dist.reduce_scatter(out, t [, {op, group}]): out = the reduction of
-- this rank's chunk of every rank's t
function dist.reduce_scatter (out, t, opts)
  opts = collective_options("reduce_scatter", opts, reduce_options)
  cdist.reduce_scatter(out, t, opts.op or "sum", opts.group)
end

-- gc.dist.broadcast(t, root [, {group = g}]): t = root's t
function dist.broadcast (t, root, opts)
  opts = collective_options("broadcast", opts, group_options)
  cdist.broadcast(t, root, opts.group)
end

-- gc.dist.send(t, peer [, {group = g}]) and gc.dist.recv(t, peer [, {group = g}])
function dist.send (t, peer, opts)
  opts = collective_options("send", opts, group_options)
  cdist.send(t, peer, opts.group)
end

function dist.recv (t, peer, opts)
  opts = collective_options("recv", opts, group_options)
  cdist.recv(t, peer, opts.group)
end

return dist
