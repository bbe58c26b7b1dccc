// The CUDA ops of ring attention (context parallelism) against their CPU
// twins: attention_forward_pos, attention_merge, attention_backward_pos,
// rope_forward_pos / rope_backward_pos. Method as in test_gpu_ops.cpp
// (gpu_test_util.h): inputs rounded to the test dtype first and fed to both
// backends, outputs the op must write poisoned with NaN, one line per
// comparison.
//
// Tolerances (relative norm ||gpu - cpu|| / ||cpu||): F32 1e-4 (kTolRingF32:
// both sides are fp32, summing in different orders; the ring adds the
// merges and, backward, sums over cp blocks), BF16 kTolBF16 = 2e-2 (an
// output stored in bf16, and in the ring accumulated in bf16 once per step).
// lse is F32 on both sides: 1e-4 for every dtype, and an -inf lse (a row that
// sees no key) must be -inf on both sides, exactly.
//
// Lengths are multiples of no tile: zigzag chunks of 37 and 20 and 50 tokens
// (local sequences of 74, 40, 100 against the kernels' 32-row / 32-key tiles),
// and at every step of a ring with cp > 1 some query rows see no key of the
// block (fully masked rows).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/gpu/gpu_test_util.h"

using namespace trainer;
using namespace trainer::gputest;

namespace {

constexpr DType F32 = DType::F32, BF16 = DType::BF16;
using Shape = std::vector<int64_t>;

constexpr double kTolRingF32 = 1e-4;
constexpr double kTolLse = 1e-4;

double ring_tol(DType dt) { return dt == F32 ? kTolRingF32 : tol(dt); }

// Zigzag rank r of cp: chunks r and 2cp-1-r of `chunk` tokens, in that order.
std::vector<int32_t> zigzag(int64_t cp, int64_t r, int64_t chunk) {
  std::vector<int32_t> pos;
  for (const int64_t c : {r, 2 * cp - 1 - r})
    for (int64_t t = 0; t < chunk; ++t) pos.push_back(int32_t(c * chunk + t));
  return pos;
}

// Rows pos of each sequence of x [B, T, W] -> [B, |pos|, W].
std::vector<float> gather_rows(const std::vector<float>& x, int64_t B, int64_t T, int64_t W,
                               const std::vector<int32_t>& pos) {
  std::vector<float> r;
  for (int64_t b = 0; b < B; ++b)
    for (const int32_t p : pos) {
      const auto first = x.begin() + (b * T + p) * W;
      r.insert(r.end(), first, first + W);
    }
  return r;
}

// lse [B, H, T] at the positions pos -> [B, H, |pos|].
std::vector<float> gather_lse(const std::vector<float>& x, int64_t BH, int64_t T,
                              const std::vector<int32_t>& pos) {
  std::vector<float> r;
  for (int64_t bh = 0; bh < BH; ++bh)
    for (const int32_t p : pos) r.push_back(x[size_t(bh * T + p)]);
  return r;
}

// -inf where the CPU has -inf (exactly), the finite rest within kTolLse.
bool compare_lse(const std::string& label, const std::vector<float>& gpu,
                 const std::vector<float>& cpu) {
  size_t masked = 0, mismatched = 0;
  std::vector<float> g, c;
  for (size_t i = 0; i < std::min(gpu.size(), cpu.size()); ++i) {
    const bool gi = gpu[i] == -kInf, ci = cpu[i] == -kInf;
    masked += ci;
    if (gi != ci)
      ++mismatched;
    else if (!ci) {
      g.push_back(gpu[i]);
      c.push_back(cpu[i]);
    }
  }
  const bool ok = mismatched == 0 && gpu.size() == cpu.size();
  const std::string line = fmt("[gpu] %-64s -inf rows %zu of %zu, %zu mismatched %s",
                               (label + " (-inf)").c_str(), masked, cpu.size(), mismatched,
                               ok ? "ok" : "FAIL");
  std::printf("%s\n", line.c_str());
  INFO(line);
  CHECK(ok);
  bool fin = true;
  if (!c.empty()) fin = compare(label, g, c, kTolLse);
  return ok && fin;
}

std::vector<float> plus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] + b[i];
  return r;
}

struct RingShape {
  int64_t cp, B, Hq, Hkv, D, chunk;
  int64_t window = 0;  // sliding window (0: none), on every op and the whole-sequence reference
  // Separate documents: each batch row's document lengths over the whole
  // sequence (empty: none); each rank passes its rows' starts (q_doc_start).
  std::vector<std::vector<int32_t>> docs = {};
};

// "20,50|148": the tag's spelling of the document lengths.
std::string docs_name(const std::vector<std::vector<int32_t>>& lengths) {
  std::string s;
  for (const std::vector<int32_t>& row : lengths) {
    if (!s.empty()) s += "|";
    for (size_t i = 0; i < row.size(); ++i) {
      if (i) s += ",";
      s += std::to_string(row[i]);
    }
  }
  return s;
}

