#include "app/eval_command.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "app/saved_model.h"
#include "data/choice_task.h"
#include "infer/choice_score.h"
#include "interop/run_tokenizer.h"

namespace trainer {

namespace {

void write_scores(const std::string& path, const std::vector<ChoiceExample>& ex, const ChoiceResult& r) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("--scores " + path + ": cannot write it");
  for (size_t i = 0; i < ex.size(); ++i) {
    nlohmann::json j;
    j["line"] = ex[i].line;
    j["label"] = ex[i].label;
    j["loglik"] = r.loglik[i];
    j["ending_bytes"] = ex[i].ending_bytes;
    j["pick"] = r.pick[i];
    j["pick_norm"] = r.pick_norm[i];
    out << j.dump() << "\n";
  }
  if (!out) throw std::runtime_error("--scores " + path + ": writing failed");
}

}  // namespace

int run_eval(const EvalOptions& opt) {
  if (opt.limit < 0) throw ConfigError("--limit must be 0 (all examples) or positive");
  const SavedModel sm = load_saved_model(opt.checkpoint);
  std::string chosen;
  const std::unique_ptr<Tokenizer> tok = tokenizer_for_checkpoint(sm.cfg, sm.dir, opt.tokenizer, chosen);
  const std::vector<ChoiceExample> ex = read_choice_task(opt.task, *tok, sm.cfg.model.vocab_size, opt.limit);
  std::vector<ChoiceItem> items;
  for (const ChoiceExample& e : ex) items.push_back({e.context, e.endings, e.ending_bytes, e.label});
  const int64_t window = std::min<int64_t>(sm.cfg.train.seq_len, sm.cfg.model.max_seq_len);
  std::fprintf(stderr, "eval: %s (step %lld), task %s: %zu examples, tokenizer %s, context window %lld\n",
               sm.dir.c_str(), (long long)sm.ck.meta.step, opt.task.c_str(), ex.size(), tok->kind().c_str(),
               (long long)window);
  const auto t0 = std::chrono::steady_clock::now();
  const ChoiceResult r = score_choices(sm.dims, sm.weights, items, window);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("task %s: %zu examples, acc %.4f, acc_norm %.4f\n", opt.task.c_str(), ex.size(), r.acc, r.acc_norm);
  std::fprintf(stderr, "eval: scored in %.2f s\n", secs);
  if (!opt.scores.empty()) write_scores(opt.scores, ex, r);
  return 0;
}

}  // namespace trainer
