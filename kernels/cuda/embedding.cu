// Token (and position) embedding of the CUDA backend (see kernels/op_list.h).
// The table, out/dout and dtable may each be F32, BF16 or F16; arithmetic is
// fp32; ids are I32. The table holds `rows` rows starting at id row_offset
// of a vocabulary of V ids (vocabulary parallelism); ids of other rows give
// zero rows (forward, or nothing when accumulating) and are skipped
// (backward).
//
// Forward: a gather. One thread per (token, pack of 8 channels) with 16-byte
// loads when C % 8 == 0 and the pointers are 16-byte aligned, per channel
// otherwise. Bytes ~ N*C*(st + so) (+ N*C*so when accumulating).
//
// Backward, deterministic without float atomics: a stable sort of the
// positions by id, then one warp per (id, 256-channel slice) adds its
// positions' gradient rows in position order.
//   1. keys[n] = ids[n] - row_offset for the rows held here; other ids, valid
//      or not, become `rows` (sorted last and skipped); vals[n] = n.
//   2. cub::DeviceRadixSort::SortPairs on the low ceil(log2(rows+1)) key bits.
//      An LSD radix sort is stable, so within one id the positions stay in
//      increasing order, and its output is fully determined by its input. This
//      replaces a counting sort: no V-sized histogram or scan, and no
//      within-bucket reordering to make atomic placement stable.
//   3. The warp at sorted index j works only if j starts a run of equal keys;
//      it finds the run's end with ballots, then accumulates
//      acc = dtable[id]; acc += dout[pos] for pos in increasing order. For F32
//      that is exactly the CPU twin's sequence of fp32 additions.
// Scratch: 16 bytes per token plus CUB's temporary storage, in a grow-only
// device buffer (below). Bytes ~ N*C*sg (dout once) + U*C*2*sd for U distinct
// ids, plus the sort (~N*8 bytes a pass, 2-3 passes for V <= 2^24).
// Work balance: a run of r equal ids is r sequential row reads for its warps;
// a batch of one repeated token (padding) is the slow case, still linear.
//
// Ids are checked on the device, not the host (that would need a sync and a
// copy): an id outside the vocabulary [0, V) makes its output row NaN in the
// forward and is ignored in the backward, and the first one per process is
// printed.
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pack.cuh"

namespace trainer::cuda {
namespace {

using checks::fail;

constexpr int kPack = 8;
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;
constexpr int kWarpsPerBlock = 8;  // backward: one sorted index per warp

// ---- argument checks ---------------------------------------------------------

// Shapes and dtypes arrive checked by the router
// (kernels/checks/embedding.cpp); the kernels index in 32 bits.
// Sort keys are 0..rows (rows marks the ids not held here), so rows < 2^31 - 1.
void check_limits(const char* op, const Tensor& ids, const Tensor& table, const char* table_name) {
  const int64_t C = table.dim(1);
  if (table.dim(0) >= (int64_t(1) << 31) - 1 || C >= (int64_t(1) << 31) || ids.numel() >= (int64_t(1) << 31))
    fail(op, std::string(table_name) + " " + table.shape_str() + " with ids " + ids.shape_str() +
                 " exceeds 32-bit indexing");
}


std::string describe(const char* name, const Tensor& t) {
  return std::string(name) + " " + dtype_name(t.dtype) + t.shape_str();
}

// ---- bad ids -------------------------------------------------------------------

__device__ int g_bad_id_reported = 0;

__device__ void report_bad_id(const char* op, int32_t id, int64_t position, int64_t V) {
  if (atomicCAS(&g_bad_id_reported, 0, 1) == 0)
    printf("%s: id %d at position %lld is outside the vocabulary [0, %lld) (first bad id of this "
           "process; forward rows of bad ids are NaN, backward ignores them)\n",
           op, int(id), static_cast<long long>(position), static_cast<long long>(V));
}

// ---- forward -------------------------------------------------------------------

template <typename TO, typename TT, int P>
__global__ void __launch_bounds__(kThreads)
    embedding_forward_kernel(TO* out, const int32_t* ids, const TT* table, int64_t N, int C,
                             int64_t row_offset, int64_t rows, int64_t V, bool accumulate) {
  const int64_t per_row = C / P;  // P divides C (P == 8 only when C % 8 == 0)
  const int64_t total = N * per_row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t n = idx / per_row;
    const int64_t c = (idx - n * per_row) * P;
    const int32_t id = ids[n];
    const int64_t r = int64_t(id) - row_offset;
    TO* dst = out + n * C + c;
    float v[P];
    if (id < 0 || id >= V) {
#pragma unroll
      for (int k = 0; k < P; ++k) v[k] = __int_as_float(0x7fc00000);  // quiet NaN
      if (c == 0) report_bad_id("embedding_forward", id, n, V);
    } else if (r >= 0 && r < rows) {
      load_pack<TT, P>(table + r * C + c, v);
    } else {
      // Another rank's id: no store at all when accumulating (adding +0
      // would turn -0 into +0), so the ranks' sum is the whole lookup.
      if (accumulate) continue;
#pragma unroll
      for (int k = 0; k < P; ++k) v[k] = 0.f;
      store_pack<TO, P>(dst, v);
      continue;
    }
    if (accumulate) {
      float o[P];
      load_pack<TO, P>(dst, o);
#pragma unroll
      for (int k = 0; k < P; ++k) v[k] += o[k];
    }
    store_pack<TO, P>(dst, v);
  }
}

// ---- backward -------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads)
    embedding_keys_kernel(uint32_t* keys, int32_t* vals, const int32_t* ids, int64_t N, int64_t row_offset,
                          int64_t rows, int64_t V) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int32_t id = ids[n];
  if (id < 0 || id >= V) report_bad_id("embedding_backward", id, n, V);
  const int64_t r = int64_t(id) - row_offset;
  const bool held = id >= 0 && id < V && r >= 0 && r < rows;
  keys[n] = held ? uint32_t(r) : uint32_t(rows);
  vals[n] = int32_t(n);
}

