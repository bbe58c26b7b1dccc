// Every op of the CUDA backend (kernels/cuda/cuda_ops.h) against its CPU twin
// (kernels/cpu) on random inputs, in F32 and BF16 and, for most ops, F16.
// The method (rounded shared inputs, NaN poisoning, relative-norm tolerance
// per dtype) is described in gpu_test_util.h.
//
// Dtypes follow cuda_ops.h and model/activations.cpp: activations, weights and
// their gradients use the test dtype; rstd, mean, lse, losses, probs, topk_w,
// dtopk_w, aux, AdamW master weights and moments are F32; indices are I32.
//
// Each configuration runs inside run_case(), so an op that throws (say, a
// dtype it does not support) fails that configuration with its message and
// the others still run. Every line of output names the dtype, op, shape and
// the error against its tolerance; grep FAIL for the failures.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/gpu/gpu_test_util.h"

using namespace trainer;
using namespace trainer::gputest;

namespace {

constexpr DType F32 = DType::F32, BF16 = DType::BF16, F16 = DType::F16, I32 = DType::I32;
const std::vector<DType> kAll = {F32, BF16, F16};
const std::vector<DType> kF32BF16 = {F32, BF16};

using Shape = std::vector<int64_t>;

std::vector<float> zeros(size_t n) { return std::vector<float>(n, 0.f); }

}  // namespace

// ---- convert --------------------------------------------------------------------

namespace {

// Values that exercise every rounding rule: magnitudes from 1e-6 (F16
// subnormals) to 1e5 (F16 overflow), exact ties for BF16 and for F16 with
// both parities of the kept bit, and the special values.
std::vector<float> conversion_values() {
  std::mt19937_64 g(seed(1));
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ue(-6.f, 5.f), ue16(-4.f, 4.f);
  std::vector<float> v;
  for (int i = 0; i < 20000; ++i) v.push_back(nd(g) * std::pow(10.f, ue(g)));
  for (int i = 0; i < 1000; ++i) {  // BF16 ties: low 16 bits exactly 0x8000
    float f = nd(g) * std::pow(10.f, ue16(g));
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u = (u & 0xffff0000u) | 0x8000u;
    std::memcpy(&f, &u, 4);
    v.push_back(f);
  }
  for (int i = 0; i < 1000; ++i) {  // F16 ties (normal F16 range): low 13 bits exactly 0x1000
    float f = nd(g) * std::pow(10.f, ue16(g));
    if (std::fabs(f) < 1e-4f || std::fabs(f) > 6e4f) f = 1.5f;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u = (u & 0xffffe000u) | 0x1000u;
    std::memcpy(&f, &u, 4);
    v.push_back(f);
  }
  const float specials[] = {0.f,
                            -0.f,
                            kInf,
                            -kInf,
                            kNaN,
                            65504.f,
                            65519.f,
                            65520.f,
                            -65520.f,
                            3e38f,
                            -3e38f,
                            1.17549435e-38f,
                            1e-8f,
                            -1e-8f,
                            1.f + 1.f / 256,
                            1.f + 3.f / 256,
                            1.f + 1.f / 2048,
                            1.f + 3.f / 2048,
                            2.5f};
  v.insert(v.end(), std::begin(specials), std::end(specials));
  return v;
}

}  // namespace

TEST_CASE("gpu convert: F32/BF16/F16 in every direction, bit for bit against the host encoder",
          "[gpu][elementwise][convert]") {
  const std::vector<float> v = conversion_values();
  const int64_t n = int64_t(v.size());
  for (DType src : kAll)
    for (DType dst : kAll) {
      const std::string label = fmt("convert %s -> %s n=%lld", dn(src), dn(dst), (long long)n);
      run_case(label, [&] {
        const std::vector<float> in = rounded(src, v);
        DeviceTensor s = upload(in, {n}, src), d({n}, dst);
        poison(d);
        ops::convert(d, s);
        sync(label);
        same_values(label, download(d), rounded(dst, in));
      });
    }

  // Host <-> device through ops::convert (same dtype: a transfer, no rounding).
  const std::string label = "convert BF16 host <-> device";
  run_case(label, [&] {
    const std::vector<float> in = rounded(BF16, v);
    std::vector<uint8_t> bytes = encode(in, BF16), back(bytes.size());
    DeviceTensor d({n}, BF16);
    poison(d);
    ops::convert(d, make_tensor(bytes.data(), BF16, {n}, Device::CPU));
    sync(label);
    ops::convert(make_tensor(back.data(), BF16, {n}, Device::CPU), d);
    same_bits(label, back, bytes, 2);
  });
}

// ---- fill, copy, add, add_inplace, scale_inplace -----------------------------------

TEST_CASE("gpu router: one device per call, checked before any kernel, host<->device copies",
          "[gpu][elementwise]") {
  run_case("router", [&] {
    const int64_t n = 1000;
    const std::vector<float> a = randn(size_t(n), seed(12));
    DeviceTensor da = upload(a, {n}, F32), out({n}, F32);
    std::vector<float> host_b = randn(size_t(n), seed(13));
    const Tensor hb = host(host_b, {n});
    poison(out);
    // A host tensor among device tensors: refused by the router, naming both.
    std::string msg = "(no exception)";
    try {
      ops::add(out, da, hb);
    } catch (const std::invalid_argument& e) {
      msg = e.what();
    }
    sync("add (refused)");
    std::printf("[gpu] router message: %s\n", msg.c_str());
    CHECK(msg == "add: b [1000] is on the cpu, but out [1000] is on the cuda: one device per call");
    // Nothing ran: out still holds its poison.
    const std::vector<float> after = download(out);
    CHECK(std::all_of(after.begin(), after.end(), [](float x) { return std::isnan(x); }));
    // copy between devices moves bytes (route "transfer"), both directions.
    ops::copy(out, hb);
    sync("copy host -> device");
    same_values("router copy host -> device", download(out), host_b);
    std::vector<float> back(size_t(n), 0.f);
    ops::copy(host(back, {n}), da);
    sync("copy device -> host");
    same_values("router copy device -> host", back, a);
  });
}

TEST_CASE("gpu fill, copy, add (aliased too), add_inplace, scale_inplace: fp32 math, one rounding",
          "[gpu][elementwise]") {
  // Expected values follow the spec to the letter (fp32 arithmetic, one
  // rounding to the storage type), so a kernel that does the same matches
  // bit for bit. For add this is also the correctly rounded sum (fp32's 24
  // bits are at least 2p+2 for BF16 and F16), so a native BF16/F16 add agrees.
  const int64_t n = 100005;  // odd: vector loads need a scalar tail
  for (DType dt : kAll) {
    const std::string tag = fmt("%s n=%lld", dn(dt), (long long)n);
    run_case(tag, [&] {
      const std::vector<float> a = randn(static_cast<size_t>(n), seed(10), 1.f, dt);
      const std::vector<float> b = randn(static_cast<size_t>(n), seed(11), 1.f, dt);
      DeviceTensor da = upload(a, {n}, dt), db = upload(b, {n}, dt), out({n}, dt);
      std::vector<float> expect(static_cast<size_t>(n));

      poison(out);
      ops::fill(out, -2.71828f);
      sync("fill");
      same_values("fill " + tag, download(out),
                  std::vector<float>(static_cast<size_t>(n), round_to(dt, -2.71828f)));

      poison(out);
      ops::copy(out.view({3, n / 3}), da);
      sync("copy");
      same_values("copy " + tag, download(out), a);

      poison(out);
      ops::add(out, da, db);
      sync("add");
      for (int64_t i = 0; i < n; ++i) expect[size_t(i)] = round_to(dt, a[size_t(i)] + b[size_t(i)]);
      same_values("add " + tag, download(out), expect);

      ops::add(out, out, db);  // out aliases a
      sync("add aliased");
      for (int64_t i = 0; i < n; ++i)
        expect[size_t(i)] = round_to(dt, expect[size_t(i)] + b[size_t(i)]);
      same_values("add out=a+b with out aliasing a " + tag, download(out), expect);

      ops::add_inplace(da, db);
      sync("add_inplace");
      for (int64_t i = 0; i < n; ++i) expect[size_t(i)] = round_to(dt, a[size_t(i)] + b[size_t(i)]);
      same_values("add_inplace " + tag, download(da), expect);

      ops::scale_inplace(da, -0.3f);
      sync("scale_inplace");
      for (int64_t i = 0; i < n; ++i) expect[size_t(i)] = round_to(dt, expect[size_t(i)] * -0.3f);
      same_values("scale_inplace " + tag, download(da), expect);
    });
  }

  // elementwise.cu lets every tensor of an op have its own storage type
  // (an fp32 accumulator fed by BF16 gradients, say).
  const std::string tag = fmt("mixed dtypes n=%lld", (long long)n);
  run_case(tag, [&] {
    const std::vector<float> a = randn(static_cast<size_t>(n), seed(12), 1.f, BF16);
    const std::vector<float> b = randn(static_cast<size_t>(n), seed(13), 1.f, F16);
    DeviceTensor da = upload(a, {n}, BF16), db = upload(b, {n}, F16), out({n}, F32);
    std::vector<float> expect(static_cast<size_t>(n));
    poison(out);
    ops::add(out, da, db);
    sync("add mixed");
    for (int64_t i = 0; i < n; ++i) expect[size_t(i)] = a[size_t(i)] + b[size_t(i)];
    same_values("add F32 = BF16 + F16 " + tag, download(out), expect);
    ops::add_inplace(out, da);
    sync("add_inplace mixed");
    for (int64_t i = 0; i < n; ++i) expect[size_t(i)] += a[size_t(i)];
    same_values("add_inplace F32 += BF16 " + tag, download(out), expect);
    ops::add_inplace(da, out);
    sync("add_inplace mixed");
    for (int64_t i = 0; i < n; ++i)
      expect[size_t(i)] = round_to(BF16, a[size_t(i)] + expect[size_t(i)]);
    same_values("add_inplace BF16 += F32 " + tag, download(da), expect);
  });
}

// ---- sum, sum_squares ---------------------------------------------------------------

TEST_CASE("gpu sum and sum_squares against float64, NaN propagates", "[gpu][reduce]") {
  // Both return double: fp32 partial sums combined in double are good to
  // ~1e-7 here; 1e-6 still catches a dropped block or a lost tail. The sum
  // is judged against sum|x| because the signed sum cancels.
  constexpr double kSumTol = 1e-6;
  const int64_t n = (int64_t(1) << 20) + 17;
  for (DType dt : kAll) {
    const std::string tag = fmt("%s n=%lld", dn(dt), (long long)n);
    run_case(tag, [&] {
      std::vector<float> x = randn(static_cast<size_t>(n), seed(20), 2.f, dt, 0.3f);
      double ss = 0, s = 0, sabs = 0;
      for (float v : x) {
        ss += double(v) * double(v);
        s += double(v);
        sabs += std::fabs(double(v));
      }
      DeviceTensor d = upload(x, {n}, dt);
      const double g_ss = ops::sum_squares(d);
      sync("sum_squares");
      const double g_s = ops::sum(d);
      sync("sum");
      const double e_ss = std::fabs(g_ss - ss) / ss, e_s = std::fabs(g_s - s) / sabs;
      const std::string l1 = fmt("[gpu] %-64s gpu=%.10g ref=%.10g rel=%.3e tol=%.1e %s",
                                 ("sum_squares " + tag).c_str(), g_ss, ss, e_ss, kSumTol,
                                 e_ss <= kSumTol ? "ok" : "FAIL");
      const std::string l2s =
          fmt("[gpu] %-64s gpu=%.10g ref=%.10g err/sum|x|=%.3e tol=%.1e %s", ("sum " + tag).c_str(),
              g_s, s, e_s, kSumTol, e_s <= kSumTol ? "ok" : "FAIL");
      std::printf("%s\n%s\n", l1.c_str(), l2s.c_str());
      {
        INFO(l1);
        CHECK(e_ss <= kSumTol);
      }
      {
        INFO(l2s);
        CHECK(e_s <= kSumTol);
      }

      x[size_t(n - 1)] = kNaN;  // in the tail
      write(d, x);
      const double nan_ss = ops::sum_squares(d), nan_s = ops::sum(d);
      sync("sum with NaN");
      std::printf("[gpu] %-64s sum_squares=%g sum=%g (both must be NaN)\n",
                  ("NaN input " + tag).c_str(), nan_ss, nan_s);
      CHECK(std::isnan(nan_ss));
      CHECK(std::isnan(nan_s));
    });
  }
}

// ---- checksum ------------------------------------------------------------------------

