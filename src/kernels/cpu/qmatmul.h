// Multi-input matrix kernels behind matmul_rows (matmul.h): one pass over each
// weight row serves every input row (n_x of 1..64), with dequantisation fused.
//
// Two numerical schemes, chosen by the weight format alone (never by ISA,
// n_x, row range or thread):
//
//  * int16 activations (uses_i16_acts): Q4_0, Q4_1, Q5_0, Q8_0, Q3_K, Q4_K,
//    Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, NVFP4, INT4_G128, INT8_COL. Each input row is quantised per 32
//    elements to int16 with an f32 scale dx = absmax / 32767. (int8
//    activations, as GGML's q8_0, were tried first: they are as fast here but
//    moved the real-model logits by up to 1.7 and top-1 agreement to 94 %;
//    int16 is ~256x finer for the same instruction count per input, using
//    vpmaddwd instead of vpmaddubsw.) A 32-element weight sub-block decodes
//    to 32 small integers w (signed, or the unsigned code for Q4_1/Q4_K/Q5_K),
//    a scale per 16 elements and, for Q4_1/Q4_K/Q5_K, an additive min. Where
//    the per-16 scales are integers times a block factor (Q3_K, Q6_K: sc_h
//    = d * isc_h), w is premultiplied: w_i = isc_h * q_i (|w| <= 4096), and
//    the sub-block has the one scale d. For output (t, j) and sub-block k
//    there are eight lanes l; lane l covers elements {2l, 2l+1} of the first
//    half ("lo") and {16+2l, 17+2l} of the second:
//        lo_l, hi_l = sums of w * xq over the lane's two pairs (exact int32)
//        one scale:  acc_l = fma((float)(lo_l + hi_l), sc * dx, acc_l)
//        per-16 scales (NVFP4):
//                    acc_l = fma((float)lo_l, sc0 * dx, acc_l)
//                    acc_l = fma((float)hi_l, sc1 * dx, acc_l)
//    Sub-blocks are taken in pairs (0,1), (2,3), ...: a pair's contributions
//    are applied as above to a zero vector, which is then added to acc (this
//    halves the accumulator's dependency chain); an odd last sub-block is
//    applied to acc directly. The mins (Q4_1, Q4_K, Q5_K) are applied once
//    per group of eight sub-blocks (0..7, 8..15, ...: the K-quants'
//    256-blocks), after the group's sub-blocks, lane l taking sub-block l of
//    the group: acc_l = fma(mn_l, S_l, acc_l), S = dx * (float)(sum of the
//    sub-block's 32 xq), precomputed (one multiply-add per group and input
//    instead of one per sub-block); a row's last group may be shorter, and
//    its other lanes take nothing. Finally
//    Y = ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)). Every integer sum is exact
//    (below 2^30); its conversion to float rounds to nearest (exact below
//    2^24, i.e. always but for the premultiplied formats). The AVX2 kernel
//    computes exactly this and so does the scalar code in
//    kernels/ref/i16_ref.h, which is the portable path: both ISAs give the
//    same bits for these formats.
//
//  * f32 activations: F32, F16, BF16, FP8_E4M3. The row is decoded to the
//    reference dequantiser's floats and summed exactly as dot_f32 does on the
//    current ISA, so Y equals dot_f32(dequantized row, x) bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace megakern {

// True for the formats computed with int16 activations (see above).
bool uses_i16_acts(DType t);

// Input rows quantised per 32 elements.
struct QuantizedActs {
  int64_t n_x = 0, cols = 0, nb = 0;  // nb = cols / 32
  std::vector<int16_t> q;             // [n_x][cols], each in -32767..32767
  std::vector<float> d;               // [n_x][nb]: dx (NaN if the block holds inf/NaN)
  std::vector<float> sum;             // [n_x][nb]: S, dx * the sub-block's sum of xq (see above)
  // Unique to one quantisation (set by prepare_acts; 0: not known): kernels
  // keep what they derive from the inputs for the next call on the same id.
  uint64_t id = 0;
  const int16_t* q_row(int64_t t) const { return q.data() + t * cols; }
  const float* d_row(int64_t t) const { return d.data() + t * nb; }
  const float* sum_row(int64_t t) const { return sum.data() + t * nb; }
};

// X is [n_x][cols], cols a multiple of 32. q = round-half-even(x * (1/dx)).
// The AVX2 and scalar versions give identical results; quantize_acts picks one.
void quantize_acts(const float* X, int64_t n_x, int64_t cols, QuantizedActs& out);
void quantize_acts_scalar(const float* X, int64_t n_x, int64_t cols, QuantizedActs& out);
void quantize_acts_avx2(const float* X, int64_t n_x, int64_t cols, QuantizedActs& out);  // buffers sized
// Sizes out's buffers for n_x x cols.
void prepare_acts(int64_t n_x, int64_t cols, QuantizedActs& out);

// AVX2 kernels (qmatmul_avx2.cpp; the f32 path in matmul_f32_avx2.cpp); call
// only when use_avx2().
// Integer path: W.type must satisfy uses_i16_acts; A holds all n_x inputs.
void matmul_rows_i16_avx2(const MatView& W, const QuantizedActs& A, float* Y, int64_t ldy, int64_t row_begin,
                           int64_t row_end);
// The same kernels built for AVX-VNNI and for AVX512-VNNI (EVEX; the same
// bits; call only where the host has them: isa.h).
void matmul_rows_i16_vnni(const MatView& W, const QuantizedActs& A, float* Y, int64_t ldy, int64_t row_begin,
                          int64_t row_end);
void matmul_rows_i16_evex(const MatView& W, const QuantizedActs& A, float* Y, int64_t ldy, int64_t row_begin,
                          int64_t row_end);
// f32 path for F32, F16, BF16, FP8_E4M3.
bool f32_path_avx2_supports(DType t);
void matmul_rows_f32_avx2(const MatView& W, const float* X, int64_t n_x, float* Y, int64_t ldy, int64_t row_begin,
                          int64_t row_end);

}  // namespace megakern
