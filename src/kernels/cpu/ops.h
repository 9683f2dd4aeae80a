// Element-wise and per-vector operations used by the forward passes.
#pragma once

#include <cmath>
#include <cstdint>

namespace megakern {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]; w may be null (no scale).
// The sum of squares is accumulated in double so the result is insensitive to
// the summation order. out may alias x.
void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out);

// Rotates the first rope_dim dims of one head vector in place for position
// pos. neox: pairs (i, i + rope_dim/2); otherwise adjacent pairs (2i, 2i+1).
// Frequencies: theta_i = pos * base^(-2i / rope_dim).
void rope_inplace(float* v, int rope_dim, int64_t pos, float base, bool neox);

// In-place softmax over n values, with the maximum subtracted first.
void softmax_inplace(float* x, int64_t n);

inline float silu(float x) { return x / (1.f + std::exp(-x)); }
// GELU with the tanh approximation (as Gemma uses).
float gelu_tanh(float x);

}  // namespace megakern
