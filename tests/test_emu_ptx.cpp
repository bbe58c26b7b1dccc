// The emulated PTX instructions (emu/) against the PTX ISA's own tables and
// descriptions. The expected values here are written from the ISA text
// (fragment formulas, the ldmatrix thread/row table, the cp.async group
// rules, ex2's corner-case table), independently of emu/'s code and of the
// kernels that use the instructions: a layout slip in emu/ disagrees with
// these tests instead of with nothing.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "emu/bf16_bits.h"
#include "emu/cp_async.h"
#include "emu/ex2.h"
#include "emu/ldmatrix.h"
#include "emu/mma.h"
#include "emu/mma_fragments.h"

using namespace trainer::emu;

namespace {

// ---- The ISA's fragment formulas, restated by register ----------------------
// "Matrix Fragments for mma.m16n8k16 with floating point type": element i of
// a lane lives in register i/2 (even i in the low half). Grouped by register
// r = i/2, A's rows alternate groupID, groupID + 8 and its columns step by 8
// after the first two registers; B's rows step by 8 in its second register.
struct Cell {
  int row, col;
};
Cell isa_a(int lane, int i) {
  const int g = lane / 4, t = lane % 4, r = i / 2;
  return {g + 8 * (r % 2), 2 * t + i % 2 + 8 * (r / 2)};
}
Cell isa_b(int lane, int i) {
  const int g = lane / 4, t = lane % 4, r = i / 2;
  return {2 * t + i % 2 + 8 * r, g};
}
Cell isa_c(int lane, int i) {
  const int g = lane / 4, t = lane % 4;
  return {g + 8 * (i / 2), 2 * t + i % 2};
}

uint32_t pair(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }

struct MmaOperands {
  uint16_t A[16][16] = {};
  uint16_t B[16][8] = {};
  float C[16][8] = {};
};

struct MmaRegisters {
  uint32_t a[32][4];
  uint32_t b[32][2];
  float c[32][4];
};

MmaRegisters isa_registers(const MmaOperands& m) {
  MmaRegisters r;
  for (int lane = 0; lane < 32; ++lane) {
    for (int reg = 0; reg < 4; ++reg) {
      const Cell lo = isa_a(lane, 2 * reg), hi = isa_a(lane, 2 * reg + 1);
      r.a[lane][reg] = pair(m.A[lo.row][lo.col], m.A[hi.row][hi.col]);
    }
    for (int reg = 0; reg < 2; ++reg) {
      const Cell lo = isa_b(lane, 2 * reg), hi = isa_b(lane, 2 * reg + 1);
      r.b[lane][reg] = pair(m.B[lo.row][lo.col], m.B[hi.row][hi.col]);
    }
    for (int i = 0; i < 4; ++i) r.c[lane][i] = m.C[isa_c(lane, i).row][isa_c(lane, i).col];
  }
  return r;
}

struct Result {
  float D[16][8];
};

Result isa_read_d(const float d[32][4]) {
  Result out;
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) out.D[isa_c(lane, i).row][isa_c(lane, i).col] = d[lane][i];
  return out;
}

Result run_mma(Type16 type, const MmaRegisters& r) {
  float d[32][4];
  mma_m16n8k16(type, r.a, r.b, r.c, d);
  return isa_read_d(d);
}

// D = A*B + C element by element, in long double.
long double reference_d(Type16 type, const MmaOperands& m, int i, int j) {
  long double sum = m.C[i][j];
  for (int k = 0; k < 16; ++k) sum += (long double)to_float(type, m.A[i][k]) * to_float(type, m.B[k][j]);
  return sum;
}

// Values k/64, |k| <= 128: exact in both formats, and every sum of products
// below is exact in float, so the emulator must match bit for bit.
MmaOperands dyadic_operands(Type16 type, std::mt19937& rng) {
  std::uniform_int_distribution<int> k(-128, 128);
  MmaOperands m;
  for (auto& row : m.A)
    for (auto& x : row) x = from_float_rn(type, float(k(rng)) / 64.0f);
  for (auto& row : m.B)
    for (auto& x : row) x = from_float_rn(type, float(k(rng)) / 64.0f);
  for (auto& row : m.C)
    for (auto& x : row) x = float(k(rng)) / 8.0f;
  return m;
}

