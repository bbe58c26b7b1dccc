// A loss mask beside a Megatron dataset (PREFIX.lossmask, written by
// scripts/prepare_corpus.py --chat): which tokens a model is trained to
// predict. Fine-tuning on chat data learns the assistant's replies only; the
// rest of a conversation is context.
//
// Layout: "TRLMASK1" (8 bytes), u64 little-endian token count, then one byte
// per token of the dataset's stream (its sequences in index order): 1 = the
// token is a target, 0 = it is not. The count must equal the dataset's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/token_file.h"

namespace trainer {

class LossMaskFile {
 public:
  // Opens and checks `path` against the dataset's token count; throws
  // std::runtime_error naming the file and what is wrong.
  LossMaskFile(const std::string& path, int64_t tokens);
  // mask bytes of stream tokens [start, start + n) into out.
  void read(int64_t start, int64_t n, uint8_t* out) const;
  int64_t ones() const { return ones_; }  // tokens that are targets
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  int64_t ones_ = 0;
};

// The mask beside a Megatron prefix, when PREFIX.lossmask exists; else null.
std::unique_ptr<LossMaskFile> open_loss_mask(const std::string& prefix, int64_t tokens);

}  // namespace trainer
