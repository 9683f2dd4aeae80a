// The f32 path of the multi-input kernels (see qmatmul.h): float weight
// formats decoded to the reference dequantiser's floats and summed exactly as
// dot_f32_avx2 sums. Compiled with -mavx2 -mfma -mf16c; reached only through
// use_avx2(). Many inputs take the register-blocked kernel of
// matmul_f32_tiled_avx2.cpp, same bits.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "kernels/cpu/format_kernels.h"
#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/f32_decoders_avx2.h"
#include "kernels/cpu/matmul_f32_tiled.h"
#include "kernels/cpu/qmatmul.h"

namespace megakern {
namespace {

using avx2::hsum;

// f32 path: decoders give 8 floats at element i (a multiple of 8; for FP8 a
// whole 32-element block at once), and one float for the scalar tail.

using f32_decode::BF16W;
using f32_decode::F16W;
using f32_decode::F32W;
using f32_decode::FP8W;

// Same order as dot_f32_avx2 over the decoded row: 32-element steps into four
// accumulators, 8-element steps into the first, reduction, then a scalar tail.
template <class F, int NT>
inline void f32_row(const uint8_t* row, int64_t n, const float* X, int64_t t0, float* Y, int64_t ldy, int64_t j) {
  __m256 s[NT][4];
  const float* x[NT];
  for (int t = 0; t < NT; ++t) {
    for (int k = 0; k < 4; ++k) s[t][k] = _mm256_setzero_ps();
    x[t] = X + (t0 + t) * n;
  }
  int64_t i = 0;
  __m256 v[4];
  for (; i + 32 <= n; i += 32) {
    F::load32(row, i, v);
    for (int t = 0; t < NT; ++t)
      for (int k = 0; k < 4; ++k) s[t][k] = _mm256_fmadd_ps(v[k], _mm256_loadu_ps(x[t] + i + 8 * k), s[t][k]);
  }
  if constexpr (F::kAny) {
    for (; i + 8 <= n; i += 8) {
      const __m256 w = F::load8(row, i);
      for (int t = 0; t < NT; ++t) s[t][0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x[t] + i), s[t][0]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    float r = hsum(_mm256_add_ps(_mm256_add_ps(s[t][0], s[t][1]), _mm256_add_ps(s[t][2], s[t][3])));
    if constexpr (F::kAny)
      for (int64_t ii = i; ii < n; ++ii) r = std::fma(F::one(row, ii), x[t][ii], r);  // as dot_f32_avx2
    Y[(t0 + t) * ldy + j] = r;
  }
}

template <class F>
void f32_rows(const MatView& W, const float* X, int64_t n_x, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  const int64_t tile = n_x <= 2 ? re - rb : avx2::tile_rows(W.row_bytes);  // as i16_rows
  for (int64_t jb = rb; jb < re; jb += tile) {
    const int64_t je = std::min(re, jb + tile);
    int64_t t0 = 0;
    for (; t0 + 2 <= n_x; t0 += 2)
      for (int64_t j = jb; j < je; ++j) f32_row<F, 2>(W.row(j), W.cols, X, t0, Y, ldy, j);
    if (t0 < n_x)
      for (int64_t j = jb; j < je; ++j) f32_row<F, 1>(W.row(j), W.cols, X, t0, Y, ldy, j);
  }
}

}  // namespace

bool f32_path_avx2_supports(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::FP8_E4M3;
}

void matmul_rows_f32_avx2(const MatView& W, const float* X, int64_t n_x, float* Y, int64_t ldy, int64_t rb,
                          int64_t re) {
  if (n_x >= f32_tiled_min_inputs())  // same bits, register-blocked (matmul_f32_tiled.h)
    matmul_rows_f32_tiled_avx2(W, X, n_x, Y, ldy, rb, re);
  else
    matmul_rows_f32_rowwise_avx2(W, X, n_x, Y, ldy, rb, re);
}

void matmul_rows_f32_rowwise_avx2(const MatView& W, const float* X, int64_t n_x, float* Y, int64_t ldy, int64_t rb,
                                  int64_t re) {
  switch (W.type) {
    case DType::F32: f32_rows<F32W>(W, X, n_x, Y, ldy, rb, re); break;
    case DType::F16: f32_rows<F16W>(W, X, n_x, Y, ldy, rb, re); break;
    case DType::BF16: f32_rows<BF16W>(W, X, n_x, Y, ldy, rb, re); break;
    case DType::FP8_E4M3: f32_rows<FP8W>(W, X, n_x, Y, ldy, rb, re); break;
    default: kernel_missing("AVX2 f32-path", W.type);
  }
}

}  // namespace megakern
