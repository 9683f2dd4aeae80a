// The AVX2 kernels of the int16-activation scheme (qmatmul.h; their
// arithmetic bit for bit), compiled twice: for AVX2 (qmatmul_avx2.cpp) and
// for AVX2 with AVX-VNNI (qmatmul_i16_vnni_avx2.cpp), whose lane sums use
// vpdpwssd (lane_sums). The including file defines MK_I16_VNNI (0 or 1) and
// MK_I16_ENTRY, the name of the entry point this body defines (declared in
// qmatmul.h). Every multiply-add that matters is an explicit FMA (intrinsic
// or std::fma); no mul+add pair is left for the compiler to contract or
// not, so the bits do not depend on inlining decisions.
//
// One thread, weights in L2, K = 1024, best of 10 (GMAC/s, AVX2 -> AVX-VNNI
// build): Q4_0 8 inputs 39.1-40.3 -> 42.0-42.5, 128 inputs (the decoded
// panel) 39.4-39.6 -> 43.3-44.7; Q8_0 38.4-39.5 -> 42.1-43.6; Q4_K 8
// inputs 27.6-28.6 -> 29.1-30.1 (before its mins went per 256-block: since,
// 3072 x 1024 from L3, VNNI build, 8 inputs 31-33, 128 inputs 39-40.5).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "kernels/cpu/format_kernels.h"
#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/qmatmul_i16_formats_avx2.h"
#if MK_I16_VNNI
#include "kernels/cpu/vnni_ops.h"
#endif

#ifndef MK_I16_ENTRY
#error "define MK_I16_ENTRY (and MK_I16_VNNI) before including qmatmul_i16_body.h"
#endif

namespace megakern {
namespace {


using avx2::hsum;
using namespace i16fmt;

// The eight lane sums of a sub-block (qmatmul.h): lane l of lo * xlo plus
// lane l of hi * xhi, each the sum of two int16 products, in exact int32
// (no sum reaches 2^24). With AVX-VNNI the second pair of products is added
// by vpdpwssd, one instruction instead of vpmaddwd and vpaddd: the same
// integers.
inline __m256i lane_sums(__m256i lo, __m256i xlo, __m256i hi, __m256i xhi) {
#if MK_I16_VNNI
  return MK_DPWSSD(_mm256_madd_epi16(lo, xlo), hi, xhi);
#else
  return _mm256_add_epi32(_mm256_madd_epi16(lo, xlo), _mm256_madd_epi16(hi, xhi));
#endif
}

// acc + the contribution of sub-block k (decoded in s) for input xq, with
// the scale products given: f0 = sc * dx (f1 = sc1 * dx, two-scale formats).
// x: the input's 32 int16 values of the sub-block. Mins are not included
// (group_mins).
template <class F>
inline __m256 contrib_at(const Sub& s, const int16_t* x, __m256 f0, __m256 f1, __m256 acc) {
  const __m256i xlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i xhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16));
  if constexpr (F::kTwoScales) {
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s.lo, xlo)), f0, acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s.hi, xhi)), f1, acc);
  } else {
    (void)f1;
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_sums(s.lo, xlo, s.hi, xhi)), f0, acc);
  }
  return acc;
}
template <class F>
inline __m256 contrib_f(const Sub& s, const int16_t* xq, int64_t k, __m256 f0, __m256 f1, __m256 acc) {
  return contrib_at<F>(s, xq + 32 * k, f0, f1, acc);
}

// The same, forming the scale products itself. kOne (a single input): sc * dx
// as one scalar multiplication, then broadcast; otherwise the broadcast sc is
// shared by the inputs and multiplied by each broadcast dx. Either way the
// same product.
template <class F, bool kOne>
inline __m256 contrib(const Sub& s, const int16_t* xq, const float* xd, int64_t k, __m256 acc) {
  auto factor = [&](float sc) {
    if constexpr (kOne) return _mm256_set1_ps(sc * xd[k]);
    return _mm256_mul_ps(_mm256_set1_ps(sc), _mm256_broadcast_ss(xd + k));
  };
  const __m256 f0 = factor(s.sc);
  if constexpr (F::kTwoScales) return contrib_f<F>(s, xq, k, f0, factor(s.sc1), acc);
  return contrib_f<F>(s, xq, k, f0, f0, acc);
}

// The mins of sub-blocks k0 .. k0 + n - 1 (a group of eight, or the row's
// last, shorter one, n < 8), mn (F::mins: zero past n), for inputs with
// sub-block sums sum[t]: acc[t] lane l += mn[l] * S of sub-block k0 + l
// (qmatmul.h). A shorter group's other lanes add nothing (zeros: the lanes
// are never -0, so adding +0 leaves them as they are).
template <int NT>
inline void group_mins(__m256 mn, const float* const* sum, int64_t k0, __m256* acc, int64_t n = 8) {
  if (n == 8) {
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(mn, _mm256_loadu_ps(sum[t] + k0), acc[t]);
    return;
  }
  // The first n sums, zero past them (a masked load: no read past the row).
  const __m256i first = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(mn, _mm256_maskload_ps(sum[t] + k0, first), acc[t]);
}

