-- test_checkpoint.lua: state dicts (docs/lua-api.md, "Checkpoints"): the
-- names PyTorch and TransformerEngine give a module tree, persistent buffers
-- only; load_state_dict writes in place (graphs captured on the parameters
-- stay valid), converts f32 <-> bf16 as copy_ does, and refuses missing,
-- unexpected and mis-sized keys by name with nothing written; optimizers'
-- state in PyTorch's layout, restored so that training resumes bit for bit,
-- also through a safetensors file.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_checkpoint.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

local HERE = "test_checkpoint.lua"

-- The sorted keys of table t.
local function keys (t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end

local function sorted (list)
  table.sort(list)
  return list
end

-- The bytes of every tensor of module m's state dict, by name.
local function snapshot (m)
  local s = {}
  for k, t in pairs(m:state_dict()) do s[k] = t:tobytes() end
  return s
end

local function mlp (seed)
  gc.manual_seed(seed)
  return gc.nn.Sequential(gc.nn.Linear(4, 8), gc.nn.GELU(), gc.nn.LayerNorm(8),
                          gc.nn.Linear(8, 2))
end

TestStateDict = {tearDown = H.no_capture_left}

function TestStateDict:test_names_torch_modules ()
  lu.assertEquals(keys(gc.nn.Linear(4, 3):state_dict()), {"bias", "weight"})
  lu.assertEquals(keys(gc.nn.Linear(4, 3, {bias = false}):state_dict()), {"weight"})
  lu.assertEquals(keys(gc.nn.LayerNorm(3):state_dict()), {"bias", "weight"})
  lu.assertEquals(keys(gc.nn.Embedding(10, 3):state_dict()), {"weight"})
  lu.assertEquals(keys(gc.nn.ReLU():state_dict()), {})
  local m = gc.nn.Sequential(gc.nn.Linear(4, 3), gc.nn.ReLU(),
                             gc.nn.Sequential(gc.nn.Linear(3, 3), gc.nn.LayerNorm(3)))
  lu.assertEquals(keys(m:state_dict()), {"0.bias", "0.weight", "2.0.bias", "2.0.weight",
                                         "2.1.bias", "2.1.weight"})
  lu.assertEquals(m:state_dict()["2.0.weight"]:shape(), {3, 3})
end

-- TransformerEngine's names (with fuse_qkv_params = True: one qkv weight,
-- its rows interleaved per head).
function TestStateDict:test_names_te_modules ()
  local function ks (m) return keys(m:state_dict()) end
  lu.assertEquals(ks(gc.nn.LayerNormLinear(4, 6)),
                  {"bias", "layer_norm_bias", "layer_norm_weight", "weight"})
  lu.assertEquals(ks(gc.nn.LayerNormMLP(4, 8)),
                  {"fc1_bias", "fc1_weight", "fc2_bias", "fc2_weight", "layer_norm_bias",
                   "layer_norm_weight"})
  lu.assertEquals(ks(gc.nn.DotProductAttention(2, 4)), {})
  lu.assertEquals(ks(gc.nn.MultiheadAttention(8, 2)),
                  {"proj.bias", "proj.weight", "qkv.bias", "qkv.weight"})
  lu.assertEquals(ks(gc.nn.MultiheadAttention(8, 2, {input_layernorm = true})),
                  {"layernorm_qkv.bias", "layernorm_qkv.layer_norm_bias",
                   "layernorm_qkv.layer_norm_weight", "layernorm_qkv.weight", "proj.bias",
                   "proj.weight"})
  local layer = gc.nn.TransformerLayer(8, 16, 2)
  lu.assertEquals(ks(layer),
                  {"layernorm_mlp.fc1_bias", "layernorm_mlp.fc1_weight", "layernorm_mlp.fc2_bias",
                   "layernorm_mlp.fc2_weight", "layernorm_mlp.layer_norm_bias",
                   "layernorm_mlp.layer_norm_weight", "self_attention.layernorm_qkv.bias",
                   "self_attention.layernorm_qkv.layer_norm_bias",
                   "self_attention.layernorm_qkv.layer_norm_weight",
                   "self_attention.layernorm_qkv.weight", "self_attention.proj.bias",
                   "self_attention.proj.weight"})
  lu.assertEquals(layer:state_dict()["self_attention.layernorm_qkv.weight"]:shape(), {24, 8})
  lu.assertEquals(ks(gc.nn.TransformerLayer(8, 16, 2, {bias = false})),
                  {"layernorm_mlp.fc1_weight", "layernorm_mlp.fc2_weight",
                   "layernorm_mlp.layer_norm_bias", "layernorm_mlp.layer_norm_weight",
                   "self_attention.layernorm_qkv.layer_norm_bias",
                   "self_attention.layernorm_qkv.layer_norm_weight",
                   "self_attention.layernorm_qkv.weight", "self_attention.proj.weight"})
