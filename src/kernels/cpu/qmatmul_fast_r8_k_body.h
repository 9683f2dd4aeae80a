// Part of qmatmul_fast_r8_body.h (included there, inside its namespace,
// under its MK_R8_VNNI): the K-quants' tiles (256-element blocks as eight
// 32-element sub-blocks with their own scales), their decoders (Q4_K, Q5_K,
// IQ4_XS, Q6_K) and their pass (passK). The body holds the shared layout,
// the row driver and the dispatch; the 32-element formats are in
// qmatmul_fast_r8_32_body.h.
#pragma once
#ifndef MK_R8_VNNI
#error "include only from qmatmul_fast_r8_body.h"
#endif

constexpr int kChunkK = 2;

struct TileK {
  alignas(32) int8_t w[kChunkK][8][8][32];  // [block][sub-block][group of 4][row lanes]
  alignas(32) int8_t aw[kChunkK][8][8][32];  // |w| (IQ4_XS: signed values, the sign trick)
  alignas(32) int16_t sc[kChunkK][8][16];   // sub-block scale per row, both int16 of its lane
  alignas(32) int16_t sc2[kChunkK][8][16];  // Q6_K: scale of the second 16 of the sub-block
  alignas(32) int16_t mv[kChunkK][4][16];   // Q4_K: (m_2h, m_2h+1) per row lane
  alignas(32) int32_t ncorr[kChunkK][8];     // Q6_K: -128 * sum_g sc_g * (sum of w over g) per row
  alignas(32) float d[kChunkK][kRows], nmin[kChunkK][kRows];
};

// Duplicate the low (or high) int16 of each 32-bit lane.
inline __m256i dup_lo16(__m256i v) {
  const __m128i c = _mm_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
  return _mm256_shuffle_epi8(v, _mm256_broadcastsi128_si256(c));
}
inline __m256i dup_hi16(__m256i v) {
  const __m128i c = _mm_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15);
  return _mm256_shuffle_epi8(v, _mm256_broadcastsi128_si256(c));
}

// kRun: vpmaddubsw results added as int16 before vpmaddwd by the scales;
// kU8: the inputs as unsigned bytes q + 128 against signed weights (Q6_K);
// kTwoScales: a scale per 16 elements.
struct R8Q4_K {
  static constexpr bool kMin = true, kSigned = false, kU8 = false, kTwoScales = false;
  // |sum of 16 code x input products| <= 16 * 15 * 127 < 2^15: the AVX-VNNI
  // loop scales each half sub-block with one vpdpwssd (see passK).
  static constexpr bool kHalf16 = true;
  static constexpr int kRun = 8;  // codes below 16
  // The scales and mins of the eight rows (shared with Q5_K).
  static void scales(const uint8_t* const p[8], TileK& T, int c) {
    const uint8_t* pm[8];
    __m256i s[8];
    for (int r = 0; r < 8; ++r) {
      pm[r] = p[r] + 2;
      uint32_t u[4];
      avx2::unpack_k_scales(p[r] + 4, u);
      s[r] = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u)));
    }
    transpose8(s);  // s[h] (h < 4): (sc_2h, sc_2h+1); s[4 + h]: (m_2h, m_2h+1)
    for (int h = 0; h < 4; ++h) {
      st(T.sc[c][2 * h], dup_lo16(s[h]));
      st(T.sc[c][2 * h + 1], dup_hi16(s[h]));
      st(T.mv[c][h], s[4 + h]);
    }
    _mm256_store_ps(T.d[c], f16x8(p));
    _mm256_store_ps(T.nmin[c], _mm256_xor_ps(_mm256_set1_ps(-0.0f), f16x8(pm)));  // exact negation, -0 included
  }
  static void decode(const uint8_t* const rows[8], int64_t k, TileK& T, int c) {
    const uint8_t* p[8];
    for (int r = 0; r < 8; ++r) p[r] = rows[r] + 144 * k;
    scales(p, T, c);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int j2 = 0; j2 < 4; ++j2) {
      __m256i v[8];
      for (int r = 0; r < 8; ++r) v[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[r] + 16 + 32 * j2));
      transpose8(v);
      for (int g = 0; g < 8; ++g) {
        st(T.w[c][2 * j2][g], _mm256_and_si256(v[g], m4));
        st(T.w[c][2 * j2 + 1][g], _mm256_and_si256(_mm256_srli_epi16(v[g], 4), m4));
      }
    }
  }
};

