-- test_dist_args.lua: bad arguments to the distributed layer and the
-- training across ranks (gc.dist, gc.ddp, gc.fsdp, gc.pipeline,
-- gc.autograd.on_backward) at world size 1: each is an error naming the
-- call and the argument at the caller's line, raised when the call is made
-- (not later, inside backward or inside the facade), and what was given
-- stays usable.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_dist_args.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

local here = debug.getinfo(1, "S").short_src

-- The error of f() names 'here' (this file's line) and every string given.
local function fails (f, ...)
  return H.assert_err(f, here .. ":", ...)
end

TestDistArgs = {}

function TestDistArgs.test_on_backward_arguments ()
  local ob = gc.autograd.on_backward
  local x = gc.randn({3}, {requires_grad = true})
  fails(function () ob("A", x, nil) end, "on_backward: fn (argument #3) must be a function, got nil")
  fails(function () ob("A", 3, function () end) end, "on_backward: x (argument #2) must be a Tensor")
  fails(function () ob(5, x, function () end) end, "on_backward: name (argument #1) must be a string")
  fails(function () ob("A", gc.randn({3}), function () end, 7) end,
        "on_backward: anchor (argument #4) must be a Tensor or nil, got number")
  -- a callable table is a function; the node still works after the errors
  local n = 0
  local y = ob("A", x, setmetatable({}, {__call = function () n = n + 1 end}))
  y:sum():backward()
  lu.assertEquals(n, 1)
  H.assert_same(x.grad:tolist(), {1, 1, 1}, "x's grad")
end

-- world size 1 for the whole file (what init and the world's group hold is
-- alive before every test)
if gc.dist.is_available() then
  gc.dist.init()
  gc.dist.world()
end

local function needs_dist ()
  if not gc.dist.is_available() then lu.skip("built without MPI") end
end

function TestDistArgs.test_group_option_not_a_group ()
  needs_dist()
  local t = gc.ones({2})
  fails(function () gc.dist.all_reduce(t, {group = {}}) end,
        "all_reduce: option group must be a gc.dist group", "got table")
  fails(function () gc.dist.reduce_scatter(t, t, {group = 1}) end, "reduce_scatter: option group")
  fails(function () gc.dist.all_gather(t, t, {group = "w"}) end, "all_gather: option group")
  fails(function () gc.dist.broadcast(t, 0, {group = {}}) end, "broadcast: option group")
  fails(function () gc.dist.barrier(5) end, "barrier: group (argument #1) must be a gc.dist group")
  gc.dist.all_reduce(t, {group = gc.dist.world()})
  H.assert_same(t:tolist(), {1, 1}, "all_reduce after the errors")
end

function TestDistArgs.test_wrapper_input_not_a_tensor ()
  needs_dist()
  local d = gc.ddp.wrap(gc.nn.Linear(2, 2))
  fails(function () d(3) end, "DDP: input (argument #1) must be a Tensor, got number")
  fails(function () d(nil) end, "DDP: input (argument #1) must be a Tensor, got nil")
  local F = gc.fsdp.shard({gc.nn.Linear(2, 2)})
  fails(function () F.units[1]({}) end, "FSDPUnit: input (argument #1) must be a Tensor, got table")
  lu.assertEquals(d(gc.ones({1, 2})):shape(), {1, 2})
  lu.assertEquals(F.units[1](gc.ones({1, 2})):shape(), {1, 2})
end

-- A parameter in two units (one module given twice, or a weight shared by
-- two modules) would get two shards stepped apart: refused, and nothing is
-- sharded.
function TestDistArgs.test_fsdp_parameter_in_two_units ()
  needs_dist()
  local l = gc.nn.Linear(2, 2)
  fails(function () gc.fsdp.shard({l, l}) end,
        "fsdp.shard: parameter 'weight' of module 2", "is also parameter 'weight' of module 1")
  local w = gc.ones({2}, {requires_grad = true})
  local Scale = gc.nn.Module("Scale")
  function Scale:init (p) self.w = p end
  function Scale:forward (x) return x * self.w end
  fails(function () gc.fsdp.shard({Scale(w), gc.nn.Linear(2, 2), Scale(w)}) end,
        "fsdp.shard: parameter 'w' of module 3", "is also parameter 'w' of module 1")
  H.assert_same(l.weight:shape(), {2, 2}, "the weight's shape")
  lu.assertEquals(#gc.fsdp.shard({l}):parameters(), 2)
end

-- A DDP module holding f32 and bf16 parameters: each bucket holds one
-- dtype (one bucket of both failed in backward, joining them), and the
-- grads are averaged (at world size 1: as they were).
function TestDistArgs.test_ddp_bucket_of_two_dtypes ()
  needs_dist()
  local Mix = gc.nn.Module("Mix")
  function Mix:init ()
    self.a = gc.ones({2}, {requires_grad = true})
    self.b = gc.ones({2}, {dtype = "bf16", requires_grad = true})
  end
  function Mix:forward (x) return x * self.a end
  local m = Mix()
  local d = gc.ddp.wrap(m)
  -- b's grad from a backward of its own, a's from the wrapper's: the sync
  -- then finds both
  local z = gc.full({2}, 3, "bf16") * m.b
  z:sum():backward()
  d(gc.full({2}, 2, {requires_grad = true})):sum():backward()
  H.assert_same(m.a.grad:tolist(), {2, 2}, "a's grad")
  H.assert_same(m.b.grad:tolist(), {3, 3}, "b's grad")
end

function TestDistArgs.test_pipeline_schedule_too_long ()
  -- 2^40 microbatches: an error, not a schedule that fills the memory
  fails(function () gc.pipeline.order{stages = 2, stage = 0, microbatches = 1 << 40} end,
        "pipeline.order: 1 chunks x 1099511627776 microbatches is more than the 1048576")
  fails(function () gc.pipeline.order{stages = 2, stage = 0, microbatches = 1 << 11,
                                      chunks = 1 << 10} end, "pipeline.order: 1024 chunks x 2048")
end

function TestDistArgs.test_pipeline_run_arguments ()
  local function opts (t)
    local o = {stages = 1, stage = 0, microbatches = 2, shape = {2},
               call = function (_, _, x) return x * 2 end,
               input = function () return gc.ones({2}, {requires_grad = true}) end,
               loss = function (_, y) return y:sum() end}
    for k, v in pairs(t) do o[k] = v end
    return o
  end
  local run = gc.pipeline.run
  fails(function () run(opts{call = function () return 3 end}) end,
        "pipeline.run: call(chunk, microbatch, x)'s result must be a Tensor, got number")
  fails(function () run(opts{input = function () end}) end,
        "pipeline.run: input(b)'s result must be a Tensor, got nil")
  fails(function () run(opts{loss = function () return 1 end}) end,
        "pipeline.run: loss(b, y)'s result must be a Tensor, got number")
  fails(function () run(opts{shape = 3}) end, "pipeline.run: shape (the activations' shape)")
  -- a chunk whose result does not come from its input sends back no grad
  local bias = gc.ones({2}, {requires_grad = true})
  fails(function ()
    run(opts{chunks = 2, call = function (c, _, x) return c == 2 and x:detach() + bias or x * 2 end})
  end, "pipeline.run: virtual stage 1 (chunk 2, microbatch 1) has no input grad for virtual stage "
       .. "0: its input got none in backward")
  fails(function () run(opts{dtype = "f16"}) end,
        "pipeline.run: dtype (the activations' dtype) must be \"f32\" or \"bf16\", got f16")
  local losses = run(opts{})
  H.assert_same({losses[1]:item(), losses[2]:item()}, {4, 4}, "losses")
  if not gc.dist.is_available() then return end
  needs_dist()
  fails(function () run(opts{group = {}}) end, "pipeline.run: option group must be a gc.dist group")
  -- more stages than ranks: said at once, not a send to a rank that is not there
  fails(function () run(opts{stages = 2, stage = 1}) end,
        "pipeline.run: the world has 1 ranks for 2 stages")
end

os.exit(lu.LuaUnit.run(), true)
