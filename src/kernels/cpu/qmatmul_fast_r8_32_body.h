// Part of qmatmul_fast_r8_body.h (included there, inside its namespace,
// under its MK_R8_VNNI and MK_R8_TRICKLE): the 32-element formats' tile
// (Tile32), their decoders (Q4_0, Q4_1, Q8_0, NVFP4 and the generic ones),
// their integer sums and their passes (pass32, pass32_pair). The body holds
// the shared layout, the row driver and the dispatch.
#pragma once
#ifndef MK_R8_VNNI
#error "include only from qmatmul_fast_r8_body.h"
#endif

constexpr int kChunk = 16;  // blocks per tile

struct Tile32 {
  alignas(32) int8_t w[kChunk][8][32];     // unsigned codes (AVX-VNNI: signed 8-bit weights too)
  alignas(32) int16_t w16[kChunk][16][16];  // signed weights (kSigned), see store_signed
  alignas(32) float s0[kChunk][kRows], s1[kChunk][kRows], mn[kChunk][kRows];
  alignas(32) int32_t corr[kChunk][kRows];  // AVX-VNNI, signed weights: -128 * sum of w (finish_signed)
};

// Signed 8-bit weights (Q8_0, INT8_COL, IQ4_NL) are dotted as int16 with
// vpmaddwd: one vpmaddubsw needs an unsigned operand, and the sign trick
// around it costs a vpsignb and a widening vpmaddwd per vpmaddubsw (their
// pair sums cannot be added in int16), three multiply-port operations per 32
// products against two here. v[g] (lane r: row r's elements 4g .. 4g + 3)
// becomes w16[2g] = (e0, e2) and w16[2g + 1] = (e1, e3) per lane, as int16;
// the inputs are laid out to match (to_q16).
inline void store_signed(Tile32& T, int c, int g, __m256i v) {
#if MK_R8_VNNI
  st(T.w[c][g], v);
#else
  st(T.w16[c][2 * g], _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8));
  st(T.w16[c][2 * g + 1], _mm256_srai_epi16(v, 8));
#endif
}

// With AVX-VNNI, signed weights w stay bytes and meet the inputs as unsigned
// bytes u = q + 128 (vpdpbusd multiplies unsigned by signed bytes): sum u w =
// sum q w + 128 * sum w, and the second term, which depends on the weights
// only, is computed here once per block and row to start each input's sum.
inline void finish_signed([[maybe_unused]] Tile32& T, [[maybe_unused]] int c) {
#if MK_R8_VNNI
  const __m256i ones = _mm256_set1_epi8(1);
  __m256i sum = _mm256_setzero_si256();
  for (int g = 0; g < 8; ++g) sum = MK_DPBUSD(sum, ones, ld(T.w[c][g]));
  st(T.corr[c], _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, 7)));
#endif
}

// 32 activations (element order) -> 32 int16 in the order of store_signed:
// per group g of four, (q4g, q4g+2) then (q4g+1, q4g+3).
inline void to_q16(const int8_t* q, int16_t* o) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  const __m256i e = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8), d = _mm256_srai_epi16(v, 8);
  const __m256i lo = _mm256_unpacklo_epi32(e, d), hi = _mm256_unpackhi_epi32(e, d);  // groups 0,1 | 4,5 ; 2,3 | 6,7
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm256_permute2x128_si256(lo, hi, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 16), _mm256_permute2x128_si256(lo, hi, 0x31));
}

// The transposed packed bytes of block c of eight 4-bit rows (v[g]: each row's
// bytes 4g..4g+3 in its lane) as codes: low nibbles (elements 4g..4g+3) in
// groups 0..3, high nibbles (16 + 4g..) in groups 4..7.
inline void store_nibbles(const __m256i v[4], Tile32& T, int c) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  for (int g = 0; g < 4; ++g) {
    st(T.w[c][g], _mm256_and_si256(v[g], m4));
    st(T.w[c][4 + g], _mm256_and_si256(_mm256_srli_epi16(v[g], 4), m4));
  }
}

