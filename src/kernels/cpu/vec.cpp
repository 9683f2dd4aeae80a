#include "kernels/cpu/vec.h"

#include "kernels/cpu/cpu_features.h"

namespace megakern {

float dot_f32_scalar(const float* a, const float* b, int64_t n) {
  // Four partial sums, like the vector path, to keep the dependency chain short.
  float s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) s[k] += a[i + k] * b[i + k];
  float r = (s[0] + s[1]) + (s[2] + s[3]);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

void axpy_f32_scalar(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void dot_f32_rows(const float* a, const float* x, int64_t stride, int64_t rows, int64_t n, float* out) {
  if (use_avx2()) {
    dot_f32_rows_avx2(a, x, stride, rows, n, out);
    return;
  }
  for (int64_t p = 0; p < rows; ++p) out[p] = dot_f32_scalar(a, x + p * stride, n);
}

void axpy_f32_rows(const float* w, const float* x, int64_t stride, int64_t rows, float* y, int64_t n) {
  if (use_avx2()) {
    axpy_f32_rows_avx2(w, x, stride, rows, y, n);
    return;
  }
  for (int64_t p = 0; p < rows; ++p) axpy_f32_scalar(w[p], x + p * stride, y, n);
}

void dot_f32_rows2(const float* a0, const float* a1, const float* x, int64_t stride, int64_t rows, int64_t n,
                   float* out0, float* out1) {
  if (use_avx2()) {
    dot_f32_rows2_avx2(a0, a1, x, stride, rows, n, out0, out1);
    return;
  }
  dot_f32_rows(a0, x, stride, rows, n, out0);
  dot_f32_rows(a1, x, stride, rows, n, out1);
}

void axpy_f32_rows2(const float* w0, const float* w1, const float* x, int64_t stride, int64_t rows, float* y0,
                    float* y1, int64_t n) {
  if (use_avx2()) {
    axpy_f32_rows2_avx2(w0, w1, x, stride, rows, y0, y1, n);
    return;
  }
  axpy_f32_rows(w0, x, stride, rows, y0, n);
  axpy_f32_rows(w1, x, stride, rows, y1, n);
}

float dot_f32(const float* a, const float* b, int64_t n) {
  return use_avx2() ? dot_f32_avx2(a, b, n) : dot_f32_scalar(a, b, n);
}

void axpy_f32(float a, const float* x, float* y, int64_t n) {
  if (use_avx2())
    axpy_f32_avx2(a, x, y, n);
  else
    axpy_f32_scalar(a, x, y, n);
}

}  // namespace megakern
