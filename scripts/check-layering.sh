#!/usr/bin/env bash
# Check the #include rules of docs/ARCHITECTURE.md, "Layers"; print each violation as file:line.
#
#   engine/ never includes Lua headers;
#   engine/src/host never includes CUDA headers or files of engine/src/cuda, and
#   engine/src/cuda never includes files of engine/src/host;
#   the core (engine/src outside host/ and cuda/) includes no CUDA header and
#   nothing from host/ or cuda/: it reaches a backend only through backend.h;
#   lua/ includes graphcap.h and nothing else of the engine, and no CUDA header;
#   only engine/src/dist includes MPI's header (mpi.h), and only the cuda
#   backend NCCL's (nccl.h, a CUDA header);
#   the binding's own rules (binding_rules below): only lua/binding/lcall.c calls
#   lua_pcall; binding files include only lbind.h, graphcap.h, Lua's and libc headers;
#   the engine's layers (engine_layer_rules below): runtime <- tensor <- train
#   and dist (beside train), no include of, or call into, a higher layer; the backends include only
#   runtime/backend.h and runtime/rng.h of the core and call only the runtime;
#   no call circle among the .c files of one layer (call_circle_rules below): their calls
#   make a graph without cycles, reported with the files of each circle and one circle
#   through them; the one exception is the runtime's hub, runtime/engine.c (calls into it are
#   not counted).
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
  if [[ $inc =~ ^(.*/)?mpi\.h$ ]] && [[ $file != engine/src/dist/* ]]; then
    report "$where" "includes MPI's header <$inc> (only engine/src/dist does)"
  fi
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
# The Lua binding (lua/binding/, docs/internals.md "The binding"):
#   only the call-path file, lcall.c, calls lua_pcall (every engine call that
#   may run Lua goes through its l_run, every callback through l_callback);
#   a binding file includes only its private header lbind.h, graphcap.h, Lua's
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
      lbind.h | graphcap.h | lua.h | lauxlib.h | lualib.h | luaconf.h) ;;
      *)
        if ! is_libc_header "$inc"; then
          report "$where" "binding includes \"$inc\" (only lbind.h, graphcap.h, Lua's and libc headers)"
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
# The engine's layers: engine/src/runtime (0) <- engine/src/tensor (1) <-
# engine/src/train and engine/src/dist (2), and the backends engine/src/host and engine/src/cuda
# beside the runtime.
#   - a layer's file includes no header of a higher layer;
#   - a backend includes, of the core, only runtime/backend.h and runtime/rng.h;
#   - a layer's file calls no function defined in a higher layer (gc_* and the
#     public gcap_* alike), and a backend calls only the runtime's.
# A file belongs to the layer of its first folder under engine/src, however deep it sits
# (engine/src/train/graphed/ is the train layer's). Calls are found by name in the code
# (comments and strings left out); a function is a layer's when one of its .c files defines it
# without `static`.
layer_rank() {
  case "$1" in
    runtime) echo 0 ;;
    tensor) echo 1 ;;
    train | dist) echo 2 ;;
    host | cuda) echo B ;;
    *) echo - ;;
  esac
}

# The folder under engine/src of the file that INC of FILE names ("" when it
# is no file of engine/src: a system or public header).
include_folder() {
  local file=$1 inc=$2 path
  if [ -e "$(dirname "$file")/$inc" ]; then
    path=$(realpath -m --relative-to=engine/src "$(dirname "$file")/$inc")
  elif [ -e "engine/src/$inc" ]; then
    path=$inc
  else
    return 0
  fi
  [[ $path == */* ]] && echo "${path%%/*}"
}

# The non-static functions (gc_*, gcap_*) that the .c files of a folder define.
defined_in() {
  [ -d "engine/src/$1" ] || return 0
  find "engine/src/$1" -name '*.c' -print0 | xargs -0 -r grep -hoE \
    '^[A-Za-z_][A-Za-z0-9_ *]*[ *](gc|gcap)_[a-z0-9_]+\(' |
    grep -v '^static' | sed -E 's/.*[ *]((gc|gcap)_[a-z0-9_]+)\($/\1/' | sort -u
}

# FILE without its comments and string literals, line for line.
code_of() {
  perl -0pe 's{/\*.*?\*/}{(my $c = $&) =~ s/[^\n]//g; $c}gse; s{//[^\n]*}{}g; s{"(?:\\.|[^"\\\n])*"}{""}g' "$1"
}

