// The register-blocked f32 kernel (kernels/cpu/matmul_f32_tiled.h) against
// the row-by-row one, bit for bit, for F32, F16, BF16 and FP8_E4M3: every
// number of inputs from 1 to 70 (every remainder of the 4-input block), row
// counts that leave partial 3-row groups and span several panels, row ranges
// starting and ending inside a panel or a row group, columns with 8-element
// and scalar tails, misaligned weights and inputs. Also against
// dot_f32_avx2 over the reference dequantisation (the contract both promise).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_f32_tiled.h"
#include "kernels/cpu/vec.h"
#include "weights_util.h"

namespace megakern {
namespace {

std::vector<float> make_x(int64_t n_x, int64_t cols, uint32_t seed, size_t offset) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x((size_t)(n_x * cols) + offset);
  for (int64_t i = 0; i < n_x * cols; ++i) x[offset + (size_t)i] = g(rng) * ((i % 89) == 3 ? 40.0f : 1.0f);
  return x;
}

struct Case {
  DType type;
  int64_t cols, rows;
};

// Rows chosen so that each case but the narrowest spans at least two panels
// of the kernel's ~384 KiB (the last one partial), and ends in a partial
// 3-row group.
std::vector<Case> cases() {
  std::vector<Case> v;
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    v.push_back({t, 8, 101});  // one panel (12288 rows of 8 would fit)
    v.push_back({t, 40, 2 * 2457 + 11});
    v.push_back({t, 1000, 200});
    v.push_back({t, 1027, 203});
    v.push_back({t, 4096, 53});
    v.push_back({t, 5, 7});  // no vector step at all: scalar tail only
  }
  for (int64_t cols : {32, 64, 1024, 4096}) v.push_back({DType::FP8_E4M3, cols, cols <= 64 ? 3100 : cols == 1024 ? 200 : 53});
  return v;
}

TEST(F32Tiled, MatchesRowwiseKernelBitForBit) {
  if (!use_avx2()) GTEST_SKIP() << "AVX2 kernels only";
  constexpr int64_t kMaxX = 70;
  int compared = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(std::string(dtype_traits(c.type).name) + " cols=" + std::to_string(c.cols));
    const Weights W = make_weights(c.type, c.rows, c.cols, (uint32_t)(c.cols * 31 + c.rows), (size_t)(c.cols % 3));
    const auto xbuf = make_x(kMaxX, c.cols, (uint32_t)c.cols + 5, 1);
    const float* X = xbuf.data() + 1;
    std::vector<float> want((size_t)(kMaxX * c.rows));
    matmul_rows_f32_rowwise_avx2(W.view, X, kMaxX, want.data(), c.rows, 0, c.rows);

    std::mt19937 rng((uint32_t)c.cols);
    std::vector<float> got((size_t)(kMaxX * c.rows));
    for (int64_t n_x = 1; n_x <= kMaxX; ++n_x) {
      // A window of n_x inputs, a row range that starts and ends anywhere
      // (every fourth call: all rows).
      const int64_t t0 = (int64_t)(rng() % (uint32_t)(kMaxX - n_x + 1));
      int64_t rb = (int64_t)(rng() % (uint32_t)c.rows), re = (int64_t)(rng() % (uint32_t)(c.rows + 1));
      if (rb > re) std::swap(rb, re);
      if (n_x % 4 == 0) rb = 0, re = c.rows;
      std::fill(got.begin(), got.end(), -7.0f);
      matmul_rows_f32_tiled_avx2(W.view, X + t0 * c.cols, n_x, got.data() + t0 * c.rows, c.rows, rb, re);
      // The window's inputs, and the inputs either side of it.
      for (int64_t t = std::max<int64_t>(0, t0 - 1); t < std::min(kMaxX, t0 + n_x + 1); ++t) {
        for (int64_t j = 0; j < c.rows; ++j) {
          const size_t o = (size_t)(t * c.rows + j);
          const bool inside = t >= t0 && t < t0 + n_x && j >= rb && j < re;
          if (inside) {
            if (std::memcmp(&got[o], &want[o], sizeof(float)) != 0)
              FAIL()
                << "n_x=" << n_x << " rows [" << rb << "," << re << ") input " << t << " row " << j << ": " << got[o]
                << " vs " << want[o];
            ++compared;
          } else if (got[o] != -7.0f) {
            FAIL() << "wrote outside its range: input " << t << " row " << j;
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 100000);
}

TEST(F32Tiled, EqualsDotOfReferenceDequantisation) {
  if (!use_avx2()) GTEST_SKIP() << "AVX2 kernels only";
  for (const Case& c : cases()) {
    SCOPED_TRACE(std::string(dtype_traits(c.type).name) + " cols=" + std::to_string(c.cols));
    const int64_t rows = std::min<int64_t>(c.rows, 41), n_x = 11;
    const Weights W = make_weights(c.type, rows, c.cols, (uint32_t)c.cols + 9, 3);
    const auto xbuf = make_x(n_x, c.cols, (uint32_t)c.cols + 2, 2);
    const float* X = xbuf.data() + 2;
    std::vector<float> got((size_t)(n_x * rows)), w((size_t)c.cols);
    matmul_rows_f32_tiled_avx2(W.view, X, n_x, got.data(), rows, 0, rows);
    for (int64_t j = 0; j < rows; ++j) {
      dtype_traits(c.type).dequantize(W.view.row(j), w.data(), c.cols);
      for (int64_t t = 0; t < n_x; ++t) {
        const float want = dot_f32_avx2(w.data(), X + t * c.cols, c.cols);
        const float y = got[(size_t)(t * rows + j)];
        ASSERT_EQ(std::memcmp(&y, &want, sizeof(float)), 0) << "row " << j << " input " << t << ": " << y << " vs " << want;
      }
    }
  }
}

// Through the public entry point: matmul_rows picks the tiled kernel from
// f32_tiled_min_inputs() inputs on (counts below, at and above it); the
// outputs stay those of one input alone.
TEST(F32Tiled, MatmulRowsIndependentOfBatch) {
  const int64_t cols = 1027, rows = 29, m = f32_tiled_min_inputs();
  const Weights W = make_weights(DType::F16, rows, cols, 4, 1);
  for (int64_t n_x : {std::max<int64_t>(1, m - 1), m, m + 1, m + 5}) {
    const auto xbuf = make_x(n_x, cols, 6, 0);
    std::vector<float> all((size_t)(n_x * rows)), one((size_t)rows);
    matmul_rows(W.view, xbuf.data(), n_x, all.data(), rows, 0, rows);
    for (int64_t t = 0; t < n_x; ++t) {
      matmul_rows(W.view, xbuf.data() + t * cols, 1, one.data(), rows, 0, rows);
      ASSERT_EQ(std::memcmp(one.data(), all.data() + t * rows, sizeof(float) * (size_t)rows), 0)
          << n_x << " inputs, input " << t;
    }
  }
}

}  // namespace
}  // namespace megakern