// Values spread over many binades (rounded to the type), for the 1-ulp check.
MmaOperands wide_operands(Type16 type, std::mt19937& rng) {
  std::normal_distribution<float> mantissa(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-6, 6);
  auto draw = [&] { return std::ldexp(mantissa(rng), exponent(rng)); };
  MmaOperands m;
  for (auto& row : m.A)
    for (auto& x : row) x = from_float_rn(type, draw());
  for (auto& row : m.B)
    for (auto& x : row) x = from_float_rn(type, draw());
  for (auto& row : m.C)
    for (auto& x : row) x = draw();
  return m;
}

float ulp_of(float x) {
  const float a = std::fabs(x);
  return std::nextafter(a, std::numeric_limits<float>::infinity()) - a;
}

Type16 type_named(const char* name) { return std::string(name) == "bf16" ? Type16::bf16 : Type16::f16; }

}  // namespace

// ---- mma.m16n8k16 ---------------------------------------------------------

TEST_CASE("emu mma fragment positions match the ISA figures' cells", "[emu][ptx]") {
  // Spot cells read off the ISA's figures for A (T0, T5, T31), B and C/D.
  CHECK(mma_a_position(0, 0).row == 0);
  CHECK(mma_a_position(0, 1).col == 1);
  CHECK((mma_a_position(0, 2).row == 8 && mma_a_position(0, 2).col == 0));
  CHECK((mma_a_position(0, 4).row == 0 && mma_a_position(0, 4).col == 8));
  CHECK((mma_a_position(0, 7).row == 8 && mma_a_position(0, 7).col == 9));
  CHECK((mma_a_position(5, 0).row == 1 && mma_a_position(5, 0).col == 2));
  CHECK((mma_a_position(31, 7).row == 15 && mma_a_position(31, 7).col == 15));
  CHECK((mma_b_position(0, 1).row == 1 && mma_b_position(0, 1).col == 0));
  CHECK((mma_b_position(0, 2).row == 8 && mma_b_position(0, 2).col == 0));
  CHECK((mma_b_position(31, 3).row == 15 && mma_b_position(31, 3).col == 7));
  CHECK((mma_c_position(0, 2).row == 8 && mma_c_position(0, 2).col == 0));
  CHECK((mma_c_position(31, 3).row == 15 && mma_c_position(31, 3).col == 7));
  // Every formula agrees with the register-wise restatement above, and each
  // covers its matrix exactly once (a bijection lanes x elements -> cells).
  int seen_a[16][16] = {}, seen_b[16][8] = {}, seen_c[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) {
      const MatrixPosition p = mma_a_position(lane, i);
      CHECK((p.row == isa_a(lane, i).row && p.col == isa_a(lane, i).col));
      ++seen_a[p.row][p.col];
    }
    for (int i = 0; i < 4; ++i) {
      const MatrixPosition pb = mma_b_position(lane, i), pc = mma_c_position(lane, i);
      CHECK((pb.row == isa_b(lane, i).row && pb.col == isa_b(lane, i).col));
      CHECK((pc.row == isa_c(lane, i).row && pc.col == isa_c(lane, i).col));
      ++seen_b[pb.row][pb.col];
      ++seen_c[pc.row][pc.col];
    }
  }
  for (auto& row : seen_a)
    for (int n : row) CHECK(n == 1);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 8; ++c) CHECK((seen_b[r][c] == 1 && seen_c[r][c] == 1));
  CHECK_THROWS_WITH(mma_a_position(32, 0), Catch::Contains("lane 32"));
  CHECK_THROWS_WITH(mma_b_position(0, 4), Catch::Contains("element 4"));
}

TEST_CASE("emu mma pack helpers build the ISA's registers and round-trip", "[emu][ptx]") {
  std::mt19937 rng(7);
  const MmaOperands m = dyadic_operands(Type16::bf16, rng);
  const MmaRegisters isa = isa_registers(m);
  uint32_t a[32][4], b[32][2];
  float c[32][4];
  pack_mma_a(m.A, a);
  pack_mma_b(m.B, b);
  pack_mma_c(m.C, c);
  CHECK(std::memcmp(a, isa.a, sizeof(a)) == 0);
  CHECK(std::memcmp(b, isa.b, sizeof(b)) == 0);
  CHECK(std::memcmp(c, isa.c, sizeof(c)) == 0);
  MmaOperands back;
  unpack_mma_a(a, back.A);
  unpack_mma_b(b, back.B);
  unpack_mma_c(c, back.C);
  CHECK(std::memcmp(&back, &m, sizeof(m)) == 0);
}