end

-- Buffers as PyTorch's: persistent ones are in the state dict, in the
-- module's order after its parameters; non-persistent ones (and Linear's
-- main_grad) are not, though named_buffers lists them.
function TestStateDict:test_buffers_and_lua_modules ()
  local Block = gc.nn.Module("Block")
  function Block:init ()
    self.scale = gc.nn.Parameter(gc.ones({3}))
    self:register_buffer("running", gc.zeros({3}))
    self:register_buffer("cache", gc.zeros({3}), {persistent = false})
    self.lin = gc.nn.Linear(3, 3, {fuse_wgrad_accumulation = true})
  end
  function Block:forward (x) return self.lin(x) * self.scale end
  local b = Block()
  lu.assertEquals(keys(b:state_dict()), {"lin.bias", "lin.weight", "running", "scale"})
  local bufs = {}
  for _, e in ipairs(b:named_buffers()) do bufs[#bufs + 1] = e[1] end
  lu.assertEquals(sorted(bufs), {"cache", "lin.main_grad", "running"})
  H.assert_err(function () b:register_buffer("x", gc.zeros({1}), {persistent = 0}) end, HERE,
               "register_buffer: persistent must be a boolean")
  H.assert_err(function () b:register_buffer("x", gc.zeros({1}), {persist = false}) end, HERE,
               "register_buffer: unknown option 'persist'")
  local r = b:load_state_dict({["lin.weight"] = gc.ones({3, 3}), ["lin.bias"] = gc.ones({3}),
                               running = gc.full({3}, 2), scale = gc.ones({3}),
                               cache = gc.ones({3})}, {strict = false})
  lu.assertEquals(r, {missing_keys = {}, unexpected_keys = {"cache"}})
  lu.assertEquals(b.running:tolist(), {2, 2, 2})
  lu.assertEquals(b.cache:tolist(), {0, 0, 0})
end

-- A child reached by two names is in the state dict under both, as PyTorch's.
function TestStateDict:test_shared_child_both_names ()
  local lin = gc.nn.Linear(2, 2)
  local Two = gc.nn.Module("Two")
  function Two:init () self.a = lin; self.b = lin end
  local sd = Two():state_dict()
  lu.assertEquals(keys(sd), {"a.bias", "a.weight", "b.bias", "b.weight"})
  lu.assertEquals(sd["a.weight"]:data_ptr(), sd["b.weight"]:data_ptr())
end

-- The tensors share the module's storage, detached (keep_vars: the
-- parameters themselves); prefix is put before every name.
function TestStateDict:test_values_options ()
  local m = gc.nn.Linear(3, 2)
  local sd = m:state_dict()
  lu.assertEquals(sd.weight:data_ptr(), m.weight:data_ptr())
  lu.assertFalse(sd.weight.requires_grad)
  lu.assertIs(m:state_dict({keep_vars = true}).weight, m.weight)
  lu.assertEquals(keys(m:state_dict({prefix = "enc."})), {"enc.bias", "enc.weight"})
  H.assert_err(function () m:state_dict({keep = true}) end, HERE,
               "state_dict: unknown option 'keep'")
