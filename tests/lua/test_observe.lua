-- test_observe.lua: seeing what was captured and what ran. Traces of
-- make_graphed_callables as Chrome trace-event JSON (spans of warmup,
-- captures, hook calls and replays, every hook call outside every capture);
-- the graphcap program's --trace, complete even when the script fails; DOT
-- dumps of graphs and graphed entries; the progress option; and the error
-- headlines: the user's file and line, the user's names, one traceback.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_observe.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"
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

-- With an order (two chunks): hook calls sit between the captures too.
function TestTrace:test_hooks_outside_captures_with_order ()
  local path = tmpname(".json")
  local hooks = {{forward_pre_hooks = {function () end}, backward_pre_hooks = {function () end}},
                 {forward_hooks = {function () end}, backward_hooks = {function () end}}}
  gc.trace.start(path)
  local ok, err = pcall(gc.make_graphed_callables, linears(2), samples(2),
                        {num_warmup_iters = W, order = {1, 2, -2, -1},
                         capture_time_hooks = hooks})
  gc.trace.stop()
  local spans = trace_events(path)
  os.remove(path)
  lu.assertTrue(ok, err)
  local captures, hook_calls = select(spans, "capture", "^capture "), select(spans, "hook")
  lu.assertEquals(#captures, 4)
  lu.assertEquals(#hook_calls, 4 * (W + 1))
  for _, h in ipairs(hook_calls) do
    for _, c in ipairs(captures) do
      lu.assertTrue(h.ts + h.dur <= c.ts or c.ts + c.dur <= h.ts, h.name .. " overlaps " .. c.name)
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

-- graphcap --trace: the file is complete JSON, also when the script fails
-- or leaves by os.exit.
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
  lu.assertEquals(code, 1)
  lu.assertStrContains(out, "the script fails here")
  local spans = trace_events(path)
  os.remove(path)
  lu.assertEquals(#select(spans, "graphed", "^make_graphed_callables$"), 1)
  lu.assertEquals(#select(spans, "replay", "^graphed forward of entry 1$"), 1)
  f = assert(io.open(script, "w"))
  f:write([[
local gc = require "graphcap"
local g = gc.Graph()
local x = gc.ones({2})
g:capture(function () x = x * 2 end)
g:replay()
os.exit(3)
]])
  f:close()
  p = io.popen(cmd)
  p:read("a")
  _, _, code = p:close()
  os.remove(script)
  lu.assertEquals(code, 3)
  spans = trace_events(path)
  os.remove(path)
  lu.assertEquals(#select(spans, "replay", "^replay graph #%d+$"), 1)
end

TestDump = {}

-- The node and edge statements of a DOT file.
local function dot_parts (path)
  local text = read_file(path)
  lu.assertStrContains(text, "digraph")
  local nodes, edges, dashed = 0, 0, 0
  for line in text:gmatch("[^\n]+") do
    -- host's nodes, or CUDA's own ("graph_1_node_0"[style=... label=...)
    if line:match("^%s*n%d+ %[label=") or line:match('^%s*"graph_%d+_node_%d+"%s*%[') then
      nodes = nodes + 1
    end
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
  lu.assertStrContains(text, "writes p0 [4, 8] f32: pool block")
  lu.assertStrContains(text, "reads  p1 [4, 8] f32: heap block")
  lu.assertStrContains(text, "reads  p2 [8, 8] f32: heap block")
  lu.assertNotStrContains(text, "n: ")  -- the tensors' shapes say the sizes
end

-- A graphed module's nodes name the op, where it ran (the module path: a
-- child by its name, the type beside it) and the tensors it reads and
-- writes; a backward's nodes name the node whose backward ran them.
function TestDump:test_labels_name_op_module_and_sizes ()
  lu.skipIf(gc.device() ~= "host", "cuda dumps are CUDA's own format")
  local seq = gc.nn.Sequential(gc.nn.Linear(4, 8), gc.nn.ReLU(), gc.nn.Linear(8, 2))
  local g = gc.make_graphed_callables(seq, {gc.ones({3, 4}, {requires_grad = true})},
                                      {num_warmup_iters = 1})
  local prefix = tmpname()
  local paths = g:debug_dump(prefix)
  local fwd, bwd = H.slurp(paths[1]), H.slurp(paths[2])
  for _, p in ipairs(paths) do os.remove(p) end
  lu.assertStrContains(fwd, "#0 matmul\\nlinear in Sequential.0 (Linear)\\n")
  lu.assertStrContains(fwd, "relu in Sequential.1 (ReLU)")
  lu.assertStrContains(fwd, "linear in Sequential.2 (Linear)")
  lu.assertStrContains(fwd, "reads  p1 [3, 4] f32: ")    -- the input
  lu.assertStrContains(fwd, "reads  p2 [8, 4] f32: ")    -- the first weight
  lu.assertStrContains(fwd, "writes p0 [3, 2] f32: ")    -- the output
  lu.assertStrContains(bwd, "backward of linear in Sequential.2 (Linear)")
  lu.assertStrContains(bwd, "backward of relu in Sequential.1 (ReLU)")
  lu.assertStrContains(bwd, "writes p0 [8, 4] f32: ")    -- the first weight's grad
end

-- A stream forked into the capture and joined back: its node is marked, and
-- the join is an edge from it to the node after the join.
function TestDump:test_fork_and_join_edges ()
  lu.skipIf(gc.device() ~= "host", "cuda dumps are CUDA's own format")
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
  H.assert_err(function () g[2]:debug_dump(prefix) end, "entry 2 (callable 2, Linear) was reset")
end

-- Run a Lua script (the text src) with the graphcap program, or with a stock
-- lua5.4 over this tree's module when stock is true; returns its exit code
-- and what it wrote to stderr.
local ROOT = debug.getinfo(1, "S").source:match("^@?(.-)[^/\\]*$") .. "../../"
local function run_script (src, stock)
  local script, errf = tmpname(".lua"), tmpname(".err")
  local f = assert(io.open(script, "w"))
  f:write(src)
  f:close()
  local cmd
  if stock then
    local build = program():match("^(.-)[^/]*$")
    cmd = string.format("GRAPHCAP_DEVICE=%s LUA_PATH=%q LUA_CPATH=%q lua5.4 %q 2>%q", gc.device(),
                        ROOT .. "lua/?.lua;" .. ROOT .. "lua/?/init.lua;;",
                        build .. "lua/?.so;;", script, errf)
  else
    cmd = string.format("%q --device %s %q 2>%q", program(), gc.device(), script, errf)
  end
  local p = io.popen(cmd)
  p:read("a")
  local _, _, code = p:close()
  local err = read_file(errf)
  os.remove(script)
  os.remove(errf)
  return code, err
end

-- Skip the rest of the test when a stock lua5.4 cannot run this tree's
-- module: none installed, or a module built with AddressSanitizer (make
-- asan), which only a program linked with its runtime can load.
local function skip_without_stock_lua ()
  local p = io.popen("command -v lua5.4")
  local path = p:read("a")
  p:close()
  lu.skipIf(path == "", "no lua5.4 here")
  local code, err = run_script("require 'graphcap'", true)
  lu.skipIf(code ~= 0 and err:find("ASan runtime", 1, true), "the module is built with ASan")
  lu.assertEquals(code, 0, err)
end

TestProgress = {}

function TestProgress:test_function_sees_every_pass ()
  local calls = {}
  local mods = linears(2)
  gc.make_graphed_callables(mods, samples(2), {num_warmup_iters = W, progress = function (...)
    calls[#calls + 1] = table.concat({...}, " ")
  end})
  local want = {}
  for i = 1, 2 * 2 * W do want[#want + 1] = "warmup " .. i .. " " .. 2 * 2 * W end
  for i = 1, 4 do want[#want + 1] = "capture " .. i .. " 4" end
  lu.assertEquals(calls, want)
end

-- An error in the progress function stops the call like a hook's: nothing
-- is graphed, the modules train eagerly with their grads as before.
function TestProgress:test_error_aborts_cleanly ()
  local mods = linears(2)
  local before = mods[1].weight:tolist()
  local err = H.assert_err(function ()
    gc.make_graphed_callables(mods, samples(2), {num_warmup_iters = W, progress = function (phase)
      if phase == "capture" then error("stop the graphing") end
    end})
  end, "stop the graphing", HERE)
  lu.assertNotStrContains(err, "traceback")
  lu.assertFalse(gc.is_capturing())
  lu.assertNil(mods[1].weight.grad)
  lu.assertEquals(mods[1].weight:tolist(), before)
  local y = mods[2](mods[1](gc.ones({4, 8})))  -- eager: the modules were not graphed
  y:sum():backward()
  lu.assertNotNil(mods[1].weight.grad)
end

function TestProgress:test_bad_value ()
  H.assert_err(function ()
    gc.make_graphed_callables(linears(1)[1], {gc.ones({4, 8})}, {progress = "yes"})
  end, HERE, "option progress must be a function or a boolean, got string")
end

local PROGRESS_SCRIPT = [[
local gc = require "graphcap"
local m = gc.nn.Linear(4, 4)
gc.make_graphed_callables(m, {gc.ones({2, 4}, {requires_grad = true})}, {progress = true})
]]

-- progress = true: the terminal line, the same from the program and from
-- a stock lua5.4.
function TestProgress:test_true_prints_the_line ()
  local code, err = run_script(PROGRESS_SCRIPT)
  lu.assertEquals(code, 0)
  lu.assertStrContains(err, "\rgraphcap: warmup 6/6\n")
  lu.assertStrContains(err, "\rgraphcap: capture 2/2\n")
  skip_without_stock_lua()
  local code2, err2 = run_script(PROGRESS_SCRIPT, true)
  lu.assertEquals(code2, 0)
  lu.assertEquals(err2, err)
end

-- progress = true draws about ten updates a second, the first and last pass
-- of each phase always: a long graphing does not spend its time writing to
-- the terminal.
function TestProgress:test_line_is_throttled ()
  local code, err = run_script([[
local gc = require "graphcap"
local mods, samples = {}, {}
for i = 1, 80 do
  mods[i] = gc.nn.Linear(4, 4)
  samples[i] = {gc.ones({2, 4}, {requires_grad = true})}
end
gc.make_graphed_callables(mods, samples, {num_warmup_iters = 3, progress = true})
]])
  lu.assertEquals(code, 0, err)
  lu.assertStrContains(err, "\rgraphcap: warmup 1/480")
  lu.assertStrContains(err, "\rgraphcap: warmup 480/480\n")
  lu.assertStrContains(err, "\rgraphcap: capture 1/160")
  lu.assertStrContains(err, "\rgraphcap: capture 160/160\n")
  local _, lines = err:gsub("\rgraphcap: ", "")
  lu.assertTrue(lines < 60, lines .. " updates of 640 passes")
end

TestHeadlines = {}

-- Each call fails naming this file's line, the function the user called,
-- and nothing of the facade ('make', graphcap:NN).
function TestHeadlines:test_user_line_and_names ()
  local lin = gc.nn.Linear(2, 2)
  local cases = {
    {function () local t = gc.zeros("x"); return t end, "zeros: shape must be a table"},
    {function () local t = gc.ones({2, -1}); return t end, "ones: shape entry #2"},
    {function () local t = gc.randn({2}, {dtype = "f64"}); return t end, "randn: unknown dtype 'f64'"},
    {function () local t = gc.rand({2}, "f16"); return t end, "rand: unknown dtype 'f16'"},
    {function () local t = gc.empty({1, 1, 1, 1, 1}); return t end, "empty: shape has 5 entries"},
    {function () local t = gc.full({2}, "a"); return t end, "full: the fill value must be a number"},
    {function () local t = gc.tensor({1, "a"}); return t end, "tensor: entry [2] must be a number"},
    {function () local t = gc.tensor({{1}, 2}); return t end, "tensor: entry [2] must be a table"},
    {function () local t = gc.tensor(true); return t end, "tensor: data must be a number or"},
    {function () local t = gc.ones({2}):view({3}); return t end, "view: cannot view"},
    {function () local r = gc.make_graphed_callables(lin, {gc.ones({2, 2})}, {bogus = 1}); return r end,
     "make_graphed_callables: unknown option 'bogus'"},
    {function () local r = gc.Graph():capture(function () end, {pool = 3}); return r end,
     "Graph:capture: option pool must be a Pool, got number"},
    {function () local r = gc.with_stream(3, function () end); return r end,
     "with_stream: s must be a Stream, got number"},
    {function () local r = gc.ones({2}, {requires_grad = true}):backward(3); return r end,
     "backward: grad must be a Tensor, got number"},
    {function () local r = gc.no_grad(3); return r end, "no_grad: fn must be a function"},
    {function () local r = gc.enable_grad(3); return r end, "enable_grad: fn must be a function"},
  }
  for i, c in ipairs(cases) do
    local ok, msg = pcall(c[1])
    lu.assertFalse(ok, "case " .. i)
    msg = tostring(msg)
    lu.assertStrContains(msg, HERE .. ":")
    lu.assertStrContains(msg, c[2])
    lu.assertNotStrContains(msg, "'make'")
    lu.assertNotStrContains(msg, "graphcap:")
    lu.assertNotStrContains(msg, "graphcap/")
    lu.assertNotStrContains(msg, "traceback")
  end
  -- called by pcall itself: the line of the pcall
  local ok, msg = pcall(gc.zeros, {-1})
  lu.assertFalse(ok)
  lu.assertStrContains(msg, HERE .. ":")
  lu.assertStrContains(msg, "zeros: shape entry #1")
end

-- A hook returning a value: the user's call, the hook and where it is defined.
function TestHeadlines:test_hook_return_names_its_definition ()
  local line = debug.getinfo(1, "l").currentline + 1
  local hook = function () return 1 end
  local msg = H.assert_err(function ()
    gc.make_graphed_callables(linears(1), samples(1),
                              {capture_time_hooks = {{forward_hooks = {hook}}}})
  end, "capture_time_hooks forward_hooks must not return a value",
       "defined at " .. debug.getinfo(1, "S").short_src .. ":" .. line)
  lu.assertStrContains(msg, HERE .. ":")
  lu.assertNotStrContains(msg, "traceback")
  msg = H.assert_err(function ()
    gc.make_graphed_callables(linears(1), samples(1), {pre_warmup_hook = hook})
  end, "pre_warmup_hook must not return a value", "defined at ")
  lu.assertStrContains(msg, HERE .. ":")
end

local HOOK_ERROR_SCRIPT = [[
local gc = require "graphcap"
local m = gc.nn.Linear(4, 4)
local function my_hook () error("my hook failed") end
gc.make_graphed_callables(m, {gc.ones({2, 4}, {requires_grad = true})},
                          {capture_time_hooks = {{forward_hooks = {my_hook}}}})
]]

-- An error in a hook, uncaught: the message with the hook's line, and one
-- traceback, from the program and from a stock lua5.4.
function TestHeadlines:test_one_traceback ()
  local function check (code, err)
    lu.assertEquals(code, 1)
    lu.assertStrContains(err, ":3: my hook failed")
    local _, n = err:gsub("stack traceback:", "")
    lu.assertEquals(n, 1, err)
    lu.assertStrContains(err, ":4: in main chunk")  -- the user's call
  end
  check(run_script(HOOK_ERROR_SCRIPT))
  skip_without_stock_lua()
  check(run_script(HOOK_ERROR_SCRIPT, true))
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
