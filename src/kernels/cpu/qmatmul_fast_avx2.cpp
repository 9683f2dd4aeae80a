// AVX2 kernels of the fast numerics mode (qmatmul_fast.h states the
// arithmetic they reproduce bit for bit). Compiled with -mavx2 -mfma -mf16c;
// reached only through use_avx2().
//
// Weight rows are taken eight at a time. A chunk of blocks of the eight rows
// is decoded once into an L1 scratch (8-bit codes, scales as vectors over the
// eight rows) and then dotted with every input: per block and row one
// vpmaddubsw and one vpmaddwd, then a transposing reduction (vphaddd) turns
// the eight rows' lane sums into one vector holding each row's exact integer
// sum, whose float steps are done for the eight rows at once. The outputs of
// the eight rows are adjacent in Y, so they are stored with one vector store.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "kernels/cpu/format_kernels.h"
#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/qmatmul_fast.h"
#include "kernels/cpu/qmatmul_fast_formats_avx2.h"

namespace megakern {
namespace {

constexpr int kRows = 8;  // weight rows per group

using namespace fast32;

// The eight rows' lane sums v[0..7] (each 8 x int32) -> one vector whose lane
// r is the total of v[r]. With `halves`, lo gets the sums of lanes 0..3
// (elements 0..15 of a 32-element block) and hi those of lanes 4..7.
inline __m256i reduce8(const __m256i v[8]) {
  const __m256i a0 = _mm256_hadd_epi32(v[0], v[1]), a1 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i a2 = _mm256_hadd_epi32(v[4], v[5]), a3 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i b0 = _mm256_hadd_epi32(a0, a1), b1 = _mm256_hadd_epi32(a2, a3);
  return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20), _mm256_permute2x128_si256(b0, b1, 0x31));
}
inline void reduce8_halves(const __m256i v[8], __m256i& lo, __m256i& hi) {
  const __m256i a0 = _mm256_hadd_epi32(v[0], v[1]), a1 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i a2 = _mm256_hadd_epi32(v[4], v[5]), a3 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i b0 = _mm256_hadd_epi32(a0, a1), b1 = _mm256_hadd_epi32(a2, a3);
  lo = _mm256_permute2x128_si256(b0, b1, 0x20);
  hi = _mm256_permute2x128_si256(b0, b1, 0x31);
}

// ---------------------------------------------------------------------------
// The rows two groups ahead are prefetched while a group is decoded
// (GroupAhead): a group reads eight short row pieces at a time, too many
// streams for the hardware prefetcher to run ahead of.
// Rows are decoded in pairs (a, b) = (2p, 2p + 1) into two vectors:
//   lo = [a's elements 0..15 | b's elements 0..15], hi = [a's 16..31 | b's 16..31],
// so one input block, its halves broadcast to both 128-bit lanes, meets two
// rows at once, and four pair vectors reduce to the eight rows' sums with
// three vphaddd. Formats whose 16-byte nibble runs already split that way
// load two rows with one 256-bit load; the others decode a row and permute.
template <class F>
inline void decode_pair(const uint8_t* ra, const uint8_t* rb, int64_t k, __m256i& lo, __m256i& hi, Dec& da,
                        Dec& db) {
  if constexpr (requires { F::kNibbleAt; }) {
    // Codes of element i < 16 in the low nibble of byte i, of 16 + i in its high nibble.
    const uint8_t* qa = ra + (k / F::kSubs) * F::kBytes + F::kNibbleAt + 16 * (k % F::kSubs);
    const uint8_t* qb = rb + (k / F::kSubs) * F::kBytes + F::kNibbleAt + 16 * (k % F::kSubs);
    const __m256i raw = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(qb), reinterpret_cast<const __m128i*>(qa));
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    lo = F::map(_mm256_and_si256(raw, m4));
    hi = F::map(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
    F::scales(ra, k, da);
    F::scales(rb, k, db);
  } else {
    F::decode(ra, k, da);
    F::decode(rb, k, db);
    lo = _mm256_permute2x128_si256(da.w, db.w, 0x20);
    hi = _mm256_permute2x128_si256(da.w, db.w, 0x31);
  }
}

// Four pair vectors (lanes 0..3: row a's four partial sums, 4..7: row b's)
// -> the eight rows' totals in row order.
inline __m256i reduce_pairs(const __m256i v[4]) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  // h = rows (0, 2, 4, 6 | 1, 3, 5, 7)
  return _mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The group two on: rows are contiguous, so its eight rows are one range of
// memory, prefetched in order, by block k of nb its first (k + 1) / nb.
// (One line per row and block instead, eight streams for 32-element blocks
// of 18-34 bytes, asks for most lines several times: one input, SmolLM2
// Q4_1, ~35 % more time per matrix product.)
class GroupAhead {
 public:
  GroupAhead(const uint8_t* const ahead[kRows], size_t row_bytes, int64_t nb)
      : next_(reinterpret_cast<const char*>(ahead[0])),
        base_(next_),
        end_(reinterpret_cast<const char*>(ahead[kRows - 1]) + row_bytes),
        per_block_((size_t)(end_ - base_) / (size_t)std::max<int64_t>(nb, 1) + 1) {}
  void upto(int64_t k) {
    const char* u = std::min(end_, base_ + per_block_ * (size_t)(k + 1));
    for (; next_ < u; next_ += 64) _mm_prefetch(next_, _MM_HINT_T0);
  }

