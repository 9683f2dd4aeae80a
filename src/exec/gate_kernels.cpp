#include "exec/gate_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "exec/op_kernels.h"
#include "kernels/cpu/ops.h"

namespace megakern {

std::vector<float> residual_gate_coefficients(const std::vector<float>& gamma) {
  const size_t n = gamma.size();
  std::vector<float> ab(2 * n);
  for (size_t i = 0; i < n; ++i) {
    // In double, rounded once: the coefficients are constants of the model.
    const double u = static_cast<double>(gamma[i]) / 0.3;
    const double beta = 1.0 / (1.0 + std::exp(-u));
    const double alpha = std::sqrt(std::max((1.0 / (1.0 + std::exp(u))) * (1.0 + beta), 1e-3));
    ab[i] = static_cast<float>(alpha);
    ab[n + i] = static_cast<float>(beta);
  }
  return ab;
}

void gated_residual_tile(const Op& op, const StepContext& ctx, int r) {
  const int n = width_of(ctx, op.out);
  float* s = row_of(ctx, op.out, r);
  const float* x = row_of(ctx, op.in, r);
  thread_local std::vector<float> xn;
  xn.resize(static_cast<size_t>(n));
  if (op.n_norm == 3 * n) {
    // An input scale before the weightless norm: Muse Spark's post-FFN norm
    // (musespark/__init__.py decoder_layer: t = ffn_out * post_ffn_norm).
    const float* w = op.norm + 2 * n;
    for (int i = 0; i < n; ++i) xn[static_cast<size_t>(i)] = x[i] * w[i];
    x = xn.data();
  }
  rmsnorm(x, nullptr, n, op.eps, xn.data());
  const float* alpha = op.norm;
  const float* beta = op.norm + n;
  for (int i = 0; i < n; ++i) s[i] = alpha[i] * s[i] + beta[i] * xn[static_cast<size_t>(i)];
}

void head_norm_gate_tile(const Op& op, const StepContext& ctx, int r) {
  float* o = row_of(ctx, op.out, r);
  const float* g = row_of(ctx, op.in, r);
  const int D = op.head_dim;
  const bool per_head = width_of(ctx, op.in) == op.n_head;
  for (int h = 0; h < op.n_head; ++h) {
    float* oh = o + static_cast<size_t>(h) * D;
    rmsnorm(oh, op.norm, D, op.eps, oh);
    if (per_head) {
      const float s = sigmoidf(g[h]);
      for (int i = 0; i < D; ++i) oh[i] *= s;
    } else {
      const float* gh = g + static_cast<size_t>(h) * D;
      if (ctx.scalar)
        glu_act_scalar(GluKind::Sigmoid, gh, oh, 1.f, 1.f, oh, D);
      else
        glu_act(GluKind::Sigmoid, gh, oh, 1.f, 1.f, oh, D);
    }
  }
}

void logit_softcap_tile(const Op& op, const StepContext& ctx, int r) {
  const int n = width_of(ctx, op.out);
  float* x = row_of(ctx, op.out, r);
  if (ctx.scalar)
    softcap_scalar(x, n, op.cap, op.scale);
  else
    softcap(x, n, op.cap, op.scale);
  if (op.norm)
    for (int i = 0; i < n; ++i) x[i] += op.norm[i];
}

}  // namespace megakern
