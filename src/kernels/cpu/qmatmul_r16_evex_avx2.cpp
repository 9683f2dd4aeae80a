// The row-interleaved kernels of both numerics modes on weights packed as
// kernels/cpu/repack.h lays them out, with AVX-512 VNNI on 512-bit vectors:
// one vector element per weight row, sixteen rows at a time, so the exact
// integer sums come out of vpdpbusd already separated by row (no horizontal
// reduction) and the float steps run on sixteen rows at once. Compiled for
// AVX2 like every *_avx2.cpp, the kernels for AVX-512 as well, reached only
// on CPUs that report AVX512-VNNI (repack_enabled). Same bits as the scalar
// oracle of each mode:
//  * fast (qmatmul_fast.h): isum of block k = sum of w * q over its 32
//    values; acc[k % 2] = fma((float)isum, sc * dx, acc[k % 2]) (Q4_1: then
//    fma(mn, sx, acc[k % 2])); Y = acc0 + acc1.
//  * fast, Q4_K: per sub-block j the sixteen rows' S_j = sum of c * q
//    (c the nibble itself, no offset), isum = sum_j sc_j * S_j (vpmulld by
//    the bytes of scales widened), msum = sum_j m_j * sum(q over j) with
//    the inputs' sums split as 256 * hi + lo (hi signed, lo unsigned bytes,
//    vpdpbusd against the mins as bytes); acc = fma((float)isum, d * dx,
//    acc), then fma((float)msum, (-dmin) * dx, acc); one accumulator.
//  * fast, Q6_K: the same with 16-element groups and no mins (q6k_block).
//  * exact (qmatmul.h): lane L's sum over the lane's four columns, with
//    int16 inputs split as q = 256 * hi + lo (hi signed, lo unsigned bytes):
//    sum(w * q) = 256 * sum(w * hi) + sum(w * lo), both exact; the lanes'
//    float steps, pairs of sub-blocks summed from zero, Q4_1's mins once per
//    eight sub-blocks (lane l taking the l-th), and the final
//    ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
// vpdpbusd multiplies unsigned by signed bytes: the weights' unsigned codes
// c = w + off meet the signed inputs (less off times the inputs' sum), and
// the signed weights meet the unsigned low bytes.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/qmatmul_fast.h"
#include "kernels/cpu/repack.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")
// GCC 12 reports the AVX-512 intrinsics' own undefined-vector idiom.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace megakern {
namespace {

// Column of lane L's i-th value (repack.h).
constexpr int lane_col(int L, int i) { return i < 2 ? 2 * L + i : 16 + 2 * L + (i - 2); }

template <DType T>
constexpr int kOff = T == DType::Q4_0 ? 8 : T == DType::Q5_0 ? 16 : T == DType::Q4_1 ? 0 : 128;
template <DType T>
constexpr bool kMins = T == DType::Q4_1;

// Lane L of a block of the sixteen rows: the unsigned codes c = w + off.
template <DType T, int L>
inline __m512i lane_codes(const uint8_t* codes, const uint8_t* bits) {
  if constexpr (T == DType::Q8_0) {
    return _mm512_xor_si512(_mm512_loadu_si512(codes + 64 * L), _mm512_set1_epi8((char)0x80));
  } else {
    const __m512i raw = _mm512_loadu_si512(codes + 64 * (L & 3));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i c = L < 4 ? _mm512_and_si512(raw, m4) : _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
    if constexpr (T == DType::Q5_0) {
      // Bit L of each byte to bit 4 (a 16-bit shift moves no other byte's
      // bit into bit 4 of either byte), then (s & 0x10) | c.
      const __m512i hb = _mm512_loadu_si512(bits);
      const __m512i s = L <= 4 ? _mm512_slli_epi16(hb, 4 - L) : _mm512_srli_epi16(hb, L - 4);
      c = _mm512_ternarylogic_epi32(s, _mm512_set1_epi8(0x10), c, 0xEA);
    }
    return c;
  }
}

// The signed weights w = c - off of the same lane.
template <DType T, int L>
inline __m512i lane_weights(const uint8_t* codes, const __m512i c) {
  if constexpr (T == DType::Q8_0) {
    (void)c;
    return _mm512_loadu_si512(codes + 64 * L);
  } else {
    (void)codes;
    return _mm512_sub_epi8(c, _mm512_set1_epi8((char)kOff<T>));
  }
}

template <class F, int... L>
inline void for_lanes(F&& f, std::integer_sequence<int, L...>) {
  (f(std::integral_constant<int, L>{}), ...);
}
template <class F>
inline void for_lanes(F&& f) {
  for_lanes(std::forward<F>(f), std::make_integer_sequence<int, 8>{});
}

struct Group {
  const uint8_t* codes;
  const uint8_t* bits;
  const uint8_t* scales;
  const uint8_t* mins;
  size_t cb, hb;
  const uint8_t* c(int64_t k) const { return codes + (size_t)k * cb; }
  const uint8_t* h(int64_t k) const { return bits + (size_t)k * hb; }
  __m512 sc(int64_t k) const {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 32 * (size_t)k)));
  }
  __m512 mn(int64_t k) const {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mins + 32 * (size_t)k)));
  }
};

