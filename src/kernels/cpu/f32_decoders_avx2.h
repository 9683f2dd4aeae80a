// Row decoders of the float weight formats for the f32 path (AVX2): the
// reference dequantiser's floats, 8 at element i (a multiple of 8) or a
// whole 32-element block, and one float for the scalar tail. Included only
// by files compiled for AVX2.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/half.h"

namespace megakern::f32_decode {

struct F32W {
  static constexpr bool kAny = true;  // any number of columns
  static __m256 load8(const uint8_t* r, int64_t i) { return _mm256_loadu_ps(reinterpret_cast<const float*>(r) + i); }
  static void load32(const uint8_t* r, int64_t i, __m256 v[4]) {
    for (int k = 0; k < 4; ++k) v[k] = load8(r, i + 8 * k);
  }
  static float one(const uint8_t* r, int64_t i) {
    float v;  // rows may be misaligned
    std::memcpy(&v, r + 4 * i, 4);
    return v;
  }
};
struct F16W {
  static constexpr bool kAny = true;
  static __m256 load8(const uint8_t* r, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 2 * i)));
  }
  static void load32(const uint8_t* r, int64_t i, __m256 v[4]) {
    for (int k = 0; k < 4; ++k) v[k] = load8(r, i + 8 * k);
  }
  static float one(const uint8_t* r, int64_t i) {
    uint16_t h;
    std::memcpy(&h, r + 2 * i, 2);
    return f16_to_f32(h);
  }
};
struct BF16W {
  static constexpr bool kAny = true;
  static __m256 load8(const uint8_t* r, int64_t i) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 2 * i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
  static void load32(const uint8_t* r, int64_t i, __m256 v[4]) {
    for (int k = 0; k < 4; ++k) v[k] = load8(r, i + 8 * k);
  }
  static float one(const uint8_t* r, int64_t i) {
    uint16_t h;
    std::memcpy(&h, r + 2 * i, 2);
    return bf16_to_f32(h);
  }
};
// FP8 e4m3fn bytes b -> f16 bits (b & 0x7f) << 7 with the sign at bit 15:
// that f16 equals the e4m3 value times 2^-8 exactly (normal and subnormal
// alike); NaN codes get f16 exponent 31 (NaN). The block scale 2^(e-127) is
// multiplied by 256 first (exact for e <= 246): h * (256 * scale) is then the
// same real number as the reference's fp8 * scale, rounded once, so the same
// float. Larger e takes two multiplications, like the reference's values.
struct FP8W {
  static constexpr bool kAny = false;  // whole 32-element blocks only
  static inline __m256i to_f16(__m128i bytes16) {  // 16 bytes -> 16 f16
    const __m256i w = _mm256_cvtepu8_epi16(bytes16);
    const __m256i mag = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(0x3f80));
    const __m256i sign = _mm256_and_si256(_mm256_slli_epi16(w, 8), _mm256_set1_epi16((short)0x8000));
    const __m256i nan = _mm256_and_si256(_mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x3f80)), _mm256_set1_epi16(0x4000));
    return _mm256_or_si256(_mm256_or_si256(mag, sign), nan);
  }
  static void load32(const uint8_t* r, int64_t i, __m256 v[4]) {
    const uint8_t* b = r + (i / 32) * 33;
    const uint32_t e = b[0];
    const float d = e == 0 ? bits_to_f32(0x00400000u) : bits_to_f32(e << 23);
    __m256i h[2];
    for (int half = 0; half < 2; ++half) h[half] = to_f16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 1 + 16 * half)));
    __m256 f[4] = {_mm256_cvtph_ps(_mm256_castsi256_si128(h[0])), _mm256_cvtph_ps(_mm256_extracti128_si256(h[0], 1)),
                   _mm256_cvtph_ps(_mm256_castsi256_si128(h[1])), _mm256_cvtph_ps(_mm256_extracti128_si256(h[1], 1))};
    if (e <= 246) {
      const __m256 dv = _mm256_set1_ps(d * 256.0f);
      for (int k = 0; k < 4; ++k) v[k] = _mm256_mul_ps(f[k], dv);
    } else {
      const __m256 dv = _mm256_set1_ps(d), k256 = _mm256_set1_ps(256.0f);
      for (int k = 0; k < 4; ++k) v[k] = _mm256_mul_ps(_mm256_mul_ps(f[k], k256), dv);
    }
  }
  static __m256 load8(const uint8_t*, int64_t) { return _mm256_setzero_ps(); }  // unused
  static float one(const uint8_t*, int64_t) { return 0.0f; }                    // unused
};

}  // namespace megakern::f32_decode