// The whole ring on the GPU and on the CPU, op by op, then the GPU ring
// against causal attention of the whole sequence (CPU).
void ring_case(DType dt, const RingShape& sh) {
  const std::string tag =
      fmt("%s cp=%lld B=%lld Hq=%lld Hkv=%lld D=%lld chunk=%lld", dn(dt), (long long)sh.cp,
          (long long)sh.B, (long long)sh.Hq, (long long)sh.Hkv, (long long)sh.D,
          (long long)sh.chunk) +
      (sh.window > 0 ? fmt(" window=%lld", (long long)sh.window) : std::string()) +
      (sh.docs.empty() ? std::string() : " docs=" + docs_name(sh.docs));
  run_case("ring " + tag, [&] {
    const int64_t cp = sh.cp, B = sh.B, Hq = sh.Hq, Hkv = sh.Hkv, D = sh.D;
    const int64_t T = 2 * cp * sh.chunk, Tl = 2 * sh.chunk, WQ = Hq * D, WK = Hkv * D;
    const Shape qs{B, Tl, Hq, D}, ks{B, Tl, Hkv, D}, ls{B, Hq, Tl}, ps{Tl};
    const uint64_t s = seed(4000 + uint64_t(cp * 100 + sh.chunk + D + Hq + sh.window * 7));
    const std::vector<float> q = randn(size_t(B * T * WQ), s, 1.f, dt),
                             k = randn(size_t(B * T * WK), s + 1, 1.f, dt),
                             v = randn(size_t(B * T * WK), s + 2, 1.f, dt),
                             dout = randn(size_t(B * T * WQ), s + 3, 1.f, dt);
    // The whole sequence's document starts ([B, T]) and each rank's rows'.
    const std::vector<int32_t> docs = sh.docs.empty() ? std::vector<int32_t>{} : doc_starts(sh.docs, T);
    const Tensor whole_docs = docs.empty() ? Tensor{} : host_i32(docs, {B, T});

    struct Rank {
      std::vector<int32_t> pos, doc;
      std::vector<float> q, k, v, dout;            // host, rounded to dt
      std::vector<float> c_out, c_lse;              // CPU running result
      DeviceTensor d_pos, d_doc, d_q, d_k, d_v, d_dout, g_out, g_lse;
      Tensor g_doc() const { return doc.empty() ? Tensor{} : Tensor(d_doc); }
      Tensor c_doc(int64_t B) const {
        return doc.empty() ? Tensor{} : host_i32(doc, {B, int64_t(pos.size())});
      }
    };
    std::vector<Rank> ranks(static_cast<size_t>(cp));
    for (int64_t r = 0; r < cp; ++r) {
      Rank& rk = ranks[size_t(r)];
      rk.pos = zigzag(cp, r, sh.chunk);
      rk.q = gather_rows(q, B, T, WQ, rk.pos);
      rk.k = gather_rows(k, B, T, WK, rk.pos);
      rk.v = gather_rows(v, B, T, WK, rk.pos);
      rk.dout = gather_rows(dout, B, T, WQ, rk.pos);
      rk.c_out.assign(rk.q.size(), 0.f);
      rk.c_lse.assign(size_t(B * Hq * Tl), -kInf);
      rk.d_pos = upload_i32(rk.pos, ps);
      if (!docs.empty()) {
        for (int64_t b = 0; b < B; ++b)
          for (const int32_t p : rk.pos) rk.doc.push_back(docs[size_t(b * T + p)]);
        rk.d_doc = upload_i32(rk.doc, {B, Tl});
      }
      rk.d_q = upload(rk.q, qs, dt);
      rk.d_k = upload(rk.k, ks, dt);
      rk.d_v = upload(rk.v, ks, dt);
      rk.d_dout = upload(rk.dout, qs, dt);
      rk.g_out = upload(rk.c_out, qs, dt);
      rk.g_lse = upload(rk.c_lse, ls, F32);
    }

    // Forward ring: each partial, then each merge, on both backends.
    DeviceTensor part_out(qs, dt), part_lse(ls, F32);
    std::vector<float> c_part(size_t(numel_of(qs))), c_plse(size_t(numel_of(ls)));
    for (int64_t st = 0; st < cp; ++st)
      for (int64_t r = 0; r < cp; ++r) {
        Rank& rk = ranks[size_t(r)];
        Rank& src = ranks[size_t((r - st + cp) % cp)];
        const std::string step = fmt(" step %lld rank %lld", (long long)st, (long long)r);
        poison(part_out);
        poison(part_lse);
        ops::attention_forward_pos(part_out, part_lse, rk.d_q, src.d_k, src.d_v, rk.d_pos,
                                   src.d_pos, sh.window, rk.g_doc());
        sync("attention_forward_pos " + tag + step);
        cpu::attention_forward_pos(host(c_part, qs), host(c_plse, ls), host(rk.q, qs),
                                   host(src.k, ks), host(src.v, ks), host_i32(rk.pos, ps),
                                   host_i32(src.pos, ps), sh.window, rk.c_doc(B));
        compare("attention_forward_pos out " + tag + step, download(part_out), c_part,
                ring_tol(dt));
        compare_lse("attention_forward_pos lse " + tag + step, download(part_lse), c_plse);

        // Both merges take the CPU's partial (rounded to dt, as the GPU
        // stores it), so they compare the merge only.
        c_part = rounded(dt, c_part);
        write(part_out, c_part);
        write(part_lse, c_plse);
        ops::attention_merge(rk.g_out, rk.g_lse, part_out, part_lse);
        sync("attention_merge " + tag + step);
        cpu::attention_merge(host(rk.c_out, qs), host(rk.c_lse, ls), host(c_part, qs),
                             host(c_plse, ls));
      }
    // The merged results, and the GPU's against the whole sequence's attention.
    std::vector<float> ref_out(q.size()), ref_lse(size_t(B * Hq * T));
    cpu::attention_forward(host(ref_out, {B, T, Hq, D}), host(ref_lse, {B, Hq, T}),
                           host(q, {B, T, Hq, D}), host(k, {B, T, Hkv, D}), host(v, {B, T, Hkv, D}),
                           true, sh.window, whole_docs);
    for (int64_t r = 0; r < cp; ++r) {
      Rank& rk = ranks[size_t(r)];
      const std::string who = fmt(" rank %lld", (long long)r);
      const std::vector<float> g_out = download(rk.g_out), g_lse = download(rk.g_lse);
      compare("attention_merge out " + tag + who, g_out, rk.c_out, ring_tol(dt));
      compare_lse("attention_merge lse " + tag + who, g_lse, rk.c_lse);
      compare("ring out vs whole causal attention " + tag + who, g_out,
              gather_rows(ref_out, B, T, WQ, rk.pos), ring_tol(dt));
      compare_lse("ring lse vs whole causal attention " + tag + who, g_lse,
                  gather_lse(ref_lse, B * Hq, T, rk.pos));
    }

    // Backward ring from the CPU's final out (rounded to dt) and lse, so both
    // backends read the same; accumulators start at random values (+=).
    const size_t n_ranks = static_cast<size_t>(cp);
    std::vector<std::vector<float>> c_dq(n_ranks), c_dk(n_ranks), c_dv(n_ranks);
    std::vector<std::vector<float>> init_dq(n_ranks), init_dk(n_ranks), init_dv(n_ranks);
    std::vector<DeviceTensor> g_dq, g_dk, g_dv, d_out_final, d_lse_final;
    for (int64_t r = 0; r < cp; ++r) {
      Rank& rk = ranks[size_t(r)];
      rk.c_out = rounded(dt, rk.c_out);
      init_dq[size_t(r)] = randn(rk.q.size(), s + 10 + uint64_t(r), 0.1f, dt);
      init_dk[size_t(r)] = randn(rk.k.size(), s + 20 + uint64_t(r), 0.1f, dt);
      init_dv[size_t(r)] = randn(rk.v.size(), s + 30 + uint64_t(r), 0.1f, dt);
      c_dq[size_t(r)] = init_dq[size_t(r)];
      c_dk[size_t(r)] = init_dk[size_t(r)];
      c_dv[size_t(r)] = init_dv[size_t(r)];
      g_dq.push_back(upload(init_dq[size_t(r)], qs, dt));
      g_dk.push_back(upload(init_dk[size_t(r)], ks, dt));
      g_dv.push_back(upload(init_dv[size_t(r)], ks, dt));
      d_out_final.push_back(upload(rk.c_out, qs, dt));
      d_lse_final.push_back(upload(rk.c_lse, ls, F32));
    }
    for (int64_t st = 0; st < cp; ++st)
      for (int64_t r = 0; r < cp; ++r) {
        Rank& rk = ranks[size_t(r)];
        const int64_t o = (r - st + cp) % cp;
        Rank& src = ranks[size_t(o)];
        ops::attention_backward_pos(g_dq[size_t(r)], g_dk[size_t(o)], g_dv[size_t(o)], rk.d_dout,
                                    rk.d_q, src.d_k, src.d_v, d_out_final[size_t(r)],
                                    d_lse_final[size_t(r)], rk.d_pos, src.d_pos, sh.window, rk.g_doc());
        sync("attention_backward_pos " + tag +
             fmt(" step %lld rank %lld", (long long)st, (long long)r));
        cpu::attention_backward_pos(host(c_dq[size_t(r)], qs), host(c_dk[size_t(o)], ks),
                                    host(c_dv[size_t(o)], ks), host(rk.dout, qs), host(rk.q, qs),
                                    host(src.k, ks), host(src.v, ks), host(rk.c_out, qs),
                                    host(rk.c_lse, ls), host_i32(rk.pos, ps),
                                    host_i32(src.pos, ps), sh.window, rk.c_doc(B));
      }
    std::vector<float> ref_dq(q.size()), ref_dk(k.size()), ref_dv(v.size());
    cpu::attention_backward(host(ref_dq, {B, T, Hq, D}), host(ref_dk, {B, T, Hkv, D}),
                            host(ref_dv, {B, T, Hkv, D}), host(dout, {B, T, Hq, D}),
                            host(q, {B, T, Hq, D}), host(k, {B, T, Hkv, D}),
                            host(v, {B, T, Hkv, D}), host(ref_out, {B, T, Hq, D}),
                            host(ref_lse, {B, Hq, T}), true, sh.window, whole_docs);
    for (int64_t r = 0; r < cp; ++r) {
      Rank& rk = ranks[size_t(r)];
      const std::string who = fmt(" rank %lld", (long long)r);
      const std::vector<float> g1 = download(g_dq[size_t(r)]), g2 = download(g_dk[size_t(r)]),
                               g3 = download(g_dv[size_t(r)]);
      compare("attention_backward_pos dq (+=) " + tag + who, g1, c_dq[size_t(r)], ring_tol(dt));
      compare("attention_backward_pos dk (+=) " + tag + who, g2, c_dk[size_t(r)], ring_tol(dt));
      compare("attention_backward_pos dv (+=) " + tag + who, g3, c_dv[size_t(r)], ring_tol(dt));
      compare("ring dq vs whole causal attention_backward " + tag + who, g1,
              plus(init_dq[size_t(r)], gather_rows(ref_dq, B, T, WQ, rk.pos)), ring_tol(dt));
      compare("ring dk vs whole causal attention_backward " + tag + who, g2,
              plus(init_dk[size_t(r)], gather_rows(ref_dk, B, T, WK, rk.pos)), ring_tol(dt));
      compare("ring dv vs whole causal attention_backward " + tag + who, g3,
              plus(init_dv[size_t(r)], gather_rows(ref_dv, B, T, WK, rk.pos)), ring_tol(dt));
    }
  });
}

}  // namespace

