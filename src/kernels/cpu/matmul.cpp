#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul_f32_tiled.h"
#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/qmatmul_fast.h"
#include "kernels/cpu/quant_rows.h"
#include "kernels/cpu/repack.h"
#include "kernels/cpu/vec.h"
#include "kernels/ref/i16_ref.h"

namespace megakern {
namespace {

// The rows [row_begin, end) that W's packed copy serves for n_x inputs
// (end <= row_begin: none), the rest left to the original rows' kernels.
int64_t packed_end(const MatView& W, int64_t n_x, int64_t row_begin, int64_t row_end, Numerics numerics) {
  if (W.packed == nullptr || !repack_enabled() || !r16_supports(W.type, numerics)) return row_begin;
  if (n_x > r16_max_inputs(numerics) && !(n_x >= r16_many_inputs() && r16_many_supports(W.type, numerics)))
    return row_begin;
  return std::min(row_end, W.rows / kR16Rows * kR16Rows);
}

// Rows [row_begin, row_end) with the inputs already quantised when the
// format needs it (A non-null exactly when uses_i16_acts(W.type)). Every
// path computes each output (t, j) by a sequence of operations that depends
// only on W's row j, X's row t and the ISA, never on n_x or the row range:
// rows are independent, and inputs are either handled one at a time or in
// groups whose per-input arithmetic is the same as alone.
void rows_prepared(const MatView& W, const float* X, const QuantizedActs* A, int64_t n_x, float* Y, int64_t ldy,
                   int64_t row_begin, int64_t row_end) {
  if (A != nullptr) {
    const int64_t p = packed_end(W, n_x, row_begin, row_end, Numerics::Exact);
    if (p > row_begin) matmul_rows_i16_r16_evex(W, *A, Y, ldy, row_begin, p);
    row_begin = std::max(row_begin, p);
    if (row_begin == row_end) return;
    if (const IntKernelBuild* b = active_int_build())
      b->i16_rows(W, *A, Y, ldy, row_begin, row_end);
    else
      matmul_rows_i16_ref(W, *A, Y, ldy, row_begin, row_end);
    return;
  }
  if (use_avx2() && f32_path_avx2_supports(W.type)) {
    matmul_rows_f32_avx2(W, X, n_x, Y, ldy, row_begin, row_end);
    return;
  }
  // Portable f32 path: decode the row once, then dot it with every input.
  thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<size_t>(W.cols)) scratch.resize(static_cast<size_t>(W.cols));
  for (int64_t j = row_begin; j < row_end; ++j) {
    const float* w;
    if (W.type == DType::F32 && reinterpret_cast<uintptr_t>(W.row(j)) % alignof(float) == 0) {
      w = reinterpret_cast<const float*>(W.row(j));
    } else {
      dequantize_row_fast(W.type, W.row(j), scratch.data(), W.cols);
      w = scratch.data();
    }
    for (int64_t t = 0; t < n_x; ++t) Y[t * ldy + j] = dot_f32(w, X + t * W.cols, W.cols);
  }
}

// The fast mode's path: 8-bit activations for the formats that have it.
void rows_fast(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t row_begin, int64_t row_end) {
  const int64_t p = packed_end(W, A.n_x, row_begin, row_end, Numerics::Fast);
  if (p > row_begin) matmul_rows_fast_r16_evex(W, A, Y, ldy, row_begin, p);
  row_begin = std::max(row_begin, p);
  if (row_begin == row_end) return;
  if (use_avx2())
    matmul_rows_fast_avx2(W, A, Y, ldy, row_begin, row_end);
  else
    matmul_rows_fast_ref(W, A, Y, ldy, row_begin, row_end);
}

}  // namespace

int64_t threshold_from_env(const char* name) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == 0) return 0;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  MK_CHECK(*end == 0 && v >= 1 && v <= (1L << 30), "{} must be a positive integer, got '{}'", name, e);
  return static_cast<int64_t>(v);
}

int64_t f32_tiled_min_inputs() {
  static const int64_t forced = threshold_from_env("MEGAKERN_F32_TILED_MIN");
  return forced > 0 ? forced : kF32TiledMinInputs;
}

void dequantize_row(const MatView& W, int64_t j, float* dst) {
  dequantize_row_fast(W.type, W.row(j), dst, W.cols);
}

