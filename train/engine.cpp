#include "train/engine.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <vector>

#include "infer/choice_score.h"
#include "infer/generate.h"
#include "model/flops.h"
#include "model/kv_cache.h"
#include "observe/process_stats.h"
#include "observe/step_window.h"
#include "observe/trace_file.h"
#include "runtime/watchdog.h"
#include "train/gpu_watch.h"
#include "train/micro_batch.h"
#include "train/preemption.h"
#include "train/session.h"
#include "train/step.h"

namespace trainer {

namespace {

TrainSummary start_summary(const Session& s) {
  TrainSummary summary;
  summary.planned_bytes = s.plan.total();
  summary.device_bytes = s.dev.memory_bytes;
  summary.optimizer_bytes = s.models->optimizer_bytes();
  summary.start_step = summary.end_step = s.start_step;
  return summary;
}

StepWindow::Setup window_setup(Session& s) {
  StepWindow::Setup w;
  w.host = &s.dist->host();
  w.timed = &s.dist->timed_groups();
  w.log = s.log.get();
  w.mesh = s.dist->mesh();
  w.simulated = &s.simulated;
  w.dims = s.dims;
  w.world_size = s.opt.launch.world_size;
  w.places = &s.places;
  w.rank = s.opt.launch.rank;
  w.predicted = s.predicted ? &*s.predicted : nullptr;
  w.hardware = s.hardware ? &*s.hardware : nullptr;
  w.lead = s.lead;
  w.quiet = s.opt.quiet;
  w.model_flops = flops_per_token(s.dims);  // the planner's count too (model/flops.h)
  w.peak = peak_tflops(s.dev.line, s.storage != DType::F32, s.cfg.train.peak_tflops);
  w.run_dir = s.run_dir;
  w.resumed = s.start_step > 0;
  w.gpu = [&s] { return s.nvml ? s.nvml->read() : GpuHealth{}; };  // opened after the window (open_gpu_watch)
  return w;
}

RunTrace::Setup trace_setup(Session& s) {
  RunTrace::Setup t;
  if (!s.cfg.log.trace.empty()) t.steps = parse_step_range(s.cfg.log.trace);
  t.store = s.dist->store();
  t.rank = s.opt.launch.rank;
  t.world = s.opt.launch.world_size;
  if (size_t(t.rank) < s.places.host.size()) t.host = s.places.host[size_t(t.rank)];
  t.path = s.run_dir + "/trace.json";
  t.quiet = s.opt.quiet;
  return t;
}

// What follows an applied step: its log line (and window), the save that
// is due, the evaluation that is due.
// train.eval_task: the weights gathered whole (collective: every rank), the
// lead scores the task on its CPU as `trainer eval` would.
void score_eval_task(Session& s, int64_t step) {
  if (s.eval_task.empty()) return;
  const std::vector<std::vector<float>> w = s.models->gather_fp32_weights(single_plan(s.dims, s.cfg.model.init_std).params);
  if (!s.lead) return;
  const int64_t window = std::min<int64_t>(s.cfg.train.seq_len, s.cfg.model.max_seq_len);
  const ChoiceResult r = score_choices(s.dims, w, s.eval_task, window);
  s.log->task(step, s.cfg.train.eval_task, int64_t(s.eval_task.size()), r.acc, r.acc_norm);
}

// log.resources_interval: every rank's sample, gathered (a collective at
// the same step everywhere), and the run directory's bytes.
void record_resources(Session& s, int64_t step) {
  const ProcessSample mine = sample_process();
  Communicator& host = s.dist->host();
  std::vector<double> all(size_t(3 * host.size()));
  double v[3] = {mine.resident_bytes, mine.open_fds, mine.threads};
  host.all_gather(Tensor(all.data(), DType::F64, {int64_t(all.size())}), Tensor(v, DType::F64, {3}));
  if (!s.lead || !s.log) return;
  auto mib = [](double bytes) { return std::round(bytes / (1 << 20) * 100) / 100; };
  nlohmann::json rss = nlohmann::json::array(), fds = nlohmann::json::array(), threads = nlohmann::json::array();
  for (int k = 0; k < host.size(); ++k) {
    rss.push_back(mib(all[size_t(3 * k)]));
    fds.push_back(all[size_t(3 * k + 1)]);
    threads.push_back(all[size_t(3 * k + 2)]);
  }
  s.log->record(nlohmann::json{{"step", step},
                               {"resources", {{"rss_mib", rss}, {"open_fds", fds}, {"threads", threads},
                                              {"run_dir_mib", mib(directory_bytes(s.run_dir))},
                                              {"checkpoints_mib", mib(directory_bytes(s.ckpt_root))}}}}
                    .dump());
}

void after_applied(Session& s, StepWindow& window, TrainSummary& summary, int64_t step, const StepResult& r,
                   bool loss_scaling) {
  const Config& cfg = s.cfg;
  const bool last = step == s.end_step;
  StepMetrics sm;
  sm.step = step;
  sm.total_steps = s.end_step;
  sm.loss = r.loss;
  sm.aux_loss = r.aux;
  sm.has_aux = s.dims.E > 0;
  sm.loss_scale = loss_scaling ? r.loss_scale : 0;
  sm.lr = r.lr;
  sm.grad_norm = r.norm;
  sm.tokens = s.tokens;
  window.applied_step(sm, s.tokens_per_step(), is_log_step(cfg, step, s.end_step),
                      std::sqrt(s.models->local_grad_sum_squares()) / r.loss_scale);
  // This step ran on the state the held snapshot holds, and was applied.
  if (s.saver->holding()) window.as_checkpoint([&] { s.saver->confirm(true, false, summary); });
  if (s.saver->due(step, last))
    window.as_checkpoint([&] { s.saver->maybe_save(*s.models, step, s.tokens, s.data_offset, last, summary); });
  if (cfg.log.resources_interval > 0 && (step % cfg.log.resources_interval == 0 || last)) record_resources(s, step);
  // Every rank evaluates: under ZeRO-3 the forward gathers weights from all.
  if (s.valid_batch && ((cfg.train.eval_interval > 0 && step % cfg.train.eval_interval == 0) || last)) {
    if (Watchdog* w = s.dist->watchdog()) w->progress(step, "evaluation");
    window.as_eval([&] {
      const double vl = evaluate(*s.valid_batch, *s.models, s.dist->pp_group(), s.dist->host(), s.dp, s.counts_loss,
                                 s.dims.N(), s.valid_share);
      summary.val_losses.push_back(vl);
      summary.final_val_loss = vl;
      if (s.lead) s.log->eval(step, vl);
      score_eval_task(s, step);
    });
  }
}

// "the newest checkpoint is DIR", from this run's saves or the root's `latest`.
std::string newest_checkpoint(Session& s) {
  std::string dir = s.saver->writer().last_completed();
  if (dir.empty()) {
    std::ifstream latest(s.ckpt_root + "/latest");
    std::string name;
    if (latest >> name) dir = s.ckpt_root + "/" + name;
  }
  return dir.empty() ? "no complete checkpoint under " + s.ckpt_root : "the newest checkpoint is " + dir;
}

// Every rank stops after the same step and saves it, unless the policy
// flagged it (then the newest checkpoint stays the last one).
void stop_preempted(Session& s, const StepRunner& runner, TrainSummary& summary) {
  summary.preempted = true;
  const int64_t completed = runner.completed();
  if (s.lead)
    std::printf("preemption: %s, all ranks stop after step %lld%s; relaunch with checkpoint.resume=auto to "
                "continue (exit code %d)\n",
                preemption_requests() > 0 ? (std::string(preemption_signal()) + " received").c_str()
                                          : "another rank received a signal",
                (long long)completed, runner.last_flagged() ? " (flagged by train.nonfinite: not saved)" : ", saving it",
                kPreemptedExitCode);
  if (!runner.last_flagged()) s.saver->save_on_exit(*s.models, completed, s.tokens, s.data_offset, summary);
}

// The end of the loop on every rank: the preemption save, the time table
// and the traffic measured, the last checkpoint written out.
void finish_loop(Session& s, StepWindow& window, const StepRunner& runner, TrainSummary& summary) {
  if (runner.preempt() && runner.completed() < s.end_step) stop_preempted(s, runner, summary);
  // On the CPU the plan is the process's memory, less the program, its
  // libraries and their buffers: the difference says how much that is.
  if (window.print_step_time())
    if (const size_t peak = peak_resident_bytes(); peak > 0 && s.dev.device == Device::CPU)
      std::printf("peak resident memory: %.0f MiB, memory plan %.0f MiB (%+.0f MiB)\n", double(peak) / (1 << 20),
                  double(s.plan.total()) / (1 << 20), (double(peak) - double(s.plan.total())) / (1 << 20));
  window.report_traffic(runner.preempt());
  if (Watchdog* w = s.dist->watchdog()) w->progress(summary.end_step, "finishing");
  CheckpointSaver& writer = s.saver->writer();
  writer.wait();
  if (!s.opt.quiet && !writer.last_completed().empty())
    std::printf("checkpoint: latest complete is %s\n", writer.last_completed().c_str());
  // A run whose last step the policy flagged did not finish training: its
  // update was not applied and nothing was saved from it (exit 4, as a stop).
  if (runner.last_flagged() && !summary.preempted && runner.completed() == s.end_step)
    throw StepPolicyStop("the last step was flagged (" + runner.last_flag() +
                         "): its update was not applied and nothing was saved from it; " + newest_checkpoint(s));
}

// The end-of-run sample (log.sample_tokens): the data's tokenizer encodes
// the prompt and decodes the text; the key/value cache makes each token one
// token's forward (model/kv_cache.h). Gathering the weights is collective.
void sample_text(Session& s, TrainSummary& summary) {
  const Config& cfg = s.cfg;
  std::vector<std::vector<float>> final_weights;
  const bool sample = cfg.log.sample_tokens > 0 && !summary.diverged && !s.opt.smoke;
  if (sample) final_weights = s.models->gather_fp32_weights(single_plan(s.dims, cfg.model.init_std).params);
  s.dist->finish();
  if (!sample || !s.lead) return;
  const std::unique_ptr<Tokenizer> tok = tokenizer_or_fallback(s.data_tokenizer, cfg.model.vocab_size);
  std::vector<int32_t> prompt;
  if (tok->encodes_text()) {
    prompt = tok->encode(cfg.log.sample_prompt);
  } else if (!tok->warning.empty()) {
    std::printf("warning: %s; log.sample_prompt is not used\n", tok->warning.c_str());
  }
  KvDecoder decoder(s.dims, final_weights, s.T, Device::CPU);
  SamplingOptions so;
  so.temperature = float(cfg.log.sample_temperature);
  so.seed = cfg.run.seed;
  const auto ids = generate_cached(decoder, prompt, cfg.log.sample_tokens, so);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), ids.begin(), ids.end());
  summary.sample = tok->decode(all);
  std::printf("\nsample (temperature %.2f, %d tokens):\n%s\n", cfg.log.sample_temperature, cfg.log.sample_tokens,
              summary.sample.c_str());
}

}  // namespace

