// The register-blocked fast-mode kernel for AVX2 (qmatmul_fast_r8_body.h),
// many-input build.
#define MK_R8_VNNI 0
#define MK_R8_TRICKLE 0
#define MK_R8_ENTRY matmul_rows_fast_r8_avx2
#include "kernels/cpu/qmatmul_fast_r8_body.h"
#include "kernels/cpu/format_kernels.h"

namespace megakern {

bool fast_r8_supports(DType t) { return format_kernels(t).r8_min_inputs != 0; }

}  // namespace megakern