 private:
  const char* next_;
  const char* base_;
  const char* end_;
  size_t per_block_;
};

// Blocks decoded per chunk: the scratch of eight rows stays in L1.
constexpr int kChunk32 = 16;

struct Scratch32 {
  alignas(32) int8_t lo[kChunk32][4][32], hi[kChunk32][4][32];
  alignas(32) int8_t alo[kChunk32][4][32], ahi[kChunk32][4][32];  // |w| (signed formats)
  alignas(32) float s0[kChunk32][kRows], s1[kChunk32][kRows], mn[kChunk32][kRows];
};

// One input block against a block of the eight rows: lo / hi are the pair
// vectors decode_pair gives (alo / ahi their magnitudes, signed formats), ql /
// qh the input block's halves broadcast to both lanes; each row's exact
// integer sum, then its float step into a (s0 / s1 / mn: the rows' scales
// and mins in row order).
template <class F>
inline __m256 block_step(const __m256i lo[4], const __m256i hi[4], const __m256i alo[4], const __m256i ahi[4],
                         __m256i ql, __m256i qh, const int16_t* s16, float dx, float sx, __m256 s0, __m256 s1,
                         __m256 mn, __m256 a) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256 dxv = _mm256_set1_ps(dx);
  if constexpr (F::kTwo) {
    __m256i vl[4], vh[4];
    for (int p = 0; p < 4; ++p) {
      vl[p] = _mm256_madd_epi16(_mm256_maddubs_epi16(lo[p], ql), ones);
      vh[p] = _mm256_madd_epi16(_mm256_maddubs_epi16(hi[p], qh), ones);
    }
    __m256i l = reduce_pairs(vl), h = reduce_pairs(vh);
    if constexpr (F::kOffset != 0) {
      l = _mm256_sub_epi32(l, _mm256_set1_epi32(F::kOffset * s16[0]));
      h = _mm256_sub_epi32(h, _mm256_set1_epi32(F::kOffset * s16[1]));
    }
    a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), _mm256_mul_ps(s0, dxv), a);
    a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_mul_ps(s1, dxv), a);
  } else {
    __m256i v[4];
    for (int p = 0; p < 4; ++p) {
      if constexpr (F::kSigned) {
        // Sign trick: |w| * (q * sign(w)); each half summed to int32 on its
        // own (two halves of 8-bit products could overflow int16).
        const __m256i pl = _mm256_maddubs_epi16(alo[p], _mm256_sign_epi8(ql, lo[p]));
        const __m256i ph = _mm256_maddubs_epi16(ahi[p], _mm256_sign_epi8(qh, hi[p]));
        v[p] = _mm256_add_epi32(_mm256_madd_epi16(pl, ones), _mm256_madd_epi16(ph, ones));
      } else {
        // Codes below 32: both halves' pair sums fit int16 together.
        v[p] = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo[p], ql), _mm256_maddubs_epi16(hi[p], qh)),
                                 ones);
      }
    }
    __m256i is = reduce_pairs(v);
    if constexpr (F::kOffset != 0) is = _mm256_sub_epi32(is, _mm256_set1_epi32(F::kOffset * (s16[0] + s16[1])));
    a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(s0, dxv), a);
  }
  if constexpr (F::kMin) a = _mm256_fmadd_ps(mn, _mm256_set1_ps(sx), a);
  return a;
}

inline __m256i half_at(const int8_t* q) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
}

