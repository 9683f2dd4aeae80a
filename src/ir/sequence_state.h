// Per-sequence state: everything one sequence carries between decode steps,
// whatever its architecture. The KV cache of its attention layers, the
// recurrent state (conv windows and delta-rule S) of its recurrent layers,
// both sized from the model's DecodeProgram (sequence_shape) and made by one
// factory (make_sequence_state). Executors read and write it through the
// rows of a step (RowInput); the runtime owns one per sequence.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/kv_type.h"
#include "core/zeroed_buffer.h"

namespace megakern {

struct DecodeProgram;

// Keys and values of one sequence, for n_layer attention layers (the ops'
// cache_index). Each layer is stored head-major: `heads` KV heads, each the
// run of its positions, [heads][positions][kv_dim / heads] for K and
// [heads][positions][v_width() / heads] for V (MLA: V may be narrower than K,
// v_dim floats per position; 0: kv_dim). A head's keys of consecutive
// positions are then contiguous, which the attention kernel reads in tiles
// without gathering them first. heads = 1 is the position-major layout
// [positions][kv_dim] (caches made by hand in tests).
//
// Optionally some layers are ring buffers (sliding-window attention): when
// `ring` is non-empty, layer l keeps only its last ring[l] positions
// (0: all n_ctx), position p living in slot p % ring[l], and the layers are
// packed back to back (`layer_offset`, in floats). init_rings() sets this up.
//
// The element type (core/kv_type.h) is f32 by default: the values are the
// floats of `k` and `v`, and the float accessors (k_head, k_at, ...) address
// them. Other types keep `k` and `v` empty and store the same layout in the
// bytes of `kq` and `vq`: n values at a value offset o (a multiple of the
// head width) take kv_row_bytes(type, n) bytes from kv_row_bytes(type, o).
// store() rounds or quantises, load() and the attention kernels decode.
// Offsets below count values whatever the type.
struct KVCache {
  int n_ctx = 0;
  int n_layer = 0;
  int kv_dim = 0;
  int v_dim = 0;
  int heads = 1;  // KV heads; divides kv_dim and v_width()
  // Zeroed, committed as positions are written (see ZeroedBuffer).
  ZeroedBuffer<float> k, v;
  KvType type = KvType::f32;
  ZeroedBuffer<uint8_t> kq, vq;  // type != f32
  int v_width() const { return v_dim > 0 ? v_dim : kv_dim; }
  int head_k() const { return kv_dim / heads; }     // floats of one head's key
  int head_v() const { return v_width() / heads; }  // floats of one head's value
  std::vector<int> ring;             // [n_layer] or empty
  std::vector<size_t> layer_offset;  // [n_layer + 1] when ring is set
  // Positions kept by a layer's ring (0 when the layer keeps all of them).
  int ring_len(int layer) const { return ring.empty() ? 0 : ring[static_cast<size_t>(layer)]; }
  // Positions a layer holds, and the slot of position pos in it.
  int kept(int layer) const { return ring_len(layer) > 0 ? ring_len(layer) : n_ctx; }
  int slot(int layer, int pos) const { return ring_len(layer) > 0 ? pos % ring_len(layer) : pos; }
  // First float of a layer's K (a multiple of kv_dim).
  size_t layer_base(int layer) const {
    return ring.empty() ? static_cast<size_t>(layer) * n_ctx * kv_dim : layer_offset[static_cast<size_t>(layer)];
  }
  // A K offset (a multiple of kv_dim) as the matching V offset.
  size_t v_offset(size_t k_offset) const {
    return v_dim > 0 ? k_offset / static_cast<size_t>(kv_dim) * static_cast<size_t>(v_dim) : k_offset;
  }
  // Head h's keys (values) of a layer: slot s at + s * head_k() (head_v()).
  size_t k_head_offset(int layer, int h) const {
    return layer_base(layer) + static_cast<size_t>(h) * kept(layer) * head_k();
  }
  size_t v_head_offset(int layer, int h) const {
    return v_offset(layer_base(layer)) + static_cast<size_t>(h) * kept(layer) * head_v();
  }
  // (f32 caches.)
  float* k_head(int layer, int h) { return k.data() + k_head_offset(layer, h); }
  float* v_head(int layer, int h) { return v.data() + v_head_offset(layer, h); }
  // Head h's key (value) of position pos.
  float* k_at(int layer, int h, int pos) { return k_head(layer, h) + static_cast<size_t>(slot(layer, pos)) * head_k(); }
  float* v_at(int layer, int h, int pos) { return v_head(layer, h) + static_cast<size_t>(slot(layer, pos)) * head_v(); }
  // The stored bytes of head h of a layer (types other than f32).
  const uint8_t* k_head_bytes(int layer, int h) const { return kq.data() + kv_row_bytes(type, k_head_offset(layer, h)); }
  const uint8_t* v_head_bytes(int layer, int h) const { return vq.data() + kv_row_bytes(type, v_head_offset(layer, h)); }
  // Values allocated for K and V, and their bytes.
  size_t k_values() const;
  size_t v_values() const;
  size_t bytes() const { return kv_row_bytes(type, static_cast<int64_t>(k_values() + v_values())); }
  // Zeroed storage of the cache's type for k_values values of K and
  // v_values of V (the other type's buffers emptied).
  void allocate(size_t k_values, size_t v_values);
  // Writes (reads) position pos of a layer from (to) whole rows: kv_dim
  // floats of K, v_width() of V, heads one after another. Storing rounds or
  // quantises to the cache's type; loading gives the values it holds.
  void store(int layer, int pos, const float* k_row, const float* v_row);
  void load(int layer, int pos, float* k_row, float* v_row) const;
  // Floats of k that layers [0, n) occupy (of v: v_offset of it).
  size_t floats_for(int n) const {
    if (ring.empty()) return static_cast<size_t>(n) * static_cast<size_t>(n_ctx) * static_cast<size_t>(kv_dim);
    return layer_offset[static_cast<size_t>(std::min(n, n_layer))];
  }
  // Makes layer l a ring of ring_lens[l] positions (0 or >= n_ctx: a plain
  // layer of n_ctx) and allocates zeroed storage (allocate()).
  void init_rings(const std::vector<int>& ring_lens);
};

// The recurrent state of one sequence, for n_layer recurrent layers (indexed
// by the ops' cache_index, not the model's layer number). All f32, zero at the
// start of a sequence.
//   conv: [n_layer][conv_hist][conv_dim], the conv_hist = kernel - 1 previous
//         q|k|v conv inputs of each layer, oldest first (as transformers'
//         conv cache without its current column, and reference.json's conv_window);
//   S:    [n_layer][n_v_heads][v_dim][k_dim], row-major: S[h][i][j] couples value
//         component i with key component j (the [v][k] orientation of the
//         reference: o = S q, pred = S k; flash-linear-attention stores the transpose).
//         KDA layers (ops::DeltaRule::kda, Kimi K3) store their heads' S the other way,
//         [k_dim][v_dim] (S[h][j][i], as flash-linear-attention), in the same
//         space; their key and value widths are equal.
// A row advances it by one token. A sequence's rows in one step (adjacent,
// consecutive positions, one cache) either share one state, forming a block
// that the first row's tiles compute in order (blocks of several tokens use
// the chunked forms of the delta rule and KDA: prefill), or chain per-row
// states through RowInput::state_in (a verify block keeping a snapshot per
// row), whose recurrent tiles executors order along the chain (rows_chained).
struct RecurrentState {
  int n_layer = 0, conv_dim = 0, conv_hist = 0, n_v_heads = 0, v_dim = 0, k_dim = 0;
  std::vector<float> conv, S;

