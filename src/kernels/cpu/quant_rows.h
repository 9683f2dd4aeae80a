// Row decoders for block-quantised weights: dequantise one row to f32, with
// an AVX2 version that gives exactly the scalar reference's floats (each
// 32-element sub-block is decoded with the reference's arithmetic, no fused
// multiply-adds). Used for embedding lookups and the portable f32 matrix
// path; the matrix kernels proper are in qmatmul.h.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace megakern {

// True when the AVX2 path handles this type (and the CPU has AVX2/FMA).
bool quant_rows_fast(DType t);

// n elements of row `w` -> dst. Uses the AVX2 decoder when available, else the
// scalar reference; both give identical floats.
void dequantize_row_fast(DType t, const void* w, float* dst, int64_t n);

// AVX2 versions (n a multiple of the type's block size); only call when
// quant_rows_fast(t).
void dequantize_row_avx2(DType t, const void* w, float* dst, int64_t n);
bool avx2_row_kernels_support(DType t);

}  // namespace megakern
