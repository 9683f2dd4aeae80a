// Dense decoder-only transformers read from GGUF: llama (SmolLM2), qwen3 (per
// head q/k norms) and gemma3 (sliding-window and global layers, sandwich norms,
// GELU, scaled embeddings). Weights, KV cache and a prompt pass that runs the
// model's decode program; every buffer's shape is noted.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/zeroed_buffer.h"

#include "kernels/cpu/matmul.h"

namespace megakern {

class GGUFFile;
class ThreadPool;

enum class DenseArch { Llama, Qwen3, Gemma3 };

struct DenseConfig {
  DenseArch arch = DenseArch::Llama;
  std::string arch_name;
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
  int sliding_window = 0;           // 0: none
  std::vector<bool> layer_swa;      // [n_layer] true where the layer uses the window
  float attn_scale = 1.f;           // multiplies q.k
  float embd_scale = 1.f;           // multiplies the token embedding
  bool gelu = false;                // GELU(tanh) gate instead of SiLU
  bool qk_norm = false;             // per-head RMSNorm on q and k
  bool sandwich_norm = false;       // gemma: norms after attention and MLP outputs too
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
};

// Keys and values of one sequence: [n_layer][n_ctx][n_head_kv*head_dim] each.
// V may be narrower than K (MLA): v_dim floats per position then (0: kv_dim),
// laid out as K with v_dim in place of kv_dim.
//
// Optionally some layers are ring buffers (sliding-window attention): when
// `ring` is non-empty, layer l keeps only its last ring[l] positions
// (0: all n_ctx), position p living in slot p % ring[l], and the layers are
// packed back to back (`layer_offset`, in floats). init_rings() sets this up.
struct KVCache {
  int n_ctx = 0;
  int n_layer = 0;
  int kv_dim = 0;
  int v_dim = 0;
  // Zeroed, committed as positions are written (see ZeroedBuffer).
  ZeroedBuffer<float> k, v;
  int v_width() const { return v_dim > 0 ? v_dim : kv_dim; }
  std::vector<int> ring;             // [n_layer] or empty
  std::vector<size_t> layer_offset;  // [n_layer + 1] when ring is set
  float* k_at(int layer, int pos) { return k.data() + offset(layer, pos); }
  float* v_at(int layer, int pos) { return v.data() + v_offset(offset(layer, pos)); }
  // A K offset (a multiple of kv_dim) as the matching V offset.
  size_t v_offset(size_t k_offset) const {
    return v_dim > 0 ? k_offset / static_cast<size_t>(kv_dim) * static_cast<size_t>(v_dim) : k_offset;
  }
  size_t offset(int layer, int pos) const {
    if (ring.empty()) return (static_cast<size_t>(layer) * n_ctx + pos) * kv_dim;
    const int len = ring[static_cast<size_t>(layer)];
    return layer_offset[static_cast<size_t>(layer)] + static_cast<size_t>(len > 0 ? pos % len : pos) * kv_dim;
  }
  // Positions kept by a layer's ring (0 when the layer keeps all of them).
  int ring_len(int layer) const { return ring.empty() ? 0 : ring[static_cast<size_t>(layer)]; }
  // Floats of k that layers [0, n) occupy (of v: v_offset of it).
  size_t floats_for(int n) const {
    if (ring.empty()) return static_cast<size_t>(n) * static_cast<size_t>(n_ctx) * static_cast<size_t>(kv_dim);
    return layer_offset[static_cast<size_t>(std::min(n, n_layer))];
  }
  // Makes layer l a ring of ring_lens[l] positions (0 or >= n_ctx: a plain
  // layer of n_ctx) and allocates zeroed k and v.
  void init_rings(const std::vector<int>& ring_lens) {
    ring.assign(static_cast<size_t>(n_layer), 0);
    layer_offset.assign(static_cast<size_t>(n_layer) + 1, 0);
    for (int l = 0; l < n_layer; ++l) {
      const int len = l < static_cast<int>(ring_lens.size()) ? ring_lens[static_cast<size_t>(l)] : 0;
      ring[static_cast<size_t>(l)] = len > 0 && len < n_ctx ? len : 0;
      const int kept = ring[static_cast<size_t>(l)] > 0 ? ring[static_cast<size_t>(l)] : n_ctx;
      layer_offset[static_cast<size_t>(l) + 1] = layer_offset[static_cast<size_t>(l)] + static_cast<size_t>(kept) * kv_dim;
    }
    k.assign(layer_offset.back(), 0.f);
    v.assign(v_offset(layer_offset.back()), 0.f);
  }
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
  KVCache make_cache(int n_ctx) const;
  // Bytes of weights read by one decode step.
  size_t weight_bytes() const;

  const MatView& tok_embd() const { return tok_embd_; }
  const MatView& output() const { return output_; }
  const std::vector<float>& output_norm() const { return output_norm_; }
  const std::vector<DenseLayer>& layers() const { return layers_; }

  // Positions computed per step inside forward(); longer inputs are chunked.
  static constexpr int kMaxChunk = 128;

  // Runs tokens[0..n) at positions pos0..pos0+n-1, appending their keys and
  // values to `cache`. Writes logits [n_out][n_vocab] for the last n_out
  // positions (n_out = n for teacher forcing, 1 for generation). Matrix
  // products use `numerics`. This is the model's decode program (see
  // model/dense_program.h) on the megakernel executor, in steps of up to
  // kMaxChunk positions: each position's logits are the bits an executor
  // step computing that position alone gives.
  void forward(ThreadPool& pool, KVCache& cache, const int32_t* tokens, int n, int pos0, int n_out,
               float* logits, Numerics numerics = Numerics::Exact) const;

 private:
  DenseConfig cfg_;
  MatView tok_embd_;  // [n_vocab][n_embd]
  MatView output_;    // [n_vocab][n_embd] (the embedding when tied)
  std::vector<float> output_norm_;
  std::vector<DenseLayer> layers_;
  // Storage of matrices dequantised at load (load with weights = F32); the
  // MatViews above point into it.
  std::vector<std::vector<float>> owned_;
  void dequantize_all_to_f32();
};

}  // namespace megakern
