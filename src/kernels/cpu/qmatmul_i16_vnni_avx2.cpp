// The int16-activation matrix kernels (qmatmul_i16_body.h) built for AVX2
// with AVX-VNNI: the file is compiled for AVX2 like every *_avx2.cpp, the
// body's functions for AVX-VNNI as well, reached only on CPUs that report
// it (cpu_features().avxvnni). The same bits as the AVX2 build.
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
#pragma GCC target("avxvnni")
#define MK_I16_VNNI 1
#define MK_VNNI_EVEX 0
#define MK_I16_ENTRY matmul_rows_i16_vnni
#include "kernels/cpu/qmatmul_i16_body.h"
#pragma GCC pop_options