Group group_at(const MatView& W, int64_t g, int64_t nb) {
  Group G;
  G.cb = r16_code_bytes(W.type);
  G.hb = r16_bit_bytes(W.type);
  G.codes = W.packed + (size_t)g * r16_group_bytes(W.type, W.cols);
  G.bits = G.codes + (size_t)nb * G.cb;
  G.scales = G.bits + (size_t)nb * G.hb;
  G.mins = G.scales + (size_t)nb * r16_scale_bytes(W.type);
  return G;
}

// The group about kAheadBytes on (at least the next) is prefetched into L2
// while one is computed, in step with its blocks (a group is three runs of
// memory at once, more streams than the hardware prefetcher follows far
// enough ahead at one input). Into L2, not L1: a group of a wide matrix is
// larger than L1, and prefetching two groups ahead into L1 evicted the group
// being computed. bench_kernels BM_MatmulR16 / BM_MatmulFastDramR16, one
// input, one thread, 4096 columns, CPU time against the original layout
// (Zen 4, two alternated rounds): exact Q8_0 0.5-0.6x with L1 prefetches two
// groups ahead -> 1.1x with these, exact Q5_0 1.0x -> 1.4-1.8x, fast Q4_K
// 1.3-1.9x -> 1.8-2.7x.
constexpr size_t kAheadBytes = 128 * 1024;

class Ahead {
 public:
  Ahead(const MatView& W, int64_t g, int64_t g_end, int64_t nb) {
    const size_t gb = r16_group_bytes(W.type, W.cols);
    const int64_t dist = std::max<int64_t>(1, (int64_t)((kAheadBytes + gb - 1) / gb));
    if (g + dist >= g_end) return;
    next_ = base_ = reinterpret_cast<const char*>(W.packed) + (size_t)(g + dist) * gb;
    end_ = base_ + gb;
    per_block_ = gb / (size_t)nb + 1;
  }
  void upto(int64_t k) {
    if (next_ == nullptr) return;
    const char* u = std::min(end_, base_ + per_block_ * (size_t)(k + 1));
    for (; next_ < u; next_ += 64) _mm_prefetch(next_, _MM_HINT_T1);
  }

 private:
  const char* next_ = nullptr;
  const char* base_ = nullptr;
  const char* end_ = nullptr;
  size_t per_block_ = 0;
};

__mmask16 row_mask(int64_t r0, int64_t rb, int64_t re) {
  const int64_t lo = std::max<int64_t>(rb - r0, 0), hi = std::min<int64_t>(re - r0, kR16Rows);
  return (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

// ---- fast mode -------------------------------------------------------------

// Two tables derived from one quantisation of the inputs, remade only for
// another (Q8Acts::id); `remake` sizes them and says whether to fill them.
struct InputTables {
  std::vector<int32_t> a, b;
  uint64_t made = 0;
  bool remake(const Q8Acts& A, size_t na, size_t nb) {
    if (!remake_input_tables(made, A.id)) return false;
    a.resize(na);
    b.resize(nb);
    return true;
  }
};

// An input's values per lane: [nb][8] dwords (lane L's four bytes), and its
// blocks' sums of q.
struct FastInputs : InputTables {
  std::vector<int32_t>& lanes = a;
  std::vector<int32_t>& sums = b;
};

void fast_inputs(const Q8Acts& A, FastInputs& I) {
  if (!I.remake(A, (size_t)(A.n_x * A.nb * 8), (size_t)(A.n_x * A.nb))) return;
  for (int64_t t = 0; t < A.n_x; ++t)
    for (int64_t k = 0; k < A.nb; ++k) {
      // Lane L's columns 2L, 2L+1, 16+2L, 17+2L (lane_col): the L-th word of
      // the block's first half, then the L-th word of its second half.
      const int8_t* q = A.q_row(t) + 32 * k;
      const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
      const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16));
      int32_t* out = &I.lanes[(size_t)((t * A.nb + k) * 8)];
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_unpacklo_epi16(lo, hi));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 4), _mm_unpackhi_epi16(lo, hi));
      const int16_t* s16 = A.s16_row(t) + 2 * k;
      I.sums[(size_t)(t * A.nb + k)] = s16[0] + s16[1];
    }
  I.made = A.id;
}