TEST_CASE("gpu ring attention F32: zigzag cp 2/3/4, GQA, tile-unaligned chunks, masked rows",
          "[gpu][cp]") {
  ring_case(F32, {2, 2, 4, 2, 64, 37});
  ring_case(F32, {3, 1, 2, 2, 128, 20});
  ring_case(F32, {4, 1, 8, 2, 64, 50});
  ring_case(F32, {2, 1, 4, 2, 32, 37});
}

TEST_CASE("gpu ring attention with a sliding window: F32 and BF16, windows inside a chunk and across chunks",
          "[gpu][cp][window]") {
  // Chunks of 37 and 50: a window of 5 skips whole 32 x 32 tiles by distance
  // (and leaves far chunk pairs with no visible key at all), 40 and 90
  // reach into the neighbouring chunks.
  for (DType dt : {F32, BF16}) {
    ring_case(dt, {2, 2, 4, 2, 64, 37, 5});
    ring_case(dt, {4, 1, 8, 2, 128, 50, 40});
    ring_case(dt, {2, 1, 4, 2, 64, 37, 90});
  }
}

// Separate documents (q_doc_start): a rank's rows see no key before their
// document's start, so whole blocks go unseen by rows whose document starts
// after them (fully masked rows, -inf partials, and 32 x 32 tiles skipped
// by the rows' lowest visible position) and the ring must still sum to the
// whole sequence's attention_forward / attention_backward with doc_start.
// cp 2, chunk 37 (T 148, ranks at 0..36 + 111..147 and 37..110): documents
// start at 20, 70 (inside rank 1's rows) and 110 (rank 0's second chunk sees
// one key of rank 1's block); the second batch row is one document. cp 3,
// chunk 20 (T 120): a document of one token at 40, starts at 7, 41 and 80
// (a chunk edge), with a window of 30 as well. The kernels compute in fp32
// whatever the storage, so BF16 (its loads and stores) runs the smaller ring
// only: the emulated device's time.
TEST_CASE("gpu ring attention with separate documents: F32 and BF16 zigzag cp 2 and 3 with windows and GQA",
          "[gpu][cp][documents]") {
  ring_case(F32, {2, 2, 2, 1, 64, 37, 0, {{20, 50, 40, 38}, {148}}});
  for (DType dt : {F32, BF16}) ring_case(dt, {3, 1, 4, 2, 32, 20, 30, {{7, 33, 1, 39, 40}}});
  // Identity positions: the positions kernels with q_doc_start against the
  // GPU's own attention_forward with doc_start (the MMA path for BF16).
  for (DType dt : {F32, BF16}) {
    const int64_t B = 2, T = 100, Hq = 4, Hkv = 2, D = 64;
    const std::string tag = fmt("%s identity documents B=%lld T=%lld Hq=%lld Hkv=%lld D=%lld", dn(dt),
                                (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)D);
    run_case(tag, [&] {
      const Shape qs{B, T, Hq, D}, ks{B, T, Hkv, D}, ls{B, Hq, T};
      const uint64_t s = seed(4650);
      std::vector<int32_t> pos(static_cast<size_t>(T));
      std::iota(pos.begin(), pos.end(), 0);
      const std::vector<int32_t> docs = doc_starts({{5, 27, 32, 36}, {64, 36}}, T);
      DeviceTensor d_q = upload(randn(size_t(numel_of(qs)), s, 1.f, dt), qs, dt),
                   d_k = upload(randn(size_t(numel_of(ks)), s + 1, 1.f, dt), ks, dt),
                   d_v = upload(randn(size_t(numel_of(ks)), s + 2, 1.f, dt), ks, dt),
                   d_pos = upload_i32(pos, {T}), d_docs = upload_i32(docs, {B, T}), out(qs, dt),
                   lse(ls, F32), out_p(qs, dt), lse_p(ls, F32);
      poison(out_p);
      poison(lse_p);
      ops::attention_forward(out, lse, d_q, d_k, d_v, true, 0, d_docs);
      ops::attention_forward_pos(out_p, lse_p, d_q, d_k, d_v, d_pos, d_pos, 0, d_docs);
      sync("attention_forward / attention_forward_pos with documents " + tag);
      compare("attention_forward_pos out vs attention_forward " + tag, download(out_p), download(out),
              ring_tol(dt));
      compare_lse("attention_forward_pos lse vs attention_forward " + tag, download(lse_p),
                  download(lse));
    });
  }
}

