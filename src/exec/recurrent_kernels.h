// Per-sequence recurrent state of Gated DeltaNet and KDA layers, and the
// checks of the rows that carry it (the recurrent ops themselves:
// ops/recurrent.h).
#pragma once

#include <cstdint>
#include <vector>

#include "ir/program.h"

namespace megakern {

struct StepContext;
struct RowInput;

// The recurrent state of one sequence, for n_layer DeltaNet layers (indexed by
// the ops' cache_index, not the model's layer number). All f32, zero at the start
// of a sequence.
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
