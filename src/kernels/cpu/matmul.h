// Matrix products with a weight matrix in any supported format.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/mat_view.h"
#include "core/numerics.h"

namespace megakern {

class ThreadPool;

// Y[t][j] = sum_i W[j][i] * X[t][i] for t < n_x and j in [row_begin, row_end).
// X is [n_x][W.cols], Y is [n_x][ldy]. Each output is computed the same way
// whatever n_x and the row range, so results do not depend on batching or on
// how rows are split between threads. `numerics` picks the activation
// quantisation of block formats (core/numerics.h).
void matmul_rows(const MatView& W, const float* X, int64_t n_x, float* Y, int64_t ldy, int64_t row_begin,
                 int64_t row_end, Numerics numerics = Numerics::Exact);

// Names one set of inputs across several matmul_rows calls (the row ranges
// of the matrix products that read one slot's values in one step, run by
// one thread; ops/matmul.cpp keys them by the op that wrote the slot, the
// step's id as epoch): a call whose key
// equals the same thread's previous keyed call, with the same X, n_x and
// width, reuses the inputs it quantised instead of quantising them again.
// The caller guarantees X is unchanged between such calls. epoch 0: no reuse.
struct ActsKey {
  const void* tag = nullptr;
  uint64_t epoch = 0;
};
void matmul_rows(const MatView& W, const float* X, int64_t n_x, float* Y, int64_t ldy, int64_t row_begin,
                 int64_t row_end, Numerics numerics, const ActsKey& key);

// Weights the calling thread reads right after its current matmul_rows
// call, when its caller knows them: [begin, end) are the rows that follow
// the call's row range in the same matrix. The megakernel, which runs a
// product in chunks of rows one call each, names the chunk it runs next.
// Kernels that prefetch the next panel of their range while computing one
// (matmul_f32_tiled.h) then prefetch across the call's end into these
// rows instead of starting the next call on cold weights. Thread-local,
// empty unless set; never changes results.
struct WeightLookahead {
  const uint8_t* begin = nullptr;
  const uint8_t* end = nullptr;
};
WeightLookahead& weight_lookahead();

// A kernel threshold's override from the environment (MEGAKERN_FAST_R8_MIN,
// MEGAKERN_F32_TILED_MIN: A/B and tuning knobs whose results are the same
// bits either way): the variable's positive integer value, 0 when it is
// unset or empty; any other value fails, naming the variable.
int64_t threshold_from_env(const char* name);

// Kernels that derive tables from their quantised inputs (re-encoded codes,
// offsets, grouped values) keep them, per thread, for the next call on the
// same quantisation: `made` is the id (Q8Acts::id, QuantizedActs::id) the
// tables were made from. True when they must be made (again) for `id`, then
// `made` reads 0 until the caller sets it to id after making them (an error
// on the way leaves it so); id 0 (not known) always remakes.
inline bool remake_input_tables(uint64_t& made, uint64_t id) {
  if (id != 0 && id == made) return false;
  made = 0;
  return true;
}

// The same over all rows, split across the pool's workers. Y is [n_x][W.rows].
void matmul(ThreadPool& pool, const MatView& W, const float* X, int64_t n_x, float* Y,
            Numerics numerics = Numerics::Exact);

// Copies row j of W into dst (W.cols floats), dequantising.
void dequantize_row(const MatView& W, int64_t j, float* dst);

}  // namespace megakern
