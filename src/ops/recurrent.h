// The recurrent ops, which keep per-sequence state (RowInput::state,
// exec/recurrent_kernels.h) and compute the rows of one sequence together, in
// order (the tile of its first row does the block).
//   CausalConvSilu: in-place on `out` (the q|k|v channels): depthwise causal conv over the row's
//                   conv window (taps [C][K], tap K-1 = current input), window updated, then SiLU
//   DeltaRule:      out[r] = gated delta rule read-out per value head; in = conv'd q|k|v, in2 = [b | a]
//                   (2 * n_head); q, k L2-normed per key head (eps), q *= scale; a_log, dt_bias
//                   [n_head] each; updates S; tiles (row, value head). With `kda` (Kimi Delta
//                   Attention): a decay per key channel, S stored [k][v], in2 = forget-gate input
//                   [n_head * key dim], in3 = beta logits [n_head], dt_bias [n_head * key dim],
//                   log decay a = gate_bound * sigmoid(exp(a_log) (g + dt_bias)).
// cache_index: the op's layer in the RecurrentState (-1: Op::layer).
#pragma once

#include <span>

namespace megakern::ops {
struct CausalConvSilu {
  std::span<const float> taps;  // [C][K]
  int cache_index = -1;
};
struct DeltaRule {
  int n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1.f, eps = 1e-6f;
  std::span<const float> a_log, dt_bias;
  bool kda = false;
  float gate_bound = -5.f;
  int cache_index = -1;
};
}  // namespace megakern::ops
