#!/usr/bin/env bash
# The planner on H100s (issue 44 item 4): tensor parallelism of 8 inside a
# node (NVLink) and across 8 nodes joined by a 25 Gbit/s network, its
# scaling efficiency T(1 GPU) / (8 T(tp 8)) at the same global batch, for a
# few dense models. `trainer plan` only: no GPU, no data, a second or two.
#   bash bench/tp_scaling_plan.sh [TRAINER_BIN]
# Prints markdown; asserts nothing (not a test).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${1:-build/trainer}")
WORK=$(mktemp -d /tmp/tp_scaling.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# The estimated step of one layout, in ms (the plan's "estimate" line).
step_ms() {  # CONFIG WORLD GPUS_PER_NODE SETTINGS...
  local cfg=$1 world=$2 per=$3
  shift 3
  "$BIN" plan --config "$cfg" --world "$world" --gpu h100 --gpus-per-node "$per" "$@" > "$WORK/plan.txt" 2>&1 ||
    { cat "$WORK/plan.txt" >&2; exit 1; }
  /usr/bin/python3 - "$WORK/plan.txt" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"= step ([0-9.]+) (ms|s)\b", text) or re.search(r"step\s+([0-9.]+) (ms|s)\b", text)
if not m:
    sys.exit("no step estimate in the plan:\n" + text[-2000:])
print(float(m[1]) * (1e3 if m[2] == "s" else 1))
EOF
}

model() {  # NAME D_MODEL LAYERS HEADS D_FF SEQ
  cat > "$WORK/$1.yaml" <<YAML
run: {name: $1}
model: {arch: llama, vocab_size: 32000, d_model: $2, n_layers: $3, n_heads: $4, d_ff: $5, max_seq_len: $6}
parallel: {tp: 1}
train: {device: cuda, seq_len: $6, micro_batch_size: 1, global_batch_size: 64, recompute: selective}
data: {train: [unused.bin]}
hardware: {gpu: h100}
YAML
}

echo "| model (seq, micro-batch 1, 64 sequences a step, selective recompute) | 1 GPU step | tp 8 in a node (NVLink) | efficiency | tp 8 across 8 nodes, 25 Gbit/s | efficiency |"
echo "|---|---|---|---|---|---|"
for spec in "1.3B d2048 x 24, 2048|2048 24 16 5504 2048" "7B d4096 x 32, 4096|4096 32 32 11008 4096" \
            "13B d5120 x 40, 4096|5120 40 40 13824 4096" "70B d8192 x 80, 4096|8192 80 64 28672 4096"; do
  label=${spec%%|*}
  # shellcheck disable=SC2086
  model m ${spec#*|}
  one=$(step_ms "$WORK/m.yaml" 1 8)
  inside=$(step_ms "$WORK/m.yaml" 8 8 --set parallel.tp=8 --set parallel.sp=true)
  across=$(step_ms "$WORK/m.yaml" 8 1 --set parallel.tp=8 --set parallel.sp=true --set parallel.tp_across_nodes=true --set hardware.network_gbit_s=25)
  /usr/bin/python3 -c "
one, i, a = $one, $inside, $across
print(f'| $label | {one:.0f} ms | {i:.0f} ms | {100 * one / (8 * i):.0f}% | {a:.0f} ms | {100 * one / (8 * a):.0f}% |')"
done
