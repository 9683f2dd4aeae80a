// Qwen3.8 hyperparameters and size arithmetic: the Gated DeltaNet + gated full
// attention hybrid of ../shared/docs/reference-system.md ("Qwen3.8-27B").
//
// The architecture is the one of the public Qwen3.5 dense checkpoints
// (transformers' `qwen3_5_text`, e.g. Qwen/Qwen3.5-27B has exactly these
// hyperparameters). Tensor names and shapes follow that implementation
// (transformers 5.24 `models/qwen3_5/modeling_qwen3_5.py`, Qwen3_5ForCausalLM),
// per decoder layer l:
//
//   model.layers.l.input_layernorm.weight            [H]            zero-centred (1 + w)
//   model.layers.l.post_attention_layernorm.weight   [H]            zero-centred (1 + w)
//   model.layers.l.mlp.{gate,up}_proj.weight         [FF, H]        SwiGLU: down(silu(gate x) * up x)
//   model.layers.l.mlp.down_proj.weight              [H, FF]
// full attention layers (l % 4 == 3):
//   model.layers.l.self_attn.q_proj.weight  [n_head * head_dim * 2, H]
//        output viewed as [n_head][2][head_dim]: per head first the query,
//        then the gate (NOT all queries then all gates);
//   model.layers.l.self_attn.k_proj.weight  [n_head_kv * head_dim, H]
//   model.layers.l.self_attn.v_proj.weight  [n_head_kv * head_dim, H]
//   model.layers.l.self_attn.o_proj.weight  [H, n_head * head_dim]
//   model.layers.l.self_attn.{q,k}_norm.weight [head_dim]   zero-centred, per head
// Gated DeltaNet layers (the rest):
//   model.layers.l.linear_attn.in_proj_qkv.weight [2 * key_dim + value_dim, H]
//        rows: all q (key heads x k_dim), then all k, then all v (value heads x v_dim)
//   model.layers.l.linear_attn.in_proj_z.weight   [value_dim, H]  (gate of the output norm)
//   model.layers.l.linear_attn.in_proj_b.weight   [n_v_heads, H]  (beta = sigmoid(b))
//   model.layers.l.linear_attn.in_proj_a.weight   [n_v_heads, H]  (decay input a)
//   model.layers.l.linear_attn.conv1d.weight      [conv_dim, 1, conv_kernel]  (depthwise, no bias)
//   model.layers.l.linear_attn.dt_bias            [n_v_heads]
//   model.layers.l.linear_attn.A_log              [n_v_heads]
//   model.layers.l.linear_attn.norm.weight        [v_head_dim]  gated RMSNorm, NOT zero-centred
//   model.layers.l.linear_attn.out_proj.weight    [H, value_dim]
// and model.embed_tokens.weight [V, H], model.norm.weight [H] (zero-centred),
// lm_head.weight [V, H] (absent where the embeddings are tied).
//
// (Qwen3-Next, the MoE sibling, packs the DeltaNet input differently:
// in_proj_qkvz [key heads][q k | v z of its value heads] and in_proj_ba
// [key heads][b | a of its value heads]; the parameter counts are the same.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace megakern {

class GGUFFile;
class HFConfig;

struct Qwen38Config {
  std::string name;
  int n_layer = 0;         // num_hidden_layers
  int hidden = 0;          // hidden_size (H)
  int intermediate = 0;    // MLP width (FF), SwiGLU
  int vocab = 0;           // vocab_size (V)
  double rms_eps = 1e-6;   // every RMSNorm, the gated one included
  bool tie_embeddings = false;   // the LM head reads embed_tokens (Qwen3.8's presets: false)
  bool zero_centred_norm = true; // x * rsqrt(mean(x^2) + eps) * (1 + w), except the gated norm

  // Gated full attention.
  int full_attn_interval = 4;  // layer l is full attention when l % interval == interval - 1
  int n_head = 0;              // query heads
  int n_head_kv = 0;           // key/value heads (GQA)
  int head_dim = 0;
  int rotary_dim = 0;          // RoPE (rotate-half) on the first rotary_dim dims of each head
  double rope_theta = 1e7;

