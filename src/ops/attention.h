// The attention ops: per-head norm and RoPE, the KV store, attention itself
// and MLA's per-head key assembly.
//   HeadNormRope: in-place on `out`: per head, optional rmsnorm by head_norm [head_dim], then RoPE at pos[r]
//   StoreKV:      cache(r)[layer][pos[r]] = (in[r], in2[r]) (k, v); out is the layer's width-0 cache
//                 marker slot, so the dependency of attention on it is explicit
//   Attention:    out[r] = softmax(q.K^T * scale) V over row r's cache, causal, optional window;
//                 in = q, in2 = the cache marker StoreKV wrote; tiles (row, KV head, part of its group)
//   MlaKey:       out[r] = per head [in[r] head h (head_dim - w2) | in2[r] (w2, shared by all heads)]
// cache_index: the op's layer in the KV cache (-1: Op::layer).
#pragma once

#include <span>

namespace megakern {

struct Op;

namespace ops {
struct HeadNormRope {
  int n_head = 0, head_dim = 0, rope_dim = 0;
  float rope_base = 10000.f;
  bool rope_neox = false;
  std::span<const float> head_norm;  // [head_dim] or empty
  float eps = 1e-6f;
};
struct StoreKV {
  int cache_index = -1;
};
struct Attention {
  int n_head = 0, n_head_kv = 0, head_dim = 0;
  int v_head_dim = 0;  // value width per head when it differs from head_dim (0: head_dim)
  float scale = 1.f;
  int window = 0;      // sliding window (0: none)
  int cache_index = -1;
  int v_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
};
struct MlaKey {
  int n_head = 0, head_dim = 0;
};
}  // namespace ops

// Attention is tiled by (row, KV head, part of its query group): the number
// of parts each group is cut into for this step.
// Attention is tiled by (block of rows, KV head, part of its query group).
// Rows per block for a step of n_rows rows: up to 8 rows (decode batches of
// different sequences, short verify blocks) a tile is one row; a longer step
// is a prompt chunk, whose blocks of rows share each tile of keys and values.
int attention_row_block(int n_rows);
// The number of parts each group is cut into for a step of n_blocks row blocks.
int attention_group_split(const Op& op, int n_blocks, int n_workers);

}  // namespace megakern
