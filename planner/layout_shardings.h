// The chunk plans (model/sharding.h) of every pipeline rank of one layout,
// built once for the plan's memory, traffic and time: ranks whose stages
// hold layers of the same shape (count, MoE pattern, no embedding or head)
// share one copy, so that pricing thousands of layouts (trainer plan
// --search) does not build thousands of identical plans.
#pragma once

#include <memory>
#include <vector>

#include "comm/mesh.h"
#include "config/config.h"
#include "model/sharding.h"

namespace trainer {

struct LayoutShardings {
  std::vector<std::shared_ptr<const std::vector<ShardingPlan>>> of_rank;  // per pipeline rank
  std::vector<std::vector<int>> slots;  // per pipeline rank and chunk: activation slots (planner/memory_plan.h)
  std::vector<int> in_flight;           // per pipeline rank: the peak between forward and backward
  const std::vector<ShardingPlan>& plans(int pp_rank) const { return *of_rank[size_t(pp_rank)]; }
  std::vector<int> slots_of(int pp_rank) const;
};
LayoutShardings layout_shardings(const Config& c, const MeshShape& mesh, DType storage);

}  // namespace trainer
