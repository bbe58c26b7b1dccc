// parallel.backend resolved for a run: NCCL, or collectives of device
// tensors staged through host memory and Gloo (comm/host_staged_communicator.h),
// with the start-up line that says which and why.
#pragma once

#include <string>

#include "core/tensor.h"

namespace trainer {

struct BackendChoice {
  bool host_staged = false;
  std::string line;  // "comm: nccl (each of the 8 ranks on this node has its own GPU)"
};

// device: where the run's tensors live; ranks_per_node: the launcher's local
// world size; gpus: the CUDA devices a rank sees (unused on the CPU). Throws
// ConfigError naming parallel.backend when nccl cannot serve the run.
BackendChoice choose_backend(const std::string& requested, Device device, int ranks_per_node, int gpus);

}  // namespace trainer
