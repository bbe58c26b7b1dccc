#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <stdexcept>

#include "comm/collective_trace.h"
#include "kernels/cuda/compute_stream.h"
#include "kernels/cuda/cuda_check.h"

namespace trainer {

namespace {

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

}  // namespace

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  // NCCL_VERSION_CODE since 2.9: major * 10000 + minor * 100 + patch.
  std::string text =
      "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
#ifdef TRAINER_EMU_NCCL
  text += std::string(" (") + TRAINER_EMU_NCCL_DESCRIPTION + ")";  // a version number cannot say it is emulated
#endif
  return text;
}

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  std::string name;
  std::vector<int> members;
  int rank = 0, size = 1;
  double timeout_s = 600;
  cudaStream_t side = nullptr;     // async collectives; made on first use
  cudaEvent_t side_tail = nullptr; // recorded after each async collective
  bool async_pending = false;      // side_tail not yet waited for by the compute stream
  int* barrier_word = nullptr;     // device scratch for barrier()
  std::atomic<bool> aborted{false};

  ~Impl() {
    // No throwing and no waiting on peers here: a communicator is destroyed
    // on error paths too, where the peers may be gone.
    if (barrier_word) cudaFree(barrier_word);
    if (side_tail) cudaEventDestroy(side_tail);
    if (side) cudaStreamDestroy(side);
    if (comm && !aborted.load()) ncclCommDestroy(comm);
  }

  std::string describe() const { return name + " (ranks " + format_rank_list(members) + ")"; }

  void check(ncclResult_t r, const char* call, const char* op) const {
    if (r == ncclSuccess) return;
    const char* last = ncclGetLastError(comm);
    throw std::runtime_error(std::string(op) + " on group " + describe() + ": " + call + " failed: " +
                             ncclGetErrorString(r) + (last && *last ? std::string(" (") + last + ")" : ""));
  }

  void usable(const char* op) const {
    note_collective(op, describe());
    if (aborted.load())
      throw std::runtime_error(std::string(op) + " on group " + describe() + ": the communicator was aborted");
  }

  [[noreturn]] void bad(const char* op, const std::string& why) const {
    throw std::invalid_argument(std::string(op) + " on group " + describe() + ": " + why);
  }

  void need_cuda(const char* op, const char* what, const Tensor& t) const {
    if (t.device != Device::CUDA)
      bad(op, std::string(what) + " is a " + device_name(t.device) + " tensor; NCCL moves CUDA tensors only");
  }

  ncclDataType_t reduce_type(const char* op, DType d) const {
    switch (d) {
      case DType::F32: return ncclFloat32;
      case DType::F64: return ncclFloat64;
      case DType::BF16: return ncclBfloat16;
      case DType::F16: return ncclFloat16;
      case DType::I32: return ncclInt32;
      case DType::U32: return ncclUint32;
      default: bad(op, std::string("cannot reduce ") + dtype_name(d));
    }
  }

  // Sync collectives go on the compute stream; if async ones of this
  // communicator are still queued on the side stream, the compute stream
  // first waits for them, so NCCL sees this communicator's operations in
  // issue order on every rank.
  cudaStream_t sync_stream() {
    cudaStream_t s = cuda::stream();
    if (async_pending) {
      CUDA_CHECK(cudaStreamWaitEvent(s, side_tail, 0), name + ": order after async collectives");
      async_pending = false;
    }
    return s;
  }

  // The side stream, ordered after the work queued so far on the compute stream.
  cudaStream_t async_stream() {
    if (!side) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), name + ": communication stream");
      CUDA_CHECK(cudaEventCreateWithFlags(&side_tail, cudaEventDisableTiming), name + ": event");
    }
    cudaEvent_t ready;
    CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), name + ": event");
    CUDA_CHECK(cudaEventRecord(ready, cuda::stream()), name + ": record on the compute stream");
    CUDA_CHECK(cudaStreamWaitEvent(side, ready, 0), name + ": communication stream waits for compute");
    cudaEventDestroy(ready);  // released once the recorded work is done
    return side;
  }

  std::unique_ptr<Work> finish_async();

  void all_reduce_on(Tensor t, ReduceOp op, cudaStream_t s) {
    check(ncclAllReduce(t.data, t.data, size_t(t.numel()), reduce_type("all_reduce", t.dtype),
                        op == ReduceOp::Sum ? ncclSum : ncclMax, comm, s),
          "ncclAllReduce", "all_reduce");
  }

  void reduce_scatter_on(Tensor out, Tensor in, cudaStream_t s) {
    check(ncclReduceScatter(in.data, out.data, size_t(out.numel()), reduce_type("reduce_scatter", in.dtype), ncclSum,
                            comm, s),
          "ncclReduceScatter", "reduce_scatter");
  }

  // Bytes: any dtype gathers the same way. NCCL works in place when in is
  // this rank's own chunk of out.
  void all_gather_on(Tensor out, Tensor in, cudaStream_t s) {
    check(ncclAllGather(in.data, out.data, in.nbytes(), ncclUint8, comm, s), "ncclAllGather", "all_gather");
  }

  void check_all_gather(Tensor out, Tensor in) const {
    const char* op = "all_gather";
    usable(op);
    need_cuda(op, "out", out);
    need_cuda(op, "in", in);
  }

  void check_all_reduce(Tensor t) const {
    usable("all_reduce");
    need_cuda("all_reduce", "the tensor", t);
    reduce_type("all_reduce", t.dtype);
  }

  void check_reduce_scatter(Tensor out, Tensor in) const {
    const char* op = "reduce_scatter";
    usable(op);
    need_cuda(op, "out", out);
    need_cuda(op, "in", in);
    reduce_type(op, in.dtype);
  }
};