// Grid: x = sorted index groups (one index per warp), y = channel slices of
// 32*P channels. keys are sorted; pos holds the positions in the same order;
// key `rows` marks positions whose id is not held here.
template <typename TD, typename TG, int P>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    embedding_backward_kernel(TD* dtable, const TG* dout, const uint32_t* keys, const int32_t* pos, int64_t N,
                              int C, uint32_t rows) {
  const int64_t j = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x) % 32;
  if (j >= N) return;  // whole warp: j is per warp
  const uint32_t key = keys[j];
  if (key >= rows || (j > 0 && keys[j - 1] == key)) return;  // not held here, or not the first of its run
  // The run of `key` is [j, end): equal keys that follow j form a prefix of
  // every 32-wide window, so the first lane without a match marks the end.
  int64_t end = j + 1;
  for (;;) {
    const int64_t m = end + lane;
    const unsigned same = __ballot_sync(0xffffffffu, m < N && keys[m] == key);
    if (same == 0xffffffffu) {
      end += 32;
      continue;
    }
    end += __ffs(~same) - 1;
    break;
  }
  const int64_t c = (int64_t(blockIdx.y) * 32 + lane) * P;
  if (c >= C) return;  // no warp-wide operation after this point
  TD* dst = dtable + int64_t(key) * C + c;
  float acc[P];
  load_pack<TD, P>(dst, acc);
#pragma unroll 4
  for (int64_t m = j; m < end; ++m) {
    float g[P];
    load_pack<TG, P>(dout + int64_t(pos[m]) * C + c, g);
#pragma unroll
    for (int k = 0; k < P; ++k) acc[k] += g[k];
  }
  store_pack<TD, P>(dst, acc);
}

// Grow-only device scratch for the sort, kept for the life of the process
// (freed with the context at exit). Reuse across calls is safe because every
// op runs on cuda::stream(): a later call's kernels start after an earlier
// call's kernels are done with it. Growing first waits for the stream so no
// running kernel loses its buffer. One host thread issues the ops (the mutex
// only guards the allocation).
void* sort_scratch(size_t bytes, const std::string& context) {
  static std::mutex mu;
  static void* p = nullptr;
  static size_t have = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (bytes > have) {
    if (p != nullptr) {
      CUDA_CHECK(cudaStreamSynchronize(stream()), "embedding_backward scratch grow, " + context);
      CUDA_CHECK(cudaFree(p), "embedding_backward scratch grow, " + context);
      p = nullptr;
      have = 0;
    }
    const size_t want = std::max(bytes + bytes / 4, size_t(1) << 20);
    CUDA_CHECK(cudaMalloc(&p, want), "embedding_backward scratch (" + std::to_string(want) + " bytes), " + context);
    have = want;
  }
  return p;
}

size_t round_up_256(size_t b) { return (b + 255) / 256 * 256; }

}  // namespace

