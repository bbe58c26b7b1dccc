#!/usr/bin/env bash
# Runs hf_eval_test.py with the Python that has transformers, as
# hf_interop_test.sh does. Exit 77 from it means the package is missing
# (ctest: skipped).
set -euo pipefail
BIN=$1 SRC=$2 WORK=$3
py="$SRC/.venv-hf/bin/python"
[ -x "$py" ] || py=/usr/bin/python3
exec "$py" "$SRC/tests/hf/hf_eval_test.py" "$BIN" "$SRC" "$WORK"
