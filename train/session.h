// Everything a run sets up before its first step, in the order it happens:
// the device and the process groups, the run lock, the layout (dims, the
// pipeline schedule checked by the simulator, the memory plan checked
// against the device), the data and this rank's share of it, the stage
// models (checked against the plan to the byte), the run directory and the
// data's tokenizer, the resume, the metrics log and the checkpoint saver.
// The start-up lines (train/startup_report.h) are printed as each part is
// known, so a failing check shows what led to it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/batch_sampler.h"
#include "data/prefetch.h"
#include "infer/choice_score.h"
#include "interop/reference_dump.h"
#include "interop/run_tokenizer.h"
#include "model/sharding.h"
#include "observe/metrics.h"
#include "observe/placement_report.h"
#include "pipeline/schedule.h"
#include "pipeline/simulate.h"
#include "planner/hardware.h"
#include "planner/memory_plan.h"
#include "planner/step_estimate.h"
#include "runtime/device_select.h"
#include "runtime/distributed_run.h"
#include "runtime/nvml.h"
#include "train/engine.h"
#include "train/run_identity.h"
#include "train/run_lock.h"
#include "train/run_saver.h"
#include "train/stage_models.h"

namespace trainer {

class Session {
 public:
  Session(const Config& cfg, const RunOptions& opt);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const Config& cfg;
  RunOptions opt;  // quiet on every rank but the lead
  DeviceChoice dev;
  std::optional<TokenizerFiles> data_tokenizer;
  // train.eval_task, read and tokenized at start-up (empty: none).
  std::vector<ChoiceItem> eval_task;
  std::unique_ptr<DistributedRun> dist;
  std::unique_ptr<RunLock> run_lock;  // one job per run directory, held until the session ends
  RankPlaces places;                  // every rank's host and local rank (observe/placement_report.h)
  bool lead = false;
  int dp = 1, pp_stage = 0, zero_stage = 0;
  bool counts_loss = true;  // every tp rank of a replica computes the same loss; one counts it
  // One rank of each replica (tp, cp, pp coordinate 0) counts its batch's
  // predicted targets (train/micro_batch.h: predicted_share).
  bool counts_batch = true;
  double valid_share = 1;   // predicted_share of valid_batch
  DType storage = DType::F32;

  // The layout.
  int64_t micro = 0, M = 0, T = 0;  // sequences per micro-batch, micro-batches per step, tokens
  ModelDims dims;
  std::vector<int64_t> stage_layers;
  Schedule schedule;
  TransferMode transfer_mode;  // how the pipeline transfers on this device (the simulation's and the executor's)
  Simulation simulated;
  MemoryPlan plan;
  // The planner's step on the configuration's `hardware:` entry, only when
  // the configuration has one (runs otherwise ignore the section): the
  // end-of-run link report sets its prediction beside the measurement.
  std::optional<Hardware> hardware;
  std::optional<StepEstimate> predicted;

  // The data: training batches prefetched, the validation batches read once.
  std::unique_ptr<BatchSampler> train_data;
  std::unique_ptr<HostBatch> valid_batch;
  std::unique_ptr<BatchPrefetcher> prefetch;

  std::vector<ShardingPlan> plans;  // this rank's model chunks
  std::unique_ptr<StageModels> models;

  std::string run_dir, ckpt_root, metrics_path;
  RunIdentity identity;  // recorded in every checkpoint (train/run_identity.h)
  int64_t start_step = 0, end_step = 0;
  int64_t tokens = 0;       // seen by the state the models hold
  int64_t data_offset = 0;  // data steps skipped by rollbacks (checkpoint meta data_offset)
  std::unique_ptr<MetricsLog> log;
  std::unique_ptr<NvmlReader> nvml;  // this rank's GPU (train/gpu_watch.h); null: not read
  uint64_t ecc_seen = 0;             // its uncorrected ECC count last seen
  std::unique_ptr<RunSaver> saver;
  std::unique_ptr<ReferenceDump> dump;

  int64_t tokens_per_step() const { return M * dims.N() * dp; }

 private:
  void open_run();
  void plan_layout();
  void open_data();
  void open_eval_task();
  void build_models();
  void open_run_dir();
  void resume();
  void open_outputs();
};

// Moves this run's checkpoints above `step` aside (checkpoint.h
// set_aside_newer) on the lead rank, saying so: a resume from further back,
// a start over or a rollback left their timeline.
void set_aside_left_timeline(const std::string& root, int64_t step, bool lead, bool quiet);

// After a resume or a rollback, rows logged past the checkpoint (by the run
// that crashed, or the steps rolled back) would repeat steps: keep only what
// the restored state has seen.
void trim_metrics(const std::string& path, int64_t last_step);

}  // namespace trainer
