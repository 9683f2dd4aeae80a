// Kimi K3 hyperparameters and size arithmetic: the KDA + gated NoPE MLA hybrid
// with attention residuals and a latent MoE of ../shared/docs/reference-system.md
// ("Kimi K3").
//
// Layer pattern: layer l uses gated MLA when l % mla_interval == mla_interval - 1
// or it is the last layer, KDA (Kimi Delta Attention) otherwise. Layer 0 has a
// dense MLP, every other layer the latent MoE. The residual stream is the
// attention-residual block list (see model/kimi.h), with a new block every
// attn_res_block layers.
//
// The full-size figures are the published reference's (Inferact/tpu-megakernels
// kimi/__init__.py Config: dim 7168, 93 layers, 96 heads of 128 for both KDA
// and MLA, q rank 1536, kv rank 512 + 64 extra dims, 896 experts top-16 of
// width 3072 in a latent of 3584, shared width 6144, dense width 33792,
// vocabulary 163840, residual block 12; kimi/load.py shards MLA as 32 ranks x
// 3 heads: q_b 3 x 192 rows, kv_b 3 x 256, g_proj 3 x 128). The reference
// states no parameter count; ours is derived in tests/test_kimi.cpp.
// Layout assumptions that match the reference:
//  - MLA: per head 128 "nope" + 64 extra query/key dims and 128 value dims;
//  - the sigmoid output gate of MLA is a full-rank [n_head * v_head_dim, hidden]
//    projection of the layer input (the doc's W_gate x);
//  - the KDA output gate is part of the fused input projection (full rank), the
//    forget gate's low-rank path is hidden -> 128 -> n_head * head_dim, A_log is
//    per head and dt_bias per channel (flash-linear-attention's KDA layout);
//  - routed-expert weights are used as normalised; a routed scaling factor
//    (DeepSeek-V3's routed_scaling_factor) would cancel in the latent RMSNorm
//    that follows the expert sum, so there is none; one shared expert, one
//    dense layer (layer 0);
//  - untied embeddings; every RMSNorm has eps 1e-5 and a plain (not zero-centred) weight.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace megakern {

struct KimiConfig {
  std::string name;
  int n_layer = 0;
  int hidden = 0;        // H
  int vocab = 0;         // V
  double rms_eps = 1e-5; // every RMSNorm and the attention-residual scores
  int mla_interval = 4;  // layer l is MLA when l % mla_interval == mla_interval - 1, or the last layer
  int attn_res_block = 12;  // a new residual block starts at every layer l > 0 with l % attn_res_block == 0

  // KDA (key and value heads are the same heads, head_dim each).
  int kda_n_head = 0;
  int kda_head_dim = 0;
  int kda_gate_rank = 0;      // low-rank forget-gate path: H -> rank -> n_head * head_dim
  int conv_kernel = 4;        // causal depthwise conv over the q, k, v channels
  float kda_lower_bound = -5.f;  // a = lower_bound * sigmoid(exp(A_log) * (g + dt_bias))

  // Gated NoPE MLA.
  int mla_n_head = 0;
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_dim = 0;   // per head, from the kv_b projection
  int qk_extra_dim = 0;  // per head in q; shared by all heads in the key (c[kv_lora_rank:])
  int v_head_dim = 0;

  // MLPs.
  int dense_ff = 0;         // layer 0's dense SiTU MLP width
  int n_dense_layers = 1;   // layers [0, n_dense_layers) are dense
  int n_expert = 0;
  int n_expert_used = 0;    // top-k
  int expert_ff = 0;        // per routed expert
  int moe_latent = 0;       // the latent space the routed experts run in
  int shared_ff = 0;        // the shared expert's width (on the hidden state)

  // Kimi Linear (model/kimi_linear.cpp) runs on this architecture with the
  // options below; the defaults are Kimi K3's.
  bool attn_res = true;            // false: a plain residual stream, x += each sublayer's output
  std::vector<int> mla_layers{};   // non-empty: exactly these layers are MLA (mla_interval unused)
  bool kda_softplus_gate = false;  // KDA log decay a = -exp(A_log) * softplus(g + dt_bias) (no lower bound)
  int kda_out_gate_rank = 0;       // > 0: KDA's output gate is low rank, H -> rank -> n_head * head_dim;
                                   // 0: full rank, part of the fused input projection
  bool mla_gate = true;            // MLA's sigmoid output gate; q_lora_rank 0: MLA's query is one projection
  bool silu = false;               // SwiGLU (SiLU) dense MLP and experts instead of SiTU
  // moe_latent 0: the routed experts run on the hidden state (no latent
  // projections and norm).
  float routed_scale = 1.f;        // factor on the routed experts' weights (routed_scaling_factor)
  bool expert_norm = true;         // the selected experts' weights divided by their sum