TEST_CASE("gpu ring attention BF16: zigzag cp 2/3, GQA, tile-unaligned chunks, masked rows",
          "[gpu][cp]") {
  ring_case(BF16, {2, 2, 4, 2, 64, 37});
  ring_case(BF16, {3, 1, 2, 2, 128, 20});
  ring_case(BF16, {2, 1, 4, 2, 32, 37});
}

// Scattered positions: holes among a row's visible keys, Tq != Tk, rows that
// see nothing and keys nobody sees; and identity positions against the GPU's
// own attention_forward(causal).
TEST_CASE("gpu attention_forward_pos / attention_backward_pos at scattered and identity positions",
          "[gpu][cp]") {
  for (DType dt : {F32, BF16}) {
    const int64_t B = 2, Tq = 45, Tk = 70, Hq = 4, Hkv = 2, D = 64;
    const std::string tag = fmt("%s scattered B=%lld Tq=%lld Tk=%lld Hq=%lld Hkv=%lld D=%lld",
                                dn(dt), (long long)B, (long long)Tq, (long long)Tk, (long long)Hq,
                                (long long)Hkv, (long long)D);
    run_case(tag, [&] {
      const Shape qs{B, Tq, Hq, D}, ks{B, Tk, Hkv, D}, ls{B, Hq, Tq};
      const uint64_t s = seed(4500);
      const std::vector<float> q = randn(size_t(numel_of(qs)), s, 1.f, dt),
                               k = randn(size_t(numel_of(ks)), s + 1, 1.f, dt),
                               v = randn(size_t(numel_of(ks)), s + 2, 1.f, dt),
                               dout = randn(size_t(numel_of(qs)), s + 3, 1.f, dt);
      // Positions in [0, 100): about a third of the query rows see nothing
      // below position 30 of the keys, drawn from [30, 130).
      std::vector<int32_t> qpos = rand_ints(size_t(Tq), s + 4, 0, 100),
                           kpos = rand_ints(size_t(Tk), s + 5, 30, 130);
      DeviceTensor d_q = upload(q, qs, dt), d_k = upload(k, ks, dt), d_v = upload(v, ks, dt),
                   d_dout = upload(dout, qs, dt), d_qpos = upload_i32(qpos, {Tq}),
                   d_kpos = upload_i32(kpos, {Tk}), out(qs, dt), lse(ls, F32);
      poison(out);
      poison(lse);
      ops::attention_forward_pos(out, lse, d_q, d_k, d_v, d_qpos, d_kpos, 0, Tensor{});
      sync("attention_forward_pos " + tag);
      std::vector<float> c_out(q.size()), c_lse(size_t(numel_of(ls)));
      cpu::attention_forward_pos(host(c_out, qs), host(c_lse, ls), host(q, qs), host(k, ks),
                                 host(v, ks), host_i32(qpos, {Tq}), host_i32(kpos, {Tk}), 0, Tensor{});
      const std::vector<float> g_out = download(out);
      compare("attention_forward_pos out " + tag, g_out, c_out, ring_tol(dt));
      compare_lse("attention_forward_pos lse " + tag, download(lse), c_lse);
      // A row that sees nothing is exactly 0.
      std::vector<float> g_masked, c_masked;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < Tq; ++i)
          for (int64_t h = 0; h < Hq; ++h)
            if (c_lse[size_t((b * Hq + h) * Tq + i)] == -kInf)
              for (int64_t d = 0; d < D; ++d)
                g_masked.push_back(g_out[size_t(((b * Tq + i) * Hq + h) * D + d)]);
      all_zero("attention_forward_pos masked rows are 0 " + tag, g_masked, 0, g_masked.size());
      CHECK(!g_masked.empty());

      // Backward with the CPU's out (rounded) and lse, into nonzero buffers.
      const std::vector<float> r_out = rounded(dt, c_out);
      const std::vector<float> dq0 = randn(q.size(), s + 6, 0.1f, dt),
                               dk0 = randn(k.size(), s + 7, 0.1f, dt),
                               dv0 = randn(v.size(), s + 8, 0.1f, dt);
      DeviceTensor d_out = upload(r_out, qs, dt), d_lse = upload(c_lse, ls, F32),
                   dq = upload(dq0, qs, dt), dk = upload(dk0, ks, dt), dv = upload(dv0, ks, dt);
      ops::attention_backward_pos(dq, dk, dv, d_dout, d_q, d_k, d_v, d_out, d_lse, d_qpos, d_kpos, 0,
                                  Tensor{});
      sync("attention_backward_pos " + tag);
      std::vector<float> c_dq = dq0, c_dk = dk0, c_dv = dv0;
      cpu::attention_backward_pos(host(c_dq, qs), host(c_dk, ks), host(c_dv, ks), host(dout, qs),
                                  host(q, qs), host(k, ks), host(v, ks), host(r_out, qs),
                                  host(c_lse, ls), host_i32(qpos, {Tq}), host_i32(kpos, {Tk}), 0,
                                  Tensor{});
      compare("attention_backward_pos dq (+=) " + tag, download(dq), c_dq, ring_tol(dt));
      compare("attention_backward_pos dk (+=) " + tag, download(dk), c_dk, ring_tol(dt));
      compare("attention_backward_pos dv (+=) " + tag, download(dv), c_dv, ring_tol(dt));
    });

    // Identity positions: the GPU's attention_forward(causal), a different
    // kernel (the MMA path for BF16), within the tolerance.
    const int64_t T = 100;
    const std::string itag = fmt("%s identity B=1 T=%lld Hq=4 Hkv=2 D=128", dn(dt), (long long)T);
    run_case(itag, [&] {
      const Shape qs{1, T, 4, 128}, ks{1, T, 2, 128}, ls{1, 4, T};
      const uint64_t s = seed(4600);
      std::vector<int32_t> pos(static_cast<size_t>(T));
      std::iota(pos.begin(), pos.end(), 0);
      DeviceTensor d_q = upload(randn(size_t(numel_of(qs)), s, 1.f, dt), qs, dt),
                   d_k = upload(randn(size_t(numel_of(ks)), s + 1, 1.f, dt), ks, dt),
                   d_v = upload(randn(size_t(numel_of(ks)), s + 2, 1.f, dt), ks, dt),
                   d_pos = upload_i32(pos, {T}), out(qs, dt), lse(ls, F32), out_p(qs, dt),
                   lse_p(ls, F32);
      poison(out_p);
      poison(lse_p);
      ops::attention_forward(out, lse, d_q, d_k, d_v, true, 0, Tensor{});
      ops::attention_forward_pos(out_p, lse_p, d_q, d_k, d_v, d_pos, d_pos, 0, Tensor{});
      sync("attention_forward / attention_forward_pos " + itag);
      compare("attention_forward_pos out vs attention_forward causal " + itag, download(out_p),
              download(out), ring_tol(dt));
      compare_lse("attention_forward_pos lse vs attention_forward causal " + itag, download(lse_p),
                  download(lse));
    });
  }
}

