-- test_graph.lua: capture and replay of one graph at a time (docs/semantics.md,
-- "Capture rules"; docs/lua-api.md, "Graphs"): replay equals eager bitwise
-- (also for 1,000 ops), capture records and does not run, static outputs are
-- rewritten, inputs are read at replay, host values and pointers are baked at
-- capture, streams (capture on a given stream, replay on another, fork/join),
-- random numbers in graphs, stats, reset and close.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_graph.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

-- A nested {rows, cols} table of not-too-regular values.
local function matrix (rows, cols, phase)
  local m = {}
  for i = 1, rows do
    m[i] = {}
    for j = 1, cols do m[i][j] = math.sin(0.37 * ((i - 1) * cols + j) + phase) * 1.5 + 0.25 end
  end
  return m
end

-- Ops of every kind, broadcasting included.
local function chain (x)
  local y = x * x + x
  y = y * 0.37 - x
  y = y - y:mean()
  y = y * x:sum()
  return -y
end

TestGraph = {tearDown = H.no_capture_left}

function TestGraph:test_replay_equals_eager_bitwise ()
  local x = gc.tensor(matrix(16, 32, 0))
  local eager = chain(x):tolist()
  local g, y = gc.Graph(), nil
  g:capture(function () y = chain(x) end)
  for _ = 1, 2 do
    g:replay()
    lu.assertEquals(y:tolist(), eager)
  end
  x:copy_(gc.tensor(matrix(16, 32, 1)))   -- new contents, same memory
  eager = chain(x):tolist()
  g:replay()
  lu.assertEquals(y:tolist(), eager)
  lu.assertNotEquals(eager[1][1], 0)
end

-- 1,000 small ops in one graph; replay equals eager bit for bit.
local function thousand_ops (x)
  local y = x
  for i = 0, 999 do
    local k = i % 5
    if k == 0 then y = y + x
    elseif k == 1 then y = y * 0.5
    elseif k == 2 then y = y * x
    elseif k == 3 then y = -y
    elseif i % 50 == 4 then y = y - y:mean()
    else y = y - x end
  end
  return y
end

function TestGraph:test_thousand_ops_bitwise ()
  local v = {}
  for i = 1, 64 do v[i] = 0.9 + 0.2 * ((i * 37) % 64) / 64 end
  local x = gc.tensor(v)
  local eager = thousand_ops(x):tolist()
  local g, y = gc.Graph(), nil
  g:capture(function () y = thousand_ops(x) end)
  g:replay()
  lu.assertEquals(y:tolist(), eager)
  for _, e in ipairs(eager) do lu.assertTrue(e == e and math.abs(e) < math.huge) end
  local st = g:stats()
  lu.assertTrue(st.nodes >= 1000, "nodes " .. st.nodes)
  print(string.format("# 1000-op graph: %d nodes, capture %.3f ms, instantiate %.3f ms",
                      st.nodes, st.capture_ms, st.instantiate_ms))
end

function TestGraph:test_capture_records_and_replay_runs ()
  local x = gc.tensor{1, 2, 3, 4}
  local z = gc.ones{4}
  local g, y = gc.Graph(), nil
  local inside
  g:capture(function ()
    inside = gc.is_capturing()
    z:fill_(5)                        -- an eager tensor written by the graph
    y = x * 2                         -- a static output
  end)
  lu.assertTrue(inside)
  lu.assertFalse(gc.is_capturing())
  lu.assertEquals(z:tolist(), {1, 1, 1, 1}) -- recorded, not run
  g:replay()
  lu.assertEquals(z:tolist(), {5, 5, 5, 5})
  lu.assertEquals(y:tolist(), {2, 4, 6, 8})
end

function TestGraph:test_outputs_rewritten_inputs_read_at_replay ()
  local x = gc.tensor{1, 2, 3, 4}
  local u = gc.zeros{4}                -- never read by the graph
  local g, y = gc.Graph(), nil
  g:capture(function () y = x * 2 end)
  g:replay()
  lu.assertEquals(y:tolist(), {2, 4, 6, 8})
  x:fill_(3)
  g:replay()
  lu.assertEquals(y:tolist(), {6, 6, 6, 6})
  x:copy_(gc.tensor{-1, 0, 1, 2})
  g:replay()
  lu.assertEquals(y:tolist(), {-2, 0, 2, 4})
  y:zero_()
  u:fill_(100)
  g:replay()
  lu.assertEquals(y:tolist(), {-2, 0, 2, 4})
end

