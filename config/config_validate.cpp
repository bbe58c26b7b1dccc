// Range and cross-key checks. Types were settled by the loader; here every
// message names the keys involved, their values and what would be accepted.
#include <cctype>
#include <cmath>
#include <stdexcept>
#include <string>

#include "config/config.h"
#include "config/config_schema.h"
#include "data/dataset_blend.h"

namespace trainer {

namespace {

std::string kv(const char* key, int64_t v) { return std::string(key) + "=" + std::to_string(v); }

class Checker {
 public:
  explicit Checker(const Config& c) : c_(c) {}
  [[noreturn]] void fail(const std::string& msg) const {
    throw ConfigError(c_.source + ": " + msg);
  }
  void require(bool ok, const std::string& msg) const {
    if (!ok) fail(msg);
  }

 private:
  const Config& c_;
};

void check_parallel(const Config& c, int world, const Checker& ck) {
  const auto& p = c.parallel;
  const std::string procs = std::to_string(world);
  // One dimension alone already asks for more processes than exist: say so in
  // those words, since "the product must equal the world size" hides which key.
  auto needs = [&](const char* key, int v) {
    if (v > world)
      ck.fail(kv(key, v) + " needs " + std::to_string(v) + " processes, this run has " + procs +
              " (launch " + std::to_string(v) + " processes with torchrun/mpirun/srun, or set " + key + "=1)");
  };
  needs("parallel.tp", p.tp);
  needs("parallel.pp", p.pp);
  needs("parallel.cp", p.cp);
  needs("parallel.ep", p.ep);
  if (p.dp > 0) needs("parallel.dp", p.dp);

  const int64_t model_parallel = int64_t(p.tp) * p.pp * p.cp;
  const std::string mp_text = "parallel.tp x pp x cp = " + std::to_string(p.tp) + " x " + std::to_string(p.pp) +
                              " x " + std::to_string(p.cp) + " = " + std::to_string(model_parallel);
  if (p.dp > 0) {
    const int64_t total = model_parallel * p.dp;
    ck.require(total == world, mp_text + " times parallel.dp=" + std::to_string(p.dp) + " is " +
                                   std::to_string(total) + " processes, this run has " + procs +
                                   " (they must be equal; parallel.dp=0 picks dp automatically)");
  } else {
    ck.require(world % model_parallel == 0,
               mp_text + " does not divide the " + procs + " processes of this run");
  }
  const int dp = data_parallel_size(c, world);

  if (p.ep > 1) {
    ck.require(c.model.moe.num_experts > 0,
               kv("parallel.ep", p.ep) + " splits experts, but model.moe.num_experts=0 (a dense model); "
               "set parallel.ep=1 or model.moe.num_experts > 0");
    ck.require((int64_t(dp) * p.cp) % p.ep == 0,
               kv("parallel.ep", p.ep) + " must divide data-parallel x parallel.cp = " + std::to_string(dp) + " x " +
                   std::to_string(p.cp) + " (experts are spread over those ranks)");
    ck.require(c.model.moe.num_experts % p.ep == 0,
               kv("model.moe.num_experts", c.model.moe.num_experts) + " must be divisible by " +
                   kv("parallel.ep", p.ep) + " (each expert-parallel rank holds the same number of experts)");
  }
  if (p.tp > 1) {
    ck.require(c.model.n_heads % p.tp == 0,
               kv("model.n_heads", c.model.n_heads) + " must be divisible by " + kv("parallel.tp", p.tp) +
                   " (each tensor-parallel rank holds whole heads)");
    ck.require(c.kv_heads() % p.tp == 0 || p.tp % c.kv_heads() == 0,
               "key/value heads (model.n_kv_heads, 0 = n_heads) = " + std::to_string(c.kv_heads()) + " and " +
                   kv("parallel.tp", p.tp) +
                   ": one must divide the other (tp splits the key/value heads, or replicates each on "
                   "tp / n_kv_heads ranks)");
    bool any_dense = false;
    for (int64_t i = 0; i < c.model.n_layers; ++i)
      any_dense |= c.model.moe.num_experts == 0 || (i + 1) % c.model.moe.every != 0;
    if (any_dense)
      ck.require(c.d_ff() % p.tp == 0,
                 "model.d_ff=" + std::to_string(c.d_ff()) + " (0 = the architecture's default) must be divisible by " +
                     kv("parallel.tp", p.tp) + " (each tensor-parallel rank holds d_ff / tp FFN columns)");
    if (c.model.moe.num_experts > 0)
      ck.require(c.moe_d_ff() % p.tp == 0,
                 "model.moe.d_ff=" + std::to_string(c.moe_d_ff()) + " (0 = model.d_ff) must be divisible by " +
                     kv("parallel.tp", p.tp) + " (each expert's FFN columns are split like the dense FFN's)");
    if (p.sp)
      ck.require((c.train.seq_len / p.cp) % p.tp == 0,
                 kv("train.seq_len", c.train.seq_len) + (p.cp > 1 ? " / " + kv("parallel.cp", p.cp) : std::string()) +
                     " must be divisible by " + kv("parallel.tp", p.tp) +
                     " when parallel.sp=true (the sequence is split across the tensor-parallel group)");
  }
  ck.require(!p.sp || p.tp > 1,
             "parallel.sp=true splits the sequence inside a tensor-parallel group, but " + kv("parallel.tp", p.tp) +
                 ": set parallel.tp > 1 or parallel.sp=false");
  if (p.pp > 1)
    ck.require(c.model.n_layers >= p.pp,
               kv("parallel.pp", p.pp) + " needs at least one layer per stage, but " +
                   kv("model.n_layers", c.model.n_layers));
  if (p.pp > 1)
    ck.require(p.zero_stage <= 1,
               kv("parallel.zero_stage", p.zero_stage) + " with " + kv("parallel.pp", p.pp) +
                   ": ZeRO-2/3 reduce (and ZeRO-3 gathers) every micro-batch, and a pipeline keeps many "
                   "micro-batches in flight, so the gradient traffic would grow with them (DeepSpeed refuses it "
                   "too); use parallel.zero_stage 0 or 1 with pipeline parallelism");
  if (p.pp_schedule == "zb-h1")
    ck.require(p.zero_stage <= 1,
               "parallel.pp_schedule=zb-h1 with " + kv("parallel.zero_stage", p.zero_stage) +
                   ": the schedule runs a micro-batch's weight gradients after the input gradients of later "
                   "micro-batches, while ZeRO-2/3 hold a unit's gradient buffer (and ZeRO-3 its gathered weights) "
                   "only during its backward; use parallel.zero_stage 0 or 1, or another schedule");
  if (p.pp_schedule == "zb-h1")
    ck.require(c.train.recompute == "none",
               "parallel.pp_schedule=zb-h1 with train.recompute=" + c.train.recompute +
                   ": the schedule computes a micro-batch's weight gradients after later micro-batches' backward, "
                   "from the layer inputs recompute drops (they would be recomputed twice); use "
                   "train.recompute=none with zb-h1, or parallel.pp_schedule=1f1b");
  ck.require(c.train.recompute_layers <= c.model.n_layers,
             kv("train.recompute_layers", c.train.recompute_layers) + " exceeds " +
                 kv("model.n_layers", c.model.n_layers) + " (0 recomputes every layer)");
  // Interleaving: pp_virtual model chunks per rank, pp x pp_virtual virtual stages.
  const bool interleaved = p.pp_schedule == "interleaved";
  const int stages = interleaved ? p.pp * p.pp_virtual : p.pp;
  if (interleaved) {
    ck.require(p.pp > 1, "parallel.pp_schedule=interleaved needs " + kv("parallel.pp", p.pp) + " > 1");
    ck.require(c.model.n_layers >= stages,
               "parallel.pp_schedule=interleaved with " + kv("parallel.pp", p.pp) + " x " +
                   kv("parallel.pp_virtual", p.pp_virtual) + " = " + std::to_string(stages) +
                   " virtual stages needs a layer each, but " + kv("model.n_layers", c.model.n_layers));
    const int64_t m = c.train.micro_batch_size > 0 ? c.train.global_batch_size / (int64_t(c.train.micro_batch_size) * dp) : 0;
    ck.require(m % p.pp == 0,
               "parallel.pp_schedule=interleaved runs micro-batches in groups of " + kv("parallel.pp", p.pp) +
                   ", but a step has " + std::to_string(m) +
                   " (train.global_batch_size / (train.micro_batch_size x data parallel)); make it a multiple of pp "
                   "or use parallel.pp_schedule=1f1b");
  }
  if (!p.pp_layers.empty()) {
    int64_t sum = 0;
    std::string list;
    for (int n : p.pp_layers) {
      sum += n;
      list += (list.empty() ? "" : ", ") + std::to_string(n);
    }
    ck.require(int(p.pp_layers.size()) == stages,
               "parallel.pp_layers=[" + list + "] has " + std::to_string(p.pp_layers.size()) + " entries, one per " +
                   (interleaved ? "virtual stage is needed (parallel.pp x parallel.pp_virtual = " + std::to_string(stages) + ")"
                                : "pipeline stage is needed (" + kv("parallel.pp", p.pp) + ")"));
    ck.require(sum == c.model.n_layers, "parallel.pp_layers=[" + list + "] sums to " + std::to_string(sum) +
                                            " layers, " + kv("model.n_layers", c.model.n_layers));
  }
  if (p.cp > 1)
    ck.require(c.train.seq_len % (2 * p.cp) == 0,
               kv("train.seq_len", c.train.seq_len) + " must be divisible by 2 x " + kv("parallel.cp", p.cp) + " = " +
                   std::to_string(2 * p.cp) + " (each context-parallel rank holds two equal chunks of the sequence)");
}

void check_model(const Config& c, const Checker& ck) {
  const auto& m = c.model;
  ck.require(m.d_model % m.n_heads == 0,
             kv("model.d_model", m.d_model) + " must be divisible by " + kv("model.n_heads", m.n_heads) +
                 " (head_dim = d_model / n_heads)");
  if (m.n_kv_heads > 0) {
    ck.require(m.n_kv_heads <= m.n_heads,
               kv("model.n_kv_heads", m.n_kv_heads) + " must be <= " + kv("model.n_heads", m.n_heads));
    ck.require(m.n_heads % m.n_kv_heads == 0,
               kv("model.n_heads", m.n_heads) + " must be a multiple of " + kv("model.n_kv_heads", m.n_kv_heads) +
                   " (each key/value head serves the same number of query heads)");
  }
  if (m.arch == "llama")
    ck.require(c.head_dim() % 2 == 0,
               "head_dim = model.d_model / model.n_heads = " + std::to_string(m.d_model) + " / " +
                   std::to_string(m.n_heads) + " = " + std::to_string(c.head_dim()) +
                   " must be even for llama (RoPE rotates pairs of dimensions)");
  const auto& rs = m.rope_scaling;
  if (rs.type != "none") {
    ck.require(m.arch == "llama", "model.rope_scaling.type=" + rs.type +
                                      " with model.arch=gpt2: gpt2 has learned positions, no RoPE to scale");
    if (rs.type == "llama3") {
      ck.require(rs.original_max_seq_len >= 1,
                 "model.rope_scaling.type=llama3 needs model.rope_scaling.original_max_seq_len >= 1 (the "
                 "pretraining context, original_max_position_embeddings in config.json)");
      ck.require(rs.high_freq_factor > rs.low_freq_factor,
                 "model.rope_scaling.high_freq_factor=" + std::to_string(rs.high_freq_factor) +
                     " must be > model.rope_scaling.low_freq_factor=" + std::to_string(rs.low_freq_factor));
    }
  }
  ck.require(m.attn_bias == "none" || m.arch == "llama",
             "model.attn_bias=" + m.attn_bias + " with model.arch=gpt2: gpt2 always has its attention biases "
             "(the key is for llama models)");
  if (m.moe.num_experts > 0) {
    ck.require(m.moe.top_k <= m.moe.num_experts,
               kv("model.moe.top_k", m.moe.top_k) + " must be <= " + kv("model.moe.num_experts", m.moe.num_experts));
    ck.require(m.moe.every <= m.n_layers,
               kv("model.moe.every", m.moe.every) + " with " + kv("model.n_layers", m.n_layers) +
                   " makes no layer a MoE layer (layer i is MoE when (i + 1) % every == 0); use every <= n_layers");
  }
}

void check_train(const Config& c, int world, const Checker& ck) {
  const auto& t = c.train;
  ck.require(t.seq_len <= c.model.max_seq_len,
             kv("train.seq_len", t.seq_len) + " must be <= " + kv("model.max_seq_len", c.model.max_seq_len));
  if (t.global_batch_size > 0) {  // 0 is "auto", resolved by resolve_config
    const int dp = data_parallel_size(c, world);
    const int64_t step = int64_t(t.micro_batch_size) * dp;
    ck.require(t.global_batch_size % step == 0,
               kv("train.global_batch_size", t.global_batch_size) + " must be a multiple of " +
                   "train.micro_batch_size x data-parallel size = " + std::to_string(t.micro_batch_size) + " x " +
                   std::to_string(dp) + " = " + std::to_string(step) + " (gradient accumulation runs whole micro-batches)");
  }
  {
    int exponent = 0;
    const double mantissa = std::frexp(t.initial_loss_scale, &exponent);
    ck.require(mantissa == 0.5, "train.initial_loss_scale=" + value_yaml(*find_key("train.initial_loss_scale"), c) +
                                    " must be a power of two (2^k scales and unscales every gradient exactly)");
  }
  if (t.device == "cpu")
    ck.require(t.precision == "auto" || t.precision == "fp32",
               "train.precision=" + t.precision + " is not available with train.device=cpu (the CPU backend "
               "computes in fp32); use train.precision: fp32 or auto, or train.device: cuda");
}

void check_optim(const Config& c, const Checker& ck) {
  const auto& o = c.optim;
  ck.require(o.min_lr <= o.lr, "optim.min_lr=" + value_yaml(*find_key("optim.min_lr"), c) +
                                   " must be <= optim.lr=" + value_yaml(*find_key("optim.lr"), c));
  // A warm-up longer than the run or the decay is allowed (a quick
  // `--set train.steps=10` of any config must run): config_warnings() says
  // what the schedule does then, and optim/lr_schedule.cpp handles it.
}

void check_data_and_io(const Config& c, const Checker& ck) {
  ck.require(!c.data.train.empty(),
             "data.train is empty: set data.train to your token files (e.g. 'data: {train: [data/train.bin]}' "
             "in the YAML, or --set data.train=data/train.bin)");
  // Only the entry syntax (weights) is checked here; files are opened, and
  // globs expanded, when the sampler is built.
  auto check_entries = [&](const char* key, const std::vector<std::string>& files) {
    for (size_t i = 0; i < files.size(); ++i) {
      const std::string k = std::string(key) + "[" + std::to_string(i) + "]";
      ck.require(!files[i].empty(), k + " is an empty path");
      try {
        parse_data_entry(files[i], k);
      } catch (const std::runtime_error& e) {
        ck.fail(e.what());
      }
    }
  };
  check_entries("data.train", c.data.train);
  check_entries("data.valid", c.data.valid);
  ck.require(!c.run.name.empty() && c.run.name.find('/') == std::string::npos,
             "run.name='" + c.run.name + "' must be a non-empty name without '/' (use run.dir for a path)");
}

void check_log(const Config& c, const Checker& ck) {
  if (c.log.trace.empty()) return;
  const std::optional<StepRange> r = parse_step_range(c.log.trace);
  ck.require(r.has_value(), "log.trace='" + c.log.trace +
                                "' is not a window of steps: write FIRST-LAST (e.g. 10-12) or one step, counted from 1");
  ck.require(r->last - r->first < 1000, "log.trace='" + c.log.trace +
                                            "' spans more than 1000 steps: a trace holds every span of every step in "
                                            "memory; trace a few steps");
}

}  // namespace

std::optional<StepRange> parse_step_range(const std::string& text) {
  StepRange r;
  size_t used = 0;
  try {
    r.first = std::stoll(text, &used);
    if (used == text.size()) {
      r.last = r.first;
    } else {
      if (text[used] != '-') return std::nullopt;
      const std::string rest = text.substr(used + 1);
      size_t used2 = 0;
      r.last = std::stoll(rest, &used2);
      if (used2 != rest.size() || rest.empty() || !std::isdigit(static_cast<unsigned char>(rest[0]))) return std::nullopt;
    }
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (!std::isdigit(static_cast<unsigned char>(text[0])) || r.first < 1 || r.last < r.first) return std::nullopt;
  return r;
}

void validate_config(const Config& c, int world_size) {
  const Checker ck(c);
  if (world_size < 1) ck.fail("world size " + std::to_string(world_size) + " must be >= 1");
  for (const auto& k : config_schema())
    if (auto problem = check_key_value(k, c)) ck.fail(*problem);
  check_parallel(c, world_size, ck);
  check_model(c, ck);
  check_train(c, world_size, ck);
  check_optim(c, ck);
  check_data_and_io(c, ck);
  check_log(c, ck);
}

}  // namespace trainer
