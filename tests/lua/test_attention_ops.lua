-- test_attention_ops.lua: the ops of attention (docs/lua-api.md, "Functions"):
-- batched gc.matmul, gc.F.softmax with a scale, masks and causal,
-- gc.F.masked_fill, gc.F.embedding, gc.F.dropout on 4-D attention weights and
-- gc.F.scaled_dot_product_attention: values and grads against double-precision
-- references (central differences), a captured forward and backward replayed
-- equal to eager bit for bit, and their errors.
--   build/graphcap tests/lua/test_attention_ops.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
-- The shared helpers, from this file's directory (whatever the working directory).
local H = dofile(debug.getinfo(1, "S").source:match("^@?(.-)[^/\\]*$") .. "helpers.lua")

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

os.exit(lu.LuaUnit.run())
