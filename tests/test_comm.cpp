// The communicators (comm/process_group.h, comm/gloo_communicator.h) across
// real processes: each test forks N children that build their ProcessGroups
// exactly as the trainer does (rank 0 serves the store on a loopback port),
// run collectives and compare every element with its closed form. A child
// reports through a pipe ("" when all checks passed, else what failed) and
// then waits for the parent to release it, so that no rank tears down its
// connections, or rank 0 its store, while another still needs them.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include "tests/error_of.h"
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo_communicator.h"
#include "comm/host_staged_communicator.h"
#include "comm/process_group.h"
#include "core/half_float.h"
#include "rank_runner.h"
#include "e2e_util.h"
#include "observe/wait_attribution.h"

using namespace trainer;

namespace {

using e2e::free_port;
using namespace trainer::test;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

template <typename T>
void expect_all(const std::vector<T>& got, const std::function<T(size_t)>& want, const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want(i)))
      throw CheckFailed(what + ": element " + std::to_string(i) + " is " + std::to_string(double(got[i])) +
                        ", expected " + std::to_string(double(want(i))));
}

template <typename T>
Tensor view(std::vector<T>& v, DType d) {
  return Tensor(v.data(), d, {int64_t(v.size())});
}

using trainer::test::error_of;

// --- the collectives of one communicator ------------------------------------

// all_reduce: sums (F32 over several of Gloo's segments, I32, F64), max, and
// the refused bf16 (Gloo's).
void check_all_reduce(Communicator& c) {
  const int r = c.rank(), n = c.size();
  const float tri = float(n * (n - 1) / 2);  // sum of the ranks
  {  // all_reduce, sum: large enough to need several of Gloo's 1 MiB segments
    std::vector<float> a(300001);
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(r) + float(i % 1000);
    c.all_reduce(view(a, DType::F32));
    expect_all<float>(a, [&](size_t i) { return float(n) * float(i % 1000) + tri; }, "all_reduce sum F32");
  }
  {  // all_reduce, max
    std::vector<float> a(1001);
    for (size_t i = 0; i < a.size(); ++i) a[i] = float((7 * r + int(i)) % 13);
    c.all_reduce(view(a, DType::F32), ReduceOp::Max);
    expect_all<float>(a, [&](size_t i) {
      int m = 0;
      for (int q = 0; q < n; ++q) m = std::max(m, (7 * q + int(i)) % 13);
      return float(m);
    }, "all_reduce max F32");
  }
  {  // integer and double sums
    std::vector<int32_t> a(77);
    for (size_t i = 0; i < a.size(); ++i) a[i] = int32_t(r * 1000 + int(i));
    c.all_reduce(view(a, DType::I32));
    expect_all<int32_t>(a, [&](size_t i) { return int32_t(1000 * tri + n * int(i)); }, "all_reduce sum I32");
    std::vector<double> d(33, 0.5 + r);
    c.all_reduce(view(d, DType::F64));
    expect_all<double>(d, [&](size_t) { return 0.5 * n + tri; }, "all_reduce sum F64");
  }
  // bf16 cannot be reduced on the CPU backend, and saying so breaks nothing;
  // the host-staged communicator reduces it in F32 (its own test below).
  if (dynamic_cast<HostStagedCommunicator*>(&c) == nullptr) {
    std::vector<uint16_t> b(8, 0x3f80);
    const std::string e = error_of([&] { c.all_reduce(view(b, DType::BF16)); });
    CHILD_CHECK(contains(e, "not supported on the CPU backend") && contains(e, c.name()), "bf16 all_reduce: " + e);
  }
}

// reduce_scatter, all_gather and broadcast, out of place and in place.
void check_scatter_gather(Communicator& c) {
  const int r = c.rank(), n = c.size();
  {  // reduce_scatter: chunk size 1000 (not a power of two)
    const size_t m = 1000;
    std::vector<float> in(m * n), out(m, -1.f);
    for (size_t j = 0; j < in.size(); ++j) in[j] = float(r + 1) * float(j % 97 + 1);
    const std::vector<float> before = in;
    c.reduce_scatter(view(out, DType::F32), view(in, DType::F32));
    const float s = float(n * (n + 1) / 2);
    expect_all<float>(out, [&](size_t k) { return s * float((r * m + k) % 97 + 1); }, "reduce_scatter");
    CHILD_CHECK(in == before, "reduce_scatter changed its input");
    // In place: out is this rank's own chunk of in.
    Tensor own(in.data() + r * m, DType::F32, {int64_t(m)});
    c.reduce_scatter(own, view(in, DType::F32));
    std::vector<float> got(in.begin() + r * m, in.begin() + (r + 1) * m);
    expect_all<float>(got, [&](size_t k) { return s * float((r * m + k) % 97 + 1); }, "reduce_scatter in place");
  }
  {  // all_gather: F32, bf16 bits (a byte move), and in place
    const size_t m = 123;
    std::vector<float> in(m), out(m * n, -1.f);
    for (size_t k = 0; k < m; ++k) in[k] = float(r * 1000 + int(k));
    c.all_gather(view(out, DType::F32), view(in, DType::F32));
    expect_all<float>(out, [&](size_t i) { return float(int(i / m) * 1000 + int(i % m)); }, "all_gather F32");
    std::vector<uint16_t> hin(m), hout(m * n);
    for (size_t k = 0; k < m; ++k) hin[k] = uint16_t(0x4000 + r * 200 + int(k));
    c.all_gather(view(hout, DType::BF16), view(hin, DType::BF16));
    expect_all<uint16_t>(hout, [&](size_t i) { return uint16_t(0x4000 + int(i / m) * 200 + int(i % m)); },
                         "all_gather BF16");
    std::vector<float> buf(m * n, -1.f);
    for (size_t k = 0; k < m; ++k) buf[r * m + k] = float(r * 1000 + int(k));
    c.all_gather(view(buf, DType::F32), Tensor(buf.data() + r * m, DType::F32, {int64_t(m)}));
    expect_all<float>(buf, [&](size_t i) { return float(int(i / m) * 1000 + int(i % m)); }, "all_gather in place");
  }
  {  // broadcast from the last rank (not 0)
    const int root = n - 1;
    std::vector<float> a(5000, -1.f);
    std::vector<uint16_t> h(17, 0);
    if (r == root) {
      for (size_t i = 0; i < a.size(); ++i) a[i] = 7.f + float(i);
      for (size_t i = 0; i < h.size(); ++i) h[i] = uint16_t(0x3c00 + i);
    }
    c.broadcast(view(a, DType::F32), root);
    c.broadcast(view(h, DType::F16), root);
    expect_all<float>(a, [&](size_t i) { return 7.f + float(i); }, "broadcast F32");
    expect_all<uint16_t>(h, [&](size_t i) { return uint16_t(0x3c00 + i); }, "broadcast F16");
  }
}

