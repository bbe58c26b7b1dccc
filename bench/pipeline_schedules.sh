#!/usr/bin/env bash
# Measures each pipeline schedule on CPU processes and prints a table of
# step time and each stage's idle share (time waiting in pipeline transfers)
# next to the simulator's bubble for the same schedule and stage costs.
#   bash bench/pipeline_schedules.sh [TRAINER_BIN] [PROCESSES] [STEPS]
# The model: llama, d_model 128, 8 layers, sequences of 64, 16 micro-batches
# of 2 per step, one thread per process. Not a test: nothing is asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/trainer}
P=${2:-4}
STEPS=${3:-30}
WORK=$(mktemp -d /tmp/pp_bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
python3 scripts/prepare_text.py --out-dir "$WORK/data" '/usr/share/common-licenses/*' > /dev/null
cat > "$WORK/cfg.yaml" <<YAML
run: {name: ppbench, seed: 1}
model: {arch: llama, vocab_size: 256, d_model: 128, n_layers: 8, n_heads: 4, n_kv_heads: 4, max_seq_len: 64}
train: {steps: $STEPS, seq_len: 64, micro_batch_size: 2, global_batch_size: 32, threads: 1, device: cpu}
optim: {lr: 1.0e-3, warmup_steps: 2}
data: {train: [$WORK/data/train.bin]}
checkpoint: {interval: 0}
log: {interval: 10, progress: lines, jsonl: false}
parallel: {timeout_s: 120}
YAML
printf '| schedule | ranks | ms/step (last 10 steps) | measured idle per stage | simulated bubble |\n|---|---|---|---|---|\n'
for sched in gpipe 1f1b interleaved zb-h1; do
  port=$((20000 + RANDOM % 20000))
  pids=()
  for ((r = 0; r < P; r++)); do
    RANK=$r WORLD_SIZE=$P LOCAL_RANK=$r LOCAL_WORLD_SIZE=$P MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$BIN" --config "$WORK/cfg.yaml" --set run.dir="$WORK/run_$sched" --set parallel.pp=$P \
      --set parallel.pp_schedule=$sched > "$WORK/$sched.$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  log="$WORK/$sched.0.log"
  ms=$(grep -E "^step +$STEPS/" "$log" | sed -E 's/.*\| ([0-9.]+) ms\/step.*/\1/')
  idle=$(grep "pipeline idle" "$log" | tail -1 | sed -E 's/.*per stage: (.*) \(simulated bubble ([0-9]+%)\)/\1/')
  sim=$(grep "simulated with these stage costs" "$log" | sed -E 's/.*stage costs: ([0-9.]+%).*/\1/')
  printf '| %s | %d | %s | %s | %s |\n' "$sched" "$P" "$ms" "$idle" "$sim"
done