TEST_CASE("gpu attention_merge: -inf on either or both sides, NaN, against the CPU", "[gpu][cp]") {
  for (DType dt : {F32, BF16}) {
    const int64_t B = 2, T = 37, H = 3, D = 64;
    const std::string tag = fmt("%s B=%lld T=%lld H=%lld D=%lld", dn(dt), (long long)B,
                                (long long)T, (long long)H, (long long)D);
    run_case("attention_merge " + tag, [&] {
      const Shape os{B, T, H, D}, ls{B, H, T};
      const uint64_t s = seed(4700);
      std::vector<float> out = randn(size_t(numel_of(os)), s, 1.f, dt),
                         part = randn(size_t(numel_of(os)), s + 1, 1.f, dt),
                         lse = randn(size_t(numel_of(ls)), s + 2, 2.f),
                         plse = randn(size_t(numel_of(ls)), s + 3, 2.f);
      // Row kinds by t % 5: both -inf, running -inf (the first merge), part
      // -inf, both finite, both finite; one NaN row.
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t t = 0; t < T; ++t) {
            const size_t li = size_t((b * H + h) * T + t);
            const int kind = int(t % 5);
            if (kind == 0 || kind == 1) {
              lse[li] = -kInf;
              for (int64_t d = 0; d < D; ++d) out[size_t(((b * T + t) * H + h) * D + d)] = 0.f;
            }
            if (kind == 0 || kind == 2) plse[li] = -kInf;
          }
      plse[size_t(3)] = kNaN;  // b 0, h 0, t 3
      DeviceTensor d_out = upload(out, os, dt), d_lse = upload(lse, ls, F32),
                   d_part = upload(part, os, dt), d_plse = upload(plse, ls, F32);
      ops::attention_merge(d_out, d_lse, d_part, d_plse);
      sync("attention_merge " + tag);
      std::vector<float> c_out = out, c_lse = lse;
      cpu::attention_merge(host(c_out, os), host(c_lse, ls), host(part, os), host(plse, ls));
      std::vector<float> g_out = download(d_out), g_lse = download(d_lse);
      // The NaN row: NaN on both sides; then left out of the comparisons.
      bool nan_row = std::isnan(g_lse[3]) && std::isnan(c_lse[3]);
      for (int64_t d = 0; d < D; ++d) {
        const size_t oi = size_t(3 * H * D + d);  // b 0, t 3, h 0
        nan_row = nan_row && std::isnan(g_out[oi]) && std::isnan(c_out[oi]);
        g_out[oi] = c_out[oi] = 0.f;
      }
      g_lse[3] = c_lse[3] = 0.f;
      std::printf("[gpu] %-64s NaN row stays NaN %s\n", ("attention_merge " + tag).c_str(),
                  nan_row ? "ok" : "FAIL");
      CHECK(nan_row);
      compare("attention_merge out " + tag, g_out, c_out, ring_tol(dt));
      compare_lse("attention_merge lse " + tag, g_lse, c_lse);
      // Both -inf: out exactly 0; running -inf: out is the part, exactly.
      std::vector<float> both, first, first_want;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t d = 0; d < D; ++d) {
              const size_t oi = size_t(((b * T + t) * H + h) * D + d);
              if (t % 5 == 0) both.push_back(g_out[oi]);
              if (t % 5 == 1) {
                first.push_back(g_out[oi]);
                first_want.push_back(part[oi]);
              }
            }
      all_zero("attention_merge both -inf: out 0 " + tag, both, 0, both.size());
      same_values("attention_merge into -inf copies the part " + tag, first, first_want);
    });
  }
}

