-- test_cuda_kernel.lua: gc.cuda.kernel (docs/custom-ops.md): kernels compiled
-- with NVRTC on every backend and launched on tensors, eagerly, captured
-- (a replay reads the inputs' new values) and graphed with
-- make_graphed_callables (with an order and capture_time_hooks) inside a
-- gc.autograd.Function whose backward is a kernel too, equal to eager bit
-- for bit; a finite-difference check of that backward; the replay check
-- naming the kernel; compile errors carrying NVRTC's log and the script's
-- line; bad launches; a host twin's error, eager and at replay. Skipped
-- (exit 77) where NVRTC cannot be found.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_cuda_kernel.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local nest, values = H.nest, H.values
local assert_close, assert_bitwise, assert_err = H.assert_close, H.assert_bitwise, H.assert_err

local HERE = debug.getinfo(1, "S").short_src .. ":"
local ROOT = debug.getinfo(1, "S").source:match("^@?(.-)tests/lua/[^/\\]*$")

local SCALE = [[
extern "C" __global__ void scale(const float *x, float *y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
]]

-- y = a * x, on the host
local function scale_twin (x, y, a, n)
  local v = x:view({n}):tolist()
  for i = 1, n do v[i] = a * v[i] end
  y:view({n}):copy_(gc.tensor(v))
end

local compiled, scale = pcall(gc.cuda.kernel, SCALE, "scale", {host = scale_twin})
if not compiled and tostring(scale):find("NVRTC is not available", 1, true) then
  print("# skipped: " .. tostring(scale))  -- no CUDA toolkit here
  os.exit(77)
end
assert(compiled, scale)

local function run_scale (x, y, a)
  scale:launch{grid = 1, block = 256, args = {x, y, a, x:numel()}, writes = {y}}
end

-- The same values, each as the float the kernel stores.
local function f32 (v)
  local t = gc.tensor(v)
  return t:tolist()
end

TestKernel = {tearDown = H.no_capture_left}

function TestKernel:test_eager ()
  local x, y = gc.tensor(values(40, 1)), gc.zeros({40})
  run_scale(x, y, 2.5)
  local want = {}
  for i, v in ipairs(f32(values(40, 1))) do want[i] = v * 2.5 end
  assert_close(y:tolist(), want, 0, 1e-6, "scale")
end

function TestKernel:test_captured_replays_new_inputs ()
  local x, y = gc.tensor(values(40, 1)), gc.zeros({40})
  local g = gc.Graph()
  g:capture(function () run_scale(x, y, 3) end)
  x:copy_(gc.tensor(values(40, 2)))
  g:replay()
  local eager = gc.zeros({40})
  run_scale(x, eager, 3)
  assert_bitwise(y:tolist(), eager:tolist(), "replay")
  lu.assertNotEquals(y:tolist()[1], 0)
end

function TestKernel:test_compile_error_has_log_and_line ()
  local bad = 'extern "C" __global__ void f(float *y) {\n  y[0] = nothing_here;\n}\n'
  local line
  local msg = assert_err(function ()
    line = debug.getinfo(1, "l").currentline; gc.cuda.kernel(bad, "f")
  end, "kernel 'f' does not compile", "f.cu(2): error", "nothing_here")
  lu.assertStrContains(msg, HERE .. line .. ": kernel 'f'")
  assert_err(function () gc.cuda.kernel(SCALE, "absent") end, HERE, "absent")
  assert_err(function () gc.cuda.kernel(SCALE, "scale", {options = {"--no-such-flag"}}) end,
             HERE, "kernel 'scale' does not compile")
end

function TestKernel:test_bad_launches ()
  local x, y = gc.tensor({1, 2}), gc.zeros({2})
  assert_err(function () scale:launch{grid = 0, block = 1, args = {x, y, 1.0, 2}, writes = {y}} end,
             HERE, "kernel 'scale':launch: grid sizes must be 1 to 2147483647, got 0")
  assert_err(function () scale:launch{grid = 1, block = 1, args = {x, "y", 1.0, 2}} end,
             HERE, "kernel 'scale':launch: args[2] must be a tensor or a number, got string")
  assert_err(function () scale:launch{grid = 1, block = 1, args = {x, y, 1.0, 2}, reads = {x}} end,
             HERE, "kernel 'scale': tensor argument #2 is in neither reads nor writes")
  assert_err(function () scale:launch{grid = {1, 2, 3, 4}, block = 1} end, HERE,
             "grid must be an integer or {x [, y [, z]]}")
  assert_err(function () scale:launch{grid = 1, block = 1, stream = 2} end, HERE,
             "unknown option 'stream'")
  assert_err(function () scale:launch{grid = 1, block = 1, args = {x, y, 1.0, 1 << 40},
                                      writes = {y}} end, HERE,
             "kernel 'scale': argument #4 (1099511627776) is out of the range of i32")
  run_scale(x, y, 2) -- still usable
  lu.assertEquals(y:tolist(), {2, 4})
end

-- In pool p: g1 writes y; g2 reads it with the kernel; g3 overwrites y:
-- replaying g2 after g3 is refused, naming the kernel's read.
function TestKernel:test_replay_check_names_kernel ()
  local p, x = gc.graph_pool_handle(), gc.tensor(values(8, 3))
  local y, z
  local g1, g2, g3 = gc.Graph(), gc.Graph(), gc.Graph()
  g1:capture(function () y = x * 2 end, {pool = p})
  g2:capture(function () z = gc.empty({8}); run_scale(y, z, 1.5) end, {pool = p, name = "reader"})
  g3:capture(function () y:fill_(7) end, {pool = p})
  g1:replay(); g2:replay(); g3:replay()
  assert_err(function () g2:replay() end, HERE, "'reader' refused",
             "read by custom op 'scale'")
end

-- ---------------------------------------------------------------------------
-- Host twins (the host backend runs them in the kernel's place)

function TestKernel:test_twin_errors ()
  if gc.device() ~= "host" then return end -- the twins run on the host backend only
  local boom = gc.cuda.kernel(SCALE, "scale", {host = function () error("twin broke") end})
  local x, y = gc.tensor({1, 2}), gc.zeros({2})
  assert_err(function () boom:launch{grid = 1, block = 2, args = {x, y, 1.0, 2}, writes = {y}} end,
             HERE, "twin broke")
  local fail = false
  local flaky = gc.cuda.kernel(SCALE, "scale", {host = function (...)
    if fail then error("twin broke at replay") end
    scale_twin(...)
  end})
  local g = gc.Graph()
  g:capture(function () flaky:launch{grid = 1, block = 2, args = {x, y, 3.0, 2}, writes = {y}} end)
  fail = true
  assert_err(function () g:replay() end, HERE, "twin broke at replay")
  fail = false
  g:replay()
  lu.assertEquals(y:tolist(), {3, 6})
  local none = gc.cuda.kernel(SCALE, "scale")
  assert_err(function () none:launch{grid = 1, block = 2, args = {x, y, 1.0, 2}, writes = {y}} end,
             HERE, "has none (gc.cuda.kernel's option host)")
end

-- ---------------------------------------------------------------------------
-- SwiGLU from examples/swiglu.lua: kernels in a gc.autograd.Function

local S = assert(loadfile(ROOT .. "examples/swiglu.lua"))("pieces")

function TestKernel:test_swiglu_matches_graphcap_ops ()
  local av, bv, wv = values(24, 1, 2), values(24, 2, 2), values(24, 3)
  local function grads (f)
    local a = gc.tensor(nest(av, {4, 6}), {requires_grad = true})
    local b = gc.tensor(nest(bv, {4, 6}), {requires_grad = true})
    local y = f(a, b)
    ;(y * gc.tensor(nest(wv, {4, 6}))):sum():backward()
    return y:tolist(), a.grad:tolist(), b.grad:tolist()
  end
  local y1, da1, db1 = grads(S.SwiGLU.apply)
  local y2, da2, db2 = grads(S.swiglu_ops)
  assert_close(y1, y2, 1e-6, 1e-5, "y")
  assert_close(da1, da2, 1e-6, 1e-5, "da")
  assert_close(db1, db2, 1e-6, 1e-5, "db")
end

function TestKernel:test_swiglu_backward_finite_differences ()
  local xs = values(12, 4, 1.5) -- a then b, 6 each
  local wv = values(6, 5)
  local function loss ()
    local a = gc.tensor({table.unpack(xs, 1, 6)})
    local b = gc.tensor({table.unpack(xs, 7, 12)})
    return (S.SwiGLU.apply(a, b) * gc.tensor(wv)):sum():item()
  end
  local num = H.numgrad(loss, xs, 1e-2)
  local a = gc.tensor({table.unpack(xs, 1, 6)}, {requires_grad = true})
  local b = gc.tensor({table.unpack(xs, 7, 12)}, {requires_grad = true})
  ;(S.SwiGLU.apply(a, b) * gc.tensor(wv)):sum():backward()
  local got = a.grad:tolist()
  for _, v in ipairs(b.grad:tolist()) do got[#got + 1] = v end
  assert_close(got, num, 2e-3, 2e-2, "grad vs central differences")
end

-- Two SwiGLU layers graphed as a pipeline (order 1, 2, -2, -1) with
-- capture-time hooks; three SGD steps equal the eager ones bit for bit.
function TestKernel:test_swiglu_graphed_with_order_and_hooks ()
  local D, HID, B = 8, 16, 4
  local function layers ()
    gc.manual_seed(9)
    return {S.FFN(D, HID), S.FFN(D, HID)}
  end
  local function params (ls)
    local ps = {}
    for _, l in ipairs(ls) do for _, p in ipairs(l:parameters()) do ps[#ps + 1] = p end end
    return ps
  end
  local log = {}
  local function hooks (c)
    return {forward_pre_hooks = {function () log[#log + 1] = "pre" .. c end},
            backward_hooks = {function () log[#log + 1] = "bwd" .. c end}}
  end
  local graphed = layers()
  local entries = gc.make_graphed_callables(graphed, {{gc.randn({B, D}, {requires_grad = true})},
                                                      {gc.randn({B, D}, {requires_grad = true})}},
                                            {order = {1, 2, -2, -1}, num_warmup_iters = 1,
                                             capture_time_hooks = {hooks(1), hooks(2)}})
  lu.assertEquals(log, {"pre1", "pre2", "bwd2", "bwd1", "pre1", "pre2", "bwd2", "bwd1"})
  local eager = layers()
  local function step (call, opt, s)
    opt:zero_grad()
    gc.manual_seed(50 + s)
    local x = gc.randn({B, D}, {requires_grad = true})
    local h = call(1, x)
    local h2 = h:detach()
    h2.requires_grad = true
    local y = call(2, h2)
    local loss = (y * y):mean()
    loss:backward()
    h:backward(h2.grad)
    opt:step()
    return loss:item(), x.grad:tolist()
  end
  local oe, og = gc.optim.SGD(params(eager), {lr = 0.1}), gc.optim.SGD(params(graphed), {lr = 0.1})
  for s = 1, 3 do
    local le, xe = step(function (i, x) return eager[i](x) end, oe, s)
    local lg, xg = step(function (i, x) return entries[i](x) end, og, s)
    lu.assertEquals(lg, le, "loss of step " .. s)
    assert_bitwise(xg, xe, "input grad of step " .. s)
  end
  local pe, pg = params(eager), params(graphed)
  for i = 1, #pe do assert_bitwise(pg[i]:tolist(), pe[i]:tolist(), "parameter " .. i) end
  lu.assertEquals(#log, 8) -- never on replay
end

-- regression: a negative shmem wrapped to 4 GiB and launched; bad sizes named no kernel
-- A kernel launch with a negative shared memory size ran (wrapped to 4 GiB
-- as the driver's unsigned int); out-of-range grid and block sizes named no
-- kernel. Both are refused at the caller's line, naming the kernel.
function TestKernel:test_kernel_launch_ranges_name_the_kernel ()
  local SRC = [[
extern "C" __global__ void fill1(float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 1.0f;
}
]]
  local k = gc.cuda.kernel(SRC, "fill1",
                           {host = function (y, n) y:view({n}):copy_(gc.ones({n})) end})
  local y = gc.zeros({4})
  local bad = {
    {{grid = 1, block = 4, shmem = -1}, "kernel 'fill1':launch: shmem must be 0 to 2^32-1 bytes, got -1"},
    {{grid = 1, block = 4, shmem = 1 << 32}, "shmem must be 0 to 2^32-1 bytes, got 4294967296"},
    {{grid = 0, block = 4}, "kernel 'fill1':launch: grid sizes must be 1 to 2147483647, got 0 (entry 1)"},
    {{grid = {1, -2}, block = 4}, "kernel 'fill1':launch: grid sizes must be 1 to 2147483647, got -2 (entry 2)"},
    {{grid = 1, block = 1025}, "kernel 'fill1':launch: block sizes must be 1 to 1024, got 1025 (entry 1)"},
  }
  for _, c in ipairs(bad) do
    local t = c[1]
    t.args, t.writes = {y, 4}, {y}
    local ok, e = pcall(function () k:launch(t) end)
    lu.assertFalse(ok, c[2])
    lu.assertStrContains(e, HERE)
    lu.assertStrContains(e, c[2])
  end
  lu.assertEquals(y:tolist(), {0, 0, 0, 0})
  k:launch{grid = 1, block = 4, shmem = 0, args = {y, 4}, writes = {y}}
  lu.assertEquals(y:tolist(), {1, 1, 1, 1})
end

-- regression: k.launch{...} (a dot for the colon) named kernel 'nil'
-- The error says how to call it.
function TestKernel:test_kernel_launch_called_with_a_dot ()
  local k = gc.cuda.kernel([[
extern "C" __global__ void nop1(int n) {}
]], "nop1", {host = function () end})
  local ok, e = pcall(function () k.launch{grid = 1, block = 1, args = {1}} end)
  lu.assertFalse(ok)
  lu.assertStrContains(e, HERE)
  lu.assertStrContains(e, "Kernel:launch: call it as k:launch{...}, got a table for k")
  lu.assertNotStrContains(e, "'nil'")
  k:launch{grid = 1, block = 1, args = {1}}
end

-- regression: NVRTC read a source, name or option up to a NUL byte, dropping the rest
-- A kernel's source, name or option holding a NUL byte was cut there
-- without a word (the source's rest never compiled): it is refused.
function TestKernel:test_kernel_strings_with_a_nul_byte ()
  local src = 'extern "C" __global__ void f(int a) {}\n'
  lu.assertEquals(gc.cuda.kernel(src, "f").name, "f")
  for _, c in ipairs({{src .. "\0#error never read", "f", {}, "source holds a NUL byte at 40"},
                      {src, "f\0g", {}, "name holds a NUL byte at 2"},
                      {src, "f", {"-w\0x"}, "an option holds a NUL byte at 3"}}) do
    local ok, e = pcall(function () return gc.cuda.kernel(c[1], c[2], {options = c[3]}) end)
    lu.assertFalse(ok, c[4])
    lu.assertStrContains(e, HERE)
    lu.assertStrContains(e, "gc.cuda.kernel: " .. c[4])
  end
end

os.exit(lu.LuaUnit.run(), true)
