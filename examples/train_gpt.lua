-- train_gpt.lua: a small GPT (token and position embeddings, N pre-LN
-- TransformerLayers with causal self-attention, a final LayerNorm and an LM
-- head over the 256 byte values) trained on a byte-level task the script
-- generates: strings that repeat a random pattern of 2 to 4 letters
-- ("cafcafcaf..."). Once a pattern has been seen, each next byte is the one
-- a period back, which only attention can find. Two copies of the model
-- train side by side from one seed on the same batches: one eager, one whose
-- layers are graphed one by one (make_graphed_callables with
-- capture_time_hooks); their losses and final parameters must be equal bit
-- for bit. It prints the loss, checks the accuracy it states on fresh
-- strings, says how the attention ran (on cuda in bf16: cuDNN, reading q,
-- k and v in place), and writes an SVG of the loss curve. With "fp8" a
-- second pair trains beside the first, the layers' GEMMs in FP8
-- (DelayedScaling; eager under gc.fp8.autocast, graphed with fp8_enabled),
-- its loss printed next to the first pair's.
--
--   build/graphcap examples/train_gpt.lua [small|full] [fp8] [SVG]
--   GPT_DTYPE=bf16 build/graphcap examples/train_gpt.lua small    (default f32)
--
-- "small" (the test setting, also GPT_SIZE=small) is 2 layers of width 32;
-- "full" (the default) 4 layers of width 64. SVG: where the loss curve
-- goes (default train_gpt_loss.svg).
local gc = require "graphcap"

local SIZES = {
  small = {layers = 2, d = 32, heads = 2, S = 16, B = 16, steps = 200, lr = 3e-3, accuracy = 0.9},
  full = {layers = 4, d = 64, heads = 4, S = 32, B = 32, steps = 250, lr = 2e-3, accuracy = 0.98},
}
local size, with_fp8, svg_path = os.getenv("GPT_SIZE") or "full", false, "train_gpt_loss.svg"
for i, a in ipairs(arg) do
  if SIZES[a] then
    size = a
  elseif a == "fp8" then
    with_fp8 = true
  elseif i == #arg and a:match("%.svg$") then
    svg_path = a
  else
    error("expected small, full, fp8 or an SVG path (the last argument), got " .. a)
  end
end
local C = SIZES[size] or error("size must be small or full, got " .. tostring(size))
local DT = os.getenv("GPT_DTYPE") or "f32"
assert(DT == "f32" or DT == "bf16", "GPT_DTYPE must be f32 or bf16, got " .. DT)
local RECIPE = gc.fp8.DelayedScaling{amax_history_len = 16}
local V = 256          -- byte values
local MIN_FIRST = 4    -- from this position on, every target is determined
local LETTERS = "abcdefgh"