// The scale products of sub-block s for a group of up to eight inputs whose
// dx are dx8[0..8): f0[t] = sc * dx8[t] (f1[t] = sc1 * dx8[t], two-scale
// formats), the products contrib forms one input at a time.
template <class F>
inline void group_factors(const Sub& s, const float* dx8, float* f0, float* f1) {
  const __m256 dx = _mm256_loadu_ps(dx8);
  _mm256_store_ps(f0, _mm256_mul_ps(_mm256_set1_ps(s.sc), dx));
  if constexpr (F::kTwoScales) _mm256_store_ps(f1, _mm256_mul_ps(_mm256_set1_ps(s.sc1), dx));
  else (void)f1;
}

// Software prefetch for the row loops, kPrefetchBytes ahead in the row (and
// on into the next rows, which follow in memory), covering the bytes of
// sub-blocks k .. k + n - 1: with this many instructions per cache line,
// demand loads alone keep too few lines in flight to use the memory
// bandwidth. With several inputs only the first group of inputs over a tile
// prefetches (the later ones re-read the tile from L2): eight inputs, K =
// 1024, weights from memory, one thread: Q4_0 26.7 -> 30.2 GMAC/s, Q4_1
// 19.4 -> 24.2, Q8_0 21.8 -> 30.8, Q4_K 20.1 -> 22.5, Q6_K 23.0 -> 23.8.
constexpr int kPrefetchBytes = 1536;  // measured: 0.75-3 KiB all about as good
template <class F, int n>
inline void prefetch_ahead(const uint8_t* row, int64_t k) {
  constexpr int kSubs = F::kBlock / 32;
  constexpr int kSpan = n * F::kBytes / kSubs;
  const char* p = reinterpret_cast<const char*>(row) + (k * F::kBytes) / kSubs + kPrefetchBytes;
  for (int o = 0; o < kSpan; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

// Formats with their own row loops (i16_rows_q45k, i16_rows_q6k; the others
// take i16_row).
template <class F>
constexpr bool kOwnRowLoop = std::is_same_v<F, Q4_K> || std::is_same_v<F, Q5_K> || std::is_same_v<F, Q6_K>;

// Outputs (t0 .. t0+NT-1, j): one pass over weight row j. Sub-blocks go in
// pairs: each pair's contributions are summed into a fresh zero vector and
// that is added to the accumulator, which halves the accumulator's
// dependency chain; an odd last sub-block is added directly.
// With several inputs the scale products sc * dx of a sub-block are formed
// for all of them at once (one vector multiplication of the broadcast sc by
// the group's dx, dxg[8 k + t], stored and broadcast per input) rather than
// one multiplication per input: the same products, one fewer operation per
// input and sub-block on the multiply ports.
template <class F, int NT>
inline void i16_row(const uint8_t* row, const QuantizedActs& A, int64_t t0, float* Y, int64_t ldy, int64_t j,
                    bool pf, const float* dxg) {
  static_assert(!kOwnRowLoop<F>, "K-quants: their own row loops");
  __m256 acc[NT];
  const int16_t* xq[NT];
  const float* xd[NT];
  const float* sum[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm256_setzero_ps();
    xq[t] = A.q_row(t0 + t);
    xd[t] = A.d_row(t0 + t);
    sum[t] = A.sum_row(t0 + t);
  }
  const int64_t nsub = A.nb;
  int64_t k = 0, cur = -1;
  typename StateOf<F>::type st;
  if constexpr (NT == 1) {
    // Two pairs per iteration: the four sub-blocks' integer work is issued
    // ahead of the pairs' float chains (added to acc in order).
    for (; k + 4 <= nsub; k += 4) {
      prefetch_ahead<F, 4>(row, k);
      Sub sb[4];
      decode4<F>(row, k, cur, st, sb);
      __m256 pair0 = contrib<F, true>(sb[0], xq[0], xd[0], k, _mm256_setzero_ps());
      __m256 pair1 = contrib<F, true>(sb[2], xq[0], xd[0], k + 2, _mm256_setzero_ps());
      pair0 = contrib<F, true>(sb[1], xq[0], xd[0], k + 1, pair0);
      pair1 = contrib<F, true>(sb[3], xq[0], xd[0], k + 3, pair1);
      acc[0] = _mm256_add_ps(_mm256_add_ps(acc[0], pair0), pair1);
      if constexpr (kGroupMins<F>)
        if ((k + 4) % 8 == 0) group_mins<NT>(F::mins(row, k - 4), sum, k - 4, acc);
    }
  }
  for (; k + 2 <= nsub; k += 2) {
    if (NT == 1 || pf) prefetch_ahead<F, 2>(row, k);
    Sub s0, s1;
    decode_sub<F>(row, k, cur, st, s0);
    decode_sub<F>(row, k + 1, cur, st, s1);
    if constexpr (NT == 1) {
      __m256 tmp = contrib<F, true>(s0, xq[0], xd[0], k, _mm256_setzero_ps());
      tmp = contrib<F, true>(s1, xq[0], xd[0], k + 1, tmp);
      acc[0] = _mm256_add_ps(acc[0], tmp);
    } else {
      alignas(32) float f[4][8];  // [2 * sub-block of the pair + scale][input]
      group_factors<F>(s0, dxg + 8 * k, f[0], f[1]);
      group_factors<F>(s1, dxg + 8 * (k + 1), f[2], f[3]);
      for (int t = 0; t < NT; ++t) {
        __m256 tmp = contrib_f<F>(s0, xq[t], k, _mm256_broadcast_ss(&f[0][t]),
                                  _mm256_broadcast_ss(&f[F::kTwoScales ? 1 : 0][t]), _mm256_setzero_ps());
        tmp = contrib_f<F>(s1, xq[t], k + 1, _mm256_broadcast_ss(&f[2][t]),
                           _mm256_broadcast_ss(&f[F::kTwoScales ? 3 : 2][t]), tmp);
        acc[t] = _mm256_add_ps(acc[t], tmp);
      }
    }
    if constexpr (kGroupMins<F>)
      if ((k + 2) % 8 == 0) group_mins<NT>(F::mins(row, k - 6), sum, k - 6, acc);
  }
  if (k < nsub) {
    Sub s;
    decode_sub<F>(row, k, cur, st, s);
    if constexpr (NT == 1) {
      acc[0] = contrib<F, true>(s, xq[0], xd[0], k, acc[0]);
    } else {
      alignas(32) float f[2][8];
      group_factors<F>(s, dxg + 8 * k, f[0], f[1]);
      for (int t = 0; t < NT; ++t)
        acc[t] = contrib_f<F>(s, xq[t], k, _mm256_broadcast_ss(&f[0][t]),
                              _mm256_broadcast_ss(&f[F::kTwoScales ? 1 : 0][t]), acc[t]);
    }
  }
  if constexpr (kGroupMins<F>)
    if (nsub % 8 != 0) group_mins<NT>(F::mins(row, nsub - nsub % 8, nsub % 8), sum, nsub - nsub % 8, acc, nsub % 8);
  for (int t = 0; t < NT; ++t) Y[(t0 + t) * ldy + j] = hsum(acc[t]);
}

// One input against a Q4_K, Q5_K or Q6_K row, block by block: exactly the
// arithmetic and order of i16_row<F, 1> (sub-blocks in pairs summed into
// fresh vectors, each pair then added to the accumulator), with what the
// generic loop redoes per sub-block done once per 256-block: the scales (and
// Q4_K's mins) and their products with the inputs' scales are formed as
// vectors and broadcast from memory, and bytes that several sub-blocks share
// are loaded and widened once (Q4_K: the 32 bytes of a pair of sub-blocks;
// Q5_K: those and the fifth bits of all eight, in registers rather than
// through Q5_K::State's stored codes; Q6_K: the high bits of four and the
// low nibbles of two). The scale
// products are the same single multiplications, so the bits are those of
// i16_row<F, 1>.
inline __m256 k_contrib(__m256i lo, __m256i hi, const int16_t* xq, const float* fac, __m256 acc) {
  const __m256i xlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  const __m256i xhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 16));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_sums(lo, xlo, hi, xhi)), _mm256_broadcast_ss(fac), acc);
}

