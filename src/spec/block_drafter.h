// Block drafters conditioned on the target's hidden states, after the
// reference system's "DSpark" (Kimi K3) and "DFlash" (Qwen3.8) drafters.
//
// The drafter is a small Qwen3-style transformer that never sees the
// target's tokens directly as context. Instead, for every position p the
// target has verified (or prefilled), it receives the target's residual
// stream after a few chosen layers ("taps", see add_taps in ir/program.h),
// concatenated into one vector of n_taps * H_target floats:
//
//   c_p = RMSNorm(W_fc . taps_p) * hidden_norm                     (width D)
//   for each drafter layer l:
//     K_l[p] = RoPE(RMSNorm_head(W_k,l c_p) * k_norm_l, p),   V_l[p] = W_v,l c_p
//
// (RMSNorm_head: per head, over head_dim, then the per-layer weight of
// head_dim values.) These context keys and values sit in the drafter's own
// KV cache. To draft after the anchor t_N (the last token emitted, not yet
// run by the target) it runs one block of B rows at positions N..N+B-1: the
// anchor's embedding then B-1 embeddings of the mask token. Each drafter
// layer is a pre-norm attention + SwiGLU block; queries and the block's own
// keys get the same per-head weighted norms (q_norm, k_norm) before RoPE. A
// block row attends to the context entries of positions
// max(0, N - window)..N-1 and, causally, to the block rows up to itself.
// After the final norm:
//
//  - DSpark (the reference system's; docs/ARCHITECTURE.md): every
//    slot predicts the position after its own, so row k (k = 0..B-1) gives
//    the logits of draft d_{k+1} at position N+k+1, B drafts per block. Its
//    own embedding table [V][D] (the mask token is a vocabulary id) and LM
//    head, and a rank-r Markov bias applied left to right:
//    d_{k+1} = argmax(logits_k + W2 . W1[d_k]), d_0 = the anchor, the
//    argmax over the top markov_top_m base logits of each 32nd of the
//    vocabulary (as the reference system runs it; 0: over all of it).
//    Two extensions of ours (config keys absent from the reference layout):
//    tie_target_embeddings reads the embedding (mask token included) and LM
//    head from the target, so neither is stored; draft_vocab_size restricts
//    the LM head, the Markov tables and so the drafts to the target ids of
//    the tensor d2t (the trained drafter shipped for SmolLM2 uses both).
//  - DFlash-style (ours): row k (k = 1..B-1) gives the logits of the token
//    at position N+k, B-1 drafts; the target's own token embedding (with its
//    embedding scale) and LM head, read from the target's program; a learned
//    mask embedding; plain argmax, no Markov bias. D must equal H_target.
//
// Causal attention within the block makes draft i independent of how many
// rows follow it, so a shorter proposal gives the same first drafts. Drafts
// are greedy (deterministic, q one-hot), so with the target's sampling they
// are still checked losslessly. Only taps of accepted positions are fed
// (SpeculativeGenerator), so a rejected draft never enters the drafter's
// context and nothing has to be rolled back.
//
// Weights: synthetic_block_drafter() gives deterministic random MINI weights
// sized to a target; with these the drafts are essentially random and only
// the machinery (taps, context cache, block pass, verification) is
// exercised. For SmolLM2 a trained DSpark drafter is shipped
// (shipped_block_drafter; scripts/train_drafter.py makes it). A DSpark drafter is saved and
// loaded in the reference system's checkpoint layout (config.json with
// transformer_layer_config, aux_hidden_state_layer_ids, mask_token_id,
// markov_rank; model.safetensors with its tensor names, F32 or BF16); a
// DFlash-style one as config.json (our keys) + model.safetensors (f32), the
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

// The reference system shards the vocabulary over 32 ranks and keeps each
// rank's top markov_top_m base logits as the candidates of the sequential
// Markov step; the same 32 contiguous slices are used here.
constexpr int kMarkovShards = 32;
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
  int mask_token = -1;      // DSpark: the vocabulary id whose embedding fills the mask rows (-1: DFlash)
  int window = 0;           // context positions a block attends to (the last `window`; 0: all)
  // DSpark: Markov candidates per vocabulary slice (see kMarkovShards); 0,
  // or a vocabulary that does not split into the slices: the exact argmax
  // over the whole vocabulary. 16 as the reference system runs it.
  int markov_top_m = 16;
  float rope_base = 10000.f;
  float eps = 1e-5f;
  uint64_t seed = 1;        // the synthetic weights' seed (informational once saved)
  // DSpark extensions (our config keys, absent from the reference layout):
  // draft_vocab_size: drafts come from this many target ids only, listed in
  // the tensor "d2t" (ascending), so the LM head and the Markov tables have
  // that many rows; 0: the whole vocabulary.
  int draft_vocab = 0;
  // tie_target_embeddings: the token embedding (the mask token's row
  // included) and the LM head are the target's own, read from its program
  // (restricted to d2t's rows), and not stored.
  bool tie_target = false;
  // target_num_hidden_layers: the depth of the target the drafter was made
  // for (0: not recorded); a target of another depth is refused.
  int target_layers = 0;

  int n_taps() const { return static_cast<int>(tap_layers.size()); }
  // Width of the drafter's logits: the draft vocabulary, else the target's.
  int out_vocab() const { return draft_vocab > 0 ? draft_vocab : n_vocab; }
  // DSpark: the reference system's config.json keys (tap layer l is written
  // as aux_hidden_state_layer_ids entry l + 1, the stream entering layer
  // l + 1); DFlash: ours.
  std::string to_json() const;
  // Either layout (a "transformer_layer_config" object marks the reference
  // system's). Throws megakern::Error naming the missing or bad field.
  static BlockDrafterConfig from_json(const std::string& text, const std::string& where);
  // Checks the arithmetic (head sizes, block, rank); throws megakern::Error.
  void validate() const;
  // The MINI configuration for `target`: D = H_target, 2 layers, 4 query /
  // 2 key-value heads, SwiGLU 2D, block 8, taps after three layers spread
  // over the target's depth (the last one included); DSpark: Markov rank 256
  // and a 2048-position window (the reference system's), mask token V - 1.
  static BlockDrafterConfig mini(BlockDrafterKind kind, const Model& target);
};