template <DType T, int NT>
inline void fast_block(const Group& G, const Q8Acts& A, const FastInputs& I, int64_t t0, int64_t k, __m512 acc[NT]) {
  const int64_t nb = A.nb;
  __m512i c[8];
  for_lanes([&](auto L) { c[L] = lane_codes<T, L>(G.c(k), G.h(k)); });
  const __m512 sc = G.sc(k);
  for (int t = 0; t < NT; ++t) {
    const int64_t ti = t0 + t;
    const int32_t* ql = &I.lanes[(size_t)((ti * nb + k) * 8)];
    __m512i is = _mm512_set1_epi32(-kOff<T> * I.sums[(size_t)(ti * nb + k)]);
    for_lanes([&](auto L) { is = _mm512_dpbusd_epi32(is, c[L], _mm512_set1_epi32(ql[L])); });
    const __m512 s = _mm512_mul_ps(sc, _mm512_set1_ps(A.d_row(ti)[k]));
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), s, acc[t]);
    if constexpr (kMins<T>) acc[t] = _mm512_fmadd_ps(G.mn(k), _mm512_set1_ps(A.sx_row(ti)[k]), acc[t]);
  }
}

template <DType T, int NT>
void fast_group(const Group& G, Ahead& ahead, const Q8Acts& A, const FastInputs& I, int64_t t0, __m512 out[NT]) {
  const int64_t nb = A.nb;
  __m512 acc0[NT], acc1[NT];  // even and odd blocks
  for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 2 <= nb; k += 2) {
    ahead.upto(k + 1);
    fast_block<T, NT>(G, A, I, t0, k, acc0);
    fast_block<T, NT>(G, A, I, t0, k + 1, acc1);
  }
  if (k < nb) {
    ahead.upto(k);
    fast_block<T, NT>(G, A, I, t0, k, acc0);
  }
  for (int t = 0; t < NT; ++t) out[t] = _mm512_add_ps(acc0[t], acc1[t]);
}

template <DType T>
void fast_rows(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  thread_local FastInputs I;
  fast_inputs(A, I);
  const int64_t g_end = (re + kR16Rows - 1) / kR16Rows;
  for (int64_t g = rb / kR16Rows; g * kR16Rows < re; ++g) {
    const Group G = group_at(W, g, A.nb);
    const __mmask16 m = row_mask(g * kR16Rows, rb, re);
    int64_t t = 0;
    auto run = [&](auto nt) {
      constexpr int NT = decltype(nt)::value;
      __m512 out[NT];
      Ahead ahead(W, g, t == 0 ? g_end : 0, A.nb);  // the first pass over the group prefetches
      fast_group<T, NT>(G, ahead, A, I, t, out);
      for (int u = 0; u < NT; ++u) _mm512_mask_storeu_ps(Y + (t + u) * ldy + g * kR16Rows, m, out[u]);
      t += NT;
    };
    for (; t + 4 <= A.n_x;) run(std::integral_constant<int, 4>{});
    if (A.n_x - t == 3) run(std::integral_constant<int, 3>{});
    if (A.n_x - t == 2) run(std::integral_constant<int, 2>{});
    if (A.n_x - t == 1) run(std::integral_constant<int, 1>{});
  }
}

// ---- fast mode, many inputs (prompts) --------------------------------------

// The 32-element formats for many inputs at once: a group's codes are
// decoded once per chunk of kManyChunk blocks into a buffer that every input
// then reads (fast_rows decodes them again for every four inputs), kManyNT
// inputs at a time against each block, their even- and odd-block
// accumulators kept in memory between chunks. Each output takes fast_block's
// operations in the same order (start at -off * sum, the eight vpdpbusd,
// then fma((float)isum, sc * dx, acc[k % 2]), Q4_1's fma(mn, sx, ...)), and
// Y = acc0 + acc1: the same bits as fast_rows and the scalar oracle.
constexpr int64_t kManyChunk = 16;  // blocks decoded at once (8 KiB of codes)
constexpr int kManyNT = 8;          // inputs per pass over a decoded block

// (Plain element vectors and unaligned loads: std::vector does not give
// vector types their 64-byte alignment here.)
struct ManyScratch {
  std::vector<uint8_t> codes;  // [kManyChunk][8 lanes][64]
  std::vector<float> sc, mn;   // [kManyChunk][16]
  std::vector<float> acc;      // [n_x][2][16]: even, odd blocks
  std::vector<int32_t> init;   // [n_x][nb]: -off * sum of the block's q
  uint64_t made = 0;
  const uint8_t* c(int64_t i) const { return codes.data() + 512 * i; }
  __m512 s(int64_t i) const { return _mm512_loadu_ps(sc.data() + 16 * i); }
  __m512 m(int64_t i) const { return _mm512_loadu_ps(mn.data() + 16 * i); }
  float* a(int64_t t, int h) { return acc.data() + 32 * t + 16 * h; }
};

