# Sourced by the benchmarks on the namespace cluster (bench/overlap_netns.sh,
# bench/time_model_netns.sh) with their arguments [TRAINER_BIN] [RATE]
# [STEPS], from the repository root. Sets BIN, RATE, STEPS, WORK (removed at
# exit), PREFIX and node0; brings up two nodes with the link shaped to RATE
# (scripts/netns_cluster.sh, root; down again at exit); writes
# $WORK/cfg.yaml (llama d_model 128, 4 layers, sequences of 64, global
# batch 16 in micro-batches of 4, one thread, logged every 4 steps) on the
# license texts; and defines
#   run NAME SETTINGS...   one torchrun per node (RANKS_PER_NODE ranks each,
#                          2 unless set in the environment) on NODES nodes
#                          (2 unless set; 1: node 0 alone), rank 0's
#                          stdout in $WORK/NAME.log, run dir $WORK/NAME;
#                          EXTRA (words) goes before SETTINGS, SUB (a
#                          subcommand such as calibrate) before --config.
BIN=$(realpath "${1:-build/trainer}")
RATE=${2:-1gbit}
STEPS=${3:-12}
WORK=$(mktemp -d /tmp/netns_bench.XXXXXX)
PREFIX="nb$$"
EXTRA=""
RANKS_PER_NODE=${RANKS_PER_NODE:-2}
trap 'bash scripts/netns_cluster.sh down --prefix "$PREFIX" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
bash scripts/netns_cluster.sh up 2 --rate "$RATE" --prefix "$PREFIX" >&2
node0=$(bash scripts/netns_cluster.sh addr 0 --prefix "$PREFIX")
python3 scripts/prepare_text.py --out-dir "$WORK/data" '/usr/share/common-licenses/*' > /dev/null
cat > "$WORK/cfg.yaml" <<YAML
run: {name: netns_bench, seed: 1}
model: {arch: llama, vocab_size: 256, d_model: 128, n_layers: 4, n_heads: 4, n_kv_heads: 4, max_seq_len: 64}
train: {steps: $STEPS, seq_len: 64, micro_batch_size: 4, global_batch_size: 16, threads: 1, device: cpu}
optim: {lr: 1.0e-3, warmup_steps: 2}
data: {train: [$WORK/data/train.bin]}
checkpoint: {interval: 0}
log: {interval: 4, progress: lines}
parallel: {timeout_s: 120}
YAML
port=$((20000 + $$ % 20000))
run() {
  local name=$1 pids=() k nodes=${NODES:-2}
  shift
  port=$((port + 1))
  for ((k = 0; k < nodes; ++k)); do
    # shellcheck disable=SC2086  # EXTRA and SUB are words
    bash scripts/netns_cluster.sh exec "$k" --prefix "$PREFIX" torchrun -r 1 -t 2 --log_dir "$WORK/$name.tl$k" \
      --nnodes "$nodes" --nproc_per_node "$RANKS_PER_NODE" --node_rank "$k" --master_addr "$node0" --master_port "$port" \
      --no_python "$BIN" ${SUB:-} --config "$WORK/cfg.yaml" --set run.dir="$WORK/$name" $EXTRA "$@" \
      > "$WORK/$name.node$k.log" 2>&1 &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k"; done
  cat "$WORK/$name.tl0"/*/attempt_0/0/stdout.log > "$WORK/$name.log"
}
