// Qwen3.8 (Gated DeltaNet + gated full attention hybrid; see model/qwen38_config.h
// and ../shared/docs/reference-system.md) loaded from a Hugging Face Qwen3.5 /
// Qwen3.5-MoE / Qwen3-Next safetensors checkpoint or from a GGUF file of
// those families in llama.cpp's conventions (load_gguf), and its DecodeProgram.
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
//  - Qwen3-Next's fused in_proj_qkvz / in_proj_ba (rows grouped per key head)
//    are regrouped into the same [q | k | v], z and [b | a] matrices (GGUF:
//    ssm_ba, or the older ssm_in), and Qwen3.5 GGUF files' tiled value
//    heads are put back in grouped order (rows, and ssm_out's columns);
//  - matrices stay in F32, F16 or BF16 as stored (copied when the data is not
//    aligned to its element size); any other float dtype is converted to F32;
//    small tensors are converted to F32.
//
// Per-sequence state: a KVCache holding only the full-attention layers
// (the ops' cache_index numbers them 0..n_attn-1) and a RecurrentState for the
// DeltaNet layers (numbered 0..n_deltanet-1 in layer order). Several adjacent
// rows of one sequence in a step are computed as a block (chunked delta rule).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/reserved_space.h"
#include "ir/expert_bank.h"
#include "ir/program.h"
#include "kernels/cpu/matmul.h"
#include "model/qwen38_config.h"

namespace megakern {

class GGUFFile;
class SafetensorsModel;
struct SafetensorsOut;

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
  // Mixture of experts (Qwen3-Next) instead of the MLP: the router
  // [n_expert][H], the routed experts, the shared expert and its gate [1][H].
  MatView router;
  ExpertBank experts;
  MatView sh_gate, sh_up, sh_down, sh_gate_inp;
};

class Qwen38Model {
 public:
  // Reads dir/config.json (qwen38_config_from_hf) and the safetensors
  // checkpoint in dir (a file, an index or a directory, as
  // SafetensorsModel::open). Tensor names may carry the "model." or the
  // "model.language_model." prefix. Throws megakern::Error naming a missing
  // tensor, a wrong shape or an unsupported dtype.
  // With `weights`, every matrix (embedding and LM head included) is
  // converted to that format at load (e.g. Q8_0, Q4_0, MXFP4); its block size
  // must divide the matrix widths.
  static std::unique_ptr<Qwen38Model> load(const std::string& dir, std::optional<DType> weights = {});
  // A GGUF file of one of qwen38_gguf_architectures() (qwen3next, qwen35,
  // qwen35moe) in llama.cpp's naming and conventions (the converter's norm
  // weights already 1 + w, A stored as -exp(A_log), dt_bias as ssm_dt.bias,
  // Qwen3-Next's q | k | v and z split as attn_qkv / attn_gate or fused as
  // ssm_in, [b | a] per key head as ssm_ba; Qwen3.5's b and a as ssm_beta /
  // ssm_alpha and its value heads tiled, put back in grouped order at load).
  // Matrices keep the formats of the file (zero-copy where no regrouping is
  // needed), or are dequantised to f32 when `weights` is F32 (the only
  // format accepted). The model keeps the file. Throws megakern::Error
  // naming a missing tensor, a wrong shape or a bad key.
  static std::unique_ptr<Qwen38Model> load_gguf(std::unique_ptr<GGUFFile> file, std::optional<DType> weights = {});
  // The deterministic synthetic checkpoint of qwen38_synthetic_tensors(c,
  // seed), built in memory and loaded as load() would load it from disk.
  // The config's shapes without weight memory (a bf16 checkpoint image in
  // reserved address space, all zeros): its program can be built and
  // scheduled (`inspect --schedule`, `--race-check`), not run.
  static std::unique_ptr<Qwen38Model> shapes_only(const Qwen38Config& c);
  static std::unique_ptr<Qwen38Model> synthetic(const Qwen38Config& c, uint64_t seed,
                                                std::optional<DType> weights = {});
  ~Qwen38Model();

  const Qwen38Config& config() const { return cfg_; }
  int n_attention_layers() const { return cfg_.n_full_attention_layers(); }
  int n_deltanet_layers() const { return cfg_.n_deltanet_layers(); }

  const MatView& tok_embd() const { return tok_embd_; }
  const MatView& lm_head() const { return lm_head_; }
  const std::vector<float>& final_norm() const { return final_norm_; }
  const std::vector<Qwen38Layer>& layers() const { return layers_; }
  const std::string& tensor_prefix() const { return prefix_; }
  // The GGUF file the model was read from, or null.
  const GGUFFile* gguf() const { return gguf_.get(); }

 private:
  Qwen38Model() = default;
  Qwen38Config cfg_;
  static std::unique_ptr<Qwen38Model> load_from(std::unique_ptr<Qwen38Model> m, const std::string& config_name,
                                                std::optional<DType> weights);
  std::unique_ptr<SafetensorsModel> st_;
  std::unique_ptr<GGUFFile> gguf_;
  std::vector<uint8_t> image_;  // the checkpoint bytes of a synthetic model
  std::unique_ptr<ReservedSpace> reserved_;  // shapes_only(): the checkpoint image
  std::vector<std::vector<float>> owned_;  // backing store of transformed matrices
  std::string prefix_;
  MatView tok_embd_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<Qwen38Layer> layers_;
  friend struct Qwen38Loader;
};

// config.json text for c in the Hugging Face Qwen3.5 naming (model_type
// "qwen3_5_text"), which qwen38_config_from_hf reads back as c.
std::string qwen38_hf_config_json(const Qwen38Config& c);
// Deterministic synthetic weights in the checkpoint naming of
// qwen38_tensors(c): matrices bf16 with entries of standard deviation
// 1/sqrt(fan-in) (the embedding 1, the LM head 2/sqrt(H) so the next-token
// distribution is not flat), zero-centred norm weights near 0, conv taps,
// A_log = log(U[1, 16]) and dt_bias near 1 as the public initialisation
// draws them. Activations stay finite over all 64 layers of qwen3.8-bench.
std::vector<SafetensorsOut> qwen38_synthetic_tensors(const Qwen38Config& c, uint64_t seed);
// `megakern gen-model`: writes dir/config.json and dir/model.safetensors
// (creating dir), loadable by Qwen38Model::load.
void write_qwen38_synthetic(const Qwen38Config& c, uint64_t seed, const std::string& dir);

// The decode step: embedding; per layer zero-centred input norm, the mixer
// (gated attention at l % 4 == 3, else Gated DeltaNet), residual,
// post-attention norm, SwiGLU MLP (or routed experts plus a gated shared
// expert: Qwen3-Next), residual; final norm; untied LM head.
// The program is `recurrent`: rows need a RecurrentState (make_sequence_state).
DecodeProgram build_qwen38_program(const Qwen38Model& model, int max_rows);

}  // namespace megakern
