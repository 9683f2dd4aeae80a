// The f32 path of the multi-input kernels (qmatmul.h) for many inputs:
// F32, F16, BF16 and FP8_E4M3 weights, register-blocked over rows and inputs.
//
// Every output equals the row-by-row kernel's bit for bit, that is
// dot_f32_avx2(dequantized row j, input t): 32-element steps into four
// 8-lane accumulators (chain k takes elements 32m+8k..32m+8k+7 for m = 0, 1,
// ...), then 8-element steps into chain 0, then hsum((s0+s1)+(s2+s3)) and a
// scalar fused multiply-add per remaining element. The four chains do not
// depend on each other, so they are computed one after another (each in its
// own order over m) and combined at the end in that order.
//
// Layout of the work: a panel of weight rows is decoded to f32 once into a
// thread-local buffer of about 384 KiB, packed chain by chain with kRows = 3
// rows interleaved per 8-element step, and reused for every input; the
// inputs are packed the same way, kInputs = 4 per block, once per call. For
// one input block, one sub-panel of 24 rows and one chain, the inputs' slice
// stays in L1 while the rows' packed chain streams from L2: 3 x 4
// accumulators in registers, 3 weight vectors and one input vector (the 16
// ymm registers), 12 FMAs per 7 loads; the inner loop is 22 fused µops per
// 12 FMAs. F32 / F16 / BF16 rows are decoded and packed by the first input
// block's pass itself (their stores interleaved with its FMAs), FP8 rows
// beforehand; the next panel's raw weights are prefetched while a panel is
// used, and during the last panel of a call the rows its caller runs next
// (weight_lookahead() in matmul.h), when named.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/mat_view.h"

namespace megakern {

// The n_x inputs X ([n_x][cols]) packed into the tiled kernel's input
// layout, for weights of type t. A caller that runs several row ranges of
// matrices with the same inputs (the megakernel's chunks of a matrix
// product, or the matrices that read one slot) packs them once.
struct TiledF32Inputs {
  std::vector<float> buf;
  const float* data = nullptr;  // 32-byte aligned, inside buf
  int64_t n_x = 0, cols = 0;
  bool any = false;  // the layout of F32 / F16 / BF16 (true) or FP8_E4M3 (whole 32-blocks only)
};
void pack_tiled_f32_inputs(DType t, const float* X, int64_t n_x, int64_t cols, TiledF32Inputs& out);
// The packed-input layout weights of type t take: inputs packed for one
// type serve another of the same layout (1: F32 / F16 / BF16, 2: FP8_E4M3).
int tiled_f32_layout(DType t);

// Rows [rb, re) of W (F32, F16, BF16 or FP8_E4M3) times the n_x inputs X
// ([n_x][W.cols]) into Y ([n_x][ldy]). AVX2/FMA/F16C only (use_avx2()).
// `packed`, when given, holds X packed for W (pack_tiled_f32_inputs);
// otherwise the call packs X itself. Same bits either way.
void matmul_rows_f32_tiled_avx2(const MatView& W, const float* X, int64_t n_x, float* Y, int64_t ldy, int64_t rb,
                                int64_t re, const TiledF32Inputs* packed = nullptr);

// The row-by-row kernel (one weight row, one or two inputs at a time), the
// reference the tiled one must match (matmul_f32_avx2.cpp).
void matmul_rows_f32_rowwise_avx2(const MatView& W, const float* X, int64_t n_x, float* Y, int64_t ldy, int64_t rb,
                                  int64_t re);

// matmul_rows_f32_avx2 uses the tiled kernel from this many inputs on. The
// row-by-row kernel goes over a tile of rows once per pair of inputs,
// decoding it again each time; the tiled one decodes it once. One thread,
// weights in L3, best of 3-5 (ms per matrix, row-by-row -> tiled): BF16
// 1024 x 1024, 3 inputs 0.337 -> 0.217, 4: 0.344 -> 0.226, 7: 0.474 ->
// 0.299; BF16 2048 x 2048, 3: 1.25 -> 0.96; F16 2048 x 4096, 3: 2.16 ->
// 2.15, 4: 2.36 -> 2.19. At 2 inputs neither wins everywhere (F16 1024
// columns: 0.235 -> 0.209; 4096 columns: 1.82 -> 2.21).
constexpr int64_t kF32TiledMinInputs = 3;
// The threshold in use: kF32TiledMinInputs, or MEGAKERN_F32_TILED_MIN when
// set (A/B runs and tests; the bits are the same either way).
int64_t f32_tiled_min_inputs();

}  // namespace megakern
