// Causal attention of a block of query rows of one sequence against its KV
// cache, for the query heads that share one KV head (GQA).
//
// The rows of a block are consecutive positions pos0, pos0 + 1, ... of one
// sequence (a prompt chunk, a verify block, or a single decode row), whose
// keys and values are already in the cache. Row i attends positions
// [start_i, pos0 + i], start_i = max(0, pos0 + i - window + 1) with a window,
// else 0.
//
// attention_block() works through the history in tiles of positions small
// enough for L1: every row of the block and every query head of the group
// uses a tile's keys (then its values) before the next tile is loaded, so the
// cache is read once per block rather than once per row and head. A
// head-major cache (KVCache's layout: a head's positions contiguous) is read
// in place; from a position-major one (a head's keys a KV width apart, 4 KiB
// in common models, which maps a whole tile onto a few L1 sets) a tile used
// by several rows is first copied into a packed buffer. The heads of a group go two at a time
// against each tile and the softmaxes four at a time. Each
// output is nevertheless computed exactly as attention_rows_reference()
// computes it one row and one head at a time: the same dot product per
// position, the same two-pass softmax over the row's whole score vector, and
// the value rows accumulated in increasing position order with the same
// fused multiply-adds. Only the order in which independent outputs are
// worked on changes, so a row's bits do not depend on the block it is in.
#pragma once

#include <cstdint>

#include "core/kv_type.h"

namespace megakern {

// Where one KV head's keys and values of one layer are. A cache of another
// type than f32 (core/kv_type.h) is given by kb / vb instead, the strides
// then counting bytes; the kernels decode its tiles to f32 (kv_decode.h)
// and use the decoded floats as they use an f32 cache's.
struct KvHeadView {
  const float* k = nullptr;  // key of slot s: k + s * k_stride (head_dim floats; head-major cache: stride = head_dim)
  const float* v = nullptr;  // value of slot s: v + s * v_stride (v_dim floats)
  int64_t k_stride = 0, v_stride = 0;
  int ring = 0;  // 0: position p is slot p; else slot p % ring (the layer keeps `ring` positions)
  int slot(int p) const { return ring > 0 ? p % ring : p; }
  const float* k_at(int p) const { return k + static_cast<int64_t>(slot(p)) * k_stride; }
  const float* v_at(int p) const { return v + static_cast<int64_t>(slot(p)) * v_stride; }
  KvType type = KvType::f32;
  const uint8_t* kb = nullptr;  // type != f32: key of slot s at kb + s * k_stride bytes
  const uint8_t* vb = nullptr;
  const uint8_t* kb_at(int p) const { return kb + static_cast<int64_t>(slot(p)) * k_stride; }
  const uint8_t* vb_at(int p) const { return vb + static_cast<int64_t>(slot(p)) * v_stride; }
};

struct AttentionBlock {
  const float* q = nullptr;  // row i, head j: q + i * q_stride + j * head_dim
  int64_t q_stride = 0;
  float* out = nullptr;  // row i, head j: out + i * out_stride + j * v_dim
  int64_t out_stride = 0;
  int n_rows = 0;   // rows at positions pos0 .. pos0 + n_rows - 1
  int pos0 = 0;
  int n_heads = 0;  // query heads of the group
  int head_dim = 0;
  int v_dim = 0;    // width of a value (MLA: may differ from head_dim)
  int window = 0;   // 0: full causal attention
  float scale = 1.f;  // multiplies q.k
  float softcap = 0.f;  // > 0: scores become softcap * tanh(score / softcap) before the softmax
  // Head j's sink logit sinks[j] (gpt-oss), or null: the softmax runs over the
  // scores followed by the sink, whose weight multiplies no value.
  const float* sinks = nullptr;
};

// The tiled kernel. `scalar`: the portable kernels (the reference executor's
// arithmetic); otherwise the AVX2 ones where the CPU has them (decoding
// included: its floats are the same either way).
void attention_block(const AttentionBlock& a, const KvHeadView& kv, bool scalar);

// One row and one head at a time, each position on its own: the definition
// the tiled kernel must match bit for bit (with the same `scalar`).
void attention_rows_reference(const AttentionBlock& a, const KvHeadView& kv, bool scalar);

// Positions per tile of the tiled kernel for this block.
int attention_tile_positions(const AttentionBlock& a);

}  // namespace megakern
