#include "calibrate/matmul_timing.h"

#include <algorithm>
#include <chrono>
#include <functional>

#include "core/cuda_backend.h"
#include "core/device_memory.h"
#include "core/half_float.h"
#include "kernels/ops.h"

namespace trainer {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One tensor of the shape's products, filled with small values (zeros could
// take a faster path on some hardware).
struct Operand {
  Operand(int64_t rows, int64_t cols, Device d, DType t) : device(d) {
    const int64_t n = rows * cols;
    p = device_alloc(size_t(n) * dtype_size(t), d, "calibrate matmul");
    tensor = Tensor(p, t, {rows, cols}, d);
    std::vector<uint16_t> half;
    std::vector<float> f(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) f[size_t(i)] = 0.01f * float((i * 7919) % 201 - 100) / 100.0f;
    if (t == DType::F32) {
      write_from_host(tensor, f.data());
      return;
    }
    for (float x : f) half.push_back(t == DType::BF16 ? bf16_from_f32(x) : f16_from_f32(x));
    write_from_host(tensor, half.data());
  }
  ~Operand() { device_free(p, device); }
  Operand(const Operand&) = delete;
  Operand& operator=(const Operand&) = delete;
  Device device;
  void* p = nullptr;
  Tensor tensor;
};

// Median seconds of `call` (the device settled after each).
double median_time(const std::function<void()>& call, Device d, const MatmulTimingOptions& o) {
  auto settle = [&] {
    if (d == Device::CUDA) cuda_backend(nullptr)->synchronize();
  };
  for (int w = 0; w < o.warmup; ++w) call();
  settle();
  std::vector<double> t;
  const double start = now_s();
  // At least `repetitions` calls, and more until min_s has passed: a
  // millisecond product timed 7 times reads a moment of the machine, not
  // its rate (on a shared VM two such reads differed by 25%).
  for (int r = 0;; ++r) {
    const double t0 = now_s();
    call();
    settle();
    t.push_back(now_s() - t0);
    const double spent = now_s() - start;
    if (spent > o.budget_s / 3) break;  // three products share the budget
    if (r + 1 >= std::max(1, o.repetitions) && spent >= o.min_s / 3) break;
  }
  std::sort(t.begin(), t.end());
  return t.size() % 2 ? t[t.size() / 2] : (t[t.size() / 2 - 1] + t[t.size() / 2]) / 2;
}

}  // namespace

int64_t linear_buffer_bytes(const std::vector<LinearShape>& shapes, DType storage) {
  int64_t most = 0;
  for (const LinearShape& s : shapes) most = std::max(most, 2 * (s.rows * s.in + s.out * s.in + s.rows * s.out));
  return most * int64_t(dtype_size(storage));
}

std::vector<MatmulTiming> time_linears(const std::vector<LinearShape>& shapes, Device device, DType storage,
                                       const MatmulTimingOptions& o) {
  std::vector<MatmulTiming> out;
  for (const LinearShape& s : shapes) {
    const Operand inp(s.rows, s.in, device, storage), weight(s.out, s.in, device, storage);
    const Operand y(s.rows, s.out, device, storage), dy(s.rows, s.out, device, storage);
    const Operand dinp(s.rows, s.in, device, storage), dweight(s.out, s.in, device, storage);
    MatmulTiming m;
    m.shape = s;
    m.forward_s = median_time([&] { ops::linear_forward(y.tensor, inp.tensor, weight.tensor, Tensor()); }, device, o);
    m.backward_input_s = median_time(
        [&] { ops::linear_backward(dinp.tensor, Tensor(), Tensor(), dy.tensor, inp.tensor, weight.tensor, false); },
        device, o);
    m.backward_weight_s = median_time(
        [&] { ops::linear_backward(Tensor(), dweight.tensor, Tensor(), dy.tensor, inp.tensor, weight.tensor, false); },
        device, o);
    out.push_back(m);
  }
  return out;
}

double model_matmul_rate(const std::vector<MatmulTiming>& timings) {
  double flops = 0, seconds = 0;
  for (const MatmulTiming& t : timings) {
    flops += t.shape.count * 3 * t.shape.flops();
    seconds += t.shape.count * t.seconds();
  }
  return seconds > 0 ? flops / seconds : 0;
}

}  // namespace trainer
