// AVX2 kernels of the int16-activation scheme (qmatmul.h): the activation
// quantiser and the AVX2 build of the matrix kernels (qmatmul_i16_body.h;
// the AVX-VNNI build is qmatmul_i16_vnni_avx2.cpp). Compiled with -mavx2
// -mfma -mf16c; reached only through use_avx2().
#define MK_I16_VNNI 0
#define MK_I16_ENTRY matmul_rows_i16_avx2
#include "kernels/cpu/qmatmul_i16_body.h"

namespace megakern {

// Same arithmetic as quantize_acts_scalar (qmatmul.cpp), vectorised.
void quantize_acts_avx2(const float* X, int64_t n_x, int64_t cols, QuantizedActs& A) {
  prepare_acts(n_x, cols, A);
  const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t t = 0; t < n_x; ++t) {
    for (int64_t k = 0; k < A.nb; ++k) {
      const float* x = X + t * cols + 32 * k;
      __m256 v[4], a[4];
      int finite = 0xff;
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        a[i] = _mm256_andnot_ps(sign, v[i]);
        finite &= _mm256_movemask_ps(_mm256_cmp_ps(a[i], inf, _CMP_LT_OQ));
      }
      __m256 m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float amax = _mm_cvtss_f32(m4);
      float d = amax / 32767.0f;
      float id = d != 0.0f ? 1.0f / d : 0.0f;
      if (std::isinf(id)) d = id = 0.0f;  // as the scalar version
      int16_t* q = A.q.data() + t * cols + 32 * k;
      float* s = A.s.data() + (t * A.nb + k) * 8;
      if (finite != 0xff) {
        d = NAN;
        std::memset(q, 0, 64);
        _mm256_storeu_ps(s, _mm256_set1_ps(NAN));  // d * 0
        A.d[(size_t)(t * A.nb + k)] = d;
        continue;
      }
      const __m256 idv = _mm256_set1_ps(id);
      __m256i qi[4];
      for (int i = 0; i < 4; ++i) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], idv));
      // packs interleaves 128-bit lanes; the permute restores element order.
      const __m256i lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[0], qi[1]), 0xd8);
      const __m256i hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[2], qi[3]), 0xd8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 16), hi);
      const __m256i lanes = _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
      _mm256_storeu_ps(s, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes)));
      A.d[(size_t)(t * A.nb + k)] = d;
    }
  }
}

}  // namespace megakern
