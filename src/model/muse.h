// Muse Spark (model/muse_config.h for the architecture and its equations):
// the model's weights, their on-disk form, and its DecodeProgram.
//
// On disk a model is a directory with
//   config.json        {"model_type": "muse_spark", every MuseConfig field by
//                       name (name, n_layer, hidden, vocab, vocab_used, rms_eps,
//                       post_eps, n_head, n_head_kv, head_dim, window,
//                       rope_theta, qk_scale_factor, full_attn_interval,
//                       full_attn_offset, n_expert, top_k, expert_ff,
//                       expert_dim, router_scale, route_eps, logit_scale,
//                       logit_cap; post_eps, qk_scale_factor and route_eps
//                       default to the reference's values when absent),
//                       "dense_format", "expert_format" (dtype
//                       names as dtype_from_name reads them)}
//   model.safetensors  the tensors of muse_tensors(config), by these names
//                      (logical row-major shapes; l is the layer):
//     embed.weight [V][H], lm_head.weight [V][H], final_norm [H]
//     layers.l.attn_norm [H], layers.l.ffn_norm [H]
//     layers.l.attn.q [qd][H], .k [kvd][H], .v [kvd][H], .gate [qd][H], .o [H][qd]
//     layers.l.attn_gamma [H], layers.l.ffn_gamma [H]      (residual gates' gamma)
//     layers.l.post_ffn_norm [H]          (scales the MoE output before its norm)
//     layers.l.moe.router [E][H] (always F32), layers.l.moe.router_bias [E]
//     layers.l.moe.pre [D][H], layers.l.moe.pre_norm [D], layers.l.moe.post [H][D]
//     layers.l.moe.experts.gate [E][F][D], .up [E][F][D], .down [E][D][F]
//     layers.l.moe.experts.scale [3][E]   (global multipliers of gate, up, down;
//                                          NVFP4's per-tensor scale, 1 otherwise)
//     layers.l.moe.experts.norm [D]       (the experts' shared output norm weight)
// Matrices (embed, lm_head, attn.*, moe.pre, moe.post: the dense format;
// moe.experts.{gate,up,down}: the expert format) are stored as F32, F16 or
// BF16 with their logical shape when the format is one of those, otherwise
// as U8 with the last dimension replaced by the row's byte count in the
// block format (row_bytes of core/dtype.h), rows quantised one at a time.
// Vectors and the router are F32.
//
// Per-sequence state is a KVCache over all layers; the windowed layers are
// ring buffers of window + max_block - 1 positions (make_sequence_state with
// ring_block = max_block), so a long sequence grows only in the
// full-attention layers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/reserved_space.h"
#include "ir/expert_bank.h"
#include "ir/program.h"
#include "kernels/cpu/matmul.h"
#include "model/muse_config.h"

