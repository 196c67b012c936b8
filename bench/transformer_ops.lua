-- transformer_ops.lua: the time of each op of a transformer layer at the
-- compute-bound size of the transformer bench (bf16, S 1024, B 8, d 768,
-- 12 heads), each op 10 times between two synchronizes, in ms:
--   build/graphcap --device cuda bench/transformer_ops.lua [S B d heads]
local gc = require "graphcap"
local S, B, d, H = tonumber(arg[1] or 1024), tonumber(arg[2] or 8), tonumber(arg[3] or 768),
                   tonumber(arg[4] or 12)
local D = d // H
local bf = {dtype = "bf16"}

local function time (name, f)
  f()
  gc.synchronize()
  local t0 = gc.clock()
  for _ = 1, 10 do f() end
  gc.synchronize()
  print(string.format("%-44s %9.3f ms", name, (gc.clock() - t0) / 10 * 1e3))
end

local x = gc.randn({S, B, d}, bf)
local w, w4 = gc.randn({3 * d, d}, bf), gc.randn({4 * d, d}, bf)
local q, k = gc.randn({B, H, S, D}, bf), gc.randn({B, H, S, D}, bf)
local scores, heads = gc.randn({B, H, S, S}, bf), gc.randn({S, B, H, D}, bf)
time("linear (qkv projection)", function () return gc.F.linear(x, w) end)
time("linear_gelu (fc1)", function () return gc.F.linear_gelu(x, w4) end)
time("layer_norm", function () return gc.F.layer_norm(x) end)
time("permute [S,B,H,D] -> [B,H,S,D]", function () return heads:permute(2, 3, 1, 4) end)
time("transpose of k", function () return k:transpose(3, 4) end)
time("batched q k^T (with the transpose)", function () return gc.matmul(q, k:transpose(3, 4)) end)
time("softmax, causal", function () return gc.F.softmax(scores, {causal = true}) end)
time("softmax", function () return gc.F.softmax(scores) end)
for _, impl in ipairs({"composed", "fused"}) do
  time("attention forward, causal, " .. impl, function ()
    return gc.F.scaled_dot_product_attention(q, k, k, {is_causal = true, impl = impl})
  end)
end
local o = {dtype = "bf16", requires_grad = true}
local qg, kg, vg = gc.randn({B, H, S, D}, o), gc.randn({B, H, S, D}, o), gc.randn({B, H, S, D}, o)
for _, impl in ipairs({"composed", "fused"}) do
  time("attention forward + backward, causal, " .. impl, function ()
    gc.F.scaled_dot_product_attention(qg, kg, vg, {is_causal = true, impl = impl}):sum():backward()
    qg.grad, kg.grad, vg.grad = nil, nil, nil
  end)
end
