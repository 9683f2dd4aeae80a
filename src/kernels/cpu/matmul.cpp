#include "kernels/cpu/matmul.h"

#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/quant_rows.h"
#include "kernels/cpu/vec.h"

namespace megakern {

void dequantize_row(const MatView& W, int64_t j, float* dst) {
  dequantize_row_fast(W.type, W.row(j), dst, W.cols);
}

void matmul_rows(const MatView& W, const float* X, int64_t n_x, float* Y, int64_t ldy, int64_t row_begin,
                 int64_t row_end) {
  MK_CHECK(row_begin >= 0 && row_end <= W.rows && row_begin <= row_end);
  // Few inputs: decode each row in registers and never store it. Many
  // inputs: decode the row once into a buffer and reuse it for every input.
  // Both give the same bits (see quant_rows.h), so results do not depend on n_x.
  if (n_x <= 2) {
    for (int64_t j = row_begin; j < row_end; ++j)
      for (int64_t t = 0; t < n_x; ++t) Y[t * ldy + j] = dot_row_fast(W.type, W.row(j), X + t * W.cols, W.cols);
    return;
  }
  thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<size_t>(W.cols)) scratch.resize(static_cast<size_t>(W.cols));
  for (int64_t j = row_begin; j < row_end; ++j) {
    const float* w;
    if (W.type == DType::F32) {
      w = reinterpret_cast<const float*>(W.row(j));
    } else {
      dequantize_row_fast(W.type, W.row(j), scratch.data(), W.cols);
      w = scratch.data();
    }
    for (int64_t t = 0; t < n_x; ++t) Y[t * ldy + j] = dot_f32(w, X + t * W.cols, W.cols);
  }
}

void matmul(ThreadPool& pool, const MatView& W, const float* X, int64_t n_x, float* Y) {
  pool.parallel_for(W.rows, 16, [&](int64_t b, int64_t e) { matmul_rows(W, X, n_x, Y, W.rows, b, e); });
}

}  // namespace megakern
