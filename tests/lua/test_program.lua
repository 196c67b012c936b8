-- test_program.lua: the graphcap program's options, as lua's: a script from
-- standard input ('-', or none with stdin not a terminal), -e and -l run in
-- order before the script, -l g=mod, -E, -W, -i, '--', bad options, a bad
-- device in one line, and --device cuda / GRAPHCAP_DEVICE=cuda failing where
-- no GPU answers.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_program.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"

local H = require "helpers"
local prog, quote, slurp = H.program, H.quote, H.slurp

-- Run the program with the shell words 'args' (quoted here), 'input' on its
-- standard input and 'env' (a string of NAME=value words) in its environment,
-- which has no LUA_INIT nor version-specific paths of the caller's; return
-- stdout, stderr and the exit code.
local function run (args, input, env)
  local words = {}
  for i, a in ipairs(args) do words[i] = quote(a) end
  local inf, outf, errf = os.tmpname(), os.tmpname(), os.tmpname()
  local f = assert(io.open(inf, "wb"))
  f:write(input or "")
  f:close()
  local cmd = string.format("env -u LUA_INIT -u LUA_INIT_5_4 -u LUA_PATH_5_4 -u LUA_CPATH_5_4 " ..
                            "%s %s %s <%s >%s 2>%s", env or "", quote(prog),
                            table.concat(words, " "), inf, outf, errf)
  local _, _, code = os.execute(cmd)
  os.remove(inf)
  return slurp(outf), slurp(errf), code
end

local function write_tmp (src)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(src)
  f:close()
  return path
end

TestProgram = {}

function TestProgram.test_dash_reads_stdin ()
  local out, err, code = run({"-", "a", "b"}, "print(1 + 1, ...)")
  lu.assertEquals({out, err, code}, {"2\ta\tb\n", "", 0})
end

function TestProgram.test_no_script_reads_stdin_when_not_a_terminal ()
  local out, err, code = run({}, "print(#arg, 6 * 7)")
  lu.assertEquals({out, err, code}, {"0\t42\n", "", 0})
end

function TestProgram.test_e_and_l_run_in_order_before_the_script ()
  local script = write_tmp("print(x, s.upper('b'), type(string))")
  local out, err, code = run({"-e", "x = 1", "-l", "s=string", "-ex = x + 1", script})
  os.remove(script)
  lu.assertEquals({out, err, code}, {"2\tB\ttable\n", "", 0})
end

function TestProgram.test_l_sets_the_global_named_after_the_module ()
  local out, _, code = run({"-lstring", "-l", "g=graphcap", "-e",
                            "print(string.rep('a', 2), g.tensor({3}):item())"})
  lu.assertEquals({out, code}, {"aa\t3.0\n", 0})
end

function TestProgram.test_l_of_a_missing_module_fails ()
  local out, err, code = run({"-l", "no_such_module", "-e", "print('ran')"})
  lu.assertEquals({out, code}, {"", 1})
  lu.assertStrContains(err, "module 'no_such_module' not found")
end

function TestProgram.test_E_ignores_lua_init_and_lua_path ()
  local env = "LUA_INIT='x = 5' LUA_PATH='/nowhere/?.lua'"
  local code_ = "print(x, package.path:find('/nowhere', 1, true) ~= nil)"
  lu.assertEquals({run({"-e", code_}, nil, env)}, {"5\ttrue\n", "", 0})
  lu.assertEquals({run({"-E", "-e", code_}, nil, env)}, {"nil\tfalse\n", "", 0})
end

function TestProgram.test_W_turns_warnings_on ()
  lu.assertEquals({run({"-e", "warn('careful')"})}, {"", "", 0})
  lu.assertEquals({run({"-W", "-e", "warn('careful')"})}, {"", "Lua warning: careful\n", 0})
end

