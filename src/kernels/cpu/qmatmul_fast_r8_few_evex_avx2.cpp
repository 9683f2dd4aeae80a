// The register-blocked fast-mode kernel's few-input build (MK_R8_TRICKLE)
// with the EVEX VNNI encodings, compiled as qmatmul_fast_r8_evex_avx2.cpp is.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/qmatmul_fast.h"
#include "kernels/cpu/qmatmul_fast_formats_avx2.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#define MK_R8_VNNI 1
#define MK_VNNI_EVEX 1
#define MK_R8_TRICKLE 1
#define MK_R8_ENTRY matmul_rows_fast_r8_few_evex
#include "kernels/cpu/qmatmul_fast_r8_body.h"
#pragma GCC pop_options