// Inputs t0 .. t0 + NT - 1's int16 values, block scales and sub-block sums.
template <int NT>
struct InputRows {
  const int16_t* q[NT];
  const float* d[NT];
  const float* sum[NT];
  InputRows(const QuantizedActs& A, int64_t t0) {
    for (int t = 0; t < NT; ++t) q[t] = A.q_row(t0 + t), d[t] = A.d_row(t0 + t), sum[t] = A.sum_row(t0 + t);
  }
};

// f.template operator()<I>() for I = 0 .. N - 1, in order (compile-time
// indices: sub-blocks of a half, halves of a block).
template <int N, class F>
inline void unrolled(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (f.template operator()<I>(), ...); }(std::make_integer_sequence<int, N>{});
}

// The order i16_row<F, 1> adds four sub-blocks u = 0..3 in: pairs (0, 1)
// and (2, 3), each summed into a fresh vector, then both added to acc.
template <class Sub>
inline __m256 four_subs(__m256 acc, Sub&& sub) {
  __m256 pair0 = sub.template operator()<0>(_mm256_setzero_ps());
  __m256 pair1 = sub.template operator()<2>(_mm256_setzero_ps());
  pair0 = sub.template operator()<1>(pair0);
  pair1 = sub.template operator()<3>(pair1);
  return _mm256_add_ps(_mm256_add_ps(acc, pair0), pair1);
}

