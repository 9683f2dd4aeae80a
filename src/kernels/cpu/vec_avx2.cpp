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

namespace {

// Two queries against keys r[0..4) of CH 32-element chunks. dot_f32_avx2
// keeps four accumulators, one per 8-element quarter c of each chunk, and
// returns hsum((s0 + s1) + (s2 + s3)). Here each quarter is done for the
// 2 x 4 products at once (eight chains, each key's quarter loaded once into
// a register for both queries), and the quarters are combined as they
// finish: t = s0 + s1 is kept while s2 and s3 are formed.
template <int CH>
__attribute__((always_inline)) inline void dot2x4(const float* a0, const float* a1, const float* const r[4], float* out0, float* out1) {
  __m256 t[8], u[8];
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    __m256 s[8];
    for (auto& v : s) v = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < CH; ++i) {
      const int o = 32 * i + 8 * c;
      const __m256 q0 = _mm256_loadu_ps(a0 + o), q1 = _mm256_loadu_ps(a1 + o);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        __m256 k = _mm256_loadu_ps(r[j] + o);
        __asm__("" : "+x"(k));  // one load of the key quarter for both queries
        s[j] = _mm256_fmadd_ps(q0, k, s[j]);
        s[4 + j] = _mm256_fmadd_ps(q1, k, s[4 + j]);
      }
    }
    for (int j = 0; j < 8; ++j) {
      if (c == 0) t[j] = s[j];
      if (c == 1) t[j] = _mm256_add_ps(t[j], s[j]);
      if (c == 2) u[j] = s[j];
      if (c == 3) t[j] = _mm256_add_ps(t[j], _mm256_add_ps(u[j], s[j]));
    }
  }
  const __m256 h = avx2::hsum8(t);
  _mm_storeu_ps(out0, _mm256_castps256_ps128(h));
  _mm_storeu_ps(out1, _mm256_extractf128_ps(h, 1));
}

template <int CH>
void dot_rows2_chunks(const float* a0, const float* a1, const float* x, int64_t stride, int64_t rows, float* out0,
                      float* out1) {
  int64_t p = 0;
  for (; p + 4 <= rows; p += 4) {
    const float* r[4] = {x + p * stride, x + (p + 1) * stride, x + (p + 2) * stride, x + (p + 3) * stride};
    dot2x4<CH>(a0, a1, r, out0 + p, out1 + p);
  }
  for (; p < rows; ++p) {
    out0[p] = dot_f32_avx2(a0, x + p * stride, 32 * CH);
    out1[p] = dot_f32_avx2(a1, x + p * stride, 32 * CH);
  }
}

}  // namespace

void dot_f32_rows2_avx2(const float* a0, const float* a1, const float* x, int64_t stride, int64_t rows, int64_t n,
                        float* out0, float* out1) {
  switch (n % 32 == 0 ? n / 32 : 0) {
    case 1: return dot_rows2_chunks<1>(a0, a1, x, stride, rows, out0, out1);
    case 2: return dot_rows2_chunks<2>(a0, a1, x, stride, rows, out0, out1);
    case 3: return dot_rows2_chunks<3>(a0, a1, x, stride, rows, out0, out1);
    case 4: return dot_rows2_chunks<4>(a0, a1, x, stride, rows, out0, out1);
    case 5: return dot_rows2_chunks<5>(a0, a1, x, stride, rows, out0, out1);
    case 6: return dot_rows2_chunks<6>(a0, a1, x, stride, rows, out0, out1);
    case 7: return dot_rows2_chunks<7>(a0, a1, x, stride, rows, out0, out1);
    case 8: return dot_rows2_chunks<8>(a0, a1, x, stride, rows, out0, out1);
    default:
      dot_f32_rows_avx2(a0, x, stride, rows, n, out0);
      dot_f32_rows_avx2(a1, x, stride, rows, n, out1);
  }
}

namespace {

// NV vectors (8 NV elements) of both outputs from element i on, over all
// rows: 2 NV accumulators, each row's vectors loaded once for both.
template <int NV>
__attribute__((always_inline)) inline void axpy2_block(const float* w0, const float* w1, const float* x, int64_t stride,
                                                       int64_t rows, float* y0, float* y1) {
  __m256 a[NV], b[NV];
  for (int k = 0; k < NV; ++k) a[k] = _mm256_loadu_ps(y0 + 8 * k), b[k] = _mm256_loadu_ps(y1 + 8 * k);
  for (int64_t p = 0; p < rows; ++p) {
    const __m256 u = _mm256_set1_ps(w0[p]), v = _mm256_set1_ps(w1[p]);
    const float* xp = x + p * stride;
    for (int k = 0; k < NV; ++k) {
      const __m256 e = _mm256_loadu_ps(xp + 8 * k);
      a[k] = _mm256_fmadd_ps(u, e, a[k]);
      b[k] = _mm256_fmadd_ps(v, e, b[k]);
    }
  }
  for (int k = 0; k < NV; ++k) _mm256_storeu_ps(y0 + 8 * k, a[k]), _mm256_storeu_ps(y1 + 8 * k, b[k]);
}

}  // namespace

void axpy_f32_rows2_avx2(const float* w0, const float* w1, const float* x, int64_t stride, int64_t rows, float* y0,
                         float* y1, int64_t n) {
  // Both outputs' elements in registers, 48 at a time (twelve accumulators:
  // each gets one FMA per row, so eight of them, 32 elements, left the FMA
  // units waiting on their latency) or 32. Per element, the same fused
  // multiply-adds in the same order as axpy_f32_rows_avx2 (and repeated
  // axpy_f32_avx2).
  // As many 48-element blocks as leave a multiple of 32 (128: 48 + 48 +
  // 32; 64: 32 + 32), so no element falls to the one-row tail loop.
  int64_t n48 = n / 48;
  while (n48 > 0 && (n - 48 * n48) % 32 != 0) --n48;
  int64_t i = 0;
  for (; i < 48 * n48; i += 48) axpy2_block<6>(w0, w1, x + i, stride, rows, y0 + i, y1 + i);
  for (; i + 32 <= n; i += 32) axpy2_block<4>(w0, w1, x + i, stride, rows, y0 + i, y1 + i);
  if (i < n) {
    for (int64_t p = 0; p < rows; ++p) axpy_f32_avx2(w0[p], x + p * stride + i, y0 + i, n - i);
    for (int64_t p = 0; p < rows; ++p) axpy_f32_avx2(w1[p], x + p * stride + i, y1 + i, n - i);
  }
}

}  // namespace megakern
