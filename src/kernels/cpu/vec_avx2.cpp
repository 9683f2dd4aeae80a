// AVX2/FMA versions of vec.h. Compiled with -mavx2 -mfma; reached only when
// the CPU reports both.
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/vec.h"

namespace megakern {

float dot_f32_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
         s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float r = avx2::hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  // The tail is fused explicitly: GCC would contract "r += a * b" here in
  // some inlining contexts and not others, and callers (the matrix kernels)
  // must be able to reproduce this function's bits.
  for (; i < n; ++i) r = std::fma(a[i], b[i], r);
  return r;
}

void axpy_f32_avx2(float a, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

void dot_f32_rows_avx2(const float* a, const float* x, int64_t stride, int64_t rows, int64_t n, float* out) {
  if (n % 32 != 0 || n > 256) {  // the general shape: one row at a time
    for (int64_t p = 0; p < rows; ++p) out[p] = dot_f32_avx2(a, x + p * stride, n);
    return;
  }
  // Two rows per pass, each with dot_f32_avx2's four accumulators over
  // 32-element chunks and its final reduction, so the bits are the same.
  int64_t p = 0;
  for (; p + 2 <= rows; p += 2) {
    const float* x0 = x + p * stride;
    const float* x1 = x0 + stride;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t i = 0; i < n; i += 32) {
      const __m256 q0 = _mm256_loadu_ps(a + i), q1 = _mm256_loadu_ps(a + i + 8), q2 = _mm256_loadu_ps(a + i + 16),
                   q3 = _mm256_loadu_ps(a + i + 24);
      a0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(x0 + i), a0);
      b0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(x1 + i), b0);
      a1 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(x0 + i + 8), a1);
      b1 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(x1 + i + 8), b1);
      a2 = _mm256_fmadd_ps(q2, _mm256_loadu_ps(x0 + i + 16), a2);
      b2 = _mm256_fmadd_ps(q2, _mm256_loadu_ps(x1 + i + 16), b2);
      a3 = _mm256_fmadd_ps(q3, _mm256_loadu_ps(x0 + i + 24), a3);
      b3 = _mm256_fmadd_ps(q3, _mm256_loadu_ps(x1 + i + 24), b3);
    }
    out[p] = avx2::hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    out[p + 1] = avx2::hsum(_mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3)));
  }
  for (; p < rows; ++p) out[p] = dot_f32_avx2(a, x + p * stride, n);
}

void axpy_f32_rows_avx2(const float* w, const float* x, int64_t stride, int64_t rows, float* y, int64_t n) {
  // y is kept in registers 64 elements at a time; each element sees the same
  // fused multiply-adds in the same order as repeated axpy_f32_avx2 calls.
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m256 acc[8];
    for (int k = 0; k < 8; ++k) acc[k] = _mm256_loadu_ps(y + i + 8 * k);
    for (int64_t p = 0; p < rows; ++p) {
      const __m256 wp = _mm256_set1_ps(w[p]);
      const float* xp = x + p * stride + i;
      for (int k = 0; k < 8; ++k) acc[k] = _mm256_fmadd_ps(wp, _mm256_loadu_ps(xp + 8 * k), acc[k]);
    }
    for (int k = 0; k < 8; ++k) _mm256_storeu_ps(y + i + 8 * k, acc[k]);
  }
  if (i < n)
    for (int64_t p = 0; p < rows; ++p) axpy_f32_avx2(w[p], x + p * stride + i, y + i, n - i);
}

}  // namespace megakern
