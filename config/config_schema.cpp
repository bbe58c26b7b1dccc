#include "config/config_schema.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>

namespace trainer {

namespace {

constexpr double kNone = std::numeric_limits<double>::quiet_NaN();

// `+` turns the captureless lambda into the plain function pointer FieldRef holds.
#define FIELD(member) +[](Config& c) -> decltype((c.member)) { return c.member; }

// Fluent row builder so the table reads one key per line with only what
// differs from "no range, no choices".
struct Row {
  KeySpec k;
  Row(std::string_view path, FieldRef f, std::string_view help) {
    k.path = path;
    k.field = f;
    k.type = static_cast<KeyType>(f.index());
    k.min = kNone;
    k.max = kNone;
    k.help = help;
  }
  Row& at_least(double lo) { k.min = lo; return *this; }
  Row& above(double lo) { k.min = lo; k.min_exclusive = true; return *this; }
  Row& between(double lo, double hi) { k.min = lo; k.max = hi; return *this; }
  Row& below(double hi) { k.max = hi; k.max_exclusive = true; return *this; }
  Row& one_of(std::string_view c) { k.choices = c; return *this; }
  Row& or_path(std::string_view c) { k.choices = c; k.open_choice = true; return *this; }
  Row& aka(std::string_view a) { k.aka = a; return *this; }
  operator KeySpec() const { return k; }
};

std::vector<KeySpec> build_schema() {
  return {
      Row("run.name", FIELD(run.name), "run name; the run directory defaults to runs/<name>")
          .aka("run_name experiment"),
      Row("run.dir", FIELD(run.dir), "run directory (logs, metrics, checkpoints); empty: runs/<name>")
          .aka("out_dir output_dir"),
      Row("run.seed", FIELD(run.seed), "seed for initialisation and data order")
          .aka("random_seed"),

      Row("model.arch", FIELD(model.arch), "architecture").one_of("llama|gpt2")
          .aka("architecture model_type type"),
      Row("model.vocab_size", FIELD(model.vocab_size), "vocabulary size (token ids are < this)")
          .at_least(2).aka("vocab n_vocab padded_vocab_size"),
      Row("model.d_model", FIELD(model.d_model), "width of the residual stream")
          .at_least(1).aka("hidden_size n_embd dim embed_dim d_embed"),
      Row("model.n_layers", FIELD(model.n_layers), "number of transformer blocks")
          .at_least(1).aka("n_layer num_layers num_hidden_layers depth layers"),
      Row("model.n_heads", FIELD(model.n_heads), "attention (query) heads")
          .at_least(1).aka("n_head num_heads num_attention_heads heads"),
      Row("model.n_kv_heads", FIELD(model.n_kv_heads), "key/value heads (grouped-query attention); 0: n_heads")
          .at_least(0).aka("n_kv_head num_kv_heads num_key_value_heads kv_heads"),
      Row("model.d_ff", FIELD(model.d_ff), "FFN width; 0: llama round_up(8*d_model/3, 32), gpt2 4*d_model")
          .at_least(0).aka("ffn_dim ffn_hidden_size intermediate_size hidden_dim d_hidden"),
      Row("model.max_seq_len", FIELD(model.max_seq_len), "longest sequence the model supports (gpt2 position table size)")
          .at_least(1).aka("block_size n_ctx n_positions max_position_embeddings context_length"),
      Row("model.norm_eps", FIELD(model.norm_eps), "epsilon of RMSNorm/LayerNorm")
          .above(0).aka("eps layer_norm_eps rms_norm_eps layernorm_epsilon"),
      Row("model.rope_theta", FIELD(model.rope_theta), "RoPE base (llama)")
          .above(0).aka("rope_base theta"),
      Row("model.rope_scaling.type", FIELD(model.rope_scaling.type),
          "RoPE frequency scaling (llama): linear divides every frequency by factor; llama3 (Llama 3.1) divides "
          "those of wavelength > original_max_seq_len / low_freq_factor, keeps those < original_max_seq_len / "
          "high_freq_factor, and ramps between")
          .one_of("none|linear|llama3").aka("rope_type scaling_type"),
      Row("model.rope_scaling.factor", FIELD(model.rope_scaling.factor), "RoPE scaling factor (linear, llama3)")
          .above(0).aka("scaling_factor rope_factor"),
      Row("model.rope_scaling.low_freq_factor", FIELD(model.rope_scaling.low_freq_factor),
          "llama3 scaling: wavelengths above original_max_seq_len / this are divided by factor")
          .above(0),
      Row("model.rope_scaling.high_freq_factor", FIELD(model.rope_scaling.high_freq_factor),
          "llama3 scaling: wavelengths below original_max_seq_len / this are kept (> low_freq_factor)")
          .above(0),
      Row("model.rope_scaling.original_max_seq_len", FIELD(model.rope_scaling.original_max_seq_len),
          "llama3 scaling: the context length of pretraining (>= 1 with llama3)")
          .at_least(0).aka("original_max_position_embeddings original_context_length old_context_len"),
      Row("model.attn_bias", FIELD(model.attn_bias),
          "biases of a llama model's attention projections: none, qkv (q, k, v: Qwen2), qkvo (q, k, v and o: "
          "Llama attention_bias); gpt2 always has them")
          .one_of("none|qkv|qkvo").aka("attention_bias qkv_bias add_qkv_bias bias"),
      Row("model.sliding_window", FIELD(model.sliding_window),
          "sliding-window attention (Mistral): a query sees itself and the W keys before it; 0: full causal "
          "attention")
          .at_least(0).aka("attention_window window window_size swa local_window"),
      Row("model.tie_embeddings", FIELD(model.tie_embeddings), "share the embedding with the output head; auto: gpt2 true, llama false")
          .one_of("auto|true|false").aka("tie_word_embeddings tied weight_tying tie_weights"),
      Row("model.init_std", FIELD(model.init_std), "standard deviation of the weight initialisation")
          .above(0).aka("initializer_range init_scale"),
      Row("model.init_from", FIELD(model.init_from),
          "a Hugging Face model directory (config.json + safetensors) whose weights the run starts from, with a "
          "fresh optimizer state; empty: random initialisation")
          .aka("init_checkpoint pretrained pretrained_model_name_or_path load_from"),
      Row("model.moe.num_experts", FIELD(model.moe.num_experts), "experts per MoE layer; 0: dense model")
          .at_least(0).aka("experts n_experts num_local_experts n_routed_experts"),
      Row("model.moe.top_k", FIELD(model.moe.top_k), "experts each token is routed to")
          .at_least(1).aka("topk k num_experts_per_tok experts_per_token router_topk"),
      Row("model.moe.every", FIELD(model.moe.every), "layer i is MoE when (i + 1) % every == 0")
          .at_least(1).aka("moe_every interval frequency moe_layer_freq expert_interval"),
      Row("model.moe.capacity_factor", FIELD(model.moe.capacity_factor), "expert capacity factor; <= 0: dropless")
          .aka("capacity"),
      Row("model.moe.aux_loss_coeff", FIELD(model.moe.aux_loss_coeff), "weight of the load-balancing loss (with model.init_from and this key unset: the directory's "
          "router_aux_loss_coef)")
          .at_least(0).aka("aux_loss load_balancing_loss_coeff router_aux_loss_coef moe_aux_loss_coeff"),
      Row("model.moe.d_ff", FIELD(model.moe.d_ff), "expert FFN width; 0: model.d_ff")
          .at_least(0).aka("ffn_dim expert_d_ff moe_intermediate_size moe_ffn_hidden_size"),
      Row("model.moe.normalize_topk", FIELD(model.moe.normalize_topk), "renormalise the top-k router weights to sum to 1")
          .aka("norm_topk_prob normalize"),

      Row("parallel.tp", FIELD(parallel.tp), "tensor-parallel size").at_least(1)
          .aka("tensor_parallel tensor_model_parallel_size tp_size"),
      Row("parallel.pp", FIELD(parallel.pp), "pipeline-parallel stages").at_least(1)
          .aka("pipeline_parallel pipeline_model_parallel_size pp_size"),
      Row("parallel.cp", FIELD(parallel.cp), "context-parallel size (sequence split across ranks)").at_least(1)
          .aka("context_parallel context_parallel_size cp_size"),
      Row("parallel.ep", FIELD(parallel.ep), "expert-parallel size (divides dp*cp)").at_least(1)
          .aka("expert_parallel expert_model_parallel_size ep_size"),
      Row("parallel.dp", FIELD(parallel.dp), "data-parallel size; 0: world / (tp*pp*cp)").at_least(0)
          .aka("data_parallel data_parallel_size dp_size"),
      Row("parallel.pp_schedule", FIELD(parallel.pp_schedule), "pipeline schedule").one_of("1f1b|gpipe|interleaved|zb-h1")
          .aka("pipeline_schedule schedule_kind"),
      Row("parallel.pp_virtual", FIELD(parallel.pp_virtual),
          "model chunks per pipeline rank under the interleaved schedule (virtual stages = pp x this)")
          .at_least(2).aka("virtual_pipeline_model_parallel_size num_model_chunks virtual_stages"),
      Row("parallel.pp_layers", FIELD(parallel.pp_layers),
          "layers per pipeline stage (per virtual stage when interleaved), e.g. [3, 5, 5, 7]; empty: balanced by "
          "the cost model")
          .at_least(1).aka("pipeline_layers layers_per_stage"),
      Row("parallel.sp", FIELD(parallel.sp), "sequence parallelism inside tensor-parallel groups")
          .aka("sequence_parallel"),
      Row("parallel.tp_across_nodes", FIELD(parallel.tp_across_nodes),
          "allow a tensor-parallel group of whole nodes (tp a multiple of the GPUs per node): every layer's "
          "collectives then cross the network, which is slow; for measuring it"),
      Row("parallel.zero_stage", FIELD(parallel.zero_stage), "ZeRO stage: 0 none, 1 optimizer state, 2 +grads, 3 +params")
          .between(0, 3).aka("zero stage zero_optimization"),
      Row("parallel.timeout_s", FIELD(parallel.timeout_s), "seconds a collective or rendezvous may wait before failing")
          .above(0).aka("timeout nccl_timeout"),
      Row("parallel.overlap", FIELD(parallel.overlap),
          "run gradient reductions, ZeRO-3 gathers, pipeline sends and the context-parallel ring's passes behind "
          "compute (false: wait for each at once, the no-overlap baseline; same results)")
          .aka("overlap_comm overlap_grad_reduce overlap_param_gather"),
      Row("parallel.backend", FIELD(parallel.backend),
          "collectives of GPU tensors: nccl, host (through host memory and Gloo; ranks may share a GPU), auto (NCCL "
          "when each rank has its own GPU, else host)")
          .one_of("auto|nccl|host").aka("dist_backend communication_backend"),

      Row("train.device", FIELD(train.device), "where to run; auto: CUDA when a GPU answers, else CPU")
          .one_of("auto|cpu|cuda").aka("backend"),
      Row("train.precision", FIELD(train.precision), "compute precision; auto: bf16 on CUDA, fp32 on CPU")
          .one_of("auto|fp32|bf16|fp16").aka("dtype mixed_precision amp"),
      Row("train.steps", FIELD(train.steps), "optimizer steps to train").at_least(1)
          .aka("max_steps max_iters train_iters num_steps iters total_steps"),
      Row("train.seq_len", FIELD(train.seq_len), "tokens per training sequence (<= model.max_seq_len)")
          .at_least(1).aka("seq_length sequence_length context_len block_size"),
      Row("train.micro_batch_size", FIELD(train.micro_batch_size), "sequences per forward/backward on one rank")
          .at_least(1).aka("batch_size micro_batch mbs per_device_train_batch_size"),
      Row("train.global_batch_size", FIELD(train.global_batch_size), "sequences per optimizer step; 0: micro_batch_size * dp")
          .at_least(0).aka("global_batch gbs total_batch_size"),
      Row("train.grad_clip", FIELD(train.grad_clip), "clip the global gradient norm to this; <= 0: off")
          .aka("clip_grad max_grad_norm gradient_clipping clip"),
      Row("train.eval_interval", FIELD(train.eval_interval), "evaluate every N steps; 0: no periodic eval")
          .at_least(0).aka("eval_every eval_iters_interval"),
      Row("train.eval_steps", FIELD(train.eval_steps), "validation batches per evaluation, each of train.global_batch_size sequences (split over ranks and micro-batches like a training step)")
          .at_least(1).aka("eval_iters eval_batches"),
      Row("train.eval_task", FIELD(train.eval_task),
          "multiple-choice task (HellaSwag's JSON lines) scored at every evaluation: acc and acc_norm; empty: none")
          .aka("hellaswag benchmark eval_tasks tasks"),
      Row("train.eval_task_limit", FIELD(train.eval_task_limit), "score the first N examples of train.eval_task; 0: all")
          .at_least(0).aka("eval_task_examples limit"),
      Row("train.threads", FIELD(train.threads), "CPU threads; 0: all cores")
          .at_least(0).aka("num_threads omp_threads"),
      Row("train.loss_scaling", FIELD(train.loss_scaling), "dynamic loss scaling; auto: on with fp16 only")
          .one_of("auto|dynamic|off").aka("loss_scale dynamic_loss_scale fp16_loss_scaling"),
      Row("train.initial_loss_scale", FIELD(train.initial_loss_scale), "loss scale at the start (a power of two)")
          .at_least(1).aka("init_loss_scale initial_scale initial_scale_power"),
      Row("train.loss_scale_window", FIELD(train.loss_scale_window), "steps without overflow before the loss scale doubles")
          .at_least(1).aka("scale_window loss_scale_growth_interval growth_interval"),
      Row("train.nonfinite", FIELD(train.nonfinite),
          "a step with a NaN/Inf loss or gradient norm, or a loss spike: skip its update, skip then roll back to "
          "the newest checkpoint after train.nonfinite_limit in a row, or stop")
          .one_of("skip|rollback|stop").aka("nan_policy on_nan skip_nan"),
      Row("train.nonfinite_limit", FIELD(train.nonfinite_limit),
          "flagged steps in a row that skip (then stop) or rollback (then roll back) tolerate; 0: act at the first")
          .at_least(0).aka("max_skipped_steps nan_limit"),
      Row("train.spike_zscore", FIELD(train.spike_zscore),
          "a loss or gradient norm this many robust standard deviations (1.4826 x the median absolute deviation) "
          "above the median of the last train.spike_window healthy steps is a spike, handled like a NaN; 0: off")
          .at_least(0).aka("loss_spike_zscore spike_threshold"),
      Row("train.spike_window", FIELD(train.spike_window),
          "healthy steps the loss and gradient-norm z-scores (median and MAD) look back on")
          .at_least(2).aka("loss_spike_window"),
      Row("train.loss_ceiling", FIELD(train.loss_ceiling),
          "a loss above this flags the step from the first step on (an exploded model, even if finite); 0: 3 x "
          "ln(model.vocab_size), 3 times a uniform guess; < 0: off")
          .aka("max_loss loss_limit"),
      Row("train.grad_norm_ceiling", FIELD(train.grad_norm_ceiling),
          "a global gradient norm (before clipping) above this flags the step from the first step on; 0: off")
          .at_least(0).aka("grad_norm_limit"),
      Row("train.replica_check_interval", FIELD(train.replica_check_interval),
          "every N steps, and before every checkpoint, the copies that must be identical (data-parallel replicas of "
          "the weights and of unsharded optimizer state, tensor-parallel copies, the tied embedding's pipeline ends) "
          "compare a checksum per tensor; 0: off")
          .at_least(0).aka("check_weight_hash_across_dp_replicas_interval replica_check"),
      Row("train.replica_policy", FIELD(train.replica_policy),
          "when copies disagree: stop (exit 5, naming the ranks, nodes and tensor) or roll back to the newest "
          "checkpoint (every checkpoint was checked before it was written)")
          .one_of("stop|rollback").aka("on_replica_mismatch"),
      Row("train.rerun_flagged", FIELD(train.rerun_flagged),
          "run a flagged step (NaN, spike, ceiling) again on the same data from the same state before the policy "
          "acts: the same result blames the data or the numerics and names the step's sequences (file and offset), "
          "a different one is a transient fault named by rank (costs one pass over the gradients a step while on)")
          .aka("rerun_on_nan check_for_nan_in_loss_and_grad rerun"),
      Row("train.rerun_transient", FIELD(train.rerun_transient),
          "a flagged step whose re-run differs: continue with the re-run's result, or stop (exit 4)")
          .one_of("continue|stop").aka("on_transient_fault"),
      Row("train.peak_tflops", FIELD(train.peak_tflops),
          "peak TFLOP/s of one device for the MFU figure; 0: from the table of known GPUs")
          .at_least(0).aka("peak_flops device_tflops"),
      Row("train.recompute", FIELD(train.recompute),
          "activation recompute: none keeps every activation for backward; selective drops the two norm "
          "outputs, the attention output (its core re-run from the kept q, k, v) and the FFN activation, "
          "and recomputes them in backward without a weight matmul; full keeps only each block's input and "
          "recomputes the whole block")
          .one_of("none|selective|full")
          .aka("activation_checkpointing recompute_granularity gradient_checkpointing activation_recompute"),
      Row("train.recompute_layers", FIELD(train.recompute_layers),
          "layers of each pipeline stage (model chunk), counted from its first, that recompute; 0: all")
          .at_least(0).aka("recompute_num_layers checkpoint_layers"),

      Row("optim.name", FIELD(optim.name), "optimizer").one_of("adamw").aka("optimizer type"),
      Row("optim.lr", FIELD(optim.lr), "peak learning rate").above(0)
          .aka("learning_rate max_lr peak_lr"),
      Row("optim.min_lr", FIELD(optim.min_lr), "learning rate at the end of the decay").at_least(0)
          .aka("final_lr lr_min end_lr"),
      Row("optim.warmup_steps", FIELD(optim.warmup_steps), "linear warm-up steps").at_least(0)
          .aka("warmup warmup_iters lr_warmup_steps lr_warmup_iters"),
      Row("optim.schedule", FIELD(optim.schedule), "learning-rate decay after warm-up")
          .one_of("cosine|linear|constant").aka("lr_schedule scheduler lr_decay_style decay_style"),
      Row("optim.decay_steps", FIELD(optim.decay_steps), "steps of warm-up plus decay; 0: train.steps")
          .at_least(0).aka("lr_decay_iters lr_decay_steps decay_iters"),
      Row("optim.beta1", FIELD(optim.beta1), "Adam first-moment decay").between(0, 1).below(1)
          .aka("adam_beta1 b1"),
      Row("optim.beta2", FIELD(optim.beta2), "Adam second-moment decay").between(0, 1).below(1)
          .aka("adam_beta2 b2"),
      Row("optim.eps", FIELD(optim.eps), "Adam epsilon").above(0).aka("adam_eps epsilon"),
      Row("optim.weight_decay", FIELD(optim.weight_decay), "decoupled weight decay (matrices only)")
          .at_least(0).aka("wd decay"),
      Row("optim.offload", FIELD(optim.offload),
          "none, or optimizer: ZeRO-Offload, fp32 masters, AdamW moments and the update in host memory")
          .one_of("none|optimizer").aka("offload_optimizer cpu_offload"),

      Row("data.train", FIELD(data.train), "training data: entries 'PATH' or 'WEIGHT PATH', PATH a file, glob or Megatron prefix")
          .aka("train_data train_files data_path train_bin training"),
      Row("data.valid", FIELD(data.valid), "validation data, entries as in data.train")
          .aka("val valid_data val_data validation eval eval_data val_files"),
      Row("data.dtype", FIELD(data.dtype), "token id type of raw .bin files (llm.c and Megatron files record their own)")
          .one_of("uint16|uint32").aka("token_dtype type"),
      Row("data.format", FIELD(data.format), "token file layout; auto: Megatron if a PREFIX.idx is there, llm.c by its magic, else raw")
          .one_of("auto|raw|llmc|megatron").aka("data_impl dataset_impl data_format file_format"),
      Row("data.documents", FIELD(data.documents),
          "packed: sequences attend across documents; separate: positions restart, attention and loss stay inside "
          "each document (Megatron index needed)")
          .one_of("packed|separate")
          .aka("reset_attention_mask reset_position_ids eod_mask_loss document_masking packing"),

      Row("checkpoint.dir", FIELD(checkpoint.dir), "checkpoint directory; empty: <run dir>/ckpt")
          .aka("ckpt_dir checkpoint_dir save_dir save path"),
      Row("checkpoint.interval", FIELD(checkpoint.interval), "save every N steps; 0: never")
          .at_least(0).aka("save_interval every save_every checkpoint_interval"),
      Row("checkpoint.keep_last", FIELD(checkpoint.keep_last), "checkpoints to keep")
          .at_least(1).aka("keep save_total_limit keep_last_n"),
      Row("checkpoint.async", FIELD(checkpoint.async), "write checkpoints in a background thread")
          .aka("async_save"),
      Row("checkpoint.resume", FIELD(checkpoint.resume), "none, auto (the newest complete checkpoint in checkpoint.dir) or a checkpoint path")
          .or_path("none|auto").aka("resume_from load init_from resume_from_checkpoint"),
      Row("checkpoint.on_save_error", FIELD(checkpoint.on_save_error),
          "a failed save (disk full, read-only, permissions): stop the run (exit 1) or log it and continue, "
          "trying again at the next interval")
          .one_of("stop|continue").aka("save_error on_save_failure"),
      Row("checkpoint.load_foreign", FIELD(checkpoint.load_foreign),
          "resume and save among checkpoints another run wrote (another seed, model or training data); "
          "false: such a checkpoint.dir stops the run at start-up")
          .aka("allow_foreign"),

      Row("log.interval", FIELD(log.interval), "print a log line every N steps").at_least(1)
          .aka("log_interval every log_every"),
      Row("log.jsonl", FIELD(log.jsonl), "write <run dir>/metrics.jsonl").aka("json metrics"),
      Row("log.tensorboard", FIELD(log.tensorboard),
          "also write the logged scalars as TensorBoard events in <run dir>/tensorboard (rank 0)")
          .aka("use_tensorboard tensorboard_log"),
      Row("log.progress", FIELD(log.progress), "auto: a bar on a terminal, lines otherwise")
          .one_of("auto|bar|lines").aka("progress_bar style"),
      Row("log.sample_tokens", FIELD(log.sample_tokens),
          "after training, print this many tokens generated by the model; 0: none")
          .at_least(0).aka("sample generate num_samples"),
      Row("log.sample_prompt", FIELD(log.sample_prompt), "text the generated sample continues (encoded with the data's tokenizer)")
          .aka("prompt start"),
      Row("log.sample_temperature", FIELD(log.sample_temperature), "sampling temperature")
          .above(0).aka("temperature"),
      Row("log.straggler_threshold", FIELD(log.straggler_threshold),
          "a rank the other ranks wait for in collectives more than this share of the step is a straggler")
          .above(0).aka("straggler_ratio slow_rank_threshold"),
      Row("log.straggler_intervals", FIELD(log.straggler_intervals),
          "log intervals the straggler judgement averages over (the others' waiting for a rank) before it alerts")
          .at_least(1).aka("straggler_patience"),
      Row("log.trace", FIELD(log.trace),
          "record a timeline of these steps (FIRST-LAST, or one step) on every rank into <run dir>/trace.json "
          "(Chrome trace events: Perfetto, chrome://tracing); empty: none")
          .aka("profile profile_steps trace_steps timeline"),
      Row("log.resources_interval", FIELD(log.resources_interval),
          "every N steps, each rank's resident memory, open file descriptors and threads and the run directory's "
          "bytes into metrics.jsonl (a leak shows as growth); 0: off")
          .at_least(0).aka("resource_interval memory_log_interval"),

      Row("smoke.steps", FIELD(smoke.steps), "steps of the built-in smoke test").at_least(1)
          .aka("iters max_steps"),

      Row("hardware.calibration", FIELD(hardware.calibration),
          "a file `trainer calibrate` wrote (a hardware section measured on the cluster): its numbers fill the "
          "hardware keys this configuration leaves unset; \"\": none")
          .aka("calibration_file hardware_file"),
      Row("hardware.gpu", FIELD(hardware.gpu),
          "GPU that `trainer plan` estimates memory and time for: h100, h200, a100-80gb, a100-40gb, a10g, l40s, l4, "
          "b200, h800, a800 (planner/hardware.cpp), or any name with every number below given")
          .aka("gpu_type accelerator device_type"),
      Row("hardware.memory_gib", FIELD(hardware.memory_gib), "device memory in GiB; 0: the GPU table's")
          .at_least(0).aka("memory gpu_memory"),
      Row("hardware.bf16_tflops", FIELD(hardware.bf16_tflops),
          "dense bf16 peak TFLOP/s of one GPU (no sparsity); 0: the GPU table's")
          .at_least(0).aka("tflops peak_tflops"),
      Row("hardware.hbm_gb_s", FIELD(hardware.hbm_gb_s), "memory bandwidth in GB/s; 0: the GPU table's")
          .at_least(0).aka("hbm_bandwidth memory_bandwidth"),
      Row("hardware.nvlink_gb_s", FIELD(hardware.nvlink_gb_s),
          "GPU-to-GPU bandwidth inside a node in GB/s, both directions together as data sheets state it "
          "(NVLink, or PCIe); 0: the GPU table's")
          .at_least(0).aka("nvlink intra_node_bandwidth"),
      Row("hardware.network_gbit_s", FIELD(hardware.network_gbit_s),
          "bandwidth across nodes per GPU in Gbit/s, one direction: the node's NICs divided by its GPUs "
          "(one 25 Gbit/s NIC for 8 GPUs: 3.125); 0: the GPU table's reference system")
          .at_least(0).aka("network inter_node_bandwidth nic_gbps"),
      Row("hardware.gpus_per_node", FIELD(hardware.gpus_per_node),
          "GPUs of one node (groups inside a node use nvlink_gb_s, groups across nodes network_gbit_s); 0: 8")
          .at_least(0).aka("local_world_size nproc_per_node"),
      Row("hardware.matmul_efficiency", FIELD(hardware.matmul_efficiency),
          "share of the bf16 peak the model's matmuls reach; 0: 0.5 (well-tuned dense training reaches 0.4-0.55)")
          .between(0, 1).aka("efficiency mfu"),
      Row("hardware.collective_latency_us", FIELD(hardware.collective_latency_us),
          "fixed cost of one collective call in microseconds; 0: 8.4 (NCCL's ring model)")
          .at_least(0).aka("base_latency launch_latency"),
      Row("hardware.nvlink_latency_us", FIELD(hardware.nvlink_latency_us),
          "latency of one ring step (one message) inside a node in microseconds; 0: 3.4 (NCCL's ring model, NVLink)")
          .at_least(0).aka("intra_node_latency"),
      Row("hardware.network_latency_us", FIELD(hardware.network_latency_us),
          "latency of one ring step (one message) across nodes in microseconds; 0: 9.6 (NCCL's ring model, network)")
          .at_least(0).aka("latency inter_node_latency"),
  };
}

#undef FIELD

std::string lower(std::string_view s) {
  std::string r(s);
  for (auto& ch : r) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return r;
}

// Optimal string alignment distance: like Levenshtein, plus one edit for a
// swapped neighbour pair, the commonest typo in key names ("modle").
// Optimal-string-alignment distance, or cap + 1 when it is larger: it is at
// least the length difference, so a long unknown key (a typo of nothing)
// costs no table against every key of the schema.
size_t osa_distance(std::string_view a, std::string_view b, size_t cap) {
  const size_t n = a.size(), m = b.size();
  if ((n > m ? n - m : m - n) > cap) return cap + 1;
  std::vector<size_t> before(m + 1), prev(m + 1), cur(m + 1);
  for (size_t j = 0; j <= m; ++j) prev[j] = j;
  for (size_t i = 1; i <= n; ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) cur[j] = std::min(cur[j], before[j - 2] + 1);
    }
    std::swap(before, prev);
    std::swap(prev, cur);
  }
  return std::min(prev[m], cap + 1);
}