TEST_CASE("gpu checksum equals the CPU's on the same bytes, aligned or not, and sees one flipped bit",
          "[gpu][reduce]") {
  // An integer sum: the GPU's value must be the CPU's exactly, whatever the
  // grid. 16-bit elements: sizes below and above one block, an odd count
  // (the last word half full), and a start one element into a word (the
  // unaligned path).
  for (int64_t n : {int64_t(1), int64_t(3), int64_t(513), int64_t(1 << 19) + 1, int64_t(5 << 19) + 1}) {
    for (int64_t offset : {int64_t(0), int64_t(1)}) {
      const std::string tag = fmt("%lld x 16 bits at element %lld", (long long)n, (long long)offset);
      run_case(tag, [&] {
        std::vector<uint8_t> host(size_t(2 * (n + offset)));
        uint64_t z = seed(21) + uint64_t(n);
        for (uint8_t& b : host) b = uint8_t((z = z * 6364136223846793005ull + 1442695040888963407ull) >> 56);
        DeviceTensor d({n + offset}, DType::U16);
        write_bytes(d, host);
        const Tensor view(static_cast<char*>(d.t().data) + 2 * offset, DType::U16, {n}, Device::CUDA);
        const uint64_t cpu_value = cpu::checksum(Tensor(host.data() + 2 * offset, DType::U16, {n}));
        const uint64_t gpu_value = ops::checksum(view);
        sync("checksum");
        host[size_t(2 * offset + n)] ^= 0x10;
        write_bytes(d, host);
        const uint64_t flipped = ops::checksum(view);
        sync("checksum after a flip");
        std::printf("[gpu] checksum %-40s gpu=%016llx cpu=%016llx %s; one bit flipped: %s\n", tag.c_str(),
                    (unsigned long long)gpu_value, (unsigned long long)cpu_value,
                    gpu_value == cpu_value ? "equal" : "DIFFER", flipped != gpu_value ? "changed" : "UNCHANGED");
        CHECK(gpu_value == cpu_value);
        CHECK(flipped != gpu_value);
      });
    }
  }
}

// ---- embedding ----------------------------------------------------------------------

TEST_CASE("gpu embedding forward (= and +=) and backward: repeated ids, deterministic",
          "[gpu][embedding]") {
  const int64_t V = 1000, C = 768, N = 4096;
  // Three quarters of the tokens hit four ids (~770 rows each): a backward
  // that adds rows with float atomics in a varying order shows up in the
  // determinism check, one that accumulates in BF16 in the comparison.
  std::vector<int32_t> ids = rand_ints(static_cast<size_t>(N), seed(30), 0, int(V));
  {
    const int32_t hot[] = {0, 7, 500, int32_t(V - 1)};
    std::mt19937_64 g(seed(31));
    for (int64_t i = 0; i < N; ++i)
      if (g() % 4 != 0) ids[size_t(i)] = hot[g() % 4];
  }
  for (DType dt : kAll) {
    const std::string tag =
        fmt("%s V=%lld C=%lld N=%lld", dn(dt), (long long)V, (long long)C, (long long)N);
    run_case(tag, [&] {
      const std::vector<float> table = randn(static_cast<size_t>(V * C), seed(32), 1.f, dt);
      DeviceTensor d_table = upload(table, {V, C}, dt), d_ids = upload_i32(ids, {N}),
                   out({N, C}, dt);

      poison(out);
      ops::embedding_forward(out, d_ids, d_table, false, 0, V);
      sync("embedding_forward");
      std::vector<float> ref(static_cast<size_t>(N * C));
      cpu::embedding_forward(host(ref, {N, C}), host_i32(ids, {N}), host(table, {V, C}), false, 0, V);
      same_values("embedding_forward " + tag, download(out), ref);

      const std::vector<float> base = randn(static_cast<size_t>(N * C), seed(33), 1.f, dt);
      write(out, base);
      ops::embedding_forward(out, d_ids, d_table, true, 0, V);
      sync("embedding_forward accumulate");
      std::vector<float> acc(static_cast<size_t>(N * C));
      for (size_t i = 0; i < acc.size(); ++i) acc[i] = round_to(dt, base[i] + ref[i]);
      same_values("embedding_forward accumulate " + tag, download(out), acc);

      const std::vector<float> dtable0 = randn(static_cast<size_t>(V * C), seed(34), 1.f, dt);
      const std::vector<float> dout = randn(static_cast<size_t>(N * C), seed(35), 1.f, dt);
      DeviceTensor d_dtable = upload(dtable0, {V, C}, dt), d_dout = upload(dout, {N, C}, dt);
      ops::embedding_backward(d_dtable, d_ids, d_dout, 0, V);
      sync("embedding_backward");
      const std::vector<uint8_t> run1 = download_bytes(d_dtable);
      std::vector<float> ref_dt = dtable0;
      cpu::embedding_backward(host(ref_dt, {V, C}), host_i32(ids, {N}), host(dout, {N, C}), 0, V);
      compare("embedding_backward dtable (+=) " + tag, decode(run1, dt), ref_dt, tol(dt));

      write(d_dtable, dtable0);
      ops::embedding_backward(d_dtable, d_ids, d_dout, 0, V);
      sync("embedding_backward again");
      same_bits("embedding_backward run twice (determinism) " + tag, download_bytes(d_dtable), run1,
                dtype_size(dt));
    });
  }
}

TEST_CASE("gpu vocab-parallel embedding: a table split over 3 ranks, each rank against its CPU twin "
          "and against the whole table's rows",
          "[gpu][embedding]") {
  // V = 1000 over P = 3: 334 rows a rank, the last one with 2 padding rows
  // (NaN in the forward table: a lookup that reached one would show).
  const int64_t V = 1000, C = 768, N = 4096, P = 3, rows = (V + P - 1) / P;
  std::vector<int32_t> ids = rand_ints(static_cast<size_t>(N), seed(40), 0, int(V));
  {
    // Hot ids on both sides of each rank boundary and at both ends.
    const int32_t hot[] = {0, int32_t(rows - 1), int32_t(rows), int32_t(2 * rows), int32_t(V - 1)};
    std::mt19937_64 g(seed(41));
    for (int64_t i = 0; i < N; ++i)
      if (g() % 2 != 0) ids[size_t(i)] = hot[g() % 5];
  }
  for (DType dt : kAll) {
    const std::string tag = fmt("%s V=%lld P=%lld C=%lld N=%lld", dn(dt), (long long)V,
                                (long long)P, (long long)C, (long long)N);
    run_case(tag, [&] {
      const std::vector<float> table = randn(static_cast<size_t>(V * C), seed(42), 1.f, dt);
      const std::vector<float> dtable0 = randn(static_cast<size_t>(V * C), seed(43), 1.f, dt);
      const std::vector<float> dout = randn(static_cast<size_t>(N * C), seed(44), 1.f, dt);
      const std::vector<float> base = randn(static_cast<size_t>(N * C), seed(45), 1.f, dt);
      DeviceTensor d_ids = upload_i32(ids, {N}), d_dout = upload(dout, {N, C}, dt);

      // The whole table's backward on the device: each rank's rows must be
      // these bit for bit (the same additions in the same order).
      DeviceTensor d_whole = upload(dtable0, {V, C}, dt);
      ops::embedding_backward(d_whole, d_ids, d_dout, 0, V);
      sync("embedding_backward whole table");
      const std::vector<uint8_t> whole_bytes = download_bytes(d_whole);
      const size_t row_bytes = size_t(C) * dtype_size(dt);

      std::vector<float> whole_ref(static_cast<size_t>(N * C));
      cpu::embedding_forward(host(whole_ref, {N, C}), host_i32(ids, {N}), host(table, {V, C}), false,
                             0, V);
      DeviceTensor acc = upload(base, {N, C}, dt);
      for (int64_t p = 0; p < P; ++p) {
        const int64_t off = p * rows, valid = std::min(rows, V - off);
        const std::string rtag = fmt("rank %lld [%lld, %lld) ", (long long)p, (long long)off,
                                     (long long)(off + rows)) + tag;
        std::vector<float> tab(static_cast<size_t>(rows * C), kNaN), dtab(static_cast<size_t>(rows * C), 3.f);
        std::copy(table.begin() + off * C, table.begin() + (off + valid) * C, tab.begin());
        std::copy(dtable0.begin() + off * C, dtable0.begin() + (off + valid) * C, dtab.begin());
        DeviceTensor d_tab = upload(tab, {rows, C}, dt), out({N, C}, dt);

        poison(out);
        ops::embedding_forward(out, d_ids, d_tab, false, off, V);
        sync("embedding_forward vocab-parallel");
        std::vector<float> ref(static_cast<size_t>(N * C));
        cpu::embedding_forward(host(ref, {N, C}), host_i32(ids, {N}), host(tab, {rows, C}), false,
                               off, V);
        same_values("embedding_forward " + rtag, download(out), ref);
        ops::embedding_forward(acc, d_ids, d_tab, true, off, V);
        sync("embedding_forward vocab-parallel accumulate");

        DeviceTensor d_dtab = upload(dtab, {rows, C}, dt);
        ops::embedding_backward(d_dtab, d_ids, d_dout, off, V);
        sync("embedding_backward vocab-parallel");
        const std::vector<uint8_t> got = download_bytes(d_dtab);
        std::vector<float> ref_dt = dtab;
        cpu::embedding_backward(host(ref_dt, {rows, C}), host_i32(ids, {N}), host(dout, {N, C}), off, V);
        compare("embedding_backward dtable (+=) " + rtag, decode(got, dt), ref_dt, tol(dt));
        same_bits("embedding_backward rows = whole table's rows " + rtag,
                  std::vector<uint8_t>(got.begin(), got.begin() + valid * row_bytes),
                  std::vector<uint8_t>(whole_bytes.begin() + off * row_bytes,
                                       whole_bytes.begin() + (off + valid) * row_bytes),
                  dtype_size(dt));
        if (valid < rows)  // padding rows: never written
          same_bits("embedding_backward padding rows untouched " + rtag,
                    std::vector<uint8_t>(got.begin() + valid * row_bytes, got.end()),
                    encode(std::vector<float>(static_cast<size_t>((rows - valid) * C), 3.f), dt),
                    dtype_size(dt));
      }
      // Each token is added by exactly one rank: base + table[id], rounded once.
      std::vector<float> acc_ref(static_cast<size_t>(N * C));
      for (size_t i = 0; i < acc_ref.size(); ++i) acc_ref[i] = round_to(dt, base[i] + whole_ref[i]);
      same_values("embedding_forward accumulate over the ranks = whole table " + tag, download(acc),
                  acc_ref);
    });
  }
}

// ---- norms --------------------------------------------------------------------------

TEST_CASE("gpu rmsnorm forward and backward (dx +=, dweight +=)", "[gpu][norm]") {
  const int64_t N = 257;
  const float eps = 1e-5f;
  for (DType dt : kAll)
    for (int64_t C : {int64_t(200), int64_t(1024), int64_t(4096)}) {
      const std::string tag = fmt("%s N=%lld C=%lld", dn(dt), (long long)N, (long long)C);
      run_case(tag, [&] {
        const uint64_t s = seed(40 + uint64_t(C));
        const std::vector<float> x = randn(static_cast<size_t>(N * C), s, 1.5f, dt);
        const std::vector<float> w = randn(static_cast<size_t>(C), s + 1, 0.3f, dt, 1.f);
        DeviceTensor dx_in = upload(x, {N, C}, dt), dw_in = upload(w, {C}, dt), out({N, C}, dt),
                     rstd({N}, F32);
        poison(out);
        poison(rstd);
        ops::rmsnorm_forward(out, rstd, dx_in, dw_in, eps);
        sync("rmsnorm_forward");
        std::vector<float> r_out(static_cast<size_t>(N * C)), r_rstd(static_cast<size_t>(N));
        cpu::rmsnorm_forward(host(r_out, {N, C}), host(r_rstd, {N}), host(x, {N, C}), host(w, {C}),
                             eps);
        compare("rmsnorm_forward out " + tag, download(out), r_out, tol(dt));
        compare("rmsnorm_forward rstd " + tag, download(rstd), r_rstd, kTolF32);

        // The backward reads the GPU's rstd on both sides; the gradients
        // accumulate into random contents of the scale they add.
        const std::vector<float> g_rstd = download(rstd);
        const std::vector<float> dout = randn(static_cast<size_t>(N * C), s + 2, 1.f, dt);
        const std::vector<float> dx0 = randn(static_cast<size_t>(N * C), s + 3, 1.f, dt);
        const std::vector<float> dw0 = randn(static_cast<size_t>(C), s + 4, 8.f, dt);
        DeviceTensor d_dout = upload(dout, {N, C}, dt), d_dx = upload(dx0, {N, C}, dt),
                     d_dw = upload(dw0, {C}, dt);
        ops::rmsnorm_backward(d_dx, d_dw, d_dout, dx_in, dw_in, rstd);
        sync("rmsnorm_backward");
        std::vector<float> r_dx = dx0, r_dw = dw0;
        cpu::rmsnorm_backward(host(r_dx, {N, C}), host(r_dw, {C}), host(dout, {N, C}),
                              host(x, {N, C}), host(w, {C}), host(g_rstd, {N}));
        compare("rmsnorm_backward dx (+=) " + tag, download(d_dx), r_dx, tol(dt));
        compare("rmsnorm_backward dweight (+=) " + tag, download(d_dw), r_dw, tol(dt));

        // norms.cu reduces dweight without atomics: the same bits every run.
        const std::vector<uint8_t> dx1 = download_bytes(d_dx), dw1 = download_bytes(d_dw);
        write(d_dx, dx0);
        write(d_dw, dw0);
        ops::rmsnorm_backward(d_dx, d_dw, d_dout, dx_in, dw_in, rstd);
        sync("rmsnorm_backward again");
        same_bits("rmsnorm_backward dx run twice (determinism) " + tag, download_bytes(d_dx), dx1,
                  dtype_size(dt));
        same_bits("rmsnorm_backward dweight run twice (determinism) " + tag, download_bytes(d_dw),
                  dw1, dtype_size(dt));
      });
    }
}

