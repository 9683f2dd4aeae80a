// Register-blocked kernel of the fast numerics mode for many inputs (prompt
// chunks, batches, verification): the arithmetic of qmatmul_fast.h, bit for
// bit, with the eight weight rows of a group in the eight 32-bit lanes of a
// vector.
//
// This body is compiled twice (the file that includes it sets MK_R8_VNNI):
// for AVX2 (qmatmul_fast_r8_avx2.cpp) and for AVX2 with AVX-VNNI
// (qmatmul_fast_r8_vnni_avx2.cpp). AVX-VNNI's vpdpbusd adds the four
// products of unsigned and signed bytes of each 32-bit lane into an int32
// sum in one instruction, which AVX2 needs vpmaddubsw, an int16 addition and
// a widening vpmaddwd for. Both compute the same exact integer sums, so the
// two variants give the same bits.
//
// Weight layout. A chunk of blocks of eight rows is decoded once into an L1
// tile in which vector g of a 32-element run holds, in lane r, row r's four
// codes of elements 4g .. 4g + 3 (an 8 x 8 transpose of 32-bit groups). One
// vpbroadcastd of the input's four bytes 4g .. 4g + 3 and one vpmaddubsw
// (vpdpbusd) with that vector give the eight rows' partial sums in their own
// lanes, so the rows need no horizontal reduction: int16 pair sums are added
// while they cannot overflow, widened by vpmaddwd (by ones, or by the rows'
// group scales for the K-quants) and added as int32. The float steps of each
// block are then done for the eight rows of one input with vector FMAs, in
// the order the contract states. Several inputs (kNT) are computed per pass
// so that each weight vector loaded from the tile serves all of them.
//
// Every fast-mode format is here (the K-quants' tiles, decoders and pass in
// qmatmul_fast_r8_k_body.h, which this file includes). Signed 8-bit weights (Q8_0, INT8_COL,
// IQ4_NL) go as int16 through vpmaddwd instead (store_signed); with AVX-VNNI
// they stay bytes, met by the inputs as unsigned bytes q + 128 and a
// weight-only correction (finish_signed). NVFP4 and Q3_K (two scales per
// 32-element block) keep the sums of elements 0..15 and 16..31 apart.
//
// Cost per 32-element block of the eight rows and one input, in vector
// operations other than loads (the inner loop is bound by them: about three
// per cycle): unsigned 4-bit codes 8 vpmaddubsw + 7 vpaddw + 1 vpmaddwd,
// plus the float steps (vcvtdq2ps, vmulps, vfmadd) and the offset (vpsubd):
// 20. Signed 8-bit weights: 16 vpmaddwd + 15 vpaddd + 3 float = 34 (the
// sign trick costs the same count with 27 of them on the two multiply
// ports, against 19). K-quants per 32 elements: Q4_K 17, Q6_K 20 (its -32
// offset is a weight-only term, R8Q6_K), IQ4_XS 32 (sign trick). Without a
// dot-product instruction these are near the floor: a vpmaddubsw's int16
// result needs one addition to be kept. With AVX-VNNI: 8 vpdpbusd for the
// integer part of any 32-element block (12 with the float steps), Q4_K 10
// (a vpdpwssd per half sub-block, whose sum fits int16), Q6_K 14 (a vpmulld
// by the scale per sub-block); IQ4_XS keeps the AVX2 sequence. There the
// loads become the other limit (a vpbroadcastd per vpdpbusd), so the
// 32-element formats run two tiles of eight rows per pass (pass32_pair):
// each broadcast serves sixteen rows. Without AVX-VNNI two tiles measured
// no faster (the multiply ports are the limit) and are not used.
//
// Few inputs (MK_R8_TRICKLE 1): the body is compiled a second time for up
// to kFastR8FewInputs inputs (batches, verify steps; qmatmul_fast.h), where
// a group's passes are short and its weights come from memory: the next
// group's weights are prefetched a few lines per block of the passes
// (Trickle) instead of as a burst per chunk. The many-input build keeps the
// burst and is the code it was: with both in one body, 128-input passes
// ran 2-3% slower (weights in L2), and so did whole prompts.
#ifndef MK_R8_VNNI
#error "define MK_R8_VNNI (0 or 1) before including this file"
#endif
#ifndef MK_R8_TRICKLE
#error "define MK_R8_TRICKLE (0 or 1) before including this file"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/qmatmul_fast.h"
#include "kernels/cpu/qmatmul_fast_formats_avx2.h"

