#!/usr/bin/env bash
# Check graphcap as users get it once installed, from outside the source tree:
#
#   scripts/check-install.sh             into a temporary prefix (make install PREFIX=...)
#   scripts/check-install.sh --default   into the default prefix, /usr/local (needs root)
#
# After `make install`: a stock lua5.4 requires graphcap from another directory
# and computes with it; examples/embed and README's C example build with
# README's two pkg-config commands, as written there, against the installed
# copy (libgraphcap.so, and libgraphcap.a through graphcap-static), and run;
# the installed program runs an example. Then
# `make uninstall` leaves nothing behind. With a temporary prefix, README's
# LuaRocks commands (luarocks make from the checkout) run as written there,
# into a tree of their own, and the install is checked the same way.
#
# Needs lua5.4, pkg-config and luarocks (a temporary prefix). Exit 1 on the
# first failure, naming the check.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
src=$PWD

default=0
case "${1-}" in
  "") ;;
  --default) default=1 ;;
  *)
    echo "usage: $0 [--default]" >&2
    exit 2
    ;;
esac

for tool in lua5.4 pkg-config cc; do
  if ! command -v "$tool" >/dev/null; then
    echo "check-install: $tool not found" >&2
    exit 1
  fi
done
if [ $default = 0 ] && ! command -v luarocks >/dev/null; then
  echo "check-install: luarocks not found (apt-get install luarocks)" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/elsewhere"

if [ $default = 1 ]; then
  prefix=/usr/local
  make_args=()
else
  prefix=$tmp/prefix
  make_args=(PREFIX="$prefix")
fi

step() { echo "check-install: $*"; }

# The commands of README.md's first ```sh block that contains WORD, comments
# dropped, one a line (as .ci/run reads the set-up commands).
readme_sh() {
  awk -v w="$1" '/^```sh$/ { on = 1; blk = ""; found = 0; next }
    on && /^```/ { if (found) { printf "%s", blk; exit } on = 0; next }
    on { sub(/[ \t]*#.*/, ""); if ($0 != "") { blk = blk $0 "\n"; if (index($0, w)) found = 1 } }
  ' README.md
}
fail() {
  echo "check-install: FAILED: $*" >&2
  exit 1
}

step "make install ${make_args[*]}"
make -s install "${make_args[@]}" >"$tmp/install.log" 2>&1 || {
  cat "$tmp/install.log" >&2
  fail "make install"
}

# The Lua module: a stock lua5.4, from another directory; with a prefix of its
# own, once LUA_PATH and LUA_CPATH name its folders.
lua_env=()
if [ $default = 0 ]; then
  lua_env=(LUA_PATH="$prefix/share/lua/5.4/?.lua;$prefix/share/lua/5.4/?/init.lua;;"
    LUA_CPATH="$prefix/lib/lua/5.4/?.so;;")
fi
lua_check='
local gc = require "graphcap"
local x = gc.tensor({{1, 2}, {3, 4}})
local g, y = gc.Graph()
g:capture(function () y = (x * 2):sum() end)
x:copy_(gc.tensor({{1, 1}, {1, 1}}))
g:replay()
assert(y:item() == 8, "graphed sum: " .. y:item())
io.write(package.searchpath("graphcap.core", package.cpath), "\n")'
step "stock lua5.4 requires graphcap from another directory"
core=$(cd "$tmp/elsewhere" && env "${lua_env[@]}" lua5.4 -e "$lua_check") ||
  fail "lua5.4 require \"graphcap\""
[ "$core" = "$prefix/lib/lua/5.4/graphcap/core.so" ] ||
  fail "lua5.4 loaded graphcap.core from $core, not from $prefix"

# C: README's commands, against the installed copy only (pkg-config's path
# is the prefix's alone): `cc -o prog prog.c $(pkg-config ...)`, the first
# linking libgraphcap.so, the second libgraphcap.a.
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
mapfile -t cc_cmds < <(readme_sh "pkg-config --cflags")
[ ${#cc_cmds[@]} -eq 2 ] || fail "README.md has not its two pkg-config build commands"
run_env=()
[ $default = 1 ] || run_env=(LD_LIBRARY_PATH="$prefix/lib")

# readme_cc I NAME SOURCE...: README's command I with SOURCE... for prog.c, the
# program written to tmp/NAME.
readme_cc() {
  local cmd=${cc_cmds[$1]} exe
  exe=$(printf '%q' "$tmp/$2")
  shift 2
  cmd=${cmd/ prog.c / $(printf '%q ' "$@")}
  cmd=${cmd/-o prog /-o $exe }
  bash -c "$cmd"
}

# build_and_run NAME SOURCE...: build with both commands, check which library
# each loads, run both.
build_and_run() {
  local name=$1
  shift
  step "$name: ${cc_cmds[0]}"
  readme_cc 0 "$name" "$@" || fail "$name: ${cc_cmds[0]}"
  step "$name: ${cc_cmds[1]}"
  readme_cc 1 "$name-static" "$@" || fail "$name: ${cc_cmds[1]}"
  local so
  so=$(env "${run_env[@]}" ldd "$tmp/$name" | awk '$1 == "libgraphcap.so.0" { print $3 }')
  [ "$so" -ef "$prefix/lib/libgraphcap.so.0" ] || fail "$name loads libgraphcap from '$so'"
  ! ldd "$tmp/$name-static" | grep libgraphcap >/dev/null ||
    fail "$name-static loads libgraphcap.so: $(ldd "$tmp/$name-static" | grep libgraphcap)"
  (cd "$tmp/elsewhere" && env "${run_env[@]}" "$tmp/$name" >"$tmp/$name.out") ||
    fail "$name (shared) exited non-zero: $(cat "$tmp/$name.out")"
  (cd "$tmp/elsewhere" && "$tmp/$name-static" >"$tmp/$name-static.out") ||
    fail "$name (static) exited non-zero: $(cat "$tmp/$name-static.out")"
}
build_and_run embed "$src"/examples/embed/*.c
# README's C example, as the README shows it (its first ```c block).
awk '/^```c$/ { on = 1; next } /^```/ { if (on) exit } on' README.md >"$tmp/prog.c"
[ -s "$tmp/prog.c" ] || fail "README.md has no C example"
build_and_run readme-example "$tmp/prog.c"