TEST_CASE("gpu layernorm forward and backward (dx, dweight, dbias +=)", "[gpu][norm]") {
  const int64_t N = 257;
  const float eps = 1e-5f;
  for (DType dt : kAll)
    for (int64_t C : {int64_t(200), int64_t(1024), int64_t(4096)}) {
      const std::string tag = fmt("%s N=%lld C=%lld", dn(dt), (long long)N, (long long)C);
      run_case(tag, [&] {
        const uint64_t s = seed(50 + uint64_t(C));
        // Rows with means up to ~10x their spread: a one-pass variance that
        // cancels badly shows up here.
        std::vector<float> x = randn(static_cast<size_t>(N * C), s, 1.5f);
        const std::vector<float> row_mean = randn(static_cast<size_t>(N), s + 5, 5.f);
        for (int64_t n = 0; n < N; ++n)
          for (int64_t c = 0; c < C; ++c)
            x[size_t(n * C + c)] = round_to(dt, x[size_t(n * C + c)] + row_mean[size_t(n)]);
        const std::vector<float> w = randn(static_cast<size_t>(C), s + 1, 0.3f, dt, 1.f);
        const std::vector<float> b = randn(static_cast<size_t>(C), s + 2, 0.5f, dt);
        DeviceTensor d_x = upload(x, {N, C}, dt), d_w = upload(w, {C}, dt),
                     d_b = upload(b, {C}, dt), out({N, C}, dt), mean({N}, F32), rstd({N}, F32);
        poison(out);
        poison(mean);
        poison(rstd);
        ops::layernorm_forward(out, mean, rstd, d_x, d_w, d_b, eps);
        sync("layernorm_forward");
        std::vector<float> r_out(static_cast<size_t>(N * C)), r_mean(static_cast<size_t>(N)),
            r_rstd(static_cast<size_t>(N));
        cpu::layernorm_forward(host(r_out, {N, C}), host(r_mean, {N}), host(r_rstd, {N}),
                               host(x, {N, C}), host(w, {C}), host(b, {C}), eps);
        compare("layernorm_forward out " + tag, download(out), r_out, tol(dt));
        compare("layernorm_forward mean " + tag, download(mean), r_mean, kTolF32);
        compare("layernorm_forward rstd " + tag, download(rstd), r_rstd, kTolF32);

        const std::vector<float> g_mean = download(mean), g_rstd = download(rstd);
        const std::vector<float> dout = randn(static_cast<size_t>(N * C), s + 3, 1.f, dt);
        const std::vector<float> dx0 = randn(static_cast<size_t>(N * C), s + 4, 1.f, dt);
        const std::vector<float> dw0 = randn(static_cast<size_t>(C), s + 6, 8.f, dt);
        const std::vector<float> db0 = randn(static_cast<size_t>(C), s + 7, 8.f, dt);
        DeviceTensor d_dout = upload(dout, {N, C}, dt), d_dx = upload(dx0, {N, C}, dt),
                     d_dw = upload(dw0, {C}, dt), d_db = upload(db0, {C}, dt);
        ops::layernorm_backward(d_dx, d_dw, d_db, d_dout, d_x, d_w, mean, rstd);
        sync("layernorm_backward");
        std::vector<float> r_dx = dx0, r_dw = dw0, r_db = db0;
        cpu::layernorm_backward(host(r_dx, {N, C}), host(r_dw, {C}), host(r_db, {C}),
                                host(dout, {N, C}), host(x, {N, C}), host(w, {C}),
                                host(g_mean, {N}), host(g_rstd, {N}));
        compare("layernorm_backward dx (+=) " + tag, download(d_dx), r_dx, tol(dt));
        compare("layernorm_backward dweight (+=) " + tag, download(d_dw), r_dw, tol(dt));
        compare("layernorm_backward dbias (+=) " + tag, download(d_db), r_db, tol(dt));

        const std::vector<uint8_t> dx1 = download_bytes(d_dx), dw1 = download_bytes(d_dw),
                                   db1 = download_bytes(d_db);
        write(d_dx, dx0);
        write(d_dw, dw0);
        write(d_db, db0);
        ops::layernorm_backward(d_dx, d_dw, d_db, d_dout, d_x, d_w, mean, rstd);
        sync("layernorm_backward again");
        same_bits("layernorm_backward dx run twice (determinism) " + tag, download_bytes(d_dx), dx1,
                  dtype_size(dt));
        same_bits("layernorm_backward dweight run twice (determinism) " + tag, download_bytes(d_dw),
                  dw1, dtype_size(dt));
        same_bits("layernorm_backward dbias run twice (determinism) " + tag, download_bytes(d_db),
                  db1, dtype_size(dt));
      });
    }
}

// ---- linear -------------------------------------------------------------------------

namespace {
struct LinearShape {
  int64_t B, T, IC, OC;  // B == 0: a 2-D input [T, IC]
  int64_t N() const { return B == 0 ? T : B * T; }
  Shape inp() const { return B == 0 ? Shape{T, IC} : Shape{B, T, IC}; }
  Shape out() const { return B == 0 ? Shape{T, OC} : Shape{B, T, OC}; }
  std::string str() const {
    return fmt("inp %s[%lld,%lld] OC=%lld", B == 0 ? "" : fmt("[%lld]x", (long long)B).c_str(),
               (long long)T, (long long)IC, (long long)OC);
  }
};
// A square-ish GEMM, a 3-D input with odd token count and small widths, and
// a single token (a GEMV shape cuBLASLt handles differently).
const LinearShape kLinearShapes[] = {{0, 128, 256, 384}, {3, 37, 72, 40}, {0, 1, 128, 256}};
}  // namespace

TEST_CASE("gpu linear forward, with and without bias", "[gpu][linear]") {
  for (DType dt : kAll)
    for (const LinearShape& sh : kLinearShapes)
      for (bool with_bias : {true, false}) {
        const std::string tag =
            fmt("%s %s %s", dn(dt), sh.str().c_str(), with_bias ? "bias" : "no bias");
        run_case(tag, [&] {
          const int64_t N = sh.N(), IC = sh.IC, OC = sh.OC;
          const uint64_t s = seed(60 + uint64_t(N));
          const std::vector<float> inp = randn(static_cast<size_t>(N * IC), s, 1.f, dt);
          const std::vector<float> w =
              randn(static_cast<size_t>(OC * IC), s + 1, 1.f / std::sqrt(float(IC)), dt);
          const std::vector<float> b = randn(static_cast<size_t>(OC), s + 2, 1.f, dt);
          DeviceTensor d_inp = upload(inp, sh.inp(), dt), d_w = upload(w, {OC, IC}, dt),
                       d_b = upload(b, {OC}, dt), out(sh.out(), dt);
          poison(out);
          ops::linear_forward(out, d_inp, d_w, with_bias ? d_b.t() : Tensor());
          sync("linear_forward");
          std::vector<float> ref(static_cast<size_t>(N * OC));
          cpu::linear_forward(host(ref, sh.out()), host(inp, sh.inp()), host(w, {OC, IC}),
                              with_bias ? host(b, {OC}) : Tensor());
          compare("linear_forward " + tag, download(out), ref, tol(dt));
        });
      }
}

TEST_CASE("gpu linear backward: dinp overwrite or +=, dweight and dbias +=, absent dinp or dbias",
          "[gpu][linear]") {
  struct Mode {
    bool dinp, accumulate, dbias;
    const char* name;
  };
  const Mode modes[] = {{true, false, true, "dinp overwrite, dbias"},
                        {true, true, true, "dinp +=, dbias"},
                        {true, false, false, "dinp overwrite, no dbias"},
                        {false, false, true, "no dinp, dbias"}};
  for (DType dt : kAll)
    for (const LinearShape& sh : kLinearShapes)
      for (const Mode& m : modes) {
        const std::string tag = fmt("%s %s %s", dn(dt), sh.str().c_str(), m.name);
        run_case(tag, [&] {
          const int64_t N = sh.N(), IC = sh.IC, OC = sh.OC;
          const uint64_t s = seed(70 + uint64_t(N));
          const float acc_scale = std::sqrt(float(N));  // the size of a sum over N rows
          const std::vector<float> inp = randn(static_cast<size_t>(N * IC), s, 1.f, dt);
          const std::vector<float> w =
              randn(static_cast<size_t>(OC * IC), s + 1, 1.f / std::sqrt(float(IC)), dt);
          const std::vector<float> dout = randn(static_cast<size_t>(N * OC), s + 2, 1.f, dt);
          const std::vector<float> dinp0 = randn(static_cast<size_t>(N * IC), s + 3, 1.f, dt);
          const std::vector<float> dw0 = randn(static_cast<size_t>(OC * IC), s + 4, acc_scale, dt);
          const std::vector<float> db0 = randn(static_cast<size_t>(OC), s + 5, acc_scale, dt);
          DeviceTensor d_inp = upload(inp, sh.inp(), dt), d_w = upload(w, {OC, IC}, dt),
                       d_dout = upload(dout, sh.out(), dt), d_dinp = upload(dinp0, sh.inp(), dt),
                       d_dw = upload(dw0, {OC, IC}, dt), d_db = upload(db0, {OC}, dt);
          if (m.dinp && !m.accumulate) poison(d_dinp);
          ops::linear_backward(m.dinp ? d_dinp.t() : absent_cuda(), d_dw,
                               m.dbias ? d_db.t() : Tensor(), d_dout, d_inp, d_w, m.accumulate);
          sync("linear_backward");
          std::vector<float> r_dinp = dinp0, r_dw = dw0, r_db = db0;
          cpu::linear_backward(m.dinp ? host(r_dinp, sh.inp()) : Tensor(), host(r_dw, {OC, IC}),
                               m.dbias ? host(r_db, {OC}) : Tensor(), host(dout, sh.out()),
                               host(inp, sh.inp()), host(w, {OC, IC}), m.accumulate);
          if (m.dinp) compare("linear_backward dinp " + tag, download(d_dinp), r_dinp, tol(dt));
          compare("linear_backward dweight (+=) " + tag, download(d_dw), r_dw, tol(dt));
          if (m.dbias)
            compare("linear_backward dbias (+=) " + tag, download(d_db), r_db, tol(dt));
          else
            same_values("linear_backward absent dbias leaves its buffer " + tag, download(d_db),
                        db0);
        });
      }
}

// ---- rope ---------------------------------------------------------------------------

TEST_CASE("gpu rope forward and backward, out of place and in place", "[gpu][rope]") {
  struct RopeShape {
    int64_t B, T, H, D;
    ops::Rope rope;
  };
  // Llama 3.1's scaling (model.rope_scaling.type llama3) and a linear one:
  // the same table code reads other frequencies.
  ops::Rope llama31(5e5f), linear(1e4f);
  llama31.scaling = ops::RopeScaling::Llama3;
  llama31.factor = 8.0;
  llama31.low_freq_factor = 1.0;
  llama31.high_freq_factor = 4.0;
  llama31.original_max_pos = 8192.0;
  linear.scaling = ops::RopeScaling::Linear;
  linear.factor = 4.0;
  // T = 4096 at theta 5e5 (LLaMA 3): angles up to 4095 rad. The CPU twin
  // takes angles in double; an angle t * inv_freq formed in fp32 is off by
  // ~5e-4 rad there. Only the few fastest-turning pairs suffer, which the
  // relative norm averages away (3.6e-6 at T = 1000), so F32 also bounds the
  // largest elementwise error (kRopeMaxAbsF32).
  const RopeShape shapes[] = {
      {2, 100, 4, 64, 1e4f}, {1, 4096, 2, 128, 5e5f}, {3, 17, 3, 128, 1e4f}, {1, 4096, 2, 128, llama31},
      {2, 100, 4, 64, linear}};
  // Correct cos/sin rounded to fp32 and an fp32 rotation of O(1) inputs are
  // good to ~1e-6 per element; fp32 angles give ~1e-4 at T = 1000.
  constexpr double kRopeMaxAbsF32 = 2e-5;
  for (DType dt : kAll)
    for (const RopeShape& sh : shapes) {
      const std::string tag =
          fmt("%s B=%lld T=%lld H=%lld D=%lld theta=%g scaling=%s", dn(dt), (long long)sh.B, (long long)sh.T,
              (long long)sh.H, (long long)sh.D, double(sh.rope.theta), ops::rope_scaling_name(sh.rope.scaling));
      run_case(tag, [&] {
        const Shape shape{sh.B, sh.T, sh.H, sh.D};
        const size_t n = size_t(numel_of(shape));
        const uint64_t s = seed(80 + uint64_t(sh.T));
        const std::vector<float> x = randn(n, s, 1.f, dt), dout = randn(n, s + 1, 1.f, dt);
        std::vector<float> r_out(n), r_dx(n);
        cpu::rope_forward(host(r_out, shape), host(x, shape), sh.rope, 0);
        cpu::rope_backward(host(r_dx, shape), host(dout, shape), sh.rope, 0);

        DeviceTensor d_x = upload(x, shape, dt), out(shape, dt);
        poison(out);
        ops::rope_forward(out, d_x, sh.rope, 0);
        sync("rope_forward");
        const std::vector<float> g_out = download(out);
        compare("rope_forward " + tag, g_out, r_out, tol(dt));
        if (dt == F32) max_abs_within("rope_forward " + tag, g_out, r_out, kRopeMaxAbsF32);
        ops::rope_forward(d_x, d_x, sh.rope, 0);
        sync("rope_forward in place");
        compare("rope_forward in place " + tag, download(d_x), r_out, tol(dt));

        DeviceTensor d_dout = upload(dout, shape, dt), dx(shape, dt);
        poison(dx);
        ops::rope_backward(dx, d_dout, sh.rope, 0);
        sync("rope_backward");
        const std::vector<float> g_dx = download(dx);
        compare("rope_backward " + tag, g_dx, r_dx, tol(dt));
        if (dt == F32) max_abs_within("rope_backward " + tag, g_dx, r_dx, kRopeMaxAbsF32);
        ops::rope_backward(d_dout, d_dout, sh.rope, 0);
        sync("rope_backward in place");
        compare("rope_backward in place " + tag, download(d_dout), r_dx, tol(dt));
      });
    }
}

