#include "optim/adamw.h"

namespace trainer {

bool needs_master_weights(const std::vector<ParamInfo>& params) {
  return !params.empty() && params[0].spec.dtype != DType::F32;
}

}  // namespace trainer
