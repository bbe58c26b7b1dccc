#!/usr/bin/env bash
# The quickstart configuration must pass its own smoke test: the README's first
# command is only as good as this. Data: Debian's fortunes text, prepared here.
set -euo pipefail
trainer=$1 source=$2 work=$3
mkdir -p "$work"
if [ ! -f "$work/fortunes/train.bin" ]; then
  mapfile -t texts < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name '*art*' | sort)
  [ ${#texts[@]} -gt 0 ] || { echo "no /usr/share/games/fortunes texts: run scripts/setup.sh"; exit 1; }
  python3 "$source/scripts/prepare_text.py" --out-dir "$work/fortunes" "${texts[@]}"
fi
"$trainer" --config "$source/configs/quickstart.yaml" \
  --set data.train="[$work/fortunes/train.bin]" --set data.valid="[$work/fortunes/valid.bin]" \
  --set log.progress=lines --smoke-test --steps 100