namespace megakern {
namespace {

constexpr int kRows = 8;
constexpr int kNT = 4;  // inputs per pass
constexpr int64_t kActBytes = 128 * 1024;  // 8-bit activations per block of inputs
constexpr int64_t kPanel = 64;              // weight rows per panel (a multiple of kRows)

// Pins a running sum to a register in program order: without it the
// compiler re-balances the chains of additions into trees, which keeps every
// product alive at once and spills them.
#define MK_KEEP(v) __asm__("" : "+x"(v))

#if MK_R8_TRICKLE
// The next group's weights, prefetched a few lines per block of the
// passes over the current group (step()) rather than all at once: a burst
// of 40-90 prefetches waits on the core's few fill buffers, and the
// weights then arrive late however far ahead they were asked for. Eight
// inputs, weights from memory, one thread: Q4_1 (576 x 768, AVX2) 48-50
// GMAC/s with the burst one or two groups ahead, 55 trickled, 61 with the
// weights in L2; Q4_0 and Q4_K (1024 x 1536, AVX-VNNI) 61-63 -> 74-75.
struct Trickle {
  uintptr_t line = 0, end = 0;
  int per = 1;  // lines per step
  // Bytes [b, e) over about `steps` steps.
  void start(const uint8_t* b, const uint8_t* e, int64_t steps) {
    line = reinterpret_cast<uintptr_t>(b) & ~uintptr_t{63};
    end = reinterpret_cast<uintptr_t>(e);
    const int64_t lines = end > line ? (int64_t)((end - line + 63) / 64) : 0;
    per = (int)std::max<int64_t>(1, (lines + steps - 1) / std::max<int64_t>(steps, 1));
  }
  void step() {
    for (int i = 0; i < per && line < end; ++i, line += 64) _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
  }
};
thread_local Trickle trickle;
#endif

inline __m256i ld(const void* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
inline void st(void* p, __m256i v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }
inline __m256i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
inline __m256i load2(const uint8_t* hi, const uint8_t* lo) {
  return _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(hi), reinterpret_cast<const __m128i*>(lo));
}

// v[r] = row r's eight 32-bit groups -> v[g] = group g of rows 0..7.
inline void transpose8(__m256i v[8]) {
  __m256i t[8], u[8];
  for (int p = 0; p < 2; ++p) {
    const __m256i* a = v + 4 * p;
    __m256i* tt = t + 4 * p;
    tt[0] = _mm256_unpacklo_epi32(a[0], a[1]);
    tt[1] = _mm256_unpackhi_epi32(a[0], a[1]);
    tt[2] = _mm256_unpacklo_epi32(a[2], a[3]);
    tt[3] = _mm256_unpackhi_epi32(a[2], a[3]);
    __m256i* uu = u + 4 * p;
    uu[0] = _mm256_unpacklo_epi64(tt[0], tt[2]);  // group 0 | group 4 of four rows
    uu[1] = _mm256_unpackhi_epi64(tt[0], tt[2]);  // 1 | 5
    uu[2] = _mm256_unpacklo_epi64(tt[1], tt[3]);  // 2 | 6
    uu[3] = _mm256_unpackhi_epi64(tt[1], tt[3]);  // 3 | 7
  }
  for (int g = 0; g < 4; ++g) {
    v[g] = _mm256_permute2x128_si256(u[g], u[4 + g], 0x20);
    v[4 + g] = _mm256_permute2x128_si256(u[g], u[4 + g], 0x31);
  }
}

// v[p] = [row p's four 32-bit groups | row p + 4's] (p < 4) -> v[g] = group
// g of rows 0..7 (g < 4).
inline void transpose4x2(__m256i v[4]) {
  const __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
  v[0] = _mm256_unpacklo_epi64(t0, t2);
  v[1] = _mm256_unpackhi_epi64(t0, t2);
  v[2] = _mm256_unpacklo_epi64(t1, t3);
  v[3] = _mm256_unpackhi_epi64(t1, t3);
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

// ---------------------------------------------------------------------------
// 32-element formats.
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
  for (int g = 0; g < 8; ++g) sum = _mm256_dpbusd_avx_epi32(sum, ones, ld(T.w[c][g]));
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
      acc[i] = _mm256_dpbusd_avx_epi32(start ? _mm256_setzero_si256() : acc[i], w, bcast32(q[i] + 4 * g));
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
      acc[i] = _mm256_dpbusd_avx_epi32(acc[i], bcast32(u[i] + 4 * g), w);
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
        acc[0][i] = _mm256_dpbusd_avx_epi32(acc[0][i], b, w0);
        acc[1][i] = _mm256_dpbusd_avx_epi32(acc[1][i], b, w1);
      } else {
        acc[0][i] = _mm256_dpbusd_avx_epi32(start ? _mm256_setzero_si256() : acc[0][i], w0, b);
        acc[1][i] = _mm256_dpbusd_avx_epi32(start ? _mm256_setzero_si256() : acc[1][i], w1, b);
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

// Inputs are addressed from the first one's row by fixed strides (qs bytes
// of q, ds entries of the per-block arrays), so that the loop keeps its
// pointers in registers instead of recomputing them from A.
struct Rows8 {
  const int8_t* q;       // first input's q at the chunk's first block
  const int16_t* q16;    // the same as int16 in the to_q16 order (signed weights)
  const float* d;        // dx of that block
  const float* sx;       // sx (32-element blocks)
  const int32_t* off;    // the offset term (32-element formats with unsigned codes)
  const uint8_t* u8;     // q + 128 as unsigned bytes (kU8)
  const int16_t* sq;     // sums of 32 (Q4_K's mins)
  int64_t qs, ds, sqs;
  // The row's first chunk: each accumulator's first block adds to zero
  // rather than to memory (fma(x, y, 0), what a zeroed accumulator gave).
  bool fresh;
};

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

// ---------------------------------------------------------------------------
// K-quants: 256-element blocks as eight 32-element sub-blocks.
#include "kernels/cpu/qmatmul_fast_r8_k_body.h"

// ---------------------------------------------------------------------------
// The inputs' 8-bit activations as unsigned bytes q + 128.
inline void to_u8(const Q8Acts& A, std::vector<uint8_t>& u8) {
  if (u8.size() < (size_t)(A.n_x * A.cols)) u8.resize((size_t)(A.n_x * A.cols));
  const __m256i bias = _mm256_set1_epi8((char)0x80);
  for (int64_t i = 0; i < A.n_x * A.cols; i += 32)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u8.data() + i),
                        _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(A.q.data() + i)), bias));
}

