// AVX2 decoders for the block formats. Each decodes one 32-element sub-block
// into four vectors v[0..3] (elements 0-7, 8-15, 16-23, 24-31) using exactly
// the scalar reference's arithmetic: an integer quant converted to float,
// multiplied by the scale, then the offset subtracted or added, with no fused
// multiply-add, so the decoded floats equal the reference's.
#include <immintrin.h>

#include <cstring>

#include "core/half.h"
#include "kernels/cpu/format_kernels.h"
#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/quant_rows.h"

namespace megakern {
namespace {

using avx2::load_f16;
using avx2::nibbles;
using avx2::q6k_codes;
using avx2::q6k_scales;

// Four vectors of 8 floats from 32 signed bytes.
inline void bytes_to_floats(__m256i q, __m256 v[4]) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  v[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  v[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}

inline void scale_vecs(__m256 v[4], __m256 d) {
  for (int k = 0; k < 4; ++k) v[k] = _mm256_mul_ps(v[k], d);
}

// Per-format decoders: Decode(block, sub-block index, v) for a block of
// kBlock elements and kBytes bytes.
struct Q4_0 {
  static constexpr int kBlock = 32, kBytes = 18;
  static void decode(const uint8_t* b, int, __m256 v[4]) {
    bytes_to_floats(_mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8)), v);
    scale_vecs(v, _mm256_set1_ps(load_f16(b)));
  }
};
struct Q4_1 {
  static constexpr int kBlock = 32, kBytes = 20;
  static void decode(const uint8_t* b, int, __m256 v[4]) {
    bytes_to_floats(nibbles(b + 4), v);
    const __m256 d = _mm256_set1_ps(load_f16(b)), m = _mm256_set1_ps(load_f16(b + 2));
    for (int k = 0; k < 4; ++k) v[k] = _mm256_add_ps(_mm256_mul_ps(v[k], d), m);
  }
};
struct Q5_0 {
  static constexpr int kBlock = 32, kBytes = 22;
  static void decode(const uint8_t* b, int, __m256 v[4]) {
    const __m256i hi = avx2::q5_0_high_bits(b);
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(nibbles(b + 6), hi), _mm256_set1_epi8(16));
    bytes_to_floats(q, v);
    scale_vecs(v, _mm256_set1_ps(load_f16(b)));
  }
};
struct Q8_0 {
  static constexpr int kBlock = 32, kBytes = 34;
  static void decode(const uint8_t* b, int, __m256 v[4]) {
    bytes_to_floats(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), v);
    scale_vecs(v, _mm256_set1_ps(load_f16(b)));
  }
};
struct Q4_K {
  static constexpr int kBlock = 256, kBytes = 144;
  static void decode(const uint8_t* b, int sb, __m256 v[4]) {
    const uint8_t* s = b + 4;
    int sc, m;
    k_scale_min(s, sb, sc, m);
    const float d = load_f16(b) * static_cast<float>(sc);
    const float off = load_f16(b + 2) * static_cast<float>(m);
    // Sub-blocks 2c and 2c+1 share 32 bytes: low nibbles, then high nibbles.
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * (sb / 2)));
    const __m256i q = _mm256_and_si256(sb % 2 ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(0x0f));
    bytes_to_floats(q, v);
    const __m256 dv = _mm256_set1_ps(d), ov = _mm256_set1_ps(off);
    for (int k = 0; k < 4; ++k) v[k] = _mm256_sub_ps(_mm256_mul_ps(dv, v[k]), ov);
  }
};
struct Q6_K {
  static constexpr int kBlock = 256, kBytes = 210;
  static void decode(const uint8_t* b, int sb, __m256 v[4]) {
    const int8_t* sc = q6k_scales(b, sb);
    const __m256i q = q6k_codes(b, sb);
    bytes_to_floats(q, v);
    const float d = load_f16(b + 208);
    // The reference computes (d * scale) * q; elements 0-15 use sc[0], 16-31 sc[1].
    const __m256 s0 = _mm256_set1_ps(d * static_cast<float>(sc[0]));
    const __m256 s1 = _mm256_set1_ps(d * static_cast<float>(sc[1]));
    v[0] = _mm256_mul_ps(s0, v[0]);
    v[1] = _mm256_mul_ps(s0, v[1]);
    v[2] = _mm256_mul_ps(s1, v[2]);
    v[3] = _mm256_mul_ps(s1, v[3]);
  }
};

