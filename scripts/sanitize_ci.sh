#!/usr/bin/env bash
# The test suite under the sanitizers (docs/RELIABILITY.md), bounded for CI:
#
#   scripts/sanitize_ci.sh [asan|tsan]...      default: both
#
# asan: build-asan/, the CPU build (TRAINER_CUDA=OFF) with gcc's
#   AddressSanitizer + UndefinedBehaviorSanitizer (-O1, every UBSan check
#   fatal), then unit_tests: every test case except those that launch the
#   trainer as several processes ([e2e]) and the timing ones ([serial]);
#   the trainer they do launch (one-process runs, the CLI tests) is
#   instrumented too.
# tsan: build-tsan/, ThreadSanitizer, then the test cases of the threaded
#   parts: the batch prefetch thread, the asynchronous checkpoint writer,
#   the watchdog and heartbeats, the store server and its clients, the
#   communicators' worker threads (Gloo, host-staged, timed), the rank
#   runner's forked ranks (ASAN_SPEC / TSAN_SPEC below). OpenMP runs one
#   thread there (OMP_NUM_THREADS=1): libgomp is not instrumented, and its
#   barriers would be reported as races; the threads above are all ours.
# Both builds are TRAINER_CUDA=EMU (the emulated CUDA module, no nvcc): the
# module's kernels and host code run instrumented in gpu_tests_emu (EMU_ASAN_SPEC,
# EMU_TSAN_SPEC), where device memory is host memory with poisoned guard
# zones (ASan) and each CUDA thread is a fiber TSan sees as a thread, with
# happens-before only where a GPU has it (barriers, warp rendezvous, kernel
# ends): a shared-memory access with no barrier between is reported as a race.
# Any sanitizer report fails the test that made it, so the script fails.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=${SANITIZE_JOBS:-$(nproc)}

# Not in the sanitizer runs: [e2e] launches ranks as processes (the same code
# the one-process tests run, at several times the cost), [serial] times things.
ASAN_SPEC=${ASAN_SPEC:-"~[e2e]~[serial]~[cuda_module]"}
threaded="[checkpoint] [store] [watchdog] [comm] [multirank]"
spec="prefetch*"
for t in $threaded; do spec+=",$t~[e2e]~[serial]"; done
# One multi-process run of the instrumented trainer: Gloo's worker threads
# under asynchronous reductions, gathers and pipeline transfers, the batch
# prefetch and the asynchronous checkpoint writer, together.
spec+=",parallel.overlap on and off give the same run bit for bit"
TSAN_SPEC=${TSAN_SPEC:-$spec}
# The ops of the emulated module under the sanitizers, at the emulator's
# shapes. ASan (~80 s): every op family but the sliding-window attention
# sweeps (the same kernels as [sanitize]'s window case, at a minute more)
# the fp32 ring (the BF16 ring runs the same pieces in a sixth of its time)
# and the vocab-parallel embedding (the plain embedding's kernels on 3 slices).
# TSan (~30 s): attention's race-check subset, the kernel with the most
# shared-memory choreography (cp.async double buffers, ldmatrix, barriers);
# TSan slows fiber switches tenfold, so the other families are ASan's alone.
EMU_ASAN_SPEC=${EMU_ASAN_SPEC:-'[sanitize],[norm],[reduce],[optim],[moe],[cp]~[window]~"gpu ring attention F32*",[embedding]~"gpu vocab-parallel embedding*",[rope],[activation],[elementwise],[loss],[linear]'}
EMU_TSAN_SPEC=${EMU_TSAN_SPEC:-"[race]"}
# The TSan build compiles only the test files holding those tests (found by
# the same tags and names, so a new test of a threaded part is picked up).
tsan_files=$(grep -lE '\[(checkpoint|store|watchdog|comm|multirank)\]|TEST_CASE\("prefetch|parallel\.overlap on and off give the same run bit for bit' \
  tests/test_*.cpp | xargs -n1 basename | paste -sd';')

# A phase's seconds for scripts/test.sh's timing table (when it runs us).
record() { [[ -n "${TRAINER_TIMINGS:-}" ]] && printf '%s\t%d\t%s\n' "$1" "$2" "$3" >> "$TRAINER_TIMINGS"; return 0; }

build() {  # build NAME DIR FLAGS [TEST_FILES]
  local name=$1 dir=$2 flags=$3 files=${4:-} t0=$SECONDS
  mkdir -p "$dir"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Sanitize -DTRAINER_CUDA=EMU "-DTRAINER_TEST_FILES=$files" \
    -DCMAKE_CXX_FLAGS_SANITIZE="-O1 -g1 -fno-omit-frame-pointer -march=x86-64-v2 -fno-math-errno $flags" \
    -DCMAKE_EXE_LINKER_FLAGS_SANITIZE="$flags" -DCMAKE_SHARED_LINKER_FLAGS_SANITIZE="$flags" \
    -DCMAKE_MODULE_LINKER_FLAGS_SANITIZE="$flags" > "$dir/configure.log" 2>&1 ||
    { cat "$dir/configure.log"; record "$name build" $((SECONDS - t0)) FAILED; exit 1; }
  cmake --build "$dir" -j"$jobs" --target unit_tests trainer trainer_cuda_emu gpu_tests_emu emu_runtime_tests > "$dir/build.log" 2>&1 ||
    { tail -40 "$dir/build.log"; record "$name build" $((SECONDS - t0)) FAILED; exit 1; }
  echo "sanitize_ci: $dir configured and built in $((SECONDS - t0)) s"
  record "$name build" $((SECONDS - t0)) ok
}