template <class F>
void fast32_group(const uint8_t* const rows[kRows], const uint8_t* const ahead[kRows], size_t block_bytes,
                  const Q8Acts& A, __m256* acc, Scratch32& S) {
  GroupAhead next(ahead, block_bytes * (size_t)A.nb, A.nb);
  for (int64_t k0 = 0; k0 < A.nb; k0 += kChunk32) {
    const int kn = (int)std::min<int64_t>(kChunk32, A.nb - k0);
    for (int c = 0; c < kn; ++c) {
      next.upto(k0 + c);
      for (int p = 0; p < 4; ++p) {
        __m256i lo, hi;
        Dec da, db;
        decode_pair<F>(rows[2 * p], rows[2 * p + 1], k0 + c, lo, hi, da, db);
        _mm256_store_si256(reinterpret_cast<__m256i*>(S.lo[c][p]), lo);
        _mm256_store_si256(reinterpret_cast<__m256i*>(S.hi[c][p]), hi);
        if constexpr (F::kSigned) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(S.alo[c][p]), _mm256_abs_epi8(lo));
          _mm256_store_si256(reinterpret_cast<__m256i*>(S.ahi[c][p]), _mm256_abs_epi8(hi));
        }
        S.s0[c][2 * p] = da.s0;
        S.s0[c][2 * p + 1] = db.s0;
        if constexpr (F::kTwo) {
          S.s1[c][2 * p] = da.s1;
          S.s1[c][2 * p + 1] = db.s1;
        }
        if constexpr (F::kMin) {
          S.mn[c][2 * p] = da.mn;
          S.mn[c][2 * p + 1] = db.mn;
        }
      }
    }
    auto ld = [](const int8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); };
    // Block c of input t into accumulator a (even or odd blocks' chain).
    auto step = [&](int64_t t, int c, __m256 a) {
      const int8_t* q = A.q_row(t) + 32 * (k0 + c);
      __m256i lo[4], hi[4], alo[4], ahi[4];
      for (int p = 0; p < 4; ++p) {
        lo[p] = ld(S.lo[c][p]);
        hi[p] = ld(S.hi[c][p]);
        if constexpr (F::kSigned) {
          alo[p] = ld(S.alo[c][p]);
          ahi[p] = ld(S.ahi[c][p]);
        }
      }
      return block_step<F>(lo, hi, alo, ahi, half_at(q), half_at(q + 16), A.s16_row(t) + 2 * (k0 + c),
                           A.d_row(t)[k0 + c], F::kMin ? A.sx_row(t)[k0 + c] : 0.0f, _mm256_load_ps(S.s0[c]),
                           F::kTwo ? _mm256_load_ps(S.s1[c]) : _mm256_setzero_ps(),
                           F::kMin ? _mm256_load_ps(S.mn[c]) : _mm256_setzero_ps(), a);
    };
    // Blocks alternate between two accumulators per output (k0 is even, so
    // c's parity is the block's); two inputs at a time, so four independent
    // chains hide the FMA latency.
    int64_t t = 0;
    for (; t + 2 <= A.n_x; t += 2) {
      __m256 a0 = acc[2 * t], a1 = acc[2 * t + 1], b0 = acc[2 * t + 2], b1 = acc[2 * t + 3];
      int c = 0;
      for (; c + 2 <= kn; c += 2) {
        a0 = step(t, c, a0);
        b0 = step(t + 1, c, b0);
        a1 = step(t, c + 1, a1);
        b1 = step(t + 1, c + 1, b1);
      }
      if (c < kn) {
        a0 = step(t, c, a0);
        b0 = step(t + 1, c, b0);
      }
      acc[2 * t] = a0, acc[2 * t + 1] = a1, acc[2 * t + 2] = b0, acc[2 * t + 3] = b1;
    }
    if (t < A.n_x) {
      __m256 a0 = acc[2 * t], a1 = acc[2 * t + 1];
      int c = 0;
      for (; c + 2 <= kn; c += 2) {
        a0 = step(t, c, a0);
        a1 = step(t, c + 1, a1);
      }
      if (c < kn) a0 = step(t, c, a0);
      acc[2 * t] = a0, acc[2 * t + 1] = a1;
    }
  }
}

// Up to kFewInputs inputs: each block of the eight rows is decoded and met
// by every input at once, with no scratch (for so few inputs a scratch
// would cost more than it saves); per input the same operations in the same
// order as fast32_group, so the same bits.
constexpr int kFewInputs = 4;

template <class F, int N>
void fast32_few(const uint8_t* const rows[kRows], const uint8_t* const ahead[kRows], size_t block_bytes,
                const Q8Acts& A, __m256* acc) {
  __m256 chain[N][2];
  for (int t = 0; t < N; ++t) chain[t][0] = acc[2 * t], chain[t][1] = acc[2 * t + 1];
  GroupAhead next(ahead, block_bytes * (size_t)A.nb, A.nb);
  for (int64_t k = 0; k < A.nb; ++k) {
    __m256i lo[4], hi[4], alo[4], ahi[4];
    alignas(32) float s0[kRows], s1[kRows], mn[kRows];
    next.upto(k);
    for (int p = 0; p < 4; ++p) {
      Dec da, db;
      decode_pair<F>(rows[2 * p], rows[2 * p + 1], k, lo[p], hi[p], da, db);
      if constexpr (F::kSigned) {
        alo[p] = _mm256_abs_epi8(lo[p]);
        ahi[p] = _mm256_abs_epi8(hi[p]);
      }
      s0[2 * p] = da.s0, s0[2 * p + 1] = db.s0;
      if constexpr (F::kTwo) s1[2 * p] = da.s1, s1[2 * p + 1] = db.s1;
      if constexpr (F::kMin) mn[2 * p] = da.mn, mn[2 * p + 1] = db.mn;
    }
    const __m256 s0v = _mm256_load_ps(s0);
    const __m256 s1v = F::kTwo ? _mm256_load_ps(s1) : _mm256_setzero_ps();
    const __m256 mnv = F::kMin ? _mm256_load_ps(mn) : _mm256_setzero_ps();
    for (int t = 0; t < N; ++t) {
      const int8_t* q = A.q_row(t) + 32 * k;
      __m256& a = chain[t][k & 1];
      a = block_step<F>(lo, hi, alo, ahi, half_at(q), half_at(q + 16), A.s16_row(t) + 2 * k, A.d_row(t)[k],
                        F::kMin ? A.sx_row(t)[k] : 0.0f, s0v, s1v, mnv, a);
    }
  }
  for (int t = 0; t < N; ++t) acc[2 * t] = chain[t][0], acc[2 * t + 1] = chain[t][1];
}

