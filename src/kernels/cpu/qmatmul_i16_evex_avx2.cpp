// The int16-activation matrix kernels (qmatmul_i16_body.h) with the EVEX
// encoding of vpdpwssd (AVX512-VNNI on 256-bit vectors, AVX512VL): for CPUs
// with AVX-512 VNNI but no AVX-VNNI (AMD Zen 4). The file is compiled for
// AVX2 like every *_avx2.cpp, the body for AVX-512 as well, reached only on
// CPUs that report it (isa.h). The same bits as the AVX2 build.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/qmatmul_i16_formats_avx2.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#define MK_I16_VNNI 1
#define MK_VNNI_EVEX 1
#define MK_I16_ENTRY matmul_rows_i16_evex
#include "kernels/cpu/qmatmul_i16_body.h"
#pragma GCC pop_options
