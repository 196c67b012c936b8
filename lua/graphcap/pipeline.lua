-- graphcap.pipeline: pipeline-parallel schedules (require "graphcap".pipeline).
-- A schedule is one stage's `order` for make_graphed_callables, numbered as
-- Megatron-LM numbers it (convert_schedule_table_to_order) and as
-- TransformerEngine reads it: +k is the forward of the next microbatch of
-- chunk k, -k the backward of chunk k's oldest microbatch whose backward has
-- not run, -(k + 0.5) (delay_wgrad) the delayed weight grad of the backward
-- just run. Chunks are the stage's virtual pipeline stages: chunk k of stage
-- r is virtual stage (k - 1) * stages + r of the whole model.
--
--   1F1B: warmup = min(stages - stage - 1, microbatches) forwards, then
--   one forward and one backward in turn, then the warmup's backwards.
--   Interleaved 1F1B: the microbatches go in groups of group_size (default
--   stages); the forwards run each group through chunk 1, then chunk 2, ...;
--   warmup = 2 * (stages - stage - 1) + (chunks - 1) * group_size forwards
--   (at most all), then forward and backward in turn, backwards visiting the
--   chunks last to first.

local core = require "graphcap.core"
local util = require "graphcap.util"
core._facade()

local ipairs, math, require, table, tostring, type =
      ipairs, math, require, table, tostring, type
_ENV = nil

local raise, options = util.raise, util.options

local pipeline = {}

local MAX_STEPS = 1 << 20  -- the most chunks x microbatches of one schedule

-- A positive integer argument 'what' of 'where', or 'default' when nil.
local function count (where, what, v, default)
  if v == nil and default ~= nil then return default end
  if math.type(v) ~= "integer" or v < 1 then
    raise("%s: %s must be a positive integer, got %s", where, what,
          math.type(v) == "integer" and v or type(v))
  end
  return v
end

