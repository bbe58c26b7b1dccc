#!/usr/bin/env bash
# The quickstart configuration must pass its own smoke test: the README's first
# command is only as good as this. Data: Debian's fortunes text, prepared here.
set -euo pipefail
trainer=$1 source=$2 work=$3
mkdir -p "$work"
# Prepared again when an older prepare_text.py left no tokenizer_info.json.
if [ ! -f "$work/fortunes/train.bin" ] || [ ! -f "$work/fortunes/tokenizer_info.json" ]; then
  mapfile -t texts < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name '*art*' | sort)
  [ ${#texts[@]} -gt 0 ] || { echo "no /usr/share/games/fortunes texts: run scripts/setup.sh"; exit 1; }
  python3 "$source/scripts/prepare_text.py" --out-dir "$work/fortunes" "${texts[@]}"
fi
"$trainer" --config "$source/configs/quickstart.yaml" \
  --set data.train="[$work/fortunes/train.bin]" --set data.valid="[$work/fortunes/valid.bin]" \
  --set log.progress=lines --smoke-test --steps 100
# `trainer generate` on a checkpoint of the quickstart model (a few steps):
# it prints text that continues the prompt.
"$trainer" --config "$source/configs/quickstart.yaml" \
  --set data.train="[$work/fortunes/train.bin]" --set data.valid="[$work/fortunes/valid.bin]" \
  --set log.progress=lines --set run.dir="$work/run" --set checkpoint.resume=none --set train.steps=20 \
  --set checkpoint.interval=20 --set train.eval_interval=0 --set log.sample_tokens=0 > "$work/train.txt"
grep -q "^tokenizer: bytes, vocabulary 256" "$work/train.txt" || { cat "$work/train.txt"; echo "no tokenizer line"; exit 1; }
"$trainer" generate --checkpoint "$work/run/ckpt" --prompt "The " --tokens 60 > "$work/generated.txt"
cat "$work/generated.txt"
grep -q "^The " "$work/generated.txt" || { echo "generate did not continue the prompt"; exit 1; }
[ "$(wc -c < "$work/generated.txt")" -ge 60 ] || { echo "generate printed too little"; exit 1; }