std::string_view leaf_of(std::string_view p) {
  auto dot = p.rfind('.');
  return dot == std::string_view::npos ? p : p.substr(dot + 1);
}
std::string_view parent_of(std::string_view p) {
  auto dot = p.rfind('.');
  return dot == std::string_view::npos ? std::string_view() : p.substr(0, dot);
}

std::string format_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  // Other YAML readers (YAML 1.1, e.g. PyYAML) read "600" as an int and
  // "1e-05" as a string; "600.0" and "1.0e-05" are floats to every reader.
  if (std::isfinite(v) && s.find('.') == std::string::npos) {
    const auto e = s.find('e');
    if (e == std::string::npos) s += ".0";
    else s.insert(e, ".0");
  }
  return s;
}

std::string format_bound(const KeySpec& k, double v) {
  return k.type == KeyType::Double ? format_double(v) : std::to_string(int64_t(v));
}

// Numeric value of a scalar key as double for the range check; int64 fits
// exactly for every range the table declares.
double numeric_value(const KeySpec& k, Config& c) {
  switch (k.type) {
    case KeyType::Int: return std::get<int& (*)(Config&)>(k.field)(c);
    case KeyType::Int64: return double(std::get<int64_t& (*)(Config&)>(k.field)(c));
    case KeyType::UInt64: return double(std::get<uint64_t& (*)(Config&)>(k.field)(c));
    case KeyType::Double: return std::get<double& (*)(Config&)>(k.field)(c);
    default: return 0;
  }
}

