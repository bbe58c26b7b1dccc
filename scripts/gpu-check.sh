#!/usr/bin/env bash
# The whole GPU check in one call on a lent GPU machine (one H200; nvcc,
# CMake, ninja, PyTorch, compute-sanitizer; no Debian packages, no network),
# within 540 s so that the device tool (600 s a call) always brings the
# results back. Here, first:
#
#   bash scripts/gpu_deps_bundle.sh && bash scripts/gpu-check.sh --dry-run
#
# then the device call:
#
#   run(command="bash scripts/gpu-check.sh", carry=["gpu_deps"], timeout_s=600)
#
# Order (time caps in seconds, each cut short so the phases after it keep theirs):
#   summary.md is written first (date, commit from gpu_deps/SOURCE when the
#     copy has no .git) and appended after every phase, so a kill at any point
#     still returns everything measured so far;
#   versions; configure build-gpu (sm_90 only); build ptx_probe (one small
#     file; its failure stops nothing), then gpu_tests with all cores (and the
#     CUDA module libtrainer_cuda.so it loads), then trainer and bench_kernels
#     (no CPU-only tests: CI runs those);
#     PyTorch's benchmark runs only while our build does, and is stopped when it ends;
#   the PTX probe (seconds): `ptx_probe --expect gpu_deps/ptx_probe_emu.txt`, the
#     GPU's mma, ldmatrix, cp.async, ex2, shuffles and atomics against the
#     emulator's output that scripts/gpu_deps_bundle.sh stored (docs/EMULATOR.md);
#     without that file the GPU's own output and ISA checks are still kept and the
#     row says "not run";
#   our GPU tests, one process per op family, each with its own time limit,
#     line-buffered, with GPU_TESTS_REQUIRE_DEVICE=1 (no device = failure);
#   a failed family again under compute-sanitizer memcheck (time-capped);
#   bench_kernels; `trainer devices` (driver, module, devices); the trainer on
#     the two bench configs (a failing config again for 2 steps with
#     CUDA_LAUNCH_BLOCKING=1);
#   the mesh on the one GPU (scripts/gpu_mesh_check.sh, T_MESH s reserved from
#     the start): tp2, tp2+sp, pp2 1f1b and zb-h1, cp2, ep2 (MoE), dp2 ZeRO-3,
#     dp2 full recompute, dp2 ZeRO-1 offload, each 2 ranks sharing the GPU in bf16 through
#     host-staged Gloo (parallel.backend=auto must say so), every logged loss
#     against one-process GPU bf16 (2e-2 relative) and CPU fp32 (5e-2) runs of
#     the same tiny model, one row per layout; a failing layout again with both
#     ranks under memcheck;
#   with nothing failed and time left: racecheck and synccheck on a small
#     attention subset; then PyTorch resumes with the time left; the tables.
# Results in $OUT, 12 files: summary.md gpu-check.log build.log tests.log
#   trainer.log mesh.log bench_kernels.json bench_torch.json bench_torch.log
#   ptx_probe_gpu.txt ptx_probe_emu.txt ptx_probe_report.txt
#
#   bash scripts/gpu-check.sh --dry-run    # here: everything short of the GPU
#
# Environment: GPU_CHECK_BIN_DIR=DIR uses DIR/{gpu_tests,trainer,bench_kernels,ptx_probe}
# (and DIR/libtrainer_cuda.so, which DIR/trainer loads) instead of building (a warm machine's earlier build, or the rehearsal's
# stand-ins: tests/gpu_check_rehearsal.sh); GPU_CHECK_TORCH=0 skips PyTorch;
# GPU_CHECK_FAMILY_CAP=N gives every test family N seconds;
# GPU_CHECK_PROBE_EXPECT=FILE compares the PTX probe with FILE instead of
# gpu_deps/ptx_probe_emu.txt (the rehearsal's).
# Numbers go to docs/PERFORMANCE.md only once measured by this script.
set -uo pipefail   # no -e: a failing phase is recorded and the rest still runs
cd "$(dirname "$0")/.."
ROOT=$PWD

DRY=0
BUDGET=${GPU_CHECK_BUDGET:-540}
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=1 ;;
    --budget=*) BUDGET=${a#--budget=} ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument '$a'" >&2; exit 2 ;;
  esac
done

# ---- the plan -----------------------------------------------------------------
T_INFO=15 T_CONFIGURE=75 T_BUILD=220 T_MEMCHECK=60 T_BENCH=60 T_BLOCKING=30 T_SANITIZE=40 T_SUMMARY=10
# The PTX probe: its build (inside T_BUILD) and its run.
T_PROBE_BUILD=60 T_PROBE=20
# The mesh phase: references and 9 layouts of ~5 s each (2 ranks of a tiny
# model, start-up bound), one hang (25 s) or memcheck rerun on top.
T_MESH=100
CONFIGS=(configs/bench_gpt2_124m.yaml configs/bench_llama_1b.yaml)
T_TRAIN=(35 60)
# GPU test families: name, Catch2 test spec (a comma is "or"), time cap.
# Every GPU test case is in exactly one family (--dry-run checks it).
FAMILIES=(
  "basic|[convert],[elementwise],[reduce],[embedding]|30"
  "norms|[norm]|30"
  "linear|[linear]|30"
  "rope|[rope]|20"
  "activations|[activation]|20"
  "cross_entropy|[loss]|30"
  "optimizer|[optim]|30"
  "moe|[moe]|40"
  "attention_f32|[attention][f32]|60"
  "attention_bf16|[attention][bf16]|60"
  "attention_f16|[attention][f16]|30"
  "ring_attention|[cp]|30"
  "training|[training]~[nccl]|90"
  "training_nccl|[nccl]|60"
)
SANITIZE_SPEC="[sanitize]"
BUILD=build-gpu
DEPS=$ROOT/gpu_deps
CUDA_ARCH=${CUDA_ARCH:-90}
JOBS=$(nproc 2>/dev/null || echo 4)
BIN_DIR=${GPU_CHECK_BIN_DIR:-}
WITH_TORCH=${GPU_CHECK_TORCH:-1}
if [ -n "$BIN_DIR" ]; then
  BIN_DIR=$(cd "$BIN_DIR" && pwd)
  GPU_TESTS=$BIN_DIR/gpu_tests TRAINER=$BIN_DIR/trainer BENCH=$BIN_DIR/bench_kernels PTX_PROBE=$BIN_DIR/ptx_probe
else
  GPU_TESTS=$ROOT/$BUILD/tests/gpu_tests TRAINER=$ROOT/$BUILD/trainer BENCH=$ROOT/$BUILD/bench/bench_kernels
  PTX_PROBE=$ROOT/$BUILD/ptx_probe
fi
# The emulator's PTX probe output (scripts/gpu_deps_bundle.sh made it here).
PROBE_EXPECT=${GPU_CHECK_PROBE_EXPECT:-$DEPS/ptx_probe_emu.txt}
# The CUDA backend: every kernel lives in it, next to the trainer, which
# dlopens it on the first CUDA use (gpu_tests and bench_kernels load the
# same file).
MODULE=$(dirname "$TRAINER")/libtrainer_cuda.so
# gpu_tests line-buffers its own stdout; stdbuf covers stderr and stand-ins.
STDBUF=(env)
command -v stdbuf >/dev/null 2>&1 && STDBUF=(stdbuf -oL -eL)
family_cap() { echo "${GPU_CHECK_FAMILY_CAP:-$1}"; }
# Seconds the phases after the GPU tests are guaranteed: bench_kernels'
# minimum, both trainer runs, the mesh, the summary.
AFTER_TESTS=$(( 30 + T_TRAIN[0] + T_TRAIN[1] + T_MESH + T_SUMMARY ))

OUT=${OUT:-$ROOT/gpu-check-out}
((DRY)) && OUT=${GPU_CHECK_DRY_OUT:-/tmp/gpu-check-dry}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.md
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET - $(elapsed) )); }
# cap N RESERVE: N, or less so that RESERVE seconds remain for what follows.
cap() { local n=$1 r=${2:-0} l; l=$(( $(left) - r )); ((l < n)) && n=$l; ((n < 1)) && n=1; echo "$n"; }
section() { printf '\n===== [%4ss] %s =====\n' "$(elapsed)" "$*"; }
# One row of summary.md, written the moment a phase ends.
ROW_T0=$START
row() {  # row PHASE RESULT
  local now; now=$(date +%s)
  printf '| %s | %s | %s |\n' "$1" "${2//|//}" "$((now - ROW_T0))" >> "$SUMMARY"
  ROW_T0=$now
  printf 'gpu-check: %-22s %s\n' "$1" "$2"
}
FAILED=0   # anything failed: no racecheck/synccheck, memcheck instead
SANITIZER_BIN=""
find_sanitizer() {
  local c
  for c in "$(command -v compute-sanitizer 2>/dev/null)" /usr/local/cuda/bin/compute-sanitizer \
           "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/nvcc)")/compute-sanitizer"; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return; }
  done
}

