// The register-blocked fast-mode kernel for AVX2 (qmatmul_fast_r8_body.h),
// few-input build (MK_R8_TRICKLE: batches and verify steps).
#define MK_R8_VNNI 0
#define MK_R8_TRICKLE 1
#define MK_R8_ENTRY matmul_rows_fast_r8_few_avx2
#include "kernels/cpu/qmatmul_fast_r8_body.h"
