#include "kernels/cpu/qmatmul.h"

#include <atomic>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/format_kernels.h"

namespace megakern {

bool uses_i16_acts(DType t) { return format_kernels(t).i16_acts; }

// nearbyint (in the default rounding mode) and the f32 division and
// multiplication are exactly rounded, so the AVX2 version reproduces this.
void prepare_acts(int64_t n_x, int64_t cols, QuantizedActs& A) {
  MK_CHECK(cols % 32 == 0, "integer activations need a multiple of 32 columns, got {}", cols);
  static std::atomic<uint64_t> next_id{1};
  A.id = next_id.fetch_add(1, std::memory_order_relaxed);
  A.n_x = n_x;
  A.cols = cols;
  A.nb = cols / 32;
  const size_t total = (size_t)(n_x * cols);
  if (A.q.size() < total) A.q.resize(total);
  if (A.d.size() < (size_t)(n_x * A.nb)) A.d.resize((size_t)(n_x * A.nb));
  if (A.sum.size() < (size_t)(n_x * A.nb)) A.sum.resize((size_t)(n_x * A.nb));
}

void quantize_acts(const float* X, int64_t n_x, int64_t cols, QuantizedActs& A) {
  if (use_avx2())
    quantize_acts_avx2(X, n_x, cols, A);
  else
    quantize_acts_scalar(X, n_x, cols, A);
}

void quantize_acts_scalar(const float* X, int64_t n_x, int64_t cols, QuantizedActs& A) {
  prepare_acts(n_x, cols, A);
  for (int64_t t = 0; t < n_x; ++t) {
    for (int64_t k = 0; k < A.nb; ++k) {
      const float* x = X + t * cols + 32 * k;
      int16_t* q = A.q.data() + t * cols + 32 * k;
      float amax = 0.0f;
      bool finite = true;
      for (int i = 0; i < 32; ++i) {
        amax = std::fmax(amax, std::fabs(x[i]));
        finite &= std::isfinite(x[i]);
      }
      float d = amax / 32767.0f;
      float id = d != 0.0f ? 1.0f / d : 0.0f;
      if (std::isinf(id)) d = id = 0.0f;  // block below ~1e-38: treated as zeros
      if (!finite) d = std::numeric_limits<float>::quiet_NaN();  // poison the outputs, as f32 would
      int32_t total = 0;
      for (int i = 0; i < 32; ++i) {
        const int v = finite ? (int)std::nearbyint(x[i] * id) : 0;
        q[i] = (int16_t)v;
        total += v;
      }
      A.d[(size_t)(t * A.nb + k)] = d;
      A.sum[(size_t)(t * A.nb + k)] = d * (float)total;
    }
  }
}

}  // namespace megakern