void check_all_to_all(Communicator& c) {
  const int r = c.rank(), n = c.size();
  {  // all_to_all: chunk p of rank r goes to rank p
    const size_t m = 5;
    std::vector<int32_t> in(m * n), out(m * n, -1);
    for (int p = 0; p < n; ++p)
      for (size_t k = 0; k < m; ++k) in[p * m + k] = r * 1000 + p * 10 + int(k);
    c.all_to_all(view(out, DType::I32), view(in, DType::I32));
    expect_all<int32_t>(out, [&](size_t i) { return int32_t(int(i / m) * 1000 + r * 10 + int(i % m)); }, "all_to_all");
  }
  {  // all_to_all_v: rank s sends count(s, d) elements to rank d, some zero
    auto count = [](int s, int d) { return int64_t((s + 2 * d) % 3); };
    std::vector<int64_t> in_counts(n), out_counts(n);
    int64_t in_total = 0, out_total = 0;
    for (int p = 0; p < n; ++p) {
      in_counts[p] = count(r, p);
      out_counts[p] = count(p, r);
      in_total += in_counts[p];
      out_total += out_counts[p];
    }
    std::vector<float> in(in_total + 3, -5.f), out(out_total + 2, -7.f);  // slack at the end stays untouched
    std::vector<float> want(out.size(), -7.f);
    for (int p = 0, at = 0; p < n; ++p)
      for (int64_t k = 0; k < in_counts[p]; ++k) in[at++] = float(r * 1000 + p * 10 + int(k));
    for (int p = 0, at = 0; p < n; ++p)
      for (int64_t k = 0; k < out_counts[p]; ++k) want[at++] = float(p * 1000 + r * 10 + int(k));
    c.all_to_all_v(view(out, DType::F32), out_counts, view(in, DType::F32), in_counts);
    expect_all<float>(out, [&](size_t i) { return want[i]; }, "all_to_all_v");
  }
}

// batch_send_recv round a ring, and batch_send_recv_posted's sends that do
// not wait for their receiver.
void check_send_recv(Communicator& c) {
  const int r = c.rank(), n = c.size();
  {  // batch_send_recv: a ring, both directions at once, twice
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    for (int round = 0; round < 2; ++round) {
      std::vector<int32_t> to_next(64), from_prev(64, -1);
      std::vector<float> to_prev(1000), from_next(1000, -1.f);
      for (size_t k = 0; k < to_next.size(); ++k) to_next[k] = r * 10 + int(k) + round;
      for (size_t k = 0; k < to_prev.size(); ++k) to_prev[k] = float(r * 100000 + int(k) + round);
      c.batch_send_recv({{true, view(to_next, DType::I32), next},
                         {false, view(from_prev, DType::I32), prev},
                         {true, view(to_prev, DType::F32), prev},
                         {false, view(from_next, DType::F32), next}});
      expect_all<int32_t>(from_prev, [&](size_t k) { return int32_t(prev * 10 + int(k) + round); }, "ring from prev");
      expect_all<float>(from_next, [&](size_t k) { return float(next * 100000 + int(k) + round); }, "ring from next");
    }
  }
  if (n >= 2 && r < 2) {
    // batch_send_recv_posted returns before the receiver asks: rank 0 posts
    // a send to rank 1, then receives from it; rank 1 first sends (which
    // completes only once rank 0 receives), then receives. With sends that
    // wait for their receiver the two would wait on each other until the
    // timeout.
    std::vector<float> a(4096), b(4096), got(4096, -1.f);
    for (size_t k = 0; k < a.size(); ++k) {
      a[k] = float(k) + 0.5f;
      b[k] = -float(k);
    }
    if (r == 0) {
      auto sent = c.batch_send_recv_posted({{true, view(a, DType::F32), 1}});
      c.batch_send_recv({{false, view(got, DType::F32), 1}});
      sent->wait();
      sent->wait();  // a second wait is harmless
      expect_all<float>(got, [&](size_t k) { return -float(k); }, "posted: receive after posting a send");
    } else {
      c.batch_send_recv({{true, view(b, DType::F32), 0}});
      c.batch_send_recv({{false, view(got, DType::F32), 0}});
      expect_all<float>(got, [&](size_t k) { return float(k) + 0.5f; }, "posted: the posted send arrives");
    }
  }
}

