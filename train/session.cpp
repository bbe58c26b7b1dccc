#include "train/session.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "data/batch_share.h"
#include "data/choice_task.h"
#include "interop/hf_import.h"
#include "kernels/cpu/blas_info.h"
#include "optim/adamw.h"
#include "pipeline/pipeline_plan.h"
#include "runtime/watchdog.h"
#include "train/world_change.h"
#include "train/checkpointing.h"
#include "train/micro_batch.h"
#include "train/startup_report.h"

namespace trainer {

Session::Session(const Config& c, const RunOptions& o) : cfg(c), opt(o) {
  open_run();
  plan_layout();
  open_data();
  build_models();
  open_run_dir();
  resume();
  open_outputs();
}

// The device, the process groups and the run lock, and the line that says
// what runs where.
void Session::open_run() {
  dev = select_device(cfg.train.device, opt.launch.local_rank);
  // Data parallelism with ZeRO stage 0-3 (optim/zero.h): every rank draws its
  // share of the global batch; gradients, optimizer state and (stage 3)
  // weights are split across the data-parallel group.
  zero_stage = cfg.parallel.zero_stage;
  if (!opt.dump_reference_dir.empty() && opt.launch.launched())
    throw ConfigError("--dump-reference runs in one process");
  // Every rank checks the data's tokenizer (interop/run_tokenizer.h) before
  // any collective, so a mismatch ends each with the same exit 2.
  data_tokenizer = check_data_tokenizer(cfg);
  dist = std::make_unique<DistributedRun>(cfg, opt.launch, dev.device);
  dp = dist->dp();
  counts_loss = dist->coords().tp == 0;
  counts_batch = dist->coords().tp == 0 && dist->coords().cp == 0 && dist->coords().pp == 0;
  pp_stage = dist->coords().pp;
  if (!opt.dump_reference_dir.empty() && zero_stage > 0)
    throw ConfigError("--dump-reference records full gradients: run it with parallel.zero_stage=0");
  if (!opt.dump_reference_dir.empty() && cfg.data.documents == "separate")
    throw ConfigError("--dump-reference: the PyTorch reference packs documents; run it with data.documents: packed");
  lead = opt.launch.rank == 0;
  if (!lead) opt.quiet = true;
  // [ckpt-integrity] One job per run directory (train/run_lock.h): a second
  // trainer stops here with exit 2 naming the holder; held until the session ends.
  run_lock = std::make_unique<RunLock>(cfg, lead, dist->host());
  storage = storage_dtype(cfg.train.precision, dev.device);
  if (!opt.dump_reference_dir.empty() && dev.device != Device::CPU)
    throw ConfigError("--dump-reference compares against the fp32 PyTorch reference: run it with train.device=cpu");
  if (cfg.train.threads > 0) cpu::set_cpu_threads(cfg.train.threads);
  if (lead) std::fputs(format_run_line(cfg, dev, storage, dist->mesh(), omp_get_max_threads()).c_str(), stdout);
  if (lead) std::fputs(dist->backend_line().c_str(), stdout);
  // Which groups sit inside a node (observe/placement_report.h): a tp group
  // across the network is named before it slows every step.
  places = gather_rank_places(dist->host(), opt.launch.local_rank);
  if (lead && opt.launch.world_size > 1) std::fputs(format_placement(dist->mesh(), places.host).c_str(), stdout);
  if (Watchdog* wd = dist->watchdog()) wd->set_places(places.host);
}

// The layers per stage and the step's schedule, checked by the simulator
// before anything runs (pipeline/); the memory plan, checked against the device.
void Session::plan_layout() {
  const MeshShape& mesh = dist->mesh();
  micro = cfg.train.micro_batch_size;
  M = microbatches_per_step(cfg, dp);
  T = cfg.train.seq_len;
  dims = make_dims(cfg, micro, T, storage);
  stage_layers = stage_layers_for(cfg, dims, mesh.pp * pipeline_chunks(cfg));
  schedule = schedule_for(cfg, mesh.pp, M);
  transfer_mode = transfer_mode_for(cfg, dev.device);
  simulated = simulate(schedule, stage_action_costs(dims, stage_layers, mesh.pp), transfer_mode);
  if (!simulated.ok) throw std::logic_error("pipeline schedule: " + simulated.error);
  // The activation slots as this run's executor takes them.
  plan = plan_memory(cfg, storage, mesh, dist->coords(), zero_stage, simulated.peak_chunk_slots);
  plan.in_flight = std::min(plan.activation_slots, simulated.peak_in_flight[size_t(pp_stage)]);
  if (lead) std::fputs(format_memory_report(cfg, plan, dev, storage, mesh, dist->coords()).c_str(), stdout);
  if (dev.memory_bytes > 0 && plan.total() > dev.memory_bytes)
    throw std::runtime_error("the memory plan needs " + format_bytes(double(plan.total())) + " per GPU, the device has " +
                             format_bytes(double(dev.memory_bytes)) +
                             ": lower train.micro_batch_size (more micro-batches keep the global batch)");
  if (lead) std::fputs((format_model_line(cfg, dims) + format_batch_line(cfg, M)).c_str(), stdout);
  const bool has_hardware = std::any_of(cfg.given.begin(), cfg.given.end(),
                                        [](const std::string& k) { return k.rfind("hardware.", 0) == 0; });
  if (has_hardware && lead) {
    hardware = resolve_hardware(cfg);
    predicted = estimate_step(cfg, mesh, *hardware, storage);
  }
}

// This rank's share of every step (data/batch_share.h): the union over the
// ranks is the single-process batch, whatever dp is. The validation batches
// are train.eval_steps steps' worth, split the same way and read once.
// train.eval_task, tokenized with the data's tokenizer; every rank reads it,
// so a bad file stops them all at start-up, naming its line.
void Session::open_eval_task() {
  if (cfg.train.eval_task.empty()) return;
  const std::unique_ptr<Tokenizer> tok = tokenizer_or_fallback(data_tokenizer, cfg.model.vocab_size);
  for (const ChoiceExample& e :
       read_choice_task(cfg.train.eval_task, *tok, cfg.model.vocab_size, cfg.train.eval_task_limit))
    eval_task.push_back({e.context, e.endings, e.ending_bytes, e.label});
  if (lead)
    std::printf("eval task: %s, %zu examples (acc, acc_norm at every evaluation)\n", cfg.train.eval_task.c_str(),
                eval_task.size());
}

void Session::open_data() {
  const bool separate = cfg.data.documents == "separate";
  train_data = std::make_unique<BatchSampler>(cfg.data.train, cfg.data.dtype, T, cfg.model.vocab_size, cfg.run.seed,
                                              "train", cfg.data.format, ScanOptions{}, separate);
  if (!cfg.data.valid.empty()) {
    const BatchSampler valid_data(cfg.data.valid, cfg.data.dtype, T, cfg.model.vocab_size, cfg.run.seed, "valid",
                                  cfg.data.format, ScanOptions{}, separate);
    valid_batch = std::make_unique<HostBatch>();
    const int64_t steps = cfg.train.eval_steps * M;
    fill_batch(valid_data, rank_sequences(steps, micro, dp, dist->dp_rank()), 0, steps, micro, *valid_batch);
    valid_share = predicted_share(*valid_batch, dist->host(), counts_batch);
  }
  if (lead) std::printf("data: %s", train_data->describe().c_str());  // describe() ends each entry with a newline
  open_eval_task();
  // The next step's tokens are read in a background thread while this step computes.
  prefetch = std::make_unique<BatchPrefetcher>(*train_data, M, micro, rank_sequences(M, micro, dp, dist->dp_rank()));
}

// This rank's model chunks (one, or pp_virtual interleaved), each with its
// ZeRO optimizer, as the sharding plan (model/sharding.h) lays them out:
// storage, optimizer and checkpoints all follow it.
void Session::build_models() {
  const MeshShape& mesh = dist->mesh();
  plans = chunk_plans(dims, cfg.model.init_std, mesh, dist->coords(), zero_stage, cfg.parallel.sp, stage_layers,
                      pipeline_chunks(cfg));
  models = std::make_unique<StageModels>(plans, dev.device, zero_stage, simulated.peak_chunk_slots[size_t(pp_stage)],
                                         stage_groups(*dist), adamw_config(cfg));
  for (const ChunkState& c : models->states()) {
    c.opt->set_overlap(cfg.parallel.overlap);
    c.model->overlap_comm = cfg.parallel.overlap;
  }
  if (lead)
    std::fputs(format_layout_report(cfg, dims, stage_layers, schedule, simulated, storage, mesh, plans, M).c_str(),
               stdout);
  if (cfg.model.init_from.empty()) {
    models->initialise(cfg.run.seed);
  } else {
    // Every rank reads the whole directory and keeps its own pieces.
    std::vector<std::string> notes;
    models->initialise_from(load_init_weights(cfg, &notes));
    if (lead) std::printf("init: weights from %s (fresh optimizer state)\n", cfg.model.init_from.c_str());
    if (lead)
      for (const std::string& n : notes) std::printf("%s\n", n.c_str());
  }
  // The plan (and `trainer plan`, which prints the same ledger) is what the
  // run holds: the three states ZeRO shards, to the byte.
  check_allocation(plan, models->param_bytes(), models->grad_bytes(), models->optimizer_bytes(), models->host_bytes());
  if (lead) std::fputs(format_allocation_line(plan).c_str(), stdout);
}

void Session::open_run_dir() {
  run_dir = cfg.run_dir();
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) throw std::runtime_error(run_dir + ": cannot create run directory: " + ec.message());
  if (lead && data_tokenizer) {
    record_tokenizer(*data_tokenizer, run_dir);
    std::fputs(format_tokenizer_line(*data_tokenizer, cfg, run_dir).c_str(), stdout);
  }
}

