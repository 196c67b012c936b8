-- graphcap.graphed: gc.make_graphed_callables, TransformerEngine's, with
-- capture_time_hooks. This file checks and normalizes the arguments (the
-- Lua-shaped ones: hook tables, kwargs, functions as callables) and builds
-- the returned objects; the core does the warmup, captures and replays.

local core = require "graphcap.core"
local util = require "graphcap.util"
core._facade()
local nn = require "graphcap.nn"
local fp8 = require "graphcap.fp8"

local debug, getmetatable, ipairs, math, pairs, select, setmetatable, string, table,
      tostring, type = debug, getmetatable, ipairs, math, pairs, select, setmetatable, string,
      table, tostring, type
_ENV = nil

local Tensor = core._metatables.Tensor
local is_module = nn.is_module
local W = "make_graphed_callables"

-- Every argument error names the user's line, however deep in the facade
-- it is found.
local function fail (fmt, ...)
  util.raise(W .. ": " .. fmt, ...)
end

local function is_tensor (v)
  return type(v) == "userdata" and getmetatable(v) == Tensor
end

local known_options = {
  num_warmup_iters = "integer", allow_unused_input = "boolean",
  sample_kwargs = "table", order = "table", num_layers_per_chunk = true,
  pool = "userdata", retain_graph_in_backward = "boolean",
  reuse_graph_input_output_buffers = "boolean",
  clone_param_grads_on_return = "boolean", pre_warmup_hook = "function",
  post_warmup_hook = "function", capture_time_hooks = "table", progress = true,
  fp8_enabled = true, fp8_recipe = true, fp8_group = true, fp8_weight_caching = "boolean",
  fp8_calibrating = "boolean",
}

-- TransformerEngine's spellings of the options it marks private.
local te_aliases = {
  _order = "order", _num_layers_per_chunk = "num_layers_per_chunk",
  _reuse_graph_input_output_buffers = "reuse_graph_input_output_buffers",
  -- its newer names of the FP8 options
  enabled = "fp8_enabled", recipe = "fp8_recipe", amax_reduction_group = "fp8_group",
  cache_quantized_params = "fp8_weight_caching", calibrating = "fp8_calibrating",
}

local groups = core.hook_groups -- the engine's names, in call order
local is_group = {}
for _, g in ipairs(groups) do is_group[g] = true end

