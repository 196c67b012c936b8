-- graphcap.recompute: gc.checkpoint(fn, ...), activation checkpointing as
-- torch.utils.checkpoint (reentrant) and TransformerEngine's and Megatron's
-- checkpoint. The forward runs fn without recording, keeping only its
-- tensor arguments; the backward runs fn again, recording, with every
-- generator's state as the forward found it (the default generator's and
-- each tracked state's: dropout draws the same masks), backpropagates
-- through it, and puts the generators back where the recomputation found
-- them. The states are saved and restored by copies on the device, so a
-- graphed callable that checkpoints replays the same work.

local core = require "graphcap.core"
local util = require "graphcap.util"
local random = require "graphcap.random"

local error, getmetatable, ipairs, table, type =
      error, getmetatable, ipairs, table, type
_ENV = nil

core._facade()

local raise, run = util.raise, util.run
local R = core._random
local TENSOR = core._metatables.Tensor
local MODULE = core._metatables.Module

local function typename (v)
  local mt = getmetatable(v)
  return type(v) == "userdata" and mt and mt.__name or type(v)
end

local function callable (fn)
  local mt = getmetatable(fn)
  return type(fn) == "function" or (type(mt) == "table" and mt.__call ~= nil)
end

-- fn(...) under the states `states` of the generators `gens`, recording;
-- the generators are put back as they were, also when fn raises.
local function recompute (gens, states, fn, args)
  local now = {}
  for i, g in ipairs(gens) do now[i] = R.save(g) end
  for i, g in ipairs(gens) do R.restore(g, states[i]) end
  local prev = core.set_grad_enabled(true)
  local r = run(fn, table.unpack(args, 1, args.n))
  core.set_grad_enabled(prev)
  for i, g in ipairs(gens) do R.restore(g, now[i]) end
  if not r[1] then error(r[2], 0) end
  return r[2]
end

-- The node's backward: fn again on leaves sharing the inputs' storage, its
-- output's grad backpropagated (parameters fn uses get theirs in .grad, as
-- a reentrant checkpoint gives them), the leaves' grads the node's.
local function backward (c, g)
  local args, leaves = {n = c.args.n}, {}
  for i = 1, c.args.n do
    local a = c.args[i]
    if getmetatable(a) == TENSOR then
      a = a:detach()
      if c.args[i].requires_grad then a:requires_grad_(true) end
      leaves[i] = a
    end
    args[i] = a
  end
  local y = recompute(c.gens, c.states, c.fn, args)
  if y.requires_grad then y:backward(g) end
  local grads = {}
  for i = 1, c.nin do grads[i] = leaves[i] and leaves[i].requires_grad and leaves[i].grad or nil end
  return grads
end

-- A tensor that makes the node record when no argument requires grad, so
-- that a module's parameters get their grads: its first trainable one.
local function module_anchor (fn)
  if getmetatable(fn) ~= MODULE then return nil end
  for _, p in ipairs(fn:parameters()) do
    if p.requires_grad then return core._anchor(p) end
  end
  return nil
end

-- gc.checkpoint(fn, ...) -> fn(...)'s one tensor, whose backward recomputes
-- fn. Without grad recording it is fn(...).
local function checkpoint (fn, ...)
  if not callable(fn) then
    raise("checkpoint: fn must be a function or a module, got %s", typename(fn))
  end
  if not core.is_grad_enabled() then return fn(...) end
  local args, inputs, saved, any = table.pack(...), {}, {}, false
  for i = 1, args.n do
    local a = args[i]
    if getmetatable(a) == TENSOR then
      inputs[i], saved[#saved + 1] = a, a
      any = any or a.requires_grad
    end
  end
  local anchor = not any and module_anchor(fn) or nil
  if not any and anchor == nil then
    raise("checkpoint: no tensor argument requires grad, so backward would never recompute fn "
          .. "and the parameters it uses would get no grad; pass an input that requires grad "
          .. "(or a module as fn), or call fn directly when it has no parameters")
  end
  local gens, states = random._generators(), {}
  for i, g in ipairs(gens) do states[i] = R.save(g) end
  local prev = core.set_grad_enabled(false)
  local r = run(fn, ...)
  core.set_grad_enabled(prev)
  if not r[1] then error(r[2], 0) end
  if r.n ~= 2 or getmetatable(r[2]) ~= TENSOR then
    raise("checkpoint: fn must return one tensor, got %s",
          r.n ~= 2 and (r.n - 1) .. " values" or typename(r[2]))
  end
  local c = {fn = fn, args = args, gens = gens, states = states, nin = args.n}
  if anchor ~= nil then inputs[args.n + 1] = anchor end
  local nin = anchor ~= nil and args.n + 1 or args.n
  return core._fn_record("checkpoint", r[2], nin, inputs, saved,
                         function (g) return backward(c, g) end)
end

return util.entry(function (fn, ...) return checkpoint(fn, ...) end)
