// Per-sequence recurrent state of Gated DeltaNet and KDA layers, and the
// checks of the rows that carry it (the recurrent ops themselves:
// ops/recurrent.h).
#pragma once

#include <cstdint>
#include <vector>

#include "ir/sequence_state.h"
#include "ir/program.h"

namespace megakern {

struct StepContext;
struct RowInput;

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
bool op_is_recurrent(const Op& op);

}  // namespace megakern
