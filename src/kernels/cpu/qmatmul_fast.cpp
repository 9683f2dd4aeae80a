#include "kernels/cpu/qmatmul_fast.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/format_kernels.h"

namespace megakern {

bool uses_fast_acts(DType t) { return format_kernels(t).fast_block != 0; }

int fast_act_block(DType t) {
  const int b = format_kernels(t).fast_block;
  return b != 0 ? b : 32;
}

// From how many inputs on the register-blocked kernel takes a format
// (format_kernels.cpp says how the thresholds were measured).
// MEGAKERN_FAST_R8_MIN overrides it for every format (tuning and tests;
// results are the same either way).
int fast_r8_min_inputs(DType t, bool vnni) {
  static const int forced = (int)threshold_from_env("MEGAKERN_FAST_R8_MIN");
  if (forced > 0) return forced;
  const FormatKernels& k = format_kernels(t);
  return vnni ? k.r8_min_inputs_vnni : k.r8_min_inputs;
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
