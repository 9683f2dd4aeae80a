// Qwen3.8 (Gated DeltaNet + gated full attention hybrid; see model/qwen38_config.h
// and ../shared/docs/reference-system.md) loaded from a Hugging Face Qwen3.5
// safetensors checkpoint, and its DecodeProgram.
//
// Load-time transforms (buffers owned by the model; everything else is a
// zero-copy view of the mapped checkpoint):
//  - zero-centred RMSNorm weights (input/post-attention/final norms, q/k norms)
//    are stored as 1 + w; the DeltaNet gated norm weight is used as is;
//  - q_proj, whose rows are [head][query | gate], is split into a query matrix
//    and a gate matrix, each [n_head * head_dim][hidden] in head order;
//  - in_proj_b and in_proj_a are stacked into one [2 * n_v_heads][hidden]
//    matrix ([b | a]), so one product feeds the delta rule;
//  - conv1d.weight [C][1][K] is read as taps [C][K] (tap K-1 = current input);
//  - matrices stay in F32, F16 or BF16 as stored (copied when the data is not
//    aligned to its element size); any other float dtype is converted to F32;
//    small tensors are converted to F32.
//
// Per-sequence state: a KVCache holding only the full-attention layers
// (Op::cache_index numbers them 0..n_attn-1) and a RecurrentState for the
// DeltaNet layers (numbered 0..n_deltanet-1 in layer order). Executor steps
// over a Qwen3.8 program hold at most one row per sequence.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "exec/recurrent_kernels.h"
#include "ir/program.h"
#include "kernels/cpu/matmul.h"
#include "model/dense.h"
#include "model/qwen38_config.h"

namespace megakern {

class SafetensorsModel;

struct Qwen38Layer {
  bool attention = false;
  int cache_index = 0;  // index among the attention layers, or among the DeltaNet layers
  std::vector<float> input_norm, post_norm;  // [H], 1 + w
  // Gated attention.
  MatView wq, wgate;              // [n_head * head_dim][H]
  MatView wk, wv;                 // [n_head_kv * head_dim][H]
  MatView wo;                     // [H][n_head * head_dim]
  std::vector<float> q_norm, k_norm;  // [head_dim], 1 + w
  // Gated DeltaNet.
  MatView w_qkv;                  // [C = 2 * key_dim + value_dim][H]
  MatView w_z;                    // [value_dim][H]
  MatView w_ba;                   // [2 * n_v_heads][H]: b rows, then a rows
  MatView w_out;                  // [H][value_dim]
  std::vector<float> conv;        // [C][K]
  std::vector<float> a_log, dt_bias;  // [n_v_heads]
  std::vector<float> gated_norm;  // [v_head_dim], as is
  // SwiGLU MLP.
  MatView w_gate, w_up;           // [FF][H]
  MatView w_down;                 // [H][FF]
};

class Qwen38Model {
 public:
  // Reads dir/config.json (qwen38_config_from_hf) and the safetensors
  // checkpoint in dir (a file, an index or a directory, as
  // SafetensorsModel::open). Tensor names may carry the "model." or the
  // "model.language_model." prefix. Throws megakern::Error naming a missing
  // tensor, a wrong shape or an unsupported dtype.
  static std::unique_ptr<Qwen38Model> load(const std::string& dir);
  ~Qwen38Model();

  const Qwen38Config& config() const { return cfg_; }
  int n_attention_layers() const { return cfg_.n_full_attention_layers(); }
  int n_deltanet_layers() const { return cfg_.n_deltanet_layers(); }
  // K/V of the full-attention layers only.
  KVCache make_cache(int n_ctx) const;
  RecurrentState make_state() const;

  const MatView& tok_embd() const { return tok_embd_; }
  const MatView& lm_head() const { return lm_head_; }
  const std::vector<float>& final_norm() const { return final_norm_; }
  const std::vector<Qwen38Layer>& layers() const { return layers_; }
  const std::string& tensor_prefix() const { return prefix_; }

 private:
  Qwen38Model() = default;
  Qwen38Config cfg_;
  std::unique_ptr<SafetensorsModel> st_;
  std::vector<std::vector<float>> owned_;  // backing store of transformed matrices
  std::string prefix_;
  MatView tok_embd_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<Qwen38Layer> layers_;
  friend struct Qwen38Loader;
};

// The decode step: embedding; per layer zero-centred input norm, the mixer
// (gated attention at l % 4 == 3, else Gated DeltaNet), residual,
// post-attention norm, SwiGLU MLP, residual; final norm; untied LM head.
// The program is `recurrent`: rows need a RecurrentState from make_state().
DecodeProgram build_qwen38_program(const Qwen38Model& model, int max_rows);

}  // namespace megakern