// ---------------------------------------------------------------------------
// K-quants: 256-element blocks, integer group scales. decode(b, r, S) writes
// row r's unsigned codes of the block (8 sub-blocks of 32), the int16 scale
// vector of each sub-block (int16 lane l of vpmaddubsw's output, elements
// 2l and 2l + 1, meets its group's scale) and d; Q4_K and Q5_K their mins as
// int16 (mv: [row a's 8 mins | row b's 8] per pair of rows), scaled by
// -dmin; Q6_K the coefficients -32 * scale of its 16 groups (cv), whose
// product with the sums of q is part of isum.
struct ScratchK {
  alignas(32) int8_t w[8][kRows][32];
  alignas(32) int8_t aw[8][kRows][32];  // |w| (IQ4_XS: signed table values, the sign trick)
  alignas(32) int16_t sc[8][kRows][16];
  alignas(32) int16_t mv[4][16];
  alignas(32) int16_t cv[kRows][16];
  alignas(32) float d[kRows], nmin[kRows];
};

struct FQ4_K {
  static constexpr bool kMin = true, kSigned = false;
  // The 6-bit scales and mins (unpacked with 32-bit masks), d and -dmin.
  static void scales(const uint8_t* b, int r, ScratchK& S) {
    uint32_t u[4];
    avx2::unpack_k_scales(b + 4, u);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));  // sc[0..7], m[0..7]
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(bytes));
    for (int j = 0; j < 8; ++j) {
      const __m256i pat = _mm256_set1_epi16((short)(0x0100 * (2 * j + 1) + 2 * j));
      _mm256_store_si256(reinterpret_cast<__m256i*>(S.sc[j][r]), _mm256_shuffle_epi8(sc16, pat));
    }
    _mm_store_si128(reinterpret_cast<__m128i*>(&S.mv[r / 2][8 * (r % 2)]), _mm_cvtepu8_epi16(_mm_srli_si128(bytes, 8)));
    const __m128 dm = avx2::load_f16x2(b);
    S.d[r] = _mm_cvtss_f32(dm);
    S.nmin[r] = -_mm_cvtss_f32(_mm_movehdup_ps(dm));
  }
  static void decode(const uint8_t* b, int r, ScratchK& S) {
    scales(b, r, S);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * c));
      _mm256_store_si256(reinterpret_cast<__m256i*>(S.w[2 * c][r]), _mm256_and_si256(raw, m4));
      _mm256_store_si256(reinterpret_cast<__m256i*>(S.w[2 * c + 1][r]),
                         _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
    }
  }
};
// Q5_K: Q4_K's scales and mins, codes 0..31 (the fifth bit from qh, bit j
// of byte i for element i of sub-block j).
struct FQ5_K {
  static constexpr bool kMin = true, kSigned = false;
  static void decode(const uint8_t* b, int r, ScratchK& S) {
    FQ4_K::scales(b, r, S);
    const __m256i m4 = _mm256_set1_epi8(0x0f), b16 = _mm256_set1_epi8(0x10);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    auto high = [&](int j) {  // 16 where bit j of the element's qh byte is set
      const __m256i bit = _mm256_set1_epi8((char)(1 << j));
      return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), b16);
    };
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 48 + 32 * c));
      _mm256_store_si256(reinterpret_cast<__m256i*>(S.w[2 * c][r]), _mm256_or_si256(_mm256_and_si256(raw, m4), high(2 * c)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(S.w[2 * c + 1][r]),
                         _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), high(2 * c + 1)));
    }
  }
};
// IQ4_XS: signed table values (the sign trick), signed 6-bit scales per 32,
// no offset or min (its cv stays zero).
struct FIQ4_XS {
  static constexpr bool kMin = false, kSigned = true;
  static void decode(const uint8_t* b, int r, ScratchK& S) {
    uint16_t sh;
    std::memcpy(&sh, b + 2, 2);
    for (int j = 0; j < 8; ++j) {
      const int ls = (((b[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | (((sh >> (2 * j)) & 3) << 4)) - 32;
      _mm256_store_si256(reinterpret_cast<__m256i*>(S.sc[j][r]), _mm256_set1_epi16((short)ls));
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(S.cv[r]), _mm256_setzero_si256());
    const __m256i m4 = _mm256_set1_epi8(0x0f), tab = iq4nl_table();
    for (int c = 0; c < 4; ++c) {
      // Sub-blocks 2c and 2c + 1: 16 bytes each, low nibbles first.
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 8 + 32 * c));
      const __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      const __m256i w0 = _mm256_shuffle_epi8(tab, _mm256_permute2x128_si256(lo, hi, 0x20));
      const __m256i w1 = _mm256_shuffle_epi8(tab, _mm256_permute2x128_si256(lo, hi, 0x31));
      _mm256_store_si256(reinterpret_cast<__m256i*>(S.w[2 * c][r]), w0);
      _mm256_store_si256(reinterpret_cast<__m256i*>(S.w[2 * c + 1][r]), w1);
      _mm256_store_si256(reinterpret_cast<__m256i*>(S.aw[2 * c][r]), _mm256_abs_epi8(w0));
      _mm256_store_si256(reinterpret_cast<__m256i*>(S.aw[2 * c + 1][r]), _mm256_abs_epi8(w1));
    }
    S.d[r] = f16_at(b);
  }
};
struct FQ6_K {
  static constexpr bool kMin = false, kSigned = false;
  static void decode(const uint8_t* b, int r, ScratchK& S) {
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(S.cv[r]), _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc, 5)));
    // Sub-block sb: lanes 0..7 get scale 2sb, lanes 8..15 scale 2sb + 1.
    const __m256i half0 = _mm256_permute4x64_epi64(sc, 0x44), half1 = _mm256_permute4x64_epi64(sc, 0xee);
    for (int sb = 0; sb < 8; ++sb) {
      const int w0 = 2 * (sb % 4), w1 = w0 + 1;
      const __m256i pat = _mm256_setr_m128i(_mm_set1_epi16((short)(0x0100 * (2 * w0 + 1) + 2 * w0)),
                                            _mm_set1_epi16((short)(0x0100 * (2 * w1 + 1) + 2 * w1)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(S.sc[sb][r]), _mm256_shuffle_epi8(sb < 4 ? half0 : half1, pat));
    }
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      const __m256i c0 = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
      const __m256i c1 = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
      const __m256i c2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m2));
      const __m256i c3 =
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
      _mm256_store_si256(reinterpret_cast<__m256i*>(S.w[4 * h + 0][r]), c0);
      _mm256_store_si256(reinterpret_cast<__m256i*>(S.w[4 * h + 1][r]), c1);
      _mm256_store_si256(reinterpret_cast<__m256i*>(S.w[4 * h + 2][r]), c2);
      _mm256_store_si256(reinterpret_cast<__m256i*>(S.w[4 * h + 3][r]), c3);
    }
    S.d[r] = f16_at(b + 208);
  }
};

