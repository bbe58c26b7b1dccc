#!/usr/bin/env bash
# The mesh on one GPU: every parallel layout as 2 ranks sharing the lent GPU
# (parallel.backend=auto must resolve to host-staged Gloo, as NCCL refuses two
# ranks on one device), each compared with one-process runs of the same model.
# A phase of scripts/gpu-check.sh; --cpu is its dry run here.
#
#   bash scripts/gpu_mesh_check.sh [options] TRAINER OUT_DIR SECONDS
#     --cpu            train.device=cpu, fp32, parallel.backend=host; the only
#                      reference is the CPU fp32 one-process run (dry run)
#     --work=DIR       data, configs and run dirs (default OUT_DIR/mesh-work)
#     --summary=FILE   where rows go (default OUT_DIR/summary.md)
#     --sanitizer=PATH compute-sanitizer: a failing layout again under memcheck
#     --layouts=A,B    only these layouts (names below)
#   bash scripts/gpu_mesh_check.sh --list   # the layouts' names
#
# Layouts (as in tests/test_host_staged.cpp, all 2 ranks): tp2, tp2_sp,
# pp2_1f1b, pp2_zbh1, cp2, ep2_moe, dp2_zero3, dp2_recompute_full, and
# dp2_zero1_offload (ZeRO-Offload: the bf16 weights' fp32 masters, moments
# and update on the host, the copies both ways through pageable memory). The model:
# llama d_model 64, 4 layers (pp2 needs 2 or more), seq 64, 8 sequences a step
# in micro-batches of 2, 10 steps at lr 1e-2 (the loss falls from ~5.5 to ~3.5,
# so a wrong gradient shows), byte tokens of this checkout's README.md and
# docs/*.md made by scripts/prepare_text.py (no /usr/share files: the GPU
# machine has no Debian packages); ep2 on the same model with
# moe: {num_experts: 4, top_k: 2}.
#
# Each row (| mesh: LAYOUT | result | seconds |, written the moment the
# layout ends, so a kill keeps every row so far; a kill mid-layout writes
# that layout's row from the TERM trap) gives the largest relative difference
# of any logged loss against each reference. Tolerances (GPU mode):
#   2e-2 against the one-process GPU bf16 run. Both runs store weights and
#     activations in bf16 (unit roundoff 2^-8 = 3.9e-3) with fp32 masters and
#     accumulation; a layout changes only where partial results are rounded
#     (tp's split reductions, sp's scatter, pp's bf16 activations on the wire,
#     cp's lse merge, ZeRO-3's gathered bf16 shards). One rounding step moves
#     a 512-token mean loss by far less than u, but 10 AdamW steps amplify
#     (AdamW's first steps move every weight by ~lr whatever its gradient's
#     size, so rounding noise in small gradients becomes lr-sized weight
#     changes); the GPU op tests hold one BF16 op to 2e-2 of fp32, and we hold
#     the whole run to that (~5 u). A real layout bug (stale or unordered
#     staging copy, wrong shard, missed reduction) breaks the step-1 forward
#     or the following updates and moves the loss by 10% or more (it falls
#     ~0.2 a step), or makes it NaN.
#   5e-2 against the CPU fp32 one-process run: bf16 against fp32 is every
#     rounding of the run at once, not just the layout's; twice and a half
#     the bf16 tolerance, still well under what a bug moves.
#   --cpu: 1e-5 against the CPU fp32 run, as tests/e2e_util.cpp holds the
#     same layouts: only the summation order differs (measured here: 5e-8 at
#     most).
# A failing layout is run again at once with both ranks under
# compute-sanitizer --tool memcheck (time-capped, keeping time for the layouts
# after it) and the first report goes in its row; when that time is not there,
# the rerun waits until every layout has its row and gets its own row
# ('mesh: LAYOUT memcheck', 2 at most). Exit 0 when every layout is ok.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

