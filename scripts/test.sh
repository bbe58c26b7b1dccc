#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (C++ tests and the PyTorch reference).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build
ctest --output-on-failure --no-tests=error -j"$(nproc)" --timeout 1500