namespace megakern {

class SafetensorsModel;

struct MuseLayer {
  bool full = false;                         // full attention without RoPE (else windowed with RoPE)
  std::vector<float> attn_norm, ffn_norm;    // [H]
  MatView wq;                                // [qd][H]
  MatView wk, wv;                            // [kvd][H]
  MatView wgate;                             // [qd][H]: one sigmoid gate per channel
  MatView wo;                                // [H][qd]
  std::vector<float> attn_gamma, ffn_gamma;  // [H] as stored
  std::vector<float> post_ffn_norm;          // [H]
  std::vector<float> attn_gate;              // [2H]: [alpha | beta] from attn_gamma
  std::vector<float> ffn_gate;               // [3H]: [alpha | beta] from ffn_gamma | post_ffn_norm
  MatView router;                            // [E][H], f32
  std::vector<float> router_bias;            // [E]
  MatView pre;                               // [D][H]
  std::vector<float> pre_norm;               // [D]
  MatView post;                              // [H][D]
  ExpertBank experts;                        // E x (gate, up [F][D], down [D][F]), shared norm [D]
};

class MuseModel {
 public:
  // Deterministic synthetic weights for a config: the same (config, seed,
  // formats) always gives the same bytes. Matrices are uniform with unit
  // output variance for unit-variance inputs (bound sqrt(3 / cols)); norm
  // weights 1 +- 0.1; gammas in +-0.5; router biases in +-0.02. Every
  // sublayer output is RMS-normalised before it enters the residual stream
  // and alpha^2 + beta^2 stays near 1, so activations stay finite over any
  // number of layers. dense: F32, F16, BF16 or INT8_COL; experts: F32, BF16,
  // INT4_G128 or NVFP4 (any block format of dtype.h is accepted).
  static std::unique_ptr<MuseModel> synthetic(const MuseConfig& c, uint64_t seed, DType dense = DType::BF16,
                                              DType experts = DType::INT4_G128);
  // Writes dir/config.json and dir/model.safetensors (creating dir).
  void save(const std::string& dir) const;
  // Reads a directory written by save() (or by any writer following the
  // layout above), or a checkpoint in the reference's layout (see
  // save_reference; recognised by its Hugging Face style config.json).
  // Throws megakern::Error naming a missing tensor, a wrong dtype or shape
  // (with the expected one), or a bad config.
  static std::unique_ptr<MuseModel> load(const std::string& dir);
  // The config's shapes without weight memory: matrices point into reserved
  // address space (any access faults), vectors are zeros. Its program can be
  // built and scheduled (`inspect --schedule`, `--race-check`), not run.
  static std::unique_ptr<MuseModel> shapes_only(const MuseConfig& c, DType dense = DType::BF16,
                                                DType experts = DType::INT4_G128);
  // Writes dir/config.json and dir/model.safetensors in the layout of the
  // published reference's checkpoints (musespark/config.py from_checkpoint,
  // musespark/load.py LAYER_SUFFIXES / GLOBAL_KEYS): config keys under
  // "text_config" (hidden_size, moe_hidden_size, moe_intermediate_size,
  // num_local_experts, num_experts_per_tok, layer_types, layer_rope_theta,
  // ...); tensors model.language_model.embed_tokens.weight, lm_head.weight,
  // model.language_model.norm.weight and per layer
  // model.language_model.layers.l.{input_layernorm, pre_feedforward_layernorm,
  // post_feedforward_layernorm}.weight, self_attn.{q,k,v,gate,o}_proj.weight,
  // post_attention_residual_gate.gate, post_feedforward_residual_gate.gate,
  // mlp.gate.weight (F32), mlp.gate.e_score_correction_bias,
  // mlp.pre_expert_proj.weight, mlp.pre_expert_norm.weight,
  // mlp.experts.gate_up_proj [E][2F][D] (gate rows, then up rows),
  // mlp.experts.down_proj [E][D][F], mlp.experts.post_expert_norm.weight,
  // mlp.post_expert_proj.weight. Norm weights are zero-centred (the stored w
  // means 1 + w) except the final norm; the loader rounds 1 + w to bf16 as
  // the reference's eff_weight does, so a round trip keeps a norm weight
  // only up to that rounding. Matrices are written as stored when the format
  // is F32, F16 or BF16, otherwise dequantised to F32; the NVFP4 global
  // scales are folded in. The vocabulary mask of a reference checkpoint is
  // the reference's: ids >= min(201818, vocab_size).
  void save_reference(const std::string& dir) const;
  ~MuseModel();

  const MuseConfig& config() const { return cfg_; }
  DType dense_format() const { return dense_; }
  DType expert_format() const { return expert_; }
  int n_vocab() const { return cfg_.vocab; }

  const MatView& tok_embd() const { return embed_; }
  const MatView& lm_head() const { return lm_head_; }
  const std::vector<float>& final_norm() const { return final_norm_; }
  const std::vector<MuseLayer>& layers() const { return layers_; }
  // [head_dim] ones: the weight of the parameter-free per-head norms.
  const std::vector<float>& unit_norm() const { return ones_; }
  // [H] ones: the weight of the parameter-free embedding norm.
  const std::vector<float>& unit_hidden() const { return ones_h_; }
  // [vocab]: 0 for used ids, -inf for ids >= vocab_used.
  const std::vector<float>& vocab_mask() const { return vocab_mask_; }

 private:
  MuseModel() = default;
  // Points every view at tensor_data_ (filled by synthetic or load).
  void bind();
  // load() of a directory in the reference's layout (model/muse_layout.cpp).
  static std::unique_ptr<MuseModel> load_reference(const std::string& dir, const std::string& config_path);
  MuseConfig cfg_;
  DType dense_ = DType::BF16, expert_ = DType::INT4_G128;
  std::unique_ptr<SafetensorsModel> st_;
  std::vector<std::vector<uint8_t>> owned_;
  std::unique_ptr<ReservedSpace> reserved_;  // shapes_only(): the matrices' address space
  std::map<std::string, const uint8_t*> tensor_data_;  // muse_tensors() name -> stored bytes
  // Bytes from one expert's gate (and up) rows to the next expert's: 0 for
  // separate [E][F][D] tensors; 2F rows where gate and up are row ranges of
  // one fused [E][2F][D] tensor.
  size_t glu_stride_ = 0;
  MatView embed_, lm_head_;
  std::vector<float> final_norm_, ones_, ones_h_, vocab_mask_;
  std::vector<MuseLayer> layers_;
};

// The decode step: embedding and its parameter-free norm; per layer RMSNorm, q/k/v/gate products,
// per-head q/k norm (+ RoPE on windowed layers), KV store, attention
// (windowed or full), per-head output norm * sigmoid(gate), output product,
// gated residual; RMSNorm, router product and top-k routing, pre-expert
// product and norm, experts (gate/up, down, shared output norm and weighted
// sum), post product, gated residual with the post-FFN input scale; final norm, LM head, soft-cap and vocabulary
// mask. KV cache layer l is model layer l. max_rows in [1, 64].
DecodeProgram build_muse_program(const MuseModel& model, int max_rows);

}  // namespace megakern
