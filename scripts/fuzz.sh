#!/usr/bin/env bash
# One long fuzzing run of one reader (tests/fuzz, docs/ARCHITECTURE.md):
#
#   scripts/fuzz.sh TARGET SECONDS      e.g. scripts/fuzz.sh manifest 3600
#   scripts/fuzz.sh --list              the targets
#
# Builds build-fuzz/ with clang++-14 when needed (scripts/fuzz_ci.sh installs
# the compiler on a fresh machine), then runs build-fuzz/fuzz_TARGET for
# SECONDS from its committed seeds (tests/fuzz/corpus/TARGET, read only) and
# the inputs earlier runs kept (build-fuzz/work/TARGET, where new ones go:
# the repository's corpus only changes by hand). A crash, sanitizer report,
# input slower than 1 s or over 512 MiB is written to build-fuzz/findings/
# and the script exits 1 naming it; reproduce with
#   build-fuzz/fuzz_TARGET build-fuzz/findings/FILE
# A finding worth keeping goes, minimised (-minimize_crash=1), into
# tests/fuzz/corpus/TARGET/regression-NAME once the reader is fixed.
#
# Environment: FUZZ_BUILD (build directory, default build-fuzz), FUZZ_JOBS
# (build parallelism, default 2), FUZZ_ARGS (more libFuzzer flags).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${FUZZ_BUILD:-$repo/build-fuzz}"
jobs="${FUZZ_JOBS:-2}"
cxx="${FUZZ_CXX:-clang++-14}"

# Every tests/fuzz/fuzz_NAME.cpp is a target (tests/fuzz/CMakeLists.txt).
targets() { for f in "$repo"/tests/fuzz/fuzz_*.cpp; do f="${f##*/fuzz_}"; echo "${f%.cpp}"; done; }

if [[ "${1:-}" == "--list" ]]; then
  targets
  exit 0
fi
if [[ $# -ne 2 || ! "$2" =~ ^[0-9]+$ ]]; then
  echo "usage: scripts/fuzz.sh TARGET SECONDS   (targets: $(targets | xargs))" >&2
  exit 2
fi
target="$1"
seconds="$2"
if ! targets | grep -qx "$target"; then
  echo "fuzz.sh: unknown target '$target' (targets: $(targets | xargs))" >&2
  exit 2
fi
if ! command -v "$cxx" >/dev/null; then
  echo "fuzz.sh: $cxx not found: apt-get install -y clang-14 libclang-rt-14-dev (or run scripts/fuzz_ci.sh as root)" >&2
  exit 2
fi

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$repo/tests/fuzz" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
fi
cmake --build "$build" -j"$jobs" --target "fuzz_$target" >/dev/null

work="$build/work/$target"
findings="$build/findings"
mkdir -p "$work" "$findings"
dict=()
[[ -f "$repo/tests/fuzz/dict/$target.dict" ]] && dict=(-dict="$repo/tests/fuzz/dict/$target.dict")
log="$build/work/$target.log"

echo "fuzz.sh: fuzz_$target for ${seconds} s; corpus $work (+ tests/fuzz/corpus/$target), log $log"
# shellcheck disable=SC2086  # FUZZ_ARGS is a list of flags
set +e
"$build/fuzz_$target" -max_total_time="$seconds" -timeout=1 -rss_limit_mb=512 -malloc_limit_mb=512 \
  -print_final_stats=1 -artifact_prefix="$findings/$target-" "${dict[@]}" ${FUZZ_ARGS:-} \
  "$work" "$repo/tests/fuzz/corpus/$target" >"$log" 2>&1
rc=$?
set -e

# The last status line ("#N DONE cov: C ft: F corp: K/S ...") and the final
# statistics say how far it got.
last="$(grep -aE '^#[0-9]+' "$log" | tail -1 || true)"
execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")"
ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")"
corp="$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")"
echo "fuzz.sh: $target: ${execs:-?} executions (${rate:-?}/s), coverage ${cov:-?} edges, ${ft:-?} features, corpus ${corp:-?}"

if [[ $rc -ne 0 ]]; then
  artifact="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)"
  summary="$(grep -a -m1 -E 'SUMMARY|ERROR: libFuzzer|==ERROR' "$log" || true)"
  echo "fuzz.sh: $target: FINDING: ${summary:-exit code $rc}" >&2
  echo "fuzz.sh: reproducer: ${artifact:-none written (see $log)}" >&2
  echo "fuzz.sh: reproduce with: $build/fuzz_$target ${artifact:-}" >&2
  exit 1
fi