template <class F>
void fastk_group(const uint8_t* const rows[kRows], const uint8_t* const ahead[kRows], size_t block_bytes,
                 const Q8Acts& A, __m256* acc, ScratchK& S) {
  const __m256i ones = _mm256_set1_epi16(1);
  GroupAhead next(ahead, block_bytes * (size_t)A.nb, A.nb);
  for (int64_t k = 0; k < A.nb; ++k) {
    next.upto(k);
    for (int r = 0; r < kRows; ++r) {
      F::decode(rows[r] + k * block_bytes, r, S);
    }
    const __m256 dw = _mm256_load_ps(S.d);
    for (int64_t t = 0; t < A.n_x; ++t) {
      const int8_t* q = A.q_row(t) + 256 * k;
      const __m256i b16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(A.s16_row(t) + 16 * k));
      __m256i ia[kRows];
      for (int r = 0; r < kRows; ++r) {
        if constexpr (F::kMin)
          ia[r] = _mm256_setzero_si256();
        else  // the -32 offset: sum_g (-32 * sc_g) * (sum of q over group g)
          ia[r] = _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(S.cv[r])), b16);
      }
      for (int j = 0; j < 8; ++j) {
        const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * j));
        for (int r = 0; r < kRows; ++r) {
          const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(S.w[j][r]));
          __m256i p;
          if constexpr (F::kSigned)
            p = _mm256_maddubs_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(S.aw[j][r])),
                                     _mm256_sign_epi8(qv, wv));
          else
            p = _mm256_maddubs_epi16(wv, qv);
          ia[r] = _mm256_add_epi32(
              ia[r], _mm256_madd_epi16(p, _mm256_load_si256(reinterpret_cast<const __m256i*>(S.sc[j][r]))));
        }
      }
      const __m256i is = reduce8(ia);
      const __m256 dxv = _mm256_set1_ps(A.d_row(t)[k]);
      __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dw, dxv), acc[2 * t]);
      if constexpr (F::kMin) {
        // Sums of q over the 32-element groups, as int16 in both lanes.
        const __m256i s32 = _mm256_madd_epi16(b16, ones);  // [g0..g3 | g4..g7] as int32
        const __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
        const __m256i bb = _mm256_broadcastsi128_si256(p);
        __m256i mv[4];
        for (int pr = 0; pr < 4; ++pr)
          mv[pr] = _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(S.mv[pr])), bb);
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce_pairs(mv)), _mm256_mul_ps(_mm256_load_ps(S.nmin), dxv), a);
      }
      acc[2 * t] = a;
    }
  }
}

// Up to three inputs (below the register-blocked kernel's thresholds, so
// mostly one): each row's block is decoded in registers and met by the
// inputs at once, with no scratch (at one input the scratch's stores and
// reloads cost more than the products they feed). Per output the same
// integer sums and the same two float steps as fastk_group, so the same bits.
// Row r's block b of a K-quant against N inputs: ia[t] += its lane sums of
// sc_g * w * q (for Q6_K including the -32 offset term), into lanes whose
// total is the row's isum; mn (Q4_K) the row's eight mins as int16 lanes
// 0..7, zero above; d and -dmin.
struct KRow {
  __m256i mn;
  float d, nmin;
};