// Q5_K: Q4_K's scales and mins, codes below 32 (the fifth bit from qh, bit
// j of byte i for element i of sub-block j).
struct R8Q5_K {
  static constexpr bool kMin = true, kSigned = false, kU8 = false, kTwoScales = false;
  static constexpr bool kHalf16 = false;  // codes to 31: a half sum reaches 2^15
  static constexpr int kRun = 4;
  static void decode(const uint8_t* const rows[8], int64_t k, TileK& T, int c) {
    const uint8_t* p[8];
    for (int r = 0; r < 8; ++r) p[r] = rows[r] + 176 * k;
    R8Q4_K::scales(p, T, c);
    __m256i qh[8];
    for (int r = 0; r < 8; ++r) qh[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[r] + 16));
    transpose8(qh);
    const __m256i m4 = _mm256_set1_epi8(0x0f), b16 = _mm256_set1_epi8(0x10);
    for (int j2 = 0; j2 < 4; ++j2) {
      __m256i v[8];
      for (int r = 0; r < 8; ++r) v[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[r] + 48 + 32 * j2));
      transpose8(v);
      const __m256i bl = _mm256_set1_epi8((char)(1 << (2 * j2))), bh = _mm256_set1_epi8((char)(2 << (2 * j2)));
      for (int g = 0; g < 8; ++g) {
        const __m256i hl = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh[g], bl), bl), b16);
        const __m256i hh = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh[g], bh), bh), b16);
        st(T.w[c][2 * j2][g], _mm256_or_si256(_mm256_and_si256(v[g], m4), hl));
        st(T.w[c][2 * j2 + 1][g], _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v[g], 4), m4), hh));
      }
    }
  }
};

// IQ4_XS: IQ4_NL's table values (signed: the sign trick) under signed 6-bit
// scales per 32 elements; no offset, no min.
struct R8IQ4_XS {
  static constexpr bool kMin = false, kSigned = true, kU8 = false, kTwoScales = false;
  static constexpr bool kHalf16 = false;
  static constexpr int kRun = 1;
  static void decode(const uint8_t* const rows[8], int64_t k, TileK& T, int c) {
    const uint8_t* p[8];
    __m256i s[8];
    for (int r = 0; r < 8; ++r) {
      p[r] = rows[r] + 136 * k;
      uint16_t sh;
      std::memcpy(&sh, p[r] + 2, 2);
      alignas(16) int16_t ls[8];
      for (int j = 0; j < 8; ++j)
        ls[j] = (int16_t)((((p[r][4 + j / 2] >> (4 * (j % 2))) & 0x0f) | (((sh >> (2 * j)) & 3) << 4)) - 32);
      s[r] = _mm256_zextsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(ls)));
    }
    transpose8(s);  // s[h] (h < 4): (ls_2h, ls_2h+1) per row
    for (int h = 0; h < 4; ++h) {
      st(T.sc[c][2 * h], dup_lo16(s[h]));
      st(T.sc[c][2 * h + 1], dup_hi16(s[h]));
    }
    _mm256_store_ps(T.d[c], f16x8(p));
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i tab = _mm256_broadcastsi128_si256(
        _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113));
    for (int j = 0; j < 8; ++j) {
      __m256i v[4];
      for (int r = 0; r < 4; ++r) v[r] = load2(p[r + 4] + 8 + 16 * j, p[r] + 8 + 16 * j);
      transpose4x2(v);
      for (int g = 0; g < 4; ++g) {
        const __m256i lo = _mm256_shuffle_epi8(tab, _mm256_and_si256(v[g], m4));
        const __m256i hi = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(v[g], 4), m4));
        st(T.w[c][j][g], lo);
        st(T.w[c][j][4 + g], hi);
        st(T.aw[c][j][g], _mm256_abs_epi8(lo));
        st(T.aw[c][j][4 + g], _mm256_abs_epi8(hi));
      }
    }
  }
};

