// Register-blocked f32 path for many inputs (see matmul_f32_tiled.h for the
// arithmetic it keeps). Compiled with -mavx2 -mfma -mf16c; reached only
// through use_avx2(). Every multiply-add is an explicit FMA intrinsic or
// std::fma, so the bits do not depend on the compiler's contraction choices.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/avx2_common.h"
#include "kernels/cpu/f32_decoders_avx2.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_f32_tiled.h"

namespace megakern {
namespace {

constexpr int kRows = 3;    // weight rows per register block
constexpr int kInputs = 4;  // inputs per register block
constexpr int kStep = kRows * 8;  // floats per packed step of a row group
constexpr size_t kPanelBytes = size_t{384} << 10;

// Row decoders: the reference dequantiser's floats (f32_decoders_avx2.h).
using F32D = f32_decode::F32W;
using F16D = f32_decode::F16W;
using BF16D = f32_decode::BF16W;
using FP8D = f32_decode::FP8W;

// The shape of one row length n: m32 32-element steps, g8 further 8-element
// steps (chain 0 only), then n - n8 scalar elements.
//
// Packed rows (weights, kRows per group) and packed inputs (kInputs per
// block) share one layout: a group holds chain 0, then chains 1, 2, 3; chain
// k's step s < m32 holds elements 32 s + 8 k .. 32 s + 8 k + 7 of each of the
// group's rows, 8 floats apiece, one row after the other; chain 0's steps
// m32 + u (u < g8) hold elements 32 m32 + 8 u ... So a chain is one
// contiguous stream for the weights and one for the inputs.
struct Shape {
  int64_t n, m32, g8, n8, steps;  // steps: 8-element steps per row (n8 / 8)
  explicit Shape(int64_t cols, bool any) : n(cols) {
    m32 = n / 32;
    g8 = any ? (n % 32) / 8 : 0;
    n8 = 32 * m32 + 8 * g8;
    steps = n8 / 8;
  }
  int64_t chain_steps(int k) const { return k == 0 ? m32 + g8 : m32; }
  // Offset of chain k inside a group of `slots` rows, in floats.
  int64_t chain_off(int k, int slots) const { return (k == 0 ? 0 : m32 + g8 + (k - 1) * m32) * slots * 8; }
};

// Rows rows[0..R) of W into the R slots of a packed group at dst: the
// stores run through the group in address order.
template <class F>
void pack_group(const uint8_t* const* rows, int R, const Shape& sh, float* dst) {
  __m256 v[kRows][4];
  for (int64_t m = 0; m < sh.m32; ++m) {
    for (int q = 0; q < R; ++q) F::load32(rows[q], 32 * m, v[q]);
    for (int k = 0; k < 4; ++k)
      for (int q = 0; q < R; ++q) _mm256_store_ps(dst + sh.chain_off(k, kRows) + m * kStep + 8 * q, v[q][k]);
  }
  if constexpr (F::kAny)
    for (int64_t u = 0; u < sh.g8; ++u)
      for (int q = 0; q < R; ++q) _mm256_store_ps(dst + (sh.m32 + u) * kStep + 8 * q, F::load8(rows[q], 32 * sh.m32 + 8 * u));
}

// Input x into slot q of a packed input block at dst.
void pack_input(const float* x, const Shape& sh, float* dst) {
  constexpr int64_t kXStep = kInputs * 8;
  int64_t off[4];
  for (int k = 0; k < 4; ++k) off[k] = sh.chain_off(k, kInputs);
  for (int64_t m = 0; m < sh.m32; ++m)
    for (int k = 0; k < 4; ++k) _mm256_store_ps(dst + off[k] + m * kXStep, _mm256_loadu_ps(x + 32 * m + 8 * k));
  for (int64_t u = 0; u < sh.g8; ++u) _mm256_store_ps(dst + (sh.m32 + u) * kXStep, _mm256_loadu_ps(x + 32 * sh.m32 + 8 * u));
}

// All n_x inputs, kInputs per block.
void pack_inputs(const float* X, int64_t n_x, const Shape& sh, float* dst) {
  const int64_t block_floats = sh.n8 * kInputs;
  if (sh.n8 > 0)
    for (int64_t t = 0; t < n_x; ++t) pack_input(X + t * sh.n, sh, dst + (t / kInputs) * block_floats + (t % kInputs) * 8);
}

// One chain for R rows x T inputs over `steps` packed steps: weights from pw
// (kRows slots a step), inputs from px (kInputs slots a step). Each
// accumulator is its own chain, in step order, as dot_f32_avx2 runs it.
// Results go to out[r * kInputs + t].
template <int R, int T>
void chain_block(const float* pw, const float* px, int64_t steps, __m256* out) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t s = 0; s < steps; ++s, pw += kStep, px += kInputs * 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm256_load_ps(pw + 8 * r);
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_load_ps(px + 8 * t);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) out[r * kInputs + t] = acc[r][t];
}