// Q4_K, and Q5_K (kQ5: Q4_K's layout after 32 bytes of fifth bits, bit sb
// of each byte for sub-block sb), against inputs t0 .. t0 + NT - 1: each
// sub-block decoded once for all of them; the block's mins after its
// sub-blocks, lane l taking sub-block l (qmatmul.h).
template <bool kQ5, int NT>
void i16_rows_q45k(const uint8_t* row, const QuantizedActs& A, int64_t t0, float* Y, int64_t ldy, int64_t j,
                   bool pf) {
  using F = std::conditional_t<kQ5, Q5_K, Q4_K>;
  const InputRows<NT> in(A, t0);
  const int16_t* const* xq = in.q;
  const float* const* xd = in.d;
  __m256 acc[NT];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi16(0x0f), one = _mm256_set1_epi16(1);
  auto wide = [](const uint8_t* p) { return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); };
  Q4_K::State st;
  alignas(32) float fac[NT][8];
  for (int64_t bi = 0; bi < A.nb / 8; ++bi) {
    const uint8_t* b = row + bi * F::kBytes;
    Q4_K::prepare(b, st);
    const __m256 sc = _mm256_load_ps(st.sc);
    for (int t = 0; t < NT; ++t) _mm256_store_ps(fac[t], _mm256_mul_ps(sc, _mm256_loadu_ps(xd[t] + 8 * bi)));
    __m256i bits_lo = _mm256_setzero_si256(), bits_hi = bits_lo;  // Q5_K: fifth bits of elements 0..15, 16..31
    if constexpr (kQ5) bits_lo = wide(b + 16), bits_hi = wide(b + 32);
    auto half = [&]<int h>() {
      const int64_t k = 8 * bi + 4 * h;
      if (NT == 1 || pf) prefetch_ahead<F, 4>(row, k);
      const uint8_t* q = b + (kQ5 ? 48 : 16) + 64 * h;  // pairs (4h, 4h + 1) and (4h + 2, 4h + 3)
      const __m256i l0 = wide(q), h0 = wide(q + 16), l1 = wide(q + 32), h1 = wide(q + 48);
      // Sub-block 4h + u: low nibbles (u even) or high ones of pair u / 2
      // (Q5_K: and bit 4h + u of the fifth bits, as 16).
      __m256i lo[4], hi[4];
      auto codes = [&]<int u>() {
        const __m256i l = u / 2 ? l1 : l0, hh = u / 2 ? h1 : h0;
        lo[u] = u % 2 ? _mm256_srli_epi16(l, 4) : _mm256_and_si256(l, m4);
        hi[u] = u % 2 ? _mm256_srli_epi16(hh, 4) : _mm256_and_si256(hh, m4);
        if constexpr (kQ5) {
          constexpr int sb = 4 * h + u;
          lo[u] = _mm256_or_si256(lo[u], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bits_lo, sb), one), 4));
          hi[u] = _mm256_or_si256(hi[u], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bits_hi, sb), one), 4));
        }
      };
      unrolled<4>(codes);
      for (int t = 0; t < NT; ++t) {
        auto sub = [&]<int u>(__m256 a) { return k_contrib(lo[u], hi[u], xq[t] + 32 * (k + u), fac[t] + 4 * h + u, a); };
        acc[t] = four_subs(acc[t], sub);
      }
    };
    unrolled<2>(half);
    const __m256 mn = _mm256_load_ps(st.mn);
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(mn, _mm256_loadu_ps(in.sum[t] + 8 * bi), acc[t]);
  }
  for (int t = 0; t < NT; ++t) Y[(t0 + t) * ldy + j] = hsum(acc[t]);
}

// Q6_K against inputs t0 .. t0 + NT - 1: codes premultiplied by their
// 16-element scales, one scale d * dx per sub-block (qmatmul.h).
template <int NT>
void i16_rows_q6k(const uint8_t* row, const QuantizedActs& A, int64_t t0, float* Y, int64_t ldy, int64_t j,
                  bool pf) {
  const InputRows<NT> in(A, t0);
  const int16_t* const* xq = in.q;
  const float* const* xd = in.d;
  __m256 acc[NT];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3), c32 = _mm256_set1_epi8(32);
  alignas(32) float fac[NT][8];  // d times the input's scale, per sub-block
  alignas(32) int16_t isc[16];   // the block's 16-element scales
  for (int64_t bi = 0; bi < A.nb / 8; ++bi) {
    const uint8_t* b = row + bi * Q6_K::kBytes;
    const __m256 d = _mm256_set1_ps(avx2::load_f16(b + 208));
    _mm256_store_si256(reinterpret_cast<__m256i*>(isc),
                       _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192))));
    for (int t = 0; t < NT; ++t) _mm256_store_ps(fac[t], _mm256_mul_ps(d, _mm256_loadu_ps(xd[t] + 8 * bi)));
    auto half = [&]<int h>() {
      const int64_t k = 8 * bi + 4 * h;
      if (NT == 1 || pf) prefetch_ahead<Q6_K, 4>(row, k);
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      // Sub-block 4h + u: low nibbles of ql(u % 2) (high nibbles for u >= 2),
      // bits 2u, 2u + 1 of qh as bits 4, 5; minus 32; widened to int16 and
      // multiplied by the scales of its halves.
      __m256i lo[4], hi[4];
      auto codes = [&]<int u>() {
        const __m256i ql = u % 2 ? ql1 : ql0;
        const __m256i low = _mm256_and_si256(u >= 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * u), m2);
        const __m256i w = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), c32);
        constexpr int sc = 8 * h + 2 * u;  // avx2::q6k_scales
        lo[u] = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)), _mm256_set1_epi16(isc[sc]));
        hi[u] = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1)), _mm256_set1_epi16(isc[sc + 1]));
      };
      unrolled<4>(codes);
      for (int t = 0; t < NT; ++t) {
        auto sub = [&]<int u>(__m256 a) { return k_contrib(lo[u], hi[u], xq[t] + 32 * (k + u), fac[t] + 4 * h + u, a); };
        acc[t] = four_subs(acc[t], sub);
      }
    };
    unrolled<2>(half);
  }
  for (int t = 0; t < NT; ++t) Y[(t0 + t) * ldy + j] = hsum(acc[t]);
}

