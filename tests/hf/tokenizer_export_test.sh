#!/usr/bin/env bash
# Runs tokenizer_export_test.py with the Python that has transformers:
# .venv-hf (scripts/setup.sh) if there, else Debian's. Exit 77 from it means
# a package is missing (ctest: skipped).
set -euo pipefail
BIN=$1 SRC=$2 WORK=$3
py="$SRC/.venv-hf/bin/python"
[ -x "$py" ] || py=/usr/bin/python3
exec "$py" "$SRC/tests/hf/tokenizer_export_test.py" "$BIN" "$SRC" "$WORK"
