#!/usr/bin/env bash
# A throwaway one-node Slurm cluster on this machine, everything inside DIR:
#
#   bash scripts/slurm_local.sh start DIR   # munged + slurmctld + slurmd, waits for the node to be idle
#   source DIR/env                          # SLURM_CONF for srun/sbatch/sinfo/scontrol
#   srun -n 2 -N 1 hostname
#   bash scripts/slurm_local.sh stop DIR    # kills the three daemons, removes DIR
#
# Several nodes: with the namespace test cluster up (scripts/netns_cluster.sh
# up N --prefix P), `start DIR --netns P` makes each namespace a node of its
# own: slurmctld in node 0, one slurmd per node under its own host name
# (<P>-node<k>, its address on the bridge), each with its own spool, pid and
# log file. Its clients must run inside a node, as on a real login node:
#   bash scripts/netns_cluster.sh exec 0 --prefix P srun -N 2 -n 4 hostname
# Debian's slurmd needs no --enable-multiple-slurmd build for this, because
# each daemon has a network stack and host name of its own.
#
# Nothing system-wide is used or changed: the munge key, socket and seed, the
# slurm.conf, the controller's state, slurmd's spool, the logs and the pid
# files all live in DIR; the clients find the cluster through SLURM_CONF, and
# Slurm finds munged through AuthInfo=socket=... . Needs root (slurmd starts
# the tasks) and the Debian packages slurm-wlm and munge (scripts/setup.sh).
#
# Exit codes of start: 0 the node is idle; 3 this environment cannot run the
# cluster (not root, packages missing, a daemon died or never got ready: the
# reason and the log tails are printed, and whatever started is stopped
# again); 1 usage errors. DIR must not exist yet or be empty (a short path:
# munge's socket path must fit in 108 bytes); `stop` only removes a DIR that
# `start` made.
set -euo pipefail

