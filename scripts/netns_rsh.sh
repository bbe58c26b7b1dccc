#!/usr/bin/env bash
# mpirun's remote shell for the namespace test cluster (scripts/netns_cluster.sh):
# OpenMPI starts its daemon on host H with `AGENT H COMMAND...`; here H is a
# node's host name, <prefix>-node<k>, and the command runs inside that node.
#   mpirun --hostfile HOSTS --mca plm_rsh_agent scripts/netns_rsh.sh ...
set -euo pipefail
host=${1:?usage: netns_rsh.sh <prefix>-node<k> COMMAND...}
shift
[[ "$host" =~ ^([a-z][a-z0-9]*)-node([0-9]+)$ ]] ||
  { echo "netns_rsh: '$host' is not a node of the namespace cluster (<prefix>-node<k>)" >&2; exit 2; }
exec bash "$(dirname "$0")/netns_cluster.sh" exec "${BASH_REMATCH[2]}" --prefix "${BASH_REMATCH[1]}" sh -c "$*"
