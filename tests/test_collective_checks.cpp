// The collective argument checks (comm/collective_checks.h) run once, in the
// Communicator's public calls, before any backend hook: a bad call fails
// with the same message whatever the backend (a recording double, the
// group of one, the timing wrapper) and never reaches the hook; a good one
// reaches it.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/process_group.h"
#include "comm/timed_communicator.h"

using namespace trainer;

namespace {

// Counts the hook calls that get through.
class HookCounter final : public Communicator {
 public:
  HookCounter(int rank, int size) : rank_(rank), size_(size) {
    for (int r = 0; r < size; ++r) members_.push_back(r);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& members() const override { return members_; }
  Device device() const override { return Device::CPU; }
  int hooks = 0;

 protected:
  void do_all_reduce(Tensor, ReduceOp) override { ++hooks; }
  void do_reduce_scatter(Tensor, Tensor) override { ++hooks; }
  void do_all_gather(Tensor, Tensor) override { ++hooks; }
  void do_broadcast(Tensor, int) override { ++hooks; }
  void do_all_to_all(Tensor, Tensor) override { ++hooks; }
  void do_all_to_all_v(Tensor, const std::vector<int64_t>&, Tensor, const std::vector<int64_t>&) override { ++hooks; }
  void do_batch_send_recv(const std::vector<P2POp>&) override { ++hooks; }
  void do_barrier() override { ++hooks; }
  std::unique_ptr<Work> do_all_reduce_async(Tensor) override { return done(); }
  std::unique_ptr<Work> do_reduce_scatter_async(Tensor, Tensor) override { return done(); }
  std::unique_ptr<Work> do_all_gather_async(Tensor, Tensor) override { return done(); }

 private:
  std::unique_ptr<Work> done() {
    ++hooks;
    return std::make_unique<CompletedWork>();
  }
  int rank_, size_;
  std::string name_ = "world";
  std::vector<int> members_;
};

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Every bad call of a group of `size`, with the message part it must give.
struct BadCall {
  const char* what;
  std::function<void(Communicator&)> call;
};

}  // namespace

TEST_CASE("bad collective arguments fail in the public call, before any backend hook", "[comm][collective_checks]") {
  std::vector<float> a(8), b(8);
  std::vector<int32_t> ints(8);
  auto t = [](std::vector<float>& v, int64_t n) { return Tensor(v.data(), DType::F32, {n}); };
  const std::vector<BadCall> bad = {
      {"in must be out x 2", [&](Communicator& c) { c.reduce_scatter(t(a, 3), t(b, 8)); }},
      {"out must be in x 2", [&](Communicator& c) { c.all_gather(t(a, 8), t(b, 3)); }},
      {"out is F32, in is I32", [&](Communicator& c) { c.all_gather(t(a, 8), Tensor(ints.data(), DType::I32, {4})); }},
      {"root 2 is not a group rank (0..1)", [&](Communicator& c) { c.broadcast(t(a, 8), 2); }},
      {"both must be equal and divisible by 2", [&](Communicator& c) { c.all_to_all(t(a, 7), t(b, 7)); }},
      {"needs one count per member (2)", [&](Communicator& c) { c.all_to_all_v(t(a, 8), {4}, t(b, 8), {4}); }},
      {"negative count for group rank 1", [&](Communicator& c) { c.all_to_all_v(t(a, 8), {1, -1}, t(b, 8), {1, 1}); }},
      {"counts add up to 10", [&](Communicator& c) { c.all_to_all_v(t(a, 8), {1, 1}, t(b, 8), {1, 9}); }},
      {"sends itself 2 but receives 1", [&](Communicator& c) { c.all_to_all_v(t(a, 8), {1, 1}, t(b, 8), {2, 1}); }},
      {"peer 3 is not a group rank", [&](Communicator& c) { c.batch_send_recv({{true, t(a, 2), 3}}); }},
      {"1 sends to this rank itself but 0 receives", [&](Communicator& c) { c.batch_send_recv({{true, t(a, 2), 0}}); }},
      {"a send to itself of 8 bytes meets a receive of 4",
       [&](Communicator& c) { c.batch_send_recv_posted({{true, t(a, 2), 0}, {false, t(b, 1), 0}}); }},
      {"the tensor has no data", [&](Communicator& c) { c.all_reduce(Tensor(nullptr, DType::F32, {4})); }},
      {"in must be out x 2", [&](Communicator& c) { c.reduce_scatter_async(t(a, 3), t(b, 8)); }},
      {"out must be in x 2", [&](Communicator& c) { c.all_gather_async(t(a, 8), t(b, 3)); }},
  };
  HookCounter direct(0, 2), inner(0, 2);
  TimedCommunicator timed(inner, "world");
  for (const BadCall& b : bad) {
    const std::string d = error_of([&] { b.call(direct); });
    const std::string w = error_of([&] { b.call(timed); });
    INFO("expected: " << b.what << "\n  direct: " << d << "\n  timed:  " << w);
    CHECK(d.find(std::string("on group world (ranks 0,1): ")) != std::string::npos);
    CHECK(d.find(b.what) != std::string::npos);
    CHECK(w == d);
  }
  CHECK(direct.hooks == 0);
  CHECK(inner.hooks == 0);

  // Good calls reach the hook once each.
  direct.reduce_scatter(t(a, 4), t(b, 8));
  direct.all_gather(t(a, 8), t(b, 4));
  direct.broadcast(t(a, 8), 1);
  direct.all_to_all(t(a, 8), t(b, 8));
  direct.all_to_all_v(t(a, 8), {2, 3}, t(b, 8), {2, 4});
  direct.batch_send_recv({{true, t(a, 2), 1}, {true, t(a, 2), 0}, {false, t(b, 2), 0}});
  direct.barrier();
  direct.all_reduce_async(t(a, 8))->wait();
  CHECK(direct.hooks == 8);
}

TEST_CASE("a group of one refuses what any group refuses, with the same words", "[comm][collective_checks]") {
  std::vector<float> a(8), b(8);
  auto t = [](std::vector<float>& v, int64_t n) { return Tensor(v.data(), DType::F32, {n}); };
  HookCounter one(0, 1);
  SingleRankCommunicator single("world", 0, Device::CPU);
  const std::vector<std::function<void(Communicator&)>> bad = {
      [&](Communicator& c) { c.reduce_scatter(t(a, 3), t(b, 4)); },
      [&](Communicator& c) { c.broadcast(t(a, 8), 1); },
      [&](Communicator& c) { c.all_to_all_v(t(a, 8), {3}, t(b, 8), {2}); },
      [&](Communicator& c) { c.batch_send_recv({{true, t(a, 2), 1}}); },
  };
  for (const auto& call : bad) {
    const std::string x = error_of([&] { call(one); }), y = error_of([&] { call(single); });
    INFO("double: " << x << "\n  single: " << y);
    CHECK(!x.empty());
    CHECK(x == y);
  }
  CHECK(one.hooks == 0);
  // And its copies still run.
  a = {1, 2, 3, 4, 5, 6, 7, 8};
  single.all_to_all_v(t(b, 8), {3}, t(a, 8), {3});
  CHECK(b[2] == 3);
}
