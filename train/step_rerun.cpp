// train.rerun_flagged: a flagged step (NaN, spike, ceiling) runs again on the
// same data from the same state before the policy acts, to tell a cause
// that repeats (the data, the numerics) from one that does not (hardware).
// The state is the same because a flagged step has changed nothing yet:
// the update is applied only after the verdict. Each rank compares its own
// loss and the fingerprint of its gradients before any reduction
// (ZeroOptimizer::gradient_fingerprint) between the two runs, so a rank
// that computed something else the first time is named even when the
// reductions spread its NaN to every rank.
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/step.h"

namespace trainer {

namespace {

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

nlohmann::json values(const StepResult& r) { return {{"loss", r.loss}, {"grad_norm", r.norm}}; }

}  // namespace

void StepRunner::rerun_if_flagged(int64_t step, StepResult& r) {
  const bool hooked = hooks_.skip_steps.count(step + 1) > 0;
  const StepVerdict verdict = policy_.classify(r.loss, r.norm);
  if (!hooked && verdict.flag == StepFlag::Healthy) return;
  const std::string why = hooked ? "skipped by the test hook" : verdict.why;
  const StepResult first = r;
  double mine[4] = {local_loss_, s_.models->gradient_fingerprint(), 0, 0};
  window_.as_optimizer([&] { s_.models->begin_step(); });
  double loss_sum = 0, aux_sum = 0;
  forward_backward(step, r.loss_scale, loss_sum, aux_sum);
  measure(r, loss_sum, aux_sum);
  mine[2] = local_loss_;
  mine[3] = s_.models->gradient_fingerprint();
  Communicator& host = s_.dist->host();
  std::vector<double> all(size_t(4 * host.size()));
  host.all_gather(Tensor(all.data(), DType::F64, {int64_t(all.size())}), Tensor(mine, DType::F64, {4}));
  std::vector<int> changed;
  for (int k = 0; k < host.size(); ++k)
    if (!same_bits(all[size_t(4 * k)], all[size_t(4 * k + 2)]) || !same_bits(all[size_t(4 * k + 1)], all[size_t(4 * k + 3)]))
      changed.push_back(k);
  const bool same = changed.empty() && same_bits(first.loss, r.loss) && same_bits(first.norm, r.norm);

  nlohmann::json rec = {{"step", step + 1},
                        {"rerun", {{"flag", why}, {"reproducible", same}, {"first", values(first)}, {"again", values(r)}}}};
  std::string said = "step " + std::to_string(step + 1) + ": flagged (" + why + "); run again on the same data from " +
                     "the same state: ";
  if (same) {
    // Every sequence of the step, as a user can open it: file and token offset.
    nlohmann::json seqs = nlohmann::json::array();
    const int64_t global = s_.M * s_.micro * s_.dp;
    for (int64_t i = 0; i < global; ++i) {
      const auto [file, offset] = s_.train_data->where(step + s_.data_offset, i);
      seqs.push_back(file + ":" + std::to_string(offset));
    }
    rec["rerun"]["sequences"] = seqs;
    said += "the same loss and gradient norm bit for bit: the cause is the data or the numerics; the step's " +
            std::to_string(global) + " sequences (file:token offset) are in metrics.jsonl, the first " +
            seqs.front().get<std::string>();
  } else {
    rec["rerun"]["ranks_changed"] = changed;
    std::string ranks;
    for (int k : changed)
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(k) +
               (size_t(k) < s_.places.host.size() ? " on " + s_.places.host[size_t(k)] : "");
    char b[160];
    std::snprintf(b, sizeof b, "loss %.9g -> %.9g, gradient norm %.9g -> %.9g", first.loss, r.loss, first.norm, r.norm);
    said += std::string(b) + ": a transient fault; " +
            (changed.empty() ? std::string("no rank's own values changed (the sums over ranks did)")
                             : "the values of rank" + std::string(changed.size() > 1 ? "s " : " ") + ranks + " changed") +
            (s_.cfg.train.rerun_transient == "stop" ? "" : "; the run goes on with the re-run's result");
  }
  if (s_.lead && s_.log) s_.log->record(rec.dump());
  if (!s_.opt.quiet) std::printf("%s\n", said.c_str());
  if (!same && s_.cfg.train.rerun_transient == "stop")
    throw StepPolicyStop(said + " (train.rerun_transient=stop)");
  if (same) r = first;
}

}  // namespace trainer
