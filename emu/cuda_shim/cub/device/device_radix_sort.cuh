// The emulated CUDA device's cub::DeviceRadixSort: the SortPairs overload
// kernels/cuda/embedding.cu calls (separate input and output arrays, not the
// DoubleBuffer one), for unsigned integer keys, on host memory
// (emu/cub_radix_sort.cpp).
//
// As CUB's: the two-call protocol (d_temp_storage == nullptr writes the
// temporary bytes needed to temp_storage_bytes and sorts nothing; a later call
// with at least that many bytes sorts), a stable least-significant-digit
// radix sort on the key bits [begin_bit, end_bit) (keys equal in those bits
// keep their input order; the keys are output whole), inputs never written,
// no overlap allowed between the four arrays. The sort runs on the calling
// thread and is done when the call returns: the stream is not used (the
// emulated device's work is synchronous). A bad argument returns
// cudaErrorInvalidValue (CUB's answer to a short temporary allocation) with
// the reason on stderr.
#pragma once

#include <stddef.h>

#include <type_traits>

// cudaError_t: the runtime's own where its headers are on the include path
// (the module's emulated build); the two values used here otherwise (unit
// tests that see no toolkit).
#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#else
typedef enum cudaError { cudaSuccess = 0, cudaErrorInvalidValue = 1 } cudaError_t;
typedef struct CUstream_st* cudaStream_t;
#endif

namespace trainer::emu::cub_detail {

// The untyped sort behind SortPairs: keys of key_bytes (1, 2, 4 or 8,
// unsigned), values of value_bytes copied as bytes. Returns false after
// printing why the arguments are refused.
bool radix_sort_pairs(void* temp, size_t& temp_bytes, const void* keys_in, void* keys_out, size_t key_bytes,
                      const void* values_in, void* values_out, size_t value_bytes, long long num_items,
                      int begin_bit, int end_bit);

}  // namespace trainer::emu::cub_detail

namespace cub {

struct DeviceRadixSort {
  template <typename KeyT, typename ValueT, typename NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes, const KeyT* d_keys_in,
                               KeyT* d_keys_out, const ValueT* d_values_in, ValueT* d_values_out,
                               NumItemsT num_items, int begin_bit = 0, int end_bit = sizeof(KeyT) * 8,
                               cudaStream_t stream = 0) {
    // CUB also sorts signed and floating-point keys by flipping bits first;
    // the module sorts unsigned ones only, and these are what is emulated.
    static_assert(std::is_integral_v<KeyT> && std::is_unsigned_v<KeyT> && !std::is_same_v<KeyT, bool>,
                  "the emulated cub::DeviceRadixSort::SortPairs sorts unsigned integer keys only");
    static_assert(std::is_trivially_copyable_v<ValueT>, "radix-sorted values are moved as bytes");
    static_assert(std::is_integral_v<NumItemsT>, "num_items is an integer");
    (void)stream;
    const bool ok = trainer::emu::cub_detail::radix_sort_pairs(
        d_temp_storage, temp_storage_bytes, d_keys_in, d_keys_out, sizeof(KeyT), d_values_in, d_values_out,
        sizeof(ValueT), static_cast<long long>(num_items), begin_bit, end_bit);
    return ok ? cudaSuccess : cudaErrorInvalidValue;
  }
};

}  // namespace cub