// One weight row against inputs t0 .. t0 + NT - 1: the K-quants' own loops
// above, the generic one otherwise (dxg: i16_row's, null for one input).
template <class F, int NT>
inline void i16_row_any(const uint8_t* row, const QuantizedActs& A, int64_t t0, float* Y, int64_t ldy, int64_t j,
                        bool pf, const float* dxg) {
  if constexpr (std::is_same_v<F, Q4_K>)
    i16_rows_q45k<false, NT>(row, A, t0, Y, ldy, j, pf);
  else if constexpr (std::is_same_v<F, Q5_K>)
    i16_rows_q45k<true, NT>(row, A, t0, Y, ldy, j, pf);
  else if constexpr (std::is_same_v<F, Q6_K>)
    i16_rows_q6k<NT>(row, A, t0, Y, ldy, j, pf);
  else
    i16_row<F, NT>(row, A, t0, Y, ldy, j, pf, dxg);
}

// Many inputs: a panel of weight rows is decoded once into int16 codes and
// scales (decode can cost more than the products it feeds: a Q4_K sub-block
// unpacks scales, mins and nibbles), then every group of eight inputs runs
// over the decoded panel from L2 with its activations in L1. Each output is
// computed with exactly i16_row's operations in i16_row's order.
struct Codes {
  __m256i lo, hi;
};
struct Panel {
  std::vector<Codes> codes;    // [row][sub-block]
  std::vector<float> scales;   // [row][sub-block][sc, sc1]
  std::vector<float> mins;     // kGroupMins: [row][group of 8][8], the mins again, zero-padded
};

// Sub-blocks rounded up to whole groups of eight (group_mins).
inline int64_t padded_subs(int64_t nb) { return (nb + 7) / 8 * 8; }

template <class F>
void decode_panel(const MatView& W, int64_t nb, int64_t jb, int64_t je, Panel& p) {
  const size_t n = (size_t)((je - jb) * nb);
  if (p.codes.size() < n) p.codes.resize(n);
  if (p.scales.size() < 2 * n) p.scales.resize(2 * n);
  if (kGroupMins<F> && p.mins.size() < (size_t)((je - jb) * padded_subs(nb))) p.mins.resize((size_t)((je - jb) * padded_subs(nb)));
  for (int64_t j = jb; j < je; ++j) {
    const uint8_t* row = W.row(j);
    int64_t cur = -1;
    typename StateOf<F>::type st;
    const size_t base = (size_t)((j - jb) * nb);
    for (int64_t k = 0; k < nb; ++k) {
      Sub s;
      s.sc1 = s.mn = 0.0f;
      decode_sub<F>(row, k, cur, st, s);
      p.codes[base + k] = Codes{s.lo, s.hi};
      float* sc = &p.scales[2 * (base + k)];
      sc[0] = s.sc;
      sc[1] = s.sc1;
      if constexpr (kGroupMins<F>) p.mins[(size_t)((j - jb) * padded_subs(nb) + k)] = s.mn;
    }
    if constexpr (kGroupMins<F>)
      for (int64_t k = nb; k < padded_subs(nb); ++k) p.mins[(size_t)((j - jb) * padded_subs(nb) + k)] = 0.0f;
  }
}

// Sub-block k of a decoded row: its codes (panel_row takes the scales from
// the scale products, fac, and the mins from the row's mins).
inline Sub panel_sub(const Codes* codes, int64_t k) {
  Sub s;
  s.lo = codes[k].lo;
  s.hi = codes[k].hi;
  return s;
}

// Scale products of one decoded row for the kGroup inputs t0 ..: fac[k][u]
// = sc_k * dx[t0+u][k] (and fac[k][kGroup+u] with sc1), from dxT = dx
// transposed ([k][t], padded so a whole group can always be read).
// Eight (rather than four) halve the scale products' share of the work: one
// thread, K = 1024, N = 3072, 128 inputs, best of 5 interleaved runs: Q4_0
// 31.2 -> 35.0 GMAC/s, Q4_K 24.6 -> 26.8, Q6_K 22.8 -> 24.7.
constexpr int kGroup = 8;  // inputs per pass over a decoded row (at most 8: one vector of dx)
template <class F>
inline void row_factors(const float* scales, const float* dxT, int64_t ldt, int64_t t0, int64_t kb, int64_t ke,
                        float* fac) {
  for (int64_t k = kb; k < ke; ++k) {
    const __m256 dx = _mm256_loadu_ps(dxT + k * ldt + t0);
    _mm256_storeu_ps(fac + 2 * kGroup * k, _mm256_mul_ps(_mm256_set1_ps(scales[2 * k]), dx));
    if constexpr (F::kTwoScales)
      _mm256_storeu_ps(fac + 2 * kGroup * k + kGroup, _mm256_mul_ps(_mm256_set1_ps(scales[2 * k + 1]), dx));
  }
}