-- A group: a table of hooks keyed by id, as TransformerEngine's {hook_id:
-- fn} dicts. Ids are integers (a sequence is ids 1..n; ids from 0, as
-- PyTorch's handles count, work too) or strings. A Lua table keeps no
-- insertion order, so the order is the ids': integer ids ascending, then
-- string ids in sorted (byte) order.
local function group_list (c, name, grp)
  if type(grp) ~= "table" then
    fail("capture_time_hooks[%d].%s must be a table of functions, got %s", c,
         name, type(grp))
  end
  local ints, strs = {}, {}
  for k in pairs(grp) do
    if math.type(k) == "integer" then ints[#ints + 1] = k
    elseif type(k) == "string" then strs[#strs + 1] = k
    else fail("capture_time_hooks[%d].%s has an id %s that is neither an "
              .. "integer nor a string", c, name, tostring(k)) end
  end
  table.sort(ints)
  table.sort(strs)
  local list = {}
  for _, ids in ipairs({ints, strs}) do
    for _, k in ipairs(ids) do
      local f = grp[k]
      if type(f) ~= "function" then
        fail("capture_time_hooks[%d].%s[%s] must be a function, got %s", c,
             name, type(k) == "string" and string.format("%q", k) or k, type(f))
      end
      list[#list + 1] = f
    end
  end
  return list
end

-- The type of v for messages: the __name of a userdata's metatable.
local function typename (v)
  local mt = type(v) == "userdata" and getmetatable(v)
  local name = type(mt) == "table" and mt.__name
  return type(name) == "string" and name or type(v)
end

-- Raise "<what> must not return a value (<detail>)" if any of ... is not
-- nil; detail(f, returned) says where hook f is defined.
local function returns_nothing (f, detail, ...)
  for i = 1, select("#", ...) do
    local v = select(i, ...)
    if v ~= nil then
      local info = debug.getinfo(f, "S")
      util.raise("%s", detail(info.short_src .. ":" .. info.linedefined, typename(v)))
    end
  end
end

-- Hook f of group g of callable c (the hook #k), as the core calls it: with
-- the callable, returning nothing.
local function capture_hook (f, g, c, k, callable)
  local function detail (at, got)
    return string.format("capture_time_hooks %s must not return a value (callable %d, hook "
                         .. "#%d defined at %s, returned %s)", g, c, k, at, got)
  end
  return function () returns_nothing(f, detail, f(callable)) end
end

-- pre_warmup_hook or post_warmup_hook f, as the core calls it.
local function warmup_hook (f, name)
  local function detail (at, got)
    return string.format("%s must not return a value (it returned %s; defined at %s)", name,
                          got, at)
  end
  return function () returns_nothing(f, detail, f()) end
end

-- One entry per callable: {callable = original, <group> = {f, ...}, ...}.
local function normalize_hooks (hooks, originals)
  if hooks == nil then return nil end
  local n = #hooks
  for k in pairs(hooks) do
    if math.type(k) ~= "integer" or k < 1 or k > n then
      fail("capture_time_hooks must be a sequence with one entry per "
           .. "callable (a table or false), got a key %s", tostring(k))
    end
  end
  if n ~= #originals then
    fail("capture_time_hooks has %d entries, but there are %d callables",
         n, #originals)
  end
  local out = {}
  for c = 1, n do
    local h, e = hooks[c], {callable = originals[c]}
    if h ~= false then
      if type(h) ~= "table" then
        fail("capture_time_hooks[%d] must be a table or false, got %s", c,
             type(h))
      end
      for k in pairs(h) do
        if not is_group[k] then
          fail("capture_time_hooks[%d] has an unknown group '%s' (known: %s)",
               c, tostring(k), table.concat(groups, ", "))
        end
      end
      for _, g in ipairs(groups) do
        if h[g] ~= nil then e[g] = group_list(c, g, h[g]) end
      end
    end
    out[c] = e
  end
  return out
end

-- A Lua function as a callable: a module with no parameters.
local Function = nn.Module("function")
function Function:init (fn) self.fn = fn end
function Function:forward (...) return self.fn(...) end

-- kwargs of one entry: sorted keys, their tensors appended to args.
local function kwargs_of (i, kw)
  if kw == nil or kw == false then return nil end
  if type(kw) ~= "table" or is_tensor(kw) then
    fail("sample_kwargs[%d] must be a map of name -> tensor or false", i)
  end
  local keys = {}
  for k, v in pairs(kw) do
    if type(k) ~= "string" then
      fail("sample_kwargs[%d] has a non-string key %s", i, tostring(k))
    end
    if not is_tensor(v) then
      fail("sample_kwargs[%d].%s must be a tensor, got %s", i, k, type(v))
    end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  return keys
end

-- sample_kwargs of several callables: a sequence with one map (or false)
-- per callable, or per entry with an order: n of them, the `what` (a plural
-- noun) that the map of one `each` goes with (TransformerEngine's ValueError
-- when the lengths differ).
local function check_kwargs_count (kwargs, n, what, each)
  local last = 0
  for k in pairs(kwargs) do
    if math.type(k) ~= "integer" or k < 1 then
      fail("sample_kwargs must be a sequence with one map (or false) per %s, got a key %s",
           each, tostring(k))
    end
    if k > last then last = k end
  end
  if last ~= n then
    fail("sample_kwargs has %d %s, but there are %d %s (one map or false per %s)", last,
         last == 1 and "entry" or "entries", n, what, each)
  end
end

-- The graphs of each module graphed in place (without an order), by mode:
-- {[training] = {G = graphed, i = entry, keys = its kwargs keys or nil}}. A
-- module graphed again in the other mode keeps both, and each call replays
-- the graph of its mode, as TransformerEngine's wrapper of a wrapper does; in
-- the same mode the new graph replaces the old. Weak keys: a module's graphs
-- go with it.
local in_place = setmetatable({}, {__mode = "k"})

local function key_list (keys)
  return "{" .. table.concat(keys or {}, ", ") .. "}"
end

-- Both modes' graphs of a module take its calls' kwargs maps one way: the
-- sample keys of callable c (module m) must be those of its graph in the
-- other mode.
local function check_other_mode (c, m, keys)
  local other = in_place[m] and in_place[m][not m.training]
  if other and key_list(other.keys) ~= key_list(keys) then
    fail("sample_kwargs of callable %d has the keys %s, but %s is graphed in %s mode with %s; "
         .. "a module graphed in both modes takes the same kwargs in both", c, key_list(keys),
         m:type(), m.training and "eval" or "training", key_list(other.keys))
  end
end

-- Module m now replays entry i of G in its mode; its methods act on the
-- graph of its current mode (or its one graph), reset() frees every graph.
local function graph_in_place (m, G, i, keys, dw)
  local modes = in_place[m] or {}
  in_place[m] = modes
  modes[m.training] = {G = G, i = i, keys = keys, dw = dw}
  local function mine ()
    local g = modes[m.training] or modes[not m.training]
    return g.G, g.i
  end
  m.graphed_callables = G
  m.backward_dw = util.entry(function ()
    return (modes[m.training] or modes[not m.training]).dw()
  end)
  m.reset = util.entry(function ()
    for _, mode in ipairs({true, false}) do
      if modes[mode] then modes[mode].G:reset(modes[mode].i) end
    end
  end)
  m.stats = util.entry(function () local g, k = mine(); return g:stats(k) end)
  m.debug_dump = util.entry(function (_, prefix)
    local g, k = mine()
    return g:debug_dump(k, prefix)
  end)
end

local Entry = {}
Entry.__index = Entry
Entry.__name = "graphcap.GraphedEntry"

function Entry:__call (...)  -- a kwargs map, last, is flattened by the binding
  return self.G:call(self.i, ...)
end
function Entry:backward_dw () return self.dw() end
function Entry:reset () return self.G:reset(self.i) end
function Entry:stats () return self.G:stats(self.i) end
function Entry:debug_dump (prefix) return self.G:debug_dump(self.i, prefix) end
function Entry:__tostring ()
  return string.format("graphcap.GraphedEntry(%d)", self.i)
end
util.entries(Entry)

-- The replay of entry i's delayed-wgrad graph, inside what its module m
-- runs around it, when m has that (m:_backward_dw_around(run): gc.ddp
-- averages the grads the replay adds, as TransformerEngine runs its wgrad
-- reduce hooks after the replay).
local function backward_dw_of (G, i, m)
  local function run () return G:backward_dw(i) end
  if m._backward_dw_around == nil then return run end
  return function () return m:_backward_dw_around(run) end
end

-- The callable (index) of each of n entries: entry i is callable i without
-- an order; with one, the entries go chunk by chunk (nlpc[c] callables
-- each, by default n / K / M), then microbatch (M of them), then layer.
local function entry_callables (n, order, nlpc)
  local out = {}
  if order == nil then
    for i = 1, n do out[i] = i end
    return out
  end
  local K, M = 0, 0
  for _, v in ipairs(order) do
    if v > K then K = math.floor(v) end
    if v == 1 then M = M + 1 end
  end
  local base = 0
  for c = 1, K do
    local L = nlpc and nlpc[c] or n // K // M
    for _ = 1, M do
      for l = 1, L do out[#out + 1] = base + l end
    end
    base = base + L
  end
  return out
end

-- The FP8 options as the core takes them: fp8_enabled one boolean per
-- callable (n), fp8_recipe as numbers, fp8_group checked; all nil when no
-- callable runs in FP8 (as TransformerEngine drops the recipe then).
local function fp8_options (opts, n, norm)
  local en = opts.fp8_enabled
  if opts.fp8_calibrating then fail("fp8_calibrating is not supported") end
  norm.fp8_calibrating = nil
  if en == nil then en = false end
  if type(en) == "boolean" then
    local t = {}
    for c = 1, n do t[c] = en end
    en = t
  elseif type(en) ~= "table" then
    fail("fp8_enabled must be a bool or a sequence of bools, but got %s", type(en))
  elseif #en ~= n then
    fail("fp8_enabled length (%d) must match modules length (%d)", #en, n)
  end
  local any = false
  for c = 1, n do
    if type(en[c]) ~= "boolean" then
      fail("fp8_enabled[%d] must be a boolean, got %s", c, type(en[c]))
    end
    any = any or en[c]
  end
  local r = fp8.check_recipe(W, "option fp8_recipe", opts.fp8_recipe)
  local g = opts.fp8_group
  if g ~= nil and getmetatable(g) ~= core._metatables.DistGroup then
    fail("option fp8_group must be a gc.dist group, got %s", type(g))
  end
  if not any then
    norm.fp8_enabled, norm.fp8_recipe, norm.fp8_group = nil, nil, nil
    return
  end
  norm.fp8_enabled = en
  norm.fp8_recipe = {r.kind == "DelayedScaling" and 0 or 1, r.fp8_format == "HYBRID" and 0 or 1,
                     r.margin or 0, r.amax_history_len or 1024,
                     r.amax_compute_algo == "most_recent" and 1 or 0}
end

local INT_MAX = 0x7fffffff

-- An integer of C's int range, or nil: option/entry 'what' checked.
local function c_int (what, v)
  if math.type(v) ~= "integer" or v < -INT_MAX or v > INT_MAX then
    fail("%s must be an integer of at most %d in size, got %s", what, INT_MAX, tostring(v))
  end
  return v
end

local function make_graphed_callables (callables, sample_args, opts)
  opts = util.options(W, util.aliases(W, opts, te_aliases), known_options)
  for k, kind in pairs(known_options) do
    local v = opts[k]
    if v ~= nil and kind ~= true and not (kind == "integer" and math.type(v) == "integer")
       and type(v) ~= kind then
      fail("option %s must be %s %s, got %s", k, kind == "integer" and "an" or "a", kind,
           math.type(v) or type(v))
    end
  end
  if opts.num_warmup_iters ~= nil then c_int("num_warmup_iters", opts.num_warmup_iters) end
  if opts.progress ~= nil and type(opts.progress) ~= "function"
     and type(opts.progress) ~= "boolean" then
    fail("option progress must be a function or a boolean, got %s", type(opts.progress))
  end
  for p, v in ipairs(opts.order or {}) do
    if type(v) ~= "number" then fail("order[%d] must be a number, got %s", p, type(v)) end
  end
  local single = type(callables) == "function" or is_module(callables)
  local kwargs = opts.sample_kwargs
  if single then
    callables, sample_args = {callables}, {sample_args}
    if kwargs ~= nil then kwargs = {kwargs} end
  end
  if type(callables) ~= "table" or #callables == 0 then
    fail("callables must be a module, a function or a non-empty sequence of them")
  end
  if type(sample_args) ~= "table" then
    fail("sample_args must be a sequence of tensors (one callable) or of such "
         .. "sequences, got %s", type(sample_args))
  end
  local mods, originals = {}, {}
  for c, v in ipairs(callables) do
    originals[c] = v
    if is_module(v) then mods[c] = v
    elseif type(v) == "function" then mods[c] = Function(v)
    else fail("callable #%d is a %s; expected a module or a function", c, type(v)) end
  end
  if #mods ~= #callables then fail("callables must be a sequence (no holes)") end
  -- a function has no training flag: it takes the modules' mode, and no side
  -- in the check that they share one
  local mode
  for c = 1, #mods do
    if mode == nil and mods[c] == originals[c] then mode = mods[c].training end
  end
  for c = 1, #mods do
    if mods[c] ~= originals[c] and mode ~= nil then mods[c]:train(mode) end
  end
  if kwargs ~= nil and not single then
    if opts.order then check_kwargs_count(kwargs, #sample_args, "sample_args entries", "entry")
    else check_kwargs_count(kwargs, #mods, "callables", "callable") end
  end
  local args, keys = {}, {}
  for i = 1, #sample_args do
    local a = sample_args[i]
    if type(a) ~= "table" or is_tensor(a) then
      fail("sample_args[%d] must be a sequence of tensors, got %s", i,
           is_tensor(a) and "a tensor" or type(a))
    end
    local flat = {}
    for k = 1, #a do
      if not is_tensor(a[k]) then
        fail("sample_args[%d][%d] must be a tensor, got %s (sample_args hold "
             .. "only tensors)", i, k, type(a[k]))
      end
      flat[k] = a[k]
    end
    keys[i] = kwargs_of(i, kwargs and kwargs[i])
    if keys[i] then
      for _, k in ipairs(keys[i]) do flat[#flat + 1] = kwargs[i][k] end
    end
    args[i] = flat
  end
  local nlpc = opts.num_layers_per_chunk
  if math.type(nlpc) == "integer" and opts.order then
    local K = 0
    for _, v in ipairs(opts.order) do if v > K then K = math.floor(v) end end
    local t = {}
    for m = 1, K do t[m] = nlpc end
    nlpc = t
  elseif math.type(nlpc) == "integer" then
    fail("num_layers_per_chunk needs order")
  elseif nlpc ~= nil and type(nlpc) ~= "table" then
    fail("num_layers_per_chunk must be an integer or a sequence, got %s", type(nlpc))
  end
  for m, v in ipairs(nlpc or {}) do c_int("num_layers_per_chunk[" .. m .. "]", v) end
  -- the core's options: the Lua functions it may run in one flat sequence,
  -- where the options name them by index
  local norm, fns = {}, {}
  for k, v in pairs(opts) do norm[k] = v end
  norm.num_layers_per_chunk, norm.hooks, norm.sample_kwargs = nlpc, fns, nil
  fp8_options(opts, #mods, norm)
  local hooks = normalize_hooks(opts.capture_time_hooks, originals)
  if hooks then
    local counts = {}
    for c, e in ipairs(hooks) do
      counts[c] = {}
      for gi, g in ipairs(groups) do
        counts[c][gi] = #(e[g] or {})
        for k, f in ipairs(e[g] or {}) do fns[#fns + 1] = capture_hook(f, g, c, k, e.callable) end
      end
    end
    norm.capture_time_hooks = counts
  end
  for _, name in ipairs({"pre_warmup_hook", "post_warmup_hook"}) do
    if opts[name] then
      fns[#fns + 1] = warmup_hook(opts[name], name)
      norm[name] = #fns
    end
  end
  if type(opts.progress) == "function" then
    fns[#fns + 1] = opts.progress
    norm.progress = #fns
  end
  -- a callable graphed with kwargs gets them back as a map when the core
  -- calls it (warmup, capture), and flattens its map when it is called
  local kw = {}  -- the kwargs keys of each callable
  if opts.order == nil then
    for i = 1, #mods do kw[i] = keys[i] end
  else  -- with an order every entry of a callable shares its keys
    local k1 = table.concat(keys[1] or {}, "\0")
    for i = 2, #args do
      if table.concat(keys[i] or {}, "\0") ~= k1 then
        fail("with an order, sample_kwargs must have the same keys for every entry "
             .. "(entry 1 and entry %d differ)", i)
      end
    end
    for c = 1, #mods do kw[c] = keys[1] end
  end
  norm.kwargs = {}
  for c = 1, #mods do
    norm.kwargs[c] = kw[c] or false
    if opts.order == nil and mods[c] == originals[c] then check_other_mode(c, mods[c], kw[c]) end
  end
  local G = core.make_graphed_callables(mods, args, norm)
  local out, of = {}, entry_callables(#G, opts.order, nlpc)
  for i = 1, #G do
    local m = opts.order == nil and mods[i] == originals[i] and mods[i] or nil
    local dw = backward_dw_of(G, i, mods[of[i]])
    if m then   -- the module itself now replays; keep G with it
      graph_in_place(m, G, i, keys[i], dw)
      out[i] = m
    else
      -- keeps the callables' Lua values (their kwargs keys)
      out[i] = setmetatable({G = G, i = i, mods = mods, dw = dw}, Entry)
    end
  end
  if single then return out[1] end
  return out
end

return make_graphed_callables
