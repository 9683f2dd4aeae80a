#include "ops/norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/registry.h"

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

namespace {

bool yes(const Op&) { return true; }

void rmsnorm_tile(const Op& op, const StepContext& ctx, int t, int) {
  const auto& a = op.as<ops::RmsNorm>();
  rmsnorm(row_of(ctx, op.in, t), a.weight.data(), static_cast<int64_t>(a.weight.size()), a.eps, row_of(ctx, op.out, t));
}

void residual_tile(const Op& op, const StepContext& ctx, int t, int) {
  const auto& a = op.as<ops::Residual>();
  float* x = row_of(ctx, op.out, t);
  const int n = width_of(ctx, op.out);
  const float* in = row_of(ctx, op.in, t);
  if (!a.post_norm.empty()) {
    thread_local std::vector<float> tmp;
    tmp.resize(static_cast<size_t>(n));
    rmsnorm(in, a.post_norm.data(), n, a.eps, tmp.data());
    for (int i = 0; i < n; ++i) x[i] += tmp[static_cast<size_t>(i)];
  } else {
    for (int i = 0; i < n; ++i) x[i] += in[i];
  }
}

void gated_residual_tile(const Op& op, const StepContext& ctx, int r, int) {
  const auto& a = op.as<ops::GatedResidual>();
  const int n = width_of(ctx, op.out);
  float* s = row_of(ctx, op.out, r);
  const float* x = row_of(ctx, op.in, r);
  thread_local std::vector<float> xn;
  xn.resize(static_cast<size_t>(n));
  if (a.coef.size() == 3 * static_cast<size_t>(n)) {
    // An input scale before the weightless norm: Muse Spark's post-FFN norm
    // (musespark/__init__.py decoder_layer: t = ffn_out * post_ffn_norm).
    const float* w = a.coef.data() + 2 * n;
    for (int i = 0; i < n; ++i) xn[static_cast<size_t>(i)] = x[i] * w[i];
    x = xn.data();
  }
  rmsnorm(x, nullptr, n, a.eps, xn.data());
  const float* alpha = a.coef.data();
  const float* beta = a.coef.data() + n;
  for (int i = 0; i < n; ++i) s[i] = alpha[i] * s[i] + beta[i] * xn[static_cast<size_t>(i)];
}

template <class K>
void gated_rmsnorm_tile(const Op& op, const StepContext& ctx, int r, int) {
  const auto& a = op.as<ops::GatedRmsNorm>();
  float* o = row_of(ctx, op.out, r);
  const float* z = row_of(ctx, op.in, r);
  const int D = a.head_dim;
  for (int h = 0; h < a.n_head; ++h) {
    float* oh = o + static_cast<size_t>(h) * D;
    rmsnorm(oh, a.weight.data(), D, a.eps, oh);
    K::glu(a.gate, z + static_cast<size_t>(h) * D, oh, 1.f, 1.f, oh, D);
  }
}

template <class K>
void head_norm_gate_tile(const Op& op, const StepContext& ctx, int r, int) {
  const auto& a = op.as<ops::HeadNormGate>();
  float* o = row_of(ctx, op.out, r);
  const float* g = row_of(ctx, op.in, r);
  const int D = a.head_dim;
  const bool per_head = width_of(ctx, op.in) == a.n_head;
  for (int h = 0; h < a.n_head; ++h) {
    float* oh = o + static_cast<size_t>(h) * D;
    rmsnorm(oh, a.weight.empty() ? nullptr : a.weight.data(), D, a.eps, oh);
    if (per_head) {
      const float s = sigmoidf(g[h]);
      for (int i = 0; i < D; ++i) oh[i] *= s;
    } else {
      K::glu(GluKind::Sigmoid, g + static_cast<size_t>(h) * D, oh, 1.f, 1.f, oh, D);
    }
  }
}

}  // namespace