template <DType T, int NT>
inline void many_block(const uint8_t* c8, const __m512 sc, const __m512 mn, const Q8Acts& A, const FastInputs& I,
                       const int32_t* init, int64_t t0, int64_t k, __m512* acc) {
  __m512i c[8];
  for (int L = 0; L < 8; ++L) c[L] = _mm512_loadu_si512(c8 + 64 * L);
  const int64_t nb = A.nb;
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
    const int64_t ti = t0 + t;
    const int32_t* ql = &I.lanes[(size_t)((ti * nb + k) * 8)];
    __m512i is = _mm512_set1_epi32(init[ti * nb + k]);
    for_lanes([&](auto L) { is = _mm512_dpbusd_epi32(is, c[L], _mm512_set1_epi32(ql[L])); });
    const __m512 s = _mm512_mul_ps(sc, _mm512_set1_ps(A.d_row(ti)[k]));
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), s, acc[t]);
    if constexpr (kMins<T>) acc[t] = _mm512_fmadd_ps(mn, _mm512_set1_ps(A.sx_row(ti)[k]), acc[t]);
  }
}

// Inputs t0 .. t0 + NT - 1 against the decoded blocks k0 .. k0 + kc - 1
// (k0 even), their accumulators loaded from and stored to S.acc.
template <DType T, int NT>
inline void many_pass(ManyScratch& S, const Q8Acts& A, const FastInputs& I, int64_t t0, int64_t k0, int64_t kc) {
  __m512 a0[NT], a1[NT];
  for (int t = 0; t < NT; ++t) {
    a0[t] = k0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(S.a(t0 + t, 0));
    a1[t] = k0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(S.a(t0 + t, 1));
  }
  const int32_t* init = S.init.data();
  int64_t c = 0;
  for (; c + 2 <= kc; c += 2) {
    many_block<T, NT>(S.c(c), S.s(c), S.m(c), A, I, init, t0, k0 + c, a0);
    many_block<T, NT>(S.c(c + 1), S.s(c + 1), S.m(c + 1), A, I, init, t0, k0 + c + 1, a1);
  }
  if (c < kc) many_block<T, NT>(S.c(c), S.s(c), S.m(c), A, I, init, t0, k0 + c, a0);
  for (int t = 0; t < NT; ++t) {
    _mm512_storeu_ps(S.a(t0 + t, 0), a0[t]);
    _mm512_storeu_ps(S.a(t0 + t, 1), a1[t]);
  }
}

template <DType T>
void fast_rows_many(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  thread_local FastInputs I;
  thread_local ManyScratch S;
  fast_inputs(A, I);
  const int64_t nb = A.nb;
  if (remake_input_tables(S.made, A.id)) {
    S.init.resize((size_t)(A.n_x * nb));
    for (size_t i = 0; i < S.init.size(); ++i) S.init[i] = -kOff<T> * I.sums[i];
    S.made = A.id;
  }
  S.codes.resize((size_t)(512 * kManyChunk));
  S.sc.resize((size_t)(16 * kManyChunk));
  S.mn.resize((size_t)(16 * kManyChunk));
  S.acc.resize((size_t)(32 * A.n_x));
  const int64_t g_end = (re + kR16Rows - 1) / kR16Rows;
  for (int64_t g = rb / kR16Rows; g * kR16Rows < re; ++g) {
    const Group G = group_at(W, g, nb);
    const __mmask16 m = row_mask(g * kR16Rows, rb, re);
    Ahead ahead(W, g, g_end, nb);
    for (int64_t k0 = 0; k0 < nb; k0 += kManyChunk) {
      const int64_t kc = std::min(kManyChunk, nb - k0);
      ahead.upto(k0 + kc - 1);
      for (int64_t c = 0; c < kc; ++c) {
        uint8_t* dst = S.codes.data() + 512 * c;
        for_lanes([&](auto L) { _mm512_storeu_si512(dst + 64 * L, lane_codes<T, L>(G.c(k0 + c), G.h(k0 + c))); });
        _mm512_storeu_ps(S.sc.data() + 16 * c, G.sc(k0 + c));
        _mm512_storeu_ps(S.mn.data() + 16 * c, kMins<T> ? G.mn(k0 + c) : _mm512_setzero_ps());
      }
      int64_t t = 0;
      for (; t + kManyNT <= A.n_x; t += kManyNT) many_pass<T, kManyNT>(S, A, I, t, k0, kc);
      if (A.n_x - t >= 4) many_pass<T, 4>(S, A, I, t, k0, kc), t += 4;
      if (A.n_x - t >= 2) many_pass<T, 2>(S, A, I, t, k0, kc), t += 2;
      if (A.n_x - t >= 1) many_pass<T, 1>(S, A, I, t, k0, kc), t += 1;
    }
    for (int64_t t = 0; t < A.n_x; ++t)
      _mm512_mask_storeu_ps(Y + t * ldy + g * kR16Rows, m,
                            _mm512_add_ps(_mm512_loadu_ps(S.a(t, 0)), _mm512_loadu_ps(S.a(t, 1))));
  }
}

