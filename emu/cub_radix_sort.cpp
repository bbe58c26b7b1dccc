// The emulated cub::DeviceRadixSort::SortPairs
// (emu/cuda_shim/cub/device/device_radix_sort.cuh): a least-significant-digit
// radix sort, 8 key bits a pass, of the item positions; then keys and values
// are gathered by the sorted positions. Each pass is a counting sort that
// keeps equal digits in their current order, so the whole sort is stable, as
// CUB's is. The positions' two ping-pong arrays live in the caller's temporary
// storage, so a caller that allocates less than the size query said is caught
// here as on a GPU.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "emu/cuda_shim/cub/device/device_radix_sort.cuh"

namespace trainer::emu::cub_detail {
namespace {

constexpr int kDigitBits = 8;
constexpr size_t kAlign = 256;  // the alignment cudaMalloc gives; CUB aligns its pieces the same way

size_t round_up(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

bool refuse(const std::string& why) {
  std::fprintf(stderr, "cub::DeviceRadixSort::SortPairs (emulated): %s\n", why.c_str());
  return false;
}

// Two arrays of 64-bit positions, plus room to align the first to 256 bytes
// wherever the caller's storage starts; never 0 bytes, so that a caller that
// allocates exactly what was asked never passes nullptr again (which would be
// another size query, silently sorting nothing).
size_t temp_bytes_for(long long n) { return 2 * round_up(size_t(n) * sizeof(uint64_t)) + kAlign; }

uint64_t key_at(const void* keys, size_t key_bytes, uint64_t i) {
  const auto* p = static_cast<const unsigned char*>(keys) + i * key_bytes;
  switch (key_bytes) {
    case 1: return *p;
    case 2: { uint16_t k; std::memcpy(&k, p, 2); return k; }
    case 4: { uint32_t k; std::memcpy(&k, p, 4); return k; }
    default: { uint64_t k; std::memcpy(&k, p, 8); return k; }
  }
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

bool check_bits(size_t key_bytes, int begin_bit, int end_bit) {
  const int bits = int(key_bytes * 8);
  if (begin_bit < 0 || end_bit > bits || begin_bit > end_bit)
    return refuse("the bit range [begin_bit, end_bit) = [" + std::to_string(begin_bit) + ", " +
                  std::to_string(end_bit) + ") is not within the " + std::to_string(bits) + "-bit keys with begin_bit <= end_bit");
  return true;
}

// CUB forbids any overlap between the four arrays (and the temporary storage
// is the sort's own).
bool check_disjoint(const void* const ptr[5], const size_t bytes[5]) {
  const char* names[5] = {"d_keys_in", "d_keys_out", "d_values_in", "d_values_out", "d_temp_storage"};
  for (int i = 0; i < 5; ++i)
    for (int j = i + 1; j < 5; ++j)
      if (overlaps(ptr[i], bytes[i], ptr[j], bytes[j]))
        return refuse(std::string(names[i]) + " and " + names[j] + " overlap; CUB's SortPairs does not sort in place");
  return true;
}

struct Arrays {
  const void* keys_in;
  void* keys_out;
  size_t key_bytes;
  const void* values_in;
  void* values_out;
  size_t value_bytes;
  uint64_t n;
};

bool check_arrays(const Arrays& a, void* temp, size_t temp_bytes) {
  const uint64_t kb = a.n * a.key_bytes, vb = a.n * a.value_bytes;
  const void* ptr[5] = {a.keys_in, a.keys_out, a.values_in, a.values_out, temp};
  const size_t bytes[5] = {kb, kb, vb, vb, temp_bytes};
  const char* names[4] = {"d_keys_in", "d_keys_out", "d_values_in", "d_values_out"};
  for (int i = 0; i < 4; ++i)
    if (a.n > 0 && !ptr[i]) return refuse(std::string(names[i]) + " is null with " + std::to_string(a.n) + " items");
  return check_disjoint(ptr, bytes);
}

// One stable counting-sort pass of the positions `from` by the digit at `shift`.
void pass(const Arrays& a, const uint64_t* from, uint64_t* to, int shift, uint64_t mask) {
  uint64_t start[(1 << kDigitBits) + 1] = {};
  for (uint64_t i = 0; i < a.n; ++i) ++start[((key_at(a.keys_in, a.key_bytes, from[i]) >> shift) & mask) + 1];
  for (int d = 0; d < (1 << kDigitBits); ++d) start[d + 1] += start[d];
  for (uint64_t i = 0; i < a.n; ++i) to[start[(key_at(a.keys_in, a.key_bytes, from[i]) >> shift) & mask]++] = from[i];
}

// The sorted positions, in `first` or `second` (the one returned).
const uint64_t* sort_positions(const Arrays& a, uint64_t* first, uint64_t* second, int begin_bit, int end_bit) {
  for (uint64_t i = 0; i < a.n; ++i) first[i] = i;
  uint64_t* from = first;
  uint64_t* to = second;
  for (int bit = begin_bit; bit < end_bit; bit += kDigitBits) {
    const int width = end_bit - bit < kDigitBits ? end_bit - bit : kDigitBits;
    pass(a, from, to, bit, (uint64_t(1) << width) - 1);
    std::swap(from, to);
  }
  return from;
}

void gather(const Arrays& a, const uint64_t* order) {
  auto* ko = static_cast<unsigned char*>(a.keys_out);
  auto* vo = static_cast<unsigned char*>(a.values_out);
  const auto* ki = static_cast<const unsigned char*>(a.keys_in);
  const auto* vi = static_cast<const unsigned char*>(a.values_in);
  for (uint64_t i = 0; i < a.n; ++i) {
    std::memcpy(ko + i * a.key_bytes, ki + order[i] * a.key_bytes, a.key_bytes);
    std::memcpy(vo + i * a.value_bytes, vi + order[i] * a.value_bytes, a.value_bytes);
  }
}

}  // namespace

bool radix_sort_pairs(void* temp, size_t& temp_bytes, const void* keys_in, void* keys_out, size_t key_bytes,
                      const void* values_in, void* values_out, size_t value_bytes, long long num_items,
                      int begin_bit, int end_bit) {
  if (num_items < 0) return refuse("num_items is " + std::to_string(num_items) + "; it must be at least 0");
  if (!check_bits(key_bytes, begin_bit, end_bit)) return false;
  const size_t need = temp_bytes_for(num_items);
  if (!temp) {
    temp_bytes = need;
    return true;
  }
  if (temp_bytes < need)
    return refuse("temp_storage_bytes is " + std::to_string(temp_bytes) + " but this sort needs " +
                  std::to_string(need) + " (the size query with d_temp_storage == nullptr says how many)");
  const Arrays a{keys_in, keys_out, key_bytes, values_in, values_out, value_bytes, uint64_t(num_items)};
  if (!check_arrays(a, temp, temp_bytes)) return false;
  const uintptr_t base = reinterpret_cast<uintptr_t>(temp);
  char* aligned = static_cast<char*>(temp) + (round_up(base) - base);
  auto* first = reinterpret_cast<uint64_t*>(aligned);
  auto* second = reinterpret_cast<uint64_t*>(aligned + round_up(a.n * sizeof(uint64_t)));
  gather(a, sort_positions(a, first, second, begin_bit, end_bit));
  return true;
}

}  // namespace trainer::emu::cub_detail
