#include "train/step.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <optional>
#include <thread>

#include "core/trace.h"
#include "optim/grad_clip.h"
#include "pipeline/executor.h"
#include "runtime/watchdog.h"
#include "train/checkpointing.h"
#include "train/micro_batch.h"
#include "train/preemption.h"
#include "train/replica_check.h"

namespace trainer {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// fp16 has too little range for small gradients: dynamic loss scaling
// (optim/loss_scale.h); train.loss_scaling: dynamic turns it on for any
// precision (exact in fp32 and bf16, so the run is unchanged).
bool loss_scaling_on(const Config& cfg, DType storage) {
  return cfg.train.loss_scaling == "dynamic" || (cfg.train.loss_scaling == "auto" && storage == DType::F16);
}

}  // namespace

StepRunner::StepRunner(Session& s, StepWindow& window, TrainSummary& summary)
    : s_(s),
      window_(window),
      summary_(summary),
      sched_{s.cfg.optim.schedule, s.cfg.optim.lr, s.cfg.optim.min_lr, s.cfg.optim.warmup_steps,
             s.cfg.optim.decay_steps > 0 ? s.cfg.optim.decay_steps : s.cfg.train.steps},
      scaler_(loss_scaling_on(s.cfg, s.storage), s.cfg.train.initial_loss_scale, s.cfg.train.loss_scale_window),
      policy_(s.cfg.train, s.cfg.model.vocab_size),
      hooks_(test_hooks_for(s.opt.launch.rank)),
      global_params_(single_plan(s.dims, s.cfg.model.init_std).params),
      completed_(s.start_step) {}

StepResult StepRunner::run(int64_t step) {
  begin(step);
  StepResult r;
  r.next_step = step + 1;
  r.loss_scale = scaler_.scale();
  double loss_sum = 0, aux_sum = 0;
  s_.models->set_gradient_fingerprint(s_.cfg.train.rerun_flagged && !s_.opt.smoke);
  forward_backward(step, r.loss_scale, loss_sum, aux_sum);
  completed_ = step + 1;
  measure(r, loss_sum, aux_sum);
  if (overflowed(step, r) || diverged(step, r)) return r;
  last_flagged_ = false;
  if (!s_.opt.smoke && s_.cfg.train.rerun_flagged) rerun_if_flagged(step, r);
  if (!s_.opt.smoke && flagged(step, r)) return r;
  apply(step, r);
  check_replicas(step, r);
  return r;
}

// The step's loss, aux loss and gradient norm from the ranks' sums.
void StepRunner::measure(StepResult& r, double loss_sum, double aux_sum) {
  const ModelDims& d = s_.dims;
  r.loss = loss_sum / (double(s_.M * d.N() * s_.dp) * share_);
  r.aux = aux_sum / double(s_.M * s_.dp * s_.dist->mesh().cp);  // each cp rank reports the same, whole value
  window_.as_optimizer([&] { r.norm = std::sqrt(s_.models->grad_sum_squares()) / r.loss_scale; });
}

void StepRunner::begin(int64_t step) {
  window_.begin_iteration();
  if (hooks_.kill_step == step + 1) ::raise(SIGKILL);
  if (hooks_.signal_step == step + 1) ::raise(SIGTERM);
  t0_ = clock_type::now();
  if (Watchdog* w = s_.dist->watchdog()) w->progress(step + 1, "forward/backward");
  // Zeroing the gradients and (below) their norm are the optimizer's
  // work, as zero_grad and clip_grad_norm_ are in PyTorch, not "other".
  window_.as_optimizer([&] { s_.models->begin_step(); });
}

