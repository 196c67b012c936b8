-- test_te_matrix.lua: TransformerEngine's test matrix for graphed
-- callables, on graphcap's transformer modules. For each module kind, three
-- layers trained for 3 SGD steps of 2 microbatches each (grads accumulated,
-- zero_grad without set_to_none) give the same params, grads and last output
-- bit for bit whether run eagerly, graphed as one callable (a Sequential of
-- the three) or graphed layer by layer; f32 and bf16. Data is laid out
-- [seq, batch, hidden]; warmup samples are ones, real data random.
--   build/graphcap tests/lua/test_te_matrix.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = dofile(debug.getinfo(1, "S").source:match("^@?(.-)[^/\\]*$") .. "helpers.lua")

-- Tiny dims: seq 4, batch 2, hidden 16 (2 heads of 8), ffn 32.
local S, B, HID, HEADS, FFN = 4, 2, 16, 2, 32
local WARMUP = 10

-- One layer of each kind, from the generator as it stands.
local KINDS = {
  linear = function () return gc.nn.Linear(HID, HID) end,
  layernorm_linear = function () return gc.nn.LayerNormLinear(HID, HID) end,
  layernorm_mlp_nocheckpoint = function () return gc.nn.LayerNormMLP(HID, FFN) end,
  layernorm_mlp_checkpoint = function ()
    return gc.nn.LayerNormMLP(HID, FFN, {checkpoint = true})
  end,
}
H.te_kinds = KINDS  -- the attention kinds join below when present

-- Three layers of `kind` in dtype dt, from seed 7.
local function layers (kind, dt)
  gc.manual_seed(7)
  local mods = {}
  for i = 1, 3 do
    mods[i] = KINDS[kind]()
    mods[i]:to(dt)
  end
  return mods
end

local function sample (dt)
  return gc.ones({S, B, HID}, {dtype = dt, requires_grad = true})
end

-- Train `model` (callable on x) over the layers' parameters `params`:
-- the nested values of every param, grad and the last output.
local function train (model, params, dt)
  local opt = gc.optim.SGD(params, {lr = 1e-3})
  local y
  gc.manual_seed(12)
  for _ = 1, 3 do
    opt:zero_grad({set_to_none = false})
    for _ = 1, 2 do
      local x = gc.randn({S, B, HID}, {dtype = dt, requires_grad = true})
      y = model(x);
      (y * gc.randn({S, B, HID}, {dtype = dt})):sum():backward()
    end
    opt:step()
  end
  local res = {out = y:tolist(), params = {}, grads = {}}
  for i, p in ipairs(params) do
    res.params[i] = p:tolist()
    res.grads[i] = p.grad:tolist()
  end
  return res
end

-- The result of training `kind` in dt under graph mode "none", "full" or
-- "individual".
local function run (kind, dt, mode)
  local mods = layers(kind, dt)
  local seq = gc.nn.Sequential(mods)
  local graphed = {}  -- the graphed modules, replayed by each call
  if mode == "full" then
    graphed = {gc.make_graphed_callables(seq, {sample(dt)}, {num_warmup_iters = WARMUP})}
  elseif mode == "individual" then
    local samples = {}
    for i = 1, #mods do samples[i] = {sample(dt)} end
    graphed = gc.make_graphed_callables(mods, samples, {num_warmup_iters = WARMUP})
  end
  local res = train(seq, H.all_params(mods), dt)
  for i, g in ipairs(graphed) do  -- 6 calls, each a forward and a backward replay
    lu.assertEquals(g:stats().fwd.replays, 6, mode .. " entry " .. i .. ": forward replays")
    lu.assertEquals(g:stats().bwd.replays, 6, mode .. " entry " .. i .. ": backward replays")
  end
  return res
end
H.te_run = run

local function check (kind, dt)
  local eager = run(kind, dt, "none")
  for _, mode in ipairs({"full", "individual"}) do
    local got = run(kind, dt, mode)
    H.assert_same(got.out, eager.out, kind .. " " .. dt .. " " .. mode .. ": output")
    H.assert_same(got.params, eager.params, kind .. " " .. dt .. " " .. mode .. ": params")
    H.assert_same(got.grads, eager.grads, kind .. " " .. dt .. " " .. mode .. ": grads")
  end
  return eager
end

TestTEMatrix = {tearDown = H.no_capture_left}

-- One test per kind and dtype, named as TE's parametrization.
for kind in pairs(KINDS) do
  for _, dt in ipairs({"f32", "bf16"}) do
    TestTEMatrix["test_" .. kind .. "_" .. dt] = function () check(kind, dt) end
  end
end

-- The harness can fail: a graphed model whose layers were built from
-- another seed differs from eager.
function TestTEMatrix:test_harness_sees_a_difference ()
  local eager = run("layernorm_mlp_nocheckpoint", "f32", "none")
  local mods = layers("layernorm_mlp_nocheckpoint", "f32")
  gc.no_grad(function () mods[2].fc1_weight:copy_(mods[2].fc1_weight * 1.5) end)
  local got = train(gc.nn.Sequential(mods), H.all_params(mods), "f32")
  lu.assertFalse(pcall(H.assert_same, got.params, eager.params, "params"))
end

-- Checkpointing changes what is kept, not the values: a checkpointed
-- LayerNormMLP trains as the plain one does (within rounding of a
-- different schedule of the same kernels: here equal bit for bit on host).
function TestTEMatrix:test_checkpoint_matches_plain ()
  local plain = run("layernorm_mlp_nocheckpoint", "f32", "none")
  local ckpt = run("layernorm_mlp_checkpoint", "f32", "none")
  H.assert_close(ckpt.params, plain.params, 1e-6, 1e-5, "params")
  H.assert_close(ckpt.grads, plain.grads, 1e-6, 1e-5, "grads")
  H.assert_close(ckpt.out, plain.out, 1e-6, 1e-5, "output")
end

-- A checkpointed call keeps one node over the whole MLP; a plain one, its
-- last linear.
function TestTEMatrix:test_checkpoint_is_one_node ()
  gc.manual_seed(1)
  local x = gc.randn({S, B, HID}, {requires_grad = true})
  lu.assertEquals(gc.nn.LayerNormMLP(HID, FFN, {checkpoint = true})(x).grad_fn, "LayerNormMLP")
  lu.assertEquals(gc.nn.LayerNormMLP(HID, FFN)(x).grad_fn, "linear")
end

os.exit(lu.LuaUnit.run())