CPU=0 WORK="" SUMMARY="" SANITIZER="" ONLY="" LIST=0
while [[ ${1:-} == --* ]]; do
  case "$1" in
    --cpu) CPU=1 ;;
    --work=*) WORK=${1#--work=} ;;
    --summary=*) SUMMARY=${1#--summary=} ;;
    --sanitizer=*) SANITIZER=${1#--sanitizer=} ;;
    --layouts=*) ONLY=${1#--layouts=} ;;
    --list) LIST=1 ;;
    *) echo "gpu_mesh_check: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
if ((LIST == 0 && $# != 3)); then
  awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0" >&2
  exit 2
fi
TRAINER=${1:-} OUT=${2:-} LIMIT=${3:-0}
START=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
# cap N RESERVE: N, or less so that RESERVE seconds remain.
cap() { local n=$1 r=${2:-0} l; l=$(( $(left) - r )); ((l < n)) && n=$l; ((n < 1)) && n=1; echo "$n"; }

STEPS=10
T_REF=30        # the one-process references, all at once
T_LAYOUT=25     # one layout, both ranks
T_MEMCHECK=40   # one layout again under memcheck
COLL_TIMEOUT=15 # parallel.timeout_s: a hang fails inside the trainer first
TOL_GPU=2e-2 TOL_CPU=5e-2 TOL_FP32=1e-5
DENSE="{arch: llama, vocab_size: 256, d_model: 64, n_layers: 4, n_heads: 4, n_kv_heads: 2, max_seq_len: 64}"
MOE="{arch: llama, vocab_size: 256, d_model: 64, n_layers: 4, n_heads: 4, n_kv_heads: 2, max_seq_len: 64, moe: {num_experts: 4, top_k: 2}}"
# name|model|settings
LAYOUTS=(
  "tp2|dense|parallel.tp=2"
  "tp2_sp|dense|parallel.tp=2 parallel.sp=true"
  "pp2_1f1b|dense|parallel.pp=2 parallel.pp_schedule=1f1b"
  "pp2_zbh1|dense|parallel.pp=2 parallel.pp_schedule=zb-h1"
  "cp2|dense|parallel.cp=2"
  "ep2_moe|moe|parallel.ep=2"
  "dp2_zero3|dense|parallel.zero_stage=3"
  "dp2_recompute_full|dense|train.recompute=full"
  "dp2_zero1_offload|dense|parallel.zero_stage=1 optim.offload=optimizer"
)
if ((LIST)); then printf '%s\n' "${LAYOUTS[@]%%|*}"; exit 0; fi
if [ -n "$ONLY" ]; then
  sel=()
  for l in "${LAYOUTS[@]}"; do [[ ",$ONLY," == *",${l%%|*},"* ]] && sel+=("$l"); done
  ((${#sel[@]})) || { echo "gpu_mesh_check: --layouts=$ONLY names no layout" >&2; exit 2; }
  LAYOUTS=("${sel[@]}")
fi
if ((CPU)); then
  MESH=(--set train.device=cpu --set train.precision=fp32 --set parallel.backend=host --set train.threads=1)
  REFS=("cpu|--set train.device=cpu --set train.precision=fp32|$TOL_FP32|CPU fp32")
else
  MESH=(--set train.device=cuda --set train.precision=bf16 --set parallel.backend=auto)
  REFS=("gpu|--set train.device=cuda --set train.precision=bf16|$TOL_GPU|1-process GPU bf16"
        "cpu|--set train.device=cpu --set train.precision=fp32|$TOL_CPU|CPU fp32")
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=${WORK:-$OUT/mesh-work}
SUMMARY=${SUMMARY:-$OUT/summary.md}
LOG=$OUT/mesh.log
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)

ROW_T0=$(date +%s)
row() {  # row PHASE RESULT: appended at once, as gpu-check.sh's row() does
  local now; now=$(date +%s)
  printf '| %s | %s | %s |\n' "$1" "${2//|//}" "$((now - ROW_T0))" >> "$SUMMARY"
  ROW_T0=$now
  printf 'gpu-check: %-22s %s\n' "$1" "$2"
}
ANY_FAIL=0
PIDS=() PENDING_NAME="" PENDING_TEXT=""
on_term() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  [ -n "$PENDING_NAME" ] && row "$PENDING_NAME" "KILLED: the mesh phase's limit ran out${PENDING_TEXT:+; $PENDING_TEXT}"
  exit 124
}
trap on_term TERM INT

pick_port() {  # a port P with P and P+1 free (the store listens at MASTER_PORT + 1)
  python3 - <<'PY' 2>/dev/null || echo $(( 20001 + RANDOM % 12000 ))
import random, socket
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        s.close()
for _ in range(500):
    p = random.randrange(20001, 32000)
    if free(p) and free(p + 1) and free(p + 2):
        print(p); break
PY
}

# compare RUN REF TOL: "N WORST PASS" over the logged losses (steps must match).
compare() {
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" "$STEPS" <<'PY'
import json, math, sys
def losses(path):
    out = {}
    try:
        for line in open(path):
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if isinstance(o, dict) and "loss" in o and "step" in o:
                out[o["step"]] = float(o["loss"])
    except OSError:
        pass
    return out
a, b, tol, steps = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
worst = 0.0 if a and sorted(a) == sorted(b) else math.inf
for s in set(a) & set(b):
    d = abs(a[s] - b[s]) / abs(b[s]) if b[s] != 0 else math.inf
    worst = max(worst, d) if not math.isnan(d) else math.nan
ok = len(a) == steps and not math.isnan(worst) and worst <= tol
print(len(a), "%.1e" % worst if math.isfinite(worst) else str(worst), int(ok))
PY
}

log_run() {  # log_run TITLE DIR [RANK_LOGS...]: into mesh.log
  local title=$1 dir=$2 f; shift 2
  { echo "== $title"
    for f in "$@"; do
      echo "-- $f"
      case "$f" in *.jsonl) grep '"loss"' "$f" 2>/dev/null ;; *) cat "$f" 2>/dev/null ;; esac
    done; } >> "$LOG"
}

# ---- data and configs ----------------------------------------------------------
prepare() {
  : > "$LOG"
  rm -rf "$WORK/data"
  (cd "$ROOT" && timeout 30 python3 scripts/prepare_text.py --out-dir "$WORK/data" README.md 'docs/*.md') >> "$LOG" 2>&1 ||
    return 1
  local m
  for m in dense moe; do
    local model=$DENSE
    [ $m = moe ] && model=$MOE
    cat > "$WORK/$m.yaml" <<EOF
run: {name: mesh_$m, seed: 1234}
model: $model
train: {steps: $STEPS, seq_len: 64, micro_batch_size: 2, global_batch_size: 8, eval_interval: 0, grad_clip: 1.0}
optim: {lr: 1.0e-2, warmup_steps: 2}
data: {train: [$WORK/data/train.bin], valid: [$WORK/data/valid.bin], dtype: uint16}
checkpoint: {interval: 0}
log: {interval: 1, progress: lines, sample_tokens: 0}
parallel: {timeout_s: $COLL_TIMEOUT}
EOF
  done
}

# ---- the one-process references, all at once -------------------------------------
references() {
  local models=() m r kind sets name limit bad="" okp="" pids=() tags=() i rc
  for l in "${LAYOUTS[@]}"; do IFS='|' read -r _ m _ <<< "$l"; [[ " ${models[*]} " == *" $m "* ]] || models+=("$m"); done
  limit=$(cap $T_REF)
  PENDING_NAME="mesh: references" PENDING_TEXT=""
  for m in "${models[@]}"; do
    for r in "${REFS[@]}"; do
      IFS='|' read -r kind sets _ _ <<< "$r"
      rm -rf "$WORK/ref_${kind}_$m"
      # shellcheck disable=SC2086
      timeout -k 3 "$limit" "$TRAINER" --config "$WORK/$m.yaml" --set run.dir="$WORK/ref_${kind}_$m" $sets \
        > "$WORK/ref_${kind}_$m.log" 2>&1 &
      pids+=($!) tags+=("${kind}_$m")
      PIDS=("${pids[@]}")
    done
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    rc=$?
    name=${tags[$i]}
    log_run "reference $name (exit $rc)" "$WORK/ref_$name" "$WORK/ref_$name.log" "$WORK/ref_$name/metrics.jsonl"
    local n
    n=$(grep -c '"loss"' "$WORK/ref_$name/metrics.jsonl" 2>/dev/null)
    if ((rc == 0)) && [ "${n:-0}" = "$STEPS" ]; then okp+=" $name"
    elif ((rc == 124 || rc == 137)); then bad+=" $name: TIMEOUT after $limit s;"
    else bad+=" $name: exit $rc, ${n:-0} losses, $(grep -m1 -iE 'error' "$WORK/ref_$name.log" | cut -c1-100);"; fi
  done
  PIDS=() PENDING_NAME=""
  if [ -z "$bad" ]; then row "mesh: references" "ok:$okp ($STEPS losses each)"
  else ANY_FAIL=1; row "mesh: references" "FAILED:$bad ok:${okp:- none}"; fi
}

# run2 DIR LIMIT CFG [WRAPPER...] -- SETTINGS...: both ranks, as torchrun
# would start them (tests/e2e_util.cpp run_by_hand); RCS gets their exits.
RCS=()
run2() {
  local dir=$1 limit=$2 cfg=$3 wrap=() port r
  shift 3
  while (($#)) && [ "$1" != -- ]; do wrap+=("$1"); shift; done
  shift
  rm -rf "$dir" "$dir".rank*.log
  port=$(pick_port)
  PIDS=()
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout -k 3 "$limit" ${wrap[@]+"${wrap[@]}"} "$TRAINER" --config "$cfg" --set run.dir="$dir" \
      "${MESH[@]}" "$@" > "$dir.rank$r.log" 2>&1 &
    PIDS+=($!)
  done
  RCS=()
  for r in "${PIDS[@]}"; do wait "$r"; RCS+=($?); done
  PIDS=()
}

# memcheck NAME CFG RESERVE SETTINGS...: the failing layout again, both ranks
# under compute-sanitizer; MC gets what goes in its row (no subshell: the
# TERM trap must see the ranks' pids). Without RESERVE + 10 s left it is
# deferred until every layout has its row (DEFERRED; its own row then).
MC="" DEFERRED=()
memcheck() {
  local name=$1 cfg=$2 reserve=$3 limit dir errs first
  shift 3
  if ((CPU)); then MC="memcheck: not on the CPU"; return; fi
  if [ -z "$SANITIZER" ] || [ ! -x "$SANITIZER" ]; then MC="memcheck: compute-sanitizer not found"; return; fi
  if (( $(left) <= reserve + 10 )); then
    DEFERRED+=("$name|$cfg|$*")
    MC="memcheck: after the other layouts (row 'mesh: $name memcheck')"
    return
  fi
  limit=$(cap $T_MEMCHECK "$reserve")
  dir=$WORK/$name-memcheck
  run2 "$dir" "$limit" "$cfg" "$SANITIZER" --tool memcheck --print-limit 10 -- \
    --set parallel.timeout_s="$limit" "$@"
  log_run "$name under compute-sanitizer memcheck (exits ${RCS[*]}, limit $limit s)" "$dir" "$dir.rank0.log" "$dir.rank1.log"
  errs=$(cat "$dir.rank0.log" "$dir.rank1.log" 2>/dev/null | grep -oE 'ERROR SUMMARY: [0-9]+ error' | grep -oE '[0-9]+' | paste -sd+ -)
  first=$(cat "$dir.rank0.log" "$dir.rank1.log" 2>/dev/null |
          grep -m1 -E '^========= (Invalid|Race|Barrier|Uninitialized|Program hit|ERROR:|Leaked)' | cut -c11-150)
  if [[ " ${RCS[*]} " == *" 124 "* || " ${RCS[*]} " == *" 137 "* ]]; then
    MC="memcheck: TIMEOUT after $limit s${first:+, first report: $first}"
  elif [ -n "$errs" ]; then
    MC="memcheck: $(( errs )) errors (exits ${RCS[*]})${first:+: $first}"
  else
    MC="memcheck: no error summary (exits ${RCS[*]}, mesh.log)"
  fi
}

layouts() {
  local i name model sets setargs s dir limit res r kind tol label n worst pass ok detail err line remaining est=10 t0
  for i in "${!LAYOUTS[@]}"; do
    IFS='|' read -r name model sets <<< "${LAYOUTS[$i]}"
    remaining=$(( ${#LAYOUTS[@]} - i - 1 ))
    if (( $(left) < 5 )); then ANY_FAIL=1; row "mesh: $name" "not run: no time left"; continue; fi
    setargs=()
    for s in $sets; do setargs+=(--set "$s"); done
    dir=$WORK/$name
    limit=$(cap $T_LAYOUT)
    PENDING_NAME="mesh: $name" PENDING_TEXT="running ${MESH[*]} ${setargs[*]}"
    t0=$(date +%s)
    run2 "$dir" "$limit" "$WORK/$model.yaml" -- "${setargs[@]}"
    (( $(date +%s) - t0 + 2 > est )) && est=$(( $(date +%s) - t0 + 2 ))
    log_run "$name: 2 ranks, ${MESH[*]} ${setargs[*]} (exits ${RCS[*]})" "$dir" "$dir.rank0.log" "$dir.rank1.log" \
      "$dir/metrics.jsonl"
    ok=1 detail=""
    if [ "${RCS[*]}" != "0 0" ]; then
      ok=0
      detail="exits ${RCS[*]}"
      [[ " ${RCS[*]} " == *" 124 "* || " ${RCS[*]} " == *" 137 "* ]] && detail="TIMEOUT after $limit s (exits ${RCS[*]})"
      err=$(cat "$dir.rank0.log" "$dir.rank1.log" 2>/dev/null | grep -m1 -iE 'error' | cut -c1-120)
      detail+="${err:+: $err}"
    fi
    if ! grep -q '^comm: host-staged gloo' "$dir.rank0.log" 2>/dev/null; then
      ok=0
      line=$(grep -m1 '^comm:' "$dir.rank0.log" 2>/dev/null | cut -c1-60)
      detail+="${detail:+; }no 'comm: host-staged gloo' start-up line${line:+ (got \"$line\")}"
    fi
    res=""
    for r in "${REFS[@]}"; do
      IFS='|' read -r kind _ tol label <<< "$r"
      read -r n worst pass <<< "$(compare "$dir" "$WORK/ref_${kind}_$model" "$tol")"
      [ "${pass:-0}" = 1 ] || ok=0
      res+="${res:+, }${worst:-?} vs $label (tol $tol)"
    done
    res="${n:-0} losses; max rel diff $res"
    if ((ok)); then
      PENDING_NAME=""
      row "mesh: $name" "ok: $res; comm: host-staged gloo"
    else
      ANY_FAIL=1
      PENDING_TEXT="FAILED: ${detail:+$detail; }$res; memcheck cut short"
      memcheck "$name" "$WORK/$model.yaml" $(( remaining * est )) "${setargs[@]}"
      PENDING_NAME=""
      row "mesh: $name" "FAILED: ${detail:+$detail; }$res; $MC"
    fi
  done
}

# The memcheck reruns that had to wait, with the time left (2 at most).
deferred_memchecks() {
  local d name cfg sets n=0 args
  for d in ${DEFERRED[@]+"${DEFERRED[@]}"}; do
    IFS='|' read -r name cfg sets <<< "$d"
    if ((n == 2)) || (( $(left) < 15 )); then row "mesh: $name memcheck" "not run: no time left"; continue; fi
    # shellcheck disable=SC2206
    args=($sets)
    PENDING_NAME="mesh: $name memcheck" PENDING_TEXT=""
    memcheck "$name" "$cfg" 0 "${args[@]}"
    PENDING_NAME=""
    row "mesh: $name memcheck" "$MC"
    n=$((n + 1))
  done
}

echo "gpu_mesh_check: $([ $CPU = 1 ] && echo "CPU (fp32, backend host)" || echo "GPU (bf16, backend auto)"), ${#LAYOUTS[@]} layouts, limit $LIMIT s, log $LOG"
if ! prepare; then
  row "mesh: data" "FAILED: scripts/prepare_text.py (mesh.log)"
  exit 1
fi
references
layouts
deferred_memchecks
exit $ANY_FAIL
