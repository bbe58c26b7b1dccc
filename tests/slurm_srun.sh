#!/usr/bin/env bash
# The trainer under a real Slurm: a throwaway one-node cluster on this machine
# (scripts/slurm_local.sh: munged, slurmctld, slurmd, all state in a temporary
# directory), then
#   1. `srun -n 2 -N 1 trainer ...`: both tasks exit 0, rank 0 says
#      "launcher: srun, rank 0 of 2", and the losses of all 20 steps equal the
#      one-process run's within rel 1e-5;
#   2. scripts/sbatch_example.sh submitted with sbatch (one node, two tasks,
#      no GPUs), sent SIGUSR1 as --signal=USR1@120 would: the trainer saves
#      and exits 75, the script requeues the job, the second run resumes from
#      that checkpoint, and the 20 steps' losses again equal the one-process
#      run's.
# When the daemons cannot run here (not root, no slurm-wlm/munge, a sandbox
# that forbids them) it prints why and exits 77, which ctest reports as
# skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt), never as passed.
set -euo pipefail
name=slurm_srun
# This test's own cluster only: nothing from an enclosing Slurm job or
# launcher reaches the runs below (tests/launch_test_lib.sh).
# shellcheck source=tests/launch_test_lib.sh
source "$(dirname "$0")/launch_test_lib.sh" "$@"

# munge's socket path must be short: the cluster lives under /tmp, not in the build tree.
cluster=$(mktemp -d /tmp/trainer-slurm.XXXXXX)
rmdir "$cluster"
cleanup() { bash "$source/scripts/slurm_local.sh" stop "$cluster" > "$work/stop.log" 2>&1 || cat "$work/stop.log"; }
trap cleanup EXIT

set +e
bash "$source/scripts/slurm_local.sh" start "$cluster" 2>&1 | tee "$work/start.log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -eq 3 ]; then
  say "SKIPPED: the local Slurm cluster cannot run in this environment (reason above)"
  exit $SKIP
fi
[ "$rc" -eq 0 ] || fail "scripts/slurm_local.sh start exited $rc"
# shellcheck source=/dev/null
source "$cluster/env"

# rank 0 finds rank 0's host from the node list: the node's name must resolve.
host=$(hostname -s)
if ! getent hosts "$host" > /dev/null; then
  say "note: this host's name '$host' does not resolve: MASTER_ADDR=127.0.0.1 for the Slurm runs"
  export MASTER_ADDR=127.0.0.1
fi

# --- data and configuration (checkpoint.interval 20: the last step is saved)
python3 "$source/scripts/prepare_text.py" --out-dir "$work/data" '/usr/share/common-licenses/*' > "$work/prepare.log"
cat > "$work/tiny.yaml" << EOF
run: {name: slurm, seed: 1234}
model: {arch: llama, vocab_size: 256, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 32}
train: {device: cpu, steps: 20, seq_len: 32, micro_batch_size: 2, global_batch_size: 8, eval_interval: 0, threads: 1}
optim: {lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 5}
data: {train: [$work/data/train.bin], valid: [$work/data/valid.bin]}
checkpoint: {interval: 20}
log: {interval: 1, progress: lines}
EOF

compare() {  # NAME RUN_DIR: every step's loss against the one-process run
  python3 - "$1" "$work/one/metrics.jsonl" "$2/metrics.jsonl" << 'EOF'
import json, sys
name, ref_path, got_path = sys.argv[1:]
def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if "loss" in row:
                out[row["step"]] = row["loss"]
    return out
ref, got = losses(ref_path), losses(got_path)
if sorted(ref) != list(range(1, 21)) or sorted(got) != sorted(ref):
    sys.exit(f"slurm_srun: FAIL: {name}: steps {sorted(got)} vs the one-process run's {sorted(ref)}")
worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)
worst_abs = max(abs(got[s] - ref[s]) for s in ref)
print(f"slurm_srun: {name}: {len(ref)} losses, max rel diff {worst:.3g} (abs {worst_abs:.3g}) vs the one-process run "
      f"(step 20: {got[20]:.6f} vs {ref[20]:.6f})")
if worst > 1e-5:
    sys.exit(f"slurm_srun: FAIL: {name}: losses differ by rel {worst:.3g} > 1e-5")
EOF
}

# --- the one-process reference
rc=0
"$trainer" --config "$work/tiny.yaml" --set run.dir="$work/one" > "$work/one.out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat "$work/one.out"; fail "the one-process run exited $rc"; }
grep -q "launcher: single process" "$work/one.out" || { cat "$work/one.out"; fail "the reference run is not a single process"; }

