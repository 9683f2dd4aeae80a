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
// Every fast-mode format is here: the 32-element formats' tiles, decoders
// and passes in qmatmul_fast_r8_32_body.h, the K-quants' in
// qmatmul_fast_r8_k_body.h, both included by this file, which holds the
// shared layout, the row driver and the dispatch. Signed 8-bit weights
// (Q8_0, INT8_COL, IQ4_NL) go as int16 through vpmaddwd instead
// (store_signed); with AVX-VNNI they stay bytes, met by the inputs as
// unsigned bytes q + 128 and a weight-only correction (finish_signed). NVFP4 and Q3_K (two scales per
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
#if MK_R8_VNNI
#include "kernels/cpu/vnni_ops.h"
#endif

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

using avx2::f16x8;

// ---------------------------------------------------------------------------
// The inputs of a pass, for the 32-element formats and the K-quants alike.
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

// ---------------------------------------------------------------------------
// 32-element formats.
#include "kernels/cpu/qmatmul_fast_r8_32_body.h"

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
        // The next two groups' rows (past the range's end, the rows the
        // caller runs next, when named: weight_lookahead()), a few lines per
        // block of this group's passes; each group is asked for twice, the
        // second time mostly from L1. With one group ahead, few inputs left
        // too little time for the lines to arrive (Zen 4, Gemma 3 270M fast
        // mode, 4 rows per step: 200 -> 245 tok/s).
        {
          const uint8_t* b = W.row(std::min(j0 + step, re));
          const uint8_t* e = W.row(std::min(j0 + 3 * step, re));
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
  thread_local std::vector<int16_t> q16;
  thread_local std::vector<uint8_t> u8;
  thread_local uint64_t made = 0;
  constexpr int kOffs = F::kTwo ? 2 : 1;
  const bool tables = remake_input_tables(made, A.id);
  if constexpr (F::kOffset != 0) if (tables) {
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
  if constexpr (F::kSigned) if (tables) {
    if (MK_R8_VNNI) {
      to_u8(A, u8);
    } else {
      if (q16.size() < (size_t)(A.n_x * A.cols)) q16.resize((size_t)(A.n_x * A.cols));
      for (int64_t t = 0; t < A.n_x; ++t)
        for (int64_t k = 0; k < A.nb; ++k) to_q16(A.q_row(t) + 32 * k, q16.data() + t * A.cols + 32 * k);
    }
  }
  made = A.id;
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
  thread_local std::vector<uint8_t> u8;
  thread_local uint64_t made = 0;
  const bool tables = remake_input_tables(made, A.id);
  if constexpr (F::kMin) if (tables) {
    if (sq.size() < (size_t)(A.n_x * A.nb * 8)) sq.resize((size_t)(A.n_x * A.nb * 8));
    for (int64_t t = 0; t < A.n_x; ++t) {
      const int16_t* s = A.s16_row(t);
      for (int64_t g = 0; g < A.nb * 8; ++g) sq[(size_t)(t * A.nb * 8 + g)] = (int16_t)(s[2 * g] + s[2 * g + 1]);
    }
  }
  if constexpr (F::kU8) if (tables) to_u8(A, u8);
  made = A.id;
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
