// The mixture-of-experts ops (parameters and what they compute:
// ir/op_params.h; the experts: ir/expert_bank.h).
//
// Data flow of one MoE block for a step of R rows (k = top_k):
//   logits [R][E]  --MoeRoute-->   route [R][2k]    ids (as floats) | weights
//   z [R][d_in]    --MoeGlu-->     h [R][k][d_ff]   h[r][j] from expert route[r][j]
//   h              --MoeDown-->    y [R][k][d_in]
//   y              --MoeCombine--> out [R][d_in]    sum_j w_j norm_e(y[r][j]), j in order
// MoeRoute and MoeCombine are row-tiled. MoeGlu and MoeDown are tiled by
// (slot, output range): slot s is the s-th smallest distinct expert selected
// by any row of the step (known only after routing, so every tile derives it
// from the route slot), and the tile multiplies that expert's rows
// [begin, end) with the inputs of every row that selected it. So each
// selected expert's weights are read once per step whatever the batch, and
// a step has min(E, R * k) slots, of which the unused ones do nothing.
// Every output value is one weight row times one input row (matmul_rows
// computes it the same way for any batch or range), so a row's result does
// not depend on its batch mates or on how the tiles were cut.
#pragma once

#include <cstddef>
#include <cstdint>

namespace megakern {

struct Op;
struct StepContext;

// Tiles of a MoeGlu / MoeDown op for n_rows rows on n_workers workers.
int moe_tile_count(const Op& op, int n_rows, int n_workers);
// What tile t of n_tiles of a MoeGlu / MoeDown op covers in a step of n_rows
// rows: its expert slot and the output rows [begin, end) of each selection
// (of d_ff for MoeGlu, of d_in for MoeDown).
struct MoeTileCut {
  int slot = 0, begin = 0, end = 0;
};
MoeTileCut moe_tile_cut(const Op& op, int n_rows, int t, int n_tiles);

// The expert weights tile t of n_tiles of a MoeGlu / MoeDown op reads in a
// step, known once the op's route slot (Op::in2) is written: the gate and up
// rows of its output range (MoeGlu) or the down rows (MoeDown) of the expert
// its slot resolves to. Returns how many ranges it wrote to out (0 when the
// slot is unused in this step). The megakernel prefetches them right after
// routing.
struct ByteRange {
  const uint8_t* begin = nullptr;
  size_t bytes = 0;
};
int moe_tile_weights(const Op& op, const StepContext& ctx, int t, int n_tiles, ByteRange out[2]);
// The bytes those ranges add up to when the slot is used (every expert of a
// bank has the same shapes and format), for planning before routing.
size_t moe_tile_weight_bytes(const Op& op, int n_rows, int t, int n_tiles);

// The activations of ExpertBank::act, exposed for tests.
float swiglu_act(float g, float u);
float situ_act(float g, float u);

}  // namespace megakern