// chain_block for the first input block of a panel, decoding the weights as
// it goes: chain k of rows[0..R) is read from W (8 elements a step), stored
// packed at pw for the later blocks, and used at once. Formats with whole
// 32-element blocks only (FP8) are packed beforehand instead.
template <class F, int R, int T>
void chain_block_decode(const uint8_t* const* rows, const Shape& sh, int k, float* pw, const float* px, __m256* out) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  auto step = [&](int64_t col) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) {
      wv[r] = F::load8(rows[r], col);
      _mm256_store_ps(pw + 8 * r, wv[r]);
    }
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_load_ps(px + 8 * t);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
    pw += kStep;
    px += kInputs * 8;
  };
  for (int64_t m = 0; m < sh.m32; ++m) step(32 * m + 8 * k);
  if (k == 0)
    for (int64_t u = 0; u < sh.g8; ++u) step(32 * sh.m32 + 8 * u);
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) out[r * kInputs + t] = acc[r][t];
}

using DecodeFn = void (*)(const uint8_t* const*, const Shape&, int, float*, const float*, __m256*);
template <class F, int T>
constexpr DecodeFn decode_fn(int r) {
  return r == 1 ? chain_block_decode<F, 1, T> : r == 2 ? chain_block_decode<F, 2, T> : chain_block_decode<F, 3, T>;
}
template <class F>
DecodeFn pick_decode(int rows, int inputs) {
  switch (inputs) {
    case 1: return decode_fn<F, 1>(rows);
    case 2: return decode_fn<F, 2>(rows);
    case 3: return decode_fn<F, 3>(rows);
    default: return decode_fn<F, 4>(rows);
  }
}

using ChainFn = void (*)(const float*, const float*, int64_t, __m256*);
template <int T>
constexpr ChainFn chain_fn(int r) {
  return r == 1 ? chain_block<1, T> : r == 2 ? chain_block<2, T> : chain_block<3, T>;
}
ChainFn pick_chain(int rows, int inputs) {
  switch (inputs) {
    case 1: return chain_fn<1>(rows);
    case 2: return chain_fn<2>(rows);
    case 3: return chain_fn<3>(rows);
    default: return chain_fn<4>(rows);
  }
}

// 32-byte aligned thread-local float storage.
struct Scratch {
  std::vector<float> buf;
  float* get(size_t n) {
    if (buf.size() < n + 8) buf.resize(n + 8);
    auto p = reinterpret_cast<uintptr_t>(buf.data());
    return reinterpret_cast<float*>((p + 31) & ~uintptr_t{31});
  }
};

constexpr int64_t kSubGroups = 8;  // row groups sharing one pass over an input block's chain

