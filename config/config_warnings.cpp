// Settings that are legal but probably not what was meant. They do not stop
// the run (a quick `--set train.steps=10` of a long recipe is a normal thing
// to do); main() prints each once, on rank 0, before training starts.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/config_schema.h"

namespace trainer {

namespace {

std::string kv(const char* key, int64_t v) { return std::string(key) + "=" + std::to_string(v); }

std::string fraction(int64_t num, int64_t den) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", double(num) / double(den));
  return b;
}

}  // namespace

std::vector<std::string> config_warnings(const Config& c) {
  std::vector<std::string> out;
  const auto& o = c.optim;
  const std::string lr = value_yaml(*find_key("optim.lr"), c);
  if (o.warmup_steps > c.train.steps) {
    // optim/lr_schedule.cpp: lr * (s + 1) / warmup for every step s of the run.
    out.push_back(c.source + ": " + kv("optim.warmup_steps", o.warmup_steps) + " is longer than " +
                  kv("train.steps", c.train.steps) + ": the run ends during the warm-up, its last step at " +
                  fraction(c.train.steps, o.warmup_steps) + " x optim.lr=" + lr +
                  " (the schedule never reaches its peak or decays)");
  } else if (o.decay_steps > 0 && o.warmup_steps > o.decay_steps) {
    out.push_back(c.source + ": " + kv("optim.warmup_steps", o.warmup_steps) + " is longer than " +
                  kv("optim.decay_steps", o.decay_steps) + " (warm-up plus decay): the warm-up runs its " +
                  std::to_string(o.warmup_steps) + " steps up to optim.lr=" + lr +
                  ", then the learning rate is optim.min_lr (the decay window is over)");
  }
  if (const std::optional<StepRange> r = c.log.trace.empty() ? std::nullopt : parse_step_range(c.log.trace))
    if (r->first > c.train.steps)
      out.push_back(c.source + ": log.trace=" + c.log.trace + " starts after the run's last step (" +
                    kv("train.steps", c.train.steps) + "): no timeline is written");
  return out;
}

}  // namespace trainer