// ---- fast mode, Q4_K --------------------------------------------------------

// An input's per super-block sums of q over its eight sub-blocks, split as
// 256 * hi + lo: [nb][2] dwords of high (signed) bytes, sub-blocks 4v ..
// 4v + 3 in dword v, and the same of the low (unsigned) bytes.
struct Q4KInputs : InputTables {
  std::vector<int32_t>& hi = a;
  std::vector<int32_t>& lo = b;
};

void q4k_inputs(const Q8Acts& A, Q4KInputs& I) {
  if (!I.remake(A, (size_t)(A.n_x * A.nb * 2), (size_t)(A.n_x * A.nb * 2))) return;
  for (int64_t t = 0; t < A.n_x; ++t)
    for (int64_t k = 0; k < A.nb; ++k) {
      const int16_t* s16 = A.s16_row(t) + 16 * k;
      uint8_t h[8], l[8];
      for (int j = 0; j < 8; ++j) {
        const int v = s16[2 * j] + s16[2 * j + 1];
        h[j] = (uint8_t)(int8_t)((v - (v & 0xff)) / 256);  // floor(v / 256)
        l[j] = (uint8_t)(v & 0xff);
      }
      std::memcpy(&I.hi[(size_t)((t * A.nb + k) * 2)], h, 8);
      std::memcpy(&I.lo[(size_t)((t * A.nb + k) * 2)], l, 8);
    }
  I.made = A.id;
}

// A sub-block's sixteen rows' codes c[8] (lanes of four columns) against
// one input's 32 values q: the first 16 columns' sums added to s0, the
// last 16's to s1.
inline void half_dots(const __m512i c[8], const int8_t* q, __m512i& s0, __m512i& s1) {
  for_lanes([&](auto L) {
    int32_t v;
    std::memcpy(&v, q + 4 * L, 4);
    if constexpr (L < 4)
      s0 = _mm512_dpbusd_epi32(s0, c[L], _mm512_set1_epi32(v));
    else
      s1 = _mm512_dpbusd_epi32(s1, c[L], _mm512_set1_epi32(v));
  });
}

template <int NT>
inline void q4k_block(const uint8_t* codes, const uint8_t* scales, const uint8_t* mins, const Q8Acts& A,
                      const Q4KInputs& I, int64_t t0, int64_t k, __m512 acc[NT]) {
  __m512i isum[NT];
  for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
  for (int j = 0; j < 8; ++j) {
    __m512i c[8];
    for_lanes([&](auto L) { c[L] = lane_codes<DType::Q4_0, L>(codes + 256 * j, nullptr); });
    const __m512i sc =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 2 * kR16Rows + 16 * j)));
    for (int t = 0; t < NT; ++t) {
      const int8_t* q = A.q_row(t0 + t) + 256 * k + 32 * j;
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      half_dots(c, q, s0, s1);
      isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), sc));
    }
  }
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales)));
  const __m512 nmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mins)));
  const __m512i m0 = _mm512_loadu_si512(mins + 2 * kR16Rows), m1 = _mm512_loadu_si512(mins + 2 * kR16Rows + 64);
  for (int t = 0; t < NT; ++t) {
    const int64_t ti = t0 + t;
    const size_t at = (size_t)((ti * A.nb + k) * 2);
    __m512i ms = _mm512_dpbusd_epi32(_mm512_setzero_si512(), m0, _mm512_set1_epi32(I.hi[at]));
    ms = _mm512_slli_epi32(_mm512_dpbusd_epi32(ms, m1, _mm512_set1_epi32(I.hi[at + 1])), 8);
    ms = _mm512_dpbusd_epi32(ms, _mm512_set1_epi32(I.lo[at]), m0);
    ms = _mm512_dpbusd_epi32(ms, _mm512_set1_epi32(I.lo[at + 1]), m1);
    const __m512 dx = _mm512_set1_ps(A.d_row(ti)[k]);
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(d, dx), acc[t]);
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(nmin, dx), acc[t]);
  }
}

