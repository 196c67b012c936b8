-- test_fp8_cast.lua: gc.fp8.cast, the FP8 casts (docs/lua-api.md, "FP8"):
-- every E4M3 and E5M2 value round-trips, ties go to even, values beyond the
-- largest finite saturate (infinities too), NaN stays NaN, subnormals are
-- exact, a scale multiplies before the cast and its float inverse after,
-- and the amax is the largest |x| with NaN left out. The values are decoded
-- here in plain Lua from the formats' definitions.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_fp8_cast.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

-- The value of FP8 byte q: m mantissa bits, exponent bias b; E4M3 has no
-- infinity and one NaN pattern per sign (0x7f), E5M2 IEEE-like specials.
local FMT = {E4M3 = {m = 3, b = 7, max = 448}, E5M2 = {m = 2, b = 15, max = 57344}}

local function decode (q, name)
  local f = FMT[name]
  local sign = q >= 128 and -1 or 1
  local e, man = (q % 128) >> f.m, q % (1 << f.m)
  if name == "E4M3" and q % 128 == 127 then return 0 / 0 end
  if name == "E5M2" and e == 31 then return man == 0 and sign * math.huge or 0 / 0 end
  if e == 0 then return sign * man * 2.0 ^ (1 - f.b - f.m) end
  return sign * ((1 << f.m) + man) * 2.0 ^ (e - f.b - f.m)
end

-- Every finite value of a format, in byte order.
local function finite_values (name)
  local v = {}
  for q = 0, 255 do
    local x = decode(q, name)
    if x == x and math.abs(x) ~= math.huge then v[#v + 1] = x end
  end
  return v
end

local function cast (xs, name, scale)
  local y, amax = gc.fp8.cast(gc.tensor(xs), name, scale)
  return y:tolist(), amax:item()
end

TestFp8Cast = {}

function TestFp8Cast:test_every_value_round_trips ()
  for name, f in pairs(FMT) do
    local v = finite_values(name)
    lu.assertEquals(#v, name == "E4M3" and 254 or 248, name .. ": finite values")
    local got, amax = cast(v, name)
    H.assert_bitwise(got, v, name .. " round trip")
    lu.assertEquals(amax, f.max, name .. ": amax")
  end
end

function TestFp8Cast:test_ties_to_even ()
  -- the midpoints between neighbours go to the one with an even mantissa
  for name in pairs(FMT) do
    local v, mids, want = finite_values(name), {}, {}
    table.sort(v)
    for i = 1, #v - 1 do
      if v[i] >= 0 and v[i + 1] > v[i] then
        mids[#mids + 1] = (v[i] + v[i + 1]) / 2
        local lo = v[i]
        -- lo's mantissa is even when its byte is even
        local qlo
        for q = 0, 127 do if decode(q, name) == lo then qlo = q end end
        want[#want + 1] = qlo % 2 == 0 and v[i] or v[i + 1]
      end
    end
    H.assert_bitwise((cast(mids, name)), want, name .. " midpoints")
  end
end

function TestFp8Cast:test_saturates ()
  local got = cast({449, 464, 465, 1e30, math.huge, -1e30, -math.huge}, "E4M3")
  H.assert_bitwise(got, {448, 448, 448, 448, 448, -448, -448}, "E4M3 saturation")
  got = cast({57345, 61439, 61440, 1e30, math.huge, -math.huge}, "E5M2")
  H.assert_bitwise(got, {57344, 57344, 57344, 57344, 57344, -57344}, "E5M2 saturation")
end

function TestFp8Cast:test_subnormals ()
  -- E4M3's smallest subnormal is 2^-9, E5M2's 2^-16; half of it ties to 0
  local got = cast({2 ^ -9, 2 ^ -10, 1.5 * 2 ^ -10, 2 ^ -11, 3 * 2 ^ -10, 7 * 2 ^ -9}, "E4M3")
  H.assert_bitwise(got, {2 ^ -9, 0, 2 ^ -9, 0, 2 ^ -8, 7 * 2 ^ -9}, "E4M3 subnormals")
  got = cast({2 ^ -16, 2 ^ -17, 3 * 2 ^ -17, 3 * 2 ^ -16, 7 * 2 ^ -17, 2 ^ -130}, "E5M2")
  H.assert_bitwise(got, {2 ^ -16, 0, 2 ^ -15, 3 * 2 ^ -16, 2 ^ -14, 0}, "E5M2 subnormals")
end

function TestFp8Cast:test_nan_and_amax ()
  for name in pairs(FMT) do
    local got, amax = cast({0 / 0, 1, -3}, name)
    lu.assertTrue(got[1] ~= got[1], name .. ": NaN stays NaN")
    lu.assertEquals(amax, 3, name .. ": the amax leaves NaN out")
  end
end

function TestFp8Cast:test_scale ()
  -- q = cast(x * s), then q * (1 / s) as a float product
  local s = 3.0
  local xs = {1.0, 100.0, 200.0, -0.01}
  local got, amax = cast(xs, "E4M3", s)
  local inv = gc.tensor({1 / s}):tolist()[1] -- the float nearest 1 / s
  local want = {}
  for i, x in ipairs(xs) do
    local q = (cast({x * s}, "E4M3"))[1]
    want[i] = (gc.tensor({q}) * gc.tensor({inv})):tolist()[1]
  end
  H.assert_bitwise(got, want, "scaled round trip")
  lu.assertEquals(amax, 200)
  lu.assertEquals(got[3], (gc.tensor({448}) * gc.tensor({inv})):tolist()[1],
                  "200 * 3 saturates to 448 before the inverse scale")
end

function TestFp8Cast:test_bf16_and_shapes ()
  local x = gc.tensor({{1, 2.5}, {-3, 1000}}, "bf16")
  local y = gc.fp8.cast(x, "E4M3")
  lu.assertEquals(y:dtype(), "bf16")
  lu.assertEquals(y:shape(), {2, 2})
  H.assert_bitwise(y:tolist(), {{1, 2.5}, {-3, 448}}, "bf16")
end

function TestFp8Cast:test_errors ()
  local x = gc.ones({2})
  H.assert_err(function () gc.fp8.cast(x, "E3M4") end, "fp8.cast: format must be")
  H.assert_err(function () gc.fp8.cast(x, "E4M3", 0) end, "fp8.cast: scale must be a finite")
  H.assert_err(function () gc.fp8.cast(x, "E4M3", 1 / 0) end, "fp8.cast: scale must be a finite")
  H.assert_err(function () gc.fp8.cast(x, "E4M3", "2") end, "fp8.cast: scale must be a number")
  local err = H.assert_err(function () gc.fp8.cast(x, "E5M3") end, "E4M3")
  lu.assertStrContains(err, "test_fp8_cast.lua:")
  local y = gc.fp8.cast(x, "E4M3") -- usable after the errors
  H.assert_bitwise(y:tolist(), {1, 1}, "after errors")
end

os.exit(lu.LuaUnit.run(), true)
