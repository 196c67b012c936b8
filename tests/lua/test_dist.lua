-- test_dist.lua: gc.dist as whole programs: a script at world size 1 without
-- mpirun (on this run's backend: on cuda, NCCL with one rank), a script that
-- never calls gc.dist needing no MPI, and a job where one rank fails while
-- the other waits in a collective: it ends with a non-zero status and that
-- rank's message, never hangs (a time limit makes a hang a failure). In a
-- build without MPI, init's error says so.
--   LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_dist.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"

local H = require "helpers"
local prog, quote, slurp = H.program, H.quote, H.slurp

-- Run the shell command line 'cmd' with the Lua source 'src' as its script
-- (the word SCRIPT in cmd), at most 'limit' seconds; stdout, stderr, status.
local function run (cmd, src, limit)
  local script, outf, errf = os.tmpname(), os.tmpname(), os.tmpname()
  local f = assert(io.open(script, "wb"))
  f:write(src)
  f:close()
  cmd = cmd:gsub("SCRIPT", quote(script))
  local _, _, code = H.execute(string.format("timeout -k 5 %d %s </dev/null >%s 2>%s", limit,
                                            cmd, outf, errf), {outf, errf})
  os.remove(script)
  return slurp(outf), slurp(errf), code
end

-- mpirun with the flags a test job needs (as root: --allow-run-as-root), or
-- nil when there is none.
local function mpirun ()
  if not os.execute("command -v mpirun >/dev/null 2>&1") then return nil end
  local p = io.popen("id -u")
  local root = p:read("l") == "0"
  p:close()
  return "mpirun --oversubscribe" .. (root and " --allow-run-as-root" or "")
end

local device = gc.device()
local program = quote(prog) .. " --device " .. device .. " SCRIPT"

TestDist = {}

function TestDist.test_world_size_one_without_mpirun ()
  if not gc.dist.is_available() then
    local _, err, code = run(program, [[
      local gc = require "graphcap"
      gc.dist.init()]], 60)
    lu.assertNotEquals(code, 0)
    lu.assertStrContains(err, "init: graphcap was built without MPI")
    return
  end
  local out, err, code = run(program, [[
    local gc = require "graphcap"
    assert(not gc.dist.is_initialized())
    gc.dist.init()
    assert(gc.dist.rank() == 0 and gc.dist.world_size() == 1 and gc.dist.local_rank() == 0)
    local t = gc.tensor({1.5, -2, 3})
    gc.dist.all_reduce(t, {op = "avg"})
    local out = gc.zeros({3})
    gc.dist.all_gather(out, t)
    local rs = gc.zeros({3})
    gc.dist.reduce_scatter(rs, out, {op = "max"})
    gc.dist.broadcast(rs, 0)
    local x, y = gc.ones({3}), nil
    local g = gc.Graph()
    g:capture(function () y = x * 2; gc.dist.all_reduce(y) end)
    x:fill_(4)
    g:replay()
    gc.dist.barrier()
    print(table.concat(rs:tolist(), " "), table.concat(y:tolist(), " "))
  ]], 60)
  lu.assertEquals({out, err, code}, {"1.5 -2.0 3.0\t8.0 8.0 8.0\n", "", 0})
end

function TestDist.test_no_dist_no_mpi ()
  local out, err, code = run(program, [[
    local gc = require "graphcap"
    print(gc.dist.is_initialized(), (gc.ones({2}) * 3):sum():item())
  ]], 60)
  lu.assertEquals({out, err, code}, {"false\t6.0\n", "", 0})
end

function TestDist.test_a_failing_rank_ends_the_job ()
  local mr = mpirun()
  if not gc.dist.is_available() or mr == nil then lu.skip("built without MPI, or no mpirun") end
  local t0 = os.time()
  local out, err, code = run(mr .. " -np 2 " .. quote(prog) .. " --device host SCRIPT", [[
    local gc = require "graphcap"
    gc.dist.init()
    local t = gc.ones({4})
    if gc.dist.rank() == 1 then
      gc.dist.all_gather(gc.zeros({3}), t)  -- wrong size: rank 1 fails
    end
    gc.dist.all_reduce(t)                   -- rank 0 waits here for rank 1
    print("not reached")
  ]], 60)
  lu.assertNotEquals(code, 0)
  lu.assertNotEquals(code, 124, "the job hung until the time limit")
  lu.assertStrContains(err, "graphcap: rank 1: ")
  lu.assertStrContains(err, "all_gather: out has 3 elements, expected 8")
  lu.assertNotStrContains(out, "not reached")
  lu.assertTrue(os.time() - t0 < 50)
end

-- os.exit(3) on one rank while the other waits in a collective: the job
-- ends with that rank named (exit's finalize waited for ever for the other)
function TestDist.test_os_exit_failing_on_one_rank_ends_the_job ()
  local mr = mpirun()
  if not gc.dist.is_available() or mr == nil then lu.skip("built without MPI, or no mpirun") end
  local out, err, code = run(mr .. " -np 2 " .. quote(prog) .. " --device host SCRIPT", [[
    local gc = require "graphcap"
    gc.dist.init()
    if gc.dist.rank() == 1 then os.exit(3) end
    gc.dist.all_reduce(gc.ones({4}))  -- rank 0 waits here for rank 1
    print("not reached")
  ]], 30)
  lu.assertNotEquals(code, 124, "the job hung until the time limit")
  lu.assertNotEquals(code, 0)
  lu.assertStrContains(err, "graphcap: rank 1: os.exit(3)")
  lu.assertNotStrContains(out, "not reached")
end

-- Debug mode on rank 0 only: rank 0 exchanges descriptors where the others
-- send their tensors. A small tensor: rank 0 names the ranks that are not in
-- debug mode (it once decoded their floats as a call of finalize). A large
-- one (past a descriptor's size): MPI truncates rank 0's exchange, and the
-- other ranks find its descriptor in place of a tensor; either error says
-- rank 0 is in debug mode. Then send/recv, where the peer is not in debug
-- mode. Each job ends with an error, never hangs.
function TestDist.test_debug_mode_on_one_rank_only ()
  local mr = mpirun()
  if not gc.dist.is_available() or mr == nil then lu.skip("built without MPI, or no mpirun") end
  local function job (np, body)
    local out, err, code = run(mr .. " -np " .. np .. " " .. quote(prog) .. " --device host SCRIPT",
                               [[
      local gc = require "graphcap"
      gc.dist.init()
      local rank = gc.dist.rank()
      if rank == 0 then gc.dist.set_debug(true) end
    ]] .. body .. [[
      print("not reached")
    ]], 30)
    lu.assertNotEquals(code, 124, "the job hung until the time limit")
    lu.assertNotEquals(code, 0)
    lu.assertNotStrContains(out, "not reached")
    lu.assertNotStrContains(err, "called finalize")
    lu.assertStrContains(err, "call gc.dist.set_debug(true) on every rank")
    return err
  end
  local small = "gc.dist.all_reduce(gc.ones({4}))"
  lu.assertStrContains(job(2, small), ":5: all_reduce: rank 1 of the group "
                       .. "is not in debug mode and rank 0 is (it called all_reduce(sum) f32 [4])")
  lu.assertStrContains(job(4, small), "all_reduce: ranks 1, 2, 3 of the group are not in debug "
                       .. "mode and rank 0 is")
  for _, np in ipairs{2, 4} do
    lu.assertStrContains(job(np, "gc.dist.all_reduce(gc.ones({64}))"), "rank 0 is in debug mode")
  end
  local recv = "if rank == 1 then gc.dist.send(gc.ones({4}), 0) elseif rank == 0 then "
               .. "gc.dist.recv(gc.zeros({4}), 1) end gc.dist.barrier()"
  lu.assertStrContains(job(2, recv), "recv: its peer rank 1 is not in debug mode and rank 0 is "
                       .. "(it called recv f32 [4])")
end

os.exit(lu.LuaUnit.run(), true)
