// The 32-element formats of the fast numerics mode as the AVX2 kernels read
// them (qmatmul_fast.h states the arithmetic): per block of 32 elements, the
// codes (unsigned, to be offset by kOffset, or signed weights when kSigned)
// and the scale(s) / min. Shared by qmatmul_fast_avx2.cpp and
// qmatmul_fast_r8_avx2.cpp; include only from files built with AVX2.
//
// kMaxCode bounds |code| (unsigned codes: the largest code; signed weights:
// the largest magnitude). A format either has decode(row, k, o) (o.w: block
// k's 32 codes in element order) or, for codes in nibbles (element i < 16 in
// the low nibble of byte i, 16 + i in the high one, 16 bytes at kNibbleAt of
// block k / kSubs of kBytes bytes, sub-block k % kSubs), kBytes / kSubs /
// kNibbleAt, map (4-bit code -> code) and scales(row, k, o).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "kernels/cpu/avx2_common.h"

namespace megakern {
namespace fast32 {

inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
  return bits_to_f32(bits);
}
inline float ue4m3_half(uint8_t s) {
  s &= 0x7f;
  return s == 0x7f ? 0.0f : fp8_e4m3_to_f32(s) * 0.5f;
}
inline float f16_at(const uint8_t* p) { return avx2::load_f16(p); }

// 16 packed bytes -> 32 codes: low nibbles (elements 0..15), high (16..31).
inline __m256i nib32(const uint8_t* qs) { return avx2::nibbles(qs); }

// e2m1 code -> doubled value + 12 (0..24): MXFP4 / NVFP4 as unsigned codes
// with offset 12.
inline __m256i e2m1_plus12_table() {
  return _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
}

// 32-element formats. decode(row, k, o) writes block k's 32 bytes to o.w
// (unsigned codes, or signed weights when kSigned) and its scale(s) / min.
struct Dec {
  __m256i w;
  float s0, s1, mn;
};

struct FQ4_0 {
  static constexpr int kMaxCode = 15;
  static constexpr bool kSigned = false, kTwo = false, kMin = false;
  static constexpr int kOffset = 8;
  static constexpr int kBytes = 18, kSubs = 1, kNibbleAt = 2;
  static __m256i map(__m256i c) { return c; }
  static void scales(const uint8_t* row, int64_t k, Dec& o) { o.s0 = f16_at(row + k * 18); }
};
struct FQ4_1 {
  static constexpr int kMaxCode = 15;
  static constexpr bool kSigned = false, kTwo = false, kMin = true;
  static constexpr int kOffset = 0;
  static constexpr int kBytes = 20, kSubs = 1, kNibbleAt = 4;
  static __m256i map(__m256i c) { return c; }
  static void scales(const uint8_t* row, int64_t k, Dec& o) {
    const __m128 v = avx2::load_f16x2(row + k * 20);
    o.s0 = _mm_cvtss_f32(v);
    o.mn = _mm_cvtss_f32(_mm_movehdup_ps(v));
  }
};
struct FQ5_0 {
  static constexpr int kMaxCode = 31;
  static constexpr bool kSigned = false, kTwo = false, kMin = false;
  static constexpr int kOffset = 16;
  static void decode(const uint8_t* row, int64_t k, Dec& o) {
    const uint8_t* b = row + k * 22;
    o.w = _mm256_or_si256(nib32(b + 6), avx2::q5_0_high_bits(b));
    o.s0 = f16_at(b);
  }
};
struct FQ8_0 {
  static constexpr int kMaxCode = 128;
  static constexpr bool kSigned = true, kTwo = false, kMin = false;
  static constexpr int kOffset = 0;
  static void decode(const uint8_t* row, int64_t k, Dec& o) {
    const uint8_t* b = row + k * 34;
    o.w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    o.s0 = f16_at(b);
  }
};
struct FMXFP4 {
  static constexpr int kMaxCode = 24;
  static constexpr bool kSigned = false, kTwo = false, kMin = false;
  static constexpr int kOffset = 12;
  static constexpr int kBytes = 17, kSubs = 1, kNibbleAt = 1;
  static __m256i map(__m256i c) { return _mm256_shuffle_epi8(e2m1_plus12_table(), c); }
  static void scales(const uint8_t* row, int64_t k, Dec& o) { o.s0 = e8m0_half(row[k * 17]); }
};
struct FNVFP4 {
  static constexpr int kMaxCode = 24;
  static constexpr bool kSigned = false, kTwo = true, kMin = false;
  static constexpr int kOffset = 12;
  static void decode(const uint8_t* row, int64_t k, Dec& o) {
    // Block k / 2, 32-element half k % 2: two 16-element sub-blocks of 8
    // bytes; in each, low nibbles are elements 0..7 and high ones 8..15.
    const uint8_t* b = row + (k / 2) * 36;
    const int h = (int)(k % 2);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4 + 16 * h));
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(raw, m), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m);
    // Sub-block s: bytes 8s..8s+7; elements 16s+0..7 = lo nibbles, 16s+8..15 = hi.
    const __m128i s0 = _mm_unpacklo_epi64(lo, hi), s1 = _mm_unpackhi_epi64(lo, hi);
    o.w = _mm256_shuffle_epi8(e2m1_plus12_table(), _mm256_set_m128i(s1, s0));
    o.s0 = ue4m3_half(b[2 * h]);
    o.s1 = ue4m3_half(b[2 * h + 1]);
  }
};
struct FINT4_G128 {
  static constexpr int kMaxCode = 15;
  static constexpr bool kSigned = false, kTwo = false, kMin = false;
  static constexpr int kOffset = 8;
  static constexpr int kBytes = 66, kSubs = 4, kNibbleAt = 2;
  static __m256i map(__m256i c) { return c; }
  static void scales(const uint8_t* row, int64_t k, Dec& o) { o.s0 = f16_at(row + (k / 4) * 66); }
};
struct FINT8_COL {
  static constexpr int kMaxCode = 128;
  static constexpr bool kSigned = true, kTwo = false, kMin = false;
  static constexpr int kOffset = 0;
  static void decode(const uint8_t* row, int64_t k, Dec& o) {
    const uint8_t* b = row + (k / 4) * 132;
    o.w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 4 + 32 * (k % 4)));
    std::memcpy(&o.s0, b, 4);
  }
};