// Rows [rb, re) in groups of eight (a last partial group repeats row rb and
// stores only its valid outputs). Per input two accumulators of the eight
// outputs (even and odd blocks; the K-quants use the first). With T2 (and
// pass2), two full groups of a panel go through pass2 together, which runs
// both tiles against each input block once (pass32_pair).
template <class Tile, class Decode, class Pass, class Pass2 = std::nullptr_t>
void r8_rows(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re, int chunk,
             bool two_chains, Tile& T, Decode&& decode, Pass&& pass, Tile* T2 = nullptr, Pass2&& pass2 = nullptr) {
  struct alignas(32) Acc {
    float v[kRows];
  };
  thread_local std::vector<Acc> store, store2;
  if (store.size() < (size_t)(2 * A.n_x)) store.resize((size_t)(2 * A.n_x));
  if (T2 != nullptr && store2.size() < (size_t)(2 * A.n_x)) store2.resize((size_t)(2 * A.n_x));
  __m256* acc = reinterpret_cast<__m256*>(store.data());
  __m256* acc2 = reinterpret_cast<__m256*>(store2.data());
#if MK_R8_TRICKLE
  const WeightLookahead next = weight_lookahead();
#else
  const size_t bytes = dtype_traits(W.type).block_bytes;
  const int64_t nbw = W.cols / dtype_traits(W.type).block_size;
#endif
  // Rows in panels of kPanel, inputs in blocks whose 8-bit activations stay
  // in L2: a panel's weights come from memory once and stay in L2 while
  // every block of inputs meets them (a group's tile is decoded again for
  // each block of inputs, from L2).
  const int64_t tb = std::max<int64_t>(kNT, (kActBytes / std::max<int64_t>(A.cols, 1)) / kNT * kNT);
  for (int64_t p0 = rb; p0 < re; p0 += kPanel) {
    const int64_t p1 = std::min(re, p0 + kPanel);
    for (int64_t tb0 = 0; tb0 < A.n_x; tb0 += tb) {
      const int64_t tb1 = std::min(A.n_x, tb0 + tb);
      for (int64_t j0 = p0; j0 < p1;) {
        const bool pair = T2 != nullptr && j0 + 2 * kRows <= p1;
        const int n = (int)std::min<int64_t>(kRows, p1 - j0);
        const int64_t step = pair ? 2 * kRows : kRows;
        const uint8_t* rows[kRows];
        const uint8_t* rows2[kRows];
#if !MK_R8_TRICKLE
        const uint8_t* ahead[2 * kRows];
#endif
        for (int r = 0; r < kRows; ++r) {
          rows[r] = W.row(r < n ? j0 + r : rb);
          rows2[r] = pair ? W.row(j0 + kRows + r) : rows[r];
        }
#if MK_R8_TRICKLE
        // The next group's rows (past the range's end, the rows the caller
        // runs next, when named: weight_lookahead()), a few lines per block
        // of this group's passes.
        {
          const uint8_t* b = W.row(std::min(j0 + step, re));
          const uint8_t* e = W.row(std::min(j0 + 2 * step, re));
          if (b == e && next.begin == b) e = std::min(next.end, b + step * W.row_bytes);
          trickle.start(b, e, A.nb * ((tb1 - tb0 + kNT - 1) / kNT));
        }
#else
        for (int r = 0; r < (int)step; ++r) ahead[r] = W.row(std::min<int64_t>(j0 + step + r, re - 1));
#endif
        // The first chunk's passes start the accumulators (Rows8::fresh);
        // only a second chain that no block reaches (a one-block row) is
        // zeroed here. The K-quants' odd accumulators stay idle.
        if (two_chains && A.nb < 2)
          for (int64_t t = tb0; t < tb1; ++t) {
            acc[2 * t + 1] = _mm256_setzero_ps();
            if (pair) acc2[2 * t + 1] = _mm256_setzero_ps();
          }
        for (int64_t k0 = 0; k0 < A.nb; k0 += chunk) {
          const int kn = (int)std::min<int64_t>(chunk, A.nb - k0);
          for (int c = 0; c < kn; ++c) decode(rows, k0 + c, T, c);
          if (pair)
            for (int c = 0; c < kn; ++c) decode(rows2, k0 + c, *T2, c);
#if !MK_R8_TRICKLE
          // The next group's rows for this chunk, while the inputs run.
          const size_t pb = (size_t)(k0 * nbw / A.nb) * bytes, pe = (size_t)((k0 + kn) * nbw / A.nb) * bytes;
          for (int r = 0; r < (int)step; ++r)
            for (size_t o = pb; o < pe; o += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead[r] + o), _MM_HINT_T1);
#endif
          auto run = [&](auto nt, int64_t t) {
            if constexpr (!std::is_same_v<std::decay_t<Pass2>, std::nullptr_t>) {
              if (pair) return pass2(nt, kn, k0, t, acc, acc2);
            }
            pass(nt, kn, k0, t, acc);
          };
          int64_t t = tb0;
          for (; t + kNT <= tb1; t += kNT) run(std::integral_constant<int, kNT>{}, t);
          switch (tb1 - t) {
            case 3: run(std::integral_constant<int, 3>{}, t); break;
            case 2: run(std::integral_constant<int, 2>{}, t); break;
            case 1: run(std::integral_constant<int, 1>{}, t); break;
            default: break;
          }
        }
        for (int64_t t = tb0; t < tb1; ++t) {
          const __m256 y = two_chains ? _mm256_add_ps(acc[2 * t], acc[2 * t + 1]) : acc[2 * t];
          avx2::store_f32_first(Y + t * ldy + j0, y, n);
          if (pair) {
            const __m256 y2 = two_chains ? _mm256_add_ps(acc2[2 * t], acc2[2 * t + 1]) : acc2[2 * t];
            _mm256_storeu_ps(Y + t * ldy + j0 + kRows, y2);
          }
        }
        j0 += step;
      }
    }
  }
}

