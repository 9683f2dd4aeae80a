// Tests of the matrix kernels (src/kernels/cpu/matmul.*, qmatmul*, and the
// scalar oracle in src/kernels/ref/i16_ref.*), for every weight format.
//
// What is checked, per format:
//  * bit-exactness of the AVX2 kernel against its scalar oracle: for the
//    int16-activation formats the oracle is matmul_rows_i16_ref (which is also
//    the portable path); for F32/F16/BF16/FP8_E4M3 it is dot_f32_avx2 over the
//    reference dequantiser's floats (the f32 path promises exactly that);
//  * accuracy against the exact (f64) product of the dequantised weights with
//    the f32 inputs, with the tolerance stated per scheme (see kTolerance);
//  * the executors' hard constraint: Y[t][j] is bit-identical whatever n_x
//    (1..64), whatever row range a call covers and whichever thread computes
//    it (memcmp), and repeated calls give the same bits;
//  * sizes with tails (rows not a multiple of anything, columns of one block
//    up to thousands, and non-multiples of 8/32 for the plain floats) and
//    misaligned weight and input pointers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "core/error.h"
#include "kernels/cpu/format_kernels.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/quant_rows.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec.h"
#include "kernels/ref/i16_ref.h"
#include "kernels/cpu/qmatmul_fast.h"
#include "weights_util.h"

namespace megakern {
namespace {

std::vector<DType> all_types() {
  size_t n = 0;
  const DType* p = all_dtypes(&n);
  return std::vector<DType>(p, p + n);
}

// Inputs at a float offset (so X is not 32-byte aligned), with varied scales
// per 32-block and a few outliers.
std::vector<float> make_inputs(int64_t n_x, int64_t cols, uint32_t seed, size_t offset) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x((size_t)(n_x * cols) + offset);
  for (int64_t i = 0; i < n_x * cols; ++i) {
    const float s = ((i / 32) % 3 == 0) ? 0.01f : 1.0f;
    x[offset + (size_t)i] = g(rng) * s * ((i % 97) == 5 ? 30.0f : 1.0f);
  }
  return x;
}

std::vector<int64_t> col_sizes(DType t) {
  const int64_t bs = dtype_traits(t).block_size;
  if (bs == 1) return {1, 7, 8, 31, 32, 33, 63, 100, 257, 1000};
  std::vector<int64_t> v;
  for (int64_t m : {1, 2, 3, 5, 8, 17}) v.push_back(m * bs);
  if (bs <= 64) v.push_back(4096 + bs);
  return v;
}

// Stated tolerance of Y[t][j] against sum_i deq[j][i] * x[t][i] in f64.
//  * f32 path (F32, F16, BF16, FP8_E4M3): only f32 rounding of the sum:
//    2 * (n/32 + 8) * 2^-24 * sum|w x| (each lane sums n/32 products, then a
//    fixed 8-way reduction and at most 7 tail additions).
//  * int16-activation formats: the inputs are rounded to the 32-block grid
//    dx = absmax/32767, an error of at most dx/2 per element, so
//    sum_i |w_i| * dx(i) / 2, plus the f32 rounding of scales and sums:
//    2 * (n/32 * 3 + 8) * 2^-24 * sum|w x| (a few roundings per block).
//    Relative to sum|w x| this is ~1e-5 for typical data (int8 activations
//    would be ~3e-3).
double tolerance(DType t, const float* w, const float* x, int64_t n) {
  double mag = 0;
  for (int64_t i = 0; i < n; ++i) mag += std::fabs((double)w[i] * x[i]);
  if (!uses_i16_acts(t)) return 2.0 * ((double)n / 32 + 8) * 0x1p-24 * mag + 1e-30;
  double q = 0;
  for (int64_t k = 0; k < n / 32; ++k) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * k + i]));
    const double dx = (double)amax / 32767.0;
    for (int i = 0; i < 32; ++i) q += std::fabs((double)w[32 * k + i]) * dx / 2;
  }
  return 1.0001 * q + 2.0 * ((double)n / 32 * 3 + 8) * 0x1p-24 * mag + 1e-30;
}

// Every output Y[s * ldy + j] within tolerance() of the f64 product of the
// reference dequantiser's row j of W and input s of X ([n_x][W.cols]).
void expect_near_f64_product(const MatView& W, const float* X, int64_t n_x, const float* Y, int64_t ldy) {
  std::vector<float> w((size_t)W.cols);
  for (int64_t j = 0; j < W.rows; ++j) {
    dtype_traits(W.type).dequantize(W.row(j), w.data(), W.cols);
    for (int64_t s = 0; s < n_x; ++s) {
      const float* x = X + s * W.cols;
      double exact = 0;
      for (int64_t i = 0; i < W.cols; ++i) exact += (double)w[(size_t)i] * x[i];
      EXPECT_NEAR(Y[(size_t)(s * ldy + j)], exact, tolerance(W.type, w.data(), x, W.cols)) << "row " << j << " input " << s;
    }
  }
}

// Raw random blocks keep every code and sub-block scale byte, but their
// f16 / f32 / e8m0 super-scales are set to sane values so no inf/NaN arises
// (NVFP4's scale bytes are all finite already).
void pin_block_scales(DType t, uint8_t* b, std::mt19937& rng) {
  auto put_f16 = [&](size_t at) {
    const uint16_t h = f32_to_f16(std::ldexp(1.0f + (float)(rng() % 1000) / 1000.0f, (int)(rng() % 10) - 8));
    std::memcpy(b + at, &h, 2);
  };
  switch (t) {
    case DType::Q4_0: case DType::Q8_0: case DType::Q5_0: case DType::INT4_G128: put_f16(0); break;
    case DType::Q4_1: case DType::Q4_K: case DType::Q5_K: put_f16(0); put_f16(2); break;
    case DType::Q6_K: put_f16(208); break;
    case DType::Q3_K: put_f16(108); break;
    case DType::IQ4_NL: case DType::IQ4_XS: put_f16(0); break;
    case DType::MXFP4: b[0] = (uint8_t)(100 + rng() % 55); break;
    case DType::INT8_COL: { const float d = 0.01f; std::memcpy(b, &d, 4); break; }
    default: break;
  }
}

// The many-row dot and axpy give exactly the bits of the one-row functions,
// for aligned and odd widths, strides and row counts (attention relies on it:
// the dense prompt pass and the executors must agree bit for bit).
TEST(VecRows, ManyRowsEqualOneRowAtATimeBitForBit) {
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.f, 1.f);
  for (int64_t n : {8, 24, 32, 64, 96, 128, 192, 256, 257, 320}) {
    for (int64_t rows : {1, 2, 3, 7, 64}) {
      const int64_t stride = n + 40;
      std::vector<float> a(static_cast<size_t>(n)), x(static_cast<size_t>(stride * rows)), w(static_cast<size_t>(rows));
      for (auto& v : a) v = g(rng);
      for (auto& v : x) v = g(rng);
      for (auto& v : w) v = g(rng);
      std::vector<float> got(static_cast<size_t>(rows)), y1(static_cast<size_t>(n), 0.5f), y2 = y1;
      dot_f32_rows(a.data(), x.data(), stride, rows, n, got.data());
      axpy_f32_rows(w.data(), x.data(), stride, rows, y1.data(), n);
      for (int64_t p = 0; p < rows; ++p) {
        const float want = dot_f32(a.data(), x.data() + p * stride, n);
        ASSERT_EQ(std::memcmp(&got[static_cast<size_t>(p)], &want, 4), 0) << "n " << n << " row " << p;
        axpy_f32(w[static_cast<size_t>(p)], x.data() + p * stride, y2.data(), n);
      }
      ASSERT_EQ(std::memcmp(y1.data(), y2.data(), 4 * static_cast<size_t>(n)), 0) << "n " << n << " rows " << rows;
    }
  }
}

// Two queries (or two weight vectors) against the same rows, as attention
// pairs the heads of a group: each output is the one-query function's, bit
// for bit (rows of 4 and the rest, the 32-multiple fast shapes and others;
// value sums in blocks of 48 and 32 elements and a tail).
TEST(VecRows, PairsEqualOneQueryAtATimeBitForBit) {
  std::mt19937 rng(12);
  std::normal_distribution<float> g(0.f, 1.f);
  for (int64_t n : {8, 37, 48, 64, 72, 80, 96, 128, 192, 256, 288}) {
    for (int64_t rows : {1, 3, 4, 5, 9, 33}) {
      const int64_t stride = n + 24;
      std::vector<float> a0(static_cast<size_t>(n)), a1(a0.size()), x(static_cast<size_t>(stride * rows)),
          w0(static_cast<size_t>(rows)), w1(w0.size());
      for (auto* v : {&a0, &a1, &x, &w0, &w1})
        for (auto& e : *v) e = g(rng);
      std::vector<float> o0(static_cast<size_t>(rows)), o1(o0.size()), r0(o0.size()), r1(o0.size());
      dot_f32_rows2(a0.data(), a1.data(), x.data(), stride, rows, n, o0.data(), o1.data());
      dot_f32_rows(a0.data(), x.data(), stride, rows, n, r0.data());
      dot_f32_rows(a1.data(), x.data(), stride, rows, n, r1.data());
      ASSERT_EQ(std::memcmp(o0.data(), r0.data(), 4 * o0.size()), 0) << "n " << n << " rows " << rows;
      ASSERT_EQ(std::memcmp(o1.data(), r1.data(), 4 * o1.size()), 0) << "n " << n << " rows " << rows;
      std::vector<float> y0(static_cast<size_t>(n), 0.25f), y1(y0.size(), -0.5f), z0 = y0, z1 = y1;
      axpy_f32_rows2(w0.data(), w1.data(), x.data(), stride, rows, y0.data(), y1.data(), n);
      axpy_f32_rows(w0.data(), x.data(), stride, rows, z0.data(), n);
      axpy_f32_rows(w1.data(), x.data(), stride, rows, z1.data(), n);
      ASSERT_EQ(std::memcmp(y0.data(), z0.data(), 4 * y0.size()), 0) << "n " << n << " rows " << rows;
      ASSERT_EQ(std::memcmp(y1.data(), z1.data(), 4 * y1.size()), 0) << "n " << n << " rows " << rows;
    }
  }
}