// Async collectives overlap compute and keep their order with later sync ones.
void check_async(Communicator& c) {
  const int r = c.rank(), n = c.size();
  const float tri = float(n * (n - 1) / 2);  // sum of the ranks
  {  // async: overlaps with compute, keeps its order with later sync calls
    std::vector<float> big(1 << 20, float(r + 1)), small(10, float(r));
    std::vector<float> rs_in(64 * n), rs_out(64);
    for (size_t j = 0; j < rs_in.size(); ++j) rs_in[j] = float(j);
    auto w1 = c.all_reduce_async(view(big, DType::F32));
    auto w2 = c.reduce_scatter_async(view(rs_out, DType::F32), view(rs_in, DType::F32));
    double acc = 0;  // compute while the collectives run
    for (int i = 0; i < 2000000; ++i) acc += std::sin(i * 1e-3);
    CHILD_CHECK(std::isfinite(acc), "compute");
    c.all_reduce(view(small, DType::F32));  // behind both async ones
    w2->wait();
    w1->wait();
    w1->wait();  // a second wait is harmless
    const float s = float(n * (n + 1) / 2);
    expect_all<float>(big, [&](size_t) { return s; }, "async all_reduce");
    expect_all<float>(rs_out, [&](size_t k) { return float(n) * float(r * 64 + int(k)); }, "async reduce_scatter");
    expect_all<float>(small, [&](size_t) { return tri; }, "sync all_reduce after async");
  }
}

void check_collectives(Communicator& c) {
  check_all_reduce(c);
  check_scatter_gather(c);
  check_all_to_all(c);
  check_send_recv(c);
  c.barrier();
  check_async(c);
}

// --- async all-gather (ZeRO-3 prefetch) ---------------------------------------

// Distinct for every (gather, owning rank, element); the BF16 ones are bits.
float gval(int tag, int q, size_t k) { return float(tag * 100000 + q * 1000 + int(k)); }
uint16_t gbits(int tag, int q, size_t k) { return uint16_t(tag * 4096 + q * 512 + int(k)); }

Tensor chunk_of(std::vector<float>& v, size_t at, size_t len) {
  return Tensor(v.data() + at, DType::F32, {int64_t(len)});
}

