// The weight formats of the exact numerics mode as its AVX2 kernels read
// them (qmatmul.h states the arithmetic): a 32-element sub-block decoded to
// int16 codes (Sub: elements 0..15 and 16..31) with its scale(s) and min;
// formats whose 256-block carries state (K-quants, IQ4_XS) prepare it once
// per block (F::State). Used by qmatmul_avx2.cpp only; include only from
// files built with AVX2.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/half.h"
#include "kernels/cpu/avx2_common.h"

namespace megakern {
namespace i16fmt {

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

// A decoded 32-element sub-block: elements 0..15 (lo) and 16..31 (hi) as
// int16, the scale (sc; sc1 for elements 16..31 when kTwoScales) and the min.
struct Sub {
  __m256i lo, hi;
  float sc, sc1, mn;
};

inline void widen_s8(__m128i lo8, __m128i hi8, Sub& s) {
  s.lo = _mm256_cvtepi8_epi16(lo8);
  s.hi = _mm256_cvtepi8_epi16(hi8);
}
inline void widen_s8(__m256i w, Sub& s) { widen_s8(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1), s); }

// 16 packed bytes -> codes of elements 0..15 (low nibbles), 16..31 (high).
inline void nibble_halves(const uint8_t* qs, __m128i& lo, __m128i& hi) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  lo = _mm_and_si128(b, m);
  hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
}
// 16 packed bytes -> the same codes as int16, widening first (one
// vpmovzxbw), then splitting nibbles inside each 16-bit lane.
inline void nibble_halves16(const uint8_t* qs, __m256i& lo, __m256i& hi) {
  const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  lo = _mm256_and_si256(w, _mm256_set1_epi16(0x0f));
  hi = _mm256_srli_epi16(w, 4);
}
inline __m128i e2m1_table128() { return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12); }

// 32 nibble codes at q minus 8 (Q4_0, INT4_G128), with the f16 scale at d
// (followed by more of its block).
inline void nibbles_minus8(const uint8_t* q, const uint8_t* d, Sub& s) {
  __m256i lo, hi;
  nibble_halves16(q, lo, hi);
  const __m256i eight = _mm256_set1_epi16(8);
  s.lo = _mm256_sub_epi16(lo, eight);
  s.hi = _mm256_sub_epi16(hi, eight);
  s.sc = avx2::load_f16_in_block(d);
}

