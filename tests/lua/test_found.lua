-- test_found.lua: regressions for what fault injection and the fuzzers
-- found outside the defects already filed (each names its finder). Those
-- that are undefined behaviour fail under `make asan` (UBSan) only.
--   build/graphcap tests/lua/test_found.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = dofile(debug.getinfo(1, "S").source:match("^@?(.-)[^/\\]*$") .. "helpers.lua")

TestFound = {tearDown = H.no_capture_left}

-- API fuzzer: graphing callables that have no parameter with no sample
-- tensor sorted an empty (NULL) list with qsort (UB). The call must fail
-- cleanly (ReLU needs its input) and the same with a tensor then work.
function TestFound:test_graphing_with_no_tensor_at_all ()
  H.assert_err(function () gc.make_graphed_callables({gc.nn.ReLU()}, {{}}) end,
               "expected 1 input, got 0")
  local G = gc.make_graphed_callables({gc.nn.ReLU()}, {{gc.randn({2, 2})}})
  lu.assertEquals(G[1](gc.tensor({{-1, 2}, {3, -4}})):tolist(), {{0, 2}, {3, 0}})
end

os.exit(lu.LuaUnit.run(), true) -- closing the state frees the engine: nothing is left for a leak check
