// Block drafters conditioned on the target's hidden states, after the
// reference system's "DSpark" (Kimi K3) and "DFlash2" (Qwen3.8) drafters.
//
// The drafter is a small transformer that never sees the target's tokens
// directly as context. Instead, for every position p the target has verified
// (or prefilled), it receives the target's residual stream after a few chosen
// layers ("taps", see add_taps in ir/program.h), concatenated into one vector
// of n_taps * H_target floats:
//
//   c_p = RMSNorm(W_tap . taps_p) * tap_norm                      (width D)
//   for each drafter layer l:  K_l[p] = RoPE(W_k,l c_p, p),  V_l[p] = W_v,l c_p
//
// These context keys and values sit in the drafter's own KV cache. To draft
// after the anchor t_N (the last token emitted, not yet run by the target) it
// runs one block of B rows at positions N..N+B-1: the anchor's embedding then
// B-1 copies of a learned mask embedding. Each drafter layer is a pre-norm
// attention + SwiGLU block; a block row attends to every context entry
// 0..N-1 and, causally, to the block rows up to itself (row i sees rows
// 0..i). Causal rather than bidirectional attention within the block is our
// choice: it makes draft i independent of how many rows follow it, so a
// shorter proposal gives the same first drafts. After the final norm, row
// k (k = 1..B-1) gives the logits of draft d_k, the token at position N+k.
//
//  - DSpark-style: its own embedding table ([V+1][D], row V is the mask
//    token) and LM head over the target vocabulary, plus a rank-r Markov
//    bias: d_k = argmax(logits_k + W2 . W1[d_{k-1}]), d_0 = the anchor,
//    W1 [V][r] and W2 [V][r] (W2 used as a V x r matrix).
//  - DFlash-style: the target's own token embedding (with its embedding
//    scale) and LM head, read from the target's program; a learned mask
//    embedding; plain argmax, no Markov bias. D must equal H_target.
//
// Drafts are greedy (deterministic, q one-hot), so with the target's
// sampling they are still checked losslessly. Only taps of accepted
// positions are fed (SpeculativeGenerator), so a rejected draft never enters
// the drafter's context and nothing has to be rolled back.
//
// Weights: synthetic_block_drafter() gives deterministic random MINI weights
// sized to a target (its vocabulary and hidden width). Trained weights do not
// exist here, so with these the drafts are essentially random and the
// acceptance length is close to 1 token per round; the machinery (taps,
// context cache, block pass, verification) is what is exercised. Weights are
// saved as a directory with config.json and model.safetensors (f32), the
// config also in the safetensors metadata under "drafter_config".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "spec/drafter.h"

namespace megakern {

class Model;
class ThreadPool;

enum class BlockDrafterKind { DSpark, DFlash };
const char* block_drafter_kind_name(BlockDrafterKind k);

struct BlockDrafterConfig {
  BlockDrafterKind kind = BlockDrafterKind::DSpark;
  int target_hidden = 0;    // H_target: width of one tap
  int n_vocab = 0;          // the target's vocabulary
  std::vector<int> tap_layers;  // target layers tapped, in tap order
  int hidden = 0;           // D
  int n_layer = 2;
  int n_head = 4, n_head_kv = 2, head_dim = 0;
  int ffn = 0;              // SwiGLU width
  int block = 8;            // B: anchor + B-1 mask rows
  int markov_rank = 0;      // r (DSpark; 0 for DFlash)
  float rope_base = 10000.f;
  float eps = 1e-5f;
  uint64_t seed = 1;        // the synthetic weights' seed (informational once saved)