// all_gather_async calls issued back to back, some reading what an async
// collective before them writes, mixed with reduce_scatter_async and
// synchronous all_reduce: they complete in issue order, every chunk where it
// belongs, F32 and BF16, separate and in place. Works for a group of one too.
void check_async_all_gather(Communicator& c) {
  const int r = c.rank(), n = c.size();
  const float tri = float(n * (n - 1) / 2), s = float(n * (n + 1) / 2);
  const size_t m = 1000, mh = 300;  // F32 and BF16 chunk sizes
  {  // one burst, nothing synchronous in between
    std::vector<float> a_in(m), a_out(m * n, -1.f), b_out(m * n, -1.f), rs(m * n);
    std::vector<uint16_t> h_in(mh), h_out(mh * n, 0);
    for (size_t k = 0; k < m; ++k) a_in[k] = gval(1, r, k);
    for (size_t k = 0; k < mh; ++k) h_in[k] = gbits(2, r, k);
    for (size_t j = 0; j < rs.size(); ++j) rs[j] = float(r + 1) * float(j % 97 + 1);
    std::vector<float> none;
    std::vector<std::unique_ptr<Work>> w;
    w.push_back(c.all_gather_async(view(a_out, DType::F32), view(a_in, DType::F32)));
    // ZeRO's step: reduce-scatter into this rank's own chunk, then gather the
    // reduced chunks back in place; the gather reads what the first wrote.
    w.push_back(c.reduce_scatter_async(chunk_of(rs, r * m, m), view(rs, DType::F32)));
    w.push_back(c.all_gather_async(view(rs, DType::F32), chunk_of(rs, r * m, m)));
    w.push_back(c.all_gather_async(view(h_out, DType::BF16), view(h_in, DType::BF16)));
    w.push_back(c.all_gather_async(view(none, DType::F32), view(none, DType::F32)));
    // Gathers the chunk the first gather brought from rank r+1.
    w.push_back(c.all_gather_async(view(b_out, DType::F32), chunk_of(a_out, ((r + 1) % n) * m, m)));
    // Waiting for the last one is enough: the others were issued before it.
    w.back()->wait();
    expect_all<float>(a_out, [&](size_t i) { return gval(1, int(i / m), i % m); }, "async all_gather F32");
    expect_all<float>(rs, [&](size_t i) { return s * float(i % 97 + 1); },
                      "reduce_scatter_async, then gathered in place");
    expect_all<uint16_t>(h_out, [&](size_t i) { return gbits(2, int(i / mh), i % mh); }, "async all_gather BF16");
    expect_all<float>(b_out, [&](size_t i) { return gval(1, (int(i / m) + 1) % n, i % m); },
                      "async all_gather of an earlier gather's output");
    for (auto it = w.rbegin(); it != w.rend(); ++it) (*it)->wait();  // late, out of order, twice: harmless
  }
  {  // a prefetching loop: layer l+1 is gathered while layer l is used, with
     // gradient reduce-scatters and a synchronous all_reduce per layer
    const int layers = 4;
    std::vector<std::vector<float>> full(layers, std::vector<float>(m * n, -1.f)), grad(layers),
        grad_shard(layers, std::vector<float>(m, -1.f));
    std::vector<std::vector<uint16_t>> half(layers, std::vector<uint16_t>(mh * n, 0)),
        half_shard(layers, std::vector<uint16_t>(mh));
    for (int l = 0; l < layers; ++l) {
      for (size_t k = 0; k < m; ++k) full[l][r * m + k] = gval(10 + l, r, k);  // the shard lives in its own chunk
      for (size_t k = 0; k < mh; ++k) half_shard[l][k] = gbits(3 + l, r, k);
      grad[l].resize(m * n);
      for (size_t j = 0; j < grad[l].size(); ++j) grad[l][j] = float(r + 1) * float(j % 89 + l);
    }
    std::vector<std::unique_ptr<Work>> gf(layers), gh(layers), rs_work;
    auto prefetch = [&](int l) {
      gf[l] = c.all_gather_async(view(full[l], DType::F32), chunk_of(full[l], r * m, m));
      gh[l] = c.all_gather_async(view(half[l], DType::BF16), view(half_shard[l], DType::BF16));
    };
    prefetch(0);
    for (int l = 0; l < layers; ++l) {
      if (l + 1 < layers) prefetch(l + 1);
      gf[l]->wait();
      gh[l]->wait();
      const std::string at = " (layer " + std::to_string(l) + ")";
      expect_all<float>(full[l], [&](size_t i) { return gval(10 + l, int(i / m), i % m); },
                        "prefetched F32 in place" + at);
      expect_all<uint16_t>(half[l], [&](size_t i) { return gbits(3 + l, int(i / mh), i % mh); },
                           "prefetched BF16" + at);
      rs_work.push_back(c.reduce_scatter_async(view(grad_shard[l], DType::F32), view(grad[l], DType::F32)));
      std::vector<float> loss(3, float(r + l));
      c.all_reduce(view(loss, DType::F32));  // behind every async call so far
      expect_all<float>(loss, [&](size_t) { return tri + float(n * l); }, "sync all_reduce between async calls" + at);
    }
    for (auto& w : rs_work) w->wait();
    for (int l = 0; l < layers; ++l)
      expect_all<float>(grad_shard[l], [&](size_t k) { return s * float((size_t(r) * m + k) % 89 + size_t(l)); },
                        "reduce_scatter_async between gathers (layer " + std::to_string(l) + ")");
  }
}

}  // namespace

TEST_CASE("comm: Gloo collectives on 2, 3 and 4 processes match their closed forms", "[comm]") {
  for (int n : {2, 3, 4}) {
    SECTION("world of " + std::to_string(n)) {
      Run run;
      run.world = n;
      run.mesh.dp = n;
      const auto results = run_ranks(run, [](ProcessGroups& pg, std::string&) {
        Communicator& w = pg.world();
        CHILD_CHECK(w.size() == pg.world_size() && w.rank() == pg.rank(), "world rank/size");
        CHILD_CHECK(w.name() == "world" && w.device() == Device::CPU, "world name/device");
        check_collectives(w);
        pg.finalize();
      });
      require_all_passed(results);
    }
  }
}

TEST_CASE("comm: the host-staged communicator matches the same closed forms on 2 and 3 processes", "[comm]") {
  // parallel.backend host: every collective through host copies of its
  // tensors, asynchronous ones copied back at their wait or when a later
  // call reads what they write.
  for (int n : {2, 3}) {
    Run run;
    run.world = n;
    run.mesh.dp = n;
    run.host_staged = true;
    const auto results = run_ranks(run, [](ProcessGroups& pg, std::string&) {
      Communicator& w = pg.world();
      CHILD_CHECK(dynamic_cast<HostStagedCommunicator*>(&w) != nullptr, "the world is not host-staged");
      check_collectives(w);
      check_async_all_gather(w);
      pg.finalize();
    });
    INFO("world of " << n);
    require_all_passed(results);
  }
}

