-- profile_step.lua: one training step of the benchmark's model, eagerly or
-- replayed as one captured graph, for a kernel profiler (ncu) to time each
-- kernel it launches. Usage:
--   ncu --clock-control none --metrics gpu__time_duration.sum --csv \
--       build/graphcap bench/profile_step.lua [L H B dtype [eager|graph]]
-- The warm-up steps come first; profile the launches of the last step (in
-- graph mode, the kernel nodes of the last replay).
local gc = require "graphcap"

local L, H, B = tonumber(arg[1]) or 24, tonumber(arg[2]) or 1024, tonumber(arg[3]) or 32
local dt, mode = arg[4] or "f32", arg[5] or "eager"
local mods = {}
for i = 1, L do mods[i] = gc.nn.Sequential(gc.nn.Linear(H, H), gc.nn.GELU()):to(dt) end
local x = gc.randn({B, H}, {requires_grad = true, dtype = dt})
local function step ()
  local h = x
  for _, m in ipairs(mods) do h = m(h) end
  h:sum():backward()
end
local s = gc.Stream()
gc.with_stream(s, function () for _ = 1, 3 do step() end end)
gc.synchronize()
if mode == "graph" then
  for _, m in ipairs(mods) do m:zero_grad() end
  x.grad = nil
  local g = gc.Graph()
  g:capture(step)
  g:replay()
  gc.synchronize()
  g:replay()
else
  step()
end
gc.synchronize()
