#include "kernels/cpu/quant_rows.h"

#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/vec.h"

namespace megakern {

bool quant_rows_fast(DType t) { return use_avx2() && avx2_row_kernels_support(t); }

void dequantize_row_fast(DType t, const void* w, float* dst, int64_t n) {
  if (quant_rows_fast(t))
    dequantize_row_avx2(t, w, dst, n);
  else
    dtype_traits(t).dequantize(w, dst, n);
}

float dot_row_fast(DType t, const void* w, const float* x, int64_t n) {
  if (quant_rows_fast(t)) return dot_row_avx2(t, w, x, n);
  if (t == DType::F32) return dot_f32(static_cast<const float*>(w), x, n);
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(n)) buf.resize(static_cast<size_t>(n));
  dtype_traits(t).dequantize(w, buf.data(), n);
  return dot_f32(buf.data(), x, n);
}

}  // namespace megakern