-- "Late binding hides bugs" (docs/semantics.md, "Capture rules"): a host value
-- used at capture is baked into the graph; changing it later changes nothing.
function TestGraph:test_host_scalar_baked ()
  local x = gc.tensor{1, 2, 3, 4}
  local s = 3
  local g, y, y2 = gc.Graph(), nil, nil
  g:capture(function ()
    y = x * s
    y2 = s - x
  end)
  s = 5
  g:replay()
  lu.assertEquals(y:tolist(), {3, 6, 9, 12})
  lu.assertEquals(y2:tolist(), {2, 1, 0, -1})
  local g2, z = gc.Graph(), nil          -- a second graph sees the new value
  g2:capture(function () z = x * s end)
  g2:replay()
  g:replay()
  lu.assertEquals(z:tolist(), {5, 10, 15, 20})
  lu.assertEquals(y:tolist(), {3, 6, 9, 12})
end

-- The graph reads the memory captured, not whatever a variable names now.
function TestGraph:test_pointers_baked ()
  local x = gc.tensor{1, 2, 3}
  local keep = x
  local g, y = gc.Graph(), nil
  g:capture(function () y = x + 1 end)
  x = gc.tensor{10, 20, 30}              -- rebinding the variable
  g:replay()
  lu.assertEquals(y:tolist(), {2, 3, 4})
  keep:fill_(7)                          -- the captured memory
  g:replay()
  lu.assertEquals(y:tolist(), {8, 8, 8})
  x:fill_(0)
  g:replay()
  lu.assertEquals(y:tolist(), {8, 8, 8})
end

function TestGraph:test_handles_closed_after_capture ()
  local x = gc.tensor{1, 2, 3, 4}
  local v = x:view{2, 2}
  local g, y = gc.Graph(), nil
  g:capture(function () y = v + v end)
  v:close()                              -- the storage lives on in x
  local yv = y:view{4}
  y:close()                              -- and y's in yv
  x:fill_(1.5)
  g:replay()
  lu.assertEquals(yv:tolist(), {3, 3, 3, 3})
end

function TestGraph:test_capture_on_stream_and_replay_on_another ()
  local x = gc.tensor{1, 2, 3, 4}
  local cs, rs = gc.Stream(), gc.Stream()
  local g, y = gc.Graph(), nil
  g:capture(function () y = -x end, {stream = cs, name = "neg"})
  gc.with_stream(rs, function () g:replay() end)
  rs:synchronize()
  lu.assertEquals(y:tolist(), {-1, -2, -3, -4})
  x:fill_(7)
  g:replay()
  gc.synchronize()
  lu.assertEquals(y:tolist(), {-7, -7, -7, -7})
end

-- Fork/join (docs/semantics.md, "Capture rules"): a second stream joins the
-- capture by waiting on an event recorded in it, and is joined back before the
-- end.
function TestGraph:test_fork_join ()
  local x = gc.tensor{1, 2, 3, 4}
  local s2 = gc.Stream()
  local g, y1, y2, z = gc.Graph(), nil, nil, nil
  g:capture(function ()
    y1 = x * 2
    local ev = gc.Event()
    ev:record()
    s2:wait_event(ev)
    gc.with_stream(s2, function () y2 = x * 3 end)
    local ev2 = gc.Event()
    ev2:record(s2)
    gc.current_stream():wait_event(ev2)
    z = y1 + y2
  end)
  g:replay()
  lu.assertEquals(z:tolist(), {5, 10, 15, 20})
  x:fill_(-2)
  g:replay()
  lu.assertEquals(z:tolist(), {-10, -10, -10, -10})
  lu.assertEquals(y2:tolist(), {-6, -6, -6, -6})
  local st = g:stats()
  lu.assertTrue(st.nodes >= 3)
  lu.assertEquals(st.replays, 2)
end

function TestGraph:test_fork_not_joined_fails ()
  local x = gc.tensor{1, 2, 3, 4}
  local s2 = gc.Stream()
  local g = gc.Graph()
  lu.assertErrorMsgContains("capture", g.capture, g, function ()
    local ev = gc.Event()
    ev:record()
    s2:wait_event(ev)
    gc.with_stream(s2, function () local _ = x * 3 end)
  end)
  lu.assertFalse(gc.is_capturing())
  lu.assertErrorMsgContains("captur", g.replay, g)
  local w
  gc.with_stream(s2, function () w = x * 4 end)             -- s2 left the capture
  s2:synchronize()
  lu.assertEquals(w:tolist(), {4, 8, 12, 16})
  local y
  g:capture(function () y = x * 5 end)                      -- g captures again
  g:replay()
  lu.assertEquals(y:tolist(), {5, 10, 15, 20})
end