  // Gated DeltaNet ("linear attention").
  int la_n_k_heads = 0;   // query/key heads
  int la_n_v_heads = 0;   // value heads; each key head serves la_n_v_heads / la_n_k_heads
  int la_k_head_dim = 0;
  int la_v_head_dim = 0;
  int conv_kernel = 4;    // causal depthwise conv over q, k, v channels
  // Qwen3-Next's checkpoint layout (model_type qwen3_next): the DeltaNet
  // projections fused per key head, in_proj_qkvz rows [q | k | v | z] of each
  // key head (v and z for its la_n_v_heads / la_n_k_heads value heads) and
  // in_proj_ba rows [b | a] of each key head's value heads.
  bool fused_qkvz = false;
  // Qwen3.5's GGUF layout (qwen35, qwen35moe): llama.cpp's converter stores
  // the value heads tiled (value head j r + g of key head g at position
  // j n_k + g) instead of grouped by key head; the loader puts them back.
  bool tiled_v_heads = false;

  // Mixture of experts in every layer instead of the SwiGLU MLP (Qwen3-Next;
  // 0 experts: dense): softmax routing to the top n_expert_used, renormalised
  // when norm_topk_prob, plus a shared expert of width shared_intermediate
  // scaled by sigmoid(shared_expert_gate . x).
  int n_expert = 0, n_expert_used = 0, moe_intermediate = 0, shared_intermediate = 0;
  bool norm_topk_prob = false;
  bool moe() const { return n_expert > 0; }

  bool is_full_attention(int layer) const { return layer % full_attn_interval == full_attn_interval - 1; }
  int n_full_attention_layers() const;
  int n_deltanet_layers() const { return n_layer - n_full_attention_layers(); }
  int64_t q_proj_rows() const { return int64_t(n_head) * head_dim * 2; }  // query and gate
  int64_t la_key_dim() const { return int64_t(la_n_k_heads) * la_k_head_dim; }
  int64_t la_value_dim() const { return int64_t(la_n_v_heads) * la_v_head_dim; }
  int64_t la_conv_dim() const { return 2 * la_key_dim() + la_value_dim(); }  // q, k, v channels
  // Throws megakern::Error naming the first inconsistent field.
  void validate() const;
};

// Presets: "qwen3.8-27b" (full size), "qwen3.8-mini" (tiny, tests; matches
// tests/fixtures/qwen38_mini/config.json), "qwen3.8-bench" (64 layers, reduced
// width, weights read per step >= 10 x 32 MiB in Q4_0, total < 4 GB in bf16).
const std::vector<Qwen38Config>& qwen38_presets();
const Qwen38Config* find_qwen38_preset(const std::string& name);

// One weight tensor of the checkpoint, with its Hugging Face name and
// row-major (PyTorch) shape.
struct Qwen38Tensor {
  enum class Kind {
    Embedding,   // model.embed_tokens.weight
    LmHead,      // lm_head.weight
    Attention,   // self_attn.* (projections and q/k norms)
    DeltaNet,    // linear_attn.* (projections, conv, A_log, dt_bias, gated norm)
    Mlp,         // mlp.*
    Norm,        // input/post_attention layernorms and the final norm
  };
  std::string name;
  std::vector<int64_t> shape;
  Kind kind;
  int layer = -1;  // -1 for embedding, head and final norm
  // A matrix the engine stores in the weight format (2-D, read as rows of
  // shape[1]); the rest (norm vectors, conv taps, A_log, dt_bias) stay f32.
  bool matrix = false;
  int64_t numel() const;
};
// model_prefix is "model." for Qwen3_5ForCausalLM checkpoints (and our
// fixtures); the released multimodal checkpoints (Qwen3_5ForConditionalGeneration,
// e.g. Qwen/Qwen3.5-27B) name the same tensors "model.language_model.layers.N...",
// "model.language_model.embed_tokens.weight", "model.language_model.norm.weight"
// and keep "lm_head.weight" (plus model.visual.* and mtp.*, which Qwen3.8 ignores).
// The full-size list has 851 tensors, as public Qwen3.5-27B loaders count.
// With fused_experts (MoE only), each layer's experts as
// mlp.experts.gate_up_proj [E][2 F][H] (per expert the gate rows, then the up
// rows) and mlp.experts.down_proj [E][H][F] instead of one matrix per expert.
std::vector<Qwen38Tensor> qwen38_tensors(const Qwen38Config& c, const std::string& model_prefix = "model.",
                                         bool fused_experts = false);

