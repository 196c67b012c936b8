-- graphcap.lr_scheduler: learning-rate schedules (gc.optim.lr_scheduler),
-- PyTorch's torch.optim.lr_scheduler: LambdaLR, LinearLR, CosineAnnealingLR
-- and SequentialLR with its formulas (the chainable ones that step() uses,
-- the closed forms where PyTorch takes them), defaults and order of
-- operations, in double as Python computes them. A scheduler writes the rate
-- it computes into the optimizer (opt:set_lr), whose steps read it on the
-- device when they run: a step captured once follows the schedule.

local core = require "graphcap.core"
local util = require "graphcap.util"
core._facade()

local getmetatable, ipairs, math, pairs, setmetatable, table, type =
      getmetatable, ipairs, math, pairs, setmetatable, table, type
_ENV = nil

local raise, check, options = util.raise, util.check, util.options
local Optimizer = core._metatables.Optimizer

local lr_scheduler = {}

-- Each optimizer's rate when the first scheduler took it (PyTorch's
-- param_group["initial_lr"], set once by setdefault): the base rate of every
-- later scheduler of the optimizer.
local initial_lr = setmetatable({}, {__mode = "k"})

-- The methods every scheduler has; a class's own come first.
local Scheduler = {}

-- sched:step(): the next epoch's rate, into the optimizer
function Scheduler:step ()
  self._step_count = self._step_count + 1
  self.last_epoch = self.last_epoch + 1
  self:_set(self:get_lr())
end

-- sched:get_last_lr(): a sequence of the rate last set (one per param
-- group, as PyTorch; an optimizer here has one)
function Scheduler:get_last_lr ()
  return {self._last_lr}
end

function Scheduler:_set (lr)
  self.optimizer:set_lr(lr)
  self._last_lr = self.optimizer:get_lr()
end

-- The closed form at 'epoch' where the class has one (SequentialLR's
-- restart of a scheduler at its milestone), else its chainable form there.
function Scheduler:_update_lr (epoch)
  self.last_epoch = epoch
  self:_set(self._closed_form and self:_closed_form() or self:get_lr())
end

-- The construction's first step: epoch 0.
function Scheduler:_initial_step ()
  self._step_count = 0
  self._is_initial = true
  self:step()
  self._is_initial = false
end

local function class (name)
  local cls = {__name = "graphcap." .. name}
  cls.__index = function (_, k) return cls[k] or Scheduler[k] end
  return cls
end

-- A new scheduler of class cls over optimizer opt (PyTorch's LRScheduler
-- with last_epoch = -1), fields set, its first step not yet taken.
local function new (cls, where, opt, fields)
  if getmetatable(opt) ~= Optimizer then
    raise("%s: optimizer must be a gc.optim optimizer, got %s", where, type(opt))
  end
  if initial_lr[opt] == nil then initial_lr[opt] = opt:get_lr() end
  fields.optimizer = opt
  fields.base_lrs = {initial_lr[opt]}
  fields.last_epoch = -1
  fields._step_count = 0
  return setmetatable(fields, cls)
end

local function base (self) return self.base_lrs[1] end

-- ---------------------------------------------------------------------------
-- LambdaLR: base_lr * lr_lambda(epoch)

local LambdaLR = class("LambdaLR")

function LambdaLR:get_lr ()
  local f = self.lr_lambda(self.last_epoch)
  if type(f) ~= "number" then
    raise("LambdaLR: lr_lambda(%d) returned a %s; expected a number (the factor of the base rate)",
          self.last_epoch, type(f))
  end
  return base(self) * f
end

