// Muse Spark hyperparameters and size arithmetic: the sliding-window / NoPE
// attention + sigmoid-routed MoE model, computed as the published reference
// (Inferact/tpu-megakernels, musespark/) computes it. Each line names the
// reference function it follows.
//
// Per layer l (H = hidden, qd = n_head * head_dim, kvd = n_head_kv * head_dim,
// E experts, F = expert_ff, D = expert_dim, the latent width the experts
// work in); n(x; w, eps) = x * rsqrt(mean(x^2) + eps) * w, n0 without w:
//   embedding (__init__.py embed): s = n0(E[token], rms_eps), f32 residual
//   attention (__init__.py attention_branch): xn = n(s; attn_norm, rms_eps)
//     q = W_q xn [qd], k = W_k xn [kvd], v = W_v xn [kvd], g = W_g xn [qd]
//     q, k: per-head n0(., rms_eps), then RoPE (rotate-half, all head_dim
//     dims, theta rope_theta) on windowed layers; none on the full layers
//     (l % 4 == 1, "NoPE"). Windowed layers attend to the last `window`
//     positions (the current one included).
//     softmax scale qk_scale_factor / sqrt(head_dim) (config.py softmax_scale)
//     o = per-head n0(attn, rms_eps) * sigmoid(g), per channel; out = W_o o
//   residual (__init__.py decoder_layer, gate_coeffs), per channel gamma [H]:
//     u = gamma / 0.3, beta = sigmoid(u), alpha = sqrt(max(sigmoid(-u) (1 + beta), 1e-3))
//     after attention: s = alpha * s + beta * n0(out, post_eps)
//     after the MoE:   s = alpha * s + beta * n0(out * post_ffn_norm, post_eps)
//   MoE (__init__.py moe_branch, moe.py route_from_logits / finalize):
//     xn = n(s; ffn_norm, rms_eps)
//     router: score_e = sigmoid(router_scale * (W_r xn)_e), f32 weights;
//       selected = top_k of score + bias (ties to the lowest index);
//       weight_e = score_e / (sum of the selected scores + route_eps)
//     z = n(W_pre xn; pre_norm, rms_eps) [D]
//     y_e = W_down_e (silu(W_gate_e z) * W_up_e z)
//     out = W_post (sum_e weight_e n0(y_e * expert_norm, post_eps)) [H]
//       (expert_norm [D] is one weight shared by the experts, applied
//       before the weightless norm)
// logits (__init__.py forward, softcap_logits, mask_unused_vocab):
//   W_head n(s; final_norm, rms_eps), then 20 * tanh(logits * logit_scale / 20);
//   ids >= vocab_used (201818 in the full model: the untrained padding rows
//   after the special tokens) get -inf.
// Norm weights are stored as the multipliers the equations use; the
// reference's checkpoint stores the zero-centred ones (1 + w) for every norm
// but the final one (musespark/__init__.py eff_weight); the reference-layout
// loader adds the 1.
//
// Deliberate differences from the reference (the math is the same, the
// rounding is not):
//  - activations stay f32 between ops where the reference rounds them to
//    bf16 (its r16 after every projection, norm and RoPE), and matrix
//    products take f32 (exact mode) or 8-bit (fast mode) activations instead
//    of bf16 ones; the router is one f32 matrix (the reference splits it
//    into a bf16 hi + lo pair whose sum is the same f32 values);
//  - norm weights are f32 (the reference rounds 1 + w to bf16 at load; our
//    reference-layout loader does the same rounding, our own layout keeps
//    whatever f32 it is given);
//  - NVFP4 experts: our block quantiser sees the weights already divided by
//    the global scale (w / gs, then / block scale) where the reference
//    divides once by (block scale * gs); the rounding rules are the same.
//  - the embedding is stored in the dense format (the reference keeps it
//    bf16 when the dense projections are int8).
//
// Sizes: muse-spark-1.2 has 819.99 B parameters, 816.68 B without the
// embedding and the LM head, of which 42.78 B are active per token, the
// "816B-A42B" of the published checkpoint's name (see muse_config.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace megakern {

struct MuseConfig {
  std::string name;
  int n_layer = 0;
  int hidden = 0;          // H
  int vocab = 0;           // rows of the embedding and the LM head
  int vocab_used = 0;      // ids >= vocab_used are masked out of the logits
  double rms_eps = 1e-5;   // embedding, pre-norms, q/k norms, attention-output norm
  double post_eps = 1e-8;  // post-attention, post-FFN and expert-output norms

