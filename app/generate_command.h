// `trainer generate --checkpoint DIR --prompt TEXT`: text from a saved model.
// The checkpoint may have any layout (load_checkpoint + SliceAssembler put
// the full fp32 weights together); its saved configuration gives the model,
// the context window (train.seq_len) and where the tokenizer is
// (interop/run_tokenizer.h). Decoding uses the key/value cache
// (model/kv_cache.h) on the CPU or a GPU. The text goes to stdout, what was
// loaded and how fast it ran to stderr.
//
// Mistakes: an empty prompt, a tokenizer larger than model.vocab_size, a
// bad option: exit 2. A checkpoint directory that does not exist or does
// not verify, a tokenizer recorded by the run whose file is missing: exit 1,
// naming it.
#pragma once

#include <cstdint>
#include <string>

namespace trainer {

struct GenerateOptions {
  std::string checkpoint;   // a step directory, or a checkpoint root with `latest`
  std::string prompt;
  std::string tokenizer;    // override: a tokenizer file or a directory holding one
  std::string device = "auto";
  int tokens = 200;
  double temperature = 0.8;
  int top_k = 0;
  uint64_t seed = 1234;
  bool compare = false;     // also run the no-cache reference and print whether the tokens agree
};

// Returns the exit code (0); throws ConfigError / std::runtime_error otherwise.
int run_generate(const GenerateOptions& opt);

}  // namespace trainer
