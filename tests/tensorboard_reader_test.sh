#!/usr/bin/env bash
# Runs tensorboard_reader_test.py with the Python that has the tensorboard
# package: .venv-tensorboard (scripts/setup.sh) if there, else Debian's.
# Exit 77 from it means the package is missing (ctest: skipped).
set -euo pipefail
BIN=$1 SRC=$2 WORK=$3
py="$SRC/.venv-tensorboard/bin/python"
[ -x "$py" ] || py=/usr/bin/python3
exec "$py" "$SRC/tests/tensorboard_reader_test.py" "$BIN" "$SRC" "$WORK"
