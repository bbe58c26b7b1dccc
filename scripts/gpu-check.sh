#!/usr/bin/env bash
# The whole GPU check in one call on the lent GPU machine (one H200, nvcc,
# CMake, ninja, PyTorch; no Debian packages, no network), under 10 minutes:
#
#   run(command="bash scripts/gpu-check.sh", carry=["gpu_deps"], timeout_s=600)
#
# after `bash scripts/gpu_deps_bundle.sh` here has made gpu_deps/ (the
# Debian-packaged libraries that machine lacks). It
#   1. prints the GPU, driver, nvcc, CMake, compiler and PyTorch versions;
#   2. writes random-token files for the two bench configs (numpy);
#   3. starts scripts/bench_gpu_torch.py (PyTorch kernels and models) in the
#      background: it uses the GPU while the trainer builds, which uses only
#      the CPUs (the build runs at lower priority);
#   4. configures and builds build-gpu/ (CUDA on, sm_90) with all cores,
#      trainer, gpu_tests and bench_kernels first;
#   5. runs the CPU unit tests (no GPU visible, lowest priority) while
#      PyTorch finishes, then, with the GPU to itself: the GPU tests
#      (ctest -L gpu), bench_kernels, and the trainer on
#      configs/bench_gpt2_124m.yaml and configs/bench_llama_1b.yaml;
#   6. prints a status table, then the comparison table (kernels: ours vs
#      PyTorch; end to end: tokens/s and MFU, ours vs PyTorch eager vs compiled).
# Every part has its own time limit, so a hang in one still leaves the others'
# results and the tables. Logs, JSON and the tables go to $OUT (8 files, flat):
#   gpu-check.log build.log tests.log trainer.log bench_kernels.json
#   bench_torch.log bench_torch.json summary.md
#
#   bash scripts/gpu-check.sh --dry-run   # here, no GPU: the plan, the commands,
#                                         # and a check that every file they use exists
# Numbers go to docs/PERFORMANCE.md only once measured by this script.
set -uo pipefail   # no -e: a failing part is recorded and the rest still runs
cd "$(dirname "$0")/.."
ROOT=$PWD

DRY=0
BUDGET=${GPU_CHECK_BUDGET:-570}   # seconds; the device tool kills the call at 600
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=1 ;;
    --budget=*) BUDGET=${a#--budget=} ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument '$a'" >&2; exit 2 ;;
  esac
done

# Time caps (seconds), about 540 in all: PyTorch runs during the build, and
# everything after the build has the GPU alone. Each step after the build
# keeps back the caps of the steps after it, so a slow one cannot eat them.
# The LLaMA run gets more: 1.1B parameters are initialised on the host, one
# thread (~15 s). A run cut short still leaves its logged steps' ms/step.
T_INFO=20 T_TORCH=280 T_CONFIGURE=90 T_BUILD=275 T_GPU_TESTS=60 T_BENCH=80 T_SUMMARY=10
CONFIGS=(configs/bench_gpt2_124m.yaml configs/bench_llama_1b.yaml)
T_TRAIN=(35 65)
BUILD=build-gpu
DEPS=$ROOT/gpu_deps
CUDA_ARCH=${CUDA_ARCH:-90}
JOBS=$(nproc 2>/dev/null || echo 4)
AFTER_BENCH=$(( T_TRAIN[0] + T_TRAIN[1] + T_SUMMARY ))
AFTER_TESTS=$(( T_BENCH + AFTER_BENCH ))
AFTER_BUILD=$(( T_GPU_TESTS + AFTER_TESTS ))

if ((DRY)); then
  OUT=${OUT:-/tmp/gpu-check-dry}
else
  OUT=${OUT:-$ROOT/gpu-check-out}
fi
mkdir -p "$OUT"
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET - $(elapsed) )); }
# cap N RESERVE: N, or less so that RESERVE seconds remain for what follows.
cap() { local n=$1 r=${2:-0} l; l=$(( $(left) - r )); ((l < n)) && n=$l; ((n < 1)) && n=1; echo "$n"; }

declare -A STATUS
declare -a ORDER
status() { [[ -v "STATUS[$1]" ]] || ORDER+=("$1"); STATUS[$1]=$2; }
section() { printf '\n===== [%4ss] %s =====\n' "$(elapsed)" "$*"; }

