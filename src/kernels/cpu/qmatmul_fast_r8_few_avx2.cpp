// The register-blocked fast-mode kernel for AVX2 (qmatmul_fast_r8_body.h),
// few-input build (MK_R8_TRICKLE: batches and verify steps).
#define MK_R8_VNNI 0
#define MK_R8_TRICKLE 1
#include "kernels/cpu/qmatmul_fast_r8_body.h"

namespace megakern {

void matmul_rows_fast_r8_few_avx2(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  r8_dispatch(W, A, Y, ldy, rb, re);
}

}  // namespace megakern
