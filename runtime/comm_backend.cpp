#include "runtime/comm_backend.h"

#include "config/config.h"

namespace trainer {

BackendChoice choose_backend(const std::string& requested, Device device, int ranks_per_node, int gpus) {
  BackendChoice c;
  const std::string n = std::to_string(ranks_per_node), g = std::to_string(gpus);
  if (device == Device::CPU) {
    if (requested == "nccl")
      throw ConfigError("parallel.backend=nccl needs GPU tensors, and this run is on the CPU: use parallel.backend=auto");
    c.host_staged = requested == "host";
    c.line = c.host_staged ? "comm: host-staged gloo (parallel.backend=host: CPU tensors copied through host buffers, "
                             "as GPU tensors would be)\n"
                           : "comm: gloo (CPU tensors)\n";
    return c;
  }
  const bool shared = ranks_per_node > gpus;
  if (requested == "nccl") {
    if (shared)
      throw ConfigError("parallel.backend=nccl: " + n + " ranks on this node share " + g +
                        " GPU(s), and NCCL needs a GPU per rank; use parallel.backend=host (or auto)");
    c.line = "comm: nccl (parallel.backend=nccl)\n";
  } else if (requested == "host") {
    c.host_staged = true;
    c.line = "comm: host-staged gloo (parallel.backend=host: GPU tensors copied through host memory)\n";
  } else if (shared) {
    c.host_staged = true;
    c.line = "comm: host-staged gloo (" + n + " ranks on this node share " + g +
             " GPU(s), and NCCL needs a GPU per rank; parallel.backend=auto)\n";
  } else {
    c.line = "comm: nccl (each of the " + n + " ranks on this node has its own GPU; parallel.backend=auto)\n";
  }
  return c;
}

}  // namespace trainer