  int n_taps() const { return static_cast<int>(tap_layers.size()); }
  std::string to_json() const;
  // Throws megakern::Error naming the missing or bad field.
  static BlockDrafterConfig from_json(const std::string& text, const std::string& where);
  // Checks the arithmetic (head sizes, block, rank); throws megakern::Error.
  void validate() const;
  // The MINI configuration for `target`: D = H_target, 2 layers, 4 query /
  // 2 key-value heads, SwiGLU 2D, block 8, taps after three layers spread
  // over the target's depth (the last one included), Markov rank 16 (DSpark).
  static BlockDrafterConfig mini(BlockDrafterKind kind, const Model& target);
};

// All weights, f32, row-major ([out][in] for matrices).
struct BlockDrafterWeights {
  BlockDrafterConfig config;
  std::vector<float> tap_proj;  // [D][n_taps * H_target]
  std::vector<float> tap_norm;  // [D]
  struct Layer {
    std::vector<float> attn_norm;             // [D]
    std::vector<float> wq, wk, wv, wo;        // [nh*hd][D], [nkv*hd][D] x2, [D][nh*hd]
    std::vector<float> ffn_norm;              // [D]
    std::vector<float> w_gate, w_up, w_down;  // [F][D] x2, [D][F]
  };
  std::vector<Layer> layers;
  std::vector<float> final_norm;  // [D]
  std::vector<float> mask_embed;  // [D] (DFlash; DSpark keeps its mask in row V of embed)
  // DSpark only.
  std::vector<float> embed;       // [V + 1][D]
  std::vector<float> lm_head;     // [V][D]
  std::vector<float> markov_w1;   // [V][r]
  std::vector<float> markov_w2;   // [V][r]

  // (name, shape, data) of every tensor, in a fixed order: what the
  // safetensors file holds.
  struct TensorRef {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float>* data;
  };
  std::vector<TensorRef> tensors();
};

// Deterministic random weights for a config (seeded by config.seed).
BlockDrafterWeights synthetic_block_drafter(const BlockDrafterConfig& config);

// Writes dir/config.json and dir/model.safetensors (the directory is created).
void save_block_drafter(const BlockDrafterWeights& w, const std::string& dir);
// Reads a directory as save_block_drafter writes it, or a .safetensors file
// (config from its "drafter_config" metadata, else config.json beside it).
// Checks that every tensor is present with the shape the config implies and
// that the config fits `target` (vocabulary, hidden width, tap layers);
// throws megakern::Error naming the tensor or field at fault.
BlockDrafterWeights load_block_drafter(const std::string& path, const Model& target);

class BlockDrafter final : public Drafter {
 public:
  // Throws megakern::Error if the weights do not fit the target. The target
  // must outlive the drafter (DFlash reads its embedding and LM head).
  BlockDrafter(const Model& target, BlockDrafterWeights weights, ThreadPool& pool, int n_ctx);
  BlockDrafter(const BlockDrafter&) = delete;
  BlockDrafter& operator=(const BlockDrafter&) = delete;

  std::string name() const override;
  // Proposes min(k, B-1) drafts. Throws megakern::Error unless the taps of
  // exactly the positions before the anchor (0..context.size()-2) were fed.
  void propose(const std::vector<int32_t>& context, int k, Draft& out) override;
  void reset() override { n_filled_ = 0; }
  const std::vector<int>& tap_layers() const override { return w_.config.tap_layers; }
  // Writes the context keys and values of positions pos0..pos0+n-1. pos0 may
  // be at most the number of positions held (earlier ones are overwritten,
  // later ones forgotten).
  void observe_taps(const float* taps, int n_rows, int pos0) override;

  const BlockDrafterWeights& weights() const { return w_; }
  // Positions whose context entries are held.
  int n_filled() const { return n_filled_; }

 private:
  void embed_row(int32_t token, bool mask, float* out) const;

  BlockDrafterWeights w_;
  ThreadPool& pool_;
  int n_ctx_;
  int n_filled_ = 0;
  // DFlash: the target's token embedding (and its scale) and LM head.
  MatView target_embed_, target_head_;
  float target_embed_scale_ = 1.f;
  // Views over w_'s matrices.
  MatView tap_proj_, lm_head_, markov_w2_;
  struct LayerViews {
    MatView wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  std::vector<LayerViews> lv_;
  // Context cache: [layer][pos][nkv * hd] keys and values.
  std::vector<std::vector<float>> ctx_k_, ctx_v_;
};

}  // namespace megakern
