#!/usr/bin/env bash
# A multi-node training job for Slurm, preemption- and time-limit-safe:
#
#   sbatch scripts/sbatch_example.sh                                   # configs/tiny.yaml
#   CONFIG=configs/bench_llama_1b.yaml sbatch scripts/sbatch_example.sh --set train.steps=20000
#
# Arguments after the script name go to the trainer. TRAINER and CONFIG (from
# the submitting shell: sbatch exports its environment by default) choose the
# binary and the configuration. Submit from the checkout: relative paths are
# relative to the submit directory. Run and checkpoint directories must be on
# a filesystem every node sees.
#
# srun starts one trainer per task; each finds its rank, the world size, its
# node-local rank (its GPU) and rank 0's host (the first node of the step)
# in the SLURM_* variables, and picks the store's port from the job id (the
# same after a requeue; export MASTER_PORT to choose another).
#
# How a job survives its time limit (or a preemption warning):
#   1. --signal=USR1@120: 120 s before the limit Slurm sends SIGUSR1 to every
#      task of the job's steps (not to this script).
#   2. The trainer treats SIGUSR1 (and SIGTERM) as "save and stop": the ranks
#      agree on a step, write a complete checkpoint and exit with code 75.
#      The 120 s must cover one training step plus one checkpoint write.
#   3. srun returns 75, and this script requeues the job (--requeue allows
#      it). Slurm starts it again under the same job id, with
#      SLURM_RESTART_COUNT incremented; --open-mode=append keeps the earlier
#      runs' output in the same file.
#   4. checkpoint.resume=auto continues from the newest complete checkpoint
#      (a damaged newest one falls back to the previous), bit for bit as if
#      never stopped. The first run finds none and starts from step 0.
# Any other non-zero exit (1 run-time error, 2 configuration error, 3 a
# collective timed out, 4 train.nonfinite=stop) ends the job as failed: a
# requeue would only fail again.
#
# tests/slurm_srun.sh submits this very script to a throwaway local cluster
# (scripts/slurm_local.sh), with --nodes=1 --ntasks-per-node=2
# --gpus-per-node=0 on the command line (they override the lines below),
# signals it, and checks that the requeued run ends at the one-process losses.
#
#SBATCH --job-name=trainer
#SBATCH --nodes=2
# One task (one rank) per GPU.
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
# CPU cores per rank: the background data reader and the host side.
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
# %x: job name, %j: job id (unchanged by a requeue, so one file per job).
#SBATCH --output=slurm-%x-%j.out

# No -e: the trainer's exit code decides what happens next.
set -uo pipefail

TRAINER=${TRAINER:-build/trainer}
CONFIG=${CONFIG:-configs/tiny.yaml}

echo "sbatch_example: job ${SLURM_JOB_ID:-?} run $((${SLURM_RESTART_COUNT:-0} + 1)) on ${SLURM_JOB_NODELIST:-?}," \
  "$(date '+%F %T')"

# No --kill-on-bad-exit: ranks that exit 75 one after another, each after its
# part of the checkpoint, must not be killed while the slower ones still
# write theirs. A rank that crashes makes the others fail their next
# collective after parallel.timeout_s (exit 3).
srun "$TRAINER" --config "$CONFIG" --set checkpoint.resume=auto "$@"
rc=$?

if [ "$rc" -eq 75 ]; then
  # Saved and stopped (time limit, preemption warning, scancel --signal=USR1):
  # back into the queue; the next run resumes from that checkpoint.
  echo "sbatch_example: the trainer saved a checkpoint and stopped (exit 75): requeueing job $SLURM_JOB_ID"
  if scontrol requeue "$SLURM_JOB_ID"; then
    exit 0  # Slurm ends this run of the script now and starts the job again later
  fi
  echo "sbatch_example: scontrol requeue failed; resubmit by hand: the checkpoint is kept" >&2
  exit 75
fi
echo "sbatch_example: the trainer exited with $rc"
exit "$rc"