// Up to four softmaxes at once, of different lengths, each with the bits of
// softmax_inplace alone: tiny and huge spreads, -inf, NaN, equal values.
TEST(VecRows, SoftmaxRowsEqualOneRowAtATimeBitForBit) {
  std::mt19937 rng(13);
  std::normal_distribution<float> g(0.f, 30.f);
  const std::vector<std::vector<int64_t>> shapes = {{1}, {7, 9}, {33, 33, 33}, {64, 5, 129, 0}, {300, 301, 299, 302},
                                                    {8, 8, 8, 8}, {2, 40, 17, 1}};
  for (size_t si = 0; si < shapes.size(); ++si) {
    const auto& ns = shapes[si];
    std::vector<std::vector<float>> rows(ns.size()), want(ns.size());
    for (size_t r = 0; r < ns.size(); ++r) {
      rows[r].resize(static_cast<size_t>(ns[r]));
      for (auto& v : rows[r]) v = g(rng);
      if (si == 3 && r == 0) rows[r][3] = -INFINITY;
      if (si == 4 && r == 1) rows[r][100] = NAN;
      if (si == 5) std::fill(rows[r].begin(), rows[r].end(), r == 2 ? -0.0f : 1.5f);
      want[r] = rows[r];
      softmax_inplace(want[r].data(), ns[r]);
    }
    std::vector<float*> xs;
    for (auto& r : rows) xs.push_back(r.data());
    softmax_rows(xs.data(), ns.data(), static_cast<int>(ns.size()));
    for (size_t r = 0; r < ns.size(); ++r)
      if (!rows[r].empty())  // an empty vector's data() may be null, which memcmp may not take
        ASSERT_EQ(std::memcmp(rows[r].data(), want[r].data(), 4 * rows[r].size()), 0) << "shape " << si << " row " << r;
  }
}

