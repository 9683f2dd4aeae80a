// Vector primitives on f32 with a scalar version and an AVX2 version chosen at
// run time. Each function's summation order is fixed for a given ISA, so a
// result never depends on how work was split between threads.
#pragma once

#include <cstdint>

namespace megakern {

// sum_i a[i] * b[i]
float dot_f32(const float* a, const float* b, int64_t n);
float dot_f32_scalar(const float* a, const float* b, int64_t n);
float dot_f32_avx2(const float* a, const float* b, int64_t n);

// y[i] += a * x[i]
void axpy_f32(float a, const float* x, float* y, int64_t n);
void axpy_f32_scalar(float a, const float* x, float* y, int64_t n);
void axpy_f32_avx2(float a, const float* x, float* y, int64_t n);

// Many rows at once (attention over a KV cache: row p at x + p * stride):
//   out[p] = dot_f32(a, x + p * stride, n)                 for p < rows
//   y     += w[p] * (x + p * stride)  for p = 0, 1, ... in order
// with exactly the bits of the one-row functions on the same ISA (the same
// per-element operations in the same order), only without a call and a pass
// over y per row.
void dot_f32_rows(const float* a, const float* x, int64_t stride, int64_t rows, int64_t n, float* out);
void axpy_f32_rows(const float* w, const float* x, int64_t stride, int64_t rows, float* y, int64_t n);
void dot_f32_rows_avx2(const float* a, const float* x, int64_t stride, int64_t rows, int64_t n, float* out);
void axpy_f32_rows_avx2(const float* w, const float* x, int64_t stride, int64_t rows, float* y, int64_t n);

// The same for two query vectors (two heads of a GQA group) against the same
// rows, each row loaded once for both: out0 as dot_f32_rows(a0, ...), out1
// as dot_f32_rows(a1, ...), bit for bit; y0 and y1 likewise for
// axpy_f32_rows with weights w0 and w1.
void dot_f32_rows2(const float* a0, const float* a1, const float* x, int64_t stride, int64_t rows, int64_t n,
                   float* out0, float* out1);
void axpy_f32_rows2(const float* w0, const float* w1, const float* x, int64_t stride, int64_t rows, float* y0,
                    float* y1, int64_t n);
void dot_f32_rows2_avx2(const float* a0, const float* a1, const float* x, int64_t stride, int64_t rows, int64_t n,
                        float* out0, float* out1);
void axpy_f32_rows2_avx2(const float* w0, const float* w1, const float* x, int64_t stride, int64_t rows, float* y0,
                         float* y1, int64_t n);

}  // namespace megakern
