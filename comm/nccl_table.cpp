#include "comm/nccl_table.h"

#include "core/cuda_module.h"

namespace trainer {

const NcclTable* nccl_table(std::string* why) {
  return kept_cuda_module_table<NcclTable>(kNcclTableSpec, why);
}

}  // namespace trainer
