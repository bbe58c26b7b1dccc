// Multiple-choice benchmark tasks (HellaSwag's form, scored as lm-eval's
// acc and acc_norm by infer/choice_score.h): a context and its candidate
// endings, one of them right.
//
// A task file is JSON lines, one example per line:
//   {"ctx": "A man is sitting on a roof. he", "endings": ["is using wrap ...", ...], "label": 3}
// ("context" for "ctx"; "label" an integer or a string holding one, as in
// Hugging Face's hellaswag). Each ending is scored as the continuation
// " " + ending of the context, tokenized as lm-eval does: the whole text
// encoded, the context's own encoding cut off its front. A tokenizer that
// cannot encode here (a Hugging Face tokenizer.json) needs the ids in the
// file: "context_ids" and "endings_ids" (scripts/prepare_task.py writes
// them), with "endings" kept for the byte lengths acc_norm divides by.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace trainer {

struct ChoiceExample {
  std::vector<int32_t> context;
  std::vector<std::vector<int32_t>> endings;  // the continuations' ids
  std::vector<int64_t> ending_bytes;          // UTF-8 bytes of each ending (acc_norm)
  int label = 0;
  int64_t line = 0;                           // in the task file
};

// Reads and tokenizes `path`; every id must be below vocab_size. Throws
// std::runtime_error naming the file, the line and the field on anything
// malformed (a label out of range, an empty ending, text the tokenizer
// cannot encode without ids in the file). limit > 0: the first `limit`
// examples only.
std::vector<ChoiceExample> read_choice_task(const std::string& path, const Tokenizer& tok, int64_t vocab_size,
                                            int64_t limit = 0);

}  // namespace trainer