TEST(Kernels, MatchOracleBitExactlyAndReferenceWithinTolerance) {
  int checked = 0;
  for (DType t : all_types()) {
    const DTypeTraits& tr = dtype_traits(t);
    SCOPED_TRACE(tr.name);
    for (int64_t cols : col_sizes(t)) {
      for (int64_t rows : {1, 5, 19}) {
        for (size_t wmis : {0u, 1u, 3u}) {
          const int64_t n_x = (rows * 7 + cols) % 6 + 1;
          const size_t xoff = (size_t)(wmis + 1) % 3;  // 0, 1 or 2 floats
          const Weights W = make_weights(t, rows, cols, (uint32_t)(cols * 13 + rows + wmis), wmis);
          const auto xbuf = make_inputs(n_x, cols, (uint32_t)(cols + rows * 3 + wmis), xoff);
          const float* X = xbuf.data() + xoff;
          std::vector<float> Y((size_t)(n_x * rows), -1.0f);
          matmul_rows(W.view, X, n_x, Y.data(), rows, 0, rows);

          // Oracle on this ISA.
          std::vector<float> O((size_t)(n_x * rows), -2.0f);
          if (uses_i16_acts(t)) {
            QuantizedActs A;
            quantize_acts(X, n_x, cols, A);
            matmul_rows_i16_ref(W.view, A, O.data(), rows, 0, rows);
          } else {
            for (int64_t j = 0; j < rows; ++j)
              for (int64_t s = 0; s < n_x; ++s)
                O[(size_t)(s * rows + j)] = dot_f32(&W.deq[(size_t)(j * cols)], X + s * cols, cols);
          }
          ASSERT_EQ(std::memcmp(Y.data(), O.data(), Y.size() * sizeof(float)), 0)
              << "cols=" << cols << " rows=" << rows << " misalign=" << wmis << " n_x=" << n_x;

          for (int64_t j = 0; j < rows; ++j) {
            for (int64_t s = 0; s < n_x; ++s) {
              const float* w = &W.deq[(size_t)(j * cols)];
              const float* x = X + s * cols;
              double exact = 0;
              for (int64_t i = 0; i < cols; ++i) exact += (double)w[i] * x[i];
              ASSERT_NEAR((double)Y[(size_t)(s * rows + j)], exact, tolerance(t, w, x, cols))
                  << "cols=" << cols << " row=" << j << " input=" << s;
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 300);
}

// Long rows through the decoded panel (many inputs), which takes a group of
// inputs over a row in several passes of sub-blocks with the accumulators
// kept in between: every output equals the one-input kernel's bit for bit
// (rows of an odd and an even number of 32-element sub-blocks, input counts
// that leave partial groups).
TEST(Kernels, PanelOverLongRowsEqualsOneInputAtATime) {
  for (DType t : all_types()) {
    const DTypeTraits& tr = dtype_traits(t);
    if (!uses_i16_acts(t)) continue;
    SCOPED_TRACE(tr.name);
    const int64_t block = std::max<int64_t>(tr.block_size, 32);
    for (int64_t subs : {int64_t{97}, int64_t{112}}) {
      const int64_t cols = (32 * subs + block - 1) / block * block;
      const int64_t rows = 11;
      const Weights W = make_weights(t, rows, cols, 91, 0);
      for (int64_t n_x : {int64_t{19}, int64_t{24}}) {
        const auto xbuf = make_inputs(n_x, cols, 92, 0);
        std::vector<float> y((size_t)(n_x * rows), NAN), one((size_t)rows, NAN);
        matmul_rows(W.view, xbuf.data(), n_x, y.data(), rows, 0, rows);
        for (int64_t s = 0; s < n_x; ++s) {
          matmul_rows(W.view, xbuf.data() + s * cols, 1, one.data(), rows, 0, rows);
          ASSERT_EQ(std::memcmp(&y[(size_t)(s * rows)], one.data(), (size_t)rows * sizeof(float)), 0)
              << "cols " << cols << " n_x " << n_x << " input " << s;
        }
      }
    }
  }
}

TEST(Kernels, OutputsDoNotDependOnBatchRowRangeOrThreads) {
  constexpr int64_t kMaxX = 64;
  ThreadPool pool1(1), pool2(2), pool3(3, /*oversubscribe=*/true);
  for (DType t : all_types()) {
    const DTypeTraits& tr = dtype_traits(t);
    SCOPED_TRACE(tr.name);
    const int64_t cols = tr.block_size == 1 ? 203 : std::max<int64_t>(tr.block_size, 32) * 3;
    const int64_t rows = 53;
    const Weights W = make_weights(t, rows, cols, 77, 1);
    const auto xbuf = make_inputs(kMaxX, cols, 78, 1);
    const float* X = xbuf.data() + 1;

    // Reference: all 64 inputs, all rows, one call.
    std::vector<float> full((size_t)(kMaxX * rows));
    matmul_rows(W.view, X, kMaxX, full.data(), rows, 0, rows);

    std::mt19937 rng(123);
    for (int64_t n_x = 1; n_x <= kMaxX; ++n_x) {
      // A window of n_x inputs starting at t0, over a random row range.
      const int64_t t0 = (int64_t)(rng() % (uint32_t)(kMaxX - n_x + 1));
      int64_t rb = (int64_t)(rng() % rows), re = (int64_t)(rng() % rows);
      if (rb > re) std::swap(rb, re);
      ++re;
      std::vector<float> y((size_t)(n_x * rows), NAN);
      matmul_rows(W.view, X + t0 * cols, n_x, y.data(), rows, rb, re);
      for (int64_t s = 0; s < n_x; ++s) {
        ASSERT_EQ(std::memcmp(&y[(size_t)(s * rows + rb)], &full[(size_t)((t0 + s) * rows + rb)],
                              (size_t)(re - rb) * sizeof(float)),
                  0)
            << "n_x=" << n_x << " t0=" << t0 << " rows [" << rb << "," << re << ") input " << s;
      }
      // The pooled version, with 1, 2 and 3 threads.
      for (ThreadPool* pool : {&pool1, &pool2, &pool3}) {
        std::vector<float> yp((size_t)(n_x * rows), NAN);
        matmul(*pool, W.view, X + t0 * cols, n_x, yp.data());
        for (int64_t s = 0; s < n_x; ++s) {
          ASSERT_EQ(std::memcmp(&yp[(size_t)(s * rows)], &full[(size_t)((t0 + s) * rows)], (size_t)rows * sizeof(float)),
                    0)
              << "pool of " << pool->size() << " n_x=" << n_x;
        }
      }
    }
    // Deterministic: again, same bits.
    std::vector<float> again((size_t)(kMaxX * rows));
    matmul_rows(W.view, X, kMaxX, again.data(), rows, 0, rows);
    EXPECT_EQ(std::memcmp(again.data(), full.data(), full.size() * sizeof(float)), 0);
  }
}

// Raw random block bytes (every code, every sub-block scale byte), with only
// the f16/f32/e8m0 super-scales pinned to sane values so no inf/NaN arises;
// the AVX2 kernel must still match its oracle bit for bit.
TEST(Kernels, RandomBitPatternsMatchOracle) {
  std::mt19937 rng(2024);
  for (DType t : all_types()) {
    if (!uses_i16_acts(t)) continue;
    const DTypeTraits& tr = dtype_traits(t);
    SCOPED_TRACE(tr.name);
    const int64_t cols = std::max<int64_t>(tr.block_size, 64) * 4, rows = 64;
    const size_t rb = row_bytes(t, cols);
    std::vector<uint8_t> buf(rb * rows + 1);
    for (auto& b : buf) b = (uint8_t)rng();
    uint8_t* base = buf.data() + 1;
    const int64_t nblk = rows * cols / tr.block_size;
    for (int64_t i = 0; i < nblk; ++i) {
      uint8_t* b = base + (size_t)i * tr.block_bytes;
      pin_block_scales(t, b, rng);
    }
    const MatView W{t, cols, rows, base, rb};
    const int64_t n_x = 5;
    const auto x = make_inputs(n_x, cols, 31, 0);
    std::vector<float> Y((size_t)(n_x * rows)), O((size_t)(n_x * rows));
    matmul_rows(W, x.data(), n_x, Y.data(), rows, 0, rows);
    QuantizedActs A;
    quantize_acts(x.data(), n_x, cols, A);
    matmul_rows_i16_ref(W, A, O.data(), rows, 0, rows);
    for (float v : O) ASSERT_TRUE(std::isfinite(v));
    EXPECT_EQ(std::memcmp(Y.data(), O.data(), Y.size() * sizeof(float)), 0);
    // And the oracle agrees with the reference dequantiser within tolerance.
    expect_near_f64_product(W, x.data(), n_x, O.data(), rows);
  }
}

// FP8 blocks from raw bytes: every non-NaN code, scale bytes across the
// whole range (including the e > 246 path of the AVX2 decoder), subnormal
// codes; the f32 path must equal dot_f32 over the reference dequantisation.
// Many inputs take the decoded-panel path (a panel of rows decoded once, then
// every group of four inputs): the oracle's bits at input counts on both
// sides of each format's switch, odd sub-block counts, several panels (long
// rows make panels of few rows), row ranges starting inside a panel, and
// misaligned weights and inputs.
TEST(Kernels, DecodedPanelPathMatchesOracle) {
  for (DType t : all_types()) {
    if (!uses_i16_acts(t)) continue;
    const DTypeTraits& tr = dtype_traits(t);
    SCOPED_TRACE(tr.name);
    const int64_t bs = std::max<int64_t>(tr.block_size, 32);
    for (const int64_t cols : {bs * 3, bs * ((4128 + bs - 1) / bs)}) {
      const int64_t rows = 29;
      const Weights W = make_weights(t, rows, cols, (uint32_t)(cols + 5), 3);
      for (const int64_t n_x : {5, 9, 16, 17, 33}) {
        const auto xbuf = make_inputs(n_x, cols, (uint32_t)(n_x * 7 + cols), 1);
        const float* X = xbuf.data() + 1;
        QuantizedActs A;
        quantize_acts(X, n_x, cols, A);
        std::vector<float> O((size_t)(n_x * rows));
        matmul_rows_i16_ref(W.view, A, O.data(), rows, 0, rows);
        for (const auto& [rb, re] : {std::pair<int64_t, int64_t>{0, rows}, {7, 26}, {13, 14}}) {
          std::vector<float> Y((size_t)(n_x * rows), NAN);
          matmul_rows(W.view, X, n_x, Y.data(), rows, rb, re);
          for (int64_t s = 0; s < n_x; ++s)
            ASSERT_EQ(std::memcmp(&Y[(size_t)(s * rows + rb)], &O[(size_t)(s * rows + rb)],
                                  (size_t)(re - rb) * sizeof(float)),
                      0)
                << "cols=" << cols << " n_x=" << n_x << " rows [" << rb << "," << re << ") input " << s;
        }
      }
    }
  }
}

TEST(Kernels, Fp8RawBlocksMatchReference) {
  std::mt19937 rng(99);
  const int64_t cols = 32 * 6, rows = 40;
  const size_t rb = row_bytes(DType::FP8_E4M3, cols);
  std::vector<uint8_t> buf(rb * rows);
  const uint8_t scales[] = {0, 1, 2, 60, 100, 127, 140, 200, 246, 247, 250, 254};
  for (int64_t blk = 0; blk < rows * cols / 32; ++blk) {
    uint8_t* b = buf.data() + blk * 33;
    b[0] = scales[(size_t)blk % std::size(scales)];
    for (int i = 1; i < 33; ++i) {
      uint8_t c = (uint8_t)rng();
      if ((c & 0x7f) == 0x7f) c = 0x05;       // no NaN here
      if (b[0] >= 240) c &= 0x9f;             // keep huge scales finite
      b[i] = c;
    }
  }
  const MatView W{DType::FP8_E4M3, cols, rows, buf.data(), rb};
  const auto x = make_inputs(3, cols, 5, 0);
  std::vector<float> Y(3 * rows), w((size_t)cols);
  matmul_rows(W, x.data(), 3, Y.data(), rows, 0, rows);
  for (int64_t j = 0; j < rows; ++j) {
    dtype_traits(DType::FP8_E4M3).dequantize(W.row(j), w.data(), cols);
    for (int64_t t = 0; t < 3; ++t) {
      const float o = dot_f32(w.data(), x.data() + t * cols, cols);
      EXPECT_EQ(std::memcmp(&Y[(size_t)(t * rows + j)], &o, 4), 0) << "row " << j << " input " << t;
    }
  }
  // A NaN code poisons its output.
  buf[5] = 0x7f;
  float y;
  matmul_rows(W, x.data(), 1, &y, 1, 0, 1);
  EXPECT_TRUE(std::isnan(y));
}

TEST(Kernels, EmptyCallsWriteNothing) {
  const Weights W = make_weights(DType::Q4_0, 4, 64, 1, 0);
  const auto x = make_inputs(2, 64, 2, 0);
  std::vector<float> y(8, 42.0f);
  matmul_rows(W.view, x.data(), 2, y.data(), 4, 2, 2);
  matmul_rows(W.view, x.data(), 0, y.data(), 4, 0, 4);
  for (float v : y) EXPECT_EQ(v, 42.0f);
}

TEST(Kernels, DequantizeRowMatchesReference) {
  for (DType t : all_types()) {
    const int64_t cols = std::max<int64_t>(dtype_traits(t).block_size, 32) * 4;
    const Weights W = make_weights(t, 3, cols, 5, 2);
    std::vector<float> d((size_t)cols);
    for (int64_t j = 0; j < 3; ++j) {
      dequantize_row(W.view, j, d.data());
      EXPECT_EQ(std::memcmp(d.data(), &W.deq[(size_t)(j * cols)], d.size() * sizeof(float)), 0)
          << dtype_traits(t).name;
    }
  }
}

// The AVX2 row decoders of the K-quant and IQ4 formats on raw random blocks
// (every quant and sub-block scale byte random, negative super-block scales
// included; only the f16 scales kept finite): the same floats as the
// reference dequantiser.
TEST(Kernels, DequantizeRowRandomBlocksMatchReference) {
  std::mt19937 rng(77);
  const std::pair<DType, std::vector<size_t>> cases[] = {
      {DType::Q3_K, {108}}, {DType::Q5_K, {0, 2}}, {DType::IQ4_NL, {0}}, {DType::IQ4_XS, {0}},
      {DType::Q4_K, {0, 2}}, {DType::Q6_K, {208}}};
  for (const auto& [t, f16_at] : cases) {
    const DTypeTraits& tr = dtype_traits(t);
    SCOPED_TRACE(tr.name);
    const int64_t n = 1024;
    std::vector<uint8_t> buf(row_bytes(t, n) + 1);
    for (auto& b : buf) b = (uint8_t)rng();
    uint8_t* w = buf.data() + 1;  // misaligned
    for (int64_t i = 0; i < n / tr.block_size; ++i)
      for (size_t at : f16_at) {
        const float v = std::ldexp(1.0f + (float)(rng() % 1000) / 1000.0f, (int)(rng() % 12) - 10) * (rng() % 4 ? 1.0f : -1.0f);
        const uint16_t h = f32_to_f16(v);
        std::memcpy(w + (size_t)i * tr.block_bytes + at, &h, 2);
      }
    std::vector<float> want((size_t)n), got((size_t)n);
    tr.dequantize(w, want.data(), n);
    dequantize_row_fast(t, w, got.data(), n);
    EXPECT_EQ(std::memcmp(want.data(), got.data(), sizeof(float) * (size_t)n), 0);
  }
}

TEST(Kernels, ActivationQuantisation) {
  const int64_t cols = 96;
  auto x = make_inputs(2, cols, 9, 0);
  x[40] = 0.0f;
  for (int i = 64; i < 96; ++i) x[(size_t)i] = 0.0f;  // an all-zero block
  QuantizedActs A;
  quantize_acts(x.data(), 2, cols, A);
  ASSERT_EQ(A.nb, 3);
  for (int64_t t = 0; t < 2; ++t) {
    for (int64_t k = 0; k < 3; ++k) {
      const float dx = A.d_row(t)[k];
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[(size_t)(t * cols + 32 * k + i)]));
      EXPECT_EQ(dx, amax / 32767.0f);
      int32_t total = 0;
      for (int i = 0; i < 32; ++i) {
        const int q = A.q_row(t)[32 * k + i];
        const float xv = x[(size_t)(t * cols + 32 * k + i)];
        EXPECT_LE(std::abs(q), 32767);
        EXPECT_LE(std::fabs((double)q * dx - xv), 0.5001 * dx + 1e-30);
        total += q;
      }
      EXPECT_EQ(A.sum_row(t)[k], dx * (float)total);
    }
  }
  // A non-finite input poisons its outputs rather than vanishing.
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::Q3_K}) {
    const Weights W = make_weights(t, 2, 256, 3, 0);
    auto xin = make_inputs(1, 256, 4, 0);
    xin[100] = INFINITY;
    float y[2];
    matmul_rows(W.view, xin.data(), 1, y, 2, 0, 2);
    EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[1])) << dtype_traits(t).name;
  }
}