template <int N>
inline void q4k_row(const uint8_t* b, const int8_t* const q[N], __m256i ia[N], KRow& out) {
  uint32_t u[4];
  avx2::unpack_k_scales(b + 4, u);
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));  // sc[0..7], m[0..7]
  const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(bytes));
  out.mn = _mm256_zextsi128_si256(_mm_cvtepu8_epi16(_mm_srli_si128(bytes, 8)));
  const __m128 dm = avx2::load_f16x2(b);
  out.d = _mm_cvtss_f32(dm);
  out.nmin = -_mm_cvtss_f32(_mm_movehdup_ps(dm));
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  for (int t = 0; t < N; ++t) ia[t] = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * c));
    const __m256i w0 = _mm256_and_si256(raw, m4), w1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    const int j0 = 2 * c, j1 = 2 * c + 1;
    const __m256i s0 = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 * (2 * j0 + 1) + 2 * j0)));
    const __m256i s1 = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 * (2 * j1 + 1) + 2 * j1)));
    for (int t = 0; t < N; ++t) {
      const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[t] + 32 * j0));
      const __m256i q1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[t] + 32 * j1));
      ia[t] = _mm256_add_epi32(ia[t], _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(w0, q0), s0),
                                                       _mm256_madd_epi16(_mm256_maddubs_epi16(w1, q1), s1)));
    }
  }
}

template <int N>
inline void q6k_row(const uint8_t* b, const int8_t* const q[N], const __m256i b16[N], __m256i ia[N], KRow& out) {
  const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
  const __m256i cv = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc, 5));
  for (int t = 0; t < N; ++t) ia[t] = _mm256_madd_epi16(cv, b16[t]);  // the -32 offset term
  const __m256i halves[2] = {_mm256_permute4x64_epi64(sc, 0x44), _mm256_permute4x64_epi64(sc, 0xee)};
  const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x30);
  for (int h = 0; h < 2; ++h) {
    const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
    const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    const __m256i c[4] = {
        _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2)),
        _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m2)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2))};
    for (int u = 0; u < 4; ++u) {
      // Sub-block 4h + u: lanes 0..7 take scale 2u of this half, 8..15 scale 2u + 1.
      const int w0 = 2 * u, w1 = w0 + 1;
      const __m256i pat = _mm256_setr_m128i(_mm_set1_epi16((short)(0x0100 * (2 * w0 + 1) + 2 * w0)),
                                            _mm_set1_epi16((short)(0x0100 * (2 * w1 + 1) + 2 * w1)));
      const __m256i s = _mm256_shuffle_epi8(halves[h], pat);
      for (int t = 0; t < N; ++t) {
        const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[t] + 32 * (4 * h + u)));
        ia[t] = _mm256_add_epi32(ia[t], _mm256_madd_epi16(_mm256_maddubs_epi16(c[u], qv), s));
      }
    }
  }
  out.d = f16_at(b + 208);
}

template <class F, int N>
void fastk_few(const uint8_t* const rows[kRows], const uint8_t* const ahead[kRows], size_t block_bytes,
               const Q8Acts& A, __m256* acc) {
  static_assert(std::is_same_v<F, FQ4_K> || std::is_same_v<F, FQ6_K>);
  const __m256i ones = _mm256_set1_epi16(1);
  GroupAhead next(ahead, block_bytes * (size_t)A.nb, A.nb);
  for (int64_t k = 0; k < A.nb; ++k) {
    next.upto(k);
    const int8_t* q[N];
    __m256i b16[N], bb[N];
    for (int t = 0; t < N; ++t) {
      q[t] = A.q_row(t) + 256 * k;
      b16[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(A.s16_row(t) + 16 * k));
      if constexpr (F::kMin) {
        // Sums of q over the 32-element groups as int16, lanes 0..7 (and again above).
        const __m256i s32 = _mm256_madd_epi16(b16[t], ones);
        bb[t] = _mm256_broadcastsi128_si256(
            _mm_packs_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1)));
      }
    }
    __m256i ia[N][kRows], mv[N][kRows];
    alignas(32) float d[kRows], nmin[kRows];
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* b = rows[r] + k * block_bytes;
      __m256i row_ia[N];
      KRow kr;
      if constexpr (std::is_same_v<F, FQ4_K>)
        q4k_row<N>(b, q, row_ia, kr);
      else
        q6k_row<N>(b, q, b16, row_ia, kr);
      d[r] = kr.d;
      for (int t = 0; t < N; ++t) {
        ia[t][r] = row_ia[t];
        if constexpr (F::kMin) mv[t][r] = _mm256_madd_epi16(kr.mn, bb[t]);
      }
      if constexpr (F::kMin) nmin[r] = kr.nmin;
    }
    const __m256 dw = _mm256_load_ps(d);
    for (int t = 0; t < N; ++t) {
      const __m256 dxv = _mm256_set1_ps(A.d_row(t)[k]);
      __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(ia[t])), _mm256_mul_ps(dw, dxv), acc[2 * t]);
      if constexpr (F::kMin)
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(mv[t])), _mm256_mul_ps(_mm256_load_ps(nmin), dxv), a);
      acc[2 * t] = a;
    }
  }
}

