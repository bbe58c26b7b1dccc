#!/usr/bin/env bash
# bench/libblas_time.so under a real CPU run: it must see the trainer's
# sgemm calls (the layers' outside a parallel region, attention's inside one),
# the same calls every step (scripts/bench_cpu.py --gemm-floor tells the
# warm-up steps apart by that), and write a log Python's json reads.
set -euo pipefail
trainer=$1 lib=$2 source=$3 work=$4 steps=3
rm -rf "$work" && mkdir -p "$work"
python3 "$source/scripts/prepare_text.py" --out-dir "$work/data" '/usr/share/common-licenses/*' > /dev/null
cat > "$work/run.yaml" <<YAML
run: {name: blas_time, dir: $work/run}
model: {arch: llama, vocab_size: 256, d_model: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 64}
train: {device: cpu, steps: $steps, seq_len: 64, micro_batch_size: 4, global_batch_size: 4, threads: 2}
data: {train: [$work/data/train.bin]}
log: {progress: lines}
YAML
BLAS_TIME_OUT="$work/sgemm.json" LD_PRELOAD="$lib" "$trainer" --config "$work/run.yaml" > "$work/train.txt" 2>&1 ||
  { cat "$work/train.txt"; echo "the trainer failed under $lib"; exit 1; }
python3 - "$work/sgemm.json" "$steps" <<'PY'
import json, sys
calls = json.load(open(sys.argv[1]))["sgemm"]
steps = int(sys.argv[2])
outside = [c for c in calls if not c["in_parallel"]]
inside = [c for c in calls if c["in_parallel"]]
print(f"{len(outside)} call shapes outside parallel regions, {len(inside)} inside; "
      f"{sum(c['calls'] for c in calls)} calls")
assert outside, "no layer GEMM was timed"
assert inside, "no attention GEMM (inside a parallel region) was timed"
for c in calls:
    shape = f"{c['m']}x{c['n']}x{c['k']}"
    assert c["calls"] == len(c["seconds"]), f"{shape}: calls {c['calls']} vs {len(c['seconds'])} times"
    assert c["calls"] % steps == 0, f"{shape}: {c['calls']} calls in {steps} steps: not the same every step"
    assert all(s >= 0 for s in c["seconds"]) and c["total_s"] > 0, f"{shape}: bad times"
    assert c["median_s"] <= max(c["seconds"]), shape
PY