extern const OpInfo kRmsNormOp = {
    .name = "rmsnorm",
    .small_weights = [](const Op& op) { return op.as<ops::RmsNorm>().weight; },
    .verify = [](const Op& op, const VerifyContext& v) {
      MK_CHECK(op.in >= 0 && !op.as<ops::RmsNorm>().weight.empty() &&
                   op.as<ops::RmsNorm>().weight.size() == static_cast<size_t>(v.width(op.in)) &&
                   v.width(op.out) == v.width(op.in),
               "{}: widths", v.where);
    },
    .ref = rmsnorm_tile,
    .fast = rmsnorm_tile,
};

extern const OpInfo kResidualOp = {
    .name = "residual",
    .reads_out = yes,
    .small_weights = [](const Op& op) { return op.as<ops::Residual>().post_norm; },
    .verify = [](const Op& op, const VerifyContext& v) {
      const auto& a = op.as<ops::Residual>();
      MK_CHECK(op.in >= 0 && v.width(op.in) == v.width(op.out), "{}: widths", v.where);
      MK_CHECK(a.post_norm.empty() || a.post_norm.size() == static_cast<size_t>(v.width(op.in)),
               "{}: norm length", v.where);
    },
    .ref = residual_tile,
    .fast = residual_tile,
};

extern const OpInfo kGatedResidualOp = {
    .name = "gated_residual",
    .reads_out = yes,
    .small_weights = [](const Op& op) { return op.as<ops::GatedResidual>().coef; },
    .verify = [](const Op& op, const VerifyContext& v) {
      const size_t n = op.as<ops::GatedResidual>().coef.size(), w = static_cast<size_t>(v.width(op.out));
      MK_CHECK(op.in >= 0 && v.width(op.in) == v.width(op.out), "{}: widths", v.where);
      MK_CHECK(n == 2 * w || n == 3 * w,
               "{}: needs [alpha | beta] or [alpha | beta | input scale], 2 or 3 x {} floats", v.where, w);
    },
    .ref = gated_residual_tile,
    .fast = gated_residual_tile,
};

extern const OpInfo kGatedRmsNormOp = {
    .name = "gated_rmsnorm",
    .reads_out = yes,
    .small_weights = [](const Op& op) { return op.as<ops::GatedRmsNorm>().weight; },
    .verify = [](const Op& op, const VerifyContext& v) {
      const auto& a = op.as<ops::GatedRmsNorm>();
      MK_CHECK(op.in >= 0 && v.width(op.in) == v.width(op.out) && a.n_head > 0 &&
                   a.n_head * a.head_dim == v.width(op.out),
               "{}: widths", v.where);
      MK_CHECK(a.weight.size() == static_cast<size_t>(a.head_dim) && a.head_dim > 0, "{}: norm length", v.where);
      MK_CHECK(a.gate == GluKind::SiLU || a.gate == GluKind::Sigmoid, "{}: the gate is SiLU or sigmoid", v.where);
    },
    .ref = gated_rmsnorm_tile<RefKernels>,
    .fast = gated_rmsnorm_tile<FastKernels>,
};

extern const OpInfo kHeadNormGateOp = {
    .name = "head_norm_gate",
    .reads_out = yes,
    .small_weights = [](const Op& op) { return op.as<ops::HeadNormGate>().weight; },
    .verify = [](const Op& op, const VerifyContext& v) {
      const auto& a = op.as<ops::HeadNormGate>();
      MK_CHECK(op.in >= 0 && a.n_head > 0 && a.n_head * a.head_dim == v.width(op.out), "{}: heads", v.where);
      MK_CHECK(v.width(op.in) == a.n_head || v.width(op.in) == v.width(op.out),
               "{}: gate width {} (want {} or {})", v.where, v.width(op.in), a.n_head, v.width(op.out));
      MK_CHECK(a.weight.empty() || a.weight.size() == static_cast<size_t>(a.head_dim), "{}: norm length", v.where);
    },
    .ref = head_norm_gate_tile<RefKernels>,
    .fast = head_norm_gate_tile<FastKernels>,
};

}  // namespace megakern
