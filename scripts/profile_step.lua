-- profile_step.lua: one training step of the benchmark's model, eagerly, for
-- a kernel profiler (ncu) to time each kernel it launches. Usage:
--   ncu --clock-control none --metrics gpu__time_duration.sum --csv \
--       build/graphcap scripts/profile_step.lua [L H B dtype]
-- The warm-up steps come first; profile the launches of the last step.
local gc = require "graphcap"

local L, H, B = tonumber(arg[1]) or 24, tonumber(arg[2]) or 1024, tonumber(arg[3]) or 32
local dt = arg[4] or "f32"
local mods = {}
for i = 1, L do mods[i] = gc.nn.Sequential(gc.nn.Linear(H, H), gc.nn.GELU()):to(dt) end
local x = gc.randn({B, H}, {requires_grad = true, dtype = dt})
local function step ()
  local h = x
  for _, m in ipairs(mods) do h = m(h) end
  h:sum():backward()
end
for _ = 1, 3 do step() end
gc.synchronize()
step()
gc.synchronize()