namespace {

// Element i of rank r's 16-bit tensor, and the sum of two ranks' as the
// host-staged communicator gives it: added in F32, rounded once.
uint16_t narrow16(DType t, float v) { return t == DType::BF16 ? bf16_from_f32(v) : f16_from_f32(v); }
float widen16(DType t, uint16_t h) { return t == DType::BF16 ? f32_from_bf16(h) : f32_from_f16(h); }
uint16_t element16(DType t, int r, size_t i) { return narrow16(t, 1.f + 0.3f * float(i) + 0.01f * float(r)); }
uint16_t sum16(DType t, size_t i) { return narrow16(t, widen16(t, element16(t, 0, i)) + widen16(t, element16(t, 1, i))); }

// all_reduce and reduce_scatter, waited for at once and asynchronously, of
// 16-bit tensors on two ranks.
void check_16bit_reductions(Communicator& c, DType t) {
  const std::string what = dtype_name(t);
  const size_t n = 8;
  auto mine = [&] {
    std::vector<uint16_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = element16(t, c.rank(), i);
    return v;
  };
  for (bool async : {false, true}) {
    std::vector<uint16_t> x = mine(), part(n / 2);
    const std::vector<uint16_t> in = mine();
    std::vector<uint16_t> in_copy = in;
    if (async) {
      c.all_reduce_async(view(x, t))->wait();
      c.reduce_scatter_async(view(part, t), view(in_copy, t))->wait();
    } else {
      c.all_reduce(view(x, t));
      c.reduce_scatter(view(part, t), view(in_copy, t));
    }
    for (size_t i = 0; i < n; ++i) CHILD_CHECK(x[i] == sum16(t, i), what + " all_reduce element " + std::to_string(i));
    for (size_t i = 0; i < n / 2; ++i)
      CHILD_CHECK(part[i] == sum16(t, size_t(c.rank()) * n / 2 + i), what + " reduce_scatter element " + std::to_string(i));
  }
}

}  // namespace

TEST_CASE("comm: the host-staged communicator reduces BF16 and F16 in F32 (Gloo alone refuses them)", "[comm]") {
  // A GPU run in bf16 (the default) or fp16 under parallel.backend host:
  // its gradient reductions, tp's activation sums.
  Run run;
  run.world = 2;
  run.mesh.dp = 2;
  run.host_staged = true;
  const auto results = run_ranks(run, [](ProcessGroups& pg, std::string&) {
    for (DType t : {DType::BF16, DType::F16}) check_16bit_reductions(pg.world(), t);
    pg.finalize();
  });
  require_all_passed(results);
}

TEST_CASE("comm: waits in collectives are charged to the rank that arrived last", "[comm][monitor]") {
  // Three ranks, six all-reduces (one of them asynchronous); rank 2 arrives
  // 40 ms late at four of them: each of the two others waits about 40 ms
  // there, 320 ms in all, charged to rank 2 and to nobody else. Synthetic
  // sleeps, so the tolerances are wide: over 60% of the expected charge, and
  // under 20% of it for the others.
  Run run;
  run.world = 3;
  run.mesh.dp = 3;
  const auto results = run_ranks(run, [](ProcessGroups& pg, std::string& note) {
    std::vector<std::unique_ptr<TimedCommunicator>> groups;
    groups.push_back(std::make_unique<TimedCommunicator>(pg.world(), "dp_cp"));
    groups.push_back(std::make_unique<TimedCommunicator>(pg.world(), "pp"));  // never read
    TimedCommunicator& dp = *groups[0];
    std::vector<float> x(64, 1.f);
    for (int k = 0; k < 6; ++k) {
      if (pg.rank() == 2 && k != 0 && k != 3) std::this_thread::sleep_for(std::chrono::milliseconds(40));
      if (k == 5)
        dp.all_reduce_async(view(x, DType::F32))->wait();
      else
        dp.all_reduce(view(x, DType::F32));
      groups[1]->all_reduce(view(x, DType::F32));
    }
    const std::vector<double> caused = attribute_waits(groups, pg.world(), 1, false);
    note = "charged (s): " + std::to_string(caused[0]) + " " + std::to_string(caused[1]) + " " + std::to_string(caused[2]);
    CHILD_CHECK(caused.size() == 3, "one entry per rank");
    CHILD_CHECK(caused[2] > 0.6 * 0.32, "rank 2 is charged the others' waiting: " + note);
    CHILD_CHECK(caused[0] < 0.2 * 0.32 && caused[1] < 0.2 * 0.32, "nobody else is: " + note);
    CHILD_CHECK(dp.take_waits().empty(), "the waits were consumed");
    pg.finalize();
  });
  for (const auto& r : results) std::printf("[monitor] rank %d: %s\n", r.rank, r.report.c_str());
  require_all_passed(results);
}

