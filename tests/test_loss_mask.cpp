// Loss masks (PREFIX.lossmask beside a Megatron dataset, data/loss_mask.h):
// fine-tuning on chat data trains on the assistant's tokens only.
//
// - The sampler makes a target -1 exactly where the token it predicts is
//   masked out; a mask of another length or with a byte other than 0/1 is
//   refused at start-up, naming the file.
// - A masked-out target contributes exactly nothing: its logit gradient row
//   is 0.0 bit for bit, and the model's gradient with a mask is the sum of
//   the gradients with one kept target at a time (fp32 floor).
// - The binary: dp 2 x pp 2 and a micro-batch of 1 (more accumulation) with
//   a loss mask and separate documents reproduce one process, so the mean
//   over the kept targets of the whole global batch does not depend on the
//   layout or the accumulation.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

#include "data/batch_sampler.h"
#include "e2e_util.h"
#include "kernels/ops.h"
#include "model/params.h"
#include "model/transformer.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

void write_mask(const fs::path& prefix, const std::vector<uint8_t>& mask, uint64_t count) {
  std::ofstream f(prefix.string() + ".lossmask", std::ios::binary);
  f.write("TRLMASK1", 8);
  f.write(reinterpret_cast<const char*>(&count), 8);
  f.write(reinterpret_cast<const char*>(mask.data()), std::streamsize(mask.size()));
}

// Chat-like documents: a prompt (masked out) then a reply (kept), lengths cycling.
void write_chat_data(const fs::path& prefix, const std::vector<uint16_t>& tokens) {
  std::vector<int64_t> sizes;
  std::vector<uint8_t> mask;
  const int64_t prompts[] = {9, 3, 17, 5}, replies[] = {6, 11, 2, 14};
  for (int64_t at = 0, i = 0; at < int64_t(tokens.size()); ++i) {
    const int64_t p = prompts[i % 4], r = replies[i % 4];
    const int64_t n = std::min(p + r, int64_t(tokens.size()) - at);
    sizes.push_back(n);
    for (int64_t t = 0; t < n; ++t) mask.push_back(t >= p ? 1 : 0);
    at += n;
  }
  e2e::write_megatron(prefix, tokens, sizes);
  write_mask(prefix, mask, mask.size());
}

std::string runtime_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

ModelDims tiny(int64_t T) {
  ModelDims d;
  d.B = 1;
  d.T = T;
  d.C = 16;
  d.V = 13;
  d.L = 2;
  d.Hq = 4;
  d.Hkv = 2;
  d.D = 4;
  d.F = 24;
  d.max_seq = 32;
  return d;
}

std::vector<std::vector<float>> grads_of(Model& m, const std::vector<int32_t>& ids, const std::vector<int32_t>& tg) {
  std::copy(ids.begin(), ids.end(), m.acts.ids.i32());
  std::copy(tg.begin(), tg.end(), m.acts.targets.i32());
  zero_grads(m);
  model_forward(m, 1.f);
  model_backward(m, 0.f);
  std::vector<std::vector<float>> g;
  for (const Tensor& t : m.grad_tensors) g.emplace_back(t.f32(), t.f32() + t.numel());
  return g;
}

}  // namespace