usage() { echo "usage: $0 start DIR [--netns PREFIX] | stop DIR | status DIR" >&2; exit 1; }
[ $# -eq 2 ] || [ $# -eq 4 ] || usage
cmd=$1
dir=$2
netns=""
if [ $# -eq 4 ]; then
  [ "$cmd" = start ] && [ "$3" = --netns ] || usage
  netns=$4
fi
netns_cluster="$(cd "$(dirname "$0")" && pwd)/netns_cluster.sh"
marker=".slurm_local"

log() { echo "slurm_local: $*"; }

# The pids of the daemons this script started (one per line: name pid).
pids_file() { echo "$dir/daemons"; }

# The slurmstepd processes of this cluster's job steps (they outlive slurmd;
# each holds its step socket in DIR's spool) and every process under them
# (batch scripts, tasks).
our_steps() {
  local proc pid fd stat rest ppid stepds=() all=()
  declare -A kids=()
  for proc in /proc/[0-9]*; do
    pid=${proc#/proc/}
    stat=$(cat "$proc/stat" 2> /dev/null) || continue
    rest=${stat##*) }  # after "pid (comm) ": state ppid ...
    ppid=$(echo "$rest" | cut -d' ' -f2)
    kids[$ppid]+=" $pid"
    [ "$(cat "$proc/comm" 2> /dev/null)" = slurmstepd ] || continue
    for fd in "$proc/fd/"*; do
      if [[ "$(readlink "$fd" 2> /dev/null)" == "$dir/"* ]]; then
        stepds+=("$pid")
        break
      fi
    done
  done
  ((${#stepds[@]})) || return 0
  all=("${stepds[@]}")
  local i=0
  while ((i < ${#all[@]})); do
    # shellcheck disable=SC2206  # the list is pids separated by spaces
    all+=(${kids[${all[$i]}]:-})
    i=$((i + 1))
  done
  echo "${all[@]}"
}

stop_daemons() {
  [ -f "$(pids_file)" ] || return 0
  local name pid left
  # Jobs first, while slurmctld and slurmd can still end them cleanly.
  if [ -f "$dir/slurm.conf" ] && alive slurmctld; then
    SLURM_CONF="$dir/slurm.conf" scancel --quiet --full --user="$(id -un)" > /dev/null 2>&1 || true
  fi
  # Reverse order: slurmd, then slurmctld, then munged (the others need it to the end).
  tac "$(pids_file)" | while read -r name pid; do
    if kill -0 "$pid" 2> /dev/null; then kill -TERM "$pid" 2> /dev/null || true; fi
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2> /dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2> /dev/null; then
      log "$name (pid $pid) ignored SIGTERM for 5 s: SIGKILL"
      kill -KILL "$pid" 2> /dev/null || true
    fi
  done
  left=$(our_steps)
  if [ -n "$left" ]; then
    log "killing what still runs of this cluster's jobs (slurmstepd and its children): pids $left"
    # shellcheck disable=SC2086  # a list of pids
    kill -KILL $left 2> /dev/null || true
  fi
  rm -f "$(pids_file)"
}

tails() {
  local f
  for f in "$dir"/log/*.log "$dir"/log/*.stderr; do
    [ -s "$f" ] || continue
    echo "---- last lines of $f"
    tail -n 25 "$f"
  done
}

# start fails here: say why, show the logs, stop what started, exit 3 ("cannot run here").
cannot() {
  log "cannot start the local Slurm cluster: $*"
  tails
  stop_daemons
  log "daemons stopped; the logs stay in $dir/log until '$0 stop $dir'"
  exit 3
}

# A first job id whose next few ids' trainer store ports (20000 + id % 40000,
# comm/launch.cpp) are free now: two clusters on one machine (two checkouts
# testing at once) then hand out different job ids, hence different ports.
first_job_id() {
  python3 -c '
import random, socket
for _ in range(200):
    first = random.randrange(1000, 39000)
    try:
        for port in range(20000 + first, 20000 + first + 4):
            s = socket.socket(); s.bind(("", port)); s.close()
    except OSError:
        continue
    print(first); break
else:
    print(1)'
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts NAME as a foreground daemon in its own session, output to
# DIR/log/NAME.stderr (the daemons' own log files are DIR/log/NAME.log).
spawn() {
  local name=$1
  shift
  setsid "$@" > "$dir/log/$name.stderr" 2>&1 < /dev/null &
  echo "$name $!" >> "$(pids_file)"
}

alive() {  # NAME: is the daemon we started still running?
  local pid
  pid=$(awk -v n="$1" '$1 == n {print $2}' "$(pids_file)")
  [ -n "$pid" ] && kill -0 "$pid" 2> /dev/null
}

start() {
  if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
    echo "slurm_local: $dir exists and is not empty" >&2
    exit 1
  fi
  [ "$(id -u)" -eq 0 ] || { log "cannot start the local Slurm cluster: not root (slurmd must run as root to start tasks)"; exit 3; }
  local b missing=()
  for b in munged mungekey slurmctld slurmd sinfo srun scontrol python3; do
    command -v "$b" > /dev/null 2>&1 || missing+=("$b")
  done
  # Debian puts the daemons in /usr/sbin, which a minimal PATH may lack.
  if ((${#missing[@]})); then
    export PATH="$PATH:/usr/sbin:/sbin"
    missing=()
    for b in munged mungekey slurmctld slurmd sinfo srun scontrol python3; do
      command -v "$b" > /dev/null 2>&1 || missing+=("$b")
    done
  fi
  ((${#missing[@]} == 0)) || { log "cannot start the local Slurm cluster: ${missing[*]} not found (install slurm-wlm and munge: bash scripts/setup.sh)"; exit 3; }

  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  touch "$dir/$marker"
  # munged refuses a socket whose directories others cannot traverse.
  chmod 755 "$dir"
  mkdir -p "$dir/log" "$dir/state" "$dir/spool" "$dir/run"
  mkdir -m 700 "$dir/munge-key"
  mkdir -m 755 "$dir/munge-socket"
  : > "$(pids_file)"

  local sock="$dir/munge-socket/munge.socket.2"
  ((${#sock} < 100)) || { echo "slurm_local: $dir is too long a path for a unix socket ($sock)" >&2; exit 1; }

  # --- munge: a fresh key, the daemon on our socket.
  mungekey --create --keyfile="$dir/munge-key/munge.key" > "$dir/log/mungekey.log" 2>&1 ||
    cannot "mungekey failed: $(cat "$dir/log/mungekey.log")"
  spawn munged munged --foreground --force --socket="$sock" --key-file="$dir/munge-key/munge.key" \
    --pid-file="$dir/run/munged.pid" --seed-file="$dir/munge-key/munged.seed" --log-file="$dir/log/munged.log"
  for _ in $(seq 1 100); do
    [ -S "$sock" ] && break
    alive munged || cannot "munged exited at start"
    sleep 0.1
  done
  [ -S "$sock" ] || cannot "munged did not create $sock within 10 s"
  munge -n --socket="$sock" | unmunge --socket="$sock" > "$dir/log/munge-check.txt" 2>&1 ||
    cannot "munged runs but a credential does not round-trip: $(cat "$dir/log/munge-check.txt")"

  # --- slurm.conf: this host is controller and the only node, or (--netns)
  # node 0 is the controller and every namespace of the cluster a node.
  local host cpus ctld_port slurmd_port first_job ctld_addr=127.0.0.1 nodes=() k
  host=$(hostname -s)
  cpus=$(nproc)
  if [ -n "$netns" ]; then
    for k in $(seq 0 63); do
      ip netns list 2> /dev/null | awk '{print $1}' | grep -qx "$netns-node$k" || break
      nodes+=("$netns-node$k")
    done
    ((${#nodes[@]})) || cannot "no namespace $netns-node0: bring the cluster up first (scripts/netns_cluster.sh up N --prefix $netns)"
    host=${nodes[0]}
    ctld_addr=$(bash "$netns_cluster" addr 0 --prefix "$netns")
    for k in "${!nodes[@]}"; do mkdir -p "$dir/spool/${nodes[$k]}"; done
    # ip netns exec mounts a fresh /sys without the cgroup hierarchies that
    # slurmd 22.05 looks for even when no plugin uses them: a tmpfs there and
    # the v1 plugin with automount satisfy it (proctrack/linuxproc tracks).
    printf 'CgroupPlugin=cgroup/v1\nCgroupAutomount=yes\n' > "$dir/cgroup.conf"
  fi
  ctld_port=$(free_port)
  slurmd_port=$(free_port)
  while [ "$slurmd_port" = "$ctld_port" ]; do slurmd_port=$(free_port); done
  first_job=$(first_job_id)
  cat > "$dir/slurm.conf" << EOF
# Written by scripts/slurm_local.sh: a throwaway one-node cluster in $dir.
ClusterName=trainer-local
SlurmctldHost=$host($ctld_addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also how long a requeued job waits before it may start again
# (default 120 s); sched_interval: how often the scheduler looks (default 60 s).
AuthInfo=socket=$sock,cred_expire=10
SchedulerParameters=sched_interval=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool${netns:+/%n}
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd${netns:+.%n}.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd${netns:+.%n}.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: processes tracked by their parent links, tasks not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# A test cluster: give up on a dead node or job quickly.
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
FirstJobId=$first_job
MailProg=/bin/true
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  if [ -z "$netns" ]; then
    echo "NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN" >> "$dir/slurm.conf"
  else
    for k in "${!nodes[@]}"; do
      echo "NodeName=${nodes[$k]} NodeAddr=$(bash "$netns_cluster" addr "$k" --prefix "$netns") CPUs=$cpus State=UNKNOWN"
    done >> "$dir/slurm.conf"
  fi
  cat > "$dir/env" << EOF
# source this file to talk to the cluster in $dir
export SLURM_CONF=$dir/slurm.conf
export PATH="\$PATH:/usr/sbin:/sbin"
EOF
  export SLURM_CONF="$dir/slurm.conf"

  # --- the daemons, in the foreground of their own sessions (-D), fresh state (-c).
  # The clients run where the controller is reachable: node 0 under --netns.
  local at=()
  [ -z "$netns" ] || at=(bash "$netns_cluster" exec 0 --prefix "$netns")
  # The prefix and the controller port make the names of the per-node
  # daemons unique in the pids file (two clusters' files never mix anyway).
  if [ -z "$netns" ]; then
    spawn slurmctld slurmctld -D -c -f "$SLURM_CONF"
  else
    spawn slurmctld "${at[@]}" slurmctld -D -c -f "$SLURM_CONF"
  fi
  local ready=""
  for _ in $(seq 1 150); do
    alive slurmctld || cannot "slurmctld exited at start"
    if "${at[@]}" scontrol ping 2> /dev/null | grep -q "is UP"; then ready=1; break; fi
    sleep 0.2
  done
  [ -n "$ready" ] || cannot "slurmctld did not answer scontrol ping within 30 s"

  local names=("$host")
  if [ -z "$netns" ]; then
    spawn slurmd slurmd -D -f "$SLURM_CONF" -N "$host"
  else
    names=("${nodes[@]}")
    for k in "${!nodes[@]}"; do
      spawn "slurmd-${nodes[$k]}" bash "$netns_cluster" exec "$k" --prefix "$netns" \
        sh -c 'mount -t tmpfs cgroup /sys/fs/cgroup && exec slurmd -D -f "$0"' "$SLURM_CONF"
    done
  fi
  local state="" name
  for name in "${names[@]}"; do
    for _ in $(seq 1 300); do
      awk '$1 ~ /^slurmd/ {print $1}' "$(pids_file)" | while read -r d; do alive "$d" || echo "$d"; done | grep -q . &&
        cannot "a slurmd exited at start"
      state=$("${at[@]}" sinfo -h -N -n "$name" -o '%T' 2> /dev/null | head -n 1)
      [ "$state" = "idle" ] && break
      sleep 0.2
    done
    [ "$state" = "idle" ] || cannot "node $name is '${state:-unknown}' after 60 s, not idle"
  done
  log "cluster up in $dir: ${#names[@]} node(s) ${names[*]} ($cpus CPUs each) idle, slurmctld port $ctld_port, slurmd port $slurmd_port, first job id $first_job"
  if [ -z "$netns" ]; then
    log "use it with: export SLURM_CONF=$dir/slurm.conf"
  else
    log "use it inside node 0: source $dir/env; bash scripts/netns_cluster.sh exec 0 --prefix $netns srun ..."
  fi
}

stop() {
  if [ ! -d "$dir" ]; then
    log "$dir does not exist: nothing to stop"
    return 0
  fi
  [ -f "$dir/$marker" ] || { echo "slurm_local: $dir was not made by '$0 start': not touching it" >&2; exit 1; }
  dir=$(cd "$dir" && pwd)
  stop_daemons
  rm -rf "$dir"
  log "cluster stopped, $dir removed"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  status)
    [ -f "$dir/$marker" ] || { echo "slurm_local: no cluster in $dir" >&2; exit 1; }
    SLURM_CONF="$dir/slurm.conf" sinfo -N
    ;;
  *) usage ;;
esac