template <class F>
void r8_32(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  thread_local Tile32 T;
  thread_local std::vector<int32_t> off;
  constexpr int kOffs = F::kTwo ? 2 : 1;
  if constexpr (F::kOffset != 0) {
    // kOffset * (sum of q over each block, or over each half with kTwo): the
    // unsigned codes' offset.
    if (off.size() < (size_t)(A.n_x * A.nb * kOffs)) off.resize((size_t)(A.n_x * A.nb * kOffs));
    for (int64_t t = 0; t < A.n_x; ++t) {
      const int16_t* s = A.s16_row(t);
      int32_t* o = off.data() + t * A.nb * kOffs;
      for (int64_t k = 0; k < A.nb; ++k) {
        if constexpr (F::kTwo) {
          o[2 * k] = F::kOffset * s[2 * k];
          o[2 * k + 1] = F::kOffset * s[2 * k + 1];
        } else {
          o[k] = F::kOffset * (s[2 * k] + s[2 * k + 1]);
        }
      }
    }
  }
  thread_local std::vector<int16_t> q16;
  thread_local std::vector<uint8_t> u8;
  if constexpr (F::kSigned) {
    if (MK_R8_VNNI) {
      to_u8(A, u8);
    } else {
      if (q16.size() < (size_t)(A.n_x * A.cols)) q16.resize((size_t)(A.n_x * A.cols));
      for (int64_t t = 0; t < A.n_x; ++t)
        for (int64_t k = 0; k < A.nb; ++k) to_q16(A.q_row(t) + 32 * k, q16.data() + t * A.cols + 32 * k);
    }
  }
  const int32_t* o = off.data();
  auto rows8 = [&](int64_t k0, int64_t t0) {
    Rows8 R{};
    R.fresh = k0 == 0;
    R.q = A.q_row(t0) + 32 * k0;
    if constexpr (F::kSigned) {
      if (MK_R8_VNNI)
        R.u8 = u8.data() + t0 * A.cols + 32 * k0;
      else
        R.q16 = q16.data() + t0 * A.cols + 32 * k0;
    }
    R.d = A.d_row(t0) + k0;
    R.sx = A.sx_row(t0) + k0;
    if (o != nullptr) R.off = o + (t0 * A.nb + k0) * kOffs;
    R.qs = A.cols;
    R.ds = A.nb;
    return R;
  };
  auto pass = [&](auto nt, int kn, int64_t k0, int64_t t0, __m256* acc) {
    pass32<F, decltype(nt)::value>(T, kn, rows8(k0, t0), acc + 2 * t0);
  };
#if MK_R8_VNNI
  // Two tiles per pass: each input's bytes broadcast once for sixteen rows
  // (one thread, K = 1024, N = 3072, 128 inputs, best of 5-6 interleaved
  // runs: Q4_0 80.6 -> 93.2 GMAC/s, Q4_1 79.5 -> 95.1, Q8_0 99.9 -> 110.8).
  thread_local Tile32 T2;
  r8_rows(W, A, Y, ldy, rb, re, kChunk, true, T, F::decode, pass, &T2,
          [&](auto nt, int kn, int64_t k0, int64_t t0, __m256* acc, __m256* acc2) {
            pass32_pair<F, decltype(nt)::value>(T, T2, kn, rows8(k0, t0), acc + 2 * t0, acc2 + 2 * t0);
          });
#else
  r8_rows(W, A, Y, ldy, rb, re, kChunk, true, T, F::decode, pass);
#endif
}