TEST_CASE("comm: an asynchronous collective's run is busy time, only its wait is exposed", "[comm][overlap][serial]") {
  // Two ranks; rank 1 joins the asynchronous all-reduce 300 ms late while
  // rank 0, which issued it at once, computes (sleeps) 500 ms before its
  // wait: rank 0's collective runs about 300 ms on the group's thread
  // (busy) and its wait finds it done (exposed near 0). A synchronous
  // collective is both. Synthetic sleeps: wide tolerances.
  Run run;
  run.world = 2;
  run.mesh.dp = 2;
  const auto results = run_ranks(run, [](ProcessGroups& pg, std::string& note) {
    TimedCommunicator dp(pg.world(), "dp_cp");
    std::vector<float> x(1024, 1.f);
    dp.all_reduce(view(x, DType::F32));  // both connected before the clock starts
    const double busy0 = dp.busy_seconds(), blocked0 = dp.blocked_seconds();
    CHILD_CHECK(busy0 == blocked0, "a synchronous collective is busy exactly as long as it blocks");
    if (pg.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto work = dp.all_reduce_async(view(x, DType::F32));
    if (pg.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    work->wait();
    const double busy = dp.busy_seconds() - busy0, exposed = dp.blocked_seconds() - blocked0;
    note = "busy " + std::to_string(busy) + " s, exposed " + std::to_string(exposed) + " s";
    CHILD_CHECK(x[0] == 4.f, "the sum of two all-reduces of ones over 2 ranks");
    if (pg.rank() == 0) {
      CHILD_CHECK(busy > 0.2, "the late peer's 300 ms ran on the group's thread: " + note);
      CHILD_CHECK(exposed < 0.1, "and hid behind the 500 ms of compute: " + note);
    }
    CHILD_CHECK(busy >= 0 && exposed >= 0, note);
    pg.finalize();
  });
  for (const auto& r : results) std::printf("[overlap] rank %d: %s\n", r.rank, r.report.c_str());
  require_all_passed(results);
}

TEST_CASE("comm: sub-groups of the mesh, each collective stays inside its group", "[comm]") {
  struct Case {
    MeshShape mesh;
    const char* what;
  };
  MeshShape tp_dp;
  tp_dp.tp = 2;
  tp_dp.dp = 2;
  tp_dp.ep = 2;  // EP = the dp pair, EDP of size 1
  MeshShape dp_ep;
  dp_ep.dp = 4;
  dp_ep.ep = 2;  // EP {0,1},{2,3}; EDP {0,2},{1,3}
  for (const Case& k : {Case{tp_dp, "tp 2 x dp 2, ep 2"}, Case{dp_ep, "dp 4, ep 2"}}) {
    SECTION(k.what) {
      Run run;
      run.world = 4;
      run.mesh = k.mesh;
      const MeshShape mesh = k.mesh;
      const auto results = run_ranks(run, [mesh](ProcessGroups& pg, std::string&) {
        const int me = pg.rank();
        std::vector<std::unique_ptr<Work>> pending;
        std::vector<std::vector<float>> async_bufs;
        async_bufs.reserve(std::size(kAllAxes));
        for (Axis a : kAllAxes) {
          Communicator& c = pg.group(a);
          const std::vector<int> ranks = group_ranks(mesh, me, a);
          const std::string label = std::string(axis_name(a)) + " group " + c.describe();
          CHILD_CHECK(c.members() == ranks, label + ": members");
          CHILD_CHECK(c.name() == group_name(mesh, a, me), label + ": name");
          CHILD_CHECK(c.size() == int(ranks.size()) && ranks[c.rank()] == me, label + ": rank/size");
          // The sum of (global rank + 1) over the members only.
          float want = 0;
          for (int q : ranks) want += float(q + 1);
          std::vector<float> v(10, float(me + 1));
          c.all_reduce(view(v, DType::F32));
          expect_all<float>(v, [&](size_t) { return want; }, label + ": all_reduce");
          // Members, in group order, through all_gather.
          std::vector<int32_t> one{me}, all(ranks.size(), -1);
          c.all_gather(view(all, DType::I32), view(one, DType::I32));
          CHILD_CHECK(std::vector<int>(all.begin(), all.end()) == ranks, label + ": all_gather of ranks");
          // Async on every group at once: each has its own queue.
          async_bufs.emplace_back(1000, float(me + 1));
          pending.push_back(c.all_reduce_async(view(async_bufs.back(), DType::F32)));
        }
        for (size_t i = 0; i < pending.size(); ++i) {
          pending[i]->wait();
          float want = 0;
          for (int q : group_ranks(mesh, me, kAllAxes[i])) want += float(q + 1);
          expect_all<float>(async_bufs[i], [&](size_t) { return want; }, std::string(axis_name(kAllAxes[i])) + " async");
        }
        // A group of one: every collective is a copy or nothing.
        Communicator& pp = pg.group(Axis::PP);
        CHILD_CHECK(pp.size() == 1, "pp is a group of one");
        std::vector<float> x{1, 2, 3}, y(3, 0);
        pp.all_reduce(view(x, DType::F32));
        pp.reduce_scatter(view(y, DType::F32), view(x, DType::F32));
        CHILD_CHECK(x == (std::vector<float>{1, 2, 3}) && y == x, "group of one: reduce_scatter copies");
        std::fill(y.begin(), y.end(), 0.f);
        pp.batch_send_recv({{true, view(x, DType::F32), 0}, {false, view(y, DType::F32), 0}});
        CHILD_CHECK(y == x, "group of one: send to itself");
        pg.world().barrier();
        pg.finalize();
      });
      require_all_passed(results);
    }
  }
}

TEST_CASE("comm: async all_gather on 2 and 4 processes keeps issue order with the other collectives", "[comm]") {
  for (int n : {2, 4}) {
    SECTION("world of " + std::to_string(n)) {
      Run run;
      run.world = n;
      run.mesh.dp = n;
      const auto results = run_ranks(run, [](ProcessGroups& pg, std::string&) {
        check_async_all_gather(pg.world());
        // Groups of one: the mesh's (a copy) and a Gloo communicator's own.
        Communicator& pp = pg.group(Axis::PP);
        CHILD_CHECK(pp.size() == 1, "pp is a group of one");
        check_async_all_gather(pp);
        const int me = pg.rank();
        GlooCommunicator solo(pg.store(), make_gloo_device("127.0.0.1", true),
                              GlooGroup{"solo[" + std::to_string(me) + "]", {me}, me, 10, 0});
        check_async_all_gather(solo);
        pg.finalize();
      });
      require_all_passed(results);
    }
  }
}

TEST_CASE("comm: a rank that never joins a collective is named when the others time out", "[comm]") {
  // tp 2 x dp 2: rank 3 stops after start-up. Its dp partner (rank 1) times
  // out alone in dp[tp1]; ranks 0 and 2 finish dp[tp0]; then ranks 0-2 time
  // out in the world all_reduce.
  Run run;
  run.world = 4;
  run.mesh.tp = 2;
  run.mesh.dp = 2;
  run.timeout_s = 2;
  run.silent = {3};
  const double timeout = run.timeout_s;
  const auto results = run_ranks(run, [timeout](ProcessGroups& pg, std::string& note) {
    const int me = pg.rank();
    if (me == 3) {
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return;
    }
    auto timed = [&](Communicator& c, std::string* error) {
      std::vector<float> v(1000, 1.f);
      const auto t0 = Clock::now();
      try {
        c.all_reduce(view(v, DType::F32));
      } catch (const CollectiveTimeout& e) {
        *error = e.what();
      }
      return seconds_since(t0);
    };
    std::string dp_error, world_error;
    const double dp_s = timed(pg.group(Axis::DP), &dp_error);
    if (me == 1) {
      CHILD_CHECK(contains(dp_error, "all_reduce on group dp[tp1] (ranks 1,3) timed out after 2 s"), "dp: " + dp_error);
      CHILD_CHECK(contains(dp_error, "rank 3 never joined"), "dp: " + dp_error);
      CHILD_CHECK(dp_s > 0.9 * timeout && dp_s < timeout + 3.5, "dp timeout took " + std::to_string(dp_s) + " s");
      // A failed communicator refuses further work instead of hanging.
      std::vector<float> v(4, 1.f);
      const std::string again = error_of([&] { pg.group(Axis::DP).all_reduce(view(v, DType::F32)); });
      CHILD_CHECK(contains(again, "unusable after an earlier failure"), "dp again: " + again);
    } else {
      CHILD_CHECK(dp_error.empty() && dp_s < timeout, "dp[tp0] should succeed: " + dp_error);
    }
    // Ranks 0-2 meet before the world all_reduce, so that only rank 3 is late.
    PrefixStore phase(pg.store(), "test/phase");
    phase.set(std::to_string(me), "1");
    phase.wait({"0", "1", "2"}, 20);
    const double world_s = timed(pg.world(), &world_error);
    CHILD_CHECK(contains(world_error, "all_reduce on group world (ranks 0,1,2,3) timed out after 2 s"),
                "world: " + world_error);
    CHILD_CHECK(contains(world_error, "rank 3 never joined it or had already left it (0,1,2 were still in it)"), "world: " + world_error);
    CHILD_CHECK(world_s > 0.9 * timeout && world_s < timeout + 3.5,
                "world timeout took " + std::to_string(world_s) + " s");
    note = "world: " + world_error + " after " + std::to_string(world_s) + " s";
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << results[r].report);
    CHECK(results[r].reported);
    CHECK(results[r].exit_code == 0);
  }
}

TEST_CASE("comm: a pipeline transfer whose peer never comes names the group, the direction and the peer", "[comm][pp]") {
  // pp 2 x dp 2: rank 2 (stage 1 of replica 0) stops after start-up; its
  // stage-0 neighbour, rank 0, waits to receive from it and to send to it.
  Run run;
  run.world = 4;
  run.mesh.pp = 2;
  run.mesh.dp = 2;
  run.timeout_s = 2;
  run.silent = {2};
  const double timeout = run.timeout_s;
  const auto results = run_ranks(run, [timeout](ProcessGroups& pg, std::string& note) {
    const int me = pg.rank();
    if (me == 2) {
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return;
    }
    if (me != 0) return;
    Communicator& pp = pg.group(Axis::PP);
    std::vector<float> in(64), out(64, 1.f);
    const auto t0 = Clock::now();
    const std::string err = error_of([&] {
      pp.batch_send_recv({{true, view(out, DType::F32), 1}, {false, view(in, DType::F32), 1}});
    });
    const double took = seconds_since(t0);
    CHILD_CHECK(contains(err, "batch_send_recv on group pp[dp0] (ranks 0,2) timed out after 2 s"), "pp: " + err);
    CHILD_CHECK((contains(err, "sending 256 bytes to rank 2") || contains(err, "receiving 256 bytes from rank 2")),
                "pp: " + err);
    CHILD_CHECK(took > 0.9 * timeout && took < timeout + 3.5, "pp timeout took " + std::to_string(took) + " s");
    note = "pp: " + err;
  });
  for (int r : {0, 1, 3}) {
    INFO("rank " << r << ": " << results[size_t(r)].report);
    CHECK(results[size_t(r)].reported);
    CHECK(results[size_t(r)].exit_code == 0);
  }
  std::printf("[comm] %s\n", results[0].report.c_str() + (results[0].report.empty() ? 0 : 1));
}

TEST_CASE("comm: a tensor-parallel collective whose peer never comes names the tp group and the rank", "[comm][tp]") {
  Run run;
  run.world = 2;
  run.mesh.tp = 2;
  run.timeout_s = 2;
  run.silent = {1};
  const auto results = run_ranks(run, [](ProcessGroups& pg, std::string& note) {
    if (pg.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return;
    }
    std::vector<float> v(64, 1.f);
    const std::string err = error_of([&] { pg.group(Axis::TP).all_reduce(view(v, DType::F32)); });
    CHILD_CHECK(contains(err, "all_reduce on group tp (ranks 0,1) timed out after 2 s"), "tp: " + err);
    CHILD_CHECK(contains(err, "rank 1 never joined"), "tp: " + err);
    note = "tp: " + err;
  });
  INFO("rank 0: " << results[0].report);
  CHECK(results[0].reported);
  CHECK(results[0].exit_code == 0);
}

TEST_CASE("comm: a rank that dies mid-run gives the others an error, not SIGPIPE", "[comm]") {
  Run run;
  run.world = 3;
  run.mesh.dp = 3;
  run.timeout_s = 5;
  const auto t0 = Clock::now();
  const auto results = run_ranks(run, [](ProcessGroups& pg, std::string&) {
    if (pg.rank() == 2) _exit(0);  // dies without a word, connections and all
    std::vector<float> v(1 << 20, 1.f);
    std::string e;
    for (int i = 0; i < 50 && e.empty(); ++i) e = error_of([&] { pg.world().all_reduce(view(v, DType::F32)); });
    CHILD_CHECK(contains(e, "all_reduce on group world (ranks 0,1,2)") && contains(e, "rank 2 never joined"), e);
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << results[r].report);
    CHECK(results[r].reported);
    CHECK(results[r].exit_code == 0);
  }
  CHECK(seconds_since(t0) < 10);
}

TEST_CASE("comm: a rank that never starts is named by the start-up barrier", "[comm]") {
  Run run;
  run.world = 3;
  run.mesh.dp = 3;
  run.timeout_s = 1.5;
  run.absent = {2};
  const auto t0 = Clock::now();
  const auto results = run_ranks(run, [](ProcessGroups&, std::string&) {});
  const double took = seconds_since(t0);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << results[r].report);
    CHECK(results[r].exit_code == 1);
    CHECK(contains(results[r].report, "store barrier 'init' timed out after 1.5 s: rank 2 of 3 never arrived"));
  }
  CHECK(took < 10);
}

