// Norms and residuals (parameters and what they compute: ir/op_params.h).
#pragma once

#include <vector>

namespace megakern {

// The residual coefficients of a learned gamma (per channel):
//   u = gamma / 0.3, beta = sigmoid(u), alpha = sqrt(max(sigmoid(-u) * (1 + beta), 1e-3)).
// Returns [alpha | beta], 2 * gamma.size() floats, the coef of a GatedResidual op.
std::vector<float> residual_gate_coefficients(const std::vector<float>& gamma);

}  // namespace megakern
