// Dense decoder-only transformers read from GGUF: the families of
// model/dense_families.h (llama / Mistral / Llama 3, qwen2 with q/k/v biases,
// qwen3 with per-head q/k norms, phi3 with fused projections, gemma2 with
// soft-caps, gemma3 with sliding-window and global layers). Weights, KV cache
// and a prompt pass that runs the model's decode program; every buffer's
// shape is noted.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/expert_bank.h"
#include "ir/sequence_state.h"
#include "kernels/cpu/matmul.h"
#include "model/dense_families.h"

namespace megakern {

class GGUFFile;

struct DenseConfig {
  const DenseFamily* family = nullptr;
  std::string arch_name;  // general.architecture
  int n_layer = 0;
  int n_embd = 0;      // hidden size
  int n_ff = 0;        // MLP width
  int n_head = 0;      // query heads
  int n_head_kv = 0;   // key/value heads (GQA when fewer than n_head)
  int head_dim = 0;    // per-head width of q, k and v
  int n_vocab = 0;
  int n_ctx_train = 0;
  float eps = 1e-5f;
  float rope_base = 10000.f;        // global layers
  float rope_base_local = 10000.f;  // sliding-window layers (gemma3)
  int rope_dim = 0;                 // leading dims of each head that are rotated
  bool rope_neox = false;           // pairs (i, i + rope_dim/2) instead of (2i, 2i+1)
  // LongRoPE (Phi-3 128k, Phi-3.5): a sequence whose context (positions it
  // can hold) exceeds rope_long_context rotates by the long factors, one of
  // at most that many by the short ones (rope_freqs); the rotated dims are
  // multiplied by rope_amplitude (the attention factor) either way.
  int rope_long_context = 0;        // 0: no LongRoPE
  float rope_amplitude = 1.f;
  int sliding_window = 0;           // 0: none
  std::vector<bool> layer_swa;      // [n_layer] true where the layer uses the window
  float attn_scale = 1.f;           // multiplies q.k
  float embd_scale = 1.f;           // multiplies the token embedding
  bool gelu = false;                // GELU(tanh) gate instead of SiLU
  bool qk_norm = false;             // per-head RMSNorm on q and k
  bool sandwich_norm = false;       // gemma: norms after attention and MLP outputs too
  float attn_softcap = 0.f;         // gemma2: attention scores soft-capped (0: none)
  float final_softcap = 0.f;        // gemma2: logits soft-capped (0: none)
  // MoE families (qwen3moe, qwen2moe): experts per layer, selected per token, their MLP
  // width, and whether the selected softmax scores are renormalised.
  int n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
  bool expert_weights_norm = true;
  // deepseek2: multi-head latent attention (n_head_kv = n_head, head_dim =
  // qk_nope + qk_rope, the value heads v_head_dim wide), the leading
  // n_dense_lead layers dense (n_ff), the others routed experts plus
  // n_ff_shexp of shared expert; sigmoid or softmax scores, group-limited,
  // the weights times expert_weights_scale.
  bool mla = false;
  int q_lora_rank = 0, kv_lora_rank = 0, qk_nope = 0, qk_rope = 0, v_head_dim = 0;
  int n_dense_lead = 0, n_ff_shexp = 0;
  // qwen2moe: the shared expert's output is scaled by sigmoid(sh_gate_inp . x).
  bool shared_gate = false;
  bool gating_sigmoid = false;
  float expert_weights_scale = 1.f;
  int n_group = 1, topk_group = 1;
  // gpt-oss: the router's weights a softmax over the selected logits, the
  // experts' clamped SwiGLU with biases, per-head attention sinks, biases on
  // q/k/v and the output projection.
  bool gpt_oss = false;
  int v_dim() const { return mla ? v_head_dim : head_dim; }
  bool layer_moe(int l) const { return n_expert > 0 && l >= n_dense_lead; }
};

struct DenseLayer {
  std::vector<float> attn_norm, ffn_norm;            // [n_embd]
  std::vector<float> q_norm, k_norm;                 // [head_dim] when qk_norm
  std::vector<float> post_attn_norm, post_ffn_norm;  // [n_embd] when sandwich_norm
  MatView wq;     // [n_head*head_dim][n_embd]
  MatView wk, wv; // [n_head_kv*head_dim][n_embd]
  MatView wo;     // [n_embd][n_head*head_dim]
  MatView w_gate, w_up;  // [n_ff][n_embd]
  MatView w_down;        // [n_embd][n_ff]
  std::vector<float> bq, bk, bv;  // [rows of wq / wk / wv] when the family has q/k/v biases
  std::vector<float> bo;          // [n_embd] output-projection bias (gpt-oss), or empty
  std::vector<float> sinks;       // [n_head] attention sink logits (gpt-oss), or empty
  std::vector<float> router_b;    // [n_expert] router logit bias (gpt-oss), or empty
  // MoE families: the router [n_expert][n_embd] and the routed experts
  // (views into the file's 3-D tensors); w_gate / w_up / w_down are unused.
  MatView router;
  ExpertBank experts;
  std::vector<float> router_bias;  // [n_expert] selection bias (deepseek2), or empty
  MatView sh_gate, sh_up, sh_down; // shared experts (deepseek2, qwen2moe)
  MatView sh_gate_inp;             // [1][n_embd]: the shared expert's gate logit (qwen2moe), or empty
  // MLA (deepseek2): see DecodeProgram::MlaSpec.
  MatView q_a, q_b, kv_a, kv_b_k, kv_b_v;
  std::vector<float> q_a_norm, kv_a_norm;
};

class DenseModel {
 public:
  // Reads the config and tensor views; the GGUF file must outlive the model.
  // Throws megakern::Error naming a missing tensor or a wrong shape.
  // With `weights` = F32, every weight matrix (embedding and output
  // included) is dequantised to f32 at load and owned by the model: the
  // f32 computation of the very same weights, which accuracy measurements
  // (megakern perplexity --kl-base) compare the quantised kernels against.
  // Other formats are refused: requantising a quantised file would change
  // the weights.
  static std::unique_ptr<DenseModel> load(const GGUFFile& file, std::optional<DType> weights = std::nullopt);

  const DenseConfig& config() const { return cfg_; }
  // Bytes of weights read by one decode step.
  size_t weight_bytes() const;

  const MatView& tok_embd() const { return tok_embd_; }
  const MatView& output() const { return output_; }
  const std::vector<float>& output_norm() const { return output_norm_; }
  const std::vector<DenseLayer>& layers() const { return layers_; }
  // [rope_dim / 2] RoPE frequency divisors (Llama 3, linear, YaRN, LongRoPE's
  // short factors), or empty.
  const std::vector<float>& rope_freqs() const { return rope_freqs_; }
  // [rope_dim / 2] LongRoPE's long factors, or empty (config().rope_long_context).
  const std::vector<float>& rope_freqs_long() const { return rope_freqs_long_; }

 private:
  DenseConfig cfg_;
  MatView tok_embd_;  // [n_vocab][n_embd]
  MatView output_;    // [n_vocab][n_embd] (the embedding when tied)
  std::vector<float> output_norm_;
  std::vector<float> rope_freqs_;
  std::vector<float> rope_freqs_long_;
  std::vector<DenseLayer> layers_;
  // Storage of matrices dequantised at load (load with weights = F32); the
  // MatViews above point into it.
  std::vector<std::vector<float>> owned_;
  std::vector<std::vector<uint8_t>> owned_bytes_;  // rows gathered from a fused tensor, in its format
  void dequantize_all_to_f32();
  void load_mla_layer(const GGUFFile& f, int layer);
};

}  // namespace megakern