TEST_CASE("emu mma accumulator fragments of two n-tiles form the A fragment", "[emu][ptx]") {
  // An ISA property the kernels lean on: lane l's c0,c1 (c2,c3) sit where its
  // a0,a1 (a2,a3) do, and a4..a7 repeat that 8 columns to the right.
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const MatrixPosition c = mma_c_position(lane, i), lo = mma_a_position(lane, i), hi = mma_a_position(lane, i + 4);
      CHECK((lo.row == c.row && lo.col == c.col));
      CHECK((hi.row == c.row && hi.col == c.col + 8));
    }
}

TEST_CASE("emu mma matches a plain loop on random matrices", "[emu][ptx]") {
  const Type16 type = type_named(GENERATE("bf16", "f16"));
  std::mt19937 rng(type == Type16::bf16 ? 11 : 12);
  for (int trial = 0; trial < 20; ++trial) {
    const MmaOperands exact = dyadic_operands(type, rng);
    const Result d = run_mma(type, isa_registers(exact));
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) REQUIRE(d.D[i][j] == float(reference_d(type, exact, i, j)));

    const MmaOperands wide = wide_operands(type, rng);
    const Result w = run_mma(type, isa_registers(wide));
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) {
        const float ref = float(reference_d(type, wide, i, j));
        INFO("D(" << i << "," << j << ") = " << w.D[i][j] << ", reference " << ref);
        REQUIRE(std::fabs(w.D[i][j] - ref) <= ulp_of(ref));
      }
  }
}

TEST_CASE("emu mma puts A(i,k)*B(k,j) at D(i,j) and nowhere else", "[emu][ptx]") {
  // One nonzero in A and one in B: the product must land at exactly (i, j),
  // which pins every lane/element of the three layouts at once.
  const Type16 type = type_named(GENERATE("bf16", "f16"));
  const uint16_t three = from_float_rn(type, 3.0f), five = from_float_rn(type, -5.0f);
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k)
      for (int j = 0; j < 8; ++j) {
        MmaOperands m;
        m.A[i][k] = three;
        m.B[k][j] = five;
        const Result d = run_mma(type, isa_registers(m));
        for (int r = 0; r < 16; ++r)
          for (int c = 0; c < 8; ++c) {
            INFO("A(" << i << "," << k << ") B(" << k << "," << j << ") -> D(" << r << "," << c << ")");
            REQUIRE(d.D[r][c] == (r == i && c == j ? -15.0f : 0.0f));
          }
      }
}

TEST_CASE("emu mma adds C and may write D over C", "[emu][ptx]") {
  const Type16 type = type_named(GENERATE("bf16", "f16"));
  std::mt19937 rng(5);
  MmaOperands m = dyadic_operands(type, rng);
  MmaOperands zero_c = m;
  for (auto& row : zero_c.C)
    for (auto& x : row) x = 0.0f;
  MmaRegisters r = isa_registers(m);
  const Result without_c = run_mma(type, isa_registers(zero_c));
  mma_m16n8k16(type, r.a, r.b, r.c, r.c);  // in place, as the kernels call it
  const Result with_c = isa_read_d(r.c);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) REQUIRE(with_c.D[i][j] == without_c.D[i][j] + m.C[i][j]);
}

TEST_CASE("emu mma gives a wrong result for a misplaced fragment", "[emu][ptx]") {
  // Shows the comparisons above can fail: swapping registers a0a1 and a2a3
  // (rows g and g+8), or the two halves of each register, changes D.
  std::mt19937 rng(3);
  const MmaOperands m = dyadic_operands(Type16::bf16, rng);
  const MmaRegisters good = isa_registers(m);
  MmaRegisters swapped_regs = good, swapped_halves = good;
  for (int lane = 0; lane < 32; ++lane) {
    std::swap(swapped_regs.a[lane][0], swapped_regs.a[lane][1]);
    for (uint32_t& reg : swapped_halves.a[lane]) reg = (reg >> 16) | (reg << 16);
  }
  const Result right = run_mma(Type16::bf16, good);
  for (const MmaRegisters* bad : {&swapped_regs, &swapped_halves}) {
    const Result wrong = run_mma(Type16::bf16, *bad);
    int differing = 0;
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) differing += wrong.D[i][j] != right.D[i][j];
    CHECK(differing > 0);
  }
}