commit_line() {
  if git rev-parse --verify -q HEAD >/dev/null 2>&1; then
    local dirty=""
    git diff --quiet HEAD -- 2>/dev/null || dirty=" + uncommitted changes"
    echo "$(git rev-parse HEAD)$dirty (from .git)"
  elif [ -f gpu_deps/SOURCE ]; then
    echo "$(head -1 gpu_deps/SOURCE) (from gpu_deps/SOURCE, written by --dry-run)"
  else
    echo "unknown (no .git, no gpu_deps/SOURCE: run --dry-run before the device call)"
  fi
}

# ---- configure arguments ------------------------------------------------------
CMAKE_ARGS=(
  -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTRAINER_CUDA=ON
  -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH"
  -DCMAKE_PREFIX_PATH="$DEPS"
  -Dyaml-cpp_DIR="$DEPS/lib/x86_64-linux-gnu/cmake/yaml-cpp"
  -DCLI11_DIR="$DEPS/share/cmake/CLI11"
  -DCatch2_DIR="$DEPS/lib/cmake/Catch2"
  -DGloo_DIR="$DEPS/share/cmake/Gloo"
  -Dnlohmann_json_DIR="$DEPS/share/cmake/nlohmann_json"
  -DBLAS_LIBRARIES="$DEPS/lib/libopenblas.so.0"
  -DCBLAS_INCLUDE_DIR="$DEPS/include/openblas"
  # libopenblas needs libgfortran at link time too; the linker looks for a
  # library's own dependencies here, not through -L.
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$DEPS/lib"
  # The machine's CMake may be 4.x, which refuses the old cmake_policy ranges
  # of some packaged config files without this.
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5
)
command -v ninja >/dev/null 2>&1 && CMAKE_ARGS+=(-G Ninja)
# NCCL: the GPU image has it only inside PyTorch's pip packages
# (site-packages/nvidia/nccl/{include,lib}), where CMakeLists.txt does not look.
NCCL_INC="" NCCL_LIB="" NCCL_LIB_DIR=""
probe='
import glob, os, site
for root in site.getsitepackages() + [site.getusersitepackages()]:
    for inc in sorted(glob.glob(os.path.join(root, "nvidia", "**", "include", "nccl.h"), recursive=True)):
        lib = os.path.join(os.path.dirname(os.path.dirname(inc)), "lib", "libnccl.so.2")
        if os.path.exists(lib):
            print(os.path.dirname(inc), lib)
            raise SystemExit
'
if ((DRY == 0)) && [ "${GPU_CHECK_NCCL:-1}" != 0 ]; then
  read -r NCCL_INC NCCL_LIB <<< "$(python3 -c "$probe" 2>/dev/null)"
  if [ -n "${NCCL_LIB:-}" ]; then
    CMAKE_ARGS+=(-DNCCL_INCLUDE_DIR="$NCCL_INC" -DNCCL_LIBRARY="$NCCL_LIB")
    NCCL_LIB_DIR=$(dirname "$NCCL_LIB")
  fi
fi
TORCH_CMD=(python3 scripts/bench_gpu_torch.py all --json "$OUT/bench_torch.json" --resume)