// The inputs of a group of kGroup, interleaved for panel_row: sub-block k of
// input t of the group at xg + (k * kGroup + t) * 32; with sg (kGroupMins
// formats), the sub-block sums of group of eight g at sg + (g * kGroup + t)
// * 8, zero past the row's end. One pointer then reaches every input of the
// group (separate rows would need a register each, more than there are).
void group_inputs(const QuantizedActs& A, int64_t t0, int nt, int16_t* xg, float* sg) {
  for (int t = 0; t < nt; ++t) {
    const int16_t* q = A.q_row(t0 + t);
    for (int64_t k = 0; k < A.nb; ++k) std::memcpy(xg + (k * kGroup + t) * 32, q + 32 * k, 64);
    if (sg == nullptr) continue;
    for (int64_t k = 0; k < A.nb; ++k) sg[((k / 8) * kGroup + t) * 8 + k % 8] = A.sum_row(t0 + t)[k];
  }
}

// i16_row's NT > 1 loop over sub-blocks [kb, ke) of a decoded row, scale
// products from fac and the inputs grouped (group_inputs); for kGroupMins
// formats the mins of each group of eight after its sub-blocks (mins: the
// row's, zero-padded; sums: the inputs', grouped). The accumulators
// start at zero (kb = 0) or from state, and go back to state unless the row
// is finished (ke = nsub), when their sums are the outputs. kb is even, so
// the sub-blocks pair up as in one pass over the whole row.
template <class F, int NT>
inline void panel_row(const Codes* codes, const float* mins, const float* fac, const int16_t* xg, const float* sums,
                      int64_t kb, int64_t ke, int64_t nsub, float* state, int64_t t0, float* Y, int64_t ldy,
                      int64_t j) {
  auto add_group_mins = [&](int64_t g, __m256* acc) {  // zero-padded: a shorter last group as a whole one
    const __m256 mn = _mm256_loadu_ps(mins + 8 * g);
    const float* sb = sums + g * kGroup * 8;
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(mn, _mm256_loadu_ps(sb + 8 * t), acc[t]);
  };
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = kb == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(state + 8 * t);
  int64_t k = kb;
  for (; k + 2 <= ke; k += 2) {
    const Sub s0 = panel_sub(codes, k), s1 = panel_sub(codes, k + 1);
    const float* f0 = fac + 2 * kGroup * k;
    const float* f1 = f0 + 2 * kGroup;
    const int16_t* x0 = xg + k * kGroup * 32;
    for (int t = 0; t < NT; ++t) {
      __m256 tmp = contrib_at<F>(s0, x0 + 32 * t, _mm256_broadcast_ss(f0 + t), _mm256_broadcast_ss(f0 + kGroup + t),
                                 _mm256_setzero_ps());
      tmp = contrib_at<F>(s1, x0 + 32 * (kGroup + t), _mm256_broadcast_ss(f1 + t),
                          _mm256_broadcast_ss(f1 + kGroup + t), tmp);
      acc[t] = _mm256_add_ps(acc[t], tmp);
    }
    if constexpr (kGroupMins<F>)
      if ((k + 2) % 8 == 0) add_group_mins((k + 2) / 8 - 1, acc);
  }
  if (k < ke) {  // the row's odd last sub-block
    const Sub s = panel_sub(codes, k);
    const float* f = fac + 2 * kGroup * k;
    const int16_t* x0 = xg + k * kGroup * 32;
    for (int t = 0; t < NT; ++t)
      acc[t] = contrib_at<F>(s, x0 + 32 * t, _mm256_broadcast_ss(f + t), _mm256_broadcast_ss(f + kGroup + t), acc[t]);
  }
  if constexpr (kGroupMins<F>)
    if (ke == nsub && nsub % 8 != 0) add_group_mins(nsub / 8, acc);
  if (ke == nsub)
    for (int t = 0; t < NT; ++t) Y[(t0 + t) * ldy + j] = hsum(acc[t]);
  else
    for (int t = 0; t < NT; ++t) _mm256_storeu_ps(state + 8 * t, acc[t]);
}