struct Q4_0 {
  static constexpr int kBlock = 32, kBytes = 18;
  static constexpr bool kTwoScales = false, kMin = false;
  static void decode(const uint8_t* b, int, Sub& s) { nibbles_minus8(b + 2, b, s); }
};
struct Q4_1 {
  static constexpr int kBlock = 32, kBytes = 20;
  static constexpr bool kTwoScales = false, kMin = true;
  static void decode(const uint8_t* b, int, Sub& s) {
    nibble_halves16(b + 4, s.lo, s.hi);
    const __m128 v = avx2::load_f16x2(b);
    s.sc = _mm_cvtss_f32(v);
    s.mn = _mm_cvtss_f32(_mm_movehdup_ps(v));
  }
  // The mins of sub-blocks k0 .. k0 + n - 1 (n <= 8) as floats, zero past n:
  // the halves at byte 2 of each block, gathered in a register.
  static __m256 mins(const uint8_t* row, int64_t k0, int n = 8) {
    if (n == 8) {
      const uint8_t* p[8];
      for (int i = 0; i < 8; ++i) p[i] = row + (k0 + i) * kBytes + 2;
      return avx2::f16x8(p);
    }
    // Packed in general registers (stores and a vector load would stall).
    uint64_t w[2] = {0, 0};
    for (int i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, row + (k0 + i) * kBytes + 2, 2);
      w[i / 4] |= (uint64_t)h << (16 * (i % 4));
    }
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)w[1], (long long)w[0]));
  }
};
struct Q5_0 {
  static constexpr int kBlock = 32, kBytes = 22;
  static constexpr bool kTwoScales = false, kMin = false;
  static void decode(const uint8_t* b, int, Sub& s) {
    const __m256i hi = avx2::q5_0_high_bits(b);
    widen_s8(_mm256_sub_epi8(_mm256_or_si256(nibbles(b + 6), hi), _mm256_set1_epi8(16)), s);
    s.sc = avx2::load_f16_in_block(b);
  }
};
struct Q8_0 {
  static constexpr int kBlock = 32, kBytes = 34;
  static constexpr bool kTwoScales = false, kMin = false;
  static void decode(const uint8_t* b, int, Sub& s) {
    widen_s8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)),
             _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18)), s);
    s.sc = avx2::load_f16_in_block(b);
  }
};
struct Q4_K {
  static constexpr int kBlock = 256, kBytes = 144;
  static constexpr bool kTwoScales = false, kMin = true;
  // Per 256-block: the eight sub-block scales d * sc and mins -(dmin * m),
  // unpacked with 32-bit masks (GGML's utmp trick) and converted together.
  struct State {
    alignas(32) float sc[8], mn[8];
  };
  static void prepare(const uint8_t* b, State& st) {
    uint32_t u[4];
    avx2::unpack_k_scales(b + 4, u);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
    _mm256_store_ps(st.sc, _mm256_mul_ps(_mm256_set1_ps(avx2::load_f16(b)), sc));
    // Negation by flipping the sign bit, exactly as the scalar -(x).
    _mm256_store_ps(st.mn, _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(avx2::load_f16(b + 2)), m), _mm256_set1_ps(-0.0f)));
  }
  static void decode(const uint8_t* b, int sb, const State& st, Sub& s) {
    const uint8_t* q = b + 16 + 32 * (sb / 2);
    // Widened from memory first; then the nibble within each 16-bit word.
    const __m256i lo = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    const __m256i hi = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)));
    if (sb % 2) {
      s.lo = _mm256_srli_epi16(lo, 4);
      s.hi = _mm256_srli_epi16(hi, 4);
    } else {
      const __m256i m4 = _mm256_set1_epi16(0x0f);
      s.lo = _mm256_and_si256(lo, m4);
      s.hi = _mm256_and_si256(hi, m4);
    }
    s.sc = st.sc[sb];
    s.mn = st.mn[sb];
  }
};
// Q6_K: the codes premultiplied by their 16-element integer scales (|w| <=
// 4096), one scale d per sub-block (qmatmul.h).
struct Q6_K {
  static constexpr int kBlock = 256, kBytes = 210;
  static constexpr bool kTwoScales = false, kMin = false;
  static void decode(const uint8_t* b, int sb, Sub& s) {
    const int8_t* sc = avx2::q6k_scales(b, sb);
    widen_s8(avx2::q6k_codes(b, sb), s);
    s.lo = _mm256_mullo_epi16(s.lo, _mm256_set1_epi16(sc[0]));
    s.hi = _mm256_mullo_epi16(s.hi, _mm256_set1_epi16(sc[1]));
    s.sc = avx2::load_f16(b + 208);
  }
};
// Q4_K's low nibbles and scales plus a fifth bit per element: element l of
// sub-block sb takes bit sb of qh[l] (qh = bytes 16..47). prepare decodes the
// whole 256-block (the 32 qh bytes serve all eight sub-blocks, with constant
// shift counts) into int16 codes 0..31 beside Q4_K's scales and mins.
struct Q5_K {
  static constexpr int kBlock = 256, kBytes = 176;
  static constexpr bool kTwoScales = false, kMin = true;
  struct State {
    Q4_K::State k;  // the same d, dmin and 12 scale bytes at 0..15
    alignas(32) int16_t w[256];
  };
  template <int SB>
  static void codes(__m256i qs, __m256i qh, State& st) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i low = _mm256_and_si256(SB % 2 ? _mm256_srli_epi16(qs, 4) : qs, m4);
    const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, SB), _mm256_set1_epi8(1)), 4);
    const __m256i q = _mm256_or_si256(low, high);
    int16_t* w = st.w + 32 * SB;
    _mm256_store_si256(reinterpret_cast<__m256i*>(w), _mm256_cvtepu8_epi16(_mm256_castsi256_si128(q)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(w + 16), _mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1)));
  }
  static void prepare(const uint8_t* b, State& st) {
    Q4_K::prepare(b, st.k);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    const auto qs = [&](int c) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 48 + 32 * c)); };
    const __m256i q0 = qs(0), q1 = qs(1), q2 = qs(2), q3 = qs(3);
    codes<0>(q0, qh, st);
    codes<1>(q0, qh, st);
    codes<2>(q1, qh, st);
    codes<3>(q1, qh, st);
    codes<4>(q2, qh, st);
    codes<5>(q2, qh, st);
    codes<6>(q3, qh, st);
    codes<7>(q3, qh, st);
  }
  static void decode(const uint8_t*, int sb, const State& st, Sub& s) {
    s.lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(st.w + 32 * sb));
    s.hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(st.w + 32 * sb + 16));
    s.sc = st.k.sc[sb];
    s.mn = st.k.mn[sb];
  }
};
// Formats with an additive min: applied once per group of eight sub-blocks
// (for the K-quants, a 256-block), qmatmul.h.
template <class F>
inline constexpr bool kGroupMins = F::kMin;
// Quants -4..3 from two bits of qs and one of hmask; a signed 6-bit scale per
// 16 elements. prepare decodes the whole 256-block at once (the 32 hmask
// bytes serve all eight sub-blocks and each 32 qs bytes four, with constant
// shift counts) into int16 quants premultiplied by their 16-element scales
// s - 32 (unpacked with 32-bit masks), the sub-block's one scale being d;
// decode then only loads a sub-block.
struct Q3_K {
  static constexpr int kBlock = 256, kBytes = 110;
  static constexpr bool kTwoScales = false, kMin = false;
  struct State {
    alignas(32) int16_t w[256];  // quants times their integer scale (qmatmul.h)
    alignas(16) int8_t isc[16];
    float d;
  };
  template <int H, int J>
  static void quants(__m256i qs, __m256i hm, State& st) {
    const __m256i low = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * J), _mm256_set1_epi8(3));
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * H + J), _mm256_set1_epi8(1));
    // low | high << 2 is the code 0..7; minus 4 gives the quant.
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 2)), _mm256_set1_epi8(4));
    constexpr int sb = 4 * H + J;
    int16_t* w = st.w + 32 * sb;
    const __m256i lo = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)), _mm256_set1_epi16(st.isc[2 * sb]));
    const __m256i hi = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)), _mm256_set1_epi16(st.isc[2 * sb + 1]));
    _mm256_store_si256(reinterpret_cast<__m256i*>(w), lo);
    _mm256_store_si256(reinterpret_cast<__m256i*>(w + 16), hi);
  }
  static void prepare(const uint8_t* b, State& st) {
    uint32_t a[3], u[4];
    std::memcpy(a, b + 96, 12);
    constexpr uint32_t kLow4 = 0x0f0f0f0f, kTop2 = 0x03030303;
    u[0] = (a[0] & kLow4) | (((a[2] >> 0) & kTop2) << 4);  // scales 0..3
    u[1] = (a[1] & kLow4) | (((a[2] >> 2) & kTop2) << 4);  // 4..7
    u[2] = ((a[0] >> 4) & kLow4) | (((a[2] >> 4) & kTop2) << 4);  // 8..11
    u[3] = ((a[1] >> 4) & kLow4) | (((a[2] >> 6) & kTop2) << 4);  // 12..15
    _mm_store_si128(reinterpret_cast<__m128i*>(st.isc),
                    _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u)), _mm_set1_epi8(32)));
    st.d = avx2::load_f16(b + 108);
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i qs0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32));
    const __m256i qs1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64));
    quants<0, 0>(qs0, hm, st);
    quants<0, 1>(qs0, hm, st);
    quants<0, 2>(qs0, hm, st);
    quants<0, 3>(qs0, hm, st);
    quants<1, 0>(qs1, hm, st);
    quants<1, 1>(qs1, hm, st);
    quants<1, 2>(qs1, hm, st);
    quants<1, 3>(qs1, hm, st);
  }
  static void decode(const uint8_t*, int sb, const State& st, Sub& s) {
    s.lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(st.w + 32 * sb));
    s.hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(st.w + 32 * sb + 16));
    s.sc = st.d;
  }
};
// GGML's kvalues_iq4nl as a byte-shuffle table.
inline __m128i iq4nl_table128() {
  return _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
}
// 16 index bytes (low nibbles elements 0..15, high 16..31) -> table values.
inline void iq4_lookup(const uint8_t* qs, Sub& s) {
  __m128i lo, hi;
  nibble_halves(qs, lo, hi);
  const __m128i tab = iq4nl_table128();
  widen_s8(_mm_shuffle_epi8(tab, lo), _mm_shuffle_epi8(tab, hi), s);
}
struct IQ4_NL {
  static constexpr int kBlock = 32, kBytes = 18;
  static constexpr bool kTwoScales = false, kMin = false;
  static void decode(const uint8_t* b, int, Sub& s) {
    iq4_lookup(b + 2, s);
    s.sc = avx2::load_f16_in_block(b);
  }
};
// IQ4_NL's values in 256-blocks; the eight sub-block scales d * (ls - 32)
// are decoded once per block.
struct IQ4_XS {
  static constexpr int kBlock = 256, kBytes = 136;
  static constexpr bool kTwoScales = false, kMin = false;
  struct State {
    alignas(32) float sc[8];
  };
  // Lane ib: the low nibble is bits 4ib.. of the 32-bit scales_l, the top
  // two bits are bits 2ib.. of scales_h.
  static void prepare(const uint8_t* b, State& st) {
    uint32_t lo, hi = 0;
    std::memcpy(&lo, b + 4, 4);
    std::memcpy(&hi, b + 2, 2);
    const __m256i l = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)lo), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                       _mm256_set1_epi32(0x0f));
    const __m256i h = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)hi), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                       _mm256_set1_epi32(3));
    const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(l, _mm256_slli_epi32(h, 4)), _mm256_set1_epi32(32));
    _mm256_store_ps(st.sc, _mm256_mul_ps(_mm256_set1_ps(avx2::load_f16(b)), _mm256_cvtepi32_ps(ls)));
  }
  static void decode(const uint8_t* b, int sb, const State& st, Sub& s) {
    iq4_lookup(b + 8 + 16 * sb, s);
    s.sc = st.sc[sb];
  }
};
struct MXFP4 {
  static constexpr int kBlock = 32, kBytes = 17;
  static constexpr bool kTwoScales = false, kMin = false;
  static void decode(const uint8_t* b, int, Sub& s) {
    // The 16 bytes zero-extended to words by an in-lane shuffle of a
    // broadcast load; each word's nibble looked up (high byte: entry 0 = 0)
    // and sign-extended by vpmaddubsw with (1, 0).
    const __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 1)));
    const __m256i w = _mm256_shuffle_epi8(
        raw, _mm256_setr_epi8(0, -128, 1, -128, 2, -128, 3, -128, 4, -128, 5, -128, 6, -128, 7, -128, 8, -128, 9,
                              -128, 10, -128, 11, -128, 12, -128, 13, -128, 14, -128, 15, -128));
    const __m256i tab = _mm256_broadcastsi128_si256(e2m1_table128());
    const __m256i one0 = _mm256_set1_epi16(1);
    s.lo = _mm256_maddubs_epi16(one0, _mm256_shuffle_epi8(tab, _mm256_and_si256(w, _mm256_set1_epi16(0x0f))));
    s.hi = _mm256_maddubs_epi16(one0, _mm256_shuffle_epi8(tab, _mm256_srli_epi16(w, 4)));
    s.sc = e8m0_half(b[0]);
  }
};
struct NVFP4 {
  static constexpr int kBlock = 64, kBytes = 36;
  static constexpr bool kTwoScales = true, kMin = false;
  static void decode(const uint8_t* b, int sb, Sub& s) {
    // 16 bytes = sub-blocks 2sb, 2sb+1 of 8 bytes each; in each, low nibbles
    // are elements 0..7 and high nibbles 8..15.
    // Bytes 0..7 zero-extended to words in both 128-bit lanes (8..15 for the
    // second half); the lower lane takes low nibbles, the upper high ones (a
    // per-dword shift by 0 or 4, then a mask); table lookup per word, sign
    // extension by vpmaddubsw with (1, 0).
    const __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4 + 16 * sb)));
    const __m256i z = _mm256_set1_epi8(-128);
    const __m256i pat_lo = _mm256_unpacklo_epi8(_mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2,
                                                                 3, 4, 5, 6, 7, 0, 0, 0, 0, 0, 0, 0, 0),
                                                z);
    const __m256i pat_hi = _mm256_add_epi8(pat_lo, _mm256_set1_epi16(8));
    const __m256i cnt = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    const __m256i m = _mm256_set1_epi16(0x0f);
    const __m256i tab = _mm256_broadcastsi128_si256(e2m1_table128());
    const __m256i one0 = _mm256_set1_epi16(1);
    auto half = [&](__m256i pat) {
      const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(raw, pat), cnt), m);
      return _mm256_maddubs_epi16(one0, _mm256_shuffle_epi8(tab, idx));
    };
    s.lo = half(pat_lo);
    s.hi = half(pat_hi);
    s.sc = ue4m3_half(b[2 * sb]);
    s.sc1 = ue4m3_half(b[2 * sb + 1]);
  }
};
struct INT4_G128 {
  static constexpr int kBlock = 128, kBytes = 66;
  static constexpr bool kTwoScales = false, kMin = false;
  static void decode(const uint8_t* b, int sb, Sub& s) { nibbles_minus8(b + 2 + 16 * sb, b, s); }
};
struct INT8_COL {
  static constexpr int kBlock = 128, kBytes = 132;
  static constexpr bool kTwoScales = false, kMin = false;
  static void decode(const uint8_t* b, int sb, Sub& s) {
    const uint8_t* q = b + 4 + 32 * sb;
    widen_s8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)),
             _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)), s);
    std::memcpy(&s.sc, b, 4);
  }
};