std::string emit_string(const std::string& s) {
  YAML::Emitter e;
  e << s;
  return e.c_str();
}

}  // namespace

std::string_view KeySpec::leaf() const { return leaf_of(path); }
std::string_view KeySpec::parent() const { return parent_of(path); }

std::vector<std::string> KeySpec::choice_list() const {
  std::vector<std::string> out;
  std::string_view rest = choices;
  while (!rest.empty()) {
    auto bar = rest.find('|');
    out.emplace_back(rest.substr(0, bar));
    if (bar == std::string_view::npos) break;
    rest.remove_prefix(bar + 1);
  }
  return out;
}

const std::vector<KeySpec>& config_schema() {
  static const std::vector<KeySpec> schema = build_schema();
  return schema;
}

const KeySpec* find_key(std::string_view path) {
  for (const auto& k : config_schema())
    if (k.path == path) return &k;
  return nullptr;
}

const std::vector<std::string>& config_sections() {
  static const std::vector<std::string> sections = [] {
    std::vector<std::string> out;
    for (const auto& k : config_schema()) {
      std::string_view p = k.parent();
      // Every ancestor of a key is a section ("model" for "model.moe.top_k").
      std::vector<std::string> chain;
      while (!p.empty()) {
        chain.emplace_back(p);
        p = parent_of(p);
      }
      for (auto it = chain.rbegin(); it != chain.rend(); ++it)
        if (std::find(out.begin(), out.end(), *it) == out.end()) out.push_back(*it);
    }
    return out;
  }();
  return sections;
}