TEST_CASE("gpu rope_forward_pos / rope_backward_pos: CPU twin, rope at an offset and the zigzag "
          "chunks bit for bit",
          "[gpu][cp]") {
  const int64_t B = 2, H = 4, D = 128, cp = 2, chunk = 37, T = 2 * cp * chunk;
  // Plain RoPE and Llama 3.1's scaling (the frequencies both tables read).
  ops::Rope llama31(5e5f);
  llama31.scaling = ops::RopeScaling::Llama3;
  llama31.factor = 8.0;
  llama31.original_max_pos = 8192.0;
  for (const ops::Rope& theta : {ops::Rope(5e5f), llama31})
  for (DType dt : {F32, BF16}) {
    const std::string tag = fmt("%s B=%lld T=%lld H=%lld D=%lld theta=%g scaling=%s", dn(dt), (long long)B,
                                (long long)T, (long long)H, (long long)D, double(theta.theta),
                                ops::rope_scaling_name(theta.scaling));
    run_case("rope_pos " + tag, [&] {
      const Shape whole_shape{B, T, H, D};
      const std::vector<float> whole = randn(size_t(numel_of(whole_shape)), seed(4800), 1.f, dt);
      DeviceTensor d_whole = upload(whole, whole_shape, dt), whole_out(whole_shape, dt),
                   whole_bwd(whole_shape, dt);
      ops::rope_forward(whole_out, d_whole, theta, 0);
      ops::rope_backward(whole_bwd, d_whole, theta, 0);
      sync("rope_forward / rope_backward of the whole " + tag);
      const std::vector<float> g_whole_out = download(whole_out), g_whole_bwd = download(whole_bwd);
      for (int64_t r = 0; r < cp; ++r) {
        const std::string who = fmt(" rank %lld", (long long)r);
        const std::vector<int32_t> pos = zigzag(cp, r, chunk);
        const int64_t Tl = int64_t(pos.size());
        const Shape ls{B, Tl, H, D};
        const std::vector<float> local = gather_rows(whole, B, T, H * D, pos);
        DeviceTensor d_local = upload(local, ls, dt), d_pos = upload_i32(pos, {Tl}), out(ls, dt),
                     dx(ls, dt);
        poison(out);
        poison(dx);
        ops::rope_forward_pos(out, d_local, theta, d_pos);
        ops::rope_backward_pos(dx, d_local, theta, d_pos);
        sync("rope_forward_pos / rope_backward_pos " + tag + who);
        std::vector<float> c_out(local.size()), c_dx(local.size());
        cpu::rope_forward_pos(host(c_out, ls), host(local, ls), theta, host_i32(pos, {Tl}));
        cpu::rope_backward_pos(host(c_dx, ls), host(local, ls), theta, host_i32(pos, {Tl}));
        const std::vector<float> g_out = download(out), g_dx = download(dx);
        compare("rope_forward_pos " + tag + who, g_out, c_out, tol(dt));
        compare("rope_backward_pos " + tag + who, g_dx, c_dx, tol(dt));
        same_values("rope_forward_pos = the whole's positions " + tag + who, g_out,
                    gather_rows(g_whole_out, B, T, H * D, pos));
        same_values("rope_backward_pos = the whole's positions " + tag + who, g_dx,
                    gather_rows(g_whole_bwd, B, T, H * D, pos));
        ops::rope_forward_pos(d_local, d_local, theta, d_pos);  // in place
        sync("rope_forward_pos in place " + tag + who);
        same_values("rope_forward_pos in place " + tag + who, download(d_local), g_out);
      }
      // Contiguous positions: rope_forward at that offset, bit for bit.
      const int64_t offset = 300, Tc = 45;
      std::vector<int32_t> pos(static_cast<size_t>(Tc));
      std::iota(pos.begin(), pos.end(), int32_t(offset));
      const Shape cs{B, Tc, H, D};
      DeviceTensor d_x = upload(randn(size_t(numel_of(cs)), seed(4801), 1.f, dt), cs, dt),
                   d_pos = upload_i32(pos, {Tc}), a(cs, dt), b(cs, dt);
      ops::rope_forward(a, d_x, theta, offset);
      ops::rope_forward_pos(b, d_x, theta, d_pos);
      sync("rope_forward at an offset / rope_forward_pos " + tag);
      same_values("rope_forward_pos = rope_forward at offset 300 " + tag, download(b), download(a));
      ops::rope_backward(a, d_x, theta, offset);
      ops::rope_backward_pos(b, d_x, theta, d_pos);
      sync("rope_backward at an offset / rope_backward_pos " + tag);
      same_values("rope_backward_pos = rope_backward at offset 300 " + tag, download(b),
                  download(a));
    });
  }
}

