#include "core/error.h"
#include "ops/registry.h"

namespace megakern {
namespace {

bool yes(const Op&) { return true; }

template <class K>
void glu_act_tile(const Op& op, const StepContext& ctx, int t, int) {
  K::glu(op.as<ops::GluAct>().act, row_of(ctx, op.in, t), row_of(ctx, op.in2, t), 1.f, 1.f, row_of(ctx, op.out, t),
         width_of(ctx, op.out));
}

template <class K>
void sigmoid_gate_tile(const Op& op, const StepContext& ctx, int r, int) {
  float* o = row_of(ctx, op.out, r);
  const int n = width_of(ctx, op.out);
  if (width_of(ctx, op.in) == n) {
    K::glu(GluKind::Sigmoid, row_of(ctx, op.in, r), o, 1.f, 1.f, o, n);
    return;
  }
  // One gate for the row: sigmoid(g) * 1, then every value times it.
  const float one = 1.f;
  float gate = 0.f;
  K::glu(GluKind::Sigmoid, row_of(ctx, op.in, r), &one, 1.f, 1.f, &gate, 1);
  for (int i = 0; i < n; ++i) o[i] *= gate;
}

template <class K>
void logit_softcap_tile(const Op& op, const StepContext& ctx, int r, int) {
  const auto& a = op.as<ops::LogitSoftcap>();
  const int n = width_of(ctx, op.out);
  float* x = row_of(ctx, op.out, r);
  K::softcap(x, n, a.cap, a.scale);
  if (!a.mask.empty())
    for (int i = 0; i < n; ++i) x[i] += a.mask[static_cast<size_t>(i)];
}

}  // namespace

extern const OpInfo kGluActOp = {
    .name = "glu_act",
    .verify = [](const Op& op, const VerifyContext& v) {
      MK_CHECK(op.in >= 0 && op.in2 >= 0 && v.width(op.in) == v.width(op.in2) && v.width(op.out) == v.width(op.in),
               "{}: widths", v.where);
      MK_CHECK(op.as<ops::GluAct>().act != GluKind::Sigmoid, "{}: the activation is SiLU, GELU or SiTU", v.where);
    },
    .ref = glu_act_tile<RefKernels>,
    .fast = glu_act_tile<FastKernels>,
};

extern const OpInfo kSigmoidGateOp = {
    .name = "sigmoid_gate",
    .reads_out = yes,
    .verify = [](const Op& op, const VerifyContext& v) {
      MK_CHECK(op.in >= 0 && (v.width(op.in) == v.width(op.out) || v.width(op.in) == 1), "{}: widths", v.where);
    },
    .ref = sigmoid_gate_tile<RefKernels>,
    .fast = sigmoid_gate_tile<FastKernels>,
};

extern const OpInfo kLogitSoftcapOp = {
    .name = "logit_softcap",
    .reads_out = yes,
    .small_weights = [](const Op& op) { return op.as<ops::LogitSoftcap>().mask; },
    .verify = [](const Op& op, const VerifyContext& v) {
      const auto& a = op.as<ops::LogitSoftcap>();
      MK_CHECK(a.cap > 0 && op.in < 0, "{}: needs cap > 0 and no input", v.where);
      MK_CHECK(a.mask.empty() || a.mask.size() == static_cast<size_t>(v.width(op.out)), "{}: mask length {} vs {}",
               v.where, a.mask.size(), v.width(op.out));
    },
    .ref = logit_softcap_tile<RefKernels>,
    .fast = logit_softcap_tile<FastKernels>,
};

}  // namespace megakern
