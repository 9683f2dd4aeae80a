// Element-wise and per-vector operations used by the forward passes.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace megakern {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]; w may be null (no scale).
// The sum of squares is accumulated in double so the result is insensitive to
// the summation order. out may alias x.
void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out);

// Rotates the first rope_dim dims of one head vector in place for position
// pos. neox: pairs (i, i + rope_dim/2); otherwise adjacent pairs (2i, 2i+1).
// Frequencies: theta_i = pos * base^(-2i / rope_dim).
// With freq_factors ([rope_dim / 2]), theta_i is divided by freq_factors[i].
void rope_inplace(float* v, int rope_dim, int64_t pos, float base, bool neox, const float* freq_factors = nullptr);
// The same in two parts, for many heads at one position: the angles once
// (cos and sin of theta_i, each computed in double and rounded once), then
// the rotation of each head. Gives exactly the bits of rope_inplace.
struct RopeAngles {
  std::vector<float> cos, sin;  // [rope_dim / 2]
  void compute(int rope_dim, int64_t pos, float base, const float* freq_factors = nullptr);
};
void rope_apply(float* v, int rope_dim, const RopeAngles& a, bool neox);
// The angles of (rope_dim, pos, base) from a small per-thread cache, computed
// on a miss: a step's layers all rotate the same positions (q and k of every
// layer), so each position's sines and cosines are computed once per step
// instead of twice per layer. The reference stays valid until the calling
// thread's next call.
const RopeAngles& rope_angles(int rope_dim, int64_t pos, float base, const float* freq_factors = nullptr);

// In-place softmax over n values, with the maximum subtracted first and the
// sum of the exponentials taken in double, in order. softmax_inplace_scalar
// uses the C library's exp; softmax_inplace picks the AVX2 exp when the CPU
// has it (within a few ulps; tested), whose result for a value does not depend
// on its place in the range.
void softmax_inplace(float* x, int64_t n);
void softmax_inplace_scalar(float* x, int64_t n);
void softmax_inplace_avx2(float* x, int64_t n);
// Up to four rows at once (row r: x[r], n[r] values), each with exactly the
// bits softmax_inplace gives it alone; their in-order sums run side by side.
void softmax_rows(float* const* x, const int64_t* n, int count);
void softmax_rows_avx2(float* const* x, const int64_t* n, int count);

inline float silu(float x) { return x / (1.f + std::exp(-x)); }
// GELU with the tanh approximation (as Gemma uses).
float gelu_tanh(float x);
// Kimi K3's SiTU gate: 4 tanh(g / 4) * sigmoid(g) * 25 tanh(u / 25).
inline float situ(float g, float u) {
  return 4.f * std::tanh(g * 0.25f) * (1.f / (1.f + std::exp(-g))) * (25.f * std::tanh(u / 25.f));
}

// The gated activations of GLU layers, element-wise over n values:
//   o[i] = act(gs * g[i], us * u[i])
// SiLU: silu(g) * u; GeluTanh: gelu_tanh(g) * u; SiTU: situ(g, u);
// Sigmoid: u * (1 / (1 + exp(-g))) (a sigmoid gate on u).
// glu_act_scalar evaluates the formulas above with the C library's exp and
// tanh (the reference); glu_act_avx2 uses vector exp / tanh approximations
// within a few float ulps of them (|error| <= 1e-6 * max(1, |result|), tested);
// glu_act picks the AVX2 version when the CPU has it. A result depends only
// on its own inputs, never on n or on where the range starts.
// SwiGluOai: gpt-oss's clamped SwiGLU, with a = min(g, 7), b = clamp(u, -7, 7):
// a * sigmoid(1.702 a) * (b + 1).
enum class GluKind : unsigned char { SiLU, GeluTanh, SiTU, Sigmoid, SwiGluOai };
inline constexpr float kSwiGluOaiAlpha = 1.702f;
inline constexpr float kSwiGluOaiLimit = 7.f;
void glu_act(GluKind k, const float* g, const float* u, float gs, float us, float* o, int64_t n);
void glu_act_scalar(GluKind k, const float* g, const float* u, float gs, float us, float* o, int64_t n);
void glu_act_avx2(GluKind k, const float* g, const float* u, float gs, float us, float* o, int64_t n);

// Logit soft-capping in place: x[i] = cap * tanh(x[i] * scale / cap), with
// the same scalar / AVX2 split and accuracy as glu_act.
void softcap(float* x, int64_t n, float cap, float scale);
void softcap_scalar(float* x, int64_t n, float cap, float scale);
void softcap_avx2(float* x, int64_t n, float cap, float scale);

}  // namespace megakern