  RecurrentState() = default;
  RecurrentState(int n_layer, int conv_dim, int conv_hist, int n_v_heads, int v_dim, int k_dim);
  void reset();
  float* conv_at(int layer) { return conv.data() + static_cast<size_t>(layer) * conv_hist * conv_dim; }
  float* S_at(int layer, int head) {
    return S.data() + (static_cast<size_t>(layer) * n_v_heads + head) * static_cast<size_t>(v_dim) * k_dim;
  }
  size_t bytes() const { return sizeof(float) * (conv.size() + S.size()); }
};

// What a program needs of a sequence's state, independent of its length.
struct SequenceShape {
  // KV cache: attention layers (StoreKV ops), their K and V widths, the KV
  // heads their attention reads (1: none named), and the sliding window of
  // each (0: attends to every position).
  int kv_layers = 0, kv_dim = 0, v_dim = 0, kv_heads = 1;
  std::vector<int> window;  // [kv_layers]
  // The key and value width of the heads that each layer's attention reads
  // (0: no attention op reads the layer).
  std::vector<int> head_k, head_v;  // [kv_layers]
  // Recurrent state (0 layers: none).
  int rec_layers = 0, conv_dim = 0, conv_hist = 0, n_v_heads = 0, rec_v_dim = 0, rec_k_dim = 0;
  bool recurrent = false;
};

// The shape of the state that the program's StoreKV / Attention and
// CausalConvSilu / DeltaRule ops read and write. Throws megakern::Error when
// two recurrent ops disagree on the state's shape.
SequenceShape sequence_shape(const DecodeProgram& program);

// One row of a step: a token of some sequence at position pos, whose keys and
// values go to (and are read from) `cache`. Programs with recurrent layers
// (DecodeProgram::recurrent) also need the sequence's `state`, which the step
// advances by one token per row of the sequence. A sequence's rows in one step
// are adjacent and either share one `state` (a block computed in order, as in
// prefill) or chain per-row states: each row writes its own `state` (the
// snapshot after it) and starts from `state_in`, the previous row's `state`
// (a speculative verify block, whose snapshots allow rollback).
struct RowInput {
  int32_t token = 0;
  int32_t pos = 0;
  KVCache* cache = nullptr;
  RecurrentState* state = nullptr;
  // The state this row starts from when it is not `state` itself (null: it
  // advances `state` in place).
  const RecurrentState* state_in = nullptr;
};

// Everything one sequence carries between steps.
struct SequenceState {
  KVCache cache;
  RecurrentState state;  // empty unless the model is recurrent
  bool recurrent = false;
  int n_ctx() const { return cache.n_ctx; }
  RowInput row(int32_t token, int32_t pos) { return {token, pos, &cache, recurrent ? &state : nullptr}; }
  // Forgets the sequence: recurrent state back to zero (KV entries are
  // simply overwritten by later positions).
  void clear() {
    if (recurrent) state.reset();
  }
};

// The zeroed state of a sequence of up to n_ctx positions. With ring_block >
// 0, every windowed attention layer is a ring of window + ring_block - 1
// positions, enough for steps whose rows of one sequence number at most
// ring_block; with 0 every layer keeps all n_ctx positions. The KV cache
// stores kv_type. Throws megakern::Error for a non-positive n_ctx, a cache
// that could never fit in physical memory (naming the sizes), or a type the
// shape cannot take (check_kv_type).
SequenceState make_sequence_state(const SequenceShape& shape, int n_ctx, int ring_block = 0,
                                  KvType kv_type = KvType::f32);
// Throws megakern::Error when a cache of this shape cannot store kv_type
// (q8_0: a head width not a multiple of 32, naming the layer and widths).
void check_kv_type(const SequenceShape& shape, KvType kv_type);

}  // namespace megakern