# The spec's test cases are dealt round-robin to SANITIZE_SHARDS unit_tests
# processes (default: the cores) that run side by side: one process leaves a
# core idle (the TSan run has one OpenMP thread). The cases run, and their
# count, are the spec's; a shard that runs fewer cases than it was dealt fails.
shards=${SANITIZE_SHARDS:-$(nproc)}
report_re='^(==[0-9]+==ERROR|SUMMARY: (Address|UndefinedBehavior|Thread)Sanitizer|WARNING: ThreadSanitizer)|runtime error:'

cases_run() {  # cases_run LOG: the test cases Catch's summaries count (all programs in it)
  sed -nE 's/.*assertions? in ([0-9]+) test cases?.*/\1/p; s/^test cases: *([0-9]+).*/\1/p' "$1" |
    awk '{ n += $1 } END { if (NR) print n }'
}

reported() {  # reported NAME LOG: prints LOG's first sanitizer report; false when it has none
  grep -qE "$report_re" "$2" || return 1
  echo "sanitize_ci: $1 reported (first report):"
  grep -m1 -B2 -A30 -E "^(==[0-9]+==ERROR|WARNING: ThreadSanitizer)|runtime error:" "$2"
}

conclude() {  # conclude NAME T0 RC WHAT LOG: the run's closing line and its timing row; returns RC
  local ok=ok verdict=passed
  (($3 == 0)) || ok=FAILED verdict=FAILED
  echo "sanitize_ci: $1 $4, $verdict in $((SECONDS - $2)) s; log $5"
  record "$1 run" $((SECONDS - $2)) "$ok"
  return "$3"
}

run() {  # run NAME DIR SPEC: unit_tests with the spec; a report fails it
  local name=$1 dir=$2 spec=$3 t0=$SECONDS rc=0 s n got total=0
  local out="$root/$dir"
  (cd "$dir/tests" && ./unit_tests "$spec" --list-test-names-only) | sed '/^[[:space:]]*$/d' > "$out/cases.txt"
  n=$(wc -l < "$out/cases.txt")
  ((n > 0)) || { echo "sanitize_ci: $name: no test case matches $spec"; return 1; }
  local pids=()
  for ((s = 0; s < shards; s++)); do
    # Catch reads each line as a name; ',', '[', ']', '*' and '\' are escaped
    # as ctest's test list escapes them, or a name with a comma matches nothing.
    awk -v s="$s" -v k="$shards" 'NR % k == s' "$out/cases.txt" | sed 's/[],[\\*]/\\&/g' > "$out/cases.$s.txt"
    (cd "$dir/tests" && exec ./unit_tests -f "$out/cases.$s.txt" --durations no > "$out/test.$s.log" 2>&1) &
    pids+=($!)
  done
  for ((s = 0; s < shards; s++)); do
    wait "${pids[s]}" || rc=1
    got=$(cases_run "$out/test.$s.log")
    sed '/^[[:space:]]*$/d' "$out/test.$s.log" | tail -1 | sed "s/^/  shard $s: /"
    if [[ "$got" != "$(wc -l < "$out/cases.$s.txt")" ]]; then
      echo "sanitize_ci: $name shard $s ran ${got:-no} test cases of the $(wc -l < "$out/cases.$s.txt") it was dealt"
      rc=1
    fi
    total=$((total + ${got:-0}))
  done
  cat "$out"/test.[0-9]*.log > "$out/test.log"
  reported "$name" "$out/test.log" && rc=1
  conclude "$name" "$t0" "$rc" "($spec): $total of $n test cases in $shards processes" "$dir/test.log"
}

run_emu() {  # run_emu NAME DIR SPEC: gpu_tests_emu with the spec, then emu_runtime_tests; a report fails it
  local name=$1 dir=$2 spec=$3 t0=$SECONDS rc=0
  local log="$root/$dir/gpu_tests_emu.log"
  # --warn NoTests: a spec that matches nothing fails instead of passing empty.
  "$dir/gpu_tests_emu" "$spec" --durations no --warn NoTests > "$log" 2>&1 || rc=$?
  sed '/^[[:space:]]*$/d' "$log" | tail -1 | sed 's/^/  /'
  if ! grep -q "^gpu_tests: device .*Emulated CUDA device" "$log"; then
    echo "sanitize_ci: $name: gpu_tests_emu did not run on the emulated device:"; head -5 "$log"; rc=1
  fi
  # The emulated runtime itself: its guard zones (under ASan a write past an
  # allocation must be reported at the access), streams, launches.
  "$dir/emu_runtime_tests" >> "$log" 2>&1 || { rc=1; echo "sanitize_ci: $name: emu_runtime_tests failed"; }
  reported "$name" "$log" && rc=1
  conclude "$name" "$t0" "$rc" "(gpu_tests_emu $spec, emu_runtime_tests): $(cases_run "$log") test cases" \
    "$dir/gpu_tests_emu.log"
}

what=("$@")
((${#what[@]})) || what=(asan tsan)
failed=0
for w in "${what[@]}"; do
  case $w in
    asan)
      build asan build-asan "-fsanitize=address,undefined -fno-sanitize-recover=undefined"
      ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        run asan build-asan "$ASAN_SPEC" || failed=1
      ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        run_emu "asan emu" build-asan "$EMU_ASAN_SPEC" || failed=1 ;;
    tsan)
      # No target_clones: their ifunc resolvers run while the loader
      # relocates, before TSan's runtime is up, and crash instrumented.
      build tsan build-tsan "-fsanitize=thread -DTRAINER_NO_SIMD_CLONES" "$tsan_files"
      OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 die_after_fork=0" \
        run tsan build-tsan "$TSAN_SPEC" || failed=1
      OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
        run_emu "tsan emu" build-tsan "$EMU_TSAN_SPEC" || failed=1 ;;
    *) echo "sanitize_ci: unknown sanitizer '$w' (asan or tsan)" >&2; exit 2 ;;
  esac
done
exit $failed
