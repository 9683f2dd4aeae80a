// AVX2 multi-input kernels (see qmatmul.h for the arithmetic they must
// reproduce bit for bit). Compiled with -mavx2 -mfma -mf16c; reached only
// through use_avx2(). Every multiply-add that matters is an explicit FMA
// (intrinsic or std::fma); no mul+add pair is left for the compiler to
// contract or not, so the bits do not depend on inlining decisions.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/half.h"
#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/qmatmul.h"

namespace megakern {
namespace {

using avx2::hsum;
using avx2::nibbles;

inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
  return bits_to_f32(bits);
}

// Unsigned e4m3 scale byte -> value / 2 (sign bit ignored, 0x7f -> 0), as
// the reference's ue4m3_half; a table built at compile time.
struct Ue4m3HalfTable {
  float v[128];
};
constexpr Ue4m3HalfTable make_ue4m3_half_table() {
  Ue4m3HalfTable t{};
  for (int s = 0; s < 128; ++s) {
    const int e = s >> 3, m = s & 7;
    const int ex = (e == 0 ? 1 : e) - 7;  // 2^ex: 2^(e-7) for normals, 2^-6 for subnormals
    double p = 1.0;
    for (int i = 0; i < ex; ++i) p *= 2.0;
    for (int i = 0; i > ex; --i) p /= 2.0;
    const double val = e == 0 ? (double)m / 8.0 * p : (1.0 + (double)m / 8.0) * p;
    t.v[s] = s == 0x7f ? 0.0f : (float)(val * 0.5);
  }
  return t;
}
constexpr Ue4m3HalfTable kUe4m3Half = make_ue4m3_half_table();
inline float ue4m3_half(uint8_t s) { return kUe4m3Half.v[s & 0x7f]; }

// ---------------------------------------------------------------------------
// int16-activation path. Each format supplies
//   weights(row, k, lo, hi): sub-block k's 32 small integers as int16,
//     elements 0..15 in lo and 16..31 in hi;
//   scale1(row, k, sc): its scale(s) and min as floats (sc[0], sc[1] for
//     elements 16..31 when kTwoScales, sc[2] the min when kMin);
//   scales8(row, k, v): the same numbers for sub-blocks k..k+7 (k a multiple
//     of 8) as vectors, bit for bit what scale1 gives one at a time.
// The kernel forms the per-sub-block factors sc * dx eight at a time, stores
// them, and the inner loop reads each back with one broadcast: the scale
// decoding leaves the per-sub-block instruction stream.

struct Scales8 {
  __m256 sc, sc1, mn;
};

// Eight little-endian u16 at p, p + S, ..., p + 7S, packed into 128 bits.
// They are assembled with scalar loads, shifts and ors, which run on the
// integer units (idle in these kernels); the empty asm keeps the compiler
// from turning that into a longer vector shuffle sequence.
inline uint64_t load_u16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}
template <int S>
inline uint64_t pack4_u16(const uint8_t* p) {
  uint64_t a = load_u16(p) | load_u16(p + S) << 16;
  uint64_t b = load_u16(p + 2 * S) | load_u16(p + 3 * S) << 16;
  asm("" : "+r"(a), "+r"(b));
  return a | b << 32;
}
template <int S>
inline __m128i gather_u16x8(const uint8_t* p) {
  return _mm_set_epi64x((long long)pack4_u16<S>(p + 4 * S), (long long)pack4_u16<S>(p));
}
template <int S>
inline __m256 f16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(gather_u16x8<S>(p));
}

// The i16 nibble layout: 16 packed bytes -> codes of elements 0..15 (low
// nibbles, lo) and 16..31 (high nibbles, hi) as int16.
inline void nibble_halves16(const uint8_t* qs, __m256i& lo, __m256i& hi) {
  const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  lo = _mm256_and_si256(w, _mm256_set1_epi16(0x0f));
  hi = _mm256_srli_epi16(w, 4);
}
inline void widen_s8(__m128i lo8, __m128i hi8, __m256i& lo, __m256i& hi) {
  lo = _mm256_cvtepi8_epi16(lo8);
  hi = _mm256_cvtepi8_epi16(hi8);
}
inline void widen_s8(__m256i w, __m256i& lo, __m256i& hi) {
  widen_s8(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1), lo, hi);
}
// 16 packed bytes -> codes of elements 0..15 (low nibbles), 16..31 (high).
inline void nibble_halves(const uint8_t* qs, __m128i& lo, __m128i& hi) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  lo = _mm_and_si128(b, m);
  hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
}
inline __m128i e2m1_table128() { return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12); }