template <class F>
void r8_k(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  thread_local TileK T;
  thread_local std::vector<int16_t> sq;
  if constexpr (F::kMin) {
    if (sq.size() < (size_t)(A.n_x * A.nb * 8)) sq.resize((size_t)(A.n_x * A.nb * 8));
    for (int64_t t = 0; t < A.n_x; ++t) {
      const int16_t* s = A.s16_row(t);
      for (int64_t g = 0; g < A.nb * 8; ++g) sq[(size_t)(t * A.nb * 8 + g)] = (int16_t)(s[2 * g] + s[2 * g + 1]);
    }
  }
  thread_local std::vector<uint8_t> u8;
  if constexpr (F::kU8) to_u8(A, u8);
  const int16_t* s = sq.data();
  r8_rows(W, A, Y, ldy, rb, re, kChunkK, false, T, F::decode, [&](auto nt, int kn, int64_t k0, int64_t t0, __m256* acc) {
    Rows8 R{};
    R.fresh = k0 == 0;
    R.q = A.q_row(t0) + 256 * k0;
    R.d = A.d_row(t0) + k0;
    if constexpr (F::kU8) R.u8 = u8.data() + t0 * A.cols + 256 * k0;
    if (s != nullptr) R.sq = s + (t0 * A.nb + k0) * 8;
    R.qs = A.cols;
    R.ds = A.nb;
    R.sqs = A.nb * 8;
    passK<F, decltype(nt)::value>(T, kn, R, acc + 2 * t0);
  });
}