TEST(Kernels, ActivationQuantisationIsaIndependent) {
  if (!use_avx2()) GTEST_SKIP() << "no AVX2";
  // 40 blocks a row: whole groups of eight for the AVX2 version; 43: a
  // group of three at the end.
  for (const int64_t cols : {int64_t{32 * 40}, int64_t{32 * 43}}) {
    auto x = make_inputs(3, cols, 21, 0);
    for (int i = 0; i < 32; ++i) x[(size_t)(32 + i)] = 0.0f;              // zero block
    for (int i = 0; i < 32; ++i) x[(size_t)(64 + i)] = 1e-40f * (float)i;  // subnormals
    for (int i = 0; i < 32; ++i) x[(size_t)(96 + i)] = 3e37f * (float)(i - 16);
    x[200] = -INFINITY;
    x[300] = NAN;
    x[(size_t)(cols - 5)] = INFINITY;  // the last group's last block
    x[400] = 0.5f * 32767.0f / 32767.0f;  // a value on a rounding tie is possible; compare bits anyway
    QuantizedActs a, b;
    quantize_acts_scalar(x.data(), 3, cols, a);
    quantize_acts_avx2(x.data(), 3, cols, b);
    ASSERT_EQ(std::memcmp(a.q.data(), b.q.data(), (size_t)(3 * cols) * 2), 0);
    ASSERT_EQ(std::memcmp(a.d.data(), b.d.data(), (size_t)(3 * a.nb) * 4), 0);
    ASSERT_EQ(std::memcmp(a.sum.data(), b.sum.data(), (size_t)(3 * a.nb) * 4), 0);
  }
}

// The largest premultiplied codes (qmatmul.h): Q6_K's scale -128 times code
// -32 (4096) and Q3_K's -32 times -4, against inputs at full int16 scale,
// so every lane sum is near 2^29 (Q6_K): no overflow, and the result within
// the stated tolerance of the f64 product, with 1, 8 and 16 inputs (row
// loops and the decoded panel).
TEST(Kernels, PremultipliedScalesAtTheirLimits) {
  const int64_t cols = 512, rows = 3;
  for (DType t : {DType::Q6_K, DType::Q3_K}) {
    const auto& tr = dtype_traits(t);
    const size_t rb = (size_t)(cols / tr.block_size) * tr.block_bytes;
    std::vector<uint8_t> bytes(rb * rows, 0);
    for (int64_t j = 0; j < rows; ++j)
      for (int64_t b = 0; b < cols / 256; ++b) {
        uint8_t* blk = bytes.data() + j * rb + b * tr.block_bytes;
        const uint16_t one = f32_to_f16(j == 2 ? -1.0f : 1.0f);
        if (t == DType::Q6_K) {
          std::memset(blk + 192, 0x80, 16);  // scales -128; codes 0 - 32
          if (j == 1) std::memset(blk, 0xff, 192);  // codes 63 - 32 = 31
          std::memcpy(blk + 208, &one, 2);
        } else {
          // scale bytes 0 -> 0 - 32; hmask 0 and low bits 0 -> quant -4
          std::memcpy(blk + 108, &one, 2);
          if (j == 1) std::memset(blk, 0xff, 96);  // quant 3
        }
      }
    const MatView W{t, cols, rows, bytes.data(), rb};
    for (const int64_t n_x : {int64_t{1}, int64_t{8}, int64_t{16}}) {
      std::vector<float> x((size_t)(n_x * cols));
      for (size_t i = 0; i < x.size(); ++i) x[i] = i % 5 == 0 ? -1.0f : 1.0f;
      std::vector<float> Y((size_t)(n_x * rows));
      matmul_rows(W, x.data(), n_x, Y.data(), rows, 0, rows);
      SCOPED_TRACE(tr.name + std::string(" inputs ") + std::to_string(n_x));
      expect_near_f64_product(W, x.data(), n_x, Y.data(), rows);
    }
  }
}

// The vector GLU activations against the C library formulas: within
// 1e-6 * max(1, |reference|) over a wide range of inputs (zero, tiny, large,
// saturating), with the input scales applied; and a value's result does not
// depend on its place in the range or on the range's length (tails included).
TEST(Kernels, GluActivationsMatchTheScalarFormulas) {
  if (!use_avx2()) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> wide(-30.f, 30.f), narrow(-1.f, 1.f);
  std::vector<float> g, u;
  for (float v : {0.f, -0.f, 1e-8f, -1e-8f, 1e-3f, -0.62f, 0.63f, 5.f, -9.f, 40.f, -40.f, 88.f, -88.f, 100.f, -100.f,
                  1e30f, -1e30f}) {
    g.push_back(v);
    u.push_back(std::fabs(v) < 50.f ? -v * 0.5f + 0.25f : 0.5f);
  }
  for (int i = 0; i < 4000; ++i) {
    g.push_back(i % 2 ? wide(rng) : narrow(rng));
    u.push_back(i % 3 ? wide(rng) * 3.f : narrow(rng));
  }
  const int64_t n = static_cast<int64_t>(g.size());
  for (GluKind k : {GluKind::SiLU, GluKind::GeluTanh, GluKind::SiTU, GluKind::Sigmoid, GluKind::SwiGluOai})
    for (float gs : {1.f, 0.7f}) {
      std::vector<float> ref(g.size()), fast(g.size());
      glu_act_scalar(k, g.data(), u.data(), gs, 1.3f, ref.data(), n);
      glu_act_avx2(k, g.data(), u.data(), gs, 1.3f, fast.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(std::isfinite(fast[static_cast<size_t>(i)])) << "kind " << int(k) << " g " << g[static_cast<size_t>(i)];
        ASSERT_LE(std::fabs(fast[static_cast<size_t>(i)] - ref[static_cast<size_t>(i)]),
                  1e-6f * std::max(1.f, std::fabs(ref[static_cast<size_t>(i)])))
            << "kind " << int(k) << " g " << g[static_cast<size_t>(i)] << " u " << u[static_cast<size_t>(i)];
      }
      // Sub-ranges at every offset and length up to 19 give the same bits.
      for (int64_t off = 0; off < 9; ++off)
        for (int64_t len = 1; len < 20; ++len) {
          std::vector<float> part(static_cast<size_t>(len));
          glu_act_avx2(k, g.data() + off, u.data() + off, gs, 1.3f, part.data(), len);
          ASSERT_EQ(0, std::memcmp(part.data(), fast.data() + off, sizeof(float) * static_cast<size_t>(len)))
              << "kind " << int(k) << " offset " << off << " length " << len;
        }
    }
}

TEST(Kernels, SoftcapMatchesTheScalarFormula) {
  if (!use_avx2()) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> d(-200.f, 200.f);
  std::vector<float> x = {0.f, -0.f, 1e-7f, -1e-7f, 29.9f, -30.1f, 1e30f, -1e30f};
  for (int i = 0; i < 3000; ++i) x.push_back(i % 4 ? d(rng) : d(rng) * 1e-3f);
  for (float cap : {30.f, 15.f}) {
    std::vector<float> ref = x, fast = x;
    softcap_scalar(ref.data(), static_cast<int64_t>(ref.size()), cap, 0.8f);
    softcap_avx2(fast.data(), static_cast<int64_t>(fast.size()), cap, 0.8f);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_LE(std::fabs(fast[i] - ref[i]), 1e-6f * std::max(1.f, std::fabs(ref[i]))) << "x " << x[i] << " cap " << cap;
    // A tail gives the same bits as the same values inside a longer range.
    std::vector<float> tail(x.begin() + 3, x.begin() + 8);
    softcap_avx2(tail.data(), 5, cap, 0.8f);
    EXPECT_EQ(0, std::memcmp(tail.data(), fast.data() + 3, sizeof(float) * 5));
  }
}

// The per-thread angle cache returns what RopeAngles::compute gives for the
// key asked, bit for bit: across keys sharing a slot (positions 128 apart),
// other dims and other bases, asked in an order that evicts and refills.
TEST(Kernels, RopeAngleCacheEqualsComputedAngles) {
  struct Key {
    int dim;
    int64_t pos;
    float base;
  };
  const std::vector<Key> keys = {{128, 5, 1e6f},  {128, 133, 1e6f}, {64, 5, 1e6f},     {128, 5, 1e4f},
                                 {128, 5, 1e6f},  {32, 0, 1e4f},    {128, 261, 5e5f}, {128, 133, 1e6f},
                                 {64, 70000, 1e4f}, {128, 5, 1e6f}};
  for (int round = 0; round < 3; ++round)
    for (const Key& k : keys) {
      RopeAngles want;
      want.compute(k.dim, k.pos, k.base);
      const RopeAngles& got = rope_angles(k.dim, k.pos, k.base);
      ASSERT_EQ(got.cos.size(), want.cos.size()) << k.dim << " " << k.pos << " " << k.base;
      EXPECT_EQ(0, std::memcmp(got.cos.data(), want.cos.data(), sizeof(float) * want.cos.size())) << k.pos;
      EXPECT_EQ(0, std::memcmp(got.sin.data(), want.sin.data(), sizeof(float) * want.sin.size())) << k.pos;
    }
  // rope_inplace goes through the cache and keeps the bits of the two-part form.
  std::vector<float> v(128), w;
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i) - 0.5f;
  w = v;
  rope_inplace(v.data(), 128, 133, 1e6f, true);
  RopeAngles a;
  a.compute(128, 133, 1e6f);
  rope_apply(w.data(), 128, a, true);
  EXPECT_EQ(0, std::memcmp(v.data(), w.data(), sizeof(float) * v.size()));
}

TEST(Kernels, SoftmaxMatchesTheScalarVersion) {
  if (!use_avx2()) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> d(-40.f, 40.f);
  for (int64_t n : {1, 3, 8, 9, 31, 1000, 4099}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = d(rng);
    if (n > 3) x[2] = -INFINITY;  // a masked score
    std::vector<float> ref = x, fast = x;
    softmax_inplace_scalar(ref.data(), n);
    softmax_inplace_avx2(fast.data(), n);
    double sum = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_LE(std::fabs(fast[i] - ref[i]), 1e-6f * std::max(ref[i], 1e-30f) + 1e-37f) << "n " << n << " i " << i;
      sum += fast[i];
    }
    EXPECT_NEAR(sum, 1.0, 1e-5) << n;
  }
}