// Rows [rb, re) in groups of eight; a last partial group repeats row rb in
// its missing places and stores only its valid outputs (each output's
// arithmetic is its own, so the padding changes nothing).
template <class Group>
void run_groups(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re, bool two_chains,
                Group&& group) {
  // Per input, two accumulators of the group's eight outputs (the second
  // used by the 32-element formats' odd blocks).
  struct alignas(32) Acc {
    float v[kRows];
  };
  thread_local std::vector<Acc> store;
  if (store.size() < (size_t)(2 * A.n_x)) store.resize((size_t)(2 * A.n_x));
  __m256* acc = reinterpret_cast<__m256*>(store.data());
  for (int64_t j0 = rb; j0 < re; j0 += kRows) {
    const int n = (int)std::min<int64_t>(kRows, re - j0);
    const uint8_t* rows[kRows];
    const uint8_t* ahead[kRows];
    for (int r = 0; r < kRows; ++r) {
      rows[r] = W.row(r < n ? j0 + r : rb);
      ahead[r] = W.row(std::min<int64_t>(j0 + 2 * kRows + r, re - 1));
    }
    for (int64_t t = 0; t < 2 * A.n_x; ++t) acc[t] = _mm256_setzero_ps();
    group(rows, ahead, acc);
    for (int64_t t = 0; t < A.n_x; ++t) {
      const __m256 y = two_chains ? _mm256_add_ps(acc[2 * t], acc[2 * t + 1]) : acc[2 * t];
      avx2::store_f32_first(Y + t * ldy + j0, y, n);
    }
  }
}

template <class F>
void fast32_rows(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  thread_local Scratch32 S;
  const size_t bytes = dtype_traits(W.type).block_bytes * 32 / (size_t)dtype_traits(W.type).block_size;
  run_groups(W, A, Y, ldy, rb, re, true, [&](const uint8_t* const* rows, const uint8_t* const* ahead, __m256* acc) {
    switch (A.n_x) {
      case 1: fast32_few<F, 1>(rows, ahead, bytes, A, acc); break;
      case 2: fast32_few<F, 2>(rows, ahead, bytes, A, acc); break;
      case 3: fast32_few<F, 3>(rows, ahead, bytes, A, acc); break;
      case 4: fast32_few<F, 4>(rows, ahead, bytes, A, acc); break;
      default: fast32_group<F>(rows, ahead, bytes, A, acc, S); break;
    }
  });
}

template <class F>
void fastk_rows(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  thread_local ScratchK S;
  const size_t bytes = dtype_traits(W.type).block_bytes;
  run_groups(W, A, Y, ldy, rb, re, false, [&](const uint8_t* const* rows, const uint8_t* const* ahead, __m256* acc) {
    if constexpr (std::is_same_v<F, FQ4_K> || std::is_same_v<F, FQ6_K>) {
      switch (A.n_x) {
        case 1: return fastk_few<F, 1>(rows, ahead, bytes, A, acc);
        case 2: return fastk_few<F, 2>(rows, ahead, bytes, A, acc);
        case 3: return fastk_few<F, 3>(rows, ahead, bytes, A, acc);
        default: break;
      }
    }
    fastk_group<F>(rows, ahead, bytes, A, acc, S);
  });
}

}  // namespace

namespace {

// The codes of a block of `block` values at x: round-to-nearest-even of x
// times idv (1 / d, as quantize_q8_acts_scalar computes it), as int8.
inline void q8_block_values(const float* x, int64_t block, __m256 idv, int8_t* q) {
  for (int64_t i = 0; i < block; i += 32) {
    __m256i qi[4];
    for (int u = 0; u < 4; ++u) qi[u] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * u), idv));
    // packs interleave 128-bit lanes; the permute restores element order.
    const __m256i w01 = _mm256_packs_epi32(qi[0], qi[1]), w23 = _mm256_packs_epi32(qi[2], qi[3]);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), b);
  }
}

// The eight sums of four of a 32-byte group of codes (lanes 0..3: elements
// 0..15, lanes 4..7: 16..31), by vpmaddubsw (1 * q) and vpmaddwd, in-lane.
inline __m256i q8_sums4(const int8_t* q) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), b), _mm256_set1_epi16(1));
}

// Block k of row t, one at a time (256-element blocks, and the 32-element
// blocks left after the groups of eight).
void q8_one_block(const float* x, int64_t block, int8_t* q, int16_t* s16, float& d_out, float& sx_out) {
  bool finite;
  const float amax = avx2::abs_max(x, block, finite);
  float d = amax / 127.0f;
  float id = d != 0.0f ? 1.0f / d : 0.0f;
  if (std::isinf(id)) d = id = 0.0f;
  if (!finite) {
    std::memset(q, 0, (size_t)block);
    std::memset(s16, 0, sizeof(int16_t) * (size_t)(block / 16));
    d_out = NAN;
    sx_out = NAN;  // NaN * 0
    return;
  }
  q8_block_values(x, block, _mm256_set1_ps(id), q);
  int32_t total = 0;
  for (int64_t i = 0; i < block; i += 32) {
    alignas(32) int32_t s4[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(s4), q8_sums4(q + i));
    const int32_t lo = (s4[0] + s4[1]) + (s4[2] + s4[3]), hi = (s4[4] + s4[5]) + (s4[6] + s4[7]);
    s16[i / 16] = (int16_t)lo;
    s16[i / 16 + 1] = (int16_t)hi;
    total += lo + hi;
  }
  d_out = d;
  sx_out = d * (float)total;
}

}  // namespace