# The C++ unit tests that need no GPU (the slow Python reference and smoke
# tests excluded), on the CPUs only, within $1 seconds.
run_cpu_tests() {
  local rc line
  echo "== CPU unit tests, limit $1 s" >> "$OUT/tests.log"
  (cd "$BUILD" && CUDA_VISIBLE_DEVICES= nice -n 19 timeout -k 5 "$1" \
     ctest -LE gpu -E 'reference_|quickstart_smoke|gpu|cuda|GPU|CUDA' -j"$JOBS" --timeout 60) >> "$OUT/tests.log" 2>&1
  rc=$?
  line=$(grep -E "tests passed" "$OUT/tests.log" | tail -1)
  if ((rc == 0)); then status cpu_tests "ok: $line"
  elif ((rc == 124)); then status cpu_tests "TIMEOUT after $1 s (partial; see tests.log)"
  else status cpu_tests "FAILED: ${line:-exit $rc}"; fi
  grep -E "\*\*\*Failed|\*\*\*Timeout|\(Failed\)" "$OUT/tests.log" | tail -10
}

CMAKE_ARGS=(
  -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTRAINER_CUDA=ON
  -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH"
  -DCMAKE_PREFIX_PATH="$DEPS"
  -Dyaml-cpp_DIR="$DEPS/lib/x86_64-linux-gnu/cmake/yaml-cpp"
  -DCLI11_DIR="$DEPS/share/cmake/CLI11"
  -DCatch2_DIR="$DEPS/lib/cmake/Catch2"
  -DGloo_DIR="$DEPS/share/cmake/Gloo"
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
# (site-packages/nvidia/nccl/{include,lib}), where CMakeLists.txt does not
# look. GPU_CHECK_NCCL=0 builds without it (comm/ then has no GPU collectives).
NCCL_LIB_DIR=""
if [ "${GPU_CHECK_NCCL:-1}" != 0 ]; then
  probe='
import glob, os, site
for root in site.getsitepackages() + [site.getusersitepackages()]:
    for inc in sorted(glob.glob(os.path.join(root, "nvidia", "**", "include", "nccl.h"), recursive=True)):
        lib = os.path.join(os.path.dirname(os.path.dirname(inc)), "lib", "libnccl.so.2")
        if os.path.exists(lib):
            print(os.path.dirname(inc), lib)
            raise SystemExit
'
  found=$(python3 -c "$probe" 2>/dev/null) || true
  read -r NCCL_INC NCCL_LIB <<< "$found"
  if [ -n "${NCCL_LIB:-}" ]; then
    CMAKE_ARGS+=(-DNCCL_INCLUDE_DIR="$NCCL_INC" -DNCCL_LIBRARY="$NCCL_LIB")
    NCCL_LIB_DIR=$(dirname "$NCCL_LIB")
  fi
fi
TORCH_CMD=(python3 scripts/bench_gpu_torch.py all --json "$OUT/bench_torch.json" --deadline $((T_TORCH - 15)))
BENCH_CMD=("$BUILD/bench/bench_kernels" --json "$OUT/bench_kernels.json")
SUMMARY_CMD=(python3 scripts/bench_gpu_torch.py summary --ours "$OUT/bench_kernels.json"
             --torch "$OUT/bench_torch.json" --out "$OUT/summary.md")
for c in "${CONFIGS[@]}"; do
  n=$(basename "$c" .yaml)
  SUMMARY_CMD+=(--trainer "$n=$c:$BUILD/runs/$n/metrics.jsonl")
done

# ----------------------------------------------------------------------------
if ((DRY)); then
  echo "gpu-check --dry-run: budget ${BUDGET} s, results would go to \$OUT (here $OUT)"
  echo
  echo "plan (time caps in seconds):"
  echo "  [$T_INFO] versions: nvidia-smi, nvcc, cmake, ninja, gcc, python3/torch"
  echo "  data: python3 (numpy) -> data/bench/random_50304.bin, data/bench/random_32000.bin (4M uint16 tokens each)"
  echo "  [$T_TORCH, background] PYTHONUNBUFFERED=1 ${TORCH_CMD[*]}"
  echo "  [$T_CONFIGURE] cmake ${CMAKE_ARGS[*]}"
  echo "      (NCCL from site-packages/nvidia/nccl of python3 where found: here ${NCCL_LIB:-none})"
  echo "  [$T_BUILD] nice -n 10 cmake --build $BUILD -j$JOBS --target trainer gpu_tests bench_kernels, then all (keep going past failures)"
  echo "  [until PyTorch's limit, at most 150] while PyTorch runs, if the build is done:"
  echo "      CUDA_VISIBLE_DEVICES= nice -n 19 ctest -LE gpu -E 'reference_|quickstart_smoke|gpu|cuda|GPU|CUDA' (CPU unit tests)"
  echo "  wait for the PyTorch benchmark"
  echo "  [$T_GPU_TESTS] ctest -L gpu --output-on-failure (or, if none is labelled, ctest -R 'gpu|cuda|GPU|CUDA')"
  echo "  [$T_BENCH] ${BENCH_CMD[*]}"
  for i in "${!CONFIGS[@]}"; do
    c=${CONFIGS[$i]}
    echo "  [${T_TRAIN[$i]}] $BUILD/trainer --config $c --set run.dir=$BUILD/runs/$(basename "$c" .yaml) --set log.progress=lines"
  done
  echo "  [what is left] the CPU unit tests, if they did not run during the wait"
  echo "  [$T_SUMMARY] ${SUMMARY_CMD[*]}"
  echo
  echo "device tool call: run(command=\"bash scripts/gpu-check.sh\", carry=[\"gpu_deps\"], timeout_s=600)"
  echo
  fail=0
  check() { if [ -e "$1" ]; then echo "  ok       $1"; else echo "  MISSING  $1${2:+  ($2)}"; fail=1; fi; }
  echo "files:"
  check gpu_deps/README "run: bash scripts/gpu_deps_bundle.sh"
  if [ -e gpu_deps/lib/libopenblas.so.0 ] || [ -e gpu_deps/lib/libopenblas.so.0.xz ]; then
    echo "  ok       gpu_deps/lib/libopenblas.so.0$([ -e gpu_deps/lib/libopenblas.so.0 ] || echo .xz)"
  else
    echo "  MISSING  gpu_deps/lib/libopenblas.so.0  (run: bash scripts/gpu_deps_bundle.sh)"; fail=1
  fi
  for f in gpu_deps/lib/libgfortran.so.5 gpu_deps/lib/libquadmath.so.0 gpu_deps/lib/libyaml-cpp.so.0.7 \
           gpu_deps/lib/x86_64-linux-gnu/cmake/yaml-cpp/yaml-cpp-config.cmake \
           gpu_deps/share/cmake/CLI11/CLI11Config.cmake gpu_deps/lib/cmake/Catch2/Catch2Config.cmake \
           gpu_deps/include/openblas/cblas.h gpu_deps/include/yaml-cpp/yaml.h gpu_deps/include/CLI/CLI.hpp \
           gpu_deps/include/catch2/catch.hpp \
           CMakeLists.txt tests/CMakeLists.txt bench/CMakeLists.txt bench/bench_kernels.cu \
           scripts/bench_gpu_torch.py "${CONFIGS[@]}" kernels/cuda/cuda_context.h kernels/ops.h; do
    check "$f"
  done
  if grep -Eq '^[^#]*add_subdirectory\(bench\)' CMakeLists.txt; then
    echo "  ok       CMakeLists.txt adds bench/"
  else
    echo "  WARNING  CMakeLists.txt has no add_subdirectory(bench): bench_kernels will not be built"
    echo "           (add: if(TRAINER_HAVE_CUDA) add_subdirectory(bench) endif())"
  fi
  ls kernels/cuda/*.cu >/dev/null 2>&1 && echo "  ok       $(ls kernels/cuda/*.cu | wc -l) CUDA sources in kernels/cuda/"
  echo "syntax:"
  if bash -n "$0"; then echo "  ok       bash -n $0"; else fail=1; fi
  if python3 -m py_compile scripts/bench_gpu_torch.py; then echo "  ok       py_compile scripts/bench_gpu_torch.py"; else fail=1; fi
  for c in "${CONFIGS[@]}"; do
    if python3 -c "import sys, yaml; c = yaml.safe_load(open(sys.argv[1])); assert c['train']['device'] == 'cuda' and c['log']['interval'] == 1" "$c" 2>/dev/null; then
      echo "  ok       $c (device cuda, log.interval 1)"
    elif python3 -c "import yaml" 2>/dev/null; then
      echo "  BAD      $c: expected train.device cuda and log.interval 1"; fail=1
    fi
    for t in build-bundle/trainer build/trainer; do
      if [ -x "$t" ]; then
        if LD_LIBRARY_PATH="$DEPS/lib:${LD_LIBRARY_PATH:-}" "$t" --config "$c" --print-config > /dev/null 2>"$OUT/print-config.err"; then
          echo "  ok       $t --config $c --print-config"
        else
          echo "  BAD      $t --config $c --print-config: $(head -c 300 "$OUT/print-config.err")"; fail=1
        fi
        break
      fi
    done
  done
  size_kb=$(( $(git ls-files -co --exclude-standard -z 2>/dev/null | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1) + $(du -sk gpu_deps 2>/dev/null | cut -f1 || echo 0) ))
  echo "carried tree: ~$((size_kb / 1024)) MiB of the 64 MiB limit (working tree + gpu_deps)"
  ((size_kb > 60 * 1024)) && { echo "  too close to the 64 MiB limit"; fail=1; }
  ((fail)) && { echo "gpu-check --dry-run: FAILED"; exit 1; }
  echo "gpu-check --dry-run: ok"
  exit 0
fi

# ----------------------------------------------------------------------------
main() {
echo "gpu-check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), budget ${BUDGET} s, results in $OUT"

section "versions"
export LD_LIBRARY_PATH="$DEPS/lib${NCCL_LIB_DIR:+:$NCCL_LIB_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "NCCL: ${NCCL_LIB:-not found in the site-packages of python3, the build goes on without it}"
if [ ! -e "$DEPS/lib/libopenblas.so.0" ] && [ -e "$DEPS/lib/libopenblas.so.0.xz" ]; then
  # Made by gpu_deps_bundle.sh --xz; python3's lzma stands in where xz is missing.
  xz -dk "$DEPS/lib/libopenblas.so.0.xz" 2>/dev/null ||
    python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
      "$DEPS/lib/libopenblas.so.0.xz" "$DEPS/lib/libopenblas.so.0"
fi
[ -e "$DEPS/lib/libopenblas.so.0" ] || echo "gpu-check: gpu_deps is missing: was it carried (carry=[\"gpu_deps\"])?"
timeout "$T_INFO" bash -c '
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv
  nvidia-smi | head -15
  echo "nvcc: $(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)"; (nvcc --version || /usr/local/cuda/bin/nvcc --version) | tail -2
  cmake --version | head -1; echo "ninja $(ninja --version 2>/dev/null || echo missing)"
  c++ --version | head -1; echo "omp.h: $(echo "#include <omp.h>" | c++ -fopenmp -E -x c++ - >/dev/null 2>&1 && echo found || echo MISSING)"
  python3 -c "import torch, numpy; print(\"python3\", __import__(\"sys\").version.split()[0], \"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"numpy\", numpy.__version__)"
  echo "cpus $(nproc), $(free -g | awk "/Mem:/{print \$2}") GiB RAM, disk $(df -h . | awk "NR==2{print \$4}") free"
' || true
command -v git >/dev/null && git rev-parse --short HEAD 2>/dev/null | sed 's/^/commit /'

section "data"
if timeout 60 python3 - <<'PY'
import os
os.makedirs("data/bench", exist_ok=True)
n = 1 << 22  # 4M tokens: far more than 30 steps read, written in a second
for vocab in (50304, 32000):
    path = f"data/bench/random_{vocab}.bin"
    try:
        import numpy as np
        np.random.default_rng(vocab).integers(0, vocab, size=n, dtype=np.uint16).tofile(path)
    except ImportError:  # slower, same format
        import array, random
        r = random.Random(vocab)
        with open(path, "wb") as f:
            array.array("H", (r.randrange(vocab) for _ in range(n))).tofile(f)
    print(path, os.path.getsize(path), "bytes")
PY
then status data ok; else status data FAILED; fi

section "PyTorch benchmark (background, log: bench_torch.log)"
PYTHONUNBUFFERED=1 timeout -k 10 "$T_TORCH" "${TORCH_CMD[@]}" > "$OUT/bench_torch.log" 2>&1 &
TORCH_PID=$!
TORCH_START=$(date +%s)
echo "started pid $TORCH_PID: ${TORCH_CMD[*]}"

section "configure (log: build.log)"
{
  echo "cmake ${CMAKE_ARGS[*]}"
  timeout "$T_CONFIGURE" cmake "${CMAKE_ARGS[@]}"
} > "$OUT/build.log" 2>&1
rc=$?
grep -E "trainer: |CMAKE_CUDA_COMPILER|Error|error" "$OUT/build.log" | head -20
if ((rc == 0)); then status configure ok; else status configure "FAILED (exit $rc)"; tail -30 "$OUT/build.log"; fi

if [[ ${STATUS[configure]} == ok ]]; then
  section "build, $JOBS jobs (log: build.log)"
  KEEP_GOING=(-k 0)
  grep -q Ninja "$BUILD/CMakeCache.txt" 2>/dev/null || KEEP_GOING=(-k)
  # What the GPU steps run comes first, so a build cut short by its limit
  # still leaves them; then everything else (the CPU unit tests).
  # (trainer always exists; the others only where their CMakeLists added
  # them, and naming a missing target would fail the whole build command.)
  FIRST=(trainer)
  targets=$(cmake --build "$BUILD" --target help 2>/dev/null)
  for t in gpu_tests bench_kernels; do
    grep -qE "(^|[ .])$t(:| |$)" <<< "$targets" && FIRST+=("$t")
  done
  t0=$(date +%s)
  # The build may run into PyTorch's time, not into the GPU steps' time.
  build_limit=$(cap $T_BUILD $AFTER_BUILD)
  rc=0
  if ((${#FIRST[@]})); then
    echo "== build ${FIRST[*]}" >> "$OUT/build.log"
    nice -n 10 timeout -k 10 "$build_limit" cmake --build "$BUILD" -j"$JOBS" --target "${FIRST[@]}" -- "${KEEP_GOING[@]}" \
      >> "$OUT/build.log" 2>&1
    rc=$?
    echo "build of ${FIRST[*]}: exit $rc after $(( $(date +%s) - t0 )) s"
  fi
  rest=$(( build_limit - ($(date +%s) - t0) ))
  if ((rc != 124 && rest > 5)); then
    echo "== build all" >> "$OUT/build.log"
    nice -n 10 timeout -k 10 "$rest" cmake --build "$BUILD" -j"$JOBS" -- "${KEEP_GOING[@]}" >> "$OUT/build.log" 2>&1
    rc2=$?
    ((rc == 0)) && rc=$rc2
  elif ((rc == 0)); then
    rc=124
  fi
  echo "build: exit $rc after $(( $(date +%s) - t0 )) s"
  grep -E "error|FAILED|warning: .*(spill|stack frame)" "$OUT/build.log" | head -40
  if ((rc == 0)); then status build ok
  elif ((rc == 124)); then status build "TIMEOUT after $build_limit s"
  else status build "FAILED (exit $rc)"; fi
  for t in trainer tests/gpu_tests bench/bench_kernels tests/unit_tests; do
    [ -x "$BUILD/$t" ] && echo "built: $BUILD/$t" || echo "not built: $BUILD/$t"
  done
fi

# The CPU unit tests fill the wait for PyTorch: no GPU visible to them (they
# are the CI's tests, and must not disturb PyTorch's timings), lowest CPU
# priority so PyTorch's launch thread keeps its core.
torch_left=$(( TORCH_START + T_TORCH - $(date +%s) ))
if kill -0 "$TORCH_PID" 2>/dev/null && ((torch_left > 30)) && [ -f "$BUILD/CTestTestfile.cmake" ]; then
  section "CPU unit tests while PyTorch runs (log: tests.log)"
  run_cpu_tests "$(( torch_left < 150 ? torch_left : 150 ))"
fi

section "waiting for the PyTorch benchmark"
wait "$TORCH_PID"
rc=$?
if ((rc == 0)); then status bench_torch ok
elif ((rc == 124 || rc == 137)); then status bench_torch "TIMEOUT (partial results kept)"
else status bench_torch "FAILED (exit $rc)"; fi
grep -E "^(device|bench_gpu_torch)" "$OUT/bench_torch.log" | tail -15
echo "$(grep -c '^RESULT' "$OUT/bench_torch.log") PyTorch results"

section "GPU tests (log: tests.log)"
if [ -d "$BUILD" ] && [ -f "$BUILD/CTestTestfile.cmake" ]; then
  n_gpu=$(cd "$BUILD" && ctest -N -L gpu 2>/dev/null | awk '/Total Tests:/{print $3}')
  SEL=(-L gpu)
  if [ "${n_gpu:-0}" = 0 ]; then
    SEL=(-R 'gpu|cuda|GPU|CUDA')
    echo "no test is labelled gpu; running tests whose names match gpu|cuda"
  fi
  t_tests=$(cap $T_GPU_TESTS $AFTER_TESTS)
  echo "== GPU tests (${SEL[*]}), limit $t_tests s" >> "$OUT/tests.log"
  # One ctest entry may be the whole GPU test binary: its limit is the step's.
  (cd "$BUILD" && timeout -k 5 "$t_tests" ctest "${SEL[@]}" --output-on-failure --timeout "$t_tests" -j1) \
    >> "$OUT/tests.log" 2>&1
  rc=$?
  grep -E "tests passed|Total Test time|\*\*\*|Failed|Not Run" "$OUT/tests.log" | head -30
  summary_line=$(grep -E "tests passed" "$OUT/tests.log" | tail -1)
  # ctest counts a skipped test (exit 77: no usable GPU) as passed; say so.
  n_skip=$(sed -n '/== GPU tests/,$p' "$OUT/tests.log" | grep -c '\*\*\*Skipped')
  ((n_skip > 0)) && summary_line="$summary_line, $n_skip SKIPPED"
  if ((rc == 0)); then status gpu_tests "ok: ${summary_line:-no tests}"
  elif ((rc == 124)); then status gpu_tests "TIMEOUT: ${summary_line}"
  else status gpu_tests "FAILED: ${summary_line:-exit $rc}"; fi
else
  status gpu_tests "skipped (no build)"
fi

section "bench_kernels"
if [ -x "${BENCH_CMD[0]}" ]; then
  timeout -k 5 "$(cap $T_BENCH $AFTER_BENCH)" "${BENCH_CMD[@]}"
  rc=$?
  if ((rc == 0)); then status bench_kernels ok
  elif ((rc == 124)); then status bench_kernels "TIMEOUT (partial results kept)"
  else status bench_kernels "FAILED (exit $rc)"; fi
else
  status bench_kernels "skipped (not built)"
fi

section "trainer end to end (log: trainer.log)"
: > "$OUT/trainer.log"
for i in "${!CONFIGS[@]}"; do
  c=${CONFIGS[$i]}
  n=$(basename "$c" .yaml)
  if [ ! -x "$BUILD/trainer" ]; then status "$n" "skipped (not built)"; continue; fi
  rm -rf "$BUILD/runs/$n"
  mkdir -p "$BUILD/runs"
  log="$BUILD/runs/$n.log"
  t0=$(date +%s)
  reserve=$T_SUMMARY
  for ((j = i + 1; j < ${#CONFIGS[@]}; ++j)); do reserve=$((reserve + T_TRAIN[j])); done
  timeout -k 5 "$(cap "${T_TRAIN[$i]}" $reserve)" "$BUILD/trainer" --config "$c" --set run.dir="$BUILD/runs/$n" \
    --set log.progress=lines > "$log" 2>&1
  rc=$?
  rows=$(cat "$BUILD/runs/$n/metrics.jsonl" 2>/dev/null | grep -c ms_per_step)
  echo "$n: exit $rc after $(( $(date +%s) - t0 )) s, $rows steps logged"
  grep -E "^(error|device:|memory plan|  total|model:|batch:|step +[0-9]*[05]/)" "$log" | head -12
  {
    echo "== $BUILD/trainer --config $c (exit $rc)"
    cat "$log"
    if [ -f "$BUILD/runs/$n/metrics.jsonl" ]; then
      echo "== $BUILD/runs/$n/metrics.jsonl"
      cat "$BUILD/runs/$n/metrics.jsonl"
    fi
  } >> "$OUT/trainer.log"
  if ((rc == 0)); then status "$n" "ok: $rows steps"
  elif ((rc == 124)); then status "$n" "TIMEOUT: $rows steps logged"
  else status "$n" "FAILED (exit $rc): $(grep -m1 -iE 'error' "$log" | cut -c1-120)"; fi
done

if [[ ! -v "STATUS[cpu_tests]" ]]; then
  if (( $(left) > 40 )) && [ -f "$BUILD/CTestTestfile.cmake" ]; then
    section "CPU unit tests with the time left (log: tests.log)"
    run_cpu_tests "$(cap 120 $T_SUMMARY)"
  else
    status cpu_tests "skipped (no time left)"
  fi
fi

section "summary"
echo "| part | result |"
echo "|---|---|"
for k in "${ORDER[@]}"; do echo "| $k | ${STATUS[$k]} |"; done
echo "| elapsed | $(elapsed) s of ${BUDGET} s |"
echo
timeout "$T_SUMMARY" "${SUMMARY_CMD[@]}" || echo "gpu-check: the summary table could not be made (see the JSON files)"
}

# Everything printed also goes to $OUT/gpu-check.log; the pipeline (unlike
# exec > >(tee)) waits for tee, so the tables are the last lines out.
main 2>&1 | tee -a "$OUT/gpu-check.log"
exit "${PIPESTATUS[0]}"
