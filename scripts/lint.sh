#!/usr/bin/env bash
# Static checks: clang-format (the checked-in .clang-format) on the C, C++ and CUDA
# sources, cppcheck on engine/ and lua/, luacheck (the checked-in .luacheckrc) on the Lua
# sources, shellcheck on the shell scripts, then the layering rules.
# Exit non-zero on any finding. The tools come from `scripts/setup.sh --lint`.
# variableScope is off: like Lua's own source, functions declare their locals first.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

failed=()

# Sources of the given kinds under the given directories (those that exist), NUL-separated.
sources() {
  local dirs=() d
  for d in "${@:2}"; do [ -d "$d" ] && dirs+=("$d"); done
  [ ${#dirs[@]} -gt 0 ] || return 0
  local names=() ext
  for ext in $1; do names+=(-o -name "*.$ext"); done
  find "${dirs[@]}" -type f \( "${names[@]:1}" \) -print0 | sort -z
}

clang_format=${CLANG_FORMAT:-}
if [ -z "$clang_format" ]; then
  for c in clang-format clang-format-14; do
    if command -v "$c" >/dev/null; then
      clang_format=$c
      break
    fi
  done
fi

mapfile -d '' fmt_srcs < <(sources "c h cu cuh cpp" engine lua tests examples)
if [ -z "$clang_format" ]; then
  echo "lint: clang-format not found (scripts/setup.sh --lint installs it)"
  failed+=(clang-format)
elif [ ${#fmt_srcs[@]} -gt 0 ]; then
  if ! "$clang_format" --dry-run --Werror --style=file "${fmt_srcs[@]}"; then
    echo "lint: formatting differs from .clang-format; fix with: $clang_format -i FILE..."
    failed+=(clang-format)
  fi
fi

mapfile -d '' c_srcs < <(sources "c" engine lua)
if ! command -v cppcheck >/dev/null; then
  echo "lint: cppcheck not found (scripts/setup.sh --lint installs it)"
  failed+=(cppcheck)
elif [ ${#c_srcs[@]} -gt 0 ]; then
  if ! cppcheck --enable=warning,style,performance,portability --error-exitcode=1 \
    --inline-suppr --quiet --library=lua -I engine/include -I engine/src \
    --suppress=missingIncludeSystem --suppress=variableScope -j "$(nproc 2>/dev/null || echo 2)" "${c_srcs[@]}"; then
    failed+=(cppcheck)
  fi
fi

mapfile -d '' lua_srcs < <(sources "lua" lua tests examples scripts bench)
if ! command -v luacheck >/dev/null; then
  echo "lint: luacheck not found (scripts/setup.sh --lint installs it)"
  failed+=(luacheck)
elif [ ${#lua_srcs[@]} -gt 0 ]; then
  if ! luacheck --no-color --formatter plain --codes "${lua_srcs[@]}"; then
    failed+=(luacheck)
  fi
fi

mapfile -d '' sh_srcs < <(sources "sh" scripts tests bench)
[ -f .ci/run ] && sh_srcs+=(.ci/run)
if ! command -v shellcheck >/dev/null; then
  echo "lint: shellcheck not found (scripts/setup.sh --lint installs it)"
  failed+=(shellcheck)
elif [ ${#sh_srcs[@]} -gt 0 ]; then
  if ! shellcheck "${sh_srcs[@]}"; then
    failed+=(shellcheck)
  fi
fi

# A Lua suite closes its state on exit (os.exit(code, true)), so that the engine and its device
# memory are freed and the sanitizers' leak checks see real leaks only.
for f in tests/lua/test_*.lua; do
  if ! tail -n 3 "$f" | grep -q 'os.exit(lu.LuaUnit.run(), true)'; then
    echo "lint: $f must end with os.exit(lu.LuaUnit.run(), true)"
    failed+=(lua-suites)
  fi
done

if ! scripts/check-layering.sh; then
  failed+=(layering)
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "lint: failed: ${failed[*]}"
  exit 1
fi
echo "lint: clean (clang-format, cppcheck, luacheck, shellcheck, layering, Lua suites)"
