#include "comm/host_staged_communicator.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "core/device_memory.h"
#include "kernels/ops.h"

namespace trainer {

// A host buffer standing in for (a prefix of) a device tensor. A reduction
// of BF16 or F16 runs on an F32 widening of it (`host`; Gloo reduces F32),
// the copies going through `narrow`, host bytes in the device's dtype.
struct HostStagedCommunicator::HostCopy {
  std::unique_ptr<uint64_t[]> bytes, narrow_bytes;  // 8-byte aligned for every dtype
  Tensor host, device, narrow;
};

namespace {

using HostCopy = HostStagedCommunicator::HostCopy;

// The first `n` elements of t as a flat tensor (all of it by default).
Tensor flat(const Tensor& t, int64_t n = -1) {
  if (n < 0) n = t.numel();
  return Tensor(t.data, t.dtype, {n}, t.device);
}

Tensor host_tensor(std::unique_ptr<uint64_t[]>& bytes, DType dtype, int64_t n) {
  bytes.reset(new uint64_t[std::max<size_t>(1, (size_t(n) * dtype_size(dtype) + 7) / 8)]);
  return Tensor(bytes.get(), dtype, {n}, Device::CPU);
}

// `reduced`: the host collective reduces it, so 16-bit floats widen to F32.
HostCopy host_buffer(const Tensor& device, bool reduced = false) {
  HostCopy c;
  c.device = device;
  const bool widen = reduced && (device.dtype == DType::BF16 || device.dtype == DType::F16);
  c.host = host_tensor(c.bytes, widen ? DType::F32 : device.dtype, device.numel());
  if (widen) c.narrow = host_tensor(c.narrow_bytes, device.dtype, device.numel());
  return c;
}

// A host copy of the tensor's current values, taken in the compute
// stream's order.
HostCopy copy_out(const Tensor& device, bool reduced = false) {
  HostCopy c = host_buffer(device, reduced);
  if (device.numel() == 0) return c;
  if (!c.narrow_bytes) {
    copy_between_devices(c.host, device);
    return c;
  }
  copy_between_devices(c.narrow, device);
  ops::convert(c.host, c.narrow);
  return c;
}

// The sum rounds once, here, where NCCL's ring rounds at every hop.
void copy_back(const HostCopy& c) {
  if (c.device.numel() == 0) return;
  if (!c.narrow_bytes) return copy_between_devices(c.device, c.host);
  ops::convert(c.narrow, c.host);
  copy_between_devices(c.device, c.narrow);
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const char* x = static_cast<const char*>(a.data);
  const char* y = static_cast<const char*>(b.data);
  return a.nbytes() > 0 && b.nbytes() > 0 && x < y + b.nbytes() && y < x + a.nbytes();
}

}  // namespace

// The host work of an asynchronous call: its buffers live until it is
// finished, which then copies the results back. Calls of one communicator
// act in the order issued, as on Gloo and NCCL: finishing a collective
// finishes the collectives still pending before it (point-to-point calls
// pair with their peers' and are not ordered with the rest), and a later
// call that reads or writes what a pending one writes finishes that one
// first.
struct HostStagedCommunicator::Pending {
  std::unique_ptr<Work> inner;
  std::vector<HostCopy> inputs, results;
  std::vector<std::shared_ptr<Pending>> before;  // collectives pending when this one was issued
  bool collective = true;
  bool done = false;
  void finish() {
    if (done) return;
    for (const auto& p : before) p->finish();
    before.clear();
    inner->wait();
    for (const HostCopy& c : results) copy_back(c);
    done = true;
  }
};

namespace {

class StagedWork final : public Work {
 public:
  explicit StagedWork(std::shared_ptr<HostStagedCommunicator::Pending> p) : p_(std::move(p)) {}
  void wait() override { p_->finish(); }
  double busy_seconds() const override { return p_->inner->busy_seconds(); }