# ---- phases -------------------------------------------------------------------
phase_versions() {
  section "versions"
  timeout "$T_INFO" bash -c '
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv
    echo "nvcc: $(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)"; (nvcc --version || /usr/local/cuda/bin/nvcc --version) | tail -2
    cmake --version | head -1; echo "ninja $(ninja --version 2>/dev/null || echo missing)"
    c++ --version | head -1
    python3 -c "import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda)"
    echo "cpus $(nproc), $(free -g | awk "/Mem:/{print \$2}") GiB RAM"
  ' 2>&1
  local gpu
  gpu=$(timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
  row versions "${gpu:-nvidia-smi gave no GPU}; NCCL ${NCCL_LIB:-not found}; compute-sanitizer ${SANITIZER_BIN:-not found}"
}

phase_data() {
  if timeout 60 python3 - <<'PY'
import os
os.makedirs("data/bench", exist_ok=True)
n = 1 << 22  # 4M tokens: far more than the bench runs read
for vocab in (50304, 32000):
    path = f"data/bench/random_{vocab}.bin"
    try:
        import numpy as np
        np.random.default_rng(vocab).integers(0, vocab, size=n, dtype=np.uint16).tofile(path)
    except ImportError:
        import array, random
        r = random.Random(vocab)
        with open(path, "wb") as f:
            array.array("H", (r.randrange(vocab) for _ in range(n))).tofile(f)
PY
  then row data "ok"; else row data "FAILED (the bench configs will fail)"; fi
}

TORCH_PID=""
torch_start() {  # torch_start SECONDS
  ((WITH_TORCH)) || return 0
  PYTHONUNBUFFERED=1 timeout -k 5 "$1" "${TORCH_CMD[@]}" --deadline "$1" >> "$OUT/bench_torch.log" 2>&1 &
  TORCH_PID=$!
  echo "PyTorch benchmark started (pid $TORCH_PID, at most $1 s): ${TORCH_CMD[*]}"
}
torch_stop() {
  [ -n "$TORCH_PID" ] || return 0
  if kill -0 "$TORCH_PID" 2>/dev/null; then
    kill -TERM "$TORCH_PID" 2>/dev/null; pkill -TERM -f "scripts/bench_gpu_torch.py" 2>/dev/null
    wait "$TORCH_PID" 2>/dev/null
    echo "PyTorch benchmark stopped: the GPU is ours now"
  else
    wait "$TORCH_PID" 2>/dev/null
  fi
  TORCH_PID=""
  echo "== stopped at $(elapsed) s" >> "$OUT/bench_torch.log"
}
torch_results() { grep -c '^RESULT' "$OUT/bench_torch.log" 2>/dev/null || echo 0; }

phase_build() {
  if [ -n "$BIN_DIR" ]; then
    row build "skipped: prebuilt binaries from $BIN_DIR"
    return
  fi
  section "configure (log: build.log)"
  if [ ! -e "$DEPS/lib/libopenblas.so.0" ] && [ -e "$DEPS/lib/libopenblas.so.0.xz" ]; then
    xz -dk "$DEPS/lib/libopenblas.so.0.xz" 2>/dev/null ||
      python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
        "$DEPS/lib/libopenblas.so.0.xz" "$DEPS/lib/libopenblas.so.0"
  fi
  [ -e "$DEPS/lib/libopenblas.so.0" ] || echo "gpu-check: gpu_deps is missing: was it carried (carry=[\"gpu_deps\"])?"
  local rc
  { echo "cmake ${CMAKE_ARGS[*]}"; timeout "$(cap $T_CONFIGURE)" cmake "${CMAKE_ARGS[@]}"; } >> "$OUT/build.log" 2>&1
  rc=$?
  grep -E "trainer: |Error" "$OUT/build.log" | head -10
  if ((rc != 0)); then
    FAILED=1
    row configure "FAILED (exit $rc): $(grep -m1 -E 'Error|error' "$OUT/build.log" | cut -c1-160)"
    tail -30 "$OUT/build.log"
    return
  fi
  row configure ok
  section "build, $JOBS jobs (log: build.log)"
  local limit t0 what
  limit=$(cap $T_BUILD $(( 60 + AFTER_TESTS )))
  t0=$(date +%s)
  # The PTX probe first: one small file, and a failure here stops nothing.
  echo "== build ptx_probe" >> "$OUT/build.log"
  timeout -k 10 "$(cap $(( T_PROBE_BUILD < limit ? T_PROBE_BUILD : limit )) $(( 60 + AFTER_TESTS )))" \
    cmake --build "$BUILD" -j"$JOBS" --target ptx_probe >> "$OUT/build.log" 2>&1 ||
    echo "gpu-check: ptx_probe did not build (build.log); the rest goes on"
  # gpu_tests first: it needs every kernel, and the tests come first.
  for what in gpu_tests "trainer bench_kernels"; do
    echo "== build $what" >> "$OUT/build.log"
    # shellcheck disable=SC2086
    timeout -k 10 "$(( limit - ($(date +%s) - t0) > 1 ? limit - ($(date +%s) - t0) : 1 ))" cmake --build "$BUILD" -j"$JOBS" --target $what \
      >> "$OUT/build.log" 2>&1
    rc=$?
    ((rc == 0)) || break
  done
  grep -E "error|warning: .*(spill|stack frame)" "$OUT/build.log" | head -30
  local built=""
  for t in "$GPU_TESTS" "$MODULE" "$TRAINER" "$BENCH" "$PTX_PROBE"; do [ -e "$t" ] && built+=" $(basename "$t")"; done
  if ((rc == 0)); then row build "ok:$built"
  elif ((rc == 124 || rc == 137)); then FAILED=1; row build "TIMEOUT after $limit s; built:${built:- nothing}"
  else FAILED=1; row build "FAILED (exit $rc): $(grep -m1 -E 'error' "$OUT/build.log" | cut -c1-160); built:${built:- nothing}"; fi
  # Registers, stack frames and spills of every kernel (cuobjdump, device-side
  # only), in the module that holds them.
  if [ -e "$MODULE" ] && command -v cuobjdump >/dev/null 2>&1; then
    echo "== cuobjdump --dump-resource-usage $MODULE" >> "$OUT/build.log"
    timeout 30 cuobjdump --dump-resource-usage "$MODULE" > "$OUT/resource.tmp" 2>&1
    cat "$OUT/resource.tmp" >> "$OUT/build.log"
    local n maxreg stack
    n=$(grep -c 'REG:' "$OUT/resource.tmp")
    maxreg=$(grep -o 'REG:[0-9]*' "$OUT/resource.tmp" | cut -d: -f2 | sort -n | tail -1)
    stack=$(grep -E 'STACK:[1-9]|LOCAL:[1-9]' "$OUT/resource.tmp" | grep -c .)
    rm -f "$OUT/resource.tmp"
    row resources "$n kernels, max ${maxreg:-?} registers, $stack with a stack frame or local memory (build.log)"
  fi
}

# The PTX probe: the GPU's output of every hand-written PTX instruction and
# warp builtin against the emulator's (docs/EMULATOR.md, "The PTX probe"), each
# probe by its own rule; the report also says whether the GPU matches the ISA
# as the probe reads it. Both outputs and the report stay in $OUT.
probe_maxima() {  # the tolerance-ruled probes' largest differences, from the report
  awk '/^probe (ex2_approx_ftz|mma_bf16_rand|mma_f16_rand):/ {
      n = $2; sub(/:$/, "", n)
      for (i = 1; i < NF; i++) if ($i == "difference") { printf "%s%s %s%s", sep, n, $(i + 1), ($(i + 2) == "ulp" ? " ulp" : ""); sep = ", " }
    }' "$1"
}
phase_ptx_probe() {
  section "PTX probe: the GPU against the emulator (ptx_probe_report.txt)"
  local gpu=$OUT/ptx_probe_gpu.txt rep=$OUT/ptx_probe_report.txt rc args=() wrong refs src maxima mism
  if [ ! -x "$PTX_PROBE" ]; then row ptx_probe "not run: $PTX_PROBE was not built"; return; fi
  if [ -f "$PROBE_EXPECT" ]; then
    cp "$PROBE_EXPECT" "$OUT/ptx_probe_emu.txt"
    args=(--expect "$PROBE_EXPECT")
  fi
  timeout -k 5 "$(cap $T_PROBE $AFTER_TESTS)" "$PTX_PROBE" ${args[@]+"${args[@]}"} > "$gpu" 2> "$rep"
  rc=$?
  head -1 "$gpu"
  grep -vE '^reference [^ ]+: ok |^probe [^ ]+: .*: ok$' "$rep" | head -40
  wrong=$(grep -oE '^reference [a-z0-9_]+: WRONG' "$rep" | awk '{ sub(/:$/, "", $2); printf "%s%s", s, $2; s = " " }')
  refs="ISA references ${wrong:+WRONG: }${wrong:-ok}"
  if [ ! -f "$PROBE_EXPECT" ]; then
    row ptx_probe "not run: no $PROBE_EXPECT to compare with (scripts/gpu_deps_bundle.sh makes it); the GPU alone: exit $rc, $refs (ptx_probe_gpu.txt)"
    return
  fi
  src=$(sed -n 's/^# source: //p' "$PROBE_EXPECT" | head -1 | cut -c1-12)
  maxima=$(probe_maxima "$rep")
  mism=$(sed -n 's/^ptx_probe --expect .*: MISMATCH in [0-9]* probe(s): //p' "$rep")
  if ((rc == 0)); then
    row ptx_probe "ok: $(grep -oE 'all [0-9]+ probes agree' "$rep") with the emulator's (${src:-?}); $refs; max $maxima"
  elif ((rc == 124 || rc == 137)); then row ptx_probe "TIMEOUT after $T_PROBE s (ptx_probe_report.txt)"
  elif ((rc == 1)) && [ -n "$mism" ]; then
    row ptx_probe "MISMATCH: $(wc -w <<< "$mism") probe(s) differ from the emulator's (${src:-?}): $mism; $refs; max $maxima (ptx_probe_report.txt)"
  elif ((rc == 1)); then row ptx_probe "FAILED: the emulator's output agrees, but $refs (ptx_probe_report.txt)"
  else row ptx_probe "FAILED (exit $rc): $(grep -m1 -E '^ptx_probe' "$rep" | cut -c1-160)"; fi
}

