#!/usr/bin/env bash
# Overlap against its bound on a shaped link (issue 44 item 3): two namespace
# nodes of one rank each (scripts/netns_cluster.sh, root), one thread per
# rank, the link between them shaped to RATE. Per layout a baseline run
# (parallel.overlap false, with a timeline of two steps) and an overlapped one;
# bench/overlap_bound.py reads the baseline's timeline for what each
# collective costs on the wire and where it was issued, and prints the bound
# on the exposure next to the measured one. Prints markdown; asserts nothing.
#   bash bench/overlap_bound_netns.sh [TRAINER_BIN] [RATE] [STEPS]
# The model: bench/netns_bench_lib.sh's (llama d_model 128, 4 layers, 16 x 64
# tokens a step) with MODEL (environment, --set words) over it, e.g.
#   MODEL="--set model.d_model=256 --set model.max_seq_len=128 --set train.seq_len=128"
set -euo pipefail
cd "$(dirname "$0")/.."
export RANKS_PER_NODE=1
# shellcheck source=bench/netns_bench_lib.sh
source bench/netns_bench_lib.sh "$@"
EXTRA="${MODEL:-}"
rate_mbit=$(python3 -c "import re,sys; m=re.fullmatch(r'(\d+(?:\.\d+)?)(k|m|g)bit', '$RATE'); \
print(float(m[1]) * {'k': 1e-3, 'm': 1, 'g': 1e3}[m[2]]) if m else sys.exit('RATE like 100mbit')")
last=$((STEPS - 1))
echo "Link $RATE between 2 nodes of one rank (one thread) each; model ${MODEL:-as bench/netns_bench_lib.sh}; $STEPS steps, the means of the steps after the first two; ms per step."
echo
echo "| layout | baseline step | baseline exposed (share) | baseline parts | bound on exposed | step, overlap | exposed, overlap | exposed - bound, points of the baseline step | largest reduction |"
echo "|---|---|---|---|---|---|---|---|---|"
for layout in "dp2 ZeRO-1|dp_cp|--set parallel.zero_stage=1" "dp2 ZeRO-3|dp_cp|--set parallel.zero_stage=3"; do
  label=${layout%%|*}
  rest=${layout#*|}
  group=${rest%%|*}
  set -- ${rest#*|}
  run off "$@" --set parallel.overlap=false --set log.interval=1 --set log.trace=$last-$STEPS
  run on "$@" --set parallel.overlap=true --set log.interval=1
  /usr/bin/python3 bench/overlap_bound.py "$WORK/off" "$WORK/on" "$group" "$rate_mbit" "$label"
  rm -rf "$WORK/on" "$WORK/off"
done
echo
echo "| ring | baseline step | wire time per group (baseline timeline) | communication | compute, overlap | step, overlap | step / max(compute, communication) |"
echo "|---|---|---|---|---|---|---|"
run off --set parallel.cp=2 --set parallel.overlap=false --set log.interval=1 --set log.trace=$last-$STEPS
run on --set parallel.cp=2 --set parallel.overlap=true --set log.interval=1
/usr/bin/python3 bench/overlap_bound.py --ring "$WORK/off" "$WORK/on" "cp2"