TrainSummary run_training(const Config& cfg, const RunOptions& opt) {
  Session s(cfg, opt);
  TrainSummary summary = start_summary(s);
  StepWindow window(window_setup(s), cfg.log);
  install_preemption_handlers();
  // A rank blocked on a dead peer ends at once once a signal asks it to.
  if (Watchdog* w = s.dist->watchdog()) w->set_stop_requested(&preemption_requested);
  StepRunner runner(s, window, summary);
  open_gpu_watch(s);
  RunTrace timeline(trace_setup(s));
  if (s.lead)
    if (const double age = process_age_seconds(); age >= 0)
      std::printf("start-up: %.2f s from process start to step %lld\n", age, (long long)s.start_step + 1);
  // A failed collective ends the run on every rank naming the step, the
  // phase and the heartbeats (runtime/watchdog.h).
  try {
    for (int64_t step = s.start_step; step < s.end_step && !runner.preempt();) {
      timeline.before_step(step + 1);
      StepResult r;
      {
        const trace::Scope span("step", "step", step + 1);
        r = runner.run(step);
        if (r.outcome == StepOutcome::Applied)
          after_applied(s, window, summary, step + 1, r, runner.loss_scaling());
        else  // a flagged, rolled back or diverged step drops a held snapshot; an overflow keeps it
          s.saver->confirm(false, r.outcome != StepOutcome::OverflowSkipped, summary);
      }
      if (timeline.writes_after(step + 1))
        if (Watchdog* w = s.dist->watchdog()) w->progress(step + 1, "log.trace: merging every rank's timeline");
      timeline.after_step(step + 1);
      check_gpu_errors(s, step + 1);
      if (r.outcome == StepOutcome::Diverged) break;
      step = r.next_step;
    }
    if (timeline.recording())
      if (Watchdog* w = s.dist->watchdog()) w->progress(runner.completed(), "log.trace: merging every rank's timeline");
    timeline.finish();
    finish_loop(s, window, runner, summary);
  } catch (...) {
    if (Watchdog* w = s.dist->watchdog()) w->rethrow_failure();  // adds step, phase, heartbeats; rank 0 keeps the store up briefly
    throw;
  }
  if (s.dump) s.dump->finish();
  if (s.opt.after_run && !summary.diverged)
    s.opt.after_run(FinishedRun{cfg, s.opt.launch, s.plans, *s.models, summary.end_step, s.tokens, s.ckpt_root, *s.dist},
                    summary);
  // The smoke test judges the pace of the job: a step takes as long as its
  // slowest rank, and every rank must reach the same verdict.
  if (s.opt.smoke && s.dist->launched() && !summary.step_ms.empty())
    s.dist->host().all_reduce(Tensor(summary.step_ms.data(), DType::F64, {int64_t(summary.step_ms.size())}),
                              ReduceOp::Max);
  sample_text(s, summary);
  return summary;
}

}  // namespace trainer
