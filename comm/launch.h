// Who am I in this job? The binary is started by torchrun, OpenMPI's mpirun,
// Slurm's srun or by hand, and each launcher describes the job in its own
// environment variables. detect_launch turns them into one LaunchInfo so the
// rest of the trainer never looks at the environment (docs/ARCHITECTURE.md "Distributed runs").
#pragma once

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace trainer {

struct LaunchInfo {
  std::string launcher = "single";  // "torchrun" | "mpirun" | "srun" | "single"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;               // index on this node: the CUDA device ordinal
  int local_world_size = 1;         // processes on this node
  std::string master_addr = "127.0.0.1";  // where rank 0 serves the key-value store
  int master_port = 0;
  // torchrun's agent serves its own store at MASTER_PORT under the static
  // rendezvous (TORCHELASTIC_USE_AGENT_STORE=True) and when the variable is
  // missing (torchrun's variables set by hand: no way to know); under c10d or
  // etcd it only checked that MASTER_PORT was free, for the workers to use.
  bool agent_holds_master_port = false;
  int restart_count = 0;            // torchelastic restarts / Slurm requeues so far
  std::string run_id;               // launcher's job id ("" when it has none)

  // Started by a launcher (even as its only process): the run then builds
  // process groups and meets the other ranks through the store.
  bool launched() const { return world_size > 1 || launcher != "single"; }
  // Where rank 0's store listens: the next port when the agent holds MASTER_PORT.
  int store_port() const {
    return agent_holds_master_port && master_port > 0 && master_port < 65535 ? master_port + 1 : master_port;
  }
  // "launcher: torchrun, rank 3 of 8 (local 3 of 4), master node01:29500, restart 0"
  std::string describe() const;
};

using GetEnv = std::function<const char*(const char*)>;

// Reads the launcher's variables through `getenv` (injectable for tests; an
// empty value counts as unset). Precedence torchrun > OpenMPI > Slurm, because
// an inner launcher inherits the variables of an outer one (torchrun under
// srun, mpirun inside an sbatch allocation) and only the innermost knows this
// process's rank. Nothing set: a single process. Throws std::runtime_error
// naming the variable and its value when one is missing, not a number, or
// inconsistent with the others (RANK >= WORLD_SIZE, ...).
LaunchInfo detect_launch(const GetEnv& getenv = ::getenv);

// Slurm's compressed host list: "node[01-04,07],gpu-a[1-2]", "n[1-3]-ib",
// "rack[1-2]-n[01-02]" (several brackets: the leftmost varies slowest). Zero
// padding is kept as written in the lower bound. Throws std::runtime_error on
// malformed input or more than a million hosts.
std::vector<std::string> expand_hostlist(const std::string& hostlist);
// The first host of the list, without expanding the rest (which is still
// checked for syntax).
std::string first_host(const std::string& hostlist);

// Slurm's SLURM_TASKS_PER_NODE form "4(x2),3" -> {4, 4, 3}.
std::vector<int> parse_tasks_per_node(const std::string& text);

// A port in [20000, 60000) from a job id, so that every rank of a job agrees on
// it without talking and two jobs sharing a node rarely collide. A decimal id
// maps to 20000 + id % 40000; any other text is hashed first.
int port_from_job_id(const std::string& job_id);

}  // namespace trainer
