#include "train/engine.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "comm/mesh.h"
#include "comm/process_group.h"
#include "core/device_memory.h"
#include "model/tp_traffic.h"
#include "pipeline/executor.h"
#include "pipeline/pipeline_plan.h"
#include "observe/pipeline_report.h"
#include "comm/timed_communicator.h"
#include "model/context_parallel.h"
#include "model/expert_load.h"
#include "model/flops.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/zero.h"
#include "optim/grad_clip.h"
#include "optim/loss_scale.h"
#include "optim/lr_schedule.h"
#include "data/batch_sampler.h"
#include "train/checkpointing.h"
#include "train/checkpoint_saver.h"
#include "train/run_lock.h"
#include "runtime/device_select.h"
#include "infer/generate.h"
#include "observe/comm_measured.h"
#include "interop/run_tokenizer.h"
#include "model/kv_cache.h"
#include "observe/metrics.h"
#include "observe/process_stats.h"
#include "planner/memory_plan.h"
#include "interop/hf_import.h"
#include "observe/recompute_report.h"
#include "data/prefetch.h"
#include "interop/reference_dump.h"
#include "observe/context_report.h"
#include "observe/expert_report.h"
#include "train/preemption.h"
#include "observe/rank_monitor.h"
#include "observe/step_time.h"
#include "train/step_policy.h"
#include "train/test_hooks.h"
#include "train/stage_models.h"
#include "runtime/distributed_run.h"
#include "runtime/watchdog.h"
#include "kernels/cpu/blas_info.h"