// Same arithmetic as quantize_q8_acts_scalar (qmatmul_fast.cpp), vectorised.
// 32-element blocks go eight at a time: their scales and inverses are one
// vector division each (exactly rounded, as the scalar ones), and their sums
// of 16 come out of a tree of vphaddd over four blocks. Integer sums are
// exact in any order; everything else is the scalar code's operation.
void quantize_q8_acts_avx2(const float* X, int64_t n_x, int64_t cols, int64_t block, Q8Acts& A) {
  prepare_q8_acts(n_x, cols, block, A);
  const int64_t groups = block == 32 ? A.nb / 8 : 0;
  for (int64_t t = 0; t < n_x; ++t) {
    const float* xr = X + t * cols;
    int8_t* qr = A.q.data() + t * cols;
    int16_t* sr = A.s16.data() + t * cols / 16;
    float* dr = A.d.data() + t * A.nb;
    float* sxr = A.sx.data() + t * A.nb;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = 8 * g;
      alignas(32) float amax[8];
      int finite = 0;
      for (int b = 0; b < 8; ++b) {
        bool ok;
        amax[b] = avx2::abs_max(xr + 32 * (k0 + b), 32, ok);
        finite |= ok ? 1 << b : 0;
      }
      __m256 d, id;
      avx2::block_scales8(_mm256_load_ps(amax), 127.0f, d, id);
      alignas(32) float idb[8];
      _mm256_store_ps(idb, id);
      for (int b = 0; b < 8; ++b) q8_block_values(xr + 32 * (k0 + b), 32, _mm256_set1_ps(idb[b]), qr + 32 * (k0 + b));
      // Sums of 16 and totals, four blocks at a time: after two rounds of
      // vphaddd, lanes hold [A0..15, B0..15, C0..15, D0..15 | A16..31, ...].
      alignas(32) int32_t tot[8];
      for (int h = 0; h < 2; ++h) {
        const int8_t* q = qr + 32 * (k0 + 4 * h);
        const __m256i ab = _mm256_hadd_epi32(q8_sums4(q), q8_sums4(q + 32));
        const __m256i cd = _mm256_hadd_epi32(q8_sums4(q + 64), q8_sums4(q + 96));
        const __m256i s = _mm256_hadd_epi32(ab, cd);
        // [A lo, A hi, B lo, B hi, ...] as int16 (each sum of 16 fits).
        const __m256i pairs = _mm256_permutevar8x32_epi32(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(sr + 2 * (k0 + 4 * h)), p16);
        _mm_store_si128(reinterpret_cast<__m128i*>(tot + 4 * h),
                        _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1)));
      }
      const __m256 sx = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(tot))));
      _mm256_storeu_ps(dr + k0, d);
      _mm256_storeu_ps(sxr + k0, sx);
      if (finite != 0xff)  // blocks holding inf or NaN, as the scalar code leaves them
        for (int b = 0; b < 8; ++b)
          if (!(finite >> b & 1)) {
            std::memset(qr + 32 * (k0 + b), 0, 32);
            std::memset(sr + 2 * (k0 + b), 0, 4);
            dr[k0 + b] = NAN;
            sxr[k0 + b] = NAN;
          }
    }
    for (int64_t k = 8 * groups; k < A.nb; ++k)
      q8_one_block(xr + block * k, block, qr + block * k, sr + block * k / 16, dr[k], sxr[k]);
  }
}

void matmul_rows_fast_avx2(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  const IntKernelBuild& b = *active_int_build();  // the caller checked use_avx2()
  if (A.n_x >= fast_r8_min_inputs(W.type, b.vnni) && fast_r8_supports(W.type)) {
    (A.n_x <= kFastR8FewInputs ? b.fast_r8_few : b.fast_r8)(W, A, Y, ldy, rb, re);
    return;
  }
  switch (W.type) {
    case DType::Q4_0: fast32_rows<FQ4_0>(W, A, Y, ldy, rb, re); break;
    case DType::Q4_1: fast32_rows<FQ4_1>(W, A, Y, ldy, rb, re); break;
    case DType::Q5_0: fast32_rows<FQ5_0>(W, A, Y, ldy, rb, re); break;
    case DType::Q8_0: fast32_rows<FQ8_0>(W, A, Y, ldy, rb, re); break;
    case DType::MXFP4: fast32_rows<FMXFP4>(W, A, Y, ldy, rb, re); break;
    case DType::NVFP4: fast32_rows<FNVFP4>(W, A, Y, ldy, rb, re); break;
    case DType::INT4_G128: fast32_rows<FINT4_G128>(W, A, Y, ldy, rb, re); break;
    case DType::INT8_COL: fast32_rows<FINT8_COL>(W, A, Y, ldy, rb, re); break;
    case DType::IQ4_NL: fast32_rows<FIQ4_NL>(W, A, Y, ldy, rb, re); break;
    case DType::IQ4_XS: fastk_rows<FIQ4_XS>(W, A, Y, ldy, rb, re); break;
    case DType::Q5_K: fastk_rows<FQ5_K>(W, A, Y, ldy, rb, re); break;
    case DType::Q3_K: fast32_rows<FQ3_K>(W, A, Y, ldy, rb, re); break;
    case DType::Q4_K: fastk_rows<FQ4_K>(W, A, Y, ldy, rb, re); break;
    case DType::Q6_K: fastk_rows<FQ6_K>(W, A, Y, ldy, rb, re); break;
    default: kernel_missing("fast-mode AVX2", W.type);
  }
}

}  // namespace megakern
