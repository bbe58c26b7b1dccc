// `trainer eval --checkpoint DIR --task FILE`: a multiple-choice benchmark
// (data/choice_task.h: HellaSwag's JSON lines) scored with a saved model as
// lm-eval scores it (infer/choice_score.h): acc and acc_norm on stdout, and
// with --scores FILE every example's log-likelihoods and picks as JSON lines.
// The task is tokenized with the run's tokenizer (interop/run_tokenizer.h),
// or comes with ids (scripts/prepare_task.py). Bad options exit 2; a task
// file or checkpoint that does not read exits 1, naming it.
#pragma once

#include <cstdint>
#include <string>

namespace trainer {

struct EvalOptions {
  std::string checkpoint;  // a step directory, or a checkpoint root with `latest`
  std::string task;        // JSON lines
  std::string tokenizer;   // override: a tokenizer file or a directory holding one
  std::string scores;      // per-example output ("" none)
  int64_t limit = 0;       // first N examples (0: all)
};

int run_eval(const EvalOptions& opt);

}  // namespace trainer
