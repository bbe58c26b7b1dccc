#include "observe/wait_attribution.h"

#include <cstdint>

#include "core/device_memory.h"

namespace trainer {

namespace {

// A maximum over the group of host values; an NCCL group reduces device
// memory, so they go through a buffer there.
template <typename T>
void all_reduce_max(Communicator& c, std::vector<T>& v) {
  const DType dt = sizeof(T) == 4 ? DType::F32 : DType::F64;
  if (c.device() == Device::CPU) {
    c.all_reduce(Tensor(v.data(), dt, {int64_t(v.size())}), ReduceOp::Max);
    return;
  }
  void* dev = device_alloc(v.size() * sizeof(T), c.device(), "wait attribution");
  try {
    const Tensor t(dev, dt, {int64_t(v.size())}, c.device());
    write_from_host(t, v.data());
    c.all_reduce(t, ReduceOp::Max);
    read_to_host(t, v.data());
  } catch (...) {
    device_free(dev, c.device());
    throw;
  }
  device_free(dev, c.device());
}

// Element-wise minimum, as the maximum of the negation (communicators
// reduce by sum or max).
void all_reduce_min(Communicator& c, std::vector<float>& v) {
  for (float& x : v) x = -x;
  all_reduce_max(c, v);
  for (float& x : v) x = -x;
}

// Adds to `caused` (per global rank) the waiting each call of one group
// cost its members, charged to the member that arrived last.
void attribute_group(TimedCommunicator& g, std::vector<double>& caused) {
  std::vector<float> waits = g.take_waits();
  if (g.size() < 2) return;
  Communicator& c = g.inner();  // not timed: these calls are the monitor's, not the step's
  std::vector<double> counts = {double(waits.size()), -double(waits.size())};
  all_reduce_max(c, counts);
  if (counts[0] != -counts[1] || waits.empty()) return;
  std::vector<float> least = waits;
  all_reduce_min(c, least);
  // The last arriver of each call: the member with the least time (the
  // lowest group rank among equals).
  std::vector<float> last(waits.size());
  for (size_t k = 0; k < waits.size(); ++k) last[k] = waits[k] <= least[k] ? float(g.rank()) : float(g.size());
  all_reduce_min(c, last);
  const std::vector<int>& members = g.members();
  for (size_t k = 0; k < waits.size(); ++k) {
    const int who = int(last[k]);
    if (who == g.rank() || who < 0 || who >= int(members.size())) continue;
    caused[size_t(members[size_t(who)])] += double(waits[k]) - double(least[k]);
  }
}

}  // namespace

std::vector<double> attribute_waits(const std::vector<std::unique_ptr<TimedCommunicator>>& groups, Communicator& host,
                                    int pipeline_stages, bool experts) {
  std::vector<double> caused(size_t(host.size()), 0.0);
  for (const auto& g : groups)
    if (attributes_waits(g->label(), pipeline_stages, experts)) attribute_group(*g, caused);
    else g->take_waits();
  if (host.size() > 1) host.all_reduce(Tensor(caused.data(), DType::F64, {int64_t(caused.size())}), ReduceOp::Sum);
  return caused;
}

}  // namespace trainer
