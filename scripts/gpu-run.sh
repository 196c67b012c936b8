#!/usr/bin/env bash
# Run the test suites on a GPU machine, from the repo root of a tree built
# elsewhere (build/ present, luaunit.lua in .deps/). Logs go to ${GPU_LOG_DIR:-/tmp}/test-logs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

nvidia-smi -L || echo "gpu-run: nvidia-smi failed"
echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
if [ ! -x build/graphcap ]; then
  echo "gpu-run: build/graphcap is missing; build the tree first" >&2
  exit 2
fi
ldd build/graphcap | grep 'not found'

TEST_LOG_DIR=${GPU_LOG_DIR:-/tmp}/test-logs exec tests/run.sh build cuda host