-- A batch of strings as columns: ids [S, B] and targets [S * B] (the next
-- byte of each position), all f32 byte values.
local function batch (S, B)
  local ids, targets = {}, {}
  for s = 1, S do ids[s] = {} end
  local next_of = {}
  for b = 1, B do
    local p = math.random(2, 4)
    local pat = {}
    for i = 1, p do
      local k = math.random(#LETTERS)
      pat[i] = LETTERS:byte(k)
    end
    for s = 1, S + 1 do
      local c = pat[(s - 1) % p + 1]
      if s <= S then ids[s][b] = c end
      if s > 1 then next_of[(s - 2) * B + b] = c end
    end
  end
  for i = 1, S * B do targets[i] = next_of[i] end
  return gc.tensor(ids), gc.tensor(targets)
end

-- Positions [S, B]: row s holds s - 1.
local function positions (S, B)
  local t = {}
  for s = 1, S do
    t[s] = {}
    for b = 1, B do t[s][b] = s - 1 end
  end
  return gc.tensor(t)
end

local GPT = gc.nn.Module("GPT")
-- fp8: the layers run under an FP8 autocast (the graphed copy's graphs
-- were captured under one instead)
function GPT:init (fp8)
  self.tok = gc.nn.Embedding(V, C.d)
  self.pos = gc.nn.Embedding(C.S, C.d)
  self.layers = {}
  for i = 1, C.layers do
    local l = gc.nn.TransformerLayer(C.d, 4 * C.d, C.heads, {hidden_dropout = 0,
                                                             attention_dropout = 0})
    self["layer" .. i] = l   -- registered as a child
    self.layers[i] = l
  end
  self.ln_f = gc.nn.LayerNorm(C.d)
  self.head = gc.nn.Linear(C.d, V)
  self.posids = positions(C.S, C.B)
  self.fp8 = fp8
end
-- ids [S, B] -> logits [S * B, V]
function GPT:forward (ids)
  local h = self.tok(ids) + self.pos(self.posids)
  for _, l in ipairs(self.layers) do
    if self.fp8 then
      h = gc.fp8.autocast({recipe = RECIPE}, function () return l(h) end)
    else
      h = l(h)
    end
  end
  return self.head(self.ln_f(h)):reshape({C.S * C.B, V})
end

local function model (fp8)
  gc.manual_seed(1)
  local m = GPT(fp8):to(DT)
  return m, gc.optim.Adam(m:parameters(), {lr = C.lr})
end

local function step (m, opt, ids, targets)
  opt:zero_grad()
  local loss = gc.F.cross_entropy(m(ids):float(), targets) -- the loss in f32, as TE users take it
  loss:backward()
  opt:step()
  return loss:item()
end

-- One pair trained side by side on the same batches (the same generator
-- seed each time): an eager copy and one whose layers are graphed one by
-- one, with a capture-time hook on each layer (counted: it must run at
-- warmup and capture, never on replay); fp8: the layers' GEMMs in FP8.
-- Returns the losses and the graphed copy, after checking that both copies
-- ended equal bit for bit.
local function train (fp8)
  local eager, eager_opt = model(fp8)
  local graphed, graphed_opt = model(false)
  local hook_calls = 0
  local hooks, samples = {}, {}
  for i = 1, C.layers do
    hooks[i] = {forward_pre_hooks = {function () hook_calls = hook_calls + 1 end}}
    samples[i] = {gc.randn({C.S, C.B, C.d}, {requires_grad = true, dtype = DT})}
  end
  gc.make_graphed_callables(graphed.layers, samples, {capture_time_hooks = hooks,
                                                      num_warmup_iters = 3, fp8_enabled = fp8,
                                                      fp8_recipe = fp8 and RECIPE or nil})
  local hooks_at_graphing = hook_calls
  assert(hooks_at_graphing == C.layers * (3 + 1), "capture-time hooks: " .. hooks_at_graphing)
  math.randomseed(7)
  local losses = {}
  for s = 1, C.steps do
    local ids, targets = batch(C.S, C.B)
    local le = step(eager, eager_opt, ids, targets)
    local lg = step(graphed, graphed_opt, ids, targets)
    assert(le == lg, ("step %d: eager loss %.9g, graphed %.9g"):format(s, le, lg))
    losses[s] = lg
  end
  assert(hook_calls == hooks_at_graphing, "a capture-time hook ran at replay")
  local pe, pg = eager:parameters(), graphed:parameters()
  for i = 1, #pe do
    local a, b = pe[i]:reshape({pe[i]:numel()}):tolist(), pg[i]:reshape({pg[i]:numel()}):tolist()
    for j = 1, #a do assert(a[j] == b[j], ("parameter %d differs at %d"):format(i, j)) end
  end
  return losses, graphed
end

local losses, graphed = train(false)
local losses8 = with_fp8 and train(true)
for s = 1, C.steps do
  if s == 1 or s % 50 == 0 or s == C.steps then
    print(("step %4d  loss %.4f (%s)%s"):format(s, losses[s], DT, losses8 and
          ("  %.4f (fp8)"):format(losses8[s]) or ""))
  end
end
print(("eager and per-layer graphed training equal bit for bit over %d steps (%s%s)"):format(
  C.steps, DT, losses8 and ", and with FP8 GEMMs" or ""))
local st = graphed.layers[1]:attention_stats()
print(("attention: %s%s%s"):format(st.impl, st.packed and ", q, k and v read in place" or "",
                                   st.why and " (" .. st.why .. ")" or ""))
if gc.device() == "cuda" and DT == "bf16" then
  assert(st.impl == "cudnn" and st.packed, "cuDNN did not run the attention in place")
end

-- Accuracy on fresh strings, from the position where every target is
-- determined on.
graphed:eval()
local right, total = 0, 0
gc.no_grad(function ()
  for _ = 1, 4 do
    local ids, targets = batch(C.S, C.B)
    local logits, want = graphed(ids):tolist(), targets:tolist()
    for i = (MIN_FIRST - 1) * C.B + 1, C.S * C.B do
      local best, arg = -math.huge, 0
      for v = 1, V do
        if logits[i][v] > best then best, arg = logits[i][v], v - 1 end
      end
      right = right + (arg == want[i] and 1 or 0)
      total = total + 1
    end
  end
end)
local acc = right / total
print(("next-byte accuracy from position %d on: %.3f (stated: at least %.2f)"):format(
  MIN_FIRST, acc, C.accuracy))
assert(acc >= C.accuracy, "accuracy below the stated one")

-- The loss curve as an SVG polyline.
local W, Hh, pad = 640, 360, 40
local top = losses[1]
for _, l in ipairs(losses) do top = math.max(top, l) end
local pts = {}
for i, l in ipairs(losses) do
  pts[i] = ("%.1f,%.1f"):format(pad + (i - 1) / math.max(1, #losses - 1) * (W - 2 * pad),
                                Hh - pad - l / top * (Hh - 2 * pad))
end
local f = assert(io.open(svg_path, "w"))
f:write(([[<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">
<rect width="%d" height="%d" fill="white"/>
<text x="%d" y="20">train_gpt.lua (%s): loss over %d steps, eager = per-layer graphed</text>
<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>
<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>
<text x="%d" y="%d">%.2f</text><text x="%d" y="%d">0</text>
<polyline fill="none" stroke="#36a" stroke-width="1.5" points="%s"/>
</svg>
]]):format(W, Hh, W, Hh, pad, size, #losses, pad, Hh - pad, W - pad, Hh - pad, pad, pad, pad,
           Hh - pad, 4, pad + 4, top, 4, Hh - pad, table.concat(pts, " ")))
f:close()
print("loss curve: " .. svg_path)
