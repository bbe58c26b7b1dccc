// The router generated from kernels/op_list.h (kernels/ops.cpp): which backend
// a call reaches, and the errors it gives before any backend runs.
#include <catch2/catch.hpp>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/test_util.h"

using namespace trainer;
using test::fill_normal;
using test::Owned;

namespace {

// An absent tensor marked CUDA (tests/gpu/gpu_test_util.h absent_cuda()).
Tensor absent_marked_cuda() {
  Tensor t;
  t.device = Device::CUDA;
  return t;
}

}  // namespace

TEST_CASE("router: an absent first argument does not choose the backend", "[ops][router]") {
  const int64_t N = 3, IC = 4, OC = 5;
  Owned inp({N, IC}), w({OC, IC}), dout({N, OC}), dw_ref({OC, IC}), dw({OC, IC});
  fill_normal(inp.f, 1);
  fill_normal(w.f, 2);
  fill_normal(dout.f, 3);
  cpu::linear_backward(Tensor(), dw_ref, Tensor(), dout, inp, w, false);
  // However the absent dinp is marked, the first present tensor (dw, on the
  // host) routes the call to the CPU backend, with the same result.
  ops::linear_backward(absent_marked_cuda(), dw, Tensor(), dout, inp, w, false);
  CHECK(dw.f == dw_ref.f);
  CHECK(dw.f != std::vector<float>(dw.f.size(), 0.f));
}

#ifndef TRAINER_HAVE_CUDA
namespace {
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    std::printf("[message] %s\n", e.what());
    return e.what();
  }
  return "(no exception)";
}
}  // namespace

TEST_CASE("router: a CUDA tensor in a build without CUDA is refused by name", "[ops][router]") {
  // Never dereferenced: the router refuses before any backend runs.
  float not_device_memory[4] = {};
  Tensor cuda_t(not_device_memory, DType::F32, {4}, Device::CUDA);
  const std::string m = message_of([&] { ops::fill(cuda_t, 1.f); });
  CHECK(m == "fill: a CUDA tensor reached an op, but this build has no CUDA backend");
  CHECK(not_device_memory[0] == 0.f);
  // Also when the CUDA tensor is not the first argument but the first present one.
  Owned out({4});
  const std::string m2 =
      message_of([&] { ops::add(Tensor(), cuda_t, out); });
  CHECK(m2 == "add: a CUDA tensor reached an op, but this build has no CUDA backend");
}
#endif

TEST_CASE("router: shared checks run before the CPU backend, backend checks after",
          "[ops][router]") {
  // Shared (kernels/checks): shapes, presence, overlaps, scalars.
  Owned x({4, 8}), w0({0}), out({4, 8}), rstd({4});
  test::require_rejected([&] { ops::rmsnorm_forward(out, rstd, x, w0, 1e-5f); },
                         {"rmsnorm_forward: ", "x [4, 8] vs weight [0]"});
  Owned g({16}), m({16}), v({16});
  const ops::AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.f};
  Tensor p_shifted = Tensor(g.f.data() + 1, DType::F32, {8});
  Tensor g_head = Tensor(g.f.data(), DType::F32, {8});
  Tensor m8 = Tensor(m.f.data(), DType::F32, {8}), v8 = Tensor(v.f.data(), DType::F32, {8});
  test::require_rejected([&] { ops::adamw_update(p_shifted, g_head, m8, v8, s); },
                         {"adamw_update: ", "param [8] overlaps grad [8]"});
  Owned logits({3, 5});
  Tensor shifted_d(logits.f.data() + 5, DType::F32, {2, 5});
  Tensor two_rows(logits.f.data(), DType::F32, {2, 5});
  Owned losses2({2}), targets2({2}, DType::I32);
  test::require_rejected(
      [&] { ops::cross_entropy_forward_backward(losses2, shifted_d, two_rows, targets2, 1.f); },
      {"cross_entropy_forward_backward: ", "partially overlaps logits"});
  test::require_rejected(
      [&] { ops::rope_forward(out.t.view({1, 4, 1, 8}), x.t.view({1, 4, 1, 8}), 0.f, 0); },
      {"rope_forward: ", "theta 0.000000 must be positive"});
  // A required tensor that is absent.
  test::require_rejected([&] { ops::add_inplace(out, Tensor()); },
                         {"add_inplace: ", "x [] is missing"});

  // The CPU backend's own: F32 only (the shared checks accept BF16).
  std::vector<uint16_t> bf(32);
  Tensor xb(bf.data(), DType::BF16, {4, 8});
  test::require_rejected([&] { ops::gelu_forward(out, xb); },
                         {"gelu_forward: ", "inp [4, 8] is BF16, expected F32"});
}

TEST_CASE("linear_backward: an absent dweight skips the weight gradient on the CPU too",
          "[ops][router]") {
  const int64_t N = 3, IC = 4, OC = 5;
  Owned inp({N, IC}), w({OC, IC}), dout({N, OC}), dinp_ref({N, IC}), dinp({N, IC}), dw({OC, IC});
  fill_normal(inp.f, 4);
  fill_normal(w.f, 5);
  fill_normal(dout.f, 6);
  ops::linear_backward(dinp_ref, dw, Tensor(), dout, inp, w, false);
  ops::linear_backward(dinp, Tensor(), Tensor(), dout, inp, w, false);
  CHECK(dinp.f == dinp_ref.f);
  CHECK(dinp.f != std::vector<float>(dinp.f.size(), 0.f));
}
