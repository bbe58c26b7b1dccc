// The probes' names and inputs: generated from fixed seeds, never from the
// clock or rand(), so that both builds (and every run) feed the device the
// same bits and the comparison can regenerate them.
#include <bit>
#include <cmath>
#include <limits>
#include <utility>

#include "tests/ptx_probe/probe.h"

namespace ptx_probe {
namespace {

// Knuth's MMIX LCG; the high half is the output.
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : s_(seed) {}
  uint32_t next() {
    s_ = s_ * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(s_ >> 32);
  }
  int range(int lo, int hi) { return lo + int(next() % uint32_t(hi - lo + 1)); }

 private:
  uint64_t s_;
};

// A small integer as bf16 or f16 bits (exact: |n| <= 8).
uint16_t encode_small_int(Type16 type, int n) {
  if (type == Type16::kBf16) return uint16_t(std::bit_cast<uint32_t>(float(n)) >> 16);
  if (n == 0) return 0;
  const uint16_t sign = n < 0 ? 0x8000 : 0;
  const unsigned m = unsigned(n < 0 ? -n : n);
  const int e = 31 - std::countl_zero(m);
  return uint16_t(sign | (e + 15) << 10 | ((m << (10 - e)) & 0x3FFu));
}

// A random normal 16-bit float of magnitude [2^-6, 2), or (1 in 16) zero.
uint16_t random16(Type16 type, Lcg& rng) {
  const uint32_t r = rng.next();
  if ((r & 15u) == 0) return 0;
  const uint16_t sign = uint16_t(r >> 31 << 15);
  const int exp_step = int((r >> 4) % 7u);  // 2^-6 .. 2^0
  if (type == Type16::kBf16) return uint16_t(sign | (121 + exp_step) << 7 | ((r >> 8) & 0x7Fu));
  return uint16_t(sign | (9 + exp_step) << 10 | ((r >> 8) & 0x3FFu));
}

uint32_t float_bits(float f) { return std::bit_cast<uint32_t>(f); }

}  // namespace

const std::vector<ProbeInfo>& probes() {
  static const std::vector<ProbeInfo> list = {
      {"mma_bf16_int", Rule::kExact, "mma.m16n8k16 bf16 -> f32, integer operands: every sum exact"},
      {"mma_f16_int", Rule::kExact, "mma.m16n8k16 f16 -> f32, integer operands: every sum exact"},
      {"mma_bf16_rand", Rule::kMmaTol, "mma.m16n8k16 bf16 -> f32, random operands in [-2, 2]"},
      {"mma_f16_rand", Rule::kMmaTol, "mma.m16n8k16 f16 -> f32, random operands in [-2, 2]"},
      {"ldmatrix_x4", Rule::kExact, "ldmatrix.x4, lane i gives row i%8 of matrix i/8, in order; element = its index"},
      {"ldmatrix_x4_trans", Rule::kExact, "ldmatrix.x4.trans, rows in order"},
      {"ldmatrix_x4_scattered", Rule::kExact, "ldmatrix.x4, the 32 row addresses scattered over 128 16-byte rows"},
      {"ldmatrix_x4_trans_scattered", Rule::kExact, "ldmatrix.x4.trans, scattered row addresses"},
      {"cp_async_wait1", Rule::kExact, "cp.async 16 B (some zero-fill), 2 groups: after wait_group 1 the first group"},
      {"cp_async_wait0", Rule::kExact, "cp.async: after wait_group 0 and a barrier the whole buffer"},
      {"ex2_approx_ftz", Rule::kEx2Ulp, "ex2.approx.ftz.f32 over [-130, 130] and corner cases"},
      {"shfl_xor", Rule::kExact, "__shfl_xor_sync, widths 8/16/32, lane masks in and across segments"},
      {"shfl_down", Rule::kExact, "__shfl_down_sync, widths 8/16/32, deltas inside and past the segment"},
      {"shfl_up", Rule::kExact, "__shfl_up_sync, widths 8/16/32, deltas inside and past the segment"},
      {"shfl_idx", Rule::kExact, "__shfl_sync, widths 8/16/32, fixed and per-lane source lanes, some past the width"},
      {"shfl_partial", Rule::kExact, "shuffles under partial masks (only those lanes call; every source in the mask)"},
      {"ballot", Rule::kExact, "__ballot_sync, full and partial masks"},
      {"block_barrier", Rule::kExact, "__syncthreads ordering shared-memory exchanges across 8 warps"},
      {"atomic_add", Rule::kExact, "atomicAdd totals of 64 blocks x 128 threads: ints, floats with exact partial sums"},
  };
  return list;
}

