-- test_kernel_args.lua: gc.cuda.kernel's parameter types (docs/custom-ops.md):
-- read from the kernel's parameter list, or given with option signature
-- (which wins, and is asked for where the source cannot tell); each launch
-- argument checked against its parameter and converted, the host twin
-- receiving the values the kernel sees (an integer for a float parameter as
-- that float, a float rounded to f32, an integral float for an int
-- parameter as an integer); errors naming the kernel and the argument, at
-- the script's line, the kernel usable after them. Skipped (exit 77) where
-- NVRTC cannot be found.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_kernel_args.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local assert_err = H.assert_err

local HERE = debug.getinfo(1, "S").short_src .. ":"

local SCALE = [[
extern "C" __global__ void scale(const float *x, float *y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
]]

-- The arguments the last twin call received (weakly: a test leaves no
-- tensor alive), and their math.type.
local seen, kinds
local function record (...)
  seen, kinds = setmetatable({}, {__mode = "v"}), {}
  for i = 1, select("#", ...) do
    local v = select(i, ...)
    seen[i], kinds[i] = v, math.type(v) or type(v)
  end
end

-- y = a * x, on the host, recording its arguments
local function scale_twin (x, y, a, n)
  record(x, y, a, n)
  local v = x:view({n}):tolist()
  for i = 1, n do v[i] = a * v[i] end
  y:view({n}):copy_(gc.tensor(v))
end

local ok, scale = pcall(gc.cuda.kernel, SCALE, "scale", {host = scale_twin})
if not ok and tostring(scale):find("NVRTC is not available", 1, true) then
  print("# skipped: " .. tostring(scale)) -- no CUDA toolkit here
  os.exit(77)
end
assert(ok, scale)

-- The value v as the f32 the kernel reads.
local function f32 (v) return gc.tensor({v}):tolist()[1] end

TestKernelArgs = {tearDown = H.no_capture_left}

-- An integer for the float parameter: the kernel computes with that float,
-- and the twin is given it (before, the int's bits were passed, and the
-- twin was given the integer: the backends disagreed).
function TestKernelArgs:test_integer_for_float ()
  local x, y = gc.tensor({1, 2, 3}), gc.zeros({3})
  scale:launch{grid = 1, block = 32, args = {x, y, 2, 3.0}, writes = {y}}
  lu.assertEquals(y:tolist(), {2, 4, 6})
  if gc.device() ~= "host" then return end -- the twin runs on the host backend only
  lu.assertEquals(kinds, {"userdata", "userdata", "float", "integer"})
  lu.assertEquals(seen[3], 2.0)
  lu.assertEquals(seen[4], 3)
  lu.assertIs(seen[1], x)
  lu.assertIs(seen[2], y)
end

-- A float for an f32 parameter: the twin gets it rounded to f32, so its
-- result is the kernel's.
function TestKernelArgs:test_float_rounded_to_f32 ()
  local x, y = gc.tensor({1, 3}), gc.zeros({2})
  scale:launch{grid = 1, block = 32, args = {x, y, 0.1, 2}, writes = {y}}
  lu.assertEquals(y:tolist(), {f32(f32(0.1) * 1), f32(f32(0.1) * 3)})
  if gc.device() ~= "host" then return end
  lu.assertEquals(seen[3], f32(0.1))
  lu.assertNotEquals(seen[3], 0.1)
end

-- Every type the scanner knows, each argument converted for the twin.
local MANY = [[
typedef long long int64_t;
struct __nv_bfloat16;
extern "C" __global__ void many(const __nv_bfloat16 *__restrict__ p, double d, unsigned u,
                                int64_t q, bool b, size_t s, /* (a, comment) */ float f) {}
]]

function TestKernelArgs:test_parsed_types ()
  if gc.device() ~= "host" then return end -- what the twin receives
  local many = gc.cuda.kernel(MANY, "many", {host = record})
  local t = gc.zeros({1})
  many:launch{grid = 1, block = 1, args = {t, 2, 7.0, -5, 1, 9, 2}, reads = {t}}
  lu.assertEquals(kinds, {"userdata", "float", "integer", "integer", "integer", "integer",
                          "float"})
  lu.assertEquals({seen[2], seen[3], seen[4], seen[5], seen[6], seen[7]}, {2.0, 7, -5, 1, 9, 2.0})
  many:launch{grid = 1, block = 1, args = {t, 0.1, 0, 0, 0, 0, 0.1}, reads = {t}}
  lu.assertEquals(seen[2], 0.1) -- a double stays a double
  lu.assertEquals(seen[7], f32(0.1))
  local function bad (i, v, ...)
    local args = {t, 0, 0, 0, 0, 0, 0}
    args[i] = v
    assert_err(function () many:launch{grid = 1, block = 1, args = args, reads = {t}} end,
               HERE, ...)
  end
  bad(3, -1, "kernel 'many': argument #3 (-1) is out of the range of u32")
  bad(3, 1 << 32, "argument #3 (4294967296) is out of the range of u32")
  bad(5, 2, "argument #5 (2) is out of the range of bool")
  bad(6, -1, "argument #6 (-1) is out of the range of u64")
  bad(4, 0.5, "argument #4 must be an integer (parameter 4 is i64), got 0.5")
  bad(7, 1e300, "argument #7 (1.0000000000000001e+300) is out of the range of f32")
end

-- Wrong arguments: errors naming the kernel and the argument, at the
-- script's line; the kernel launches afterwards.
function TestKernelArgs:test_bad_arguments ()
  local x, y = gc.tensor({1, 2}), gc.zeros({2})
  local function launch (args) scale:launch{grid = 1, block = 32, args = args, writes = {y}} end
  assert_err(function () launch{x, y, 2} end, HERE, "kernel 'scale' takes 4 arguments, got 3")
  assert_err(function () launch{x, y, 2, 2, 2} end, HERE, "kernel 'scale' takes 4 arguments, got 5")
  assert_err(function () launch{x, y, 2.0, 2.5} end, HERE,
             "kernel 'scale': argument #4 must be an integer (parameter 4 is i32), got 2.5")
  assert_err(function () launch{x, y, 2.0, 0 / 0} end, HERE, "argument #4 must be an integer")
  assert_err(function () launch{x, y, x, 2} end, HERE,
             "kernel 'scale': argument #3 must be a number (parameter 3 is f32), got a tensor")
  assert_err(function () launch{x, 1, 2.0, 2} end, HERE,
             "kernel 'scale': argument #2 must be a tensor (parameter 2 is a pointer), got a number")
  assert_err(function () launch{x, y, 2.0, -(1 << 31) - 1} end, HERE,
             "argument #4 (-2147483649) is out of the range of i32")
  launch{x, y, 3, 2.0}
  lu.assertEquals(y:tolist(), {3, 6})
end

-- A captured launch replays with the converted arguments.
function TestKernelArgs:test_captured ()
  local x, y = gc.tensor({1, 2}), gc.zeros({2})
  local g = gc.Graph()
  g:capture(function () scale:launch{grid = 1, block = 32, args = {x, y, 5, 2}, writes = {y}} end)
  x:copy_(gc.tensor({-1, 4}))
  g:replay()
  lu.assertEquals(y:tolist(), {-5, 20})
  if gc.device() == "host" then lu.assertEquals(kinds[3], "float") end
end

-- Kernels whose parameters the source does not show: an error asking for
-- the signature; given, it is used (and wins over the source's).
local MACRO = [[
#define KERNEL(n) extern "C" __global__ void n(float *y, float a)
KERNEL(fill) { y[0] = a; }
]]
local TEMPLATE = [[
template <typename T> __global__ void tfill(T *y, T a) { y[0] = a; }
]]

local function fill_twin (y, a)
  record(y, a)
  y:fill_(a)
end

function TestKernelArgs:test_signature ()
  local line
  local msg = assert_err(function ()
    line = debug.getinfo(1, "l").currentline; gc.cuda.kernel(MACRO, "fill", {host = fill_twin})
  end, "kernel 'fill': no parameter list of a __global__ function 'fill'",
       "option signature of gc.cuda.kernel")
  lu.assertStrContains(msg, HERE .. line .. ": kernel 'fill'")
  assert_err(function () gc.cuda.kernel(TEMPLATE, "tfill<float>") end, HERE,
             "kernel 'tfill<float>'", "option signature")
  for _, k in ipairs{gc.cuda.kernel(MACRO, "fill", {host = fill_twin, signature = {"ptr", "f32"}}),
                     gc.cuda.kernel(TEMPLATE, "tfill<float>", {host = fill_twin,
                                                               signature = {"ptr", "f32"}})} do
    local y = gc.zeros({1})
    k:launch{grid = 1, block = 1, args = {y, 7}, writes = {y}}
    lu.assertEquals(y:tolist(), {7})
    if gc.device() == "host" then lu.assertEquals(kinds, {"userdata", "float"}) end
    assert_err(function () k:launch{grid = 1, block = 1, args = {y, 7, 1}, writes = {y}} end,
               HERE, "takes 2 arguments, got 3")
  end
  -- the signature wins: scale's a read as a double
  if gc.device() == "host" then
    local d = gc.cuda.kernel(SCALE, "scale", {host = scale_twin,
                                              signature = {"ptr", "ptr", "f64", "i32"}})
    local x, y = gc.tensor({1}), gc.zeros({1})
    d:launch{grid = 1, block = 1, args = {x, y, 0.1, 1}, writes = {y}}
    lu.assertEquals(seen[3], 0.1)
  end
  assert_err(function () gc.cuda.kernel(SCALE, "scale", {signature = {"ptr", "float"}}) end, HERE,
             'gc.cuda.kernel: signature[2] must be one of "ptr", "i32", "u32", "i64", "u64", '
             .. '"f32", "f64", "bool", got float')
  assert_err(function () gc.cuda.kernel(SCALE, "scale", {signature = "ptr"}) end, HERE,
             "option signature must be a table of type names, got string")
end

os.exit(lu.LuaUnit.run(), true)