// The K-quants' packed rows: per group, super-block by super-block, one
// accumulator per input; block(G, k, t0, acc, nt) adds super-block k of
// inputs t0 .. t0 + nt - 1 (nt an integral_constant).
template <class Block>
void k_rows(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re, Block&& block) {
  const int64_t g_end = (re + kR16Rows - 1) / kR16Rows;
  for (int64_t g = rb / kR16Rows; g * kR16Rows < re; ++g) {
    const Group G = group_at(W, g, A.nb);
    const __mmask16 m = row_mask(g * kR16Rows, rb, re);
    int64_t t = 0;
    auto run = [&](auto nt) {
      constexpr int NT = decltype(nt)::value;
      __m512 acc[NT];
      for (int u = 0; u < NT; ++u) acc[u] = _mm512_setzero_ps();
      Ahead ahead(W, g, t == 0 ? g_end : 0, A.nb);  // the first pass over the group prefetches
      for (int64_t k = 0; k < A.nb; ++k) {
        ahead.upto(k);
        block(G, k, t, acc, nt);
      }
      for (int u = 0; u < NT; ++u) _mm512_mask_storeu_ps(Y + (t + u) * ldy + g * kR16Rows, m, acc[u]);
      t += NT;
    };
    for (; t + 4 <= A.n_x;) run(std::integral_constant<int, 4>{});
    if (A.n_x - t == 3) run(std::integral_constant<int, 3>{});
    if (A.n_x - t == 2) run(std::integral_constant<int, 2>{});
    if (A.n_x - t == 1) run(std::integral_constant<int, 1>{});
  }
}

void q4k_rows(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  thread_local Q4KInputs I;
  q4k_inputs(A, I);
  const size_t sb = r16_scale_bytes(W.type), mb = r16_min_bytes(W.type);
  k_rows(W, A, Y, ldy, rb, re, [&](const Group& G, int64_t k, int64_t t0, __m512* acc, auto nt) {
    q4k_block<decltype(nt)::value>(G.c(k), G.scales + (size_t)k * sb, G.mins + (size_t)k * mb, A, I, t0, k, acc);
  });
}

// ---- fast mode, Q6_K --------------------------------------------------------

// Super-block k: per sub-block j the sixteen rows' codes c = w + 32 (the
// nibble lanes of Q4_K with the two high bits of lane L at bits 2 (L % 4)
// of vector L / 4 of the sub-block's bits), the 16-element groups 2j (lanes
// 0-3) and 2j + 1 (lanes 4-7) summed apart from -32 times the inputs' sums
// over the group (Q8Acts::s16): S_g = sum of w * q, exactly; isum = sum_g
// sc_g * S_g (vpmulld by the signed scales widened); acc = fma((float)isum,
// d * dx, acc).
template <int NT>
inline void q6k_block(const Group& G, const Q8Acts& A, int64_t t0, int64_t k, __m512 acc[NT]) {
  const uint8_t* codes = G.c(k);
  const uint8_t* bits = G.h(k);
  const uint8_t* scales = G.scales + (size_t)k * r16_scale_bytes(DType::Q6_K);
  __m512i isum[NT];
  for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
  const __m512i m30 = _mm512_set1_epi8(0x30);
  for (int j = 0; j < 8; ++j) {
    const __m512i hb0 = _mm512_loadu_si512(bits + 128 * j), hb1 = _mm512_loadu_si512(bits + 128 * j + 64);
    __m512i c[8];
    for_lanes([&](auto L) {
      const __m512i hb = L < 4 ? hb0 : hb1;
      constexpr int b = 2 * (L % 4);  // the lane's high bits, to bits 4-5 of each byte
      const __m512i s = b <= 4 ? _mm512_slli_epi16(hb, 4 - b) : _mm512_srli_epi16(hb, b - 4);
      c[L] = _mm512_ternarylogic_epi32(s, m30, lane_codes<DType::Q4_0, L>(codes + 256 * j, nullptr), 0xEA);
    });
    const __m512i sc0 = _mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 2 * kR16Rows + kR16Rows * (2 * j))));
    const __m512i sc1 = _mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 2 * kR16Rows + kR16Rows * (2 * j + 1))));
    for (int t = 0; t < NT; ++t) {
      const int8_t* q = A.q_row(t0 + t) + 256 * k + 32 * j;
      const int16_t* s16 = A.s16_row(t0 + t) + 16 * k + 2 * j;
      __m512i s0 = _mm512_set1_epi32(-32 * s16[0]), s1 = _mm512_set1_epi32(-32 * s16[1]);
      half_dots(c, q, s0, s1);
      isum[t] = _mm512_add_epi32(isum[t],
                                 _mm512_add_epi32(_mm512_mullo_epi32(s0, sc0), _mm512_mullo_epi32(s1, sc1)));
    }
  }
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales)));
  for (int t = 0; t < NT; ++t) {
    const __m512 dx = _mm512_set1_ps(A.d_row(t0 + t)[k]);
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(d, dx), acc[t]);
  }
}

