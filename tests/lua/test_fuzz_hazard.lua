-- test_fuzz_hazard.lua: differential fuzzer of the hazards a graphed callable
-- meets between its calls. Each case draws a small model (each callable a
-- Sequential of Linear/ReLU/GELU/LayerNorm/Dropout, or a module of two
-- arguments around one), graphs it with make_graphed_callables (one or two
-- callables, or two microbatches of an order; one sample tensor for two
-- arguments or two entries; retain_graph_in_backward; graphed in both modes;
-- training or eval), keeps an identical eager twin, and walks a random
-- sequence of moves on both: plain steps; a second forward before the first
-- one's backward; a second backward of a call; in-place writes (fill_,
-- zero_, copy_, an optimizer step) on the static sample, a call's input, a
-- returned output or a parameter between a call and its backward; mode
-- switches of a module or of one submodule; a parameter moved onto other
-- storage (set_) or dtype (to), a sample moved (set_); entries called and
-- backpropagated out of their captured order; an output read after a later
-- call. Every action either gives eager's values bit for bit (outputs, input
-- grads, parameter grads, parameters), or the graphed side raises an error
-- that names the entry or the parameter, and the objects stay usable: after
-- a refusal the next plain step equals eager again. Seeded and bounded
-- (tests/lua/fuzz.lua): default 300 cases of 6 moves. A failure names the seed, the case and its
-- moves; with n the failing case's number,
--   GRAPHCAP_FUZZ_SEED=s GRAPHCAP_FUZZ_ITERS=n LUA_PATH='tests/lua/?.lua;;'
--     build/graphcap tests/lua/test_fuzz_hazard.lua
-- reproduces it; GRAPHCAP_FUZZ_TRACE=1 prints each action and what each side
-- did, GRAPHCAP_FUZZ_SKIP=move,move draws other moves only.

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
local F = require "fuzz"

local ROWS = 3
local MOVES_PER_CASE = 6


local TRACE = os.getenv("GRAPHCAP_FUZZ_TRACE") == "1"

-- What ran: cases, moves, and the graphed refusals in each kind of move.
local stats = {cases = 0, moves = 0, refused = {}}

-- A callable of two arguments around a Sequential; asymmetric in x and z,
-- so that one static input serving both would show.
local Two = gc.nn.Module("Two")
function Two:init (seq) self.seq = seq end
function Two:forward (x, z) return self.seq(x * z + z) end

-- ---------------------------------------------------------------------------
-- Cases

-- The spec of one case, drawn from r. shape: "one" (one callable), "two"
-- (two callables), "args" (one callable of two arguments), "order" (one
-- callable, two microbatches of an order: two entries).
local function random_case (r)
  local c = {training = r(6) > 1, warmup = r(4) - 1,
             shape = F.pick(r, {"one", "two", "args", "order"})}
  c.alias = c.shape ~= "one" and r(2) == 1 -- one sample tensor for both places
  c.retain = c.training and r(2) == 1
  c.noclone = c.training and r(4) == 1
  c.both = c.shape ~= "order" and r(4) == 1 -- graphed in the other mode first
  c.K = c.shape == "two" and 2 or 1
  c.dims, c.outs, c.layers = {}, {}, {}
  for k = 1, c.K do
    c.dims[k] = (k == 2 and c.alias) and c.dims[1] or r(4) + 1
    local list, d = F.random_layers(r, c.dims[k], 5, {0, 0.5})
    c.layers[k], c.outs[k] = list, d
  end
  if c.shape == "order" then c.order = F.pick(r, {{1, 1, -1, -1}, {1, -1, 1, -1}}) end
  -- entry i: its callable and its number of arguments
  c.callable, c.nargs = {}, {}
  local n = (c.shape == "two" or c.shape == "order") and 2 or 1
  for i = 1, n do
    c.callable[i] = c.shape == "two" and i or 1
    c.nargs[i] = c.shape == "args" and 2 or 1
  end
  return c
end