struct Q4_0 {
  static constexpr int kSubs = 1, kBytes = 18;
  static constexpr bool kTwoScales = false, kMin = false;
  static void weights(const uint8_t* row, int64_t k, __m256i& lo, __m256i& hi) {
    nibble_halves16(row + k * kBytes + 2, lo, hi);
    const __m256i eight = _mm256_set1_epi16(8);
    lo = _mm256_sub_epi16(lo, eight);
    hi = _mm256_sub_epi16(hi, eight);
  }
  static void scale1(const uint8_t* row, int64_t k, float sc[3]) { sc[0] = avx2::load_f16(row + k * kBytes); }
  static void scales8(const uint8_t* row, int64_t k, Scales8& v) { v.sc = f16x8<kBytes>(row + k * kBytes); }
};
struct Q4_1 {
  static constexpr int kSubs = 1, kBytes = 20;
  static constexpr bool kTwoScales = false, kMin = true;
  static void weights(const uint8_t* row, int64_t k, __m256i& lo, __m256i& hi) {
    nibble_halves16(row + k * kBytes + 4, lo, hi);
  }
  static void scale1(const uint8_t* row, int64_t k, float sc[3]) {
    sc[0] = avx2::load_f16(row + k * kBytes);
    sc[2] = avx2::load_f16(row + k * kBytes + 2);
  }
  static void scales8(const uint8_t* row, int64_t k, Scales8& v) {
    v.sc = f16x8<kBytes>(row + k * kBytes);
    v.mn = f16x8<kBytes>(row + k * kBytes + 2);
  }
};
struct Q5_0 {
  static constexpr int kSubs = 1, kBytes = 22;
  static constexpr bool kTwoScales = false, kMin = false;
  static void weights(const uint8_t* row, int64_t k, __m256i& lo, __m256i& hi) {
    const uint8_t* b = row + k * kBytes;
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuf);
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    bytes = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    const __m256i h = _mm256_and_si256(bytes, _mm256_set1_epi8(0x10));
    widen_s8(_mm256_sub_epi8(_mm256_or_si256(nibbles(b + 6), h), _mm256_set1_epi8(16)), lo, hi);
  }
  static void scale1(const uint8_t* row, int64_t k, float sc[3]) { sc[0] = avx2::load_f16(row + k * kBytes); }
  static void scales8(const uint8_t* row, int64_t k, Scales8& v) { v.sc = f16x8<kBytes>(row + k * kBytes); }
};
struct Q8_0 {
  static constexpr int kSubs = 1, kBytes = 34;
  static constexpr bool kTwoScales = false, kMin = false;
  static void weights(const uint8_t* row, int64_t k, __m256i& lo, __m256i& hi) {
    const uint8_t* b = row + k * kBytes;
    widen_s8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)),
             _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18)), lo, hi);
  }
  static void scale1(const uint8_t* row, int64_t k, float sc[3]) { sc[0] = avx2::load_f16(row + k * kBytes); }
  static void scales8(const uint8_t* row, int64_t k, Scales8& v) { v.sc = f16x8<kBytes>(row + k * kBytes); }
};
struct Q4_K {
  static constexpr int kSubs = 8, kBytes = 144;
  static constexpr bool kTwoScales = false, kMin = true;
  // The eight sub-block scales d * sc and mins -(dmin * m) of a block,
  // unpacked with 32-bit masks (GGML's utmp trick) and converted together.
  static void block_scales(const uint8_t* b, __m256& scv, __m256& mnv) {
    uint32_t u[4];
    std::memcpy(u, b + 4, 12);
    constexpr uint32_t kMask1 = 0x3f3f3f3f, kMask2 = 0x0f0f0f0f, kMask3 = 0x03030303;
    u[3] = ((u[2] >> 4) & kMask2) | (((u[1] >> 6) & kMask3) << 4);  // m[4..7]
    const uint32_t m03 = u[1] & kMask1;                              // m[0..3]
    u[1] = (u[2] & kMask2) | (((u[0] >> 6) & kMask3) << 4);          // sc[4..7]
    u[2] = m03;
    u[0] &= kMask1;                                                  // sc[0..3]
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
    scv = _mm256_mul_ps(_mm256_set1_ps(avx2::load_f16(b)), sc);
    // Negation by flipping the sign bit, exactly as the scalar -(x).
    mnv = _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(avx2::load_f16(b + 2)), m), _mm256_set1_ps(-0.0f));
  }
  static void weights(const uint8_t* row, int64_t k, __m256i& lo, __m256i& hi) {
    const int sb = (int)(k % 8);
    const uint8_t* q = row + (k / 8) * kBytes + 16 + 32 * (sb / 2);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i l = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16));
    if (sb % 2) {
      l = _mm_srli_epi16(l, 4);
      h = _mm_srli_epi16(h, 4);
    }
    lo = _mm256_cvtepu8_epi16(_mm_and_si128(l, m4));
    hi = _mm256_cvtepu8_epi16(_mm_and_si128(h, m4));
  }
  static void scales8(const uint8_t* row, int64_t k, Scales8& v) { block_scales(row + (k / 8) * kBytes, v.sc, v.mn); }
  static void scale1(const uint8_t* row, int64_t k, float sc[3]) {
    alignas(32) float s[8], m[8];
    __m256 sv, mv;
    block_scales(row + (k / 8) * kBytes, sv, mv);
    _mm256_store_ps(s, sv);
    _mm256_store_ps(m, mv);
    sc[0] = s[k % 8];
    sc[2] = m[k % 8];
  }
};
struct Q6_K {
  static constexpr int kSubs = 8, kBytes = 210;
  static constexpr bool kTwoScales = true, kMin = false;
  static void weights(const uint8_t* row, int64_t k, __m256i& lo, __m256i& hi) {
    const uint8_t* b = row + (k / 8) * kBytes;
    const int sb = (int)(k % 8), h = sb / 4, j = sb % 4;
    const uint8_t* ql = b + 64 * h + (j % 2) * 32;
    const uint8_t* qh = b + 128 + 32 * h;
    const __m256i lo4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
    const __m256i low = _mm256_and_si256(j >= 2 ? _mm256_srli_epi16(lo4, 4) : lo4, _mm256_set1_epi8(0x0f));
    const __m256i high =
        _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j)), _mm256_set1_epi8(3));
    widen_s8(_mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32)), lo, hi);
  }
  static void scale1(const uint8_t* row, int64_t k, float sc[3]) {
    const uint8_t* b = row + (k / 8) * kBytes;
    const int8_t* s = reinterpret_cast<const int8_t*>(b + 192) + 2 * (k % 8);
    const float d = avx2::load_f16(b + 208);
    sc[0] = d * (float)s[0];
    sc[1] = d * (float)s[1];
  }
  static void scales8(const uint8_t* row, int64_t k, Scales8& v) {
    const uint8_t* b = row + (k / 8) * kBytes;
    // Scale bytes 2i (elements 0..15 of sub-block i) and 2i+1 (16..31).
    const __m128i s = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)),
                                       _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    const __m256 d = _mm256_set1_ps(avx2::load_f16(b + 208));
    v.sc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s)));
    v.sc1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s, 8))));
  }
};
struct MXFP4 {
  static constexpr int kSubs = 1, kBytes = 17;
  static constexpr bool kTwoScales = false, kMin = false;
  static void weights(const uint8_t* row, int64_t k, __m256i& lo, __m256i& hi) {
    __m128i l, h;
    nibble_halves(row + k * kBytes + 1, l, h);
    const __m128i tab = e2m1_table128();
    widen_s8(_mm_shuffle_epi8(tab, l), _mm_shuffle_epi8(tab, h), lo, hi);
  }
  static void scale1(const uint8_t* row, int64_t k, float sc[3]) { sc[0] = e8m0_half(row[k * kBytes]); }
  static void scales8(const uint8_t* row, int64_t k, Scales8& v) {
    const uint8_t* p = row + k * kBytes;
    uint64_t e8 = 0;
    for (int i = 0; i < 8; ++i) e8 |= (uint64_t)p[kBytes * i] << (8 * i);
    // As e8m0_half: e < 2 ? 0x00200000 << e : (e - 1) << 23.
    const __m256i e = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)e8));
    const __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i is_small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    v.sc = _mm256_castsi256_ps(_mm256_blendv_epi8(big, small, is_small));
  }
};
struct NVFP4 {
  static constexpr int kSubs = 2, kBytes = 36;
  static constexpr bool kTwoScales = true, kMin = false;
  static void weights(const uint8_t* row, int64_t k, __m256i& lo, __m256i& hi) {
    // 16 bytes = 16-element groups 2sb, 2sb+1 of 8 bytes each; in each, low
    // nibbles are elements 0..7 and high nibbles 8..15.
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + (k / 2) * kBytes + 4 + 16 * (k % 2)));
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m128i l = _mm_and_si128(raw, m), h = _mm_and_si128(_mm_srli_epi16(raw, 4), m);
    const __m128i tab = e2m1_table128();
    widen_s8(_mm_shuffle_epi8(tab, _mm_unpacklo_epi64(l, h)), _mm_shuffle_epi8(tab, _mm_unpackhi_epi64(l, h)), lo,
             hi);
  }
  static void scale1(const uint8_t* row, int64_t k, float sc[3]) {
    const uint8_t* b = row + (k / 2) * kBytes;
    sc[0] = ue4m3_half(b[2 * (k % 2)]);
    sc[1] = ue4m3_half(b[2 * (k % 2) + 1]);
  }
  static void scales8(const uint8_t* row, int64_t k, Scales8& v) {
    // Four blocks' scale bytes: byte 2i + s is scale s of sub-block i.
    const uint8_t* b = row + (k / 2) * kBytes;
    uint32_t u[4];
    for (int i = 0; i < 4; ++i) std::memcpy(&u[i], b + kBytes * i, 4);
    const __m128i bytes = _mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]);
    // e4m3 s (sign dropped) -> f16 bits s << 7, which is the e4m3 value times
    // 2^-8 exactly (normals and subnormals); times 128 gives value / 2, as
    // the table. Code 0x7f (NaN) reads as 0, as the table.
    const __m256i s = _mm256_and_si256(_mm256_cvtepu8_epi16(bytes), _mm256_set1_epi16(0x7f));
    __m256i h = _mm256_andnot_si256(_mm256_cmpeq_epi16(s, _mm256_set1_epi16(0x7f)), _mm256_slli_epi16(s, 7));
    // Even words (first scales) to the low 64 bits of each 128-bit lane, odd
    // words to the high; then [evens 0..3, evens 4..7, odds 0..3, odds 4..7].
    const __m256i sh = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12,
                                        13, 2, 3, 6, 7, 10, 11, 14, 15);
    h = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(h, sh), 0xd8);
    const __m256 k128 = _mm256_set1_ps(128.0f);
    v.sc = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), k128);
    v.sc1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), k128);
  }
};
struct INT4_G128 {
  static constexpr int kSubs = 4, kBytes = 66;
  static constexpr bool kTwoScales = false, kMin = false;
  static void weights(const uint8_t* row, int64_t k, __m256i& lo, __m256i& hi) {
    nibble_halves16(row + (k / 4) * kBytes + 2 + 16 * (k % 4), lo, hi);
    const __m256i eight = _mm256_set1_epi16(8);
    lo = _mm256_sub_epi16(lo, eight);
    hi = _mm256_sub_epi16(hi, eight);
  }
  static void scale1(const uint8_t* row, int64_t k, float sc[3]) { sc[0] = avx2::load_f16(row + (k / 4) * kBytes); }
  static void scales8(const uint8_t* row, int64_t k, Scales8& v) {
    const uint8_t* b = row + (k / 4) * kBytes;
    v.sc = _mm256_set_m128(_mm_set1_ps(avx2::load_f16(b + kBytes)), _mm_set1_ps(avx2::load_f16(b)));
  }
};
struct INT8_COL {
  static constexpr int kSubs = 4, kBytes = 132;
  static constexpr bool kTwoScales = false, kMin = false;
  static void weights(const uint8_t* row, int64_t k, __m256i& lo, __m256i& hi) {
    const uint8_t* q = row + (k / 4) * kBytes + 4 + 32 * (k % 4);
    widen_s8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)),
             _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)), lo, hi);
  }
  static void scale1(const uint8_t* row, int64_t k, float sc[3]) { std::memcpy(&sc[0], row + (k / 4) * kBytes, 4); }
  static void scales8(const uint8_t* row, int64_t k, Scales8& v) {
    const uint8_t* b = row + (k / 4) * kBytes;
    float s0, s1;
    std::memcpy(&s0, b, 4);
    std::memcpy(&s1, b + kBytes, 4);
    v.sc = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
  }
};

