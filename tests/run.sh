#!/usr/bin/env bash
# Run every test suite on each backend and end with one line "N passed, M failed".
#
#   tests/run.sh BUILD_DIR BACKEND...      e.g. tests/run.sh build host cuda
#
# Per backend, the suites are: each C test BUILD_DIR/tests/test_X of a tests/c/test_X.c (run with
# GRAPHCAP_DEVICE=BACKEND), each tests/lua/test_*.lua (run as
# BUILD_DIR/graphcap --device BACKEND FILE -o tap), BUILD_DIR/embed and
# BUILD_DIR/embed_custom when they were built (one test each, passed when it
# exits 0); and tests/readme.sh, which runs every lua and c block of
# README.md and the blocks of docs/*.md marked runnable, and
# examples/train_gpt.lua in its small setting with its FP8 pair (one test,
# passed when it exits 0; on cuda a second in bf16; neither with TEST_ONLY=c). With the host
# backend, when the program was built with MPI and mpirun is found, each tests/dist/test_*.lua also runs
# under `mpirun -np 2` and `mpirun -np 4 --oversubscribe` (as root with
# --allow-run-as-root), rank 0 printing the results (not with TEST_ONLY=c).
#
# Lines "ok N ..." and "not ok N ..." are counted ("ok N # SKIP" as skipped).
# A suite that exits non-zero without a "not ok" line (a crash, a load error),
# or that exits 0 printing no result at all, counts as one failure. A suite that
# exits 77 without a "not ok" line is skipped. Exit 1 when anything failed or
# no test ran.
#
# Environment:
#   TEST_LOG_DIR   also write each suite's output to TEST_LOG_DIR/BACKEND-SUITE.log
#   TEST_TIMEOUT   seconds a suite may run (default 600; 0: no limit)
#   TEST_DIST_TIMEOUT  seconds an mpirun job of tests/dist may run (default 120)
#   TEST_ONLY      "c" (the C tests and the embed example) or "lua" (the Lua tests)
#   TEST_NOT_RUN   backends built but not run here (no GPU), named in the summary
#   TEST_WRAPPER   a command (words split on spaces) every suite runs under, e.g.
#                  "compute-sanitizer --tool memcheck" (scripts/gpu-sanitize.sh)
# LUA_PATH (and LUA_PATH_5_4 when set) starts with tests/lua and tests/dist, so that a suite
# requires its helpers by name; with .deps/ (the GPU machine's luaunit.lua) before them. One
# suite by hand, from the top of the tree:
#   LUA_PATH='tests/lua/?.lua;;' build/graphcap --device host tests/lua/test_tensor.lua
set -uo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 BUILD_DIR BACKEND..." >&2
  exit 2
fi
if [ ! -d "$1" ]; then
  echo "tests/run.sh: no build directory $1" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
shift
log_dir=${TEST_LOG_DIR:-}
if [ -n "$log_dir" ]; then
  if ! mkdir -p "$log_dir"; then
    echo "tests/run.sh: cannot create TEST_LOG_DIR $log_dir" >&2
    exit 2
  fi
  log_dir=$(cd "$log_dir" && pwd)
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

# What the suites require: the helpers of tests/lua and tests/dist (require "helpers",
# require "harness"), and .deps/ when it exists (the GPU machine's luaunit.lua), first.
lua_dirs="$PWD/tests/lua/?.lua;$PWD/tests/dist/?.lua"
if [ -d .deps ]; then lua_dirs="$PWD/.deps/?.lua;$lua_dirs"; fi
export LUA_PATH="$lua_dirs;${LUA_PATH:-;}"
if [ -n "${LUA_PATH_5_4:-}" ]; then export LUA_PATH_5_4="$lua_dirs;$LUA_PATH_5_4"; fi

only=${TEST_ONLY:-}
case "$only" in
  "" | c | lua) ;;
  *)
    echo "tests/run.sh: TEST_ONLY must be c or lua, not $only" >&2
    exit 2
    ;;
esac

