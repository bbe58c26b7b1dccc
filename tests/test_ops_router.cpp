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
