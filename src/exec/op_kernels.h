// The per-tile work of each op, shared by all executors. A tile is the unit
// of work an executor schedules: a contiguous range of output rows for a
// matrix product, one row for row-wise ops, one (row, head) for attention,
// one (selected expert, output range) for the MoE expert products.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "exec/executor.h"
#include "ir/program.h"

namespace megakern {

struct StepContext {
  const DecodeProgram* program = nullptr;
  std::vector<float*> slot;  // [n_slots] base pointers; row r of slot s at slot[s] + r * width
  const RowInput* rows = nullptr;
  int n_rows = 0;
  bool scalar = false;  // use the scalar reference kernels
  float* taps = nullptr;  // Tap ops' output, [n_rows][program->tap_width]; null: taps skipped
};

// Width of a slot, and row r of it, in a step.
inline int width_of(const StepContext& ctx, int slot) { return ctx.program->slots[static_cast<size_t>(slot)].width; }
inline float* row_of(const StepContext& ctx, int slot, int r) {
  return ctx.slot[static_cast<size_t>(slot)] + static_cast<size_t>(r) * static_cast<size_t>(width_of(ctx, slot));
}
// sigmoid in f32, as every gate kernel computes it.
inline float sigmoidf(float x) { return 1.f / (1.f + std::exp(-x)); }

// How an op is cut into tiles for n_rows rows when the team has n_workers.
int op_tile_count(const Op& op, int n_rows, int n_workers);
// Attention is tiled by (block of rows, KV head, part of its query group).
// Rows per block for a step of n_rows rows (rows of one sequence in a block
// are computed together, reading the keys and values once).
int attention_row_block(int n_rows);
// The number of parts each group is cut into for a step of n_blocks row
// blocks.
int attention_group_split(const Op& op, int n_blocks, int n_workers);
struct AttentionTiling {
  int rows_per_block = 1;
  int n_blocks = 0;
  int per_block = 0;  // tiles per row block: n_head_kv x parts
};
// The tiling of an Attention op's n_tiles tiles over n_rows rows.
AttentionTiling attention_tiling(const Op& op, int n_rows, int n_tiles);
// The rows [r0, r1) whose activations tile t of op reads and writes, when its
// work is confined to some rows (row-wise ops: one row; attention: its row
// block). False for ops whose tiles span every row (matrix and expert
// products, recurrent ops).
bool op_tile_rows(const Op& op, int t, int n_tiles, int n_rows, int& r0, int& r1);
// The tiles [t0, t1) of an Attention op that compute any of rows [r0, r1).
void attention_tiles_of_rows(const Op& op, int r0, int r1, int n_tiles, int n_rows, int& t0, int& t1);
// The output-row range [begin, end) of MatMul tile t of n (balanced, aligned to 4 rows).
void matmul_tile_range(const Op& op, int t, int n, int64_t& begin, int64_t& end);
// Whether tiles of this op correspond one-to-one to rows.
bool op_is_row_tiled(const Op& op);

// Runs tile t of n_tiles of op on the context.
void run_op_tile(const Op& op, const StepContext& ctx, int t, int n_tiles);

// Checks rows against the program (throws megakern::Error).
void validate_rows(const DecodeProgram& p, const std::vector<RowInput>& rows);

}  // namespace megakern
