// Helpers shared by the op and model tests: owned host buffers, seeded random
// fills, and a central finite-difference gradient check that prints its error.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace trainer::test {

// A tensor that owns its (host) storage, for tests only.
struct Owned {
  std::vector<float> f;
  std::vector<int32_t> i;
  Tensor t;
  Owned() = default;
  Owned(std::initializer_list<int64_t> dims, DType dt = DType::F32) {
    Tensor probe(nullptr, dt, dims);
    if (dt == DType::I32) {
      i.assign(size_t(probe.numel()), 0);
      t = Tensor(i.data(), dt, dims);
    } else {
      f.assign(size_t(probe.numel()), 0.f);
      t = Tensor(f.data(), dt, dims);
    }
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  float* p() { return f.data(); }
  operator Tensor() const { return t; }
};

inline void fill_normal(std::vector<float>& v, uint64_t seed, float std = 1.f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, std);
  for (auto& x : v) x = d(g);
}

inline void fill_ints(std::vector<int32_t>& v, uint64_t seed, int lo, int hi) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> d(lo, hi - 1);
  for (auto& x : v) x = d(g);
}

// Runs f, which must be rejected with std::invalid_argument; prints the
// message and checks that it contains every one of `parts` (the op, the
// argument and its shape, the reason).
inline void require_rejected(const std::function<void()>& f, std::initializer_list<const char*> parts) {
  std::string msg = "(no std::invalid_argument thrown)";
  try {
    f();
  } catch (const std::invalid_argument& e) {
    msg = e.what();
  }
  std::printf("[message] %s\n", msg.c_str());
  INFO("message: " << msg);
  for (const char* part : parts) CHECK(msg.find(part) != std::string::npos);
}

struct GradCheckResult {
  double max_rel_err = 0;
  double max_abs_err = 0;
};

// Compares analytic[i] with (loss(x+h) - loss(x-h)) / 2h for every element of
// x (or a strided sample when x is large). loss() must recompute from x.
// The relative error uses max(|a|, |n|, floor) so near-zero entries compare
// on an absolute scale of `floor`.
inline GradCheckResult grad_check(const std::string& label, std::vector<float>& x,
                                  const std::vector<float>& analytic,
                                  const std::function<double()>& loss, double h = 1e-2,
                                  double floor = 1e-2, size_t max_points = 256) {
  GradCheckResult r;
  size_t stride = std::max<size_t>(1, x.size() / max_points);
  for (size_t i = 0; i < x.size(); i += stride) {
    float saved = x[i];
    x[i] = float(saved + h);
    double lp = loss();
    x[i] = float(saved - h);
    double lm = loss();
    x[i] = saved;
    double num = (lp - lm) / (2 * h);
    double a = analytic[i];
    double abs_err = std::fabs(num - a);
    double rel = abs_err / std::max({std::fabs(num), std::fabs(a), floor});
    r.max_abs_err = std::max(r.max_abs_err, abs_err);
    r.max_rel_err = std::max(r.max_rel_err, rel);
  }
  std::printf("[gradcheck] %-40s max_rel_err=%.3e max_abs_err=%.3e\n", label.c_str(),
              r.max_rel_err, r.max_abs_err);
  return r;
}

inline double max_rel_diff(const float* a, const double* b, size_t n, double floor = 1e-6) {
  double m = 0;
  for (size_t i = 0; i < n; ++i)
    m = std::max(m, std::fabs(a[i] - b[i]) / std::max(std::fabs(b[i]), floor));
  return m;
}

}  // namespace trainer::test