// Formats with per-block state (decoded once per block) declare F::State.
template <class F>
concept HasState = requires { typename F::State; };
struct NoState {};
template <class F>
struct StateOf {
  using type = NoState;
};
template <HasState F>
struct StateOf<F> {
  using type = typename F::State;
};

// Decodes sub-block k; `cur` / `st` cache the state of the current block.
template <class F>
inline void decode_sub(const uint8_t* row, int64_t k, int64_t& cur, typename StateOf<F>::type& st, Sub& s) {
  constexpr int kSubs = F::kBlock / 32;
  const int64_t bi = k / kSubs;
  const uint8_t* blk = row + bi * F::kBytes;
  if constexpr (HasState<F>) {
    if (bi != cur) {
      F::prepare(blk, st);
      cur = bi;
    }
    F::decode(blk, (int)(k % kSubs), st, s);
  } else {
    (void)cur;
    (void)st;
    F::decode(blk, (int)(k % kSubs), s);
  }
}

// Sub-blocks k .. k + 3 for k a multiple of 4, with the block addresses and
// in-block indices known at compile time where the format allows.
template <class F>
inline void decode4(const uint8_t* row, int64_t k, int64_t& cur, typename StateOf<F>::type& st, Sub s[4]) {
  constexpr int kSubs = F::kBlock / 32;
  if constexpr (HasState<F> || kSubs > 4) {
    for (int u = 0; u < 4; ++u) decode_sub<F>(row, k + u, cur, st, s[u]);
  } else {
    (void)cur;
    (void)st;
    const uint8_t* b = row + (k / kSubs) * F::kBytes;
    for (int u = 0; u < 4; ++u) F::decode(b + (u / kSubs) * F::kBytes, u % kSubs, s[u]);
  }
}

}  // namespace i16fmt
}  // namespace megakern
