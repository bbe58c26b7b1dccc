#include "trainer/engine.h"

#include <omp.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include "kernels/ops.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"
#include "trainer/batch_sampler.h"
#include "trainer/device_select.h"
#include "trainer/metrics.h"
#include "trainer/plan.h"
#include "trainer/reference_dump.h"

extern "C" void openblas_set_num_threads(int);

namespace trainer {

namespace {

struct StepBatches {
  int64_t micro_steps = 1;
  int64_t micro_batch = 1;
};

void load_micro_batch(const BatchSampler& s, Model& m, int64_t step, int64_t micro) {
  const ModelDims& d = m.dims;
  int32_t* ids = m.acts.ids.i32();
  int32_t* tg = m.acts.targets.i32();
  for (int64_t b = 0; b < d.B; ++b)
    s.sequence(step, micro * d.B + b, ids + b * d.T, tg + b * d.T);
}

double evaluate(const BatchSampler& s, Model& m, int eval_steps) {
  double sum = 0;
  for (int i = 0; i < eval_steps; ++i) {
    load_micro_batch(s, m, 0, i);
    sum += model_forward(m, 0.f).loss_sum;
  }
  return sum / double(eval_steps * m.dims.N());
}

}  // namespace

TrainSummary run_training(const Config& cfg, const RunOptions& opt) {
  const DeviceChoice dev = select_device(cfg.train.device);
  if (cfg.train.threads > 0) {
    omp_set_num_threads(cfg.train.threads);
    openblas_set_num_threads(cfg.train.threads);
  }
  const int threads = omp_get_max_threads();
  std::printf("%s, %d thread%s\n", dev.line.c_str(), threads, threads == 1 ? "" : "s");

  const int dp = 1;
  const int64_t micro = cfg.train.micro_batch_size;
  const int64_t M = cfg.train.global_batch_size / (micro * dp);
  const int64_t T = cfg.train.seq_len;
  const ModelDims dims = make_dims(cfg, micro, T);

  const MemoryPlan plan = plan_memory(cfg);
  std::printf("%s", format_plan(plan, device_name(dev.device)).c_str());
  std::printf("model: %s, %lld layers, d_model %lld, heads %lld/%lld, ffn %lld%s\n",
              cfg.model.arch.c_str(), (long long)dims.L, (long long)dims.C, (long long)dims.Hq,
              (long long)dims.Hkv, (long long)dims.F,
              dims.E > 0 ? (", MoE " + std::to_string(dims.E) + " experts top-" +
                            std::to_string(dims.K))
                               .c_str()
                         : "");
  std::printf("batch: %lld sequences x %lld tokens = %lld tokens/step (%lld micro-batches of %lld)\n",
              (long long)cfg.train.global_batch_size, (long long)T,
              (long long)(cfg.train.global_batch_size * T), (long long)M, (long long)micro);

  BatchSampler train_data(cfg.data.train, cfg.data.dtype, T, cfg.model.vocab_size, cfg.run.seed, "train");
  std::unique_ptr<BatchSampler> valid_data;
  if (!cfg.data.valid.empty())
    valid_data = std::make_unique<BatchSampler>(cfg.data.valid, cfg.data.dtype, T,
                                                cfg.model.vocab_size, cfg.run.seed, "valid");

  Model model;
  build_model(model, dims, cfg.model.init_std, dev.device);
  init_parameters(model.params, model.param_tensors, cfg.run.seed);
  AdamWState opt_state;
  adamw_init(opt_state, {cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps, cfg.optim.weight_decay},
             model.params, dev.device);

  const std::string run_dir = cfg.run_dir();
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) throw std::runtime_error(run_dir + ": cannot create run directory: " + ec.message());
  MetricsLog log(cfg.log.jsonl ? run_dir + "/metrics.jsonl" : "");

  std::unique_ptr<ReferenceDump> dump;
  if (!opt.dump_reference_dir.empty())
    dump = std::make_unique<ReferenceDump>(opt.dump_reference_dir, cfg, model, M);

  LrSchedule sched{cfg.optim.schedule, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps,
                   cfg.optim.decay_steps > 0 ? cfg.optim.decay_steps : cfg.train.steps};
  const float ce_scale = float(1.0 / double(M * dims.N()));
  const float aux_grad = float(double(dims.aux_coeff) / double(M));
  TrainSummary summary;
  int64_t tokens = 0;
  using clock = std::chrono::steady_clock;
  auto window_start = clock::now();
  int64_t window_tokens = 0, window_steps = 0;

  for (int64_t step = 0; step < cfg.train.steps; ++step) {
    zero_grads(model);
    double loss_sum = 0, aux_sum = 0;
    for (int64_t mb = 0; mb < M; ++mb) {
      load_micro_batch(train_data, model, step, mb);
      if (dump) dump->before_forward(step, mb);
      ForwardResult fr = model_forward(model, ce_scale);
      loss_sum += fr.loss_sum;
      aux_sum += fr.aux_sum;
      model_backward(model, aux_grad);
    }
    const double loss = loss_sum / double(M * dims.N());
    const double aux = aux_sum / double(M);
    const double norm = global_grad_norm(model.grad_tensors);
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "training diverged at step %lld: loss %g, grad norm %g (lower optim.lr, "
                    "raise optim.warmup_steps or set train.grad_clip)",
                    (long long)step + 1, loss, norm);
      throw std::runtime_error(buf);
    }
    if (dump && step == 0) dump->after_step0_backward();
    const double lr = learning_rate(sched, step);
    adamw_step(opt_state, model.params, model.param_tensors, model.grad_tensors, lr,
               clip_factor(norm, cfg.train.grad_clip));
    tokens += M * dims.N() * dp;
    window_tokens += M * dims.N() * dp;
    window_steps += 1;
    summary.losses.push_back(loss);
    if (dump) dump->record_step(loss, aux, lr, norm);

    const bool last = step + 1 == cfg.train.steps;
    if ((step + 1) % cfg.log.interval == 0 || last) {
      const double secs = std::chrono::duration<double>(clock::now() - window_start).count();
      StepMetrics sm;
      sm.step = step + 1;
      sm.total_steps = cfg.train.steps;
      sm.loss = loss;
      sm.aux_loss = aux;
      sm.has_aux = dims.E > 0;
      sm.lr = lr;
      sm.grad_norm = norm;
      sm.tokens = tokens;
      sm.tokens_per_s = double(window_tokens) / secs;
      sm.ms_per_step = 1e3 * secs / double(window_steps);
      log.step(sm, !opt.quiet);
      window_start = clock::now();
      window_tokens = window_steps = 0;
    }
    if (valid_data && ((cfg.train.eval_interval > 0 && (step + 1) % cfg.train.eval_interval == 0) || last)) {
      const double vl = evaluate(*valid_data, model, cfg.train.eval_steps);
      summary.val_losses.push_back(vl);
      summary.final_val_loss = vl;
      log.eval(step + 1, vl);
      window_start = clock::now();  // eval time is not training throughput
    }
  }
  if (dump) dump->finish();
  return summary;
}

}  // namespace trainer