-- The schedule table of the interleaved schedule: the forwards of one
-- stage in run order, each {microbatch, chunk} (1-based). Microbatches go
-- in groups of g; each group runs through every chunk before the next
-- group starts, and the last group takes whatever is left.
function pipeline.schedule_table (microbatches, chunks, group_size)
  local M = count("schedule_table", "microbatches", microbatches)
  local V = count("schedule_table", "chunks", chunks)
  local G = count("schedule_table", "group_size", group_size)
  local t = {}
  local first = 1
  while first <= M do
    local last = first + G - 1
    if last + 1 > M then last = M end  -- the last group takes the rest
    for c = 1, V do
      for b = first, last do t[#t + 1] = {b, c} end
    end
    first = last + 1
  end
  return t
end

-- The order of a schedule table with 'warmup' forwards before the first
-- backward: forward values chunk, backward values the chunks in reverse
-- (table chunk c becomes -(V - c + 1)), forwards and backwards in turn.
local function table_to_order (t, V, warmup, delay_wgrad)
  local n = #t
  if warmup > n then warmup = n end
  local order = {}
  local function fwd (i) order[#order + 1] = t[i][2] end
  local function bwd (i)
    local k = V - t[i][2] + 1
    order[#order + 1] = -k
    if delay_wgrad then order[#order + 1] = -(k + 0.5) end
  end
  for i = 1, warmup do fwd(i) end
  for i = warmup + 1, n do
    fwd(i)
    bwd(i - warmup)
  end
  for i = n - warmup + 1, n do bwd(i) end
  return order
end

local order_options = {stages = true, stage = true, microbatches = true, chunks = true,
                       group_size = true, interleaved = true, delay_wgrad = true}

-- pipeline.order{stages = P, stage = r (0 .. P-1), microbatches = M
--   [, chunks = 1] [, interleaved = chunks > 1] [, group_size = P]
--   [, delay_wgrad = false]} -> the order of stage r: 1F1B, or (with
-- several chunks, or interleaved = true) Megatron's interleaved 1F1B.
function pipeline.order (opts)
  if type(opts) ~= "table" then
    raise("pipeline.order: expected an options table, got %s", type(opts))
  end
  options("pipeline.order", opts, order_options)
  local P = count("pipeline.order", "stages", opts.stages)
  local r = opts.stage
  if math.type(r) ~= "integer" or r < 0 or r >= P then
    raise("pipeline.order: stage must be an integer in 0..%d (stages - 1), got %s", P - 1,
          math.type(r) and r or type(r))
  end
  local M = count("pipeline.order", "microbatches", opts.microbatches)
  local V = count("pipeline.order", "chunks", opts.chunks, 1)
  if M > MAX_STEPS // V then  -- the order holds 2 entries (3: delay_wgrad) per chunk x microbatch
    raise("pipeline.order: %d chunks x %d microbatches is more than the %d a schedule takes",
          V, M, MAX_STEPS)
  end
  local inter = opts.interleaved
  if inter == nil then inter = V > 1 end
  if type(inter) ~= "boolean" then
    raise("pipeline.order: interleaved must be a boolean, got %s", type(inter))
  end
  local dw = opts.delay_wgrad or false
  if type(dw) ~= "boolean" then
    raise("pipeline.order: delay_wgrad must be a boolean, got %s", type(dw))
  end
  if not inter then
    if V ~= 1 then
      raise("pipeline.order: %d chunks need the interleaved schedule (interleaved = false)", V)
    end
    if opts.group_size ~= nil then
      raise("pipeline.order: group_size is an option of the interleaved schedule")
    end
    return table_to_order(pipeline.schedule_table(M, 1, M), 1, P - r - 1, dw)
  end
  local G = count("pipeline.order", "group_size", opts.group_size, P)
  if G < P or G > M then
    raise("pipeline.order: group_size (microbatches in a row per chunk) must be in %d..%d "
          .. "(stages..microbatches), got %d", P, M, G)
  end
  local rest = M % G
  if rest > 0 and rest < P then
    raise("pipeline.order: the last group of microbatches holds %d (%d %% %d), fewer than the "
          .. "%d stages: its forwards would wait on each other", rest, M, G, P)
  end
  return table_to_order(pipeline.schedule_table(M, V, G), V, 2 * (P - r - 1) + (V - 1) * G, dw)
end

-- pipeline.steps(order) -> a sequence of {kind, chunk, microbatch}, one per
-- entry of order: kind "forward", "backward" or "wgrad", chunk and
-- microbatch 1-based, as make_graphed_callables walks the order.
function pipeline.steps (order)
  if type(order) ~= "table" then
    raise("pipeline.steps: order must be a sequence, got %s", type(order))
  end
  local fwd, bwd, steps = {}, {}, {}
  for i = 1, #order do
    local v = order[i]
    if type(v) ~= "number" or v == 0 or v ~= v then
      raise("pipeline.steps: order[%d] must be a non-zero number, got %s", i, v)
    end
    local k = math.floor(math.abs(v))
    if v > 0 then
      fwd[k] = (fwd[k] or 0) + 1
      steps[i] = {kind = "forward", chunk = k, microbatch = fwd[k]}
    elseif v == math.floor(v) then
      bwd[k] = (bwd[k] or 0) + 1
      steps[i] = {kind = "backward", chunk = k, microbatch = bwd[k]}
    else
      steps[i] = {kind = "wgrad", chunk = k, microbatch = bwd[k] or 0}
    end
  end
  return steps
end

-- pipeline.entry(chunk, microbatch, microbatches [, layer = 1]
--   [, num_layers_per_chunk]) -> the index in the sequence that
-- make_graphed_callables returns (and in sample_args) of that layer's
-- entry: entries go chunk by chunk, then microbatch, then layer.
-- num_layers_per_chunk is a sequence (one count per chunk) or nil (one
-- layer per chunk).
function pipeline.entry (chunk, microbatch, microbatches, layer, num_layers_per_chunk)
  local c = count("pipeline.entry", "chunk", chunk)
  local b = count("pipeline.entry", "microbatch", microbatch)
  local M = count("pipeline.entry", "microbatches", microbatches)
  local l = count("pipeline.entry", "layer", layer, 1)
  if b > M then raise("pipeline.entry: microbatch %d of %d", b, M) end
  local n = num_layers_per_chunk
  if n == nil then
    if l ~= 1 then raise("pipeline.entry: layer %d of a one-layer chunk", l) end
    return (c - 1) * M + b
  end
  if type(n) ~= "table" or n[c] == nil then
    raise("pipeline.entry: num_layers_per_chunk must be a sequence with an entry for chunk %d", c)
  end
  if l > n[c] then raise("pipeline.entry: layer %d of a %d-layer chunk", l, n[c]) end
  local prefix = 0
  for k = 1, c - 1 do prefix = prefix + n[k] end
  return prefix * M + (b - 1) * n[c] + l
end

-- The transfers of one training step between the stages of a pipeline
-- whose stage r runs orders[r] (0-based), in one order that every rank
-- computes alike: the order in which their receives happen when the stages
-- run side by side, each step waiting for its input (a forward for the
-- activation from the virtual stage before, a backward for its own forward
-- and the grad from the virtual stage after). Each {channel ("act" or
-- "grad"), from, to (stages), key}. A stage that does its sends and receives
-- in this order, sending no earlier than it has the data and receiving when
-- it needs it, never waits forever, also where a send waits for its
-- receive: the first unfinished transfer always finds both stages at it.
local function transfers (P, V, orders)
  local S, done, pos, steps, out = P * V, {}, {}, {}, {}
  for r = 0, P - 1 do steps[r], pos[r] = pipeline.steps(orders[r]), 1 end
  local left = true
  while left do
    local progress
    left, progress = false, false
    for r = 0, P - 1 do
      local s = steps[r][pos[r]]
      if s ~= nil then
        left = true
        local v, b, ready, from, channel = (s.chunk - 1) * P + r, s.microbatch, true, nil, nil
        if s.kind == "forward" then
          if v > 0 then ready, from, channel = done["F" .. (v - 1) .. ":" .. b], (v - 1) % P, "act" end
        elseif s.kind == "backward" then
          ready = done["F" .. v .. ":" .. b]
          if v < S - 1 then
            ready = ready and done["B" .. (v + 1) .. ":" .. b]
            from, channel = (v + 1) % P, "grad"
          end
        end
        if ready then
          if from ~= nil and from ~= r then
            out[#out + 1] = {channel = channel, from = from, to = r, key = channel .. v .. ":" .. b}
          end
          if s.kind ~= "wgrad" then done[(s.kind == "forward" and "F" or "B") .. v .. ":" .. b] = true end
          pos[r], progress = pos[r] + 1, true
        end
      end
    end
    if left and not progress then
      raise("pipeline.run: the stages' orders wait on each other (no stage can take its next step)")
    end
  end
  return out
end

-- The plans of pipeline.run by schedule (at most MAX_PLANS, then begun
-- again): a training step reruns one schedule, whose orders and transfers
-- cost more host time than a small stage's graph replays.
local MAX_PLANS, plans, nplans = 64, {}, 0

-- Stage r's plan of the schedule sched (pipeline.order's options but the
-- stage): its steps and its transfers in the common order ({channel, from,
-- to, key}, read only), and the index of each transfer by key.
local function plan_of (sched, r)
  local id = table.concat({tostring(sched.stages), tostring(sched.microbatches),
                           tostring(sched.chunks or 1), tostring(sched.group_size),
                           tostring(sched.interleaved), tostring(r)}, " ")
  local plan = plans[id]
  if plan then return plan end
  local orders = {}
  for q = 0, sched.stages - 1 do
    sched.stage = q
    orders[q] = pipeline.order(sched)
  end
  local mine, index = {}, {}
  for _, t in ipairs(transfers(sched.stages, sched.chunks or 1, orders)) do
    if t.from == r or t.to == r then
      mine[#mine + 1] = t
      index[t.key] = #mine
    end
  end
  plan = {steps = pipeline.steps(orders[r]), mine = mine, index = index}
  if nplans == MAX_PLANS then plans, nplans = {}, 0 end
  plans[id], nplans = plan, nplans + 1
  return plan
end

local run_options = {stages = true, stage = true, microbatches = true, chunks = true,
                     group_size = true, interleaved = true, call = true, input = true,
                     loss = true, shape = true, dtype = true, group = true}

-- pipeline.run{stages = P, stage = r, microbatches = M [, chunks = 1]
--   [, group_size] [, interleaved], call = function (chunk, microbatch, x) -> y,
--   input = function (b) -> x, loss = function (b, y) -> 0-D tensor,
--   shape = activation shape [, dtype = "f32" | "bf16" (the activations', f32)]
--   [, group = the pipeline's gc.dist group]}
--   -> the losses by microbatch (on the stage of the last virtual stage)
-- One training step of stage r in the order pipeline.order gives for these
-- options (graph the chunks with that order): each chunk's forward and
-- backward run with call (an eager module or the graphed entry); the first
-- virtual stage reads input(b), the last one backpropagates loss(b, y);
-- activations go to the next virtual stage and input grads to the one
-- before, kept when that virtual stage is on this stage, else sent with
-- gc.dist.send/recv to the group's rank of that stage (the world's without
-- a group). Every stage does its transfers in one order computed from every
-- stage's order (see transfers), so blocking sends cannot wait on each
-- other: a send goes once its data exists and the transfers before it are
-- done, a receive when its data is needed.
function pipeline.run (opts)
  if type(opts) ~= "table" then
    raise("pipeline.run: expected an options table, got %s", type(opts))
  end
  options("pipeline.run", opts, run_options)
  local call, input, loss, shape = opts.call, opts.input, opts.loss, opts.shape
  if type(call) ~= "function" or type(input) ~= "function" or type(loss) ~= "function" then
    raise("pipeline.run: call, input and loss must be functions")
  end
  local sched = {stages = opts.stages, microbatches = opts.microbatches, chunks = opts.chunks,
                 group_size = opts.group_size, interleaved = opts.interleaved}
  local P, r = count("pipeline.run", "stages", opts.stages), opts.stage
  if math.type(r) ~= "integer" or r < 0 or r >= P then
    raise("pipeline.run: stage must be an integer in 0..%d (stages - 1), got %s", P - 1,
          math.type(r) and r or type(r))
  end
  if type(shape) ~= "table" then
    raise("pipeline.run: shape (the activations' shape) must be a sequence, got %s", type(shape))
  end
  local dtype = opts.dtype or "f32"
  if dtype ~= "f32" and dtype ~= "bf16" then
    raise("pipeline.run: dtype (the activations' dtype) must be \"f32\" or \"bf16\", got %s",
          tostring(dtype))
  end
  local gc = require "graphcap"
  local group = opts.group
  local ranks
  if P > 1 or group ~= nil then  -- the ranks of the stages: this one must be stage r's
    local dist, g, n = util.dist_group("pipeline.run", group)
    ranks = g and g:ranks()
    if (g and n ~= P) or n < P then
      raise("pipeline.run: %s has %d ranks for %d stages", g and "the group" or "the world", n, P)
    end
    local me = g and g:rank() or dist.rank()
    if me ~= r then
      raise("pipeline.run: stage %d given on the pipeline's rank %d (each rank runs the stage of "
            .. "its rank in the group, or in the world without one)", r, me)
    end
  end
  local S = P * (opts.chunks or 1)
  local plan = plan_of(sched, r)
  local mine, index, at = plan.mine, plan.index, 1
  local function tensor (what, v) return util.check_tensor("pipeline.run", what, v) end
  -- outgoing data waits in outbox, incoming in inbox, until their turn
  local outbox, inbox, here = {}, {}, {}
  local function upto (k)
    while at <= k do
      local t = mine[at]
      local peer = t.from == r and t.to or t.from
      local o = {group = group}
      if ranks then peer = ranks[peer + 1] end
      if t.from == r then
        if outbox[t.key] == nil then  -- the order of transfers promises it
          raise("pipeline.run: stage %d has no %s to send yet", r, t.key)
        end
        gc.dist.send(outbox[t.key], peer, o)
        outbox[t.key] = nil
      else
        local buf = gc.empty(shape, {dtype = dtype})
        gc.dist.recv(buf, peer, o)
        inbox[t.key] = buf
      end
      at = at + 1
    end
  end
  -- hand t to virtual stage w (microbatch b) on channel; sends go as soon
  -- as the order lets them (the transfers before them done)
  local function put (channel, t, w, b)
    local key = channel .. w .. ":" .. b
    if t == nil then  -- only a grad can be missing: call's results are checked
      raise("pipeline.run: virtual stage %d (chunk %d, microbatch %d) has no input grad for "
            .. "virtual stage %d: its input got none in backward (does call(chunk, microbatch, "
            .. "x) compute its result from x?)", w + 1, (w + 1) // P + 1, b, w)
    end
    if w % P == r then
      here[key] = t:detach()
      return
    end
    if t:dtype() ~= dtype then  -- the peer receives into a buffer of dtype
      raise("pipeline.run: the %s of virtual stage %d (microbatch %d) to send is %s, but the "
            .. "activations' dtype is %s (set the option dtype)",
            channel == "act" and "activation" or "input grad", channel == "act" and w - 1 or w + 1,
            b, t:dtype(), dtype)
    end
    outbox[key] = t
    while mine[at] and mine[at].from == r and outbox[mine[at].key] ~= nil do upto(at) end
  end
  local function get (channel, w, b)
    local key = channel .. w .. ":" .. b
    local t = here[key]
    here[key] = nil
    if t ~= nil then return t end
    upto(index[key])
    t, inbox[key] = inbox[key], nil
    return t
  end
  local xs, ys, losses = {}, {}, {}
  for _, s in ipairs(plan.steps) do
    local c, b = s.chunk, s.microbatch
    local v, key = (c - 1) * P + r, c .. ":" .. b
    if s.kind == "forward" then
      local x = v == 0 and tensor("input(b)'s result", input(b))
                or get("act", v, b):requires_grad_(true)
      local y = tensor("call(chunk, microbatch, x)'s result", call(c, b, x))
      xs[key] = x
      if v == S - 1 then
        losses[b] = tensor("loss(b, y)'s result", loss(b, y))
        ys[key] = losses[b]
      else
        ys[key] = y
        put("act", y, v + 1, b)
      end
    elseif s.kind == "backward" then
      local y = ys[key]
      if v == S - 1 then y:backward() else y:backward(get("grad", v, b)) end
      if v > 0 then put("grad", xs[key].grad, v - 1, b) end
      xs[key], ys[key] = nil, nil
    end
  end
  upto(#mine)
  return losses
end

return pipeline
