-- The Lua module (require "graphcap"), built by the Makefile, from a checkout:
--   luarocks make                      (into the default tree)
--   luarocks make --tree DIR           (into DIR; `luarocks --tree DIR path` sets the paths)
-- The cuda backend is built in when nvcc is found, as for `make`.
rockspec_format = "3.0"
package = "graphcap"
version = "0.1.0-1"
-- Built from the checkout it sits in (luarocks make); there is no published archive, so
-- `luarocks install` of this file cannot fetch its source.
source = {
  url = "git+file://.",
}
description = {
  summary = "CUDA graph capture for Lua 5.4: make_graphed_callables with capture-time hooks",
  detailed = [[
graphcap captures forward and backward passes into graphs that share one memory
pool and replays each as one launch, as TransformerEngine's make_graphed_callables
does for PyTorch. It runs on NVIDIA GPUs and, as an exact reference, on the host.]],
  license = "MIT",
}
dependencies = {
  "lua >= 5.4, < 5.5",
}
build = {
  type = "make",
  build_target = "lua-module",
  -- SETUP=0: the rock uses the Lua LuaRocks found, and installs no packages.
  build_variables = {
    CFLAGS = "$(CFLAGS)",
    LUA_INCDIR = "$(LUA_INCDIR)",
    SETUP = "0",
  },
  install_target = "install-lua",
  install_variables = {
    LUA_SHAREDIR = "$(LUADIR)",
    LUA_LIBDIR = "$(LIBDIR)",
    SETUP = "0",
  },
}
