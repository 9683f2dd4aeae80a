// The dense transformer families the engine reads: one entry per family with
// what distinguishes it (RoPE pairing, norms, biases, fused projections,
// windows, soft-caps), the GGUF `general.architecture` and Hugging Face
// `model_type` names it answers to, and its tensor names in both forms.
//
// GGUF tensor names follow llama.cpp's converter (one spelling per tensor
// kind, shared by every architecture: "blk.{layer}.attn_q.weight"); a
// Hugging Face checkpoint names them per family. Loaders ask this table for a
// name (dense_tensor_name / hf_tensor_name) and never spell one themselves.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megakern {

// The tensors of a dense decoder. Per-layer kinds take the layer index.
enum class DenseTensor {
  TokenEmbd,     // [n_vocab][n_embd]
  Output,        // [n_vocab][n_embd]; absent when tied to the embedding
  OutputNorm,    // [n_embd]
  RopeFreqs,     // [rope_dim / 2] frequency divisors (Llama 3 scaling), global
  RopeFactorsLong,   // [rope_dim / 2] LongRoPE's divisors past the original context, global
  RopeFactorsShort,  // [rope_dim / 2] LongRoPE's divisors within it, global
  AttnNorm,      // [n_embd]
  AttnQ,         // [n_head * head_dim][n_embd]
  AttnK,         // [n_head_kv * head_dim][n_embd]
  AttnV,         // [n_head_kv * head_dim][n_embd]
  AttnQkv,       // fused q | k | v rows (Phi-3)
  AttnOut,       // [n_embd][n_head * head_dim]
  AttnQNorm,     // [head_dim]
  AttnKNorm,     // [head_dim]
  AttnPostNorm,  // [n_embd] (Gemma's norm of the attention output)
  FfnNorm,       // [n_embd]
  FfnGate,       // [n_ff][n_embd]
  FfnUp,         // [n_ff][n_embd], or gate | up rows when fused (Phi-3)
  FfnDown,       // [n_embd][n_ff]
  FfnPostNorm,   // [n_embd] (Gemma's norm of the MLP output)
  FfnGateInp,    // [n_expert][n_embd] router (MoE families)
  FfnGateExps,   // [n_expert][n_ff_exp][n_embd] routed experts' gate matrices (GGUF: one 3-D tensor)
  FfnUpExps,     // [n_expert][n_ff_exp][n_embd]
  FfnDownExps,   // [n_expert][n_embd][n_ff_exp]
  // Multi-head latent attention (deepseek2); per head q and k are [nope | rope].
  AttnQA,        // [q_lora_rank][n_embd]
  AttnQANorm,    // [q_lora_rank]
  AttnQB,        // [n_head * (nope + rope)][q_lora_rank]; AttnQ instead without a q rank
  AttnKvAMqa,    // [kv_lora_rank + rope][n_embd]: the latent, then the key dims shared by all heads
  AttnKvANorm,   // [kv_lora_rank]
  AttnKvB,       // [n_head * (nope + v)][kv_lora_rank], per head key rows then value rows (older converters)
  AttnKB,        // GGUF shape {nope, kv_lora_rank, n_head}: the key part of AttnKvB, each head's block transposed
  AttnVB,        // GGUF shape {kv_lora_rank, v, n_head} (the value part of AttnKvB)
  FfnGateShexp,  // [n_ff_shexp][n_embd] shared experts' gate (all shared experts as one MLP)
  FfnUpShexp,    // [n_ff_shexp][n_embd]
  FfnDownShexp,  // [n_embd][n_ff_shexp]
  FfnExpProbsB,  // [n_expert] the router's selection bias (DeepSeek-V3's e_score_correction_bias)
  AttnSinks,     // [n_head] per-head attention sink logits (gpt-oss)
  FfnGateInpShexp,  // [n_embd] (GGUF {n_embd} or {n_embd, 1}): the shared expert's gate logit (Qwen2-MoE)
  // Gated DeltaNet layers (qwen3next, qwen35, qwen35moe): n_k key heads of
  // d_k, n_v value heads of d_v, C = 2 n_k d_k + n_v d_v conv channels.
  AttnGate,      // [n_v d_v][n_embd]: z, the gate of the output norm
  SsmIn,         // [C + n_v d_v][n_embd]: older qwen3next files, per key head [q | k | v | z] (as in_proj_qkvz)
  SsmConv1d,     // GGUF {taps, C}: the depthwise causal conv
  SsmDt,         // [n_v] (suffix "bias"): dt_bias
  SsmA,          // [n_v] (no suffix): A = -exp(A_log)
  SsmBa,         // [2 n_v][n_embd]: per key head [b | a] of its value heads (qwen3next)
  SsmBeta,       // [n_v][n_embd]: b (qwen35, qwen35moe)
  SsmAlpha,      // [n_v][n_embd]: a (qwen35, qwen35moe)
  SsmNorm,       // [d_v]: the gated RMSNorm's weight
  SsmOut,        // [n_embd][n_v d_v]
  // gpt-oss in Hugging Face form: the experts' gate and up matrices
  // interleaved (gate = even columns, up = odd) and transposed, one tensor
  // [n_expert][n_embd][2 n_ff_exp] per layer (with "_bias" [n_expert][2 n_ff_exp]);
  // or MXFP4 "_blocks" [n_expert][2 n_ff_exp][n_embd / 32][16] and "_scales"
  // [n_expert][2 n_ff_exp][n_embd / 32] with gate and up rows interleaved.
  // GGUF splits them into FfnGateExps / FfnUpExps. Newer llama.cpp
  // converters write Qwen3.5-MoE's experts fused as ffn_gate_up_exps
  // [n_expert][2 n_ff_exp][n_embd]: per expert the gate rows, then the up rows.
  FfnGateUpExps,
  // Kimi Delta Attention layers (kimi-linear; model/kimi_linear.cpp): n heads
  // of d, q / k / v as AttnQ / AttnK / AttnV, beta logits as SsmBeta [n][n_embd],
  // A as SsmA, dt_bias as SsmDt [n d], the output norm SsmNorm [d].
  SsmConv1dQ,    // GGUF {taps, 1, n d, 1} (or {taps, n d}): the depthwise causal conv of q (k, v alike)
  SsmConv1dK,
  SsmConv1dV,
  SsmFA,         // [rank][n_embd]: the forget gate's low-rank input
  SsmFB,         // [n d][rank]
  SsmGA,         // [rank][n_embd]: the output gate's low-rank input
  SsmGB,         // [n d][rank]
};
inline constexpr int kDenseTensorKinds = static_cast<int>(DenseTensor::SsmGB) + 1;

