// What the PTX ISA says each probe must output, computed on the host from the
// same inputs, written from the ISA's tables and pseudocode rather than from
// emu/: where the emulator disagrees with this, it misreads the ISA; where a
// GPU does, the ISA reading here (and in emu/) is wrong.
#include <bit>
#include <cmath>
#include <cstdio>

#include "tests/ptx_probe/probe.h"

namespace ptx_probe {
namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

bool mma_probe(const std::string& name, Type16& type, bool& integers) {
  if (name.rfind("mma_", 0) != 0) return false;
  type = name.find("_f16_") != std::string::npos ? Type16::kF16 : Type16::kBf16;
  integers = name.size() > 4 && name.compare(name.size() - 4, 4, "_int") == 0;
  return true;
}

// The warp's A (16x16), B (16x8), C (16x8) as the fragment tables place the
// lanes' registers.
struct MmaMatrices {
  double a[16][16], b[16][8], c[16][8];
};
MmaMatrices mma_matrices(Type16 type, const std::vector<uint32_t>& words) {
  MmaMatrices m{};
  for (int lane = 0; lane < kLanes; ++lane) {
    const uint32_t* w = &words[lane * kMmaWords];
    for (int e = 0; e < 8; ++e) {
      const Pos p = mma_a_pos(lane, e);
      m.a[p.row][p.col] = decode16(type, uint16_t(w[e / 2] >> (16 * (e % 2))));
    }
    for (int e = 0; e < 4; ++e) {
      const Pos p = mma_b_pos(lane, e);
      m.b[p.row][p.col] = decode16(type, uint16_t(w[4 + e / 2] >> (16 * (e % 2))));
      const Pos q = mma_c_pos(lane, e);
      m.c[q.row][q.col] = from_bits(w[6 + e]);
    }
  }
  return m;
}

Values mma_expected(Type16 type, bool integers) {
  const MmaMatrices m = mma_matrices(type, mma_inputs(type, integers));
  Values v;
  for (int lane = 0; lane < kLanes; ++lane)
    for (int e = 0; e < 4; ++e) {
      const Pos p = mma_c_pos(lane, e);
      double sum = m.c[p.row][p.col];
      for (int k = 0; k < 16; ++k) sum += m.a[p.row][k] * m.b[k][p.col];
      v[uint32_t(lane * 4 + e)] = bits(float(sum));
    }
  return v;
}

Values ldmatrix_expected(int config) {
  const std::vector<uint32_t> rows = ldmatrix_rows();
  const bool trans = config % 2 == 1;
  // Element (r, c) of matrix m as stored: the c-th 16-bit value of the row
  // lane 8m + r points at, whose value is its own index.
  auto stored = [&](int m, int r, int c) { return rows[config * kLanes + m * 8 + r] * 8 + uint32_t(c); };
  Values v;
  for (int lane = 0; lane < kLanes; ++lane)
    for (int m = 0; m < 4; ++m) {
      const int row = lane / 4, col = 2 * (lane % 4);
      const uint32_t lo = trans ? stored(m, col, row) : stored(m, row, col);
      const uint32_t hi = trans ? stored(m, col + 1, row) : stored(m, row, col + 1);
      v[uint32_t(lane * 4 + m)] = lo | hi << 16;
    }
  return v;
}

Values cp_async_expected(bool whole_buffer) {
  const std::vector<uint32_t> src = cp_async_source();
  auto chunk_word = [&](int k, int t, int w) -> uint32_t {
    switch (k) {
      case 0: return src[t * 4 + w];
      case 1: return cp_chunk1_valid(t) ? src[(32 + t) * 4 + w] : 0;
      case 2: return cp_chunk2_valid(t) ? src[cp_chunk2_source(t) * 4 + w] : 0;
      default: return kCpPattern | uint32_t((k * 32 + t) * 4 + w);
    }
  };
  Values v;
  for (int t = 0; t < kLanes; ++t)
    for (int k = 0; k < (whole_buffer ? 4 : 2); ++k)
      for (int w = 0; w < 4; ++w)
        v[whole_buffer ? uint32_t((k * 32 + t) * 4 + w) : uint32_t(t * 8 + k * 4 + w)] = chunk_word(k, t, w);
  return v;
}

// The correctly rounded 2^x with .ftz's flushes; the GPU may be 2 ulp off.
Values ex2_expected() {
  const std::vector<float> x = ex2_inputs();
  Values v;
  for (size_t i = 0; i < x.size(); ++i) {
    float in = x[i];
    if (std::fpclassify(in) == FP_SUBNORMAL) in = 0.0f;
    float d = float(std::exp2(double(in)));
    if (std::fpclassify(d) == FP_SUBNORMAL) d = 0.0f;
    v[uint32_t(i)] = bits(d);
  }
  return v;
}

// PTX shfl.sync's pseudocode, with the c operand CUDA's __shfl*_sync build:
// ((32 - width) << 8) | clamp, the clamp 0 for up and 31 otherwise.
int shfl_source(const ShflCase& k, int lane) {
  const int segmask = (32 - k.width) & 31, cval = k.mode == kShflUp ? 0 : 31;
  const int max_lane = (lane & segmask) | (cval & ~segmask), min_lane = lane & segmask;
  const int b = (k.b + lane * k.lane_step) & 31;
  int j = lane;
  bool pval = true;
  switch (k.mode) {
    case kShflUp: j = lane - b; pval = j >= max_lane; break;
    case kShflDown: j = lane + b; pval = j <= max_lane; break;
    case kShflXor: j = lane ^ b; pval = j <= max_lane; break;
    default: j = min_lane | (b & ~segmask); pval = j <= max_lane; break;
  }
  return pval ? j : lane;
}

// Every shuffle and ballot probe: [case in probe][lane][word] as the kernel
// writes them (lanes outside the mask untouched, word 1 only for u64).
Table shfl_expected() {
  const auto& cases = shfl_cases();
  const std::vector<uint32_t> vals = shfl_values();
  std::map<std::string, uint32_t> seen;
  Table t;
  for (size_t c = 0; c < cases.size(); ++c) {
    const ShflCase& k = cases[c].c;
    const uint32_t n = seen[cases[c].probe]++;
    unsigned ballot = 0;
    for (int lane = 0; lane < kLanes; ++lane)
      if ((k.mask >> lane & 1u) && (vals[c * kLanes + lane] & uint32_t(k.b))) ballot |= 1u << lane;
    Values& v = t[cases[c].probe];
    for (int lane = 0; lane < kLanes; ++lane) {
      const uint32_t at = (n * kLanes + uint32_t(lane)) * 2;
      uint32_t w0 = kShflUntouched, w1 = kShflUntouched;
      if (k.mask >> lane & 1u) {
        const uint32_t src = vals[c * kLanes + shfl_source(k, lane)];
        w0 = k.mode == kBallot ? ballot : k.type == kU64 ? src ^ kShflLowMix : src;
        if (k.type == kU64) w1 = src;
      }
      v[at] = w0;
      if (k.type == kU64) v[at + 1] = w1;
    }
  }
  return t;
}

Values barrier_expected() {
  const std::vector<uint32_t> s = barrier_inputs();
  const int n = kBarrierThreads;
  std::vector<uint32_t> x(n), s2(n);
  for (int t = 0; t < n; ++t) x[t] = s[(t * 37 + 11) % n] ^ s[n - 1 - t];
  for (int t = 0; t < n; ++t) s2[t] = x[t] * 2654435761u;
  Values v;
  for (int t = 0; t < n; ++t) v[uint32_t(t)] = s2[(t + 1) % n] + x[t];
  return v;
}

Values atomic_expected() {
  int ints[kAtomicInts] = {};
  double floats[kAtomicFloats] = {};
  for (int blk = 0; blk < kAtomicBlocks; ++blk)
    for (int t = 0; t < kAtomicThreads; ++t) {
      ints[t % kAtomicInts] += atomic_int_term(blk, t);
      floats[t % kAtomicFloats] += atomic_float_term(blk, t);
    }
  Values v;
  for (int i = 0; i < kAtomicInts; ++i) v[uint32_t(i)] = uint32_t(ints[i]);
  for (int i = 0; i < kAtomicFloats; ++i) v[uint32_t(kAtomicInts + i)] = bits(float(floats[i]));
  return v;
}

Table expected_table() {
  Table t = shfl_expected();
  t["mma_bf16_int"] = mma_expected(Type16::kBf16, true);
  t["mma_f16_int"] = mma_expected(Type16::kF16, true);
  t["mma_bf16_rand"] = mma_expected(Type16::kBf16, false);
  t["mma_f16_rand"] = mma_expected(Type16::kF16, false);
  const char* ldsm[kLdsmConfigs] = {"ldmatrix_x4", "ldmatrix_x4_trans", "ldmatrix_x4_scattered",
                                    "ldmatrix_x4_trans_scattered"};
  for (int c = 0; c < kLdsmConfigs; ++c) t[ldsm[c]] = ldmatrix_expected(c);
  t["cp_async_wait1"] = cp_async_expected(false);
  t["cp_async_wait0"] = cp_async_expected(true);
  t["ex2_approx_ftz"] = ex2_expected();
  t["block_barrier"] = barrier_expected();
  t["atomic_add"] = atomic_expected();
  return t;
}

}  // namespace