limit=${TEST_TIMEOUT:-600}
timeout_cmd=()
if [ "$limit" != 0 ] && command -v timeout >/dev/null; then
  timeout_cmd=(timeout -k 10 "$limit")
fi

wrapper=()
if [ -n "${TEST_WRAPPER:-}" ]; then read -ra wrapper <<<"$TEST_WRAPPER"; fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

passed=0
failed=0
skipped=0
failures=()
skips=()

# run_suite BACKEND NAME KIND CMD...: run one suite, print and count its output.
# KIND is "tap" (count result lines) or "single" (one test: its exit status).
run_suite() {
  local be=$1 name=$2 kind=$3
  shift 3
  local outf=$tmp/out err=$tmp/err rc try
  echo "== $be: $name"
  for try in 1 2; do
    # A subshell that cannot exec the command waits for it, so bash's own report
    # of a crash ("Segmentation fault ...") goes to /dev/null; ours follows.
    (
      GRAPHCAP_DEVICE=$be "${timeout_cmd[@]}" "${wrapper[@]}" "$@" </dev/null >"$outf" 2>"$err"
      exit $?
    ) 2>/dev/null
    rc=$?
    # LeakSanitizer's own tracer can crash while it stops the threads of a
    # process that started OpenMPI (under load, now and then): that is no
    # finding about the suite, which runs once more. A leak report fails it.
    if [ $rc -eq 0 ] || [ $try != 1 ] ||
      ! grep -q "LeakSanitizer has encountered a fatal error" "$outf" "$err"; then
      break
    fi
    echo "-- $be: $name: LeakSanitizer's tracer crashed; running the suite again"
  done

  local why=""
  if [ ${#timeout_cmd[@]} -gt 0 ] && [ $rc -eq 124 ]; then
    why="timed out after ${limit}s"
  elif [ $rc -gt 128 ]; then
    why="killed by signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null || echo '?'))"
  elif [ $rc -ne 0 ]; then
    why="exited with status $rc"
    if [ $rc -eq 77 ]; then why="$why (skip)"; fi
  fi

  cat "$outf"
  if [ -s "$err" ]; then
    echo "-- $be: $name: stderr"
    cat "$err"
  fi
  if [ -n "$why" ]; then echo "-- $be: $name: $why"; fi
  if [ -n "$log_dir" ]; then
    {
      cat "$outf"
      if [ -s "$err" ]; then
        echo "-- stderr"
        cat "$err"
      fi
      if [ -n "$why" ]; then echo "-- $why"; fi
    } >"$log_dir/$be-$name.log"
  fi

  if [ "$kind" = single ]; then
    if [ $rc -eq 0 ]; then
      passed=$((passed + 1))
    elif [ $rc -eq 77 ]; then
      skipped=$((skipped + 1))
      skips+=("$be: $name")
    else
      failed=$((failed + 1))
      failures+=("$be: $name: $why")
    fi
    return
  fi

  local ok skip line
  local -a bad=()
  ok=$(cat "$outf" "$err" | grep -cE '^ok([[:space:]]|$)')
  skip=$(cat "$outf" "$err" | grep -cE '^ok([[:space:]]|$).*#[[:space:]]*[Ss][Kk][Ii][Pp]')
  mapfile -t bad < <(cat "$outf" "$err" | grep -E '^not ok([[:space:]]|$)')
  passed=$((passed + ok - skip))
  skipped=$((skipped + skip))
  failed=$((failed + ${#bad[@]}))
  for line in "${bad[@]}"; do
    failures+=("$be: $name: $line")
  done

  # A suite skipped whole says so by its exit status 77, or by TAP's plan
  # "1..0 # SKIP" (what is left of it under a wrapper that keeps no status).
  local skipped_whole=0
  if [ $rc -eq 77 ] || { [ "$ok" -eq 0 ] && [ $rc -eq 0 ] &&
    grep -qE '^1\.\.0[[:space:]]*#[[:space:]]*[Ss][Kk][Ii][Pp]' "$outf"; }; then
    skipped_whole=1
  fi
  if [ ${#bad[@]} -eq 0 ]; then
    if [ $skipped_whole = 1 ]; then
      skips+=("$be: $name")
    elif [ $rc -ne 0 ]; then
      failed=$((failed + 1))
      failures+=("$be: $name: $why")
    elif [ "$ok" -eq 0 ]; then
      failed=$((failed + 1))
      failures+=("$be: $name: printed no test results")
    fi
  fi
}

# The multi-rank suites: each tests/dist/test_*.lua on 2 and 4 ranks of the
# host backend, when the program has MPI and mpirun is here; else one skip.
run_dist_suites() {
  local t np
  local -a mpirun=(mpirun)
  if ! "$build/graphcap" -e 'os.exit(require("graphcap").dist.is_available() and 0 or 1)' \
    </dev/null >/dev/null 2>&1 || ! command -v mpirun >/dev/null; then
    skips+=("host: tests/dist (built without MPI, or no mpirun)")
    return
  fi
  [ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
  # a job that hangs (a rank left waiting) fails in this time, not TEST_TIMEOUT's (run_suite
  # names this one, through bash's dynamic scope)
  local limit=${TEST_DIST_TIMEOUT:-120}
  for t in tests/dist/test_*.lua; do
    for np in 2 4; do
      run_suite host "np$np-$(basename "$t")" tap timeout -k 5 "$limit" "${mpirun[@]}" \
        --oversubscribe -np "$np" "$build/graphcap" --device host "$t"
    done
  done
}

shopt -s nullglob
# The C suites of tests/c as built: a binary left in BUILD_DIR by a suite since removed is not one.
c_tests=()
for t in tests/c/test_*.c; do c_tests+=("$build/tests/$(basename "$t" .c)"); done
lua_tests=(tests/lua/test_*.lua)
case "$only" in
  c) lua_tests=() ;;
  lua) c_tests=() ;;
esac
for be in "$@"; do
  for t in "${c_tests[@]}"; do
    if [ ! -f "$t" ] || [ ! -x "$t" ]; then continue; fi
    run_suite "$be" "$(basename "$t")" tap "$t"
  done
  for t in "${lua_tests[@]}"; do
    run_suite "$be" "$(basename "$t")" tap "$build/graphcap" --device "$be" "$t" -o tap
  done
  if [ "$only" != c ]; then
    run_suite "$be" README.md tap tests/readme.sh "$build"
    run_suite "$be" train_gpt.lua single "$build/graphcap" --device "$be" examples/train_gpt.lua \
      small fp8 "$tmp/train_gpt_loss.svg"
    # on cuda also in bf16, where cuDNN runs the attention (the example checks it does)
    if [ "$be" = cuda ]; then
      run_suite "$be" train_gpt.lua-bf16 single env GPT_DTYPE=bf16 "$build/graphcap" --device "$be" \
        examples/train_gpt.lua small "$tmp/train_gpt_loss.svg"
    fi
  fi
  if [ "$be" = host ] && [ "$only" != c ]; then run_dist_suites; fi
  for ex in embed embed_custom; do
    embed=$build/$ex
    [ -d "$embed" ] && embed=$build/$ex/$ex
    if [ "$only" != lua ] && [ -f "$embed" ] && [ -x "$embed" ]; then
      run_suite "$be" "$ex" single "$embed"
    fi
  done
done

echo "=="
if [ ${#skips[@]} -gt 0 ]; then
  printf 'skipped suite: %s\n' "${skips[@]}"
fi
if [ ${#failures[@]} -gt 0 ]; then
  printf 'FAILED %s\n' "${failures[@]}"
fi
if [ "$skipped" -gt 0 ]; then
  echo "$skipped skipped"
fi
if [ $((passed + failed)) -eq 0 ]; then
  echo "tests/run.sh: no test ran"
fi
not_run=${TEST_NOT_RUN:-}
echo "backends run: $*${not_run:+; built but not run (no GPU visible): $not_run}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ $((passed + failed)) -gt 0 ]