  bool is_mla(int l) const {
    if (!mla_layers.empty()) {
      for (int m : mla_layers)
        if (m == l) return true;
      return false;
    }
    return l % mla_interval == mla_interval - 1 || l == n_layer - 1;
  }
  bool is_dense(int l) const { return l < n_dense_layers; }
  // The residual-block index whose prefix layer l's sublayer outputs are summed into.
  int res_block_of(int l) const { return 1 + l / attn_res_block; }
  // Number of block slots: the embedding plus one per run of attn_res_block layers.
  int n_res_blocks() const { return 1 + (n_layer + attn_res_block - 1) / attn_res_block; }
  int n_mla_layers() const;
  int n_kda_layers() const { return n_layer - n_mla_layers(); }
  int64_t kda_key_dim() const { return int64_t(kda_n_head) * kda_head_dim; }
  int64_t kda_conv_dim() const { return 3 * kda_key_dim(); }  // q, k, v channels
  // Fused input projection rows: q, k, v, output gate (n_head * head_dim each; not with a
  // low-rank output gate), beta (n_head).
  int64_t kda_in_rows() const { return (kda_out_gate_rank > 0 ? 3 : 4) * kda_key_dim() + kda_n_head; }
  int64_t mla_k_dim() const { return int64_t(qk_nope_dim) + qk_extra_dim; }  // per head key/query width
  // Throws megakern::Error naming the first inconsistent field.
  void validate() const;
};

// "kimi-k3" (full size), "kimi-k3-mini" (tiny, tests; matches
// tests/fixtures/kimi_mini/config.json), "kimi-k3-bench" (all 93 layers at
// reduced width and expert count).
const std::vector<KimiConfig>& kimi_presets();
const KimiConfig* find_kimi_preset(const std::string& name);

struct KimiParamCount {
  int64_t embedding = 0, lm_head = 0;
  int64_t kda = 0, mla = 0;          // all mixers of each kind
  int64_t dense_mlp = 0;             // the dense layers' MLPs
  int64_t router = 0, latent = 0;    // router weight + bias; latent down/up + norm, all MoE layers
  int64_t experts = 0, shared = 0;   // routed experts (all), shared experts, all MoE layers
  int64_t norms = 0;                 // sublayer norms, residual-mixture vectors, final norm
  int64_t kda_per_layer = 0, mla_per_layer = 0, expert_each = 0;
  int64_t total() const { return embedding + lm_head + kda + mla + dense_mlp + router + latent + experts + shared + norms; }
  // Parameters used by one token: all but V-1 embedding rows and all but top-k of the routed experts.
  int64_t active = 0;
};
KimiParamCount parameter_count(const KimiConfig& c);

// Weight bytes read by one decode step at batch 1, with dense matrices in
// `dense` and routed experts in `experts` (row_bytes of dtype.h), small
// tensors (norms, conv taps, A_log, dt_bias, router bias) in f32. Only the
// top-k routed experts of each layer and one embedding row are read.
int64_t weight_bytes_per_step(const KimiConfig& c, DType dense, DType experts);
// All weights stored, same conventions.
int64_t weight_bytes_total(const KimiConfig& c, DType dense, DType experts);
// KV cache bytes per token: expanded K (n_head * (nope + extra)) and V
// (n_head * v_head_dim) of every MLA layer.
int64_t kv_bytes_per_token(const KimiConfig& c, int elem_bytes = 4);
// Per-sequence recurrent state of the KDA layers (f32).
struct KimiStateBytes {
  int64_t kda_state = 0;    // S [n_head][head_dim][head_dim] per layer
  int64_t conv_window = 0;  // (conv_kernel - 1) previous q|k|v inputs per layer
  int64_t total() const { return kda_state + conv_window; }
};
KimiStateBytes recurrent_state_bytes(const KimiConfig& c);

std::string describe(const KimiConfig& c);

}  // namespace megakern
