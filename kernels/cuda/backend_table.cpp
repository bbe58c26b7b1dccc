// The CUDA module's one entry point: the table of core/cuda_backend.h,
// filled with this module's functions, which the trainer's loader
// (core/cuda_module.cpp) checks and then calls through.
#include <stdexcept>

#include "comm/communicator.h"
#include "core/cuda_backend.h"
#include "kernels/cuda/compute_stream.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_api.h"
#ifdef TRAINER_HAVE_NCCL
#include "comm/nccl_communicator.h"
#endif

namespace trainer::cuda {
namespace {

#ifdef TRAINER_HAVE_NCCL
std::unique_ptr<Communicator> nccl_world(Store& store, int rank, int world, double timeout_s, int generation) {
  return NcclCommunicator::create_world(store, rank, world, timeout_s, generation);
}

std::unique_ptr<Communicator> nccl_split(Communicator& parent, int color, int key, std::string name,
                                         std::vector<int> members) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&parent);
  if (!nccl)
    throw std::logic_error("splitting " + name + " off " + parent.describe() + ": not an NCCL communicator");
  return nccl->split(color, key, std::move(name), std::move(members));
}
#endif

CudaBackend make_table() {
  CudaBackend t;
  t.abi_version = kCudaBackendAbi;
  t.signature = kCudaBackendSignature;
  t.table_bytes = sizeof(CudaBackend);
  t.describe = &describe;
  t.device_count = &device_count;
  t.set_device = &set_device;
  t.device_info = &device_info;
  t.alloc = &alloc;
  t.release = &release;
  t.transfer = &transfer;
  t.synchronize = &synchronize;
#ifdef TRAINER_HAVE_NCCL
  t.nccl_world = &nccl_world;
  t.nccl_split = &nccl_split;
#endif
#define TRAINER_OP(route, ret, name, params, args) t.ops.name = &cuda::name;
#include "kernels/op_list.h"
#undef TRAINER_OP
  return t;
}

}  // namespace
}  // namespace trainer::cuda

extern "C" __attribute__((visibility("default"))) const trainer::CudaBackend* trainer_cuda_backend() {
  static const trainer::CudaBackend table = trainer::cuda::make_table();
  return &table;
}
