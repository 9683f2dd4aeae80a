#include "kernels/cpu/quant_rows.h"


#include "kernels/cpu/cpu_features.h"

namespace megakern {

bool quant_rows_fast(DType t) { return use_avx2() && avx2_row_kernels_support(t); }

void dequantize_row_fast(DType t, const void* w, float* dst, int64_t n) {
  if (quant_rows_fast(t))
    dequantize_row_avx2(t, w, dst, n);
  else
    dtype_traits(t).dequantize(w, dst, n);
}

}  // namespace megakern