TEST_CASE("emu mma propagates NaN and Inf", "[emu][ptx]") {
  const Type16 type = type_named(GENERATE("bf16", "f16"));
  MmaOperands m;
  m.A[2][5] = from_float_rn(type, std::numeric_limits<float>::infinity());
  m.B[5][1] = from_float_rn(type, 2.0f);  // B(5,0) stays 0: Inf * 0
  m.C[7][3] = std::numeric_limits<float>::quiet_NaN();
  m.A[9][0] = from_float_rn(type, std::numeric_limits<float>::quiet_NaN());
  const Result d = run_mma(type, isa_registers(m));
  CHECK(std::isinf(d.D[2][1]));
  CHECK(d.D[2][1] > 0);
  CHECK(std::isnan(d.D[2][0]));
  CHECK(std::isnan(d.D[7][3]));
  for (int j = 0; j < 8; ++j) CHECK(std::isnan(d.D[9][j]));  // NaN * 0 is NaN
  CHECK(d.D[3][3] == 0.0f);
}

// ---- ldmatrix ---------------------------------------------------------------

namespace {

// Four 8x8 matrices of distinct b16 values, their 32 rows scattered over a
// larger buffer (row stride 48 bytes, rows out of order, some starting 16 or
// 32 bytes into a buffer row): consecutive rows are not contiguous.
struct LdmatrixMemory {
  alignas(16) uint16_t buffer[40][24];
  const void* row_addr[32];

  static uint16_t value(int m, int row, int col) { return uint16_t(0x1000 * (m + 1) + 16 * row + col); }

  explicit LdmatrixMemory(bool transposed_copy = false) {
    for (auto& row : buffer)
      for (auto& x : row) x = 0xdead;
    for (int idx = 0; idx < 32; ++idx) {
      const int m = idx / 8, r = idx % 8;
      uint16_t* row = &buffer[(idx * 13 + 5) % 37][8 * (idx % 3)];
      for (int c = 0; c < 8; ++c) row[c] = transposed_copy ? value(m, c, r) : value(m, r, c);
      row_addr[idx] = row;
    }
  }
};

}  // namespace

TEST_CASE("emu ldmatrix gives every lane its ISA fragment, all six forms", "[emu][ptx]") {
  const int count = GENERATE(1, 2, 4);
  const bool trans = GENERATE(false, true);
  LdmatrixMemory mem;
  const void* addr[32];
  for (int lane = 0; lane < 32; ++lane)  // lanes the form does not read get garbage
    addr[lane] = lane < 8 * count ? mem.row_addr[lane] : reinterpret_cast<const void*>(uintptr_t(0x3 + lane));
  uint32_t out[32][4];
  for (auto& lane : out)
    for (auto& reg : lane) reg = 0xcafef00du;
  ldmatrix(count, trans, addr, out);
  for (int lane = 0; lane < 32; ++lane)
    for (int m = 0; m < 4; ++m) {
      INFO("x" << count << (trans ? ".trans" : "") << " lane " << lane << " register " << m);
      if (m >= count) {
        CHECK(out[lane][m] == 0xcafef00du);  // not a destination of this form
        continue;
      }
      // Row lane/4, columns 2*(lane%4) and +1 (low half first); .trans: of the transpose.
      const int r = lane / 4, c0 = 2 * (lane % 4);
      const uint16_t lo = trans ? LdmatrixMemory::value(m, c0, r) : LdmatrixMemory::value(m, r, c0);
      const uint16_t hi = trans ? LdmatrixMemory::value(m, c0 + 1, r) : LdmatrixMemory::value(m, r, c0 + 1);
      CHECK(out[lane][m] == pair(lo, hi));
    }
}

