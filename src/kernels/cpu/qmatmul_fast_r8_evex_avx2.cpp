// The register-blocked fast-mode kernel (qmatmul_fast_r8_body.h), many-input
// build, with the EVEX encoding of vpdpbusd / vpdpwssd (AVX512-VNNI on
// 256-bit vectors): for CPUs with AVX-512 VNNI but no AVX-VNNI (AMD Zen 4).
// Compiled for AVX2 like every *_avx2.cpp, the body for AVX-512 as well,
// reached only on CPUs that report it (isa.h). Same bits.
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
#define MK_R8_TRICKLE 0
#define MK_R8_ENTRY matmul_rows_fast_r8_evex
#include "kernels/cpu/qmatmul_fast_r8_body.h"
#pragma GCC pop_options
