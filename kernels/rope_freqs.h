// RoPE's frequencies: pair i of a head turns by p * inv_freq[i] at position
// p. inv_freq comes from the base theta, the head dim D and a scaling that
// stretches the low frequencies for long contexts (docs/MODEL_MATH.md,
// "RoPE"). Both backends' cos/sin tables, the model and the checks take it
// from here, so a scaling cannot mean two things.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace trainer::ops {

enum class RopeScaling : uint8_t {
  None,    // inv_freq[i] = theta^(-2i/D)
  Linear,  // every frequency / factor (positions interpolated by factor)
  Llama3,  // Llama 3.1: low frequencies / factor, high ones kept, a ramp between
};

struct Rope {
  float theta = 10000.f;
  RopeScaling scaling = RopeScaling::None;
  double factor = 1.0;             // Linear, Llama3
  double low_freq_factor = 1.0;    // Llama3: wavelengths above original_max_pos / this are divided by factor
  double high_freq_factor = 4.0;   // Llama3: wavelengths below original_max_pos / this are kept
  double original_max_pos = 0.0;   // Llama3: the context length the model was pretrained at

  Rope() = default;
  // Plain RoPE of base theta (implicit, so a bare theta still names a RoPE).
  Rope(float base) : theta(base) {}  // NOLINT(google-explicit-constructor)
};

inline const char* rope_scaling_name(RopeScaling s) {
  switch (s) {
    case RopeScaling::Linear: return "linear";
    case RopeScaling::Llama3: return "llama3";
    default: return "none";
  }
}

// "" when r can make frequencies, else what is wrong with it (for the op
// checks and the configuration's own validation).
inline std::string rope_problem(const Rope& r) {
  auto num = [](double v) { return std::to_string(v); };
  if (!(r.theta > 0) || !std::isfinite(r.theta)) return "theta " + num(r.theta) + " must be positive";
  if (r.scaling == RopeScaling::None) return "";
  if (!(r.factor > 0) || !std::isfinite(r.factor))
    return std::string(rope_scaling_name(r.scaling)) + " scaling factor " + num(r.factor) + " must be positive";
  if (r.scaling == RopeScaling::Llama3) {
    if (!(r.original_max_pos > 0)) return "llama3 scaling needs original_max_pos > 0, got " + num(r.original_max_pos);
    if (!(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor))
      return "llama3 scaling needs 0 < low_freq_factor < high_freq_factor, got " + num(r.low_freq_factor) + " and " +
             num(r.high_freq_factor);
  }
  return "";
}

// inv_freq[i], i < head_dim / 2, in double (the tables round cos and sin to
// float once, from a double angle).
inline std::vector<double> rope_inv_freqs(int64_t head_dim, const Rope& r) {
  const int64_t half = head_dim / 2;
  std::vector<double> f(static_cast<size_t>(half > 0 ? half : 0));
  const double pi = 3.14159265358979323846;
  for (int64_t i = 0; i < half; ++i) {
    const double base = std::pow(double(r.theta), -2.0 * double(i) / double(head_dim));
    double v = base;
    if (r.scaling == RopeScaling::Linear) {
      v = base / r.factor;
    } else if (r.scaling == RopeScaling::Llama3) {
      // In wavelengths (positions per turn): longer than the pretraining
      // context / low_freq_factor -> divided by factor; shorter than it /
      // high_freq_factor -> kept; between, a mix linear in context/wavelength
      // (continuous at both ends).
      const double wavelen = 2.0 * pi / base;
      const double low_wavelen = r.original_max_pos / r.low_freq_factor;
      const double high_wavelen = r.original_max_pos / r.high_freq_factor;
      if (wavelen > low_wavelen) {
        v = base / r.factor;
      } else if (wavelen >= high_wavelen) {
        const double s = (r.original_max_pos / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        v = (1.0 - s) * base / r.factor + s * base;
      }
    }
    f[size_t(i)] = v;
  }
  return f;
}

}  // namespace trainer::ops
