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

}  // namespace megakern
