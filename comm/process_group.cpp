#include "comm/process_group.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "comm/gloo_communicator.h"
#include "comm/host_staged_communicator.h"
#include "comm/nccl_table.h"
#include "comm/store_secret.h"
#include "kernels/ops.h"

namespace trainer {

namespace {

Tensor flat(void* p, DType d, int64_t n, Device dev) { return Tensor(p, d, {n}, dev); }

// Bytes of one tensor into another of the same dtype, on the tensors' device.
void move_elements(const Tensor& dst, int64_t dst_off, const Tensor& src, int64_t src_off, int64_t n) {
  if (n == 0) return;
  const size_t es = dtype_size(src.dtype);
  char* d = static_cast<char*>(dst.data) + size_t(dst_off) * es;
  char* s = static_cast<char*>(src.data) + size_t(src_off) * es;
  if (d == s) return;
  ops::copy(flat(d, dst.dtype, n, dst.device), flat(s, src.dtype, n, src.device));
}

// The CUDA module's NCCL table (comm/nccl_table.h), or why there is none. A
// CUDA run loaded the module when it chose its device.
const NcclTable& cuda_for_groups() {
  std::string why;
  if (const NcclTable* t = nccl_table(&why)) return *t;
  throw std::runtime_error("process groups on CUDA: " + why);
}

bool is_loopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0; }

// Every ProcessGroups of a process gets the next number, and every rank makes
// them in the same order, so the numbers agree and keys never collide.
std::atomic<int> g_generation{0};

}  // namespace

// --- SingleRankCommunicator ------------------------------------------------

void SingleRankCommunicator::bad(const char* op, const std::string& why) const {
  throw std::invalid_argument(std::string(op) + " on group " + describe() + ": " + why);
}

// The shapes, roots, counts and peers are checked by the caller
// (comm/collective_checks.h): in a group of one every collective is a copy.
void SingleRankCommunicator::do_reduce_scatter(Tensor out, Tensor in) {
  move_elements(out, 0, in, 0, in.numel());
}

void SingleRankCommunicator::do_all_gather(Tensor out, Tensor in) {
  move_elements(out, 0, in, 0, in.numel());
}

void SingleRankCommunicator::do_broadcast(Tensor, int) {}

void SingleRankCommunicator::do_all_to_all(Tensor out, Tensor in) {
  move_elements(out, 0, in, 0, in.numel());
}

void SingleRankCommunicator::do_all_to_all_v(Tensor out, const std::vector<int64_t>&, Tensor in,
                                             const std::vector<int64_t>& in_counts) {
  move_elements(out, 0, in, 0, in_counts[0]);
}

void SingleRankCommunicator::do_batch_send_recv(const std::vector<P2POp>& ops) {
  std::vector<const P2POp*> sends, recvs;
  for (const P2POp& p : ops) {
    (p.send ? sends : recvs).push_back(&p);
  }
  if (sends.size() != recvs.size()) bad("batch_send_recv", "sends and receives to itself must pair up");
  for (size_t i = 0; i < sends.size(); ++i) {
    const Tensor& s = sends[i]->tensor;
    const Tensor& r = recvs[i]->tensor;
    if (s.nbytes() != r.nbytes() || s.dtype != r.dtype)
      bad("batch_send_recv", "send " + std::to_string(i) + " and receive " + std::to_string(i) + " differ");
    move_elements(r, 0, s, 0, s.numel());
  }
}

std::unique_ptr<Work> SingleRankCommunicator::do_all_reduce_async(Tensor) { return std::make_unique<CompletedWork>(); }

std::unique_ptr<Work> SingleRankCommunicator::do_reduce_scatter_async(Tensor out, Tensor in) {
  do_reduce_scatter(out, in);
  return std::make_unique<CompletedWork>();
}

std::unique_ptr<Work> SingleRankCommunicator::do_all_gather_async(Tensor out, Tensor in) {
  do_all_gather(out, in);
  return std::make_unique<CompletedWork>();
}

// --- ProcessGroups ---------------------------------------------------------

