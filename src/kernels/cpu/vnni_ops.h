// The two VNNI dot-product instructions as the *_vnni / *_evex kernel builds
// spell them. The same 256-bit operation has two encodings: VEX (AVX-VNNI,
// Intel since Alder Lake and Sapphire Rapids) and EVEX (AVX512-VNNI with
// AVX512VL, Intel since Cascade Lake and AMD since Zen 4, which lacks
// AVX-VNNI). A build includes this after setting MK_VNNI_EVEX (0 or 1) inside
// its target region; the integers are identical either way.
//   MK_DPBUSD(acc, u8, s8): acc + the sums of four u8 x s8 products per lane
//   MK_DPWSSD(acc, a, b):   acc + the sums of two int16 x int16 products per lane
#pragma once

#include <immintrin.h>

#ifndef MK_VNNI_EVEX
#error "define MK_VNNI_EVEX (0 or 1) before including vnni_ops.h"
#endif

#if MK_VNNI_EVEX
#define MK_DPBUSD(acc, a, b) _mm256_dpbusd_epi32((acc), (a), (b))
#define MK_DPWSSD(acc, a, b) _mm256_dpwssd_epi32((acc), (a), (b))
#else
#define MK_DPBUSD(acc, a, b) _mm256_dpbusd_avx_epi32((acc), (a), (b))
#define MK_DPWSSD(acc, a, b) _mm256_dpwssd_avx_epi32((acc), (a), (b))
#endif