// Q6_K: weights w = code - 32 in -32..31 stored signed, against the inputs
// as unsigned bytes u = q + 128 (one vpmaddubsw, pair sums within
// 2 * 255 * 32, two of them within int16). sum sc_g u w = sum sc_g q w +
// 128 * sum sc_g w: the second term depends on the weights only, and is
// computed here once (ncorr, negated) to start each input's sum. The -32
// offset then costs nothing per input (it was 16 operations per block).
struct R8Q6_K {
  static constexpr bool kMin = false, kSigned = false, kU8 = true, kTwoScales = true;
  static constexpr bool kHalf16 = false;  // unsigned inputs to 255
  static constexpr int kRun = 2;  // |w| <= 32 against u <= 255
  static void decode(const uint8_t* const rows[8], int64_t k, TileK& T, int c) {
    const uint8_t* p[8];
    const uint8_t* pd[8];
    __m256i s[8];
    for (int r = 0; r < 8; ++r) {
      p[r] = rows[r] + 210 * k;
      pd[r] = p[r] + 208;
      s[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[r] + 192)));
    }
    transpose8(s);  // s[h]: (sc_2h, sc_2h+1) per row
    for (int h = 0; h < 8; ++h) {
      // Sub-block h (elements 32h ..): groups 2h and 2h + 1.
      st(T.sc[c][h], dup_lo16(s[h]));
      st(T.sc2[c][h], dup_hi16(s[h]));
    }
    _mm256_store_ps(T.d[c], f16x8(pd));
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; ++h) {
      __m256i l0[8], l1[8], qh[8];
      for (int r = 0; r < 8; ++r) {
        l0[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[r] + 64 * h));
        l1[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[r] + 64 * h + 32));
        qh[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[r] + 128 + 32 * h));
      }
      transpose8(l0);
      transpose8(l1);
      transpose8(qh);
      for (int g = 0; g < 8; ++g) {
        const __m256i c0 = _mm256_or_si256(_mm256_and_si256(l0[g], m4), _mm256_and_si256(_mm256_slli_epi16(qh[g], 4), m2));
        const __m256i c1 = _mm256_or_si256(_mm256_and_si256(l1[g], m4), _mm256_and_si256(_mm256_slli_epi16(qh[g], 2), m2));
        const __m256i c2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0[g], 4), m4), _mm256_and_si256(qh[g], m2));
        const __m256i c3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1[g], 4), m4),
                                           _mm256_and_si256(_mm256_srli_epi16(qh[g], 2), m2));
        st(T.w[c][4 * h + 0][g], _mm256_sub_epi8(c0, k32));
        st(T.w[c][4 * h + 1][g], _mm256_sub_epi8(c1, k32));
        st(T.w[c][4 * h + 2][g], _mm256_sub_epi8(c2, k32));
        st(T.w[c][4 * h + 3][g], _mm256_sub_epi8(c3, k32));
      }
    }
    // -128 * sum_g sc_g * (sum of w over g): pair sums of w by vpmaddubsw
    // with ones (the four groups of a 16-element half stay within int16),
    // then vpmaddwd by the half's scales.
    const __m256i ones = _mm256_set1_epi8(1);
    __m256i corr = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      __m256i lo = _mm256_maddubs_epi16(ones, ld(T.w[c][j][0])), hi = _mm256_maddubs_epi16(ones, ld(T.w[c][j][4]));
      for (int g = 1; g < 4; ++g) {
        lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(ones, ld(T.w[c][j][g])));
        hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(ones, ld(T.w[c][j][4 + g])));
      }
      corr = _mm256_add_epi32(corr, _mm256_madd_epi16(lo, ld(T.sc[c][j])));
      corr = _mm256_add_epi32(corr, _mm256_madd_epi16(hi, ld(T.sc2[c][j])));
    }
    st(T.ncorr[c], _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 7)));
  }
};

