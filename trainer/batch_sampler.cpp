#include "trainer/batch_sampler.h"

#include <algorithm>
#include <stdexcept>

namespace trainer {

namespace {
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

BatchSampler::BatchSampler(const std::vector<std::string>& files, const std::string& dtype,
                           int64_t seq_len, int64_t vocab_size, uint64_t seed,
                           const std::string& split_name)
    : seq_len_(seq_len), vocab_(vocab_size), seed_(seed ^ (split_name == "train" ? 0 : 0x5eed)) {
  const int bytes = dtype == "uint32" ? 4 : 2;
  int64_t acc = 0;
  for (const auto& f : files) {
    auto tf = std::make_unique<TokenFile>(f, bytes);
    if (tf->size() < seq_len + 1)
      throw std::runtime_error(f + ": holds " + std::to_string(tf->size()) +
                               " tokens, fewer than one sequence (train.seq_len + 1 = " +
                               std::to_string(seq_len + 1) + ")");
    acc += tf->size() - seq_len;
    total_ += tf->size();
    windows_.push_back(acc);
    files_.push_back(std::move(tf));
  }
  if (files_.empty()) throw std::runtime_error("data." + split_name + ": no token files given");
}

void BatchSampler::sequence(int64_t step, int64_t index, int32_t* inputs, int32_t* targets) const {
  const uint64_t h = mix(seed_ ^ mix(uint64_t(step) * 0x9E3779B97F4A7C15ull ^ mix(uint64_t(index) + 1)));
  const int64_t pos = int64_t(h % uint64_t(windows_.back()));
  const size_t fi = size_t(std::upper_bound(windows_.begin(), windows_.end(), pos) - windows_.begin());
  const int64_t start = pos - (fi == 0 ? 0 : windows_[fi - 1]);
  const TokenFile& f = *files_[fi];
  for (int64_t t = 0; t <= seq_len_; ++t) {
    const uint32_t tok = f.at(start + t);
    if (int64_t(tok) >= vocab_)
      throw std::runtime_error(f.path() + ": token " + std::to_string(tok) + " at index " +
                               std::to_string(start + t) + " (byte offset " +
                               std::to_string((start + t) * f.token_bytes()) +
                               ") is >= model.vocab_size " + std::to_string(vocab_));
    if (t < seq_len_) inputs[t] = int32_t(tok);
    if (t > 0) targets[t - 1] = int32_t(tok);
  }
}

}  // namespace trainer
