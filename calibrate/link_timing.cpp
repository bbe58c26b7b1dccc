#include "calibrate/link_timing.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>

#include "core/cuda_backend.h"
#include "core/device_memory.h"

namespace trainer {

namespace {

constexpr CommKind kKinds[] = {CommKind::AllReduce, CommKind::AllGather, CommKind::ReduceScatter, CommKind::Send};
constexpr int kKindCount = 4;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The device finished what was queued (NCCL and kernels are asynchronous).
void settle(Device d) {
  if (d == Device::CUDA) cuda_backend(nullptr)->synchronize();
}

struct Buffer {
  Buffer(int64_t bytes, Device d) : device(d), p(device_alloc(size_t(bytes), d, "calibrate buffer")) {}
  ~Buffer() { device_free(p, device); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Tensor f32(int64_t n) const { return Tensor(p, DType::F32, {n}, device); }
  Device device;
  void* p;
};

// Payload elements of a size: whole F32 elements, a multiple of the group
// (all_gather and reduce_scatter split it evenly).
int64_t elements_of(int64_t bytes, int ranks) {
  const int64_t per = std::max<int64_t>(1, bytes / 4 / ranks);
  return per * ranks;
}

std::string size_text(int64_t bytes) {
  return bytes % (1 << 20) == 0 ? std::to_string(bytes >> 20) + " MiB"
                                : bytes % 1024 == 0 ? std::to_string(bytes >> 10) + " KiB" : std::to_string(bytes) + " B";
}

// One call of `kind` on n elements.
void call(Communicator& g, CommKind kind, int64_t n, const Buffer& a, const Buffer& b) {
  const int p = g.size();
  switch (kind) {
    case CommKind::AllReduce: g.all_reduce(a.f32(n)); break;
    case CommKind::AllGather: g.all_gather(b.f32(n), a.f32(n / p)); break;
    case CommKind::ReduceScatter: g.reduce_scatter(a.f32(n / p), b.f32(n)); break;
    default:
      // Ranks 0 and 1 of the group: there and back.
      if (g.rank() == 0) {
        g.batch_send_recv({P2POp{true, a.f32(n), 1}});
        g.batch_send_recv({P2POp{false, b.f32(n), 1}});
      } else if (g.rank() == 1) {
        g.batch_send_recv({P2POp{false, b.f32(n), 0}});
        g.batch_send_recv({P2POp{true, b.f32(n), 0}});
      }
  }
}

// Seconds of one call on this rank (a send/receive: half the round trip,
// on rank 0 of the group; 0 on the others).
double timed_call(Communicator& g, CommKind kind, int64_t n, const Buffer& a, const Buffer& b, Device d) {
  const double t0 = now_s();
  call(g, kind, n, a, b);
  settle(d);
  const double t = now_s() - t0;
  if (kind != CommKind::Send) return t;
  return g.rank() == 0 ? t / 2 : 0;
}

}  // namespace

int repetitions_of(int64_t bytes, int base) {
  return base * int(std::clamp<int64_t>((int64_t(1) << 20) / std::max<int64_t>(bytes, 1), 1, 4));
}

std::vector<int64_t> calibration_sizes(int64_t min_bytes, int64_t max_bytes) {
  std::vector<int64_t> out;
  for (int64_t s = 4096; s <= std::max(max_bytes, min_bytes); s *= 4)
    if (s >= min_bytes) out.push_back(s);
  return out;
}

int64_t link_buffer_bytes(const LinkTimingOptions& o) {
  const int64_t largest = o.sizes.empty() ? 0 : o.sizes.back();
  return 2 * (largest + 4096);
}

std::vector<CollectiveTimes> time_link(Communicator* group, Communicator& host, const LinkGroup& link, Device device,
                                       const LinkTimingOptions& o, Watchdog* watchdog) {
  const int ranks = int(link.members.size());
  const size_t sizes = o.sizes.size(), stride = size_t(4 * o.repetitions);
  // Every rank's times, [kind][size][repetition]; zeros on non-members.
  std::vector<double> times(kKindCount * sizes * stride, 0.0);
  std::unique_ptr<Buffer> a, b;
  if (group) {
    a = std::make_unique<Buffer>(link_buffer_bytes(o) / 2, device);
    b = std::make_unique<Buffer>(link_buffer_bytes(o) / 2, device);
  }
  int64_t step = 0;
  for (int k = 0; k < kKindCount; ++k)
    for (size_t s = 0; s < sizes; ++s)
      for (size_t r = 0; r < size_t(o.warmup + repetitions_of(o.sizes[s], o.repetitions)); ++r) {
        // Every rank of the job meets before each call, so the members start
        // together and the others never wait longer than one call (no
        // collective timeout however long the whole link takes).
        if (watchdog) watchdog->progress(++step, "calibrate: links");
        host.barrier();
        if (!group) continue;
        const int64_t n = elements_of(o.sizes[s], ranks);
        try {
          const double t = timed_call(*group, kKinds[k], n, *a, *b, device);
          if (r >= size_t(o.warmup)) times[(size_t(k) * sizes + s) * stride + r - size_t(o.warmup)] = t;
        } catch (const std::exception& e) {
          throw std::runtime_error(std::string("calibrate: ") + (k == 3 ? "send/receive" : comm_kind_name(kKinds[k])) +
                                   " of " + size_text(4 * n) + " on group " + group->describe() + " (" + link.label +
                                   ") failed: " + e.what());
        }
      }
  // The slowest member's time of each call, on every rank.
  host.all_reduce(Tensor(times.data(), DType::F64, {int64_t(times.size())}, Device::CPU), ReduceOp::Max);
  std::vector<CollectiveTimes> out;
  for (int k = 0; k < kKindCount; ++k) {
    CollectiveTimes c;
    c.kind = kKinds[k];
    c.across_nodes = link.across_nodes;
    c.ranks = ranks;
    c.members_per_node = link.members_per_node;
    for (size_t s = 0; s < sizes; ++s) {
      const size_t reps = size_t(repetitions_of(o.sizes[s], o.repetitions));
      const auto first = times.begin() + long((size_t(k) * sizes + s) * stride);
      std::vector<double> r(first, first + long(reps));
      std::sort(r.begin(), r.end());
      c.bytes.push_back(double(4 * elements_of(o.sizes[s], ranks)));
      c.seconds.push_back(reps % 2 ? r[reps / 2] : (r[reps / 2 - 1] + r[reps / 2]) / 2);
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace trainer
