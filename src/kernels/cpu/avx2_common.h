// Small AVX2 helpers shared by the *_avx2.cpp kernel files. Include only from
// files compiled with AVX2/FMA/F16C enabled.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace megakern::avx2 {

// Horizontal sum of 8 floats, in a fixed order.
inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// The halves at p[0..7] as eight floats. Gathered into a register by
// vpinsrw: eight 2-byte stores read back as one 16-byte load would miss
// store forwarding and stall.
inline __m256 f16x8(const uint8_t* const p[8]) {
  auto h = [&](int r) {
    uint16_t v;
    std::memcpy(&v, p[r], 2);
    return (int)v;
  };
  __m128i v = _mm_cvtsi32_si128(h(0));
  v = _mm_insert_epi16(v, h(1), 1);
  v = _mm_insert_epi16(v, h(2), 2);
  v = _mm_insert_epi16(v, h(3), 3);
  v = _mm_insert_epi16(v, h(4), 4);
  v = _mm_insert_epi16(v, h(5), 5);
  v = _mm_insert_epi16(v, h(6), 6);
  v = _mm_insert_epi16(v, h(7), 7);
  return _mm256_cvtph_ps(v);
}

// Sum of 8 int32 lanes (exact while it fits).
inline int32_t hsum_epi32(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x01));
  return _mm_cvtsi128_si32(x);
}

// hsum of each of v[0..8) as lane i, with hsum's association:
// ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)) over each vector's lanes.
inline __m256 hsum8(const __m256 v[8]) {
  __m256 l[4];  // lanes i + (i + 4) of v[2c] (low half) and of v[2c + 1] (high half)
  for (int c = 0; c < 4; ++c)
    l[c] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * c], v[2 * c + 1], 0x20),
                         _mm256_permute2f128_ps(v[2 * c], v[2 * c + 1], 0x31));
  // (l0 + l2), (l1 + l3) of each: [v0, v0, v2, v2 | v1, v1, v3, v3] and v4..v7
  const __m256 m0 = _mm256_add_ps(_mm256_shuffle_ps(l[0], l[1], 0x44), _mm256_shuffle_ps(l[0], l[1], 0xee));
  const __m256 m1 = _mm256_add_ps(_mm256_shuffle_ps(l[2], l[3], 0x44), _mm256_shuffle_ps(l[2], l[3], 0xee));
  // their sum: lanes hold v0, v2, v4, v6 | v1, v3, v5, v7
  const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(m0, m1, 0x88), _mm256_shuffle_ps(m0, m1, 0xdd));
  return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The largest |x[i]| of n floats (n a multiple of 8), and whether all are
// finite. max is exact, so the value is a scalar loop's whatever the order.
inline float abs_max(const float* x, int64_t n, bool& finite) {
  const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
  __m256 m = _mm256_setzero_ps();
  int ok = 0xff;
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
    ok &= _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_LT_OQ));
    m = _mm256_max_ps(m, a);
  }
  finite = ok == 0xff;
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  return _mm_cvtss_f32(m4);
}

// The scales of eight blocks of an activation quantiser whose codes reach
// qmax, from their absolute maxima: d = amax / qmax and id = 1 / d (0 for a
// zero block), both 0 where 1 / d overflows (a block below ~1e-38, taken as
// zeros). One vector division each, exactly rounded as the scalar
// quantisers' divisions.
inline void block_scales8(__m256 amax, float qmax, __m256& d, __m256& id) {
  d = _mm256_div_ps(amax, _mm256_set1_ps(qmax));
  id = _mm256_and_ps(_mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_OQ), _mm256_div_ps(_mm256_set1_ps(1.0f), d));
  const __m256 tiny = _mm256_cmp_ps(id, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ);
  d = _mm256_andnot_ps(tiny, d);
  id = _mm256_andnot_ps(tiny, id);
}

// An unaligned little-endian IEEE half at p, widened exactly to f32.
inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// The two little-endian IEEE halves at p and p + 2, widened exactly to f32
// in lanes 0 and 1 (one 32-bit load and one conversion).
inline __m128 load_f16x2(const uint8_t* p) {
  uint32_t u;
  std::memcpy(&u, p, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(u)));
}
// The half at p as f32, read with a 32-bit load: p + 2 .. p + 3 must be
// readable (the scale is followed by more of its block).
inline float load_f16_in_block(const uint8_t* p) { return _mm_cvtss_f32(load_f16x2(p)); }

// The twelve scale bytes of a Q4_K / Q5_K block (eight 6-bit scales and
// eight 6-bit mins, packed) as sixteen bytes in u: sc[0..7], then m[0..7].
inline void unpack_k_scales(const uint8_t* s12, uint32_t u[4]) {
  std::memcpy(u, s12, 12);
  constexpr uint32_t kMask1 = 0x3f3f3f3f, kMask2 = 0x0f0f0f0f, kMask3 = 0x03030303;
  u[3] = ((u[2] >> 4) & kMask2) | (((u[1] >> 6) & kMask3) << 4);  // m[4..7]
  const uint32_t m03 = u[1] & kMask1;                              // m[0..3]
  u[1] = (u[2] & kMask2) | (((u[0] >> 6) & kMask3) << 4);          // sc[4..7]
  u[2] = m03;
  u[0] &= kMask1;  // sc[0..3]
}

// 16 packed bytes -> 32 codes: low nibbles first (elements 0..15), then high.
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

// Sub-block sb (elements 32 sb .. 32 sb + 31) of the Q6_K block at b: its
// 32 codes minus 32 (-32..31) as bytes in element order, and its two
// 16-element scales (q6k_scales(b, sb)[0], [1]). Half h = sb / 4 of the
// block; within it, quarter j = sb % 4 picks the nibble and the 2-bit field.
inline __m256i q6k_codes(const uint8_t* b, int sb) {
  const int h = sb / 4, j = sb % 4;
  const __m256i lo4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + (j % 2) * 32));
  const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
  const __m256i low = _mm256_and_si256(j >= 2 ? _mm256_srli_epi16(lo4, 4) : lo4, _mm256_set1_epi8(0x0f));
  const __m256i high = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j)), _mm256_set1_epi8(3));
  return _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
}
inline const int8_t* q6k_scales(const uint8_t* b, int sb) {
  return reinterpret_cast<const int8_t*>(b + 192) + 8 * (sb / 4) + 2 * (sb % 4);
}

// Stores the first n (1..8) floats of y at dst: one vector store when n is 8.
inline void store_f32_first(float* dst, __m256 y, int64_t n) {
  if (n == 8) {
    _mm256_storeu_ps(dst, y);
    return;
  }
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, y);
  std::memcpy(dst, tmp, sizeof(float) * static_cast<size_t>(n));
}

// Rows per tile: a tile of weight rows (<= ~96 KiB) is read from memory once
// and then re-read from L2 by each group of four inputs, whose activations
// stay in L1 across the tile. Tiling changes only the order in which outputs
// are produced, never how any one output is computed.
inline int64_t tile_rows(size_t row_bytes) {
  const int64_t n = static_cast<int64_t>((size_t{96} << 10) / row_bytes);
  return n > 1 ? n : 1;
}

// Q5_0's fifth bits: bit j of the block's 32-bit qh (bytes 2..5 of the
// block at b) as 0x10 in byte j, by a byte shuffle and a bit test.
inline __m256i q5_0_high_bits(const uint8_t* b) {
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuf);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(0x10));
}

}  // namespace megakern::avx2
