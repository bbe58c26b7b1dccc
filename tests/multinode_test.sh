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
#      node 1 started through scripts/netns_rsh.sh: tp 2 x dp 2;
#   6. the link cut: node 1's link goes down at step 6 of the static tp 2 x
#      dp 2 run; node 0's ranks must exit within parallel.timeout_s + 5 s
#      naming the lost node, the collective and the missing ranks; once the
#      link is back torchrun's restart resumes from step 4 and the finished
#      run's losses equal run 1's bit for bit;
#   7. a node lost for good under elastic torchrun (--nnodes 1:2): node 1
#      is killed at step 6, the job goes on with node 0 alone at data
#      parallel 1 (the same global batch, twice the accumulation), then
#      grows back to both nodes when node 1 starts again; the log says why
#      at each change of world size, and all 40 losses stay within rel 1e-5
#      of one process.
# Ranks of one node reach each other over their namespace's loopback, the
# other node only over the bridge, so every cross-node byte really crosses
# the shaped link. Not root, or namespaces refused here: prints why and exits
# 77, which ctest reports as skipped (never as passed).
set -euo pipefail
name=multinode
# shellcheck source=tests/launch_test_lib.sh
source "$(dirname "$0")/launch_test_lib.sh" "$@"
cluster="$source/scripts/netns_cluster.sh"

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

write_gpl_tokens "$work/tokens.bin"
cat > "$work/cfg.yaml" <<EOF
run: {name: multinode}
model: {arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32}
train: {steps: 40, seq_len: 32, micro_batch_size: 2, global_batch_size: 8, threads: 1}
optim: {lr: 3.0e-3, warmup_steps: 3}
data: {train: [$work/tokens.bin]}
checkpoint: {interval: 0}
log: {interval: 1, progress: lines}
parallel: {timeout_s: 60}
# The emulated cluster for the planner's prediction in the end-of-run link
# report: 1 Gbit/s per node shared by its 2 ranks.
hardware: {gpu: netns-1gbit, memory_gib: 24, bf16_tflops: 0.02, hbm_gb_s: 10, nvlink_gb_s: 4, network_gbit_s: 0.5, gpus_per_node: 2, matmul_efficiency: 1}
EOF

# The one-process references: 10 steps, and 40 (the learning-rate schedule
# spans train.steps, so each length needs its own).
for n in 10 40; do
  "$trainer" --config "$work/cfg.yaml" --set run.dir="$work/single$n" --set train.steps=$n > "$work/single$n.log" 2>&1 ||
    { tail -20 "$work/single$n.log"; fail "the one-process reference run of $n steps failed"; }
done

same_losses() {  # RUN_DIR LABEL [STEPS, 10]
  python3 - "$work/single${3:-10}/metrics.jsonl" "$1/metrics.jsonl" "$2" "${3:-10}" <<'EOF'
import json, sys
def losses(p):
    return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
ref, got, label, n = losses(sys.argv[1]), losses(sys.argv[2]), sys.argv[3], int(sys.argv[4])
if len(ref) != n or len(got) != n:
    sys.exit(f"multinode: FAIL: {label}: {len(got)} losses, the reference has {len(ref)} (expected {n})")
worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
print(f"multinode: {label}: {n} losses within rel {worst:.2e} of one process (required < 1e-5)")
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
      --set run.dir="$run" --set train.steps=10 "$@" > "$run.node$k.log" 2>&1 &
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
  same_links "$run" "$label" || fail "$label: the link report's bytes differ from the planner's, or a group sits on the wrong side"
}