// Context parallelism: a rank rotates positions [k, k + T) of each sequence.
// Against the CPU at the same offset (tolerances as above), and on the GPU
// itself the chunk must equal those positions of the whole sequence bit for
// bit (the cos/sin of a position do not depend on the table's length).
TEST_CASE("gpu rope with a position offset: CPU twin, and the whole sequence's positions",
          "[gpu][rope]") {
  struct OffsetShape {
    int64_t B, T, H, D, k;
    float theta;
  };
  const OffsetShape shapes[] = {{2, 64, 4, 64, 4032, 1e4f}, {1, 17, 3, 128, 1, 5e5f},
                                {2, 100, 2, 64, 300, 5e5f}};
  constexpr double kRopeMaxAbsF32 = 2e-5;  // as in the test above
  for (DType dt : kAll)
    for (const OffsetShape& sh : shapes) {
      const std::string tag =
          fmt("%s B=%lld T=%lld H=%lld D=%lld offset=%lld theta=%g", dn(dt), (long long)sh.B,
              (long long)sh.T, (long long)sh.H, (long long)sh.D, (long long)sh.k, double(sh.theta));
      run_case(tag, [&] {
        const int64_t HD = sh.H * sh.D, W = sh.k + sh.T;
        const Shape part_shape{sh.B, sh.T, sh.H, sh.D}, whole_shape{sh.B, W, sh.H, sh.D};
        const std::vector<float> whole = randn(size_t(sh.B * W * HD), seed(90 + uint64_t(sh.k)), 1.f, dt);
        std::vector<float> part;  // positions [k, k + T) of every sequence
        for (int64_t b = 0; b < sh.B; ++b) {
          const auto first = whole.begin() + (b * W + sh.k) * HD;
          part.insert(part.end(), first, first + sh.T * HD);
        }
        auto last_positions = [&](const std::vector<float>& w) {
          std::vector<float> r;
          for (int64_t b = 0; b < sh.B; ++b) {
            const auto first = w.begin() + (b * W + sh.k) * HD;
            r.insert(r.end(), first, first + sh.T * HD);
          }
          return r;
        };
        std::vector<float> r_out(part.size()), r_dx(part.size());
        cpu::rope_forward(host(r_out, part_shape), host(part, part_shape), sh.theta, sh.k);
        cpu::rope_backward(host(r_dx, part_shape), host(part, part_shape), sh.theta, sh.k);

        DeviceTensor d_part = upload(part, part_shape, dt), d_whole = upload(whole, whole_shape, dt);
        DeviceTensor out(part_shape, dt), whole_out(whole_shape, dt);
        poison(out);
        poison(whole_out);
        ops::rope_forward(out, d_part, sh.theta, sh.k);
        sync("rope_forward at an offset");
        ops::rope_forward(whole_out, d_whole, sh.theta, 0);
        sync("rope_forward of the whole");
        const std::vector<float> g_out = download(out);
        compare("rope_forward offset " + tag, g_out, r_out, tol(dt));
        if (dt == F32) max_abs_within("rope_forward offset " + tag, g_out, r_out, kRopeMaxAbsF32);
        same_values("rope_forward offset = whole's positions " + tag, g_out,
                    last_positions(download(whole_out)));

        poison(out);
        poison(whole_out);
        ops::rope_backward(out, d_part, sh.theta, sh.k);
        sync("rope_backward at an offset");
        ops::rope_backward(whole_out, d_whole, sh.theta, 0);
        sync("rope_backward of the whole");
        const std::vector<float> g_dx = download(out);
        compare("rope_backward offset " + tag, g_dx, r_dx, tol(dt));
        same_values("rope_backward offset = whole's positions " + tag, g_dx,
                    last_positions(download(whole_out)));
      });
    }
}

// ---- attention ----------------------------------------------------------------------

namespace {

// The F32 backward sums over up to T = 1000 keys in fp32 on both sides, in
// different orders (blocked online softmax against sgemm), and forms
// dS = P (dP - D) from two such sums: a few times the elementwise tolerance.
constexpr double kAttnBwdTolF32 = 3 * kTolF32;

// Separate documents for attention_case: doc_start [B, T] (empty: none) and
// what the tag calls the layout.
struct Docs {
  std::string name;
  std::vector<int32_t> start;
};

// window > 0 (causal only): sliding-window attention, against the CPU twin
// with the same window; docs: separate documents (causal only), likewise.
void attention_case(DType dt, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                    bool causal, int64_t window = 0, const Docs& docs = {}) {
  const std::string tag =
      fmt("%s %s B=%lld T=%lld Hq=%lld Hkv=%lld D=%lld", dn(dt), causal ? "causal" : "full",
          (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)D) +
      (window > 0 ? fmt(" window=%lld", (long long)window) : std::string()) +
      (docs.start.empty() ? std::string() : " docs=" + docs.name);
  run_case("attention " + tag, [&] {
    const Shape qs{B, T, Hq, D}, ks{B, T, Hkv, D}, ls{B, Hq, T};
    const size_t nq = size_t(numel_of(qs)), nk = size_t(numel_of(ks)), nl = size_t(numel_of(ls));
    const uint64_t s = seed(uint64_t(T * 1000 + Hq * 100 + Hkv * 10 + D + (causal ? 1 : 0) + window * 7919));
    const std::vector<float> q = randn(nq, s, 1.f, dt), k = randn(nk, s + 1, 1.f, dt),
                             v = randn(nk, s + 2, 1.f, dt), dout = randn(nq, s + 3, 1.f, dt);
    DeviceTensor d_q = upload(q, qs, dt), d_k = upload(k, ks, dt), d_v = upload(v, ks, dt),
                 d_dout = upload(dout, qs, dt), out(qs, dt), lse(ls, F32), d_docs;
    // Absent (Tensor{}) without documents, as the model passes it.
    Tensor doc_start, c_doc_start;
    if (!docs.start.empty()) {
      d_docs = upload_i32(docs.start, {B, T});
      doc_start = d_docs;
      c_doc_start = host_i32(docs.start, {B, T});
    }
    poison(out);
    poison(lse);
    ops::attention_forward(out, lse, d_q, d_k, d_v, causal, window, doc_start);
    sync("attention_forward " + tag);
    std::vector<float> r_out(nq), r_lse(nl);
    cpu::attention_forward(host(r_out, qs), host(r_lse, ls), host(q, qs), host(k, ks), host(v, ks),
                           causal, window, c_doc_start);
    compare("attention_forward out " + tag, download(out), r_out, tol(dt));
    compare("attention_forward lse " + tag, download(lse), r_lse, kTolF32);

    // Both backwards read the GPU's out and lse, so they see the same inputs.
    const std::vector<float> g_out = download(out), g_lse = download(lse);
    DeviceTensor dq(qs, dt), dk(ks, dt), dv(ks, dt);
    auto run_backward = [&] {
      poison(dq);
      poison(dk);
      poison(dv);
      ops::attention_backward(dq, dk, dv, d_dout, d_q, d_k, d_v, out, lse, causal, window, doc_start);
      sync("attention_backward " + tag);
    };
    run_backward();
    const std::vector<uint8_t> dq1 = download_bytes(dq), dk1 = download_bytes(dk),
                               dv1 = download_bytes(dv);
    std::vector<float> r_dq(nq), r_dk(nk), r_dv(nk);
    cpu::attention_backward(host(r_dq, qs), host(r_dk, ks), host(r_dv, ks), host(dout, qs),
                            host(q, qs), host(k, ks), host(v, ks), host(g_out, qs), host(g_lse, ls),
                            causal, window, c_doc_start);
    const double bt = dt == F32 ? kAttnBwdTolF32 : tol(dt);
    // dq and dk are sums of P (dP - D), which cancel to zero where a query
    // sees a single key (T = 1, the first causal row); there the rounding
    // noise is judged on the scale of dv (same dO, same P), per element.
    const double dv_norm = l2(r_dv);
    compare("attention_backward dq " + tag, decode(dq1, dt), r_dq, bt,
            dv_norm * std::sqrt(double(nq) / double(nk)));
    compare("attention_backward dk " + tag, decode(dk1, dt), r_dk, bt, dv_norm);
    compare("attention_backward dv " + tag, decode(dv1, dt), r_dv, bt);

    run_backward();
    const size_t es = dtype_size(dt);
    same_bits("attention_backward dq run twice (determinism) " + tag, download_bytes(dq), dq1, es);
    same_bits("attention_backward dk run twice (determinism) " + tag, download_bytes(dk), dk1, es);
    same_bits("attention_backward dv run twice (determinism) " + tag, download_bytes(dv), dv1, es);
  });
}

struct Heads {
  int64_t Hq, Hkv;
};
// Ratios 1, 2, 4. With Hkv >= 2 whenever Hq > Hkv, mapping query head h to
// kv head h % Hkv instead of h / (Hq / Hkv) gives a different answer.
const Heads kHeads[] = {{4, 4}, {4, 2}, {8, 2}};

// The emulated device runs every thread of a kernel on the CPU, where the
// sweep's T = 1000 alone takes minutes and its cost grows with B * Hq * T^2.
// There the sweep keeps every edge at a fraction of that: lengths 1, 17, 100
// and 129 (two 64-row tiles and one row: three K/V tiles, so the double
// buffers are refilled, and a last tile of one row, as 257 on a GPU), a
// batch of one from T = 100, and smaller heads with the same ratios 1, 2
// (Hkv = 2) and 4, the last as MQA (Hkv = 1).
struct SweepShapes {
  std::vector<int64_t> lengths;
  std::vector<Heads> heads;
  int64_t batch_one_from;  // B = 1 from this T on, else 2
};
SweepShapes sweep_shapes() {
  return gpu_or_emu(SweepShapes{{1, 17, 100, 257, 1000}, {std::begin(kHeads), std::end(kHeads)}, 1000},
                    SweepShapes{{1, 17, 100, 129}, {{2, 2}, {4, 2}, {4, 1}}, 100});
}

// D = 32 (small models: the quickstart's d_model 128 over 4 heads) shares
// 64's tiles and code, so it runs at one head layout, GQA, at every length.
void attention_sweep(DType dt) {
  const SweepShapes sh = sweep_shapes();
  for (int64_t T : sh.lengths)
    for (bool causal : {true, false}) {
      for (const Heads& h : sh.heads)
        for (int64_t D : {int64_t(64), int64_t(128)})
          attention_case(dt, T >= sh.batch_one_from ? 1 : 2, T, h.Hq, h.Hkv, D, causal);
      attention_case(dt, T >= sh.batch_one_from ? 1 : 2, T, 4, 2, 32, causal);
    }
}

}  // namespace

TEST_CASE("gpu attention F32: causal/full, GQA 1/2/4, D 32/64/128, T 1..1000, deterministic backward",
          "[gpu][attention][f32]") {
  attention_sweep(F32);
}

TEST_CASE("gpu attention BF16: causal/full, GQA 1/2/4, D 32/64/128, T 1..1000, deterministic backward",
          "[gpu][attention][bf16]") {
  attention_sweep(BF16);
}

// Sliding windows shorter than a tile (64 keys on the MMA path, 32 on the
// fp32 one), one past the fp32 tile, at the MMA tile and one past it, and
// across several tiles: tiles before every row's band are skipped, the
// band's edge is masked. Kept small: the families have time caps.
// The long rows: T = 1000 and 8 query heads on 2 on a GPU; on the emulated
// device (sweep_shapes() says why) T = 333, still a ragged last tile and whole
// tiles before the last rows' band of 200, and 4 query heads on 1 (MQA).
void window_sweep(DType dt) {
  const int64_t T = gpu_or_emu<int64_t>(1000, 333);
  const Heads h = gpu_or_emu(Heads{8, 2}, Heads{4, 1});
  for (int64_t window : {int64_t(1), int64_t(33), int64_t(64), int64_t(65), int64_t(200)}) {
    if (window < 99) attention_case(dt, 2, 100, 4, 2, window == 33 ? 32 : 64, true, window);
    attention_case(dt, 1, T, h.Hq, h.Hkv, 128, true, window);
  }
  attention_case(dt, 2, 257, 4, 4, 128, true, 65);
}

TEST_CASE("gpu attention F32 with a sliding window: windows 1..200, T 100..1000, GQA, D 32/64/128",
          "[gpu][attention][f32][window]") {
  window_sweep(F32);
}