// [ckpt-integrity] Only this run's checkpoints are resumed or rotated
// (train/run_identity.h); `latest` older than a newer complete checkpoint is
// passed over, saying so; newer ones of a timeline the run leaves are set aside.
void Session::resume() {
  ckpt_root = checkpoint_root(cfg);
  identity = run_identity(cfg, *train_data);
  std::vector<std::string> notes;
  check_checkpoint_root(cfg, ckpt_root, identity, &notes);
  if (lead)
    for (const std::string& n : notes) std::printf("%s\n", n.c_str());
  // A launcher's restart (torchrun --max_restarts, a Slurm requeue)
  // continues the job: starting again from step 0 would throw its progress
  // away and set its checkpoints aside.
  std::string mode = cfg.checkpoint.resume;
  if (mode == "none" && opt.launch.restart_count > 0) {
    mode = "auto";
    if (lead)
      std::printf("checkpoint: %s restart %d with checkpoint.resume none: resuming from the newest complete "
                  "checkpoint, as a restart continues the job (a path in checkpoint.resume chooses another)\n",
                  opt.launch.launcher.c_str(), opt.launch.restart_count);
  }
  if (auto ck = load_resume_checkpoint(ckpt_root, mode, models->states(), dist->host(), lead)) {
    if (const std::string d = foreign_difference(identity, cfg.run.seed, ck->meta); !d.empty() && lead)
      std::printf("checkpoint: %s was written by another run (%s); continuing it as checkpoint.resume names it\n",
                  ck->dir.c_str(), d.c_str());
    adopt_lineage(identity, ck->meta.identity);
    restore_checkpoint(*ck, models->states());
    start_step = ck->meta.step;
    tokens = ck->meta.tokens;
    data_offset = ck->meta.data_offset;
    if (lead)
      std::printf("resumed from %s at step %lld (%lld tokens seen)\n", ck->dir.c_str(), (long long)start_step,
                  (long long)tokens);
    if (lead) {
      const char* group_world = std::getenv("GROUP_WORLD_SIZE");  // torchrun: the nodes of this round
      std::fputs(describe_world_change(ck->meta, cfg, opt.launch, count_nodes(places.host), dp,
                                       group_world ? std::atoi(group_world) : 0)
                     .c_str(),
                 stdout);
    }
    const auto latest = latest_step(ckpt_root);
    if (lead && mode == "auto" && latest && *latest < start_step)
      std::printf("checkpoint: `latest` in %s names step %lld, but step %lld is newer and complete: resumed from "
                  "the newest\n",
                  ckpt_root.c_str(), (long long)*latest, (long long)start_step);
  } else if (mode == "auto" && lead) {
    std::printf("checkpoint: no complete checkpoint under %s, starting from step 0\n", ckpt_root.c_str());
  }
  set_aside_left_timeline(ckpt_root, start_step, lead, opt.quiet);
  end_step = opt.stop_after > 0 ? std::min(opt.stop_after, cfg.train.steps) : cfg.train.steps;
}