// All weights, f32, row-major ([out][in] for matrices).
struct BlockDrafterWeights {
  BlockDrafterConfig config;
  std::vector<float> tap_proj;  // [D][n_taps * H_target] (fc)
  std::vector<float> tap_norm;  // [D] (hidden_norm)
  struct Layer {
    std::vector<float> attn_norm;             // [D]
    std::vector<float> wq, wk, wv, wo;        // [nh*hd][D], [nkv*hd][D] x2, [D][nh*hd]
    std::vector<float> q_norm, k_norm;        // [hd] each: per-head weighted norms
    std::vector<float> ffn_norm;              // [D]
    std::vector<float> w_gate, w_up, w_down;  // [F][D] x2, [D][F]
  };
  std::vector<Layer> layers;
  std::vector<float> final_norm;  // [D]
  std::vector<float> mask_embed;  // [D] (DFlash; DSpark embeds its mask token)
  // DSpark only.
  std::vector<float> embed;       // [V][D]
  std::vector<float> lm_head;     // [V][D]
  std::vector<float> markov_w1;   // [V][r]
  std::vector<float> markov_w2;   // [V][r]
  // draft_vocab > 0: the target id of each draft-vocabulary row (ascending);
  // embed is then absent only if tie_target, lm_head and markov_w1/w2 have
  // draft_vocab rows (w1 indexed by the previous token's draft row).
  std::vector<int32_t> d2t;

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
// The trained drafter shipped for `target` (looked up by the target's model
// name; files under assets/drafters/, found like the fetched models: in
// $MEGAKERN_ASSETS_DIR, next to the build directory of the running program,
// then ./assets), or "" if none is shipped for it. Throws megakern::Error if
// one is known but its files are missing.
std::string shipped_block_drafter(const Model& target, BlockDrafterKind kind);
// Checks dir/model.safetensors against the sha256 in
// dir/model.safetensors.sha256 (as `sha256sum` writes it); throws
// megakern::Error naming both on a mismatch or a missing checksum.
void verify_block_drafter_checksum(const std::string& dir);
// Reads a directory as save_block_drafter writes it (or a DSpark checkpoint
// of the reference system), or a .safetensors file (config from its
// "drafter_config" metadata, else config.json beside it). Tensors may be F32,
// BF16 or F16. Checks that every tensor is present with the shape the config
// implies and that the config fits `target` (vocabulary, hidden width, tap
// layers); throws megakern::Error naming the tensor or field at fault.
BlockDrafterWeights load_block_drafter(const std::string& path, const Model& target);

class BlockDrafter final : public Drafter {
 public:
  // Throws megakern::Error if the weights do not fit the target. The target
  // must outlive the drafter (DFlash reads its embedding and LM head).
  BlockDrafter(const Model& target, BlockDrafterWeights weights, ThreadPool& pool, int n_ctx);
  BlockDrafter(const BlockDrafter&) = delete;
  BlockDrafter& operator=(const BlockDrafter&) = delete;

  std::string name() const override;
  // Proposes min(k, B) drafts (DSpark) or min(k, B-1) (DFlash). Throws
  // megakern::Error unless the taps of exactly the positions before the
  // anchor (0..context.size()-2) were fed.
  void propose(const std::vector<int32_t>& context, int k, Draft& out) override;
  // The block pass for the anchor context.back(): the LM-head logits of its
  // first n_rows rows (n_rows <= B), [n_rows][out_vocab()], before any
  // Markov bias (columns are draft-vocabulary rows when it has one).
  // Same preconditions as propose().
  void block_logits(const std::vector<int32_t>& context, int n_rows, std::vector<float>& logits);
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
  // Per head of n_rows rows of n_heads * head_dim: weighted RMS norm over
  // head_dim, then RoPE at positions pos0, pos0 + 1, ...
  void head_norm_rope(float* x, int n_rows, int n_heads, const float* norm, int pos0) const;

  BlockDrafterWeights w_;
  ThreadPool& pool_;
  int n_ctx_;
  int n_filled_ = 0;
  // DFlash, and DSpark with tie_target: the target's token embedding (and
  // its scale) and LM head.
  MatView target_embed_, target_head_;
  float target_embed_scale_ = 1.f;
  std::vector<float> head_rows_;  // tie_target with a draft vocabulary: d2t's rows of the target's head, f32
  std::vector<int32_t> t2d_;      // draft vocabulary: target id -> draft row, -1 outside it
  // A draft row as a target id.
  int32_t to_target(int32_t row) const { return w_.d2t.empty() ? row : w_.d2t[static_cast<size_t>(row)]; }
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