// Scores spread far apart (a peaked attention head): a weight the exponential
// puts below 2^-125 (a gap of more than 87) is exactly 0, never a subnormal,
// in the vector softmax and softmax_rows; the others as the scalar
// version's.
TEST(Kernels, FarBelowTheMaximumIsZeroNotSubnormal) {
  if (!use_avx2()) GTEST_SKIP() << "no AVX2";
  std::vector<float> x;
  for (int i = 0; i < 67; ++i) x.push_back(-1.5f * static_cast<float>(i));  // gaps 0 .. 99
  for (int i = 0; i < 40; ++i) x.push_back(-87.f - 0.025f * static_cast<float>(i));  // 87 .. 88, e^-x near 2^-126
  x.push_back(-INFINITY);
  std::vector<float> ref = x, fast = x, rows = x;
  const int64_t n = static_cast<int64_t>(x.size());
  softmax_inplace_scalar(ref.data(), n);
  softmax_inplace_avx2(fast.data(), n);
  float* rp[1] = {rows.data()};
  softmax_rows(rp, &n, 1);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NE(std::fpclassify(fast[i]), FP_SUBNORMAL) << i;
    if (-x[i] > 87.f) {
      EXPECT_EQ(fast[i], 0.f) << i;
    } else {
      EXPECT_LE(std::fabs(fast[i] - ref[i]), 1e-6f * ref[i]) << i;
    }
  }
  EXPECT_EQ(0, std::memcmp(fast.data(), rows.data(), sizeof(float) * x.size()));
  // sigmoid of a large input: 1 / (1 + e^-x), e^-x now 0 rather than a
  // subnormal added to 1.
  std::vector<float> g = {100.f, 90.f, 87.5f, 86.f}, u(4, 1.f), o(4);
  glu_act(GluKind::Sigmoid, g.data(), u.data(), 1.f, 1.f, o.data(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(o[static_cast<size_t>(i)], 1.f) << i;
}

// The int16-activation kernels' outputs pinned bit for bit: FNV-1a hashes of
// Y over raw random blocks (every code and sub-scale byte; only the f16/f32/
// e8m0 super-scales kept finite) for sub-block counts around the kernels'
// internal groupings (odd counts, 8-aligned and not, past 64), misaligned
// rows and inputs and 1..8 inputs. The inputs come from a small LCG so the
// data do not depend on the standard library. A change here means every
// model's logits change: it must be deliberate. (The scalar oracle computes
// the same bits, so the hashes hold on either ISA.)
uint64_t fnv1a(const void* p, size_t n, uint64_t h) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t pinned_hash(DType t) {
  const DTypeTraits& tr = dtype_traits(t);
  uint64_t st = 0x9e3779b97f4a7c15ull ^ (uint64_t)t;
  auto next = [&]() {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(st >> 33);
  };
  uint64_t h = 1469598103934665603ull;
  const int64_t bs = tr.block_size;
  for (int64_t nsub : {1, 2, 3, 7, 8, 9, 15, 16, 17, 24, 63, 64, 65, 66, 72, 129, 130}) {
    const int64_t cols = nsub * 32;
    if (cols % bs != 0) continue;
    for (size_t mis : {0u, 3u}) {
      const int64_t rows = 3;
      const size_t rb = row_bytes(t, cols);
      std::vector<uint8_t> buf(rb * rows + mis);
      for (auto& b : buf) b = (uint8_t)next();
      uint8_t* base = buf.data() + mis;
      for (int64_t i = 0; i < rows * cols / bs; ++i) {
        uint8_t* b = base + (size_t)i * tr.block_bytes;
        auto put_f16 = [&](size_t at) {
          const uint16_t v = f32_to_f16(std::ldexp(1.0f + (float)(next() % 1000) / 1000.0f, (int)(next() % 10) - 8));
          std::memcpy(b + at, &v, 2);
        };
        switch (t) {
          case DType::Q4_0: case DType::Q8_0: case DType::Q5_0: case DType::INT4_G128: put_f16(0); break;
          case DType::Q4_1: case DType::Q4_K: put_f16(0); put_f16(2); break;
          case DType::Q6_K: put_f16(208); break;
          case DType::Q3_K: put_f16(108); break;
          case DType::Q5_K: put_f16(0); put_f16(2); break;
          case DType::IQ4_NL: case DType::IQ4_XS: put_f16(0); break;
          case DType::MXFP4: b[0] = (uint8_t)(100 + next() % 55); break;
          case DType::INT8_COL: { const float d = 0.01f * (float)(1 + next() % 7); std::memcpy(b, &d, 4); break; }
          default: break;
        }
      }
      const MatView W{t, cols, rows, base, rb};
      for (int64_t n_x = 1; n_x <= 8; ++n_x) {
        std::vector<float> x((size_t)(n_x * cols) + mis);
        for (auto& v : x) v = ((float)(next() % 20001) - 10000.0f) * ((next() % 5) == 0 ? 1e-3f : 1e-2f);
        std::vector<float> Y((size_t)(n_x * rows));
        matmul_rows(W, x.data() + mis, n_x, Y.data(), rows, 0, rows);
        h = fnv1a(Y.data(), Y.size() * sizeof(float), h);
        // Beside the pin, correctness on the same data: every output within
        // the stated tolerance of the exact (f64) product of the reference
        // dequantiser's weights and the inputs.
        std::vector<float> wrow((size_t)cols);
        for (int64_t j = 0; j < rows; ++j) {
          tr.dequantize(base + (size_t)j * rb, wrow.data(), cols);
          for (int64_t s = 0; s < n_x; ++s) {
            const float* xs = x.data() + mis + s * cols;
            double exact = 0;
            for (int64_t i = 0; i < cols; ++i) exact += (double)wrow[(size_t)i] * xs[i];
            EXPECT_NEAR((double)Y[(size_t)(s * rows + j)], exact, tolerance(t, wrow.data(), xs, cols))
                << tr.name << " cols=" << cols << " row=" << j << " input=" << s;
          }
        }
      }
    }
  }
  return h;
}

TEST(Kernels, Int16KernelOutputsArePinned) {
  const std::pair<DType, uint64_t> want[] = {
      {DType::Q4_0, 0xe8d54d85ae7be735ull}, {DType::Q4_1, 0xee73a395b9ee6dffull}, {DType::Q5_0, 0x9dc302b955ddcbaaull}, {DType::Q8_0, 0x30a8e62811c90f31ull},
      {DType::Q4_K, 0x358bcc574d447d5eull}, {DType::Q6_K, 0x4f109e17088a1543ull}, {DType::MXFP4, 0x1f27978feae754deull}, {DType::NVFP4, 0xeccbb9d7efdfc963ull},
      {DType::INT4_G128, 0x5ef9b9e230a3ecebull}, {DType::INT8_COL, 0x985683d327d2cc2full},
      {DType::Q3_K, 0x30bce47c99b35c51ull}, {DType::Q5_K, 0x9b0a94689b48e973ull}, {DType::IQ4_NL, 0xe0b52f2c98cb6138ull}, {DType::IQ4_XS, 0x33a22a52520e26c7ull},
  };
  for (const auto& [t, h] : want) {
    const uint64_t got = pinned_hash(t);
    EXPECT_EQ(got, h) << dtype_traits(t).name << std::hex << " got 0x" << got;
  }
}

// The CPU's own flags, read from /proc/cpuinfo (not from the compiler's
// cpuid builtins the engine uses); nullopt where that file is not there.
struct CpuinfoFlags {
  bool avx2_fma = false, avxvnni = false, avx512vnni = false;
};
std::optional<CpuinfoFlags> cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> w;
    std::string one;
    while (words >> one) w.insert(one);
    const bool avx2 = w.count("avx2") && w.count("fma");
    return CpuinfoFlags{avx2, avx2 && w.count("avx_vnni") > 0,
                        avx2 && w.count("avx512f") && w.count("avx512bw") && w.count("avx512vl") && w.count("avx512_vnni")};
  }
  return std::nullopt;
}

// The path the engine takes is the one the CPU and MEGAKERN_ISA call for: the
// best integer-kernel build (isa.h) the CPU has, capped by the variable
// ("scalar": the portable path, which the scalar_isa ctest entry relies on;
// "avx2": neither VNNI build, the avx2_isa entry; "avx-vnni": no AVX-512).
TEST(Kernels, ReportsIsa) {
  const CpuFeatures& f = cpu_features();
  RecordProperty("isa", isa_name(active_isa()));
  std::printf("[kernels] ISA: %s\n", isa_report().c_str());
  const char* env = std::getenv("MEGAKERN_ISA");
  const std::string isa = env ? env : "";
  const bool forced_scalar = isa == "scalar";
  if (forced_scalar) {
    EXPECT_FALSE(use_avx2());
    EXPECT_FALSE(f.avx2 || f.fma || f.f16c || f.avx512f || f.avxvnni || f.avx512vnni)
        << "MEGAKERN_ISA=scalar must turn off every feature";
  }
  KernelIsa cap = KernelIsa::avx512_vnni;
  if (isa == "scalar") cap = KernelIsa::scalar;
  if (isa == "avx2") cap = KernelIsa::avx2;
  if (isa == "avx-vnni") cap = KernelIsa::avx_vnni;
  EXPECT_LE(static_cast<int>(active_isa()), static_cast<int>(cap)) << "MEGAKERN_ISA=" << isa << " not honoured";
  const auto cpu = cpuinfo_flags();
#if defined(__x86_64__)
  ASSERT_TRUE(cpu.has_value()) << "/proc/cpuinfo has no flags line";
#endif
  if (cpu) {
    EXPECT_EQ(use_avx2(), cpu->avx2_fma && !forced_scalar);
    EXPECT_EQ(host_runs(KernelIsa::avx2), cpu->avx2_fma);
    EXPECT_EQ(host_runs(KernelIsa::avx_vnni), cpu->avxvnni);
    EXPECT_EQ(host_runs(KernelIsa::avx512_vnni), cpu->avx512vnni);
    // The best build the host has under the cap.
    KernelIsa want = KernelIsa::scalar;
    if (cpu->avx2_fma && cap >= KernelIsa::avx2) want = KernelIsa::avx2;
    if (cpu->avxvnni && cap >= KernelIsa::avx_vnni) want = KernelIsa::avx_vnni;
    if (cpu->avx512vnni && cap >= KernelIsa::avx512_vnni) want = KernelIsa::avx512_vnni;
    EXPECT_EQ(active_isa(), want) << isa_report();
  }
}


