#include "interop/reference_dump.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "checkpoint/safetensors.h"

namespace trainer {

ReferenceDump::ReferenceDump(const std::string& dir, const Config& cfg, Model& model,
                             int64_t micro_steps)
    : dir_(dir), model_(model), steps_(cfg.train.steps), micro_steps_(micro_steps) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error(dir + ": cannot create dump directory: " + ec.message());
  std::ofstream(dir + "/config.yaml") << config_to_yaml(cfg);
  write_safetensors(dir + "/init.safetensors", named(model.param_tensors, ""));
  const ModelDims& d = model.dims;
  inputs_.resize(size_t(steps_ * micro_steps_ * d.N()));
  targets_.resize(inputs_.size());
}

std::vector<std::pair<std::string, Tensor>> ReferenceDump::named(const std::vector<Tensor>& ts,
                                                                 const std::string& prefix) const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < ts.size(); ++i) out.push_back({prefix + model_.params[i].spec.name, ts[i]});
  return out;
}

void ReferenceDump::before_forward(int64_t step, int64_t micro) {
  const int64_t N = model_.dims.N();
  const size_t at = size_t((step * micro_steps_ + micro) * N);
  const Activations& a = activations_of(model_, micro);  // held by the training step
  std::memcpy(&inputs_[at], a.ids.data, size_t(N) * 4);
  std::memcpy(&targets_[at], a.targets.data, size_t(N) * 4);
  if (step == 0 && micro == 0) {
    // A gradient-free forward on the same slot, which the training step
    // keeps: its forward then overwrites the logits with their gradient.
    const MicroBatch mb{micro, false};
    embedding_forward(model_, mb);
    blocks_forward(model_, mb, 0, model_.dims.L);
    head_forward(model_, mb, 0.f);
    logits0_.assign(a.logits.f32(), a.logits.f32() + a.logits.numel());
  }
}

void ReferenceDump::after_step0_backward() {
  for (const Tensor& g : model_.grad_tensors) grads0_.insert(grads0_.end(), g.f32(), g.f32() + g.numel());
}

void ReferenceDump::record_step(double lm_loss, double aux_loss, double lr, double grad_norm) {
  lm_.push_back(lm_loss);
  aux_.push_back(aux_loss);
  lr_.push_back(lr);
  norm_.push_back(grad_norm);
}

void ReferenceDump::finish() {
  const ModelDims& d = model_.dims;
  write_safetensors(dir_ + "/batches.safetensors",
                    {{"inputs", Tensor(inputs_.data(), DType::I32, {steps_, micro_steps_, d.B, d.T})},
                     {"targets", Tensor(targets_.data(), DType::I32, {steps_, micro_steps_, d.B, d.T})}});
  std::vector<std::pair<std::string, Tensor>> s0;
  s0.push_back({"logits", Tensor(logits0_.data(), DType::F32, {d.N(), d.V})});
  size_t off = 0;
  for (size_t i = 0; i < model_.params.size(); ++i) {
    Tensor g = model_.grad_tensors[i];
    g.data = grads0_.data() + off;
    off += size_t(g.numel());
    s0.push_back({"grad." + model_.params[i].spec.name, g});
  }
  write_safetensors(dir_ + "/step0.safetensors", s0);
  write_safetensors(dir_ + "/final.safetensors", named(model_.param_tensors, ""));
  std::ofstream js(dir_ + "/losses.json");
  auto arr = [&](const char* key, const std::vector<double>& v, bool last) {
    js << "\"" << key << "\": [";
    char b[40];
    for (size_t i = 0; i < v.size(); ++i) {
      std::snprintf(b, sizeof b, "%.17g", v[i]);
      js << (i ? ", " : "") << b;
    }
    js << "]" << (last ? "" : ", ");
  };
  js << "{";
  arr("lm_loss", lm_, false);
  arr("aux_loss", aux_, false);
  arr("lr", lr_, false);
  arr("grad_norm", norm_, true);
  js << "}\n";
}

}  // namespace trainer
