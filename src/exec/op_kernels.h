// The per-tile entry points every executor uses (the step context and each
// op's tiles: ops/registry.h and its family's file). A tile is
// the unit of work an executor schedules: a contiguous range of output rows
// for a matrix product, one row for row-wise ops, one (row, head) for
// attention, one (selected expert, output range) for the MoE expert products.
#pragma once

#include <vector>

#include "exec/executor.h"
#include "ops/registry.h"

namespace megakern {

// How an op is cut into tiles for n_rows rows when the team has n_workers.
int op_tile_count(const Op& op, int n_rows, int n_workers);

// Runs tile t of n_tiles of op on the context (its reference tile when ctx.scalar).
void run_op_tile(const Op& op, const StepContext& ctx, int t, int n_tiles);

// Checks rows against the program (throws megakern::Error).
void validate_rows(const DecodeProgram& p, const std::vector<RowInput>& rows);

}  // namespace megakern
