#include "runtime/distributed_run.h"

#include "comm/mesh.h"
#include "runtime/comm_backend.h"
#include "runtime/device_select.h"

namespace trainer {

DistributedRun::DistributedRun(const Config& cfg, const LaunchInfo& launch, Device device) {
  if (!launch.launched()) {
    if (cfg.parallel.tp > 1 || cfg.parallel.pp > 1 || cfg.parallel.cp > 1 || cfg.parallel.ep > 1)
      throw ConfigError("parallel.tp x pp x cp x ep > 1 needs one process per rank: launch the run with "
                        "torchrun, mpirun or srun");
    choose_backend(cfg.parallel.backend, device, 1, 1);  // refuses nccl on the CPU here too
    solo_ = std::make_unique<SingleRankCommunicator>("dp", 0, device);
    solo_tp_ = std::make_unique<SingleRankCommunicator>("tp", 0, device);
    solo_pp_ = std::make_unique<SingleRankCommunicator>("pp", 0, device);
    solo_ep_ = std::make_unique<SingleRankCommunicator>("ep", 0, device);
    solo_cp_ = std::make_unique<SingleRankCommunicator>("cp", 0, device);
    cp_group_ = solo_cp_.get();
    dp_group_ = host_ = edp_group_ = solo_.get();
    ep_group_ = solo_ep_.get();
    tp_group_ = solo_tp_.get();
    pp_group_ = solo_pp_.get();
    wrap_groups();
    return;
  }
  const MeshShape mesh = resolve_mesh(cfg.parallel, launch.world_size, launch.local_world_size);
  std::string why;
  const BackendChoice backend = choose_backend(cfg.parallel.backend, device, launch.local_world_size,
                                               device == Device::CUDA ? cuda_device_count(&why) : 0);
  if (launch.world_size > 1) backend_line_ = backend.line;
  ProcessGroupOptions po;
  po.timeout_s = cfg.parallel.timeout_s;
  po.host_world = device == Device::CUDA;
  po.host_staged = backend.host_staged;
  groups_ = std::make_unique<ProcessGroups>(launch, mesh, device, po);
  if (launch.world_size > 1)
    watchdog_ = std::make_unique<Watchdog>(WatchdogOptions{groups_->store().host(), groups_->store().port(), po.token,
                                                           launch.rank, launch.world_size, po.timeout_s,
                                                           abort_communicators(*groups_), -1, po.secret});
  mesh_ = mesh;
  at_ = coords_of(mesh, launch.rank);
  // One process under a launcher reduces over the world (an NCCL
  // communicator of one on a GPU); the DP axis of a one-rank mesh is a copy.
  dp_group_ = mesh.world() == 1 ? &groups_->world() : &groups_->group(Axis::DP_CP);
  tp_group_ = &groups_->group(Axis::TP);
  pp_group_ = &groups_->group(Axis::PP);
  ep_group_ = &groups_->group(Axis::EP);
  cp_group_ = &groups_->group(Axis::CP);
  // Like dp: a one-rank mesh reduces over the world.
  edp_group_ = mesh.world() == 1 ? &groups_->world() : &groups_->group(Axis::EDP);
  host_ = &groups_->host_world();
  wrap_groups();
}

void DistributedRun::wrap_groups() {
  auto wrap = [&](Communicator*& c, const char* label) {
    timed_.push_back(std::make_unique<TimedCommunicator>(*c, label));
    c = timed_.back().get();
  };
  wrap(tp_group_, "tp");
  wrap(dp_group_, "dp_cp");
  wrap(pp_group_, "pp");
  wrap(ep_group_, "ep");
  wrap(edp_group_, "edp");
  wrap(cp_group_, "cp");
  wrap(host_, "host");
}

void DistributedRun::finish() {
  watchdog_.reset();  // finalize has its own timeout, and rank 0's sample afterwards is no collective
  if (groups_) groups_->finalize();
}

}  // namespace trainer
