// Norms and residuals.
//   RmsNorm:       out[r] = rmsnorm(in[r]) * weight
//   Residual:      out[r] += post_norm.empty() ? in[r] : rmsnorm(in[r]) * post_norm
//   GatedResidual: out[r] = alpha * out[r] + beta * t * rsqrt(mean(t^2) + eps), t = in[r] (* w);
//                  coef = [alpha | beta] (2 * width floats) or [alpha | beta | w] (3 * width)
//   GatedRmsNorm:  in-place on `out`, per head: rmsnorm(out) * weight * gate(in)   (in = z; gate:
//                  SiLU, or Sigmoid for KDA)
//   HeadNormGate:  in-place on `out`, per head h: rmsnorm(out_h) (* weight when given) * sigmoid(g),
//                  g = in[h] when in has n_head values, else in[h * head_dim + i]
// All are row-tiled: tile t is row t.
#pragma once

#include <span>
#include <vector>

#include "kernels/cpu/ops.h"

namespace megakern {
namespace ops {
struct RmsNorm {
  std::span<const float> weight;
  float eps = 1e-6f;
};
struct Residual {
  std::span<const float> post_norm;  // empty: a plain sum
  float eps = 1e-6f;
};
struct GatedResidual {
  std::span<const float> coef;
  float eps = 1e-6f;
};
struct GatedRmsNorm {
  int n_head = 0, head_dim = 0;
  std::span<const float> weight;  // [head_dim]
  float eps = 1e-6f;
  GluKind gate = GluKind::SiLU;
};
struct HeadNormGate {
  int n_head = 0, head_dim = 0;
  std::span<const float> weight;  // [head_dim] or empty
  float eps = 1e-6f;
};
}  // namespace ops

// The residual coefficients of a learned gamma (per channel):
//   u = gamma / 0.3, beta = sigmoid(u), alpha = sqrt(max(sigmoid(-u) * (1 + beta), 1e-3)).
// Returns [alpha | beta], 2 * gamma.size() floats, the coef of a GatedResidual op.
std::vector<float> residual_gate_coefficients(const std::vector<float>& gamma);

}  // namespace megakern