// Which layers use the sliding window.
enum class SwaPattern {
  None,        // no layer (or every layer, when the file gives a window: see DenseFamily::window_all)
  EvenLayers,  // layers 0, 2, 4, ... (Gemma 2)
  FiveOfSix,   // all but every sixth layer (Gemma 3)
};

struct DenseFamily {
  std::string_view name;                    // "qwen2"
  std::string_view gguf_arch;               // general.architecture
  std::vector<std::string_view> hf_types;   // config.json model_type values
  bool rope_neox = true;       // rotate pairs (i, i + d/2); false: adjacent pairs of GGUF's permuted q/k (llama)
  bool qk_norm = false;        // per-head RMSNorm of q and k
  bool sandwich_norm = false;  // norms after the attention and MLP outputs (Gemma)
  bool gelu = false;           // GELU(tanh) gate instead of SiLU
  bool embd_scale_sqrt = false;  // the embedding is multiplied by sqrt(n_embd) (Gemma)
  bool qkv_bias = false;       // q, k and v projections carry biases (required)
  bool fused_qkv = false;      // attn_qkv holds q | k | v
  bool fused_gate_up = false;  // ffn_up holds gate | up
  bool hf_norm_plus_one = false;  // HF stores RMSNorm weights as w - 1 (Gemma); GGUF stores w
  bool hf_permute_qk = false;     // GGUF's q/k rows are permuted for adjacent-pair RoPE (llama)
  bool window_all = false;        // a window key, when present, applies to every layer
  SwaPattern swa = SwaPattern::None;
  float rope_base_local = 0.f;    // RoPE base of the sliding-window layers (0: the global base)
  bool moe = false;               // the MLP is a routed mixture of experts (after any leading dense layers)
  bool mla = false;               // multi-head latent attention with shared and routed experts (deepseek2)
  bool gpt_oss = false;           // sinks, biases everywhere, clamped-SwiGLU experts, YaRN (gpt-oss)
  // A shared expert of its own width (expert_shared_feed_forward_length)
  // next to the routed ones, its output scaled by sigmoid(w . x) (Qwen2-MoE).
  bool gated_shared_expert = false;
  // Whether the routed weights are renormalised when a GGUF file has no
  // expert_weights_norm key (llama.cpp's default for the architecture).
  bool expert_norm_default = true;
  // Hugging Face tensor name patterns ("{0}" or "{}" is the layer, "{1}" the
  // expert), indexed by DenseTensor; empty where the family has no such tensor.
  std::vector<std::pair<DenseTensor, std::string_view>> hf_names;
};

// Every family, in the order they are matched.
const std::vector<DenseFamily>& dense_families();
const DenseFamily* dense_family_of_gguf(std::string_view general_architecture);
const DenseFamily* dense_family_of_hf(std::string_view model_type);

// "blk.3.attn_q.weight" (suffix "weight" or "bias"; none when empty, as
// "blk.3.ssm_a"); global kinds ignore layer.
std::string dense_tensor_name(DenseTensor t, int layer, std::string_view suffix = "weight");
// The family's Hugging Face name for a tensor (suffix appended as
// ".weight" / ".bias"), or nullopt when the family has no such tensor.
std::optional<std::string> hf_tensor_name(const DenseFamily& f, DenseTensor t, int layer,
                                          std::string_view suffix = "weight", int expert = 0);

// GGUF architectures of related families this engine recognises but does
// not run, with the reason a user is told.
std::optional<std::string> unsupported_gguf_reason(std::string_view general_architecture);

}  // namespace megakern
