#!/usr/bin/env bash
# Overlap measured on a shaped link: two namespace "nodes" of two ranks each
# (scripts/netns_cluster.sh, root), the link between them shaped to RATE, and
# per layout the exposed communication per step (the time rank 0 waited in
# the data-parallel group; the pipeline's idle for pp) with
# parallel.overlap true and false (the no-overlap baseline), the group's
# busy time, the step time, and for the pipeline the measured idle next to
# the simulated bubble. Prints a markdown table. Not a test: nothing is
# asserted.
#   bash bench/overlap_netns.sh [TRAINER_BIN] [RATE] [STEPS]
# RANKS_PER_NODE=1 (environment) runs one rank per node: with 2 cores each
# rank then has a core of its own (the dp rows become dp2, the pipeline
# pp 2 alone).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/netns_bench_lib.sh
source bench/netns_bench_lib.sh "$@"
# Per step, over the windows after the first (start-up excluded): step ms,
# the group's exposed and busy ms.
window_means() {  # RUN_DIR GROUP
  python3 - "$1/metrics.jsonl" "$2" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "ms_per_step" in r][1:]
times = [r for r in rows if "time_ms" in r][1:]
g = sys.argv[2]
step = sum(r["ms_per_step"] for r in steps) / len(steps)
exposed = sum(r["time_ms"]["comm_" + g] for r in times) / len(times)
busy = sum(r["comm_busy_ms"][g] for r in times) / len(times)
print(f"{step:.1f} {exposed:.1f} {busy:.1f}")
EOF
}
echo "| layout (2 nodes x $RANKS_PER_NODE ranks, link $RATE) | group | step ms, overlap | step ms, none | exposed ms, overlap | exposed ms, none | exposed / baseline | busy ms, overlap |"
echo "|---|---|---|---|---|---|---|---|"
# label|group|settings: dp over all four ranks, and the context-parallel
# ring over all four (its passes cross the link twice per ring).
W=$((2 * RANKS_PER_NODE))
for layout in "dp$W ZeRO-0|dp_cp|--set parallel.zero_stage=0" "dp$W ZeRO-3|dp_cp|--set parallel.zero_stage=3" \
              "cp$W|cp|--set parallel.cp=$W"; do
  label=${layout%%|*}
  rest=${layout#*|}
  group=${rest%%|*}
  set -- ${rest#*|}
  run on "$@" --set parallel.overlap=true
  run off "$@" --set parallel.overlap=false
  read -r s_on e_on b_on < <(window_means "$WORK/on" "$group")
  read -r s_off e_off b_off < <(window_means "$WORK/off" "$group")
  ratio=$(python3 -c "print(f'{$e_on / $e_off:.0%}' if $e_off > 0 else '-')")
  echo "| $label | $group | $s_on | $s_off | $e_on | $e_off | $ratio | $b_on |"
  rm -rf "$WORK/on" "$WORK/off"
done
echo
echo "| pipeline (pp 2 across the nodes x dp $RANKS_PER_NODE inside) | step ms | measured idle per stage | simulated bubble |"
echo "|---|---|---|---|"
for sched in 1f1b zb-h1; do
  run "pp_$sched" --set parallel.pp=2 --set parallel.pp_schedule=$sched --set train.micro_batch_size=1
  read -r s_pp _ _ < <(window_means "$WORK/pp_$sched" pp)
  idle=$(grep "pipeline idle (waiting" "$WORK/pp_$sched.log" | tail -1 | sed -E 's/.*per stage: (.*) \(simulated bubble ([0-9]+%)\)/\1/')
  sim=$(grep "pipeline idle (waiting" "$WORK/pp_$sched.log" | tail -1 | sed -E 's/.*\(simulated bubble ([0-9]+%)\)/\1/')
  echo "| $sched | $s_pp | $idle | $sim |"
done
