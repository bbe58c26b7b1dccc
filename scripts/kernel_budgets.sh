#!/usr/bin/env bash
# Kernel resource budgets, checked without a GPU (ctest kernel_budgets).
#
#   scripts/kernel_budgets.sh [BUILD_DIR] [--full] [--suggest] [-j N] [--no-compile]
#
# Compiles every .cu file of the CUDA module for sm_80 and sm_90 (CMakeLists.txt's
# source list, architectures and flags) into BUILD_DIR (default build-budgets/) with
# `-Xptxas -v`, and checks each kernel against kernels/cuda/budgets.tsv: no spills,
# registers within max_regs, the block size the code launches, theoretical occupancy
# at or above the floor. Prints the table (markdown, one row per budget line and
# architecture; every instance goes to BUILD_DIR/kernel_budgets_full.md). Exit 0 all
# within budget, 1 violations (one line each), 2 a tool or input error, 77 (skipped)
# when nvcc is not found. The work is scripts/kernel_budgets.py (Python standard library
# and c++filt); at most two nvcc processes at a time unless -j says otherwise.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

nvcc="${NVCC:-}"
if [[ -z "$nvcc" ]]; then
  nvcc="$(command -v nvcc || true)"
  [[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
fi
if [[ -z "$nvcc" || ! -x "$nvcc" ]]; then
  echo "kernel_budgets: skipped: nvcc not found (set NVCC, put it on PATH or install the CUDA toolkit in /usr/local/cuda)"
  exit 77
fi
if ! command -v python3 >/dev/null; then
  echo "kernel_budgets: python3 not found" >&2
  exit 2
fi
exec python3 "$here/kernel_budgets.py" --nvcc "$nvcc" "$@"
