#include "exec/kimi_kernels.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "exec/op_kernels.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec.h"

namespace megakern {
// Attention residuals: the sublayer input is a softmax mixture of the first
// `block` blocks (the embedding, the finished blocks and the running prefix).
// Block i is scored by its dot with the learned vector w, divided by its RMS:
//   score_i = (v_i . w) * rsqrt(mean(v_i^2) + eps),  p = softmax(score),
//   out = sum_i p_i v_i     (sums in block order).
void attn_res_mix_tile(const Op& op, const StepContext& ctx, int r) {
  const int H = width_of(ctx, op.out), n = op.block;
  const float* blocks = row_of(ctx, op.in, r);  // [n_blocks][H]
  float* out = row_of(ctx, op.out, r);
  auto dot = ctx.scalar ? dot_f32_scalar : dot_f32;
  auto axpy = ctx.scalar ? axpy_f32_scalar : axpy_f32;
  thread_local std::vector<float> score;
  score.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const float* v = blocks + static_cast<size_t>(i) * H;
    double ss = 0;
    for (int j = 0; j < H; ++j) ss += static_cast<double>(v[j]) * v[j];
    const float inv_rms = static_cast<float>(1.0 / std::sqrt(ss / H + op.eps));
    score[static_cast<size_t>(i)] = dot(v, op.norm, H) * inv_rms;
  }
  if (ctx.scalar)
    softmax_inplace_scalar(score.data(), n);
  else
    softmax_inplace(score.data(), n);
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(H));
  for (int i = 0; i < n; ++i) axpy(score[static_cast<size_t>(i)], blocks + static_cast<size_t>(i) * H, out, H);
}

void attn_res_add_tile(const Op& op, const StepContext& ctx, int r) {
  const int H = width_of(ctx, op.in);
  const float* in = row_of(ctx, op.in, r);
  float* dst = row_of(ctx, op.out, r) + static_cast<size_t>(op.block) * H;
  if (op.overwrite)
    std::memcpy(dst, in, sizeof(float) * static_cast<size_t>(H));
  else
    for (int j = 0; j < H; ++j) dst[j] += in[j];
}

// NoPE MLA key: head h is [k_nope of head h | the shared extra dims].
void mla_key_tile(const Op& op, const StepContext& ctx, int r) {
  const int shared = width_of(ctx, op.in2), own = op.head_dim - shared;
  const float* kn = row_of(ctx, op.in, r);
  const float* ke = row_of(ctx, op.in2, r);
  float* out = row_of(ctx, op.out, r);
  for (int h = 0; h < op.n_head; ++h) {
    float* oh = out + static_cast<size_t>(h) * op.head_dim;
    std::memcpy(oh, kn + static_cast<size_t>(h) * own, sizeof(float) * static_cast<size_t>(own));
    std::memcpy(oh + own, ke, sizeof(float) * static_cast<size_t>(shared));
  }
}

}  // namespace megakern
