// A bank of routed experts, as the MoE ops of a DecodeProgram see it
// (OpKind::MoeGlu, MoeDown, MoeCombine; kernels in ops/moe.h).
//
// Expert e maps an input z [d_in] to
//   h_e = act(gate_scale[e] * (W_gate_e z), up_scale[e] * (W_up_e z))      [d_ff]
//   y_e = down_scale[e] * (W_down_e h_e)                                   [d_in]
//   t   = y_e * out_norm,  y_e = t * rsqrt(mean(t^2) + out_norm_eps)
//         (only when out_norm is given: one weight shared by every expert,
//         applied before a weightless norm, as Muse Spark's post_expert_norm
//         in the reference's musespark/__init__.py moe_branch)
// and a row's output is sum_j weight_j * y_{e_j} over its selected experts in
// selection order. The scales carry a per-matrix global factor (NVFP4's
// per-tensor scale, which the block format itself does not store); they are
// 1 for the other formats. The activation is chosen by `act`:
//   SwiGLU: silu(g) * u
//   SiTU:   4 tanh(g / 4) * sigmoid(g) * 25 tanh(u / 25)   (Kimi K3)
//   SwiGluOai: a * sigmoid(1.702 a) * (b + 1), a = min(g, 7), b = clamp(u, -7, 7)   (gpt-oss)
// With biases (gpt-oss), g = gate_scale W_gate z + gate_bias[e], u likewise,
// and y_e gains down_bias[e] after its scale.
// The bank is owned by the model; ops hold a pointer to it.
#pragma once

#include <cstddef>
#include <vector>

#include "core/mat_view.h"

namespace megakern {

enum class ExpertAct : unsigned char { SwiGLU, SiTU, SwiGluOai };

struct ExpertBank {
  int n_expert = 0;
  int d_in = 0;   // width of an expert's input and output
  int d_ff = 0;   // width of its gated hidden layer
  ExpertAct act = ExpertAct::SwiGLU;
  std::vector<MatView> gate, up;  // [n_expert], each [d_ff][d_in]
  std::vector<MatView> down;      // [n_expert], each [d_in][d_ff]
  std::vector<float> gate_scale, up_scale, down_scale;  // [n_expert] each, or empty (1)
  std::vector<float> out_norm;    // [d_in] shared by all experts, or empty (no output norm)
  std::vector<float> gate_bias, up_bias;  // [n_expert][d_ff] each, or empty (no biases)
  std::vector<float> down_bias;           // [n_expert][d_in], or empty
  float out_norm_eps = 1e-8f;

  // Bytes of the gate and up (or down) matrices of expert e.
  size_t glu_bytes(int e) const {
    return gate[static_cast<size_t>(e)].row_bytes * static_cast<size_t>(d_ff) +
           up[static_cast<size_t>(e)].row_bytes * static_cast<size_t>(d_ff);
  }
  size_t down_bytes(int e) const { return down[static_cast<size_t>(e)].row_bytes * static_cast<size_t>(d_in); }
};

}  // namespace megakern
