#!/usr/bin/env bash
# The long soak (issue 45 item 3; tests/test_soak_short.cpp is CI's short
# one): configs/tiny.yaml for STEPS steps (default 100,000) with a checkpoint
# every 500 and keep-last rotation (3), an evaluation every 1,000, TensorBoard
# on, once in one process and once as dp2 under torchrun (the straggler
# monitor on). log.resources_interval records every rank's resident memory,
# open file descriptors and threads and the run directory's and the
# checkpoints' bytes every 1,000 steps; bench/soak_report.py tabulates them,
# judges growth after step 2,000 (2%; the checkpoints within the keep-last
# bound) and plots them. Not in CI: about an hour on 2 cores by default.
#   bash bench/soak.sh [TRAINER_BIN] [STEPS] [WORK_DIR] [PNG]
# SET (environment, --set words) goes to both runs, e.g. a shorter sequence.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${1:-build/trainer}")
STEPS=${2:-100000}
WORK=${3:-runs/soak}
PNG=${4:-$WORK/soak.png}
[ -f data/licenses/train.bin ] || /usr/bin/python3 scripts/prepare_text.py --out-dir data/licenses '/usr/share/common-licenses/*' > /dev/null
rm -rf "$WORK"
mkdir -p "$WORK"
common=(--config configs/tiny.yaml --set train.steps="$STEPS" --set train.eval_interval=1000 --set train.eval_steps=1
        --set checkpoint.interval=500 --set checkpoint.keep_last=3 --set log.interval=1000 --set log.tensorboard=true
        --set log.resources_interval=1000 --set log.progress=lines ${SET:-})
echo "soak: $STEPS steps of configs/tiny.yaml, one process (${SET:-no extra settings})"
t0=$SECONDS
"$BIN" "${common[@]}" --set run.dir="$WORK/one" > "$WORK/one.log" 2>&1 || { tail -20 "$WORK/one.log"; exit 1; }
echo "soak: one process took $((SECONDS - t0)) s; now dp2 under torchrun"
port=$(/usr/bin/python3 -c "import random; print(random.randint(20001, 32000))")
t0=$SECONDS
torchrun -r 1 -t 2 --log_dir "$WORK/torchrun_logs" --nproc_per_node 2 --rdzv_backend c10d \
  --rdzv_endpoint "localhost:$port" --no_python "$BIN" "${common[@]}" --set train.threads=1 --set run.dir="$WORK/dp2" \
  > "$WORK/dp2.log" 2>&1 || { tail -20 "$WORK/dp2.log"; exit 1; }
echo "soak: dp2 took $((SECONDS - t0)) s"
/usr/bin/python3 bench/soak_report.py --png "$PNG" --every 10000 "one process=$WORK/one" "dp2 (torchrun)=$WORK/dp2"
