// Three unsigned extents or coordinates, as CUDA's dim3 and uint3: what the
// launch takes for grid and block sizes and what threadIdx, blockIdx,
// blockDim and gridDim give. Components left out are 1.
#pragma once

namespace trainer::emu {

struct Dim3 {
  unsigned x = 1;
  unsigned y = 1;
  unsigned z = 1;
};

inline bool operator==(const Dim3& a, const Dim3& b) { return a.x == b.x && a.y == b.y && a.z == b.z; }

inline unsigned long long volume(const Dim3& d) {
  return static_cast<unsigned long long>(d.x) * d.y * d.z;
}

}  // namespace trainer::emu