double mma_scale(const std::string& probe, uint32_t index) {
  static std::map<std::string, std::vector<double>> cache;
  Type16 type;
  bool integers;
  if (!mma_probe(probe, type, integers) || index >= uint32_t(kLanes * 4)) return 0;
  std::vector<double>& s = cache[probe];
  if (s.empty()) {
    const MmaMatrices m = mma_matrices(type, mma_inputs(type, integers));
    for (int lane = 0; lane < kLanes; ++lane)
      for (int e = 0; e < 4; ++e) {
        const Pos p = mma_c_pos(lane, e);
        double sum = std::fabs(m.c[p.row][p.col]);
        for (int k = 0; k < 16; ++k) sum += std::fabs(m.a[p.row][k] * m.b[k][p.col]);
        s.push_back(sum);
      }
  }
  return s[index];
}

void print_table(const Table& t, const std::string& header) {
  std::printf("# %s\n", header.c_str());
  for (const ProbeInfo& p : probes()) {
    const auto it = t.find(p.name);
    if (it == t.end()) continue;
    std::printf("# %s: %s\n", p.name, p.what);
    for (const auto& [index, value] : it->second) std::printf("%s %u %08x\n", p.name, index, value);
  }
  std::fflush(stdout);
}

bool check_references(const Table& t, std::string& out) {
  const Table want = expected_table();
  bool ok = true;
  char line[512];
  for (const ProbeInfo& p : probes()) {
    const auto got = t.find(p.name);
    const Verdict v = compare_probe(p, got == t.end() ? Values{} : got->second, want.at(p.name), kEx2UlpVsReference);
    std::snprintf(line, sizeof line, "reference %s: %s (%zu values, max difference %.3g %s; rule %s)\n", p.name,
                  v.bad ? "WRONG" : "ok", v.values, v.max_diff, v.unit.c_str(), v.rule.c_str());
    out += line;
    for (const std::string& s : v.first_bad) out += "  " + s + " (got, ISA)\n";
    ok = ok && v.bad == 0;
  }
  return ok;
}

}  // namespace ptx_probe