engine_layer_rules() {
  local entry inc where file folder rank target trank
  while IFS= read -r entry; do
    inc=${entry#*:*:}
    where=${entry%:"$inc"}
    file=${where%:*}
    [[ $file == engine/src/*/* ]] || continue
    folder=${file#engine/src/}
    folder=${folder%%/*}
    rank=$(layer_rank "$folder")
    target=$(include_folder "$file" "$inc")
    if [ -z "$target" ] || [ "$target" = "$folder" ]; then continue; fi
    trank=$(layer_rank "$target")
    if [ "$rank" = B ]; then
      case "$inc" in
        runtime/backend.h | runtime/rng.h) ;;
        *) [ "$trank" = B ] || report "$where" "backend includes \"$inc\" (of the core, only runtime/backend.h and runtime/rng.h)" ;;
      esac
    elif [ "$rank" != - ] && [ "$trank" != - ] && [ "$trank" != B ] && [ "$trank" -gt "$rank" ]; then
      report "$where" "$folder/ includes \"$inc\" of the higher layer $target/"
    fi
  done < <(list_includes)

  local upper lower syms hits
  for upper in tensor train dist; do
    mapfile -t syms < <(defined_in "$upper")
    [ ${#syms[@]} -gt 0 ] || continue
    for lower in runtime tensor host cuda; do
      [ "$(layer_rank "$lower")" = B ] || [ "$(layer_rank "$lower")" -lt "$(layer_rank "$upper")" ] ||
        continue
      [ -d "engine/src/$lower" ] || continue
      while IFS= read -r -d '' f; do
        while IFS= read -r hits; do
          report "$f:${hits%%:*}" "$lower/ calls ${hits#*:} of the higher layer $upper/"
        done < <(code_of "$f" | grep -nowF -f <(printf '%s\n' "${syms[@]}") || true)
      done < <(find "engine/src/$lower" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \
        -o -name '*.cuh' \) -print0 | sort -z)
    done
  done
}

engine_layer_rules

# ---------------------------------------------------------------------------
# No call circle among the files of one layer: the calls between the .c files
# of engine/src/runtime, tensor, train and dist make a graph with no cycle, so
# that each file can be read knowing only the files it calls. Calls are found
# as above (by name in the code, a function being its file's when the file
# defines it without `static`). The one exception is the runtime's hub:
# calls into runtime/engine.c (the engine's checks and references, which
# every runtime file makes while engine.c calls them all) are not counted.
circle_exempt=engine/src/runtime/engine.c

# The non-static functions a .c file defines, one per line (none: no line).
defined_by() {
  { grep -hoE '^[A-Za-z_][A-Za-z0-9_ *]*[ *][a-z_][a-z0-9_]*\(' "$1" || true; } |
    { grep -v '^static' || true; } | sed -E 's/.*[ *]([a-z_][a-z0-9_]*)\($/\1/' | sort -u
}

# The calls between the .c files of folder $1 as "caller callee function"
# lines, one per pair of files (the first function by name).
file_calls() {
  local f defs
  defs=$(for f in "engine/src/$1"/*.c; do
    if [ -e "$f" ]; then defined_by "$f" | sed "s|\$| $f|"; fi
  done)
  [ -n "$defs" ] || return 0
  for f in "engine/src/$1"/*.c; do
    code_of "$f" | { grep -owF -f <(cut -d' ' -f1 <<<"$defs") || true; } | sort -u |
      awk -v f="$f" -v skip="$circle_exempt" '
        NR == FNR { def[$1] = def[$1] " " $2; next }
        { n = split(def[$1], g, " ")
          for (i = 1; i <= n; i++) if (g[i] != f && g[i] != skip) print f, g[i], $1 }' \
        <(printf '%s\n' "$defs") -
  done | sort -s -k1,2 -u
}

# The circles of a call graph ("caller callee function" lines): one line per
# set of files that reach each other (Tarjan's strongly connected sets), its
# files, then the shortest circle from its first file back to it, a function
# per call: "a.c, b.c: a.c -> b.c (gc_f) -> a.c (gc_g)".
circles() {
  perl -ne '
    my ($a, $b, $s) = split;
    push @{$calls{$a}}, $b; $sym{"$a $b"} = $s; $node{$a} = $node{$b} = 1;
    END {
      my ($i, @stack, %on, %idx, %low, @sets) = (0);
      my $visit; $visit = sub {
        my $v = shift;
        $idx{$v} = $low{$v} = $i++; push @stack, $v; $on{$v} = 1;
        for my $w (@{$calls{$v} || []}) {
          if (!exists $idx{$w}) { $visit->($w); $low{$v} = $low{$w} if $low{$w} < $low{$v} }
          elsif ($on{$w}) { $low{$v} = $idx{$w} if $idx{$w} < $low{$v} }
        }
        return if $low{$v} != $idx{$v};
        my ($w, @set);
        do { $w = pop @stack; delete $on{$w}; push @set, $w } while ($w ne $v);
        push @sets, [sort @set] if @set > 1;
      };
      for my $v (sort keys %node) { $visit->($v) unless exists $idx{$v} }
      for my $set (@sets) {
        my %in = map { $_ => 1 } @$set;
        my $v = $set->[0];
        my (%prev, $end);
        my @q = ($v);
        while (!defined $end && defined(my $x = shift @q)) {   # breadth first, back to $v
          for my $w (sort @{$calls{$x} || []}) {
            next unless $in{$w};
            if ($w eq $v) { $end = $x; last }
            next if exists $prev{$w};
            $prev{$w} = $x; push @q, $w;
          }
        }
        my @path = ($v);
        for (my $x = $end; $x ne $v; $x = $prev{$x}) { splice @path, 1, 0, $x }
        push @path, $v;
        my $line = join(", ", @$set) . ": $path[0]";
        for my $k (1 .. $#path) {
          my $call = "$path[$k - 1] $path[$k]";
          $line .= " -> $path[$k] ($sym{$call})";
        }
        $line =~ s|engine/src/[a-z]+/||g;
        print "$line\n";
      }
    }'
}

call_circle_rules() {
  local layer circle
  for layer in runtime tensor train dist; do
    [ -d "engine/src/$layer" ] || continue
    while IFS= read -r circle; do
      report "engine/src/$layer" "call circle among $circle"
    done < <(file_calls "$layer" | circles)
  done
}

call_circle_rules

if [ "$violations" -gt 0 ]; then
  echo "check-layering: $violations violation(s) of the layering rules in docs/ARCHITECTURE.md"
  exit 1
fi