TEST_CASE("emu ldmatrix .trans loads what a plain load of the transpose does", "[emu][ptx]") {
  LdmatrixMemory mem, transposed(true);
  uint32_t with_trans[32][4], of_transpose[32][4];
  ldmatrix(4, true, mem.row_addr, with_trans);
  ldmatrix(4, false, transposed.row_addr, of_transpose);
  CHECK(std::memcmp(with_trans, of_transpose, sizeof(with_trans)) == 0);
  uint32_t plain[32][4];
  ldmatrix(4, false, mem.row_addr, plain);
  CHECK(std::memcmp(with_trans, plain, sizeof(plain)) != 0);
}

TEST_CASE("emu ldmatrix rejects misaligned and null row addresses and bad counts", "[emu][ptx]") {
  LdmatrixMemory mem;
  const void* addr[32];
  std::memcpy(addr, mem.row_addr, sizeof(addr));
  uint32_t out[32][4];
  addr[11] = static_cast<const unsigned char*>(mem.row_addr[11]) + 2;
  CHECK_THROWS_WITH(ldmatrix(4, false, addr, out), Catch::Contains("lane 11") && Catch::Contains("16-byte aligned") &&
                                                       Catch::Contains("2 bytes past"));
  CHECK_NOTHROW(ldmatrix(1, false, addr, out));  // .x1 reads lanes 0-7 only
  CHECK_THROWS_WITH(ldmatrix(2, true, addr, out), Catch::Contains("x2.trans") && Catch::Contains("lane 11"));
  addr[11] = mem.row_addr[11];
  addr[0] = nullptr;
  CHECK_THROWS_WITH(ldmatrix(1, false, addr, out), Catch::Contains("lane 0") && Catch::Contains("null"));
  CHECK_THROWS_WITH(ldmatrix(3, false, mem.row_addr, out), Catch::Contains(".x1, .x2 or .x4"));
}

// ---- cp.async ---------------------------------------------------------------

namespace {

struct CopyBuffers {
  alignas(16) unsigned char src[64];
  alignas(16) unsigned char dst[64];
  CopyBuffers() {
    for (int i = 0; i < 64; ++i) src[i] = uint8_t(i + 1);
    std::memset(dst, 0, sizeof(dst));
  }
  bool landed(int offset, int bytes) const { return std::memcmp(dst + offset, src + offset, size_t(bytes)) == 0; }
  bool untouched(int offset, int bytes) const {
    for (int i = 0; i < bytes; ++i)
      if (dst[offset + i] != 0) return false;
    return true;
  }
};

}  // namespace

TEST_CASE("emu cp.async writes nothing until a wait completes its group", "[emu][ptx]") {
  CopyBuffers buf;
  CpAsyncQueue q;
  q.copy(CpAsyncCache::cg, buf.dst, buf.src, 16);
  CHECK(buf.untouched(0, 16));
  CHECK(q.has_pending_write(buf.dst + 8, 1));
  q.commit();
  CHECK(buf.untouched(0, 16));
  CHECK(q.committed_groups() == 1);
  q.wait_group(0);
  CHECK(buf.landed(0, 16));
  CHECK_FALSE(q.has_pending_write(buf.dst, 64));
  CHECK(q.committed_groups() == 0);
}

TEST_CASE("emu cp.async.wait_group N leaves the newest N groups pending", "[emu][ptx]") {
  CopyBuffers buf;
  CpAsyncQueue q;
  q.copy(CpAsyncCache::ca, buf.dst, buf.src, 8);  // group 1
  q.copy(CpAsyncCache::ca, buf.dst + 8, buf.src + 8, 8);
  q.commit();
  q.copy(CpAsyncCache::cg, buf.dst + 16, buf.src + 16, 16);  // group 2
  q.commit();
  q.copy(CpAsyncCache::ca, buf.dst + 32, buf.src + 32, 4);  // group 3
  q.commit();
  q.wait_group(2);
  CHECK(buf.landed(0, 16));
  CHECK(buf.untouched(16, 20));
  q.wait_group(2);  // nothing more to do
  CHECK(buf.untouched(16, 20));
  q.wait_group(1);
  CHECK(buf.landed(16, 16));
  CHECK(buf.untouched(32, 4));
  q.wait_group(0);
  CHECK(buf.landed(32, 4));
}

