// Multi-tensor AdamW of the CUDA backend (kernels/op_list.h): the update of
// adamw_update_master over a whole list of tensors in one launch per
// (param dtype, grad dtype) pair present, usually exactly one.
//
// Algorithm: the host cuts every tensor into chunks of kChunk elements and
// writes a table to device memory: one 64-byte entry per tensor (pointers,
// numel, weight decay, alignment phase) and one 8-byte entry per chunk
// (tensor index, chunk index), chunks grouped by dtype pair. Each thread
// block takes one chunk, reads its tensor's entry and runs the same
// per-element code as adamw.cu (adamw_detail::update_range: 4 elements per
// step, 16-byte F32 / 8-byte BF16/F16 vector accesses when the five arrays
// share an alignment phase, scalar head/tail), so results are bit-identical
// to the single-tensor op. The decay factor 1 - lr*wd is formed per block
// from the tensor's own weight decay (round-to-nearest double, as the host).
// The table is uploaded only when it changes (pointers, sizes and decays are
// the same every step), so a steady-state step costs the launches alone.
//
// Bytes: those of adamw_update_master (28 B per BF16 parameter) plus 72 B per
// 32k-element chunk for the table reads (0.01%). Flops: about 20 per element.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/adamw_math.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch.cuh"

namespace trainer::cuda {
namespace {

using adamw_detail::Consts;

constexpr const char* kOp = "adamw_update_master_multi";
constexpr int kThreads = 256;
// Elements per block: 128 per thread, 0.9 MB of traffic per block in BF16.
// A multiple of 4, so every chunk starts at the same vector phase.
constexpr int64_t kChunk = 32768;

struct TensorEntry {
  void* param;
  float* master;
  const void* grad;
  float* m;
  float* v;
  int64_t n;
  double weight_decay;
  int32_t head;  // update_range's vector phase, -1: scalar only
  int32_t pad;
};
static_assert(sizeof(TensorEntry) == 64);

struct ChunkEntry {
  uint32_t tensor;
  uint32_t chunk;
};
static_assert(sizeof(ChunkEntry) == 8);

template <typename Tp, typename Tg>
__global__ void __launch_bounds__(kThreads)
    adamw_multi_kernel(const TensorEntry* __restrict__ tensors, const ChunkEntry* __restrict__ chunks, Consts c) {
  const ChunkEntry ch = chunks[blockIdx.x];
  const TensorEntry e = tensors[ch.tensor];
  const int64_t begin = int64_t(ch.chunk) * kChunk;
  const int64_t end = e.n < begin + kChunk ? e.n : begin + kChunk;
  const float decay = adamw_detail::decay_factor(c.lr, e.weight_decay);
  adamw_detail::update_range<Tp, Tg, true>(static_cast<Tp*>(e.param), e.master, static_cast<const Tg*>(e.grad),
                                           e.m, e.v, begin, end, e.head, decay, c, threadIdx.x, kThreads);
}

// ---- helpers ---------------------------------------------------------------
// The arguments arrive checked by the router (kernels/checks/adamw_multi.cpp):
// equal list lengths, each tensor's dtypes and sizes, and no overlap between
// any two arrays of the call, which matters here: chunks of different
// tensors run concurrently.

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument(std::string(kOp) + ": " + what); }

int dtype_index(DType t) { return t == DType::F32 ? 0 : t == DType::BF16 ? 1 : 2; }

template <typename T>
int phase(const Tensor& t) {
  return adamw_detail::phase_of<T>(t.data);
}

int phase_any(const Tensor& t) {
  switch (t.dtype) {
    case DType::BF16: return phase<__nv_bfloat16>(t);
    case DType::F16: return phase<__half>(t);
    default: return phase<float>(t);
  }
}

// ---- the device-side table --------------------------------------------------

// One buffer per process, reused every step; re-uploaded only when the bytes
// differ from the last upload. Stream order protects it: an upload is queued
// after the kernels that read the previous contents.
struct TableCache {
  std::mutex mu;
  void* dev = nullptr;
  size_t capacity = 0;
  int device = -1;
  std::vector<unsigned char> uploaded;  // bytes now in dev (valid when !uploaded.empty())
};

TableCache& table_cache() {
  static TableCache c;  // never destroyed before exit; the driver frees dev then
  return c;
}

// Returns the device copy of blob (valid for kernels on stream()).
const unsigned char* upload(TableCache& c, const std::vector<unsigned char>& blob) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device), kOp);
  if (c.device != device || blob.size() > c.capacity) {
    if (c.dev != nullptr) {
      // Kernels queued with the old table may still read it.
      CUDA_CHECK(cudaStreamSynchronize(stream()), "adamw multi-tensor table resize");
      CUDA_CHECK(cudaFree(c.dev), "adamw multi-tensor table resize");
      c.dev = nullptr;
    }
    const size_t cap = std::max(blob.size(), c.device == device ? 2 * c.capacity : size_t(0));
    CUDA_CHECK(cudaMalloc(&c.dev, cap), "adamw multi-tensor table, " + std::to_string(cap) + " bytes");
    c.capacity = cap;
    c.device = device;
    c.uploaded.clear();
  }
  if (c.uploaded != blob) {
    c.uploaded = blob;
    // From pageable memory: staged before the call returns, so c.uploaded
    // may change afterwards; the copy is ordered after earlier kernels.
    const cudaError_t e = cudaMemcpyAsync(c.dev, c.uploaded.data(), c.uploaded.size(), cudaMemcpyHostToDevice, stream());
    if (e != cudaSuccess) {
      c.uploaded.clear();  // the device copy is unknown now
      cuda_fail("cudaMemcpyAsync", "adamw multi-tensor table, " + std::to_string(blob.size()) + " bytes", e);
    }
  }
  return static_cast<const unsigned char*>(c.dev);
}

}  // namespace

