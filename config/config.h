// Typed run configuration. One YAML file fills these structs (config_load.cpp);
// every key, its type, default and allowed values are declared once in the
// schema (config_schema.cpp), which also drives --set, --print-config and the
// "did you mean" suggestions.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <stdexcept>
#include <optional>
#include <string>
#include <vector>

namespace trainer {

struct RunConfig {
  std::string name = "run";
  std::string dir = "";          // "" -> runs/<name>
  uint64_t seed = 1234;
};

struct MoeConfig {
  int num_experts = 0;           // 0: dense model
  int top_k = 2;
  int every = 1;                 // layer i is MoE when (i + 1) % every == 0
  double capacity_factor = 0.0;  // <= 0: dropless
  double aux_loss_coeff = 0.01;
  int d_ff = 0;                  // 0: model.d_ff
  bool normalize_topk = true;
};

// RoPE frequency scaling for contexts longer than pretraining
// (kernels/rope_freqs.h; Hugging Face config.json "rope_scaling").
struct RopeScalingConfig {
  std::string type = "none";      // none | linear | llama3
  double factor = 1.0;            // linear, llama3
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int original_max_seq_len = 0;   // llama3: the pretraining context (original_max_position_embeddings)
};

struct ModelConfig {
  std::string arch = "llama";    // llama | gpt2
  int vocab_size = 256;
  int d_model = 64;
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = 0;            // 0: n_heads
  int d_ff = 0;                  // 0: llama round_up(8d/3, 32), gpt2 4d
  int max_seq_len = 64;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScalingConfig rope_scaling;
  // Attention projection biases of a llama model: none, qkv (Qwen2), qkvo
  // (Llama's attention_bias: true). gpt2 always has all of them.
  std::string attn_bias = "none";
  int sliding_window = 0;        // 0: full causal attention; W: a query sees itself and the W keys before it
  std::string tie_embeddings = "auto";  // auto | true | false (auto: gpt2 true, llama false)
  double init_std = 0.02;
  std::string init_from = "";    // a Hugging Face model directory to start from (interop/hf_import.h)
  MoeConfig moe;

