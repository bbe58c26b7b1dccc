#!/usr/bin/env bash
# Two "nodes" of two ranks each (scripts/netns_cluster.sh: one network
# namespace per node, a bridge between them shaped to 1 Gbit/s), launched
# the way a real two-host job is, and each run's 10 losses equal the
# one-process run's within rel 1e-5:
#   1. torchrun with a static rendezvous, one per node (--nnodes 2
#      --node_rank k --master_addr <node 0>): tp 2 inside each node x dp 2
#      across the nodes;
#   2. torchrun with the elastic c10d rendezvous (--rdzv_backend c10d
#      --rdzv_endpoint <node 0>): the same layout;
#   3. pp 2 across the nodes x tp 2 inside them;
#   4. dp 4 at ZeRO-3 across the two nodes;
#   5. mpirun from node 0 with a hostfile of the two nodes, its daemon on
#      node 1 started through scripts/netns_rsh.sh: tp 2 x dp 2.
# Ranks of one node reach each other over their namespace's loopback, the
# other node only over the bridge, so every cross-node byte really crosses
# the shaped link. Not root, or namespaces refused here: prints why and exits
# 77, which ctest reports as skipped (never as passed).
set -euo pipefail
trainer=$1 source=$2 work=$3
SKIP=77
say() { echo "multinode: $*"; }
fail() { say "FAIL: $*"; exit 1; }

rm -rf "$work" && mkdir -p "$work"
trainer=$(cd "$(dirname "$trainer")" && pwd)/$(basename "$trainer")
cluster="$source/scripts/netns_cluster.sh"
# Nothing of an enclosing launcher may leak into the runs.
while IFS= read -r name; do
  case "$name" in SLURM_* | OMPI_* | PMIX_* | RANK | WORLD_SIZE | LOCAL_RANK | LOCAL_WORLD_SIZE | MASTER_ADDR | MASTER_PORT | TORCHELASTIC_*)
    unset "$name" ;;
  esac
done < <(compgen -e)

command -v torchrun >/dev/null || { say "SKIP: torchrun not found (python3-torch)"; exit $SKIP; }
prefix="mn$$"
trap 'bash "$cluster" down --prefix "$prefix" >/dev/null 2>&1 || true' EXIT
set +e
bash "$cluster" up 2 --rate 1gbit --prefix "$prefix"
rc=$?
set -e
if [ $rc -eq 77 ]; then say "SKIP: no test cluster here (see the line above)"; exit $SKIP; fi
[ $rc -eq 0 ] || fail "scripts/netns_cluster.sh up 2 failed (exit $rc)"
node0=$(bash "$cluster" addr 0 --prefix "$prefix")

# Byte tokens of a license text.
python3 - "$work/tokens.bin" <<'EOF'
import struct, sys
text = open("/usr/share/common-licenses/GPL-3", "rb").read()
open(sys.argv[1], "wb").write(struct.pack("<%dH" % len(text), *text))
EOF
cat > "$work/cfg.yaml" <<EOF
run: {name: multinode}
model: {arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32}
train: {steps: 10, seq_len: 32, micro_batch_size: 2, global_batch_size: 8, threads: 1}
optim: {lr: 3.0e-3, warmup_steps: 3}
data: {train: [$work/tokens.bin]}
checkpoint: {interval: 0}
log: {interval: 1, progress: lines}
parallel: {timeout_s: 60}
EOF

"$trainer" --config "$work/cfg.yaml" --set run.dir="$work/single" > "$work/single.log" 2>&1 ||
  { tail -20 "$work/single.log"; fail "the one-process reference run failed"; }

same_losses() {  # RUN_DIR LABEL
  python3 - "$work/single/metrics.jsonl" "$1/metrics.jsonl" "$2" <<'EOF'
import json, sys
def losses(p):
    return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
ref, got, label = losses(sys.argv[1]), losses(sys.argv[2]), sys.argv[3]
if len(ref) != 10 or len(got) != len(ref):
    sys.exit(f"multinode: FAIL: {label}: {len(got)} losses, the reference has {len(ref)}")
worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
print(f"multinode: {label}: 10 losses within rel {worst:.2e} of one process (required < 1e-5)")
sys.exit(0 if worst < 1e-5 else 1)
EOF
}