step "the installed program runs examples/basics.lua"
(cd "$tmp/elsewhere" && "$prefix/bin/graphcap" "$src/examples/basics.lua" >"$tmp/basics.out") ||
  fail "$prefix/bin/graphcap examples/basics.lua: $(cat "$tmp/basics.out")"

step "make uninstall ${make_args[*]}"
make -s uninstall "${make_args[@]}" >/dev/null || fail "make uninstall"
if [ $default = 1 ]; then
  for f in include/graphcap.h include/graphcap_types.h lib/libgraphcap.a lib/libgraphcap.so \
    lib/pkgconfig/graphcap.pc lib/pkgconfig/graphcap-static.pc share/lua/5.4/graphcap \
    lib/lua/5.4/graphcap bin/graphcap; do
    [ ! -e "$prefix/$f" ] || fail "make uninstall left $prefix/$f"
  done
else
  left=$(find "$prefix" -type f -o -type l)
  [ -z "$left" ] || fail "make uninstall left: $left"

  # README's tree, /tmp/rocks, becomes one of this run's own.
  tree=$tmp/rocktree
  rocks=$(readme_sh "luarocks ")
  [ -n "$rocks" ] || fail "README.md has no LuaRocks commands"
  rocks=${rocks//\/tmp\/rocks/$tree}
  step "README's LuaRocks commands (luarocks make at the top of the checkout), into $tree"
  bash -c "set -e; $rocks" >"$tmp/rock.log" 2>&1 || {
    cat "$tmp/rock.log" >&2
    fail "README's LuaRocks commands"
  }
  core=$(cd "$tmp/elsewhere" && eval "$(luarocks --lua-version 5.4 --tree "$tree" path)" &&
    lua5.4 -e "$lua_check") || fail "lua5.4 require \"graphcap\" from the LuaRocks tree"
  [ "$core" = "$tree/lib/lua/5.4/graphcap/core.so" ] ||
    fail "lua5.4 loaded graphcap.core from $core, not from the LuaRocks tree"
fi
step "all passed"
