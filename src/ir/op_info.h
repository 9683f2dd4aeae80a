// The op registry's entry type: what each op kind provides, so that the IR
// (reads, weight and state bytes, verification), the schedule compiler and
// every executor look an op up instead of switching on its kind. The entries
// and the table (op_info) are defined in ops/, each entry next to its kind's
// tiles (ops/registry.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ir/program.h"

namespace megakern {

struct StepContext;  // ops/registry.h

struct ByteRange;   // ops/moe.h

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
  // Its tiles may be run by whichever worker claims them (the megakernel
  // shares them between its workers at run time): kinds whose tiles are
  // heavy or uneven, so that the worker with the lighter ones takes some of
  // the other's instead of waiting at the next op.
  bool shareable = false;
  // And cut into chunks: tile t * c + k of n * c lies inside tile t for
  // every k < c (matrix products, whose tiles are ranges of output columns).
  bool chunkable = false;
  // Reads `out` too (read-modify-write).
  bool (*reads_out)(const Op& op) = nullptr;
  // Tiles for n_rows rows on n_workers workers (null: n_rows).
  int (*tile_count)(const Op& op, int n_rows, int n_workers) = nullptr;
  // The rows [r0, r1) tile t of n touches, for a kind whose tiles each touch
  // some rows only (null: row t when row_tiled, else every row).
  void (*tile_rows)(const Op& op, int t, int n_tiles, int n_rows, int& r0, int& r1) = nullptr;
  // Whether tile t of n reads what tile pt of np of `producer` (an op whose
  // output it reads) wrote, for a kind whose tiles read only some of a
  // producer's tiles beyond rows (null: every tile, subject to tile_rows).
  // The megakernel then waits for those tiles only.
  bool (*reads_tile)(const Op& op, const Op& producer, int n_rows, int t, int n_tiles, int pt, int np) = nullptr;
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

}  // namespace megakern
