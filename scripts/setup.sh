#!/usr/bin/env bash
# Install the Debian packages graphcap needs, when they are missing (and fetch the cuDNN
# frontend's headers, below).
#
#   scripts/setup.sh          lua5.4, liblua5.4-dev, lua-unit, and OpenMPI (openmpi-bin,
#                             libopenmpi-dev) for the distributed layer
#   scripts/setup.sh --lint   the same, and clang-format, cppcheck, lua-check (luacheck)
#                             and shellcheck
#   scripts/setup.sh --list   print the first list, one package a line
#
# Where nvcc is found, the first two also fetch the headers of cuDNN's frontend (header-only
# C++, pinned below) into .deps/cudnn-frontend/include when that folder is missing: the cuda
# backend runs attention through cuDNN when they are there (Makefile, CUDNN=auto). They come as
# the PyPI wheel nvidia-cudnn-frontend, which holds include/; a machine that cannot fetch it
# builds without cuDNN, after one line saying so.
#
# Idempotent: prints nothing when everything is present, one line when it
# installed or fetched something. Runs apt-get through sudo when not root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

pkgs=(lua5.4 liblua5.4-dev lua-unit openmpi-bin libopenmpi-dev)
case "${1-}" in
  "") ;;
  --lint) pkgs+=(clang-format cppcheck lua-check shellcheck) ;;
  --list)
    printf '%s\n' "${pkgs[@]}"
    exit 0
    ;;
  *)
    echo "usage: $0 [--lint | --list]" >&2
    exit 2
    ;;
esac

fe_version=1.32.0
fe_dir=.deps/cudnn-frontend/include

# The frontend's headers from its wheel, through a temporary folder, so that an
# interrupted fetch leaves no partial folder behind.
fetch_cudnn_frontend() {
  local tmp
  tmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: --retries 0 --timeout 15 -d "$tmp" \
    "nvidia-cudnn-frontend==$fe_version" >"$tmp/log" 2>&1 &&
    python3 - "$tmp" <<'PY' >>"$tmp/log" 2>&1; then
import glob, os, sys, zipfile
tmp = sys.argv[1]
with zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0]) as z:
    for name in z.namelist():
        if name.startswith("include/") and not name.endswith("/"):
            z.extract(name, tmp)
PY
    if [ -f "$tmp/include/cudnn_frontend.h" ]; then
      mkdir -p "$(dirname "$fe_dir")"
      mv "$tmp/include" "$fe_dir"
      echo "setup: fetched the cuDNN frontend $fe_version headers into $fe_dir"
      rm -rf "$tmp"
      return
    fi
  fi
  tail -n 3 "$tmp/log" >&2
  echo "setup: could not fetch nvidia-cudnn-frontend==$fe_version (python3 -m pip download," \
    "output above); the cuda backend builds without cuDNN attention" >&2
  rm -rf "$tmp"
}

if command -v "${NVCC:-nvcc}" >/dev/null && [ ! -d "$fe_dir" ]; then
  fetch_cudnn_frontend
fi

if ! command -v dpkg >/dev/null || ! command -v apt-get >/dev/null; then
  echo "setup: not a Debian system; install Lua 5.4 with its headers and LuaUnit" \
    "(and clang-format, cppcheck, luacheck, shellcheck for lint) yourself" >&2
  exit 0
fi

# A tool counts as present when its command is; a library package when dpkg
# has it installed.
present() {
  case "$1" in
    clang-format) command -v clang-format >/dev/null || command -v clang-format-14 >/dev/null ;;
    cppcheck) command -v cppcheck >/dev/null ;;
    lua-check) command -v luacheck >/dev/null ;;
    shellcheck) command -v shellcheck >/dev/null ;;
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
# Another apt (a boot-time upgrade, a second build running setup) may hold
# dpkg's lock: wait for it rather than fail.
lock=(-o DPkg::Lock::Timeout=300)
install() {
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get "${lock[@]}" install -y -q "${missing[@]}" >>"$log" 2>&1
}

if install; then
  echo "setup: installed ${missing[*]}"
elif "${as_root[@]}" apt-get "${lock[@]}" update -q >>"$log" 2>&1 && install; then
  echo "setup: updated the package lists and installed ${missing[*]}"
else
  tail -n 20 "$log" >&2
  echo "setup: could not install ${missing[*]} (apt-get failed, output above)" >&2
  exit 1
fi
