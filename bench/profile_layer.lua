-- profile_layer.lua: steps of one pre-LN TransformerLayer (the transformer
-- bench's layer: causal, no dropout, bf16) on x [S, B, d], forward and
-- backward of the sum, for a kernel profiler. bench/profile_kernels.py keeps
-- the kernels of the last of the `steps` steps; with RECIPE (DelayedScaling
-- or Float8CurrentScaling) each step runs under gc.fp8.autocast with it, the
-- layer's linears in FP8. Usage:
--   build/graphcap bench/profile_layer.lua [d heads S B steps impl [RECIPE]]
local gc = require "graphcap"

local d, heads = tonumber(arg[1]) or 768, tonumber(arg[2]) or 12
local S, B = tonumber(arg[3]) or 1024, tonumber(arg[4]) or 8
local steps, impl = tonumber(arg[5]) or 4, arg[6] or "auto"
local recipe = arg[7] and gc.fp8[arg[7]]{}
gc.manual_seed(0)
local m = gc.nn.TransformerLayer(d, 4 * d, heads, {self_attn_mask_type = "causal",
                                                   hidden_dropout = 0, attention_dropout = 0,
                                                   attn_impl = impl})
m:to("bf16")
local x = gc.randn({S, B, d}, {requires_grad = true, dtype = "bf16"})
local function step () m(x):sum():backward() end
for _ = 1, steps do
  if recipe then gc.fp8.autocast({recipe = recipe}, step) else step() end
  gc.synchronize()
end
