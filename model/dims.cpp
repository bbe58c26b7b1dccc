#include "model/dims.h"

#include <cmath>

namespace trainer {

ops::Rope rope_of(const ModelConfig& m) {
  ops::Rope r(float(m.rope_theta));
  const RopeScalingConfig& s = m.rope_scaling;
  r.scaling = s.type == "linear" ? ops::RopeScaling::Linear
              : s.type == "llama3" ? ops::RopeScaling::Llama3
                                   : ops::RopeScaling::None;
  r.factor = s.factor;
  r.low_freq_factor = s.low_freq_factor;
  r.high_freq_factor = s.high_freq_factor;
  r.original_max_pos = double(s.original_max_seq_len);
  return r;
}

ModelDims make_dims(const Config& c, int64_t micro_batch, int64_t seq_len, DType storage) {
  ModelDims d;
  d.act = storage;
  d.llama = c.model.arch == "llama";
  d.tied = c.model.tied();
  d.B = micro_batch;
  d.T = seq_len;
  d.C = c.model.d_model;
  d.V = c.model.vocab_size;
  d.L = c.model.n_layers;
  d.Hq = c.model.n_heads;
  d.Hkv = c.kv_heads();
  d.D = c.head_dim();
  d.F = c.d_ff();
  d.max_seq = c.model.max_seq_len;
  d.eps = float(c.model.norm_eps);
  d.rope = rope_of(c.model);
  d.qkv_bias = !d.llama || c.model.attn_bias != "none";
  d.o_bias = !d.llama || c.model.attn_bias == "qkvo";
  d.window = c.model.sliding_window;
  d.documents = c.data.documents == "separate";
  // The schedules that split the backward (pipeline/schedule.h: splits_backward).
  d.split_backward = c.parallel.pp_schedule == "zb-h1";
  d.recompute = c.train.recompute == "full"        ? Recompute::Full
                : c.train.recompute == "selective" ? Recompute::Selective
                                                   : Recompute::None;
  d.recompute_layers = c.train.recompute_layers;
  if (c.model.moe.num_experts > 0) {
    d.E = c.model.moe.num_experts;
    d.K = c.model.moe.top_k;
    d.Fm = c.moe_d_ff();
    d.moe_every = c.model.moe.every;
    d.normalize_topk = c.model.moe.normalize_topk;
    d.aux_coeff = float(c.model.moe.aux_loss_coeff);
    if (c.model.moe.capacity_factor > 0)
      d.capacity = int64_t(std::ceil(c.model.moe.capacity_factor * double(d.N() * d.K) / double(d.E)));
  }
  return d;
}

}  // namespace trainer
