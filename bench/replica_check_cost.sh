#!/usr/bin/env bash
# What the replica check costs (train.replica_check_interval, issue 45 item 1):
# dp2 under torchrun, one thread a rank, a check after every step, on the
# quickstart model at ZeRO 0 and 1 and on GPT-2 124M (fp32, on the CPU) at
# ZeRO 0 (weights, m and v checked: the most a rank hashes). Prints one
# markdown row per run: the pieces and sets checked, the check's mean time,
# the step's, and the cost per step at the default interval of 100.
# Needs data/licenses (scripts/prepare_text.py, as configs/tiny.yaml says).
#   bash bench/replica_check_cost.sh [TRAINER_BIN] [WORK_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${1:-build/trainer}")
WORK=${2:-runs/replica_cost}
[ -f data/licenses/train.bin ] || /usr/bin/python3 scripts/prepare_text.py --out-dir data/licenses '/usr/share/common-licenses/*' > /dev/null
mkdir -p "$WORK"
DATA=(--set "data.train=[data/licenses/train.bin]" --set "data.valid=[data/licenses/valid.bin]")
EVERY=(--set train.replica_check_interval=1 --set log.interval=1 --set train.eval_interval=0 --set checkpoint.interval=0)
run() {  # LABEL, trainer arguments...
  local label=$1
  shift
  local port
  port=$(/usr/bin/python3 -c "import random; print(random.randint(20001, 32000))")
  rm -rf "${WORK:?}/$label"
  torchrun -r 1 -t 2 --log_dir "$WORK/$label.tlog" --nproc_per_node 2 --rdzv_backend c10d \
    --rdzv_endpoint "localhost:$port" --no_python "$BIN" --set train.threads=1 --set run.dir="$WORK/$label" \
    --set log.progress=lines "$@" > "$WORK/$label.log" 2>&1 || { tail -20 "$WORK/$label.log"; exit 1; }
  /usr/bin/python3 - "$WORK/$label" "$label" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
checks = [r["replica_check"] for r in rows if "replica_check" in r][1:]  # the first steps warm up
steps = [r["ms_per_step"] for r in rows if "ms_per_step" in r][1:]
ms, step = sum(c["ms"] for c in checks) / len(checks), sum(steps) / len(steps)
print(f"| {sys.argv[2]} | {checks[0]['pieces']} pieces, {checks[0]['sets']} sets | {ms:.1f} ms | {step:.0f} ms | "
      f"{ms / 100:.2f} ms ({ms / step:.2f}% of a step) |")
PY
}
echo "| run (dp2, torchrun, 1 thread a rank) | checked | check | step (check included) | per step at the default interval 100 |"
echo "|---|---|---|---|---|"
run quickstart_zero0 --config configs/quickstart.yaml "${DATA[@]}" --set train.micro_batch_size=8 --set train.steps=12 \
  --set parallel.zero_stage=0 "${EVERY[@]}"
run quickstart_zero1 --config configs/quickstart.yaml "${DATA[@]}" --set train.micro_batch_size=8 --set train.steps=12 \
  --set parallel.zero_stage=1 "${EVERY[@]}"
run gpt2_124m_zero0 --config configs/bench_gpt2_124m.yaml "${DATA[@]}" --set train.device=cpu --set train.precision=fp32 \
  --set train.steps=4 --set train.seq_len=128 --set train.micro_batch_size=4 --set train.global_batch_size=8 \
  --set parallel.zero_stage=0 "${EVERY[@]}"