# --- 1. srun: a two-task job step (the allocation made by srun itself)
rc=0
timeout 300 srun -n 2 -N 1 --job-name=trainer-srun "$trainer" --config "$work/tiny.yaml" --set run.dir="$work/srun" \
  > "$work/srun.out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat "$work/srun.out"; fail "srun -n 2 -N 1 trainer exited $rc (both tasks must exit 0)"; }
line=$(grep -m1 "^launcher:" "$work/srun.out" || true)
say "srun: exit 0, $line"
[[ "$line" == "launcher: srun, rank 0 of 2 "* ]] || { cat "$work/srun.out"; fail "no 'launcher: srun, rank 0 of 2' line"; }
[ -f "$work/srun/ckpt/step_00000020/manifest.json" ] || fail "srun: no checkpoint at step 20"
compare "srun -n 2" "$work/srun"

# --- 2. sbatch scripts/sbatch_example.sh: signalled, saved (exit 75), requeued, resumed
# delay=*:150 (tests only) slows every step by 150 ms so that the signal lands mid-run.
job=$(sbatch --parsable --nodes=1 --ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1 --time=10 \
  --chdir="$work" --output="$work/job.out" \
  --export="ALL,TRAINER=$trainer,CONFIG=$work/tiny.yaml,TRAINER_TEST_HOOKS=delay=*:150" \
  "$source/scripts/sbatch_example.sh" --set run.dir="$work/batch")
job=${job%%;*}
say "sbatch: job $job submitted"

job_field() { scontrol show job "$job" 2> /dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1; }
step_reached() {  # loss rows so far in the batch run's metrics.jsonl
  local n
  n=$(grep -c '"loss"' "$work/batch/metrics.jsonl" 2> /dev/null) || true
  echo "${n:-0}"
}

deadline=$((SECONDS + 120))
until [ "$(step_reached)" -ge 4 ]; do
  ((SECONDS < deadline)) || { cat "$work/job.out" 2> /dev/null; fail "job $job did not reach step 4 within 120 s (state $(job_field JobState))"; }
  sleep 0.2
done
# What --signal=USR1@120 does near the time limit: SIGUSR1 to every task of the steps.
scancel --signal=USR1 "$job"
say "sbatch: SIGUSR1 sent to job $job after step $(step_reached)"

deadline=$((SECONDS + 240))
while :; do
  state=$(job_field JobState)
  case "$state" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED) break ;; esac
  ((SECONDS < deadline)) || { cat "$work/job.out"; fail "job $job still $state after 240 s"; }
  sleep 0.5
done
restarts=$(job_field Restarts)
say "sbatch: job $job $state, exit code $(job_field ExitCode), restarts $restarts"
[ "$state" = COMPLETED ] || { cat "$work/job.out"; fail "job $job ended $state"; }
[ "$restarts" = 1 ] || { cat "$work/job.out"; fail "job $job restarted $restarts times, not once"; }
grep -q "^sbatch_example: job $job run 1 " "$work/job.out" || { cat "$work/job.out"; fail "no first run in the job output"; }
grep -q "^sbatch_example: job $job run 2 " "$work/job.out" || { cat "$work/job.out"; fail "no second run in the job output"; }
grep -q "^preemption: SIGUSR1 received" "$work/job.out" || { cat "$work/job.out"; fail "the trainer did not report SIGUSR1"; }
grep -q "exit 75): requeueing job $job" "$work/job.out" || { cat "$work/job.out"; fail "the script did not requeue on exit 75"; }
resumed=$(grep -m1 "^resumed from" "$work/job.out" || true)
[ -n "$resumed" ] || { cat "$work/job.out"; fail "the second run did not resume from a checkpoint"; }
grep -q "^sbatch_example: the trainer exited with 0" "$work/job.out" || { cat "$work/job.out"; fail "the second run did not end with exit 0"; }
grep -q "^launcher: srun, rank 0 of 2 .*, restart 0$" "$work/job.out" || { cat "$work/job.out"; fail "no first srun launch of 2 ranks (restart 0)"; }
grep -q "^launcher: srun, rank 0 of 2 .*, restart 1$" "$work/job.out" || { cat "$work/job.out"; fail "no second srun launch of 2 ranks with restart 1 (SLURM_RESTART_COUNT)"; }
say "sbatch: $(grep -m1 '^preemption:' "$work/job.out" | cut -c1-80)..."
say "sbatch: $resumed"
compare "sbatch + requeue" "$work/batch"
say "PASSED"
