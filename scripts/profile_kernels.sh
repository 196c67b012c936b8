#!/usr/bin/env bash
# Time every kernel of one TransformerLayer step (forward and backward) with
# ncu, graphcap's and PyTorch's side by side, grouped by kernel, with a total
# line each: the table bench/RESULTS.md keeps. Needs a GPU, ncu and PyTorch.
#
#   scripts/profile_kernels.sh [d heads S B [impl [RECIPE]]]   default: 768 12 1024 8 auto
#
# RECIPE (DelayedScaling or Float8CurrentScaling) runs graphcap's layer with
# its linears in FP8 under that recipe, beside PyTorch's bf16 layer: where an
# FP8 step's time goes, against the bf16 step it should beat.
#
# Raw CSVs and the table go to $PROFILE_DIR (default build/profile).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
d=${1:-768} heads=${2:-12} S=${3:-1024} B=${4:-8} impl=${5:-auto} recipe=${6:-}
steps=4
dir=${PROFILE_DIR:-build/profile}
mkdir -p "$dir"
ncu_run() {
  ncu --clock-control none --metrics gpu__time_duration.sum --csv "$@"
}
tag="d${d}_S${S}_B${B}${recipe:+_fp8_$recipe}"
label="graphcap ($impl${recipe:+, FP8 $recipe})"
ncu_run build/graphcap --device cuda bench/profile_layer.lua "$d" "$heads" "$S" "$B" "$steps" \
  "$impl" ${recipe:+"$recipe"} >"$dir/graphcap_$tag.csv"
ncu_run python3 bench/torch_profile_layer.py "$d" "$heads" "$S" "$B" "$steps" \
  >"$dir/torch_$tag.csv"
python3 bench/profile_kernels.py "$steps" "$label=$dir/graphcap_$tag.csv" \
  "PyTorch${recipe:+ (bf16)}=$dir/torch_$tag.csv" | tee "$dir/kernels_$tag.md"
