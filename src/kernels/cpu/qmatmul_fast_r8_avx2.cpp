// The register-blocked fast-mode kernel for AVX2 (qmatmul_fast_r8_body.h),
// many-input build.
#define MK_R8_VNNI 0
#define MK_R8_TRICKLE 0
#define MK_R8_ENTRY matmul_rows_fast_r8_avx2
#include "kernels/cpu/qmatmul_fast_r8_body.h"

namespace megakern {

bool fast_r8_supports(DType t) {
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q6_K:
    case DType::Q5_K:
    case DType::IQ4_XS:
    case DType::Q5_0:
    case DType::IQ4_NL:
    case DType::Q3_K:
    case DType::MXFP4:
    case DType::NVFP4:
    case DType::INT4_G128:
    case DType::INT8_COL:
      return true;
    default:
      return false;
  }
}

}  // namespace megakern
