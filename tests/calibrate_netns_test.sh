#!/usr/bin/env bash
# `trainer calibrate` on the namespace cluster (scripts/netns_cluster.sh:
# one network namespace per node, a bridge between them shaped with tbf):
# two nodes of one rank each, launched with torchrun as a run is, at two
# link rates. At each rate:
#   - calibrate measures the link across the nodes (payloads 64 KiB .. 16 MiB)
#     and writes its hardware section;
#   - a raw TCP transfer of 64 MiB (a Python socket sender on node 0, its
#     receiver on node 1) measures what the link carries;
#   - the fitted across-node bandwidth (network_gbit_s) must be within 15%
#     of the raw TCP rate, and at the held-out sizes of 1 MiB and more
#     across the nodes each collective's fitted line and the planner's time
#     on the written numbers within 20% of the measured time (check() says
#     why the held-out 256 KiB is printed only).
# Then, on the faster link: `trainer plan` and a two-node run read the file
# through hardware.calibration (the plan's header names the calibrated GPU
# and its network; the run's end-of-run link report prices dp_cp on it);
# and two nodes of two ranks each: the link inside node 0 is measured too,
# its section carries nvlink_gb_s, and the across-node bandwidth (a rank's
# share while the node's two rings both send) within 40% of half the raw rate
# (two rings on 2 cores overlap only partly; their held-out sizes printed).
# Every number compared is printed with its tolerance. Not root, or
# namespaces refused here: exit 77, which ctest reports as skipped.
set -euo pipefail
name=calibrate_netns
# shellcheck source=tests/launch_test_lib.sh
source "$(dirname "$0")/launch_test_lib.sh" "$@"
cluster="$source/scripts/netns_cluster.sh"

command -v torchrun >/dev/null || { say "SKIP: torchrun not found (python3-torch)"; exit $SKIP; }
prefix="cal$$"
trap 'bash "$cluster" down --prefix "$prefix" >/dev/null 2>&1 || true' EXIT

write_gpl_tokens "$work/tokens.bin"
cat > "$work/cfg.yaml" <<EOF
run: {name: calibrate}
model: {arch: llama, vocab_size: 256, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32}
train: {steps: 6, seq_len: 32, micro_batch_size: 2, global_batch_size: 8, threads: 1, device: cpu}
optim: {lr: 3.0e-3, warmup_steps: 2}
data: {train: [$work/tokens.bin]}
checkpoint: {interval: 0}
log: {interval: 1, progress: lines}
parallel: {timeout_s: 60}
EOF

up() {  # RATE
  set +e
  bash "$cluster" up 2 --rate "$1" --prefix "$prefix" > /dev/null
  local rc=$?
  set -e
  if [ $rc -eq 77 ]; then say "SKIP: no test cluster here (see the line above)"; exit $SKIP; fi
  [ $rc -eq 0 ] || fail "scripts/netns_cluster.sh up 2 --rate $1 failed (exit $rc)"
  node0=$(bash "$cluster" addr 0 --prefix "$prefix")
  node1=$(bash "$cluster" addr 1 --prefix "$prefix")
}