namespace trainer {

namespace {

using clock_type = std::chrono::steady_clock;

// Micro-batch `micro` of a batch into its activation slot of chunk `m` (held by then).
void load_prefetched(const HostBatch& hb, Model& m, int64_t micro) {
  Activations& a = activations_of(m, micro);
  const ModelDims& d = m.dims;
  if (d.cp == 1) {
    write_from_host(a.ids, hb.inputs_of(micro));
    write_from_host(a.targets, hb.targets_of(micro));
    return;
  }
  // Context parallelism: this rank's two chunks of every sequence.
  std::vector<int32_t> local(size_t(d.N()));
  zigzag_tokens(hb.inputs_of(micro), hb.micro_batch, hb.seq_len, d.cp, d.cp_rank, local.data());
  write_from_host(a.ids, local.data());
  zigzag_tokens(hb.targets_of(micro), hb.micro_batch, hb.seq_len, d.cp, d.cp_rank, local.data());
  write_from_host(a.targets, local.data());
}

// The validation batches are the same at every evaluation (read once).
// Each rank evaluates its share of the validation batches (split like a
// training step), so the loss does not depend on dp or the micro-batch size.
// The tensor-parallel ranks of a replica compute the same losses; one of
// them (`counts`) adds them to the sum over all ranks.
double evaluate(const HostBatch& hb, StageModels& stage, Communicator& pp, Communicator& host, int dp, bool counts,
                int64_t tokens_per_micro) {
  double sum = run_pipeline_forward(stage.models(), pp, hb.micro_steps, [&](Model& m, int64_t mb) {
                 load_prefetched(hb, m, mb);
               }).loss_sum;
  if (!counts) sum = 0;
  host.all_reduce(Tensor(&sum, DType::F64, {1}));
  return sum / double(hb.micro_steps * tokens_per_micro * dp);
}

// After a resume, rows logged past the checkpoint (by the run that crashed)
// would repeat steps; keep only what the resumed state has seen.
void trim_metrics(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, kept;
  while (std::getline(in, line)) {
    const auto k = line.find("\"step\": ");
    if (k != std::string::npos && std::stoll(line.substr(k + 8)) > last_step) continue;
    kept += line + "\n";
  }
  in.close();
  std::ofstream(path, std::ios::trunc) << kept;
}

}  // namespace

TrainSummary run_training(const Config& cfg, const RunOptions& opt_in) {
  RunOptions opt = opt_in;
  const DeviceChoice dev = select_device(cfg.train.device, opt.launch.local_rank);
  // Data parallelism with ZeRO stage 0-3 (optim/zero.h): every rank draws its
  // share of the global batch; gradients, optimizer state and (stage 3)
  // weights are split across the data-parallel group.
  const int stage = cfg.parallel.zero_stage;
  if (!opt.dump_reference_dir.empty() && opt.launch.launched())
    throw ConfigError("--dump-reference runs in one process");
  // Every rank checks the data's tokenizer (interop/run_tokenizer.h) before
  // any collective, so a mismatch ends each with the same exit 2.
  const std::optional<TokenizerFiles> data_tokenizer = check_data_tokenizer(cfg);
  DistributedRun dist(cfg, opt.launch, dev.device);
  const int dp = dist.dp(), dp_rank = dist.dp_rank();
  const MeshShape& mesh = dist.mesh();
  // Every tp rank of a replica computes the same loss; one of them counts it.
  const bool counts_loss = dist.coords().tp == 0;
  const int pp_stage = dist.coords().pp;
  Watchdog* watchdog = dist.watchdog();  // multi-process runs: heartbeats, and a stuck collective ends the run
  if (!opt.dump_reference_dir.empty() && stage > 0)
    throw ConfigError("--dump-reference records full gradients: run it with parallel.zero_stage=0");
  const bool lead = opt.launch.rank == 0;
  if (!lead) opt.quiet = true;
  // [ckpt-integrity] One job per run directory (train/run_lock.h): a second
  // trainer stops here with exit 2 naming the holder; held until we return.
  const RunLock run_lock(cfg, lead, dist.host());
  const DType storage = storage_dtype(cfg.train.precision, dev.device);
  if (!opt.dump_reference_dir.empty() && dev.device != Device::CPU)
    throw ConfigError("--dump-reference compares against the fp32 PyTorch reference: run it with train.device=cpu");
  if (cfg.train.threads > 0) cpu::set_cpu_threads(cfg.train.threads);
  const int threads = omp_get_max_threads();
  if (lead)
    std::printf("%s, %d thread%s%s, storage %s%s%s%s\n", dev.line.c_str(), threads, threads == 1 ? "" : "s",
                dev.device == Device::CPU ? (" (BLAS: OpenBLAS " + cpu::blas_threading() + ")").c_str() : "",
                dtype_name(storage),
                mesh.tp > 1 ? (", tensor parallel " + std::to_string(mesh.tp) + (cfg.parallel.sp ? " with sp" : ""))
                                  .c_str()
                            : "",
                mesh.cp > 1 ? (", context parallel " + std::to_string(mesh.cp) + " (zigzag chunks of " +
                               std::to_string(cfg.train.seq_len / (2 * mesh.cp)) + " tokens, ring attention)")
                                  .c_str()
                            : "",
                dp > 1 || stage > 0
                    ? (", data parallel " + std::to_string(dp) + ", ZeRO stage " + std::to_string(stage)).c_str()
                    : "");

  const int64_t micro = cfg.train.micro_batch_size;
  const int64_t M = microbatches_per_step(cfg, dp);
  const int64_t T = cfg.train.seq_len;
  const ModelDims dims = make_dims(cfg, micro, T, storage);
  // The pipeline: layers per stage and this step's schedule, checked by the
  // simulator before anything runs (pipeline/).
  const int chunks = pipeline_chunks(cfg);
  const std::vector<int64_t> stage_layers = stage_layers_for(cfg, dims, mesh.pp * chunks);
  const Schedule schedule = schedule_for(cfg, mesh.pp, M);
  const Simulation simulated = simulate(schedule, stage_action_costs(dims, stage_layers, mesh.pp));
  if (!simulated.ok) throw std::logic_error("pipeline schedule: " + simulated.error);

  TrainSummary summary;
  const MemoryPlan plan = plan_memory(cfg, storage, mesh, dist.coords(), stage);
  summary.planned_bytes = plan.total();
  summary.device_bytes = dev.memory_bytes;
  if (lead) std::printf("%s", format_memory_plan(plan, device_name(dev.device), storage).c_str());
  if (lead && dp > 1) std::printf("%s", format_zero_stages(cfg, storage, mesh, dist.coords(), stage).c_str());
  if (lead) std::printf("%s", format_sp_activations(cfg, storage, mesh, dist.coords(), stage).c_str());
  if (lead) std::printf("%s", format_recompute_trade(cfg, storage, mesh, dist.coords(), stage).c_str());
  if (dev.memory_bytes > 0 && plan.total() > dev.memory_bytes)
    throw std::runtime_error("the memory plan needs " + format_bytes(double(plan.total())) + " per GPU, the device has " +
                             format_bytes(double(dev.memory_bytes)) +
                             ": lower train.micro_batch_size (more micro-batches keep the global batch)");
  if (lead) {
    std::string extra = dims.E > 0 ? ", MoE " + std::to_string(dims.E) + " experts top-" + std::to_string(dims.K) : "";
    if (dims.window > 0)
      extra += ", sliding window " + std::to_string(dims.window) +
               (dims.window >= cfg.train.seq_len - 1 ? " (covers train.seq_len: full causal attention)" : "");
    std::printf("model: %s, %lld layers, d_model %lld, heads %lld/%lld, ffn %lld%s\n", cfg.model.arch.c_str(),
                (long long)dims.L, (long long)dims.C, (long long)dims.Hq, (long long)dims.Hkv, (long long)dims.F,
                extra.c_str());
  }
  if (lead) std::printf("batch: %lld sequences x %lld tokens = %lld tokens/step (%lld micro-batch%s of %lld)\n",
              (long long)cfg.train.global_batch_size, (long long)T,
              (long long)(cfg.train.global_batch_size * T), (long long)M, M == 1 ? "" : "es",
              (long long)micro);

  BatchSampler train_data(cfg.data.train, cfg.data.dtype, T, cfg.model.vocab_size, cfg.run.seed,
                          "train", cfg.data.format);
  std::unique_ptr<HostBatch> valid_batch;
  if (!cfg.data.valid.empty()) {
    const BatchSampler valid_data(cfg.data.valid, cfg.data.dtype, T, cfg.model.vocab_size, cfg.run.seed, "valid",
                                  cfg.data.format);
    valid_batch = std::make_unique<HostBatch>();
    // train.eval_steps batches of global_batch_size sequences, this rank's
    // share in the order of a training step.
    std::vector<int64_t> valid_indices;
    for (int64_t mb = 0; mb < cfg.train.eval_steps * M; ++mb)
      for (int64_t b = 0; b < micro; ++b) valid_indices.push_back(mb * micro * dp + dp_rank * micro + b);
    fill_batch(valid_data, valid_indices, 0, cfg.train.eval_steps * M, micro, *valid_batch);
  }
  if (lead) std::printf("data: %s", train_data.describe().c_str());  // describe() ends each entry with a newline
  // Sequence (mb, b) of this rank is global sequence mb*B*dp + dp_rank*B + b:
  // the union over ranks is the single-process batch, whatever dp is.
  std::vector<int64_t> indices;
  for (int64_t mb = 0; mb < M; ++mb)
    for (int64_t b = 0; b < micro; ++b) indices.push_back(mb * micro * dp + dp_rank * micro + b);
  // The next step's tokens are read in a background thread while this step computes.
  BatchPrefetcher prefetch(train_data, M, micro, indices);

  // The one layout of this rank (model/sharding.h): storage, optimizer and
  // checkpoints all follow it.
  // This rank's model chunks (one, or pp_virtual interleaved), each with
  // its ZeRO optimizer, as the sharding plan lays them out.
  const std::vector<ShardingPlan> plans = chunk_plans(dims, cfg.model.init_std, mesh, dist.coords(), stage,
                                                      cfg.parallel.sp, stage_layers, chunks);
  Communicator& pp_group = dist.pp_group();
  Communicator& host = dist.host();
  StageModels models(plans, dev.device, stage, simulated.peak_chunk_slots[size_t(pp_stage)],
                     stage_groups(dist), adamw_config(cfg));
  Model& model = models.model(0);
  if (lead && mesh.pp > 1) std::printf("%s", format_pipeline(cfg, dims, stage_layers, schedule, simulated, storage, mesh).c_str());
  if (lead) std::printf("%s", format_tp_traffic(tp_traffic(plans, M)).c_str());
  if (lead && dims.E > 0)
    std::printf("%s", format_moe_routing(plans.front().local, cfg.model.moe.capacity_factor, dp).c_str());
  if (lead && mesh.ep > 1) std::printf("%s", format_expert_plan(expert_plan(plans), M).c_str());
  if (lead && mesh.cp > 1) std::printf("%s", format_context_plan(plans.front(), M).c_str());
  if (cfg.model.init_from.empty()) {
    models.initialise(cfg.run.seed);
  } else {
    // Every rank reads the whole directory and keeps its own pieces.
    std::vector<std::string> notes;
    models.initialise_from(load_init_weights(cfg, &notes));
    if (lead) std::printf("init: weights from %s (fresh optimizer state)\n", cfg.model.init_from.c_str());
    if (lead)
      for (const std::string& n : notes) std::printf("%s\n", n.c_str());
  }
  summary.optimizer_bytes = models.optimizer_bytes();
  // The plan (and `trainer plan`, which prints the same ledger) is what the
  // run holds: the three states ZeRO shards, to the byte.
  if (models.optimizer_bytes() != plan.optimizer_bytes || models.param_bytes() != plan.param_bytes ||
      models.grad_bytes() != plan.grad_bytes)
    throw std::logic_error("memory plan and allocation disagree: parameters " + std::to_string(plan.param_bytes) +
                           " planned, " + std::to_string(models.param_bytes()) + " allocated; gradients " +
                           std::to_string(plan.grad_bytes) + " / " + std::to_string(models.grad_bytes()) +
                           "; optimizer " + std::to_string(plan.optimizer_bytes) + " / " +
                           std::to_string(models.optimizer_bytes()));
  if (lead)
    std::printf("memory plan = allocation: parameters %zu, gradients %zu, optimizer %zu bytes\n", plan.param_bytes,
                plan.grad_bytes, plan.optimizer_bytes);

  const std::string run_dir = cfg.run_dir();
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) throw std::runtime_error(run_dir + ": cannot create run directory: " + ec.message());
  if (lead && data_tokenizer) {
    record_tokenizer(*data_tokenizer, run_dir);
    const std::unique_ptr<Tokenizer> t = load_tokenizer(*data_tokenizer);
    std::printf("tokenizer: %s%s%s, vocabulary %lld (model.vocab_size %lld), copied to %s/tokenizer/\n",
                data_tokenizer->kind.c_str(), data_tokenizer->file.empty() ? "" : " ",
                data_tokenizer->file.c_str(),
                (long long)(t->vocab_size() > 0 ? t->vocab_size() : data_tokenizer->info_vocab),
                (long long)cfg.model.vocab_size, run_dir.c_str());
    if (!t->warning.empty()) std::printf("warning: %s\n", t->warning.c_str());
  }

