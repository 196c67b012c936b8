-- test_safetensors.lua: gc.save and gc.load (docs/lua-api.md, "Checkpoints"):
-- files written by Python's safetensors (tests/fixtures, made by
-- make_safetensors.py) load into the same models and save back to the same
-- bytes; f32 and bf16 round trips are bit for bit (every bf16 pattern); every
-- refusal names the file and what is wrong, at the caller's line; truncated
-- and flipped files never crash nor read past the file. t:tobytes() and
-- gc.frombytes move the raw bytes. Where python3 has safetensors (and
-- PyTorch), files go through Python both ways.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_safetensors.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

local HERE = "test_safetensors.lua"
local FIXTURES = (arg and arg[0] and arg[0]:match("^(.*)/") or "tests/lua") .. "/../fixtures/"

local function read (path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function write (path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- The bytes a save of tensors (and metadata) writes.
local function saved (tensors, metadata)
  local p = os.tmpname()
  gc.save(p, tensors, metadata)
  return H.slurp(p)
end

-- A file of header text h (as given) and data d.
local function file_of (h, d) return string.pack("<I8", #h) .. h .. (d or "") end

-- load's error on a file of the bytes s: it names the file, the caller's
-- line and each string of ...
local function load_err (s, ...)
  local p = os.tmpname()
  write(p, s)
  local msg = H.assert_err(function () gc.load(p) end, HERE, 'load: "' .. p .. '"', ...)
  os.remove(p)
  return msg
end

-- gc.load of the bytes s, through a file.
local function load_bytes (s)
  local p = os.tmpname()
  write(p, s)
  local t = gc.load(p)
  local meta = gc.load_metadata(p)
  os.remove(p)
  return t, meta
end

-- The bits of value k of the bf16 fixture (make_safetensors.py's bf16_bits).
local SPECIAL = {[3] = 0x8000, [5] = 0x7F80, [6] = 0xFF80, [9] = 0x0001, [10] = 0x807F,
                 [12] = 0x7F7F, [20] = 0x7FC1, [21] = 0xFFA5, [22] = 0x7F81}
local function bf16_bits (k)
  return SPECIAL[k] or (((0x3C00 + 97 * k) & 0xFFFF) ~ (k % 3 == 0 and 0x8000 or 0))
end

local MLP = {{"layer_norm_weight", 4}, {"layer_norm_bias", 4}, {"fc1_weight", 32},
             {"fc1_bias", 8}, {"fc2_weight", 32}, {"fc2_bias", 4}}

TestSafetensors = {tearDown = H.no_capture_left}

-- The state dict of PyTorch's Sequential(Linear(4, 3), GELU(), LayerNorm(3)),
-- written by Python's safetensors, loads into graphcap's same model with
-- its values, and the model saves back to the very same bytes.
function TestSafetensors:test_fixture_sequential_f32 ()
  local path = FIXTURES .. "sequential_f32.safetensors"
  lu.assertEquals(gc.load_metadata(path), {format = "pt"})
  lu.assertEquals(select("#", gc.load(path)), 1) -- the tensors alone, as load_file gives them
  local m = gc.nn.Sequential(gc.nn.Linear(4, 3), gc.nn.GELU(), gc.nn.LayerNorm(3))
  local r = m:load_state_dict(gc.load(path)) -- PyTorch's files have metadata: nothing else comes
  lu.assertEquals(r, {missing_keys = {}, unexpected_keys = {}})
  local w, b, lw, lb = {}, {}, {}, {}
  for i = 0, 2 do
    w[i + 1] = {}
    for j = 0, 3 do w[i + 1][j + 1] = (4 * i + j - 6) / 8 end
    b[i + 1], lw[i + 1], lb[i + 1] = (i - 1) / 4, 1 + i / 4, i / 16
  end
  lu.assertEquals(m[1].weight:tolist(), w)
  lu.assertEquals(m[1].bias:tolist(), b)
  lu.assertEquals(m[3].weight:tolist(), lw)
  lu.assertEquals(m[3].bias:tolist(), lb)
  lu.assertEquals(saved(m:state_dict(), {format = "pt"}), read(path))
end

-- TransformerEngine's LayerNormMLP in bf16: every value, -0, infinities,
-- subnormals and NaN payloads included, goes file -> model -> file bit for bit.
function TestSafetensors:test_fixture_te_bf16_bits ()
  local path = FIXTURES .. "layernorm_mlp_bf16.safetensors"
  local sd = gc.load(path)
  lu.assertNil(gc.load_metadata(path))
  local m = gc.nn.LayerNormMLP(4, 8):to("bf16")
  m:load_state_dict(sd)
  local k = 0
  for _, e in ipairs(MLP) do
    local bits = {}
    for i = 1, e[2] do bits[i] = bf16_bits(k); k = k + 1 end
    local want = string.pack("<" .. string.rep("I2", e[2]), table.unpack(bits))
    lu.assertEquals(sd[e[1]]:dtype(), "bf16")
    lu.assertEquals(sd[e[1]]:tobytes(), want, e[1] .. " as loaded")
    lu.assertEquals(m[e[1]]:tobytes(), want, e[1] .. " in the module")
  end
  lu.assertEquals(sd.fc1_weight:shape(), {8, 4})
  lu.assertEquals(saved(m:state_dict()), read(path))
end

-- f32: NaN payloads, -0, infinities, subnormals, every shape from 0-D to 4-D
-- and empty ones, and metadata with characters JSON escapes.
function TestSafetensors:test_roundtrip_f32_bitwise ()
  gc.manual_seed(3)
  local specials = string.pack("<I4I4I4I4I4I4", 0x7fc00123, 0xff800001, 0x80000000, 0x7f800000,
                               0x00000001, 0x3f800000)
  local ts = {
    special = gc.frombytes(specials, {2, 3}),
    scalar = gc.tensor(2.5),
    empty = gc.zeros({0}),
    empty3 = gc.zeros({2, 0, 3}),
    four = gc.randn({2, 3, 1, 5}),
    ["quote\"back\\slash\nnew λ"] = gc.randn({3}),
  }
  local meta = {["k\"ey"] = "v\tal\1ue λ", format = "pt"}
  local p = os.tmpname()
  gc.save(p, ts, meta)
  local back, m2 = gc.load(p), gc.load_metadata(p)
  os.remove(p)
  lu.assertEquals(m2, meta)
  local n = 0
  for k, t in pairs(ts) do
    n = n + 1
    lu.assertEquals(back[k]:shape(), t:shape(), k)
    lu.assertEquals(back[k]:dtype(), "f32", k)
    lu.assertEquals(back[k]:tobytes(), t:tobytes(), k)
  end
  for _ in pairs(back) do n = n - 1 end
  lu.assertEquals(n, 0)
end

-- bf16: all 65536 patterns, and a model's bf16 parameters.
function TestSafetensors:test_roundtrip_bf16_all_patterns ()
  local bits = {}
  for i = 0, 65535 do bits[#bits + 1] = string.pack("<I2", i) end
  local s = table.concat(bits)
  local t = gc.frombytes(s, {256, 256}, "bf16")
  lu.assertEquals(t:tobytes(), s)
  local p = os.tmpname()
  gc.save(p, {all = t, f = gc.ones({2})})
  local back = gc.load(p)
  os.remove(p)
  lu.assertEquals(back.all:dtype(), "bf16")
  lu.assertEquals(back.all:tobytes(), s)
  lu.assertEquals(back.f:tolist(), {1, 1})
  -- values as the device holds them: 1.0 is 0x3f80
  lu.assertEquals(gc.tensor({1, -2}, "bf16"):tobytes(), string.pack("<I2I2", 0x3f80, 0xc000))
end

-- The layout of a written file: tensors by dtype (f32 first) then name, the
-- header padded with spaces to 8 bytes, as Python's writer lays it out.
function TestSafetensors:test_layout ()
  local s = saved({b = gc.zeros({1}, "bf16"), a = gc.ones({1}, "bf16"), z = gc.full({1}, 2)})
  local n = string.unpack("<I8", s)
  lu.assertEquals(n % 8, 0)
  local h = '{"z":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
            .. '"a":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]},'
            .. '"b":{"dtype":"BF16","shape":[1],"data_offsets":[6,8]}}'
  lu.assertEquals(s:sub(9, 8 + n), h .. string.rep(" ", n - #h))
  lu.assertTrue(n - #h < 8)
  lu.assertEquals(s:sub(9 + n), string.pack("<fI2I2", 2, 0x3f80, 0))
  lu.assertEquals(saved({}), string.pack("<I8", 8) .. "{}      ")
end

function TestSafetensors:test_save_refusals ()
  local p = os.tmpname()
  local t = gc.ones({2})
  H.assert_err(function () gc.save(p, t) end, HERE, "save: tensors must be a table", "a tensor")
  H.assert_err(function () gc.save(p, {t}) end, HERE, "save: tensor names must be strings",
               "number key 1")
  H.assert_err(function () gc.save(p, {w = 3}) end, HERE, 'save: tensors["w"] must be a tensor')
  H.assert_err(function () gc.save(p, {__metadata__ = t}) end, HERE, '"__metadata__"')
  H.assert_err(function () gc.save(p, {["\255"] = t}) end, HERE, "is not UTF-8")
  H.assert_err(function () gc.save(p, {w = t}, {a = 1}) end, HERE,
               "save: metadata must map strings to strings")
  H.assert_err(function () gc.save(3, {w = t}) end, HERE, "save: path must be a string")
  local c = gc.ones({2})
  c:close()
  H.assert_err(function () gc.save(p, {w = c}) end, HERE, 'tensors["w"] is a closed tensor')
  H.assert_err(function () gc.save("/nonexistent-dir/x.safetensors", {w = t}) end, HERE,
               'save: cannot write "/nonexistent-dir/x.safetensors"')
  local g = gc.Graph()
  H.assert_err(function () g:capture(function () gc.save(p, {w = t}) end) end, HERE,
               "save: reading tensors back is not allowed while a capture is open")
  os.remove(p)
end

-- Each lie a header can tell, refused by name before any data is read.
function TestSafetensors:test_load_refusals ()
  local T = '{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
  local d8 = string.rep("\0", 8)
  H.assert_err(function () gc.load("/nonexistent-dir/m.safetensors") end, HERE,
               'load: cannot open "/nonexistent-dir/m.safetensors"')
  H.assert_err(function () gc.load({}) end, HERE, "load: path must be a string")
  local dir = os.tmpname()
  os.remove(dir)
  lu.assertTrue(os.execute("mkdir " .. H.quote(dir)))
  H.assert_err(function () gc.load(dir) end, HERE, 'load: "' .. dir .. '": cannot read it')
  os.remove(dir)
  load_err("", "is not a safetensors file: 0 bytes")
  load_err("\1\0\0", "3 bytes, less than the 8")
  load_err(string.pack("<I8", 40) .. "{}", "is truncated: its header length is 40 bytes, but 2")
  load_err(string.pack("<i8", -1) .. "{}", "header length of 2^63 or more")
  load_err(string.pack("<I8", 200000000) .. "{}", "header length 200000000 is over")
  load_err(file_of("[]"), "does not start with '{'")
  load_err(file_of('{"a":' .. T .. ',}', d8), "not valid JSON: expected a string key at byte 55 of the header")
  load_err(file_of('{"a":' .. T, d8), "not valid JSON: expected ',' or '}'")
  load_err(file_of('{"a":' .. T .. ',"a":' .. T .. '}', d8), 'duplicate key "a"')
  load_err(file_of('{"a\\q":1}'), "bad escape")
  load_err(file_of('{"a":' .. T .. '} x', d8), "text after the value")
  load_err(file_of('{"a":' .. string.rep("[", 100) .. string.rep("]", 100) .. "}"),
           "nesting deeper than 64")
  load_err(file_of('{"a\1":1}'), "control character in a string")
  load_err(file_of('{"\xff":1}'), "not UTF-8")
  load_err(file_of('{"a":[1,2]}'), 'tensor "a" must be an object')
  load_err(file_of('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}}', d8),
           'tensor "a" has an unknown field "x"')
  load_err(file_of('{"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}}', d8),
           'tensor "a" has dtype F16; graphcap reads F32 and BF16')
  load_err(file_of('{"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}', d8),
           "has dtype I64")
  load_err(file_of('{"a":{"dtype":"Q8","shape":[8],"data_offsets":[0,8]}}', d8),
           'has an unknown dtype "Q8"')
  load_err(file_of('{"a":{"shape":[2],"data_offsets":[0,8]}}', d8), "has no dtype")
  load_err(file_of('{"a":{"dtype":"F32","shape":{},"data_offsets":[0,8]}}', d8), "has no shape")
  load_err(file_of('{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', d8),
           "shape entry #1 -2; sizes are integers >= 0")
  load_err(file_of('{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}', d8),
           "shape entry #1 2.0")
  load_err(file_of('{"a":{"dtype":"F32","shape":[1,1,1,1,2],"data_offsets":[0,8]}}', d8),
           "has 5 dims; graphcap's tensors have 0 to 4")
  load_err(file_of('{"a":{"dtype":"F32","shape":[99999999999,99999999999],' ..
                   '"data_offsets":[0,8]}}', d8), "more than 2^40 elements, graphcap's most")
  load_err(file_of('{"a":{"dtype":"F32","shape":[4,4611686018427387904],' ..
                   '"data_offsets":[0,0]}}'), "more than 2^40 elements")
  load_err(file_of('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}}', d8),
           "has no data_offsets [begin, end] of two integers")
  load_err(file_of('{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}', d8),
           "data_offsets [8, 0]: expected 0 <= begin <= end")
  load_err(file_of('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}}', d8),
           "data_offsets [0, 16] past the end of the data (8 bytes)")
  load_err(file_of('{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}}', d8),
           "BF16 [2] needs 4 bytes, but its data_offsets [0, 8] hold 8")
  load_err(file_of('{"a":' .. T .. ',"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', d8),
           'tensors "a" and "b" overlap (data_offsets [0, 8] and [4, 8])')
  load_err(file_of('{"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', d8),
           'bytes 0 to 4 of the data belong to no tensor (before "b")')
  load_err(file_of('{"a":' .. T .. '}', d8 .. "\0\0"),
           "the tensors cover 8 bytes of data, but the file holds 10 after the header")
  load_err(file_of('{"__metadata__":{"a":1}}'), '__metadata__ entry "a" is not a string')
  load_err(file_of('{"__metadata__":["a"]}'), "__metadata__ must be an object")
  -- a header padded with spaces, and an empty file of no tensors, load; so do
  -- empty tensors, whatever their other sizes
  lu.assertEquals(next(load_bytes(file_of("{}        "))), nil)
  local e = load_bytes(file_of('{"a":{"dtype":"BF16","shape":[0,1099511627776],' ..
                               '"data_offsets":[0,0]},"b":{"dtype":"F32","shape":[3,0],' ..
                               '"data_offsets":[0,0]}}'))
  lu.assertEquals({e.a:shape(), e.b:shape()}, {{0, 1099511627776}, {3, 0}})
  local g = gc.Graph()
  local p = os.tmpname()
  write(p, file_of("{}"))
  H.assert_err(function () g:capture(function () gc.load(p) end) end, HERE,
               "load: writing tensors from the host is not allowed while a capture is open")
  -- load_metadata reads no tensor: a capture may be open; its refusals name it
  write(p, file_of('{"__metadata__":{"format":"pt"}}'))
  local meta
  g:capture(function () meta = gc.load_metadata(p) end)
  lu.assertEquals(meta, {format = "pt"})
  write(p, "\1\0\0")
  H.assert_err(function () gc.load_metadata(p) end, HERE,
               "load_metadata: \"" .. p .. "\" is not a safetensors file: 3 bytes")
  os.remove(p)
end

-- Every truncation of both fixtures is refused by name; flipped bytes either
-- load (a flip in the data) or are refused by name: never a crash, never
-- another error, never a read past the file.
function TestSafetensors:test_fuzz_truncated_and_flipped ()
  local p = os.tmpname()
  local function try (s)
    write(p, s)
    local ok, err = pcall(gc.load, p)
    if not ok then
      lu.assertStrContains(tostring(err), HERE)
      lu.assertStrContains(tostring(err), 'load: "' .. p .. '"')
    end
    return ok
  end
  for _, name in ipairs({"sequential_f32.safetensors", "layernorm_mlp_bf16.safetensors"}) do
    local s = read(FIXTURES .. name)
    for n = 0, #s - 1 do lu.assertFalse(try(s:sub(1, n)), name .. " cut at " .. n) end
    lu.assertTrue(try(s))
    local loaded, refused = 0, 0
    for i = 1, #s do
      for _, mask in ipairs({0x01, 0x20, 0x80, 0xff}) do
        local b = string.char(s:byte(i) ~ mask)
        if try(s:sub(1, i - 1) .. b .. s:sub(i + 1)) then loaded = loaded + 1
        else refused = refused + 1 end
      end
    end
    lu.assertTrue(loaded > 0 and refused > 0)
  end
  os.remove(p)
end

-- An allocation that fails while loading names the file and the tensor.
function TestSafetensors:test_allocation_failure ()
  local path = FIXTURES .. "layernorm_mlp_bf16.safetensors"
  local failed = 0
  for n = 1, 100 do
    gc._test.fail_alloc(n)
    local ok, err = pcall(gc.load, path)
    local hit = gc._test.fail_alloc(0)
    if not hit then
      lu.assertTrue(ok, tostring(err))
      break
    end
    if not ok then
      failed = failed + 1
      lu.assertStrContains(err, HERE)
      lu.assertStrContains(err, 'load: "' .. path .. '": tensor "')
    end
  end
  lu.assertTrue(failed > 0)
end

function TestSafetensors:test_tobytes_frombytes ()
  local t = gc.tensor({{1, 2}, {3, 4}})
  lu.assertEquals(t:tobytes(), string.pack("<ffff", 1, 2, 3, 4))
  local u = gc.frombytes(t:tobytes(), {4}, {requires_grad = true})
  lu.assertEquals(u:tolist(), {1, 2, 3, 4})
  lu.assertTrue(u.requires_grad)
  H.assert_err(function () gc.frombytes("abc", {2}) end, HERE,
               "frombytes: 3 bytes, but a tensor of 2 f32 elements holds 8")
  H.assert_err(function () gc.frombytes(3, {2}) end, HERE, "frombytes: s must be a string")
  local g = gc.Graph()
  H.assert_err(function () g:capture(function () return t:tobytes() end) end, HERE,
               "read_bytes: reading a tensor's bytes back to the host is not allowed")
end

-- Where python3 has safetensors (GRAPHCAP_TEST_PYTHON names another python):
-- Python reads what gc.save wrote, and writes what gc.load reads.
function TestSafetensors:test_python_reads_and_writes ()
  local py = os.getenv("GRAPHCAP_TEST_PYTHON") or "python3"
  if not os.execute(py .. " -c 'import safetensors' 2>/dev/null") then
    lu.skip(py .. " has no safetensors (pip install safetensors)")
  end
  local p, q = os.tmpname(), os.tmpname()
  gc.manual_seed(1)
  local ts = {w = gc.randn({3, 4}), ["b\"\\λ"] = gc.randn({5}, "bf16"), s = gc.tensor(1.5)}
  gc.save(p, ts, {format = "pt"})
  local script = [==[
import sys
from safetensors import deserialize, serialize_file, TensorSpec
import ctypes, json
raw = open(sys.argv[1], "rb").read()
keep, specs = [], {}
for name, info in deserialize(raw):
    buf = ctypes.create_string_buffer(bytes(info["data"]), len(info["data"]))
    keep.append(buf)
    specs[name] = TensorSpec(dtype={"F32": "float32", "BF16": "bfloat16"}[info["dtype"]],
                             shape=info["shape"], data_ptr=ctypes.addressof(buf),
                             data_len=len(info["data"]))
serialize_file(specs, sys.argv[2], metadata={"format": "pt"})
]==]
  local sp = os.tmpname()
  write(sp, script)
  lu.assertTrue(os.execute(py .. " " .. H.quote(sp) .. " " .. H.quote(p) .. " " .. H.quote(q)))
  lu.assertEquals(read(q), read(p))
  local back = gc.load(q)
  for k, t in pairs(ts) do lu.assertEquals(back[k]:tobytes(), t:tobytes(), k) end
  os.remove(p); os.remove(q); os.remove(sp)
end

-- Where python3 has PyTorch and safetensors (the GPU machines): PyTorch's
-- Sequential(Linear, GELU, LayerNorm) saved by save_file loads here and
-- gives PyTorch's outputs; changed here and saved by gc.save, it loads into
-- PyTorch with load_state_dict (strict) and gives ours; a bf16 state dict
-- goes PyTorch -> graphcap -> PyTorch bit for bit.
function TestSafetensors:test_torch_round_trip ()
  local py = os.getenv("GRAPHCAP_TEST_PYTHON") or "python3"
  if not os.execute(py .. " -c 'import torch, safetensors' 2>/dev/null") then
    lu.skip(py .. " has no torch or no safetensors")
  end
  local script = [==[
import sys, torch
from safetensors.torch import save_file, load_file
mode, d = sys.argv[1], sys.argv[2]
def model():
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.GELU(approximate="tanh"),
                               torch.nn.LayerNorm(3))
if mode == "make":
    torch.manual_seed(0)
    m = model()
    x = torch.randn(5, 4)
    save_file(m.state_dict(), d + "/torch.safetensors", metadata={"format": "pt"})
    with torch.no_grad():
        save_file({"x": x, "y": m(x)}, d + "/io.safetensors")
    save_file(model().to(torch.bfloat16).state_dict(), d + "/torch_bf16.safetensors")
else:
    m = model()
    m.load_state_dict(load_file(d + "/graphcap.safetensors"))
    with torch.no_grad():
        save_file({"y": m(load_file(d + "/io.safetensors")["x"])}, d + "/torch_y.safetensors")
    a, b = load_file(d + "/torch_bf16.safetensors"), load_file(d + "/graphcap_bf16.safetensors")
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    for k in a:
        assert torch.equal(a[k].view(torch.int16), b[k].view(torch.int16)), k
]==]
  local d = os.tmpname()
  os.remove(d)
  lu.assertTrue(os.execute("mkdir " .. H.quote(d)))
  write(d .. "/rt.py", script)
  local function python (mode)
    lu.assertTrue(os.execute(py .. " " .. H.quote(d .. "/rt.py") .. " " .. mode .. " " .. H.quote(d)),
                  "python " .. mode)
  end
  local function model ()
    return gc.nn.Sequential(gc.nn.Linear(4, 3), gc.nn.GELU(), gc.nn.LayerNorm(3))
  end
  python("make")
  local m = model()
  m:load_state_dict(gc.load(d .. "/torch.safetensors"))
  local io = gc.load(d .. "/io.safetensors")
  H.assert_close(m(io.x):tolist(), io.y:tolist(), 1e-4, 1e-4, "PyTorch's outputs")
  gc.no_grad(function () m[1].weight:copy_(m[1].weight * 2) end)
  gc.save(d .. "/graphcap.safetensors", m:state_dict())
  local mb = model():to("bf16")
  mb:load_state_dict(gc.load(d .. "/torch_bf16.safetensors"))
  gc.save(d .. "/graphcap_bf16.safetensors", mb:state_dict())
  python("check")
  H.assert_close(gc.load(d .. "/torch_y.safetensors").y:tolist(), m(io.x):tolist(), 1e-4, 1e-4,
                 "graphcap's outputs in PyTorch")
  os.execute("rm -rf " .. H.quote(d))
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
