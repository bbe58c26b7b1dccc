#!/usr/bin/env bash
# Every fuzz target of tests/fuzz (docs/ARCHITECTURE.md), bounded for CI:
#
#   scripts/fuzz_ci.sh
#
# Installs clang-14 and libFuzzer's runtime when missing (apt-get: CI is a
# fresh Debian machine, as root), builds build-fuzz/, then for each target
#   1. runs every committed input of tests/fuzz/corpus/TARGET once (the seeds
#      and the regression-* reproducers of fixed findings);
#   2. fuzzes from them for FUZZ_CI_SECONDS (default: FUZZ_CI_BUDGET, 200 s,
#      shared out over the targets: about 4 minutes in all on 2 cores),
#      with a fresh scratch corpus (build-fuzz/ci-work, thrown away).
# A finding is a crash, a sanitizer report (ASan, UBSan), an input slower
# than 1 s or one that takes over 512 MiB. Any finding fails the script
# (exit 1), naming the target and the reproducer file (build-fuzz/findings/,
# or the corpus file that failed); reproduce with
#   build-fuzz/fuzz_TARGET FILE
# The summary table says how far each target got (executions per second,
# coverage).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${FUZZ_BUILD:-$repo/build-fuzz}"
jobs="${FUZZ_JOBS:-2}"
budget="${FUZZ_CI_BUDGET:-200}"
limits=(-timeout=1 -rss_limit_mb=512 -malloc_limit_mb=512)
start=$SECONDS

say() { echo "fuzz_ci: $*"; }
# A phase's seconds for scripts/test.sh's timing table (when it runs us).
record() {
  [[ -n "${TRAINER_TIMINGS:-}" ]] && printf '%s\t%d\t%s\n' "$1" "$2" "$3${TRAINER_TIMING_NOTE:+ $TRAINER_TIMING_NOTE}" >> "$TRAINER_TIMINGS"
  return 0
}
die() { echo "fuzz_ci: $*" >&2; exit 2; }

# --- tools ------------------------------------------------------------------
# libFuzzer lives in libclang-rt-14-dev, not in the compiler package.
have_tools() {
  command -v clang++-14 >/dev/null && command -v cmake >/dev/null && command -v make >/dev/null &&
    compgen -G "/usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" >/dev/null &&
    [[ -f /usr/include/yaml-cpp/yaml.h && -f /usr/include/nlohmann/json.hpp ]]
}
if ! have_tools; then
  packages=(clang-14 libclang-rt-14-dev cmake make libyaml-cpp-dev nlohmann-json3-dev)
  sudo=()
  [[ $(id -u) -ne 0 ]] && sudo=(sudo)
  say "installing ${packages[*]}"
  "${sudo[@]}" apt-get update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}" \
    >/dev/null || die "apt-get install ${packages[*]} failed"
  have_tools || die "clang-14 / libclang-rt-14-dev still missing after apt-get install"
fi

# --- build ------------------------------------------------------------------
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$repo/tests/fuzz" -B "$build" -DCMAKE_CXX_COMPILER=clang++-14 >/dev/null || die "cmake configure failed"
fi
build_start=$SECONDS
cmake --build "$build" -j"$jobs" >"$build/build.log" 2>&1 ||
  { tail -40 "$build/build.log" >&2; record "fuzz build" $((SECONDS - build_start)) FAILED; die "build failed"; }
say "built in $((SECONDS - build_start)) s"
record "fuzz build" $((SECONDS - build_start)) ok

targets=()
for f in "$repo"/tests/fuzz/fuzz_*.cpp; do
  f="${f##*/fuzz_}"
  targets+=("${f%.cpp}")
done
seconds="${FUZZ_CI_SECONDS:-$((budget / ${#targets[@]}))}"
((seconds < 5)) && seconds=5
say "${#targets[@]} targets, ${seconds} s of fuzzing each"

findings="$build/findings"
scratch="$build/ci-work"
rm -rf "$scratch"
mkdir -p "$findings" "$scratch"

failed=()
rows=()
fuzz_start=$SECONDS
for t in "${targets[@]}"; do
  bin="$build/fuzz_$t"
  corpus="$repo/tests/fuzz/corpus/$t"
  log="$scratch/$t.log"
  dict=()
  [[ -f "$repo/tests/fuzz/dict/$t.dict" ]] && dict=(-dict="$repo/tests/fuzz/dict/$t.dict")

  # 1. The committed inputs, each once: a file that fails is the reproducer.
  mapfile -t inputs < <(find "$corpus" -type f 2>/dev/null | sort)
  if ((${#inputs[@]} > 0)); then
    if ! "$bin" "${limits[@]}" "${inputs[@]}" >"$scratch/$t.regression.log" 2>&1; then
      bad="$(sed -n 's/^Running: //p' "$scratch/$t.regression.log" | tail -1)"
      summary="$(grep -a -m1 -E 'SUMMARY|ERROR: libFuzzer|==ERROR' "$scratch/$t.regression.log")"
      failed+=("$t: committed input ${bad#"$repo"/} fails: ${summary:-see $scratch/$t.regression.log}")
      rows+=("$(printf '%-20s %10s %8s %7s  %s' "$t" - - - "FAILED (corpus)")")
      continue
    fi
  fi

  # 2. Fuzz from them. New inputs go to a scratch directory, never the repository.
  mkdir -p "$scratch/$t"
  "$bin" "${limits[@]}" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$findings/$t-" \
    "${dict[@]}" "$scratch/$t" "$corpus" >"$log" 2>&1
  rc=$?
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
  cov="$(grep -aE '^#[0-9]+' "$log" | tail -1 | sed -n 's/.* cov: \([0-9]*\).*/\1/p')"
  if ((rc != 0)); then
    artifact="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)"
    summary="$(grep -a -m1 -E 'SUMMARY|ERROR: libFuzzer|==ERROR' "$log")"
    failed+=("$t: ${summary:-exit code $rc}; reproducer ${artifact:-none, see $log}")
    status="FINDING"
  else
    status="ok"
  fi
  rows+=("$(printf '%-20s %10s %8s %7s  %s' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "$status")")
done

echo
printf '%-20s %10s %8s %7s  %s\n' target executions execs/s cov result
printf '%s\n' "${rows[@]}"
say "fuzzing took $((SECONDS - fuzz_start)) s, everything $((SECONDS - start)) s"
record "fuzz run" $((SECONDS - fuzz_start)) "$( ((${#failed[@]} == 0)) && echo ok || echo FAILED)"
if ((${#failed[@]} > 0)); then
  for f in "${failed[@]}"; do echo "fuzz_ci: FINDING in $f" >&2; done
  echo "fuzz_ci: reproduce with $build/fuzz_TARGET FILE; fix the reader, then add the minimised file as" \
    "tests/fuzz/corpus/TARGET/regression-NAME" >&2
  exit 1
fi
say "no findings"