// This rank's actions of the schedule (one process: 1F1B of one stage,
// micro-batch after micro-batch), then the reduction; the loss sums come
// back summed over the ranks, with the ranks' stop requests.
void StepRunner::forward_backward(int64_t step, double loss_scale, double& loss_sum, double& aux_sum) {
  const ModelDims& d = s_.dims;
  const auto d0 = clock_type::now();
  const int64_t trace0 = trace::now_ns();
  const HostBatch& batch = s_.prefetch->get(step + s_.data_offset);
  window_.parts().data += seconds_since(d0);
  trace::span("data", "data wait", trace0, trace::now_ns());
  // The mean over the targets the step predicts (all of them unless documents are separate).
  share_ = predicted_share(batch, s_.dist->host(), s_.counts_batch);
  const float ce_scale = float(loss_scale / (double(s_.M * d.N() * s_.dp) * share_));
  if (hooks_.nan_grad_step == step + 1 && !nan_fired_) {
    s_.models->zero(0).poison_next_gradient();
    nan_fired_ = true;  // once: a rollback runs the step number again
  }
  // The load-balancing loss is each micro-batch's (its whole sequences,
  // which every cp rank holds the statistics of): their mean over the
  // step. Each cp rank differentiates it for its own tokens, so the
  // gradient is not divided by cp (model/moe_routing_plan.h).
  const float aux_grad = float(loss_scale * double(d.aux_coeff) / double(s_.M * s_.dp));
  // The steps that log also count each expert's tokens.
  ExpertLoad* load = window_.expert_load_of_step(is_log_step(s_.cfg, step + 1, s_.end_step));
  for (Model* m : s_.models->models()) m->expert_load = load;
  const PipelineStepResult pr = run_pipeline_step(
      s_.models->models(), s_.dist->pp_group(), s_.schedule.ranks[size_t(s_.pp_stage)], ce_scale, aux_grad,
      [&](Model& m, int64_t mb) {
        load_micro_batch(batch, m, mb);
        if (s_.dump) s_.dump->before_forward(step, mb);
      },
      {s_.transfer_mode, {}});
  for (Model* m : s_.models->models()) m->expert_load = nullptr;
  if (hooks_.delay_ms > 0) {
    // A slow device, on purpose: counted as compute.
    const auto s0 = clock_type::now();
    const trace::Scope span("forward", "delay (test hook)");
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(hooks_.delay_ms));
    window_.parts().forward += seconds_since(s0);
  }
  window_.parts().forward += pr.forward_s;
  window_.parts().backward += pr.backward_s;
  window_.add_pipeline_wait(pr.wait_s);
  loss_sum = pr.loss_sum;
  aux_sum = pr.aux_sum;
  local_loss_ = pr.loss_sum;
  if (Watchdog* w = s_.dist->watchdog()) w->progress(step + 1, "gradient reduction");
  s_.models->finish_backward();  // the unit reductions overlapped backward; the last ones land here
  // The loss sums carry the ranks' stop requests (train/preemption.h):
  // all ranks learn of a signal at the same step.
  preempt_ = preemption_requests() > 0;
  if (s_.dist->launched()) {
    double sums[3] = {s_.counts_loss ? loss_sum : 0, s_.counts_loss ? aux_sum : 0, preempt_ ? 1.0 : 0.0};
    const auto h0 = clock_type::now();
    s_.dist->host().all_reduce(Tensor(sums, DType::F64, {3}));
    // A stage that finished its schedule first waits here for the last one
    // (the pipeline's drain): idle like its waits for neighbours, and the
    // simulator's idle counts it too.
    if (s_.dist->mesh().pp > 1) window_.add_pipeline_wait(seconds_since(h0));
    loss_sum = sums[0];
    aux_sum = sums[1];
    preempt_ = sums[2] > 0;
  }
}

// Under loss scaling a non-finite loss or norm is an overflow: the step is
// skipped and the scale lowered; a scale below 1 ends the run.
bool StepRunner::overflowed(int64_t step, StepResult& r) {
  if (!scaler_.enabled() || (std::isfinite(r.norm) && std::isfinite(r.loss))) return false;
  scaler_.overflow();
  summary_.skipped_steps.push_back(step + 1);
  r.outcome = StepOutcome::OverflowSkipped;
  if (!s_.opt.quiet)
    std::printf("step %lld: gradient overflow at loss scale %g, step skipped, loss scale -> %g\n", (long long)step + 1,
                r.loss_scale, scaler_.scale());
  if (scaler_.scale() < 1.0) {
    const char* why = "the loss scale fell below 1: the gradients overflow at any scale";
    if (!s_.opt.smoke)
      throw std::runtime_error(std::string(why) + (s_.storage == DType::F16 ? "; use train.precision=bf16" : ""));
    summary_.diverged = true;
    summary_.divergence = why;
    r.outcome = StepOutcome::Diverged;
  }
  return true;
}

// The smoke test records a divergence instead of judging it.
bool StepRunner::diverged(int64_t step, StepResult& r) {
  if (!s_.opt.smoke || (std::isfinite(r.loss) && std::isfinite(r.norm))) return false;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "training diverged at step %lld: loss %g, grad norm %g (lower optim.lr, "
                "raise optim.warmup_steps or set train.grad_clip)",
                (long long)step + 1, r.loss, r.norm);
  summary_.diverged = true;
  summary_.divergence = buf;
  summary_.losses.push_back(r.loss);
  summary_.grad_norms.push_back(r.norm);
  r.outcome = StepOutcome::Diverged;
  return true;
}

