// Kimi K3 (KDA + gated NoPE MLA, attention residuals, latent MoE; see
// model/kimi_config.h and ../shared/docs/reference-system.md): weights
// (synthetic or from a safetensors checkpoint) and the DecodeProgram.
//
// Checkpoint naming. Where a public implementation has the tensor, its name
// is used: flash-linear-attention / Kimi-Linear for KDA, DeepSeek-V3 for MLA,
// the router and the experts. Per layer l ("model.layers.l."):
//   input_layernorm.weight           [H]    RMSNorm of the attention sublayer input
//   post_attention_layernorm.weight  [H]    RMSNorm of the MLP sublayer input
//   attn_res.weight, mlp_res.weight  [H]    attention-residual vectors (no public
//                                            implementation; the doc's folded_w)
// KDA layers:
//   self_attn.{q,k,v}_proj.weight    [nh*D, H]
//   self_attn.g_proj.weight          [nh*D, H]  output gate (full rank, see kimi_config.h)
//   self_attn.b_proj.weight          [nh, H]    beta logits
//   self_attn.f_a_proj.weight        [rank, H], self_attn.f_b_proj.weight [nh*D, rank]  forget-gate input g
//   self_attn.{q,k,v}_conv1d.weight  [nh*D, 1, K]  depthwise causal conv (tap K-1 = current input)
//   self_attn.A_log                  nh values (any shape, e.g. [1, 1, nh, 1] as Kimi-Linear)
//   self_attn.dt_bias                [nh*D]
//   self_attn.o_norm.weight          [D], self_attn.o_proj.weight [H, nh*D]
// MLA layers (l % 4 == 3 and the last):
//   self_attn.q_a_proj.weight [ql, H], q_a_layernorm.weight [ql], q_b_proj.weight [nh*(Dn+De), ql]
//        (per head: Dn "nope" dims then De extra dims)
//   self_attn.kv_a_proj_with_mqa.weight [kvl+De, H] (latent rows, then the shared extra key dims)
//   self_attn.kv_a_layernorm.weight [kvl], self_attn.kv_b_proj.weight [nh*(Dn+Dv), kvl]
//        (per head: Dn key rows then Dv value rows)
//   self_attn.g_proj.weight [nh*Dv, H] (sigmoid output gate), self_attn.o_proj.weight [H, nh*Dv]
// Dense layers (layer 0): mlp.{gate,up}_proj.weight [FF, H], mlp.down_proj.weight [H, FF]
// MoE layers:
//   mlp.gate.weight [E, H], mlp.gate.e_score_correction_bias [E]
//   mlp.latent_down_proj.weight [L, H], mlp.latent_norm.weight [L], mlp.latent_up_proj.weight [H, L]
//   mlp.experts.e.{gate,up}_proj.weight_blocks [F, L/32, 16] U8 and .weight_scales [F, L/32] U8,
//   mlp.experts.e.down_proj.weight_blocks [L, F/32, 16] U8 and .weight_scales [L, F/32] U8:
//        MXFP4 as gpt-oss stores it (byte i of a block holds element 2i in its low nibble and
//        2i+1 in its high nibble; a scale byte is E8M0, 2^(s-127)); a float ".weight" instead
//        is accepted and quantised to MXFP4 at load;
//   mlp.shared_experts.{gate,up}_proj.weight [S, H], mlp.shared_experts.down_proj.weight [H, S]
// Global: model.embed_tokens.weight [V, H], model.attn_res.weight [H] (the final mixture's
// vector), model.norm.weight [H], lm_head.weight [V, H].
// config.json: model_type "kimi_k3" with the fields written by save().
//
// In memory: dense matrices keep their float type (F32/F16/BF16; other float
// types become F32); the fused KDA input projection is one matrix
// [q | k | v | g | b]; kv_b is split into its key and value rows; routed
// experts are [E * 2F][L] (gate rows, then up rows, per expert) and [E * L][F].
// Their format is MXFP4, or with KimiWeightOptions::fp8_experts the same
// values losslessly re-blocked to FP8 e4m3 (same E8M0 scale per 32), which
// the matrix kernels compute with f32 activations.
//
// Per-sequence state: a KVCache of the MLA layers (expanded per-head K
// [nh*(Dn+De)] and V [nh*Dv]; cache_index 0..n_mla-1) and a RecurrentState of
// the KDA layers (0..n_kda-1). A sequence's rows in one step form a block
// (chunked KDA) or a chain of per-row snapshots (RowInput::state_in).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/expert_bank.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "ir/program.h"
#include "kernels/cpu/matmul.h"
#include "model/kimi_config.h"