struct Qwen38ParamCount {
  int64_t embedding = 0;   // V * H
  int64_t attention = 0;   // all full-attention mixers (q/k/v/o, q/k norms)
  int64_t deltanet = 0;    // all DeltaNet mixers
  int64_t mlp = 0;         // all MLPs
  int64_t norms = 0;       // per-layer input/post norms + final norm
  int64_t lm_head = 0;     // V * H
  int64_t attention_per_layer = 0;
  int64_t deltanet_per_layer = 0;
  int64_t mlp_per_layer = 0;
  int64_t total() const { return embedding + attention + deltanet + mlp + norms + lm_head; }
};
Qwen38ParamCount parameter_count(const Qwen38Config& c);

// Weight bytes read by one decode step at batch 1: every tensor except the
// embedding, of which one row is read; the LM head is read whole.
// With a byte count per parameter, applied to every tensor alike
// (bf16 2, q8_0 34/32, q4_0 18/32):
double weight_bytes_per_step(const Qwen38Config& c, double bytes_per_param);
// With a weight format: matrices in `t` (row_bytes of dtype.h), the small
// tensors (norms, conv taps, A_log, dt_bias) in f32.
int64_t weight_bytes_per_step(const Qwen38Config& c, DType t);
// Bytes of all weights stored (the whole embedding), same conventions.
int64_t weight_bytes_total(const Qwen38Config& c, DType t);

// KV cache bytes per token: K and V of every full-attention layer,
// n_head_kv * head_dim each, in f32 (4) or bf16 (2) elements.
int64_t kv_bytes_per_token(const Qwen38Config& c, int elem_bytes = 4);

// Per-sequence recurrent state of the DeltaNet layers.
struct Qwen38StateBytes {
  int64_t delta_state = 0;  // f32 S[v_heads][v_dim][k_dim] per layer, all layers
  int64_t conv_window = 0;  // (conv_kernel - 1) previous inputs of the conv_dim channels, all layers
  int64_t total() const { return delta_state + conv_window; }
};
Qwen38StateBytes recurrent_state_bytes(const Qwen38Config& c, int conv_elem_bytes = 4);

// Human-readable table: hyperparameters, parameter counts per component,
// weights read per step for bf16 / q8_0 / q4_0, KV bytes per token, state bytes.
std::string describe(const Qwen38Config& c);

// Reads a Hugging Face config.json of the Qwen3.5 dense family
// (model_type "qwen3_5_text", or "qwen3_5" with a text_config). Throws
// megakern::Error for another model type, a layer_types list that is not the
// l % interval pattern, or an inconsistent config.
Qwen38Config qwen38_config_from_hf(const HFConfig& hf);

// The GGUF `general.architecture` values read as Qwen3.8: qwen3next (Qwen3-Next),
// qwen35 (Qwen3.5 dense) and qwen35moe (Qwen3.5-MoE).
const std::vector<std::string>& qwen38_gguf_architectures();
// Reads the hyperparameters of such a file, with the keys llama.cpp's
// converter writes ("{arch}.ssm.*" for the DeltaNet, the expert keys for the
// mixtures, "{arch}.attention.recurrent_layers" or full_attention_interval
// for the layer pattern; MTP blocks counted by nextn_predict_layers are not
// part of the model). Throws megakern::Error naming a missing or bad key.
Qwen38Config qwen38_config_from_gguf(const GGUFFile& f);

}  // namespace megakern
