-- hooks.lua: capture-time hooks in the FSDP style. Each layer keeps its
-- weights on the host; a forward pre-hook uploads them (an allocation and a
-- synchronous copy, both forbidden inside a capture) and a backward hook
-- reads the trained weights back (a synchronization, also forbidden). Hooks
-- run outside capture, around warmup and capture passes, and never on replay.
local gc = require "graphcap"

gc.manual_seed(3)
local layers = {gc.nn.Linear(16, 32), gc.nn.Linear(32, 16)}
local host = {}          -- layer -> host copies of its parameters (Lua tables)
for _, m in ipairs(layers) do
  host[m] = {}
  for i, p in ipairs(m:parameters()) do host[m][i] = p:tolist() end
end

local uploads, readbacks = 0, 0
local function materialize(m)
  assert(not gc.is_capturing())
  gc.no_grad(function()
    for i, p in ipairs(m:parameters()) do p:copy_(gc.tensor(host[m][i])) end
  end)
  uploads = uploads + 1
end
local function release(m)
  assert(not gc.is_capturing())
  for i, p in ipairs(m:parameters()) do host[m][i] = p:tolist() end
  readbacks = readbacks + 1
end

local hooks = {}
for k = 1, #layers do
  hooks[k] = {forward_pre_hooks = {materialize}, backward_hooks = {release}}
end
local x = gc.randn({8, 16}, {requires_grad = true})
local h = gc.randn({8, 32}, {requires_grad = true})
local graphed = gc.make_graphed_callables(layers, {{x}, {h}},
                                          {num_warmup_iters = 2, capture_time_hooks = hooks})
print(("construction: %d uploads, %d read-backs (2 layers x (2 warmup + 1 capture))")
      :format(uploads, readbacks))

local opt = gc.optim.SGD({table.unpack(layers[1]:parameters()), table.unpack(layers[2]:parameters())},
                         {lr = 0.01})
local target = gc.zeros({8, 16})
for step = 1, 5 do
  opt:zero_grad()
  local y = graphed[2](graphed[1](gc.randn({8, 16})))   -- two forward replays
  local loss = gc.F.mse_loss(y, target)
  loss:backward()                                       -- two backward replays
  opt:step()
  print(("step %d: loss %.5f"):format(step, loss:item()))
end
print(("after training: still %d uploads, %d read-backs: hooks never run on replay")
      :format(uploads, readbacks))
assert(uploads == 6 and readbacks == 6)
