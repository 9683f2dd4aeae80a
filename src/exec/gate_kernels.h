// Per-tile kernels of the gated residual, the gated per-head norm and the
// logit soft-cap (GatedResidual, HeadNormGate, LogitSoftcap; see
// ir/program.h). All are row-tiled: tile t is row t.
#pragma once

#include <vector>

#include "ir/program.h"

namespace megakern {

struct StepContext;

void gated_residual_tile(const Op& op, const StepContext& ctx, int r);
void head_norm_gate_tile(const Op& op, const StepContext& ctx, int r);
void logit_softcap_tile(const Op& op, const StepContext& ctx, int r);

// The residual coefficients of a learned gamma (per channel):
//   u = gamma / 0.3, beta = sigmoid(u), alpha = sqrt(max(sigmoid(-u) * (1 + beta), 1e-3)).
// Returns [alpha | beta], 2 * gamma.size() floats, the norm of a GatedResidual op.
std::vector<float> residual_gate_coefficients(const std::vector<float>& gamma);

}  // namespace megakern