const ProbeInfo* find_probe(const std::string& name) {
  for (const ProbeInfo& p : probes())
    if (name == p.name) return &p;
  return nullptr;
}

std::vector<uint32_t> mma_inputs(Type16 type, bool integers) {
  Lcg rng(0x6D6D61ull * 4 + (type == Type16::kF16 ? 1 : 0) * 2 + (integers ? 1 : 0));
  std::vector<uint32_t> words(kLanes * kMmaWords);
  for (int lane = 0; lane < kLanes; ++lane) {
    uint32_t* w = &words[lane * kMmaWords];
    for (int r = 0; r < 6; ++r) {  // a0..a3, b0, b1: two elements each
      const uint16_t lo = integers ? encode_small_int(type, rng.range(-8, 8)) : random16(type, rng);
      const uint16_t hi = integers ? encode_small_int(type, rng.range(-8, 8)) : random16(type, rng);
      w[r] = uint32_t(lo) | uint32_t(hi) << 16;
    }
    for (int i = 0; i < 4; ++i) {
      const uint32_t r = rng.next();
      const float c = integers ? float((r & 1 ? -1 : 1) * (2048 + int(r >> 1) % 64))
                               : float(int(r >> 8) - (1 << 23)) * 0x1p-22f;
      w[6 + i] = float_bits(c);
    }
  }
  return words;
}

float decode16(Type16 type, uint16_t bits) {
  if (type == Type16::kBf16) return std::bit_cast<float>(uint32_t(bits) << 16);
  const float sign = bits & 0x8000 ? -1.0f : 1.0f;
  const int e = (bits >> 10) & 0x1F, m = bits & 0x3FF;
  if (e == 0x1F) return m ? std::numeric_limits<float>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(float(m), -24);
  return sign * std::ldexp(float(m | 0x400), e - 25);
}

Pos mma_a_pos(int lane, int e) {
  const int g = lane / 4, t = lane % 4;
  return {g + 8 * ((e >> 1) & 1), 2 * t + (e & 1) + 8 * (e >> 2)};
}
Pos mma_b_pos(int lane, int e) {
  const int g = lane / 4, t = lane % 4;
  return {2 * t + (e & 1) + 8 * (e >> 1), g};
}
Pos mma_c_pos(int lane, int e) {
  const int g = lane / 4, t = lane % 4;
  return {g + 8 * (e >> 1), 2 * t + (e & 1)};
}

std::vector<uint32_t> ldmatrix_rows() {
  std::vector<uint32_t> perm(kLdsmRows);
  for (int i = 0; i < kLdsmRows; ++i) perm[i] = uint32_t(i);
  Lcg rng(0x6C64736Dull);
  for (int i = kLdsmRows - 1; i > 0; --i) std::swap(perm[i], perm[rng.next() % uint32_t(i + 1)]);
  std::vector<uint32_t> rows(kLdsmConfigs * kLanes);
  for (int lane = 0; lane < kLanes; ++lane) {
    rows[0 * kLanes + lane] = rows[1 * kLanes + lane] = uint32_t(lane);
    rows[2 * kLanes + lane] = rows[3 * kLanes + lane] = perm[lane];
  }
  return rows;
}

std::vector<uint32_t> cp_async_source() {
  Lcg rng(0x63706173ull);
  std::vector<uint32_t> words(kCpSrcChunks * 4);
  for (uint32_t& w : words) w = rng.next();
  return words;
}

std::vector<float> ex2_inputs() {
  std::vector<float> x;
  for (int i = 0; i < 4096; ++i) x.push_back(float(-130.0 + 260.0 * i / 4095.0));
  const float inf = std::numeric_limits<float>::infinity(), tiny = std::numeric_limits<float>::denorm_min();
  const float fmin = std::numeric_limits<float>::min();
  for (float c : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), tiny, -tiny, 1e-40f, -1e-40f,
                  fmin / 2, -fmin / 2, fmin, -fmin, 1e-30f, -1e-30f, 1.0f, -1.0f, 0.5f, -0.5f, 3.0f, -3.0f,
                  -125.99f, -126.0f, -126.01f, -126.5f, -127.0f, -149.0f, -150.0f, -200.0f, 127.0f, 127.99f,
                  std::nextafter(128.0f, 0.0f), 128.0f, 128.5f, 200.0f})
    x.push_back(c);
  return x;
}

bool ex2_special_input(float x) {
  return std::isnan(x) || std::isinf(x) || x == 0.0f || std::fpclassify(x) == FP_SUBNORMAL;
}