void r8_dispatch(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  switch (W.type) {
    case DType::Q4_0: r8_32<R8Q4_0>(W, A, Y, ldy, rb, re); break;
    case DType::Q4_1: r8_32<R8Q4_1>(W, A, Y, ldy, rb, re); break;
    case DType::Q8_0: r8_32<R8Q8_0>(W, A, Y, ldy, rb, re); break;
    case DType::Q4_K: r8_k<R8Q4_K>(W, A, Y, ldy, rb, re); break;
    case DType::Q6_K: r8_k<R8Q6_K>(W, A, Y, ldy, rb, re); break;
    case DType::Q5_K: r8_k<R8Q5_K>(W, A, Y, ldy, rb, re); break;
    case DType::IQ4_XS: r8_k<R8IQ4_XS>(W, A, Y, ldy, rb, re); break;
    case DType::Q5_0: r8_32<R8Gen<fast32::FQ5_0>>(W, A, Y, ldy, rb, re); break;
    case DType::IQ4_NL: r8_32<R8Gen<fast32::FIQ4_NL>>(W, A, Y, ldy, rb, re); break;
    case DType::Q3_K: r8_32<R8Gen<fast32::FQ3_K>>(W, A, Y, ldy, rb, re); break;
    case DType::MXFP4: r8_32<R8Gen<fast32::FMXFP4>>(W, A, Y, ldy, rb, re); break;
    case DType::NVFP4: r8_32<R8NVFP4>(W, A, Y, ldy, rb, re); break;
    case DType::INT4_G128: r8_32<R8Gen<fast32::FINT4_G128>>(W, A, Y, ldy, rb, re); break;
    case DType::INT8_COL: r8_32<R8Gen<fast32::FINT8_COL>>(W, A, Y, ldy, rb, re); break;
    default: fail("fast r8 kernel: {} is not supported", dtype_traits(W.type).name);
  }
}

}  // namespace
}  // namespace megakern

// The build's entry point (MK_R8_ENTRY, named by the including file).
#ifdef MK_R8_ENTRY
namespace megakern {
void MK_R8_ENTRY(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  r8_dispatch(W, A, Y, ldy, rb, re);
}
}  // namespace megakern
#endif
