#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: the C++ tests and the
# PyTorch reference (ctest), then every fuzz target for a bounded time
# (scripts/fuzz_ci.sh) and the sanitizer builds (scripts/sanitize_ci.sh:
# ASan + UBSan unit tests, ThreadSanitizer on the threaded parts). Each part
# runs even when an earlier one failed; any failure fails the whole.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
bash scripts/build.sh || exit 1
failed=()
(cd build && ctest --output-on-failure --no-tests=error -j"$(nproc)" --timeout 1500) || failed+=(ctest)
bash scripts/fuzz_ci.sh || failed+=(fuzz_ci)
bash scripts/sanitize_ci.sh || failed+=(sanitize_ci)
if ((${#failed[@]})); then
  echo "test.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "test.sh: ctest, fuzz_ci and sanitize_ci passed"
