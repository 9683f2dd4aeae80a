#include "kernels/cpu/kv_decode.h"

#include <cstring>

#include "core/half.h"
#include "kernels/cpu/cpu_features.h"

namespace megakern {

void kv_decode_rows_scalar(KvType t, const uint8_t* src, int64_t stride, int64_t rows, int64_t n, float* dst) {
  for (int64_t r = 0; r < rows; ++r, src += stride, dst += n) {
    if (t == KvType::q8_0) {
      for (int64_t b = 0; b < n / kKvQ8Block; ++b) {
        const uint8_t* blk = src + b * static_cast<int64_t>(kKvQ8BlockBytes);
        uint16_t h;
        std::memcpy(&h, blk, 2);
        const float d = f16_to_f32(h);
        for (int j = 0; j < kKvQ8Block; ++j)
          dst[b * kKvQ8Block + j] = static_cast<float>(static_cast<int8_t>(blk[2 + j])) * d;
      }
      continue;
    }
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = t == KvType::f16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
  }
}

void kv_decode_rows(KvType t, const uint8_t* src, int64_t stride, int64_t rows, int64_t n, float* dst, bool scalar) {
  if (!scalar && use_avx2() && cpu_features().f16c)
    kv_decode_rows_avx2(t, src, stride, rows, n, dst);
  else
    kv_decode_rows_scalar(t, src, stride, rows, n, dst);
}

}  // namespace megakern