namespace {

class NcclWork final : public Work {
 public:
  NcclWork(cudaEvent_t done, std::string what) : done_(done), what_(std::move(what)) {}
  ~NcclWork() override {
    // Dropping the Work must not let the compute stream reuse the tensors
    // while the collective still runs.
    if (done_) {
      cudaStreamWaitEvent(cuda::stream(), done_, 0);
      cudaEventDestroy(done_);
    }
  }
  void wait() override {
    if (!done_) return;
    CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(), done_, 0), what_);
    cudaEventDestroy(done_);
    done_ = nullptr;
  }

 private:
  cudaEvent_t done_;
  std::string what_;
};

}  // namespace

std::unique_ptr<Work> NcclCommunicator::Impl::finish_async() {
  cudaEvent_t done;
  CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), name + ": event");
  CUDA_CHECK(cudaEventRecord(done, side), name + ": record on the communication stream");
  CUDA_CHECK(cudaEventRecord(side_tail, side), name + ": record on the communication stream");
  async_pending = true;
  return std::make_unique<NcclWork>(done, "waiting for an async collective on group " + describe());
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclCommunicator::~NcclCommunicator() = default;

std::unique_ptr<NcclCommunicator> NcclCommunicator::create_world(Store& store, int rank, int world, double timeout_s,
                                                                 int generation) {
  auto impl = std::make_unique<Impl>();
  impl->name = "world";
  for (int r = 0; r < world; ++r) impl->members.push_back(r);
  impl->rank = rank;
  impl->size = world;
  impl->timeout_s = timeout_s;
  const std::string key = "nccl/world/" + std::to_string(generation);
  ncclUniqueId id;
  if (rank == 0) {
    impl->check(ncclGetUniqueId(&id), "ncclGetUniqueId", "creating the world communicator");
    store.set(key, std::string(id.internal, NCCL_UNIQUE_ID_BYTES));
  } else {
    std::string v;
    try {
      v = store.get(key, timeout_s);
    } catch (const StoreTimeout& e) {
      throw CollectiveTimeout("creating the NCCL world communicator: rank 0 did not publish the NCCL unique id within " +
                              seconds_text(timeout_s) + " s (" + e.what() + ")");
    }
    if (v.size() != NCCL_UNIQUE_ID_BYTES)
      throw std::runtime_error("creating the NCCL world communicator: the unique id under '" + key + "' has " +
                               std::to_string(v.size()) + " bytes, expected " + std::to_string(NCCL_UNIQUE_ID_BYTES));
    std::memcpy(id.internal, v.data(), NCCL_UNIQUE_ID_BYTES);
  }
  impl->check(ncclCommInitRank(&impl->comm, world, id, rank), "ncclCommInitRank", "creating the world communicator");
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(impl)));
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::split(int color, int key, std::string name,
                                                          std::vector<int> members) {
  impl_->usable("split");
  auto child = std::make_unique<Impl>();
  child->name = std::move(name);
  child->members = std::move(members);
  child->timeout_s = impl_->timeout_s;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  impl_->check(ncclCommSplit(impl_->comm, color, key, &child->comm, &config), "ncclCommSplit",
               ("splitting off " + child->describe()).c_str());
  int n = 0, r = 0;
  child->check(ncclCommCount(child->comm, &n), "ncclCommCount", "split");
  child->check(ncclCommUserRank(child->comm, &r), "ncclCommUserRank", "split");
  if (n != int(child->members.size()) || r != key)
    throw std::logic_error("ncclCommSplit made group " + child->describe() + " with " + std::to_string(n) +
                           " ranks, this one at " + std::to_string(r) + "; the mesh expects " +
                           std::to_string(child->members.size()) + " ranks, this one at " + std::to_string(key));
  child->rank = r;
  child->size = n;
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(child)));
}

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::size() const { return impl_->size; }
const std::string& NcclCommunicator::name() const { return impl_->name; }
const std::vector<int>& NcclCommunicator::members() const { return impl_->members; }