TEST_CASE("emu cp.async counts an empty group as the most recent one", "[emu][ptx]") {
  // commit_group with nothing issued makes an empty group; wait_group 1 then
  // leaves only that one pending, so the real group before it completes.
  CopyBuffers buf;
  CpAsyncQueue q;
  q.copy(CpAsyncCache::cg, buf.dst, buf.src, 16);
  q.commit();
  q.commit();
  q.wait_group(1);
  CHECK(buf.landed(0, 16));
}

TEST_CASE("emu cp.async.wait_group does not complete uncommitted copies", "[emu][ptx]") {
  CopyBuffers buf;
  CpAsyncQueue q;
  q.copy(CpAsyncCache::cg, buf.dst, buf.src, 16);
  q.commit();
  q.copy(CpAsyncCache::cg, buf.dst + 16, buf.src + 16, 16);  // issued, never committed
  q.wait_group(0);
  CHECK(buf.landed(0, 16));
  CHECK(buf.untouched(16, 16));
  CHECK(q.uncommitted_copies() == 1);
  q.wait_all();  // commits it, then waits for everything
  CHECK(buf.landed(16, 16));
  CHECK(q.uncommitted_copies() == 0);
}

TEST_CASE("emu cp.async src-size below cp-size fills the rest with zeros", "[emu][ptx]") {
  CopyBuffers buf;
  std::memset(buf.dst, 0xff, sizeof(buf.dst));
  CpAsyncQueue q;
  q.copy(CpAsyncCache::ca, buf.dst, buf.src, 8, 5);
  q.copy(CpAsyncCache::cg, buf.dst + 16, nullptr, 16, 0);  // src-size 0 reads nothing
  q.wait_all();
  CHECK(std::memcmp(buf.dst, buf.src, 5) == 0);
  for (int i = 5; i < 8; ++i) CHECK(buf.dst[i] == 0);
  CHECK(buf.dst[8] == 0xff);  // beyond cp-size: not written
  for (int i = 16; i < 32; ++i) CHECK(buf.dst[i] == 0);
}

TEST_CASE("emu cp.async reads its source when it lands", "[emu][ptx]") {
  CopyBuffers buf;
  CpAsyncQueue q;
  q.copy(CpAsyncCache::cg, buf.dst, buf.src, 16);
  q.commit();
  buf.src[3] = 0x77;  // a kernel overwriting the source before its wait
  q.wait_group(0);
  CHECK(buf.dst[3] == 0x77);
}

TEST_CASE("emu cp.async rejects bad sizes and misaligned addresses", "[emu][ptx]") {
  CopyBuffers buf;
  CpAsyncQueue q;
  CHECK_THROWS_WITH(q.copy(CpAsyncCache::ca, buf.dst, buf.src, 2), Catch::Contains("cp-size must be 4, 8 or 16"));
  CHECK_THROWS_WITH(q.copy(CpAsyncCache::ca, buf.dst, buf.src, 32), Catch::Contains("cp-size must be 4, 8 or 16"));
  CHECK_THROWS_WITH(q.copy(CpAsyncCache::cg, buf.dst, buf.src, 8), Catch::Contains("cg allows only cp-size 16"));
  CHECK_THROWS_WITH(q.copy(CpAsyncCache::cg, buf.dst, buf.src, 16, 17), Catch::Contains("src-size must be between"));
  CHECK_THROWS_WITH(q.copy(CpAsyncCache::ca, buf.dst, buf.src, 4, -1), Catch::Contains("src-size must be between"));
  CHECK_THROWS_WITH(q.copy(CpAsyncCache::cg, buf.dst + 4, buf.src, 16),
                    Catch::Contains("destination address") && Catch::Contains("not aligned to cp-size 16"));
  CHECK_THROWS_WITH(q.copy(CpAsyncCache::ca, buf.dst, buf.src + 4, 8),
                    Catch::Contains("source address") && Catch::Contains("4 bytes past"));
  CHECK_THROWS_WITH(q.copy(CpAsyncCache::ca, nullptr, buf.src, 4), Catch::Contains("destination address is null"));
  CHECK_THROWS_WITH(q.copy(CpAsyncCache::ca, buf.dst, nullptr, 4), Catch::Contains("source address is null"));
  CHECK_THROWS_WITH(q.wait_group(-1), Catch::Contains("must not be negative"));
  CHECK(q.uncommitted_copies() == 0);  // nothing rejected was queued
  CHECK_NOTHROW(q.copy(CpAsyncCache::ca, buf.dst + 4, buf.src + 4, 4));
  CHECK_NOTHROW(q.copy(CpAsyncCache::ca, buf.dst + 8, buf.src + 8, 8));
}

