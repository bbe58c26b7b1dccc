#include "runtime/distributed_run.h"

#include "comm/mesh.h"

namespace trainer {

DistributedRun::DistributedRun(const Config& cfg, const LaunchInfo& launch, Device device) {
  if (!launch.launched()) {
    solo_ = std::make_unique<SingleRankCommunicator>("dp", 0, device);
    dp_group_ = dp_host_ = solo_.get();
    return;
  }
  const MeshShape mesh = resolve_mesh(cfg.parallel, launch.world_size, launch.local_world_size);
  if (mesh.tp > 1 || mesh.pp > 1 || mesh.cp > 1 || mesh.ep > 1)
    throw ConfigError(describe(mesh) + ": only data parallelism (ZeRO stages 0-3) is wired into training so far "
                      "(set parallel.tp, pp, cp and ep to 1)");
  ProcessGroupOptions po;
  po.timeout_s = cfg.parallel.timeout_s;
  po.host_world = device == Device::CUDA;
  groups_ = std::make_unique<ProcessGroups>(launch, mesh, device, po);
  if (launch.world_size > 1)
    watchdog_ = std::make_unique<Watchdog>(WatchdogOptions{groups_->store().host(), groups_->store().port(), po.token,
                                                           launch.rank, launch.world_size, po.timeout_s,
                                                           abort_communicators(*groups_)});
  dp_ = mesh.dp;
  dp_rank_ = coords_of(mesh, launch.rank).dp;
  // One process under a launcher reduces over the world (an NCCL
  // communicator of one on a GPU); the DP axis of a one-rank mesh is a copy.
  dp_group_ = dp_ > 1 ? &groups_->group(Axis::DP) : &groups_->world();
  dp_host_ = &groups_->host_world();  // dp == world while DP is the only axis
}

void DistributedRun::finish() {
  watchdog_.reset();  // finalize has its own timeout, and rank 0's sample afterwards is no collective
  if (groups_) groups_->finalize();
}

}  // namespace trainer