void NcclCommunicator::do_all_reduce(Tensor t, ReduceOp op) {
  impl_->check_all_reduce(t);
  if (t.numel() == 0) return;
  impl_->all_reduce_on(t, op, impl_->sync_stream());
}

std::unique_ptr<Work> NcclCommunicator::do_all_reduce_async(Tensor t) {
  impl_->check_all_reduce(t);
  impl_->all_reduce_on(t, ReduceOp::Sum, impl_->async_stream());
  return impl_->finish_async();
}

void NcclCommunicator::do_reduce_scatter(Tensor out, Tensor in) {
  impl_->check_reduce_scatter(out, in);
  if (out.numel() == 0) return;
  impl_->reduce_scatter_on(out, in, impl_->sync_stream());
}

std::unique_ptr<Work> NcclCommunicator::do_reduce_scatter_async(Tensor out, Tensor in) {
  impl_->check_reduce_scatter(out, in);
  impl_->reduce_scatter_on(out, in, impl_->async_stream());
  return impl_->finish_async();
}

void NcclCommunicator::do_all_gather(Tensor out, Tensor in) {
  impl_->check_all_gather(out, in);
  if (in.numel() == 0) return;
  impl_->all_gather_on(out, in, impl_->sync_stream());
}

std::unique_ptr<Work> NcclCommunicator::do_all_gather_async(Tensor out, Tensor in) {
  impl_->check_all_gather(out, in);
  // Nothing to move on any rank (the sizes agree): no NCCL call, as in the
  // synchronous form, and nothing to wait for.
  if (in.numel() == 0) return std::make_unique<NcclWork>(nullptr, std::string());
  impl_->all_gather_on(out, in, impl_->async_stream());
  return impl_->finish_async();
}

void NcclCommunicator::do_broadcast(Tensor t, int root) {
  Impl& m = *impl_;
  const char* op = "broadcast";
  m.usable(op);
  m.need_cuda(op, "the tensor", t);
  if (t.numel() == 0) return;
  m.check(ncclBroadcast(t.data, t.data, t.nbytes(), ncclUint8, root, m.comm, m.sync_stream()), "ncclBroadcast", op);
}

void NcclCommunicator::do_all_to_all(Tensor out, Tensor in) {
  Impl& m = *impl_;
  const char* op = "all_to_all";
  m.usable(op);
  m.need_cuda(op, "out", out);
  m.need_cuda(op, "in", in);
  if (in.data == out.data) m.bad(op, "in and out must not be the same memory");
  if (in.numel() == 0) return;
  const size_t chunk = in.nbytes() / size_t(m.size);
  cudaStream_t s = m.sync_stream();
  const char* src = static_cast<const char*>(in.data);
  char* dst = static_cast<char*>(out.data);
  m.check(ncclGroupStart(), "ncclGroupStart", op);
  for (int p = 0; p < m.size; ++p) {
    m.check(ncclSend(src + p * chunk, chunk, ncclUint8, p, m.comm, s), "ncclSend", op);
    m.check(ncclRecv(dst + p * chunk, chunk, ncclUint8, p, m.comm, s), "ncclRecv", op);
  }
  m.check(ncclGroupEnd(), "ncclGroupEnd", op);
}

