#!/usr/bin/env bash
# Install the Debian packages graphcap needs, when they are missing.
#
#   scripts/setup.sh          lua5.4, liblua5.4-dev, lua-unit, and OpenMPI (openmpi-bin,
#                             libopenmpi-dev) for the distributed layer
#   scripts/setup.sh --lint   the same, and clang-format and cppcheck
#   scripts/setup.sh --list   print the first list, one package a line
#
# Idempotent: prints nothing when everything is present, one line when it
# installed something. Runs apt-get through sudo when not root.
set -euo pipefail

pkgs=(lua5.4 liblua5.4-dev lua-unit openmpi-bin libopenmpi-dev)
case "${1-}" in
  "") ;;
  --lint) pkgs+=(clang-format cppcheck) ;;
  --list)
    printf '%s\n' "${pkgs[@]}"
    exit 0
    ;;
  *)
    echo "usage: $0 [--lint | --list]" >&2
    exit 2
    ;;
esac

if ! command -v dpkg >/dev/null || ! command -v apt-get >/dev/null; then
  echo "setup: not a Debian system; install Lua 5.4 with its headers and LuaUnit" \
    "(and clang-format, cppcheck for lint) yourself" >&2
  exit 0
fi

# A tool counts as present when its command is; a library package when dpkg
# has it installed.
present() {
  case "$1" in
    clang-format) command -v clang-format >/dev/null || command -v clang-format-14 >/dev/null ;;
    cppcheck) command -v cppcheck >/dev/null ;;
    *) dpkg -s "$1" 2>/dev/null | grep -q '^Status: install ok installed' ;;
  esac
}

missing=()
for p in "${pkgs[@]}"; do
  present "$p" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null; then
  as_root=(sudo)
else
  echo "setup: missing ${missing[*]}; run as root (no sudo here) to install them" >&2
  exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
install() {
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q "${missing[@]}" >>"$log" 2>&1
}

if install; then
  echo "setup: installed ${missing[*]}"
elif "${as_root[@]}" apt-get update -q >>"$log" 2>&1 && install; then
  echo "setup: updated the package lists and installed ${missing[*]}"
else
  tail -n 20 "$log" >&2
  echo "setup: could not install ${missing[*]} (apt-get failed, output above)" >&2
  exit 1
fi