// Inputs from which the decoded-panel path is taken: decoding once pays
// sooner where it is dear (IQ4_XS and Q3_K unpack scales and bits;
// measured: from 5 inputs; Q4_K, Q5_K and Q6_K: see below), and from 16 for the formats whose sub-blocks
// decode in a few instructions (at 8 inputs the panel's extra stores and
// loads cost more than a second decode). MEGAKERN_I16_PANEL_MIN overrides
// both, for A/B runs; results are the same bits either way.
template <class F>
int64_t panel_min_inputs() {
  static const long env = [] {
    const char* e = std::getenv("MEGAKERN_I16_PANEL_MIN");
    return e ? std::strtol(e, nullptr, 10) : 0L;
  }();
  if (env > 0) return env;
  // Q4_K, Q5_K and Q6_K have their own row loops (i16_rows_q45k,
  // i16_rows_q6k), faster than the panel up to 8 inputs (measured: 8 inputs,
  // one thread, 20-25 against 18-20 GMAC/s); the panel wins from 16.
  if constexpr (kOwnRowLoop<F>) return 9;
  constexpr bool dear = std::is_same_v<F, Q3_K> || std::is_same_v<F, IQ4_XS>;
  return dear ? 5 : 16;
}

template <class F>
void i16_rows_panel(const MatView& W, const QuantizedActs& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  thread_local Panel panel;
  thread_local std::vector<float> dxT, fac, sg;
  thread_local std::vector<int16_t> xg;
  // The inputs' transposed scales and grouped values depend on A alone:
  // made once per quantisation (A.id), not once per call (the megakernel
  // runs a product in chunks of rows, a call each).
  thread_local uint64_t made = 0;
  const int64_t nb = A.nb, ldt = A.n_x + kGroup;
  const int64_t n_groups = (A.n_x + kGroup - 1) / kGroup, group_subs = nb * kGroup;
  const int64_t sum_floats = padded_subs(nb) * kGroup;  // a group's sub-block sums (group_inputs)
  if (remake_input_tables(made, A.id)) {
    dxT.assign((size_t)(nb * ldt), 0.0f);
    for (int64_t t = 0; t < A.n_x; ++t)
      for (int64_t k = 0; k < nb; ++k) dxT[(size_t)(k * ldt + t)] = A.d_row(t)[k];
    xg.resize((size_t)(n_groups * group_subs * 32));
    if constexpr (kGroupMins<F>) sg.assign((size_t)(n_groups * sum_floats), 0.0f);
    for (int64_t g = 0; g < n_groups; ++g)
      group_inputs(A, g * kGroup, (int)std::min<int64_t>(kGroup, A.n_x - g * kGroup),
                   xg.data() + g * group_subs * 32, kGroupMins<F> ? sg.data() + g * sum_floats : nullptr);
    made = A.id;
  }
  fac.resize((size_t)(2 * kGroup * nb));
  // Rows per decoded panel: about 384 KiB of codes and scales. Every group's
  // inputs stream past each panel once, so fewer, larger panels read them
  // less often: 128 inputs, K = 5632, one thread, 128 -> 384 KiB: 35.0 /
  // 36.2 -> 37.4 / 39.1 GMAC/s (768 KiB: 38.5 / 37.4); K = 1024 and 3072
  // level.
  const int64_t rows = std::max<int64_t>(1, (int64_t)((384u << 10) / (size_t)(nb * 72)));
  // Sub-blocks per pass of a group over the panel's rows: a group's inputs
  // for 32 sub-blocks are 16 KiB of values, which stay in L1 while the rows
  // go by; whole rows of 3072 (96 sub-blocks) did not, and streamed them
  // from L2 once per row.
  const int64_t kc = nb <= 48 ? nb : 32;
  thread_local std::vector<float> state;  // [row of the panel][input of the group][lane]
  state.resize((size_t)(rows * kGroup * 8));
  for (int64_t jb = rb; jb < re; jb += rows) {
    const int64_t je = std::min(re, jb + rows);
    decode_panel<F>(W, nb, jb, je, panel);
    int64_t t0 = 0;
    auto run = [&]<int NT>() {
      const int16_t* x = xg.data() + (t0 / kGroup) * group_subs * 32;
      const float* sums = kGroupMins<F> ? sg.data() + (t0 / kGroup) * sum_floats : nullptr;
      for (int64_t kb = 0; kb < nb; kb += kc) {
        const int64_t ke = std::min(nb, kb + kc);
        for (int64_t j = jb; j < je; ++j) {
          const size_t base = (size_t)((j - jb) * nb);
          const float* sc = panel.scales.data() + 2 * base;
          row_factors<F>(sc, dxT.data(), ldt, t0, kb, ke, fac.data());
          const float* mins = kGroupMins<F> ? panel.mins.data() + (j - jb) * padded_subs(nb) : nullptr;
          panel_row<F, NT>(panel.codes.data() + base, mins, fac.data(), x, sums, kb, ke, nb,
                           state.data() + (j - jb) * kGroup * 8, t0, Y, ldy, j);
        }
      }
    };
    for (; t0 + kGroup <= A.n_x; t0 += kGroup) run.template operator()<kGroup>();
    switch (A.n_x - t0) {
      case 7: run.template operator()<7>(); break;
      case 6: run.template operator()<6>(); break;
      case 5: run.template operator()<5>(); break;
      case 4: run.template operator()<4>(); break;
      case 3: run.template operator()<3>(); break;
      case 2: run.template operator()<2>(); break;
      case 1: run.template operator()<1>(); break;
      default: break;
    }
  }
}

