#!/usr/bin/env bash
# Run both sides of the benchmark RUNS times on this GPU and report them
# together, with the spread over the runs (bench/bench_report.lua).
#
#   bench/bench-runs.sh [RUNS [OUT_DIR]]      defaults: 3, build/bench
#
# Run i writes OUT_DIR/graphcap-i.jsonl (bench/bench.lua configs, then
# scaling, then transformer, then fp8, each in a process of its own) and
# OUT_DIR/torch-i.jsonl (bench/torch_graphed.py, bench/torch_scaling.py,
# bench/torch_transformer.py, bench/torch_fp8.py); the two sides of a
# run follow each other, so that their ratio compares one state of the
# machine. Then OUT_DIR/report.md and OUT_DIR/ratios.svg are written from
# all runs (by build/graphcap, which is a Lua interpreter: the GPU machine
# may have no lua5.4). Needs a CUDA GPU, build/graphcap (make) and python3
# with torch.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs=${1:-3}
dir=${2:-build/bench}
mkdir -p "$dir"
if ! python3 -c 'import torch' 2>/dev/null; then
  echo "bench-runs: python3 has no torch; PyTorch's side cannot run" >&2
  exit 1
fi
gfiles=() tfiles=()
for i in $(seq 1 "$runs"); do
  echo "bench-runs: run $i of $runs" >&2
  g=$dir/graphcap-$i.jsonl t=$dir/torch-$i.jsonl
  {
    build/graphcap --device cuda bench/bench.lua configs
    build/graphcap --device cuda bench/bench.lua scaling
    build/graphcap --device cuda bench/bench.lua transformer
    build/graphcap --device cuda bench/bench.lua fp8
  } >"$g"
  {
    python3 bench/torch_graphed.py
    python3 bench/torch_scaling.py
    python3 bench/torch_transformer.py
    python3 bench/torch_fp8.py
  } >"$t"
  gfiles+=("$g")
  tfiles+=("$t")
done
build/graphcap bench/bench_report.lua --svg "$dir/ratios.svg" --graphcap "${gfiles[@]}" \
  --torch "${tfiles[@]}" >"$dir/report.md"
echo "bench-runs: $dir/report.md, $dir/ratios.svg" >&2