 private:
  std::shared_ptr<HostStagedCommunicator::Pending> p_;
};

// Host copies of a batch: sends copied out, receives as empty buffers;
// `ops` gets the host tensors in the batch's order.
struct StagedBatch {
  std::vector<HostCopy> sends, recvs;
  std::vector<P2POp> ops;
};

StagedBatch stage_batch(const std::vector<P2POp>& ops) {
  StagedBatch b;
  for (const P2POp& op : ops) {
    if (op.send) {
      b.sends.push_back(copy_out(op.tensor));
      b.ops.push_back({true, b.sends.back().host, op.peer});
    } else {
      b.recvs.push_back(host_buffer(op.tensor));
      b.ops.push_back({false, b.recvs.back().host, op.peer});
    }
  }
  return b;
}

}  // namespace

HostStagedCommunicator::HostStagedCommunicator(std::unique_ptr<Communicator> host, Device device)
    : host_(std::move(host)), device_(device) {}

HostStagedCommunicator::~HostStagedCommunicator() = default;

void HostStagedCommunicator::do_all_reduce(Tensor t, ReduceOp op) {
  settle(t);
  const HostCopy c = copy_out(t, true);
  host_->all_reduce(c.host, op);
  copy_back(c);
}

void HostStagedCommunicator::do_reduce_scatter(Tensor out, Tensor in) {
  settle(in);
  settle(out);
  // `in` is copied before anything is written: out may be its own chunk.
  const HostCopy src = copy_out(in, true), dst = host_buffer(out, true);
  host_->reduce_scatter(dst.host, src.host);
  copy_back(dst);
}

void HostStagedCommunicator::do_all_gather(Tensor out, Tensor in) {
  settle(in);
  settle(out);
  const HostCopy src = copy_out(in), dst = host_buffer(out);
  host_->all_gather(dst.host, src.host);
  copy_back(dst);
}

void HostStagedCommunicator::do_broadcast(Tensor t, int root) {
  settle(t);
  const HostCopy c = rank() == root ? copy_out(t) : host_buffer(t);
  host_->broadcast(c.host, root);
  if (rank() != root) copy_back(c);
}

void HostStagedCommunicator::do_all_to_all(Tensor out, Tensor in) {
  settle(in);
  settle(out);
  const HostCopy src = copy_out(in), dst = host_buffer(out);
  host_->all_to_all(dst.host, src.host);
  copy_back(dst);
}

void HostStagedCommunicator::do_all_to_all_v(Tensor out, const std::vector<int64_t>& out_counts, Tensor in,
                                             const std::vector<int64_t>& in_counts) {
  settle(in);
  settle(out);
  // Only the counted prefixes move; elements past them are left alone.
  const int64_t n_in = std::accumulate(in_counts.begin(), in_counts.end(), int64_t(0));
  const int64_t n_out = std::accumulate(out_counts.begin(), out_counts.end(), int64_t(0));
  const HostCopy src = copy_out(flat(in, n_in)), dst = host_buffer(flat(out, n_out));
  host_->all_to_all_v(dst.host, out_counts, src.host, in_counts);
  copy_back(dst);
}

void HostStagedCommunicator::do_batch_send_recv(const std::vector<P2POp>& ops) {
  for (const P2POp& op : ops) settle(op.tensor);
  const StagedBatch b = stage_batch(ops);
  host_->batch_send_recv(b.ops);
  for (const HostCopy& c : b.recvs) copy_back(c);
}

std::unique_ptr<Work> HostStagedCommunicator::track(std::unique_ptr<Work> inner, std::vector<HostCopy> inputs,
                                                    std::vector<HostCopy> results, bool collective) {
  auto p = std::make_shared<Pending>();
  p->inner = std::move(inner);
  p->inputs = std::move(inputs);
  p->results = std::move(results);
  p->collective = collective;
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const auto& q) { return q->done; }),
                 pending_.end());
  if (collective)
    for (const auto& q : pending_)
      if (q->collective) p->before.push_back(q);
  if (collective || !p->results.empty()) pending_.push_back(p);
  return std::make_unique<StagedWork>(std::move(p));
}

void HostStagedCommunicator::settle(const Tensor& t) {
  for (const auto& p : pending_)
    if (!p->done)
      for (const HostCopy& c : p->results)
        if (overlaps(c.device, t)) {
          p->finish();
          break;
        }
}

std::unique_ptr<Work> HostStagedCommunicator::do_batch_send_recv_posted(const std::vector<P2POp>& ops) {
  for (const P2POp& op : ops) settle(op.tensor);
  StagedBatch b = stage_batch(ops);
  std::unique_ptr<Work> sends = host_->batch_send_recv_posted(b.ops);
  for (const HostCopy& c : b.recvs) copy_back(c);
  return track(std::move(sends), std::move(b.sends), {}, false);
}

std::unique_ptr<Work> HostStagedCommunicator::do_batch_send_recv_async(const std::vector<P2POp>& ops) {
  for (const P2POp& op : ops) settle(op.tensor);
  StagedBatch b = stage_batch(ops);
  std::unique_ptr<Work> w = host_->batch_send_recv_async(b.ops);
  return track(std::move(w), std::move(b.sends), std::move(b.recvs), false);
}

std::unique_ptr<Work> HostStagedCommunicator::do_post_receives(const std::vector<P2POp>& receives) {
  for (const P2POp& op : receives) settle(op.tensor);
  StagedBatch b = stage_batch(receives);
  std::unique_ptr<Work> w = host_->post_receives(b.ops);
  if (!w) return nullptr;
  return track(std::move(w), {}, std::move(b.recvs), false);
}

std::unique_ptr<Work> HostStagedCommunicator::do_all_reduce_async(Tensor t) {
  settle(t);
  std::vector<HostCopy> results;
  results.push_back(copy_out(t, true));
  std::unique_ptr<Work> w = host_->all_reduce_async(results.back().host);
  return track(std::move(w), {}, std::move(results));
}

std::unique_ptr<Work> HostStagedCommunicator::do_reduce_scatter_async(Tensor out, Tensor in) {
  settle(in);
  settle(out);
  std::vector<HostCopy> inputs, results;
  inputs.push_back(copy_out(in, true));
  results.push_back(host_buffer(out, true));
  std::unique_ptr<Work> w = host_->reduce_scatter_async(results.back().host, inputs.back().host);
  return track(std::move(w), std::move(inputs), std::move(results));
}

std::unique_ptr<Work> HostStagedCommunicator::do_all_gather_async(Tensor out, Tensor in) {
  settle(in);
  settle(out);
  std::vector<HostCopy> inputs, results;
  inputs.push_back(copy_out(in));
  results.push_back(host_buffer(out));
  std::unique_ptr<Work> w = host_->all_gather_async(results.back().host, inputs.back().host);
  return track(std::move(w), std::move(inputs), std::move(results));
}

}  // namespace trainer
