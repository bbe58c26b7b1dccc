#!/usr/bin/env bash
# Slurm across two "nodes": the namespace test cluster (scripts/netns_cluster.sh,
# one network namespace per node, a 1 Gbit/s bridge) with a Slurm cluster on
# it (scripts/slurm_local.sh --netns: slurmctld in node 0, one slurmd in each
# node under the node's own host name). From node 0, as from a login node,
#   srun -N 2 -n 4 --ntasks-per-node 2 trainer ... (tp 2 inside each node x
#   dp 2 across the two)
# must say "launcher: srun, rank 0 of 4 (local 0 of 2)", print a placement
# line with both nodes and the tp groups inside them, and give the 10 losses
# of the one-process run within rel 1e-5. Not root, no namespaces, or Slurm
# unable to run here: prints why and exits 77 (skipped, never passed).
set -euo pipefail
name=multinode_slurm
# shellcheck source=tests/launch_test_lib.sh
source "$(dirname "$0")/launch_test_lib.sh" "$@"
netns="$source/scripts/netns_cluster.sh"

prefix="ms$$"
slurm=$(mktemp -d /tmp/trainer-slurmns.XXXXXX)  # munge's socket path must be short
rmdir "$slurm"
cleanup() {
  bash "$source/scripts/slurm_local.sh" stop "$slurm" > "$work/stop.log" 2>&1 || cat "$work/stop.log"
  bash "$netns" down --prefix "$prefix" > /dev/null 2>&1 || true
}
trap cleanup EXIT
set +e
bash "$netns" up 2 --rate 1gbit --prefix "$prefix"
rc=$?
set -e
[ $rc -ne 77 ] || { say "SKIP: no test cluster here (see the line above)"; exit $SKIP; }
[ $rc -eq 0 ] || fail "scripts/netns_cluster.sh up 2 failed (exit $rc)"
set +e
bash "$source/scripts/slurm_local.sh" start "$slurm" --netns "$prefix" 2>&1 | tee "$work/start.log"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" -ne 3 ] || { say "SKIP: Slurm cannot run on the namespace cluster here (reason above)"; exit $SKIP; }
[ "$rc" -eq 0 ] || fail "scripts/slurm_local.sh start --netns exited $rc"
# shellcheck source=/dev/null
source "$slurm/env"

write_gpl_tokens "$work/tokens.bin"
cat > "$work/cfg.yaml" <<EOF
run: {name: multinode_slurm}
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

rc=0
bash "$netns" exec 0 --prefix "$prefix" timeout 300 srun -N 2 -n 4 --ntasks-per-node 2 --job-name trainer-2nodes \
  "$trainer" --config "$work/cfg.yaml" --set run.dir="$work/srun" --set parallel.tp=2 > "$work/srun.log" 2>&1 || rc=$?
[ $rc -eq 0 ] || { tail -n 40 "$work/srun.log"; fail "srun -N 2 -n 4 exited $rc"; }
line=$(grep -m1 "^launcher:" "$work/srun.log" || true)
say "$line"
[[ "$line" == "launcher: srun, rank 0 of 4 (local 0 of 2)"* ]] || fail "rank 0 did not report 4 ranks on 2 nodes under srun"
line=$(grep -m1 "^placement:" "$work/srun.log" || true)
say "$line"
[[ "$line" == "placement: 2 nodes ($prefix-node0: ranks 0-1, $prefix-node1: ranks 2-3); tp groups inside nodes"* ]] ||
  fail "no placement line naming both nodes with the tp groups inside them"
python3 - "$work/single/metrics.jsonl" "$work/srun/metrics.jsonl" <<'EOF' || fail "losses differ from the one-process run"
import json, sys
def losses(p):
    return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
ref, got = losses(sys.argv[1]), losses(sys.argv[2])
if len(ref) != 10 or len(got) != 10:
    sys.exit(f"multinode_slurm: FAIL: {len(got)} losses, the reference has {len(ref)} (expected 10)")
worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
print(f"multinode_slurm: srun -N 2 -n 4: 10 losses within rel {worst:.2e} of one process (required < 1e-5)")
sys.exit(0 if worst < 1e-5 else 1)
EOF
say "PASS: srun across two slurmd on two namespace nodes equals one process"