// Nibble formats: element i < 16 in the low nibble of byte i, 16 + i in the
// high one; kRun is the number of vpmaddubsw results whose int16 pair sums
// can be added without overflow (codes below 16: all eight).
struct R8Q4_0 {
  static constexpr bool kTwo = false, kSigned = false, kMin = false;
  static constexpr int kOffset = 8, kRun = 8;
  static void decode(const uint8_t* const rows[8], int64_t k, Tile32& T, int c) {
    const uint8_t* p[8];
    for (int r = 0; r < 8; ++r) p[r] = rows[r] + 18 * k;
    __m256i v[4];
    for (int r = 0; r < 4; ++r) v[r] = load2(p[r + 4] + 2, p[r] + 2);
    transpose4x2(v);
    store_nibbles(v, T, c);
    _mm256_store_ps(T.s0[c], f16x8(p));
  }
};
struct R8Q4_1 {
  static constexpr bool kTwo = false, kSigned = false, kMin = true;
  static constexpr int kOffset = 0, kRun = 8;
  static void decode(const uint8_t* const rows[8], int64_t k, Tile32& T, int c) {
    const uint8_t* p[8];
    const uint8_t* pm[8];
    for (int r = 0; r < 8; ++r) p[r] = rows[r] + 20 * k, pm[r] = p[r] + 2;
    __m256i v[4];
    for (int r = 0; r < 4; ++r) v[r] = load2(p[r + 4] + 4, p[r] + 4);
    transpose4x2(v);
    store_nibbles(v, T, c);
    _mm256_store_ps(T.s0[c], f16x8(p));
    _mm256_store_ps(T.mn[c], f16x8(pm));
  }
};
struct R8Q8_0 {
  static constexpr bool kTwo = false, kSigned = true, kMin = false;
  static constexpr int kOffset = 0, kRun = 1;
  static void decode(const uint8_t* const rows[8], int64_t k, Tile32& T, int c) {
    const uint8_t* p[8];
    for (int r = 0; r < 8; ++r) p[r] = rows[r] + 34 * k;
    __m256i v[8];
    for (int r = 0; r < 8; ++r) v[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[r] + 2));
    transpose8(v);
    for (int g = 0; g < 8; ++g) store_signed(T, c, g, v[g]);
    finish_signed(T, c);
    _mm256_store_ps(T.s0[c], f16x8(p));
  }
};

// int16 pair sums of codes below max_code + 1 against |q| <= 127 that can be
// added without overflow, as a divisor of `groups` (runs end at a half).
constexpr int run_for(int max_code, int groups) {
  int run = groups;
  while (run > 1 && run * 2 * max_code * 127 > 32767) run /= 2;
  return run;
}

// The other 32-element formats, from the block decoders of
// qmatmul_fast_formats_avx2.h: nibble formats transposed packed (as Q4_0,
// then mapped), the others block by block as 32 codes in element order and
// then transposed. kTwo: two scales per block (elements 0..15 are groups
// 0..3, 16..31 groups 4..7).
template <class F>
struct R8Gen {
  static constexpr bool kSigned = F::kSigned, kMin = F::kMin, kTwo = F::kTwo;
  static constexpr int kOffset = F::kOffset;
  static constexpr int kRun = kSigned ? 1 : run_for(F::kMaxCode, kTwo ? 4 : 8);
  static_assert(!(kSigned && kTwo), "signed weights with two scales per block");
  static void store(Tile32& T, int c, int g, __m256i w) {
    if constexpr (kSigned)
      store_signed(T, c, g, w);
    else
      st(T.w[c][g], w);
  }
  static void decode(const uint8_t* const rows[8], int64_t k, Tile32& T, int c) {
    fast32::Dec d[8];
    if constexpr (requires { F::kNibbleAt; }) {
      const int64_t at = (k / F::kSubs) * F::kBytes + F::kNibbleAt + 16 * (k % F::kSubs);
      __m256i v[4];
      for (int r = 0; r < 4; ++r) v[r] = load2(rows[r + 4] + at, rows[r] + at);
      transpose4x2(v);
      const __m256i m4 = _mm256_set1_epi8(0x0f);
      for (int g = 0; g < 4; ++g) {
        store(T, c, g, F::map(_mm256_and_si256(v[g], m4)));
        store(T, c, 4 + g, F::map(_mm256_and_si256(_mm256_srli_epi16(v[g], 4), m4)));
      }
      for (int r = 0; r < 8; ++r) F::scales(rows[r], k, d[r]);
    } else {
      __m256i v[8];
      for (int r = 0; r < 8; ++r) {
        F::decode(rows[r], k, d[r]);
        v[r] = d[r].w;
      }
      transpose8(v);
      for (int g = 0; g < 8; ++g) store(T, c, g, v[g]);
    }
    if constexpr (kSigned) finish_signed(T, c);
    for (int r = 0; r < 8; ++r) {
      T.s0[c][r] = d[r].s0;
      if constexpr (kTwo) T.s1[c][r] = d[r].s1;
      if constexpr (kMin) T.mn[c][r] = d[r].mn;
    }
  }
};

