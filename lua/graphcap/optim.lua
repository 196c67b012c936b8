-- graphcap.optim: optimizers (require "graphcap".optim). They update
-- parameters in place with device-side state, the learning rate and the
-- step counts included, so a step can be captured, and a captured step
-- follows a schedule (PyTorch's capturable = True).

local core = require "graphcap.core"
local util = require "graphcap.util"
core._facade()

local require, type = require, type
_ENV = nil

local coptim = core._optim
local options, check = util.options, util.check

local optim = {}

-- opt:zero_grad([{set_to_none = true}])
local Optimizer = core._metatables.Optimizer.__index
Optimizer.zero_grad = util.zero_grad(Optimizer.zero_grad)

-- opt:set_lr(lr): the rate every later step reads (also a captured one)
local set_lr = Optimizer.set_lr
function Optimizer.set_lr (self, lr)
  return set_lr(self, check("set_lr", "lr", lr, "number", nil))
end

-- capturable (PyTorch's option) is accepted, true or false: every step here
-- reads its learning rate and step count from the device.
local sgd_options = {lr = true, momentum = true, weight_decay = true, capturable = true}

-- gc.optim.SGD(params, {lr = ..., momentum = 0, weight_decay = 0})
function optim.SGD (params, opts)
  opts = options("SGD", opts, sgd_options)
  check("SGD", "capturable", opts.capturable, "boolean", true)
  return coptim.sgd(params, check("SGD", "lr", opts.lr, "number", nil),
                    check("SGD", "momentum", opts.momentum, "number", 0),
                    check("SGD", "weight_decay", opts.weight_decay, "number",
                          0))
end

local adam_options = {lr = true, betas = true, eps = true, weight_decay = true,
                      capturable = true}

-- Adam or AdamW ('where') over params with options opts, weight decay wd
-- unless given.
local function adam (where, make, params, opts, wd)
  opts = options(where, opts, adam_options)
  check(where, "capturable", opts.capturable, "boolean", true)
  local betas = opts.betas or {0.9, 0.999}
  if type(betas) ~= "table" or type(betas[1]) ~= "number"
     or type(betas[2]) ~= "number" or #betas ~= 2 then
    util.raise("%s: betas must be a sequence of two numbers", where)
  end
  return make(params, check(where, "lr", opts.lr, "number", 1e-3), betas[1], betas[2],
              check(where, "eps", opts.eps, "number", 1e-8),
              check(where, "weight_decay", opts.weight_decay, "number", wd))
end

-- gc.optim.Adam(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8,
-- weight_decay = 0}): weight decay as L2, added to the grad
function optim.Adam (params, opts)
  return adam("Adam", coptim.adam, params, opts, 0)
end

-- gc.optim.AdamW(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8,
-- weight_decay = 1e-2}): PyTorch's defaults; decoupled weight decay (each
-- step first multiplies a parameter by 1 - lr * weight_decay)
function optim.AdamW (params, opts)
  return adam("AdamW", coptim.adamw, params, opts, 1e-2)
end

optim.lr_scheduler = require "graphcap.lr_scheduler"

return optim