# run_family NAME SPEC CAP: one process, its own limit, its own row.
declare -a FAILED_FAMILIES=()
run_family() {
  local name=$1 spec=$2 limit=$3 log=$OUT/tests.log first rc status
  printf '\n=== family %s: gpu_tests "%s" (limit %s s)\n' "$name" "$spec" "$limit" >> "$log"
  first=$(( $(wc -l < "$log") + 1 ))
  GPU_TESTS_REQUIRE_DEVICE=1 timeout -k 5 "$limit" "${STDBUF[@]}" "$GPU_TESTS" "$spec" --durations yes >> "$log" 2>&1
  rc=$?
  local part ok fail notrun worst cases
  part=$(tail -n +"$first" "$log")
  fail=$(grep -cE '^\[gpu\].*FAIL' <<< "$part")
  notrun=$(grep -cE '^\[gpu\].*NOT RUN' <<< "$part")
  ok=$(( $(grep -cE '^\[gpu\]' <<< "$part") - fail - notrun ))
  # The worst error as a fraction of its tolerance, over every compared output.
  worst=$(awk '/^\[gpu\]/ && /rel=/ && /tol=/ {
      r = $0; sub(/.*rel=/, "", r); sub(/ .*/, "", r); t = $0; sub(/.*tol=/, "", t); sub(/ .*/, "", t);
      if (t + 0 > 0 && r / t > m) m = r / t } END { if (m != "") printf "%.2f", m }' <<< "$part")
  cases=$(grep -oE 'test cases?: *[0-9]+|in [0-9]+ test cases?' <<< "$part" | tail -1 | grep -oE '[0-9]+')
  local detail="$ok checks ok, $fail failed"
  ((notrun)) && detail+=", $notrun not run (device unusable)"
  detail+="; worst error ${worst:-n/a} of its tolerance; ${cases:-?} test cases"
  if grep -q 'No test cases matched' <<< "$part"; then status="NO TESTS matched $spec"; rc=1
  elif ((rc == 0)); then status="ok: $detail"
  elif ((rc == 124 || rc == 137)); then status="TIMEOUT after $limit s: $detail"
  elif ((rc > 128)); then status="CRASHED (signal $((rc - 128))): $detail"
  else status="FAILED (exit $rc): $detail"; fi
  ((rc == 0)) || { FAILED=1; FAILED_FAMILIES+=("$name|$spec|$rc|$limit"); }
  row "gpu: $name" "$status"
}

phase_gpu_tests() {
  section "GPU tests, one process per family (log: tests.log)"
  if [ ! -x "$GPU_TESTS" ]; then FAILED=1; row "gpu tests" "not run: $GPU_TESTS was not built"; return; fi
  local f name spec c
  for f in "${FAMILIES[@]}"; do
    IFS='|' read -r name spec c <<< "$f"
    run_family "$name" "$spec" "$(cap "$(family_cap "$c")" $AFTER_TESTS)"
  done
}