TEST_CASE("gpu attention BF16 with a sliding window: windows 1..200, T 100..1000, GQA, D 32/64/128",
          "[gpu][attention][bf16][window]") {
  window_sweep(BF16);
}

namespace {

// Separate documents: several a row, of different lengths. T = 100: starts
// inside a tile (5), on the fp32 path's 32-row tile edge (32) and on both
// paths' (64: the MMA path's tiles are 64 rows), and a batch row that is one
// document (the causal mask alone). T = 129: documents across a tile edge
// (40..79, 12..71) followed by a start inside the next tile (80, 72), so a
// tile's first row still needs an earlier K/V tile that its later rows must
// mask whole; documents of one token (rows that see only themselves: 3 and
// the last row, 128, alone in its tile); and a row whose doc_start runs
// ahead of the row (12 for rows 5..11, taken as the row itself). Against
// the CPU twin, forward and backward, with and without a window (40:
// reaching across some documents, not others), GQA; T = 100 and 129 are
// multiples of no tile. The emulated device runs these in about a second
// each: kept at B <= 2 and 4 query heads.
void documents_sweep(DType dt) {
  const int64_t T1 = 100, T2 = 129;
  const Docs many{"5,27,32,36|100", doc_starts({{5, 27, 32, 36}, {100}}, T1)};
  std::vector<int32_t> ahead = doc_starts({{3, 1, 36, 40, 48, 1}, {5, 7, 60, 57}}, T2);
  for (int64_t i = 5; i < 12; ++i) ahead[size_t(T2 + i)] = 12;
  const Docs odd{"3,1,36,40,48,1|ahead", ahead};
  const Docs first{"3,1,36,40,48,1", std::vector<int32_t>(ahead.begin(), ahead.begin() + T2)};
  attention_case(dt, 2, T1, 4, 2, 64, true, 0, many);
  attention_case(dt, 2, T2, 4, 2, 32, true, 40, odd);
  attention_case(dt, 1, T2, 4, 2, 128, true, 0, first);
}

}  // namespace

TEST_CASE("gpu attention F32 with separate documents: doc_start at T 100 and 129 with windows and GQA",
          "[gpu][attention][f32][documents]") {
  documents_sweep(F32);
}

TEST_CASE("gpu attention BF16 with separate documents: doc_start at T 100 and 129 with windows and GQA",
          "[gpu][attention][bf16][documents]") {
  documents_sweep(BF16);
}

TEST_CASE("gpu attention F16: a subset of the sweep", "[gpu][attention][f16]") {
  // The sweep's rows under a tile, of several tiles and long (sweep_shapes()).
  const SweepShapes sh = sweep_shapes();
  for (int64_t T : gpu_or_emu<std::vector<int64_t>>({17, 257, 1000}, {17, 129}))
    for (bool causal : {true, false}) {
      const int64_t B = T >= sh.batch_one_from ? 1 : 2;
      attention_case(F16, B, T, 8, 2, 128, causal);
      attention_case(F16, B, T, 4, 4, 64, causal);
    }
}

// Hidden ([.]): a few small shapes for compute-sanitizer's racecheck and
// synccheck, which slow kernels down by orders of magnitude
// (scripts/gpu-check.sh runs it when time is left).
TEST_CASE("gpu attention, small subset for compute-sanitizer", "[.][gpu][sanitize]") {
  for (int64_t T : {int64_t(17), int64_t(100)})
    for (bool causal : {true, false}) {
      attention_case(BF16, 1, T, 4, 2, 64, causal);
      attention_case(BF16, 1, T, 2, 2, 128, causal);
    }
  attention_case(BF16, 1, 100, 4, 2, 64, true, 40);
}

// Hidden ([.]): the emulated device's race check (scripts/sanitize_ci.sh runs
// it under ThreadSanitizer, where each CUDA thread is a fiber and a barrier
// the only order between them, at ~10 s a case): both tile loops of the
// backward, a partial tile, GQA, both head dims, a window, and fp32.
TEST_CASE("gpu attention, race-check subset for ThreadSanitizer", "[.][gpu][race]") {
  attention_case(BF16, 1, 17, 2, 2, 64, true);
  attention_case(BF16, 1, 80, 4, 2, 128, false);
  attention_case(BF16, 1, 80, 2, 1, 64, true, 24);
  attention_case(F32, 1, 33, 2, 2, 64, true);
  attention_case(BF16, 1, 70, 4, 2, 32, true);
}

// ---- activations --------------------------------------------------------------------

TEST_CASE("gpu gelu forward and backward, dinp aliasing dout", "[gpu][activation]") {
  const int64_t n = 100005;
  for (DType dt : kAll) {
    const std::string tag = fmt("%s n=%lld", dn(dt), (long long)n);
    run_case(tag, [&] {
      std::vector<float> x = randn(static_cast<size_t>(n), seed(90), 2.5f, dt);
      x[0] = -9.f;  // deep tail, where 1 + tanh cancels
      x[1] = 6.f;
      x[2] = 0.f;
      const std::vector<float> dout = randn(static_cast<size_t>(n), seed(91), 1.f, dt);
      std::vector<float> r_out(static_cast<size_t>(n)), r_dx(static_cast<size_t>(n));
      cpu::gelu_forward(host(r_out, {n}), host(x, {n}));
      cpu::gelu_backward(host(r_dx, {n}), host(dout, {n}), host(x, {n}));

      DeviceTensor d_x = upload(x, {n}, dt), out({n}, dt), d_dout = upload(dout, {n}, dt),
                   dx({n}, dt);
      poison(out);
      ops::gelu_forward(out, d_x);
      sync("gelu_forward");
      compare("gelu_forward " + tag, download(out), r_out, tol(dt));
      poison(dx);
      ops::gelu_backward(dx, d_dout, d_x);
      sync("gelu_backward");
      const std::vector<float> g_dx = download(dx);
      compare("gelu_backward " + tag, g_dx, r_dx, tol(dt));
      ops::gelu_backward(d_dout, d_dout, d_x);
      sync("gelu_backward in place");
      same_values("gelu_backward in place equals out of place " + tag, download(d_dout), g_dx);
    });
  }
}

TEST_CASE("gpu swiglu forward and backward", "[gpu][activation]") {
  const int64_t N = 257, F = 1000;
  for (DType dt : kAll) {
    const std::string tag = fmt("%s N=%lld F=%lld", dn(dt), (long long)N, (long long)F);
    run_case(tag, [&] {
      const size_t n = size_t(N * F);
      const std::vector<float> gate = randn(n, seed(100), 2.f, dt),
                               up = randn(n, seed(101), 1.f, dt),
                               dout = randn(n, seed(102), 1.f, dt);
      std::vector<float> r_out(n), r_dg(n), r_du(n);
      cpu::swiglu_forward(host(r_out, {N, F}), host(gate, {N, F}), host(up, {N, F}));
      cpu::swiglu_backward(host(r_dg, {N, F}), host(r_du, {N, F}), host(dout, {N, F}),
                           host(gate, {N, F}), host(up, {N, F}));
      DeviceTensor d_g = upload(gate, {N, F}, dt), d_u = upload(up, {N, F}, dt),
                   d_dout = upload(dout, {N, F}, dt), out({N, F}, dt), dg({N, F}, dt),
                   du({N, F}, dt);
      poison(out);
      ops::swiglu_forward(out, d_g, d_u);
      sync("swiglu_forward");
      compare("swiglu_forward " + tag, download(out), r_out, tol(dt));
      poison(dg);
      poison(du);
      ops::swiglu_backward(dg, du, d_dout, d_g, d_u);
      sync("swiglu_backward");
      compare("swiglu_backward dgate " + tag, download(dg), r_dg, tol(dt));
      compare("swiglu_backward dup " + tag, download(du), r_du, tol(dt));
    });
  }
}

// ---- cross-entropy ------------------------------------------------------------------

TEST_CASE("gpu cross-entropy V=50257: losses, dlogits, ignored targets, losses only, in place",
          "[gpu][loss]") {
  // V = 50257 (GPT-2, unpadded) leaves rows misaligned for vector loads.
  const int64_t N = 48, V = 50257;
  const float grad_scale = 1.f / 37.f;
  std::vector<int32_t> targets = rand_ints(static_cast<size_t>(N), seed(110), 0, int(V));
  targets[0] = 0;
  targets[1] = int32_t(V - 1);
  targets[2] = -1;     // ignored
  targets[5] = -100;   // ignored (PyTorch's ignore_index)
  targets[7] = 12345;  // the peak of row 7 (below)
  const std::vector<int64_t> ignored = {2, 5};
  for (DType dt : kAll) {
    const std::string tag = fmt("%s N=%lld V=%lld", dn(dt), (long long)N, (long long)V);
    run_case(tag, [&] {
      std::vector<float> logits = randn(static_cast<size_t>(N * V), seed(111), 2.f);
      for (int64_t j = 0; j < V; ++j)
        logits[size_t(3 * V + j)] += 100.f;  // exp overflows without the max
      logits[size_t(7 * V + 12345)] = 25.f;  // a confident, correct row
      logits[size_t(8 * V + 777)] = 25.f;    // a confident, wrong row
      logits = rounded(dt, logits);
      std::vector<float> r_loss(static_cast<size_t>(N)), r_dl(static_cast<size_t>(N * V));
      cpu::cross_entropy_forward_backward(host(r_loss, {N}), host(r_dl, {N, V}),
                                          host(logits, {N, V}), host_i32(targets, {N}), grad_scale);

      DeviceTensor d_logits = upload(logits, {N, V}, dt), d_t = upload_i32(targets, {N}),
                   losses({N}, F32), dl({N, V}, dt);
      auto check_ignored = [&](const std::string& what, const std::vector<float>& g_loss,
                               const std::vector<float>* g_dl) {
        for (int64_t n : ignored) {
          all_zero(fmt("%s ignored row %lld loss ", what.c_str(), (long long)n) + tag, g_loss,
                   size_t(n), size_t(n + 1));
          if (g_dl)
            all_zero(fmt("%s ignored row %lld dlogits ", what.c_str(), (long long)n) + tag, *g_dl,
                     size_t(n * V), size_t((n + 1) * V));
        }
      };

      poison(losses);
      poison(dl);
      ops::cross_entropy_forward_backward(losses, dl, d_logits, d_t, grad_scale);
      sync("cross_entropy_forward_backward");
      const std::vector<float> g_loss = download(losses), g_dl = download(dl);
      compare("cross_entropy losses " + tag, g_loss, r_loss, kTolF32);
      compare("cross_entropy dlogits " + tag, g_dl, r_dl, tol(dt));
      check_ignored("cross_entropy", g_loss, &g_dl);

      poison(losses);
      ops::cross_entropy_forward_backward(losses, Tensor(), d_logits, d_t, grad_scale);
      sync("cross_entropy_forward_backward losses only");
      const std::vector<float> g_loss2 = download(losses);
      compare("cross_entropy losses only (no dlogits) " + tag, g_loss2, r_loss, kTolF32);
      check_ignored("cross_entropy losses only", g_loss2, nullptr);

      // In place: dlogits overwrites the logits it reads.
      poison(losses);
      ops::cross_entropy_forward_backward(losses, d_logits, d_logits, d_t, grad_scale);
      sync("cross_entropy_forward_backward in place");
      const std::vector<float> g_loss3 = download(losses), g_dl3 = download(d_logits);
      compare("cross_entropy in place losses " + tag, g_loss3, r_loss, kTolF32);
      compare("cross_entropy in place dlogits " + tag, g_dl3, r_dl, tol(dt));
      check_ignored("cross_entropy in place", g_loss3, &g_dl3);
    });
  }
}

