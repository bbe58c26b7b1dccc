// What the start-up plan and the log lines say about the pipeline: each
// stage's layers, estimated cost, in-flight micro-batches and memory, the
// textbook and the simulated bubble; during training the measured share of
// time each stage waited for its neighbours.
#pragma once

#include <string>
#include <vector>

#include "comm/mesh.h"
#include "config/config.h"
#include "model/dims.h"
#include "pipeline/simulate.h"

namespace trainer {

std::string format_pipeline(const Config& c, const ModelDims& global, const std::vector<int64_t>& layers,
                            const Schedule& s, const Simulation& sim, DType storage, const MeshShape& mesh);

// idle: per global rank, the share of the log window spent waiting in
// pipeline transfers.
std::string format_pipeline_idle(const MeshShape& mesh, const std::vector<double>& idle, const Simulation& sim);
// The same for metrics.jsonl: {"step", "pipeline_idle": [per stage, mean
// of its ranks], "simulated_bubble"}.
std::string pipeline_idle_json(int64_t step, const MeshShape& mesh, const std::vector<double>& idle,
                               const Simulation& sim);

}  // namespace trainer