template <class F>
void tiled_rows(const MatView& W, const float* X, int64_t n_x, float* Y, int64_t ldy, int64_t rb, int64_t re,
                const float* packed_x) {
  const Shape sh(W.cols, F::kAny);
  const int64_t n = W.cols;
  const int64_t group_floats = sh.n8 * kRows, block_floats = sh.n8 * kInputs;
  // Rows per panel: a multiple of kRows whose packed floats fit kPanelBytes.
  int64_t panel = std::max<int64_t>(kRows, (int64_t)(kPanelBytes / 4 / (size_t)std::max<int64_t>(sh.n8, 8)) / kRows * kRows);
  panel = std::min(panel, (re - rb + kRows - 1) / kRows * kRows);
  const int64_t n_blocks = (n_x + kInputs - 1) / kInputs;

  thread_local Scratch panel_buf, x_buf;
  float* pk = panel_buf.get((size_t)(panel / kRows * group_floats));
  // Partial chains of a sub-panel: [group][chain][row q][input t], one vector each.
  alignas(32) __m256 part[kSubGroups * 4 * kRows * kInputs];

  const float* xp = packed_x;
  if (xp == nullptr) {
    float* own = x_buf.get((size_t)(n_blocks * block_floats));
    pack_inputs(X, n_x, sh, own);
    xp = own;
  }

  const int64_t n_sub = (panel + kSubGroups * kRows - 1) / (kSubGroups * kRows);
  for (int64_t j0 = rb; j0 < re; j0 += panel) {
    const int64_t np = std::min(panel, re - j0);
    // F16 / BF16 / F32 rows are decoded by the first input block's pass.
    constexpr bool kDecodeInPass = F::kAny;
    if (!kDecodeInPass)
      for (int64_t p = 0; p < np; p += kRows) {
        const int R = (int)std::min<int64_t>(kRows, np - p);
        const uint8_t* rows[kRows];
        for (int q = 0; q < kRows; ++q) rows[q] = W.row(j0 + p + std::min(q, R - 1));
        pack_group<F>(rows, R, sh, pk + (p / kRows) * group_floats);
      }
    // The next panel's weights are fetched into L2 while this one is used, a
    // few lines per register block (not in bursts, which stall on the fill
    // buffers), so that packing it does not wait on memory.
    const uint8_t* pf = W.row(j0 + np);
    size_t pf_bytes = (size_t)std::min(panel, re - j0 - np) * W.row_bytes;
    if (j0 + np >= re) {  // the last panel: the rows the caller runs next, if it named them
      const WeightLookahead& next = weight_lookahead();
      if (next.begin == pf && next.end > next.begin)
        pf_bytes = std::min((size_t)(next.end - next.begin), (size_t)panel * W.row_bytes);
    }
    const size_t pf_step = (pf_bytes / (size_t)(n_blocks * n_sub * 4 * kSubGroups) + 64) & ~size_t{63};
    size_t pf_done = 0;

    for (int64_t b = 0; b < n_blocks; ++b) {
      const int64_t t0 = b * kInputs;
      const int nt = (int)std::min<int64_t>(kInputs, n_x - t0);
      const float* xb = xp + b * block_floats;
      for (int64_t p0 = 0; p0 < np; p0 += kSubGroups * kRows) {
        const int64_t sp = std::min(kSubGroups * kRows, np - p0);  // rows in this sub-panel
        const int64_t ng = (sp + kRows - 1) / kRows;
        // Chain by chain, so that the input block's chain stays in L1 while
        // the sub-panel's row groups go by.
        for (int k = 0; k < 4; ++k) {
          const float* xk = xb + sh.chain_off(k, kInputs);
          for (int64_t g = 0; g < ng; ++g) {
            for (const size_t end = std::min(pf_bytes, pf_done + pf_step); pf_done < end; pf_done += 64)
              _mm_prefetch(reinterpret_cast<const char*>(pf + pf_done), _MM_HINT_T1);
            const int rows = (int)std::min<int64_t>(kRows, sp - g * kRows);
            float* pw = pk + (p0 / kRows + g) * group_floats + sh.chain_off(k, kRows);
            __m256* out = part + (g * 4 + k) * (kRows * kInputs);
            if (kDecodeInPass && b == 0) {
              const uint8_t* rp[kRows];
              for (int q = 0; q < kRows; ++q) rp[q] = W.row(j0 + p0 + g * kRows + std::min(q, rows - 1));
              pick_decode<F>(rows, nt)(rp, sh, k, pw, xk, out);
            } else {
              pick_chain(rows, nt)(pw, xk, sh.chain_steps(k), out);
            }
          }
        }
        // Reduction and scalar tail exactly as dot_f32_avx2, eight rows at once.
        for (int64_t p = 0; p < sp; p += 8) {
          const int nr = (int)std::min<int64_t>(8, sp - p);
          for (int t = 0; t < nt; ++t) {
            __m256 v[8];
            for (int i = 0; i < 8; ++i) {
              const int64_t q = p + std::min(i, nr - 1);
              const __m256* pp = part + (q / kRows) * 4 * (kRows * kInputs) + (q % kRows) * kInputs + t;
              v[i] = _mm256_add_ps(_mm256_add_ps(pp[0], pp[kRows * kInputs]),
                                   _mm256_add_ps(pp[2 * kRows * kInputs], pp[3 * kRows * kInputs]));
            }
            float* y = Y + (t0 + t) * ldy + j0 + p0 + p;
            const __m256 h = avx2::hsum8(v);
            if (!F::kAny || sh.n8 == n) {
              avx2::store_f32_first(y, h, nr);
            } else {
              alignas(32) float r[8];
              _mm256_store_ps(r, h);
              const float* x = X + (t0 + t) * n;
              for (int i = 0; i < nr; ++i) {
                const uint8_t* row = W.row(j0 + p0 + p + i);
                for (int64_t ii = sh.n8; ii < n; ++ii) r[i] = std::fma(F::one(row, ii), x[ii], r[i]);
                y[i] = r[i];
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

int tiled_f32_layout(DType t) { return t == DType::FP8_E4M3 ? 2 : 1; }

void pack_tiled_f32_inputs(DType t, const float* X, int64_t n_x, int64_t cols, TiledF32Inputs& out) {
  const bool any = t != DType::FP8_E4M3;
  static_assert(F32D::kAny && F16D::kAny && BF16D::kAny && !FP8D::kAny);
  const Shape sh(cols, any);
  const size_t n = (size_t)((n_x + kInputs - 1) / kInputs * sh.n8 * kInputs);
  if (out.buf.size() < n + 8) out.buf.resize(n + 8);
  auto p = reinterpret_cast<uintptr_t>(out.buf.data());
  float* dst = reinterpret_cast<float*>((p + 31) & ~uintptr_t{31});
  pack_inputs(X, n_x, sh, dst);
  out.data = dst;
  out.n_x = n_x;
  out.cols = cols;
  out.any = any;
}

void matmul_rows_f32_tiled_avx2(const MatView& W, const float* X, int64_t n_x, float* Y, int64_t ldy, int64_t rb,
                                int64_t re, const TiledF32Inputs* packed) {
  if (n_x <= 0 || rb >= re) return;
  const float* px = nullptr;
  if (packed != nullptr) {
    MK_CHECK(packed->n_x == n_x && packed->cols == W.cols && packed->any == (W.type != DType::FP8_E4M3),
             "tiled f32 kernel: inputs packed for {} x {} (any {}), called with {} x {} of {}", packed->n_x,
             packed->cols, packed->any, n_x, W.cols, dtype_traits(W.type).name);
    px = packed->data;
  }
  switch (W.type) {
    case DType::F32: tiled_rows<F32D>(W, X, n_x, Y, ldy, rb, re, px); break;
    case DType::F16: tiled_rows<F16D>(W, X, n_x, Y, ldy, rb, re, px); break;
    case DType::BF16: tiled_rows<BF16D>(W, X, n_x, Y, ldy, rb, re, px); break;
    case DType::FP8_E4M3: tiled_rows<FP8D>(W, X, n_x, Y, ldy, rb, re, px); break;
    default: MK_CHECK(false, "the tiled f32 kernel does not take {} weights", dtype_traits(W.type).name);
  }
}

}  // namespace megakern
