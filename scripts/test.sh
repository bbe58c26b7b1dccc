#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: the C++ tests and the
# PyTorch reference (ctest), then every fuzz target for a bounded time
# (scripts/fuzz_ci.sh) and the sanitizer builds (scripts/sanitize_ci.sh:
# ASan + UBSan unit tests, ThreadSanitizer on the threaded parts). Each part
# runs even when an earlier one failed; any failure fails the whole. It ends
# with a table of every phase's seconds and the ten slowest tests
# (scripts/test_timing.py); docs/TESTING.md says how to run one phase alone.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$SECONDS
export TRAINER_TIMINGS=$root/build-timings.tsv
: > "$TRAINER_TIMINGS"
failed=()
junit=()

# phase NAME COMMAND...: runs it, appends its seconds and result to the table.
phase() {
  local name=$1 t0=$SECONDS rc=0
  shift
  echo "=== test.sh: $name"
  "$@" || rc=$?
  printf '%s\t%d\t%s\n' "$name" $((SECONDS - t0)) "$( ((rc == 0)) && echo ok || echo "FAILED (exit $rc)")" >> "$TRAINER_TIMINGS"
  ((rc == 0)) || failed+=("$name")
  return $rc
}
report() {
  python3 scripts/test_timing.py --wall $((SECONDS - start)) "$TRAINER_TIMINGS" "${junit[@]}" || true
  ((${#failed[@]} == 0)) || echo "test.sh: FAILED: ${failed[*]}"
}

configure() {
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTRAINER_TESTS=ON > build-configure.log 2>&1 ||
    { cat build-configure.log; return 1; }
  grep -E "trainer: (CUDA backend|tests|compiler cache)" build-configure.log || true
}
run_ctest() {
  rm -f build/ctest-junit.xml
  (cd build && ctest --output-on-failure --no-tests=error -j"$(nproc)" --timeout 1500 --output-junit ctest-junit.xml)
}

phase setup bash scripts/setup.sh test || { report; exit 1; }
phase configure configure || { report; exit 1; }
phase build cmake --build build -j"$(nproc)" || { report; exit 1; }
junit=(build/ctest-junit.xml)
phase ctest run_ctest
# fuzz_ci.sh and sanitize_ci.sh add their own build and run phases. The
# fuzzers run beside the sanitizer builds: each fuzz target is one process
# for its share of FUZZ_CI_BUDGET seconds (the same seconds as alone), which
# would leave the other core idle; nothing there times anything.
TRAINER_TIMING_NOTE="(beside the sanitizer phases)" bash scripts/fuzz_ci.sh > build-fuzz.log 2>&1 &
fuzz=$!
bash scripts/sanitize_ci.sh || failed+=(sanitize_ci)
wait $fuzz || failed+=(fuzz_ci)
cat build-fuzz.log
report
((${#failed[@]} == 0)) || exit 1
echo "test.sh: ctest, fuzz_ci and sanitize_ci passed"