TEST_CASE("comm: bad arguments are refused, naming the group, and break nothing", "[comm]") {
  Run run;
  run.world = 2;
  run.mesh.dp = 2;
  const auto results = run_ranks(run, [](ProcessGroups& pg, std::string&) {
    Communicator& c = pg.world();
    std::vector<float> a(6), b(4);
    std::string e = error_of([&] { c.reduce_scatter(view(b, DType::F32), view(a, DType::F32)); });
    CHILD_CHECK(contains(e, "reduce_scatter on group world (ranks 0,1)") && contains(e, "in must be out x 2"), e);
    e = error_of([&] { c.all_gather(view(b, DType::F32), view(a, DType::F32)); });
    CHILD_CHECK(contains(e, "all_gather on group world"), e);
    e = error_of([&] { c.all_gather_async(view(b, DType::F32), view(a, DType::F32)); });
    CHILD_CHECK(contains(e, "all_gather on group world (ranks 0,1)") && contains(e, "out must be in x 2"), e);
    e = error_of([&] { c.broadcast(view(a, DType::F32), 2); });
    CHILD_CHECK(contains(e, "root 2 is not a group rank"), e);
    e = error_of([&] { c.all_to_all_v(view(b, DType::F32), {1, 1}, view(a, DType::F32), {5, 5}); });
    CHILD_CHECK(contains(e, "counts add up to 10"), e);
    e = error_of([&] { c.batch_send_recv({{true, view(a, DType::F32), 3}}); });
    CHILD_CHECK(contains(e, "peer 3 is not a group rank"), e);
    Tensor on_gpu(a.data(), DType::F32, {6}, Device::CUDA);
    e = error_of([&] { c.all_reduce(on_gpu); });
    CHILD_CHECK(contains(e, "the Gloo backend moves host tensors only"), e);
    // None of these broke the communicator.
    std::vector<float> v(3, 1.f);
    c.all_reduce(view(v, DType::F32));
    CHILD_CHECK(v[0] == 2.f, "still usable");
    pg.finalize();
  });
  require_all_passed(results);
}

TEST_CASE("comm: group descriptions and the Gloo address choice", "[comm]") {
  CHECK(format_rank_list({0, 2, 4, 6}) == "0,2,4,6");
  std::vector<int> many(1024);
  for (int i = 0; i < 1024; ++i) many[i] = 8 * i;
  CHECK(format_rank_list(many) == "0,8,16,24,32,40,48,56,...,8176,8184 (1024 ranks)");
  SingleRankCommunicator one("pp[dp1]", 5, Device::CPU);
  CHECK(one.describe() == "pp[dp1] (ranks 5)");
  // One host, or a master spelled as loopback: loopback; otherwise never
  // loopback, since other hosts must reach us.
  CHECK(gloo_local_address("node17", true) == "127.0.0.1");
  CHECK(gloo_local_address("127.0.0.1", false) == "127.0.0.1");
  CHECK(gloo_local_address("localhost", false) == "127.0.0.1");
}
