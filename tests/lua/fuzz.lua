-- fuzz.lua: what the fuzzers share (not a suite; require "fuzz"): the seed
-- and budget from the environment, and a seeded generator.
--   GRAPHCAP_FUZZ_SEED   the seed (default 1; `make fuzz` passes a new one)
--   GRAPHCAP_FUZZ_ITERS  the budget: operations or cases (each fuzzer has its default)
-- A failure message names the seed and the case, so that
--   GRAPHCAP_FUZZ_SEED=s LUA_PATH='tests/lua/?.lua;;' build/graphcap tests/lua/test_fuzz_*.lua
-- reproduces it.

local F = {}

F.seed = math.tointeger(tonumber(os.getenv("GRAPHCAP_FUZZ_SEED") or "1")) or 1

function F.budget (default)
  return math.tointeger(tonumber(os.getenv("GRAPHCAP_FUZZ_ITERS") or "")) or default
end

-- A generator of its own, seeded: F.rng(salt) -> r; r(n) in 1..n, r() in [0, 1).
function F.rng (salt)
  local st = (F.seed * 1103515245 + (salt or 0) * 2654435761 + 12345) & 0x7fffffffffffffff
  return function (n)
    st = (st * 6364136223846793005 + 1442695040888963407) & 0xffffffffffffffff
    local x = (st >> 11) / (1 << 53)
    if n then return 1 + math.floor(x * n) end
    return x
  end
end

-- Print the seed before the run, so that a crash's log has it too.
function F.announce (what)
  io.stdout:write(string.format("# GRAPHCAP_FUZZ_SEED=%d GRAPHCAP_FUZZ_ITERS: %s\n", F.seed, what))
  io.stdout:flush()
end

-- One entry of the list t.
function F.pick (r, t)
  return t[r(#t)]
end

return F
