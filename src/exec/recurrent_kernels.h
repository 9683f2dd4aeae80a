// The per-tile kernels of the recurrent / gated ops (SigmoidGate, CausalConvSilu,
// DeltaRule, GatedRmsNorm; see ir/program.h). Used by every executor through
// run_op_tile.
#pragma once

#include <cstdint>
#include <vector>

#include "exec/sequence_state.h"
#include "ir/program.h"

namespace megakern {

struct StepContext;

// Tile kernels; t is the row for row-tiled ops, row * n_head + head for DeltaRule.
void sigmoid_gate_tile(const Op& op, const StepContext& ctx, int r);
void causal_conv_silu_tile(const Op& op, const StepContext& ctx, int r);
void delta_rule_tile(const Op& op, const StepContext& ctx, int r, int h);
void gated_rmsnorm_tile(const Op& op, const StepContext& ctx, int r);

// Throws megakern::Error when a row's state is missing, shared with a row that
// is not of its block, or does not fit the program's recurrent ops, or when a
// row continuing the previous row's sequence neither shares its state nor
// starts from it.
void validate_recurrent_rows(const DecodeProgram& p, const RowInput* rows, int n_rows);
// Whether some row starts from the state the previous row of the step
// writes: recurrent tiles of row r must then run after those of row r - 1
// (same op, same head).
bool rows_chained(const RowInput* rows, int n_rows);
// Whether an op keeps per-sequence recurrent state (CausalConvSilu, DeltaRule).
inline bool op_is_recurrent(const Op& op) { return op.kind == OpKind::CausalConvSilu || op.kind == OpKind::DeltaRule; }

}  // namespace megakern
