#include "model/kv_cache.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "comm/process_group.h"
#include "core/device_memory.h"
#include "kernels/ops.h"
#include "model/layers.h"

namespace trainer {

ModelDims decode_dims(const ModelDims& trained, int64_t T) {
  ModelDims d = trained;
  d.B = 1;
  d.T = T;
  d.capacity = 0;  // no token dropping at inference: each token's routing is its own
  d.documents = false;  // the context is one document
  d.act = DType::F32;
  d.E_local = 0;
  d.ep = 1;
  d.tp = 1;
  d.sp = false;
  d.cp = 1;
  d.cp_rank = 0;
  d.V_offset = 0;
  d.first_layer = 0;
  d.model_layers = 0;
  d.has_embedding = d.has_head = true;
  d.split_backward = false;
  d.recompute = Recompute::None;
  d.recompute_layers = 0;
  return d;
}

struct KvDecoder::Chunk {
  ModelDims dims;
  Arena arena;
  Activations acts;
};

KvDecoder::KvDecoder(const ModelDims& trained, const std::vector<std::vector<float>>& weights, int64_t window,
                     Device device)
    : dims_(decode_dims(trained, 1)), window_(window), device_(device) {
  if (window < 1) throw std::logic_error("KvDecoder: the window must hold at least one position");
  if (!dims_.llama && window > dims_.max_seq)
    throw std::logic_error("KvDecoder: a window of " + std::to_string(window) +
                           " positions is longer than the learned position table (" + std::to_string(dims_.max_seq) +
                           ")");
  build_model(model_, dims_, 0.0, device, ModelStorage{true, false});
  if (weights.size() != model_.param_tensors.size())
    throw std::logic_error("KvDecoder: " + std::to_string(weights.size()) + " weight tensors for a model of " +
                           std::to_string(model_.param_tensors.size()));
  for (size_t i = 0; i < weights.size(); ++i) {
    if (int64_t(weights[i].size()) != model_.param_tensors[i].numel())
      throw std::logic_error("KvDecoder: size mismatch of parameter " + model_.params[i].spec.name);
    write_from_host(model_.param_tensors[i], weights[i].data());
  }
  const int64_t kv = dims_.Hkv * dims_.D;
  std::vector<TensorSpec> specs;
  for (int64_t l = 0; l < dims_.L; ++l) {
    specs.push_back({"k" + std::to_string(l), {window, kv}, DType::F32});
    specs.push_back({"v" + std::to_string(l), {window, kv}, DType::F32});
  }
  specs.push_back({"positions", {window}, DType::I32});
  cache_arena_ = Arena("kv cache", arena_bytes(specs), device);
  const std::vector<Tensor> t = cache_arena_.alloc_all(specs);
  for (int64_t l = 0; l < dims_.L; ++l) {
    k_cache_.push_back(t[size_t(2 * l)]);
    v_cache_.push_back(t[size_t(2 * l + 1)]);
  }
  positions_ = t.back();
  std::vector<int32_t> pos(static_cast<size_t>(window));
  std::iota(pos.begin(), pos.end(), 0);
  write_from_host(positions_, pos.data());
}

KvDecoder::~KvDecoder() = default;

KvDecoder::Chunk& KvDecoder::chunk_of(int64_t n) {
  auto& c = chunks_[n];
  if (!c) {
    c = std::make_unique<Chunk>();
    c->dims = decode_dims(dims_, n);
    const auto specs = activation_specs(c->dims);
    c->arena = Arena("decode activations", arena_bytes(specs), device_);
    c->acts = bind_activations(c->dims, specs, c->arena.alloc_all(specs));
  }
  return *c;
}

std::vector<float> KvDecoder::append(const std::vector<int32_t>& tokens) {
  const int64_t n = int64_t(tokens.size()), p = cached_;
  if (n == 0) throw std::logic_error("KvDecoder::append: no tokens");
  if (p + n > window_)
    throw std::logic_error("KvDecoder::append: positions " + std::to_string(p) + ".." + std::to_string(p + n - 1) +
                           " do not fit in a window of " + std::to_string(window_));
  Chunk& c = chunk_of(n);
  const ModelDims& d = c.dims;
  Activations& a = c.acts;
  const Weights& w = model_.w;
  static SingleRankCommunicator solo_cpu("decode", 0, Device::CPU), solo_cuda("decode", 0, Device::CUDA);
  Communicator& solo = device_ == Device::CPU ? solo_cpu : solo_cuda;
  TensorParallel tp;
  tp.group = &solo;
  ContextParallel cp;
  cp.group = &solo;
  // Under a sliding window the chunk's first query (position p) sees back to
  // p - window: older cached keys are not read at all.
  const int64_t k_lo = d.window > 0 ? std::max<int64_t>(0, p - d.window) : 0;
  const Tensor q_pos = positions_.slice0(p, p + n), k_pos = positions_.slice0(k_lo, p + n);

  write_from_host(a.ids, tokens.data());
  const Tensor x0 = a.layers.empty() ? a.x_final : a.layers[0].x_in;
  ops::embedding_forward(x0, a.ids, w.tok_embed, false, 0, d.vocab());
  if (!d.llama) ops::embedding_forward(x0, q_pos, w.pos_embed, true, 0, d.max_seq);
  for (int64_t i = 0; i < d.L; ++i) {
    LayerActs& la = a.layers[size_t(i)];
    const LayerWeights& lw = w.layers[size_t(i)];
    const Tensor x_out = i + 1 < d.L ? a.layers[size_t(i + 1)].x_in : a.x_final;
    // The attention block of model/attention_block.cpp, against the cache.
    norm_forward(d, la.h1, la.mean1, la.rstd1, la.x_in, lw.attn_norm_w, lw.attn_norm_b);
    ops::linear_forward(la.q.view({n, d.Hq * d.D}), la.h1, lw.wq, lw.bq);
    ops::linear_forward(la.k.view({n, d.Hkv * d.D}), la.h1, lw.wk, lw.bk);
    ops::linear_forward(la.v.view({n, d.Hkv * d.D}), la.h1, lw.wv, lw.bv);
    if (d.llama) {
      ops::rope_forward_pos(la.q, la.q, d.rope, q_pos);
      ops::rope_forward_pos(la.k, la.k, d.rope, q_pos);
    }
    const Tensor kc = k_cache_[size_t(i)], vc = v_cache_[size_t(i)];
    ops::copy(kc.slice0(p, p + n), la.k.view({n, d.Hkv * d.D}));
    ops::copy(vc.slice0(p, p + n), la.v.view({n, d.Hkv * d.D}));
    ops::attention_forward_pos(la.o.view({1, n, d.Hq, d.D}), la.lse, la.q,
                               kc.slice0(k_lo, p + n).view({1, p + n - k_lo, d.Hkv, d.D}),
                               vc.slice0(k_lo, p + n).view({1, p + n - k_lo, d.Hkv, d.D}), q_pos, k_pos,
                               d.window, Tensor{});
    ops::linear_forward(la.x_mid, la.o, lw.wo, lw.bo);
    ops::add_inplace(la.x_mid, la.x_in);
    if (d.moe_layer(i))
      moe_block_forward(d, tp, cp, solo, lw, la, a.moe_out, x_out);
    else
      mlp_block_forward(d, tp, lw, la, x_out);
  }
  // Only the last row's logits are wanted: the next token's distribution.
  const Tensor last = a.x_final.slice0(n - 1, n), hf = a.hf.slice0(n - 1, n);
  const Tensor rstd = a.rstdf.slice0(n - 1, n), mean = d.llama ? Tensor{} : a.meanf.slice0(n - 1, n);
  norm_forward(d, hf, mean, rstd, last, w.final_norm_w, w.final_norm_b);
  const Tensor logits = a.logits.slice0(0, 1);
  ops::linear_forward(logits, hf, w.lm_head, {});
  cached_ = p + n;
  std::vector<float> host(size_t(logits.numel()));
  read_to_host(logits, host.data());
  host.resize(size_t(d.vocab()));
  return host;
}

}  // namespace trainer
