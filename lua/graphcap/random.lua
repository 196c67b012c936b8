-- graphcap.random: the generator's state (gc.get_rng_state,
-- gc.set_rng_state) and several generator states, as Megatron's
-- CudaRNGStatesTracker and TransformerEngine's graph-safe one:
--
--   local tracker = gc.random.RNGStatesTracker()
--   tracker:add("model-parallel-rng", 1234)
--   local y = tracker:fork("model-parallel-rng", function () return gc.F.dropout(x, 0.1) end)
--
-- Each tracked state is a generator of its own, a {seed, offset} in device
-- memory; fork makes it the one ops draw from while fn runs. Graphs captured
-- in a fork draw from it and advance it at each replay, as eager steps do,
-- and make_graphed_callables leaves every state as it found it.

local core = require "graphcap.core"
local util = require "graphcap.util"

local error, getmetatable, math, next, pairs, setmetatable, table, tostring, type =
      error, getmetatable, math, next, pairs, setmetatable, table, tostring, type
_ENV = nil

core._facade()

local raise, run = util.raise, util.run
local R = core._random

local random = {}

-- Megatron's name of the tracker's usual state.
local DEFAULT_NAME = "model-parallel-rng"

-- Every generator a tracker made, while it lives (weak keys): the states a
-- checkpoint saves and restores, with the default generator's.
local live = setmetatable({}, {__mode = "k"})

-- A state is read back and set by a copy from and to the host, which a
-- capture forbids: refused, naming the call, before anything is done.
local function not_capturing (op)
  if core.is_capturing() then
    raise("%s: not allowed while a capture is open (the generators' states are copied from and "
          .. "to the host); do it before or after the capture", op)
  end
end

-- The state {seed = n, offset = n} of generator g (nil: the one in use).
local function state_of (g, op)
  local seed, offset = R.get_state(g, op)
  return {seed = seed, offset = offset}
end

-- s checked to be a state table: its seed and offset.
local function check_state (where, what, s)
  if type(s) ~= "table" then
    raise("%s: %s must be a table {seed = n, offset = n}, got %s", where, what, type(s))
  end
  for _, k in pairs({"seed", "offset"}) do
    if math.type(s[k]) ~= "integer" then
      raise("%s: %s.%s must be an integer, got %s", where, what, k, math.type(s[k]) or type(s[k]))
    end
  end
  for k in pairs(s) do
    if k ~= "seed" and k ~= "offset" then
      raise("%s: %s has an unknown field '%s' (a state is {seed = n, offset = n})", where, what,
            tostring(k))
    end
  end
  return s.seed, s.offset
end

-- gc.get_rng_state() -> {seed, offset}: the state of the generator in use
-- (the default one, or the tracked state a fork made current), read back.
function random.get_rng_state ()
  not_capturing("get_rng_state")
  return state_of(nil, "get_rng_state")
end

-- gc.set_rng_state(s): set the generator in use to the state s.
function random.set_rng_state (s)
  local seed, offset = check_state("set_rng_state", "the state", s)
  not_capturing("set_rng_state")
  R.set_state(nil, seed, offset, "set_rng_state")
end

-- The generators whose states a checkpoint saves: the default one and each
-- a tracker made, in a fixed order (the default first).
function random._generators ()
  local gens = {R.default()}
  for g in pairs(live) do gens[#gens + 1] = g end
  return gens
end

local Tracker = {}
Tracker.__index = Tracker
Tracker.__name = "graphcap.RNGStatesTracker"

-- gc.random.RNGStatesTracker(): no states yet.
function random.RNGStatesTracker ()
  return setmetatable({states_ = {}, seeds_ = {}}, Tracker)
end
random.CudaRNGStatesTracker = random.RNGStatesTracker -- Megatron's and TE's name

local function check_self (self, what)
  if getmetatable(self) ~= Tracker then
    raise("RNGStatesTracker:%s: call it with ':' (tracker:%s(...)), got a %s for self", what,
          what, type(self))
  end
end

-- tracker:reset(): no states (graphs captured in a fork keep theirs).
function Tracker:reset ()
  check_self(self, "reset")
  self.states_, self.seeds_ = {}, {}
end

-- tracker:is_initialized(): whether a state was added.
function Tracker:is_initialized ()
  check_self(self, "is_initialized")
  return next(self.states_) ~= nil
end

-- tracker:add(name, seed): a new state {seed, 0} under name.
function Tracker:add (name, seed)
  check_self(self, "add")
  if type(name) ~= "string" then
    raise("RNGStatesTracker:add: name must be a string, got %s", type(name))
  end
  if math.type(seed) ~= "integer" then
    raise("RNGStatesTracker:add: seed must be an integer, got %s", math.type(seed) or type(seed))
  end
  if self.seeds_[seed] then raise("RNGStatesTracker:add: seed %d already exists", seed) end
  if self.states_[name] then
    raise("RNGStatesTracker:add: cuda rng state %s already exists", name)
  end
  not_capturing("RNGStatesTracker:add")
  local g = R.new(seed)
  live[g] = true
  self.states_[name], self.seeds_[seed] = g, true
end

-- tracker:get_states() -> {name = {seed, offset}}: each state, read back.
function Tracker:get_states ()
  check_self(self, "get_states")
  not_capturing("RNGStatesTracker:get_states")
  local out = {}
  for name, g in pairs(self.states_) do out[name] = state_of(g, "get_states") end
  return out
end

-- tracker:set_states(states): the tracker's states become `states` (a map
-- name -> {seed, offset}, as get_states gives): a state it tracks already is
-- set in place (graphs that draw from it draw from the new state), a new
-- name gets a generator of its own, and a name not in `states` is dropped.
function Tracker:set_states (states)
  check_self(self, "set_states")
  if type(states) ~= "table" then
    raise("RNGStatesTracker:set_states: states must be a table of name -> {seed, offset}, got %s",
          type(states))
  end
  local vals = {}
  for name, s in pairs(states) do
    if type(name) ~= "string" then
      raise("RNGStatesTracker:set_states: a state's name must be a string, got %s", type(name))
    end
    local seed, offset = check_state("RNGStatesTracker:set_states", "states." .. name, s)
    vals[name] = {seed, offset}
  end
  not_capturing("RNGStatesTracker:set_states")
  local new = {}
  for name, v in pairs(vals) do
    local g = self.states_[name]
    if g == nil then
      g = R.new(v[1])
      live[g] = true
    end
    R.set_state(g, v[1], v[2], "RNGStatesTracker:set_states")
    new[name] = g
  end
  self.states_ = new
end

-- tracker:fork([name = "model-parallel-rng",] fn, ...) -> fn(...)'s
-- results, drawn from the state `name`; the generator in use before comes
-- back, also when fn raises.
function Tracker:fork (name, fn, ...)
  check_self(self, "fork")
  if type(name) == "function" then return self:fork(DEFAULT_NAME, name, fn, ...) end
  if type(name) ~= "string" then
    raise("RNGStatesTracker:fork: name must be a string, got %s", type(name))
  end
  if type(fn) ~= "function" then
    raise("RNGStatesTracker:fork: fn must be a function, got %s", type(fn))
  end
  local g = self.states_[name]
  if g == nil then raise("RNGStatesTracker:fork: cuda rng state %s is not added", name) end
  local prev = R.current()
  R.use(g)
  local r = run(fn, ...)
  R.use(prev)
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

util.entries(Tracker)

return random