// The step policy's verdict (train/step_policy.h): a flagged step skips its
// update, owes its interval's save to the next healthy step, and may roll
// the run back or stop it.
bool StepRunner::flagged(int64_t step, StepResult& r) {
  // Once per hooked step, as nan_grad: a rollback runs the step number again.
  const bool hooked = hooks_.skip_steps.erase(step + 1) > 0;
  const StepVerdict v = hooked ? policy_.flag("skipped by the test hook") : policy_.judge(r.loss, r.norm);
  if (v.flag == StepFlag::Healthy) return false;
  last_flagged_ = true;
  const std::string param =
      v.flag == StepFlag::NonFinite ? s_.models->first_nonfinite_gradient(global_params_, s_.dist->host()) : "";
  const std::string what =
      "step " + std::to_string(step + 1) + ": " + v.why + (param.empty() ? "" : "; first non-finite gradient: " + param);
  summary_.flagged_steps.push_back(step + 1);
  last_flag_ = what;
  s_.saver->owe(step + 1);
  r.outcome = StepOutcome::Flagged;
  if (v.action == StepAction::Stop)
    throw StepPolicyStop(what + " (train.nonfinite=" + policy_.mode() +
                         (policy_.mode() == "stop" ? "" : ", " + std::to_string(v.in_a_row) + " flagged steps in a row") +
                         "; the newest checkpoint holds the last healthy state)");
  if (v.action == StepAction::Rollback) {
    roll_back(step, what, std::to_string(v.in_a_row) + " flagged steps in a row", "train.nonfinite=rollback", false, r);
    return true;
  }
  if (!s_.opt.quiet)
    std::printf("%s: update skipped on every rank (%lld in a row, train.nonfinite_limit=%lld)\n", what.c_str(),
                (long long)v.in_a_row, (long long)s_.cfg.train.nonfinite_limit);
  return true;
}

// Back to the newest complete checkpoint taken while healthy; the data of the steps since is
// skipped, so the run does not meet the same batches again.
void StepRunner::roll_back(int64_t step, const std::string& what, const std::string& why, const std::string& key,
                           bool replicas, StepResult& r) {
  auto stop = [&](const std::string& msg) {
    if (replicas) throw ReplicaMismatch(msg);
    throw StepPolicyStop(msg);
  };
  s_.saver->writer().settle();
  std::optional<LoadedCheckpoint> ck;
  try {
    ck = load_resume_checkpoint(s_.ckpt_root, "auto", s_.models->states(), s_.dist->host(), s_.lead, true, trusted_step_);
  } catch (const std::exception& e) {
    stop(what + ": " + key + " could not load a checkpoint: " + e.what());
  }
  if (!ck) stop(what + ": " + key + " found no complete checkpoint under " + s_.ckpt_root);
  rollbacks_there_ = ck->meta.step == rollback_step_ ? rollbacks_there_ + 1 : 1;
  rollback_step_ = ck->meta.step;
  if (rollbacks_there_ > 2)
    stop(what + ": " + key + " went back to " + ck->dir + " twice already and the steps after it fail again, with other data");
  restore_checkpoint(*ck, s_.models->states());
  set_aside_left_timeline(s_.ckpt_root, ck->meta.step, s_.lead, s_.opt.quiet);
  s_.data_offset += step + 1 - ck->meta.step;
  s_.tokens = ck->meta.tokens;
  policy_.reset();
  summary_.rollbacks.push_back(step + 1);
  if (!s_.metrics_path.empty()) trim_metrics(s_.metrics_path, ck->meta.step);
  if (!s_.opt.quiet)
    std::printf("%s: %s, rolled back to %s (step %lld); the data of steps %lld-%lld is skipped\n", what.c_str(),
                why.c_str(), ck->dir.c_str(), (long long)ck->meta.step,
                (long long)ck->meta.step + 1, (long long)step + 1);
  r.outcome = StepOutcome::RolledBack;
  r.next_step = ck->meta.step;
  completed_ = ck->meta.step;
}

void StepRunner::apply(int64_t step, StepResult& r) {
  if (s_.dump && step == 0) s_.dump->after_step0_backward();
  r.lr = learning_rate(sched_, step);
  if (Watchdog* w = s_.dist->watchdog()) w->progress(step + 1, "optimizer step");
  window_.as_optimizer([&] { s_.models->step(r.lr, clip_factor(r.norm, s_.cfg.train.grad_clip) / r.loss_scale); });
  flip_bit_hook(step);
  scaler_.step_applied();  // only now may the scale grow: this step divided by loss_scale
  s_.tokens += s_.tokens_per_step();
  // Every step of a smoke test (its verdict reads them all); of a run, the
  // first kStepHistory: a run of a million steps must not grow by them.
  if (s_.opt.smoke || summary_.losses.size() < kStepHistory) {
    summary_.losses.push_back(r.loss);
    summary_.grad_norms.push_back(r.norm);
    summary_.loss_scales.push_back(r.loss_scale);
    summary_.step_ms.push_back(1e3 * seconds_since(t0_));
  }
  summary_.end_step = step + 1;
  if (s_.dump) s_.dump->record_step(r.loss, r.aux, r.lr, r.norm);
  r.outcome = StepOutcome::Applied;
  if (step == s_.start_step) trusted_step_ = step;  // the resumed state has run healthy
}

bool is_log_step(const Config& cfg, int64_t step, int64_t end_step) {
  return step % cfg.log.interval == 0 || step == end_step;
}

}  // namespace trainer