local function describe (c)
  local opts = {}
  for _, o in ipairs{"alias", "retain", "noclone", "both"} do
    if c[o] then opts[#opts + 1] = o end
  end
  return string.format("%s %s %s warmup=%d%s%s", c.shape, F.describe_layers(c.layers),
                       c.training and "train" or "eval", c.warmup,
                       c.order and " order=" .. table.concat(c.order, ",") or "",
                       #opts > 0 and " " .. table.concat(opts, " ") or "")
end

-- The callables of c, from generator seed s.
local function build (c, s)
  gc.manual_seed(s)
  local mods = {}
  for k = 1, c.K do
    local seq = F.sequential(gc, c.layers[k])
    mods[k] = c.shape == "args" and Two(seq) or seq
    if not c.training then mods[k]:eval() end
  end
  return mods
end

-- ---------------------------------------------------------------------------
-- The two sides

-- A nested table of ROWS x d values in [-1, 1) drawn from r.
local function vals (r, d)
  local t = {}
  for i = 1, ROWS do
    t[i] = {}
    for j = 1, d do t[i][j] = 2 * r() - 1 end
  end
  return t
end

local function list_of (t) return t and t:tolist() or "none" end

-- assert_same of nested tables of numbers, where "none" (no grad) also
-- compares.
local function assert_same (got, want, what)
  if type(got) == "table" and type(want) == "table" and #got == #want then
    for j = 1, #want do assert_same(got[j], want[j], what .. "[" .. j .. "]") end
  elseif type(got) == "string" or type(want) == "string" then
    lu.assertTrue(got == want, string.format("%s: %s ~= %s", what, tostring(got), tostring(want)))
  else
    H.assert_same(got, want, what)
  end
end

-- A failure of the case: what ran, and how to run it again.
local function fail (ctx, what, detail)
  lu.fail(string.format("seed %d, case %d (%s): moves %s: %s: %s\n  reproduce: "
                        .. "GRAPHCAP_FUZZ_SEED=%d GRAPHCAP_FUZZ_ITERS=%d "
                        .. "LUA_PATH='tests/lua/?.lua;;' build/graphcap "
                        .. "tests/lua/test_fuzz_hazard.lua", F.seed, ctx.n, describe(ctx.c),
                        table.concat(ctx.moves, ","), what, detail, F.seed, ctx.n))
end

-- An error of this file's own making (a Lua error in the harness, not a
-- refusal of graphcap's) fails the case whichever side raised it.
local function harness_error (msg)
  return msg:find("attempt to ", 1, true) or msg:find("bad argument", 1, true)
      or msg:find("luaunit", 1, true)
end

-- Every parameter of both sides: {k, name, eager tensor, graphed tensor}.
local function params_of (ctx)
  local ps = {}
  for k = 1, ctx.c.K do
    local an, bn = ctx.a[k]:named_parameters(), ctx.b[k]:named_parameters()
    for j, nt in ipairs(an) do ps[#ps + 1] = {k = k, name = nt[1], a = nt[2], b = bn[j][2]} end
  end
  return ps
end

-- Parameters and their grads on both sides must be equal, bit for bit, and
-- so must the grads the last backwards gave their inputs (later replays
-- must not write them).
local function check_state (ctx, what)
  for _, w in ipairs(ctx.watch) do
    for j = 1, #w.g do
      local ok, err = pcall(assert_same, list_of(w.g[j].grad), list_of(w.e[j].grad),
                            "grad of input " .. j .. " of an earlier backward")
      if not ok then fail(ctx, what, "graphed differs from eager: " .. tostring(err)) end
    end
  end
  for _, p in ipairs(ctx.params) do
    local ok, err = pcall(assert_same, p.b:tolist(), p.a:tolist(), "parameter " .. p.name)
    if ok then
      ok, err = pcall(assert_same, list_of(p.b.grad), list_of(p.a.grad),
                      "grad of parameter " .. p.name)
    end
    if not ok then fail(ctx, what, "graphed differs from eager: " .. tostring(err)) end
  end
end

-- After a refusal the sides may differ in what the refused work would have
-- added: the graphed side takes the eager grads; the inputs watched may
-- have been the refused backward's.
local function resync (ctx)
  for _, p in ipairs(ctx.params) do
    p.b.grad = p.a.grad and p.a.grad:clone() or nil
  end
  ctx.watch = {}
  ctx.refused = true
end

-- Does msg hold every string of one of the alternatives of allow?
local function allowed (msg, allow)
  for _, alt in ipairs(allow or {}) do
    local all = true
    for _, s in ipairs(alt) do
      if not msg:find(s, 1, true) then all = false; break end
    end
    if all then return true end
  end
  return false
end

-- Run fe on the eager side and fg on the graphed side; each returns a value
-- to compare (nested tables of numbers) and an object to keep. The graphed
-- side may raise where eager does not only with a message holding every
-- string of one of the alternatives of allow; where eager raises, it must
-- raise too. Returns "ok", "graphed" (graphed alone refused) or "both", and
-- the two objects.
local function both (ctx, what, fe, fg, allow)
  local eok, ev, eo = pcall(fe)
  local gok, gv, go = pcall(fg)
  if TRACE then
    io.stderr:write(string.format("  [%d] %s: eager %s, graphed %s\n", ctx.n, what,
                                  eok and "ok" or tostring(ev), gok and "ok" or tostring(gv)))
  end
  if not eok and harness_error(tostring(ev)) then
    fail(ctx, what, "eager side: " .. tostring(ev))
  end
  if not gok and harness_error(tostring(gv)) then
    fail(ctx, what, "graphed side: " .. tostring(gv))
  end
  if eok and gok then
    local same, err = pcall(assert_same, gv, ev, "value")
    if not same then fail(ctx, what, "graphed differs from eager: " .. tostring(err)) end
    return "ok", eo, go
  end
  if eok then
    local msg = tostring(gv)
    if not allowed(msg, allow) then
      fail(ctx, what, "graphed raised where eager gave a result: " .. msg)
    end
    local move = ctx.moves[#ctx.moves]
    stats.refused[move] = (stats.refused[move] or 0) + 1
    resync(ctx)
    return "graphed", eo, nil
  end
  if gok then
    fail(ctx, what, "graphed gave a result where eager raised (" .. tostring(ev) .. ")")
  end
  resync(ctx)
  return "both", nil, nil
end

-- ---------------------------------------------------------------------------
-- Actions: a call, a backward, a write, an optimizer step

-- The inputs of a call of entry i: for each argument, the sample of that
-- place, another sample tensor of its shape, or a fresh tensor (in "args"
-- now and then the same fresh tensor for both); drawn before anything
-- runs. sample_at: the argument given its own sample (0: none; nil: drawn).
local function draw_inputs (ctx, i, sample_at)
  local r, c = ctx.r, ctx.c
  local ins = {}
  for p = 1, c.nargs[i] do
    local d = c.dims[c.callable[i]]
    if p == sample_at or (sample_at == nil and r(4) == 1) then
      ins[p] = {sample = ctx.S[i][p]}
    elseif p == 2 and r(6) == 1 then
      ins[p] = {same = 1}
    elseif ctx.Sall[d] and r(8) == 1 then
      ins[p] = {sample = F.pick(r, ctx.Sall[d])}
    else
      ins[p] = {vals = vals(r, d), grad = c.training and r(4) > 1}
    end
  end
  return ins
end

-- Call entry i with inputs ins on both sides (ng: under no_grad). A slot:
-- the entry, the tensors given on each side, the outputs, and whether the
-- graphed call happened.
local function call (ctx, i, ins, ng, allow)
  ctx.seed = ctx.seed + 1
  local seed = ctx.seed
  local gx, ex = {}, {}
  local twin = {} -- the eager tensor standing for each graphed tensor given
  for p, spec in ipairs(ins) do
    if spec.same then
      gx[p], ex[p] = gx[spec.same], ex[spec.same]
    elseif spec.sample then
      local s = spec.sample
      gx[p] = s
      ex[p] = twin[s] or gc.tensor(s:tolist(), {requires_grad = s.requires_grad})
      twin[s] = ex[p]
    else
      gx[p] = gc.tensor(spec.vals, {requires_grad = spec.grad})
      ex[p] = gc.tensor(spec.vals, {requires_grad = spec.grad})
    end
  end
  if TRACE then
    local d = {}
    for p, spec in ipairs(ins) do
      d[p] = spec.same and "the same" or spec.sample and ctx.Sname[spec.sample]
             or (spec.grad and "fresh, requires grad" or "fresh")
    end
    io.stderr:write(string.format("  [%d] call of entry %d%s, seed %d, inputs: %s\n", ctx.n, i,
                                  ng and " (no_grad)" or "", seed, table.concat(d, "; ")))
  end
  local slot = {entry = i, gx = gx, ex = ex, ins = ins}
  for q, x in ipairs(gx) do -- given the static input of another place
    local home = ctx.home[x]
    if home and (home[1] ~= i or home[2] ~= q) then slot.foreign = true end
  end
  local function run (f, xs)
    gc.manual_seed(seed)
    local y
    if ng then y = gc.no_grad(function () return f(table.unpack(xs)) end)
    else y = f(table.unpack(xs)) end
    return y:tolist(), y
  end
  local how
  local what = string.format("call of entry %d%s", i, ng and " (no_grad)" or "")
  how, slot.ey, slot.gy = both(ctx, what,
                               function () return run(ctx.a[ctx.c.callable[i]], ex) end,
                               function () return run(ctx.G[i], gx) end, allow)
  slot.live = how == "ok"
  slot.ng = ng
  check_state(ctx, "after a call of entry " .. i)
  return slot
end

-- The distinct tensors of a list, in order.
local function distinct (xs)
  local seen, out = {}, {}
  for _, x in ipairs(xs) do
    if not seen[x] then seen[x] = true; out[#out + 1] = x end
  end
  return out
end

-- A call given the static input of another place, run eagerly (its module
-- in another mode) saved that tensor itself, which a replay of the other
-- place's entry writes (a call copies its argument into its static input):
-- eager's own refusal, where the eager twin was given a copy.
local FOREIGN = {"backward: ", "modified by an inplace operation", "saved by '"}

-- Backpropagate the slot's outputs on both sides (opts: backward's), input
-- grads cleared first; compares the input grads, then the parameters'.
-- then_eager: what the eager side does right after its backward (also when
-- there is none), a write the graphed side made before its own.
local function backward (ctx, slot, opts, allow, then_eager)
  then_eager = then_eager or function () end
  if slot.foreign then
    allow = {FOREIGN, table.unpack(allow or {})}
  end
  if not slot.live or not slot.ey.requires_grad then
    if slot.live and slot.gy.requires_grad then
      fail(ctx, "call of entry " .. slot.entry, "the graphed output requires grad, eager's not")
    end
    then_eager()
    check_state(ctx, "with no backward of entry " .. slot.entry)
    return "skipped"
  end
  local d = ctx.c.outs[ctx.c.callable[slot.entry]]
  local dv = vals(ctx.r, d)
  local gxs, exs = distinct(slot.gx), distinct(slot.ex)
  for _, x in ipairs(gxs) do x.grad = nil end
  for _, x in ipairs(exs) do x.grad = nil end
  local function run (y, xs)
    y:backward(gc.tensor(dv), opts)
    local g = {}
    for j, x in ipairs(xs) do g[j] = list_of(x.grad) end
    return g
  end
  local how = both(ctx, "backward of entry " .. slot.entry,
                   function ()
                     local ok, g = pcall(run, slot.ey, exs)
                     then_eager()
                     if not ok then error(g, 0) end
                     return g
                   end,
                   function () return run(slot.gy, gxs) end, allow)
  if how == "ok" then -- the fresh inputs (a sample's grad is the next backward's)
    local w = {g = {}, e = {}}
    for p, spec in ipairs(slot.ins) do
      if spec.vals then w.g[#w.g + 1], w.e[#w.e + 1] = slot.gx[p], slot.ex[p] end
    end
    table.insert(ctx.watch, 1, w)
    ctx.watch[4] = nil
  end
  check_state(ctx, "after a backward of entry " .. slot.entry)
  return how
end

-- An optimizer step on both sides, then zero_grad (to none or in place), or
-- neither (the next backward accumulates).
local function optimize (ctx)
  local r = ctx.r
  local how = r(4)
  if how == 1 then return end
  local adam = r(2) == 1
  local function run (side)
    local ps = {}
    for _, p in ipairs(ctx.params) do ps[#ps + 1] = p[side] end
    local opt = adam and gc.optim.Adam(ps, {lr = 1e-2}) or gc.optim.SGD(ps, {lr = 0.1})
    opt:step()
    opt:zero_grad({set_to_none = how == 2})
    return 0
  end
  both(ctx, "optimizer step", function () return run("a") end, function () return run("b") end)
  check_state(ctx, "after an optimizer step")
end

-- Write tensor t (under no_grad) as kind says: fill_, zero_ or copy_.
local function write (t, kind)
  gc.no_grad(function ()
    if kind[1] == "fill" then t:fill_(kind[2])
    elseif kind[1] == "zero" then t:zero_()
    else t:copy_(gc.tensor(kind[2]):reshape(t:shape())) end
  end)
end

local function draw_write (r, t)
  local k = r(3)
  if k == 1 then return {"fill", 2 * r() - 1} end
  if k == 2 then return {"zero"} end
  local v = {}
  for j = 1, t:numel() do v[j] = 2 * r() - 1 end
  return {"copy", v}
end

-- Is the module of entry i (its callable) in training mode?
local function entry_training (ctx, i)
  return ctx.a[ctx.c.callable[i]].training
end

-- ---------------------------------------------------------------------------
-- Moves

local M = {}

-- A plain step: every entry called in the captured order, backwards in
-- reverse, an optimizer step.
function M.step (ctx)
  local slots = {}
  local function fwd (i) slots[i] = call(ctx, i, draw_inputs(ctx, i)) end
  local function bwd (i)
    if entry_training(ctx, i) then backward(ctx, slots[i]) end
  end
  if ctx.c.order then -- the captured walk: microbatch b's forward is entry b
    local f, b = 0, 0
    for _, o in ipairs(ctx.c.order) do
      if o > 0 then f = f + 1; fwd(f) else b = b + 1; bwd(b) end
    end
  else
    for i = 1, #ctx.c.callable do fwd(i) end
    for i = #slots, 1, -1 do bwd(i) end
  end
  optimize(ctx)
end

-- The refusals of a backward after a later call of its entry, and of a
-- replay out of the pool's captured order.
local STALE = {"graphed backward of call", "overwritten by call"}
local ORDER = {"replay: ", "refused", "replay graphs that share a pool"}

-- A second call of an entry before the first one's backward (the second
-- maybe under no_grad): the first one's backward is refused; its output
-- shows the second call's values; the second's backward is eager's.
function M.second_forward (ctx)
  local r = ctx.r
  local i = r(#ctx.c.callable)
  local A = call(ctx, i, draw_inputs(ctx, i))
  local B = call(ctx, i, draw_inputs(ctx, i), r(3) == 1)
  if A.live and B.live then
    local ok, err = pcall(assert_same, A.gy:tolist(), B.ey:tolist(), "output")
    if not ok then
      fail(ctx, "reading call 1's output after call 2 of entry " .. i,
           "it does not show call 2's values: " .. tostring(err))
    end
  end
  local allow = {{"graphed backward of call", "of entry " .. i, "overwritten by call"}}
  if r(2) == 1 then backward(ctx, A, nil, allow) end
  if not B.ng then backward(ctx, B) end
  if r(2) == 1 then backward(ctx, A, nil, allow) end
end

-- Two backwards of one call, the first with retain_graph: refused without
-- retain_graph_in_backward, eager's grads with it. The first without
-- retain_graph: both refuse the second.
function M.backward_twice (ctx)
  local r = ctx.r
  local i = r(#ctx.c.callable)
  local A = call(ctx, i, draw_inputs(ctx, i))
  local retain = r(4) > 1
  backward(ctx, A, retain and {retain_graph = true} or nil)
  local allow = {}
  if not ctx.c.retain then
    allow[1] = {"graphed backward of call", "of entry " .. i, "a second backward of one call",
                "retain_graph_in_backward"}
  end
  if not retain then -- eager goes on where its nodes saved nothing (a Dropout(0) alone)
    allow[#allow + 1] = {"trying to backward through the graph a second time ('graphed'",
                         "retain_graph = true"}
  end
  backward(ctx, A, r(2) == 1 and {retain_graph = true} or nil, allow)
  if r(2) == 1 then optimize(ctx) end
end

local WRITTEN = "modified by an inplace operation"

-- The writes between a call and its backward, made on the graphed side
-- only: eager keeps the values the call was given, or writes after its
-- backward. The graphed backward must refuse (what it reads was written
-- since the call) or give the grads of the call's values, eager's without
-- the write. (Eager itself refuses some writes whose tensor its backward
-- does not read: a layer norm's bias, saved as PyTorch saves it; where the
-- graph does not read it, a graphed backward may go on, and then equals
-- eager's without the write.)

-- The static sample of a place written between a call and its backward
-- (the call given that sample, or another tensor): refused when the graph
-- reads it. Then a write before a call given the sample: the call sees the
-- new values (eager's twin of a sample is made from its values at a call).
function M.write_sample (ctx)
  local r = ctx.r
  local i = r(#ctx.c.callable)
  local p = r(ctx.c.nargs[i])
  local s = ctx.S[i][p]
  local A = call(ctx, i, draw_inputs(ctx, i, r(2) == 1 and p or 0))
  write(s, draw_write(r, s))
  if entry_training(ctx, i) then
    backward(ctx, A, nil, {{"graphed backward of call", "of entry " .. i, WRITTEN,
                            "the static input of argument #"}})
  end
  if r(2) == 1 then
    write(s, draw_write(r, s))
    local B = call(ctx, i, draw_inputs(ctx, i, p))
    if entry_training(ctx, i) then backward(ctx, B) end
  end
end

-- A call's own input written after the call: the call copied it into the
-- static input, so the backward is that of the values given.
function M.write_input (ctx)
  local r = ctx.r
  local i = r(#ctx.c.callable)
  local ins = draw_inputs(ctx, i, 0)
  local A = call(ctx, i, ins)
  for q = 1, #A.gx do
    if not ins[q].sample and not ins[q].same and r(2) == 1 then
      write(A.gx[q], draw_write(r, A.gx[q]))
    end
  end
  backward(ctx, A)
end

-- A returned output written before its backward: refused when the graph
-- reads it (a last ReLU saved its result), as eager refuses.
function M.write_output (ctx)
  local r = ctx.r
  local i = r(#ctx.c.callable)
  local A = call(ctx, i, draw_inputs(ctx, i))
  if not A.live then return end
  write(A.gy, draw_write(r, A.gy))
  backward(ctx, A, nil, {{"graphed backward of call", "of entry " .. i, WRITTEN, "output #1"}})
end

-- A parameter written between a call and its backward, in place or by an
-- optimizer step (eager: the same step, on clones, copied in after its
-- backward): refused when the graph reads it.
function M.write_param (ctx)
  local r = ctx.r
  local i = r(#ctx.c.callable)
  local A = call(ctx, i, draw_inputs(ctx, i))
  local mine = {}
  for _, p in ipairs(ctx.params) do
    if p.k == ctx.c.callable[i] then mine[#mine + 1] = p end
  end
  if #mine == 0 then return backward(ctx, A) end
  if r(3) == 1 then
    local adam = r(2) == 1
    local function step (ts)
      local opt = adam and gc.optim.Adam(ts, {lr = 1e-2}) or gc.optim.SGD(ts, {lr = 0.1})
      opt:step()
    end
    local clones = {}
    for j, p in ipairs(ctx.params) do
      clones[j] = p.a:detach():clone()
      clones[j].requires_grad = true
      clones[j].grad = p.a.grad and p.a.grad:clone() or nil
    end
    step(clones)
    local ps = {}
    for j, p in ipairs(ctx.params) do ps[j] = p.b end
    step(ps)
    backward(ctx, A, nil, {{"graphed backward of call", "of entry " .. i, WRITTEN, "parameter '"}},
             function ()
               for j, p in ipairs(ctx.params) do
                 gc.no_grad(function () p.a:copy_(clones[j]) end)
               end
             end)
    return
  end
  local p = F.pick(r, mine)
  local kind = draw_write(r, p.a)
  write(p.b, kind)
  backward(ctx, A, nil, {{"graphed backward of call", "of entry " .. i, WRITTEN,
                          "parameter '" .. p.name .. "'"}},
           function () write(p.a, kind) end)
end

-- Switch a callable's mode (train <-> eval), whole: a call in the other
-- mode runs eagerly (or replays the graph of that mode); then back.
function M.mode_top (ctx)
  local k = ctx.r(ctx.c.K)
  local was = ctx.a[k].training
  ctx.a[k]:train(not was)
  ctx.b[k]:train(not was)
  M.step(ctx)
  ctx.a[k]:train(was)
  ctx.b[k]:train(was)
  M.step(ctx)
end

-- The children of m, depth first (m's own Sequential for a Two).
local function descendants (m, out)
  out = out or {}
  for _, ch in ipairs(m:named_children()) do
    out[#out + 1] = ch[1]
    for _, name in ipairs(descendants(ch[2])) do out[#out + 1] = ch[1] .. "." .. name end
  end
  return out
end

local function child (m, path)
  for name in path:gmatch("[^.]+") do m = m[name] end
  return m
end

-- Switch one child's mode (a Dropout in eval in a module graphed in
-- training, ...): the module no longer computes what its graph does, so a
-- call runs eagerly; then back.
function M.mode_child (ctx)
  local r = ctx.r
  local k = r(ctx.c.K)
  local names = descendants(ctx.a[k])
  if #names == 0 then return M.step(ctx) end
  local path = F.pick(r, names)
  local ca, cb = child(ctx.a[k], path), child(ctx.b[k], path)
  local was = ca.training
  ca:train(not was)
  cb:train(not was)
  M.step(ctx)
  ca:train(was)
  cb:train(was)
  M.step(ctx)
end

-- Graph the twin again: after a move that leaves its graphs reading memory
-- that is no longer the parameters'.
local function regraph (ctx)
  local c = ctx.c
  local opts = {num_warmup_iters = c.warmup, order = c.order,
                retain_graph_in_backward = c.retain or nil,
                clone_param_grads_on_return = not c.noclone}
  local ok, G = pcall(function ()
    if c.both then
      for k = 1, c.K do ctx.b[k]:train(not c.training) end
      gc.make_graphed_callables(ctx.b, ctx.S, opts)
      for k = 1, c.K do ctx.b[k]:train(c.training) end
    end
    return gc.make_graphed_callables(ctx.b, ctx.S, opts)
  end)
  if not ok then fail(ctx, "make_graphed_callables", tostring(G)) end
  ctx.G = G
end

-- The parameters of callable k's module, as ctx.params entries.
local function params_of_callable (ctx, k)
  local mine = {}
  for _, p in ipairs(ctx.params) do
    if p.k == k then mine[#mine + 1] = p end
  end
  return mine
end

-- Every entry of callable k.
local function entries_of (ctx, k)
  local es = {}
  for i, kk in ipairs(ctx.c.callable) do
    if kk == k then es[#es + 1] = i end
  end
  return es
end

-- A parameter moved onto other storage (set_) with other values: a call
-- of its module is refused, naming it; moved back (or graphed again), the
-- next step is eager's. Also between a call and its backward.
function M.param_set (ctx)
  local r = ctx.r
  local k = r(ctx.c.K)
  local mine = params_of_callable(ctx, k)
  if #mine == 0 then return M.step(ctx) end
  local p = F.pick(r, mine)
  local oa, ob = p.a:detach(), p.b:detach() -- the old storages
  local pending = r(3) == 1 and entry_training(ctx, entries_of(ctx, k)[1])
  local i = entries_of(ctx, k)[1]
  local A = pending and call(ctx, i, draw_inputs(ctx, i)) or nil
  local function move (t) t:set_(gc.no_grad(function () return t * 0.5 end)) end
  move(p.a)
  move(p.b)
  local named = {{"entry ", "'" .. p.name .. "'"}}
  if A then backward(ctx, A, nil, named) end
  for _, e in ipairs(entries_of(ctx, k)) do
    local B = call(ctx, e, draw_inputs(ctx, e), false, named)
    if B.live then
      fail(ctx, "call of entry " .. e .. " after moving " .. p.name,
           "the graphed call was not refused")
    end
  end
  if r(2) == 1 then
    p.a:set_(oa)
    p.b:set_(ob)
  else
    regraph(ctx)
  end
  M.step(ctx)
end

-- A sample moved onto other storage (set_) with other values: a call of the
-- entry whose static input it is is refused, naming it; moved back (or
-- graphed again), the next step is eager's.
function M.sample_set (ctx)
  local r = ctx.r
  local i = r(#ctx.c.callable)
  local s = ctx.S[i][r(ctx.c.nargs[i])]
  local hi, hp = ctx.home[s][1], ctx.home[s][2]
  local keep = s:detach() -- the old storage
  local v = vals(r, ctx.c.dims[ctx.c.callable[hi]])
  gc.no_grad(function () s:set_(gc.tensor(v)) end)
  local named = {{"entry " .. hi, "the static input of argument #" .. hp .. " (its sample) moved"}}
  local B = call(ctx, hi, draw_inputs(ctx, hi), false, named)
  if B.live then
    fail(ctx, "call of entry " .. hi .. " after moving its sample",
         "the graphed call was not refused")
  end
  if r(2) == 1 then s:set_(keep) else regraph(ctx) end
  M.step(ctx)
end

-- A module converted to bf16 and back: its parameters are other storage,
-- the graphs read the old one; calls are refused, naming a parameter,
-- until it is graphed again.
function M.param_to (ctx)
  local r = ctx.r
  local k = r(ctx.c.K)
  local mine = params_of_callable(ctx, k)
  if #mine == 0 then return M.step(ctx) end
  local named = {}
  for _, p in ipairs(mine) do named[#named + 1] = {"entry ", "'" .. p.name .. "'"} end
  ctx.a[k]:to("bf16")
  ctx.b[k]:to("bf16")
  local i = entries_of(ctx, k)[1]
  local B = call(ctx, i, draw_inputs(ctx, i), false, named)
  if B.live then
    fail(ctx, "call of entry " .. i .. " in bf16", "the graphed call was not refused")
  end
  ctx.a[k]:to("f32")
  ctx.b[k]:to("f32")
  check_state(ctx, "after converting back to f32")
  if r(2) == 1 then
    B = call(ctx, i, draw_inputs(ctx, i), false, named)
    if B.live then
      fail(ctx, "call of entry " .. i .. " after bf16 and back", "the graphed call was not refused")
    end
  end
  regraph(ctx)
  M.step(ctx)
end

-- Entries called and backpropagated in a random order: each replay is
-- eager's, or refused (the pool's replay-order check, a stale call).
function M.shuffle (ctx)
  local r = ctx.r
  local n = #ctx.c.callable
  local slots, order = {}, {}
  for _ = 1, n + r(2) - 1 do
    local i = r(n)
    slots[#slots + 1] = call(ctx, i, draw_inputs(ctx, i), false, {ORDER})
  end
  for j = 1, #slots do order[j] = j end
  for j = #order, 2, -1 do
    local x = r(j)
    order[j], order[x] = order[x], order[j]
  end
  for _, j in ipairs(order) do
    if entry_training(ctx, slots[j].entry) then
      backward(ctx, slots[j], nil, {STALE, ORDER})
    end
  end
  optimize(ctx)
end

-- An output read after its backward and a later call of its entry: it
-- shows the later call's values.
function M.reread (ctx)
  local r = ctx.r
  local i = r(#ctx.c.callable)
  local A = call(ctx, i, draw_inputs(ctx, i))
  if entry_training(ctx, i) then backward(ctx, A) end
  local B = call(ctx, i, draw_inputs(ctx, i), r(3) == 1)
  if A.live and B.live then
    local ok, err = pcall(assert_same, A.gy:tolist(), B.ey:tolist(), "output")
    if not ok then
      fail(ctx, "reading call 1's output after call 2 of entry " .. i,
           "it does not show call 2's values: " .. tostring(err))
    end
  end
  if entry_training(ctx, i) and not B.ng then backward(ctx, B) end
end

-- The moves drawn, by the case's mode: with weights.
local TRAIN_MOVES = {
  {"step", 3}, {"second_forward", 2}, {"backward_twice", 2}, {"write_sample", 2},
  {"write_input", 1}, {"write_output", 2}, {"write_param", 2}, {"mode_top", 1},
  {"mode_child", 2}, {"param_set", 1}, {"param_to", 1}, {"sample_set", 1}, {"shuffle", 1},
  {"reread", 1},
}
local EVAL_MOVES = {
  {"step", 2}, {"write_sample", 1}, {"mode_top", 1}, {"mode_child", 2}, {"param_set", 1},
  {"param_to", 1}, {"sample_set", 1}, {"reread", 1},
}

local SKIP = {}
for name in (os.getenv("GRAPHCAP_FUZZ_SKIP") or ""):gmatch("[%w_]+") do SKIP[name] = true end

local function draw_move (r, moves)
  local total = 0
  for _, m in ipairs(moves) do total = total + (SKIP[m[1]] and 0 or m[2]) end
  local x = r(total)
  for _, m in ipairs(moves) do
    local w = SKIP[m[1]] and 0 or m[2]
    if x <= w then return m[1] end
    x = x - w
  end
end

-- ---------------------------------------------------------------------------
-- The run

local function run_case (r, n)
  local c = random_case(r)
  local ctx = {c = c, n = n, r = r, seed = 5000 + 100 * n, moves = {}, watch = {}}
  local s = 2000 + n
  ctx.a, ctx.b = build(c, s), build(c, s)
  ctx.params = params_of(ctx)
  -- samples: one list per entry; "alias": one tensor for both places
  gc.manual_seed(3000 + n)
  ctx.S, ctx.Sall, ctx.Sname, ctx.home = {}, {}, {}, {}
  local first
  for i = 1, #c.callable do
    ctx.S[i] = {}
    for p = 1, c.nargs[i] do
      local d = c.dims[c.callable[i]]
      local s_ = (c.alias and first) or gc.tensor(vals(r, d), {requires_grad = c.training})
      first = first or s_
      ctx.S[i][p] = s_
      ctx.home[s_] = ctx.home[s_] or {i, p} -- the place whose static input it is
      ctx.Sname[s_] = ctx.Sname[s_] or string.format("sample of entry %d, argument #%d", i, p)
      ctx.Sall[d] = ctx.Sall[d] or {}
      table.insert(ctx.Sall[d], s_)
    end
  end
  regraph(ctx)
  local moves = c.training and TRAIN_MOVES or EVAL_MOVES
  for _ = 1, MOVES_PER_CASE do
    local name = draw_move(r, moves)
    ctx.moves[#ctx.moves + 1] = name
    if TRACE then io.stderr:write(string.format("[%d] move %s\n", n, name)) end
    ctx.refused = false
    M[name](ctx)
    if ctx.refused then
      -- the objects stay usable: the next plain step is eager's
      ctx.moves[#ctx.moves + 1] = "step"
      ctx.refused = false
      M.step(ctx)
      if ctx.refused then fail(ctx, "the plain step after a refusal", "it was refused") end
    end
  end
  stats.cases = stats.cases + 1
  stats.moves = stats.moves + #ctx.moves
  collectgarbage()
end

TestFuzzHazard = {tearDown = H.no_capture_left}

function TestFuzzHazard:test_graphed_equals_eager_or_refuses ()
  local r, budget = F.rng(3), F.budget(300)
  F.announce(budget .. " cases")
  for n = 1, budget do run_case(r, n) end
  local refused = {}
  for move, k in pairs(stats.refused) do refused[#refused + 1] = move .. " " .. k end
  table.sort(refused)
  print(string.format("# seed %d: %d cases, %d moves; graphed refusals: %s", F.seed, stats.cases,
                      stats.moves, table.concat(refused, ", ")))
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
