// Scalar reference of the int16-activation matrix kernel (see
// kernels/cpu/qmatmul.h for the arithmetic). It is the portable path of
// matmul_rows for those formats and the bit-exact oracle for the AVX2 kernel.
#pragma once

#include <cstdint>

#include "kernels/cpu/qmatmul.h"

namespace megakern {

// One 32-element sub-block of a weight row, decoded for the int8 kernel:
// value[i] = sc[i / 16] * w[i] + mn.
struct I16Sub {
  int8_t w[32];
  float sc[2];
  float mn;       // 0 unless has_min
  bool has_min;   // Q4_1, Q4_K (code 0..15) and Q5_K (0..31): w holds the unsigned code
  // Q3_K and Q6_K: sc[h] = d * isc[h] (d the block's factor), which the
  // int16 kernel folds into the codes (qmatmul.h).
  bool int_scales;
  int8_t isc[2];
  float d;
};

// Decodes sub-block k (elements 32k..32k+31) of a row of type t.
void decode_i16_sub(DType t, const uint8_t* row, int64_t k, I16Sub& out);

// The whole kernel over rows [row_begin, row_end).
void matmul_rows_i16_ref(const MatView& W, const QuantizedActs& A, float* Y, int64_t ldy, int64_t row_begin,
                          int64_t row_end);

}  // namespace megakern