// ---------------------------------------------------------------------------
// The fast numerics mode (kernels/cpu/qmatmul_fast.h): 8-bit activations.

std::vector<DType> fast_types() {
  std::vector<DType> v;
  for (DType t : all_types())
    if (uses_fast_acts(t)) v.push_back(t);
  return v;
}

// Stated tolerance of a fast-mode output against sum_i deq[j][i] * x[t][i]
// in f64: the inputs are rounded to the block grid dx = absmax / 127 (block
// of 32, or 256 for K-quants), at most dx / 2 per element, so
// sum_i |w_i| * dx(i) / 2; plus the f32 rounding of the scale products, the
// integer-to-float conversion of sums above 2^24 and the accumulation:
// 2 * (n / 16 + 8) * 2^-24 * sum |w x|.
double fast_tolerance(DType t, const float* w, const float* x, int64_t n) {
  const int64_t blk = fast_act_block(t);
  double mag = 0, q = 0;
  for (int64_t i = 0; i < n; ++i) mag += std::fabs((double)w[i] * x[i]);
  for (int64_t k = 0; k < n / blk; ++k) {
    float amax = 0;
    for (int64_t i = 0; i < blk; ++i) amax = std::max(amax, std::fabs(x[blk * k + i]));
    const double dx = (double)amax / 127.0;
    for (int64_t i = 0; i < blk; ++i) q += std::fabs((double)w[blk * k + i]) * dx / 2;
  }
  return 1.0001 * q + 2.0 * ((double)n / 16 + 8) * 0x1p-24 * mag + 1e-30;
}

std::vector<float> fast_oracle(const MatView& W, const float* X, int64_t n_x) {
  Q8Acts A;
  quantize_q8_acts_scalar(X, n_x, W.cols, fast_act_block(W.type), A);
  std::vector<float> O((size_t)(n_x * W.rows), -2.0f);
  matmul_rows_fast_ref(W, A, O.data(), W.rows, 0, W.rows);
  return O;
}

