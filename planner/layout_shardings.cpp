#include "planner/layout_shardings.h"

#include <map>

#include "pipeline/pipeline_plan.h"
#include "planner/memory_plan.h"

namespace trainer {

std::vector<int> LayoutShardings::slots_of(int pp_rank) const {
  if (size_t(pp_rank) < slots.size()) return slots[size_t(pp_rank)];
  return std::vector<int>(of_rank[size_t(pp_rank)]->size(), 1);
}

LayoutShardings layout_shardings(const Config& c, const MeshShape& mesh, DType storage) {
  const ModelDims g = make_dims(c, c.train.micro_batch_size, c.train.seq_len, storage);
  const int chunks = pipeline_chunks(c);
  const int V = mesh.pp * chunks;
  const std::vector<int64_t> layers = stage_layers_for(c, g, V);
  std::vector<int64_t> first(size_t(V) + 1, 0);
  for (int k = 0; k < V; ++k) first[size_t(k) + 1] = first[size_t(k)] + layers[size_t(k)];
  LayoutShardings out;
  PipelineOccupancy occ = pipeline_occupancy(c, mesh);
  out.slots = std::move(occ.chunk_slots);
  out.in_flight = std::move(occ.in_flight);
  std::map<std::vector<int64_t>, std::shared_ptr<const std::vector<ShardingPlan>>> built;
  for (int r = 0; r < mesh.pp; ++r) {
    // What a rank's plans depend on besides names: per chunk its layer
    // count, where the MoE layers fall, the embedding and the head.
    std::vector<int64_t> key;
    for (int k = 0; k < chunks; ++k) {
      const int v = k * mesh.pp + r;
      key.push_back(layers[size_t(v)]);
      key.push_back(g.moe_every > 0 ? first[size_t(v)] % g.moe_every : 0);
      key.push_back(v == 0 ? 1 : 0);
      key.push_back(v == V - 1 ? 1 : 0);
    }
    auto& p = built[key];
    if (!p) {
      Coords at;
      at.pp = r;
      p = std::make_shared<const std::vector<ShardingPlan>>(
          chunk_plans(g, c.model.init_std, mesh, at, c.parallel.zero_stage, c.parallel.sp, layers, chunks));
    }
    out.of_rank.push_back(p);
  }
  return out;
}

}  // namespace trainer