// The metrics log (observe/metrics.h; log.tensorboard: observe/tensorboard.h),
// the saver, which exists even without periodic saves (a preemption saves
// too), and the reference dump when asked for.
void Session::open_outputs() {
  metrics_path = cfg.log.jsonl && lead ? run_dir + "/metrics.jsonl" : "";
  if (!metrics_path.empty() && start_step > 0) trim_metrics(metrics_path, start_step);
  log = std::make_unique<MetricsLog>(metrics_path, start_step > 0, lead ? cfg.log.progress : "lines",
                                     lead && cfg.log.tensorboard ? run_dir + "/tensorboard" : "");
  CheckpointGroup group{dist->store(), opt.launch.rank, opt.launch.world_size, cfg.parallel.timeout_s, {}};
  // [ckpt-integrity] A save's waits end as soon as the rank waited on is
  // dead or stopped, not after parallel.timeout_s.
  if (Watchdog* wd = dist->watchdog()) group.gone = [wd](const std::vector<int>& ranks) { return wd->gone_among(ranks); };
  saver = std::make_unique<RunSaver>(
      cfg, ckpt_root, group,
      opt.launch.rank, opt.launch.world_size, count_nodes(places.host), lead, opt.quiet, dist->watchdog(), identity);
  if (!opt.dump_reference_dir.empty())
    dump = std::make_unique<ReferenceDump>(opt.dump_reference_dir, cfg, models->model(0), M);
}

void set_aside_left_timeline(const std::string& root, int64_t step, bool lead, bool quiet) {
  if (!lead) return;
  const std::vector<std::string> moved = set_aside_newer(root, step);
  if (!quiet && !moved.empty())
    std::printf("checkpoint: %zu checkpoint(s) newer than step %lld belong to a timeline this run left; set aside "
                "(never loaded or pruned; delete them when no longer wanted): %s%s\n",
                moved.size(), (long long)step, moved.front().c_str(), moved.size() > 1 ? " ..." : "");
}

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

}  // namespace trainer
