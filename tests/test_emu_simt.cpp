// The emulated CUDA device's execution core (emu/): every thread of every
// block runs once; barriers order shared memory and a missing one shows as a
// wrong result; the shuffles, the ballot and the generic warp collective
// against values worked out by hand from the Programming Guide's
// definitions; poisoned and per-block shared memory; atomics across host
// threads; the errors (deadlock, bad masks, exceptions, launch sizes) name
// the kernel, block and threads; the block order follows the seed.
// Kernel bodies never call Catch's macros (blocks run on several host
// threads): they record into host arrays, checked after the launch.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "emu/sanitizers.h"
#include "emu/simt.h"

using namespace trainer::emu;

namespace {

LaunchOptions options(unsigned host_threads, uint64_t seed = 0, const char* name = "test_kernel") {
  LaunchOptions o;
  o.name = name;
  o.host_threads = host_threads;
  o.seed = seed;
  return o;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

unsigned linear_thread() {
  const Dim3& t = thread_idx();
  const Dim3& d = block_dim();
  return t.x + d.x * (t.y + d.y * t.z);
}

unsigned linear_block() {
  const Dim3& b = block_idx();
  const Dim3& g = grid_dim();
  return b.x + g.x * (b.y + g.y * b.z);
}

// One value per lane of a 32-thread block, from a kernel body run by each.
template <class T, class F>
std::vector<T> per_lane(F f, unsigned threads = 32) {
  std::vector<T> out(threads);
  launch({1}, {threads}, 0, [&] { out[linear_thread()] = f(lane_id()); }, options(1));
  return out;
}

// A block-wide sum through shared memory; `barriers` false leaves out every
// __syncthreads, the bug the emulator must expose.
float shared_sum(bool barriers, unsigned host_threads = 1) {
  float result = 0;
  launch({1}, {256}, 256 * sizeof(float),
         [&] {
           float* s = static_cast<float*>(dynamic_shared());
           const unsigned t = thread_idx().x;
           s[t] = static_cast<float>(t + 1);
           if (barriers) sync_threads();
           for (unsigned stride = 128; stride > 0; stride /= 2) {
             if (t < stride) s[t] += s[t + stride];
             if (barriers) sync_threads();
           }
           if (t == 0) result = s[0];
         },
         options(host_threads));
  return result;
}

}  // namespace

TEST_CASE("emu: every thread of every block runs exactly once, with its coordinates", "[emu]") {
  struct Shape {
    Dim3 grid, block;
  };
  const Shape shapes[] = {{{3}, {100}}, {{2, 3}, {8, 4}}, {{2, 2, 2}, {4, 3, 5}}, {{5}, {33}}, {{1, 1, 3}, {1, 1, 64}}};
  for (const Shape& s : shapes) {
    const unsigned threads = static_cast<unsigned>(volume(s.block)), blocks = static_cast<unsigned>(volume(s.grid));
    std::vector<int> runs(size_t{threads} * blocks, 0), wrong(1, 0);
    launch(s.grid, s.block, 0,
           [&] {
             const Dim3 &t = thread_idx(), &b = block_idx();
             if (!(block_dim() == s.block) || !(grid_dim() == s.grid) || t.x >= s.block.x || t.y >= s.block.y ||
                 t.z >= s.block.z || b.x >= s.grid.x || b.y >= s.grid.y || b.z >= s.grid.z ||
                 lane_id() != linear_thread() % 32)
               atomic_add(&wrong[0], 1);
             atomic_add(&runs[size_t{linear_block()} * threads + linear_thread()], 1);
           },
           options(2, 7));
    CHECK(wrong[0] == 0);
    CHECK(std::count(runs.begin(), runs.end(), 1) == static_cast<long>(runs.size()));
  }
}

TEST_CASE("emu: a reduction needs its barriers: with them exact, without them wrong", "[emu]") {
  CHECK(shared_sum(true) == 256.0f * 257.0f / 2.0f);
  CHECK(shared_sum(true, 2) == 256.0f * 257.0f / 2.0f);
  // Thread 0 runs to its end before thread 128 has written its element: it
  // adds the poison (NaN) instead, as a GPU thread racing ahead would add
  // whatever was there. Under TSan that race is reported, the next test's job.
  if (sanitizers::kTsan) return;
  const float wrong = shared_sum(false);
  CHECK_FALSE(wrong == 256.0f * 257.0f / 2.0f);
}

// Under ThreadSanitizer this one must be reported as a data race on shared
// memory: run by hand, TRAINER_EMU_RACE_DEMO=1 unit_tests "[emu-race]" (ctest
// lists hidden tests too, hence the variable).
TEST_CASE("emu: tsan reports the reduction without barriers", "[.emu-race]") {
  if (!std::getenv("TRAINER_EMU_RACE_DEMO")) return;
  shared_sum(false);
}

TEST_CASE("emu: threads that exited count as arrived at __syncthreads", "[emu]") {
  std::vector<int> seen(64, -1);
  launch({1}, {64}, 0,
         [&] {
           int* s = static_cast<int*>(block_shared(&seen, 64 * sizeof(int), alignof(int)));
           const unsigned t = thread_idx().x;
           if (t >= 40) return;
           s[t] = static_cast<int>(t) * 3;
           sync_threads();
           seen[t] = s[(t + 1) % 40];
           sync_threads();
         },
         options(1));
  for (unsigned t = 0; t < 40; ++t) CHECK(seen[t] == static_cast<int>((t + 1) % 40) * 3);
}

TEST_CASE("emu: butterfly and shfl_down reductions", "[emu]") {
  auto value = [](unsigned lane) { return static_cast<int>(lane * lane + 1); };
  int total = 0;
  for (unsigned l = 0; l < 32; ++l) total += value(l);
  const auto xor_sums = per_lane<int>([&](unsigned lane) {
    int v = value(lane);
    for (int m = 16; m > 0; m /= 2) v += shfl_xor_sync(0xffffffffu, v, m);
    return v;
  });
  for (int v : xor_sums) CHECK(v == total);
  // shfl_down: lane l adds lane l+d's value, or its own when l+d > 31. The
  // host replays the same steps from that definition.
  std::vector<int> expected(32);
  for (unsigned l = 0; l < 32; ++l) expected[l] = value(l);
  for (unsigned d = 16; d > 0; d /= 2) {
    std::vector<int> next = expected;
    for (unsigned l = 0; l < 32; ++l) next[l] += l + d < 32 ? expected[l + d] : expected[l];
    expected = next;
  }
  const auto down_sums = per_lane<int>([&](unsigned lane) {
    int v = value(lane);
    for (unsigned d = 16; d > 0; d /= 2) v += shfl_down_sync(0xffffffffu, v, d);
    return v;
  });
  CHECK(down_sums[0] == total);
  CHECK(down_sums == expected);
}

TEST_CASE("emu: shuffles within segments of width 8 and 16", "[emu]") {
  // idx: lane src % width of the caller's own segment.
  const auto idx8 = per_lane<unsigned>([](unsigned lane) { return shfl_sync(0xffffffffu, lane * 10, 11, 8); });
  for (unsigned l = 0; l < 32; ++l) CHECK(idx8[l] == (l / 8 * 8 + 3) * 10);
  const auto idx16 = per_lane<unsigned>([](unsigned lane) { return shfl_sync(0xffffffffu, lane * 10, -1, 16); });
  for (unsigned l = 0; l < 32; ++l) CHECK(idx16[l] == (l / 16 * 16 + 15) * 10);
  // up: the caller's own value where lane % width < delta.
  const auto up16 = per_lane<unsigned>([](unsigned lane) { return shfl_up_sync(0xffffffffu, lane + 100, 3, 16); });
  for (unsigned l = 0; l < 32; ++l) CHECK(up16[l] == (l % 16 < 3 ? l : l - 3) + 100);
  // down: own value where lane % width + delta >= width.
  const auto down8 = per_lane<unsigned>([](unsigned lane) { return shfl_down_sync(0xffffffffu, lane + 100, 5, 8); });
  for (unsigned l = 0; l < 32; ++l) CHECK(down8[l] == (l % 8 + 5 >= 8 ? l : l + 5) + 100);
  // xor within a segment, and across: a later segment gives the caller's
  // own value, an earlier one is read (the Guide's note on width).
  const auto xor8 = per_lane<unsigned>([](unsigned lane) { return shfl_xor_sync(0xffffffffu, lane, 5, 8); });
  for (unsigned l = 0; l < 32; ++l) CHECK(xor8[l] == (l ^ 5));
  const auto across = per_lane<unsigned>([](unsigned lane) { return shfl_xor_sync(0xffffffffu, lane, 8, 8); });
  for (unsigned l = 0; l < 32; ++l) CHECK(across[l] == ((l ^ 8) < l ? (l ^ 8) : l));
}

TEST_CASE("emu: shuffles of 8-byte values, partial masks and the ballot", "[emu]") {
  const auto d = per_lane<double>([](unsigned lane) { return shfl_down_sync(0xffffffffu, lane * 0.5 + 1e10, 1); });
  for (unsigned l = 0; l < 32; ++l) CHECK(d[l] == (l < 31 ? l + 1 : l) * 0.5 + 1e10);
  const auto ll = per_lane<long long>([](unsigned lane) {
    return shfl_xor_sync(0xffffffffu, (1ll << 40) * lane - static_cast<long long>(lane), 31);
  });
  for (unsigned l = 0; l < 32; ++l) CHECK(ll[l] == (1ll << 40) * (31 - l) - static_cast<long long>(31 - l));
  // Lanes 0-15 alone; lanes 8-15 read lanes 16-23, which are not in the mask:
  // an undefined value, here all bits set.
  const auto half = per_lane<int>([](unsigned lane) {
    return lane < 16 ? shfl_down_sync(0x0000ffffu, static_cast<int>(lane), 8) : 1000;
  });
  for (unsigned l = 0; l < 32; ++l) CHECK(half[l] == (l < 8 ? static_cast<int>(l) + 8 : l < 16 ? -1 : 1000));
  unsigned bits = 0;
  for (unsigned l = 0; l < 32; ++l) bits |= (l % 3 == 0 ? 1u : 0u) << l;
  const auto votes = per_lane<unsigned>([](unsigned lane) { return ballot(0xffffffffu, lane % 3 == 0); });
  for (unsigned v : votes) CHECK(v == bits);
  // A partial last warp: 40 threads, warp 1 has lanes 0-7.
  const auto partial = per_lane<unsigned>(
      [](unsigned lane) { return ballot(linear_thread() >= 32 ? 0xffu : 0xffffffffu, lane & 1); }, 40);
  for (unsigned t = 0; t < 40; ++t) CHECK(partial[t] == (t < 32 ? 0xaaaaaaaau : 0xaau));
}

TEST_CASE("emu: warp_collective runs its function once and hands each lane its output", "[emu]") {
  struct In {
    int value = 0;
    short tag = 0;
  };
  std::vector<int> out(64, -1);
  std::vector<unsigned> masks_seen(2, 0);
  int runs = 0;
  launch({1}, {64}, 0,
         [&] {
           const unsigned lane = lane_id(), warp = linear_thread() / 32;
           const In in{static_cast<int>(warp * 1000 + lane), static_cast<short>(lane)};
           out[linear_thread()] = warp_collective<int>(
               0xffffffffu, in,
               [&](const In* ins, int* outs, unsigned mask) {
                 atomic_add(&runs, 1);  // two warps: two CUDA threads, unordered
                 masks_seen[ins[0].value / 1000] = mask;
                 for (unsigned l = 0; l < 32; ++l) outs[l] = ins[(l * 7 + 3) % 32].value + ins[l].tag * 0;
               },
               "permute");
         },
         options(1));
  CHECK(runs == 2);
  CHECK(masks_seen == std::vector<unsigned>{0xffffffffu, 0xffffffffu});
  for (unsigned t = 0; t < 64; ++t) CHECK(out[t] == static_cast<int>(t / 32 * 1000 + (t % 32 * 7 + 3) % 32));
}

TEST_CASE("emu: shared memory is poisoned, per block, and of the launched size", "[emu]") {
  static const char key_a = 0, key_b = 0;
  const unsigned blocks = 6;
  std::vector<int> fresh(blocks, 0), kept(blocks * 64, -1), dynamic_ok(blocks, 0);
  LaunchOptions o = options(2, 3);
  o.shared_poison = 0xCD;
  launch({blocks}, {64}, 1000,
         [&] {
           auto* a = static_cast<unsigned*>(block_shared(&key_a, 16 * sizeof(unsigned), 16));
           auto* b = static_cast<double*>(block_shared(&key_b, 3 * sizeof(double), 8));
           const unsigned t = thread_idx().x, blk = block_idx().x;
           if (t == 0) {
             auto* d = static_cast<unsigned char*>(dynamic_shared());
             bool all = dynamic_shared_bytes() == 1000;
             for (int i = 0; i < 1000; ++i) all = all && d[i] == 0xCD;
             const auto* as = reinterpret_cast<const unsigned char*>(a);
             for (size_t i = 0; i < 16 * sizeof(unsigned); ++i) all = all && as[i] == 0xCD;
             // The static variables lie past the dynamic part, apart, aligned.
             all = all && reinterpret_cast<char*>(a) >= reinterpret_cast<char*>(d) + 1000 &&
                   reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<char*>(b) >= reinterpret_cast<char*>(a + 16) &&
                   block_shared(&key_a, 16 * sizeof(unsigned), 16) == a && reinterpret_cast<uintptr_t>(d) % 16 == 0;
             fresh[blk] = all ? 1 : 0;
             a[0] = blk;
           }
           sync_threads();
           kept[blk * 64 + t] = static_cast<int>(a[0]);
         },
         o);
  for (unsigned blk = 0; blk < blocks; ++blk) {
    CHECK(fresh[blk] == 1);
    for (unsigned t = 0; t < 64; ++t) CHECK(kept[blk * 64 + t] == static_cast<int>(blk));
  }
  // The default poison reads as NaN.
  float first = 0;
  launch({1}, {1}, 64, [&] { first = static_cast<float*>(dynamic_shared())[5]; }, options(1));
  CHECK(std::isnan(first));
  const std::string e = error_of([] {
    static const char big = 0;
    launch({1}, {32}, 200 * 1024, [] { block_shared(&big, 40 * 1024, 16); }, options(1, 0, "too_much_shared"));
  });
  CHECK(contains(e, "too_much_shared"));
  CHECK(contains(e, "227 KiB"));
}

TEST_CASE("emu: atomics from many blocks on two host threads give exact totals", "[emu]") {
  int i = 0, imax = -1, imin = 1 << 30, cas_count = 0;
  unsigned u = 0, exch = 0;
  unsigned long long ull = 0;
  float f = 0;
  double d = 0;
  launch({64}, {128}, 0,
         [&] {
           const int id = static_cast<int>(linear_block() * 128 + linear_thread());
           atomic_add(&i, 1);
           atomic_add(&u, 2u);
           atomic_add(&ull, 1ull << 33);
           atomic_add(&f, 1.0f);
           atomic_add(&d, 0.5);
           atomic_max(&imax, id);
           atomic_min(&imin, id + 5);
           int old = 0;  // a guess: the loop corrects it
           while (true) {
             const int seen = atomic_cas(&cas_count, old, old + 1);
             if (seen == old) break;
             old = seen;
           }
           atomic_exch(&exch, 7u);
         },
         options(2, 5));
  const int n = 64 * 128;
  CHECK(i == n);
  CHECK(u == 2u * n);
  CHECK(ull == (1ull << 33) * n);
  CHECK(f == static_cast<float>(n));
  CHECK(d == 0.5 * n);
  CHECK(imax == n - 1);
  CHECK(imin == 5);
  CHECK(cas_count == n);
  CHECK(exch == 7u);
  int x = 10;
  CHECK(atomic_cas(&x, 3, 4) == 10);
  CHECK(x == 10);
  CHECK(atomic_exch(&x, 12) == 10);
  CHECK(atomic_add(&x, 1) == 12);
}

TEST_CASE("emu: a deadlock names who waits where", "[emu]") {
  // Lanes 0-15 wait at the barrier for lanes 16-31, which wait at a shuffle
  // for lanes 0-15.
  const std::string e = error_of([] {
    launch({2}, {32}, 0,
           [] {
             if (thread_idx().x < 16) {
               sync_threads();
             } else {
               shfl_sync(0xffffffffu, 1, 0);
             }
           },
           options(1, 0, "deadlocker"));
  });
  INFO(e);
  CHECK(contains(e, "kernel 'deadlocker' block (0,0,0): deadlock"));
  CHECK(contains(e, "threads 0-15 (0,0,0)-(15,0,0) wait at __syncthreads"));
  CHECK(contains(e, "threads 16-31 (16,0,0)-(31,0,0) wait at shfl_sync with mask 0xffffffff in warp 0 for lane(s) 0-15"));
}

TEST_CASE("emu: masks naming lanes that do not exist or exited are errors", "[emu]") {
  const std::string missing = error_of([] {
    launch({1}, {100}, 0, [] { shfl_down_sync(0xffffffffu, 1.0f, 1); }, options(1, 0, "partial"));
  });
  INFO(missing);
  CHECK(contains(missing, "kernel 'partial' block (0,0,0) thread (96,0,0)"));
  CHECK(contains(missing, "names lane(s) 4-31 of warp 3, which do not exist"));
  const std::string arrived_late = error_of([] {
    launch({1}, {32}, 0, [] { if (thread_idx().x != 0) sync_warp(); }, options(1, 0, "late"));
  });
  CHECK(contains(arrived_late, "thread (1,0,0): sync_warp with mask 0xffffffff names lane(s) 0 of warp 0, which exited"));
  const std::string left = error_of([] {
    launch({1}, {32}, 0, [] { if (thread_idx().x != 5) sync_warp(); }, options(1, 0, "left"));
  });
  CHECK(contains(left, "thread (5,0,0): exited while lane(s) 0-4 wait for it at sync_warp with mask 0xffffffff"));
  const std::string own = error_of([] { launch({1}, {32}, 0, [] { ballot(0x2u, true); }, options(1)); });
  CHECK(contains(own, "thread (0,0,0): ballot_sync with mask 0x00000002 leaves out the calling lane 0"));
  const std::string width = error_of([] { launch({1}, {32}, 0, [] { shfl_xor_sync(0xffffffffu, 1, 1, 12); }, options(1)); });
  CHECK(contains(width, "shfl_xor_sync: width 12 is not a power of two"));
  const std::string mixed = error_of([] {
    launch({1}, {32}, 0, [] { thread_idx().x < 8 ? (void)ballot(0xffffffffu, true) : sync_warp(); }, options(1));
  });
  CHECK(contains(mixed, "sync_warp with mask 0xffffffff: lane(s) 0-7 of this mask wait at ballot_sync instead"));
}

TEST_CASE("emu: an exception in a kernel reaches the caller, the other threads unwound", "[emu]") {
  struct Counted {
    int* count;
    ~Counted() { atomic_add(count, 1); }
  };
  int destroyed = 0;
  const std::string e = error_of([&] {
    launch({3}, {64}, 0,
           [&] {
             Counted c{&destroyed};
             if (block_idx().x == 1 && thread_idx().x == 7) throw std::runtime_error("boom");
             sync_threads();
           },
           options(1, 0, "thrower"));
  });
  CHECK(e == "kernel 'thrower' block (1,0,0) thread (7,0,0): boom");
  // Block 0 whole; block 1's threads 0-6 unwound from the barrier, thread 7
  // from its throw, threads 8-63 never started; block 2 never ran.
  CHECK(destroyed == 64 + 8);
  CHECK_THROWS_AS(launch({1}, {4}, 0, [] { throw 42; }, options(1)), int);
  std::vector<int> finalised(8, 0);
  CHECK_THROWS(launch({1}, {8}, 0,
                      [&] {
                        thread_slot(&finalised) = new int(static_cast<int>(thread_idx().x));
                        on_thread_exit([&] {
                          int* p = static_cast<int*>(thread_slot(&finalised));
                          finalised[*p] = 1;
                          delete p;
                        });
                        if (thread_idx().x == 7) throw std::runtime_error("after the slot");  // 0-6 wait: all started
                        sync_threads();
                      },
                      options(1)));
  CHECK(finalised == std::vector<int>(8, 1));
  CHECK_THROWS_AS(thread_idx(), std::logic_error);
}

TEST_CASE("emu: launch sizes are checked as CUDA checks them", "[emu]") {
  auto body = [] {};
  CHECK(contains(error_of([&] { launch({1}, {1025}, 0, body, options(1, 0, "big")); }),
                 "launch of kernel 'big': block (1025,1,1) exceeds CUDA's (1024,1024,64)"));
  CHECK(contains(error_of([&] { launch({1}, {1, 1, 65}, 0, body); }), "exceeds CUDA's (1024,1024,64)"));
  CHECK(contains(error_of([&] { launch({1}, {33, 32}, 0, body); }), "has 1056 threads; a block has at most 1024"));
  CHECK(contains(error_of([&] { launch({0}, {32}, 0, body); }), "grid (0,1,1) has a zero extent"));
  CHECK(contains(error_of([&] { launch({1, 65536}, {32}, 0, body); }), "exceeds CUDA's (2147483647,65535,65535)"));
  CHECK(contains(error_of([&] { launch({1}, {0, 4}, 0, body); }), "block (0,4,1) has a zero extent"));
  CHECK(contains(error_of([&] { launch({1}, {32}, 300 * 1024, body); }), "bytes of dynamic shared memory exceed"));
}

TEST_CASE("emu: blocks start in the seed's order", "[emu]") {
  auto start_order = [](uint64_t seed) {
    std::vector<unsigned> order(24, 0);
    unsigned next = 0;
    launch({4, 3, 2}, {32}, 0,
           [&] {
             if (linear_thread() == 0) order[atomic_add(&next, 1u)] = linear_block();
           },
           options(1, seed));
    return order;
  };
  std::vector<unsigned> in_order(24);
  std::iota(in_order.begin(), in_order.end(), 0u);
  CHECK(start_order(0) == in_order);
  const auto a = start_order(1), b = start_order(2);
  CHECK(a != in_order);
  CHECK(a != b);
  CHECK(a == start_order(1));
  CHECK(std::is_permutation(a.begin(), a.end(), in_order.begin()));
  // A kernel that assumes block 0 runs first.
  auto misses = [](uint64_t seed) {
    int flag = 0, missed = 0;
    launch({16}, {32}, 0,
           [&] {
             if (thread_idx().x != 0) return;
             if (block_idx().x == 0) {
               atomic_exch(&flag, 1);
             } else if (atomic_add(&flag, 0) == 0) {
               atomic_add(&missed, 1);
             }
           },
           options(1, seed));
    return missed;
  };
  CHECK(misses(0) == 0);
  CHECK(misses(1) > 0);
}

TEST_CASE("emu: TRAINER_EMU_SEED and TRAINER_EMU_THREADS steer launches that leave them unset", "[emu]") {
  auto start_order = [](std::optional<uint64_t> seed) {
    std::vector<unsigned> order(16, 0);
    unsigned next = 0;
    LaunchOptions o;
    o.seed = seed;
    launch({16}, {1}, 0, [&] { order[atomic_add(&next, 1u)] = block_idx().x; }, o);
    return order;
  };
  struct Restore {
    std::string seed = std::getenv("TRAINER_EMU_SEED") ? std::getenv("TRAINER_EMU_SEED") : "";
    std::string threads = std::getenv("TRAINER_EMU_THREADS") ? std::getenv("TRAINER_EMU_THREADS") : "";
    ~Restore() {
      seed.empty() ? ::unsetenv("TRAINER_EMU_SEED") : ::setenv("TRAINER_EMU_SEED", seed.c_str(), 1);
      threads.empty() ? ::unsetenv("TRAINER_EMU_THREADS") : ::setenv("TRAINER_EMU_THREADS", threads.c_str(), 1);
    }
  } restore;
  ::setenv("TRAINER_EMU_THREADS", "1", 1);
  ::setenv("TRAINER_EMU_SEED", "5", 1);
  CHECK(start_order(std::nullopt) == start_order(5));
  CHECK(start_order(std::nullopt) != start_order(0));
  ::setenv("TRAINER_EMU_THREADS", "two", 1);
  CHECK(contains(error_of([&] { start_order(0); }), "TRAINER_EMU_THREADS='two' is not a non-negative integer"));
}

TEST_CASE("emu: switch rate of a 256-thread block at 1000 barriers", "[emu]") {
  const int barriers = 1000;
  int done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  launch({1}, {256}, 0,
         [&] {
           for (int i = 0; i < barriers; ++i) sync_threads();
           if (thread_idx().x == 0) done = 1;
         },
         options(1));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(done == 1);
  // Each thread leaves its fiber and comes back once per barrier.
  const double switches = 2.0 * 256 * barriers;
  std::printf("emu: %.0f fiber switches in %.3f s: %.1f M switches/s (%.1f ns per switch)\n", switches, s,
              switches / s / 1e6, s / switches * 1e9);
}
