#include "comm/nccl_table.h"

#include "core/cuda_module.h"

namespace trainer {

const NcclTable* nccl_table(std::string* why) {
  struct Fetched {
    const NcclTable* table = nullptr;
    std::string why;
  };
  static const Fetched f = [] {
    Fetched r;
    r.table = static_cast<const NcclTable*>(cuda_module_table(kNcclTableSpec, &r.why));
    return r;
  }();
  if (!f.table && why) *why = f.why;
  return f.table;
}

}  // namespace trainer