// NVFP4: a 64-element block (36 bytes: four e4m3 scales of 16 elements, then
// 32 bytes of e2m1 nibbles) read as two 32-element blocks; in each
// 16-element sub-block of 8 bytes, low nibbles are elements 0..7 and high
// ones 8..15. Codes are the doubled values + 12 (fast32::FNVFP4); the scales
// (halved, e4m3 with its sign dropped, 0x7f read as 0) are converted for the
// eight rows at once: the 7 bits moved to an f32's exponent and mantissa
// fields and scaled by 2^119 (2^(127 - 7) for the exponent bias, times 1/2),
// exact for the subnormal codes too.
struct R8NVFP4 {
  static constexpr bool kTwo = true, kSigned = false, kMin = false;
  static constexpr int kOffset = fast32::FNVFP4::kOffset, kRun = run_for(fast32::FNVFP4::kMaxCode, 4);
  static __m256 scales(__m256i e) {
    const __m256i m7 = _mm256_set1_epi32(0x7f);
    e = _mm256_and_si256(e, m7);
    const __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(e, 20)), _mm256_set1_ps(0x1p119f));
    return _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(e, m7)), v);
  }
  static void decode(const uint8_t* const rows[8], int64_t k, Tile32& T, int c) {
    const int64_t at = (k / 2) * 36;
    const int h = (int)(k % 2);
    __m256i v[4];
    for (int r = 0; r < 4; ++r) v[r] = load2(rows[r + 4] + at + 4 + 16 * h, rows[r] + at + 4 + 16 * h);
    transpose4x2(v);
    // Bytes 4g .. 4g + 3: low nibbles to group kLo[g], high ones to kHi[g].
    static constexpr int kLo[4] = {0, 1, 4, 5}, kHi[4] = {2, 3, 6, 7};
    const __m256i m4 = _mm256_set1_epi8(0x0f), tab = fast32::e2m1_plus12_table();
    for (int g = 0; g < 4; ++g) {
      st(T.w[c][kLo[g]], _mm256_shuffle_epi8(tab, _mm256_and_si256(v[g], m4)));
      st(T.w[c][kHi[g]], _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(v[g], 4), m4)));
    }
    uint16_t sc[8];
    for (int r = 0; r < 8; ++r) std::memcpy(&sc[r], rows[r] + at + 2 * h, 2);
    const __m256i e = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
    _mm256_store_ps(T.s0[c], scales(e));
    _mm256_store_ps(T.s1[c], scales(_mm256_srli_epi32(e, 8)));
  }
};

// Block c of the tile (unsigned codes) against inputs t0 .. t0 + NT - 1:
// the exact integer sums of the eight rows, one vector per input (kTwo: lo
// for elements 0..15, hi for 16..31).
template <class F, int NT>
inline void isum32(const Tile32& T, int c, const int8_t* const q[NT], __m256i lo[NT], __m256i hi[NT]) {
#if MK_R8_VNNI
  __m256i acc[NT];
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) {
    const __m256i w = ld(T.w[c][g]);
    const bool start = g == 0 || (F::kTwo && g == 4);
    if constexpr (F::kTwo) {
      if (g == 4)
        for (int i = 0; i < NT; ++i) lo[i] = acc[i];
    }
#pragma GCC unroll 4
    for (int i = 0; i < NT; ++i) {
      acc[i] = MK_DPBUSD(start ? _mm256_setzero_si256() : acc[i], w, bcast32(q[i] + 4 * g));
      MK_KEEP(acc[i]);
    }
  }
  for (int i = 0; i < NT; ++i) (F::kTwo ? hi : lo)[i] = acc[i];
