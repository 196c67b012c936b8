#!/usr/bin/env bash
# Run the cuda suites under compute-sanitizer's memcheck (with leak check),
# racecheck and synccheck, on a GPU machine with a built tree (as
# scripts/gpu-run.sh). A tool's report makes the suite exit 99, which
# run-tests.sh counts as a failure. Logs: ${OUT:-/tmp}/sanitize/TOOL/.
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
  TEST_WRAPPER="$cs --tool $t $extra --error-exitcode 99" TEST_TIMEOUT=${TEST_TIMEOUT:-1800} \
    TEST_LOG_DIR=${OUT:-/tmp}/sanitize/$t scripts/run-tests.sh build cuda || status=1
done
exit $status