end

-- A load copies into the parameters in place: same addresses, the other
-- model's values bit for bit, the same outputs.
function TestStateDict:test_load_in_place ()
  local a, b = mlp(1), mlp(2)
  local addr = {}
  for i, p in ipairs(b:parameters()) do addr[i] = p:data_ptr() end
  lu.assertEquals(b:load_state_dict(a:state_dict()), {missing_keys = {}, unexpected_keys = {}})
  for i, p in ipairs(b:parameters()) do
    lu.assertEquals(p:data_ptr(), addr[i])
    lu.assertEquals(p:tobytes(), a:parameters()[i]:tobytes())
  end
  local x = gc.randn({3, 4})
  lu.assertEquals(b(x):tobytes(), a(x):tobytes())
  b:load_state_dict(b:state_dict())  -- onto itself: nothing changes
  lu.assertEquals(snapshot(b), snapshot(a))
end

-- Graphs captured on the parameters stay valid: a graphed module replays
-- with the loaded weights, equal to the other model's eager call.
function TestStateDict:test_load_into_graphed_module ()
  local a, b = mlp(1), mlp(2)
  local x = gc.randn({3, 4}, {requires_grad = true})
  gc.make_graphed_callables(b, {x})
  b:load_state_dict(a:state_dict())
  local x2 = gc.randn({3, 4}, {requires_grad = true})
  local y = b(x2)
  lu.assertEquals(b:stats().fwd.replays, 1)
  lu.assertEquals(y:tobytes(), a(x2):tobytes())
  y:sum():backward()
  lu.assertNotNil(b:parameters()[1].grad)
end

-- f32 into bf16 and back, as copy_ converts.
function TestStateDict:test_load_converts_dtype ()
  local a = mlp(1)
  local b = mlp(2):to("bf16")
  b:load_state_dict(a:state_dict())
  for k, t in pairs(a:state_dict()) do
    local want = gc.zeros(t:shape(), "bf16"):copy_(t)
    lu.assertEquals(b:state_dict()[k]:tobytes(), want:tobytes(), k)
  end
  local c = mlp(3)
  c:load_state_dict(b:state_dict())
  lu.assertEquals(c:state_dict()["0.weight"]:tolist(), b:state_dict()["0.weight"]:tolist())
end

-- Every refusal names the keys, at the caller's line, and writes nothing.
function TestStateDict:test_refusals_change_nothing ()
  local m = mlp(1)
  local before = snapshot(m)
  local function sd_with (changes)
    local sd = mlp(2):state_dict()
    for k, v in pairs(changes) do sd[k] = v end
    return sd
  end
  local function refused (sd, opts, ...)
    H.assert_err(function () m:load_state_dict(sd, opts) end, HERE, "load_state_dict: ", ...)
    lu.assertEquals(snapshot(m), before)
  end
  refused(sd_with({["0.bias"] = false}), nil, '"0.bias" must be a tensor, got boolean')
  local missing = sd_with({})
  missing["0.bias"], missing["3.weight"] = nil, nil
  refused(missing, nil, 'missing key(s) "0.bias", "3.weight" (Sequential has them, the state '
                        .. 'dict does not); load with {strict = false} to skip them')
  refused(sd_with({["9.weight"] = gc.ones({1})}), nil,
          'unexpected key(s) "9.weight" (not in Sequential)')
  local both = sd_with({["0.b"] = gc.ones({1})})
  both["0.bias"] = nil
  refused(both, nil, 'missing key(s) "0.bias"', 'unexpected key(s) "0.b"')
  refused(sd_with({["3.weight"] = gc.ones({8, 2})}), {strict = false},
          'size mismatch for "3.weight": the state dict has [8, 2], Sequential has [2, 8]')
  refused(sd_with({[1] = gc.ones({1})}), nil, "the state dict has the number key 1")
  local closed = gc.ones({8})
  closed:close()
  refused(sd_with({["0.bias"] = closed}), nil, '"0.bias" is a closed tensor')
  refused(gc.ones({2}), nil, "state_dict must be a table of name -> tensor, got a tensor")
  refused(sd_with({}), {strict = 1}, "strict must be a boolean")
  refused(sd_with({}), {assign = true}, "unknown option 'assign'")
  local g = gc.Graph()
  local sd = sd_with({})
  H.assert_err(function () g:capture(function () m:load_state_dict(sd) end) end, HERE,
               "load_state_dict: not allowed while a capture is open")
  lu.assertEquals(snapshot(m), before)
