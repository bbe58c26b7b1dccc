#!/usr/bin/env bash
# scripts/plot_schedule.py draws `trainer schedule`'s timeline: a PNG with
# one row per rank comes out; input without a timeline is refused.
set -euo pipefail
BIN=$1 SRC=$2 WORK=$3
rm -rf "$WORK" && mkdir -p "$WORK"
"$BIN" schedule --config "$SRC/configs/tiny.yaml" --set parallel.pp=4 --set train.micro_batch_size=2 \
  --set model.n_layers=4 > "$WORK/schedule.txt"
/usr/bin/python3 "$SRC/scripts/plot_schedule.py" "$WORK/schedule.txt" "$WORK/schedule.png" | tee "$WORK/out.txt"
grep -q "plot_schedule: 4 ranks" "$WORK/out.txt"
# A PNG file: its 8-byte signature, and more than a blank image's few bytes.
[ "$(head -c 8 "$WORK/schedule.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ]
[ "$(stat -c %s "$WORK/schedule.png")" -gt 5000 ]
echo "no timeline here" > "$WORK/bad.txt"
if /usr/bin/python3 "$SRC/scripts/plot_schedule.py" "$WORK/bad.txt" "$WORK/bad.png" 2> "$WORK/err.txt"; then
  echo "plot_schedule accepted an input without a timeline"; exit 1
fi
grep -q "no 'rank N |...|' timeline rows" "$WORK/err.txt"
echo "plot_schedule: PNG drawn ($(stat -c %s "$WORK/schedule.png") bytes), bad input refused"