port=$((20000 + $$ % 20000))
# One torchrun per node, static rendezvous; $1 label, $2 ranks per node, the rest: the trainer's arguments.
two_nodes() {
  local label=$1 per_node=$2 pids=() k bad=0
  shift 2
  port=$((port + 5))
  for k in 0 1; do
    bash "$cluster" exec "$k" --prefix "$prefix" timeout 150 torchrun -r 1 -t 2 --log_dir "$work/$label.tlog$k" \
      --nnodes 2 --nproc_per_node "$per_node" --node_rank "$k" --master_addr "$node0" --master_port "$port" \
      --no_python "$trainer" "$@" > "$work/$label.node$k.log" 2>&1 &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k" || bad=1; done
  if [ $bad -ne 0 ]; then
    tail -n 20 "$work/$label.node0.log" "$work/$label.node1.log"
    find "$work/$label.tlog0" "$work/$label.tlog1" -name 'std*.log' -exec tail -n 15 {} + 2>/dev/null | tail -n 60
    fail "$label: a node's torchrun failed"
  fi
  cat "$work/$label.tlog0"/*/attempt_0/0/stdout.log > "$work/$label.log"
}

# Bytes/s of one TCP stream of 64 MiB from node 0 to node 1, timed by the
# sender from the first byte to the receiver's acknowledgement of the last.
raw_tcp() {
  local p=$((30000 + RANDOM % 20000))
  bash "$cluster" exec 1 --prefix "$prefix" python3 -c "
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('$node1', $p)); s.listen(1)
c, _ = s.accept(); n = 0
while n < 64 << 20:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
c.sendall(b'k'); c.close()" &
  local server=$!
  bash "$cluster" exec 0 --prefix "$prefix" python3 -c "
import socket, time
for _ in range(100):
    try: c = socket.create_connection(('$node1', $p)); break
    except OSError: time.sleep(0.05)
buf = b'x' * (1 << 20)
t = time.perf_counter()
for _ in range(64): c.sendall(buf)
c.recv(1)
print(64 * (1 << 20) / (time.perf_counter() - t))"
  wait "$server"
}

# The file's numbers against the raw rate and the measured times: prints
# every comparison, exits 1 if one is outside its tolerance. Held out, at
# 1 MiB and more: each collective's own line t = a + n/B and the planner on
# the numbers written, within 20% of the measured time. The held-out 256
# KiB is printed, not held: its calls last 4-8 ms at 300 Mbit/s, and on
# these 2 cores a run of them now and then pays 2-4 ms more (a median of
# 28 calls: one run all_gather at 64 KiB, another reduce_scatter or
# all_reduce at 256 KiB), which moves a line through two such sizes by
# more than 20%.
check() {  # LABEL FILE RAW_BYTES_PER_S [RINGS: how many rings share the link at once, 1]
  python3 - "$@" <<'EOF'
import re, sys
label, path = sys.argv[1], sys.argv[2]
rings = int(sys.argv[4]) if len(sys.argv) > 4 else 1
raw = float(sys.argv[3]) / rings  # each ring's share of the link
# Two rings of four ranks on this machine's 2 cores start each call a
# little apart, so they overlap only partly and a ring gets more than half
# the link (+7%, +16%, +22% in three runs): 40% still tells a rank's share
# from the whole link (+100%). The held-out sizes are printed, not held.
tol = 0.15 if rings == 1 else 0.40
text = open(path).read()
keys = dict(re.findall(r"^  (\w+): (\S+)$", text, re.M))
bad = []
fit = float(keys["network_gbit_s"]) * 1e9 / 8
err = fit / raw - 1
print(f"calibrate_netns: {label}: across-node bandwidth fitted {fit / 1e6:.3f} MB/s, raw TCP"
      f"{'' if rings == 1 else f' / {rings} rings'} {raw / 1e6:.3f} MB/s: "
      f"{100 * err:+.1f}% (tolerance {100 * tol:.0f}%)")
if abs(err) > tol: bad.append("bandwidth")
rows = re.findall(r"^#\s+(inside|across)\s+(\S+)\s+(\d+) ([KM]iB)\s+measured\s+([\d.]+) ms\s+line\s+([\d.]+) ms\s+([+-][\d.]+)%"
                  r"\s+planner\s+([\d.]+) ms\s+([+-][\d.]+)%\s+(held out|fitted)$", text, re.M)
held = [r for r in rows if r[9] == "held out"]
if not held: bad.append("no held-out row")
for link, kind, num, unit, meas, line, line_err, plan, plan_err, _ in held:
    across, big = link == "across", unit == "MiB"
    hold_line = hold_plan = across and big and rings == 1
    line_ok = not hold_line or abs(float(line_err)) <= 20
    plan_ok = not hold_plan or abs(float(plan_err)) <= 20
    print(f"calibrate_netns: {label}: {link} {kind} {num} {unit} held out: measured {meas} ms; its line {line} ms "
          f"({line_err}%{', tolerance 20%' if hold_line else ', not held'}); planner {plan} ms "
          f"({plan_err}%{', tolerance 20%' if hold_plan else ', not held'})"
          f"{'' if line_ok and plan_ok else '  <-- outside'}")
    if not (line_ok and plan_ok): bad.append(f"{kind} {num} {unit}")
for k in ("collective_latency_us", "network_latency_us", "nvlink_gb_s", "nvlink_latency_us", "bf16_tflops", "gpus_per_node"):
    if k in keys: print(f"calibrate_netns: {label}: {k} {keys[k]}")
sys.exit(f"calibrate_netns: FAIL: {label}: {', '.join(bad)}" if bad else 0)
EOF
}

# Payloads of 64 KiB .. 16 MiB (fitted on 64 KiB, 1 MiB and 16 MiB; 256
# KiB and 4 MiB held out). Below 64 KiB the emulated link is no line: tbf
# lets the first 8 KB after a pause through at the veth's speed (its
# burst), so a 4 KiB message crosses a "100 Mbit/s" link several times
# faster than 100 Mbit/s, which no real link does.
sizes="--min-kib 64 --max-mib 16"
for rate in 100mbit 300mbit; do
  up "$rate"
  two_nodes "cal_$rate" 1 calibrate --config "$work/cfg.yaml" --out "$work/hw_$rate.yaml" $sizes
  grep -q "^calibrate: wrote $work/hw_$rate.yaml" "$work/cal_$rate.log" || fail "$rate: rank 0 did not say it wrote the file"
  raw=$(raw_tcp)
  check "2 nodes x 1 rank, $rate" "$work/hw_$rate.yaml" "$raw" || fail "$rate: calibrated numbers outside their tolerance"
  grep -q "gpus_per_node: 1$" "$work/hw_$rate.yaml" || fail "$rate: gpus_per_node is not 1"
  ! grep -q "nvlink_gb_s:" "$work/hw_$rate.yaml" || fail "$rate: an inside-node bandwidth with one rank per node"
done
hw="$work/hw_300mbit.yaml"

# `trainer plan` reads the file: the calibrated GPU, its network as written.
net=$(sed -n 's/^  network_gbit_s: //p' "$hw")
plan=$("$trainer" plan --config "$work/cfg.yaml" --set hardware.calibration="$hw" --world 2)
line=$(echo "$plan" | head -1)
say "plan: $line"
[[ "$line" == *" of calibrated-cpu (1 per node)"*"network $(python3 -c "print('%.3g' % $net)") Gbit/s per GPU"* ]] ||
  fail "trainer plan does not price on the calibrated numbers (network_gbit_s $net)"

# A run reads it: the end-of-run link report prices its groups on it.
two_nodes run 1 --config "$work/cfg.yaml" --set run.dir="$work/run" --set hardware.calibration="$hw"
line=$(grep -h "^links per step, planner on hardware 'calibrated-cpu'" "$work/run.log" || true)
say "run: $line"
[ -n "$line" ] || fail "the run's link report does not name the calibrated hardware"
python3 - "$work/run/metrics.jsonl" <<'EOF' || fail "the run's link report has no planned time for dp_cp"
import json, sys
rec = [json.loads(l)["links_per_step"] for l in open(sys.argv[1]) if '"links_per_step"' in l]
g = rec[0]["dp_cp"]
print(f"calibrate_netns: run: dp_cp across nodes {g['bytes']} B/step in {g['ms']:.1f} ms measured, "
      f"planner {g['planned_bytes']} B in {g['planned_ms']:.2f} ms")
sys.exit(0 if g["across_nodes"] and g["planned_ms"] > 0 else 1)
EOF

# Two ranks per node: the link inside node 0 too.
two_nodes cal_2x2 2 calibrate --config "$work/cfg.yaml" --out "$work/hw_2x2.yaml" $sizes
raw=$(raw_tcp)
# calibrate times the nodes' two rings (ranks 0,2 and 1,3) at once, as a
# run's rings share the link: each gets half of it, and network_gbit_s is
# that per-GPU share.
check "2 nodes x 2 ranks, 300mbit" "$work/hw_2x2.yaml" "$raw" 2 || fail "2x2: calibrated numbers outside their tolerance"
grep -q "nvlink_gb_s:" "$work/hw_2x2.yaml" || fail "2x2: no inside-node bandwidth"
grep -q "gpus_per_node: 2$" "$work/hw_2x2.yaml" || fail "2x2: gpus_per_node is not 2"
say "PASS"