-- gc.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda): lr_lambda a
-- function of the epoch (or a sequence of one, PyTorch's list per group)
function lr_scheduler.LambdaLR (opt, lr_lambda)
  if type(lr_lambda) == "table" and #lr_lambda == 1 then lr_lambda = lr_lambda[1] end
  if type(lr_lambda) ~= "function" then
    raise("LambdaLR: lr_lambda must be a function (or a sequence of one), got %s", type(lr_lambda))
  end
  local s = new(LambdaLR, "LambdaLR", opt, {lr_lambda = lr_lambda})
  s:_initial_step()
  return s
end

-- ---------------------------------------------------------------------------
-- LinearLR: the factor goes linearly from start_factor to end_factor over
-- total_iters epochs

local LinearLR = class("LinearLR")

function LinearLR:get_lr ()
  local lr, e = self.optimizer:get_lr(), self.last_epoch
  local s, f, n = self.start_factor, self.end_factor, self.total_iters
  if e == 0 then return lr * s end
  if self._is_initial or e > n then return lr end
  return lr * (1.0 + (f - s) / (n * s + (e - 1) * (f - s)))
end

function LinearLR:_closed_form ()
  local s, f, n = self.start_factor, self.end_factor, self.total_iters
  return base(self) * (s + (f - s) * math.min(n, self.last_epoch) / n)
end

local linear_options = {start_factor = true, end_factor = true, total_iters = true}

-- gc.optim.lr_scheduler.LinearLR(optimizer [, {start_factor = 1/3,
-- end_factor = 1, total_iters = 5}])
function lr_scheduler.LinearLR (opt, opts)
  local W = "LinearLR"
  opts = options(W, opts, linear_options)
  local s = check(W, "start_factor", opts.start_factor, "number", 1.0 / 3)
  local f = check(W, "end_factor", opts.end_factor, "number", 1.0)
  local n = check(W, "total_iters", opts.total_iters, "integer", 5)
  if s > 1.0 or s <= 0 then raise("%s: start_factor must be in (0, 1], got %g", W, s) end
  if f > 1.0 or f < 0 then raise("%s: end_factor must be in [0, 1], got %g", W, f) end
  if n < 1 then raise("%s: total_iters must be a positive integer, got %d", W, n) end
  local sched = new(LinearLR, W, opt, {start_factor = s, end_factor = f, total_iters = n})
  sched:_initial_step()
  return sched
end

-- ---------------------------------------------------------------------------
-- CosineAnnealingLR: from the base rate down to eta_min along half a cosine
-- over T_max epochs (SGDR without restarts)

local CosineAnnealingLR = class("CosineAnnealingLR")

function CosineAnnealingLR:get_lr ()
  local lr, e, T, eta = self.optimizer:get_lr(), self.last_epoch, self.T_max, self.eta_min
  if self._is_initial then return lr end
  if self._step_count == 1 and e > 0 then
    return eta + (base(self) - eta) * (1 + math.cos(e * math.pi / T)) / 2
  end
  if (e - 1 - T) % (2 * T) == 0 then
    return lr + (base(self) - eta) * (1 - math.cos(math.pi / T)) / 2
  end
  return (1 + math.cos(math.pi * e / T)) / (1 + math.cos(math.pi * (e - 1) / T)) * (lr - eta) + eta
end

function CosineAnnealingLR:_closed_form ()
  local eta = self.eta_min
  return eta + (base(self) - eta) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
end

-- gc.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max [, {eta_min = 0}])
function lr_scheduler.CosineAnnealingLR (opt, T_max, opts)
  local W = "CosineAnnealingLR"
  T_max = check(W, "T_max", T_max, "integer", nil)
  if T_max < 1 then raise("%s: T_max must be a positive integer, got %d", W, T_max) end
  opts = options(W, opts, {eta_min = true})
  local sched = new(CosineAnnealingLR, W, opt,
                    {T_max = T_max, eta_min = check(W, "eta_min", opts.eta_min, "number", 0.0)})
  sched:_initial_step()
  return sched
end

-- ---------------------------------------------------------------------------
-- SequentialLR: schedulers one after the other, each from its milestone on

local SequentialLR = class("SequentialLR")

-- Each scheduler's epoch back by one: their constructions' first steps
-- never happened (PyTorch's recursive_undo).
local function undo (s)
  if s._schedulers then
    for _, c in ipairs(s._schedulers) do undo(c) end
  else
    s.last_epoch = s.last_epoch - 1
  end
end

function SequentialLR:step ()
  self.last_epoch = self.last_epoch + 1
  local idx = 0  -- PyTorch's bisect_right: the milestones reached
  for _, m in ipairs(self._milestones) do
    if m <= self.last_epoch then idx = idx + 1 end
  end
  local s = self._schedulers[idx + 1]
  if idx > 0 and self._milestones[idx] == self.last_epoch then
    s:_update_lr(0)
  else
    s:step()
  end
  self._last_lr = s._last_lr
end

function SequentialLR:_initial_step ()
  self._schedulers[1]:_initial_step()
  self._last_lr = self._schedulers[1]._last_lr
end

-- gc.optim.lr_scheduler.SequentialLR(optimizer, schedulers, milestones):
-- schedulers[k + 1] takes over at epoch milestones[k]
function lr_scheduler.SequentialLR (opt, schedulers, milestones)
  local W = "SequentialLR"
  if getmetatable(opt) ~= Optimizer then
    raise("%s: optimizer must be a gc.optim optimizer, got %s", W, type(opt))
  end
  if type(schedulers) ~= "table" or #schedulers < 1 then
    raise("%s: schedulers must be a non-empty sequence of schedulers", W)
  end
  for i, s in ipairs(schedulers) do
    if type(s) ~= "table" or getmetatable(s) == nil or s.optimizer == nil then
      raise("%s: schedulers[%d] is a %s, not a scheduler", W, i, type(s))
    end
    if s.optimizer ~= opt then
      raise("%s: schedulers[%d] belongs to another optimizer (all must schedule this one)", W, i)
    end
  end
  if type(milestones) ~= "table" or #milestones ~= #schedulers - 1 then
    raise("%s: expected %d milestones (one fewer than the schedulers), got %s", W,
          #schedulers - 1, type(milestones) == "table" and #milestones or type(milestones))
  end
  for i, m in ipairs(milestones) do
    check(W, "milestones[" .. i .. "]", m, "integer", nil)
  end
  if initial_lr[opt] == nil then initial_lr[opt] = opt:get_lr() end
  local self = setmetatable({optimizer = opt, _schedulers = table.move(schedulers, 1, #schedulers, 1, {}),
                             _milestones = table.move(milestones, 1, #milestones, 1, {}),
                             last_epoch = 0}, SequentialLR)
  opt:set_lr(initial_lr[opt])  -- back to the base rate: the first scheduler starts again
  undo(self)
  self:_initial_step()
  return self
end

-- The schedulers' methods are entered through C, as the facade's are, so
-- that their errors name the user's line.
for _, t in ipairs({Scheduler, LambdaLR, LinearLR, CosineAnnealingLR, SequentialLR}) do
  for k, v in pairs(t) do
    if type(v) == "function" and k ~= "__index" then t[k] = util.entry(v) end
  end
end

return lr_scheduler