bool is_section(std::string_view path) {
  const auto& s = config_sections();
  return std::find(s.begin(), s.end(), path) != s.end();
}

std::string suggest_key(std::string_view unknown_path) {
  const std::string u = lower(unknown_path);
  const std::string_view u_leaf = leaf_of(u), u_parent = parent_of(u);
  // Short names tolerate fewer edits, or "tp" would suggest "pp".
  const size_t limit = std::max<size_t>(1, std::min<size_t>(3, u_leaf.size() / 3));

  std::string best;
  size_t best_score = limit + 1;
  bool best_same_parent = false;
  auto consider = [&](std::string_view cand, std::string_view aka) {
    const std::string_view c_leaf = leaf_of(cand), c_parent = parent_of(cand);
    const bool same_parent = c_parent == u_parent;
    // Right name in the wrong section (model.lr) costs one edit.
    const size_t move = same_parent ? 0 : 1;
    // Scores above the limit are never suggested: limit + 1 stands for all of them.
    size_t score = osa_distance(u, cand, limit);
    score = std::min(score, osa_distance(u_leaf, c_leaf, limit) + move);
    if (u_leaf.size() >= 4 && c_leaf.size() > u_leaf.size() && c_leaf.substr(0, u_leaf.size()) == u_leaf)
      score = std::min(score, 1 + move);  // "warmup" -> "warmup_steps"
    std::string_view rest = aka;
    while (!rest.empty()) {
      auto sp = rest.find(' ');
      if (rest.substr(0, sp) == u_leaf) score = std::min(score, move);
      if (sp == std::string_view::npos) break;
      rest.remove_prefix(sp + 1);
    }
    if (score < best_score || (score == best_score && same_parent && !best_same_parent)) {
      best = std::string(cand);
      best_score = score;
      best_same_parent = same_parent;
    }
  };
  for (const auto& s : config_sections()) consider(s, "");
  for (const auto& k : config_schema()) consider(k.path, k.aka);
  return best_score <= limit ? best : std::string();
}

