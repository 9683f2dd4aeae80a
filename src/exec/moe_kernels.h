// Per-tile kernels of the mixture-of-experts ops (MoeRoute, MoeExperts,
// MoeCombine; see ir/program.h), written for any sigmoid-routed MoE:
//  - routing: s = sigmoid(logits) in f32; the k experts with the largest
//    s + bias are selected (ties to the lowest expert id), and their weights
//    are scale * s_e / sum_selected s;
//  - experts: one tile per (row, selection) computes the selected expert's
//    gated MLP, y = W_down act(W_gate x, W_up x), act SiLU(g) * u or SiTU;
//  - combine: sum_j w_j y_j over the selections in order, so the result does
//    not depend on how tiles were spread over workers.
// The route of a row is stored as floats: [k expert ids | k weights]; ids are
// small integers, exact in f32.
#pragma once

#include <cstdint>

#include "ir/program.h"

namespace megakern {

struct StepContext;

// Selects the top k of score + bias (ties to the lowest index) and writes the
// normalised weights: ids[k], w[k]. scores are the sigmoid scores [n].
void moe_select(const float* scores, const float* bias, int n, int k, float scale, int32_t* ids, float* w);

void moe_route_tile(const Op& op, const StepContext& ctx, int r);
void moe_experts_tile(const Op& op, const StepContext& ctx, int r, int j);
void moe_combine_tile(const Op& op, const StepContext& ctx, int r);

}  // namespace megakern
