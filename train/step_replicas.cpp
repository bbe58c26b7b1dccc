// The replica check in the loop (train/replica_check.h): after an applied
// step every train.replica_check_interval steps, and before any checkpoint
// is taken of a step, so that every checkpoint was checked and a rollback
// lands on copies that agreed.
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "core/device_memory.h"
#include "core/trace.h"
#include "train/replica_check.h"
#include "train/step.h"

namespace trainer {

void StepRunner::check_replicas(int64_t step, StepResult& r) {
  const int64_t every = s_.cfg.train.replica_check_interval, done = step + 1;
  if (every <= 0 || r.outcome != StepOutcome::Applied) return;
  if (done % every != 0 && !s_.saver->due(done, done == s_.end_step) && !preempt_) return;
  if (Watchdog* w = s_.dist->watchdog()) w->progress(done, "replica check");
  const auto t0 = std::chrono::steady_clock::now();
  ReplicaVerdict v;
  {
    const trace::Scope span("replica", "replica check");
    v = trainer::check_replicas(*s_.models, *s_.dist, global_params_, s_.places.host);
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (v.sets == 0) return;  // one copy of everything (one process, ZeRO-3 without tp): nothing to compare
  if (s_.lead && s_.log) {
    char rec[256];
    std::snprintf(rec, sizeof rec, "{\"step\": %lld, \"replica_check\": {\"ok\": %s, \"ms\": %.3f, \"pieces\": %zu, \"sets\": %zu}}",
                  (long long)done, v.ok ? "true" : "false", ms, v.pieces, v.sets);
    s_.log->record(rec);
  }
  if (v.ok) {
    if (!replica_reported_ && !s_.opt.quiet)
      std::printf("replica check at step %lld: %zu pieces in %zu sets of copies agree (%.1f ms; every %lld steps and "
                  "before each checkpoint)\n",
                  (long long)done, v.pieces, v.sets, ms, (long long)every);
    replica_reported_ = true;
    return;
  }
  const std::string what = "step " + std::to_string(done) + ": " + v.message;
  summary_.flagged_steps.push_back(done);
  if (s_.cfg.train.replica_policy != "rollback")
    throw ReplicaMismatch(what + " (train.replica_policy=stop; the newest checkpoint was checked before it was written)");
  if (!s_.opt.quiet) std::printf("%s\n", what.c_str());
  last_flagged_ = true;
  roll_back(step, what, "the replicas disagree", "train.replica_policy=rollback", true, r);
}

// One bit of one copy, changed behind the optimizer's back: the lowest bit of
// final_norm.weight's first byte, after ZeRO's gathers landed (an in-flight
// gather would overwrite a copy this rank does not own).
void StepRunner::flip_bit_hook(int64_t step) {
  if (hooks_.flip_bit_step != step + 1 || flip_fired_) return;
  flip_fired_ = true;  // once: a rollback runs the step number again
  for (size_t c = 0; c < s_.models->size(); ++c) {
    s_.models->zero(c).settle();
    if (s_.models->zero(c).stage() >= 3)
      throw std::invalid_argument("TRAINER_TEST_HOOKS flip_bit: the weights are ZeRO-3 shards; use ZeRO 0-2");
    Model& m = s_.models->model(c);
    for (size_t p = 0; p < m.params.size(); ++p) {
      if (m.params[p].spec.name != "final_norm.weight") continue;
      const Tensor t = m.param_tensors[p];
      std::vector<unsigned char> bytes(t.nbytes());
      read_to_host(t, bytes.data());
      bytes[0] ^= 1;
      write_from_host(t, bytes.data());
      std::printf("test hook: rank %d flipped the lowest bit of final_norm.weight[0] after step %lld\n",
                  s_.opt.launch.rank, (long long)step + 1);
      return;
    }
  }
  throw std::invalid_argument("TRAINER_TEST_HOOKS flip_bit: rank " + std::to_string(s_.opt.launch.rank) +
                              " holds no final_norm.weight (the last pipeline stage does)");
}

}  // namespace trainer
