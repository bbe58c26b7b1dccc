// `trainer export --checkpoint DIR --out DIR [--dtype bf16|fp32] [--max-shard-size SIZE]`:
// a checkpoint of any layout (tp, pp, dp, ep, cp, any ZeRO stage: its
// pieces are assembled whole) as a Hugging Face model directory that
// transformers, vLLM and lm-eval-harness load (interop/hf_format.h),
// with the data's tokenizer files when the run had one.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace trainer {

struct ExportOptions {
  std::string checkpoint;  // a step directory, or a checkpoint root whose `latest` names one
  std::string out;
  DType dtype = DType::F32;
  uint64_t max_shard_bytes = 5ull << 30;  // as save_pretrained's default "5GB"
};

// Returns the lines to print (what was written). Throws ConfigError for a
// model with no Hugging Face twin, std::runtime_error naming the file for
// a checkpoint that does not load.
std::string export_to_hf(const ExportOptions& opt);

// "5GB", "200MB", "64KiB", "1000": bytes (decimal units as Hugging Face
// spells them, binary with "i"). Throws ConfigError naming the flag.
uint64_t parse_size(const std::string& text, const std::string& flag);

}  // namespace trainer
