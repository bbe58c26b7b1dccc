// Which tokens a training sequence holds is a pure function of
// (seed, split, step, global sequence index): resuming needs only the step,
// and a different parallel layout sees the same global batch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainer/token_file.h"

namespace trainer {

class BatchSampler {
 public:
  // files: token files of one split (sampled in proportion to their size).
  BatchSampler(const std::vector<std::string>& files, const std::string& dtype, int64_t seq_len,
               int64_t vocab_size, uint64_t seed, const std::string& split_name);
  // Writes inputs/targets [seq_len] of global sequence `index` at `step`.
  void sequence(int64_t step, int64_t index, int32_t* inputs, int32_t* targets) const;
  int64_t total_tokens() const { return total_; }

 private:
  std::vector<std::unique_ptr<TokenFile>> files_;
  std::vector<int64_t> windows_;  // cumulative count of valid start positions
  int64_t seq_len_, vocab_;
  uint64_t seed_;
  int64_t total_ = 0;
};

}  // namespace trainer