std::string type_phrase(KeyType t) {
  switch (t) {
    case KeyType::Int: return "an integer";
    case KeyType::Int64: return "an integer";
    case KeyType::UInt64: return "a non-negative integer";
    case KeyType::Double: return "a number";
    case KeyType::Bool: return "true or false";
    case KeyType::String: return "a string";
    case KeyType::StringList: return "a string or a list of strings";
    case KeyType::IntList: return "a list of integers";
  }
  return "a value";
}

std::string value_yaml(const KeySpec& k, const Config& c) {
  // The accessors are non-const only because one table serves reads and writes.
  Config& m = const_cast<Config&>(c);
  switch (k.type) {
    case KeyType::Int: return std::to_string(std::get<int& (*)(Config&)>(k.field)(m));
    case KeyType::Int64: return std::to_string(std::get<int64_t& (*)(Config&)>(k.field)(m));
    case KeyType::UInt64: return std::to_string(std::get<uint64_t& (*)(Config&)>(k.field)(m));
    case KeyType::Double: return format_double(std::get<double& (*)(Config&)>(k.field)(m));
    case KeyType::Bool: return std::get<bool& (*)(Config&)>(k.field)(m) ? "true" : "false";
    case KeyType::String: return emit_string(std::get<std::string& (*)(Config&)>(k.field)(m));
    case KeyType::StringList: {
      YAML::Emitter e;
      e << YAML::Flow << YAML::BeginSeq;
      for (const auto& s : std::get<std::vector<std::string>& (*)(Config&)>(k.field)(m)) e << s;
      e << YAML::EndSeq;
      return e.c_str();
    }
    case KeyType::IntList: {
      std::string out = "[";
      for (int x : std::get<std::vector<int>& (*)(Config&)>(k.field)(m)) {
        if (out.size() > 1) out += ", ";
        out += std::to_string(x);
      }
      return out + "]";
    }
  }
  return "";
}

