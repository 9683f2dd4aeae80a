// The parameters of each op kind (Op::params holds the one of its kind),
// grouped by the family whose file under ops/ has the kind's registry entry
// and tiles, with what each kind computes.
#pragma once

#include <span>

#include "kernels/cpu/ops.h"

namespace megakern {

struct ExpertBank;  // ir/expert_bank.h
class Communicator;  // ir/collective.h

namespace ops {

// ---- ops/matmul.cpp ------------------------------------------------------
// Embed and MatMul: the ops that stream a weight matrix (Op::mat).
//   Embed:  out[r] = scale * E[token[r]]       (mat: the table; one row per token)
//   MatMul: out[r] = W in[r] (+ bias)          (mat: W; tiles: ranges of output rows; the bias,
//           when given, is added to each output after its dot product, in f32)
struct Embed {
  float scale = 1.f;
};
struct MatMul {
  std::span<const float> bias;  // [W rows] or empty
};

// ---- ops/norm.cpp --------------------------------------------------------
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

// ---- ops/attention.cpp ---------------------------------------------------
// The attention ops: per-head norm and RoPE, the KV store, attention itself
// and MLA's per-head key assembly.
//   HeadNormRope: in-place on `out`: per head, optional rmsnorm by head_norm [head_dim], then RoPE at pos[r]
//                 of dims [rope_offset, rope_offset + rope_dim) of the head (angle i divided by
//                 freq_factors[i] when given: Llama 3 / LongRoPE scaling; by freq_factors_long[i]
//                 instead for a row whose sequence holds more than long_context positions:
//                 LongRoPE), the rotated dims then multiplied by amplitude (LongRoPE's attention factor)
//   StoreKV:      cache(r)[layer][pos[r]] = (in[r], in2[r]) (k, v); out is the layer's width-0 cache
//                 marker slot, so the dependency of attention on it is explicit
//   Attention:    out[r] = softmax(s) V over row r's cache, s = q.K^T * scale (then cap * tanh(s / cap)
//                 with a softcap: Gemma 2), causal, optional window; with sinks, head h's softmax
//                 runs over [s | sink[h]] and the sink's weight is dropped (gpt-oss);
//                 in = q, in2 = the cache marker StoreKV wrote; tiles (row, KV head, part of its group)
//   MlaKey:       out[r] = per head [in[r] head h (head_dim - w2) | in2[r] (w2, shared by all heads)]
// cache_index: the op's layer in the KV cache (-1: Op::layer).
struct HeadNormRope {
  int n_head = 0, head_dim = 0, rope_dim = 0;
  float rope_base = 10000.f;
  bool rope_neox = false;
  std::span<const float> head_norm;  // [head_dim] or empty
  float eps = 1e-6f;
  std::span<const float> freq_factors;  // [rope_dim / 2] or empty
  std::span<const float> freq_factors_long;  // [rope_dim / 2] or empty: used when the context exceeds long_context
  int long_context = 0;
  float amplitude = 1.f;   // multiplies the rotated dims (cos and sin)
  int rope_offset = 0;     // first rotated dim of a head (MLA rotates the trailing dims)
};
struct StoreKV {
  int cache_index = -1;
};
struct Attention {
  int n_head = 0, n_head_kv = 0, head_dim = 0;
  int v_head_dim = 0;  // value width per head when it differs from head_dim (0: head_dim)
  float scale = 1.f;
  int window = 0;      // sliding window (0: none)
  int cache_index = -1;
  float softcap = 0.f;  // 0: none
  // Learned per-head sink logits [n_head] (gpt-oss), or empty: each head's
  // softmax denominator gains exp(sink - max) for a key with no value.
  std::span<const float> sinks;
  int v_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
};
struct MlaKey {
  int n_head = 0, head_dim = 0;
};

// ---- ops/gate.cpp --------------------------------------------------------
// Element-wise gates.
//   GluAct:       out[r] = act(in[r]) * in2[r]    (gate, up; act: SiLU, GELU(tanh) or SiTU)
//   SigmoidGate:  out[r] *= sigmoid(in[r])        (attention output gate); with `in` one value wide,
//                 every value of out[r] is scaled by sigmoid(in[r][0]) (a shared expert's gate)
//   LogitSoftcap: in-place on `out`: cap * tanh(out * scale / cap) (+ mask[i], an additive mask,
//                 when given; -inf removes a token)
struct GluAct {
  GluKind act = GluKind::SiLU;
};
struct SigmoidGate {};
struct LogitSoftcap {
  float cap = 0.f, scale = 1.f;
  std::span<const float> mask;  // [width] or empty
};

// ---- ops/recurrent.cpp ---------------------------------------------------
// The recurrent ops, which keep per-sequence state (RowInput::state,
// ir/sequence_state.h) and compute the rows of one sequence together, in
// order (the tile of its first row does the block).
//   CausalConvSilu: in-place on `out` (the q|k|v channels): depthwise causal conv over the row's
//                   conv window (taps [C][K], tap K-1 = current input), window updated, then SiLU
//   DeltaRule:      out[r] = gated delta rule read-out per value head; in = conv'd q|k|v, in2 = [b | a]
//                   (2 * n_head); q, k L2-normed per key head (eps), q *= scale; a_log, dt_bias
//                   [n_head] each; updates S; tiles (row, value head). With `kda` (Kimi Delta
//                   Attention): a decay per key channel, S stored [k][v], in2 = forget-gate input
//                   [n_head * key dim], in3 = beta logits [n_head], dt_bias [n_head * key dim],
//                   log decay a = gate_bound * sigmoid(exp(a_log) (g + dt_bias)), or with
//                   `softplus_gate` a = -exp(a_log) * softplus(g + dt_bias) (Kimi Linear).
// cache_index: the op's layer in the RecurrentState (-1: Op::layer).
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
  bool softplus_gate = false;
  int cache_index = -1;
};

// ---- ops/moe.cpp ---------------------------------------------------------
// The mixture-of-experts ops (ir/expert_bank.h). A route slot holds, per
// row, top_k expert ids (as floats) then their top_k weights.
//   MoeRoute:   out[r] = route(in[r]): in = router logits [E]; score = sigmoid(scale * logit)
//               (or, with `softmax`, softmax(logit) over E); top_k of score + bias (optional),
//               ties to the lowest index; weights = score / (sum of the selected scores + eps)
//               (the selected scores themselves when not `normalize`), times weight_scale.
//               With n_group > 1 (DeepSeek's group-limited routing) the E experts form n_group
//               consecutive groups, each scored by its best key (`group_top2`: the sum of its two
//               best keys); the topk_group best groups (ties to the lowest index) are the only
//               ones the top_k are chosen from
//   MoeGlu:     out[r][j] = act(gate_e in[r], up_e in[r]) for e = expert j of row r (in2 = route);
//               tiles: (distinct selected expert, d_ff range), weights read once per step
//   MoeDown:    out[r][j] = down_e in[r][j]   (in = the MoeGlu slot, in2 = route); tiled as MoeGlu
//   MoeCombine: out[r] = sum_j weight_j * norm(in[r][j])   (in = the MoeDown slot, in2 = route;
//               norm: see ExpertBank::out_norm)
struct MoeRoute {
  int top_k = 0;
  float scale = 1.f, eps = 1e-6f;
  std::span<const float> bias;  // [E] or empty
  // Softmax gating (Qwen3-MoE, Mixtral): score = softmax(logits) over all
  // experts instead of the sigmoid; the weights are the selected scores,
  // over their sum (+ eps) when `normalize`, as they are otherwise.
  bool softmax = false;
  bool normalize = true;
  float weight_scale = 1.f;  // DeepSeek's routed_scaling_factor
  int n_group = 1, topk_group = 1;
  bool group_top2 = false;
  // gpt-oss: the top_k of the raw logits (+ bias), their weights the softmax
  // over the selected logits alone (softmax, normalize, eps and scale unused).
  bool softmax_selected = false;
};
struct MoeExperts {
  int top_k = 0;
  const ExpertBank* bank = nullptr;
};
struct MoeGlu : MoeExperts {};
struct MoeDown : MoeExperts {};
struct MoeCombine : MoeExperts {};

// ---- ops/residual_stream.cpp ---------------------------------------------
// Attention residuals (Kimi K3's residual stream) and stream taps.
//   AttnResMix: out[r] = softmax-weighted mixture of blocks 0..n_blocks-1 of `in` ([blocks][H] per
//               row): score_i = (v_i . query) * rsqrt(mean(v_i^2) + eps)
//   AttnResAdd: block `block` of `out` ([blocks][H] per row) = in[r] (overwrite) or += in[r]
//   Tap:        taps[r][offset .. + w] = in[r][src .. + w] (w = width, or width(in) when 0): copies
//               columns of a slot's rows into the buffer the caller gave the executor
//               (Executor::set_tap_output), [rows][DecodeProgram::tap_width]; no output slot
//               (out = -1); a no-op when no buffer is set
// All are row-tiled: tile t is row t.
struct AttnResMix {
  int n_blocks = 0;
  std::span<const float> query;  // [H]
  float eps = 1e-6f;
};
struct AttnResAdd {
  int block = 0;
  bool overwrite = false;
};
struct Tap {
  int offset = 0;
  int src = 0;    // first column of `in` copied
  int width = 0;  // columns copied (0: all of `in`)
};

// ---- ops/collective.cpp --------------------------------------------------
// Collectives between the ranks of a tensor-parallel group (ir/collective.h),
// each running its part of a partitioned program (dist/tensor_parallel.h).
// One tile for all rows: it runs once every tile of its input is done, on one
// thread, and blocks until every rank has contributed.
//   AllReduce: out[r] = in_0[r] + in_1[r] + ... + in_{N-1}[r], in_p the in slot of rank p, summed
//              in rank order on every rank (the same bits on every rank and in any emulation
//              that sums in that order)
//   AllGather: out[r] = [in_0[r] | in_1[r] | ... | in_{N-1}[r]]: rank p holds columns
//              [share_begin(W, N, p), share_begin(W, N, p + 1)) of the W columns of out
struct AllReduce {
  Communicator* comm = nullptr;
};
struct AllGather {
  Communicator* comm = nullptr;
};

}  // namespace ops
}  // namespace megakern
