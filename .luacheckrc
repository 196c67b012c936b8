-- luacheck's settings (make lint): the Lua sources, as Lua 5.4 runs them, built as Lua's own
-- makefile and Debian build it (LUA_COMPAT_5_3), which keeps 5.2's math.tanh and its kin.
stds.compat_math = {
  read_globals = {math = {fields = {"cosh", "sinh", "tanh", "pow", "frexp", "ldexp", "log10"}}},
}
std = "lua54+compat_math"
-- Hooks, host twins and other callbacks take the arguments their callers pass, used or not.
unused_args = false
ignore = {
  "432/self", -- a method defined inside another one (a test's module class) has its own self
  "581",      -- not (a <= b) is true where a or b is NaN, a <= b false: a check that NaN fails
}
-- LuaUnit runs the global tables whose names start with Test.
files["tests"] = {ignore = {"11[123]/Test.*"}}
