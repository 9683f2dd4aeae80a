// Row kernels over block-quantised weights: dequantise a row, or take its dot
// product with an f32 vector without materialising the row.
//
// For a given ISA, dot_row_fast(w, x) is bit for bit equal to dequantize
// then dot_f32 of the same row, because both decode each 32-element sub-block
// to the same floats (computed exactly as the scalar reference dequantiser
// does) and accumulate them in the same order as dot_f32.
//
// matmul_rows / matmul no longer go through dot_row_fast: they use the
// multi-input kernels of qmatmul.h (int16 activations for the quantised
// formats), whose per-output arithmetic is fixed independently of n_x, the
// row range and the thread. dequantize_row_fast remains the row decoder
// behind dequantize_row (embeddings).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace megakern {

// True when the AVX2 path handles this type (and the CPU has AVX2/FMA).
bool quant_rows_fast(DType t);

// n elements of row `w` -> dst. Uses the AVX2 decoder when available, else the
// scalar reference; both give identical floats.
void dequantize_row_fast(DType t, const void* w, float* dst, int64_t n);

// sum_i w[i] * x[i] with the same result as dequantize_row_fast + dot_f32.
float dot_row_fast(DType t, const void* w, const float* x, int64_t n);

// AVX2 versions (n a multiple of the type's block size); only call when
// quant_rows_fast(t).
void dequantize_row_avx2(DType t, const void* w, float* dst, int64_t n);
float dot_row_avx2(DType t, const void* w, const float* x, int64_t n);
bool avx2_row_kernels_support(DType t);

}  // namespace megakern
