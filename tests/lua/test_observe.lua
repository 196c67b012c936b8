-- test_observe.lua: seeing what was captured and what ran. Traces of
-- make_graphed_callables as Chrome trace-event JSON (spans of warmup,
-- captures, hook calls and replays, every hook call outside every capture);
-- the graphcap program's --trace, complete even when the script fails; DOT
-- dumps of graphs and graphed entries; the progress option; and the error
-- headlines: the user's file and line, the user's names, one traceback.
--   build/graphcap tests/lua/test_observe.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
-- The shared helpers, from this file's directory (whatever the working directory).
local H = dofile(debug.getinfo(1, "S").source:match("^@?(.-)[^/\\]*$") .. "helpers.lua")
local linears, samples = H.linears, H.samples

local HERE = "test_observe.lua"
local W = 2  -- num_warmup_iters

-- A fresh temporary file name (removed by the caller).
local function tmpname (suffix)
  local p = os.tmpname()
  os.remove(p)
  return p .. (suffix or "")
end

local function read_file (path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- The complete ("X") events of a trace file, after checking the format.
local function trace_events (path)
  local doc = H.json_decode(read_file(path))
  lu.assertEquals(type(doc.traceEvents), "table")
  local spans = {}
  for _, ev in ipairs(doc.traceEvents) do
    lu.assertEquals(math.type(ev.pid), "integer")
    lu.assertEquals(math.type(ev.tid), "integer")
    if ev.ph == "X" then
      lu.assertEquals(type(ev.name), "string")
      lu.assertTrue(ev.ts > 0 and ev.dur >= 0, ev.name)
      spans[#spans + 1] = ev
    else
      lu.assertEquals(ev.ph, "M")
    end
  end
  return spans
end

-- The spans of category cat whose name matches pattern pat (any when nil).
local function select (spans, cat, pat)
  local out = {}
  for _, ev in ipairs(spans) do
    if ev.cat == cat and (pat == nil or ev.name:find(pat)) then out[#out + 1] = ev end
  end
  return out
end

-- The program running this suite (arg's lowest index), for child runs.
local function program ()
  local i = -1
  while arg[i - 1] do i = i - 1 end
  return arg[i]
end

TestTrace = {}

-- Two Linear callables with a forward_pre hook on the first and a
-- backward hook on the second, graphed under a trace, then one training
-- step replayed: every kind of span in its expected count, nested as the
-- calls were, and no hook call inside any capture.
function TestTrace:test_spans_of_make_graphed_callables ()
  local path = tmpname(".json")
  local mods = linears(2)
  local hooks = {{forward_pre_hooks = {function () end}}, {backward_hooks = {function () end}}}
  gc.trace.start(path)
  local ok, err = pcall(function ()
    local g = gc.make_graphed_callables(mods, samples(2),
                                        {num_warmup_iters = W, capture_time_hooks = hooks})
    local y = g[2](g[1](gc.ones({4, 8})))
    y:sum():backward()
  end)
  gc.trace.stop()
  local spans = trace_events(path)
  os.remove(path)
  lu.assertTrue(ok, err)
  lu.assertEquals(#select(spans, "graphed", "^make_graphed_callables$"), 1)
  lu.assertEquals(#select(spans, "warmup", "^warmup$"), 1)
  lu.assertEquals(#select(spans, "warmup", "^warmup iteration %d+$"), W)
  lu.assertEquals(#select(spans, "warmup", "^warmup forward of entry %d$"), 2 * W)
  lu.assertEquals(#select(spans, "warmup", "^warmup backward of entry %d$"), 2 * W)
  local captures = select(spans, "capture", "^capture ")
  lu.assertEquals(#captures, 4)  -- two forwards, two backwards
  lu.assertEquals(#select(spans, "capture", "^instantiate "), 4)
  -- one hook per group and callable, num_warmup_iters + 1 times
  lu.assertEquals(#select(spans, "hook", "^forward_pre_hooks #1 of callable 1 %(Linear%)$"), W + 1)
  lu.assertEquals(#select(spans, "hook", "^backward_hooks #1 of callable 2 %(Linear%)$"), W + 1)
  lu.assertEquals(#select(spans, "replay", "^replay "), 4)
  lu.assertEquals(#select(spans, "replay", "^graphed forward of entry %d$"), 2)
  lu.assertEquals(#select(spans, "replay", "^graphed backward of entry %d$"), 2)
  for _, h in ipairs(select(spans, "hook")) do
    for _, c in ipairs(captures) do
      lu.assertTrue(h.ts + h.dur <= c.ts or c.ts + c.dur <= h.ts,
                    h.name .. " overlaps " .. c.name)
    end
  end
  -- every span of the call lies inside make_graphed_callables'
  local whole = select(spans, "graphed")[1]
  for _, ev in ipairs(spans) do
    if ev.cat ~= "replay" then
      lu.assertTrue(ev.ts >= whole.ts and ev.ts + ev.dur <= whole.ts + whole.dur, ev.name)
    end
  end
end

-- The pre and post warmup hooks and a plain Graph's capture and replays.
function TestTrace:test_warmup_hooks_and_plain_graphs ()
  local path = tmpname(".json")
  local x = gc.ones({2, 2})
  local g = gc.Graph()
  gc.trace.start(path)
  gc.make_graphed_callables(linears(1)[1], {gc.ones({4, 8}, {requires_grad = true})},
                            {num_warmup_iters = 1, pre_warmup_hook = function () end,
                             post_warmup_hook = function () end})
  g:capture(function () x = x * 2 end, {name = 'a "quoted" name'})
  g:replay()
  g:replay()
  gc.trace.stop()
  local spans = trace_events(path)
  os.remove(path)
  lu.assertEquals(#select(spans, "hook", "^pre_warmup_hook$"), 1)
  lu.assertEquals(#select(spans, "hook", "^post_warmup_hook$"), 1)
  lu.assertEquals(#select(spans, "capture", '^capture a "quoted" name$'), 1)
  lu.assertEquals(#select(spans, "replay", '^replay a "quoted" name$'), 2)
end

function TestTrace:test_errors ()
  local path = tmpname(".json")
  local msg = H.assert_err(function () gc.trace.start("/nonexistent-dir/t.json") end,
                           "/nonexistent-dir/t.json", "No such file or directory")
  lu.assertStrContains(msg, HERE .. ":")
  gc.trace.start(path)
  H.assert_err(function () gc.trace.start(path .. "2") end, "already tracing", path)
  gc.trace.stop()
  gc.trace.stop()  -- stopping no trace is fine
  lu.assertEquals(#trace_events(path), 0)
  os.remove(path)
end

-- graphcap --trace: the file is complete JSON, also when the script fails.
function TestTrace:test_program_trace_option ()
  local path, script = tmpname(".json"), tmpname(".lua")
  local f = assert(io.open(script, "w"))
  f:write([[
local gc = require "graphcap"
local m = gc.nn.Linear(4, 4)
local g = gc.make_graphed_callables(m, {gc.ones({2, 4}, {requires_grad = true})},
                                    {num_warmup_iters = 1})
g(gc.ones({2, 4}))
error("the script fails here")
]])
  f:close()
  local cmd = string.format("%q --device %s --trace %q %q 2>&1", program(), gc.device(), path,
                            script)
  local p = io.popen(cmd)
  local out = p:read("a")
  local _, _, code = p:close()
  os.remove(script)
  lu.assertEquals(code, 1)
  lu.assertStrContains(out, "the script fails here")
  local spans = trace_events(path)
  os.remove(path)
  lu.assertEquals(#select(spans, "graphed", "^make_graphed_callables$"), 1)
  lu.assertEquals(#select(spans, "replay", "^graphed forward of entry 1$"), 1)
end

TestDump = {}

-- The node and edge statements of a DOT file.
local function dot_parts (path)
  local text = read_file(path)
  lu.assertStrContains(text, "digraph")
  local nodes, edges, dashed = 0, 0, 0
  for line in text:gmatch("[^\n]+") do
    if line:match("^%s*n%d+ %[label=") then nodes = nodes + 1 end
    if line:match("^%s*n%d+ %-> n%d+") then
      edges = edges + 1
      if line:find("dashed", 1, true) then dashed = dashed + 1 end
    end
  end
  return text, nodes, edges, dashed
end

function TestDump:test_graph_dump ()
  local x, w = gc.ones({4, 8}), gc.ones({8, 8})
  local g = gc.Graph()
  g:capture(function () return gc.F.relu(gc.matmul(x, w)) * 2 end, {name = "small"})
  local path = tmpname(".dot")
  g:debug_dump(path)
  local text, nodes, edges = dot_parts(path)
  os.remove(path)
  if gc.device() ~= "host" then return end  -- CUDA's own format
  lu.assertEquals(nodes, g:stats().nodes)
  lu.assertEquals(edges, nodes - 1)  -- one stream: a chain
  lu.assertStrContains(text, 'label="small (host, 3 nodes)"')
  lu.assertStrContains(text, "#0 matmul")
  lu.assertStrContains(text, "#1 relu")
  lu.assertStrContains(text, "#2 scale")
  lu.assertStrContains(text, "writes p0: pool block")
  lu.assertStrContains(text, "reads  p1: heap block")
end

-- A stream forked into the capture and joined back: its node is marked, and
-- the join is an edge from it to the node after the join.
function TestDump:test_fork_and_join_edges ()
  if gc.device() ~= "host" then return end
  local x, s2, g = gc.ones({4, 4}), gc.Stream(), gc.Graph()
  g:capture(function ()
    local y = x * 2
    local fork = gc.Event()
    fork:record(gc.current_stream())
    s2:wait_event(fork)
    local z = gc.with_stream(s2, function () return y + x end)
    local join = gc.Event()
    join:record(s2)
    gc.current_stream():wait_event(join)
    return y + z
  end)
  local path = tmpname(".dot")
  g:debug_dump(path)
  local text, nodes, edges, dashed = dot_parts(path)
  os.remove(path)
  lu.assertEquals(nodes, 3)
  lu.assertStrContains(text, "#1 add (stream 1)")
  lu.assertStrContains(text, "n0 -> n1 [style=dashed]")  -- the fork
  lu.assertStrContains(text, "n1 -> n2 [style=dashed]")  -- the join
  lu.assertStrContains(text, "n0 -> n2;")                -- stream order
  lu.assertEquals(edges, 3)
  lu.assertEquals(dashed, 2)
end

function TestDump:test_graph_dump_errors ()
  local g = gc.Graph()
  local msg = H.assert_err(function () g:debug_dump(tmpname(".dot")) end, "not captured")
  lu.assertStrContains(msg, HERE .. ":")
  local x = gc.ones({2})
  g:capture(function () return x * 2 end)
  msg = H.assert_err(function () g:debug_dump("/nonexistent-dir/g.dot") end,
                     "cannot write '/nonexistent-dir/g.dot'", "No such file or directory")
  lu.assertStrContains(msg, HERE .. ":")
  g:reset()
  H.assert_err(function () g:debug_dump(tmpname(".dot")) end, "not captured", "reset")
end

-- Every graph of an entry: forward and backward, and the delayed wgrad's.
function TestDump:test_graphed_entries_dump ()
  local mods = linears(2, {delay_wgrad = true})
  local g = gc.make_graphed_callables(mods, samples(2),
                                      {num_warmup_iters = 1, order = {1, -1, -1.5}})
  local prefix = tmpname()
  local paths = g[1]:debug_dump(prefix)
  lu.assertEquals(paths, {prefix .. ".fwd.dot", prefix .. ".bwd.dot", prefix .. ".bwd_dw.dot"})
  for _, p in ipairs(paths) do
    local _, nodes = dot_parts(p)
    lu.assertTrue(nodes > 0, p)
    os.remove(p)
  end
  -- without an order the module itself replays, and dumps
  local m = linears(1)[1]
  gc.make_graphed_callables(m, {gc.ones({4, 8}, {requires_grad = true})}, {num_warmup_iters = 1})
  paths = m:debug_dump(prefix)
  lu.assertEquals(paths, {prefix .. ".fwd.dot", prefix .. ".bwd.dot"})
  for _, p in ipairs(paths) do os.remove(p) end
  g[2]:reset()
  H.assert_err(function () g[2]:debug_dump(prefix) end, "entry 2 was reset")
end

os.exit(lu.LuaUnit.run())