ProcessGroups::ProcessGroups(const LaunchInfo& launch, const MeshShape& mesh, Device device,
                             ProcessGroupOptions options)
    : rank_(launch.rank), mesh_(mesh), device_(device), options_(std::move(options)) {
  const int world = launch.world_size;
  if (mesh.world() != world)
    throw std::invalid_argument("process groups: the mesh has " + std::to_string(mesh.world()) +
                                " ranks but the launcher started " + std::to_string(world));
  if (rank_ < 0 || rank_ >= world)
    throw std::invalid_argument("process groups: rank " + std::to_string(rank_) + " outside a world of " +
                                std::to_string(world));
  if (world > 1 && launch.master_port <= 0)
    throw std::invalid_argument("process groups: " + std::to_string(world) +
                                " ranks need the store's port (MASTER_PORT), which is not set");
  if (!(options_.timeout_s > 0)) throw std::invalid_argument("process groups: parallel.timeout_s must be > 0");
  const double timeout = options_.timeout_s;
  const std::string token = options_.token.empty() ? job_token_from_env() : options_.token;
  const std::string secret = options_.secret ? *options_.secret : store_secret_from_env();
  const int generation = g_generation++;
  generation_ = generation;
  single_host_ = launch.local_world_size >= world;
  master_addr_ = launch.master_addr;

  const int store_port = launch.store_port();
  int port = store_port;
  if (rank_ == 0) {
    // MASTER_ADDR is often a host name that resolves, on its own node, to a
    // loopback alias (Debian's 127.0.1.1) while the other nodes reach the
    // real address: listen on every interface unless the job is loopback-only.
    const std::string bind = is_loopback(launch.master_addr) ? launch.master_addr : "0.0.0.0";
    StoreServerOptions so;
    so.secret = secret;
    server_ = std::make_unique<StoreServer>(bind, store_port, token, so);
    port = server_->port();  // a single process may leave the port to the system
  }
  try {
    store_ = std::make_unique<StoreClient>(launch.master_addr, port, token, timeout, std::max(timeout, 60.0), secret);
    store_->barrier("init", rank_, world, timeout);
    connect_all(launch, generation);
  } catch (...) {
    // The other ranks are most likely failing at this moment for the same
    // reason (a missing rank): keep the store up a little longer so that they
    // report that, rather than "the store closed the connection".
    if (server_) std::this_thread::sleep_for(std::chrono::duration<double>(std::clamp(timeout / 4, 0.5, 5.0)));
    throw;
  }
}

