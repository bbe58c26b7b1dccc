#!/usr/bin/env bash
# Configures and builds into build/ (CUDA backend when nvcc is found):
#
#   scripts/build.sh [--target T]... [CMAKE-CONFIGURE-ARGS...]
#
# With no --target everything is built (the tests too when Catch2 is there);
# scripts/quickstart.sh builds `trainer` alone, which brings the CUDA module
# with it where nvcc is found.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
configure=()
while (($#)); do
  case $1 in
    --target) [ $# -ge 2 ] || { echo "build.sh: --target needs a name" >&2; exit 2; }
              targets+=(--target "$2"); shift 2 ;;
    *) configure+=("$1"); shift ;;
  esac
done
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${configure[@]}" > build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
grep -E "trainer: (CUDA backend|tests|compiler cache)" build-configure.log || true
cmake --build build -j"$(nproc)" "${targets[@]}"
