#!/usr/bin/env bash
# Rehearsal of scripts/gpu-check.sh on a machine without a GPU: its real phase
# logic runs against stand-in binaries (GPU_CHECK_BIN_DIR) whose "norms"
# family fails and whose "moe" family hangs. The summary must report norms as
# FAILED, moe as TIMEOUT, every other family as ok, memcheck reruns of both,
# the trainer and bench rows, the mesh phase's rows (scripts/gpu_mesh_check.sh:
# every layout ok but cp2, whose stand-in losses are off, so it is FAILED
# with its memcheck rerun in the row), the PTX probe's row (the GPU's output
# differing from the emulator's in ex2 by 6 ulp: MISMATCH, naming the probe),
# and end with the elapsed row: a hang or a failure in one family or layout
# costs only that one.
#   bash tests/gpu_check_rehearsal.sh [PTX_PROBE_EMU]
# With PTX_PROBE_EMU (build/ptx_probe_emu) the probe's stand-in is that real
# program, compared with a perturbed copy of its own output, so the row is
# made from the real report; without, a shell stand-in prints such a report.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d /tmp/gpu-check-rehearsal.XXXXXX)
trap 'rm -rf "$W"' EXIT
BIN=$W/bin
mkdir -p "$BIN" "$W/out"

# gpu_tests: a Catch2 binary's output, keyed on the test spec.
cat > "$BIN/gpu_tests" <<'EOF'
#!/usr/bin/env bash
spec=${1:-}
[ "${GPU_TESTS_REQUIRE_DEVICE:-}" = 1 ] || { echo "stand-in: GPU_TESTS_REQUIRE_DEVICE not set"; exit 3; }
echo "gpu_tests: device 0 of 1: stand-in"
case "$spec" in
  "[norm]")
    echo "[gpu] rmsnorm_forward out BF16 [8, 64]                                  rel=1.000e-03 max_abs=1.0e-03 tol=2.0e-02 n=512 ok"
    echo "[gpu] rmsnorm_backward dx BF16 [8, 64]                                  rel=4.000e-01 max_abs=3.0e-01 tol=2.0e-02 n=512 FAIL"
    echo "test cases: 2 | 1 passed | 1 failed"
    exit 1 ;;
  "[moe]")
    echo "[gpu] moe_route_forward topk_w F32                                     rel=1.000e-07 max_abs=1.0e-07 tol=1.0e-05 n=64 ok"
    exec sleep 600 ;;
  *)
    echo "[gpu] stand-in check for $spec                                          rel=2.000e-06 max_abs=1.0e-06 tol=1.0e-05 n=10 ok"
    echo "[gpu] stand-in exact check                                              exact equal ok"
    echo "All tests passed (2 assertions in 1 test case)"
    exit 0 ;;