#else
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[NT], part[NT];
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) {
    const __m256i w = ld(T.w[c][g]);
    // A new int32 sum starts at group 0 (and at 4 for the second half).
    const bool first_run = F::kTwo ? g % 4 < F::kRun : g < F::kRun;
    if constexpr (F::kTwo) {
      if (g == 4)
        for (int i = 0; i < NT; ++i) lo[i] = acc[i];
    }
#pragma GCC unroll 4
    for (int i = 0; i < NT; ++i) {
      const __m256i p = _mm256_maddubs_epi16(w, bcast32(q[i] + 4 * g));
      part[i] = g % F::kRun == 0 ? p : _mm256_add_epi16(part[i], p);
      MK_KEEP(part[i]);
      if (g % F::kRun == F::kRun - 1) {
        const __m256i s = _mm256_madd_epi16(part[i], ones);
        acc[i] = first_run ? s : _mm256_add_epi32(acc[i], s);
        MK_KEEP(acc[i]);
      }
    }
  }
  for (int i = 0; i < NT; ++i) (F::kTwo ? hi : lo)[i] = acc[i];
#endif
}

#if MK_R8_VNNI
// The same for signed weights kept as bytes (finish_signed): u[i] points at
// input i's block as unsigned bytes q + 128.
template <int NT>
inline void isum_u8(const Tile32& T, int c, const uint8_t* const u[NT], __m256i out[NT]) {
  __m256i acc[NT];
  const __m256i corr = ld(T.corr[c]);
  for (int i = 0; i < NT; ++i) acc[i] = corr;
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) {
    const __m256i w = ld(T.w[c][g]);
#pragma GCC unroll 4
    for (int i = 0; i < NT; ++i) {
      acc[i] = MK_DPBUSD(acc[i], bcast32(u[i] + 4 * g), w);
      MK_KEEP(acc[i]);
    }
  }
  for (int i = 0; i < NT; ++i) out[i] = acc[i];
}

// isum32 (unsigned codes) or isum_u8 (kSigned) for two tiles of eight rows
// at once: each input's four bytes are broadcast once for both. The same
// exact integer sums as one tile at a time.
template <class F, int NT>
inline void isum_pair(const Tile32& T0, const Tile32& T1, int c, const uint8_t* const x[NT], __m256i lo[2][NT],
                      __m256i hi[2][NT]) {
  __m256i acc[2][NT];
  if constexpr (F::kSigned) {
    const __m256i c0 = ld(T0.corr[c]), c1 = ld(T1.corr[c]);
    for (int i = 0; i < NT; ++i) acc[0][i] = c0, acc[1][i] = c1;
  }
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) {
    const __m256i w0 = ld(T0.w[c][g]), w1 = ld(T1.w[c][g]);
    const bool start = !F::kSigned && (g == 0 || (F::kTwo && g == 4));
    if constexpr (F::kTwo && !F::kSigned) {
      if (g == 4)
        for (int i = 0; i < NT; ++i) lo[0][i] = acc[0][i], lo[1][i] = acc[1][i];
    }
#pragma GCC unroll 4
    for (int i = 0; i < NT; ++i) {
      const __m256i b = bcast32(x[i] + 4 * g);
      if constexpr (F::kSigned) {
        acc[0][i] = MK_DPBUSD(acc[0][i], b, w0);
        acc[1][i] = MK_DPBUSD(acc[1][i], b, w1);
      } else {
        acc[0][i] = MK_DPBUSD(start ? _mm256_setzero_si256() : acc[0][i], w0, b);
        acc[1][i] = MK_DPBUSD(start ? _mm256_setzero_si256() : acc[1][i], w1, b);
      }
      MK_KEEP(acc[0][i]);
      MK_KEEP(acc[1][i]);
    }
  }
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < NT; ++i) (F::kTwo && !F::kSigned ? hi : lo)[h][i] = acc[h][i];
}
#endif

