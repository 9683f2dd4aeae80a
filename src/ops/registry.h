// The op registry: one entry per OpKind, defined next to the op's kernels in
// its family's file (ops/*.cpp). The IR (reads, weight and state bytes,
// verification), the schedule compiler and every executor look an op up here
// instead of switching on its kind.
//
// Adding an op: its parameter struct in its family's header, its OpKind and
// OpParams alternative in ir/program.h, its OpInfo entry and tiles in its
// family's .cpp, the entry's place in registry.cpp's table, and its shapes
// in tests/test_ops.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "exec/op_kernels.h"
#include "ir/program.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec.h"

namespace megakern {

struct ByteRange;  // ops/moe.h

// What an op's verify() sees: the program, slot widths, where the op is.
struct VerifyContext {
  const DecodeProgram& p;
  const std::string& where;  // "op i (kind 'name' layer l)", for messages
  // For each cache-marker slot, the cache layer of the StoreKV that wrote it (-1: none).
  const std::vector<int>& marker_layer;
  int width(int slot) const { return p.slots[static_cast<size_t>(slot)].width; }
};

using TileFn = void (*)(const Op& op, const StepContext& ctx, int t, int n_tiles);

struct OpInfo {
  const char* name = "?";
  // Tile t of a step is row t (and a row's tile is all of its work).
  bool row_tiled = true;
  // Keeps per-sequence recurrent state: a sequence's rows are one block done
  // by its first row's tile, or, chained, tile by tile in chain order.
  bool recurrent = false;
  // Its effect (the KV cache) is read by every row of the sequence, not only its own.
  bool feeds_all_rows = false;
  // Reads `out` too (read-modify-write).
  bool (*reads_out)(const Op& op) = nullptr;
  // Tiles for n_rows rows on n_workers workers (null: n_rows).
  int (*tile_count)(const Op& op, int n_rows, int n_workers) = nullptr;
  // The rows [r0, r1) tile t of n touches, for a kind whose tiles each touch
  // some rows only (null: row t when row_tiled, else every row).
  void (*tile_rows)(const Op& op, int t, int n_tiles, int n_rows, int& r0, int& r1) = nullptr;
  // The small f32 tensors it reads whole (norm weights, taps, masks): its
  // weight bytes and, on its first tile, its prefetch range by default.
  std::span<const float> (*small_weights)(const Op& op) = nullptr;
  // Weight bytes per step (null: those of small_weights).
  size_t (*weight_bytes)(const Op& op) = nullptr;
  // The weight bytes tile t of n streams, for the prefetch plan (null: small_weights on tile 0).
  void (*tile_weights)(const Op& op, int t, int n_tiles, const uint8_t*& begin, size_t& bytes) = nullptr;
  // Routed experts: the weights depend on the step's routing. The ranges a
  // tile reads once routing is done, and their size before it.
  int (*routed_weights)(const Op& op, const StepContext& ctx, int t, int n_tiles, ByteRange out[2]) = nullptr;
  size_t (*routed_weight_bytes)(const Op& op, int n_rows, int t, int n_tiles) = nullptr;
  // Weight bytes for a step of n_rows rows (null: weight_bytes).
  double (*weight_bytes_for_rows)(const Op& op, int n_rows) = nullptr;
  // Per-sequence state bytes a row moves at position pos (null: none).
  size_t (*state_bytes)(const Op& op, const DecodeProgram& p, int pos) = nullptr;
  // Checks shapes and parameters; throws std::logic_error (MK_CHECK) naming v.where.
  void (*verify)(const Op& op, const VerifyContext& v) = nullptr;
  // The scalar reference tile and the fast tile.
  TileFn ref = nullptr, fast = nullptr;
};

// The entry of a kind.
const OpInfo& op_info(OpKind k);
inline const OpInfo& op_info(const Op& op) { return op_info(op.kind); }

// The primitives a tile is instantiated with: the scalar reference kernels
// (C library exp / tanh, sums in order) or the fast ones (AVX2 when the CPU
// has it). A family writes a tile once as a template over these and
// registers both instantiations, so the two differ only in these calls.
struct RefKernels {
  static constexpr bool kRef = true;
  static float dot(const float* a, const float* b, int64_t n) { return dot_f32_scalar(a, b, n); }
  static void axpy(float a, const float* x, float* y, int64_t n) { axpy_f32_scalar(a, x, y, n); }
  static void softmax(float* x, int64_t n) { softmax_inplace_scalar(x, n); }
  static void glu(GluKind k, const float* g, const float* u, float gs, float us, float* o, int64_t n) {
    glu_act_scalar(k, g, u, gs, us, o, n);
  }
  static void softcap(float* x, int64_t n, float cap, float scale) { softcap_scalar(x, n, cap, scale); }
  static void matmul(const DecodeProgram& p, const MatView& W, const float* X, int n_x, float* Y, int64_t ldy,
                     int64_t b, int64_t e);
  static void dequantize_row(const MatView& W, int64_t j, float* out);
};
struct FastKernels {
  static constexpr bool kRef = false;
  static float dot(const float* a, const float* b, int64_t n) { return dot_f32(a, b, n); }
  static void axpy(float a, const float* x, float* y, int64_t n) { axpy_f32(a, x, y, n); }
  static void softmax(float* x, int64_t n) { softmax_inplace(x, n); }
  static void glu(GluKind k, const float* g, const float* u, float gs, float us, float* o, int64_t n) {
    glu_act(k, g, u, gs, us, o, n);
  }
  static void softcap(float* x, int64_t n, float cap, float scale) { megakern::softcap(x, n, cap, scale); }
  static void matmul(const DecodeProgram& p, const MatView& W, const float* X, int n_x, float* Y, int64_t ldy,
                     int64_t b, int64_t e);
  static void dequantize_row(const MatView& W, int64_t j, float* out);
};

}  // namespace megakern