  // Resolved by resolve_config(); always valid after it.
  bool tied() const { return tie_embeddings == "true"; }
};

struct ParallelConfig {
  int tp = 1, pp = 1, cp = 1, ep = 1;
  int dp = 0;                    // 0: auto (world / (tp*pp*cp))
  bool sp = false;
  // A tensor-parallel group over whole nodes: every layer's collectives
  // cross the network, so it is refused unless asked for (to measure it).
  bool tp_across_nodes = false;
  std::string pp_schedule = "1f1b";  // gpipe | 1f1b | interleaved | zb-h1 (pipeline/schedule.h)
  int pp_virtual = 2;                // model chunks per rank under the interleaved schedule
  std::vector<int> pp_layers;        // layers per (virtual) stage; empty: balanced (pipeline/stage_split.h)
  int zero_stage = 0;
  double timeout_s = 600;
  // Gradient reductions, ZeRO-3 weight gathers, pipeline sends and the
  // context-parallel ring's passes run asynchronously and are waited for
  // when their result is needed; false
  // waits for each at once (the no-overlap baseline: the same results, bit
  // for bit, later).
  bool overlap = true;
  // Collectives of device tensors: nccl, host (staged through host memory
  // and Gloo: several ranks may share a GPU), auto (NCCL when every rank of
  // a node has a GPU of its own, else host); CPU runs use Gloo directly.
  std::string backend = "auto";
};

struct TrainConfig {
  std::string device = "auto";     // auto | cpu | cuda
  std::string precision = "auto";  // auto | fp32 | bf16 | fp16
  int64_t steps = 100;
  int seq_len = 64;
  int micro_batch_size = 4;
  int global_batch_size = 0;       // sequences per optimizer step; 0: micro_batch_size * dp
  double grad_clip = 1.0;          // <= 0: off
  int64_t eval_interval = 0;       // 0: no periodic eval
  int eval_steps = 4;              // micro-batches per eval
  // A multiple-choice task (data/choice_task.h) scored at every evaluation
  // ("" none), its first eval_task_limit examples (0: all).
  std::string eval_task = "";
  int64_t eval_task_limit = 0;
  int threads = 0;                 // CPU threads; 0: all cores
  std::string loss_scaling = "auto";  // auto | dynamic | off (auto: dynamic with fp16)
  double initial_loss_scale = 65536;  // a power of two
  int64_t loss_scale_window = 1000;   // steps without overflow before the scale doubles
  // A step whose loss or gradient norm is NaN/Inf, or whose loss spikes
  // (train/step_policy.h): skip its update (stop after nonfinite_limit
  // in a row), skip then roll back to the newest checkpoint, or stop.
  std::string nonfinite = "skip";     // skip | rollback | stop
  int64_t nonfinite_limit = 5;        // consecutive flagged steps skip/rollback tolerate
  double spike_zscore = 12;           // loss z-score over the window that flags a spike; 0: off
  int64_t spike_window = 100;         // healthy steps the z-score looks back on
  // Ceilings judged from the first step, when no history exists yet: a loss
  // far above a uniform guess's ln(vocab) or an enormous gradient norm is an
  // exploded model even while it is finite.
  double loss_ceiling = 0;            // 0: 3 ln(model.vocab_size); < 0: off
  double grad_norm_ceiling = 1e4;     // 0: off
  // Silent divergence of copies that must be identical (train/replica_check.h):
  // every N steps and before every checkpoint, a checksum per tensor compared
  // across data-parallel replicas, tensor-parallel copies and the tied
  // embedding's two pipeline ends; a mismatch stops (exit 5) or rolls back.
  int64_t replica_check_interval = 100;  // 0: off
  std::string replica_policy = "stop";   // stop | rollback
  // A flagged step (NaN, spike, ceiling) run again on the same data from the
  // same state first (train/step_rerun.cpp): the same result blames the data
  // or the numerics and names the step's sequences; a different one is a
  // transient fault, named by rank, and the run goes on with the re-run's
  // result (continue) or stops (stop).
  bool rerun_flagged = false;
  std::string rerun_transient = "continue";  // continue | stop
  double peak_tflops = 0;             // per device, for MFU; 0: from the GPU table (none on the CPU)
  // Activation recompute (model/recompute.h): none | selective (attention's
  // internals) | full (the whole block from its input).
  std::string recompute = "none";
  int recompute_layers = 0;           // layers of each model chunk, from its first, that recompute; 0: all
};

struct OptimConfig {
  std::string name = "adamw";
  double lr = 3e-4;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  std::string schedule = "cosine"; // cosine | linear | constant
  int64_t decay_steps = 0;         // 0: train.steps
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // none | optimizer: ZeRO-Offload, the AdamW state and step in host memory.
  std::string offload = "none";
};

struct DataConfig {
  // Entries "PATH_OR_GLOB" or "WEIGHT PATH_OR_GLOB"; a path may be a raw .bin,
  // an llm.c shard or a Megatron prefix/.bin/.idx (data/batch_sampler.h).
  std::vector<std::string> train;
  std::vector<std::string> valid;
  std::string dtype = "uint16";    // uint16 | uint32 (raw files only)
  std::string format = "auto";     // auto | raw | llmc | megatron
  // packed: a sequence is a window of the token stream, attending across the
  // documents in it (pretraining as nanoGPT does). separate: positions restart
  // at each document, attention stays inside it and no token predicts the
  // next document's first (Megatron's reset_position_ids, reset_attention_mask
  // and eod_mask_loss together); needs files that record their documents.
  std::string documents = "packed";  // packed | separate
};

struct CheckpointConfig {
  std::string dir = "";            // "" -> <run dir>/ckpt
  int64_t interval = 0;            // 0: never
  int keep_last = 3;
  bool async = true;
  std::string resume = "none";     // none | auto | PATH
  // A save that fails (disk full, read-only, permissions): stop ends the run
  // with exit 1; continue logs it and tries again at the next interval.
  std::string on_save_error = "stop";  // stop | continue
  // Resume and write among checkpoints another run wrote (train/run_identity.h).
  bool load_foreign = false;
};

struct LogConfig {
  int64_t interval = 1;
  bool jsonl = true;               // <run dir>/metrics.jsonl
  bool tensorboard = false;        // <run dir>/tensorboard/events.out.tfevents.*
  std::string progress = "auto";   // auto | bar | lines
  int sample_tokens = 0;           // > 0: print this many generated tokens after training
  std::string sample_prompt = "";
  double sample_temperature = 0.8;
  // Per-rank monitor (observe/rank_monitor.h): a rank this much slower
  // than the median, this many log intervals in a row, is named.
  double straggler_threshold = 0.2;
  int64_t straggler_intervals = 3;
  // "S-E" (or "S"): record a timeline of steps S to E, every rank, into
  // <run dir>/trace.json (observe/trace_file.h); "": none.
  std::string trace = "";
  // Every N steps each rank's resident memory, open file descriptors and
  // threads, and the run directory's bytes, into metrics.jsonl (a leak shows
  // as growth; observe/process_stats.h); 0: off.
  int64_t resources_interval = 1000;
};

// The steps of log.trace, inclusive; nullopt when the text is not "S-E" or
// "S" with 1 <= S <= E.
struct StepRange {
  int64_t first = 0, last = 0;
};
std::optional<StepRange> parse_step_range(const std::string& text);

// The accelerator `trainer plan` estimates for (planner/hardware.h): a
// known GPU by name, numbers > 0 override its table entry (or describe a GPU
// the table does not know). Runs use it for the end-of-run link report and
// step time model only. `calibration` names a file `trainer calibrate`
// wrote (config/hardware_file.h): its keys fill those the configuration
// leaves unset.
struct HardwareConfig {
  std::string calibration;
  std::string gpu = "a100-80gb";
  double memory_gib = 0;
  double bf16_tflops = 0;
  double hbm_gb_s = 0;
  double nvlink_gb_s = 0;
  double network_gbit_s = 0;
  int gpus_per_node = 0;
  double matmul_efficiency = 0;
  double collective_latency_us = 0;  // per collective call; 0: the table's
  double nvlink_latency_us = 0;      // per ring step inside a node; 0: the table's
  double network_latency_us = 0;     // per ring step across nodes; 0: the table's
};

struct SmokeConfig {
  int64_t steps = 200;
};

struct Config {
  RunConfig run;
  ModelConfig model;
  ParallelConfig parallel;
  TrainConfig train;
  OptimConfig optim;
  DataConfig data;
  CheckpointConfig checkpoint;
  LogConfig log;
  SmokeConfig smoke;
  HardwareConfig hardware;
  std::string source = "<defaults>";  // file it came from, for messages
  // Keys the YAML or a --set named ("model.moe.aux_loss_coeff"), as opposed
  // to defaults: a Hugging Face directory's settings fill only the others
  // (interop/hf_import.h).
  std::set<std::string> given;

