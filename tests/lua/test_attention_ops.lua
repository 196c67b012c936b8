-- test_attention_ops.lua: the ops of attention (docs/lua-api.md, "Functions"):
-- batched gc.matmul, gc.F.softmax with a scale, masks and causal,
-- gc.masked_fill, gc.F.embedding, gc.F.dropout on 4-D attention weights and
-- gc.F.scaled_dot_product_attention: values and grads against double-precision
-- references (central differences), a captured forward and backward replayed
-- equal to eager bit for bit, and their errors.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_attention_ops.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

local HERE = debug.getinfo(1, "S").short_src .. ":"  -- errors name the user's line

-- The element count of a shape.
local function numel (shape)
  local n = 1
  for _, v in ipairs(shape) do n = n * v end
  return n
end

-- The batch of a product: bs (out's batch dims) and, per batch index, the
-- offsets of the matrix of each operand (shape xs with its batch dims
-- broadcast to bs), counted in matrices.
local function batch_index (bs, xs, b)
  local nb, xnb = #bs, #xs - 2
  local idx, o = {}, 0
  for d = nb, 1, -1 do idx[d] = b % bs[d]; b = b // bs[d] end
  for d = 1, xnb do
    local od = nb - xnb + d
    o = o * xs[d] + (xs[d] == 1 and 0 or idx[od])
  end
  return o
end

-- op(A) op(B) in double on flat lists; shapes as: out's batch from both.
local function ref_matmul (a, as, b, bs_, ta, tb)
  local m = ta and as[#as] or as[#as - 1]
  local k = ta and as[#as - 1] or as[#as]
  local n = tb and bs_[#bs_ - 1] or bs_[#bs_]
  local nb = math.max(#as, #bs_) - 2
  local bs = {}
  for d = 1, nb do
    local ad, bd = as[#as - 2 - nb + d], bs_[#bs_ - 2 - nb + d]
    bs[d] = math.max(ad or 1, bd or 1)
  end
  local y = {}
  for bi = 0, numel(bs) - 1 do
    local ao, bo = batch_index(bs, as, bi) * m * k, batch_index(bs, bs_, bi) * k * n
    for i = 0, m - 1 do
      for j = 0, n - 1 do
        local s = 0
        for l = 0, k - 1 do
          local x = a[ao + (ta and l * m + i or i * k + l) + 1]
          local w = b[bo + (tb and j * k + l or l * n + j) + 1]
          s = s + x * w
        end
        y[#y + 1] = s
      end
    end
  end
  return y
end

TestAttentionOps = {tearDown = H.no_capture_left}

function TestAttentionOps:test_batched_matmul_values_and_grads ()
  local cases = {
    {{2, 3, 4, 5}, {2, 3, 5, 6}},   -- equal batches: one strided launch
    {{2, 3, 4, 5}, {5, 6}},         -- a 2-D operand used by every batch
    {{4, 5}, {3, 5, 2}},            -- and the other way round
    {{2, 3, 4, 5}, {3, 5, 2}},      -- a 3-D operand broadcast over the first batch dim
    {{2, 1, 4, 5}, {1, 3, 5, 2}},   -- each broadcast along one dim: one launch per first index
    {{3, 4, 5}, {3, 5, 2}},
    {{3, 4}, {4, 2}},               -- 2-D as before
  }
  for ci, c in ipairs(cases) do
    local as, bs = c[1], c[2]
    H.gradcheck("matmul case " .. ci,
                {{as, H.values(numel(as), 0.1 * ci)}, {bs, H.values(numel(bs), 0.2 * ci)}},
                function (a, b) return gc.matmul(a, b) end,
                function (a, b) return ref_matmul(a, as, b, bs) end)
  end
  local a = gc.zeros{2, 3, 4, 5}
  lu.assertEquals(a:matmul(gc.zeros{5, 7}):shape(), {2, 3, 4, 7})
end

function TestAttentionOps:test_batched_matmul_errors ()
  H.assert_err(function () return gc.matmul(gc.zeros{2, 3}, gc.zeros{4, 5}) end,
               HERE, "matmul: expected [m, k] x [k, n], got [2, 3] x [4, 5]")
  H.assert_err(function () return gc.matmul(gc.zeros{2, 3, 4}, gc.zeros{3, 4, 5}) end,
               HERE, "matmul: expected [..., m, k] x [..., k, n] with batch dims that broadcast, "
                     .. "got [2, 3, 4] x [3, 4, 5]")
  H.assert_err(function () return gc.matmul(gc.zeros{4}, gc.zeros{4, 5}) end,
               HERE, "matmul: expected [..., m, k] x [..., k, n]")
end

-- The flat index into a mask of shape ms (right-aligned, dims 1 broadcast)
-- of element idx (0-based entries) of shape xs.
local function mask_offset (xs, ms, idx)
  local o = 0
  for d = 1, #ms do
    local xd = #xs - #ms + d
    o = o * ms[d] + (ms[d] == 1 and 0 or idx[xd])
  end
  return o
end

-- Every index of shape in row-major order, 0-based entries.
local function indices (shape)
  local out, idx = {}, {}
  local function walk (d)
    if d > #shape then out[#out + 1] = table.move(idx, 1, #shape, 1, {}); return end
    for i = 0, shape[d] - 1 do idx[d] = i; walk(d + 1) end
  end
  walk(1)
  return out
end

-- softmax over the last dim of scale * x (+ mask) in double; o: {scale,
-- mask, mshape, bool, causal}. A row masked out everywhere is zeros.
local function ref_softmax (x, xs, o)
  local cols, z, y = xs[#xs], {}, {}
  for k, idx in ipairs(indices(xs)) do
    local v = (o.scale or 1) * x[k]
    local out = o.causal and idx[#xs] > idx[#xs - 1]
    if o.mask then
      local m = o.mask[mask_offset(xs, o.mshape, idx) + 1]
      if o.bool then out = out or m ~= 0 else v = v + m end
    end
    z[k] = out and -math.huge or v
  end
  for r = 0, #x // cols - 1 do
    local mx = -math.huge
    for c = 1, cols do mx = math.max(mx, z[r * cols + c]) end
    local s = 0
    for c = 1, cols do s = s + math.exp(z[r * cols + c] - mx) end
    for c = 1, cols do
      y[r * cols + c] = mx == -math.huge and 0 or math.exp(z[r * cols + c] - mx) / s
    end
  end
  return y
end

-- 0/1 values, every third one set (a row of zeros where rows has them).
local function bits (n, phase)
  local v = {}
  for i = 1, n do v[i] = (i + (phase or 0)) % 3 == 0 and 1 or 0 end
  return v
end

function TestAttentionOps:test_softmax_scale_masks_causal ()
  local xs = {2, 3, 4, 5}
  local n = numel(xs)
  local x = H.values(n, 0.3, 2)
  -- an additive mask over batch and rows, some entries -inf
  local ms = {2, 1, 4, 5}
  local m = H.values(numel(ms), 1.7, 1.5)
  for i = 1, #m, 7 do m[i] = -math.huge end
  H.gradcheck("softmax additive mask", {{xs, x}, {ms, m, grad = false}},
              function (t, mt) return gc.F.softmax(t, {scale = 0.5, mask = mt}) end,
              function (t) return ref_softmax(t, xs, {scale = 0.5, mask = m, mshape = ms}) end)
  -- a boolean mask over the last two dims, one row masked out everywhere
  local bs = {4, 5}
  local b = bits(20)
  for c = 6, 10 do b[c] = 1 end
  H.gradcheck("softmax boolean mask", {{xs, x}, {bs, b, grad = false}},
              function (t, mt) return t:softmax{mask_bool = mt, dim = -1} end,
              function (t) return ref_softmax(t, xs, {mask = b, mshape = bs, bool = true}) end)
  -- causal, square and not; with a mask and a scale
  H.gradcheck("softmax causal [2,4,4]", {{{2, 4, 4}, H.values(32, 0.9)}},
              function (t) return gc.F.softmax(t, {causal = true}) end,
              function (t) return ref_softmax(t, {2, 4, 4}, {causal = true}) end)
  H.gradcheck("softmax causal [3,5] scaled, masked", {{{3, 5}, H.values(15, 0.4)},
                                                      {{5}, bits(5, 1), grad = false}},
              function (t, mt) return gc.F.softmax(t, {causal = true, scale = 2, mask_bool = mt}) end,
              function (t)
                return ref_softmax(t, {3, 5}, {causal = true, scale = 2, mask = bits(5, 1),
                                               mshape = {5}, bool = true})
              end)
  -- a bf16 mask on f32 scores: read as its own dtype
  local mb = gc.tensor(H.nest(bits(20), bs), "bf16")
  local y = gc.F.softmax(gc.tensor(H.nest(x, xs)), {mask_bool = mb})
  H.assert_close(H.flat(y:tolist()), ref_softmax(H.flat(gc.tensor(H.nest(x, xs)):tolist()), xs,
                 {mask = bits(20), mshape = bs, bool = true}), 2e-6, 2e-5, "bf16 mask")
end

function TestAttentionOps:test_masked_fill_values_and_grads ()
  local xs, ms = {2, 3, 4}, {3, 1}
  local m = bits(3)
  H.gradcheck("masked_fill", {{xs, H.values(24, 0.2)}, {ms, m, grad = false}},
              function (t, mt) return gc.masked_fill(t, mt, -7) end,
              function (t)
                local y = {}
                for k, idx in ipairs(indices(xs)) do
                  y[k] = m[mask_offset(xs, ms, idx) + 1] ~= 0 and -7 or t[k]
                end
                return y
              end)
  local t = gc.tensor{{1, 2}, {3, 4}}
  lu.assertEquals(t:masked_fill(gc.tensor{0, 1}, -math.huge):tolist(),
                  {{1, -math.huge}, {3, -math.huge}})
end

function TestAttentionOps:test_softmax_and_masked_fill_errors ()
  local x = gc.zeros{2, 3, 4}
  H.assert_err(function () return gc.F.softmax(x, {mask = gc.zeros{3, 3}}) end,
               HERE, "softmax: the mask [3, 3] does not broadcast to [2, 3, 4]")
  H.assert_err(function () return gc.F.softmax(x, {mask = gc.zeros{4}, mask_bool = gc.zeros{4}}) end,
               HERE, "softmax: options 'mask' and 'mask_bool' exclude each other")
  H.assert_err(function () return gc.F.softmax(x, {scale = "2"}) end,
               HERE, "softmax: option 'scale' must be a number, got string")
  H.assert_err(function () return gc.F.softmax(x, {causal = 1}) end,
               HERE, "softmax: option 'causal' must be a boolean, got number")
  H.assert_err(function () return gc.F.softmax(x, {casual = true}) end,
               HERE, "softmax: unknown option 'casual'")
  H.assert_err(function () return gc.F.softmax(x, {dim = 1}) end,
               HERE, "softmax: only the last dimension is supported (dim -1 or 3), got dim 1")
  H.assert_err(function () return gc.F.softmax(gc.zeros{4}, {causal = true}) end,
               HERE, "softmax: causal needs a tensor of at least 2 dims, got 1-D")
  H.assert_err(function () return gc.F.softmax(x, {scale = math.huge}) end,
               HERE, "softmax: the scale must be finite as a float, got inf")
  H.assert_err(function () return gc.masked_fill(x, gc.zeros{2, 1, 1, 4}, 0) end,
               HERE, "masked_fill: the mask [2, 1, 1, 4] does not broadcast to [2, 3, 4]")
  H.assert_err(function () return gc.masked_fill(x, gc.zeros{4}) end,
               HERE, "bad argument #3 to 'masked_fill' (number expected, got no value)")
end

function TestAttentionOps:test_embedding_values_and_grads ()
  local rows, dim = 5, 3
  local ids = {{4, 0, 4}, {2, 4, 1}}   -- repeated ids: their grads add up
  local flat_ids = H.flat(ids)
  H.gradcheck("embedding", {{{rows, dim}, H.values(rows * dim, 0.6)}},
              function (w) return gc.F.embedding(gc.tensor(ids), w) end,
              function (w)
                local y = {}
                for _, id in ipairs(flat_ids) do
                  for c = 1, dim do y[#y + 1] = w[id * dim + c] end
                end
                return y
              end)
  local w = gc.tensor(H.nest(H.values(rows * dim), {rows, dim}), "bf16")
  local y = gc.F.embedding(gc.tensor(3), w)   -- a 0-D id: one row
  lu.assertEquals(y:shape(), {dim})
  lu.assertEquals(y:dtype(), "bf16")
  lu.assertEquals(y:tolist(), w:tolist()[4])
end

-- The weight's grad is the same bits at every run, captured or not, with
-- many ids on few rows (the order of the additions is fixed).
function TestAttentionOps:test_embedding_backward_deterministic_and_replayed ()
  local ids = {}
  for i = 1, 64 do ids[i] = (i * 7) % 3 end
  local idt = gc.tensor(H.nest(ids, {4, 16}))
  local w = gc.tensor(H.nest(H.values(3 * 8, 0.1), {3, 8}), {requires_grad = true})
  local r = gc.tensor(H.nest(H.values(4 * 16 * 8, 0.2), {4, 16, 8}))
  local function step () (gc.F.embedding(idt, w) * r):sum():backward() end
  step()
  local want = w.grad:tolist()
  for _ = 1, 3 do
    w.grad = nil
    step()
    H.assert_bitwise(w.grad:tolist(), want, "eager again")
  end
  w.grad = nil
  local g = gc.Graph()
  g:capture(step)
  g:replay()
  H.assert_bitwise(w.grad:tolist(), want, "replayed")
end

function TestAttentionOps:test_embedding_errors ()
  local w = gc.zeros{4, 2}
  H.assert_err(function () return gc.F.embedding(gc.tensor{1, 4}, w) end,
               HERE, "embedding: the id at 2 (counting from 1) is 4, not a row of the weight "
                     .. "(an integer in 0..3)")
  H.assert_err(function () return gc.F.embedding(gc.tensor{1.5}, w) end,
               HERE, "embedding: the id at 1 (counting from 1) is 1.5")
  H.assert_err(function () return gc.F.embedding(gc.tensor({1}, "bf16"), w) end,
               HERE, "embedding: expected ids of 0 to 3 dims held as f32 numbers and a weight "
                     .. "[rows, dim]; got ids bf16 [1] and weight [4, 2]")
  H.assert_err(function () return gc.F.embedding(gc.zeros{1, 1, 1, 1}, w) end,
               HERE, "embedding: expected ids of 0 to 3 dims")
  H.assert_err(function () return gc.F.embedding(gc.zeros{2}, gc.zeros{4}) end,
               HERE, "got ids f32 [2] and weight [4]")
end

-- dropout on 4-D attention weights: the mask of the flat elements, grads
-- through it, and a captured forward and backward equal to eager.
function TestAttentionOps:test_dropout_on_attention_weights ()
  local x = gc.tensor(H.nest(H.values(2 * 2 * 4 * 4, 0.3, 1, 2), {2, 2, 4, 4}),
                      {requires_grad = true})
  local r = gc.tensor(H.nest(H.values(64, 0.8), {2, 2, 4, 4}))
  gc.manual_seed(7)
  local y = gc.F.dropout(gc.F.softmax(x, {causal = true}), 0.25)
  lu.assertEquals(y:shape(), {2, 2, 4, 4})
  ;(y * r):sum():backward()
  local yv, gv = H.flat(y:tolist()), x.grad:tolist()
  local zeros = 0
  for _, v in ipairs(yv) do if v == 0 then zeros = zeros + 1 end end
  lu.assertTrue(zeros > 24 and zeros < 56, "zeros " .. zeros)  -- 24 causal ones, a quarter of the rest
  x.grad = nil
  local g, yg = gc.Graph(), nil
  gc.manual_seed(7)
  g:capture(function ()
    yg = gc.F.dropout(gc.F.softmax(x, {causal = true}), 0.25)
    ;(yg * r):sum():backward()
  end)
  gc.manual_seed(7)
  g:replay()
  H.assert_bitwise(H.flat(yg:tolist()), yv, "replayed dropout of attention weights")
  H.assert_bitwise(x.grad:tolist(), gv, "replayed grads")
end

-- Attention in double: q [B.., Sq, D], k [B.., Sk, D], v [B.., Sk, Dv] flat;
-- o: {scale, mask, mshape, bool, causal} as ref_softmax's.
local function ref_sdpa (q, k, v, qs, ks, vs, o)
  local sq, d, sk, dv = qs[#qs - 1], qs[#qs], ks[#ks - 1], vs[#vs]
  local batch = #q // (sq * d)
  local ss = table.move(qs, 1, #qs - 1, 1, {})
  ss[#ss + 1] = sk
  local scores = {}
  for b = 0, batch - 1 do
    for i = 0, sq - 1 do
      for j = 0, sk - 1 do
        local s = 0
        for l = 0, d - 1 do s = s + q[(b * sq + i) * d + l + 1] * k[(b * sk + j) * d + l + 1] end
        scores[#scores + 1] = s
      end
    end
  end
  local p = ref_softmax(scores, ss, {scale = o.scale or 1 / math.sqrt(d), mask = o.mask,
                                     mshape = o.mshape, bool = o.bool, causal = o.causal})
  local y = {}
  for b = 0, batch - 1 do
    for i = 0, sq - 1 do
      for c = 0, dv - 1 do
        local s = 0
        for j = 0, sk - 1 do s = s + p[(b * sq + i) * sk + j + 1] * v[(b * sk + j) * dv + c + 1] end
        y[#y + 1] = s
      end
    end
  end
  return y
end

function TestAttentionOps:test_sdpa_values_and_grads ()
  local qs, ks, vs = {2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 3}
  local function inputs (extra)
    local t = {{qs, H.values(numel(qs), 0.1)}, {ks, H.values(numel(ks), 0.5)},
               {vs, H.values(numel(vs), 0.9)}}
    if extra then t[4] = extra end
    return t
  end
  H.gradcheck("sdpa", inputs(),
              function (q, k, v) return gc.F.scaled_dot_product_attention(q, k, v) end,
              function (q, k, v) return ref_sdpa(q, k, v, qs, ks, vs, {}) end)
  H.gradcheck("sdpa causal, scale 0.3", inputs(),
              function (q, k, v)
                return gc.F.scaled_dot_product_attention(q, k, v, {is_causal = true, scale = 0.3})
              end,
              function (q, k, v) return ref_sdpa(q, k, v, qs, ks, vs, {causal = true, scale = 0.3}) end)
  local ms = {2, 1, 3, 5}
  local m = H.values(numel(ms), 0.7, 2)
  H.gradcheck("sdpa additive mask", inputs{ms, m, grad = false},
              function (q, k, v, mt)
                return gc.F.scaled_dot_product_attention(q, k, v, {attn_mask = mt})
              end,
              function (q, k, v) return ref_sdpa(q, k, v, qs, ks, vs, {mask = m, mshape = ms}) end)
  local b = bits(15)
  H.gradcheck("sdpa boolean mask", inputs{{3, 5}, b, grad = false},
              function (q, k, v, mt)
                return gc.F.scaled_dot_product_attention(q, k, v, {attn_mask_bool = mt})
              end,
              function (q, k, v)
                return ref_sdpa(q, k, v, qs, ks, vs, {mask = b, mshape = {3, 5}, bool = true})
              end)
end

-- With dropout, the op is the composition of the ops it names: equal to
-- matmul, softmax, dropout and matmul drawn from the same seed, bit for bit
-- on the host; captured with its backward, it replays to eager's values bit
-- for bit on every backend.
function TestAttentionOps:test_sdpa_dropout_composition_and_replay ()
  local function t (shape, ph) return gc.tensor(H.nest(H.values(numel(shape), ph), shape),
                                                {requires_grad = true}) end
  local q, k, v = t({2, 2, 6, 4}, 0.1), t({2, 2, 6, 4}, 0.2), t({2, 2, 6, 8}, 0.3)
  local mask = gc.tensor(H.nest(bits(36), {6, 6}))
  local opts = {dropout_p = 0.3, is_causal = true, attn_mask_bool = mask, scale = 0.4}
  gc.manual_seed(11)
  local y = gc.F.scaled_dot_product_attention(q, k, v, opts)
  gc.manual_seed(11)
  local s = gc.matmul(q, k:transpose(-1, -2))
  local p = gc.F.dropout(gc.F.softmax(s, {scale = 0.4, causal = true, mask_bool = mask}), 0.3)
  if gc.device() == "host" then
    H.assert_bitwise(H.flat(y:tolist()), H.flat(gc.matmul(p, v):tolist()), "composed")
  else  -- the op multiplies by k transposed in the GEMM, this by a transposed copy of k:
    -- cuBLAS picks another algorithm for each layout, summing in another order
    H.assert_close(H.flat(y:tolist()), H.flat(gc.matmul(p, v):tolist()), 1e-5, 1e-4, "composed")
  end
  local r = gc.tensor(H.nest(H.values(2 * 2 * 6 * 8, 1.3), {2, 2, 6, 8}))
  local function step ()
    local o = gc.F.scaled_dot_product_attention(q, k, v, opts)
    ;(o * r):sum():backward()
    return o
  end
  gc.manual_seed(5)
  local want_y = H.flat(step():tolist())
  local want = {q.grad:tolist(), k.grad:tolist(), v.grad:tolist()}
  q.grad, k.grad, v.grad = nil, nil, nil
  local g, yg = gc.Graph(), nil
  g:capture(function () yg = step() end)
  gc.manual_seed(5)
  g:replay()
  H.assert_bitwise(H.flat(yg:tolist()), want_y, "replayed output")
  for i, x in ipairs{q, k, v} do H.assert_bitwise(x.grad:tolist(), want[i], "replayed grad " .. i) end
end

-- The fused kernels against the composition: f32 outputs and the grads of
-- q, k and v equal bit for bit on the host (within the parity tolerance on
-- cuda, whose fused kernels sum in another order than its GEMMs), with masks,
-- causal, dropout, a scale, Sq /= Sk and D /= Dv; bf16 within its rounding.
function TestAttentionOps:test_sdpa_fused_equals_composed ()
  local function t (shape, ph, dt)
    return gc.tensor(H.nest(H.values(numel(shape), ph, 1.5), shape),
                     {requires_grad = true, dtype = dt or "f32"})
  end
  local cases = {
    {q = {2, 3, 5, 4}, k = {2, 3, 7, 4}, v = {2, 3, 7, 6}, opts = {}},
    {q = {2, 3, 6, 8}, k = {2, 3, 6, 8}, v = {2, 3, 6, 8},
     opts = {is_causal = true, dropout_p = 0.3, scale = 0.7}, mask = {{6, 6}, true}},
    {q = {2, 3, 5, 4}, k = {2, 3, 7, 4}, v = {2, 3, 7, 4}, opts = {}, mask = {{2, 1, 5, 7}, false}},
    {q = {4, 9, 16}, k = {4, 9, 16}, v = {4, 9, 16}, opts = {is_causal = true, dropout_p = 0.5}},
    {q = {3, 8}, k = {5, 8}, v = {5, 2}, opts = {dropout_p = 0.1}},
  }
  for ci, c in ipairs(cases) do
    for _, dt in ipairs{"f32", "bf16"} do
      local q, k, v = t(c.q, 0.1, dt), t(c.k, 0.2, dt), t(c.v, 0.3, dt)
      local r = gc.tensor(H.nest(H.values(numel(c.q) // c.q[#c.q] * c.v[#c.v], 0.9),
                                 (function ()
                                   local s = table.move(c.q, 1, #c.q, 1, {})
                                   s[#s] = c.v[#c.v]
                                   return s
                                 end)()), dt)
      local res = {}
      for _, impl in ipairs{"composed", "fused"} do
        local o = {impl = impl}
        for key, val in pairs(c.opts) do o[key] = val end
        if c.mask then
          local m = gc.tensor(H.nest(c.mask[2] and bits(numel(c.mask[1]))
                                     or H.values(numel(c.mask[1]), 0.4, 2), c.mask[1]))
          o[c.mask[2] and "attn_mask_bool" or "attn_mask"] = m
        end
        q.grad, k.grad, v.grad = nil, nil, nil
        gc.manual_seed(3)
        local y = gc.F.scaled_dot_product_attention(q, k, v, o)
        lu.assertEquals(tostring(y.grad_fn),  -- the path asked for ran
                        impl == "fused" and "scaled_dot_product_attention" or "matmul")
        ;(y * r):sum():backward()
        res[impl] = {H.flat(y:tolist()), H.flat(q.grad:tolist()), H.flat(k.grad:tolist()),
                     H.flat(v.grad:tolist())}
      end
      for i, what in ipairs{"output", "grad q", "grad k", "grad v"} do
        local name = string.format("case %d %s %s", ci, dt, what)
        if dt == "f32" and gc.device() == "host" then
          H.assert_bitwise(res.fused[i], res.composed[i], name)
        elseif dt == "f32" then
          H.assert_close(res.fused[i], res.composed[i], 1e-4, 1e-4, name)
        else  -- the composition rounds its scores and weights to bf16
          H.assert_close(res.fused[i], res.composed[i], 0.05, 0.05, name)
        end
      end
    end
  end
end

-- The fused path's grads by central differences, and its captured forward
-- and backward (dropout and a boolean mask) replayed equal to eager.
function TestAttentionOps:test_sdpa_fused_grads_and_replay ()
  local qs, ks, vs = {2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 3}
  local b = bits(15)
  H.gradcheck("sdpa fused, causal, boolean mask",
              {{qs, H.values(numel(qs), 0.1)}, {ks, H.values(numel(ks), 0.5)},
               {vs, H.values(numel(vs), 0.9)}, {{3, 5}, b, grad = false}},
              function (q, k, v, mt)
                return gc.F.scaled_dot_product_attention(q, k, v, {attn_mask_bool = mt,
                                                                   is_causal = true,
                                                                   impl = "fused"})
              end,
              function (q, k, v)
                return ref_sdpa(q, k, v, qs, ks, vs, {mask = b, mshape = {3, 5}, bool = true,
                                                      causal = true})
              end)
  local function t (shape, ph)
    return gc.tensor(H.nest(H.values(numel(shape), ph), shape), {requires_grad = true})
  end
  local q, k, v = t({2, 2, 6, 4}, 0.1), t({2, 2, 6, 4}, 0.2), t({2, 2, 6, 4}, 0.3)
  local r = gc.tensor(H.nest(H.values(96, 1.3), {2, 2, 6, 4}))
  local opts = {dropout_p = 0.25, attn_mask_bool = gc.tensor(H.nest(bits(36), {6, 6})),
                impl = "fused"}
  local function step ()
    local o = gc.F.scaled_dot_product_attention(q, k, v, opts)
    ;(o * r):sum():backward()
    return o
  end
  gc.manual_seed(9)
  local want_y = H.flat(step():tolist())
  local want = {q.grad:tolist(), k.grad:tolist(), v.grad:tolist()}
  q.grad, k.grad, v.grad = nil, nil, nil
  local g, yg = gc.Graph(), nil
  g:capture(function () yg = step() end)
  for _ = 1, 2 do
    gc.manual_seed(9)
    g:replay()
    H.assert_bitwise(H.flat(yg:tolist()), want_y, "replayed output")
    for i, x in ipairs{q, k, v} do H.assert_bitwise(x.grad:tolist(), want[i], "replayed grad " .. i) end
  end
end

-- regression: the fused backward wrote the D of its rows into the saved stats, so a second
-- backward with retain_graph was refused, naming that internal buffer
-- The fused backward keeps what the forward saved as it was: a second
-- backward (retain_graph on the first) adds the same grads again, with
-- dropout and a mask too.
function TestAttentionOps:test_sdpa_fused_second_backward ()
  local function t (shape, ph)
    return gc.tensor(H.nest(H.values(numel(shape), ph), shape), {requires_grad = true})
  end
  local q, k, v = t({2, 2, 5, 4}, 0.3), t({2, 2, 6, 4}, 0.6), t({2, 2, 6, 3}, 0.9)
  local r = gc.tensor(H.nest(H.values(60, 1.7), {2, 2, 5, 3}))
  local o = gc.F.scaled_dot_product_attention(q, k, v, {dropout_p = 0.2, is_causal = true,
                                                        attn_mask_bool = gc.tensor(H.nest(bits(30), {5, 6})),
                                                        impl = "fused"})
  o:backward(r, {retain_graph = true})
  local once = {q.grad:tolist(), k.grad:tolist(), v.grad:tolist()}
  o:backward(r)
  for i, x in ipairs{q, k, v} do
    H.assert_bitwise(x.grad:tolist(), (gc.tensor(once[i]) * 2):tolist(), "grad " .. i .. " twice")
  end
end

-- A step through every op of this suite (embedding, batched matmul with a
-- broadcast operand, transpose, the masked causal softmax, masked_fill,
-- split and cat, attention both ways), forward and backward, in f32 and
-- bf16: captured, each replay equals an eager step bit for bit, on new
-- inputs too; bf16 stays near f32.
local function every_op_step (p)
  local x = gc.F.embedding(p.ids, p.emb)                        -- [2, 6, 8]
  local h = gc.matmul(x, p.w)                                   -- [2, 6, 8] x [8, 8]
  local s = gc.matmul(h, x:transpose(-1, -2))                   -- [2, 6, 6]
  local a = gc.F.softmax(s, {scale = 0.3, causal = true, mask = p.add})
  local f = gc.masked_fill(a, p.drop, 0)
  local q, k = table.unpack(gc.chunk(gc.matmul(f, h), 2, -1))  -- [2, 6, 4] each
  local o1 = gc.F.scaled_dot_product_attention(q, k, k, {impl = "composed", is_causal = true})
  local o2 = gc.F.scaled_dot_product_attention(q, k, q, {impl = "fused", attn_mask_bool = p.drop})
  local loss = (gc.cat({o1, o2}, 3) * p.r):sum()
  loss:backward()
  return loss
end

local function every_op_params (dt)
  local function t (shape, ph, grad)
    return gc.tensor(H.nest(H.values(numel(shape), ph), shape), {requires_grad = grad, dtype = dt})
  end
  return {ids = gc.tensor(H.nest({1, 4, 0, 2, 2, 3, 4, 4, 1, 0, 3, 2}, {2, 6})),
          emb = t({5, 8}, 0.1, true), w = t({8, 8}, 0.2, true),
          add = gc.tensor(H.nest(H.values(36, 0.6), {6, 6})),
          drop = gc.tensor(H.nest(bits(12), {2, 1, 6})),
          r = t({2, 6, 8}, 0.4, false)}
end

function TestAttentionOps:test_every_op_captured_replays_equal_eager ()
  local ref
  for _, dt in ipairs{"f32", "bf16"} do
    local p = every_op_params(dt)
    local want_l = every_op_step(p):tolist()
    local want = {p.emb.grad:tolist(), p.w.grad:tolist()}
    p.emb.grad, p.w.grad = nil, nil
    local g, l = gc.Graph(), nil
    g:capture(function () l = every_op_step(p) end)
    g:replay()
    H.assert_bitwise({l:tolist()}, {want_l}, dt .. " loss")
    H.assert_bitwise(p.emb.grad:tolist(), want[1], dt .. " grad of the embedding")
    H.assert_bitwise(p.w.grad:tolist(), want[2], dt .. " grad of w")
    -- new weights in the same memory: eager and the replay still agree
    gc.no_grad(function () p.w:copy_(p.w * 0.5) end)
    p.emb.grad, p.w.grad = nil, nil
    want_l = every_op_step(p):tolist()
    want = {p.emb.grad:tolist(), p.w.grad:tolist()}
    g:replay()
    H.assert_bitwise({l:tolist()}, {want_l}, dt .. " loss, new weights")
    H.assert_bitwise(p.w.grad:tolist(), want[2], dt .. " grad of w, new weights")
    if dt == "f32" then
      ref = {want_l, H.flat(want[1]), H.flat(want[2])}
    else
      H.assert_close({want_l}, {ref[1]}, 0.05, 0.03, "bf16 loss near f32")
      H.assert_close(H.flat(want[2]), ref[3], 0.1, 0.05, "bf16 grad of w near f32")
    end
  end
end

-- Why cuDNN cannot run on this cuda engine at all (a build without it, or no
-- libcudnn.so.9), or nil: then impl "cudnn" must work.
local function cudnn_missing ()
  local q = gc.zeros({1, 1, 16, 8}, {dtype = "bf16"})
  local ok, err = pcall(gc.F.scaled_dot_product_attention, q, q, q, {impl = "cudnn"})
  err = tostring(err)
  if not ok and (err:find("this build has no cuDNN", 1, true)
                 or err:find("could not be loaded", 1, true)) then
    return err
  end
end

-- cuDNN's dropout (bf16, training): a graphed step drops what the eager step
-- drops, bit for bit, forward and grads; the generator moves on, so the next
-- call drops others; about p of the weights are dropped and the kept ones
-- scaled by 1 / (1 - p): with equal scores and v all ones, each output is
-- the kept fraction of its row over (1 - p).
function TestAttentionOps:test_sdpa_cudnn_dropout ()
  lu.skipIf(gc.device() == "host", "cuDNN runs on the cuda backend only")
  local missing = cudnn_missing()
  lu.skipIf(missing ~= nil, tostring(missing))
  local shape, p = {2, 4, 256, 64}, 0.25
  local function f (q, k, v)
    return gc.F.scaled_dot_product_attention(q, k, v, {dropout_p = p, impl = "cudnn"})
  end
  local function t (ph, grad)
    return gc.tensor(H.nest(H.values(numel(shape), ph, 1.5), shape),
                     {requires_grad = grad, dtype = "bf16"})
  end
  local G = gc.make_graphed_callables(f, {t(0.1, true), t(0.2, true), t(0.3, true)})
  for step = 1, 2 do
    local state = gc.get_rng_state()
    local xe = {t(step, true), t(step + 0.4, true), t(step + 0.7, true)}
    local ye = f(table.unpack(xe))
    local after = gc.get_rng_state()
    gc.set_rng_state(state)
    local xg = {t(step, true), t(step + 0.4, true), t(step + 0.7, true)}
    local yg = G(table.unpack(xg))
    lu.assertEquals(gc.get_rng_state(), after)
    H.assert_bitwise(H.flat(yg:tolist()), H.flat(ye:tolist()), "step " .. step .. ": output")
    local r = t(0.9 + step, false)
    ;(ye * r):sum():backward()
    ;(yg * r):sum():backward()
    for i = 1, 3 do
      H.assert_bitwise(H.flat(xg[i].grad:tolist()), H.flat(xe[i].grad:tolist()),
                       "step " .. step .. ": grad " .. i)
    end
  end
  local z = gc.zeros(shape, {dtype = "bf16"})
  local ones = gc.ones(shape, {dtype = "bf16"})
  local a = H.flat(f(z, z, ones):tolist())
  local b = H.flat(f(z, z, ones):tolist())
  local sum, differ = 0, 0
  for i = 1, #a do
    sum = sum + a[i]
    if a[i] ~= b[i] then differ = differ + 1 end
  end
  lu.assertTrue(differ > #a / 2, "two calls drop other weights: " .. differ .. " of " .. #a)
  -- each output: kept / 256 / (1 - p); their mean is 1 within bf16 and sampling
  lu.assertTrue(math.abs(sum / #a - 1) < 0.02, "mean output " .. sum / #a)
end

-- cuDNN's attention, graphed by make_graphed_callables, equals its eager
-- calls bit for bit (outputs and grads, causal or not, on new inputs): its
-- forward and its deterministic backward give the same bits every run.
-- "auto" takes it here; an upstream grad at an offset that breaks alignment
-- gives the grads of an aligned copy.
function TestAttentionOps:test_sdpa_cudnn_graphed_equals_eager ()
  lu.skipIf(gc.device() == "host", "cuDNN runs on the cuda backend only (the host runs the "
                                   .. "composition, the reference)")
  local missing = cudnn_missing()
  lu.skipIf(missing ~= nil, tostring(missing))
  local shape = {2, 2, 128, 64}
  local function t (ph, grad)
    return gc.tensor(H.nest(H.values(numel(shape), ph, 1.5), shape),
                     {requires_grad = grad, dtype = "bf16"})
  end
  for _, causal in ipairs{false, true} do
    local function f (q, k, v)
      return gc.F.scaled_dot_product_attention(q, k, v, {is_causal = causal, impl = "cudnn"})
    end
    local G = gc.make_graphed_callables(f, {t(0.1, true), t(0.2, true), t(0.3, true)})
    for step = 1, 2 do
      local r = t(0.9 + step, false)
      local xe = {t(step, true), t(step + 0.4, true), t(step + 0.7, true)}
      local xg = {t(step, true), t(step + 0.4, true), t(step + 0.7, true)}
      local ye, yg = f(table.unpack(xe)), G(table.unpack(xg))
      local what = string.format("causal %s, step %d", causal, step)
      H.assert_bitwise(H.flat(yg:tolist()), H.flat(ye:tolist()), what .. ": output")
      ;(ye * r):sum():backward()
      ;(yg * r):sum():backward()
      for i = 1, 3 do
        H.assert_bitwise(H.flat(xg[i].grad:tolist()), H.flat(xe[i].grad:tolist()),
                         what .. ": grad " .. i)
      end
    end
  end
  local q, k, v = t(0.1, true), t(0.2, true), t(0.3, true)
  local y = gc.F.scaled_dot_product_attention(q, k, v, {is_causal = true})
  lu.assertEquals(tostring(y.grad_fn), "scaled_dot_product_attention")  -- auto: cuDNN
  local want = H.flat(gc.F.scaled_dot_product_attention(q, k, v, {is_causal = true,
                                                                  impl = "cudnn"}):tolist())
  H.assert_bitwise(H.flat(y:tolist()), want, "auto's output")
  local g = t(0.5, false)
  local buf = gc.zeros({numel(shape) + 1}, {dtype = "bf16"})
  local ga = gc.empty(shape, {dtype = "bf16"})
  ga:set_(buf, 1)  -- 2 bytes past an aligned address
  gc.no_grad(function () ga:copy_(g) end)
  y:backward(ga, {retain_graph = true})
  local grads = {q.grad:tolist(), k.grad:tolist(), v.grad:tolist()}
  q.grad, k.grad, v.grad = nil, nil, nil
  y:backward(g)
  for i, x in ipairs{q, k, v} do
    H.assert_bitwise(H.flat(x.grad:tolist()), H.flat(grads[i]), "grad " .. i .. ", do unaligned")
  end
end

function TestAttentionOps:test_sdpa_errors ()
  local q, k, v = gc.zeros{2, 3, 4}, gc.zeros{2, 5, 4}, gc.zeros{2, 5, 6}
  local F = gc.F
  H.assert_err(function () return F.scaled_dot_product_attention(q, gc.zeros{2, 5, 3}, v) end,
               HERE, "scaled_dot_product_attention: expected q [..., Sq, D], k [..., Sk, D], "
                     .. "v [..., Sk, Dv] of one engine and dtype with equal batch dims; got q f32 "
                     .. "[2, 3, 4], k f32 [2, 5, 3], v f32 [2, 5, 6]")
  H.assert_err(function () return F.scaled_dot_product_attention(q, k, gc.zeros{3, 5, 6}) end,
               HERE, "got q f32 [2, 3, 4], k f32 [2, 5, 4], v f32 [3, 5, 6]")
  H.assert_err(function () return F.scaled_dot_product_attention(q, k, v, {dropout_p = 1}) end,
               HERE, "scaled_dot_product_attention: dropout_p must be in [0, 1), got 1")
  H.assert_err(function () return F.scaled_dot_product_attention(q, k, v, {scale = 0}) end,
               HERE, "scaled_dot_product_attention: option 'scale' must be a positive finite number")
  H.assert_err(function () return F.scaled_dot_product_attention(q, k, v, {attn_mask = gc.zeros{4, 5}}) end,
               HERE, "scaled_dot_product_attention: the attn_mask [4, 5] does not broadcast to [2, 3, 5]")
  H.assert_err(function () return F.scaled_dot_product_attention(q, k, v, {impl = "flash"}) end,
               HERE, "scaled_dot_product_attention: option 'impl' must be 'auto', 'composed', "
                     .. "'fused' or 'cudnn', got flash")
  H.assert_err(function () return F.scaled_dot_product_attention(q, k, v, {impl = "cudnn"}) end,
               HERE, "scaled_dot_product_attention: impl 'cudnn' cannot run this call: "
                     .. (gc.device() == "host"
                         and "the host backend has no cuDNN (it runs the composition, the reference)"
                         or "cuDNN's fused attention takes bf16 tensors, got f32"))
  H.assert_err(function ()
                 return F.scaled_dot_product_attention(gc.zeros{2, 129}, gc.zeros{2, 129},
                                                       gc.zeros{2, 3}, {impl = "fused"})
               end,
               HERE, "scaled_dot_product_attention: the fused kernel takes head dims up to 128, "
                     .. "got D 129 and Dv 3")
  H.assert_err(function () return F.scaled_dot_product_attention(q, k, v, {causal = true}) end,
               HERE, "scaled_dot_product_attention: unknown option 'causal'")
  H.assert_err(function () return F.scaled_dot_product_attention(q, k, v, {attn_mask = 1}) end,
               HERE, "scaled_dot_product_attention: option 'attn_mask' must be a tensor, got number")
  local closed = gc.zeros{3, 5}
  closed:close()
  H.assert_err(function () return F.scaled_dot_product_attention(q, k, v, {attn_mask_bool = closed}) end,
               HERE, "scaled_dot_product_attention: option 'attn_mask_bool' is a closed tensor")
  -- after the errors the inputs are as they were and the op works
  lu.assertEquals(F.scaled_dot_product_attention(q, k, v):shape(), {2, 3, 6})
end

-- A head dim D of 0 is one answer whatever the implementation, naming D:
-- "composed" failed on the scale 1 / sqrt(0) and "fused" gave an empty result.
function TestAttentionOps:test_head_dim_zero ()
  local q, F = gc.zeros{2, 3, 0}, gc.F
  for _, impl in ipairs({"auto", "composed", "fused"}) do
    for _, scale in ipairs({0.5, false}) do
      H.assert_err(function ()
        return F.scaled_dot_product_attention(q, gc.zeros{2, 5, 0}, gc.zeros{2, 5, 4},
                                              {impl = impl, scale = scale or nil})
      end, HERE, "scaled_dot_product_attention: the head dim D of q and k is 0 (q [2, 3, 0]); D "
                 .. "must be positive")
    end
  end
end

os.exit(lu.LuaUnit.run(), true)
