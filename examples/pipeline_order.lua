-- pipeline_order.lua: two pipeline chunks, three microbatches, graphed in an
-- interleaved 1F1B order (TE's _order) and trained for a few steps; the same
-- steps run eagerly on an identical model give the same parameters.
local gc = require "graphcap"

local M, B, H = 3, 4, 16
local order = {1, 2, 1, 2, -2, -1, 1, 2, -2, -1, -2, -1}

local function chunks()
  gc.manual_seed(11)
  return {gc.nn.Sequential(gc.nn.Linear(H, H), gc.nn.GELU()),
          gc.nn.Sequential(gc.nn.Linear(H, H), gc.nn.GELU())}
end

local function params(cs)
  local ps = {}
  for _, c in ipairs(cs) do for _, p in ipairs(c:parameters()) do ps[#ps + 1] = p end end
  return ps
end

gc.manual_seed(5)
local data = {}
for b = 1, M do data[b] = gc.randn({B, H}) end

-- entries: chunk-major, then microbatch (entry = (chunk - 1) * M + b)
local graphed_chunks = chunks()
local sample = {}
for c = 1, 2 do
  for b = 1, M do sample[(c - 1) * M + b] = {gc.randn({B, H}, {requires_grad = true})} end
end
local entries = gc.make_graphed_callables(graphed_chunks, sample,
                                          {order = order, num_layers_per_chunk = {1, 1}})
print(("%d entries graphed; entry 1 forward: %d nodes"):format(#entries, entries[1]:stats().fwd.nodes))

-- Run one training step by walking the order: forwards keep their outputs
-- until the matching backward; grads accumulate over the microbatches.
local function train_step(call, opt)
  opt:zero_grad()
  local fwd_mb, bwd_mb, outs = {0, 0}, {0, 0}, {}
  for _, v in ipairs(order) do
    local c = math.abs(v)
    if v > 0 then
      fwd_mb[c] = fwd_mb[c] + 1
      local b = fwd_mb[c]
      local input = c == 1 and data[b] or outs[1][b]:detach()
      if c == 2 then input.requires_grad = true end
      outs[c] = outs[c] or {}
      outs[c][b] = call(c, b, input)
      if c == 2 then outs[2][b] = {out = outs[2][b], input = input} end
    else
      bwd_mb[c] = bwd_mb[c] + 1
      local b = bwd_mb[c]
      if c == 2 then
        outs[2][b].out:mean():backward()
        outs.grad = outs.grad or {}
        outs.grad[b] = outs[2][b].input.grad
      else
        outs[1][b]:backward(outs.grad[b])
      end
    end
  end
  opt:step()
end

local eager_chunks = chunks()
local opt_e = gc.optim.SGD(params(eager_chunks), {lr = 0.05})
local opt_g = gc.optim.SGD(params(graphed_chunks), {lr = 0.05})
for step = 1, 3 do
  train_step(function(c, _, x) return eager_chunks[c](x) end, opt_e)
  train_step(function(c, b, x) return entries[(c - 1) * M + b](x) end, opt_g)
end

local pe, pg, same = params(eager_chunks), params(graphed_chunks), true
for k = 1, #pe do
  local a, b = pe[k]:view({pe[k]:numel()}):tolist(), pg[k]:view({pg[k]:numel()}):tolist()
  for j = 1, #a do if a[j] ~= b[j] then same = false end end
end
print(("after 3 steps the graphed pipeline's parameters %s the eager ones bit for bit")
      :format(same and "equal" or "DIFFER from"))
if not same then os.exit(1) end