function TestProgram.test_i_evaluates_lines_with_a_prompt ()
  local input = "x = 3\nx * 2\nfor i = 1, 2 do\nio.write(i, ' ')\nend\n=x + 1\n"
  local out, err, code = run({"-i", "-e", "y = 1"}, input)
  lu.assertEquals({err, code}, {"", 0})
  lu.assertStrMatches(out, "graphcap [%d.]+ %(Lua 5%.4[%d.]*%)\n> > 6\n> >> >> 1 2 > 4\n> \n")
end

function TestProgram.test_i_reports_an_error_and_goes_on ()
  local out, err, code = run({"-i"}, "error('boom')\nprint('after')\n")
  lu.assertEquals(code, 0)
  lu.assertStrContains(out, "after\n")
  lu.assertStrContains(err, "stdin:1: boom")
end

function TestProgram.test_double_dash_ends_the_options ()
  local script = write_tmp("print(...)")
  local out, err, code = run({"-e", "io.write('e ')", "--", script, "-e", "x"})
  os.remove(script)
  lu.assertEquals({out, err, code}, {"e -e\tx\n", "", 0})
end

function TestProgram.test_bad_options_fail_with_the_usage ()
  local out, err, code = run({"-x"})
  lu.assertEquals({out, code}, {"", 1})
  lu.assertStrContains(err, "unrecognized option '-x'\nusage: ")
  out, err, code = run({"-e"})
  lu.assertEquals({out, code}, {"", 1})
  lu.assertStrContains(err, "'-e' needs an argument")
end

-- A device that is none, named by --device or by GRAPHCAP_DEVICE, is one
-- line, before any code runs.
function TestProgram.test_bad_device_is_one_line ()
  lu.assertEquals({run({"--device", "gpu", "-e", "print('ran')"})},
                  {"", "graphcap: --device must be host or cuda, got 'gpu'\n", 1})
  lu.assertEquals({run({"-e", "print('ran')"}, nil, "GRAPHCAP_DEVICE=gpu")},
                  {"", "graphcap: GRAPHCAP_DEVICE must be host or cuda, got 'gpu'\n", 1})
  lu.assertEquals({run({"-e", "require 'graphcap'"}, nil, "GRAPHCAP_DEVICE=gpu")},
                  {"", "graphcap: GRAPHCAP_DEVICE must be host or cuda, got 'gpu'\n", 1})
  -- --device wins over the environment; an empty GRAPHCAP_DEVICE is the default
  lu.assertEquals({run({"--device", "host", "-e", "print('ran')"}, nil, "GRAPHCAP_DEVICE=gpu")},
                  {"ran\n", "", 0})
  lu.assertEquals({run({"-e", "print('ran')"}, nil, "GRAPHCAP_DEVICE=")}, {"ran\n", "", 0})
end

-- Asked for cuda where there is none, the program stops before running any
-- code (a script that never touched a tensor would otherwise run on no device
-- at all, and one that did would fail halfway).
function TestProgram.test_device_cuda_without_a_gpu_is_an_error ()
  if gc.cuda_available() then
    lu.assertEquals({run({"--device", "cuda", "-e", "print(require('graphcap').device())"})},
                    {"cuda\n", "", 0})
    return
  end
  local out, err, code = run({"--device", "cuda", "-e", "print('ran')"})
  lu.assertEquals({out, code}, {"", 1})
  lu.assertStrMatches(err, "graphcap: %-%-device cuda: [^\n]*\n")
  lu.assertTrue(err:find("no CUDA GPU is visible", 1, true) ~= nil
                or err:find("no cuda backend", 1, true) ~= nil, err)
  out, err, code = run({"-e", "print('ran')"}, nil, "GRAPHCAP_DEVICE=cuda")
  lu.assertEquals({out, code}, {"", 1})
  lu.assertStrContains(err, "graphcap: GRAPHCAP_DEVICE=cuda: ")
  -- --device host wins over the environment
  lu.assertEquals({run({"--device", "host", "-e", "print('ran')"}, nil, "GRAPHCAP_DEVICE=cuda")},
                  {"ran\n", "", 0})
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