end

-- strict = false loads what matches and returns PyTorch's two lists.
function TestStateDict:test_non_strict ()
  local a, m = mlp(1), mlp(2)
  local sd = a:state_dict()
  sd["0.bias"], sd.extra = nil, gc.ones({1})
  local bias = m[1].bias:tobytes()
  local r = m:load_state_dict(sd, {strict = false})
  lu.assertEquals(r, {missing_keys = {"0.bias"}, unexpected_keys = {"extra"}})
  lu.assertEquals(m[1].bias:tobytes(), bias)
  lu.assertEquals(m[1].weight:tobytes(), a[1].weight:tobytes())
end


TestOptimState = {tearDown = H.no_capture_left}

function TestOptimState:test_layout ()
  local m = mlp(1)
  local sgd = gc.optim.SGD(m:parameters(), {lr = 0.1, momentum = 0.9, weight_decay = 0.01})
  local sd = sgd:state_dict()
  lu.assertEquals(#sd.param_groups, 1)
  local g = sd.param_groups[1]
  lu.assertEquals(g.params, {1, 2, 3, 4, 5, 6})
  lu.assertEquals({g.lr, g.momentum, g.weight_decay, g.dampening, g.nesterov, g.maximize},
                  {0.1, 0.9, 0.01, 0, false, false})
  lu.assertEquals(keys(sd.state[1]), {"momentum_buffer"})
  lu.assertEquals(sd.state[1].momentum_buffer:shape(), {8, 4})
  lu.assertEquals(next(gc.optim.SGD(m:parameters(), {lr = 0.1}):state_dict().state), nil)
  local adam = gc.optim.Adam(m:parameters(), {lr = 0.01, betas = {0.8, 0.9}})
  sd = adam:state_dict()
  g = sd.param_groups[1]
  lu.assertEquals({g.lr, g.betas, g.eps, g.weight_decay, g.amsgrad},
                  {0.01, {0.8, 0.9}, 1e-8, 0, false})
  lu.assertEquals(keys(sd.state[6]), {"exp_avg", "exp_avg_sq", "step"})
  lu.assertEquals(sd.state[6].step:shape(), {})
end

-- Train 2 steps, checkpoint model and optimizer, train 2 more (the
-- reference); a fresh model and optimizer with other settings load the
-- checkpoint and train the same 2 steps: equal bit for bit.
local function resume_case (make_opt, other_opt, via_file)
  local function step (m, opt, k)
    gc.manual_seed(100 + k)
    local x, t = gc.randn({5, 4}), gc.randn({5, 2})
    opt:zero_grad()
    gc.F.mse_loss(m(x), t):backward()
    opt:step()
  end
  local a = mlp(1)
  local oa = make_opt(a:parameters())
  for k = 1, 2 do step(a, oa, k) end
  local msd = {}
  for k, t in pairs(a:state_dict()) do msd[k] = t:clone() end
  local osd = oa:state_dict()
  for _, s in pairs(osd.state) do
    for k, t in pairs(s) do s[k] = t:clone() end
  end
  for k = 3, 4 do step(a, oa, k) end
  local b = mlp(2)
  local ob = other_opt(b:parameters())
  if via_file then  -- the optimizer state as PyTorch-style names of one file
    local flat, p = {}, os.tmpname()
    for k, t in pairs(msd) do flat["model." .. k] = t end
    for id, s in pairs(osd.state) do
      for k, t in pairs(s) do flat["optim.state." .. id .. "." .. k] = t end
    end
    gc.save(p, flat)
    local back = gc.load(p)
    os.remove(p)
    msd, osd.state = {}, {}
    for k, t in pairs(back) do
      local mk = k:match("^model%.(.*)$")
      local id, name = k:match("^optim%.state%.(%d+)%.(.*)$")
      if mk then msd[mk] = t
      else
        id = math.tointeger(tonumber(id))
        osd.state[id] = osd.state[id] or {}
        osd.state[id][name] = t
      end
    end
  end
  b:load_state_dict(msd)
  ob:load_state_dict(osd)
  lu.assertEquals(ob:state_dict().param_groups[1].lr, osd.param_groups[1].lr)
  for k = 3, 4 do step(b, ob, k) end
  for i, p in ipairs(b:parameters()) do
    lu.assertEquals(p:tobytes(), a:parameters()[i]:tobytes(), "parameter " .. i)
  end
end

function TestOptimState:test_resume_sgd_momentum ()
  resume_case(function (ps) return gc.optim.SGD(ps, {lr = 0.05, momentum = 0.9}) end,
              function (ps) return gc.optim.SGD(ps, {lr = 1}) end)
end

function TestOptimState:test_resume_adam ()
  resume_case(function (ps) return gc.optim.Adam(ps, {lr = 0.01, betas = {0.8, 0.95}}) end,
              function (ps) return gc.optim.Adam(ps, {lr = 0.5}) end)
end

-- regression: a loaded lr stayed on the host while the steps read the device's
function TestOptimState:test_resume_adamw ()
  resume_case(function (ps) return gc.optim.AdamW(ps, {lr = 0.02, weight_decay = 0.3}) end,
              function (ps) return gc.optim.AdamW(ps, {lr = 0.5}) end)
end

function TestOptimState:test_resume_adam_via_file ()
  resume_case(function (ps) return gc.optim.Adam(ps, {lr = 0.01, weight_decay = 0.1}) end,
              function (ps) return gc.optim.Adam(ps) end, true)
end

-- PyTorch's 0-based ids map by position; a parameter with no state (none
-- in sd, as PyTorch before a first step) gets zeros; a step given as a
-- number (older PyTorch) is taken.
function TestOptimState:test_torch_ids_and_missing_state ()
  local m = gc.nn.Linear(2, 2)
  local opt = gc.optim.Adam(m:parameters(), {lr = 0.1})
  m.weight.grad, m.bias.grad = gc.ones({2, 2}), gc.ones({2})
  opt:step()
  local avg = gc.full({2}, 0.5)
  opt:load_state_dict({state = {[1] = {step = 7, exp_avg = avg, exp_avg_sq = gc.ones({2})}},
                       param_groups = {{lr = 0.2, betas = {0.9, 0.999}, eps = 1e-8,
                                        weight_decay = 0, amsgrad = false, foreach = false,
                                        params = {0, 1}}}})
  local sd = opt:state_dict()
  lu.assertEquals(sd.param_groups[1].lr, 0.2)
  lu.assertEquals(sd.state[1].step:item(), 0)
  lu.assertEquals(sd.state[1].exp_avg:tolist(), {{0, 0}, {0, 0}})
  lu.assertEquals(sd.state[2].step:item(), 7)
  lu.assertEquals(sd.state[2].exp_avg:tolist(), {0.5, 0.5})
