// AVX2 / F16C build of kv_decode.h: f16 through vcvtph2ps, bf16 by widening
// to 32 bits and shifting left by 16, q8_0 by sign-extending the int8 values
// and multiplying by the block's widened scale.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/kv_decode.h"

namespace megakern {

void kv_decode_rows_avx2(KvType t, const uint8_t* src, int64_t stride, int64_t rows, int64_t n, float* dst) {
  for (int64_t r = 0; r < rows; ++r, src += stride, dst += n) {
    if (t == KvType::q8_0) {
      for (int64_t b = 0; b < n / kKvQ8Block; ++b) {
        const uint8_t* blk = src + b * static_cast<int64_t>(kKvQ8BlockBytes);
        uint16_t h;
        std::memcpy(&h, blk, 2);
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(h));  // F16C: exact, as f16_to_f32
        float* y = dst + b * kKvQ8Block;
        for (int j = 0; j < kKvQ8Block; j += 8) {
          const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + j));
          _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
        }
      }
      continue;
    }
    int64_t i = 0;
    if (t == KvType::f16) {
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i))));
    } else {
      for (; i + 8 <= n; i += 8) {
        const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(u, 16)));
      }
    }
    if (i < n) kv_decode_rows_scalar(t, src + 2 * i, 0, 1, n - i, dst + i);  // the last n % 8
  }
}

}  // namespace megakern