// Per-token positions (pos [B, T]: documents restart their positions): each
// batch row rotated at its own positions, against the CPU twin, and bit for
// bit what the shared [T] form gives that row.
TEST_CASE("gpu rope_forward_pos / rope_backward_pos with one position per token (pos B x T)",
          "[gpu][rope][documents]") {
  const int64_t B = 2, T = 45, H = 3, D = 64;
  const ops::Rope theta(1e4f);
  for (DType dt : {F32, BF16}) {
    const std::string tag = fmt("%s B=%lld T=%lld H=%lld D=%lld", dn(dt), (long long)B, (long long)T,
                                (long long)H, (long long)D);
    run_case("rope_pos [B, T] " + tag, [&] {
      const Shape xs{B, T, H, D}, rs{1, T, H, D};
      const std::vector<float> x = randn(size_t(numel_of(xs)), seed(4900), 1.f, dt);
      // Row 0: documents of 10, 20 and 15 tokens; row 1: positions from 300 on.
      std::vector<int32_t> pos;
      for (const int32_t n : {10, 20, 15})
        for (int32_t t = 0; t < n; ++t) pos.push_back(t);
      for (int32_t t = 0; t < T; ++t) pos.push_back(300 + t);
      DeviceTensor d_x = upload(x, xs, dt), d_pos = upload_i32(pos, {B, T}), out(xs, dt), dx(xs, dt);
      poison(out);
      poison(dx);
      ops::rope_forward_pos(out, d_x, theta, d_pos);
      ops::rope_backward_pos(dx, d_x, theta, d_pos);
      sync("rope_forward_pos / rope_backward_pos [B, T] " + tag);
      std::vector<float> c_out(x.size()), c_dx(x.size());
      cpu::rope_forward_pos(host(c_out, xs), host(x, xs), theta, host_i32(pos, {B, T}));
      cpu::rope_backward_pos(host(c_dx, xs), host(x, xs), theta, host_i32(pos, {B, T}));
      const std::vector<float> g_out = download(out), g_dx = download(dx);
      compare("rope_forward_pos [B, T] " + tag, g_out, c_out, tol(dt));
      compare("rope_backward_pos [B, T] " + tag, g_dx, c_dx, tol(dt));
      // Each batch row alone with its positions as [T].
      const size_t row = size_t(T * H * D);
      for (int64_t b = 0; b < B; ++b) {
        const std::vector<float> xb(x.begin() + b * row, x.begin() + (b + 1) * row);
        const std::vector<int32_t> pb(pos.begin() + b * T, pos.begin() + (b + 1) * T);
        DeviceTensor d_xb = upload(xb, rs, dt), d_pb = upload_i32(pb, {T}), ob(rs, dt);
        ops::rope_forward_pos(ob, d_xb, theta, d_pb);
        sync("rope_forward_pos [T] " + tag);
        same_values(fmt("rope_forward_pos [B, T] row %lld = [T] ", (long long)b) + tag,
                    std::vector<float>(g_out.begin() + b * row, g_out.begin() + (b + 1) * row),
                    download(ob));
      }
    });
  }
}
