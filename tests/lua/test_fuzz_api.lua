-- test_fuzz_api.lua: random API calls with random arguments (wrong types,
-- shapes, closed objects, options, orders, hook tables, callbacks that raise
-- or call back in): every call succeeds or raises an error with a non-empty
-- message; nothing crashes; afterwards the engine holds nothing the fuzzer
-- dropped. Seeded and bounded (tests/lua/fuzz.lua): default 4,000 calls.
--   GRAPHCAP_FUZZ_SEED=7 GRAPHCAP_FUZZ_ITERS=100000 LUA_PATH='tests/lua/?.lua;;'
--     build/graphcap tests/lua/test_fuzz_api.lua

local lu = require "luaunit"
local gc = require "graphcap"
local F = require "fuzz"
local core = require "graphcap.core"

local r -- the generator of the run
local objs -- objects made so far (a bounded pool; old ones are dropped)
local graphed -- results of make_graphed_callables, 8 slots
local MAXOBJ = 48
local scratch = os.tmpname() -- the path of every debug_dump (removed at the end)
local depth = 0 -- callbacks that call back in are bounded

local function is_graph (v)
  return getmetatable(v) == core._metatables.Graph
end

local function keep (v)
  if type(v) == "userdata" or (type(v) == "table" and getmetatable(v) == nil) then
    if #objs < MAXOBJ then
      objs[#objs + 1] = v
    else
      local i = r(MAXOBJ)
      objs[i] = v
    end
  end
end

local option_keys = {
  "dtype", "requires_grad", "pool", "stream", "name", "num_warmup_iters", "order",
  "num_layers_per_chunk", "reuse_graph_input_output_buffers", "capture_time_hooks",
  "pre_warmup_hook", "post_warmup_hook", "sample_kwargs", "allow_unused_input",
  "retain_graph_in_backward", "clone_param_grads_on_return", "lr", "momentum",
  "weight_decay", "betas", "eps", "bias", "delay_wgrad", "fuse_wgrad_accumulation",
  "set_to_none", "retain_graph", "bogus"}
local hook_groups = {"forward_pre_hooks", "forward_hooks", "backward_pre_hooks",
                     "backward_hooks", "nonsense"}
local orders = {{1, -1}, {1, 2, -2, -1}, {1, 1, -1, -1}, {1, -1.5, -1}, {2, -2}, {1},
                {1, 2, -1, -2}, {0}, {1.5}, {}}

local value, call_random

-- A random argument.
function value ()
  local k = r(16)
  if k == 1 then return nil
  elseif k == 2 then return r(2) == 1
  elseif k == 3 then return F.pick(r, {-1, 0, 1, 2, 3, 4, 8, 2^31, -2^63})
  elseif k == 4 then return F.pick(r, {0.5, -1.5, 0 / 0, 1 / 0, 1e300, 1e-30})
  elseif k == 5 then return F.pick(r, {"f32", "bf16", "", "x", "cuda", "f16"})
  elseif k == 6 then return F.pick(r, {{2, 3}, {3, 2}, {6}, {}, {0}, {2, 3, 4}, {1, 1, 1, 1, 1},
                                       {-1, 2}, {2.5}, {"a"}})
  elseif k == 7 then return {{1, 2, 3}, {4, 5, 6}}
  elseif k == 8 then -- a callback: returns its argument, raises, or calls in
    local f = r(3)
    if f == 1 then return function (...) return ... end
    elseif f == 2 then return function () error("raised by a fuzzed callback") end
    else return function (...) if depth < 2 then call_random() end return ... end end
  elseif k == 9 then -- options
    local o = {}
    for _ = 1, r(3) do o[F.pick(r, option_keys)] = value() end
    if r(3) == 1 then o.order = F.pick(r, orders) end
    return o
  elseif k == 10 then -- capture-time hook tables
    local t = {}
    for c = 1, r(2) do
      t[c] = r(4) == 1 and false or {[F.pick(r, hook_groups)] = {value()}}
    end
    return t
  elseif k == 11 then -- a list of objects, or of lists (sample args)
    local t = {}
    for i = 1, r(3) do t[i] = r(2) == 1 and value() or {value()} end
    return t
  end
  return #objs > 0 and F.pick(r, objs) or nil
end

local function args (n)
  local a = {n = n}
  for i = 1, n do a[i] = value() end
  return a
end

-- The functions of the API, as {name, function}.
local api = {}
local function add_lib (prefix, lib, skip)
  for k, v in pairs(lib) do
    if type(v) == "function" and not (skip and skip[k]) then api[#api + 1] = {prefix .. k, v} end
  end
end

add_lib("gc.", gc, {no_grad = true, enable_grad = true, with_stream = true})
add_lib("gc.F.", gc.F)
add_lib("gc.nn.", gc.nn)
add_lib("gc.optim.", gc.optim)
-- these run their function argument: fuzzed as well
api[#api + 1] = {"gc.no_grad", function (f) return gc.no_grad(type(f) == "function" and f or value) end}
table.sort(api, function (a, b) return a[1] < b[1] end)

-- gc.save writes where it is told, as a dump does: a path (a string, or a
-- number Lua turns into one) goes to the scratch file, not into the working
-- directory
for _, e in ipairs(api) do
  if e[1] == "gc.save" then
    local save = e[2]
    e[2] = function (path, ...)
      if type(path) == "string" or type(path) == "number" then path = scratch end
      return save(path, ...)
    end
  end
end

-- The factories also take their sizes as arguments (gc.zeros(2, 3)): fuzzed
-- sizes such as 2^31 would make real tensors of gigabytes, which a machine
-- may or may not hold (under ASan the allocator aborts). Such a call is not
-- made; its error is counted as any other.
local MAXFUZZ = 1 << 24
local factories = {["gc.empty"] = true, ["gc.zeros"] = true, ["gc.ones"] = true,
                   ["gc.rand"] = true, ["gc.randn"] = true}
for _, e in ipairs(api) do
  if factories[e[1]] then
    local f = e[2]
    e[2] = function (...)
      local n = 1
      for i = 1, select("#", ...) do
        local v = select(i, ...)
        if type(v) ~= "number" then break end
        if v >= 0 and v == math.floor(v) then n = n * v end
      end
      if n > MAXFUZZ then error("fuzz: a tensor of " .. n .. " elements is not made") end
      return f(...)
    end
  end
end

-- The methods of an object, by its metatable.
local function methods_of (v)
  local mt = getmetatable(v)
  if type(mt) ~= "table" then return nil end
  local m = mt.__methods or mt.__index
  if type(m) ~= "table" then return nil end
  local names = {}
  for k, f in pairs(m) do if type(f) == "function" then names[#names + 1] = k end end
  table.sort(names)
  return names, m
end

-- A kept object of class cls (a metatable key of core._metatables), or a
-- random value.
local function obj (cls)
  local mt = core._metatables[cls]
  local start = #objs > 0 and r(#objs) or 1
  for i = 0, #objs - 1 do
    local o = objs[(start + i - 1) % #objs + 1]
    if getmetatable(o) == mt then return o end
  end
  return value()
end

local small = {{2, 4}, {4, 4}, {2, 2}, {4}, {2, 3}, {3, 4}}
local function dims () return F.pick(r, {2, 3, 4}) end

-- Well-formed calls of the paths worth reaching (one argument of which may
-- then be replaced by a random value): each returns name, function, args.
local recipes = {
  function () return "gc.randn", gc.randn, {F.pick(r, small), {requires_grad = r(2) == 1}} end,
  function () return "gc.nn.Linear", gc.nn.Linear, {dims(), dims(), {bias = r(3) > 1,
    delay_wgrad = r(4) == 1, fuse_wgrad_accumulation = r(6) == 1}} end,
  function () return "gc.nn.<layer>", F.pick(r, {gc.nn.ReLU, gc.nn.GELU, gc.nn.LayerNorm,
    gc.nn.Dropout}), {F.pick(r, {2, 4, 0.5, 0})} end,
  function () return "gc.nn.Sequential", gc.nn.Sequential, {obj("Module"), obj("Module")} end,
  function () return "module call", function (m, x) return m(x) end, {obj("Module"), obj("Tensor")} end,
  function () return "binary op", F.pick(r, {gc.matmul, gc.F.mse_loss, gc.F.linear,
    function (a, b) return a + b end, function (a, b) return a * b end}),
    {obj("Tensor"), obj("Tensor")} end,
  function () return "sum():backward()", function (t, o) return t:sum():backward(o) end,
    {obj("Tensor"), r(3) == 1 and {retain_graph = true} or nil} end,
  function () return "grad", function (t) return t.grad end, {obj("Tensor")} end,
  function () return "optimizer", F.pick(r, {gc.optim.SGD, gc.optim.Adam}),
    {obj("Module") and (obj("Module").parameters and obj("Module"):parameters()) or {}, {lr = 0.1}} end,
  function () return "optimizer step", function (o) o:step(); o:zero_grad() end, {obj("Optimizer")} end,
  function ()
    return "Graph:capture", function (g, p)
      return g:capture(function () for _ = 1, r(3) do call_random() end end, {pool = p})
    end, {obj("Graph"), r(2) == 1 and obj("Pool") or nil}
  end,
  function () return "Graph:replay", function (g) return g:replay() end, {obj("Graph")} end,
  function ()
    local mods, samples = {}, {}
    for c = 1, r(2) do -- a kept module, or a Linear that fits its sample
      local n = dims()
      mods[c] = r(2) == 1 and obj("Module") or gc.nn.Linear(n, dims())
      samples[c] = {gc.randn(r(3) == 1 and F.pick(r, small) or {2, n},
                             {requires_grad = r(4) > 1})}
    end
    local o = {num_warmup_iters = r(3) - 1}
    if r(2) == 1 then o.order = F.pick(r, orders) end
    if r(3) == 1 then o.capture_time_hooks = value() end
    if r(4) == 1 then o.reuse_graph_input_output_buffers = true end
    return "make_graphed_callables", function (...)
      local G = gc.make_graphed_callables(...)
      graphed[r(8)] = {G = G}
      return G
    end, {mods, samples, o}
  end,
  function () -- a graphed call on a kept tensor or a fresh activation, maybe then backward
    local g, i = graphed[r(8)] or {G = value()}, r(2)
    local x = obj("Tensor")
    if r(2) == 1 and type(g.G) == "table" and type(g.G[i]) == "table" then
      x = gc.randn({2, dims()}, {requires_grad = r(2) == 1}) * 2
    end
    return "graphed call", function ()
      local y = g.G[i](x)
      if r(2) == 1 then y:sum():backward() end
      return y
    end, {}
  end,
  function () -- cross entropy over class ids, some of them not ids
    local ids = {}
    for j = 1, 2 do ids[j] = r(4) > 1 and r(4) - 1 or F.pick(r, {-1, 4, 1e9, 1.5, 0 / 0}) end
    return "cross_entropy", gc.F.cross_entropy, {gc.randn({2, 4}, {requires_grad = true}),
                                                 gc.tensor(ids)}
  end,
}

local calls, errors = 0, 0
local log = {} -- the last calls, for the failure message

-- One random call: a function of the API, a method of a kept object, an
-- operator, or an ending of any open capture.
function call_random ()
  depth = depth + 1
  local what, f, a
  local k = r(14)
  if k > 10 then
    local i, mutate = r(#recipes), r(3) == 1
    what, a = "recipe " .. i, {n = 0}
    f = function () -- building the arguments may raise too (a closed object's method)
      local name, fn, list = recipes[i]()
      local b = table.pack(table.unpack(list, 1, 4))
      b.n = #list > 0 and #list or 0
      for j = b.n + 1, 4 do if b[j] ~= nil then b.n = j end end
      if mutate and b.n > 0 then b[r(b.n)] = value() end
      log[#log % 20 + 1] = name
      return fn(table.unpack(b, 1, b.n))
    end
  elseif k <= 4 or #objs == 0 then
    local e = F.pick(r, api)
    what, f, a = e[1], e[2], args(r(5) - 1)
  elseif k <= 8 then
    local o = F.pick(r, objs)
    local names, m = methods_of(o)
    if names and #names > 0 then
      local name = F.pick(r, names)
      what, f, a = type(o) .. ":" .. name, m[name], args(r(4) - 1)
      table.insert(a, 1, o)
      a.n = a.n + 1
      -- a dump writes where it is told: a path (a string, or a number Lua
      -- turns into one) goes to the scratch file, not into the working
      -- directory
      if name == "debug_dump" and (type(a[2]) == "string" or type(a[2]) == "number") then
        a[2] = scratch
      end
    else
      what, f, a = "call of a " .. type(o), function (x, ...) return x(...) end, args(r(3))
      a[1], a.n = o, math.max(a.n, 1)
    end
  elseif k == 9 then
    local op = F.pick(r, {"+", "-", "*", "neg", "len", "index"})
    what = "operator " .. op
    f = function (x, y)
      if op == "+" then return x + y elseif op == "-" then return x - y
      elseif op == "*" then return x * y elseif op == "neg" then return -x
      elseif op == "len" then return #x else return x[y] end
    end
    a = args(2)
  else -- end captures left open (otherwise most later calls only fail)
    what = "end open captures"
    f = function ()
      for _, o in ipairs(objs) do
        if is_graph(o) then pcall(o.capture_end, o) end
      end
    end
    a = {n = 0}
  end
  log[#log % 20 + 1] = what
  calls = calls + 1
  local res = table.pack(pcall(f, table.unpack(a, 1, a.n)))
  depth = depth - 1
  if res[1] then
    for i = 2, res.n do keep(res[i]) end
  else
    errors = errors + 1
    local err = res[2]
    if type(err) ~= "string" or #err == 0 or err:match("^%s*$") then
      error(string.format("seed %d, call %d (%s): an error without a message: %s", F.seed,
                          calls, what, tostring(err)), 0)
    end
  end
end

TestFuzzApi = {}

function TestFuzzApi:test_random_calls ()
  r, objs, graphed, calls, errors, log = F.rng(1), {}, {}, 0, 0, {}
  local n = F.budget(4000)
  F.announce(n .. " calls")
  local ok, err = pcall(function () for _ = 1, n do call_random() end end)
  -- leave the engine usable: no capture, grad mode on, the default stream
  for _, o in ipairs(objs) do
    if is_graph(o) then pcall(o.capture_end, o) end
  end
  lu.assertFalse(gc.is_capturing(), "seed " .. F.seed .. ": a capture is stuck open")
  objs, graphed = nil, nil
  gc.set_grad_enabled(true)
  gc.set_current_stream(gc.default_stream())
  for _, suffix in ipairs({"", ".fwd.dot", ".bwd.dot", ".bwd_dw.dot"}) do os.remove(scratch .. suffix) end
  if not ok then
    lu.fail(string.format("seed %d: %s (last calls: %s)", F.seed, tostring(err),
                          table.concat(log, ", ")))
  end
  print(string.format("# seed %d: %d calls, %d raised an error", F.seed, calls, errors))
  lu.assertTrue(errors > 0 and errors < calls)
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
