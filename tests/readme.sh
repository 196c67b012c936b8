#!/usr/bin/env bash
# Run every code block of README.md, and the blocks of docs/*.md marked
# runnable, as a reader would copy them, as TAP.
#
#   tests/readme.sh BUILD_DIR
#
# In docs/*.md, a ```lua block runs when the line before it is exactly
# "<!-- runnable -->" (other blocks there are fragments).
# Each ```lua block runs on its own under BUILD_DIR/graphcap (the backend of
# GRAPHCAP_DEVICE, host when unset); it passes when it exits 0 with nothing
# on stderr. Each ```c block is compiled against BUILD_DIR/libgraphcap.a
# with the libraries the Makefile links (LDLIBS from the environment, else
# asked of make) and run; it passes when it exits 0 and, where the block has
# a comment listing its results ("/* 12, 24, 36 */" after a printf), prints
# exactly those numbers in that order.
set -uo pipefail

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
device=${GRAPHCAP_DEVICE:-host}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Split the files into tmp/N.lang files, N counting blocks of the languages
# run here; tmp/N.line holds "FILE line L", where the block starts. With
# marked=1, only blocks after a "<!-- runnable -->" line count.
split_blocks() {
  awk -v dir="$tmp" -v marked="$1" -v n="$(find "$tmp" -name '*.line' | wc -l)" '
    FNR == 1                       { prev = "" }
    /^```(lua|c)$/ && !inb && (!marked || prev == "<!-- runnable -->") {
                                     inb = 1; n++; lang = substr($0, 4); f = dir "/" n "." lang
                                     print FILENAME " line " FNR > (dir "/" n ".line")
                                     close(dir "/" n ".line"); prev = $0; next }
    /^```/ && inb                  { inb = 0; close(f); prev = $0; next }
    inb                            { print > f }
                                   { prev = $0 }
  ' "${@:2}"
}
split_blocks 0 README.md
readme_blocks=$(find "$tmp" -name '*.line' | wc -l)
if [ "$readme_blocks" -eq 0 ]; then
  echo "not ok 1 README.md has no lua or c block"
  exit 1
fi
split_blocks 1 docs/*.md
blocks=$(find "$tmp" -name '*.line' | wc -l)
echo "1..$blocks"

# The link flags: the Makefile's LDLIBS, plus the sanitizers' runtimes when
# the archive was built with them (make asan).
# shellcheck disable=SC2016 # $(LDLIBS) is make's to expand
ldlibs=${LDLIBS:-$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s --no-print-directory \
  --eval='print-ldlibs: ; @echo $(LDLIBS) $(MPI_LIBS)' print-ldlibs 2>/dev/null)}
# (grep reads to the end: with -q, nm could die of SIGPIPE and pipefail
# would turn the match into a failure)
if nm "$build/libgraphcap.a" 2>/dev/null | grep '__asan_report' >/dev/null; then
  ldlibs="$ldlibs -fsanitize=address,undefined"
fi

# run_lua N: block N under the program; its output on failure as comments.
run_lua() {
  "$build/graphcap" --device "$device" "$tmp/$1.lua" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [ $rc -eq 0 ] && [ ! -s "$tmp/err" ]
}

# run_c N: compile block N, run it, and check the numbers its result comment
# lists (the first "/* a, b, c */" made only of numbers) against its output.
run_c() {
  # shellcheck disable=SC2086
  if ! ${CC:-cc} -std=c11 -Wall -Werror -Iengine/include -o "$tmp/$1.bin" "$tmp/$1.c" \
    "$build/libgraphcap.a" $ldlibs >"$tmp/out" 2>"$tmp/err"; then
    return 1
  fi
  GRAPHCAP_DEVICE=$device "$tmp/$1.bin" >"$tmp/out" 2>"$tmp/err" || return 1
  [ -s "$tmp/err" ] && return 1
  local -a want got
  read -ra want < <(grep -oE '/\* *-?[0-9.]+(, *-?[0-9.]+)+ *\*/' "$tmp/$1.c" | head -1 |
    tr -dc '0-9.,-' | tr ',' ' ')
  [ ${#want[@]} -eq 0 ] && return 0
  read -ra got < <(grep -oE -- '-?[0-9.]+$' "$tmp/out" | tr '\n' ' ')
  if [ "${got[*]}" != "${want[*]}" ]; then
    echo "printed '${got[*]}', the block says '${want[*]}'" >>"$tmp/err"
    return 1
  fi
}

i=0
failed=0
for f in $(find "$tmp" \( -name '*.lua' -o -name '*.c' \) -printf '%f\n' | sort -n); do
  i=$((i + 1))
  n=${f%.*}
  lang=${f##*.}
  what="$(cat "$tmp/$n.line"): the $lang block"
  if "run_$lang" "$n"; then
    echo "ok $i $what"
  else
    echo "not ok $i $what"
    sed 's/^/# /' "$tmp/out" "$tmp/err"
    failed=$((failed + 1))
  fi
done
[ "$failed" -eq 0 ]
