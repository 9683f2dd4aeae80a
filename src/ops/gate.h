// Element-wise gates.
//   GluAct:       out[r] = act(in[r]) * in2[r]    (gate, up; act: SiLU, GELU(tanh) or SiTU)
//   SigmoidGate:  out[r] *= sigmoid(in[r])        (attention output gate)
//   LogitSoftcap: in-place on `out`: cap * tanh(out * scale / cap) (+ mask[i], an additive mask,
//                 when given; -inf removes a token)
#pragma once

#include <span>

#include "kernels/cpu/ops.h"

namespace megakern::ops {
struct GluAct {
  GluKind act = GluKind::SiLU;
};
struct SigmoidGate {};
struct LogitSoftcap {
  float cap = 0.f, scale = 1.f;
  std::span<const float> mask;  // [width] or empty
};
}  // namespace megakern::ops
