-- test_fp8.lua: the recipes, gc.fp8.autocast and the modules' FP8 state
-- (docs/lua-api.md, "FP8"). Delayed scaling over several steps equals a
-- plain-Lua reference of TransformerEngine's rule; an FP8 Linear equals the
-- composition of gc.fp8.cast and the f32 linear, forward and backward, bit
-- for bit on the host (within a stated tolerance on cuda); current scaling
-- takes each tensor's own amax; errors name the field, the module and the
-- shape, and leave everything usable.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_fp8.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

local same = H.assert_same

-- x rounded to the nearest float, as the device stores it.
local function fround (x) return (string.unpack("f", string.pack("f", x))) end

local function amax_of (t)
  local m = 0
  for _, v in ipairs(H.flat(t:tolist())) do if math.abs(v) > m then m = math.abs(v) end end
  return m
end

-- TransformerEngine's delayed scaling, in plain Lua: one role's state.
local function ref_role (len, algo, fp8_max, margin)
  local r = {scale = 1.0, hist = {}}
  for i = 1, len do r.hist[i] = 0 end
  function r.step (amax)
    if amax == 0 then return end -- nothing quantized: the role stays
    table.insert(r.hist, 1, amax)
    r.hist[len + 1] = nil
    local m = amax
    if algo == "max" then
      m = 0
      for _, a in ipairs(r.hist) do if a > m then m = a end end
    end
    if m > 0 and m < math.huge then
      local s = fround(fround(fp8_max * 2.0 ^ -margin) / m)
      r.scale = s == math.huge and 3.4028234663852886e38 or s
    end
  end
  return r
end

local function assert_role (got, want, what)
  lu.assertEquals(got.scale, want.scale, what .. ": scale")
  H.assert_bitwise(got.amax_history, want.hist, what .. ": amax_history")
end

TestFp8Recipes = {}

function TestFp8Recipes:test_defaults_and_names ()
  local r = gc.fp8.DelayedScaling()
  lu.assertEquals({r.fp8_format, r.margin, r.amax_history_len, r.amax_compute_algo},
                  {"HYBRID", 0, 1024, "max"})
  lu.assertTrue(gc.fp8.is_recipe(r))
  lu.assertEquals(gc.fp8.Float8CurrentScaling().fp8_format, "HYBRID")
  lu.assertEquals(gc.fp8.DelayedScaling{fp8_format = gc.fp8.Format.E4M3}.fp8_format, "E4M3")
  local ok = gc.fp8.is_available()
  lu.assertEquals(ok, true) -- the host emulates; the GPUs tested have FP8
end

function TestFp8Recipes:test_errors_name_the_field ()
  local D = gc.fp8.DelayedScaling
  H.assert_err(function () D{margin = 1 / 0} end, "DelayedScaling: margin must be a finite number")
  H.assert_err(function () D{margin = 0 / 0} end, "margin must be a finite number")
  H.assert_err(function () D{amax_history_len = 0} end, "amax_history_len must be >= 1, got 0")
  H.assert_err(function () D{amax_compute_algo = "mean"} end,
               "amax_compute_algo must be \"max\" or \"most_recent\", got \"mean\"")
  H.assert_err(function () D{fp8_format = "E5M2"} end, "Pure E5M2 training is not supported")
  H.assert_err(function () D{fp8_format = "E3M4"} end, "fp8_format must be \"HYBRID\" or")
  H.assert_err(function () D{amax_history_length = 4} end, "unknown option 'amax_history_length'")
  H.assert_err(function () gc.fp8.Float8CurrentScaling{margin = 1} end, "unknown option 'margin'")
  local err = H.assert_err(function () gc.fp8.autocast({recipe = {fp8_format = "HYBRID"}},
                                                       function () end) end,
                           "fp8.autocast: recipe must be a recipe object")
  lu.assertStrContains(err, "test_fp8.lua:")
  H.assert_err(function () gc.fp8.autocast({recipe = D(), fp8_recipe = D()}, print) end,
               "options 'recipe' and 'fp8_recipe' are one option")
  H.assert_err(function () gc.fp8.autocast({enabled = 1}, print) end,
               "enabled must be a boolean")
end