TEST_CASE("a loss mask beside a Megatron dataset makes the targets of masked-out tokens -1", "[data][loss_mask]") {
  const fs::path dir = fs::temp_directory_path() / ("trainer_lossmask_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<uint16_t> toks(300);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = uint16_t(i);  // token i is i: a window's start is its first token
  std::vector<uint8_t> mask(300);
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = (i / 7) % 3 == 0 ? 1 : 0;
  e2e::write_megatron(dir / "d", toks, {120, 180});
  write_mask(dir / "d", mask, 300);
  const int64_t T = 24;
  const BatchSampler s({(dir / "d").string()}, "uint16", T, 512, 5, "train");
  CHECK(s.masks_targets());
  std::printf("[loss mask] %s", s.describe().c_str());
  CHECK(s.describe().find("loss on 34.") != std::string::npos);
  int masked = 0;
  for (int64_t index = 0; index < 30; ++index) {
    std::vector<int32_t> in(T), tg(T);
    s.sequence(0, index, in.data(), tg.data());
    const int64_t start = in[0];
    for (int64_t t = 0; t < T; ++t) {
      const bool keep = mask[size_t(start + t + 1)] == 1;
      REQUIRE(tg[size_t(t)] == (keep ? int32_t(start + t + 1) : -1));
      masked += !keep;
    }
  }
  std::printf("[loss mask] 30 windows: %d targets masked out, every other one the next token\n", masked);
  CHECK(masked > 100);

  write_mask(dir / "d", mask, 299);
  std::string msg = runtime_error_of([&] { BatchSampler({(dir / "d").string()}, "uint16", T, 512, 5, "train"); });
  std::printf("[message] %s\n", msg.c_str());
  CHECK(msg.find("d.lossmask: a loss mask of 299 tokens beside a dataset of 300") != std::string::npos);
  mask[17] = 2;
  write_mask(dir / "d", mask, 300);
  msg = runtime_error_of([&] { BatchSampler({(dir / "d").string()}, "uint16", T, 512, 5, "train"); });
  std::printf("[message] %s\n", msg.c_str());
  CHECK(msg.find("byte 2 at offset 33 (token 17): a loss mask holds 0 or 1") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("masked-out targets contribute nothing: zero logit rows, and the gradient sums over kept targets",
          "[model][loss_mask]") {
  // The op: an ignored row's loss and logit gradient are exactly 0.
  std::vector<float> logits(4 * 7), losses(4), dlogits(4 * 7);
  test::fill_normal(logits, 3);
  std::vector<int32_t> targets = {2, -1, 6, -1};
  ops::cross_entropy_forward_backward(Tensor(losses.data(), DType::F32, {4}), Tensor(dlogits.data(), DType::F32, {4, 7}),
                                      Tensor(logits.data(), DType::F32, {4, 7}), Tensor(targets.data(), DType::I32, {4}),
                                      0.25f);
  for (int r : {1, 3}) {
    CHECK(losses[size_t(r)] == 0.f);
    for (int c = 0; c < 7; ++c) CHECK(dlogits[size_t(r * 7 + c)] == 0.f);
  }

  // The model: the gradient with a mask is the sum of one-kept-target gradients.
  const int64_t T = 14;
  Model m;
  build_model(m, tiny(T), 0.3, Device::CPU);
  init_parameters(m.params, m.param_tensors, 9);
  std::vector<int32_t> ids(T), tg(T);
  test::fill_ints(ids, 4, 0, 13);
  test::fill_ints(tg, 5, 0, 13);
  const std::vector<int> kept = {3, 4, 5, 9, 12, 13};
  std::vector<int32_t> masked(T, -1);
  for (int k : kept) masked[size_t(k)] = tg[size_t(k)];
  const auto whole = grads_of(m, ids, masked);
  std::vector<std::vector<float>> sum(whole.size());
  for (size_t g = 0; g < whole.size(); ++g) sum[g].assign(whole[g].size(), 0.f);
  for (int k : kept) {
    std::vector<int32_t> one(T, -1);
    one[size_t(k)] = tg[size_t(k)];
    const auto gk = grads_of(m, ids, one);
    for (size_t g = 0; g < gk.size(); ++g)
      for (size_t j = 0; j < gk[g].size(); ++j) sum[g][j] += gk[g][j];
  }
  double worst = 0;
  for (size_t g = 0; g < whole.size(); ++g) {
    double num = 0, den = 0;
    for (size_t j = 0; j < whole[g].size(); ++j) {
      num += (double(whole[g][j]) - sum[g][j]) * (double(whole[g][j]) - sum[g][j]);
      den += double(sum[g][j]) * sum[g][j];
    }
    worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
  }
  std::printf("[loss mask] gradient with 6 of 14 targets kept vs the sum of 6 one-target gradients: rel L2 %.1e "
              "(tol 1e-5)\n", worst);
  CHECK(worst < 1e-5);
}

TEST_CASE("a loss mask with separate documents: dp 2 x pp 2 and a micro-batch of 1 == one process",
          "[loss_mask][e2e]") {
  const fs::path data = fs::temp_directory_path() / ("trainer_lossmask_e2e_" + std::to_string(::getpid()));
  fs::create_directories(data);
  std::vector<uint16_t> toks;
  {
    std::ifstream in("/usr/share/common-licenses/GPL-3", std::ios::binary);
    for (char c; in.get(c);) toks.push_back(uint16_t(static_cast<unsigned char>(c)));
  }
  write_chat_data(data / "chat", toks);
  const std::string prefix = (data / "chat").string();
  const e2e::Setup s =
      e2e::make_setup("lossmask", "llama",
                      "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32}",
                      "train: [" + prefix + "], valid: [" + prefix + "], documents: separate");
  e2e::run_cases(s, "loss mask",
                 {{"mask dp2 x pp2", 4, "--set parallel.pp=2"},
                  {"mask micro-batch 1", 1, "--set train.micro_batch_size=1"}},
                 {"loss on "});
  fs::remove_all(s.dir);
  fs::remove_all(data);
}