# sanitize TOOL SPEC LIMIT LABEL: gpu_tests under compute-sanitizer.
sanitize() {
  local tool=$1 spec=$2 limit=$3 label=$4 log=$OUT/tests.log first rc part errors
  if [ -z "$SANITIZER_BIN" ]; then row "$label" "not run: compute-sanitizer not found"; return; fi
  printf '\n=== %s: compute-sanitizer --tool %s gpu_tests "%s" (limit %s s)\n' "$label" "$tool" "$spec" "$limit" >> "$log"
  first=$(( $(wc -l < "$log") + 1 ))
  GPU_TESTS_REQUIRE_DEVICE=1 timeout -k 5 "$limit" "$SANITIZER_BIN" --tool "$tool" --print-limit 30 \
    "$GPU_TESTS" "$spec" >> "$log" 2>&1
  rc=$?
  part=$(tail -n +"$first" "$log")
  errors=$(grep -oE 'ERROR SUMMARY: [0-9]+ error' <<< "$part" | tail -1 | grep -oE '[0-9]+')
  if grep -qE 'Device not supported|Target application returned an error|error 999' <<< "$part" && [ -z "$errors" ]; then
    row "$label" "compute-sanitizer could not run here: $(grep -m1 -E 'not supported|error' <<< "$part" | cut -c1-120)"
  elif ((rc == 124 || rc == 137)); then
    row "$label" "TIMEOUT after $limit s; $(grep -c '^========= [A-Z]' <<< "$part") sanitizer reports so far (tests.log)"
  elif [ -n "$errors" ]; then
    local first_err
    first_err=$(grep -m1 -E '^========= (Invalid|Race|Barrier|Uninitialized|Program hit|ERROR:)' <<< "$part" | cut -c11-150)
    row "$label" "$errors errors (exit $rc)${first_err:+: $first_err}"
  else
    row "$label" "no error summary (exit $rc, see tests.log)"
  fi
}

