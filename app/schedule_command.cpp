#include "app/schedule_command.h"

#include <cstdio>

#include "comm/mesh.h"
#include "config/config_schema.h"
#include "pipeline/pipeline_plan.h"
#include "pipeline/schedule.h"
#include "pipeline/simulate.h"
#include "observe/pipeline_report.h"
#include "observe/trace_file.h"
#include "planner/memory_plan.h"

namespace trainer {

std::string describe_schedule(const Config& c, int world_size, const std::string& trace_path, double forward_ms) {
  const MeshShape mesh = resolve_mesh(c.parallel, world_size, 0);
  const ModelDims dims = make_dims(c, c.train.micro_batch_size, c.train.seq_len);
  const std::vector<int64_t> layers = stage_layers_for(c, dims, mesh.pp * pipeline_chunks(c));
  const int64_t m = microbatches_per_step(c, mesh.dp);
  const Schedule s = schedule_for(c, mesh.pp, m);
  const Simulation sim = simulate(s, stage_action_costs(dims, layers, mesh.pp));
  if (!sim.ok) throw std::logic_error("pipeline schedule: " + sim.error);
  std::string out = describe(mesh) + "\n" + format_pipeline(c, dims, layers, s, sim, DType::F32, mesh);
  if (!trace_path.empty()) {
    write_trace_file(trace_path, simulated_trace(s, sim, forward_ms));
    char line[160];
    std::snprintf(line, sizeof line, "trace: the simulated timeline (stage costs, %g ms per forward of the heaviest stage) -> ",
                  forward_ms);
    out += line + trace_path + "\n";
  }
  // The picture with equal stages (F = 1, B = 2 per chunk), where the textbook formula holds.
  const Simulation unit = simulate(s);
  char buf[200];
  std::snprintf(buf, sizeof buf, "timeline with equal stages (%s time units per chunk; bubble %.1f%%):\n",
                splits_backward(s.kind) ? "F = 1, backward-input I = 1, backward-weight W = 1" : "F = 1, B = 2",
                100.0 * unit.bubble());
  out += buf;
  out += format_timeline(unit);
  out += "peak activation memory per rank (fp32, this stage's activation slots). A micro-batch is in flight "
         "from its forward to the end of its backward (the timeline's count); its slot is held from the receive "
         "of its input until its input gradient has been delivered, and the batch that sends one micro-batch's "
         "input gradient receives the next one's input, so a stage that receives can hold one slot more:\n";
  for (int st = 0; st < mesh.pp; ++st) {
    Coords at;
    at.pp = st;
    const MemoryPlan p = plan_memory(c, DType::F32, mesh, at, c.parallel.zero_stage);
    out += "  stage " + std::to_string(st) + ": " + format_bytes(double(p.activation_bytes)) + " (" + describe_slots(p) +
           ")\n";
  }
  return out;
}

}  // namespace trainer