// acc + the contribution of one sub-block (weights lo/hi, inputs x = its 32
// int16, factors s0 = sc * dx, s1 = sc1 * dx, min mn and lane sums xs).
template <class F>
inline __m256 contrib(__m256i lo, __m256i hi, const int16_t* x, const float* s0, const float* s1, const float* mn,
                      const float* xs, __m256 acc) {
  const __m256i xlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i xhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16));
  const __m256i plo = _mm256_madd_epi16(lo, xlo), phi = _mm256_madd_epi16(hi, xhi);
  if constexpr (F::kTwoScales) {
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(plo), _mm256_broadcast_ss(s0), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(phi), _mm256_broadcast_ss(s1), acc);
  } else {
    (void)s1;
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(plo, phi)), _mm256_broadcast_ss(s0), acc);
  }
  if constexpr (F::kMin) {
    acc = _mm256_fmadd_ps(_mm256_broadcast_ss(mn), _mm256_loadu_ps(xs), acc);
  } else {
    (void)mn;
    (void)xs;
  }
  return acc;
}

// Outputs (t0 .. t0+NT-1, j): one pass over weight row j, in chunks of up to
// kChunk sub-blocks (even, so chunks never split a pair). Sub-blocks
// go in pairs: each pair's contributions are summed into a fresh zero vector
// and that is added to the accumulator, which halves the accumulator's
// dependency chain; an odd last sub-block is added directly.
template <class F, int NT>
inline void i16_row(const uint8_t* row, const QuantizedActs& A, int64_t t0, float* Y, int64_t ldy, int64_t j) {
  // Scale factors are formed for kChunk sub-blocks just before they are
  // used (a longer run ahead of the loop stalls on the lines it touches).
  constexpr int kChunk = 8;
  constexpr int kPrefetch = 1536;  // bytes
  alignas(32) float f0[NT][kChunk];
  alignas(32) float f1[F::kTwoScales ? NT : 1][F::kTwoScales ? kChunk : 1];
  alignas(32) float fmn[F::kMin ? kChunk : 1];
  __m256 acc[NT];
  const int16_t* xq[NT];
  const float* xd[NT];
  const float* xs[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm256_setzero_ps();
    xq[t] = A.q_row(t0 + t);
    xd[t] = A.d_row(t0 + t);
    xs[t] = A.s_row(t0 + t);
  }
  const int64_t nsub = A.nb;
  for (int64_t c = 0; c < nsub; c += kChunk) {
    const int m = (int)std::min<int64_t>(kChunk, nsub - c);
    // Factors sc * dx (the same single multiplication as one at a time).
    int i = 0;
    for (; i + 8 <= m; i += 8) {
      Scales8 v;
      F::scales8(row, c + i, v);
      for (int t = 0; t < NT; ++t) {
        const __m256 dx = _mm256_loadu_ps(xd[t] + c + i);
        _mm256_store_ps(&f0[t][i], _mm256_mul_ps(v.sc, dx));
        if constexpr (F::kTwoScales) _mm256_store_ps(&f1[t][i], _mm256_mul_ps(v.sc1, dx));
      }
      if constexpr (F::kMin) _mm256_store_ps(&fmn[i], v.mn);
    }
    for (; i < m; ++i) {
      float sc[3] = {0, 0, 0};
      F::scale1(row, c + i, sc);
      for (int t = 0; t < NT; ++t) {
        f0[t][i] = sc[0] * xd[t][c + i];
        if constexpr (F::kTwoScales) f1[t][i] = sc[1] * xd[t][c + i];
      }
      if constexpr (F::kMin) fmn[i] = sc[2];
    }
    auto f1p = [&](int t, int ii) -> const float* {
      if constexpr (F::kTwoScales) return &f1[t][ii];
      return nullptr;
    };
    auto mnp = [&](int ii) -> const float* {
      if constexpr (F::kMin) return &fmn[ii];
      return nullptr;
    };
    i = 0;
    // kGroup sub-blocks per iteration: their integer work is issued before
    // the pairs' float chains, which are then added to acc in order.
    constexpr int kGroup = 4;
    for (; i + kGroup <= m; i += kGroup) {
      const int64_t k = c + i;
      {
        // Software prefetch a fixed distance ahead in the row (and on into
        // the next rows, which follow in memory): demand loads alone keep too
        // few cache lines in flight once the loop has more than a few
        // instructions per line.
        constexpr int kSpan = kGroup * F::kBytes / F::kSubs;
        const char* p = reinterpret_cast<const char*>(row) + (k * F::kBytes) / F::kSubs + kPrefetch;
        for (int o = 0; o < kSpan; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
      }
      __m256i lo[kGroup], hi[kGroup];
      for (int u = 0; u < kGroup; ++u) F::weights(row, k + u, lo[u], hi[u]);
      for (int t = 0; t < NT; ++t) {
        __m256 tmp[kGroup / 2];
        for (int p = 0; p < kGroup / 2; ++p) {
          const int a = 2 * p, b = 2 * p + 1;
          tmp[p] = contrib<F>(lo[a], hi[a], xq[t] + 32 * (k + a), &f0[t][i + a], f1p(t, i + a), mnp(i + a),
                              xs[t] + 8 * (k + a), _mm256_setzero_ps());
          tmp[p] = contrib<F>(lo[b], hi[b], xq[t] + 32 * (k + b), &f0[t][i + b], f1p(t, i + b), mnp(i + b),
                              xs[t] + 8 * (k + b), tmp[p]);
        }
        for (int p = 0; p < kGroup / 2; ++p) acc[t] = _mm256_add_ps(acc[t], tmp[p]);
      }
    }
    for (; i + 2 <= m; i += 2) {
      const int64_t k = c + i;
      __m256i lo0, hi0, lo1, hi1;
      F::weights(row, k, lo0, hi0);
      F::weights(row, k + 1, lo1, hi1);
      for (int t = 0; t < NT; ++t) {
        __m256 tmp = contrib<F>(lo0, hi0, xq[t] + 32 * k, &f0[t][i], f1p(t, i), mnp(i), xs[t] + 8 * k,
                                _mm256_setzero_ps());
        tmp = contrib<F>(lo1, hi1, xq[t] + 32 * (k + 1), &f0[t][i + 1], f1p(t, i + 1), mnp(i + 1),
                         xs[t] + 8 * (k + 1), tmp);
        acc[t] = _mm256_add_ps(acc[t], tmp);
      }
    }
    if (i < m) {  // the odd last sub-block of the row
      const int64_t k = c + i;
      __m256i lo, hi;
      F::weights(row, k, lo, hi);
      for (int t = 0; t < NT; ++t)
        acc[t] = contrib<F>(lo, hi, xq[t] + 32 * k, &f0[t][i], f1p(t, i), mnp(i), xs[t] + 8 * k, acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) Y[(t0 + t) * ldy + j] = hsum(acc[t]);
}

// Rows per tile: a tile of weight rows (<= ~96 KiB) is read from memory once
// and then re-read from L2 by each group of four inputs, whose activations
// stay in L1 across the tile. Tiling changes only the order in which outputs
// are produced, never how any one output is computed.
inline int64_t tile_rows(size_t row_bytes) { return std::max<int64_t>(1, (int64_t)((96u << 10) / row_bytes)); }

template <class F>
void i16_rows(const MatView& W, const QuantizedActs& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  const int64_t tile = A.n_x <= 4 ? re - rb : tile_rows(W.row_bytes);
  for (int64_t jb = rb; jb < re; jb += tile) {
    const int64_t je = std::min(re, jb + tile);
    int64_t t0 = 0;
    for (; t0 + 4 <= A.n_x; t0 += 4)
      for (int64_t j = jb; j < je; ++j) i16_row<F, 4>(W.row(j), A, t0, Y, ldy, j);
    for (int64_t j = jb; j < je; ++j) {
      switch (A.n_x - t0) {
        case 3: i16_row<F, 3>(W.row(j), A, t0, Y, ldy, j); break;
        case 2: i16_row<F, 2>(W.row(j), A, t0, Y, ldy, j); break;
        case 1: i16_row<F, 1>(W.row(j), A, t0, Y, ldy, j); break;
        default: break;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// f32 path: decoders give 8 floats at element i (a multiple of 8; for FP8 a
// whole 32-element block at once), and one float for the scalar tail.

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

// Same order as dot_f32_avx2 over the decoded row: 32-element steps into four
// accumulators, 8-element steps into the first, reduction, then a scalar tail.
template <class F, int NT>
inline void f32_row(const uint8_t* row, int64_t n, const float* X, int64_t t0, float* Y, int64_t ldy, int64_t j) {
  __m256 s[NT][4];
  const float* x[NT];
  for (int t = 0; t < NT; ++t) {
    for (int k = 0; k < 4; ++k) s[t][k] = _mm256_setzero_ps();
    x[t] = X + (t0 + t) * n;
  }
  int64_t i = 0;
  __m256 v[4];
  for (; i + 32 <= n; i += 32) {
    F::load32(row, i, v);
    for (int t = 0; t < NT; ++t)
      for (int k = 0; k < 4; ++k) s[t][k] = _mm256_fmadd_ps(v[k], _mm256_loadu_ps(x[t] + i + 8 * k), s[t][k]);
  }
  if constexpr (F::kAny) {
    for (; i + 8 <= n; i += 8) {
      const __m256 w = F::load8(row, i);
      for (int t = 0; t < NT; ++t) s[t][0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x[t] + i), s[t][0]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    float r = hsum(_mm256_add_ps(_mm256_add_ps(s[t][0], s[t][1]), _mm256_add_ps(s[t][2], s[t][3])));
    if constexpr (F::kAny)
      for (int64_t ii = i; ii < n; ++ii) r = std::fma(F::one(row, ii), x[t][ii], r);  // as dot_f32_avx2
    Y[(t0 + t) * ldy + j] = r;
  }
}

template <class F>
void f32_rows(const MatView& W, const float* X, int64_t n_x, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  const int64_t tile = n_x <= 2 ? re - rb : tile_rows(W.row_bytes);  // as i16_rows
  for (int64_t jb = rb; jb < re; jb += tile) {
    const int64_t je = std::min(re, jb + tile);
    int64_t t0 = 0;
    for (; t0 + 2 <= n_x; t0 += 2)
      for (int64_t j = jb; j < je; ++j) f32_row<F, 2>(W.row(j), W.cols, X, t0, Y, ldy, j);
    if (t0 < n_x)
      for (int64_t j = jb; j < je; ++j) f32_row<F, 1>(W.row(j), W.cols, X, t0, Y, ldy, j);
  }
}

}  // namespace

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

void matmul_rows_i16_avx2(const MatView& W, const QuantizedActs& A, float* Y, int64_t ldy, int64_t rb,
                           int64_t re) {
  switch (W.type) {
    case DType::Q4_0: i16_rows<Q4_0>(W, A, Y, ldy, rb, re); break;
    case DType::Q4_1: i16_rows<Q4_1>(W, A, Y, ldy, rb, re); break;
    case DType::Q5_0: i16_rows<Q5_0>(W, A, Y, ldy, rb, re); break;
    case DType::Q8_0: i16_rows<Q8_0>(W, A, Y, ldy, rb, re); break;
    case DType::Q4_K: i16_rows<Q4_K>(W, A, Y, ldy, rb, re); break;
    case DType::Q6_K: i16_rows<Q6_K>(W, A, Y, ldy, rb, re); break;
    case DType::MXFP4: i16_rows<MXFP4>(W, A, Y, ldy, rb, re); break;
    case DType::NVFP4: i16_rows<NVFP4>(W, A, Y, ldy, rb, re); break;
    case DType::INT4_G128: i16_rows<INT4_G128>(W, A, Y, ldy, rb, re); break;
    case DType::INT8_COL: i16_rows<INT8_COL>(W, A, Y, ldy, rb, re); break;
    default: break;
  }
}

bool f32_path_avx2_supports(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::FP8_E4M3;
}

void matmul_rows_f32_avx2(const MatView& W, const float* X, int64_t n_x, float* Y, int64_t ldy, int64_t rb,
                          int64_t re) {
  switch (W.type) {
    case DType::F32: f32_rows<F32W>(W, X, n_x, Y, ldy, rb, re); break;
    case DType::F16: f32_rows<F16W>(W, X, n_x, Y, ldy, rb, re); break;
    case DType::BF16: f32_rows<BF16W>(W, X, n_x, Y, ldy, rb, re); break;
    case DType::FP8_E4M3: f32_rows<FP8W>(W, X, n_x, Y, ldy, rb, re); break;
    default: break;
  }
}

}  // namespace megakern
