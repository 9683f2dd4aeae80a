#include "kernels/cpu/qmatmul_fast.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/cpu/cpu_features.h"

namespace megakern {

bool uses_fast_acts(DType t) {
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q6_K:
    case DType::MXFP4:
    case DType::NVFP4:
    case DType::INT4_G128:
    case DType::INT8_COL:
    case DType::Q3_K:
    case DType::Q5_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

int fast_act_block(DType t) {
  return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::IQ4_XS ? 256 : 32;
}

// From how many inputs on the register-blocked kernel takes a format: its
// tile transposition is paid once per group of rows and chunk, so it wins
// from a few inputs, and from fewer where vpdpbusd makes its passes cheap.
// Measured per format and variant with one thread (K = 1024, N = 4096, 2 and
// 3 inputs against the per-row kernel); formats not listed keep 4.
// MEGAKERN_FAST_R8_MIN overrides it for every format (tuning and tests;
// results are the same either way).
int fast_r8_min_inputs(DType t, bool vnni) {
  static const int forced = (int)threshold_from_env("MEGAKERN_FAST_R8_MIN");
  if (forced > 0) return forced;
  switch (t) {
    // The 32-element formats' kernel for up to four inputs (fast32_few:
    // each block decoded in registers and met by every input) streams its
    // weights better than the register-blocked one at two inputs.
    case DType::Q4_K:
      return 2;
    case DType::Q5_K:
      return vnni ? 2 : 4;
    case DType::Q4_0:
    case DType::MXFP4:
    case DType::Q4_1:
      return 3;
    case DType::Q8_0:
    case DType::INT8_COL:
    case DType::IQ4_NL:
    case DType::Q5_0:
    case DType::Q3_K:
      return vnni ? 3 : 4;
    default:
      return 4;
  }
}

void prepare_q8_acts(int64_t n_x, int64_t cols, int64_t block, Q8Acts& A) {
  static std::atomic<uint64_t> next_id{1};
  A.id = next_id.fetch_add(1, std::memory_order_relaxed);
  MK_CHECK(block == 32 || block == 256, "activation block {} is neither 32 nor 256", block);
  MK_CHECK(cols % block == 0, "8-bit activations in blocks of {} need a multiple of {} columns, got {}", block,
           block, cols);
  A.n_x = n_x;
  A.cols = cols;
  A.block = block;
  A.nb = cols / block;
  const size_t total = (size_t)(n_x * cols);
  if (A.q.size() < total) A.q.resize(total);
  if (A.d.size() < (size_t)(n_x * A.nb)) A.d.resize((size_t)(n_x * A.nb));
  if (A.sx.size() < (size_t)(n_x * A.nb)) A.sx.resize((size_t)(n_x * A.nb));
  if (A.s16.size() < total / 16) A.s16.resize(total / 16);
}

void quantize_q8_acts(const float* X, int64_t n_x, int64_t cols, int64_t block, Q8Acts& A) {
  if (use_avx2())
    quantize_q8_acts_avx2(X, n_x, cols, block, A);
  else
    quantize_q8_acts_scalar(X, n_x, cols, block, A);
}

// nearbyint (in the default rounding mode) and the f32 division and
// multiplication are exactly rounded, so the AVX2 version reproduces this.
void quantize_q8_acts_scalar(const float* X, int64_t n_x, int64_t cols, int64_t block, Q8Acts& A) {
  prepare_q8_acts(n_x, cols, block, A);
  for (int64_t t = 0; t < n_x; ++t) {
    for (int64_t k = 0; k < A.nb; ++k) {
      const float* x = X + t * cols + block * k;
      int8_t* q = A.q.data() + t * cols + block * k;
      int16_t* s16 = A.s16.data() + (t * cols + block * k) / 16;
      float amax = 0.0f;
      bool finite = true;
      for (int64_t i = 0; i < block; ++i) {
        amax = std::fmax(amax, std::fabs(x[i]));
        finite &= std::isfinite(x[i]);
      }
      float d = amax / 127.0f;
      float id = d != 0.0f ? 1.0f / d : 0.0f;
      if (std::isinf(id)) d = id = 0.0f;  // block below ~1e-38: treated as zeros
      if (!finite) d = std::numeric_limits<float>::quiet_NaN();
      int32_t total = 0;
      for (int64_t g = 0; g < block / 16; ++g) {
        int32_t s = 0;
        for (int i = 0; i < 16; ++i) {
          const int v = finite ? (int)std::nearbyint(x[16 * g + i] * id) : 0;
          q[16 * g + i] = (int8_t)v;
          s += v;
        }
        s16[g] = (int16_t)s;
        total += s;
      }
      A.d[(size_t)(t * A.nb + k)] = d;
      A.sx[(size_t)(t * A.nb + k)] = d * (float)total;
    }
  }
}

}  // namespace megakern