TEST_CASE("emu cp.async drain lands every outstanding copy and counts them", "[emu][ptx]") {
  CopyBuffers buf;
  CpAsyncQueue q;
  q.copy(CpAsyncCache::cg, buf.dst, buf.src, 16);
  q.commit();
  q.copy(CpAsyncCache::cg, buf.dst + 16, buf.src + 16, 16);
  CHECK(q.drain() == 2);
  CHECK(buf.landed(0, 32));
  CHECK(q.drain() == 0);
}

// ---- ex2.approx.ftz.f32 -------------------------------------------------------

TEST_CASE("emu ex2.approx.ftz.f32 follows the ISA's corner-case table", "[emu][ptx]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float zero_of_neg_inf = ex2_approx_ftz_f32(-inf);
  CHECK(zero_of_neg_inf == 0.0f);
  CHECK_FALSE(std::signbit(zero_of_neg_inf));
  CHECK(ex2_approx_ftz_f32(-0.0f) == 1.0f);
  CHECK(ex2_approx_ftz_f32(0.0f) == 1.0f);
  CHECK(ex2_approx_ftz_f32(inf) == inf);
  CHECK(std::isnan(ex2_approx_ftz_f32(std::numeric_limits<float>::quiet_NaN())));
  // .ftz: subnormal inputs are zeros (2^0 = 1 exactly), subnormal results +0.
  CHECK(ex2_approx_ftz_f32(std::numeric_limits<float>::denorm_min()) == 1.0f);
  CHECK(ex2_approx_ftz_f32(-1e-40f) == 1.0f);
  const float flushed = ex2_approx_ftz_f32(-130.0f);  // 2^-130 is subnormal in float
  CHECK(flushed == 0.0f);
  CHECK_FALSE(std::signbit(flushed));
  CHECK(ex2_approx_ftz_f32(-126.0f) == std::numeric_limits<float>::min());
  CHECK(ex2_approx_ftz_f32(128.0f) == inf);
  CHECK(ex2_approx_ftz_f32(3.0f) == 8.0f);
  CHECK(ex2_approx_ftz_f32(-1.0f) == 0.5f);
}

TEST_CASE("emu ex2.approx.ftz.f32 is within the ISA's 2 ulp over its range", "[emu][ptx]") {
  double max_rel = 0, max_ulps = 0;
  float worst = 0;
  const int samples = 1 << 20;
  for (int s = 0; s <= samples; ++s) {
    // -125.9 .. 127.9: every result is a normal float.
    const float x = -125.9f + 253.8f * float(s) / float(samples);
    const long double exact = std::exp2((long double)x);
    const float d = ex2_approx_ftz_f32(x);
    const double rel = double(std::fabs((d - exact) / exact));
    const double ulps = double(std::fabs(d - exact) / ulp_of(float(exact)));
    if (ulps > max_ulps) worst = x;
    max_rel = std::max(max_rel, rel);
    max_ulps = std::max(max_ulps, ulps);
  }
  std::printf("ex2.approx.ftz.f32 emulation: max relative error %.3g, max %.3f ulp (at x = %.9g), ISA bound 2 ulp\n",
              max_rel, max_ulps, double(worst));
  CHECK(max_ulps <= 2.0);
  CHECK(max_rel < 0x1p-22);
}

// ---- 16-bit float conversions ---------------------------------------------------