void embedding_forward(Tensor out, Tensor ids, Tensor table, bool accumulate, int64_t row_offset,
                       int64_t vocab_size) {
  const char* op = "embedding_forward";
  check_limits(op, ids, table, "table");
  const int64_t N = ids.numel();
  const int C = int(table.dim(1));
  const int64_t rows = table.dim(0);
  if (N == 0 || C == 0) return;
  const bool vec = C % kPack == 0 && aligned16(out.data) && aligned16(table.data);
  const int64_t units = N * (vec ? C / kPack : C);
  const int64_t blocks = std::min((units + kThreads - 1) / kThreads, kMaxBlocks);
  const std::string context = describe("out", out) + " " + describe("table", table) + " ids " + ids.shape_str();
  DISPATCH_FLOAT(out.dtype, TO, op, DISPATCH_FLOAT(table.dtype, TT, op, {
    TO* o = static_cast<TO*>(out.data);
    const TT* t = static_cast<const TT*>(table.data);
    if (vec)
      launch(embedding_forward_kernel<TO, TT, kPack>, unsigned(blocks), kThreads, 0, stream(), o, ids.i32(), t, N, C,
             row_offset, rows, vocab_size, accumulate);
    else
      launch(embedding_forward_kernel<TO, TT, 1>, unsigned(blocks), kThreads, 0, stream(), o, ids.i32(), t, N, C,
             row_offset, rows, vocab_size, accumulate);
    KERNEL_CHECK("embedding_forward_kernel", context);
  }));
}

void embedding_backward(Tensor dtable, Tensor ids, Tensor dout, int64_t row_offset,
                        int64_t vocab_size) {
  const char* op = "embedding_backward";
  check_limits(op, ids, dtable, "dtable");
  const int64_t N = ids.numel();
  const int C = int(dtable.dim(1));
  const int64_t rows = dtable.dim(0);
  if (N == 0 || C == 0) return;
  const std::string context = describe("dtable", dtable) + " " + describe("dout", dout) + " ids " + ids.shape_str();
  const bool vec = C % kPack == 0 && aligned16(dtable.data) && aligned16(dout.data);
  const int P = vec ? kPack : 1;
  const int64_t slices = (int64_t(C) + 32 * P - 1) / (32 * P);
  const int64_t index_blocks = (N + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (slices > 65535) fail(op, "dtable " + dtable.shape_str() + " is too wide");

  // Keys take the values 0..rows (rows marks ids not held here): sort only
  // the bits that hold them.
  int end_bit = 1;
  while (end_bit < 32 && (uint64_t(1) << end_bit) <= uint64_t(rows)) ++end_bit;
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const uint32_t*>(nullptr),
                                             static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), int(N), 0, end_bit, stream()),
             "cub::DeviceRadixSort::SortPairs size query, " + context);
  const size_t array_bytes = round_up_256(size_t(N) * 4);
  char* base = static_cast<char*>(sort_scratch(4 * array_bytes + temp_bytes, context));
  auto* keys_in = reinterpret_cast<uint32_t*>(base);
  auto* vals_in = reinterpret_cast<int32_t*>(base + array_bytes);
  auto* keys_out = reinterpret_cast<uint32_t*>(base + 2 * array_bytes);
  auto* vals_out = reinterpret_cast<int32_t*>(base + 3 * array_bytes);
  void* temp = base + 4 * array_bytes;

  const int64_t key_blocks = (N + kThreads - 1) / kThreads;
  launch(embedding_keys_kernel, unsigned(key_blocks), kThreads, 0, stream(), keys_in, vals_in, ids.i32(), N, row_offset,
         rows, vocab_size);
  KERNEL_CHECK("embedding_keys_kernel", context);
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in, vals_out, int(N), 0,
                                             end_bit, stream()),
             "cub::DeviceRadixSort::SortPairs, " + context);
  KERNEL_CHECK("cub::DeviceRadixSort::SortPairs", context);

  const dim3 grid{static_cast<unsigned>(index_blocks), static_cast<unsigned>(slices), 1u};
  DISPATCH_FLOAT(dtable.dtype, TD, op, DISPATCH_FLOAT(dout.dtype, TG, op, {
    TD* d = static_cast<TD*>(dtable.data);
    const TG* g = static_cast<const TG*>(dout.data);
    if (vec)
      launch(embedding_backward_kernel<TD, TG, kPack>, grid, kWarpsPerBlock * 32, 0, stream(), d, g, keys_out, vals_out,
             N, C, uint32_t(rows));
    else
      launch(embedding_backward_kernel<TD, TG, 1>, grid, kWarpsPerBlock * 32, 0, stream(), d, g, keys_out, vals_out, N,
             C, uint32_t(rows));
    KERNEL_CHECK("embedding_backward_kernel", context);
  }));
}

}  // namespace trainer::cuda