// The same for signed weights (store_signed): q[i] points at input i's
// block in the to_q16 order.
template <int NT>
inline void isum16(const Tile32& T, int c, const int16_t* const q[NT], __m256i out[NT]) {
  __m256i acc[NT];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) {
    const __m256i w = ld(T.w16[c][j]);
#pragma GCC unroll 4
    for (int i = 0; i < NT; ++i) {
      const __m256i p = _mm256_madd_epi16(w, bcast32(q[i] + 2 * j));
      acc[i] = j == 0 ? p : _mm256_add_epi32(acc[i], p);
      MK_KEEP(acc[i]);
    }
  }
  for (int i = 0; i < NT; ++i) out[i] = acc[i];
}

// The scales of block c applied to the integer sums of eight rows (lo, and
// hi with kTwo) for inputs t0 .. t0 + NT - 1, into their accumulators.
template <class F, int NT>
inline void finish32(const Tile32& T, int c, const Rows8& R, const __m256i lo[NT], const __m256i hi[NT], __m256* acc) {
  constexpr int kOffs = F::kTwo ? 2 : 1;  // offset terms per block
  const __m256 s0 = _mm256_load_ps(T.s0[c]);
  for (int i = 0; i < NT; ++i) {
    __m256i v = lo[i];
    const int32_t* off = F::kOffset != 0 ? R.off + (i * R.ds + c) * kOffs : nullptr;
    if constexpr (F::kOffset != 0) v = _mm256_sub_epi32(v, _mm256_set1_epi32(off[0]));
    __m256* a = acc + 2 * i + (c & 1);
    const __m256 dx = _mm256_set1_ps(R.d[i * R.ds + c]);
    __m256 x = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(s0, dx),
                               R.fresh && c < 2 ? _mm256_setzero_ps() : *a);
    if constexpr (F::kTwo) {
      __m256i u = hi[i];
      if constexpr (F::kOffset != 0) u = _mm256_sub_epi32(u, _mm256_set1_epi32(off[1]));
      x = _mm256_fmadd_ps(_mm256_cvtepi32_ps(u), _mm256_mul_ps(_mm256_load_ps(T.s1[c]), dx), x);
    }
    if constexpr (F::kMin) x = _mm256_fmadd_ps(_mm256_load_ps(T.mn[c]), _mm256_set1_ps(R.sx[i * R.ds + c]), x);
    *a = x;
  }
}

template <class F, int NT>
void pass32(const Tile32& T, int kn, const Rows8 R, __m256* acc) {
  for (int c = 0; c < kn; ++c) {
#if MK_R8_TRICKLE
    trickle.step();
#endif
    __m256i lo[NT], hi[NT];
    if constexpr (F::kSigned) {
#if MK_R8_VNNI
      const uint8_t* u[NT];
      for (int i = 0; i < NT; ++i) u[i] = R.u8 + i * R.qs + 32 * c;
      isum_u8<NT>(T, c, u, lo);
#else
      const int16_t* q[NT];
      for (int i = 0; i < NT; ++i) q[i] = R.q16 + i * R.qs + 32 * c;
      isum16<NT>(T, c, q, lo);
#endif
    } else {
      const int8_t* q[NT];
      for (int i = 0; i < NT; ++i) q[i] = R.q + i * R.qs + 32 * c;
      isum32<F, NT>(T, c, q, lo, hi);
    }
    finish32<F, NT>(T, c, R, lo, hi, acc);
  }
}

#if MK_R8_VNNI
// pass32 for two tiles (rows j0 .. j0 + 15) into acc0 and acc1: each output
// with pass32's operations.
template <class F, int NT>
void pass32_pair(const Tile32& T0, const Tile32& T1, int kn, const Rows8 R, __m256* acc0, __m256* acc1) {
  for (int c = 0; c < kn; ++c) {
#if MK_R8_TRICKLE
    trickle.step();
#endif
    __m256i lo[2][NT], hi[2][NT];
    const uint8_t* x[NT];
    for (int i = 0; i < NT; ++i)
      x[i] = (F::kSigned ? R.u8 : reinterpret_cast<const uint8_t*>(R.q)) + i * R.qs + 32 * c;
    isum_pair<F, NT>(T0, T1, c, x, lo, hi);
    finish32<F, NT>(T0, c, R, lo[0], hi[0], acc0);
    finish32<F, NT>(T1, c, R, lo[1], hi[1], acc1);
  }
}
#endif
