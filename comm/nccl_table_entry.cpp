// The module's NCCL table (comm/nccl_table.h). Built into libtrainer_cuda.so
// whether or not NCCL was found, so that every module has the table and a
// build without NCCL says so instead of lacking a symbol.
#include <stdexcept>

#include "comm/nccl_table.h"
#ifdef TRAINER_HAVE_NCCL
#include "comm/nccl_communicator.h"
#endif

namespace trainer {
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
#else
std::string nccl_version() { return "no NCCL"; }
#endif

NcclTable make_nccl_table() {
  NcclTable t;
  t.abi_version = kNcclTableAbi;
  t.signature = kNcclTableSignature;
  t.table_bytes = sizeof(NcclTable);
  t.version = &nccl_version;
#ifdef TRAINER_HAVE_NCCL
  t.nccl_world = &nccl_world;
  t.nccl_split = &nccl_split;
#endif
  return t;
}

}  // namespace
}  // namespace trainer

extern "C" __attribute__((visibility("default"))) const trainer::CudaTable* trainer_cuda_nccl() {
  static const trainer::NcclTable table = trainer::make_nccl_table();
  return &table;
}