-- An FP8 Linear's forward and backward equal the composition of the casts
-- with the role scales it had, step by step, and its state the reference.
-- An output size that is no multiple of 16 pads the dgrad's operands. A
-- bf16 Linear (dt "bf16") equals the composition in f32 rounded to bf16
-- once: an FP8 GEMM multiplies the FP8 values as they are, rounding no
-- operand to the output's dtype.
local function check_linear_steps (recipe, steps, out, dt)
  gc.manual_seed(3)
  dt = dt or "f32"
  local lin = gc.nn.Linear(16, out or 32):to(dt)
  local len, algo = recipe.amax_history_len, recipe.amax_compute_algo
  local grad_max = recipe.fp8_format == "HYBRID" and 57344 or 448
  local ref = {input = ref_role(len, algo, 448, recipe.margin),
               weight = ref_role(len, algo, 448, recipe.margin),
               grad_output = ref_role(len, algo, grad_max, recipe.margin)}
  local gfmt = recipe.fp8_format == "HYBRID" and "E5M2" or "E4M3"
  local function want (t) return t:to(dt):tolist() end
  for step = 1, steps do
    local x = (gc.randn({8, 16}) * gc.tensor(step * 1.5)):to(dt)
    x.requires_grad = true
    local g = (gc.randn({8, out or 32}) * gc.tensor(0.25 * step)):to(dt)
    lin:zero_grad()
    local y = gc.fp8.autocast({recipe = recipe}, function () return lin(x) end)
    y:backward(g)
    -- the composition in f32 with the scales the reference held before this
    -- step, through F.linear's GEMMs (a matmul of a transposed copy may take
    -- another GEMM kernel, summing in another order on cuda)
    local xd = gc.fp8.cast(x:detach():float(), "E4M3", ref.input.scale)
    local wd = gc.fp8.cast(lin.weight:detach():float(), "E4M3", ref.weight.scale)
    local gd = gc.fp8.cast(g:float(), gfmt, ref.grad_output.scale)
    xd.requires_grad, wd.requires_grad = true, true
    local yr = gc.F.linear(xd, wd, lin.bias:detach():float())
    yr:backward(gd)
    H.assert_fp8_gemm(y:tolist(), want(yr), "y " .. step, dt)
    H.assert_fp8_gemm(x.grad:tolist(), want(xd.grad), "dx " .. step, dt)
    H.assert_fp8_gemm(lin.weight.grad:tolist(), want(wd.grad), "dw " .. step, dt)
    -- the bias grad sums the unquantized grad's rows (in the grad's cast)
    local db, tol = {}, dt == "bf16" and 1e-2 or 1e-5
    for _, row in ipairs(g:float():tolist()) do
      for j, v in ipairs(row) do db[j] = (db[j] or 0) + v end
    end
    H.assert_close(lin.bias.grad:float():tolist(), db, tol, tol, "db " .. step)
    ref.input.step(amax_of(x))
    ref.weight.step(amax_of(lin.weight))
    ref.grad_output.step(amax_of(g))
    local st = lin:fp8_state()
    for _, role in ipairs({"input", "weight", "grad_output"}) do
      assert_role(st[role], ref[role], string.format("step %d %s", step, role))
    end
  end
end

function TestFp8Recipes:test_delayed_scaling_max ()
  check_linear_steps(gc.fp8.DelayedScaling{amax_history_len = 3}, 5)
end

function TestFp8Recipes:test_delayed_scaling_most_recent_margin_e4m3 ()
  check_linear_steps(gc.fp8.DelayedScaling{amax_history_len = 2, amax_compute_algo = "most_recent",
                                           margin = 1, fp8_format = "E4M3"}, 4)
end

function TestFp8Recipes:test_delayed_scaling_padded_dgrad ()
  check_linear_steps(gc.fp8.DelayedScaling{amax_history_len = 2}, 3, 24)
end

function TestFp8Recipes:test_delayed_scaling_bf16 ()
  check_linear_steps(gc.fp8.DelayedScaling{amax_history_len = 3}, 4, nil, "bf16")
  check_linear_steps(gc.fp8.DelayedScaling{amax_history_len = 2}, 3, 24, "bf16")
end