void q6k_rows(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  k_rows(W, A, Y, ldy, rb, re, [&](const Group& G, int64_t k, int64_t t0, __m512* acc, auto nt) {
    q6k_block<decltype(nt)::value>(G, A, t0, k, acc);
  });
}

// ---- exact mode ------------------------------------------------------------

// An input's int16 values split per lane: [nb][8] dwords of high (signed)
// bytes and of low (unsigned) bytes, and -off times the sums of the high
// bytes (the format's offset).
struct ExactInputs {
  std::vector<int32_t> hi, lo, hsum;
  uint64_t made = 0;
  int off = 0;
};

void exact_inputs(const QuantizedActs& A, int off, ExactInputs& I) {
  if (I.off != off) I.made = 0;
  if (!remake_input_tables(I.made, A.id)) return;
  I.off = off;
  const size_t n = (size_t)(A.n_x * A.nb * 8);
  I.hi.resize(n);
  I.lo.resize(n);
  I.hsum.resize(n);
  for (int64_t t = 0; t < A.n_x; ++t)
    for (int64_t k = 0; k < A.nb; ++k) {
      const int16_t* q = A.q_row(t) + 32 * k;
      for (int L = 0; L < 8; ++L) {
        uint8_t h[4], l[4];
        int32_t s = 0;
        for (int i = 0; i < 4; ++i) {
          const int v = q[lane_col(L, i)];
          const int hv = (v - (v & 0xff)) / 256;  // floor(v / 256)
          h[i] = (uint8_t)(int8_t)hv;
          l[i] = (uint8_t)(v & 0xff);
          s += hv;
        }
        const size_t at = (size_t)((t * A.nb + k) * 8 + L);
        std::memcpy(&I.hi[at], h, 4);
        std::memcpy(&I.lo[at], l, 4);
        I.hsum[at] = -off * s;
      }
    }
  I.made = A.id;
}

// Lane L's exact integer sums of block k for input ti.
template <DType T, int L>
inline __m512i exact_lane(const Group& G, int64_t k, const ExactInputs& I, size_t at) {
  const __m512i c = lane_codes<T, L>(G.c(k), G.h(k));
  const __m512i w = lane_weights<T, L>(G.c(k), c);
  __m512i s = _mm512_dpbusd_epi32(_mm512_set1_epi32(I.hsum[at + L]), c, _mm512_set1_epi32(I.hi[at + L]));
  s = _mm512_slli_epi32(s, 8);
  return _mm512_dpbusd_epi32(s, _mm512_set1_epi32(I.lo[at + L]), w);
}

template <DType T, int NT>
void exact_group(const Group& G, Ahead& ahead, const QuantizedActs& A, const ExactInputs& I, int64_t t0, __m512 out[NT]) {
  const int64_t nb = A.nb;
  __m512 acc[NT][8];
  for (int t = 0; t < NT; ++t)
    for (int L = 0; L < 8; ++L) acc[t][L] = _mm512_setzero_ps();
  const __m512 zero = _mm512_setzero_ps();
  // The mins of sub-blocks k0 .. k0 + n - 1, lane l taking sub-block k0 + l
  // (qmatmul.h).
  auto group_mins = [&](int64_t k0, int64_t n) {
    for (int64_t l = 0; l < n; ++l) {
      const __m512 mn = G.mn(k0 + l);
      for (int t = 0; t < NT; ++t)
        acc[t][l] = _mm512_fmadd_ps(mn, _mm512_set1_ps(A.sum_row(t0 + t)[k0 + l]), acc[t][l]);
    }
  };
  (void)group_mins;
  int64_t k = 0;
  for (; k + 2 <= nb; k += 2) {
    ahead.upto(k + 1);
    const __m512 sc0 = G.sc(k), sc1 = G.sc(k + 1);
    __m512 s0[NT], s1[NT];
    size_t at0[NT], at1[NT];
    for (int t = 0; t < NT; ++t) {
      const int64_t ti = t0 + t;
      s0[t] = _mm512_mul_ps(sc0, _mm512_set1_ps(A.d_row(ti)[k]));
      s1[t] = _mm512_mul_ps(sc1, _mm512_set1_ps(A.d_row(ti)[k + 1]));
      at0[t] = (size_t)((ti * nb + k) * 8);
      at1[t] = at0[t] + 8;
    }
    for_lanes([&](auto L) {
      for (int t = 0; t < NT; ++t) {
        __m512 tmp = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact_lane<T, L>(G, k, I, at0[t])), s0[t], zero);
        tmp = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact_lane<T, L>(G, k + 1, I, at1[t])), s1[t], tmp);
        acc[t][L] = _mm512_add_ps(acc[t][L], tmp);
      }
    });
    if constexpr (kMins<T>)
      if ((k + 2) % 8 == 0) group_mins(k + 2 - 8, 8);
  }
  if (k < nb) {
    ahead.upto(k);
    const __m512 sc = G.sc(k);
    for (int t = 0; t < NT; ++t) {
      const int64_t ti = t0 + t;
      const __m512 s = _mm512_mul_ps(sc, _mm512_set1_ps(A.d_row(ti)[k]));
      const size_t at = (size_t)((ti * nb + k) * 8);
      for_lanes([&](auto L) {
        acc[t][L] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact_lane<T, L>(G, k, I, at)), s, acc[t][L]);
      });
    }
  }
  if constexpr (kMins<T>)
    if (nb % 8 != 0) group_mins(nb - nb % 8, nb % 8);
  for (int t = 0; t < NT; ++t) {
    const __m512* a = acc[t];
    out[t] = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                           _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])));
  }
}