TEST_CASE("emu bf16 conversions round to nearest even and keep NaN and Inf", "[emu][ptx]") {
  auto from_bits = [](uint32_t u) { return std::bit_cast<float>(u); };
  CHECK(float_to_bf16_rn(1.0f) == 0x3f80);
  CHECK(float_to_bf16_rn(from_bits(0x3f808000u)) == 0x3f80);  // tie, even below
  CHECK(float_to_bf16_rn(from_bits(0x3f818000u)) == 0x3f82);  // tie, even above
  CHECK(float_to_bf16_rn(from_bits(0x3f808001u)) == 0x3f81);  // just past the tie
  CHECK(float_to_bf16_rn(from_bits(0x3f807fffu)) == 0x3f80);
  CHECK(float_to_bf16_rn(-2.0f) == 0xc000);
  CHECK(float_to_bf16_rn(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(float_to_bf16_rn(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(float_to_bf16_rn(std::numeric_limits<float>::max()) == 0x7f80);        // rounds past the largest bf16
  CHECK(std::isnan(bf16_to_float(float_to_bf16_rn(from_bits(0x7f800001u)))));  // payload only in the low half
  CHECK(std::isnan(bf16_to_float(float_to_bf16_rn(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(float_to_bf16_rn(from_bits(0x00010000u)) == 0x0001);  // subnormals are kept
  CHECK(bf16_to_float(0x3f80) == 1.0f);
  CHECK(bf16_to_float(0x0001) == from_bits(0x00010000u));
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float f = bf16_to_float(uint16_t(bits));
    if (std::isnan(f))
      REQUIRE(std::isnan(bf16_to_float(float_to_bf16_rn(f))));
    else
      REQUIRE(float_to_bf16_rn(f) == bits);
  }
}

TEST_CASE("emu f16 conversions round to nearest even with subnormals, NaN and Inf", "[emu][ptx]") {
  CHECK(float_to_f16_rn(1.0f) == 0x3c00);
  CHECK(float_to_f16_rn(1.0f + 0x1p-11f) == 0x3c00);      // tie, even below
  CHECK(float_to_f16_rn(1.0f + 3 * 0x1p-11f) == 0x3c02);  // tie, even above
  CHECK(float_to_f16_rn(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);
  CHECK(float_to_f16_rn(65504.0f) == 0x7bff);
  CHECK(float_to_f16_rn(65519.0f) == 0x7bff);
  CHECK(float_to_f16_rn(65520.0f) == 0x7c00);  // the tie above the largest half rounds to Inf
  CHECK(float_to_f16_rn(98304.0f) == 0x7c00);  // 1.5 * 2^16: Inf, not a NaN pattern
  CHECK(float_to_f16_rn(1e9f) == 0x7c00);
  CHECK(float_to_f16_rn(-std::numeric_limits<float>::infinity()) == 0xfc00);
  CHECK(float_to_f16_rn(-0.0f) == 0x8000);
  CHECK(float_to_f16_rn(0x1p-24f) == 0x0001);  // smallest subnormal
  CHECK(float_to_f16_rn(0x1p-25f) == 0x0000);  // tie with zero: even
  CHECK(float_to_f16_rn(0x1p-25f * 1.0001f) == 0x0001);
  CHECK(float_to_f16_rn(3 * 0x1p-25f) == 0x0002);        // tie 1.5 units: even
  CHECK(float_to_f16_rn(1023 * 0x1p-24f) == 0x03ff);     // largest subnormal
  CHECK(float_to_f16_rn(1023.5f * 0x1p-24f) == 0x0400);  // tie rounds up to the smallest normal
  CHECK(float_to_f16_rn(-0x1p-14f) == 0x8400);
  CHECK(float_to_f16_rn(1e-30f) == 0x0000);
  CHECK(float_to_f16_rn(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(std::isnan(f16_to_float(float_to_f16_rn(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(f16_to_float(float_to_f16_rn(std::bit_cast<float>(0x7f800001u)))));
  CHECK(f16_to_float(0x0001) == 0x1p-24f);
  CHECK(f16_to_float(0x03ff) == 1023 * 0x1p-24f);
  CHECK(f16_to_float(0x8001) == -0x1p-24f);
  CHECK(f16_to_float(0x7c00) == std::numeric_limits<float>::infinity());
  CHECK(std::isnan(f16_to_float(0x7e00)));
  CHECK(std::isnan(f16_to_float(0x7c01)));
  CHECK(f16_to_float(0x7bff) == 65504.0f);
  CHECK(f16_to_float(0xc000) == -2.0f);
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float f = f16_to_float(uint16_t(bits));
    if (std::isnan(f))
      REQUIRE(std::isnan(f16_to_float(float_to_f16_rn(f))));
    else
      REQUIRE(float_to_f16_rn(f) == bits);
  }
}