TEST_CASE("gpu vocab-parallel cross-entropy: partial stats and combine per rank against the CPU "
          "twins, the assembled result against the fused op, in place, losses only",
          "[gpu][loss]") {
  struct Config {
    int64_t N, V, P;
  };
  // 50257 over 4: 12565 columns a rank (odd: misaligned rows), the last with
  // 3 padding columns. 13 over 6: 3 columns a rank, the last padding only.
  for (const Config cfg : {Config{48, 50257, 4}, Config{7, 13, 6}}) {
    const int64_t N = cfg.N, V = cfg.V, P = cfg.P, cols = (V + P - 1) / P;
    const float grad_scale = 1.f / 37.f;
    std::vector<int32_t> targets = rand_ints(static_cast<size_t>(N), seed(120), 0, int(V));
    targets[0] = 0;
    targets[1] = int32_t(V - 1);
    targets[2] = -1;  // ignored
    for (DType dt : kAll) {
      const std::string tag = fmt("%s N=%lld V=%lld P=%lld", dn(dt), (long long)N, (long long)V,
                                  (long long)P);
      run_case(tag, [&] {
        std::vector<float> logits = randn(static_cast<size_t>(N * V), seed(121), 2.f);
        for (int64_t j = 0; j < V; ++j) logits[size_t(3 * V + j)] += 100.f;  // exp overflows without the max
        logits[size_t(4 * V + targets[4])] = 25.f;  // a confident, correct row
        logits = rounded(dt, logits);
        std::vector<float> r_loss(static_cast<size_t>(N)), r_dl(static_cast<size_t>(N * V));
        cpu::cross_entropy_forward_backward(host(r_loss, {N}), host(r_dl, {N, V}), host(logits, {N, V}),
                                            host_i32(targets, {N}), grad_scale);
        DeviceTensor d_t = upload_i32(targets, {N});

        // Step 1 on every rank; the stats gathered on the host in rank order.
        std::vector<std::vector<float>> locals;
        std::vector<float> all(static_cast<size_t>(P * N * 3));
        for (int64_t p = 0; p < P; ++p) {
          const int64_t off = p * cols, valid = std::clamp<int64_t>(V - off, 0, cols);
          const std::string rtag = fmt("rank %lld valid=%lld ", (long long)p, (long long)valid) + tag;
          std::vector<float> local(static_cast<size_t>(N * cols), kNaN);  // padding: never read
          for (int64_t n = 0; n < N; ++n)
            std::copy(logits.begin() + n * V + off, logits.begin() + n * V + off + valid,
                      local.begin() + n * cols);
          DeviceTensor d_local = upload(local, {N, cols}, dt), d_stats({N, 3}, F32);
          poison(d_stats);
          ops::cross_entropy_partial_stats(d_stats, d_local, d_t, off, valid, V);
          sync("cross_entropy_partial_stats");
          const std::vector<float> g = download(d_stats);
          std::vector<float> r(static_cast<size_t>(N * 3));
          cpu::cross_entropy_partial_stats(host(r, {N, 3}), host(local, {N, cols}),
                                           host_i32(targets, {N}), off, valid, V);
          auto column = [&](const std::vector<float>& v, int k) {
            std::vector<float> c(static_cast<size_t>(N));
            for (int64_t n = 0; n < N; ++n) c[size_t(n)] = v[size_t(3 * n + k)];
            return c;
          };
          same_values("partial_stats max m " + rtag, column(g, 0), column(r, 0));
          compare("partial_stats sum s " + rtag, column(g, 1), column(r, 1), kTolF32);
          same_values("partial_stats target logit t " + rtag, column(g, 2), column(r, 2));
          std::copy(g.begin(), g.end(), all.begin() + p * N * 3);
          locals.push_back(std::move(local));
        }

        // Step 2 on every rank, from the device's stats.
        DeviceTensor d_all = upload(all, {P, N, 3}, F32), losses({N}, F32);
        std::vector<float> cat_dl(static_cast<size_t>(N * V), kNaN), padding;
        for (int64_t p = 0; p < P; ++p) {
          const int64_t off = p * cols, valid = std::clamp<int64_t>(V - off, 0, cols);
          const std::string rtag = fmt("rank %lld valid=%lld ", (long long)p, (long long)valid) + tag;
          const std::vector<float>& local = locals[size_t(p)];
          std::vector<float> r_l(static_cast<size_t>(N)), r_d(static_cast<size_t>(N * cols));
          cpu::cross_entropy_vocab_parallel(host(r_l, {N}), host(r_d, {N, cols}), host(local, {N, cols}),
                                            host_i32(targets, {N}), host(all, {P, N, 3}), off, valid,
                                            grad_scale);
          DeviceTensor d_local = upload(local, {N, cols}, dt), dl({N, cols}, dt);
          poison(losses);
          poison(dl);
          ops::cross_entropy_vocab_parallel(losses, dl, d_local, d_t, d_all, off, valid, grad_scale);
          sync("cross_entropy_vocab_parallel");
          const std::vector<float> g_l = download(losses), g_d = download(dl);
          compare("vocab_parallel losses " + rtag, g_l, r_l, kTolF32);
          compare("vocab_parallel dlogits " + rtag, g_d, r_d, tol(dt));
          all_zero("vocab_parallel ignored row dlogits " + rtag, g_d, size_t(2 * cols),
                   size_t(3 * cols));
          for (int64_t n = 0; n < N; ++n) {
            std::copy(g_d.begin() + n * cols, g_d.begin() + n * cols + valid, cat_dl.begin() + n * V + off);
            padding.insert(padding.end(), g_d.begin() + n * cols + valid, g_d.begin() + (n + 1) * cols);
          }
          if (p == 0) {
            compare("vocab_parallel losses vs the fused op " + tag, g_l, r_loss, kTolF32);
            all_zero("vocab_parallel ignored row loss " + tag, g_l, 2, 3);
          }

          poison(losses);
          ops::cross_entropy_vocab_parallel(losses, Tensor(), d_local, d_t, d_all, off, valid, grad_scale);
          sync("cross_entropy_vocab_parallel losses only");
          compare("vocab_parallel losses only " + rtag, download(losses), r_l, kTolF32);

          poison(losses);
          ops::cross_entropy_vocab_parallel(losses, d_local, d_local, d_t, d_all, off, valid, grad_scale);
          sync("cross_entropy_vocab_parallel in place");
          compare("vocab_parallel in place losses " + rtag, download(losses), r_l, kTolF32);
          compare("vocab_parallel in place dlogits " + rtag, download(d_local), r_d, tol(dt));
        }
        all_zero("vocab_parallel padding columns " + tag, padding, 0, padding.size());
        compare("vocab_parallel dlogits assembled vs the fused op " + tag, cat_dl, r_dl, tol(dt));
      });
    }
  }
}

// ---- AdamW --------------------------------------------------------------------------

namespace {
ops::AdamWStep adamw_step(int64_t step) {
  ops::AdamWStep s{};
  s.lr = 1e-2f / float(step);  // a schedule changes lr between steps
  s.beta1 = 0.9f;
  s.beta2 = 0.95f;
  s.eps = 1e-8f;
  s.weight_decay = 0.1f;
  s.step = step;
  s.grad_scale = 0.5f;
  return s;
}
}  // namespace

TEST_CASE("gpu adamw_update: six steps in lockstep with the CPU", "[gpu][optim]") {
  // Parameters at init scale (0.02), so the updates (~lr) are a large part
  // of them and an error in the update is not hidden by the parameter.
  const int64_t n = 100005;
  run_case("adamw_update", [&] {
    std::vector<float> p = randn(static_cast<size_t>(n), seed(120), 0.02f),
                       m = zeros(static_cast<size_t>(n)), v = zeros(static_cast<size_t>(n));
    DeviceTensor d_p = upload(p, {n}, F32), d_m = upload(m, {n}, F32), d_v = upload(v, {n}, F32),
                 d_g({n}, F32);
    for (int64_t step = 1; step <= 6; ++step) {
      const ops::AdamWStep st = adamw_step(step);
      const std::vector<float> g = randn(static_cast<size_t>(n), seed(121 + uint64_t(step)), 0.1f);
      write(d_g, g);
      ops::adamw_update(d_p, d_g, d_m, d_v, st);
      sync("adamw_update");
      cpu::adamw_update(host(p, {n}), host(g, {n}), host(m, {n}), host(v, {n}), st);
      const std::string at = fmt(" step %lld n=%lld", (long long)step, (long long)n);
      compare("adamw_update param" + at, download(d_p), p, kTolF32);
      compare("adamw_update exp_avg" + at, download(d_m), m, kTolF32);
      compare("adamw_update exp_avg_sq" + at, download(d_v), v, kTolF32);
    }
  });
}

TEST_CASE("gpu adamw_update_master: fp32 master, param = master rounded to its dtype",
          "[gpu][optim]") {
  const int64_t n = 100005;
  struct Combo {
    DType param, grad;
    bool param_is_master;  // fp32 training: the F32 param is the master itself
  };
  const Combo combos[] = {{BF16, BF16, false},
                          {BF16, F32, false},
                          {F16, F16, false},
                          {F32, F32, false},
                          {F32, F32, true}};
  for (const Combo& c : combos) {
    const std::string tag = fmt("param %s grad %s%s n=%lld", dn(c.param), dn(c.grad),
                                c.param_is_master ? " (param is master)" : "", (long long)n);
    run_case(tag, [&] {
      std::vector<float> master = randn(static_cast<size_t>(n), seed(130), 0.02f),
                         m = zeros(static_cast<size_t>(n)), v = zeros(static_cast<size_t>(n));
      std::vector<float> p_cpu = rounded(c.param, master);  // the CPU twin's F32 "param" copy
      DeviceTensor d_p = upload(p_cpu, {n}, c.param), d_master = upload(master, {n}, F32),
                   d_m = upload(m, {n}, F32), d_v = upload(v, {n}, F32), d_g({n}, c.grad);
      const Tensor param = c.param_is_master ? d_master.t() : d_p.t();
      for (int64_t step = 1; step <= 6; ++step) {
        const ops::AdamWStep st = adamw_step(step);
        const std::vector<float> g =
            randn(static_cast<size_t>(n), seed(131 + uint64_t(step)), 0.1f, c.grad);
        write(d_g, g);
        ops::adamw_update_master(param, d_master, d_g, d_m, d_v, st);
        sync("adamw_update_master");
        cpu::adamw_update_master(host(p_cpu, {n}), host(master, {n}), host(g, {n}), host(m, {n}),
                                 host(v, {n}), st);
        const std::string at = fmt(" step %lld ", (long long)step) + tag;
        const std::vector<float> g_master = download(d_master);
        compare("adamw_update_master master" + at, g_master, master, kTolF32);
        compare("adamw_update_master exp_avg" + at, download(d_m), m, kTolF32);
        compare("adamw_update_master exp_avg_sq" + at, download(d_v), v, kTolF32);
        same_values("adamw_update_master param == round(master)" + at, download(param),
                    rounded(c.param, g_master));
      }
    });
  }
}

TEST_CASE("gpu adamw_update_master_multi: bit for bit the single-tensor update, list changes",
          "[gpu][optim]") {
  // Three tensors: a large BF16 one (many chunks), an odd-sized F16 one with
  // an F32 gradient, and an F32 parameter that is its own master; each with
  // its own weight decay. The reference is the single-tensor GPU op (tested
  // above against the CPU) on copies; step 3 passes a different list, which
  // must replace the cached device table of tensor pointers.
  struct Slot {
    int64_t n;
    DType param, grad;
    bool param_is_master;
    float wd;
  };
  const Slot slots[] = {{1000003, BF16, BF16, false, 0.1f},
                        {4099, F16, F32, false, 0.f},
                        {77, F32, F32, true, 0.05f}};
  run_case("adamw_update_master_multi", [&] {
    struct State {
      DeviceTensor p, master, m, v, g;
      Tensor param() const { return p.t().data ? p.t() : master.t(); }
    };
    std::vector<State> multi, single;
    for (size_t i = 0; i < 3; ++i) {
      const Slot& sl = slots[i];
      const std::vector<float> master = randn(static_cast<size_t>(sl.n), seed(140 + i), 0.02f);
      for (auto* set : {&multi, &single}) {
        State st{sl.param_is_master ? DeviceTensor()
                                    : upload(rounded(sl.param, master), {sl.n}, sl.param),
                 upload(master, {sl.n}, F32), upload(zeros(size_t(sl.n)), {sl.n}, F32),
                 upload(zeros(size_t(sl.n)), {sl.n}, F32), DeviceTensor({sl.n}, sl.grad)};
        set->push_back(std::move(st));
      }
    }
    const std::vector<std::vector<size_t>> lists = {{0, 1, 2}, {0, 1, 2}, {2, 0}};
    for (size_t li = 0; li < lists.size(); ++li) {
      const int64_t step = int64_t(li) + 1;
      const ops::AdamWStep st = adamw_step(step);
      std::vector<Tensor> ps, ws, gs, ms, vs;
      std::vector<float> wds;
      for (size_t i : lists[li]) {
        const std::vector<float> g =
            randn(static_cast<size_t>(slots[i].n), seed(150 + 10 * step + i), 0.1f, slots[i].grad);
        write(multi[i].g, g);
        write(single[i].g, g);
        ps.push_back(multi[i].param());
        ws.push_back(multi[i].master);
        gs.push_back(multi[i].g);
        ms.push_back(multi[i].m);
        vs.push_back(multi[i].v);
        wds.push_back(slots[i].wd);
        ops::AdamWStep one = st;
        one.weight_decay = slots[i].wd;
        ops::adamw_update_master(single[i].param(), single[i].master, single[i].g, single[i].m,
                                 single[i].v, one);
      }
      ops::adamw_update_master_multi(ps, ws, gs, ms, vs, wds, st);
      sync("adamw_update_master_multi");
      for (size_t i = 0; i < 3; ++i) {
        const std::string at = fmt(" tensor %zu (%s param, n=%lld) after step %lld", i,
                                   dn(slots[i].param), (long long)slots[i].n, (long long)step);
        const size_t ps_ = dtype_size(slots[i].param);
        same_bits("adamw_update_master_multi param" + at, download_bytes(multi[i].param()),
                  download_bytes(single[i].param()), ps_);
        same_bits("adamw_update_master_multi master" + at, download_bytes(multi[i].master),
                  download_bytes(single[i].master), 4);
        same_bits("adamw_update_master_multi exp_avg" + at, download_bytes(multi[i].m),
                  download_bytes(single[i].m), 4);
        same_bits("adamw_update_master_multi exp_avg_sq" + at, download_bytes(multi[i].v),
                  download_bytes(single[i].v), 4);
      }
    }
  });
}

// ---- MoE: router ------------------------------------------------------------------