template <class F>
void i16_rows(const MatView& W, const QuantizedActs& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  if (A.n_x >= panel_min_inputs<F>()) return i16_rows_panel<F>(W, A, Y, ldy, rb, re);
  // Inputs per pass over a row: eight, so each sub-block is decoded once for
  // eight inputs (8 inputs, one thread, K = 1024, N = 3072, best of 4-8
  // interleaved runs, four -> eight: Q5_K 20.8 -> 22.3 GMAC/s, Q6_K 21.5 ->
  // 23.4, Q4_0 28.2 -> 30.9, Q4_1 23.9 -> 26.1, Q5_0 23.0 -> 26.2, IQ4_NL
  // 28.6 -> 30.0, Q8_0 31.7 -> 32.4). Q4_K measured level (24.2 against
  // 23.7) and keeps four.
  constexpr int G = std::is_same_v<F, Q4_K> ? 4 : 8;
  static_assert(kOwnRowLoop<F> || G == 8, "i16_row's groups of inputs start at multiples of 8 (dxg)");
  const int64_t tile = A.n_x <= 4 ? re - rb : avx2::tile_rows(W.row_bytes);
  // For i16_row with several inputs: their dx by group of eight (G = 8, so
  // every group starts at a multiple of 8), transposed, dxg[(t / 8) nb 8 +
  // 8 k + t % 8], zero past the last input.
  thread_local std::vector<float> dxg;
  thread_local uint64_t made = 0;  // the quantisation dxg was made from
  const bool grouped = !kOwnRowLoop<F> && A.n_x > 1;
  if (grouped && remake_input_tables(made, A.id)) {
    dxg.assign((size_t)((A.n_x + 7) / 8 * A.nb * 8), 0.0f);
    for (int64_t t = 0; t < A.n_x; ++t)
      for (int64_t k = 0; k < A.nb; ++k) dxg[(size_t)(((t / 8) * A.nb + k) * 8 + t % 8)] = A.d_row(t)[k];
    made = A.id;
  }
  auto group_dx = [&](int64_t t0) { return grouped ? dxg.data() + (t0 / 8) * A.nb * 8 : nullptr; };
  for (int64_t jb = rb; jb < re; jb += tile) {
    const int64_t je = std::min(re, jb + tile);
    int64_t t0 = 0;
    for (; t0 + G <= A.n_x; t0 += G)
      for (int64_t j = jb; j < je; ++j) i16_row_any<F, G>(W.row(j), A, t0, Y, ldy, j, t0 == 0, group_dx(t0));
    const int64_t rest = A.n_x - t0;
    if (rest == 0) continue;
    auto run = [&]<int NT>() {
      for (int64_t j = jb; j < je; ++j) i16_row_any<F, NT>(W.row(j), A, t0, Y, ldy, j, t0 == 0, group_dx(t0));
    };
    if constexpr (G == 8) {
      switch (rest) {
        case 7: run.template operator()<7>(); break;
        case 6: run.template operator()<6>(); break;
        case 5: run.template operator()<5>(); break;
        case 4: run.template operator()<4>(); break;
        default: break;
      }
      if (rest >= 4) continue;
    }
    switch (rest) {
      case 3: run.template operator()<3>(); break;
      case 2: run.template operator()<2>(); break;
      case 1: run.template operator()<1>(); break;
      default: break;
    }
  }
}

}  // namespace

void MK_I16_ENTRY(const MatView& W, const QuantizedActs& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  switch (W.type) {
    case DType::Q4_0: i16_rows<Q4_0>(W, A, Y, ldy, rb, re); break;
    case DType::Q4_1: i16_rows<Q4_1>(W, A, Y, ldy, rb, re); break;
    case DType::Q5_0: i16_rows<Q5_0>(W, A, Y, ldy, rb, re); break;
    case DType::Q8_0: i16_rows<Q8_0>(W, A, Y, ldy, rb, re); break;
    case DType::Q4_K: i16_rows<Q4_K>(W, A, Y, ldy, rb, re); break;
    case DType::Q6_K: i16_rows<Q6_K>(W, A, Y, ldy, rb, re); break;
    case DType::Q3_K: i16_rows<Q3_K>(W, A, Y, ldy, rb, re); break;
    case DType::Q5_K: i16_rows<Q5_K>(W, A, Y, ldy, rb, re); break;
    case DType::IQ4_NL: i16_rows<IQ4_NL>(W, A, Y, ldy, rb, re); break;
    case DType::IQ4_XS: i16_rows<IQ4_XS>(W, A, Y, ldy, rb, re); break;
    case DType::MXFP4: i16_rows<MXFP4>(W, A, Y, ldy, rb, re); break;
    case DType::NVFP4: i16_rows<NVFP4>(W, A, Y, ldy, rb, re); break;
    case DType::INT4_G128: i16_rows<INT4_G128>(W, A, Y, ldy, rb, re); break;
    case DType::INT8_COL: i16_rows<INT8_COL>(W, A, Y, ldy, rb, re); break;
    default: kernel_missing("exact-mode int16", W.type);
  }
}

}  // namespace megakern