// The formats below follow the 32-element contract with 32-element
// activation blocks (their super-blocks' scales are floats per 32 or 16).
inline __m256i iq4nl_table() {
  return _mm256_broadcastsi128_si256(
      _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113));
}
struct FIQ4_NL {
  static constexpr int kMaxCode = 127;
  static constexpr bool kSigned = true, kTwo = false, kMin = false;
  static constexpr int kOffset = 0;
  static constexpr int kBytes = 18, kSubs = 1, kNibbleAt = 2;
  static __m256i map(__m256i c) { return _mm256_shuffle_epi8(iq4nl_table(), c); }
  static void scales(const uint8_t* row, int64_t k, Dec& o) { o.s0 = f16_at(row + k * 18); }
};
struct FQ3_K {
  static constexpr int kMaxCode = 7;
  static constexpr bool kSigned = false, kTwo = true, kMin = false;
  static constexpr int kOffset = 4;
  static void decode(const uint8_t* row, int64_t k, Dec& o) {
    const uint8_t* b = row + (k / 8) * 110;
    const int sb = (int)(k % 8), h = sb / 4, j = sb % 4;
    const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32 + 32 * h));
    const __m256i low = _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * j)), _mm256_set1_epi8(3));
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + j)));
    // code = w + 4: low + 4 where the high-mask bit is set, low otherwise.
    const __m256i four = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), _mm256_set1_epi8(4));
    o.w = _mm256_or_si256(low, four);
    const uint8_t* s = b + 96;
    const float d = f16_at(b + 108);
    float sc[2];
    for (int half = 0; half < 2; ++half) {
      const int idx = 2 * sb + half;
      const int lo = idx < 8 ? s[idx] & 0x0f : s[idx - 8] >> 4;
      const int hi = (s[8 + idx % 4] >> (2 * (idx / 4))) & 3;
      sc[half] = d * (float)((lo | (hi << 4)) - 32);
    }
    o.s0 = sc[0];
    o.s1 = sc[1];
  }
};

}  // namespace fast32
}  // namespace megakern
