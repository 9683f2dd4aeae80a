// The `fast` numerics mode's matrix kernels (core/numerics.h): 8-bit
// activations and integer dot products with 8-bit operands (vpmaddubsw).
//
// Activations. Each input row is quantised to int8 per block of `block`
// elements (32 for the 32-element formats, 256 for the K-quants), with
// dx = absmax / 127 and q = round-half-even(x / dx) in -127..127. Alongside:
// the sum of q over every 16 elements (s16) and, for 32-element blocks,
// sx = dx * (float)(sum of q over the block). A block holding inf or NaN gets
// dx = NaN and q = 0 (the outputs become NaN, as the f32 product would).
//
// Weights decode to small signed integers w (value = scale * w [+ min]):
//
//  * 32-element formats (Q4_0, Q4_1, Q5_0, Q8_0, MXFP4, NVFP4, INT4_G128,
//    INT8_COL, IQ4_NL; and Q3_K, whose scales are floats per 16 elements,
//    sub-block by sub-block): for output (t, j) and
//    block k of the row,
//        isum  = sum_i w_i q_i            (exact int32; per 16-element half
//                                          for NVFP4's two scales)
//        acc   = fma((float)isum, sc_k * dx_k, acc)
//        (NVFP4, Q3_K: acc = fma((float)isum_lo, sc0 * dx, acc);
//                acc = fma((float)isum_hi, sc1 * dx, acc))
//        (Q4_1:  acc = fma(mn_k, sx_k, acc) after the scale term)
//    with two accumulators, acc0 for even blocks k and acc1 for odd ones
//    (two dependency chains), and Y = acc0 + acc1;
//  * K-quants (Q4_K, Q5_K, Q6_K, IQ4_XS), 256-element blocks with integer
//    group scales:
//        isum  = sum_g sc_g * sum_{i in g} w_i q_i        (exact int32)
//        acc   = fma((float)isum, d * dx, acc)
//        (Q4_K, Q5_K: msum = sum_g m_g * sum_{i in g} q_i;
//                acc = fma((float)msum, (-dmin) * dx, acc))
//    with one accumulator, Y = acc.
// Accumulators start at 0 and blocks are taken in order. Every product of
// scales is one rounded f32 multiplication. Integer sums are exact in any
// order, so a kernel may compute them however it likes (the AVX2 kernels
// use unsigned codes and subtract offset * sum(q), int16 products for 8-bit
// weights, or, for Q6_K, q + 128 against signed weights less a weight-only
// term); the float steps are the only ordered part, and they are
// per output. A row's result therefore does not depend on how many inputs
// or weight rows are computed together, nor on the ISA: the scalar code in
// kernels/ref/fast_ref.h is the portable path and the bit-exact oracle.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace megakern {

// True for the formats the fast mode computes with 8-bit activations; the
// others (f32, f16, bf16, fp8) take the f32 path in both modes.
bool uses_fast_acts(DType t);
// Activation block of a format: 256 for the K-quants, 32 otherwise.
int fast_act_block(DType t);

struct Q8Acts {
  int64_t n_x = 0, cols = 0, block = 32, nb = 0;  // nb = cols / block
  // Unique to one quantisation (set by prepare_q8_acts, so by every
  // quantiser; 0: not known). Kernels that derive tables from the
  // activations (offsets, re-encoded codes) keep them for the next call on
  // the same id: a product run in chunks of rows, one call each, derives
  // them once.
  uint64_t id = 0;
  std::vector<int8_t> q;    // [n_x][cols]
  std::vector<float> d;     // [n_x][nb] dx
  std::vector<float> sx;    // [n_x][nb] dx * sum of the block's q (block 32 only)
  std::vector<int16_t> s16; // [n_x][cols / 16] sums of q over 16 elements
  const int8_t* q_row(int64_t t) const { return q.data() + t * cols; }
  const float* d_row(int64_t t) const { return d.data() + t * nb; }
  const float* sx_row(int64_t t) const { return sx.data() + t * nb; }
  const int16_t* s16_row(int64_t t) const { return s16.data() + t * (cols / 16); }
};

// X is [n_x][cols], cols a multiple of block. The AVX2 and scalar versions
// give identical results; quantize_q8_acts picks one.
void quantize_q8_acts(const float* X, int64_t n_x, int64_t cols, int64_t block, Q8Acts& out);
void quantize_q8_acts_scalar(const float* X, int64_t n_x, int64_t cols, int64_t block, Q8Acts& out);
void quantize_q8_acts_avx2(const float* X, int64_t n_x, int64_t cols, int64_t block, Q8Acts& out);
void prepare_q8_acts(int64_t n_x, int64_t cols, int64_t block, Q8Acts& out);

// Y[t][j] for t < A.n_x, j in [row_begin, row_end); W.type must satisfy
// uses_fast_acts and A.block must be fast_act_block(W.type).
void matmul_rows_fast_ref(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t row_begin,
                          int64_t row_end);
void matmul_rows_fast_avx2(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t row_begin,
                           int64_t row_end);
// The register-blocked AVX2 kernel for many inputs (qmatmul_fast_r8_avx2.cpp),
// for the formats fast_r8_supports names; matmul_rows_fast_avx2 takes it
// from fast_r8_min_inputs(type, AVX-VNNI in use) inputs on. Same results,
// bit for bit.
bool fast_r8_supports(DType t);
int fast_r8_min_inputs(DType t, bool vnni);
void matmul_rows_fast_r8_avx2(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t row_begin,
                              int64_t row_end);
// The same kernel with AVX-VNNI (qmatmul_fast_r8_vnni_avx2.cpp): only where
// the host has AVX-VNNI (isa.h); matmul_rows_fast_avx2 takes it there. Same bits.
void matmul_rows_fast_r8_vnni(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t row_begin,
                              int64_t row_end);
// And with AVX512-VNNI's EVEX encodings (qmatmul_fast_r8_evex_avx2.cpp).
void matmul_rows_fast_r8_evex(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t row_begin,
                              int64_t row_end);
// The same two kernels built for few inputs (qmatmul_fast_r8_few_*.cpp:
// the next weights trickle in over a group's passes rather than arriving
// in bursts), which matmul_rows_fast_avx2 takes up to kFastR8FewInputs
// inputs. Same bits.
constexpr int64_t kFastR8FewInputs = 16;
void matmul_rows_fast_r8_few_avx2(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t row_begin,
                                  int64_t row_end);
void matmul_rows_fast_r8_few_vnni(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t row_begin,
                                  int64_t row_end);
void matmul_rows_fast_r8_few_evex(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t row_begin,
                                  int64_t row_end);

}  // namespace megakern
