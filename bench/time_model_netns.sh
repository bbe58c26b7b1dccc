#!/usr/bin/env bash
# The planner's time model against measured steps on the namespace cluster
# (issue 44 item 4), with the hardware entry `trainer calibrate` measures on
# the same cluster and launch: two nodes (scripts/netns_cluster.sh, root),
# the link between them shaped to RATE, one thread per rank.
#   bash bench/time_model_netns.sh [TRAINER_BIN] [RATE] [STEPS]
# The model: bench/netns_bench_lib.sh's with MODEL (environment, --set
# words) over it, e.g.
#   MODEL="--set model.d_model=256 --set model.max_seq_len=128 --set train.seq_len=128"
#
# Part 1, six layouts on 2 nodes x 2 ranks: calibrated once on that launch
# (its matmul rate is each rank's with all four running, as in a step), then
# each layout run with hardware.calibration; per layout the run's "step time
# model" (planner/step_estimate.h) next to the measured step, exposed
# communication and, for the pipelines, the measured idle per stage next to
# the bubble of the schedule simulated on the calibrated compute and link.
# Part 2, tensor parallelism inside a node (1 node x 2 ranks) against across
# the shaped link (2 nodes x 1 rank), each calibrated on its own launch, and
# one process as the base: the measured scaling efficiency T1 / (2 T_tp2)
# next to the planner's on the same entry.
# Prints markdown; asserts nothing (not a test).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/netns_bench_lib.sh
source bench/netns_bench_lib.sh "$@"
MODEL=${MODEL:-}
SIZES="--min-kib 64 --max-mib 16"  # below 64 KiB tbf's burst makes the emulated link no line

calibrate() {  # NAME: writes $WORK/NAME.yaml on the launch NODES x RANKS_PER_NODE
  # shellcheck disable=SC2086
  SUB=calibrate EXTRA="$MODEL" run "$1" --out "$WORK/$1.yaml" $SIZES
  [ -s "$WORK/$1.yaml" ] || { cat "$WORK/$1.log" "$WORK/$1".node*.log >&2; echo "calibrate $1 failed" >&2; exit 1; }
  sed -n '/^hardware:/,$p' "$WORK/$1.yaml" | grep -v '^ *#' | tr -s ' ' | paste -sd' ' | sed 's/^/    /'
}

# One row: the run's step model next to its measurements, over the steps
# after the first log window (warm-up).
row() {  # NAME LABEL
  grep -q step_model "$WORK/$1/metrics.jsonl" 2>/dev/null ||
    { tail -5 "$WORK/$1.log" "$WORK/$1".node*.log >&2; echo "run $1: no step model in its metrics" >&2; exit 1; }
  /usr/bin/python3 - "$WORK/$1/metrics.jsonl" "$2" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
model = [r["step_model"] for r in rows if "step_model" in r][0]
steps = [r["ms_per_step"] for r in rows if "ms_per_step" in r][1:]
times = [r["time_ms"] for r in rows if "time_ms" in r][1:]
meas = sum(steps) / len(steps)
# Exposed: every group's blocked time but the host group's (loss sums, flags).
exposed = sum(sum(v for k, v in t.items() if k.startswith("comm_") and k != "comm_host") for t in times) / len(times)
compute = sum(t["forward"] + t["backward"] for t in times) / len(times)
idle = [r["pipeline_idle"] for r in rows if "pipeline_idle" in r][1:]
pipe = ""
if idle:
    stages = [100 * sum(w[s] for w in idle) / len(idle) for s in range(len(idle[0]))]
    mean = sum(stages) / len(stages)
    pipe = (f"{' / '.join(f'{x:.0f}' for x in stages)} (mean {mean:.1f}) vs {100 * model['pipeline_bubble']:.1f}:"
            f" {mean - 100 * model['pipeline_bubble']:+.1f} points")
p = model["predicted_ms"]
print(f"| {sys.argv[2]} | {p:.1f} | {meas:.1f} | {p / meas:.2f} | {model['compute_ms']:.1f} | {compute:.1f} | "
      f"{model['exposed_ms'] + model['idle_ms']:.1f} | {exposed:.1f} | {pipe} |")
print(f"{sys.argv[2]}\t{p}\t{meas}", file=open(sys.argv[1] + ".rank", "w"))
EOF
  cat "$WORK/$1/metrics.jsonl.rank" >> "$WORK/ranking.tsv"
}