# The end-of-run link report (metrics.jsonl "links_per_step"): each group's
# measured bytes per step equal the planner's for the hardware entry, tp
# inside a node, dp_cp and pp across the two.
same_links() {  # RUN_DIR LABEL
  python3 - "$1/metrics.jsonl" "$2" <<'EOF'
import json, sys
rec = [json.loads(l)["links_per_step"] for l in open(sys.argv[1]) if '"links_per_step"' in l]
if len(rec) != 1:
    sys.exit(f"multinode: FAIL: {sys.argv[2]}: {len(rec)} link reports")
bad = []
for g, v in rec[0].items():
    want_across = g in ("dp_cp", "pp", "dp")
    if v.get("planned_bytes") != v["bytes"] or v["across_nodes"] != want_across:
        bad.append(g)
    print(f"multinode: {sys.argv[2]}: {g} {'across nodes' if v['across_nodes'] else 'inside a node'}: "
          f"{v['bytes']} B/step in {v['ms']:.1f} ms measured, planner {v.get('planned_bytes')} B in {v.get('planned_ms', 0):.2f} ms")
sys.exit(1 if bad or not rec[0] else 0)
EOF
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
    --set run.dir="$run" --set train.steps=10 --set parallel.tp=2 > "$run.log" 2>&1 || { tail -n 40 "$run.log"; fail "$label: mpirun failed"; }
  grep -q "launcher: mpirun, rank 0 of 4 (local 0 of 2)" "$run.log" || fail "$label: rank 0 did not report 4 ranks on 2 nodes"
  grep -q "^placement: 2 nodes ($prefix-node0: ranks 0-1, $prefix-node1: ranks 2-3); tp groups inside nodes" "$run.log" ||
    fail "$label: no placement line with the tp groups inside the nodes"
  same_losses "$run" "$label" || fail "$label: losses differ from the one-process run"  same_links "$run" "$label" || fail "$label: the link report's bytes differ from the planner's, or a group sits on the wrong side"
}
mpirun_two_nodes

# The trainer processes running inside node K's namespace.
trainers_on() {
  local p
  for p in $(ip netns pids "$prefix-node$1" 2>/dev/null); do
    [ "$(readlink "/proc/$p/exe" 2>/dev/null)" != "$trainer" ] || echo "$p"
  done
}
wait_gone() {  # K SECONDS: until node K runs no trainer
  local t0=$SECONDS
  while [ -n "$(trainers_on "$1")" ]; do
    [ $((SECONDS - t0)) -lt "$2" ] || return 1
    sleep 0.1
  done
}
wait_step() {  # RUN STEP SECONDS: until the run's metrics have STEP
  local t0=$SECONDS
  until grep -q "\"step\": $2," "$1/metrics.jsonl" 2>/dev/null; do
    [ $((SECONDS - t0)) -lt "$3" ] || return 1
    sleep 0.1
  done
}
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

# 6. The link cut. Steps slowed to 0.3 s (the delay hook) so that the cut
# lands at a known step; a checkpoint every 4 steps.
link_cut() {
  local label=link_cut run="$work/link_cut" timeout=6
  local pids=()
  for k in 0 1; do
    bash "$cluster" exec "$k" --prefix "$prefix" env TRAINER_TEST_HOOKS=delay=*:300 timeout 300 torchrun -r 1 -t 2 \
      --log_dir "$run.tlog$k" --max_restarts 3 --monitor_interval 1 --nnodes 2 --nproc_per_node 2 \
      --master_addr "$node0" --master_port $((port + 50)) --node_rank $k --no_python "$trainer" --config "$work/cfg.yaml" \
      --set run.dir="$run" --set train.steps=10 --set parallel.tp=2 --set checkpoint.interval=4 \
      --set parallel.timeout_s=$timeout > "$run.node$k.log" 2>&1 &
    pids+=($!)
  done
  wait_step "$run" 6 120 || fail "$label: the run never reached step 6"
  local cut
  cut=$(now)
  ip netns exec "$prefix-node1" ip link set eth0 down
  wait_gone 0 $((timeout + 30)) || fail "$label: node 0's ranks still run $((timeout + 30)) s after the cut"
  local took
  took=$(since "$cut")
  say "$label: node 0's ranks exited $took s after node 1's link went down (parallel.timeout_s $timeout, required <= $((timeout + 5)))"
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)" "$took" $((timeout + 5)) ||
    fail "$label: node 0's ranks took $took s"
  local err
  err=$(cat "$run.tlog0"/*/attempt_0/0/stderr.log 2>/dev/null)
  say "$label: rank 0: ${err:0:500}"
  [[ "$err" == *"node $prefix-node1 (ranks 2,3) is lost"* ]] || fail "$label: rank 0's error does not name the lost node"
  [[ "$err" == *" on group "* && "$err" == *"rank 2"* ]] || fail "$label: rank 0's error does not name the collective and rank 2"
  wait_gone 1 60 || fail "$label: node 1's ranks still run 60 s after the cut"
  say "$label: node 1's ranks exited $(since "$cut") s after the cut: $(cat "$run.tlog1"/*/attempt_0/0/stderr.log | cut -c1-300)"
  ip netns exec "$prefix-node1" ip link set eth0 up
  local bad=0 p
  for p in "${pids[@]}"; do wait "$p" || bad=1; done
  [ $bad -eq 0 ] || { tail -n 20 "$run.node0.log" "$run.node1.log"; fail "$label: torchrun did not finish the run after the link came back"; }
  grep -rqh "^resumed from $run/ckpt/step_00000004 at step 4" "$run.tlog0" || fail "$label: no restart resumed from step 4"
  python3 - "$work/static_tp2_dp2/metrics.jsonl" "$run/metrics.jsonl" <<'EOF' || fail "$label: losses differ from the uninterrupted run"