namespace {

struct MoeShape {
  int64_t N, E, K;
};
// Mixtral-like, DeepSeek-like (many experts, K = 6), and top-1 (Switch).
const MoeShape kMoeShapes[] = {{1000, 8, 2}, {777, 64, 6}, {300, 16, 1}};

// Logits whose per-row ranking is never in doubt, even after BF16 rounding:
// a shuffled ladder with 0.8 between rungs plus noise of at most 0.1 (a BF16
// ulp is at most 0.25 below 64), so the top-k is decided by the data, not by
// rounding, and must match exactly.
std::vector<float> separated_logits(int64_t N, int64_t E, uint64_t s, DType dt) {
  std::mt19937_64 g(s);
  std::uniform_real_distribution<float> noise(-0.1f, 0.1f);
  std::vector<float> v(static_cast<size_t>(N * E));
  std::vector<int> rank(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    std::iota(rank.begin(), rank.end(), 0);
    std::shuffle(rank.begin(), rank.end(), g);
    for (int64_t e = 0; e < E; ++e)
      v[size_t(n * E + e)] = round_to(dt, 0.8f * float(rank[size_t(e)]) + noise(g));
  }
  return v;
}

// The GPU router's outputs, on the device and downloaded.
struct Routed {
  DeviceTensor probs, idx, w;
  std::vector<float> h_probs, h_w;
  std::vector<int32_t> h_idx;
};

Routed route_on_gpu(const DeviceTensor& logits, int64_t N, int64_t E, int64_t K, bool normalize) {
  Routed r{
      DeviceTensor({N, E}, F32), DeviceTensor({N, K}, I32), DeviceTensor({N, K}, F32), {}, {}, {}};
  poison(r.probs);
  poison(r.idx);
  poison(r.w);
  ops::moe_route_forward(r.probs, r.idx, r.w, logits, normalize);
  sync("moe_route_forward");
  r.h_probs = download(r.probs);
  r.h_w = download(r.w);
  r.h_idx = download_i32(r.idx);
  return r;
}

std::string moe_tag(DType dt, const MoeShape& sh, bool normalize) {
  return fmt("%s N=%lld E=%lld K=%lld%s", dn(dt), (long long)sh.N, (long long)sh.E, (long long)sh.K,
             normalize ? " normalized" : "");
}

}  // namespace

TEST_CASE(
    "gpu moe_route_forward: top-k indices exactly, probs and weights; ties to the lower index",
    "[gpu][moe]") {
  for (DType dt : kF32BF16)
    for (const MoeShape& sh : kMoeShapes)
      for (bool normalize : {false, true}) {
        const std::string tag = moe_tag(dt, sh, normalize);
        run_case(tag, [&] {
          const int64_t N = sh.N, E = sh.E, K = sh.K;
          const std::vector<float> logits = separated_logits(N, E, seed(140 + uint64_t(E)), dt);
          DeviceTensor d_logits = upload(logits, {N, E}, dt);
          const Routed r = route_on_gpu(d_logits, N, E, K, normalize);
          std::vector<float> probs(static_cast<size_t>(N * E)), w(static_cast<size_t>(N * K));
          std::vector<int32_t> idx(static_cast<size_t>(N * K));
          cpu::moe_route_forward(host(probs, {N, E}), host_i32(idx, {N, K}), host(w, {N, K}),
                                 host(logits, {N, E}), normalize);
          same_ints("moe_route_forward topk_idx " + tag, r.h_idx, idx);
          compare("moe_route_forward probs " + tag, r.h_probs, probs, kTolF32);
          compare("moe_route_forward topk_w " + tag, r.h_w, w, kTolF32);
        });
      }

  // Ties: small integer logits (exact in BF16) give equal probabilities
  // within a row, and the lower expert index must come first.
  for (DType dt : kF32BF16) {
    const int64_t N = 512, E = 8, K = 3;
    const std::string tag =
        fmt("ties %s N=%lld E=%lld K=%lld", dn(dt), (long long)N, (long long)E, (long long)K);
    run_case(tag, [&] {
      std::vector<int32_t> ints = rand_ints(static_cast<size_t>(N * E), seed(150), 0, 3);
      for (int64_t e = 0; e < E; ++e) ints[size_t(e)] = 0;  // row 0: all equal
      std::vector<float> logits(ints.begin(), ints.end());
      DeviceTensor d_logits = upload(logits, {N, E}, dt);
      const Routed r = route_on_gpu(d_logits, N, E, K, true);
      std::vector<float> probs(static_cast<size_t>(N * E)), w(static_cast<size_t>(N * K));
      std::vector<int32_t> idx(static_cast<size_t>(N * K));
      cpu::moe_route_forward(host(probs, {N, E}), host_i32(idx, {N, K}), host(w, {N, K}),
                             host(logits, {N, E}), true);
      same_ints("moe_route_forward topk_idx " + tag, r.h_idx, idx);
      compare("moe_route_forward topk_w " + tag, r.h_w, w, kTolF32);
    });
  }
}

TEST_CASE("gpu moe_router_stats and moe_aux_loss_forward", "[gpu][moe]") {
  for (DType dt : kF32BF16)
    for (const MoeShape& sh : kMoeShapes) {
      const std::string tag = moe_tag(dt, sh, true);
      run_case(tag, [&] {
        const int64_t N = sh.N, E = sh.E, K = sh.K;
        // Unseparated logits: the aux loss does not care about ties, and
        // uneven loads make it differ from its balanced value 1.
        DeviceTensor d_logits =
            upload(randn(static_cast<size_t>(N * E), seed(160 + uint64_t(E)), 2.f, dt), {N, E}, dt);
        const Routed r = route_on_gpu(d_logits, N, E, K, true);
        DeviceTensor aux({1}, F32), stats({2, E}, F32);
        poison(aux);
        poison(stats);
        ops::moe_router_stats(stats, r.probs, r.idx);
        ops::moe_aux_loss_forward(aux, stats, int(N), int(K));
        sync("moe_router_stats, moe_aux_loss_forward");
        std::vector<float> ref(1), ref_stats(static_cast<size_t>(2 * E));
        cpu::moe_router_stats(host(ref_stats, {2, E}), host(r.h_probs, {N, E}), host_i32(r.h_idx, {N, K}));
        cpu::moe_aux_loss_forward(host(ref, {1}), host(ref_stats, {2, E}), int(N), int(K));
        compare("moe_router_stats " + tag, download(stats), ref_stats, kTolF32);
        compare("moe_aux_loss_forward aux " + tag, download(aux), ref, kTolF32);
        // Statistics of twice the tokens (as summed over a cp group): the
        // loss and the router gradient's aux term read `tokens`, not N.
        ops::moe_aux_loss_forward(aux, stats, int(2 * N), int(K));
        cpu::moe_aux_loss_forward(host(ref, {1}), host(ref_stats, {2, E}), int(2 * N), int(K));
        compare("moe_aux_loss_forward aux, tokens 2N " + tag, download(aux), ref, kTolF32);
      });
    }
}

TEST_CASE("gpu moe_route_backward: normalize on/off, with and without the aux term, absent dtopk_w",
          "[gpu][moe]") {
  for (DType dt : kF32BF16)
    for (const MoeShape& sh : kMoeShapes)
      for (bool normalize : {false, true})
        for (float aux_grad : {0.f, 0.7f}) {
          const std::string tag =
              moe_tag(dt, sh, normalize) + fmt(" aux_grad=%.1f", double(aux_grad));
          run_case(tag, [&] {
            const int64_t N = sh.N, E = sh.E, K = sh.K;
            DeviceTensor d_logits =
                upload(separated_logits(N, E, seed(170 + uint64_t(E)), dt), {N, E}, dt);
            const Routed r = route_on_gpu(d_logits, N, E, K, normalize);
            const std::vector<float> dw = randn(static_cast<size_t>(N * K), seed(171), 1.f);
            DeviceTensor d_dw = upload(dw, {N, K}, F32), dl({N, E}, dt), stats({2, E}, F32);
            std::vector<float> h_stats(static_cast<size_t>(2 * E));
            cpu::moe_router_stats(host(h_stats, {2, E}), host(r.h_probs, {N, E}), host_i32(r.h_idx, {N, K}));
            // As if another rank's tokens had been added: tokens 2N, counts doubled.
            for (float& v : h_stats) v *= 2.f;
            stats = upload(h_stats, {2, E}, F32);
            const int tokens = int(2 * N);
            poison(dl);
            ops::moe_route_backward(dl, d_dw, r.probs, r.idx, r.w, normalize, aux_grad, stats, tokens);
            sync("moe_route_backward");
            std::vector<float> ref(static_cast<size_t>(N * E));
            cpu::moe_route_backward(host(ref, {N, E}), host(dw, {N, K}), host(r.h_probs, {N, E}),
                                    host_i32(r.h_idx, {N, K}), host(r.h_w, {N, K}), normalize,
                                    aux_grad, host(h_stats, {2, E}), tokens);
            compare("moe_route_backward dlogits " + tag, download(dl), ref, tol(dt));

            if (aux_grad != 0.f) {  // the aux path alone, dtopk_w absent
              poison(dl);
              ops::moe_route_backward(dl, Tensor(), r.probs, r.idx, r.w, normalize, aux_grad, stats, tokens);
              sync("moe_route_backward without dtopk_w");
              cpu::moe_route_backward(host(ref, {N, E}), Tensor(), host(r.h_probs, {N, E}),
                                      host_i32(r.h_idx, {N, K}), host(r.h_w, {N, K}), normalize,
                                      aux_grad, host(h_stats, {2, E}), tokens);
              compare("moe_route_backward dlogits, absent dtopk_w " + tag, download(dl), ref,
                      tol(dt));
            }
          });
        }
}

// ---- MoE: dispatch plan -------------------------------------------------------------

