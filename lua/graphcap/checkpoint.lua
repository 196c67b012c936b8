-- graphcap.checkpoint: state dicts, as PyTorch's: m:state_dict() and
-- m:load_state_dict(sd [, {strict = true}]) for modules (the names
-- PyTorch and TransformerEngine give the same tree), opt:state_dict() and
-- opt:load_state_dict(sd) for the optimizers. A load checks everything
-- before it writes anything, and writes in place: parameters and optimizer
-- state keep their storage, so graphs captured on them stay valid.

local core = require "graphcap.core"
local util = require "graphcap.util"
core._facade()

local error, getmetatable, ipairs, math, next, pairs, pcall, string, table, tostring, type =
      error, getmetatable, ipairs, math, next, pairs, pcall, string, table, tostring, type
_ENV = nil

local raise, options, check = util.raise, util.options, util.check
local Tensor = core._metatables.Tensor
local Module = core._metatables.Module.__methods
local Optimizer = core._metatables.Optimizer.__index

local function is_open (t) return (pcall(t.dim, t)) end

local function shape_str (t)
  local s = {}
  for i, d in ipairs(t:shape()) do s[i] = tostring(d) end
  return "[" .. table.concat(s, ", ") .. "]"
end

-- At most 8 names of the sequence ks, quoted, and how many more there are.
local function names (ks)
  local s = {}
  for i = 1, math.min(#ks, 8) do s[i] = string.format("%q", ks[i]) end
  return table.concat(s, ", ") .. (#ks > 8 and string.format(" and %d more", #ks - 8) or "")
end

-- Run fn() with grad recording off, refused while capturing (a load would
-- be recorded into the graph instead of done).
local function write (where, fn)
  if core.is_capturing() then raise("%s: not allowed while a capture is open", where) end
  local prev = core.set_grad_enabled(false)
  local ok, err = pcall(fn)
  core.set_grad_enabled(prev)
  if not ok then error(err, 0) end  -- the failed op's error names the user's line
end

-- The state dict's entries of module m under prefix, in PyTorch's order: m's
-- own parameters, its own persistent buffers, then each child's entries.
local function entries (m, prefix, out)
  for _, e in ipairs(m:named_parameters()) do
    if not e[1]:find(".", 1, true) then out[#out + 1] = {prefix .. e[1], e[2]} end
  end
  for _, e in ipairs(m:named_buffers()) do
    if not e[1]:find(".", 1, true) and m:_persistent(e[1]) then
      out[#out + 1] = {prefix .. e[1], e[2]}
    end
  end
  for _, c in ipairs(m:named_children()) do entries(c[2], prefix .. c[1] .. ".", out) end
  return out
end

-- m:register_buffer(name, t [, {persistent = true}]): a non-persistent
-- buffer (PyTorch's persistent = false) stays out of m's state dict.
local register_buffer = Module.register_buffer
local buffer_options = {persistent = true}
function Module.register_buffer (self, name, t, opts)
  opts = options("register_buffer", opts, buffer_options)
  return register_buffer(self, name, t, check("register_buffer", "persistent", opts.persistent,
                                              "boolean", true))
end

local state_dict_options = {prefix = true, keep_vars = true}

-- m:state_dict([{prefix = "", keep_vars = false}]) -> {name = tensor}:
-- every parameter and persistent buffer of m and its children under its
-- dotted name (a tensor reached by two names is under both, as in
-- PyTorch). The tensors are detached views of the module's (they share its
-- storage); keep_vars gives the parameters themselves.
function Module.state_dict (self, opts)
  opts = options("state_dict", opts, state_dict_options)
  local prefix = check("state_dict", "prefix", opts.prefix, "string", "")
  local keep = check("state_dict", "keep_vars", opts.keep_vars, "boolean", false)
  local sd = {}
  for _, e in ipairs(entries(self, prefix, {})) do sd[e[1]] = keep and e[2] or e[2]:detach() end
  return sd
end

local load_options = {strict = true}

-- m:load_state_dict(sd [, {strict = true}]) -> {missing_keys = {...},
-- unexpected_keys = {...}}: copy each tensor of sd into the parameter or
-- buffer of its name, in place (converting f32 <-> bf16 as copy_ does). Strict,
-- a key of m missing from sd, or a key of sd that m lacks, is an error; a
-- size mismatch always is. Nothing is written unless every check passes.
function Module.load_state_dict (self, sd, opts)
  local W = "load_state_dict"
  opts = options(W, opts, load_options)
  local strict = check(W, "strict", opts.strict, "boolean", true)
  if type(sd) ~= "table" then
    raise("%s: state_dict must be a table of name -> tensor, got %s", W,
          getmetatable(sd) == Tensor and "a tensor" or type(sd))
  end
  for k, v in pairs(sd) do
    if type(k) ~= "string" then
      raise("%s: the state dict has the %s key %s; keys are names (strings)", W, type(k),
            tostring(k))
    end
    if getmetatable(v) ~= Tensor then raise("%s: %q must be a tensor, got %s", W, k, type(v)) end
    if not is_open(v) then raise("%s: %q is a closed tensor", W, k) end
  end
  local want, seen, missing, unexpected = entries(self, "", {}), {}, {}, {}
  for _, e in ipairs(want) do
    seen[e[1]] = true
    if sd[e[1]] == nil then missing[#missing + 1] = e[1] end
  end
  for k in pairs(sd) do
    if not seen[k] then unexpected[#unexpected + 1] = k end
  end
  table.sort(unexpected)
  if strict and (#missing > 0 or #unexpected > 0) then
    local why = {}
    if #missing > 0 then
      why[1] = string.format("missing key(s) %s (%s has them, the state dict does not)",
                             names(missing), self:type())
    end
    if #unexpected > 0 then
      why[#why + 1] = string.format("unexpected key(s) %s (not in %s)", names(unexpected),
                                    self:type())
    end
    raise("%s: %s; load with {strict = false} to skip them", W, table.concat(why, "; "))
  end
  for _, e in ipairs(want) do
    local src = sd[e[1]]
    if src ~= nil and shape_str(src) ~= shape_str(e[2]) then
      raise("%s: size mismatch for %q: the state dict has %s, %s has %s", W, e[1],
            shape_str(src), self:type(), shape_str(e[2]))
    end
  end
  write(W, function ()
    for _, e in ipairs(want) do
      local src, dst = sd[e[1]], e[2]
      if src ~= nil and (src:data_ptr() ~= dst:data_ptr() or src:dtype() ~= dst:dtype()) then
        dst:copy_(src)
      end
    end
  end)
  return {missing_keys = missing, unexpected_keys = unexpected}
end


-- Optimizers. A state dict is PyTorch's layout with Lua's ids: {state =
-- {[id] = {name = tensor}}, param_groups = {{lr = ..., ..., params = {ids}}}}
-- where the optimizer's parameter i (in the order it was given) has id i.
-- A load maps ids by position in params, as PyTorch does, so PyTorch's
-- 0-based ids load as well.

-- opt:state_dict(): the optimizer's own state tensors (a later step
-- updates them; clone to keep a snapshot); SGD has state only with momentum.
function Optimizer.state_dict (self)
  local h, state, ids = self:_hyper(), {}, {}
  local sgd = h.momentum ~= nil
  for i, e in ipairs(self:_state()) do
    ids[i] = i
    if not sgd or h.momentum ~= 0 then
      local s = {}
      for k, t in pairs(e[2]) do s[k] = t end
      if next(s) ~= nil then state[i] = s end
    end
  end
  local g
  if sgd then
    g = {lr = h.lr, momentum = h.momentum, dampening = 0, weight_decay = h.weight_decay,
         nesterov = false, maximize = false, params = ids}
  else
    g = {lr = h.lr, betas = {h.beta1, h.beta2}, eps = h.eps, weight_decay = h.weight_decay,
         amsgrad = false, maximize = false, params = ids}
  end
  return {state = state, param_groups = {g}}
end

-- PyTorch's options graphcap's optimizers do not have: a state dict may hold
-- them at these values only.
local fixed = {SGD = {dampening = 0, nesterov = false, maximize = false},
               Adam = {amsgrad = false, maximize = false, decoupled_weight_decay = false}}

-- The hyperparameters of group g (SGD's or Adam's), checked, as
-- {name = value} for _set_hyper: those g gives (the others stay).
local function hypers (W, kind, g)
  local new = {}
  local function num (k, v, below1)
    if type(v) ~= "number" or not (v >= 0) or (below1 and v >= 1) then
      raise("%s: param_groups[1].%s is %s; expected a number >= 0%s", W, k, tostring(v),
            below1 and " and < 1" or "")
    end
    return v
  end
  for k, v in pairs(fixed[kind]) do
    if g[k] ~= nil and g[k] ~= v then
      raise("%s: param_groups[1].%s is %s; graphcap's %s has only %s = %s", W, k,
            tostring(g[k]), kind, k, tostring(v))
    end
  end
  for _, k in ipairs(kind == "SGD" and {"lr", "momentum", "weight_decay"}
                     or {"lr", "eps", "weight_decay"}) do
    if g[k] ~= nil then new[k] = num(k, g[k]) end
  end
  if kind == "Adam" and g.betas ~= nil then
    local b = g.betas
    if type(b) ~= "table" or #b ~= 2 then
      raise("%s: param_groups[1].betas must be a sequence of two numbers", W)
    end
    new.beta1, new.beta2 = num("betas[1]", b[1], true), num("betas[2]", b[2], true)
  end
  return new
end

-- opt:load_state_dict(sd): the hyperparameters of sd's one param group, and
-- each parameter's state copied into the optimizer's own tensors (zeros for
-- a parameter sd has no state for, as a fresh optimizer's).
function Optimizer.load_state_dict (self, sd)
  local W = "load_state_dict"
  if type(sd) ~= "table" or getmetatable(sd) == Tensor then
    raise("%s: state_dict must be a table {state = ..., param_groups = ...}, got %s", W, type(sd))
  end
  for k in pairs(sd) do
    if k ~= "state" and k ~= "param_groups" then
      raise("%s: unexpected key %s (a state dict has state and param_groups)", W, tostring(k))
    end
  end
  local state, groups = sd.state, sd.param_groups
  if type(state) ~= "table" then raise("%s: state must be a table, got %s", W, type(state)) end
  if type(groups) ~= "table" or #groups ~= 1 or type(groups[1]) ~= "table" then
    raise("%s: param_groups must be a sequence of one group (graphcap's optimizers have one), "
          .. "got %s", W, type(groups) == "table" and #groups .. " entries" or type(groups))
  end
  local g, cur, h = groups[1], self:_state(), self:_hyper()
  local kind = h.momentum ~= nil and "SGD" or "Adam"
  local ids = g.params
  if type(ids) ~= "table" or #ids ~= #cur then
    raise("%s: param_groups[1].params names %s parameters; the optimizer has %d", W,
          type(ids) == "table" and tostring(#ids) or "no", #cur)
  end
  local pos = {}
  for j = 1, #ids do
    if pos[ids[j]] ~= nil then
      raise("%s: param_groups[1].params[%d] repeats id %s", W, j, tostring(ids[j]))
    end
    pos[ids[j]] = j
  end
  local new = hypers(W, kind, g)
  local momentum = new.momentum or h.momentum
  -- the names a parameter's state holds; SGD's momentum_buffer is read only
  -- with momentum (without, PyTorch keeps one it no longer uses)
  local want = kind == "Adam" and {"step", "exp_avg", "exp_avg_sq"} or {"momentum_buffer"}
  local needed = kind == "Adam" or momentum ~= 0
  for id, s in pairs(state) do
    local j = pos[id]
    if j == nil then
      raise("%s: state has an entry for id %s, which param_groups[1].params does not name", W,
            tostring(id))
    end
    if type(s) ~= "table" then
      raise("%s: state[%s] must be a table, got %s", W, tostring(id), type(s))
    end
    for k in pairs(s) do
      local known = false
      for _, w in ipairs(want) do known = known or k == w end
      if not known then
        raise("%s: state[%s] has an unexpected entry %s (%s keeps %s)", W, tostring(id),
              tostring(k), kind, names(want))
      end
    end
    local p = cur[j][1]
    for _, k in ipairs(want) do
      local v = s[k]
      if v == nil then  -- an error, but for SGD without momentum (nothing to read)
        if needed then raise("%s: state[%s] has no %q", W, tostring(id), k) end
      elseif k == "step" and type(v) == "number" then
        if v < 0 or v ~= math.floor(v) then
          raise("%s: state[%s].step is %s; expected a count >= 0", W, tostring(id), tostring(v))
        end
      elseif getmetatable(v) ~= Tensor or not is_open(v) then
        raise("%s: state[%s].%s must be an open tensor, got %s", W, tostring(id), k, type(v))
      elseif k == "step" and v:numel() ~= 1 then
        raise("%s: state[%s].step has %d elements; expected one", W, tostring(id), v:numel())
      elseif k ~= "step" and shape_str(v) ~= shape_str(p) then
        raise("%s: size mismatch for state[%s].%s: the state dict has %s, parameter %d is %s", W,
              tostring(id), k, shape_str(v), j, shape_str(p))
      end
    end
  end
  write(W, function ()
    for k, v in pairs(new) do self:_set_hyper(k, v) end
    local now = self:_state()  -- with the momentum buffers a new momentum made
    for j = 1, #now do
      local s = state[ids[j]]
      for k, t in pairs(now[j][2]) do
        local v = s and s[k]
        if kind == "SGD" and momentum == 0 then break end
        if v == nil then t:zero_()
        elseif type(v) == "number" then t:fill_(v)
        else t:copy_(v) end
      end
    end
  end)
end

return {}
