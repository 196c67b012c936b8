#!/usr/bin/env bash
# Run the cuda suites under compute-sanitizer's memcheck (with leak check),
# racecheck and synccheck, on a GPU machine with a built tree (as
# scripts/gpu-run.sh). A tool's report makes the suite exit 99, which
# tests/run.sh counts as a failure. CUDA API errors are not reported: the
# suites provoke them on purpose (a capture left unjoined must fail), and
# every status the engine gets is checked by the suites themselves. Only
# the suite's own process is checked (the program's tests start others),
# a suite that skips before touching CUDA is not an error, and the soak's
# resident-memory bound is off (the instrumentation grows the process). Logs: ${GPU_LOG_DIR:-/tmp}/sanitize/TOOL/.
#   scripts/gpu-sanitize.sh [TOOL...]      default: memcheck racecheck synccheck
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

cs=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
if [ ! -x "$cs" ]; then
  echo "gpu-sanitize: compute-sanitizer not found (set COMPUTE_SANITIZER)" >&2
  exit 2
fi
if [ ! -x build/graphcap ]; then
  echo "gpu-sanitize: build/graphcap is missing; build the tree first" >&2
  exit 2
fi
"$cs" --version | tail -n 1

tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(memcheck racecheck synccheck)
status=0
for t in "${tools[@]}"; do
  extra=""
  [ "$t" = memcheck ] && extra="--leak-check full"
  echo "== compute-sanitizer --tool $t"
  GRAPHCAP_SOAK_NO_RSS=1 \
    TEST_WRAPPER="$cs --tool $t $extra --report-api-errors no --require-cuda-init no --target-processes application-only --error-exitcode 99" TEST_TIMEOUT=${TEST_TIMEOUT:-1800} \
    TEST_LOG_DIR=${GPU_LOG_DIR:-/tmp}/sanitize/$t tests/run.sh build cuda || status=1
done
exit $status