TEST(FastKernels, MatchOracleBitExactlyAndReferenceWithinTolerance) {
  int checked = 0;
  for (DType t : fast_types()) {
    const DTypeTraits& tr = dtype_traits(t);
    SCOPED_TRACE(tr.name);
    const int64_t unit = std::max<int64_t>(tr.block_size, fast_act_block(t));
    for (int64_t m : {1, 2, 3, 5}) {
      const int64_t cols = m * unit;
      for (int64_t rows : {1, 5, 8, 19}) {
        for (size_t wmis : {0u, 3u}) {
          const int64_t n_x = (rows * 7 + cols) % 6 + 1;
          const size_t xoff = (size_t)(wmis + 1) % 3;
          const Weights W = make_weights(t, rows, cols, (uint32_t)(cols * 13 + rows + wmis), wmis);
          const auto xbuf = make_inputs(n_x, cols, (uint32_t)(cols + rows * 3 + wmis), xoff);
          const float* X = xbuf.data() + xoff;
          std::vector<float> Y((size_t)(n_x * rows), -1.0f);
          matmul_rows(W.view, X, n_x, Y.data(), rows, 0, rows, Numerics::Fast);
          const std::vector<float> O = fast_oracle(W.view, X, n_x);
          ASSERT_EQ(std::memcmp(Y.data(), O.data(), Y.size() * sizeof(float)), 0)
              << "cols=" << cols << " rows=" << rows << " misalign=" << wmis << " n_x=" << n_x;
          for (int64_t j = 0; j < rows; ++j) {
            for (int64_t s = 0; s < n_x; ++s) {
              const float* w = &W.deq[(size_t)(j * cols)];
              const float* x = X + s * cols;
              double exact = 0;
              for (int64_t i = 0; i < cols; ++i) exact += (double)w[i] * x[i];
              ASSERT_NEAR((double)Y[(size_t)(s * rows + j)], exact, fast_tolerance(t, w, x, cols))
                  << "cols=" << cols << " row=" << j << " input=" << s;
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GE(checked, 300);
}

// The format table (format_kernels.h): one row per format, its entries
// consistent, and every kernel it names runs (the fast AVX2 dispatch and the
// row decoder against their oracles, through each row-count path) while a
// format it gives none is refused with a message instead of an unwritten
// output.
TEST(Kernels, FormatTableCoversEveryFormatAndItsDispatch) {
  size_t n = 0;
  const FormatKernels* table = format_kernel_table(&n);
  std::set<uint32_t> seen;
  for (size_t i = 0; i < n; ++i) {
    const FormatKernels& k = table[i];
    SCOPED_TRACE(dtype_traits(k.type).name);
    EXPECT_TRUE(seen.insert((uint32_t)k.type).second) << "listed twice";
    EXPECT_TRUE(k.fast_block == 0 || k.fast_block == 32 || k.fast_block == 256);
    // A register-blocked threshold only for fast-mode formats, both or neither.
    EXPECT_EQ(k.r8_min_inputs > 0, k.r8_min_inputs_vnni > 0);
    if (k.r8_min_inputs > 0) {
      EXPECT_NE(k.fast_block, 0);
      EXPECT_LE(k.r8_min_inputs, 8);
      EXPECT_LE(k.r8_min_inputs_vnni, 8);
    }
  }
  for (DType t : all_types()) {
    const DTypeTraits& tr = dtype_traits(t);
    SCOPED_TRACE(tr.name);
    ASSERT_EQ(seen.count((uint32_t)t), 1u) << "no row in format_kernels.cpp";
    const FormatKernels& k = format_kernels(t);
    EXPECT_EQ(uses_i16_acts(t), k.i16_acts);
    EXPECT_EQ(uses_fast_acts(t), k.fast_block != 0);
    EXPECT_EQ(fast_r8_supports(t), k.r8_min_inputs != 0);
    EXPECT_EQ(avx2_row_kernels_support(t), k.avx2_rows);
    if (!use_avx2()) continue;
    const int64_t cols = std::max<int64_t>(tr.block_size, 256), rows = 11;
    const Weights W = make_weights(t, rows, cols, 5 + (uint32_t)t, 0);
    if (k.fast_block != 0) {
      for (int64_t n_x : {1, 2, 3, 4, 5, 9}) {
        const auto x = make_inputs(n_x, cols, 7 + (uint32_t)n_x, 0);
        Q8Acts A;
        quantize_q8_acts_scalar(x.data(), n_x, cols, fast_act_block(t), A);
        std::vector<float> Y((size_t)(n_x * rows), NAN);
        matmul_rows_fast_avx2(W.view, A, Y.data(), rows, 0, rows);
        const std::vector<float> O = fast_oracle(W.view, x.data(), n_x);
        ASSERT_EQ(std::memcmp(Y.data(), O.data(), Y.size() * sizeof(float)), 0) << "n_x " << n_x;
      }
    } else {
      Q8Acts A;
      prepare_q8_acts(1, cols, 32, A);
      std::vector<float> Y((size_t)rows);
      try {
        matmul_rows_fast_avx2(W.view, A, Y.data(), rows, 0, rows);
        ADD_FAILURE() << "the fast dispatch took a format the table gives no fast kernel";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(tr.name), std::string::npos) << e.what();
      }
    }
    std::vector<float> got((size_t)cols, NAN), want((size_t)cols);
    if (k.avx2_rows) {
      dequantize_row_avx2(t, W.view.row(3), got.data(), cols);
      tr.dequantize(W.view.row(3), want.data(), cols);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    } else {
      EXPECT_THROW(dequantize_row_avx2(t, W.view.row(3), got.data(), cols), Error);
    }
  }
}

TEST(FastKernels, OutputsDoNotDependOnBatchRowRangeOrThreads) {
  constexpr int64_t kMaxX = 40;
  ThreadPool pool1(1), pool3(3, /*oversubscribe=*/true);
  for (DType t : fast_types()) {
    SCOPED_TRACE(dtype_traits(t).name);
    const int64_t cols = std::max<int64_t>(dtype_traits(t).block_size, fast_act_block(t)) * 2;
    const int64_t rows = 45;
    const Weights W = make_weights(t, rows, cols, 77, 1);
    const auto xbuf = make_inputs(kMaxX, cols, 78, 1);
    const float* X = xbuf.data() + 1;
    std::vector<float> full((size_t)(kMaxX * rows));
    matmul_rows(W.view, X, kMaxX, full.data(), rows, 0, rows, Numerics::Fast);
    std::mt19937 rng(123);
    for (int64_t n_x = 1; n_x <= kMaxX; n_x += 3) {
      const int64_t t0 = (int64_t)(rng() % (uint32_t)(kMaxX - n_x + 1));
      int64_t rb = (int64_t)(rng() % rows), re = (int64_t)(rng() % rows);
      if (rb > re) std::swap(rb, re);
      ++re;
      std::vector<float> y((size_t)(n_x * rows), NAN);
      matmul_rows(W.view, X + t0 * cols, n_x, y.data(), rows, rb, re, Numerics::Fast);
      for (int64_t s = 0; s < n_x; ++s)
        ASSERT_EQ(std::memcmp(&y[(size_t)(s * rows + rb)], &full[(size_t)((t0 + s) * rows + rb)],
                              (size_t)(re - rb) * sizeof(float)),
                  0)
            << "n_x=" << n_x << " rows [" << rb << "," << re << ")";
      for (ThreadPool* pool : {&pool1, &pool3}) {
        std::vector<float> yp((size_t)(n_x * rows), NAN);
        matmul(*pool, W.view, X + t0 * cols, n_x, yp.data(), Numerics::Fast);
        ASSERT_EQ(std::memcmp(yp.data(), &full[(size_t)(t0 * rows)], yp.size() * sizeof(float)), 0)
            << "pool of " << pool->size() << " n_x=" << n_x;
      }
    }
  }
}

TEST(FastKernels, RandomBitPatternsMatchOracle) {
  std::mt19937 rng(2025);
  for (DType t : fast_types()) {
    const DTypeTraits& tr = dtype_traits(t);
    SCOPED_TRACE(tr.name);
    const int64_t cols = std::max<int64_t>(tr.block_size, 64) * 4, rows = 24;
    const size_t rb = row_bytes(t, cols);
    std::vector<uint8_t> buf(rb * rows + 1);
    for (auto& b : buf) b = (uint8_t)rng();
    uint8_t* base = buf.data() + 1;
    const int64_t nblk = rows * cols / tr.block_size;
    for (int64_t i = 0; i < nblk; ++i) {
      uint8_t* b = base + (size_t)i * tr.block_bytes;
      pin_block_scales(t, b, rng);
    }
    const MatView W{t, cols, rows, base, rb};
    for (int64_t n_x : {1, 3, 9}) {
      const auto x = make_inputs(n_x, cols, 31 + (uint32_t)n_x, 0);
      std::vector<float> Y((size_t)(n_x * rows));
      matmul_rows(W, x.data(), n_x, Y.data(), rows, 0, rows, Numerics::Fast);
      const std::vector<float> O = fast_oracle(W, x.data(), n_x);
      for (float v : O) ASSERT_TRUE(std::isfinite(v));
      ASSERT_EQ(std::memcmp(Y.data(), O.data(), Y.size() * sizeof(float)), 0) << "n_x " << n_x;
      std::vector<float> w((size_t)cols);
      for (int64_t j = 0; j < rows; ++j) {
        tr.dequantize(W.row(j), w.data(), cols);
        for (int64_t s = 0; s < n_x; ++s) {
          double exact = 0;
          for (int64_t i = 0; i < cols; ++i) exact += (double)w[(size_t)i] * x[(size_t)(s * cols + i)];
          ASSERT_NEAR(O[(size_t)(s * rows + j)], exact, fast_tolerance(t, w.data(), x.data() + s * cols, cols)) << j;
        }
      }
    }
  }
}

// The register-blocked kernel for many inputs (fast_r8_supports), called
// directly and through matmul_rows, against the oracle bit for bit: input
// counts below, at and above its blocking of four and its switch-over,
// row counts that are not multiples of its eight-row groups, odd block
// counts, misaligned rows and inputs; weights random, and random bit
// patterns including all-ones and -128 bytes with inputs at +-127 (the
// int16 pair sums at their largest).
// The register-blocked kernel's builds this CPU can run (isa.h: AVX2,
// AVX-VNNI, AVX512-VNNI), many- and few-input, whatever MEGAKERN_ISA says.
// The builds a CPU lacks are not run; the test says which.
struct R8Kernel {
  std::string name;
  void (*fn)(const MatView&, const Q8Acts&, float*, int64_t, int64_t, int64_t);
};
std::vector<R8Kernel> r8_kernels() {
  std::vector<R8Kernel> k;
  for (const IntKernelBuild& b : int_kernel_builds())
    if (host_runs(b.isa)) {
      k.push_back({isa_name(b.isa), b.fast_r8});
      k.push_back({std::string(isa_name(b.isa)) + " few", b.fast_r8_few});
    }
  return k;
}

TEST(FastKernels, RegisterBlockedKernelMatchesOracle) {
  std::string tested;
  for (const R8Kernel& k : r8_kernels()) tested += " [" + k.name + "]";
  std::printf("[kernels] %s; register-blocked builds tested:%s\n", isa_report().c_str(), tested.c_str());
  int checked = 0;
  for (DType t : fast_types()) {
    // Every fast-mode format has the register-blocked kernel.
    ASSERT_TRUE(fast_r8_supports(t)) << dtype_traits(t).name;
    const DTypeTraits& tr = dtype_traits(t);
    SCOPED_TRACE(tr.name);
    const int64_t unit = std::max<int64_t>(tr.block_size, fast_act_block(t));
    for (int64_t m : {1, 3, 19}) {
      const int64_t cols = m * unit;
      for (int64_t rows : {3, 8, 21}) {
        const size_t wmis = (size_t)(m + rows) % 4;
        const Weights W = make_weights(t, rows, cols, (uint32_t)(cols * 7 + rows), wmis);
        for (int64_t n_x : {1, 2, 4, 5, 7, 8, 12}) {
          const size_t xoff = (size_t)n_x % 3;
          const auto xbuf = make_inputs(n_x, cols, (uint32_t)(cols + rows + n_x), xoff);
          const float* X = xbuf.data() + xoff;
          const std::vector<float> O = fast_oracle(W.view, X, n_x);
          Q8Acts A;
          quantize_q8_acts(X, n_x, cols, fast_act_block(t), A);
          for (const R8Kernel& k : r8_kernels()) {
            SCOPED_TRACE(k.name);
            std::vector<float> Y((size_t)(n_x * rows), -1.0f);
            k.fn(W.view, A, Y.data(), rows, 0, rows);
            ASSERT_EQ(std::memcmp(Y.data(), O.data(), Y.size() * sizeof(float)), 0)
                << "cols=" << cols << " rows=" << rows << " n_x=" << n_x;
            // A row range starting inside a group of eight.
            std::vector<float> Z((size_t)(n_x * rows), -1.0f);
            k.fn(W.view, A, Z.data(), rows, 1, rows);
            for (int64_t s = 0; s < n_x; ++s)
              ASSERT_EQ(std::memcmp(&Z[(size_t)(s * rows + 1)], &O[(size_t)(s * rows + 1)],
                                    (size_t)(rows - 1) * sizeof(float)),
                        0)
                  << "rows [1," << rows << ") n_x=" << n_x;
          }
          std::vector<float> Y((size_t)(n_x * rows), -1.0f);
          matmul_rows(W.view, X, n_x, Y.data(), rows, 0, rows, Numerics::Fast);
          ASSERT_EQ(std::memcmp(Y.data(), O.data(), Y.size() * sizeof(float)), 0) << "matmul_rows n_x=" << n_x;
          ++checked;
        }
      }
    }
    {
      // Several panels of rows and several blocks of inputs (the kernel
      // blocks inputs by 128 KiB of activations: 16 inputs of 8192 columns).
      const int64_t cols = 8192, rows = 75, n_x = 37;
      const Weights W = make_weights(t, rows, cols, 99, 1);
      const auto xbuf = make_inputs(n_x, cols, 98, 2);
      const float* X = xbuf.data() + 2;
      const std::vector<float> O = fast_oracle(W.view, X, n_x);
      std::vector<float> Y((size_t)(n_x * rows), -1.0f);
      matmul_rows(W.view, X, n_x, Y.data(), rows, 0, rows, Numerics::Fast);
      ASSERT_EQ(std::memcmp(Y.data(), O.data(), Y.size() * sizeof(float)), 0) << "panels and input blocks";
      Q8Acts A;
      quantize_q8_acts(X, n_x, cols, fast_act_block(t), A);
      for (const R8Kernel& k : r8_kernels()) {
        std::vector<float> Z((size_t)(n_x * rows), -1.0f);
        k.fn(W.view, A, Z.data(), rows, 0, rows);
        ASSERT_EQ(std::memcmp(Z.data(), O.data(), Z.size() * sizeof(float)), 0) << k.name << " panels";
      }
      ++checked;
    }
    std::mt19937 rng(7);
    const int64_t cols = unit * 3, rows = 13;
    const size_t rb = row_bytes(t, cols);
    for (int fill : {-1, 0xff, 0x80, 0x77}) {
      std::vector<uint8_t> buf(rb * rows + 3);
      for (auto& b : buf) b = fill < 0 ? (uint8_t)rng() : (uint8_t)fill;
      uint8_t* base = buf.data() + 3;
      for (int64_t i = 0; i < rows * cols / tr.block_size; ++i) pin_block_scales(t, base + (size_t)i * tr.block_bytes, rng);
      const MatView Wv{t, cols, rows, base, rb};
      // Inputs all +127 or all -127 (2: a mix of signs; 0: random).
      for (float level : {1.0f, -1.0f, 2.0f, 0.0f}) {
        const int64_t n_x = 6;
        auto x = make_inputs(n_x, cols, 5, 0);
        if (level != 0.0f)
          for (size_t i = 0; i < x.size(); ++i) x[i] = level == 2.0f ? (i % 3 == 0 ? -1.0f : 1.0f) : level;
        const std::vector<float> O = fast_oracle(Wv, x.data(), n_x);
        Q8Acts A;
        quantize_q8_acts(x.data(), n_x, cols, fast_act_block(t), A);
        for (const R8Kernel& k : r8_kernels()) {
          std::vector<float> Y((size_t)(n_x * rows), -1.0f);
          k.fn(Wv, A, Y.data(), rows, 0, rows);
          ASSERT_EQ(std::memcmp(Y.data(), O.data(), Y.size() * sizeof(float)), 0)
              << k.name << " fill " << fill << " level " << level;
        }
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, (int)fast_types().size() * (3 * 3 * 7 + 17));
  EXPECT_GE(fast_types().size(), 14u);
}

// A keyed call reuses the quantised inputs of the same thread's previous
// call with that key (and X, n_x, width), in both modes; a new epoch, another
// tag or another X quantises afresh.
TEST(Kernels, ActsKeyReusesQuantisedInputsOnlyForTheSameKey) {
  for (Numerics num : {Numerics::Exact, Numerics::Fast}) {
    for (DType t : {DType::Q4_0, DType::Q4_K}) {
      SCOPED_TRACE(std::string(dtype_traits(t).name) + (num == Numerics::Fast ? " fast" : " exact"));
      const int64_t rows = 24, cols = 512, n_x = 5;
      const Weights W = make_weights(t, rows, cols, 3, 0);
      auto x = make_inputs(n_x, cols, 4, 0);
      auto fresh = [&](const std::vector<float>& in) {
        std::vector<float> y((size_t)(n_x * rows));
        matmul_rows(W.view, in.data(), n_x, y.data(), rows, 0, rows, num);
        return y;
      };
      const std::vector<float> before = fresh(x);
      int tag = 0, other = 0;
      std::vector<float> y((size_t)(n_x * rows), -1.f);
      matmul_rows(W.view, x.data(), n_x, y.data(), rows, 0, 8, num, ActsKey{&tag, 7});
      // Same key, same X pointer, new contents: the key's promise is broken on
      // purpose here, so the reuse shows (rows 8..24 from the old inputs).
      for (auto& v : x) v = -v * 0.5f;
      matmul_rows(W.view, x.data(), n_x, y.data(), rows, 8, rows, num, ActsKey{&tag, 7});
      for (int64_t s2 = 0; s2 < n_x; ++s2)
        ASSERT_EQ(std::memcmp(&y[(size_t)(s2 * rows)], &before[(size_t)(s2 * rows)], sizeof(float) * rows), 0);
      const std::vector<float> after = fresh(x);  // (an unkeyed call: it also forgets the key)
      ASSERT_NE(std::memcmp(after.data(), before.data(), sizeof(float) * after.size()), 0);
      matmul_rows(W.view, x.data(), n_x, y.data(), rows, 0, rows, num, ActsKey{&tag, 8});
      // A new epoch, another tag, or no key: quantised again.
      for (const ActsKey& k : {ActsKey{&tag, 8}, ActsKey{&other, 8}, ActsKey{}}) {
        std::fill(y.begin(), y.end(), -1.f);
        matmul_rows(W.view, x.data(), n_x, y.data(), rows, 0, rows, num, k);
        ASSERT_EQ(std::memcmp(y.data(), after.data(), sizeof(float) * y.size()), 0) << k.epoch;
      }
    }
  }
}

// Kernels keep what they derive from the inputs (re-encoded codes, offsets,
// grouped values and scales) for later calls on the same quantisation (its
// id): a product run in chunks of rows. The same activations object
// quantised again from other inputs must not see the old tables: a call on
// part of the rows with inputs X1, then the same object re-quantised from
// X2 and called on the rest and on all rows, against the oracle of X2.
TEST(FastKernels, DerivedInputTablesFollowEachQuantisation) {
  for (DType t : fast_types()) {
    SCOPED_TRACE(dtype_traits(t).name);
    const int64_t unit = std::max<int64_t>(dtype_traits(t).block_size, fast_act_block(t));
    const int64_t cols = 3 * unit, rows = 24;
    const Weights W = make_weights(t, rows, cols, 31, 0);
    for (int64_t n_x : {8, 32}) {
      const auto x1 = make_inputs(n_x, cols, 5, 0), x2 = make_inputs(n_x, cols, 6, 0);
      const std::vector<float> O = fast_oracle(W.view, x2.data(), n_x);
      for (const R8Kernel& k : r8_kernels()) {
        SCOPED_TRACE(k.name);
        Q8Acts A;
        std::vector<float> Y((size_t)(n_x * rows), -1.0f);
        quantize_q8_acts(x1.data(), n_x, cols, fast_act_block(t), A);
        k.fn(W.view, A, Y.data(), rows, 0, rows / 2);
        quantize_q8_acts(x2.data(), n_x, cols, fast_act_block(t), A);
        k.fn(W.view, A, Y.data(), rows, rows / 2, rows);
        for (int64_t s = 0; s < n_x; ++s)
          ASSERT_EQ(std::memcmp(&Y[(size_t)(s * rows + rows / 2)], &O[(size_t)(s * rows + rows / 2)],
                                (size_t)(rows - rows / 2) * sizeof(float)),
                    0)
              << "n_x " << n_x << " input " << s;
        std::fill(Y.begin(), Y.end(), -1.0f);
        k.fn(W.view, A, Y.data(), rows, 0, rows);
        ASSERT_EQ(std::memcmp(Y.data(), O.data(), Y.size() * sizeof(float)), 0) << "n_x " << n_x;
      }
    }
  }
  // The exact mode's grouped inputs (row loops from 2 inputs, decoded panel
  // from 9 or 16), the same way, in each build this CPU runs.
  if (!use_avx2()) return;
  using I16Fn = void (*)(const MatView&, const QuantizedActs&, float*, int64_t, int64_t, int64_t);
  std::vector<I16Fn> builds;
  for (const IntKernelBuild& b : int_kernel_builds())
    if (host_runs(b.isa)) builds.push_back(b.i16_rows);
  for (DType t : {DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
    SCOPED_TRACE(dtype_traits(t).name);
    const int64_t cols = 512, rows = 24;
    const Weights W = make_weights(t, rows, cols, 33, 0);
    for (int64_t n_x : {8, 32}) {
      const auto x1 = make_inputs(n_x, cols, 7, 0), x2 = make_inputs(n_x, cols, 8, 0);
      QuantizedActs A;
      quantize_acts(x2.data(), n_x, cols, A);
      std::vector<float> O((size_t)(n_x * rows));
      matmul_rows_i16_ref(W.view, A, O.data(), rows, 0, rows);
      for (I16Fn fn : builds) {
        std::vector<float> Y((size_t)(n_x * rows), -1.0f);
        quantize_acts(x1.data(), n_x, cols, A);
        fn(W.view, A, Y.data(), rows, 0, rows / 2);
        quantize_acts(x2.data(), n_x, cols, A);
        fn(W.view, A, Y.data(), rows, rows / 2, rows);
        fn(W.view, A, Y.data(), rows, 0, rows / 2);
        ASSERT_EQ(std::memcmp(Y.data(), O.data(), Y.size() * sizeof(float)), 0) << "n_x " << n_x;
      }
    }
  }
}

TEST(FastKernels, ActivationQuantisation) {
  // 512 columns: whole groups of eight 32-blocks (the AVX2 version's
  // vectorised path); 544: one more block, taken alone.
  for (const auto& [block, cols] : {std::pair<int64_t, int64_t>{32, 512}, {32, 544}, {256, 512}}) {
    auto x = make_inputs(3, cols, 19, 0);
    for (int i = 0; i < 32; ++i) x[(size_t)(32 + i)] = 0.0f;              // a zero 32-block
    for (int i = 0; i < 32; ++i) x[(size_t)(64 + i)] = 1e-40f * (float)i;  // subnormals
    for (int i = 0; i < 32; ++i) x[(size_t)(cols + 96 + i)] = 3e37f * (float)(i - 16);
    x[(size_t)(2 * cols + 300)] = NAN;
    x[(size_t)(2 * cols - 10)] = INFINITY;  // row 1's last block (544 columns: the block taken alone)
    Q8Acts a, b;
    quantize_q8_acts_scalar(x.data(), 3, cols, block, a);
    if (use_avx2()) {
      quantize_q8_acts_avx2(x.data(), 3, cols, block, b);
      ASSERT_EQ(std::memcmp(a.q.data(), b.q.data(), (size_t)(3 * cols)), 0) << block << " " << cols;
      ASSERT_EQ(std::memcmp(a.d.data(), b.d.data(), (size_t)(3 * a.nb) * 4), 0) << block << " " << cols;
      ASSERT_EQ(std::memcmp(a.sx.data(), b.sx.data(), (size_t)(3 * a.nb) * 4), 0) << block << " " << cols;
      ASSERT_EQ(std::memcmp(a.s16.data(), b.s16.data(), (size_t)(3 * cols / 16) * 2), 0) << block << " " << cols;
    }
    // Independent checks of the scalar version: the grid, the rounding, the sums.
    for (int64_t t = 0; t < 3; ++t) {
      for (int64_t k = 0; k < a.nb; ++k) {
        const float* xb = &x[(size_t)(t * cols + block * k)];
        bool finite = true;
        float amax = 0;
        for (int64_t i = 0; i < block; ++i) {
          finite &= std::isfinite(xb[i]);
          amax = std::max(amax, std::fabs(xb[i]));
        }
        const float dx = a.d_row(t)[k];
        if (!finite) {
          EXPECT_TRUE(std::isnan(dx));
          continue;
        }
        // A block whose scale's inverse overflows (below ~1e-38) is zeros.
        const float want = std::isinf(1.0f / (amax / 127.0f)) ? 0.0f : amax / 127.0f;
        EXPECT_EQ(dx, want);
        int32_t total = 0;
        for (int64_t i = 0; i < block; ++i) {
          const int q = a.q_row(t)[block * k + i];
          EXPECT_LE(std::abs(q), 127);
          if (dx > 0) EXPECT_LE(std::fabs((double)q * dx - xb[i]), 0.5001 * dx) << i;
          total += q;
        }
        int32_t s16 = 0;
        for (int64_t g = 0; g < block / 16; ++g) s16 += a.s16_row(t)[block * k / 16 + g];
        EXPECT_EQ(s16, total);
        if (block == 32) EXPECT_EQ(a.sx_row(t)[k], dx * (float)total);
      }
    }
  }
}

TEST(FastKernels, ExactModeIsUnchangedAndFastDiffers) {
  // The default mode is the exact one, and the fast mode is a different
  // computation (its int8 grid moves the results), so a mix-up shows.
  for (DType t : {DType::Q4_0, DType::Q4_K, DType::Q8_0}) {
    const Weights W = make_weights(t, 16, 512, 3, 0);
    const auto x = make_inputs(2, 512, 4, 0);
    std::vector<float> def(32), ex(32), fa(32);
    matmul_rows(W.view, x.data(), 2, def.data(), 16, 0, 16);
    matmul_rows(W.view, x.data(), 2, ex.data(), 16, 0, 16, Numerics::Exact);
    matmul_rows(W.view, x.data(), 2, fa.data(), 16, 0, 16, Numerics::Fast);
    EXPECT_EQ(std::memcmp(def.data(), ex.data(), 32 * 4), 0) << dtype_traits(t).name;
    EXPECT_NE(std::memcmp(ex.data(), fa.data(), 32 * 4), 0) << dtype_traits(t).name;
  }
}

}  // namespace
}  // namespace megakern