function TestFp8Recipes:test_current_scaling ()
  gc.manual_seed(4)
  local lin = gc.nn.Linear(16, 16, {bias = false})
  local x = gc.randn({16, 16}) * gc.tensor(7)
  local y = gc.fp8.autocast({recipe = gc.fp8.Float8CurrentScaling()}, function () return lin(x) end)
  local function cur (t) return (gc.fp8.cast(t, "E4M3", fround(448 / fround(amax_of(t))))) end
  H.assert_fp8_gemm(y:tolist(), gc.F.linear(cur(x), cur(lin.weight:detach())):tolist(), "y")
  lu.assertEquals(lin:fp8_state().input.scale, 1, "current scaling keeps no state")
end

function TestFp8Recipes:test_outside_autocast_no_fp8 ()
  local lin = gc.nn.Linear(16, 16)
  local x = gc.randn({8, 16})
  lu.assertEquals(lin(x).grad_fn, "linear")
  lu.assertEquals(gc.fp8.autocast(function () return lin(x) end).grad_fn, "fp8_linear")
  lu.assertEquals(gc.fp8.autocast({enabled = false}, function () return lin(x) end).grad_fn,
                  "linear")
  -- nested: the inner one ends, the outer one holds again
  gc.fp8.autocast(function ()
    gc.fp8.autocast({enabled = false}, function () lu.assertEquals(lin(x).grad_fn, "linear") end)
    lu.assertEquals(lin(x).grad_fn, "fp8_linear")
  end)
  lu.assertEquals(lin(x).grad_fn, "linear")
  local st = lin:fp8_state()
  lu.assertEquals(#st.input.amax_history, 1024, "the default history")
end

-- An empty batch (0 rows: a multiple of 8) runs its GEMMs over no rows:
-- the weight grad is zeros, the bias grad zeros, as the linear outside FP8.
function TestFp8Recipes:test_empty_batch ()
  local recipes = {gc.fp8.DelayedScaling{amax_history_len = 2}, gc.fp8.Float8CurrentScaling{}}
  for _, recipe in ipairs(recipes) do
    local lin = gc.nn.Linear(16, 32)
    local x = gc.zeros({0, 16}, {requires_grad = true})
    local y = gc.fp8.autocast({recipe = recipe}, function () return lin(x) end)
    lu.assertEquals(y:shape(), {0, 32})
    lu.assertEquals(y.grad_fn, "fp8_linear")
    y:sum():backward()
    H.assert_bitwise(lin.weight.grad:tolist(), gc.zeros({32, 16}):tolist(), "weight grad")
    H.assert_bitwise(lin.bias.grad:tolist(), gc.zeros({32}):tolist(), "bias grad")
    lu.assertEquals(x.grad:shape(), {0, 16})
  end
end

function TestFp8Recipes:test_shapes_errors_and_state_kept ()
  local r = gc.fp8.DelayedScaling{amax_history_len = 2}
  local lnl = gc.nn.LayerNormLinear(16, 16)
  gc.fp8.autocast({recipe = r}, function () lnl(gc.randn({8, 16})) end)
  local before = lnl:fp8_state()
  local err = H.assert_err(function ()
    gc.fp8.autocast({recipe = r}, function () return lnl(gc.randn({4, 16})) end)
  end, "LayerNormLinear: FP8 execution requires the product of all dimensions except the last to "
       .. "be divisible by 8 and the last dimension to be divisible by 16, but got input with "
       .. "dims=[4, 16] (product of leading dims = 4, last dim = 16)")
  lu.assertStrContains(err, "test_fp8.lua:")
  H.assert_err(function ()
    gc.fp8.autocast({recipe = r}, function () return gc.nn.Linear(16, 12)(gc.randn({8, 16})) end)
  end, "Linear: FP8 execution requires", "got weight with dims=[12, 16]")
  same(lnl:fp8_state(), before, "the state after the error")
  lu.assertEquals(lnl(gc.randn({4, 16})):shape(), {4, 16}, "usable outside the autocast")
  H.assert_err(function ()
    gc.fp8.autocast({recipe = r}, function () error("inside") end)
  end, "inside")
  lu.assertEquals(lnl(gc.randn({8, 16})).grad_fn ~= "fp8_linear", true, "autocast ended")
end

function TestFp8Recipes:test_transformer_modules ()
  local r = gc.fp8.DelayedScaling{amax_history_len = 4}
  local mlp = gc.nn.LayerNormMLP(16, 32)
  local layer = gc.nn.TransformerLayer(16, 32, 2, {hidden_dropout = 0, attention_dropout = 0})
  local x = gc.randn({8, 2, 16}, {requires_grad = true})
  gc.fp8.autocast({recipe = r}, function ()
    mlp(x):sum():backward()
    layer(x):sum():backward()
  end)
  local st = mlp:fp8_state()
  lu.assertTrue(st.fc1.input.amax_history[1] > 0 and st.fc2.grad_output.amax_history[1] > 0)
  lu.assertEquals(#st.fc2.weight.amax_history, 4)
  lu.assertNil(layer:fp8_state(), "TransformerLayer's GEMMs are its children's")
  local qkv = layer.self_attention.layernorm_qkv:fp8_state()
  lu.assertTrue(qkv.input.scale ~= 1 and qkv.grad_output.amax_history[1] > 0, "qkv ran in FP8")
  lu.assertTrue(layer.self_attention.proj:fp8_state().weight.amax_history[1] > 0)
  lu.assertTrue(layer.layernorm_mlp:fp8_state().fc2.input.amax_history[1] > 0)
end

-- A checkpointed LayerNormMLP under an FP8 autocast equals the one that is
-- not, bit for bit, over steps of both recipes: its backward recomputes the
-- forward with the scales that forward read, updating no role twice.
-- Graphed, it equals its eager steps; with fp8_weight_caching it is refused
-- by name (the recomputation would not see the cached weight).
function TestFp8Recipes:test_layernorm_mlp_checkpoint ()
  for _, r in ipairs({gc.fp8.DelayedScaling{amax_history_len = 3}, gc.fp8.Float8CurrentScaling()}) do
    local function mlp (ckpt)
      gc.manual_seed(21)
      return gc.nn.LayerNormMLP(16, 32, {checkpoint = ckpt})
    end
    local plain, ckpt = mlp(false), mlp(true)
    for step = 1, 4 do
      gc.manual_seed(50 + step)
      local x = gc.randn({8, 16}) * gc.tensor(step)
      local g = gc.randn({8, 16})
      local got = {}
      for i, m in ipairs({plain, ckpt}) do
        local xi = x:clone():requires_grad_(true)
        m:zero_grad()
        local y = gc.fp8.autocast({recipe = r}, function () return m(xi) end)
        y:backward(g)
        local ps = {}
        for k, p in ipairs(m:parameters()) do ps[k] = p.grad:tolist() end
        got[i] = {y = y:tolist(), dx = xi.grad:tolist(), grads = ps, state = m:fp8_state()}
      end
      H.assert_same(got[2], got[1], "step " .. step)
    end
  end
  local R = gc.fp8.DelayedScaling{amax_history_len = 3}
  local function mlp ()
    gc.manual_seed(22)
    return gc.nn.LayerNormMLP(16, 32, {checkpoint = true})
  end
  local eager, graphed = mlp(), mlp()
  gc.make_graphed_callables(graphed, {gc.randn({8, 16}, {requires_grad = true})},
                            {fp8_enabled = true, fp8_recipe = R})
  for step = 1, 3 do
    gc.manual_seed(70 + step)
    local x, g = gc.randn({8, 16}), gc.randn({8, 16})
    H.fp8_step_pair(eager, graphed, R, x, g, "graphed step " .. step)
    H.assert_same(graphed:fp8_state(), eager:fp8_state(), "graphed state " .. step)
  end
  H.assert_err(function ()
    gc.make_graphed_callables(mlp(), {gc.randn({8, 16})}, {fp8_enabled = true, fp8_recipe = R,
                                                          fp8_weight_caching = true})
  end, "LayerNormMLP: checkpoint = true does not run with fp8_weight_caching")
  -- a call under a recipe of another history length makes a new state: the
  -- earlier checkpoint cannot repeat its forward, and says so
  local m, x = mlp(), gc.randn({8, 16}, {requires_grad = true})
  local y1 = gc.fp8.autocast({recipe = R}, function () return m(x) end)
  local y2 = gc.fp8.autocast({recipe = gc.fp8.DelayedScaling{amax_history_len = 5}},
                             function () return m(x) end)
  y2:sum():backward()
  H.assert_err(function () y1:sum():backward() end,
               "the checkpointed 'LayerNormMLP' has another FP8 state than its forward updated")
end

function TestFp8Recipes:test_state_made_outside_capture ()
  local lin = gc.nn.Linear(16, 16)
  local x = gc.randn({8, 16})
  local g = gc.Graph()
  H.assert_err(function ()
    g:capture(function () gc.fp8.autocast(function () lin(x) end) end)
  end, "Linear: its FP8 state", "must not be inside a capture")
  gc.fp8.autocast(function () lin(x) end) -- made here, then captured and replayed
  local y
  g:capture(function () y = gc.fp8.autocast(function () return lin(x) end) end)
  local h0 = lin:fp8_state().input.amax_history[1]
  g:replay()
  lu.assertEquals(lin:fp8_state().input.amax_history[2], h0, "a replay is a step")
  lu.assertEquals(y:shape(), {8, 16})
end

-- A delayed-wgrad FP8 Linear (delay_wgrad): backward_dw runs the wgrad's
-- FP8 GEMM on the operands the backward queued, so the weight and bias
-- grads equal the immediate Linear's bit for bit, over two backwards
-- queued before one backward_dw (each recipe, f32 and bf16, the padded
-- dgrad's width too); fused into main_grad alike; a weight frozen at the
-- forward gets nothing, its bias its grad.
local function delayed_pair (dt, out, opts)
  local function make (delay)
    gc.manual_seed(21)
    local o = {delay_wgrad = delay}
    for k, v in pairs(opts or {}) do o[k] = v end
    return gc.nn.Linear(16, out, o):to(dt)
  end
  return make(false), make(true)
end

local function run_backwards (lin, recipe, dt, out)
  gc.manual_seed(22)
  for step = 1, 2 do
    local x = (gc.randn({8, 16}) * gc.tensor(step)):to(dt)
    local g = (gc.randn({8, out}) * gc.tensor(0.5 * step)):to(dt)
    gc.fp8.autocast({recipe = recipe}, function () return lin(x) end):backward(g)
  end
end

function TestFp8Recipes:test_delayed_wgrad_equals_immediate ()
  for _, recipe in ipairs({gc.fp8.DelayedScaling{amax_history_len = 3},
                           gc.fp8.Float8CurrentScaling()}) do
    for _, case in ipairs({{"f32", 32}, {"bf16", 32}, {"bf16", 24}}) do
      local dt, out = case[1], case[2]
      local what = ("%s %s out %d"):format(recipe.name or tostring(recipe), dt, out)
      local now, later = delayed_pair(dt, out)
      run_backwards(now, recipe, dt, out)
      run_backwards(later, recipe, dt, out)
      lu.assertNil(later.weight.grad, what .. ": weight grad before backward_dw")
      later:backward_dw()
      H.assert_same(later.weight.grad:tolist(), now.weight.grad:tolist(), what .. " weight grad")
      H.assert_same(later.bias.grad:tolist(), now.bias.grad:tolist(), what .. " bias grad")
      later:backward_dw()  -- the queue is empty: nothing changes
      H.assert_same(later.weight.grad:tolist(), now.weight.grad:tolist(), what .. " again")
    end
  end
end

function TestFp8Recipes:test_delayed_wgrad_fused_and_frozen ()
  local recipe = gc.fp8.DelayedScaling{amax_history_len = 2}
  local now, later = delayed_pair("bf16", 32, {fuse_wgrad_accumulation = true})
  now:zero_grad()
  later:zero_grad()
  run_backwards(now, recipe, "bf16", 32)
  run_backwards(later, recipe, "bf16", 32)
  later:backward_dw()
  H.assert_same(later.main_grad:tolist(), now.main_grad:tolist(), "main_grad")
  local ref, frozen = delayed_pair("f32", 32)
  ref.weight.requires_grad, frozen.weight.requires_grad = false, false
  run_backwards(ref, recipe, "f32", 32)
  run_backwards(frozen, recipe, "f32", 32)
  frozen:backward_dw()
  lu.assertNil(frozen.weight.grad, "a frozen weight gets no grad")
  H.assert_same(frozen.bias.grad:tolist(), ref.bias.grad:tolist(), "the frozen weight's bias grad")
end

os.exit(lu.LuaUnit.run(), true)