  int d_ff() const;                 // resolved FFN width
  int moe_d_ff() const;
  int kv_heads() const { return model.n_kv_heads > 0 ? model.n_kv_heads : model.n_heads; }
  int head_dim() const { return model.d_model / model.n_heads; }
  std::string run_dir() const { return run.dir.empty() ? "runs/" + run.name : run.dir; }
};

// A user mistake in the configuration: the message names the key (and file),
// and main() turns it into one line on stderr and exit code 2.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parse YAML text / file into a Config (defaults for absent keys), apply
// "key.path=value" overrides in order, then validate. Throws ConfigError.
// world_size: processes of the launch (validation checks the parallel layout
// and the global batch against it); 0: tp x pp x cp x max(dp, 1) of the
// configuration itself (tools that launch nothing). before_resolve, when
// set, may fill keys the YAML and the overrides left unset (Config::given)
// before defaults are resolved and everything is validated: the training
// command takes model.init_from's config.json that way (interop/hf_adopt.h).
using ConfigFill = std::function<void(Config&)>;
Config load_config_file(const std::string& path, const std::vector<std::string>& overrides,
                        int world_size = 1, const ConfigFill& before_resolve = {});
Config load_config_text(const std::string& yaml, const std::string& source,
                        const std::vector<std::string>& overrides, int world_size = 1,
                        const ConfigFill& before_resolve = {});
// The keys a YAML text sets, typed and range-checked (errors name the file
// and line), without defaults resolved or cross-key validation: for files
// that hold part of a configuration (config/hardware_file.h).
Config parse_config_keys(const std::string& yaml, const std::string& source);
// Replaces "auto"/0 placeholders that have one right answer for this run
// (model.tie_embeddings, train.global_batch_size); load_config_* call it, code
// that builds a Config by hand should too. Idempotent.
void resolve_config(Config& c, int world_size = 1);
// Checks types already done; this checks ranges and cross-key consistency.
// world_size is the number of processes (1 until distributed runs arrive).
void validate_config(const Config& c, int world_size = 1);
// Legal settings that are probably not what was meant (a warm-up longer than
// the run or the decay), one message each naming the keys; main() prints
// them as "warning: ..." once at start-up. Never throws.
std::vector<std::string> config_warnings(const Config& c);
// The resolved configuration as YAML (every key, defaults included).
std::string config_to_yaml(const Config& c);

}  // namespace trainer
