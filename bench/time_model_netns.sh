#!/usr/bin/env bash
# The planner's time model against measured steps on the namespace cluster:
# two nodes of two ranks (scripts/netns_cluster.sh, root), the link between
# them shaped to RATE, six layouts, each run with a `hardware:` entry that
# describes this cluster, and per layout the predicted step and exposed
# communication (the run's "step time model" line, planner/step_estimate.h)
# next to the measured ones. Prints markdown. Not a test: nothing asserted.
#   bash bench/time_model_netns.sh [TRAINER_BIN] [RATE] [STEPS]
#
# The entry's numbers are measured here first, none assumed:
#   compute: one process on node 0 (one thread) runs the model with a
#     1 GFLOP/s entry; its predicted compute over its measured forward +
#     backward time is the rate one core reaches on this model. Four ranks
#     share the machine's cores, so each gets rate x cores / 4.
#   links: RATE Mbit/s shared by a node's 2 ranks; latency one way from a
#     TCP ping-pong of one byte, across the bridge and on a node's loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/netns_bench_lib.sh
source bench/netns_bench_lib.sh "$@"
node1=$(bash scripts/netns_cluster.sh addr 1 --prefix "$PREFIX")
# One-way latency in microseconds: 2000 round trips of one byte, halved.
latency_us() {  # SERVER_NODE SERVER_ADDR CLIENT_NODE
  local port=$((30000 + RANDOM % 20000))
  bash scripts/netns_cluster.sh exec "$1" --prefix "$PREFIX" python3 -c "
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('$2', $port)); s.listen(1)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    b = c.recv(1)
    if not b: break
    c.sendall(b)" &
  local server=$!
  sleep 0.5
  bash scripts/netns_cluster.sh exec "$3" --prefix "$PREFIX" python3 -c "
import socket, time
c = socket.create_connection(('$2', $port)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(200): c.sendall(b'x'); c.recv(1)
t = time.perf_counter()
for _ in range(2000): c.sendall(b'x'); c.recv(1)
print(f'{(time.perf_counter() - t) / 2000 / 2 * 1e6:.1f}')
c.close()"
  wait "$server" 2>/dev/null || true
}
net_lat=$(latency_us 1 "$node1" 0)
loop_lat=$(latency_us 0 127.0.0.1 0)

# The compute rate: one process, one thread, a 1 GFLOP/s entry.
bash scripts/netns_cluster.sh exec 0 --prefix "$PREFIX" "$BIN" --config "$WORK/cfg.yaml" --set run.dir="$WORK/one" \
  --set hardware.gpu=calibrate --set hardware.memory_gib=24 --set hardware.bf16_tflops=0.001 \
  --set hardware.nvlink_gb_s=1 --set hardware.network_gbit_s=1 --set hardware.matmul_efficiency=1 > "$WORK/one.log" 2>&1
gflops=$(python3 - "$WORK/one/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
pred = [r["step_model"]["compute_ms"] for r in rows if "step_model" in r][0]
times = [r for r in rows if "time_ms" in r][1:]
meas = sum(r["time_ms"]["forward"] + r["time_ms"]["backward"] for r in times) / len(times)
print(f"{pred / meas:.2f}")
EOF
)
cores=$(nproc)
per_rank=$(python3 -c "print(f'{$gflops * min(1.0, $cores / 4) / 1000:.6f}')")
rate_gbit=$(python3 -c "import re; r='$RATE'; m=re.match(r'([0-9.]+)([kmg]?)bit', r); print(float(m.group(1)) * {'k':1e-6,'m':1e-3,'g':1,'':1e-9}[m.group(2)] / 2)")
echo "hardware entry: ${gflops} GFLOP/s one core on this model, ${per_rank} TFLOP/s per rank (${cores} cores, 4 ranks);" \
     "network ${rate_gbit} Gbit/s per rank (${RATE} per node, 2 ranks), one-way latency ${net_lat} us across, ${loop_lat} us in a node"
EXTRA="--set hardware.gpu=netns --set hardware.memory_gib=24 --set hardware.bf16_tflops=$per_rank --set hardware.matmul_efficiency=1
    --set hardware.hbm_gb_s=10 --set hardware.nvlink_gb_s=2 --set hardware.network_gbit_s=$rate_gbit --set hardware.gpus_per_node=2
    --set hardware.network_latency_us=$net_lat --set hardware.nvlink_latency_us=$loop_lat --set hardware.collective_latency_us=$loop_lat"

echo
echo "| layout (2 nodes x 2 ranks, link $RATE) | predicted step ms | measured step ms | predicted / measured | predicted exposed ms | measured exposed ms |"
echo "|---|---|---|---|---|---|"
for layout in "dp4 ZeRO-0|--set parallel.zero_stage=0" "dp4 ZeRO-3|--set parallel.zero_stage=3" \
              "tp2 (in node) x dp2|--set parallel.tp=2" "pp2 (across) x dp2, 1f1b|--set parallel.pp=2 --set parallel.pp_schedule=1f1b" \
              "pp2 (across) x dp2, zb-h1|--set parallel.pp=2 --set parallel.pp_schedule=zb-h1" "cp2 (in node) x dp2|--set parallel.cp=2"; do
  label=${layout%%|*}
  name=$(echo "$label" | tr -c 'a-z0-9' '_')
  # shellcheck disable=SC2086
  run "$name" ${layout#*|}
  line=$(python3 - "$WORK/$name/metrics.jsonl" "$label" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
model = [r["step_model"] for r in rows if "step_model" in r][0]
steps = [r["ms_per_step"] for r in rows if "ms_per_step" in r][1:]
times = [r["time_ms"] for r in rows if "time_ms" in r][1:]
meas = sum(steps) / len(steps)
# Exposed: every group's blocked time but the host group's (loss sums, flags).
exposed = sum(sum(v for k, v in t.items() if k.startswith("comm_") and k != "comm_host") for t in times) / len(times)
p = model["predicted_ms"]
print(f"| {sys.argv[2]} | {p:.1f} | {meas:.1f} | {p / meas:.2f} | {model['exposed_ms'] + model['idle_ms']:.1f} | {exposed:.1f} |")
EOF
)
  echo "$line"
done