phase_memcheck() {
  ((${#FAILED_FAMILIES[@]})) || return 0
  section "memcheck on the failed families"
  local f name spec rc limit n=0
  # Failures and crashes first (memcheck explains those); timeouts after.
  # Memcheck slows kernels down: twice the family's own limit, at most T_MEMCHECK.
  for pass in fail timeout; do
    for f in "${FAILED_FAMILIES[@]}"; do
      IFS='|' read -r name spec rc limit <<< "$f"
      if [[ $pass == fail ]] && ((rc == 124 || rc == 137)); then continue; fi
      if [[ $pass == timeout ]] && ! ((rc == 124 || rc == 137)); then continue; fi
      ((n < 3)) || break 2
      (( $(left) > AFTER_TESTS + 20 )) || { row "memcheck: $name" "not run: no time left"; continue; }
      limit=$(( 2 * limit < T_MEMCHECK ? 2 * limit : T_MEMCHECK ))
      sanitize memcheck "$spec" "$(cap $limit $AFTER_TESTS)" "memcheck: $name"
      n=$((n + 1))
    done
  done
}

phase_bench() {
  section "bench_kernels"
  if [ ! -x "$BENCH" ]; then row bench_kernels "not run: not built"; return; fi
  local limit rc
  limit=$(cap $T_BENCH $(( T_TRAIN[0] + T_TRAIN[1] + T_MESH + T_SUMMARY )))
  timeout -k 5 "$limit" "${STDBUF[@]}" "$BENCH" --json "$OUT/bench_kernels.json" >> "$OUT/gpu-check.log.bench" 2>&1
  rc=$?
  cat "$OUT/gpu-check.log.bench"; rm -f "$OUT/gpu-check.log.bench"
  if ((rc == 0)); then row bench_kernels ok
  elif ((rc == 124 || rc == 137)); then row bench_kernels "TIMEOUT after $limit s (partial results kept)"
  else FAILED=1; row bench_kernels "FAILED (exit $rc)"; fi
}

phase_trainer() {
  section "trainer end to end (log: trainer.log)"
  local i c n rc rows log dir reserve j
  if [ -x "$TRAINER" ]; then
    # Which driver, module and devices the trainer itself finds (exit 1: the
    # module next to it does not load).
    timeout -k 5 20 "$TRAINER" devices > "$OUT/devices.tmp" 2>&1
    rc=$?
    { echo "== $TRAINER devices (exit $rc)"; cat "$OUT/devices.tmp"; } >> "$OUT/trainer.log"
    cat "$OUT/devices.tmp"
    if ((rc == 0)); then row "trainer: devices" "ok: $(grep -m1 '^cuda module' "$OUT/devices.tmp" | cut -c1-150)"
    else FAILED=1; row "trainer: devices" "FAILED (exit $rc): $(grep -m1 -E '^cuda module|error' "$OUT/devices.tmp" | cut -c1-150)"; fi
    rm -f "$OUT/devices.tmp"
  fi
  for i in "${!CONFIGS[@]}"; do
    c=${CONFIGS[$i]}
    n=$(basename "$c" .yaml)
    if [ ! -x "$TRAINER" ]; then row "trainer: $n" "not run: not built"; continue; fi
    dir=$ROOT/$BUILD/runs/$n
    rm -rf "$dir"; mkdir -p "$dir"
    log=$dir.log
    reserve=$(( T_MESH + T_SUMMARY ))
    for ((j = i + 1; j < ${#CONFIGS[@]}; ++j)); do reserve=$((reserve + T_TRAIN[j])); done
    timeout -k 5 "$(cap "${T_TRAIN[$i]}" $reserve)" "$TRAINER" --config "$c" --set run.dir="$dir" \
      --set log.progress=lines > "$log" 2>&1
    rc=$?
    rows=$(grep -c ms_per_step "$dir/metrics.jsonl" 2>/dev/null)
    { echo "== $TRAINER --config $c (exit $rc)"; cat "$log"
      [ -f "$dir/metrics.jsonl" ] && { echo "== $dir/metrics.jsonl"; cat "$dir/metrics.jsonl"; }; } >> "$OUT/trainer.log"
    grep -E "^(error|device:|model:|batch:)" "$log" | head -6
    if ((rc == 0)); then row "trainer: $n" "ok: ${rows:-0} steps logged"
    elif ((rc == 124 || rc == 137)); then row "trainer: $n" "TIMEOUT: ${rows:-0} steps logged"
    else
      FAILED=1
      row "trainer: $n" "FAILED (exit $rc): $(grep -m1 -iE 'error' "$log" | cut -c1-140)"
      if (( $(left) > reserve + 10 )); then
        # Every kernel synchronous: the first failing one reports the error.
        echo "== CUDA_LAUNCH_BLOCKING=1 $TRAINER --config $c, 2 steps" >> "$OUT/trainer.log"
        CUDA_LAUNCH_BLOCKING=1 timeout -k 5 "$(cap $T_BLOCKING $reserve)" "$TRAINER" --config "$c" \
          --set run.dir="$dir-blocking" --set train.steps=2 --set log.progress=lines >> "$OUT/trainer.log" 2>&1
        rc=$?
        row "trainer: $n, blocking launches" "exit $rc: $(grep -iE 'error' "$OUT/trainer.log" | tail -1 | cut -c1-140)"
      fi
    fi
  done
}

# The mesh on the one GPU: its rows go straight into summary.md as each
# layout ends (its own TERM trap writes the row of a layout cut short).
phase_mesh() {
  section "mesh: 2 ranks on the one GPU, host-staged Gloo (log: mesh.log)"
  if [ ! -x "$TRAINER" ]; then FAILED=1; row mesh "not run: the trainer was not built"; return; fi
  local limit rc
  limit=$(cap $T_MESH $T_SUMMARY)
  timeout -k 5 "$limit" bash scripts/gpu_mesh_check.sh --work="$ROOT/$BUILD/runs/mesh" --summary="$SUMMARY" \
    --sanitizer="$SANITIZER_BIN" "$TRAINER" "$OUT" "$(( limit > 10 ? limit - 5 : limit ))"
  rc=$?
  ROW_T0=$(date +%s)
  ((rc == 0)) || FAILED=1
  grep -q '^| mesh' "$SUMMARY" || row mesh "FAILED (exit $rc): no row written (mesh.log)"
}

phase_race() {
  ((FAILED == 0)) || return 0
  (( $(left) > 2 * T_SANITIZE + T_SUMMARY + 10 )) || { row "racecheck/synccheck" "not run: no time left"; return; }
  section "racecheck and synccheck on a small attention subset"
  sanitize racecheck "$SANITIZE_SPEC" "$(cap $T_SANITIZE $(( T_SANITIZE + T_SUMMARY )))" "racecheck: attention subset"
  sanitize synccheck "$SANITIZE_SPEC" "$(cap $T_SANITIZE $T_SUMMARY)" "synccheck: attention subset"
}

phase_summary() {
  section "summary"
  printf '| elapsed | %s s of %s s |  |\n' "$(elapsed)" "$BUDGET" >> "$SUMMARY"
  if ((WITH_TORCH)) || [ -f "$OUT/bench_kernels.json" ]; then
    local cmd=(python3 scripts/bench_gpu_torch.py summary --ours "$OUT/bench_kernels.json"
               --torch "$OUT/bench_torch.json" --out "$OUT/tables.tmp") c n
    for c in "${CONFIGS[@]}"; do
      n=$(basename "$c" .yaml)
      cmd+=(--trainer "$n=$c:$ROOT/$BUILD/runs/$n/metrics.jsonl")
    done
    if timeout "$T_SUMMARY" "${cmd[@]}" > /dev/null 2>&1 && [ -f "$OUT/tables.tmp" ]; then
      { echo; cat "$OUT/tables.tmp"; } >> "$SUMMARY"
    else
      echo "(the comparison tables could not be made; see the JSON files)" >> "$SUMMARY"
    fi
    rm -f "$OUT/tables.tmp"
  fi
  echo
  cat "$SUMMARY"
}

# ---- dry run: everything short of the GPU ------------------------------------
dry_run() {
  local fail=0
  ok() { echo "  ok       $*"; }
  bad() { echo "  FAILED   $*"; fail=1; }
  echo "gpu-check --dry-run: budget $BUDGET s; plan (caps in seconds):"
  echo "  [$T_INFO] versions; [$T_CONFIGURE] cmake ${CMAKE_ARGS[*]} (+ NCCL from python3's site-packages)"
  echo "  [$T_BUILD] cmake --build $BUILD --target ptx_probe [$T_PROBE_BUILD], gpu_tests, then trainer bench_kernels (PyTorch meanwhile: ${TORCH_CMD[*]})"
  echo "  [$T_PROBE] ptx_probe --expect ${PROBE_EXPECT#"$ROOT"/} > \$OUT/ptx_probe_gpu.txt 2> \$OUT/ptx_probe_report.txt"
  local f name spec c
  for f in "${FAMILIES[@]}"; do
    IFS='|' read -r name spec c <<< "$f"
    echo "  [$c] GPU_TESTS_REQUIRE_DEVICE=1 gpu_tests '$spec' --durations yes   # $name"
  done
  echo "  [2x the family's, $T_MEMCHECK at most, 3 families at most] compute-sanitizer --tool memcheck gpu_tests SPEC   # failed families"
  echo "  [$T_BENCH] bench_kernels --json \$OUT/bench_kernels.json"
  for i in "${!CONFIGS[@]}"; do echo "  [${T_TRAIN[$i]}] trainer --config ${CONFIGS[$i]}   (failing: again 2 steps, CUDA_LAUNCH_BLOCKING=1)"; done
  echo "  [$T_MESH] bash scripts/gpu_mesh_check.sh TRAINER \$OUT SECONDS   # 9 layouts x 2 ranks on the GPU, bf16, backend auto -> host"
  echo "  [$T_SANITIZE each] compute-sanitizer --tool racecheck|synccheck gpu_tests '$SANITIZE_SPEC'   # nothing failed"
  echo "  [left] ${TORCH_CMD[*]}; [$T_SUMMARY] tables"
  echo "checks:"
  # The bundle, compressed, in the checkout that travels.
  if [ ! -f gpu_deps/README ]; then bad "gpu_deps/ is missing: bash scripts/gpu_deps_bundle.sh"
  elif [ ! -f gpu_deps/lib/libopenblas.so.0.xz ]; then bad "gpu_deps/ is not the compressed bundle: bash scripts/gpu_deps_bundle.sh"
  else ok "gpu_deps/ (compressed OpenBLAS)"; fi
  for f in gpu_deps/lib/libgfortran.so.5 gpu_deps/lib/libquadmath.so.0 gpu_deps/lib/libyaml-cpp.so.0.7 \
           gpu_deps/lib/libgloo.so.0 gpu_deps/lib/x86_64-linux-gnu/cmake/yaml-cpp/yaml-cpp-config.cmake \
           gpu_deps/share/cmake/CLI11/CLI11Config.cmake gpu_deps/lib/cmake/Catch2/Catch2Config.cmake \
           gpu_deps/share/cmake/Gloo/GlooConfig.cmake gpu_deps/include/openblas/cblas.h \
           gpu_deps/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake gpu_deps/include/nlohmann/json.hpp \
           "${CONFIGS[@]}" scripts/bench_gpu_torch.py bench/bench_kernels.cu; do
    [ -e "$f" ] || bad "missing $f"
  done
  # The commit, for a copy without .git.
  if [ -d gpu_deps ]; then
    local dirty=""
    git diff --quiet HEAD -- 2>/dev/null || dirty=" + uncommitted changes"
    { echo "$(git rev-parse HEAD)$dirty"; echo "written by gpu-check.sh --dry-run at $(date -u '+%Y-%m-%d %H:%M:%S UTC')"; } > gpu_deps/SOURCE
    ok "gpu_deps/SOURCE: $(head -1 gpu_deps/SOURCE)"
  fi
  # What travels: tracked and untracked-not-ignored files plus gpu_deps.
  local kb
  kb=$(( $(git ls-files -co --exclude-standard -z | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1) + $(du -sk gpu_deps 2>/dev/null | cut -f1 || echo 0) ))
  if ((kb > 48 * 1024)); then bad "the carried tree is $((kb / 1024)) MiB (limit 64 MiB; keep it under 48)"
  else ok "carried tree ~$((kb / 1024)) MiB of the 64 MiB limit"; fi
  dry_probe || fail=1
  # Syntax of every script the call runs.
  bash -n "$0" && ok "bash -n $0" || bad "bash -n $0"
  bash -n scripts/gpu_mesh_check.sh && ok "bash -n scripts/gpu_mesh_check.sh" || bad "bash -n scripts/gpu_mesh_check.sh"
  python3 -m py_compile scripts/prepare_text.py && ok "py_compile scripts/prepare_text.py" || bad "py_compile scripts/prepare_text.py"
  python3 -m py_compile scripts/bench_gpu_torch.py && ok "py_compile scripts/bench_gpu_torch.py" || bad "py_compile scripts/bench_gpu_torch.py"
  # The configure line, with the bundle as the only hints (no CUDA compile needed).
  local cfg=$OUT/configure-check
  rm -rf "$cfg"
  local args=("${CMAKE_ARGS[@]}")
  args[3]=$cfg
  if [ -d gpu_deps ]; then
    [ -e gpu_deps/lib/libopenblas.so.0 ] || xz -dk gpu_deps/lib/libopenblas.so.0.xz 2>/dev/null
    if cmake "${args[@]}" > "$OUT/configure-check.log" 2>&1; then
      ok "cmake configure with gpu_deps (TRAINER_CUDA=ON, sm_$CUDA_ARCH)"
      grep -q "^Catch2_DIR:.*gpu_deps" "$cfg/CMakeCache.txt" || bad "Catch2_DIR does not point into gpu_deps"
      grep -q "^nlohmann_json_DIR:.*gpu_deps" "$cfg/CMakeCache.txt" || bad "nlohmann_json_DIR does not point into gpu_deps"
    else
      bad "cmake configure: $(grep -m1 -E 'Error|error' "$OUT/configure-check.log") ($OUT/configure-check.log)"
    fi
    rm -f gpu_deps/lib/libopenblas.so.0   # only the compressed copy travels
  fi
  # Every GPU test in exactly one family, each family matching something.
  local local_bin=""
  for t in build/tests/gpu_tests build-gpu/tests/gpu_tests; do [ -x "$t" ] && { local_bin=$t; break; }; done
  if [ -n "$local_bin" ]; then
    local all covered=""
    all=$("$local_bin" --list-test-names-only 2>/dev/null | grep -v '^$' | sort)
    for f in "${FAMILIES[@]}"; do
      IFS='|' read -r name spec c <<< "$f"
      local got
      got=$("$local_bin" --list-test-names-only "$spec" 2>/dev/null | grep -v '^$')
      [ -n "$got" ] && ok "family $name: $(grep -c . <<< "$got") test cases" || bad "family $name: '$spec' matches no test"
      covered+="$got"$'\n'
    done
    local dups missing
    dups=$(grep -v '^$' <<< "$covered" | sort | uniq -d)
    missing=$(comm -23 <(echo "$all") <(grep -v '^$' <<< "$covered" | sort -u))
    [ -z "$dups" ] || bad "in two families: $dups"
    [ -z "$missing" ] && ok "all $(grep -c . <<< "$all") GPU test cases are in a family" || bad "in no family: $missing"
    [ -n "$("$local_bin" --list-test-names-only "$SANITIZE_SPEC" 2>/dev/null | grep -v '^$')" ] &&
      ok "sanitizer subset '$SANITIZE_SPEC'" || bad "'$SANITIZE_SPEC' matches no test"
  else
    # No local build: the same check from the test sources' tags (Catch2's
    # spec rules: "," or, "~" not, adjacent tags and, "[.]" hidden).
    local specs=()
    for f in "${FAMILIES[@]}"; do IFS='|' read -r name spec c <<< "$f"; specs+=("$name=$spec"); done
    if python3 - "$SANITIZE_SPEC" "${specs[@]}" <<'PY'
import glob, re, sys
cases = []
for path in sorted(glob.glob("tests/gpu/*.cpp")):
    text = open(path).read()
    for m in re.finditer(r'TEST_CASE\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+),\s*"((?:\[[^\]]*\])+)"\s*\)', text):
        name = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
        cases.append((name, set(re.findall(r"\[([^\]]*)\]", m.group(2)))))
if sum(t.count("TEST_CASE(") for t in (open(p).read() for p in glob.glob("tests/gpu/*.cpp"))) != len(cases):
    print("  FAILED   could not read the tags of every TEST_CASE in tests/gpu"); sys.exit(1)
def matches(spec, tags):
    for alt in spec.split(","):
        ok, neg = True, False
        for tok in re.findall(r"~|\[[^\]]*\]", alt):
            if tok == "~":
                neg = True
                continue
            ok = ok and ((tok[1:-1] in tags) != neg)
            neg = False
        if ok and ("." not in tags or alt.strip()):
            return True
    return False
fail = 0
seen = {}
for arg in sys.argv[2:]:
    fam, spec = arg.split("=", 1)
    got = [n for n, t in cases if "." not in t and matches(spec, t)]
    print(f"  {'ok      ' if got else 'FAILED  '} family {fam}: {len(got)} test cases (from the sources)")
    fail |= not got
    for n in got:
        seen.setdefault(n, []).append(fam)
visible = [n for n, t in cases if "." not in t]
for n in visible:
    if len(seen.get(n, [])) != 1:
        print(f"  FAILED   '{n}' is in {len(seen.get(n, []))} families"); fail = 1
if not fail:
    print(f"  ok       all {len(visible)} GPU test cases are in exactly one family (from the sources)")
hidden = [n for n, t in cases if matches(sys.argv[1], t)]
print(f"  {'ok      ' if hidden else 'FAILED  '} sanitizer subset '{sys.argv[1]}': {len(hidden)} test cases")
sys.exit(1 if fail or not hidden else 0)
PY
    then :; else fail=1; fi
  fi
  local tr=""
  for t in build/trainer build-gpu/trainer; do [ -x "$t" ] && { tr=$t; break; }; done
  # A local CUDA build's trainer must load its module (no driver needed).
  if [ -n "$tr" ] && [ -e "$(dirname "$tr")/libtrainer_cuda.so" ]; then
    local dev
    if dev=$(env -u TRAINER_CUDA_MODULE "$tr" devices 2>&1); then ok "$tr loads $(grep -m1 '^cuda module' <<< "$dev" | cut -c14-100)"
    else bad "$tr devices: $(grep -m1 -E '^cuda module|error' <<< "$dev")"; fi
  elif [ -n "$tr" ]; then
    echo "  --       $tr has no libtrainer_cuda.so beside it (a CPU-only build): module not checked"
  fi
  for c in "${CONFIGS[@]}"; do
    if [ -z "$tr" ]; then echo "  --       $c not parsed (no local trainer build)"
    elif "$tr" --config "$c" --print-config > /dev/null 2> "$OUT/print-config.err"; then ok "$c parses"
    else bad "$c: $(head -c 300 "$OUT/print-config.err" 2>/dev/null)"; fi
  done
  dry_mesh "$tr" || fail=1
  echo
  echo "device call: run(command=\"bash scripts/gpu-check.sh\", carry=[\"gpu_deps\"], timeout_s=600)"
  ((fail)) && { echo "gpu-check --dry-run: FAILED"; return 1; }
  echo "gpu-check --dry-run: ok"
}

# dry_probe: the emulator's PTX probe output is in the bundle, readable, and
# what this checkout's emulator computes (where a build of it is here).
dry_probe() {
  local pe=$PROBE_EXPECT bin=${PTX_PROBE_BUILD:-build}/ptx_probe_emu src head
  if [ ! -f "$pe" ]; then
    bad "${pe#"$ROOT"/} is missing: build ptx_probe_emu (build/, or PTX_PROBE_BUILD=DIR) and rerun scripts/gpu_deps_bundle.sh"
    return 1
  fi
  src=$(sed -n 's/^# source: //p' "$pe" | head -1)
  head=$(git rev-parse HEAD 2>/dev/null)
  ok "${pe#"$ROOT"/}: $(grep -vc '^#' "$pe") values, $(grep -c '^# reference .*: ok ' "$pe") ISA references ok, from ${src:-an unknown commit}"
  [[ -n $head && $src == "$head"* ]] ||
    echo "  --       ${pe#"$ROOT"/} is not from HEAD ($head): rerun scripts/gpu_deps_bundle.sh if emu/ or tests/ptx_probe changed"
  if [ ! -x "$bin" ]; then
    echo "  --       no $bin here: the file's format is checked on the GPU"
    return 0
  fi
  if "$bin" --expect "$pe" > /dev/null 2> "$OUT/ptx_probe_dry.txt"; then ok "$bin --expect ${pe#"$ROOT"/}: $(tail -1 "$OUT/ptx_probe_dry.txt" | sed 's/.*: //')"
  else bad "$bin --expect ${pe#"$ROOT"/}: $(tail -1 "$OUT/ptx_probe_dry.txt") ($OUT/ptx_probe_dry.txt; rerun scripts/gpu_deps_bundle.sh)"; return 1; fi
}

# dry_mesh TRAINER: the mesh phase on this CPU build, every layout, as the GPU
# run does it but in fp32 with parallel.backend=host (the same staging code
# over CPU memory), against the CPU one-process run at 1e-5.
dry_mesh() {
  local tr=$1 rows line name res secs n=0 f=0 t0
  if [ -z "$tr" ]; then echo "  --       mesh not rehearsed (no local trainer build)"; return 0; fi
  rm -rf "$OUT/mesh-work" "$OUT/mesh-dry.md"
  t0=$(date +%s)
  timeout -k 5 300 bash scripts/gpu_mesh_check.sh --cpu --work="$OUT/mesh-work" --summary="$OUT/mesh-dry.md" \
    "$tr" "$OUT" 290 > "$OUT/mesh-dry.out" 2>&1
  echo "  mesh on the CPU ($tr, fp32, parallel.backend=host, $(( $(date +%s) - t0 )) s; $OUT/mesh.log):"
  while IFS= read -r line; do
    IFS='|' read -r _ name res secs _ <<< "$line"
    name=${name# } name=${name% } res=${res# } res=${res% } secs=${secs// /}
    n=$((n + 1))
    if [[ $res == ok* ]]; then echo "  ok       $name: ${res#ok: } (${secs} s)"
    else echo "  FAILED   $name: $res (${secs} s)"; f=1; fi
  done < <(grep '^| mesh' "$OUT/mesh-dry.md" 2>/dev/null)
  rows=$(( $(bash scripts/gpu_mesh_check.sh --list | grep -c .) + 1 ))
  if ((n != rows)); then echo "  FAILED   mesh: $n rows, expected $rows (references and every layout): $(tail -3 "$OUT/mesh-dry.out")"; f=1; fi
  return $f
}

# ---- main ---------------------------------------------------------------------
main() {
  SANITIZER_BIN=$(find_sanitizer)
  {
    echo "# gpu-check $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo
    echo "commit: $(commit_line)"
    echo "budget: $BUDGET s; logs: gpu-check.log build.log tests.log trainer.log mesh.log bench_torch.log ptx_probe_report.txt"
    echo
    echo "| phase | result | s |"
    echo "|---|---|---|"
  } > "$SUMMARY"
  export LD_LIBRARY_PATH="$DEPS/lib${NCCL_LIB_DIR:+:$NCCL_LIB_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  phase_versions
  phase_data
  # PyTorch fills the GPU while our build runs, and only then.
  [ -z "$BIN_DIR" ] && torch_start "$(cap $(( T_CONFIGURE + T_BUILD )) $AFTER_TESTS)"
  phase_build
  if [ -n "$TORCH_PID" ]; then torch_stop; row "pytorch (during build)" "$(torch_results) results"; fi
  phase_ptx_probe
  phase_gpu_tests
  phase_memcheck
  phase_bench
  phase_trainer
  phase_mesh
  phase_race
  if ((WITH_TORCH)) && (( $(left) > T_SUMMARY + 30 )); then
    section "PyTorch benchmark with the time left"
    torch_start "$(cap 600 $T_SUMMARY)"
    wait "$TORCH_PID" 2>/dev/null
    TORCH_PID=""
    row "pytorch (time left)" "$(torch_results) results in all (bench_torch.json)"
  fi
  phase_summary
}

if ((DRY)); then dry_run; exit $?; fi
# Everything printed also goes to gpu-check.log; the pipeline waits for tee.
main 2>&1 | tee -a "$OUT/gpu-check.log"
grep -qE '^\| (configure|build|gpu[^|]*|ptx_probe|trainer: [^|]*|bench_kernels|mesh[^|]*) \| (FAILED|TIMEOUT|CRASHED|NO TESTS|not run|KILLED|MISMATCH)' "$SUMMARY" && exit 1
exit 0
