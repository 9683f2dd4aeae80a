// The register-blocked fast-mode kernel for AVX2 with AVX-VNNI
// (qmatmul_fast_r8_body.h), many-input build. The file is compiled for
// AVX2 like every *_avx2.cpp; the kernel's own functions, below the
// headers, are compiled for AVX-VNNI as well and are reached only on CPUs
// that report it (cpu_features().avxvnni).
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
#pragma GCC target("avxvnni")
#define MK_R8_VNNI 1
#define MK_VNNI_EVEX 0
#define MK_R8_TRICKLE 0
#define MK_R8_ENTRY matmul_rows_fast_r8_vnni
#include "kernels/cpu/qmatmul_fast_r8_body.h"
#pragma GCC pop_options
