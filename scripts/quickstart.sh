#!/usr/bin/env bash
# Sets up, builds, prepares English text (the quotations of Debian's
# `fortunes` package, installed by setup.sh) and trains configs/quickstart.yaml,
# which ends by printing text the model generates.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
if [ ! -f data/fortunes/train.bin ]; then
  mapfile -t texts < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name '*art*' | sort)
  python3 scripts/prepare_text.py --out-dir data/fortunes "${texts[@]}"
fi
exec build/trainer --config configs/quickstart.yaml "$@"
