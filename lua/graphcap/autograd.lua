-- graphcap.autograd: gc.autograd.Function, ops with a backward of their
-- own, as PyTorch's torch.autograd.Function:
--
--   local Sq = gc.autograd.Function("ScaledSquare")
--   function Sq.forward (ctx, x, s) ctx:save_for_backward(x); ctx.s = s; return x * x * s end
--   function Sq.backward (ctx, g) local x = ctx.saved_tensors[1]; return g * x * (2 * ctx.s), nil end
--   local y = Sq.apply(x, 3)
--
-- forward runs with recording off; when grad is enabled and a tensor
-- argument requires grad, its output (one tensor) becomes the output of a
-- node named after the Function, whose backward calls backward(ctx, grad),
-- which returns one grad (a tensor of the input's shape and dtype, or nil)
-- per argument of forward. Both are composed of graphcap ops, so a
-- capture (make_graphed_callables included) records what they launch.

local core = require "graphcap.core"
local util = require "graphcap.util"

local error, getmetatable, select, setmetatable, table, type =
      error, getmetatable, select, setmetatable, table, type
_ENV = nil

core._facade()

local raise, run = util.raise, util.run
local TENSOR = core._metatables.Tensor

local function typename (v)
  local mt = getmetatable(v)
  return type(v) == "userdata" and mt and mt.__name or type(v)
end

-- The ctx of one application: fields the user sets, needs_input_grad
-- (a boolean per argument of forward), saved_tensors (during backward).
local Ctx = {}
Ctx.__index = Ctx

-- ctx:save_for_backward(t...): tensors backward reads as ctx.saved_tensors,
-- checked then not to have been modified in place since.
function Ctx:save_for_backward (...)
  if not self._forward then
    raise("save_for_backward: only inside %s.forward", self._fn.name)
  end
  local n = select("#", ...)
  local t = {}
  for i = 1, n do
    local v = select(i, ...)
    if getmetatable(v) ~= TENSOR then
      raise("save_for_backward: argument #%d must be a Tensor, got %s", i, typename(v))
    end
    t[i] = v
  end
  self._to_save = t
end

util.entries(Ctx)

-- backward(ctx, grad) with the saved tensors, its grads checked.
local function run_backward (fn, ctx, n, g, saved)
  ctx.saved_tensors = saved
  local r = run(fn.backward, ctx, g)
  ctx.saved_tensors = nil
  if not r[1] then error(r[2], 0) end
  if r.n - 1 ~= n then
    raise("%s.backward returned %d value(s); expected %d (a grad or nil per argument of forward)",
          fn.name, r.n - 1, n)
  end
  local grads = {}
  for i = 1, n do
    local v = r[i + 1]
    if v ~= nil and getmetatable(v) ~= TENSOR then
      raise("%s.backward: grad #%d must be a Tensor or nil, got %s", fn.name, i, typename(v))
    end
    grads[i] = v
  end
  return grads
end

-- fn.apply(...): forward without recording, then the node.
local function apply (fn, ...)
  local n = select("#", ...)
  local args = table.pack(...)
  if type(fn.forward) ~= "function" or type(fn.backward) ~= "function" then
    raise("%s.apply: the Function needs forward and backward functions", fn.name)
  end
  local grad, needs, inputs, any = core.is_grad_enabled(), {}, {}, false
  for i = 1, n do
    local a = args[i]
    if getmetatable(a) == TENSOR then inputs[i] = a end
    needs[i] = grad and inputs[i] ~= nil and a.requires_grad or false
    any = any or needs[i]
  end
  local ctx = setmetatable({needs_input_grad = needs, _fn = fn, _forward = true}, Ctx)
  local prev = core.set_grad_enabled(false)
  local r = run(fn.forward, ctx, ...)
  core.set_grad_enabled(prev)
  ctx._forward = nil
  if not r[1] then error(r[2], 0) end
  local out = r[2]
  if r.n ~= 2 or getmetatable(out) ~= TENSOR then
    raise("%s.forward must return one Tensor, got %s", fn.name,
          r.n ~= 2 and (r.n - 1) .. " values" or typename(out))
  end
  local saved = ctx._to_save or {}
  ctx._to_save = nil
  if not any then return out end
  return core._fn_record(fn.name, out, n, inputs, saved,
                         function (g, s) return run_backward(fn, ctx, n, g, s) end)
end

local autograd = {}

-- gc.autograd.Function(name): a new Function; set its forward and backward.
function autograd.Function (name)
  if type(name) ~= "string" then
    raise("autograd.Function: name must be a string, got %s", typename(name))
  end
  if #name < 1 or #name > 63 or name:find("\0", 1, true) then -- it is its node's grad_fn
    raise("autograd.Function: name must be 1 to 63 bytes without a zero byte, got %d bytes", #name)
  end
  local fn = {name = name}
  fn.apply = util.entry(function (...) return apply(fn, ...) end)
  return fn
end

-- The names on_backward took (each checked once, as a Function's).
local node_names = {}
local NO_GRADS = {}  -- the backward of a node whose x needs no grad (never written)

-- autograd.on_backward(name, x, fn [, anchor]) -> y, x's values as a node
-- named 'name': when backward reaches it (after the backward of everything
-- computed from y), it runs fn() and passes y's grad on to x. anchor, a
-- tensor that requires grad (a parameter), makes the node record when x
-- needs no grad; it gets no grad from it. (gc.ddp and gc.fsdp run their
-- collectives so, after a module's backward, at every call: the node is
-- recorded directly, without a Function's forward and its checks, which
-- cost several times a kernel launch on the host.)
function autograd.on_backward (name, x, fn, anchor)
  if type(name) ~= "string" then
    raise("on_backward: name (argument #1) must be a string, got %s", typename(name))
  end
  if getmetatable(x) ~= TENSOR then
    raise("on_backward: x (argument #2) must be a Tensor, got %s", typename(x))
  end
  local mt = getmetatable(fn)
  if type(fn) ~= "function" and not (type(mt) == "table" and mt.__call) then
    raise("on_backward: fn (argument #3) must be a function, got %s", typename(fn))
  end
  if anchor ~= nil and getmetatable(anchor) ~= TENSOR then
    raise("on_backward: anchor (argument #4) must be a Tensor or nil, got %s", typename(anchor))
  end
  if not node_names[name] then
    if #name < 1 or #name > 63 or name:find("\0", 1, true) then -- it is its node's grad_fn
      raise("on_backward: name must be 1 to 63 bytes without a zero byte, got %d bytes", #name)
    end
    node_names[name] = true
  end
  local y = x:detach()
  if not core.is_grad_enabled() then return y end
  local gx = x.requires_grad
  -- the anchor only makes the node record: an edge into the anchor itself
  -- would hold its .grad back until this node ran (a leaf's grads go into
  -- .grad once all its edges ran, as in PyTorch), after fn() read it
  if anchor ~= nil and anchor.requires_grad then
    anchor = core._anchor(anchor)
  elseif not gx then
    return y
  else
    anchor = nil
  end
  return core._fn_record(name, y, 2, {x, anchor}, NO_GRADS, function (g)
    fn()
    return gx and {g} or NO_GRADS
  end)
end

return autograd