template <DType T>
void exact_rows(const MatView& W, const QuantizedActs& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  thread_local ExactInputs I;
  exact_inputs(A, kOff<T>, I);
  const int64_t g_end = (re + kR16Rows - 1) / kR16Rows;
  for (int64_t g = rb / kR16Rows; g * kR16Rows < re; ++g) {
    const Group G = group_at(W, g, A.nb);
    const __mmask16 m = row_mask(g * kR16Rows, rb, re);
    int64_t t = 0;
    for (; t + 2 <= A.n_x; t += 2) {
      __m512 out[2];
      Ahead ahead(W, g, t == 0 ? g_end : 0, A.nb);
      exact_group<T, 2>(G, ahead, A, I, t, out);
      for (int u = 0; u < 2; ++u) _mm512_mask_storeu_ps(Y + (t + u) * ldy + g * kR16Rows, m, out[u]);
    }
    if (t < A.n_x) {
      __m512 out[1];
      Ahead ahead(W, g, t == 0 ? g_end : 0, A.nb);
      exact_group<T, 1>(G, ahead, A, I, t, out);
      _mm512_mask_storeu_ps(Y + t * ldy + g * kR16Rows, m, out[0]);
    }
  }
}

}  // namespace

void matmul_rows_fast_r16_evex(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re) {
  MK_CHECK(W.packed != nullptr && re <= W.rows / kR16Rows * kR16Rows && A.block == fast_act_block(W.type) &&
           A.cols == W.cols);
  const bool many = A.n_x >= r16_many_inputs();
  switch (W.type) {
    case DType::Q4_K: q4k_rows(W, A, Y, ldy, rb, re); break;
    case DType::Q6_K: q6k_rows(W, A, Y, ldy, rb, re); break;
    case DType::Q4_0: many ? fast_rows_many<DType::Q4_0>(W, A, Y, ldy, rb, re) : fast_rows<DType::Q4_0>(W, A, Y, ldy, rb, re); break;
    case DType::Q4_1: many ? fast_rows_many<DType::Q4_1>(W, A, Y, ldy, rb, re) : fast_rows<DType::Q4_1>(W, A, Y, ldy, rb, re); break;
    case DType::Q5_0: many ? fast_rows_many<DType::Q5_0>(W, A, Y, ldy, rb, re) : fast_rows<DType::Q5_0>(W, A, Y, ldy, rb, re); break;
    case DType::Q8_0: many ? fast_rows_many<DType::Q8_0>(W, A, Y, ldy, rb, re) : fast_rows<DType::Q8_0>(W, A, Y, ldy, rb, re); break;
    default: fail("packed fast kernel: no packed layout for {}", dtype_traits(W.type).name);
  }
}

void matmul_rows_i16_r16_evex(const MatView& W, const QuantizedActs& A, float* Y, int64_t ldy, int64_t rb,
                              int64_t re) {
  MK_CHECK(W.packed != nullptr && re <= W.rows / kR16Rows * kR16Rows && A.cols == W.cols);
  switch (W.type) {
    case DType::Q4_0: exact_rows<DType::Q4_0>(W, A, Y, ldy, rb, re); break;
    case DType::Q4_1: exact_rows<DType::Q4_1>(W, A, Y, ldy, rb, re); break;
    case DType::Q5_0: exact_rows<DType::Q5_0>(W, A, Y, ldy, rb, re); break;
    case DType::Q8_0: exact_rows<DType::Q8_0>(W, A, Y, ldy, rb, re); break;
    default: fail("packed exact kernel: no packed layout for {}", dtype_traits(W.type).name);
  }
}

}  // namespace megakern

#pragma GCC pop_options
