-- harness.lua: the tests of tests/dist, run on every rank under mpirun
-- (tests/run.sh: -np 2, and -np 4 --oversubscribe). Each test runs
-- on every rank; rank 0 prints "ok N - name" (TAP) once every rank has
-- finished it. A failing check raises an error, which the graphcap program
-- reports with the rank and turns into the end of the whole job (non-zero
-- exit status): a failure never leaves the other ranks waiting, and the
-- tests after it do not run.
--   local T = require "harness"      (tests/run.sh puts tests/dist on LUA_PATH)
--   T.test("name", function () ... end) ... T.done()

local gc = require "graphcap"

local T = {}
local count = 0

-- Run fn as test 'name' on every rank.
function T.test (name, fn)
  fn()
  gc.dist.barrier()
  count = count + 1
  if gc.dist.rank() == 0 then
    io.stdout:write(string.format("ok %d - %s\n", count, name))
    io.stdout:flush()
  end
end

function T.done ()
  gc.dist.barrier()
  if gc.dist.rank() == 0 then io.stdout:write(string.format("1..%d\n", count)) end
end

-- The last test, 'name', which may finalize: no barrier after it; then done.
function T.final (name, fn)
  local rank = gc.dist.rank()
  fn()
  count = count + 1
  if rank == 0 then io.stdout:write(string.format("ok %d - %s\n1..%d\n", count, name, count)) end
end

-- The elements of t, flattened, as a sequence.
function T.flat (t)
  local out = {}
  local function walk (v)
    if type(v) == "table" then for _, x in ipairs(v) do walk(x) end
    else out[#out + 1] = v end
  end
  walk(t:tolist())
  return out
end

-- Raise 'rank R: what: ...' unless the elements of t equal want (a
-- sequence) exactly.
function T.eq (t, want, what)
  local got = T.flat(t)
  if #got ~= #want then
    error(string.format("%s: %d elements, expected %d", what, #got, #want), 2)
  end
  for i = 1, #want do
    if got[i] ~= want[i] then
      error(string.format("%s: element %d is %.9g, expected %.9g", what, i, got[i], want[i]), 2)
    end
  end
end

-- The same within |got - want| <= atol + rtol * |want|.
function T.near (t, want, what, atol, rtol)
  local got = T.flat(t)
  assert(#got == #want, what .. ": element count")
  for i = 1, #want do
    if math.abs(got[i] - want[i]) > atol + rtol * math.abs(want[i]) then
      error(string.format("%s: element %d is %.9g, expected %.9g", what, i, got[i], want[i]), 2)
    end
  end
end

-- Raise unless fn() fails with a message containing each of the plain
-- strings of 'parts'.
function T.fails (fn, parts, what)
  local ok, err = pcall(fn)
  if ok then error(what .. ": no error", 2) end
  for _, p in ipairs(parts) do
    if not tostring(err):find(p, 1, true) then
      error(string.format("%s: the error '%s' does not say '%s'", what, tostring(err), p), 2)
    end
  end
  return err
end

return T
