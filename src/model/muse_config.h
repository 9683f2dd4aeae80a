// Muse Spark hyperparameters and size arithmetic: the sliding-window / NoPE
// attention + sigmoid-routed MoE model of ../shared/docs/reference-system.md
// ("Muse Spark 1.2").
//
// Per layer l (H = hidden, qd = n_head * head_dim, kvd = n_head_kv * head_dim,
// E experts, F = expert width, D = expert_dim, the latent width the experts
// work in):
//   attention: xn = RMSNorm(s) * attn_norm
//     q = W_q xn [qd], k = W_k xn [kvd], v = W_v xn [kvd], g = W_g xn [n_head]
//     q, k: per-head parameter-free RMSNorm, then RoPE (rotate-half, all
//     head_dim dims, theta rope_theta) on windowed layers; none on the full
//     layers (l % 4 == 1, "NoPE"). Windowed layers attend to the last
//     `window` positions (the current one included).
//     o = per-head parameter-free RMSNorm(attn) * sigmoid(g[head]); out = W_o o
//   MoE: xn = RMSNorm(s) * ffn_norm
//     router: score_e = router_scale * sigmoid((W_r xn)_e), f32 weights;
//       selected = top_k of score + bias (ties to the lowest index);
//       weight_e = score_e / sum of the selected scores
//     z = RMSNorm(W_pre xn) * pre_norm [D]
//     y_e = RMSNorm(W_down_e (silu(W_gate_e z) * W_up_e z)) * expert_norm_e [D]
//     out = W_post (sum_e weight_e y_e) [H]
//   residual after each sublayer, with a learned per-channel gamma [H]:
//     u = gamma / 0.3, beta = sigmoid(u), alpha = sqrt(max(sigmoid(-u) (1 + beta), 1e-3))
//     s = alpha * s + beta * out * rsqrt(mean(out^2) + 1e-8)
// Embedding s = E[token] (no scale); logits = W_head (RMSNorm(s) * final_norm),
// then 20 * tanh(logits * logit_scale / 20); ids >= vocab_used get -inf.
//
// Assumptions where the description is silent (they fix the size figures):
//  - the attention output gate is one scalar per head (W_g is [n_head][H]);
//  - the experts work in a latent space of D = 4096 (W_pre [D][H],
//    W_post [H][D]); the router reads the normed hidden state xn;
//  - gamma, the router bias and the per-expert output norms are vectors
//    ([H], [E], [E][D]); every other norm eps is 1e-6;
//  - the embedding and the LM head are untied and both count as active.
// With these, muse-spark-1.2 has 815.96 B parameters of which 42.00 B are
// active per token (see muse_config.cpp for the arithmetic).
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
  double rms_eps = 1e-6;   // every learned RMSNorm and the per-head norms

  // Attention.
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int window = 0;               // sliding window of the windowed layers
  double rope_theta = 5e5;      // windowed layers only
  int full_attn_interval = 4;   // layer l is full attention (NoPE) when
  int full_attn_offset = 1;     //   l % full_attn_interval == full_attn_offset

  // MoE.
  int n_expert = 0;        // E
  int top_k = 0;
  int expert_ff = 0;       // F, the SwiGLU width of one expert
  int expert_dim = 0;      // D, the latent width experts read and write
  double router_scale = 0.17677669529663687;  // 2^-2.5

  // Output.
  double logit_scale = 0.17677669529663687;   // 2^-2.5
  double logit_cap = 20.0;

  bool is_full_attention(int layer) const { return layer % full_attn_interval == full_attn_offset; }
  int n_full_layers() const;
  int n_window_layers() const { return n_layer - n_full_layers(); }
  int64_t q_dim() const { return int64_t(n_head) * head_dim; }
  int64_t kv_dim() const { return int64_t(n_head_kv) * head_dim; }
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
    MoeDense,   // moe.pre, moe.pre_norm, moe.post
    Experts,    // moe.experts.{gate,up,down}
    ExpertAux,  // moe.experts.norm [E][D], moe.experts.scale [3][E]
    Norm,       // attn_norm, ffn_norm, attn_gamma, ffn_gamma, final_norm
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
  int64_t moe_dense = 0;   // pre/post projections and the pre-expert norm
  int64_t experts = 0;     // all routed expert matrices
  int64_t expert_aux = 0;  // per-expert output norms and scales
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
