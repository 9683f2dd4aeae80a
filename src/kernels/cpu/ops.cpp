#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_features.h"

namespace megakern {

void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  // The sum of squares in double, in eight interleaved partial sums (element
  // i goes to sum i % 8) combined in a fixed tree, then the tail in order:
  // one chain of dependent additions cost a prompt's norms four cycles per
  // element. Each square of a float is exact in double, so contracting it
  // into an FMA or not gives the same bits, and the order is fixed in the
  // source: every ISA and compiler gets the same result.
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) part[l] += static_cast<double>(x[i + l]) * x[i + l];
  double ss = ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
  for (; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  if (w) {
    for (i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
  } else {
    for (i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
}

void RopeAngles::compute(int rope_dim, int64_t pos, float base, const float* freq_factors) {
  const int half = rope_dim / 2;
  cos.resize(static_cast<size_t>(half));
  sin.resize(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    // The angle is computed in double and rounded once, so it is accurate even
    // at large positions.
    double inv_freq = std::pow(static_cast<double>(base), -2.0 * i / rope_dim);
    if (freq_factors) inv_freq /= static_cast<double>(freq_factors[i]);
    const double ang = static_cast<double>(pos) * inv_freq;
    cos[static_cast<size_t>(i)] = static_cast<float>(std::cos(ang));
    sin[static_cast<size_t>(i)] = static_cast<float>(std::sin(ang));
  }
}

const RopeAngles& rope_angles(int rope_dim, int64_t pos, float base, const float* freq_factors) {
  // Direct-mapped by position: the rows of a step (a prompt block, a batch)
  // have distinct positions, and 128 slots hold any block of up to 128 rows.
  struct Slot {
    int rope_dim = -1;
    int64_t pos = -1;
    uint32_t base_bits = 0;
    const float* factors = nullptr;
    RopeAngles a;
  };
  constexpr size_t kSlots = 128;
  thread_local std::vector<Slot> cache(kSlots);
  uint32_t bits;
  std::memcpy(&bits, &base, sizeof bits);
  Slot& s = cache[static_cast<size_t>(pos) % kSlots];
  if (s.rope_dim != rope_dim || s.pos != pos || s.base_bits != bits || s.factors != freq_factors) {
    s.a.compute(rope_dim, pos, base, freq_factors);
    s.rope_dim = rope_dim;
    s.pos = pos;
    s.base_bits = bits;
    s.factors = freq_factors;
  }
  return s.a;
}

void rope_inplace(float* v, int rope_dim, int64_t pos, float base, bool neox, const float* freq_factors) {
  rope_apply(v, rope_dim, rope_angles(rope_dim, pos, base, freq_factors), neox);
}

void rope_apply(float* v, int rope_dim, const RopeAngles& angles, bool neox) {
  const int half = rope_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float c = angles.cos[static_cast<size_t>(i)], s = angles.sin[static_cast<size_t>(i)];
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
  }
}

void softmax_inplace(float* x, int64_t n) {
  if (use_avx2())
    softmax_inplace_avx2(x, n);
  else
    softmax_inplace_scalar(x, n);
}

void softmax_rows(float* const* x, const int64_t* n, int count) {
  if (use_avx2()) {
    softmax_rows_avx2(x, n, count);
    return;
  }
  for (int r = 0; r < count; ++r) softmax_inplace_scalar(x[r], n[r]);
}

void softmax_inplace_scalar(float* x, int64_t n) {
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

void glu_act_scalar(GluKind k, const float* g, const float* u, float gs, float us, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float a = gs * g[i], b = us * u[i];
    switch (k) {
      case GluKind::SiLU: o[i] = silu(a) * b; break;
      case GluKind::GeluTanh: o[i] = gelu_tanh(a) * b; break;
      case GluKind::SiTU: o[i] = situ(a, b); break;
      case GluKind::Sigmoid: o[i] = b * (1.f / (1.f + std::exp(-a))); break;
      case GluKind::SwiGluOai: {
        const float x = std::min(a, kSwiGluOaiLimit), y = std::clamp(b, -kSwiGluOaiLimit, kSwiGluOaiLimit);
        o[i] = x * (1.f / (1.f + std::exp(-kSwiGluOaiAlpha * x))) * (y + 1.f);
        break;
      }
    }
  }
}

void softcap_scalar(float* x, int64_t n, float cap, float scale) {
  const float inv_cap = 1.f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * scale * inv_cap);
}

void softcap(float* x, int64_t n, float cap, float scale) {
  if (use_avx2())
    softcap_avx2(x, n, cap, scale);
  else
    softcap_scalar(x, n, cap, scale);
}

void glu_act(GluKind k, const float* g, const float* u, float gs, float us, float* o, int64_t n) {
  if (use_avx2())
    glu_act_avx2(k, g, u, gs, us, o, n);
  else
    glu_act_scalar(k, g, u, gs, us, o, n);
}

}  // namespace megakern
