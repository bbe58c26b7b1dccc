#!/usr/bin/env bash
# Configures and builds into build/ (CUDA backend when nvcc is found).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" > build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
grep -E "trainer: CUDA backend" build-configure.log || true
cmake --build build -j"$(nproc)"