void NcclCommunicator::do_all_to_all_v(Tensor out, const std::vector<int64_t>& out_counts, Tensor in,
                                    const std::vector<int64_t>& in_counts) {
  Impl& m = *impl_;
  const char* op = "all_to_all_v";
  m.usable(op);
  m.need_cuda(op, "out", out);
  m.need_cuda(op, "in", in);
  int64_t in_total = 0;
  for (int p = 0; p < m.size; ++p) in_total += in_counts[size_t(p)];
  if (in.data == out.data && in_total > 0) m.bad(op, "in and out must not be the same memory");
  const size_t esize = dtype_size(in.dtype);
  cudaStream_t s = m.sync_stream();
  const char* src = static_cast<const char*>(in.data);
  char* dst = static_cast<char*>(out.data);
  size_t in_off = 0, out_off = 0;
  m.check(ncclGroupStart(), "ncclGroupStart", op);
  for (int p = 0; p < m.size; ++p) {
    const size_t sb = size_t(in_counts[p]) * esize, rb = size_t(out_counts[p]) * esize;
    if (sb) m.check(ncclSend(src + in_off, sb, ncclUint8, p, m.comm, s), "ncclSend", op);
    if (rb) m.check(ncclRecv(dst + out_off, rb, ncclUint8, p, m.comm, s), "ncclRecv", op);
    in_off += sb;
    out_off += rb;
  }
  m.check(ncclGroupEnd(), "ncclGroupEnd", op);
}

void NcclCommunicator::do_batch_send_recv(const std::vector<P2POp>& ops) {
  Impl& m = *impl_;
  const char* op = "batch_send_recv";
  m.usable(op);
  for (const P2POp& p : ops) m.need_cuda(op, p.send ? "a send tensor" : "a receive tensor", p.tensor);
  if (ops.empty()) return;
  cudaStream_t s = m.sync_stream();
  // One group: NCCL progresses all of them together, so neighbours that
  // send to each other do not wait on each other.
  m.check(ncclGroupStart(), "ncclGroupStart", op);
  for (const P2POp& p : ops) {
    if (p.tensor.nbytes() == 0) continue;
    if (p.send)
      m.check(ncclSend(p.tensor.data, p.tensor.nbytes(), ncclUint8, p.peer, m.comm, s), "ncclSend", op);
    else
      m.check(ncclRecv(p.tensor.data, p.tensor.nbytes(), ncclUint8, p.peer, m.comm, s), "ncclRecv", op);
  }
  m.check(ncclGroupEnd(), "ncclGroupEnd", op);
}

void NcclCommunicator::do_barrier() {
  Impl& m = *impl_;
  m.usable("barrier");
  if (!m.barrier_word) CUDA_CHECK(cudaMalloc(&m.barrier_word, sizeof(int)), m.name + ": barrier scratch");
  cudaStream_t s = m.sync_stream();
  m.check(ncclAllReduce(m.barrier_word, m.barrier_word, 1, ncclInt32, ncclSum, m.comm, s), "ncclAllReduce", "barrier");
  CUDA_CHECK(cudaStreamSynchronize(s), "barrier on group " + m.describe());
}

void NcclCommunicator::abort() {
  if (impl_->aborted.exchange(true)) return;
  if (impl_->comm) ncclCommAbort(impl_->comm);
}

std::string NcclCommunicator::async_error() {
  if (impl_->aborted.load()) return "aborted";
  ncclResult_t r = ncclSuccess;
  if (ncclCommGetAsyncError(impl_->comm, &r) != ncclSuccess) return "ncclCommGetAsyncError failed";
  if (r == ncclSuccess || r == ncclInProgress) return "";
  const char* last = ncclGetLastError(impl_->comm);
  return std::string(ncclGetErrorString(r)) + (last && *last ? std::string(" (") + last + ")" : "");
}

}  // namespace trainer
