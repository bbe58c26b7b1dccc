#include "observe/step_window.h"

#include "observe/gpu_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "observe/pipeline_report.h"
#include "observe/wait_attribution.h"

namespace trainer {

StepWindow::StepWindow(const Setup& s, const LogConfig& log_cfg)
    : s_(s), monitor_(*s.host, *s.places, log_cfg, s.lead ? s.run_dir : "", s.resumed) {
  throughput_start_ = clock_type::now();
  window_comm0_ = run_comm0_ = comm_now();
  // Bytes each group moves in the steps of this run (observe/comm_measured.h).
  run_bytes0_ = comm_bytes_now(*s_.timed);
  window_wall0_ = run_wall0_ = clock_type::now();
}

void StepWindow::begin_iteration() {
  ++window_iterations_;
  ++run_iterations_;
}

ExpertLoad* StepWindow::expert_load_of_step(bool log_step) {
  if (s_.dims.E == 0) return nullptr;
  expert_load_.reset(s_.dims.L, s_.dims.E);
  return log_step ? &expert_load_ : nullptr;
}

StepTime StepWindow::comm_now() const {
  StepTime t;
  for (const auto& g : *s_.timed) {
    t.add_comm(g->label(), g->blocked_seconds());
    t.add_busy(g->label(), g->busy_seconds());
  }
  return t;
}

StepTime StepWindow::comm_delta(const StepTime& from) const {
  StepTime d;
  const StepTime now = comm_now();
  for (size_t i = 0; i < now.comm.size(); ++i) d.add_comm(now.comm[i].first, now.comm[i].second - from.comm[i].second);
  for (size_t i = 0; i < now.busy.size(); ++i) d.add_busy(now.busy[i].first, now.busy[i].second - from.busy[i].second);
  return d;
}

void StepWindow::applied_step(StepMetrics sm, int64_t step_tokens, bool log_step, double rank_grad_norm) {
  window_tokens_ += step_tokens;
  window_steps_ += 1;
  const double secs = seconds_since(throughput_start_);
  sm.tokens_per_s = double(window_tokens_) / secs;
  sm.ms_per_step = 1e3 * secs / double(window_steps_);
  sm.tflops = s_.model_flops * sm.tokens_per_s / double(s_.world_size) / 1e12;
  sm.mfu = s_.peak > 0 ? sm.tflops / s_.peak : -1;
  if (log_step) {
    s_.log->step(sm, !s_.quiet);
    close_window(sm, secs, rank_grad_norm);
  } else if (!s_.quiet) {
    s_.log->progress(sm);
  }
}

// The window's parts per step, every rank's report to rank 0, the experts'
// load and the pipeline's idle time; then the next window starts.
void StepWindow::close_window(const StepMetrics& sm, double secs, double rank_grad_norm) {
  StepTime w = window_parts_;
  const StepTime window_comm = comm_delta(window_comm0_);
  for (const auto& [g, t] : window_comm.comm) w.add_comm(g, t);
  for (const auto& [g, t] : window_comm.busy) w.add_busy(g, t);
  const StepTime per = per_step(w, seconds_since(window_wall0_), window_iterations_);
  // From here until the next window's clocks start, the reports to rank 0
  // belong to no window's time table: the timeline shows them as "log".
  const int64_t log0 = trace::now_ns();
  run_parts_ += window_parts_;
  if (s_.lead) {
    s_.log->record("{\"step\": " + std::to_string(sm.step) + ", " + step_time_json(per) + "}");
    s_.log->scalars(sm.step, step_time_scalars(per));
  }
  RankReport rr;
  rr.tokens_per_s = sm.tokens_per_s / double(s_.world_size);
  rr.step_ms = 1e3 * seconds_since(window_wall0_) / double(window_iterations_);
  rr.grad_norm = rank_grad_norm;
  rr.time = per;
  if (s_.gpu) rr.gpu = s_.gpu();
  // Who the others waited for (observe/wait_attribution.h): milliseconds
  // per step of an average other rank.
  std::vector<double> held = attribute_waits(*s_.timed, *s_.host, s_.mesh.pp, s_.dims.E > 0);
  for (double& h : held) h *= 1e3 / double(window_iterations_) / double(std::max(1, s_.world_size - 1));
  const std::string alerts = monitor_.report(sm.step, rr, held);
  if (s_.lead && !alerts.empty()) std::printf("%s", alerts.c_str());
  if (s_.lead)
    for (size_t r = 0; r < monitor_.gpus().size(); ++r)
      if (monitor_.gpus()[r].read) s_.log->scalars(sm.step, gpu_scalars(int(r), monitor_.gpus()[r]));
  if (s_.dims.E > 0) {
    sum_expert_load(expert_load_, *s_.host, s_.mesh.tp);
    const std::vector<LayerLoad> loads = layer_loads(expert_load_);
    if (s_.lead && !s_.quiet) std::printf("%s", format_expert_load(loads).c_str());
    if (s_.lead) s_.log->record(expert_load_json(sm.step, loads));
  }
  // Theory against reality: the share of the window each stage spent
  // waiting for its neighbours, next to the simulator's bubble.
  if (s_.mesh.pp > 1) {
    const double mine = window_wait_s_ / secs;
    std::vector<double> idle(size_t(s_.world_size), 0);
    s_.host->all_gather(Tensor(idle.data(), DType::F64, {int64_t(idle.size())}),
                        Tensor(const_cast<double*>(&mine), DType::F64, {1}));
    if (s_.lead && !s_.quiet) std::printf("%s", format_pipeline_idle(s_.mesh, idle, *s_.simulated).c_str());
    if (s_.lead) s_.log->record(pipeline_idle_json(sm.step, s_.mesh, idle, *s_.simulated));
  }
  window_wait_s_ = 0;
  // The next window starts after the reports, which belong to none.
  window_parts_ = StepTime{};
  window_comm0_ = comm_now();
  window_wall0_ = clock_type::now();
  window_iterations_ = 0;
  trace::span("log", "log: the window's reports", log0, trace::now_ns());
  throughput_start_ = clock_type::now();
  window_tokens_ = window_steps_ = 0;
}

bool StepWindow::print_step_time() {
  if (!s_.lead || s_.quiet || run_iterations_ == 0) return false;
  StepTime all = run_parts_;
  all += window_parts_;
  const StepTime run_comm = comm_delta(run_comm0_);
  for (const auto& [g, t] : run_comm.comm) all.add_comm(g, t);
  for (const auto& [g, t] : run_comm.busy) all.add_busy(g, t);
  std::printf("%s", format_step_time(all, seconds_since(run_wall0_), run_iterations_).c_str());
  return true;
}

void StepWindow::report_traffic(bool preempted) {
  if (run_iterations_ > 0 && !preempted) {
    // Collective over the host group: every rank gets here after the same steps.
    std::string json;
    const std::string measured = comm_measured_report(*s_.timed, run_bytes0_, run_iterations_, *s_.host, &json);
    if (s_.lead && !s_.quiet) std::printf("%s", measured.c_str());
    if (s_.lead && !measured.empty()) s_.log->record(json);
    if (s_.lead && s_.places) report_links();
  }
}

// Rank 0's groups, inside a node or across, measured against the plan.
void StepWindow::report_links() {
  const StepTime comm = comm_delta(run_comm0_);
  const double steps = double(std::max<int64_t>(1, run_iterations_));
  std::vector<LinkUse> uses;
  for (size_t i = 0; i < s_.timed->size(); ++i) {
    const TimedCommunicator& g = *(*s_.timed)[i];
    if (g.label() == "host") continue;
    const CommBytes d = g.bytes() - run_bytes0_[i];
    LinkUse u{g.label(), g.size(), group_payload(g.label(), d) / steps, 0};
    for (const auto& [label, t] : comm.comm)
      if (label == u.label) u.seconds = t / steps;
    uses.push_back(u);
  }
  std::string json;
  const std::string text =
      format_link_report(s_.mesh, s_.rank, s_.places->host, uses, s_.predicted, s_.hardware, &json);
  if (!s_.quiet) std::printf("%s", text.c_str());
  if (!json.empty()) s_.log->record(json);
  if (s_.predicted && s_.hardware) {
    const std::string model = format_step_model(*s_.predicted, *s_.hardware, seconds_since(run_wall0_) / steps,
                                                run_iterations_, &json);
    if (!s_.quiet) std::printf("%s", model.c_str());
    s_.log->record(json);
  }
}

}  // namespace trainer