namespace megakern {


struct KimiLayer {
  bool mla = false, dense = false;
  int cache_index = 0;  // among the MLA layers (KV cache) or the KDA layers (state)
  std::vector<float> attn_norm, mlp_norm;  // [H]
  std::vector<float> attn_res, mlp_res;    // [H] attention-residual vectors
  MatView o_proj;                          // [H][nh*D] (KDA) or [H][nh*Dv] (MLA)
  // KDA.
  MatView kda_in;                 // [4*nh*D + nh][H]: q, k, v, g (output gate), b; [3*nh*D + nh][H]: q, k, v, b
                                  // with a low-rank output gate
  MatView f_a, f_b;               // [rank][H], [nh*D][rank]
  MatView g_a, g_b;               // [rank][H], [nh*D][rank]: the low-rank output gate (kda_out_gate_rank)
  std::vector<float> conv;        // [3*nh*D][K]
  std::vector<float> a_log;       // [nh]
  std::vector<float> dt_bias;     // [nh*D]
  std::vector<float> o_norm;      // [D]
  // MLA.
  MatView q_a, q_b;               // [ql][H], [nh*(Dn+De)][ql]
  MatView kv_a;                   // [kvl+De][H]
  MatView kv_b_k, kv_b_v;         // [nh*Dn][kvl], [nh*Dv][kvl]
  MatView gate;                   // [nh*Dv][H]
  std::vector<float> q_a_norm, kv_a_norm;  // [ql], [kvl]
  // Dense MLP (dense layers) or the shared expert (MoE layers).
  MatView mlp_gate, mlp_up;       // [FF][H]
  MatView mlp_down;               // [H][FF]
  // Latent MoE.
  MatView router;                 // [E][H]
  std::vector<float> router_bias; // [E]
  MatView latent_down, latent_up; // [L][H], [H][L]
  std::vector<float> latent_norm; // [L]
  MatView experts_gu;             // [E*2F][L]
  MatView experts_down;           // [E*L][F]
  ExpertBank experts;             // per-expert views of the two matrices above, SiTU
};

struct KimiWeightOptions {
  DType dense = DType::BF16;   // synthetic(): the type of the dense matrices (F32, F16 or BF16)
  bool fp8_experts = false;    // re-block the MXFP4 experts to FP8 e4m3 (lossless)
  // synthetic(): matrices get shapes and addresses in reserved, inaccessible
  // address space but no memory and no values (vectors are still filled).
  // For planning only: the program and the megakernel schedules of a config
  // too large to hold (the full kimi-k3) can be built, but not run.
  bool shapes_only = false;
};

class KimiModel {
 public:
  // Deterministic synthetic weights for any config: the same (config, seed,
  // options) give the same bits. Matrices are scaled by 1/sqrt(fan_in) (output
  // projections by half that) so activations stay O(1) through all layers;
  // experts are MXFP4-quantised.
  static std::unique_ptr<KimiModel> synthetic(const KimiConfig& c, uint64_t seed, const KimiWeightOptions& o = {});
  // Reads dir/config.json and dir/model.safetensors (or a sharded index; see
  // SafetensorsModel::open). Throws megakern::Error naming a missing tensor, a
  // wrong shape or dtype, or a bad config field.
  // A checkpoint in the published reference's layout (model/kimi_layout.cpp)
  // is read too; an error about one of its tensors then also gives the
  // tensor's name in that layout.
  static std::unique_ptr<KimiModel> load(const std::string& dir, const KimiWeightOptions& o = {});
  // Kimi Linear (model/kimi_linear.cpp): a GGUF file of architecture
  // kimi-linear in llama.cpp's converter naming and conventions, or a Hugging
  // Face directory of model_type kimi_linear (read as the GGUF image the
  // converter would write, so both forms give the same bits). Matrices keep
  // their float formats; the model keeps the file. Throws megakern::Error
  // naming a missing tensor, a wrong shape or an unsupported key.
  static std::unique_ptr<KimiModel> load_gguf(std::unique_ptr<GGUFFile> file);
  static std::unique_ptr<KimiModel> load_kimi_linear_dir(const std::string& dir);
  // Writes dir/config.json and dir/model.safetensors (dir is created) in the
  // naming above; load(dir) gives back the same weights.
  void save(const std::string& dir) const;