const std::vector<NamedShflCase>& shfl_cases() {
  static const std::vector<NamedShflCase> cases = {
      {"shfl_xor", {kShflXor, 32, ~0u, 1, 0, kI32}},
      {"shfl_xor", {kShflXor, 32, ~0u, 16, 0, kF32}},
      {"shfl_xor", {kShflXor, 32, ~0u, 0, 1, kI32}},  // lane mask = lane: everyone reads lane 0
      {"shfl_xor", {kShflXor, 8, ~0u, 5, 0, kI32}},
      {"shfl_xor", {kShflXor, 8, ~0u, 12, 0, kI32}},  // lands in a later segment (own value) or an earlier one
      {"shfl_xor", {kShflXor, 16, ~0u, 3, 0, kU64}},
      {"shfl_xor", {kShflXor, 16, ~0u, 24, 0, kI32}},
      {"shfl_down", {kShflDown, 32, ~0u, 1, 0, kI32}},
      {"shfl_down", {kShflDown, 32, ~0u, 16, 0, kF32}},
      {"shfl_down", {kShflDown, 8, ~0u, 3, 0, kI32}},
      {"shfl_down", {kShflDown, 8, ~0u, 9, 0, kI32}},  // past the segment: own value
      {"shfl_down", {kShflDown, 16, ~0u, 5, 0, kU64}},
      {"shfl_up", {kShflUp, 32, ~0u, 1, 0, kI32}},
      {"shfl_up", {kShflUp, 32, ~0u, 7, 0, kI32}},
      {"shfl_up", {kShflUp, 8, ~0u, 2, 0, kF32}},
      {"shfl_up", {kShflUp, 8, ~0u, 8, 0, kI32}},
      {"shfl_up", {kShflUp, 16, ~0u, 4, 0, kU64}},
      {"shfl_idx", {kShflIdx, 32, ~0u, 0, 0, kI32}},
      {"shfl_idx", {kShflIdx, 32, ~0u, 31, 0, kF32}},
      {"shfl_idx", {kShflIdx, 32, ~0u, 31, -1, kI32}},  // lane 31 - lane: reversed
      {"shfl_idx", {kShflIdx, 32, ~0u, 3, 5, kI32}},    // 3 + 5 lane, past 31: taken modulo the width
      {"shfl_idx", {kShflIdx, 8, ~0u, 3, 0, kI32}},
      {"shfl_idx", {kShflIdx, 8, ~0u, 11, 0, kI32}},  // past the width
      {"shfl_idx", {kShflIdx, 16, ~0u, 0, 3, kU64}},
      {"shfl_idx", {kShflIdx, 16, ~0u, 5, 0, kF32}},
      {"shfl_partial", {kShflXor, 16, 0x0000FFFFu, 1, 0, kI32}},
      {"shfl_partial", {kShflDown, 16, 0xFFFF0000u, 2, 0, kI32}},
      {"shfl_partial", {kShflXor, 32, 0x55555555u, 2, 0, kI32}},
      {"shfl_partial", {kShflIdx, 8, 0x0F0F0F0Fu, 2, 0, kF32}},
      {"shfl_partial", {kShflUp, 8, 0x0F0F0F0Fu, 1, 0, kI32}},
      {"shfl_partial", {kShflIdx, 32, 0x80000001u, 0, 0, kU64}},
      {"ballot", {kBallot, 32, ~0u, 1, 0, kI32}},
      {"ballot", {kBallot, 32, ~0u, 0, 0, kI32}},   // no predicate true
      {"ballot", {kBallot, 32, ~0u, -1, 0, kI32}},  // every predicate true
      {"ballot", {kBallot, 32, 0x0000FFFFu, 2, 0, kI32}},
      {"ballot", {kBallot, 32, 0xAAAAAAAAu, 4, 0, kI32}},
  };
  return cases;
}

std::vector<uint32_t> shfl_values() {
  Lcg rng(0x73686666ull);
  const auto& cases = shfl_cases();
  std::vector<uint32_t> v(cases.size() * kLanes);
  for (size_t c = 0; c < cases.size(); ++c)
    for (int lane = 0; lane < kLanes; ++lane) {
      uint32_t x = rng.next();
      // A finite float of magnitude [1, 2): no NaN payload question.
      if (cases[c].c.type == kF32) x = (x & 0x807FFFFFu) | 0x3F800000u;
      // Every predicate of the "all true" ballot must be nonzero.
      if (cases[c].c.mode == kBallot && x == 0) x = 1;
      v[c * kLanes + lane] = x;
    }
  return v;
}

std::vector<uint32_t> barrier_inputs() {
  Lcg rng(0x62617272ull);
  std::vector<uint32_t> v(kBarrierThreads);
  for (uint32_t& x : v) x = rng.next();
  return v;
}

}  // namespace ptx_probe