  const std::string ckpt_root = checkpoint_root(cfg);
  int64_t start_step = 0, tokens = 0;
  int64_t data_offset = 0;  // data steps skipped by rollbacks (checkpoint meta data_offset)
  if (auto ck = load_resume_checkpoint(ckpt_root, cfg.checkpoint.resume, models.states(), host, lead)) {
    restore_checkpoint(*ck, models.states());
    start_step = ck->meta.step;
    tokens = ck->meta.tokens;
    data_offset = ck->meta.data_offset;
    if (lead) std::printf("resumed from %s at step %lld (%lld tokens seen)\n", ck->dir.c_str(),
                (long long)start_step, (long long)tokens);
  } else if (cfg.checkpoint.resume == "auto" && lead) {
    std::printf("checkpoint: no complete checkpoint under %s, starting from step 0\n", ckpt_root.c_str());
  }
  summary.start_step = summary.end_step = start_step;
  const std::string metrics_path = cfg.log.jsonl && lead ? run_dir + "/metrics.jsonl" : "";
  if (!metrics_path.empty() && start_step > 0) trim_metrics(metrics_path, start_step);
  MetricsLog log(metrics_path, start_step > 0, lead ? cfg.log.progress : "lines",
                 lead && cfg.log.tensorboard ? run_dir + "/tensorboard" : "");  // log.tensorboard (observe/tensorboard.h)