import json, sys
def losses(p):
    return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
ref, got = losses(sys.argv[1]), losses(sys.argv[2])
same = sum(a == b for a, b in zip(ref, got))
print(f"multinode: link_cut: {same} of {len(ref)} losses equal the uninterrupted run's bit for bit ({len(got)} steps)")
sys.exit(0 if len(ref) == 10 and got == ref else 1)
EOF
}
link_cut

# 7. A node lost for good, then back. The c10d store lives in node 0's
# torchrun (is_host), which survives; last_call_timeout lets a round close
# with the one node left.
start_node() {  # K TAG RUN
  bash "$cluster" exec "$1" --prefix "$prefix" env TRAINER_TEST_HOOKS=delay=*:300 timeout 400 torchrun -r 2 -t 1 \
    --log_dir "$3.tlog$1$2" --nnodes 1:2 --nproc_per_node 2 --max_restarts 4 --monitor_interval 1 \
    --rdzv_backend c10d --rdzv_endpoint "$node0:$((port + 60))" --rdzv_id "lost$$" \
    --rdzv_conf "is_host=$((1 - $1)),last_call_timeout=5" --no_python \
    "$trainer" --config "$work/cfg.yaml" --set run.dir="$3" --set parallel.tp=2 --set checkpoint.interval=4 \
    --set parallel.timeout_s=10 > "$3.node$1$2.log" 2>&1
}
lost_node() {
  local label=lost_node run="$work/lost_node"
  start_node 0 a "$run" &
  local p0=$!
  start_node 1 a "$run" &
  local p1=$!
  wait_step "$run" 6 120 || fail "$label: the run never reached step 6"
  say "$label: step 6 on two nodes: node 1 is killed (its torchrun and ranks)"
  ip netns pids "$prefix-node1" | xargs -r kill -9
  wait "$p1" 2>/dev/null || true
  local t0=$SECONDS
  until grep -q "world: 2 ranks on 1 node now" "$run.node0a.log"; do
    [ $((SECONDS - t0)) -lt 150 ] || { tail -n 30 "$run.node0a.log"; fail "$label: node 0 did not go on alone"; }
    sleep 0.2
  done
  local resumed_at
  resumed_at=$(grep "resumed from" "$run.node0a.log" | tail -1 | sed 's/.* at step \([0-9]*\).*/\1/')
  wait_step "$run" $((resumed_at + 4)) 60 || fail "$label: node 0 alone did not train 4 steps"
  say "$label: node 0 alone from step $resumed_at, $((SECONDS - t0)) s after the kill: node 1 starts again"
  start_node 1 b "$run" &
  p1=$!
  local bad=0
  wait "$p0" || bad=1
  wait "$p1" || bad=1
  [ $bad -eq 0 ] || { tail -n 30 "$run.node0a.log" "$run.node1b.log"; fail "$label: the job did not finish"; }
  local shrink grow
  shrink=$(grep -h "world: 2 ranks on 1 node now" "$run.node0a.log" | head -1 | sed 's/^\[[a-z0-9]*\]://')
  grow=$(grep -h "world: 4 ranks on 2 nodes now" "$run.node0a.log" | tail -1 | sed 's/^\[[a-z0-9]*\]://')
  say "$label: $shrink"
  say "$label: $grow"
  [[ "$shrink" == *"data parallel 2 -> 1"*"4 micro-batches of 2 per rank (was 2)"*"a node was lost"* ]] ||
    fail "$label: the shrink's line does not say what changed and why"
  [[ "$grow" == *"written by 2 ranks on 1 node"*"data parallel 1 -> 2"*"a node joined or came back"* ]] ||
    fail "$label: the growth's line does not say what changed and why"
  same_losses "$run" "$label" 40 || fail "$label: losses differ from the one-process run"
}
lost_node
say "PASS: 5 two-node launches (torchrun static and c10d, mpirun; tp2 x dp2, pp2 x tp2, dp4 ZeRO-3) equal one process; a cut link ends node 0's ranks in time naming the node, and the restart equals the uninterrupted run bit for bit; a lost node shrinks the job to one node, its return grows it back, losses within 1e-5 of one process"