void ProcessGroups::connect_all(const LaunchInfo& launch, int generation) {
  const int world = launch.world_size;
  const double timeout = options_.timeout_s;
  const Device device = device_;
  const MeshShape& mesh = mesh_;

  auto single = [&](const std::string& name) { return std::make_unique<SingleRankCommunicator>(name, rank_, device); };
  auto needs_gloo = [&] {
    if (!gloo_device_) gloo_device_ = make_gloo_device(launch.master_addr, launch.local_world_size >= world);
    return gloo_device_;
  };
  auto gloo = [&](const std::string& name, std::vector<int> members) -> std::unique_ptr<Communicator> {
    return std::make_unique<GlooCommunicator>(*store_, needs_gloo(),
                                              GlooGroup{name, std::move(members), rank_, timeout, generation});
  };
  std::vector<int> everyone(world);
  for (int r = 0; r < world; ++r) everyone[r] = r;

  // Every rank walks the axes in the same order; ranks of one group reach it
  // after the same earlier groups, so no two groups wait on each other.
  if (device == Device::CPU || options_.host_staged) {
    auto group = [&](const std::string& name, std::vector<int> members) -> std::unique_ptr<Communicator> {
      std::unique_ptr<Communicator> g = gloo(name, std::move(members));
      if (!options_.host_staged) return g;
      return std::make_unique<HostStagedCommunicator>(std::move(g), device);
    };
    world_ = world == 1 ? single("world") : group("world", everyone);
    for (Axis a : kAllAxes) {
      const std::string name = group_name(mesh, a, rank_);
      groups_[size_t(a)] = axis_size(mesh, a) == 1 ? single(name) : group(name, group_ranks(mesh, rank_, a));
    }
  } else if (world == 1) {
    // One GPU under a launcher: the world is still an NCCL communicator, so
    // that the single-GPU run exercises the same collective path as many.
    const NcclTable& cuda = cuda_for_groups();
    world_ = cuda.nccl_world ? cuda.nccl_world(*store_, rank_, 1, timeout, generation) : single("world");
    for (Axis a : kAllAxes) groups_[size_t(a)] = single(group_name(mesh, a, rank_));
  } else {
    const NcclTable& cuda = cuda_for_groups();
    if (!cuda.nccl_world)
      throw std::runtime_error("process groups: " + std::to_string(world) +
                               " ranks on CUDA need NCCL, and this build has none "
                               "(configure with CUDA and NCCL, or run with device: cpu)");
    std::unique_ptr<Communicator> nccl_world = cuda.nccl_world(*store_, rank_, world, timeout, generation);
    // ncclCommSplit is collective over the world: every rank splits every
    // axis (sizes are the same everywhere, so all skip the same ones).
    for (Axis a : kAllAxes) {
      const std::string name = group_name(mesh, a, rank_);
      if (axis_size(mesh, a) == 1) {
        groups_[size_t(a)] = single(name);
        continue;
      }
      const GroupSplit sp = group_split(mesh, rank_, a);
      groups_[size_t(a)] = cuda.nccl_split(*nccl_world, sp.color, sp.key, name, group_ranks(mesh, rank_, a));
    }
    world_ = std::move(nccl_world);
  }
  if (device == Device::CUDA && options_.host_world)
    host_world_ = world == 1 ? std::make_unique<SingleRankCommunicator>("host_world", rank_, Device::CPU)
                             : gloo("host_world", everyone);
  // Nobody leaves before everyone is connected: rank 0's store is still
  // needed by groups it is not part of.
  store_->barrier("ready", rank_, world, timeout);
}

ProcessGroups::~ProcessGroups() = default;

Communicator& ProcessGroups::host_world() {
  if (device_ == Device::CPU) return *world_;
  if (!host_world_)
    throw std::logic_error("process groups: no host world communicator (set ProcessGroupOptions::host_world)");
  return *host_world_;
}

std::unique_ptr<Communicator> ProcessGroups::subgroup(const std::string& name, const std::vector<int>& members) {
  const auto at = std::find(members.begin(), members.end(), rank_);
  const bool member = at != members.end();
  if (device_ == Device::CPU || options_.host_staged) {
    if (!member) return nullptr;
    if (members.size() == 1) return std::make_unique<SingleRankCommunicator>(name, rank_, device_);
    if (!gloo_device_) gloo_device_ = make_gloo_device(master_addr_, single_host_);
    std::unique_ptr<Communicator> g = std::make_unique<GlooCommunicator>(
        *store_, gloo_device_, GlooGroup{name, members, rank_, options_.timeout_s, generation_});
    if (!options_.host_staged) return g;
    return std::make_unique<HostStagedCommunicator>(std::move(g), device_);
  }
  // ncclCommSplit is collective over the world: the others form a group of
  // their own (color 1), which nobody uses.
  if (mesh_.world() == 1) return std::make_unique<SingleRankCommunicator>(name, rank_, device_);
  std::vector<int> rest;
  for (int r = 0; r < mesh_.world(); ++r)
    if (std::find(members.begin(), members.end(), r) == members.end()) rest.push_back(r);
  const std::vector<int>& mine = member ? members : rest;
  const int key = int(std::find(mine.begin(), mine.end(), rank_) - mine.begin());
  std::unique_ptr<Communicator> g =
      cuda_for_groups().nccl_split(*world_, member ? 0 : 1, key, member ? name : name + "_rest", mine);
  if (!member) return nullptr;
  return g;
}

void ProcessGroups::finalize() { store_->barrier("finalize", rank_, mesh_.world(), options_.timeout_s); }

}  // namespace trainer