void adamw_update_master_multi(const std::vector<Tensor>& params, const std::vector<Tensor>& masters,
                               const std::vector<Tensor>& grads, const std::vector<Tensor>& ms,
                               const std::vector<Tensor>& vs, const std::vector<float>& weight_decays,
                               const ops::AdamWStep& s) {
  const size_t T = masters.size();
  if (T > size_t(std::numeric_limits<uint32_t>::max())) fail("too many tensors: " + std::to_string(T));

  // Everything is laid out (and the limits checked) before anything launches.
  std::vector<TensorEntry> entries(T);
  for (size_t i = 0; i < T; ++i) {
    const Tensor &p = params[i], &w = masters[i], &g = grads[i], &m = ms[i], &v = vs[i];
    const int64_t n = w.numel();
    TensorEntry& e = entries[i];
    e.param = p.data;
    e.master = static_cast<float*>(w.data);
    e.grad = g.data;
    e.m = static_cast<float*>(m.data);
    e.v = static_cast<float*>(v.data);
    e.n = n;
    e.weight_decay = double(weight_decays[i]);
    e.head = adamw_detail::common_head({phase_any(p), phase<float>(w), phase_any(g), phase<float>(m), phase<float>(v)});
    e.pad = 0;
    if ((n + kChunk - 1) / kChunk > int64_t(std::numeric_limits<uint32_t>::max()))
      fail("tensor " + std::to_string(i) + ": too many elements: " + std::to_string(n));
  }

  // Chunks grouped by (param dtype, grad dtype), tensors in list order.
  std::vector<ChunkEntry> chunks;
  int64_t group_begin[10] = {};
  for (int grp = 0; grp < 9; ++grp) {
    group_begin[grp] = int64_t(chunks.size());
    for (size_t i = 0; i < T; ++i) {
      if (dtype_index(params[i].dtype) * 3 + dtype_index(grads[i].dtype) != grp) continue;
      const int64_t nchunks = (entries[i].n + kChunk - 1) / kChunk;
      for (int64_t k = 0; k < nchunks; ++k) chunks.push_back({uint32_t(i), uint32_t(k)});
    }
  }
  group_begin[9] = int64_t(chunks.size());
  if (chunks.empty()) return;

  std::vector<unsigned char> blob(T * sizeof(TensorEntry) + chunks.size() * sizeof(ChunkEntry));
  std::memcpy(blob.data(), entries.data(), T * sizeof(TensorEntry));
  std::memcpy(blob.data() + T * sizeof(TensorEntry), chunks.data(), chunks.size() * sizeof(ChunkEntry));

  const Consts c = adamw_detail::make_consts(s);
  TableCache& cache = table_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  const unsigned char* dev = upload(cache, blob);
  const auto* dev_tensors = reinterpret_cast<const TensorEntry*>(dev);
  const auto* dev_chunks = reinterpret_cast<const ChunkEntry*>(dev + T * sizeof(TensorEntry));

  constexpr DType kTypes[3] = {DType::F32, DType::BF16, DType::F16};
  for (int grp = 0; grp < 9; ++grp) {
    const int64_t count = group_begin[grp + 1] - group_begin[grp];
    if (count == 0) continue;
    if (count > int64_t(std::numeric_limits<int>::max()))
      fail("too many chunks: " + std::to_string(count));
    const DType pt = kTypes[grp / 3], gt = kTypes[grp % 3];
    const std::string ctx = std::to_string(T) + " tensors, " + std::to_string(count) + " chunks of " +
                            std::to_string(kChunk) + ", param " + dtype_name(pt) + ", grad " + dtype_name(gt);
    DISPATCH_FLOAT(pt, Tp, kOp, {
      DISPATCH_FLOAT(gt, Tg, kOp, {
        launch(adamw_multi_kernel<Tp, Tg>, unsigned(count), kThreads, 0, stream(), dev_tensors,
               dev_chunks + group_begin[grp], c);
        KERNEL_CHECK("adamw_multi_kernel", ctx);
      });
    });
  }
}

}  // namespace trainer::cuda
