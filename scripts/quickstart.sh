#!/usr/bin/env bash
# Sets up, builds, prepares English text that every Debian machine has
# (/usr/share/common-licenses) and trains configs/quickstart.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
[ -f data/licenses/train.bin ] || python3 scripts/prepare_text.py --out-dir data/licenses '/usr/share/common-licenses/*'
exec build/trainer --config configs/quickstart.yaml "$@"