end

-- Every refusal names what is wrong and changes neither settings nor state.
function TestOptimState:test_refusals_change_nothing ()
  local m = gc.nn.Linear(2, 2)
  local sgd = gc.optim.SGD(m:parameters(), {lr = 0.1, momentum = 0.5})
  local adam = gc.optim.Adam(m:parameters(), {lr = 0.1})
  local function snap (opt)
    local sd, s = opt:state_dict(), {}
    for id, st in pairs(sd.state) do
      for k, t in pairs(st) do s[id .. k] = t:tobytes() end
    end
    sd.state = s
    return sd
  end
  local function refused (opt, change, ...)
    local sd = opt:state_dict()
    local before = snap(opt)
    change(sd, sd.param_groups[1])
    H.assert_err(function () opt:load_state_dict(sd) end, HERE, "load_state_dict: ", ...)
    lu.assertEquals(snap(opt), before)
  end
  local t = gc.ones({3})
  refused(sgd, function (sd) sd.param_groups[2] = {} end, "param_groups must be a sequence of one")
  refused(sgd, function (_, g) g.params = {1} end, "params names 1 parameters; the optimizer has 2")
  refused(sgd, function (_, g) g.params = {1, 1} end, "params[2] repeats id 1")
  refused(sgd, function (sd) sd.state[5] = {} end, "state has an entry for id 5")
  refused(sgd, function (sd) sd.state[1].extra = t end,
          'state[1] has an unexpected entry extra (SGD keeps "momentum_buffer")')
  refused(sgd, function (sd) sd.state[2].momentum_buffer = nil end, 'state[2] has no "momentum_buffer"')
  refused(sgd, function (sd) sd.state[2].momentum_buffer = t end,
          "size mismatch for state[2].momentum_buffer: the state dict has [3], parameter 2 is [2]")
  refused(sgd, function (_, g) g.lr = -1 end, "param_groups[1].lr is -1; expected a number >= 0")
  refused(sgd, function (_, g) g.nesterov = true end,
          "param_groups[1].nesterov is true; graphcap's SGD has only nesterov = false")
  refused(sgd, function (sd) sd.extra = 1 end, "unexpected key extra")
  refused(adam, function (_, g) g.amsgrad = true end, "graphcap's Adam has only amsgrad = false")
  refused(adam, function (_, g) g.betas = {0.9, 1} end, "param_groups[1].betas[2] is 1")
  refused(adam, function (_, g) g.betas = 0.9 end, "betas must be a sequence of two numbers")
  refused(adam, function (sd) sd.state[1].step = gc.ones({2}) end, "state[1].step has 2 elements")
  refused(adam, function (sd) sd.state[1].step = 1.5 end, "state[1].step is 1.5")
  refused(adam, function (sd) sd.state[1].exp_avg = 2 end, "state[1].exp_avg must be an open tensor")
  H.assert_err(function () sgd:load_state_dict(3) end, HERE, "state_dict must be a table")
end

-- An SGD made without momentum takes a checkpoint with momentum: its
-- buffers are made then, and restored.
function TestOptimState:test_sgd_gains_momentum ()
  local m = gc.nn.Linear(2, 2)
  local a = gc.optim.SGD(m:parameters(), {lr = 0.1, momentum = 0.9})
  m.weight.grad, m.bias.grad = gc.ones({2, 2}), gc.ones({2})
  a:step()
  local b = gc.optim.SGD(m:parameters(), {lr = 0.5})
  b:load_state_dict(a:state_dict())
  local sd = b:state_dict()
  lu.assertEquals(sd.param_groups[1].momentum, 0.9)
  lu.assertEquals(sd.state[2].momentum_buffer:tolist(), {1, 1})
  local c = gc.optim.SGD(m:parameters(), {lr = 0.5, momentum = 0.9})  -- and loses it
  sd.param_groups[1].momentum = 0
  c:load_state_dict(sd)
  lu.assertEquals(c:state_dict().param_groups[1].momentum, 0)
  lu.assertEquals(next(c:state_dict().state), nil)
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