  // Attention.
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int window = 0;               // sliding window of the windowed layers
  double rope_theta = 5e5;      // windowed layers only
  double qk_scale_factor = 5.4730064863875;  // softmax scale = qk_scale_factor / sqrt(head_dim)
  int full_attn_interval = 4;   // layer l is full attention (NoPE) when
  int full_attn_offset = 1;     //   l % full_attn_interval == full_attn_offset

  // MoE.
  int n_expert = 0;        // E
  int top_k = 0;
  int expert_ff = 0;       // F, the SwiGLU width of one expert
  int expert_dim = 0;      // D, the latent width experts read and write
  double router_scale = 0.17677669529663687;  // 2^-2.5, inside the sigmoid
  double route_eps = 1e-15;                    // added to the sum of the selected scores

  // Output.
  double logit_scale = 0.17677669529663687;   // 2^-2.5
  double logit_cap = 20.0;

  bool is_full_attention(int layer) const { return layer % full_attn_interval == full_attn_offset; }
  int n_full_layers() const;
  int n_window_layers() const { return n_layer - n_full_layers(); }
  int64_t q_dim() const { return int64_t(n_head) * head_dim; }
  int64_t kv_dim() const { return int64_t(n_head_kv) * head_dim; }
  double softmax_scale() const;
  // Throws megakern::Error naming the first inconsistent field.
  void validate() const;
};

// Presets: "muse-spark-1.2" (full size), "muse-spark-mini" (tiny, tests and
// `run`; matches tests/fixtures/muse_mini/config.json), "muse-spark-bench"
// (all 62 layers at reduced width and expert count).
const std::vector<MuseConfig>& muse_presets();
const MuseConfig* find_muse_preset(const std::string& name);

// One weight tensor with its name in model.safetensors (see model/muse.h) and
// its logical row-major shape (a matrix in a block format is stored as U8
// [..., rows, row_bytes]; the logical shape is [..., rows, cols]).
struct MuseTensor {
  enum class Kind {
    Embedding,  // embed.weight
    LmHead,     // lm_head.weight
    Attention,  // attn.{q,k,v,gate,o}
    Router,     // moe.router (f32 matrix), moe.router_bias
    MoeDense,   // moe.pre, moe.pre_norm, moe.post, moe.experts.norm [D] (shared)
    Experts,    // moe.experts.{gate,up,down}
    ExpertAux,  // moe.experts.scale [3][E]
    Norm,       // attn_norm, ffn_norm, post_ffn_norm, attn_gamma, ffn_gamma, final_norm
  };
  std::string name;
  std::vector<int64_t> shape;
  Kind kind;
  int layer = -1;
  // Where the matrix is stored: 'd' the dense format, 'e' the expert format,
  // 'f' always f32 (router, vectors).
  char format = 'f';
  bool matrix = false;  // 2-D (or [E][rows][cols]) and read row by row
  int64_t numel() const;
};
std::vector<MuseTensor> muse_tensors(const MuseConfig& c);

struct MuseParamCount {
  int64_t embedding = 0, lm_head = 0;
  int64_t attention = 0;   // all layers
  int64_t router = 0;      // router matrices and biases
  int64_t moe_dense = 0;   // pre/post projections, the pre- and post-expert norms
  int64_t experts = 0;     // all routed expert matrices
  int64_t expert_aux = 0;  // per-expert global scales
  int64_t norms = 0;       // layer norms, gammas, final norm
  int64_t total() const { return embedding + lm_head + attention + router + moe_dense + experts + expert_aux + norms; }
  // Parameters a token touches: everything but the experts it does not select.
  int64_t active = 0;
};
MuseParamCount parameter_count(const MuseConfig& c);

// Weight bytes read by one decode step at batch 1 (one embedding row, top_k
// experts per layer, everything else whole): dense matrices in `dense`,
// expert matrices in `experts`, router and vectors in f32.
int64_t weight_bytes_per_step(const MuseConfig& c, DType dense, DType experts);
// Bytes of all weights stored, same conventions.
int64_t weight_bytes_total(const MuseConfig& c, DType dense, DType experts);
// KV bytes added per token (K and V of every layer, elem_bytes per value).
// Windowed layers stop growing after `window` tokens.
int64_t kv_bytes_per_token(const MuseConfig& c, int elem_bytes = 4);

// Human-readable table: hyperparameters, total and active parameters, bytes
// read per step for the format pairs, KV bytes per token.
std::string describe(const MuseConfig& c);

}  // namespace megakern