# One torchrun per node, each inside its namespace; $1: label, $2: rendezvous
# flags, the rest: trainer settings.
two_nodes() {
  local label=$1 rdzv=$2 run="$work/$1"
  shift 2
  local pids=()
  for k in 0 1; do
    # Static: each node its rank. c10d: every node here has the one host
    # name, so torchrun cannot tell by name which node hosts the
    # rendezvous store; is_host says it (on real hosts it finds out itself).
    local node_flags="$rdzv --node_rank $k"
    [[ "$rdzv" != *c10d* ]] || node_flags="$rdzv --rdzv_conf is_host=$((k == 0 ? 1 : 0))"
    bash "$cluster" exec "$k" --prefix "$prefix" timeout 300 torchrun -r 1 -t 2 --log_dir "$run.tlog$k" \
      --nnodes 2 --nproc_per_node 2 $node_flags --no_python "$trainer" --config "$work/cfg.yaml" \
      --set run.dir="$run" "$@" > "$run.node$k.log" 2>&1 &
    pids+=($!)
  done
  local bad=0
  for p in "${pids[@]}"; do wait "$p" || bad=1; done
  if [ $bad -ne 0 ]; then
    tail -n 30 "$run.node0.log" "$run.node1.log"
    find "$run.tlog0" "$run.tlog1" -name 'std*.log' -exec tail -n 5 {} + 2>/dev/null | tail -n 60
    fail "$label: a node's torchrun failed"
  fi
  local line
  line=$(grep -h "launcher: torchrun, rank 0 of 4 (local 0 of 2)" -r "$run.tlog0" "$run.tlog1" | head -1)
  [ -n "$line" ] || fail "$label: rank 0 did not report 4 ranks on 2 nodes"
  # Rank 0 names the nodes and says the tp groups stay inside them.
  line=$(grep -h "^placement: " -r "$run.tlog0" "$run.tlog1" | head -1)
  say "$label: $line"
  [[ "$line" == "placement: 2 nodes ($prefix-node"*": ranks 0-1, $prefix-node"*": ranks 2-3)"* ]] ||
    fail "$label: no placement line naming both nodes"
  [[ "$*" != *parallel.tp=2* || "$line" == *"tp groups inside nodes"* ]] || fail "$label: tp groups not inside nodes"
  same_losses "$run" "$label" || fail "$label: losses differ from the one-process run"
}

port=$((20000 + $$ % 20000))
two_nodes static_tp2_dp2 "--master_addr $node0 --master_port $port" --set parallel.tp=2
two_nodes elastic_tp2_dp2 "--rdzv_backend c10d --rdzv_endpoint $node0:$((port + 10)) --rdzv_id mn$$" \
  --set parallel.tp=2
two_nodes static_pp2_tp2 "--master_addr $node0 --master_port $((port + 20))" --set parallel.tp=2 --set parallel.pp=2
two_nodes static_dp4_zero3 "--master_addr $node0 --master_port $((port + 30))" --set parallel.zero_stage=3
# mpirun from node 0, its daemon on node 1 started through the namespace
# "remote shell"; MASTER_ADDR names node 0 as a user's would.
mpirun_two_nodes() {
  local label=mpirun_tp2_dp2 run="$work/mpirun_tp2_dp2"
  command -v mpirun >/dev/null || fail "mpirun not found (openmpi-bin)"
  printf '%s slots=2\n%s slots=2\n' "$prefix-node0" "$prefix-node1" > "$work/hosts"
  bash "$cluster" exec 0 --prefix "$prefix" timeout 300 mpirun --allow-run-as-root -np 4 --hostfile "$work/hosts" \
    --mca plm_rsh_agent "$source/scripts/netns_rsh.sh" --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
    -x MASTER_ADDR="$prefix-node0" -x MASTER_PORT=$((port + 40)) "$trainer" --config "$work/cfg.yaml" \
    --set run.dir="$run" --set parallel.tp=2 > "$run.log" 2>&1 || { tail -n 40 "$run.log"; fail "$label: mpirun failed"; }
  grep -q "launcher: mpirun, rank 0 of 4 (local 0 of 2)" "$run.log" || fail "$label: rank 0 did not report 4 ranks on 2 nodes"
  grep -q "^placement: 2 nodes ($prefix-node0: ranks 0-1, $prefix-node1: ranks 2-3); tp groups inside nodes" "$run.log" ||
    fail "$label: no placement line with the tp groups inside the nodes"
  same_losses "$run" "$label" || fail "$label: losses differ from the one-process run"
}
mpirun_two_nodes
say "PASS: 5 two-node launches (torchrun static and c10d, mpirun; tp2 x dp2, pp2 x tp2, dp4 ZeRO-3) equal one process"