void matmul_rows(const MatView& W, const float* X, int64_t n_x, float* Y, int64_t ldy, int64_t row_begin,
                 int64_t row_end, Numerics numerics) {
  matmul_rows(W, X, n_x, Y, ldy, row_begin, row_end, numerics, ActsKey{});
}

void matmul_rows(const MatView& W, const float* X, int64_t n_x, float* Y, int64_t ldy, int64_t row_begin,
                 int64_t row_end, Numerics numerics, const ActsKey& key) {
  MK_CHECK(row_begin >= 0 && row_end <= W.rows && row_begin <= row_end);
  if (n_x <= 0 || row_begin == row_end) return;
  // What this thread's quantised inputs of each kind were made from.
  struct Made {
    ActsKey key;
    const float* x = nullptr;
    int64_t n_x = 0, cols = 0, block = 0;
    bool same(const ActsKey& k, const float* x_, int64_t n, int64_t c, int64_t b) const {
      return k.epoch != 0 && k.tag == key.tag && k.epoch == key.epoch && x_ == x && n == n_x && c == cols && b == block;
    }
  };
  if (numerics == Numerics::Fast && uses_fast_acts(W.type)) {
    thread_local Q8Acts acts;
    thread_local Made made;
    const int64_t block = fast_act_block(W.type);
    if (!made.same(key, X, n_x, W.cols, block)) {
      made = Made{};  // invalid while quantising (an error leaves it so)
      quantize_q8_acts(X, n_x, W.cols, block, acts);
      made = Made{key, X, n_x, W.cols, block};
    }
    rows_fast(W, acts, Y, ldy, row_begin, row_end);
    return;
  }
  if (uses_i16_acts(W.type)) {
    thread_local QuantizedActs acts;
    thread_local Made made;
    if (!made.same(key, X, n_x, W.cols, 0)) {
      made = Made{};
      quantize_acts(X, n_x, W.cols, acts);
      made = Made{key, X, n_x, W.cols, 0};
    }
    rows_prepared(W, X, &acts, n_x, Y, ldy, row_begin, row_end);
    return;
  }
  if (use_avx2() && f32_path_avx2_supports(W.type) && n_x >= f32_tiled_min_inputs()) {
    // The tiled kernel's packed inputs, made once per key like the
    // quantised ones above (the same bits as packing them per call).
    thread_local TiledF32Inputs packed;
    thread_local Made made;
    const int64_t layout = tiled_f32_layout(W.type);  // in Made's block field
    if (!made.same(key, X, n_x, W.cols, layout)) {
      made = Made{};
      pack_tiled_f32_inputs(W.type, X, n_x, W.cols, packed);
      made = Made{key, X, n_x, W.cols, layout};
    }
    matmul_rows_f32_tiled_avx2(W, X, n_x, Y, ldy, row_begin, row_end, &packed);
    return;
  }
  rows_prepared(W, X, nullptr, n_x, Y, ldy, row_begin, row_end);
}

void matmul(ThreadPool& pool, const MatView& W, const float* X, int64_t n_x, float* Y, Numerics numerics) {
  if (n_x <= 0 || W.rows == 0) return;
  // Inputs are quantised once, by the calling thread, and shared read-only.
  if (numerics == Numerics::Fast && uses_fast_acts(W.type)) {
    thread_local Q8Acts q8;
    quantize_q8_acts(X, n_x, W.cols, fast_act_block(W.type), q8);
    // The workers read this thread's activations (a thread_local named in
    // the lambda would be each worker's own).
    const Q8Acts& acts = q8;
    pool.parallel_for(W.rows, 16, [&](int64_t b, int64_t e) { rows_fast(W, acts, Y, W.rows, b, e); });
    return;
  }
  thread_local QuantizedActs acts;
  const QuantizedActs* A = nullptr;
  if (uses_i16_acts(W.type)) {
    quantize_acts(X, n_x, W.cols, acts);
    A = &acts;
  }
  // Contiguous, balanced row ranges (one per worker, multiples of 16 rows).
  pool.parallel_for(W.rows, 16, [&](int64_t b, int64_t e) { rows_prepared(W, X, A, n_x, Y, W.rows, b, e); });
}

WeightLookahead& weight_lookahead() {
  thread_local WeightLookahead w;
  return w;
}

}  // namespace megakern
