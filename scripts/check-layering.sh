#!/usr/bin/env bash
# Check the #include rules of docs/ARCHITECTURE.md, "Layers"; print each violation as file:line.
#
#   engine/ never includes Lua headers;
#   engine/src/host never includes CUDA headers or files of engine/src/cuda, and
#   engine/src/cuda never includes files of engine/src/host;
#   the core (engine/src outside host/ and cuda/) includes no CUDA header and
#   nothing from host/ or cuda/: it reaches a backend only through backend.h;
#   lua/ includes graphcap.h and nothing else of the engine, and no CUDA header;
#   the binding's own rules: see binding_rules below.
#
# An include counts as a file of a directory when its path names the directory
# (host/x.h, ../cuda/x.h) or when its bare name exists there and not beside the
# including file. Exit 1 if any rule is broken.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

lua_re='^(.*/)?(lua|lauxlib|lualib|luaconf)\.h$|^(.*/)?lua\.hpp$'
cuda_re='^(cuda[_./]|cuda\.h$|cub/|cublas|curand|cufft|cusparse|cusolver|cudnn|nvrtc|nvToolsExt|nvtx3/|nccl\.h$|thrust/|cooperative_groups|device_launch_parameters\.h$|driver_types\.h$|vector_types\.h$)'

# Base names of the files under a directory, one per line ("" if it is absent).
names_in() {
  if [ -d "$1" ]; then find "$1" -type f -printf '%f\n' | sort -u; fi
}
host_names=$(names_in engine/src/host)
cuda_names=$(names_in engine/src/cuda)
src_names=$(names_in engine/src)
include_names=$(names_in engine/include)

# has LIST NAME: NAME is a line of LIST.
has() { grep -qxF -- "$2" <<<"$1"; }

# from_dir FILE INC DIRNAME NAMES: INC of FILE refers to a file of DIRNAME.
from_dir() {
  local file=$1 inc=$2 dir=$3 names=$4
  case "/$inc" in */"$dir"/*) return 0 ;; esac
  [[ $inc == */* ]] && return 1
  has "$names" "$inc" && [ ! -e "$(dirname "$file")/$inc" ]
}

violations=0
report() {
  echo "$1: $2"
  violations=$((violations + 1))
}

# Every #include of the C, C++ and CUDA sources under engine/ and lua/, as
# file:line:target.
list_includes() {
  local dirs=()
  for d in engine lua; do [ -d "$d" ] && dirs+=("$d"); done
  [ ${#dirs[@]} -gt 0 ] || return 0
  find "${dirs[@]}" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \
    -o -name '*.cc' -o -name '*.cpp' -o -name '*.hpp' \) -print0 | sort -z |
    xargs -0 -r grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"][^">]+[">]' |
    sed -E 's/^([^:]+:[0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^">]+)[">].*/\1:\2/'
}

while IFS= read -r entry; do
  inc=${entry#*:*:}
  where=${entry%:"$inc"}
  file=${where%:*}
  case "$file" in
    engine/*)
      if [[ $inc =~ $lua_re ]]; then
        report "$where" "engine/ includes the Lua header <$inc>"
      fi
      ;;
  esac
  case "$file" in
    engine/src/host/*)
      if [[ $inc =~ $cuda_re ]]; then
        report "$where" "host backend includes the CUDA header <$inc>"
      elif from_dir "$file" "$inc" cuda "$cuda_names"; then
        report "$where" "host backend includes \"$inc\" of the cuda backend"
      fi
      ;;
    engine/src/cuda/*)
      if from_dir "$file" "$inc" host "$host_names"; then
        report "$where" "cuda backend includes \"$inc\" of the host backend"
      fi
      ;;
    engine/src/*)
      if [[ $inc =~ $cuda_re ]]; then
        report "$where" "core includes the CUDA header <$inc> (backends only)"
      elif from_dir "$file" "$inc" host "$host_names" || from_dir "$file" "$inc" cuda "$cuda_names"; then
        report "$where" "core includes backend file \"$inc\" (reach backends through backend.h)"
      fi
      ;;
    lua/*)
      base=${inc##*/}
      if [[ $inc =~ $cuda_re ]]; then
        report "$where" "lua/ includes the CUDA header <$inc>"
      elif [ "$base" != graphcap.h ] && {
        case "/$inc" in */engine/*) true ;; *) false ;; esac ||
          { [[ $inc != */* ]] && [ ! -e "$(dirname "$file")/$inc" ] &&
            { has "$src_names" "$inc" || has "$include_names" "$inc"; }; }
      }; then
        report "$where" "lua/ includes engine header \"$inc\" (only graphcap.h is public)"
      fi
      ;;
  esac
done < <(list_includes)

# ---------------------------------------------------------------------------
# The Lua binding (lua/binding/, docs/ARCHITECTURE.md "The binding"):
#   only the call-path file, lcall.c, calls lua_pcall (every engine call that
#   may run Lua goes through its l_run, every callback through l_callback);
#   a binding file includes only its private header lgc.h, graphcap.h, Lua's
#   headers and the C library's.
binding_rules() {
  local f inc where
  [ -d lua/binding ] || return 0
  while IFS= read -r where; do
    f=${where%%:*}
    [ "$f" = lua/binding/lcall.c ] ||
      report "${where%:*}" "lua_pcall outside lua/binding/lcall.c (run engine calls through l_run)"
  done < <(grep -HnE '\blua_pcallk?[[:space:]]*\(' lua/binding/*.[ch] | cut -d: -f1,2 | sed 's/$/:/')
  while IFS= read -r entry; do
    inc=${entry#*:*:}
    where=${entry%:"$inc"}
    case "$inc" in
      lgc.h | graphcap.h | lua.h | lauxlib.h | lualib.h | luaconf.h) ;;
      *)
        if ! is_libc_header "$inc"; then
          report "$where" "binding includes \"$inc\" (only lgc.h, graphcap.h, Lua's and libc headers)"
        fi
        ;;
    esac
  done < <(find lua/binding -type f \( -name '*.c' -o -name '*.h' \) -print0 | sort -z |
    xargs -0 -r grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"][^">]+[">]' |
    sed -E 's/^([^:]+:[0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^">]+)[">].*/\1:\2/')
}

# The C library's headers (C11 and POSIX ones a binding may need).
is_libc_header() {
  case "$1" in
    assert.h | ctype.h | errno.h | float.h | inttypes.h | limits.h | math.h | stdarg.h | \
      stdbool.h | stddef.h | stdint.h | stdio.h | stdlib.h | string.h | time.h) return 0 ;;
  esac
  return 1
}

binding_rules
# ---------------------------------------------------------------------------

if [ "$violations" -gt 0 ]; then
  echo "check-layering: $violations violation(s) of the layering rules in docs/ARCHITECTURE.md"
  exit 1
fi
