#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>

namespace megakern {

void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  if (w) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
}

void rope_inplace(float* v, int rope_dim, int64_t pos, float base, bool neox) {
  const int half = rope_dim / 2;
  for (int i = 0; i < half; ++i) {
    // The angle is computed in double and rounded once, so it is accurate even
    // at large positions.
    const double inv_freq = std::pow(static_cast<double>(base), -2.0 * i / rope_dim);
    const double ang = static_cast<double>(pos) * inv_freq;
    const float c = static_cast<float>(std::cos(ang)), s = static_cast<float>(std::sin(ang));
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
  }
}

void softmax_inplace(float* x, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

}  // namespace megakern
