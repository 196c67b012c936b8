-- graphcap.optim: optimizers (require "graphcap".optim). They update
-- parameters in place with device-side state, so a step can be captured.

local core = require "graphcap.core"
local util = require "graphcap.util"
core._facade()

local type = type
_ENV = nil

local coptim = core._optim
local options, check = util.options, util.check

local optim = {}

-- opt:zero_grad([{set_to_none = true}])
local Optimizer = core._metatables.Optimizer.__index
Optimizer.zero_grad = util.zero_grad(Optimizer.zero_grad)

local sgd_options = {lr = true, momentum = true, weight_decay = true}

-- gc.optim.SGD(params, {lr = ..., momentum = 0, weight_decay = 0})
function optim.SGD (params, opts)
  opts = options("SGD", opts, sgd_options)
  return coptim.sgd(params, check("SGD", "lr", opts.lr, "number", nil),
                    check("SGD", "momentum", opts.momentum, "number", 0),
                    check("SGD", "weight_decay", opts.weight_decay, "number",
                          0))
end

local adam_options = {lr = true, betas = true, eps = true, weight_decay = true}

-- gc.optim.Adam(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8,
-- weight_decay = 0})
function optim.Adam (params, opts)
  opts = options("Adam", opts, adam_options)
  local betas = opts.betas or {0.9, 0.999}
  if type(betas) ~= "table" or type(betas[1]) ~= "number"
     or type(betas[2]) ~= "number" or #betas ~= 2 then
    util.raise("Adam: betas must be a sequence of two numbers")
  end
  return coptim.adam(params, check("Adam", "lr", opts.lr, "number", 1e-3),
                     betas[1], betas[2],
                     check("Adam", "eps", opts.eps, "number", 1e-8),
                     check("Adam", "weight_decay", opts.weight_decay, "number",
                           0))
end

return optim