PARTS=${PARTS:-12}  # which parts to run: 1, 2 or 12
echo "Link $RATE between 2 nodes; model ${MODEL:-as bench/netns_bench_lib.sh}; $STEPS steps, one thread per rank;"
echo "measured: means over the log windows after the first (ms per step)."
if [[ $PARTS == *1* ]]; then
echo
echo "Calibration, 2 nodes x 2 ranks (\`trainer calibrate $SIZES\`, the same launch):"
calibrate cal4
EXTRA="$MODEL --set hardware.calibration=$WORK/cal4.yaml"
echo
echo "| layout (2 nodes x 2 ranks) | predicted step | measured step | predicted / measured | predicted compute | measured compute | predicted exposed + idle | measured exposed | pipeline idle per stage, measured vs simulated bubble (%) |"
echo "|---|---|---|---|---|---|---|---|---|"
: > "$WORK/ranking.tsv"
for layout in "dp4 ZeRO-1|--set parallel.zero_stage=1" "dp4 ZeRO-3|--set parallel.zero_stage=3" \
              "tp2 (in node) x dp2|--set parallel.tp=2" \
              "pp2 (across) x dp2, 1f1b|--set parallel.pp=2 --set parallel.pp_schedule=1f1b" \
              "pp2 (across) x dp2, zb-h1|--set parallel.pp=2 --set parallel.pp_schedule=zb-h1" \
              "cp2 (in node) x dp2|--set parallel.cp=2"; do
  label=${layout%%|*}
  name=$(echo "$label" | tr -c 'a-z0-9' '_')
  # shellcheck disable=SC2086
  run "$name" ${layout#*|}
  row "$name" "$label"
done
/usr/bin/python3 - "$WORK/ranking.tsv" <<'EOF'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
by = lambda i: [r[0] for r in sorted(rows, key=lambda r: float(r[i]))]
pred, meas = by(1), by(2)
worst = max(abs(float(r[1]) / float(r[2]) - 1) for r in rows)
print(f"\nmeasured order, fastest first: {', '.join(meas)}\npredicted order: {', '.join(pred)}\n"
      f"same ranking: {'yes' if pred == meas else 'no'}; largest error of a predicted step: {100 * worst:.1f}%")
EOF
fi
[[ $PARTS == *2* ]] || exit 0

echo
echo "Tensor parallelism inside a node and across the link: scaling efficiency T1 / (2 T_tp2), measured and planned."
echo
: > "$WORK/ranking.tsv"
echo "Calibration, 1 node x 2 ranks:"
NODES=1 RANKS_PER_NODE=2 calibrate in1x2
echo "Calibration, 2 nodes x 1 rank:"
NODES=2 RANKS_PER_NODE=1 calibrate across2x1
echo
echo "| run | predicted step | measured step | predicted / measured | predicted compute | measured compute | predicted exposed + idle | measured exposed | |"
echo "|---|---|---|---|---|---|---|---|---|"
# One node measured no network; the runs on this entry never cross one.
EXTRA="$MODEL --set hardware.calibration=$WORK/in1x2.yaml --set hardware.network_gbit_s=1"
NODES=1 RANKS_PER_NODE=1 run one_in
row one_in "one process (entry: 1 x 2)"
NODES=1 RANKS_PER_NODE=2 run tp_in --set parallel.tp=2
row tp_in "tp2 inside a node"
EXTRA="$MODEL --set hardware.calibration=$WORK/across2x1.yaml"
NODES=1 RANKS_PER_NODE=1 run one_across
row one_across "one process (entry: 2 x 1)"
NODES=2 RANKS_PER_NODE=1 run tp_across --set parallel.tp=2
row tp_across "tp2 across the link"
/usr/bin/python3 - "$WORK/ranking.tsv" <<'EOF'
import sys
v = {r[0]: (float(r[1]), float(r[2])) for r in (l.rstrip("\n").split("\t") for l in open(sys.argv[1]))}
print("\n| tp2 | measured efficiency | planner's efficiency |\n|---|---|---|")
for where, one, tp in (("inside a node", "one process (entry: 1 x 2)", "tp2 inside a node"),
                       ("across the link", "one process (entry: 2 x 1)", "tp2 across the link")):
    print(f"| {where} | {100 * v[one][1] / (2 * v[tp][1]):.0f}% | {100 * v[one][0] / (2 * v[tp][0]):.0f}% |")
EOF