// Q3_K: quants -4..3 (two bits of qs, one of hmask), then (d * scale) * q
// with one 6-bit signed scale per 16 elements, as the reference.
struct Q3_K {
  static constexpr int kBlock = 256, kBytes = 110;
  static int scale(const uint8_t* s, int i) {
    const int lo = i < 8 ? s[i] & 0x0f : s[i - 8] >> 4;
    const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | (hi << 4)) - 32;
  }
  static void decode(const uint8_t* b, int sb, __m256 v[4]) {
    const int h = sb / 4, j = sb % 4;
    const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32 + 32 * h));
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i low = _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * j)), _mm256_set1_epi8(3));
    const __m256i high = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(4 * h + j)), _mm256_set1_epi8(1));
    bytes_to_floats(_mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 2)), _mm256_set1_epi8(4)), v);
    const float d = load_f16(b + 108);
    const __m256 s0 = _mm256_set1_ps(d * static_cast<float>(scale(b + 96, 2 * sb)));
    const __m256 s1 = _mm256_set1_ps(d * static_cast<float>(scale(b + 96, 2 * sb + 1)));
    v[0] = _mm256_mul_ps(s0, v[0]);
    v[1] = _mm256_mul_ps(s0, v[1]);
    v[2] = _mm256_mul_ps(s1, v[2]);
    v[3] = _mm256_mul_ps(s1, v[3]);
  }
};
// Q5_K: Q4_K's nibbles and scales with bit sb of qh[l] as the fifth bit.
struct Q5_K {
  static constexpr int kBlock = 256, kBytes = 176;
  static void decode(const uint8_t* b, int sb, __m256 v[4]) {
    const uint8_t* s = b + 4;
    int sc, m;
    k_scale_min(s, sb, sc, m);
    const float d = load_f16(b) * static_cast<float>(sc);
    const float off = load_f16(b + 2) * static_cast<float>(m);
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 48 + 32 * (sb / 2)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    const __m256i low = _mm256_and_si256(sb % 2 ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(0x0f));
    const __m256i high =
        _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(sb)), _mm256_set1_epi8(1)), 4);
    bytes_to_floats(_mm256_or_si256(low, high), v);
    const __m256 dv = _mm256_set1_ps(d), ov = _mm256_set1_ps(off);
    for (int k = 0; k < 4; ++k) v[k] = _mm256_sub_ps(_mm256_mul_ps(dv, v[k]), ov);
  }
};
// IQ4_NL / IQ4_XS: 4-bit indices into GGML's kvalues_iq4nl, times the scale.
inline __m256i iq4_values(const uint8_t* qs) {
  const __m256i tab = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113));
  return _mm256_shuffle_epi8(tab, nibbles(qs));
}
struct IQ4_NL {
  static constexpr int kBlock = 32, kBytes = 18;
  static void decode(const uint8_t* b, int, __m256 v[4]) {
    bytes_to_floats(iq4_values(b + 2), v);
    scale_vecs(v, _mm256_set1_ps(load_f16(b)));
  }
};
struct IQ4_XS {
  static constexpr int kBlock = 256, kBytes = 136;
  static void decode(const uint8_t* b, int sb, __m256 v[4]) {
    uint16_t sh;
    std::memcpy(&sh, b + 2, 2);
    const int ls = (((b[4 + sb / 2] >> (4 * (sb % 2))) & 0x0f) | (((sh >> (2 * sb)) & 3) << 4)) - 32;
    bytes_to_floats(iq4_values(b + 8 + 16 * sb), v);
    scale_vecs(v, _mm256_set1_ps(load_f16(b) * static_cast<float>(ls)));
  }
};

template <typename F>
void dequant(const uint8_t* w, float* dst, int64_t n) {
  __m256 v[4];
  for (int64_t b = 0; b < n / F::kBlock; ++b) {
    const uint8_t* blk = w + b * F::kBytes;
    for (int sb = 0; sb < F::kBlock / 32; ++sb) {
      F::decode(blk, sb, v);
      float* out = dst + b * F::kBlock + sb * 32;
      for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + 8 * k, v[k]);
    }
  }
}

}  // namespace

bool avx2_row_kernels_support(DType t) { return format_kernels(t).avx2_rows; }

void dequantize_row_avx2(DType t, const void* wv, float* dst, int64_t n) {
  const auto* w = static_cast<const uint8_t*>(wv);
  switch (t) {
    case DType::F32: std::memcpy(dst, w, sizeof(float) * static_cast<size_t>(n)); break;
    case DType::Q4_0: dequant<Q4_0>(w, dst, n); break;
    case DType::Q4_1: dequant<Q4_1>(w, dst, n); break;
    case DType::Q5_0: dequant<Q5_0>(w, dst, n); break;
    case DType::Q8_0: dequant<Q8_0>(w, dst, n); break;
    case DType::Q4_K: dequant<Q4_K>(w, dst, n); break;
    case DType::Q6_K: dequant<Q6_K>(w, dst, n); break;
    case DType::Q3_K: dequant<Q3_K>(w, dst, n); break;
    case DType::Q5_K: dequant<Q5_K>(w, dst, n); break;
    case DType::IQ4_NL: dequant<IQ4_NL>(w, dst, n); break;
    case DType::IQ4_XS: dequant<IQ4_XS>(w, dst, n); break;
    default: kernel_missing("AVX2 row decoder", t);
  }
}


}  // namespace megakern
