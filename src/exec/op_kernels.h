// The step context tiles run in, and the per-tile entry points every executor
// uses (each op's tiles are in its family's file, ops/registry.h). A tile is
// the unit of work an executor schedules: a contiguous range of output rows
// for a matrix product, one row for row-wise ops, one (row, head) for
// attention, one (selected expert, output range) for the MoE expert products.
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
  bool scalar = false;  // run the ops' scalar reference tiles
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
// Whether tiles of this op correspond one-to-one to rows.
bool op_is_row_tiled(const Op& op);

// Runs tile t of n_tiles of op on the context (its reference tile when ctx.scalar).
void run_op_tile(const Op& op, const StepContext& ctx, int t, int n_tiles);

// Attention of step rows [r0, r1) for the query heads of part `part` of n_parts of KV head
// g's group (ops/attention.cpp tiles it; ctx.scalar picks its kernels).
void attention_tile(const Op& op, const StepContext& ctx, int r0, int r1, int g, int part, int n_parts);

// Checks rows against the program (throws megakern::Error).
void validate_rows(const DecodeProgram& p, const std::vector<RowInput>& rows);

}  // namespace megakern
