#include "exec/moe_kernels.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "exec/op_kernels.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec.h"

namespace megakern {
namespace {

int width_of(const StepContext& ctx, int slot) { return ctx.program->slots[static_cast<size_t>(slot)].width; }

float* row_of(const StepContext& ctx, int slot, int r) {
  return ctx.slot[static_cast<size_t>(slot)] + static_cast<size_t>(r) * static_cast<size_t>(width_of(ctx, slot));
}

// Rows [first, first + n) of W as a matrix of their own.
MatView rows_of(const MatView& W, int64_t first, int64_t n) {
  MatView v = W;
  v.data = W.row(first);
  v.rows = n;
  return v;
}

// y[j] = W[j] . x for all rows of W, with the optimised or the scalar kernel.
void matvec(const MatView& W, const float* x, float* y, bool scalar) {
  if (scalar) {
    const auto& tr = dtype_traits(W.type);
    for (int64_t j = 0; j < W.rows; ++j) y[j] = tr.dot(W.row(j), x, W.cols);
  } else {
    matmul_rows(W, x, 1, y, W.rows, 0, W.rows);
  }
}

}  // namespace

void moe_select(const float* scores, const float* bias, int n, int k, float scale, int32_t* ids, float* w) {
  thread_local std::vector<uint8_t> taken;
  taken.assign(static_cast<size_t>(n), 0);
  double sum = 0;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float best_v = 0.f;
    for (int e = 0; e < n; ++e) {
      if (taken[static_cast<size_t>(e)]) continue;
      const float v = scores[e] + (bias ? bias[e] : 0.f);
      // Strictly greater: among equal values the lowest id wins.
      if (best < 0 || v > best_v) {
        best = e;
        best_v = v;
      }
    }
    taken[static_cast<size_t>(best)] = 1;
    ids[j] = best;
    w[j] = scores[best];
    sum += scores[best];
  }
  const float inv = sum > 0 ? static_cast<float>(scale / sum) : 0.f;
  for (int j = 0; j < k; ++j) w[j] *= inv;
}

void moe_route_tile(const Op& op, const StepContext& ctx, int r) {
  const float* logits = row_of(ctx, op.in, r);
  float* route = row_of(ctx, op.out, r);
  const int n = op.n_expert, k = op.n_expert_used;
  thread_local std::vector<float> s;
  thread_local std::vector<int32_t> ids;
  s.resize(static_cast<size_t>(n));
  ids.resize(static_cast<size_t>(k));
  for (int e = 0; e < n; ++e) s[static_cast<size_t>(e)] = 1.f / (1.f + std::exp(-logits[e]));
  moe_select(s.data(), op.bias, n, k, op.scale, ids.data(), route + k);
  for (int j = 0; j < k; ++j) route[j] = static_cast<float>(ids[static_cast<size_t>(j)]);
}

void moe_experts_tile(const Op& op, const StepContext& ctx, int r, int j) {
  const float* x = row_of(ctx, op.in, r);
  const float* route = row_of(ctx, op.in2, r);
  const int F = op.expert_ff;
  const int64_t d_out = op.mat2.rows / op.n_expert;
  const int e = static_cast<int>(route[j]);
  MK_DCHECK(e >= 0 && e < op.n_expert, "expert id {} out of range", e);
  float* y = row_of(ctx, op.out, r) + static_cast<size_t>(j) * static_cast<size_t>(d_out);
  thread_local std::vector<float> gu;  // [2F]: gate then up
  gu.resize(2 * static_cast<size_t>(F));
  matvec(rows_of(op.mat, static_cast<int64_t>(e) * 2 * F, 2 * F), x, gu.data(), ctx.scalar);
  for (int i = 0; i < F; ++i) {
    const float g = gu[static_cast<size_t>(i)], u = gu[static_cast<size_t>(F + i)];
    gu[static_cast<size_t>(i)] = op.situ ? situ(g, u) : silu(g) * u;
  }
  matvec(rows_of(op.mat2, e * d_out, d_out), gu.data(), y, ctx.scalar);
}

void moe_combine_tile(const Op& op, const StepContext& ctx, int r) {
  const int D = width_of(ctx, op.out), k = op.n_expert_used;
  const float* ys = row_of(ctx, op.in, r);
  const float* w = row_of(ctx, op.in2, r) + k;
  float* out = row_of(ctx, op.out, r);
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(D));
  auto axpy = ctx.scalar ? axpy_f32_scalar : axpy_f32;
  for (int j = 0; j < k; ++j) axpy(w[j], ys + static_cast<size_t>(j) * D, out, D);
}

}  // namespace megakern
