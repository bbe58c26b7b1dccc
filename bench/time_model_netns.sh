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
# Part 1, a job of 2 ranks, one per core of this machine: six layouts (dp2
# ZeRO-1 and ZeRO-3 across the link, tp2 in a node, pp2 across with 1f1b and
# zb-h1, cp2 across), then tp2 across and one process for tp's scaling
# efficiency T(one) / (2 T(tp2)). One hardware entry: `trainer calibrate` on
# 2 nodes x 1 rank (the link across, the matmul rate) and on 1 node x 2
# ranks (the link inside). Per layout the run's "step time model"
# (planner/step_estimate.h) next to the measured step, compute, exposed
# communication and, for the pipelines, the measured idle per stage next to
# the idle of the schedule simulated on the calibrated compute and link.
# Part 2, the six layouts on 2 nodes x 2 ranks, calibrated on that launch:
# four ranks share this machine's cores.
# PARTS (environment): 1, 2 or 12 (default).
# Prints markdown; asserts nothing (not a test).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/netns_bench_lib.sh
source bench/netns_bench_lib.sh "$@"
MODEL=${MODEL:-}
SIZES="--min-kib 64 --max-mib 16"  # below 64 KiB tbf's burst makes the emulated link no line

calibrate() {  # NAME: writes $WORK/NAME.yaml on the launch NODES x RANKS_PER_NODE (EXTRA: more settings)
  # shellcheck disable=SC2086
  SUB=calibrate EXTRA="$MODEL ${EXTRA:-}" run "$1" --out "$WORK/$1.yaml" $SIZES
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
    # The simulated schedule's idle per stage as a share of the whole
    # predicted step, as the measured one is of the measured step.
    sim = [100 * x / model["predicted_ms"] for x in model["pipeline_idle_ms"]]
    pipe = (f"{' / '.join(f'{x:.1f}' for x in stages)} vs {' / '.join(f'{x:.1f}' for x in sim)}; mean "
            f"{mean:.1f} vs {sum(sim) / len(sim):.1f}: {mean - sum(sim) / len(sim):+.1f} points")
p = model["predicted_ms"]
print(f"| {sys.argv[2]} | {p:.1f} | {meas:.1f} | {p / meas:.2f} | {model['compute_ms']:.1f} | {compute:.1f} | "
      f"{model['exposed_ms'] + model['idle_ms']:.1f} | {exposed:.1f} | {pipe} |")
print(f"{sys.argv[2]}\t{p}\t{meas}", file=open(sys.argv[1] + ".rank", "w"))
EOF
  cat "$WORK/$1/metrics.jsonl.rank" >> "$WORK/ranking.tsv"
}

PARTS=${PARTS:-12}  # 1: the layouts of a 2-rank job; 2: the same on 2 nodes x 2 ranks (4 ranks on this machine's cores)
echo "Link $RATE between 2 nodes; model ${MODEL:-as bench/netns_bench_lib.sh}; $STEPS steps, one thread per rank;"
echo "measured: means over the log windows after the first (ms per step)."

# One hardware entry for every run: the link across nodes and the matmul
# rate calibrated on 2 nodes x 1 rank, the link inside a node on 1 node x
# 2 ranks (set over it for the run that has one node).
echo
echo "Calibration, 2 nodes x 1 rank (\`trainer calibrate $SIZES\`):"
NODES=2 RANKS_PER_NODE=1 calibrate across
echo "Calibration, 1 node x 2 ranks:"
NODES=1 RANKS_PER_NODE=2 calibrate inside
key() { sed -n "s/^  $2: //p" "$WORK/$1.yaml"; }
ACROSS="$MODEL --set hardware.calibration=$WORK/across.yaml"
INSIDE="$ACROSS --set hardware.gpus_per_node=2 --set hardware.nvlink_gb_s=$(key inside nvlink_gb_s)
  --set hardware.nvlink_latency_us=$(key inside nvlink_latency_us)"