std::string allowed_phrase(const KeySpec& k) {
  if (!k.choices.empty()) {
    std::string s;
    for (const auto& ch : k.choice_list()) s += (s.empty() ? "" : " | ") + ch;
    if (k.open_choice) s += " | a path";
    return s;
  }
  const bool has_min = !std::isnan(k.min), has_max = !std::isnan(k.max);
  if (has_min && has_max && !k.min_exclusive && !k.max_exclusive)
    return format_bound(k, k.min) + " .. " + format_bound(k, k.max);
  std::string s;
  if (has_min) s = (k.min_exclusive ? "> " : ">= ") + format_bound(k, k.min);
  if (has_max) s += (s.empty() ? "" : " and ") + std::string(k.max_exclusive ? "< " : "<= ") + format_bound(k, k.max);
  return s.empty() ? type_phrase(k.type) : s;
}

std::optional<std::string> check_key_value(const KeySpec& k, const Config& c) {
  Config& m = const_cast<Config&>(c);
  const std::string key(k.path);
  if (k.type == KeyType::String) {
    const std::string& v = std::get<std::string& (*)(Config&)>(k.field)(m);
    if (k.choices.empty()) return std::nullopt;
    for (const auto& ch : k.choice_list())
      if (v == ch) return std::nullopt;
    if (k.open_choice && !v.empty()) return std::nullopt;
    return key + ": must be one of " + allowed_phrase(k) + ", got '" + v + "'";
  }
  if (k.type == KeyType::Bool || k.type == KeyType::StringList) return std::nullopt;
  if (k.type == KeyType::IntList) {
    for (int x : std::get<std::vector<int>& (*)(Config&)>(k.field)(m))
      if (!std::isnan(k.min) && x < k.min)
        return key + ": every entry must be >= " + format_bound(k, k.min) + ", got " + value_yaml(k, c);
    return std::nullopt;
  }

  const double v = numeric_value(k, m);
  const std::string shown = value_yaml(k, c);
  if (!std::isfinite(v)) return key + ": must be a finite number, got " + shown;
  const bool low = !std::isnan(k.min) && (k.min_exclusive ? v <= k.min : v < k.min);
  const bool high = !std::isnan(k.max) && (k.max_exclusive ? v >= k.max : v > k.max);
  if (low || high) return key + ": must be " + allowed_phrase(k) + ", got " + shown;
  return std::nullopt;
}

std::string config_schema_help() {
  const Config defaults;
  std::ostringstream os;
  std::string section;
  for (const auto& k : config_schema()) {
    std::string top(k.path.substr(0, k.path.find('.')));
    if (top != section) {
      os << (section.empty() ? "" : "\n") << top << ":\n";
      section = top;
    }
    std::string name(k.path);
    std::string def = value_yaml(k, defaults);
    std::string allowed = allowed_phrase(k);
    os << "  " << name << std::string(name.size() < 30 ? 30 - name.size() : 1, ' ')
       << "default " << def;
    if (allowed != type_phrase(k.type)) os << "  (" << allowed << ")";
    else os << "  (" << type_phrase(k.type) << ")";
    os << "\n      " << k.help << "\n";
  }
  return os.str();
}

}  // namespace trainer
