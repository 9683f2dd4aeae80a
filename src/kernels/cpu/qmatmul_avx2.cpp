// AVX2 kernels of the int16-activation scheme (qmatmul.h): the activation
// quantiser and the AVX2 build of the matrix kernels (qmatmul_i16_body.h;
// the AVX-VNNI build is qmatmul_i16_vnni_avx2.cpp). Compiled with -mavx2
// -mfma -mf16c; reached only through use_avx2().
#define MK_I16_VNNI 0
#define MK_I16_ENTRY matmul_rows_i16_avx2
#include "kernels/cpu/qmatmul_i16_body.h"

namespace megakern {

// Same arithmetic as quantize_acts_scalar (qmatmul.cpp), vectorised. The
// blocks of a row go eight at a time: their scales and inverses are one
// vector division each (exactly rounded, as the scalar ones) rather than two
// scalar divisions per block.
void quantize_acts_avx2(const float* X, int64_t n_x, int64_t cols, QuantizedActs& A) {
  prepare_acts(n_x, cols, A);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t t = 0; t < n_x; ++t) {
    for (int64_t k0 = 0; k0 < A.nb; k0 += 8) {
      const int nblk = (int)std::min<int64_t>(8, A.nb - k0);
      alignas(32) float amax[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int finite = 0;
      for (int b = 0; b < nblk; ++b) {
        bool ok;
        amax[b] = avx2::abs_max(X + t * cols + 32 * (k0 + b), 32, ok);
        finite |= ok ? 1 << b : 0;
      }
      __m256 d, id;
      avx2::block_scales8(_mm256_load_ps(amax), 32767.0f, d, id);
      alignas(32) float db[8], idb[8];
      _mm256_store_ps(db, d);
      _mm256_store_ps(idb, id);
      for (int b = 0; b < nblk; ++b) {
        const int64_t k = k0 + b;
        const float* x = X + t * cols + 32 * k;
        int16_t* q = A.q.data() + t * cols + 32 * k;
        if (!(finite >> b & 1)) {
          std::memset(q, 0, 64);
          A.d[(size_t)(t * A.nb + k)] = NAN;
          A.sum[(size_t)(t * A.nb + k)] = NAN;  // d * 0
          continue;
        }
        const __m256 idv = _mm256_set1_ps(idb[b]);
        __m256i qi[4];
        for (int i = 0; i < 4; ++i) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), idv));
        // packs interleaves 128-bit lanes; the permute restores element order.
        const __m256i lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[0], qi[1]), 0xd8);
        const __m256i hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[2], qi[3]), 0xd8);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 16), hi);
        const __m256i lanes = _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
        A.d[(size_t)(t * A.nb + k)] = db[b];
        A.sum[(size_t)(t * A.nb + k)] = db[b] * (float)avx2::hsum_epi32(lanes);
      }
    }
  }
}

}  // namespace megakern
