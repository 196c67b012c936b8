-- test_graphed_badid.lua: ids that name no row, given to a graph. Eagerly,
-- embedding and cross_entropy refuse such an id before they launch; a
-- graph's ids are data of each replay, so its kernel gives the row NaN, drops
-- its grad and notes the id, and the engine raises the eager message, naming
-- the graph and its replays, at the next replay or synchronization (on host,
-- where a replay runs at once, from the replay itself). The error is raised
-- once; the graph and the graphed callable stay usable.
--   build/graphcap tests/lua/test_graphed_badid.lua -o tap

local lu = require "luaunit"
local gc = require "graphcap"
local H = require "helpers"

-- Run f, then synchronize (where the error of an asynchronous replay shows);
-- its error message must hold every string given.
local function raises (f, ...)
  return H.assert_err(function () f(); gc.synchronize() end, ...)
end

-- An Embedding(5, 3) graphed on ids [2, 3], and its eager twin.
local function embeddings ()
  gc.manual_seed(3)
  local eager = gc.nn.Embedding(5, 3)
  gc.manual_seed(3)
  local graphed = gc.nn.Embedding(5, 3)
  local G = gc.make_graphed_callables(graphed, {gc.tensor({{0, 1, 2}, {3, 4, 0}})})
  return eager, G
end

TestGraphedBadId = {tearDown = H.no_capture_left}

function TestGraphedBadId:test_embedding_in_a_graphed_call ()
  local eager, G = embeddings()
  local good, bad = gc.tensor({{4, 1, 0}, {2, 2, 3}}), gc.tensor({{4, 1, 0}, {2, 7, 3}})
  H.assert_err(function () return eager(bad) end,
               "embedding: the id at 5 (counting from 1) is 7, not a row of the weight (an "
               .. "integer in 0..4)")
  raises(function () G(bad):sum():backward() end,
         "embedding: the id at 5 (counting from 1) is 7, not a row of the weight (an integer in "
         .. "0..4), in a replay of graph 'forward of entry 1' (found after its replay ",
         "its row is NaN and its grad dropped")
  -- raised once: the next call with good ids gives eager's values and grads
  G.weight.grad, eager.weight.grad = nil, nil
  local y, want = G(good), eager(good)
  H.assert_bitwise(y:tolist(), want:tolist(), "values after the error")
  y:sum():backward()
  want:sum():backward()
  H.assert_bitwise(G.weight.grad:tolist(), eager.weight.grad:tolist(), "grads after the error")
  gc.synchronize()
end

-- NaN, negative and fractional ids are refused as eagerly.
function TestGraphedBadId:test_every_kind_of_bad_id ()
  local _, G = embeddings()
  for _, case in ipairs({{0 / 0, "is NaN"}, {-1, "is -1"}, {2.5, "is 2.5"}, {5, "is 5"}}) do
    raises(function () G(gc.tensor({{0, 1, 2}, {3, case[1], 0}})) end,
           "the id at 5 (counting from 1) " .. case[2] .. ", not a row of the weight")
  end
end

-- The first bad id of a replay is named, also when the error shows only at a
-- read-back (item, tolist) after several calls.
function TestGraphedBadId:test_first_bad_id_at_a_read_back ()
  local _, G = embeddings()
  local bad = gc.tensor({{9, 1, 0}, {2, 8, 3}})
  local ok, err = pcall(function ()
    local y = G(bad)
    return y:sum():item()
  end)
  lu.assertFalse(ok)
  lu.assertStrContains(err, "the id at 1 (counting from 1) is 9")
  lu.assertNotStrContains(err, "is 8")
end

-- A Linear(4, 3) and the cross entropy of its output.
local Loss = gc.nn.Module("Loss")
function Loss:init () self.lin = gc.nn.Linear(4, 3) end
function Loss:forward (x, target) return gc.F.cross_entropy(self.lin(x), target) end

function TestGraphedBadId:test_cross_entropy_targets_at_replay ()
  gc.manual_seed(5)
  local loss_of = Loss()
  gc.manual_seed(5)
  local G = Loss()
  local x = gc.randn({2, 4}, {requires_grad = true})
  gc.make_graphed_callables(G, {x, gc.tensor({0, 2})})
  H.assert_err(function () return loss_of(x, gc.tensor({1, 3})) end,
               "cross_entropy: the target of row 2 (counting from 1) is 3, not a class id (an "
               .. "integer in 0..2)")
  raises(function () G(x, gc.tensor({1, 3})):backward() end,
         "cross_entropy: the target of row 2 (counting from 1) is 3, not a class id (an integer "
         .. "in 0..2), in a replay of graph 'forward of entry 1'", "that row's loss is NaN")
  local want = loss_of(x, gc.tensor({1, 2})):item()
  lu.assertEquals(G(x, gc.tensor({1, 2})):item(), want)
end

-- A graph of the user's own, with its ids a static input.
function TestGraphedBadId:test_own_graph ()
  local w = gc.randn({4, 2})
  local ids = gc.tensor({0, 1, 2})
  local y
  local g = gc.Graph()
  g:capture(function () y = gc.F.embedding(ids, w) end)
  ids:copy_(gc.tensor({3, 4, 1}))
  raises(function () g:replay() end,
         "embedding: the id at 2 (counting from 1) is 4, not a row of the weight (an integer in "
         .. "0..3), in a replay of graph", "(found after its replay 1)")
  ids:copy_(gc.tensor({3, 0, 1}))
  g:replay()
  lu.assertEquals(y:tolist(), gc.F.embedding(ids, w):tolist())
  -- a graph freed before the error is seen is named as such
  ids:copy_(gc.tensor({5, 0, 1}))
  local ok, err = pcall(function () g:replay() end)
  if ok then -- the replay ran asynchronously: the error comes with the next synchronization
    g:close()
    ok, err = pcall(gc.synchronize)
    lu.assertFalse(ok)
    lu.assertStrContains(err, "in a replay of a graph freed since")
  else
    lu.assertStrContains(err, "is 5")
  end
end
os.exit(lu.LuaUnit.run(), true)
