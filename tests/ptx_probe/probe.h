// The PTX probe's host side, shared by both builds of tests/ptx_probe/ptx_probe.cu
// (nvcc for a real GPU, the host compiler for the emulated device): what each
// probe is called and how it is compared, its deterministic inputs, the
// ISA's answer computed on the host, and the comparison of two outputs.
//
// Everything here is plain C++ so that both builds compile the same code: a
// difference between their outputs is then the device's, never the probe's.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

// The few helpers the kernels share with the host reference.
#ifdef __CUDACC__
#define PROBE_HD __host__ __device__
#else
#define PROBE_HD
#endif

namespace ptx_probe {

// How two outputs of a probe are compared (--expect) and how an output is
// checked against the host reference. The rule belongs to the probe's name,
// never to the file read.
enum class Rule {
  kExact,     // bit for bit
  kMmaTol,    // |x - y| <= kMmaRelTol * (sum_k |a*b| + |c|) of that output element
  kEx2Ulp,    // special inputs bit for bit (NaN: any NaN), others within an ulp bound
};

// Tensor cores may align, truncate and sum the 16 products in another order
// than the emulator (which sums in double and rounds once); for 17 terms that
// is a few 2^-23 of the terms' magnitude. 1e-5 is loose enough for any such
// order and still far below what a wrong fragment position does (O(1)).
inline constexpr double kMmaRelTol = 1e-5;
// ex2.approx.ftz.f32 is within 2 ulp of the correctly rounded result on
// either side, so the two may be 4 apart; the host reference gets 2.
inline constexpr int64_t kEx2UlpBetweenBuilds = 4;
inline constexpr int64_t kEx2UlpVsReference = 2;

struct ProbeInfo {
  const char* name;
  Rule rule;
  const char* what;  // one line: what the probe checks
};
// Every probe, in output order.
const std::vector<ProbeInfo>& probes();
const ProbeInfo* find_probe(const std::string& name);

// A probe's output: index -> 32-bit value; the whole output by probe name.
using Values = std::map<uint32_t, uint32_t>;
using Table = std::map<std::string, Values>;

// ---- inputs (probe_inputs.cpp), identical in both builds --------------------

enum class Type16 { kBf16, kF16 };
// mma: per lane a0..a3, b0, b1 (two 16-bit elements each, low half first) and
// c0..c3 (float bits): kMmaWords words, lane after lane.
inline constexpr int kLanes = 32;
inline constexpr int kMmaWords = 10;
// integers: elements in -8..8 and C of magnitude 2048..2111, so every product
// and partial sum is an integer below 2^24 (exact in fp32, in any order) and
// no sum is zero (no +0/-0 question); else random elements of magnitude
// [2^-6, 2) or zero, C uniform in [-2, 2].
std::vector<uint32_t> mma_inputs(Type16 type, bool integers);
float decode16(Type16 type, uint16_t bits);

// The ISA's fragment tables for m16n8k16 with 16-bit A/B and f32 C/D
// (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"):
// element e of lane `lane` sits at (row, col).
struct Pos {
  int row, col;
};
Pos mma_a_pos(int lane, int e);  // e in 0..7: register e/2, half e%2
Pos mma_b_pos(int lane, int e);  // e in 0..3
Pos mma_c_pos(int lane, int e);  // e in 0..3

// ldmatrix: the 16-byte row (of kLdsmRows in shared memory, element i holding
// the value i) each lane passes; configuration 0/1: rows in order (x4, .trans),
// 2/3: 32 distinct rows scattered over the buffer (x4, .trans).
inline constexpr int kLdsmRows = 128;
inline constexpr int kLdsmConfigs = 4;
std::vector<uint32_t> ldmatrix_rows();  // [config][lane]

// cp.async: 96 source chunks of 16 bytes (random words); the shared buffer's
// chunk k*32 + t is thread t's k-th; words not copied hold kCpPattern | word.
inline constexpr int kCpSrcChunks = 96;
inline constexpr int kCpChunks = 128;
inline constexpr uint32_t kCpPattern = 0xC0DE0000u;
std::vector<uint32_t> cp_async_source();  // kCpSrcChunks * 4 words
// Which chunks thread t copies: group 0 fills chunk 0 (source t, valid) and
// chunk 1 (source 32 + t, zero-fill where t % 3 == 0); group 1 fills chunk 2
// (source 64 + 7t % 32, zero-fill where t % 4 == 1); chunk 3 is never written.
PROBE_HD inline bool cp_chunk1_valid(int t) { return t % 3 != 0; }
PROBE_HD inline bool cp_chunk2_valid(int t) { return t % 4 != 1; }
PROBE_HD inline int cp_chunk2_source(int t) { return 64 + (t * 7) % 32; }

std::vector<float> ex2_inputs();
bool ex2_special_input(float x);  // ±0, ±inf, NaN, subnormal: bit-exact results

// Warp shuffles and ballot: one case per row, each lane's value from
// shfl_values(). b is the lane operand (src_lane, delta or lane mask); the
// lane's own is b + lane * lane_step. For ballot the predicate is v & b.
enum ShflMode : int32_t { kShflXor, kShflDown, kShflUp, kShflIdx, kBallot };
enum ShflType : int32_t { kI32, kF32, kU64 };
struct ShflCase {
  int32_t mode, width;
  uint32_t mask;
  int32_t b, lane_step, type;
};
struct NamedShflCase {
  const char* probe;
  ShflCase c;
};
const std::vector<NamedShflCase>& shfl_cases();
std::vector<uint32_t> shfl_values();  // [case][lane]
// A u64 case shuffles (v << 32) | (v ^ kShflLowMix); out word 0 is its low half.
inline constexpr uint32_t kShflLowMix = 0x5A5A5A5Au;
// Output words [case][lane][2]; lanes outside the mask keep this.
inline constexpr uint32_t kShflUntouched = 0xDEADBEEFu;

inline constexpr int kBarrierThreads = 256;
std::vector<uint32_t> barrier_inputs();
inline constexpr int kAtomicBlocks = 64, kAtomicThreads = 128, kAtomicInts = 8, kAtomicFloats = 4;
// The values thread t of block blk adds (to ints[t % 8] and floats[t % 4]):
// the floats are multiples of 1/8 whose partial sums stay exact in any order.
PROBE_HD inline int atomic_int_term(int blk, int t) {
  return int((unsigned(blk) * 131u + unsigned(t) * 17u) % 1000u) - 300;
}
PROBE_HD inline float atomic_float_term(int blk, int t) { return float(int((blk + t) % 13) - 6) * 0.125f; }

// ---- the output table and the reference (probe_reference.cpp) ----------------

void print_table(const Table& t, const std::string& header);
// sum_k |a*b| + |c| of an mma probe's output element (index lane * 4 + e), the
// scale of kMmaTol; 0 for any other probe or index.
double mma_scale(const std::string& probe, uint32_t index);
// Per probe "reference NAME: ok|WRONG ..." to `out`; false if any is WRONG.
bool check_references(const Table& t, std::string& out);

// ---- comparing with another output (probe_compare.cpp) ------------------------

// Reads an earlier output; false (with a message) on an unreadable file or line.
bool read_table(const std::string& path, Table& t, std::string& error);
struct Verdict {
  size_t values = 0, bad = 0;
  double max_diff = 0;
  std::string unit, rule;
  std::vector<std::string> first_bad;  // a few "index I: ..." lines
};
// Compares `got` with `want` by `info`'s rule; ulp_bound is the ex2 bound.
Verdict compare_probe(const ProbeInfo& info, const Values& got, const Values& want, int64_t ulp_bound);
// The --expect report to `out`; true when every probe of either side agrees.
bool compare_tables(const Table& got, const Table& want, const std::string& want_name, std::string& out);

}  // namespace ptx_probe