header() {
  echo
  echo "| $1 | predicted step | measured step | predicted / measured | predicted compute | measured compute | predicted exposed + idle | measured exposed | pipeline idle per stage, measured vs simulated, % of the step |"
  echo "|---|---|---|---|---|---|---|---|---|"
  : > "$WORK/ranking.tsv"
}
ranking() {
  /usr/bin/python3 - "$WORK/ranking.tsv" <<'EOF'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
by = lambda i: [r[0] for r in sorted(rows, key=lambda r: float(r[i]))]
pred, meas = by(1), by(2)
worst = max(abs(float(r[1]) / float(r[2]) - 1) for r in rows)
print(f"\nmeasured order, fastest first: {', '.join(meas)}\npredicted order: {', '.join(pred)}\n"
      f"same ranking: {'yes' if pred == meas else 'no'}; largest error of a predicted step: {100 * worst:.1f}%")
EOF
}
layout() {  # NODES RANKS_PER_NODE ENTRY LABEL SETTINGS...
  local nodes=$1 per=$2 entry=$3 label=$4 name
  shift 4
  name=$(echo "$label" | tr -c 'a-z0-9' '_')
  # shellcheck disable=SC2086
  NODES=$nodes RANKS_PER_NODE=$per EXTRA="$entry" run "$name" "$@"
  row "$name" "$label"
}

if [[ $PARTS == *1* ]]; then
header "layout, a job of 2 ranks"
layout 2 1 "$ACROSS" "dp2 ZeRO-1 (across)" --set parallel.zero_stage=1
layout 2 1 "$ACROSS" "dp2 ZeRO-3 (across)" --set parallel.zero_stage=3
layout 1 2 "$INSIDE" "tp2 (in a node)" --set parallel.tp=2
layout 2 1 "$ACROSS" "pp2 (across), 1f1b" --set parallel.pp=2 --set parallel.pp_schedule=1f1b
layout 2 1 "$ACROSS" "pp2 (across), zb-h1" --set parallel.pp=2 --set parallel.pp_schedule=zb-h1
layout 2 1 "$ACROSS" "cp2 (across)" --set parallel.cp=2
ranking
layout 2 1 "$ACROSS" "tp2 (across)" --set parallel.tp=2 --set parallel.tp_across_nodes=true
layout 1 1 "$ACROSS" "one process"
/usr/bin/python3 - "$WORK/ranking.tsv" <<'EOF'
import sys
v = {r[0]: (float(r[1]), float(r[2])) for r in (l.rstrip("\n").split("\t") for l in open(sys.argv[1]))}
one = v["one process"]
print("\nTensor parallelism's scaling efficiency, T(one process) / (2 T(tp2)), same global batch:\n")
print("| tp2 | measured | planner's |\n|---|---|---|")
for where, tp in (("inside a node", "tp2 (in a node)"), ("across the link", "tp2 (across)")):
    print(f"| {where} | {100 * one[1] / (2 * v[tp][1]):.0f}% | {100 * one[0] / (2 * v[tp][0]):.0f}% |")
EOF
fi

if [[ $PARTS == *2* ]]; then
# Four ranks on this machine's cores: each rank's compute shares a core
# with another rank and with both ranks' communication threads, which no
# time model of GPUs prices. Calibrated on the same launch.
echo
echo "Calibration, 2 nodes x 2 ranks:"
NODES=2 RANKS_PER_NODE=2 calibrate cal4
header "layout, 2 nodes x 2 ranks"
for spec in "dp4 ZeRO-1|--set parallel.zero_stage=1" "dp4 ZeRO-3|--set parallel.zero_stage=3" \
            "tp2 (in node) x dp2|--set parallel.tp=2" \
            "pp2 (across) x dp2, 1f1b|--set parallel.pp=2 --set parallel.pp_schedule=1f1b" \
            "pp2 (across) x dp2, zb-h1|--set parallel.pp=2 --set parallel.pp_schedule=zb-h1" \
            "cp2 (in node) x dp2|--set parallel.cp=2"; do
  # shellcheck disable=SC2086
  layout 2 2 "$MODEL --set hardware.calibration=$WORK/cal4.yaml" "${spec%%|*}" ${spec#*|}
done
ranking
fi