-- The generator's seed and offset live in device memory: every replay draws
-- fresh numbers, the ones eager code draws from the same state.
function TestGraph:test_rand_in_graph_draws_fresh ()
  gc.manual_seed(7)
  local r1, r2, r3 = gc.rand{256}:tolist(), gc.rand{256}:tolist(), gc.rand{256}:tolist()
  gc.manual_seed(7)
  local g, r = gc.Graph(), nil
  g:capture(function () r = gc.rand{256} end)
  g:replay()
  lu.assertEquals(r:tolist(), r1)
  g:replay()
  lu.assertEquals(r:tolist(), r2)
  lu.assertEquals(gc.rand{256}:tolist(), r3)
end

function TestGraph:test_stats ()
  local x = gc.ones{256}
  local g, c = gc.Graph(), nil
  g:capture(function () c = ((x + x) * x):sum() end)
  local st = g:stats()
  for _, k in ipairs{"nodes", "capture_ms", "instantiate_ms", "pool_bytes", "replays"} do
    lu.assertEquals(type(st[k]), "number", k)
  end
  lu.assertTrue(st.nodes >= 3, "nodes " .. st.nodes)
  lu.assertTrue(st.capture_ms >= 0 and st.instantiate_ms >= 0)
  lu.assertTrue(st.pool_bytes > 0)
  lu.assertEquals(st.replays, 0)
  for _ = 1, 3 do g:replay() end
  lu.assertEquals(g:stats().replays, 3)
  lu.assertEquals(c:item(), 512)
  lu.assertEquals(g:pool():stats().graphs, 1)
end

function TestGraph:test_reset_and_recapture ()
  local x = gc.ones{4}
  local g, y = gc.Graph(), nil
  g:capture(function () y = x * 2 end)
  g:replay()
  g:reset()
  lu.assertNil(g:pool())
  lu.assertErrorMsgContains("captur", g.replay, g)
  lu.assertEquals(y:tolist(), {2, 2, 2, 2})    -- outputs stay readable
  local y2
  g:capture(function () y2 = x * 5 end)
  lu.assertEquals(g:stats().replays, 0)
  g:replay()
  lu.assertEquals(y2:tolist(), {5, 5, 5, 5})
end

function TestGraph:test_close ()
  local x = gc.ones{4}
  local g, y = gc.Graph(), nil
  g:capture(function () y = x * 2 end)
  g:replay()
  g:close()
  lu.assertErrorMsgContains("closed", g.replay, g)
  lu.assertErrorMsgContains("closed", g.capture, g, function () end)
  g:close()
  lu.assertEquals(y:tolist(), {2, 2, 2, 2})
  do
    local h <close> = gc.Graph()
    h:capture(function () y = x * 3 end)
    h:replay()
  end
  lu.assertEquals(y:tolist(), {3, 3, 3, 3})
end

-- regression: a graph closed during its own capture left the engine capturing
-- A graph closed during its own capture ends it: by a <close> variable
-- when an error leaves a manual capture, and by g:close() inside
-- g:capture(fn). The engine is not left capturing; the next capture and
-- make_graphed_callables work.
function TestGraph:test_graph_closed_during_its_capture ()
  local x = gc.full({4}, 2)
  local ok, err = pcall(function ()
    local g <close> = gc.Graph()
    g:capture_begin()
    local _ = x * 3
    error("boom")
  end)
  lu.assertFalse(ok)
  lu.assertStrContains(err, "boom")
  lu.assertFalse(gc.is_capturing())
  local g2 = gc.Graph()
  lu.assertError(function () return g2:capture(function () g2:close(); return x * 3 end) end)
  lu.assertFalse(gc.is_capturing())
  local g3 = gc.Graph()
  local y = g3:capture(function () return x * 3 end)
  g3:replay()
  H.assert_same(y:tolist(), {6, 6, 6, 6}, "a later capture")
  local m = gc.make_graphed_callables(gc.nn.Linear(4, 2), {gc.randn({1, 4})}, {num_warmup_iters = 1})
  lu.assertEquals(m(gc.randn({1, 4})):shape(), {1, 2})
end

-- regression: a tensor outliving its stream kept its segment cached forever
-- A tensor that outlives the stream it was made on gives its memory back
-- once it goes.
function TestGraph:test_tensor_outliving_its_stream ()
  collectgarbage()
  local before = gc.memory_stats().reserved_bytes
  for _ = 1, 20 do
    local s = gc.Stream()
    local t = gc.with_stream(s, function () return gc.randn({1024}) end)
    s:close()
    lu.assertEquals(#t:tolist(), 1024)
    t:close()
  end
  lu.assertEquals(gc.memory_stats().reserved_bytes, before)
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
