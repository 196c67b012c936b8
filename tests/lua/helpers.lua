-- helpers.lua: the helpers the Lua suites share (nested tables and values,
-- comparisons, errors, small models and samples, pipeline schedules). Not a
-- suite (tests/run.sh runs test_*.lua only). A suite requires it, from the
-- LUA_PATH that tests/run.sh gives every suite (tests/lua, tests/dist):
--   local H = require "helpers"
-- and so does a suite run by hand, from the top of the tree:
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_tensor.lua -o tap
-- Error positions: a suite keeps its own HERE (its file name): a HERE
-- computed here would name this file.

local lu = require "luaunit"
local gc = require "graphcap"

local H = {}

-- ---------------------------------------------------------------------------
-- Nested tables and values

-- The entries of a nested table (or a number) in row-major order.
local function flat (v, out)
  out = out or {}
  if type(v) ~= "table" then out[#out + 1] = v; return out end
  for _, w in ipairs(v) do flat(w, out) end
  return out
end
H.flat = flat

-- The flat list xs as nested sequences of 'shape' (a number for {}). xs may
-- also be a function: the entries are then xs(0), xs(1), ... in row-major
-- order.
function H.nest (xs, shape)
  local at = xs
  if type(xs) ~= "function" then at = function (i) return xs[i + 1] end end
  local i = -1
  local function level (d)
    if d > #shape then i = i + 1; return at(i) end
    local t = {}
    for k = 1, shape[d] do t[k] = level(d + 1) end
    return t
  end
  return level(1)
end

-- n not-too-regular values in about [-scale, scale] (deterministic), plus
-- offset when one is given.
function H.values (n, phase, scale, offset)
  local v = {}
  for i = 1, n do
    local x = (scale or 1) * math.sin(0.71 * i + (phase or 0))
    if offset then x = offset + x end
    v[i] = x
  end
  return v
end

-- ---------------------------------------------------------------------------
-- Comparisons

-- |got[i] - want[i]| <= atol + rtol * |want[i]| for every entry of the
-- (flattened) nested tables.
function H.assert_close (got, want, atol, rtol, what)
  got, want = flat(got), flat(want)
  lu.assertEquals(#got, #want, what .. ": length")
  for i = 1, #want do
    local g, w = got[i], want[i]
    if not (math.abs(g - w) <= atol + rtol * math.abs(w)) then
      lu.fail(string.format("%s[%d]: got %.9g, want %.9g (atol %g, rtol %g)",
                            what, i, g, w, atol, rtol))
    end
  end
end

-- Element by element with ==: bitwise for the finite values compared here.
-- An FP8 GEMM's result against the f32 GEMM of the dequantized values
-- (rounded to the result's dtype dt, "f32" by default): bit for bit on the
-- host (that is its GEMM); within 1e-3 + 1e-3 |ref| on cuda, whose cuBLASLt
-- FP8 GEMM sums the FP8 products in its own order (the forward with fast
-- accumulation); 1e-2 + 1e-2 |ref| for bf16, where that order may round a
-- sum to the bf16 next to the reference's.
function H.assert_fp8_gemm (got, want, what, dt)
  if gc.device() == "host" then return H.assert_bitwise(got, want, what) end
  local tol = dt == "bf16" and 1e-2 or 1e-3 -- bf16: one rounding of the result apart
  return H.assert_close(got, want, tol, tol, what)
end

-- One FP8 step of module eager (under gc.fp8.autocast with recipe R) and of
-- its graphed copy on the same input x and output grad g, grads zeroed
-- first: their outputs and input grads equal bit for bit (what names the
-- step). The callers compare what else their step leaves.
function H.fp8_step_pair (eager, graphed, R, x, g, what)
  local xe, xg = x:clone():requires_grad_(true), x:clone():requires_grad_(true)
  eager:zero_grad()
  graphed:zero_grad()
  local ye = gc.fp8.autocast({recipe = R}, function () return eager(xe) end)
  local yg = graphed(xg)
  ye:backward(g)
  yg:backward(g)
  H.assert_bitwise(yg:tolist(), ye:tolist(), what .. ": y")
  H.assert_bitwise(xg.grad:tolist(), xe.grad:tolist(), what .. ": dx")
end

function H.assert_bitwise (got, want, what)
  got, want = flat(got), flat(want)
  lu.assertEquals(#got, #want, what .. ": length")
  for i = 1, #want do
    if not (got[i] == want[i]) then
      lu.fail(string.format("%s[%d]: got %.9g, want %.9g (not bitwise equal)",
                            what, i, got[i], want[i]))
    end
  end
end

-- Nested tables (sequences and maps) of numbers, equal key by key and
-- element by element with ==.
local function assert_same (a, b, what)
  if type(a) ~= "table" or type(b) ~= "table" then
    lu.assertTrue(type(a) == type(b) and a == b,
                  string.format("%s: %s ~= %s", what, tostring(a), tostring(b)))
    return
  end
  lu.assertEquals(#a, #b, what .. ": lengths differ")
  for k, v in pairs(a) do assert_same(v, b[k], what .. "[" .. tostring(k) .. "]") end
  for k in pairs(b) do lu.assertNotNil(a[k], what .. "[" .. tostring(k) .. "] missing") end
end
H.assert_same = assert_same

-- The error message of f(...), which must fail.
local function err_of (f, ...)
  local ok, e = pcall(f, ...)
  lu.assertFalse(ok, "expected an error")
  return tostring(e)
end

-- The error of f(), which must fail, containing every one of the strings.
function H.assert_err (f, ...)
  local msg = err_of(f)
  for _, p in ipairs{...} do lu.assertStrContains(msg, p) end
  return msg
end

-- Central differences of the scalar function L() at the flat list xs (L
-- reads xs; step h, 1e-5 unless given).
function H.numgrad (L, xs, h)
  h = h or 1e-5
  local g = {}
  for j = 1, #xs do
    local keep = xs[j]
    xs[j] = keep + h
    local up = L()
    xs[j] = keep - h
    local down = L()
    xs[j] = keep
    g[j] = (up - down) / (2 * h)
  end
  return g
end

--[[
Check op's forward and backward against a double-precision reference.
  inputs: sequence of {shape, values, grad = bool (default true), dtype = nil}
  op(t1, t2, ...) -> tensor (graphcap)
  ref(v1, v2, ...) -> flat list (the same op in double, on flat lists)
The loss is sum(op(...) * c) for fixed weights c; every input that requires
grad must end with .grad = d loss / d input, here by central differences
of sum(ref(...) * c). Returns the input tensors.
]]
function H.gradcheck (what, inputs, op, ref, tol)
  tol = tol or {}
  local atol, rtol = tol.atol or 2e-5, tol.rtol or 2e-4  -- f32 kernels against doubles
  local ts, vals = {}, {}
  for i, inp in ipairs(inputs) do
    ts[i] = gc.tensor(H.nest(inp[2], inp[1]), {requires_grad = inp.grad ~= false})
    vals[i] = H.flat(ts[i]:tolist())  -- the f32 values the engine sees
  end
  local y = op(table.unpack(ts))
  local yv = H.flat(y:tolist())
  H.assert_close(yv, ref(table.unpack(vals)), atol, rtol, what .. " forward")
  local c = H.values(#yv, 0.3, 1.0)
  for k = 1, #c do c[k] = c[k] + 0.25 end
  local ct = gc.tensor(H.nest(c, y:shape()))
  lu.assertNil(ts[1].grad)
  ;(y * ct):sum():backward()
  local function L ()
    local r, s = ref(table.unpack(vals)), 0
    for k = 1, #r do s = s + r[k] * c[k] end
    return s
  end
  for i, inp in ipairs(inputs) do
    if inp.grad ~= false then
      local want = H.numgrad(L, vals[i], tol.h)
      lu.assertNotNil(ts[i].grad, what .. ": input " .. i .. " has no grad")
      lu.assertEquals(ts[i].grad:shape(), inp[1], what .. ": grad shape of input " .. i)
      H.assert_close(H.flat(ts[i].grad:tolist()), want, atol, rtol,
                   what .. " grad of input " .. i)
    else
      lu.assertNil(ts[i].grad, what .. ": input " .. i .. " needs no grad")
    end
  end
  return ts
end

-- What the engine holds after a full collection: objects, blocks, bytes.
function H.live ()
  collectgarbage()
  collectgarbage()
  return gc._test.live()
end

-- Every test of a suite that loads these helpers leaves nothing alive: after
-- the test function returns and a full collection, the engine holds as many
-- objects, blocks and bytes as before it (what setUp made is in both).
local run_one = lu.LuaUnit.execOneFunction
function lu.LuaUnit:execOneFunction (class, name, instance, method)
  local test = method
  if type(test) == "function" then
    method = function (...)
      local was = H.live()
      test(...)
      local now = H.live()
      if now.objects ~= was.objects or now.blocks ~= was.blocks
         or now.in_use_bytes ~= was.in_use_bytes then
        lu.fail(string.format("left alive: objects %d -> %d, blocks %d -> %d, bytes %d -> %d",
                              was.objects, now.objects, was.blocks, now.blocks,
                              was.in_use_bytes, now.in_use_bytes))
      end
    end
  end
  return run_one(self, class, name, instance, method)
end

-- ---------------------------------------------------------------------------
-- State that a failed call must leave as it was

-- The values and .grad of params, what the engine holds, the ordinary
-- allocator's and pool's stats (peak aside; the ordinary allocator keeps
-- what it reserved, a cache as PyTorch's).
function H.state (params, pool)
  local s = {live = H.live(), heap = gc.memory_stats(), pool = pool and pool:stats(),
             params = {}, grads = {}}
  s.heap.peak_bytes, s.heap.reserved_bytes = nil, nil
  if s.pool then s.pool.peak_bytes = nil end
  for i, p in ipairs(params) do
    s.params[i] = p:tolist()
    s.grads[i] = p.grad and p.grad:tolist() or false
  end
  return s
end

-- The state now equals was; skip names parts not compared ({grads = true}).
-- what names the call (and the failure) in the message.
function H.assert_state (was, params, pool, what, skip)
  local now = H.state(params, pool)
  skip = skip or {}
  for _, k in ipairs{"live", "heap", "pool", "params", "grads"} do
    if not skip[k] then
      local ok, e = pcall(lu.assertEquals, now[k], was[k])
      if not ok then lu.fail(string.format("%s: %s not as before: %s", what, k, tostring(e))) end
    end
  end
end

-- Call this with the generator seeded 42 before the failed call: the
-- generator drew nothing since.
function H.assert_rng_untouched (what)
  local a = gc.rand({4}):tolist()
  gc.manual_seed(42)
  lu.assertEquals(a, gc.rand({4}):tolist(), what .. ": the random generator moved")
end

-- A tearDown: no capture was left open.
function H.no_capture_left ()
  lu.assertFalse(gc.is_capturing())
end

-- A tearDown: grad mode was left on.
function H.grad_mode_left_on ()
  lu.assertTrue(gc.is_grad_enabled())
end

-- ---------------------------------------------------------------------------
-- Modules and samples

-- A tensor of shape holding n not-too-regular values in about [-1.5, 1.5]
-- (H.values from phase).
function H.input (shape, phase, requires_grad)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return gc.tensor(H.nest(H.values(n, phase or 0, 1.5), shape), {requires_grad = requires_grad})
end

-- Copy src's parameters into dst's (same structure).
function H.copy_params (dst, src)
  local d, s = dst:parameters(), src:parameters()
  lu.assertEquals(#d, #s)
  gc.no_grad(function ()
    for i = 1, #d do d[i]:copy_(s[i]) end
  end)
end

-- sum(y * c) for fixed weights c of y's shape, backpropagated.
function H.backward_weighted (y)
  local n = y:numel()
  local c = H.values(n, 0.9)
  for i = 1, n do c[i] = c[i] + 0.5 end
  ;(y * gc.tensor(H.nest(c, y:shape()))):sum():backward()
end

-- A module that uses the tensor p twice (weight tying): Tied(p), with
-- t1 = Scale(p) and t2 = Scale(p), forward(x) = t2(t1(x)) = x * p * p.
function H.tied (p)
  local Scale = gc.nn.Module("Scale")
  function Scale:init (w) self.w = w end
  function Scale:forward (x) return x * self.w end
  local Tied = gc.nn.Module("Tied")
  function Tied:init (w) self.t1 = Scale(w); self.t2 = Scale(w) end
  function Tied:forward (x) return self.t2(self.t1(x)) end
  return Tied(p)
end

-- n callables Linear(8, 8) (opts passed on), from seed 1; fed {4, 8} tensors.
function H.linears (n, opts)
  gc.manual_seed(1)
  local mods = {}
  for c = 1, n do mods[c] = gc.nn.Linear(8, 8, opts) end
  return mods
end

-- One sample list per entry, each with its own {4, 8} tensor requiring grad.
function H.samples (n)
  local s = {}
  for i = 1, n do s[i] = {gc.ones({4, 8}, {requires_grad = true})} end
  return s
end

-- The parameters of every module of mods, in order.
function H.all_params (mods)
  local ps = {}
  for _, m in ipairs(mods) do
    for _, p in ipairs(m:parameters()) do ps[#ps + 1] = p end
  end
  return ps
end

-- ---------------------------------------------------------------------------
-- Schedules

-- Walk one schedule: fwd(entry, callable) for every forward pass,
-- bwd(entry, callable) for every backward pass, dw(entry, callable) for
-- every delayed wgrad, in the order make_graphed_callables warms up and
-- captures them (docs/semantics.md, "order"): without an order, forwards 1..n
-- then backwards n..1; with one, entry of (chunk k, microbatch b, layer l) =
-- prefix[k]*M + b*n[k] + l (+1), layers 0..n-1 forward and n-1..0 backward.
-- spec = {n = callables, order = ..., layers = {...}, training = bool (default
-- true)}; dw may be nil.
function H.walk (spec, fwd, bwd, dw)
  local training = spec.training ~= false
  if spec.order == nil then
    for i = 1, spec.n do fwd(i, i) end
    if training then for i = spec.n, 1, -1 do bwd(i, i) end end
    return
  end
  local layers = spec.layers
  local prefix, nf, nb, M = {[1] = 0}, {}, {}, 0
  for k = 1, #layers do
    prefix[k + 1] = prefix[k] + layers[k]
    nf[k], nb[k] = 0, 0
  end
  for _, v in ipairs(spec.order) do
    if v == 1 then M = M + 1 end
  end
  for _, v in ipairs(spec.order) do
    local k = math.floor(math.abs(v))
    local n = layers[k]
    if v > 0 then
      for l = 0, n - 1 do fwd(prefix[k] * M + nf[k] * n + l + 1, prefix[k] + l + 1) end
      nf[k] = nf[k] + 1
    elseif training and v == math.floor(v) then  -- eval: forwards only
      for l = n - 1, 0, -1 do bwd(prefix[k] * M + nb[k] * n + l + 1, prefix[k] + l + 1) end
      nb[k] = nb[k] + 1
    elseif training and dw then
      for l = n - 1, 0, -1 do dw(prefix[k] * M + (nb[k] - 1) * n + l + 1, prefix[k] + l + 1) end
    end
  end
end

-- ---------------------------------------------------------------------------
-- Whole programs

-- The program running the suite (the graphcap program, or lua5.4): the word
-- of the command line at the lowest index of 'arg'.
do
  local i = 0
  while arg[i - 1] ~= nil do i = i - 1 end
  H.program = arg[i]
end

-- s as one shell word.
function H.quote (s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- os.execute(line), whose output goes to the files `logs`; run again when it
-- failed because LeakSanitizer's own tracer crashed while it stopped the
-- threads of a process that started OpenMPI (under load, often with 4 ranks
-- on 2 cores: no finding about the job; tests/run.sh does the same for whole
-- suites): twice more, then once with leak detection off, so that the job's
-- own checks still decide (the single-process suites check leaks).
local function tracer_crashed (logs)
  for _, path in ipairs(logs) do
    local f = io.open(path, "rb")
    local s = f and f:read("a") or ""
    if f then f:close() end
    if s:find("LeakSanitizer has encountered a fatal error", 1, true) then return true end
  end
  return false
end
function H.execute (line, logs)
  local ok, how, code = os.execute(line)
  for try = 1, 3 do
    if ok or not tracer_crashed(logs) then break end
    io.stderr:write("# LeakSanitizer's tracer crashed in a job; running it again\n")
    if try == 3 then
      io.stderr:write("# (this time without leak detection)\n")
      line = 'ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" ' .. line
    end
    ok, how, code = os.execute(line)
  end
  return ok, how, code
end

-- The contents of the file at path, which is then removed.
function H.slurp (path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  os.remove(path)
  return s
end

-- ---------------------------------------------------------------------------
-- JSON

-- The value of the JSON text s, by the facade's strict reader
-- (graphcap.json); null becomes H.null. Raises "json: <what> at byte <n>".
local json = require "graphcap.json"
H.null = json.null
function H.json_decode (s)
  local ok, v = pcall(json.decode, s)
  if not ok then error("json: " .. v, 0) end
  return v
end

return H