  // Every rank writes its shard; rank 0 adds the manifest once all are in.
  // There is a writer even without periodic saves: a preemption saves too.
  // A failed save stops or is reported per checkpoint.on_save_error
  // (train/checkpoint_saver.h).
  const auto writer = std::make_unique<CheckpointSaver>(
      ckpt_root, cfg.checkpoint.keep_last, cfg.checkpoint.async,
      CheckpointGroup{dist.store(), opt.launch.rank, opt.launch.world_size, cfg.parallel.timeout_s},
      cfg.checkpoint.on_save_error, lead);

  std::unique_ptr<ReferenceDump> dump;
  if (!opt.dump_reference_dir.empty())
    dump = std::make_unique<ReferenceDump>(opt.dump_reference_dir, cfg, model, M);

  LrSchedule sched{cfg.optim.schedule, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps,
                   cfg.optim.decay_steps > 0 ? cfg.optim.decay_steps : cfg.train.steps};
  // fp16 has too little range for small gradients: dynamic loss scaling
  // (optim/loss_scale.h); train.loss_scaling: dynamic turns it on for any
  // precision (exact in fp32 and bf16, so the run is unchanged).
  const bool scaling = cfg.train.loss_scaling == "dynamic" || (cfg.train.loss_scaling == "auto" && storage == DType::F16);
  LossScaler scaler(scaling, cfg.train.initial_loss_scale, cfg.train.loss_scale_window);
  const int64_t end_step = opt.stop_after > 0 ? std::min(opt.stop_after, cfg.train.steps) : cfg.train.steps;
  ExpertLoad expert_load;  // per MoE layer and expert, on the steps that log
  auto window_start = clock_type::now();
  int64_t window_tokens = 0, window_steps = 0;
  double window_wait_s = 0;  // time this rank waited for pipeline neighbours
  install_preemption_handlers();
  const TestHooks hooks = test_hooks_for(opt.launch.rank);
  StepPolicy policy(cfg.train);
  const std::vector<ParamInfo> global_params = single_plan(dims, cfg.model.init_std).params;
  bool preempt = false;       // the ranks agreed to stop after this step
  bool last_flagged = false;  // the last step run was flagged by the policy (nothing may be saved from it)
  bool save_pending = false;  // a flagged step's interval save, owed by the next healthy step
  int64_t completed = start_step;  // steps run, applied or skipped
  bool nan_fired = false;
  // Rollbacks to the same checkpoint in a row: the third means the fault is
  // not in the data, and the run stops.
  int64_t rollback_step = -1, rollbacks_there = 0;
  // Where the time went (observe/step_time.h), per log window and for the run.
  auto seconds_since = [](clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); };
  const auto& timed = dist.timed_groups();
  auto comm_now = [&] {
    StepTime t;
    for (const auto& g : timed) t.add_comm(g->label(), g->blocked_seconds());
    return t;
  };
  StepTime window_parts, run_parts;
  // The optimizer's share of a step: its wall time less what its
  // collectives blocked (those count for their group).
  auto as_optimizer = [&](auto&& work) {
    const auto t = clock_type::now();
    const double blocked = total_blocked_seconds();
    work();
    window_parts.optimizer += seconds_since(t) - (total_blocked_seconds() - blocked);
  };
  StepTime window_comm0 = comm_now(), run_comm0 = window_comm0;
  // Bytes each group moves in the steps of this run (observe/comm_measured.h).
  const std::vector<CommBytes> run_bytes0 = comm_bytes_now(timed);
  auto window_wall0 = clock_type::now(), run_wall0 = window_wall0;
  int64_t window_iterations = 0, run_iterations = 0;
  auto comm_delta = [&](const StepTime& from) {
    StepTime d;
    const StepTime now = comm_now();
    for (size_t i = 0; i < now.comm.size(); ++i) d.add_comm(now.comm[i].first, now.comm[i].second - from.comm[i].second);
    return d;
  };
  const double model_flops = flops_per_token(dims);  // the planner's count too (model/flops.h)
  const double peak = peak_tflops(dev.line, storage != DType::F32, cfg.train.peak_tflops);
  RankMonitor monitor(host, opt.launch.local_rank, cfg.log, lead ? run_dir : "", start_step > 0);

  if (lead) {
    const double age = process_age_seconds();
    if (age >= 0) std::printf("start-up: %.2f s from process start to step %lld\n", age, (long long)start_step + 1);
  }

  // A failed collective ends the run on every rank naming the step, the
  // phase and the heartbeats (runtime/watchdog.h).
  try {
    for (int64_t step = start_step; step < end_step; ++step) {
      if (preempt) break;
      ++window_iterations;
      ++run_iterations;
      if (hooks.kill_step == step + 1) ::raise(SIGKILL);
      if (hooks.signal_step == step + 1) ::raise(SIGTERM);
      const auto t0 = clock_type::now();
      if (watchdog) watchdog->progress(step + 1, "forward/backward");
      // Zeroing the gradients and (below) their norm are the optimizer's
      // work, as zero_grad and clip_grad_norm_ are in PyTorch, not "other".
      as_optimizer([&] { models.begin_step(); });
      const double loss_scale = scaler.scale();
      const float ce_scale = float(loss_scale / double(M * dims.N() * dp));
      if (hooks.nan_grad_step == step + 1 && !nan_fired) {
        models.zero(0).poison_next_gradient();
        nan_fired = true;  // once: a rollback runs the step number again
      }
      // The load-balancing loss is each micro-batch's (its whole sequences,
      // which every cp rank holds the statistics of): their mean over the
      // step. Each cp rank differentiates it for its own tokens, so the
      // gradient is not divided by cp (model/moe_routing_plan.h).
      const float aux_grad = float(loss_scale * double(dims.aux_coeff) / double(M * dp));
      const auto d0 = clock_type::now();
      const HostBatch& batch = prefetch.get(step + data_offset);
      window_parts.data += seconds_since(d0);
      // The steps that log also count each expert's tokens.
      const bool log_step = (step + 1) % cfg.log.interval == 0 || step + 1 == end_step;
      if (dims.E > 0) {
        expert_load.reset(dims.L, dims.E);
        for (Model* m : models.models()) m->expert_load = log_step ? &expert_load : nullptr;
      }
      // This rank's actions of the schedule (one process: 1F1B of one stage,
      // micro-batch after micro-batch); the schedule says which backward is
      // the last of the step.
      const PipelineStepResult pr = run_pipeline_step(models.models(), pp_group, schedule.ranks[size_t(pp_stage)],
                                                      ce_scale, aux_grad, [&](Model& m, int64_t mb) {
                                                        load_prefetched(batch, m, mb);
                                                        if (dump) dump->before_forward(step, mb);
                                                      });
      for (Model* m : models.models()) m->expert_load = nullptr;
      if (hooks.delay_ms > 0) {
        // A slow device, on purpose: counted as compute.
        const auto s0 = clock_type::now();
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(hooks.delay_ms));
        window_parts.forward += seconds_since(s0);
      }
      window_parts.forward += pr.forward_s;
      window_parts.backward += pr.backward_s;
      double loss_sum = pr.loss_sum, aux_sum = pr.aux_sum;
      window_wait_s += pr.wait_s;
      if (watchdog) watchdog->progress(step + 1, "gradient reduction");
      models.finish_backward();  // the unit reductions overlapped backward; the last ones land here
      // The loss sums carry the ranks' stop requests (train/preemption.h):
      // all ranks learn of a signal at the same step.
      preempt = preemption_requests() > 0;
      if (dist.launched()) {
        double sums[3] = {counts_loss ? loss_sum : 0, counts_loss ? aux_sum : 0, preempt ? 1.0 : 0.0};
        host.all_reduce(Tensor(sums, DType::F64, {3}));
        loss_sum = sums[0];
        aux_sum = sums[1];
        preempt = sums[2] > 0;
      }
      completed = step + 1;
      const double loss = loss_sum / double(M * dims.N() * dp);
      const double aux = aux_sum / double(M * dp * mesh.cp);  // each cp rank reports the same, whole value
      double norm = 0;
      as_optimizer([&] { norm = std::sqrt(models.grad_sum_squares()) / loss_scale; });
      if (scaler.enabled() && (!std::isfinite(norm) || !std::isfinite(loss))) {
        scaler.overflow();
        summary.skipped_steps.push_back(step + 1);
        if (!opt.quiet)
          std::printf("step %lld: gradient overflow at loss scale %g, step skipped, loss scale -> %g\n",
                      (long long)step + 1, loss_scale, scaler.scale());
        if (scaler.scale() < 1.0) {
          const char* why = "the loss scale fell below 1: the gradients overflow at any scale";
          if (!opt.smoke)
            throw std::runtime_error(std::string(why) + (storage == DType::F16 ? "; use train.precision=bf16" : ""));
          summary.diverged = true;
          summary.divergence = why;
          break;
        }
        continue;
      }
      if (opt.smoke && (!std::isfinite(loss) || !std::isfinite(norm))) {
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "training diverged at step %lld: loss %g, grad norm %g (lower optim.lr, "
                      "raise optim.warmup_steps or set train.grad_clip)",
                      (long long)step + 1, loss, norm);
        summary.diverged = true;
        summary.divergence = buf;
        summary.losses.push_back(loss);
        summary.grad_norms.push_back(norm);
        break;
      }
      last_flagged = false;
      if (!opt.smoke) {
        const StepVerdict v = hooks.skip_step == step + 1 ? policy.flag("skipped by the test hook")
                                                          : policy.judge(loss, norm);
        if (v.flag != StepFlag::Healthy) {
          last_flagged = true;
          const std::string param = v.flag == StepFlag::NonFinite ? models.first_nonfinite_gradient(global_params, host) : "";
          const std::string what = "step " + std::to_string(step + 1) + ": " + v.why +
                                   (param.empty() ? "" : "; first non-finite gradient: " + param);
          summary.flagged_steps.push_back(step + 1);
          if (writer && cfg.checkpoint.interval > 0 && (step + 1) % cfg.checkpoint.interval == 0) save_pending = true;
          if (v.action == StepAction::Stop)
            throw StepPolicyStop(what + " (train.nonfinite=" + policy.mode() +
                                 (policy.mode() == "stop" ? "" : ", " + std::to_string(v.in_a_row) + " flagged steps in a row") +
                                 "; the newest checkpoint holds the last healthy state)");
          if (v.action == StepAction::Rollback) {
            // Back to the newest complete checkpoint; the data of the steps
            // since is skipped, so the run does not meet the same batches again.
            if (writer) writer->settle();
            std::optional<LoadedCheckpoint> ck;
            try {
              ck = load_resume_checkpoint(ckpt_root, "auto", models.states(), host, lead);
            } catch (const std::exception& e) {
              throw StepPolicyStop(what + ": train.nonfinite=rollback could not load a checkpoint: " + e.what());
            }
            if (!ck)
              throw StepPolicyStop(what + ": train.nonfinite=rollback found no complete checkpoint under " + ckpt_root);
            rollbacks_there = ck->meta.step == rollback_step ? rollbacks_there + 1 : 1;
            rollback_step = ck->meta.step;
            if (rollbacks_there > 2)
              throw StepPolicyStop(what + ": train.nonfinite=rollback went back to " + ck->dir +
                                   " twice already and the steps after it fail again, with other data");
            restore_checkpoint(*ck, models.states());
            data_offset += step + 1 - ck->meta.step;
            tokens = ck->meta.tokens;
            policy.reset();
            summary.rollbacks.push_back(step + 1);
            if (!metrics_path.empty()) trim_metrics(metrics_path, ck->meta.step);
            if (!opt.quiet)
              std::printf("%s: %lld flagged steps in a row, rolled back to %s (step %lld); the data of steps %lld-%lld "
                          "is skipped\n",
                          what.c_str(), (long long)v.in_a_row, ck->dir.c_str(), (long long)ck->meta.step,
                          (long long)ck->meta.step + 1, (long long)step + 1);
            step = ck->meta.step - 1;
            completed = ck->meta.step;
            continue;
          }
          if (!opt.quiet)
            std::printf("%s: update skipped on every rank (%lld in a row, train.nonfinite_limit=%lld)\n", what.c_str(),
                        (long long)v.in_a_row, (long long)cfg.train.nonfinite_limit);
          continue;
        }
      }
      if (dump && step == 0) dump->after_step0_backward();
      const double lr = learning_rate(sched, step);
      if (watchdog) watchdog->progress(step + 1, "optimizer step");
      as_optimizer([&] { models.step(lr, clip_factor(norm, cfg.train.grad_clip) / loss_scale); });
      scaler.step_applied();  // only now may the scale grow: this step divided by loss_scale
      const int64_t step_tokens = M * dims.N() * dp;
      tokens += step_tokens;
      window_tokens += step_tokens;
      window_steps += 1;
      summary.losses.push_back(loss);
      summary.grad_norms.push_back(norm);
      summary.loss_scales.push_back(loss_scale);
      summary.step_ms.push_back(1e3 * std::chrono::duration<double>(clock_type::now() - t0).count());
      summary.end_step = step + 1;
      if (dump) dump->record_step(loss, aux, lr, norm);

      const bool last = step + 1 == end_step;
      const double secs = std::chrono::duration<double>(clock_type::now() - window_start).count();
      StepMetrics sm;
      sm.step = step + 1;
      sm.total_steps = end_step;
      sm.loss = loss;
      sm.aux_loss = aux;
      sm.has_aux = dims.E > 0;
      sm.loss_scale = scaler.enabled() ? loss_scale : 0;
      sm.lr = lr;
      sm.grad_norm = norm;
      sm.tokens = tokens;
      sm.tokens_per_s = double(window_tokens) / secs;
      sm.ms_per_step = 1e3 * secs / double(window_steps);
      sm.tflops = model_flops * sm.tokens_per_s / double(opt.launch.world_size) / 1e12;
      sm.mfu = peak > 0 ? sm.tflops / peak : -1;
      if ((step + 1) % cfg.log.interval == 0 || last) {
        log.step(sm, !opt.quiet);
        {
          // The window's parts per step, and every rank's report to rank 0.
          StepTime w = window_parts;
          for (const auto& [g, t] : comm_delta(window_comm0).comm) w.add_comm(g, t);
          const StepTime per = per_step(w, seconds_since(window_wall0), window_iterations);
          run_parts += window_parts;
          if (lead) log.record("{\"step\": " + std::to_string(step + 1) + ", " + step_time_json(per) + "}");
          RankReport rr;
          rr.tokens_per_s = sm.tokens_per_s / double(opt.launch.world_size);
          rr.step_ms = 1e3 * seconds_since(window_wall0) / double(window_iterations);
          rr.grad_norm = std::sqrt(models.local_grad_sum_squares()) / loss_scale;
          rr.time = per;
          const std::string alerts = monitor.report(step + 1, rr);
          if (lead && !alerts.empty()) std::printf("%s", alerts.c_str());
          window_parts = StepTime{};
          window_comm0 = comm_now();
          window_wall0 = clock_type::now();
          window_iterations = 0;
        }
        if (dims.E > 0) {
          sum_expert_load(expert_load, host, mesh.tp);
          const std::vector<LayerLoad> loads = layer_loads(expert_load);
          if (lead && !opt.quiet) std::printf("%s", format_expert_load(loads).c_str());
          if (lead) log.record(expert_load_json(step + 1, loads));
        }
        // Theory against reality: the share of the window each stage spent
        // waiting for its neighbours, next to the simulator's bubble.
        if (mesh.pp > 1) {
          const double mine = window_wait_s / secs;
          std::vector<double> idle(size_t(opt.launch.world_size), 0);
          host.all_gather(Tensor(idle.data(), DType::F64, {int64_t(idle.size())}), Tensor(const_cast<double*>(&mine), DType::F64, {1}));
          if (lead && !opt.quiet) std::printf("%s", format_pipeline_idle(mesh, idle, simulated).c_str());
        }
        window_wait_s = 0;
        window_start = clock_type::now();
        window_tokens = window_steps = 0;
      } else if (!opt.quiet) {
        log.progress(sm);
      }
      if (writer && cfg.checkpoint.interval > 0 && ((step + 1) % cfg.checkpoint.interval == 0 || last || save_pending)) {
        save_pending = false;
        const auto k0 = clock_type::now();
        if (watchdog) watchdog->progress(step + 1, "checkpoint");
        const auto c0 = clock_type::now();
        Snapshot snap = take_snapshot(cfg, models.states(), step + 1, tokens, opt.launch.rank, opt.launch.world_size);
        snap.meta.data_offset = data_offset;
        const double snap_ms = 1e3 * std::chrono::duration<double>(clock_type::now() - c0).count();
        const std::string name = ckpt_root + "/" + checkpoint_dir_name(step + 1);
        const bool started = writer->save(std::move(snap));  // [ckpt-integrity] false: failed, on_save_error=continue
        if (started) summary.checkpoints.push_back(name);
        if (started && !opt.quiet)
          std::printf("checkpoint: %s snapshot taken in %.1f ms, %s\n", name.c_str(), snap_ms,
                      cfg.checkpoint.async ? "writing in the background while training continues"
                                           : "written");
        window_start = clock_type::now();
        window_parts.checkpoint += seconds_since(k0);
      }
      // Every rank evaluates: under ZeRO-3 the forward gathers weights from all.
      if (valid_batch && ((cfg.train.eval_interval > 0 && (step + 1) % cfg.train.eval_interval == 0) || last)) {
        if (watchdog) watchdog->progress(step + 1, "evaluation");
        const auto e0 = clock_type::now();
        const double eb0 = total_blocked_seconds();
        const double vl = evaluate(*valid_batch, models, pp_group, host, dp, counts_loss, dims.N());
        summary.val_losses.push_back(vl);
        summary.final_val_loss = vl;
        if (lead) log.eval(step + 1, vl);
        window_start = clock_type::now();  // eval time is not training throughput
        window_parts.eval += seconds_since(e0) - (total_blocked_seconds() - eb0);
      }
    }
    if (preempt && completed < end_step) {
      // Every rank stops after the same step and saves it, unless the
      // policy flagged it (then the newest checkpoint stays the last one).
      summary.preempted = true;
      if (lead)
        std::printf("preemption: %s, all ranks stop after step %lld%s; relaunch with checkpoint.resume=auto to "
                    "continue (exit code %d)\n",
                    preemption_requests() > 0 ? (std::string(preemption_signal()) + " received").c_str()
                                              : "another rank received a signal",
                    (long long)completed, last_flagged ? " (flagged by train.nonfinite: not saved)" : ", saving it",
                    kPreemptedExitCode);
      if (!last_flagged && writer) {
        if (watchdog) watchdog->progress(completed, "checkpoint");
        const bool already = !summary.checkpoints.empty() &&
                             summary.checkpoints.back() == ckpt_root + "/" + checkpoint_dir_name(completed);
        if (!already) {
          Snapshot snap = take_snapshot(cfg, models.states(), completed, tokens, opt.launch.rank, opt.launch.world_size);
          snap.meta.data_offset = data_offset;
          writer->save(std::move(snap));
          summary.checkpoints.push_back(ckpt_root + "/" + checkpoint_dir_name(completed));
        }
      }
    }
    if (lead && !opt.quiet && run_iterations > 0) {
      StepTime all = run_parts;
      all += window_parts;
      for (const auto& [g, t] : comm_delta(run_comm0).comm) all.add_comm(g, t);
      std::printf("%s", format_step_time(all, seconds_since(run_wall0), run_iterations).c_str());
      // On the CPU the plan is the process's memory, less the program, its
      // libraries and their buffers: the difference says how much that is.
      if (const size_t peak = peak_resident_bytes(); peak > 0 && dev.device == Device::CPU)
        std::printf("peak resident memory: %.0f MiB, memory plan %.0f MiB (%+.0f MiB)\n", double(peak) / (1 << 20),
                    double(plan.total()) / (1 << 20), (double(peak) - double(plan.total())) / (1 << 20));
    }
    if (run_iterations > 0 && !preempt) {
      // Collective over the host group: every rank gets here after the same steps.
      std::string json;
      const std::string measured = comm_measured_report(timed, run_bytes0, run_iterations, host, &json);
      if (lead && !opt.quiet) std::printf("%s", measured.c_str());
      if (lead && !measured.empty()) log.record(json);
    }
    if (watchdog) watchdog->progress(summary.end_step, "finishing");
    if (writer) {
      writer->wait();
      if (!opt.quiet && !writer->last_completed().empty())
        std::printf("checkpoint: latest complete is %s\n", writer->last_completed().c_str());
    }
  } catch (...) {
    if (watchdog) watchdog->rethrow_failure();  // adds step, phase, heartbeats; rank 0 keeps the store up briefly
    throw;
  }
  if (dump) dump->finish();
  if (opt.after_run && !summary.diverged)
    opt.after_run(FinishedRun{cfg, opt.launch, plans, models, summary.end_step, tokens, ckpt_root, dist}, summary);
  // The smoke test judges the pace of the job: a step takes as long as its
  // slowest rank, and every rank must reach the same verdict.
  if (opt.smoke && dist.launched() && !summary.step_ms.empty())
    host.all_reduce(Tensor(summary.step_ms.data(), DType::F64, {int64_t(summary.step_ms.size())}), ReduceOp::Max);

  std::vector<std::vector<float>> final_weights;
  const bool sample = cfg.log.sample_tokens > 0 && !summary.diverged && !opt.smoke;
  if (sample) final_weights = models.gather_fp32_weights(single_plan(dims, cfg.model.init_std).params);  // collective
  dist.finish();
  if (sample && lead) {
    // The data's tokenizer encodes the prompt and decodes the text; the
    // key/value cache makes each token one token's forward (model/kv_cache.h).
    const std::unique_ptr<Tokenizer> tok = tokenizer_or_fallback(data_tokenizer, cfg.model.vocab_size);
    std::vector<int32_t> prompt;
    if (tok->encodes_text()) {
      prompt = tok->encode(cfg.log.sample_prompt);
    } else if (!tok->warning.empty()) {
      std::printf("warning: %s; log.sample_prompt is not used\n", tok->warning.c_str());
    }
    KvDecoder decoder(dims, final_weights, T, Device::CPU);
    SamplingOptions so;
    so.temperature = float(cfg.log.sample_temperature);
    so.seed = cfg.run.seed;
    const auto ids = generate_cached(decoder, prompt, cfg.log.sample_tokens, so);
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), ids.begin(), ids.end());
    summary.sample = tok->decode(all);
    std::printf("\nsample (temperature %.2f, %d tokens):\n%s\n", cfg.log.sample_temperature,
                cfg.log.sample_tokens, summary.sample.c_str());
  }
  return summary;
}

}  // namespace trainer
