-- train_mlp.lua: fit a small MLP to a smooth synthetic function, eagerly and
-- then with the whole step (forward, backward, optimizer) captured in one
-- graph, and show both give the same parameters bit for bit.
local gc = require "graphcap"

local steps = tonumber(arg and arg[1]) or 200
local B, IN, HID, OUT = 64, 8, 64, 1

-- data: y = gelu(x . 0.5) plus a little noise, from the engine's generator
gc.manual_seed(0)
local x = gc.randn({B, IN})
local y = gc.no_grad(function()
  return gc.F.gelu(gc.matmul(x, gc.ones({IN, OUT}) * 0.5)) + gc.randn({B, OUT}) * 0.01
end)

local function model()
  gc.manual_seed(1)
  return gc.nn.Sequential(gc.nn.Linear(IN, HID), gc.nn.GELU(), gc.nn.Dropout(0.1),
                          gc.nn.Linear(HID, HID), gc.nn.GELU(), gc.nn.Linear(HID, OUT))
end

local function step(m, opt)
  opt:zero_grad()
  local loss = gc.F.mse_loss(m(x), y)
  loss:backward()
  opt:step()
  return loss
end

-- eager
local m1 = model()
local opt1 = gc.optim.Adam(m1:parameters(), {lr = 3e-3})
gc.manual_seed(7)
local first, last
for i = 1, steps do
  local loss = step(m1, opt1)
  local l = loss:item()
  first = first or l
  last = l
  if i == 1 or i % 50 == 0 then print(("eager  step %4d  loss %.6f"):format(i, l)) end
end
print(("eager: loss %.6f -> %.6f (%.1fx lower)"):format(first, last, first / last))

-- graphed: one eager step to create .grad and optimizer state, then the
-- whole step captured and replayed; same seed, so dropout draws the same masks
local m2 = model()
local opt2 = gc.optim.Adam(m2:parameters(), {lr = 3e-3})
gc.manual_seed(7)
local loss2 = step(m2, opt2)
local g = gc.Graph()
g:capture(function()
  opt2:zero_grad({set_to_none = false})
  loss2 = gc.F.mse_loss(m2(x), y)
  loss2:backward()
  opt2:step()
end)
for i = 2, steps do
  g:replay()
  if i % 50 == 0 then print(("graphed step %4d  loss %.6f"):format(i, loss2:item())) end
end

local same = true
local p1, p2 = m1:parameters(), m2:parameters()
for k = 1, #p1 do
  local a, b = p1[k]:view({p1[k]:numel()}):tolist(), p2[k]:view({p2[k]:numel()}):tolist()
  for j = 1, #a do if a[j] ~= b[j] then same = false end end
end
print(("graphed: loss %.6f; parameters %s eager's bit for bit; the step is %d nodes")
      :format(loss2:item(), same and "equal" or "DIFFER from", g:stats().nodes))
if not same or not (last < first / 10) then os.exit(1) end