// Per input and block: the sums of q over the eight 32-element groups as
// int16 (Q4_K's mins).
template <class F, int NT>
void passK(const TileK& T, int kn, const Rows8 R, __m256* acc) {
  for (int c = 0; c < kn; ++c) {
#if MK_R8_TRICKLE
    trickle.step();
#endif
    const int8_t* q[NT];  // kU8: the bytes of R.u8
    for (int i = 0; i < NT; ++i)
      q[i] = (F::kU8 ? reinterpret_cast<const int8_t*>(R.u8) : R.q) + i * R.qs + 256 * c;
    __m256i is[NT];
    for (int i = 0; i < NT; ++i) is[i] = F::kU8 ? ld(T.ncorr[c]) : _mm256_setzero_si256();
#if MK_R8_VNNI
    if constexpr (!F::kSigned) {
      // vpdpbusd sums of each 32-element sub-block (each 16-element half with
      // kTwoScales), multiplied by the rows' scales as int32: the same exact
      // integers as vpmaddwd by the scales below.
      for (int j = 0; j < 8; ++j) {
        if constexpr (F::kHalf16) {
          // Each half sub-block's sum fits int16, so the low int16 of its
          // lane is that sum: vpdpwssd by (sc, 0) adds sum * sc, one
          // operation for vpmulld's two and the add (the same integers).
          const __m256i sc0 = _mm256_and_si256(ld(T.sc[c][j]), _mm256_set1_epi32(0xffff));
          __m256i part[NT];
#pragma GCC unroll 8
          for (int g = 0; g < 8; ++g) {
            const __m256i w = ld(T.w[c][j][g]);
#pragma GCC unroll 4
            for (int i = 0; i < NT; ++i) {
              const __m256i x = bcast32(q[i] + 32 * j + 4 * g);
              part[i] = MK_DPBUSD(g % 4 == 0 ? _mm256_setzero_si256() : part[i], w, x);
              MK_KEEP(part[i]);
              if (g % 4 == 3) {
                is[i] = MK_DPWSSD(is[i], part[i], sc0);
                MK_KEEP(is[i]);
              }
            }
          }
          continue;
        }
        const __m256i sc = _mm256_srai_epi32(ld(T.sc[c][j]), 16);  // (sc, sc) as int16 -> sc as int32
        __m256i sc2 = sc;
        if constexpr (F::kTwoScales) sc2 = _mm256_srai_epi32(ld(T.sc2[c][j]), 16);
        __m256i part[NT];
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
          const __m256i w = ld(T.w[c][j][g]);
          const bool start = g == 0 || (F::kTwoScales && g == 4);
#pragma GCC unroll 4
          for (int i = 0; i < NT; ++i) {
            const __m256i x = bcast32(q[i] + 32 * j + 4 * g);
            const __m256i a = start ? _mm256_setzero_si256() : part[i];
            part[i] = F::kU8 ? MK_DPBUSD(a, x, w) : MK_DPBUSD(a, w, x);
            MK_KEEP(part[i]);
            if (g == 7 || (F::kTwoScales && g == 3)) {
              is[i] = _mm256_add_epi32(is[i], _mm256_mullo_epi32(part[i], g < 4 ? sc : sc2));
              MK_KEEP(is[i]);
            }
          }
        }
      }
    } else
#endif
    for (int j = 0; j < 8; ++j) {
      const __m256i sc = ld(T.sc[c][j]);
      __m256i sc2 = sc;
      if constexpr (F::kTwoScales) sc2 = ld(T.sc2[c][j]);
      __m256i part[NT];
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        const __m256i w = ld(T.w[c][j][g]);
        __m256i aw = w;
        if constexpr (F::kSigned) aw = ld(T.aw[c][j][g]);
#pragma GCC unroll 4
        for (int i = 0; i < NT; ++i) {
          const __m256i x = bcast32(q[i] + 32 * j + 4 * g);
          const __m256i p = F::kSigned ? _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w))
                            : F::kU8   ? _mm256_maddubs_epi16(x, w)
                                       : _mm256_maddubs_epi16(w, x);
          part[i] = g % F::kRun == 0 ? p : _mm256_add_epi16(part[i], p);
          MK_KEEP(part[i]);
          if (g % F::kRun == F::kRun - 1) {
            is[i] = _mm256_add_epi32(is[i], _mm256_madd_epi16(part[i], g < 4 ? sc : sc2));
            MK_KEEP(is[i]);
          }
        }
      }
    }
    const __m256 d = _mm256_load_ps(T.d[c]);
    for (int i = 0; i < NT; ++i) {
      const __m256 dx = _mm256_set1_ps(R.d[i * R.ds + c]);
      __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[i]), _mm256_mul_ps(d, dx),
                                 R.fresh && c == 0 ? _mm256_setzero_ps() : acc[2 * i]);
      if constexpr (F::kMin) {
        const int16_t* s = R.sq + i * R.sqs + 8 * c;
        __m256i m = _mm256_madd_epi16(ld(T.mv[c][0]), bcast32(s));
        for (int h = 1; h < 4; ++h) {
#if MK_R8_VNNI
          m = MK_DPWSSD(m, ld(T.mv[c][h]), bcast32(s + 2 * h));
#else
          m = _mm256_add_epi32(m, _mm256_madd_epi16(ld(T.mv[c][h]), bcast32(s + 2 * h)));
#endif
        }
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(_mm256_load_ps(T.nmin[c]), dx), a);
      }
      acc[2 * i] = a;
    }
  }
}