 private:
  static std::unique_ptr<KimiModel> load_checkpoint(const std::string& dir, const KimiWeightOptions& o);

 public:
  // Views point into buffers the model owns, so it is neither copied nor assigned.
  KimiModel(const KimiModel&) = delete;
  KimiModel& operator=(const KimiModel&) = delete;
  ~KimiModel();

  const KimiConfig& config() const { return cfg_; }
  int n_vocab() const { return cfg_.vocab; }

  const MatView& tok_embd() const { return tok_embd_; }
  const MatView& lm_head() const { return lm_head_; }
  const std::vector<float>& final_norm() const { return final_norm_; }
  const std::vector<float>& final_res() const { return final_res_; }
  const std::vector<KimiLayer>& layers() const { return layers_; }
  // The GGUF file (or a checkpoint directory's GGUF image) a Kimi Linear
  // model reads, or null.
  const GGUFFile* gguf() const { return gguf_.get(); }

 private:
  KimiModel() = default;
  // A zero-filled buffer of `bytes` owned by the model (shapes only: an
  // address range in the reservation, not backed by memory).
  uint8_t* own(size_t bytes);
  uint8_t* reserved_ = nullptr;  // shapes-only address space
  size_t reserved_bytes_ = 0, reserved_used_ = 0;
  KimiConfig cfg_;
  std::vector<std::vector<uint8_t>> owned_;
  // The mapped checkpoint files a loaded model's views point into.
  std::unique_ptr<SafetensorsModel> st_;
  // A Kimi Linear model's GGUF image (from a checkpoint directory) and file.
  std::vector<uint8_t> image_;
  std::unique_ptr<GGUFFile> gguf_;
  MatView tok_embd_, lm_head_;
  std::vector<float> final_norm_, final_res_;
  std::vector<KimiLayer> layers_;
  friend struct KimiBuilder;
};

// Reads a KimiConfig from a config.json object written by save() (model_type
// "kimi_k3"); throws megakern::Error naming a missing or bad field.
KimiConfig kimi_config_from_json(const std::string& json_text, const std::string& where);
// The published reference's checkpoint layout (model/kimi_layout.cpp): true
// when a config.json text is in its form (text_config, num_experts, ...).
bool is_kimi_reference_config(const std::string& json_text);
// The reference-layout name of one of our tensor names ("model.layers.4.mlp.
// experts.5.up_proj.weight_scales" -> "language_model.model.layers.4.
// block_sparse_moe.experts.5.w3.weight_scale"); for a folded attention-residual
// weight, its _norm.weight half.
std::string kimi_reference_name(const std::string& ours);
// A checkpoint's tensors under the names KimiModel::load reads: views of
// the tensors of a SafetensorsModel (which must outlive it), renamed and
// reshaped but never copied, plus the few tensors computed at load (the
// folded attention-residual weights), whose bytes `computed` holds.
struct KimiTensors {
  std::string path;  // for messages
  std::map<std::string, SafetensorsTensor> tensors;
  std::vector<std::vector<uint8_t>> computed;
  const SafetensorsTensor* find(const std::string& name) const {
    auto it = tensors.find(name);
    return it == tensors.end() ? nullptr : &it->second;
  }
};
// The tensors of a checkpoint in our layout, as they are.
KimiTensors kimi_tensors(const SafetensorsModel& st);
// Reads such a checkpoint: fills c from its config (kimi/__init__.py
// Config.from_checkpoint keys) and returns the tensors of st (its files)
// renamed, reshaped and folded into the names KimiModel::load reads. Throws
// megakern::Error naming a bad key or tensor.
KimiTensors open_kimi_reference(const SafetensorsModel& st, const std::string& cfg_path, const std::string& text,
                                KimiConfig& c);
std::string kimi_config_to_json(const KimiConfig& c);

// The decode step: embedding into residual block 0; per layer the attention
// sublayer (residual mixture, RMSNorm, KDA or gated MLA, added to the prefix
// or restarting it at a block boundary) and the MLP sublayer (mixture,
// RMSNorm, dense SiTU MLP or latent MoE + shared expert, added to the prefix);
// the final mixture, RMSNorm and LM head. `recurrent` is set.
DecodeProgram build_kimi_program(const KimiModel& model, int max_rows);

}  // namespace megakern