namespace {

// K distinct experts per token drawn with weights 2^(-e/2), expert `never`
// excluded: uneven loads, drops under a capacity, and an empty expert range.
std::vector<int32_t> skewed_topk(int64_t N, int64_t E, int64_t K, int64_t never, uint64_t s) {
  std::mt19937_64 g(s);
  std::vector<int32_t> idx(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> wt(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      wt[size_t(e)] = e == never ? 0.0 : std::pow(2.0, -double(e) / 2);
    for (int64_t k = 0; k < K; ++k) {
      std::discrete_distribution<int> d(wt.begin(), wt.end());
      const int e = d(g);
      idx[size_t(n * K + k)] = e;
      wt[size_t(e)] = 0.0;
    }
  }
  return idx;
}

// admitted: empty, or one entry per assignment (< 0: not admitted).
void plan_case(const std::string& name, const std::vector<int32_t>& idx, int64_t N, int64_t E,
               int64_t K, int capacity, std::vector<int32_t> admitted = {}) {
  const std::string tag = fmt("%s N=%lld E=%lld K=%lld capacity=%d%s", name.c_str(), (long long)N,
                              (long long)E, (long long)K, capacity, admitted.empty() ? "" : " admitted");
  run_case(tag, [&] {
    DeviceTensor d_idx = upload_i32(idx, {N, K}), row_map({N, K}, I32), offsets({E + 1}, I32), d_adm;
    if (!admitted.empty()) d_adm = upload_i32(admitted, {N, K});
    poison(row_map);
    poison(offsets);
    ops::moe_dispatch_plan(row_map, offsets, d_idx, int(E), capacity, admitted.empty() ? Tensor() : Tensor(d_adm));
    sync("moe_dispatch_plan");
    std::vector<int32_t> r_map(static_cast<size_t>(N * K)), r_off(static_cast<size_t>(E + 1));
    cpu::moe_dispatch_plan(host_i32(r_map, {N, K}), host_i32(r_off, {E + 1}), host_i32(idx, {N, K}),
                           int(E), capacity, admitted.empty() ? Tensor() : host_i32(admitted, {N, K}));
    same_ints("moe_dispatch_plan offsets " + tag, download_i32(offsets), r_off);
    same_ints("moe_dispatch_plan row_map " + tag, download_i32(row_map), r_map);
  });
}

}  // namespace

TEST_CASE("gpu moe_dispatch_plan equals the CPU plan exactly: capacity, dropless, empty experts",
          "[gpu][moe][plan]") {
  // The hand-worked case of tests/test_ops_moe.cpp.
  const std::vector<int32_t> hand = {0, 1, 0, 2, 0, 1, 1, 0, 2, 0, 1, 3};
  for (int cap : {0, 1, 2, 5}) plan_case("hand", hand, 6, 4, 2, cap);
  for (int cap : {0, 1}) plan_case("one token", {3, 1}, 1, 4, 2, cap);

  const std::vector<int32_t> skewed = skewed_topk(1000, 8, 2, 5, seed(180));
  for (int cap : {0, -1, 1, 40, 250, 100000})
    plan_case("skewed (expert 5 empty)", skewed, 1000, 8, 2, cap);

  // Many tokens and experts: scans and counters that span thread blocks.
  const std::vector<int32_t> big = skewed_topk(16384, 64, 6, 63, seed(181));
  for (int cap : {0, 1920}) plan_case("large skewed (expert 63 empty)", big, 16384, 64, 6, cap);
  // Admission decided elsewhere (a cp group's whole sequences): every third
  // assignment refused, with and without a capacity on top.
  std::vector<int32_t> every_third(big.size());
  for (size_t i = 0; i < every_third.size(); ++i) every_third[i] = i % 3 == 0 ? -1 : 0;
  for (int cap : {0, 1000}) plan_case("large skewed", big, 16384, 64, 6, cap, every_third);

  // From the CPU router on random logits.
  const int64_t N = 777, E = 64, K = 6;
  std::vector<float> logits = randn(static_cast<size_t>(N * E), seed(182), 2.f),
                     probs(static_cast<size_t>(N * E)), w(static_cast<size_t>(N * K));
  std::vector<int32_t> idx(static_cast<size_t>(N * K));
  cpu::moe_route_forward(host(probs, {N, E}), host_i32(idx, {N, K}), host(w, {N, K}),
                         host(logits, {N, E}), true);
  for (int cap : {0, 50}) plan_case("routed", idx, N, E, K, cap);
}

// ---- MoE: permute / unpermute -------------------------------------------------------

namespace {

// A routing and dispatch plan made by the CPU ops (the plan itself is tested
// above), uploaded for the data-movement ops.
struct HostPlan {
  int64_t N, E, K, kept = 0;
  std::vector<float> w;
  std::vector<int32_t> idx, row_map, offsets;
  HostPlan(int64_t N_, int64_t E_, int64_t K_, int capacity, uint64_t s) : N(N_), E(E_), K(K_) {
    std::vector<float> logits = randn(static_cast<size_t>(N * E), s, 2.f),
                       probs(static_cast<size_t>(N * E));
    w.resize(static_cast<size_t>(N * K));
    idx.resize(static_cast<size_t>(N * K));
    row_map.resize(static_cast<size_t>(N * K));
    offsets.resize(static_cast<size_t>(E + 1));
    cpu::moe_route_forward(host(probs, {N, E}), host_i32(idx, {N, K}), host(w, {N, K}),
                           host(logits, {N, E}), true);
    cpu::moe_dispatch_plan(host_i32(row_map, {N, K}), host_i32(offsets, {E + 1}),
                           host_i32(idx, {N, K}), int(E), capacity, {});
    kept = offsets[size_t(E)];
  }
};

}  // namespace

TEST_CASE("gpu moe_permute and moe_permute_backward (dx +=), with dropped assignments",
          "[gpu][moe]") {
  const int64_t N = 300, E = 8, K = 2, C = 256;
  for (DType dt : kF32BF16)
    for (int cap : {0, 20}) {
      const std::string tag = fmt("%s N=%lld E=%lld K=%lld C=%lld capacity=%d", dn(dt),
                                  (long long)N, (long long)E, (long long)K, (long long)C, cap);
      run_case(tag, [&] {
        const HostPlan plan(N, E, K, cap, seed(190));
        if (cap > 0) REQUIRE(plan.kept < N * K);
        const int64_t R = N * K;
        const std::vector<float> x = randn(static_cast<size_t>(N * C), seed(191), 1.f, dt);
        DeviceTensor d_x = upload(x, {N, C}, dt), d_map = upload_i32(plan.row_map, {N, K}),
                     xp({R, C}, dt);
        poison(xp);
        ops::moe_permute(xp, d_x, d_map);
        sync("moe_permute");
        std::vector<float> r_xp(static_cast<size_t>(R * C));
        cpu::moe_permute(host(r_xp, {R, C}), host(x, {N, C}), host_i32(plan.row_map, {N, K}));
        same_values(
            fmt("moe_permute (kept %lld of %lld) ", (long long)plan.kept, (long long)R) + tag,
            download(xp), r_xp);

        // Rows past the kept ones hold garbage here: the backward must not read them.
        const std::vector<float> dxp = randn(static_cast<size_t>(R * C), seed(192), 1.f, dt);
        const std::vector<float> dx0 = randn(static_cast<size_t>(N * C), seed(193), 1.f, dt);
        DeviceTensor d_dxp = upload(dxp, {R, C}, dt), d_dx = upload(dx0, {N, C}, dt);
        ops::moe_permute_backward(d_dx, d_dxp, d_map);
        sync("moe_permute_backward");
        std::vector<float> r_dx = dx0;
        cpu::moe_permute_backward(host(r_dx, {N, C}), host(dxp, {R, C}),
                                  host_i32(plan.row_map, {N, K}));
        compare("moe_permute_backward dx (+=) " + tag, download(d_dx), r_dx, tol(dt));
      });
    }
}

TEST_CASE("gpu moe_unpermute and moe_unpermute_backward, with dropped assignments", "[gpu][moe]") {
  const int64_t N = 300, E = 8, K = 2, C = 256;
  for (DType dt : kF32BF16)
    for (int cap : {0, 20}) {
      const std::string tag = fmt("%s N=%lld E=%lld K=%lld C=%lld capacity=%d", dn(dt),
                                  (long long)N, (long long)E, (long long)K, (long long)C, cap);
      run_case(tag, [&] {
        const HostPlan plan(N, E, K, cap, seed(200));
        const int64_t R = N * K;
        // Tokens with every choice dropped must come out as exact zeros.
        std::vector<int64_t> dropped_tokens;
        for (int64_t n = 0; n < N; ++n) {
          bool any = false;
          for (int64_t k = 0; k < K; ++k) any |= plan.row_map[size_t(n * K + k)] >= 0;
          if (!any) dropped_tokens.push_back(n);
        }
        if (cap > 0) REQUIRE(!dropped_tokens.empty());

        const std::vector<float> yp =
            randn(static_cast<size_t>(R * C), seed(201), 1.f, dt);  // garbage past kept rows
        DeviceTensor d_yp = upload(yp, {R, C}, dt), d_map = upload_i32(plan.row_map, {N, K}),
                     d_w = upload(plan.w, {N, K}, F32), y({N, C}, dt);
        poison(y);
        ops::moe_unpermute(y, d_yp, d_map, d_w);
        sync("moe_unpermute");
        std::vector<float> r_y(static_cast<size_t>(N * C));
        cpu::moe_unpermute(host(r_y, {N, C}), host(yp, {R, C}), host_i32(plan.row_map, {N, K}),
                           host(plan.w, {N, K}));
        const std::vector<float> g_y = download(y);
        compare(fmt("moe_unpermute (kept %lld of %lld) ", (long long)plan.kept, (long long)R) + tag,
                g_y, r_y, tol(dt));
        for (int64_t n : dropped_tokens)
          if (!all_zero(fmt("moe_unpermute fully dropped token %lld ", (long long)n) + tag, g_y,
                        size_t(n * C), size_t((n + 1) * C)))
            break;

        const std::vector<float> dy = randn(static_cast<size_t>(N * C), seed(202), 1.f, dt);
        DeviceTensor d_dy = upload(dy, {N, C}, dt), dyp({R, C}, dt), dw({N, K}, F32);
        poison(dyp);
        poison(dw);
        ops::moe_unpermute_backward(dyp, dw, d_dy, d_yp, d_map, d_w);
        sync("moe_unpermute_backward");
        std::vector<float> r_dyp(static_cast<size_t>(R * C)), r_dw(static_cast<size_t>(N * K));
        cpu::moe_unpermute_backward(host(r_dyp, {R, C}), host(r_dw, {N, K}), host(dy, {N, C}),
                                    host(yp, {R, C}), host_i32(plan.row_map, {N, K}),
                                    host(plan.w, {N, K}));
        const std::vector<float> g_dyp = download(dyp), g_dw = download(dw);
        compare("moe_unpermute_backward dyp " + tag, g_dyp, r_dyp, tol(dt));
        all_zero("moe_unpermute_backward dyp rows past the kept ones " + tag, g_dyp,
                 size_t(plan.kept * C), size_t(R * C));
        compare("moe_unpermute_backward dtopk_w " + tag, g_dw, r_dw, kTolF32);
        std::vector<float> g_dw_dropped;
        for (size_t i = 0; i < plan.row_map.size(); ++i)
          if (plan.row_map[i] < 0) g_dw_dropped.push_back(g_dw[i]);
        all_zero(fmt("moe_unpermute_backward dtopk_w of %zu dropped ", g_dw_dropped.size()) + tag,
                 g_dw_dropped, 0, g_dw_dropped.size());

        poison(dyp);
        ops::moe_unpermute_backward(dyp, Tensor(), d_dy, d_yp, d_map, d_w);
        sync("moe_unpermute_backward without dtopk_w");
        compare("moe_unpermute_backward dyp, absent dtopk_w " + tag, download(dyp), r_dyp, tol(dt));
      });
    }
}

// ---- MoE: grouped linear ------------------------------------------------------------

TEST_CASE("gpu grouped_linear forward and backward: empty experts, padding rows, absent outputs",
          "[gpu][moe]") {
  struct GroupCase {
    const char* name;
    std::vector<int32_t> counts;  // rows per expert
    int64_t R;                    // buffer rows; rows past the sum are padding
  };
  const GroupCase cases[] = {{"expert 2 empty, 41 padding rows", {37, 64, 0, 1, 100, 13}, 256},
                             {"first and last experts empty", {0, 50, 30, 0}, 80},
                             {"one expert", {128}, 128}};
  const int64_t IC = 256, OC = 192;
  for (DType dt : kAll)
    for (const GroupCase& gc : cases) {
      const int64_t E = int64_t(gc.counts.size()), R = gc.R;
      const std::string tag = fmt("%s %s E=%lld R=%lld IC=%lld OC=%lld", dn(dt), gc.name,
                                  (long long)E, (long long)R, (long long)IC, (long long)OC);
      run_case(tag, [&] {
        std::vector<int32_t> offsets(static_cast<size_t>(E + 1), 0);
        for (int64_t e = 0; e < E; ++e)
          offsets[size_t(e + 1)] = offsets[size_t(e)] + gc.counts[size_t(e)];
        const int64_t kept = offsets[size_t(E)];
        REQUIRE(kept <= R);
        const uint64_t s = seed(210 + uint64_t(R));
        const std::vector<float> inp =
            randn(static_cast<size_t>(R * IC), s, 1.f, dt);  // padding rows: garbage
        const std::vector<float> w =
            randn(static_cast<size_t>(E * OC * IC), s + 1, 1.f / std::sqrt(float(IC)), dt);
        DeviceTensor d_inp = upload(inp, {R, IC}, dt), d_w = upload(w, {E, OC, IC}, dt),
                     d_off = upload_i32(offsets, {E + 1}), out({R, OC}, dt);
        poison(out);
        ops::grouped_linear_forward(out, d_inp, d_w, d_off);
        sync("grouped_linear_forward");
        std::vector<float> r_out(static_cast<size_t>(R * OC));
        cpu::grouped_linear_forward(host(r_out, {R, OC}), host(inp, {R, IC}), host(w, {E, OC, IC}),
                                    host_i32(offsets, {E + 1}));
        const std::vector<float> g_out = download(out);
        compare("grouped_linear_forward " + tag, g_out, r_out, tol(dt));
        all_zero("grouped_linear_forward padding rows " + tag, g_out, size_t(kept * OC),
                 size_t(R * OC));

        const std::vector<float> dout =
            randn(static_cast<size_t>(R * OC), s + 2, 1.f, dt);  // padding rows: garbage
        const std::vector<float> dw0 = randn(static_cast<size_t>(E * OC * IC), s + 3, 8.f, dt);
        DeviceTensor d_dout = upload(dout, {R, OC}, dt), dinp({R, IC}, dt),
                     d_dw = upload(dw0, {E, OC, IC}, dt);
        poison(dinp);
        ops::grouped_linear_backward(dinp, d_dw, d_dout, d_inp, d_w, d_off);
        sync("grouped_linear_backward");
        std::vector<float> r_dinp(static_cast<size_t>(R * IC)), r_dw = dw0;
        cpu::grouped_linear_backward(host(r_dinp, {R, IC}), host(r_dw, {E, OC, IC}),
                                     host(dout, {R, OC}), host(inp, {R, IC}), host(w, {E, OC, IC}),
                                     host_i32(offsets, {E + 1}));
        const std::vector<float> g_dinp = download(dinp), g_dw = download(d_dw);
        compare("grouped_linear_backward dinp " + tag, g_dinp, r_dinp, tol(dt));
        all_zero("grouped_linear_backward dinp padding rows " + tag, g_dinp, size_t(kept * IC),
                 size_t(R * IC));
        compare("grouped_linear_backward dweight (+=) " + tag, g_dw, r_dw, tol(dt));
        for (int64_t e = 0; e < E; ++e)
          if (gc.counts[size_t(e)] == 0) {
            const size_t b = size_t(e * OC * IC), en = size_t((e + 1) * OC * IC);
            same_values(
                fmt("grouped_linear_backward empty expert %lld dweight unchanged ", (long long)e) +
                    tag,
                std::vector<float>(g_dw.begin() + long(b), g_dw.begin() + long(en)),
                std::vector<float>(dw0.begin() + long(b), dw0.begin() + long(en)));
          }

        // Absent dweight, then absent dinp: each alone gives the same values.
        poison(dinp);
        ops::grouped_linear_backward(dinp, Tensor(), d_dout, d_inp, d_w, d_off);
        sync("grouped_linear_backward without dweight");
        compare("grouped_linear_backward dinp, absent dweight " + tag, download(dinp), r_dinp,
                tol(dt));
        write(d_dw, dw0);
        ops::grouped_linear_backward(absent_cuda(), d_dw, d_dout, d_inp, d_w, d_off);
        sync("grouped_linear_backward without dinp");
        compare("grouped_linear_backward dweight, absent dinp " + tag, download(d_dw), r_dw,
                tol(dt));
      });
    }
}
