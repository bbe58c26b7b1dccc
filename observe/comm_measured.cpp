#include "observe/comm_measured.h"

#include <cstdio>

namespace trainer {

std::vector<CommBytes> comm_bytes_now(const std::vector<std::unique_ptr<TimedCommunicator>>& groups) {
  std::vector<CommBytes> out;
  for (const auto& g : groups) out.push_back(g->bytes());
  return out;
}

namespace {

// Exact when every step moved the same (an integer), else two decimals.
std::string per_step(double total, int64_t steps) {
  char buf[48];
  const double v = total / double(steps);
  if (v == double(int64_t(v)))
    std::snprintf(buf, sizeof buf, "%lld", (long long)v);
  else
    std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

}  // namespace

std::string comm_measured_report(const std::vector<std::unique_ptr<TimedCommunicator>>& groups,
                                 const std::vector<CommBytes>& since, int64_t steps, Communicator& host,
                                 std::string* json) {
  std::vector<double> mine, sum;
  for (size_t i = 0; i < groups.size(); ++i) {
    const CommBytes d = groups[i]->bytes() - since[i];
    for (int k = 0; k < kCommKinds; ++k) mine.push_back(double(d.bytes[size_t(k)]));
  }
  sum = mine;
  if (host.size() > 1) host.all_reduce(Tensor(sum.data(), DType::F64, {int64_t(sum.size())}));
  const double ranks = double(std::max(1, host.size()));
  std::string text, js = "{\"comm_bytes_per_step\": {", js_mean = "\"comm_bytes_per_step_mean\": {";
  bool first = true;
  if (steps <= 0) steps = 1;
  for (size_t i = 0; i < groups.size(); ++i) {
    const TimedCommunicator& g = *groups[i];
    if (g.label() == "host" || g.size() <= 1) continue;
    std::string a, b, ja, jb;
    for (int k = 0; k < kCommKinds; ++k) {
      const char* kind = comm_kind_name(CommKind(k));
      const std::string v = per_step(mine[i * kCommKinds + size_t(k)], steps);
      const std::string m = per_step(sum[i * kCommKinds + size_t(k)] / ranks, steps);
      a += std::string(" ") + kind + "=" + v;
      b += std::string(" ") + kind + "=" + m;
      ja += std::string(k ? ", " : "") + "\"" + kind + "\": " + v;
      jb += std::string(k ? ", " : "") + "\"" + kind + "\": " + m;
    }
    text += "comm measured per step, " + g.label() + " (" + std::to_string(g.size()) + " ranks):" + a +
            " | mean over ranks:" + b + "\n";
    js += std::string(first ? "" : ", ") + "\"" + g.label() + "\": {" + ja + "}";
    js_mean += std::string(first ? "" : ", ") + "\"" + g.label() + "\": {" + jb + "}";
    first = false;
  }
  if (json) *json = js + "}, " + js_mean + "}, \"steps\": " + std::to_string(steps) + "}";
  return text;
}

}  // namespace trainer