esac
EOF
# trainer: writes a metrics.jsonl of 3 steps into run.dir (the mesh phase's
# configs: their train.steps; 2 ranks: rank 0 prints the host-staged line and
# writes; cp2 logs losses 10% off).
cat > "$BIN/trainer" <<'EOF'
#!/usr/bin/env bash
[ "${1:-}" = devices ] && { echo "cuda module: $(dirname "$0")/libtrainer_cuda.so (ABI 1): stand-in"; exit 0; }
dir="" cfg="" loss=5.0 steps=3
prev=""
for a in "$@"; do
  case "$a" in run.dir=*) dir=${a#run.dir=} ;; parallel.cp=2) loss=5.5 ;; esac
  [ "$prev" = --config ] && cfg=$a
  prev=$a
done
grep -q 'name: mesh_' "$cfg" 2>/dev/null && steps=$(grep -oE 'steps: [0-9]+' "$cfg" | head -1 | grep -oE '[0-9]+')
echo "device: stand-in"
if [ "${WORLD_SIZE:-1}" != 1 ]; then
  [ "${RANK:-0}" = 0 ] || exit 0
  echo "comm: host-staged gloo (2 ranks on this node share 1 GPU(s), and NCCL needs a GPU per rank; parallel.backend=auto)"
fi
mkdir -p "$dir"
for ((s = 1; s <= steps; ++s)); do echo "{\"step\": $s, \"loss\": $loss, \"ms_per_step\": 10.0, \"tokens_per_s\": 1000}"; done > "$dir/metrics.jsonl"
EOF
cat > "$BIN/bench_kernels" <<'EOF'
#!/usr/bin/env bash
echo '{"impl": "ours", "results": []}' > "$2"
echo "bench_kernels: stand-in"
EOF
# compute-sanitizer: runs the program and reports no error.
cat > "$BIN/compute-sanitizer" <<'EOF'
#!/usr/bin/env bash
while [[ ${1:-} == --* ]]; do shift 2; done
echo "========= COMPUTE-SANITIZER (stand-in)"
"$@"
rc=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
EOF
# ptx_probe: the emulated probe itself where given, else a stand-in whose
# report has ex2_approx_ftz 6 ulp off. The "emulator's output" it is compared
# with is $W/probe_emu.txt (GPU_CHECK_PROBE_EXPECT), never the checkout's gpu_deps.
REAL_PROBE=${1:-}
if [ -n "$REAL_PROBE" ] && [ ! -x "$REAL_PROBE" ]; then
  echo "note: $REAL_PROBE is not built: the shell stand-in plays ptx_probe"
  REAL_PROBE=""
fi
if [ -n "$REAL_PROBE" ]; then
  REAL_PROBE=$(cd "$(dirname "$REAL_PROBE")" && pwd)/$(basename "$REAL_PROBE")
  printf '#!/usr/bin/env bash\nexec %q "$@"\n' "$REAL_PROBE" > "$BIN/ptx_probe"
  "$REAL_PROBE" 2> /dev/null | python3 -c '
import sys
for line in sys.stdin:
    f = line.split()
    if f[:2] == ["ex2_approx_ftz", "2000"]:
        line = "%s %s %08x\n" % (f[0], f[1], int(f[2], 16) + 6)
    sys.stdout.write(line)' > "$W/probe_emu.body"
else
  cat > "$BIN/ptx_probe" <<'EOF'
#!/usr/bin/env bash
echo "# ptx_probe (stand-in) on a stand-in GPU, sm_90"
echo "# ex2_approx_ftz: stand-in"
echo "ex2_approx_ftz 2000 3dfd32e8"
echo "reference ex2_approx_ftz: ok (1 values, max difference 0 ulp; rule 2 ulp)" >&2
if [ "${1:-}" = --expect ]; then
  echo "probe mma_bf16_rand: 128 values, max difference 0 of sum |a*b| + |c| (rule x): ok" >&2
  echo "probe mma_f16_rand: 128 values, max difference 0 of sum |a*b| + |c| (rule x): ok" >&2
  echo "probe ex2_approx_ftz: 1 values, max difference 6 ulp (rule 4 ulp): MISMATCH" >&2
  echo "ptx_probe --expect $2: MISMATCH in 1 probe(s): ex2_approx_ftz" >&2
  exit 1
fi
EOF
  echo "ex2_approx_ftz 2000 3dfd32ee" > "$W/probe_emu.body"
fi
{ echo "# source: 0123456789abcdef (rehearsal)"; cat "$W/probe_emu.body"; } > "$W/probe_emu.txt"
chmod +x "$BIN"/*

cd "$ROOT"
t0=$(date +%s)
PATH=$BIN:$PATH OUT=$W/out GPU_CHECK_BIN_DIR=$BIN GPU_CHECK_TORCH=0 GPU_CHECK_FAMILY_CAP=4 \
  GPU_CHECK_PROBE_EXPECT=$W/probe_emu.txt \
  bash scripts/gpu-check.sh --budget=300 > "$W/run.log" 2>&1
rc=$?
secs=$(( $(date +%s) - t0 ))
S=$W/out/summary.md
echo "--- summary.md (gpu-check exit $rc after $secs s)"
cat "$S"

fail=0
expect() {  # expect LABEL REGEX
  if grep -qE "$2" "$S"; then echo "ok      $1"; else echo "MISSING $1: no line matches /$2/"; fail=1; fi
}
expect "norms failed, with its checks counted" '^\| gpu: norms \| FAILED \(exit 1\): 1 checks ok, 1 failed; worst error 20\.00 of its tolerance'
expect "moe timed out, keeping its output" '^\| gpu: moe \| TIMEOUT after 4 s: 1 checks ok, 0 failed'
for f in basic linear rope activations cross_entropy optimizer attention_f32 attention_bf16 attention_f16 ring_attention training training_nccl; do
  expect "$f ran" "^\| gpu: $f \| ok: 2 checks ok, 0 failed; worst error 0\.20 of its tolerance"
done
expect "PTX probe: ex2 differs from the emulator's" \
  '^\| ptx_probe \| MISMATCH: 1 probe\(s\) differ from the emulator.s \(0123456789ab\): ex2_approx_ftz; ISA references ok; max mma_bf16_rand 0, mma_f16_rand 0, ex2_approx_ftz 6 ulp \(ptx_probe_report.txt\)'
for f in ptx_probe_gpu.txt ptx_probe_emu.txt ptx_probe_report.txt; do
  [ -s "$W/out/$f" ] && echo "ok      \$OUT/$f" || { echo "MISSING \$OUT/$f"; fail=1; }
done
expect "memcheck of norms" '^\| memcheck: norms \| 0 errors \(exit 1\)'
expect "memcheck of moe, at twice its limit" '^\| memcheck: moe \| TIMEOUT after 8 s'
expect "bench_kernels" '^\| bench_kernels \| ok'
expect "trainer devices" '^\| trainer: devices \| ok: cuda module: .*/libtrainer_cuda\.so \(ABI 1\)'
expect "trainer gpt2" '^\| trainer: bench_gpt2_124m \| ok: 3 steps logged'
expect "trainer llama" '^\| trainer: bench_llama_1b \| ok: 3 steps logged'
expect "mesh references" '^\| mesh: references \| ok: gpu_dense cpu_dense gpu_moe cpu_moe \(10 losses each\)'
for l in $(bash scripts/gpu_mesh_check.sh --list); do
  [ "$l" = cp2 ] && continue
  expect "mesh $l" "^\| mesh: $l \| ok: 10 losses; max rel diff 0\.0e\+00 vs 1-process GPU bf16 \(tol 2e-2\), 0\.0e\+00 vs CPU fp32 \(tol 5e-2\); comm: host-staged gloo"
done
expect "mesh cp2 failed, memcheck in its row" '^\| mesh: cp2 \| FAILED: 10 losses; max rel diff 1\.0e-01 vs 1-process GPU bf16 \(tol 2e-2\), 1\.0e-01 vs CPU fp32 \(tol 5e-2\); memcheck: 0 errors \(exits 0 0\)'
grep -q '^== tp2: 2 ranks' "$W/out/mesh.log" && echo "ok      mesh.log holds each layout's ranks" ||
  { echo "MISSING mesh.log"; fail=1; }
expect "no racecheck after a failure" '^\| elapsed \|'
grep -q 'racecheck' "$S" && { echo "UNEXPECTED racecheck after a failure"; fail=1; }
rows=$(grep -c '^| gpu: ' "$S")
[ "$rows" = 14 ] && echo "ok      14 family rows" || { echo "WRONG   $rows family rows, expected 14"; fail=1; }
((rc == 1)) && echo "ok      gpu-check exits 1 on a failure" || { echo "WRONG   gpu-check exit $rc, expected 1"; fail=1; }
grep -q 'stand-in check for \[rope\]' "$W/out/tests.log" && echo "ok      tests.log holds each family's lines" ||
  { echo "MISSING tests.log lines"; fail=1; }
if ((fail)); then
  echo "--- gpu-check output"; cat "$W/run.log"
  echo "gpu_check_rehearsal: FAILED"
  exit 1
fi
echo "gpu_check_rehearsal: passed"
