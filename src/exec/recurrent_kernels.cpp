#include "exec/recurrent_kernels.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "exec/op_kernels.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec.h"

namespace megakern {

RecurrentState::RecurrentState(int n_layer_, int conv_dim_, int conv_hist_, int n_v_heads_, int v_dim_, int k_dim_)
    : n_layer(n_layer_), conv_dim(conv_dim_), conv_hist(conv_hist_), n_v_heads(n_v_heads_), v_dim(v_dim_), k_dim(k_dim_) {
  conv.assign(static_cast<size_t>(n_layer) * conv_hist * conv_dim, 0.f);
  S.assign(static_cast<size_t>(n_layer) * n_v_heads * v_dim * k_dim, 0.f);
}

void RecurrentState::reset() {
  std::fill(conv.begin(), conv.end(), 0.f);
  std::fill(S.begin(), S.end(), 0.f);
}

namespace {

int width_of(const StepContext& ctx, int slot) { return ctx.program->slots[static_cast<size_t>(slot)].width; }

float* row_of(const StepContext& ctx, int slot, int r) {
  return ctx.slot[static_cast<size_t>(slot)] + static_cast<size_t>(r) * static_cast<size_t>(width_of(ctx, slot));
}

inline float sigmoidf(float x) { return 1.f / (1.f + std::exp(-x)); }
// As torch.nn.functional.softplus (threshold 20).
inline float softplusf(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

// x * rsqrt(sum x^2 + eps) * scale, the sum accumulated in double.
void l2norm(const float* x, int n, float eps, float scale, float* out) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss + eps)) * scale;
  for (int i = 0; i < n; ++i) out[i] = x[i] * inv;
}

int key_dim_of(const Op& op, int in_width) { return (in_width - op.n_head * op.head_dim) / (2 * op.n_head_kv); }

}  // namespace

void sigmoid_gate_tile(const Op& op, const StepContext& ctx, int r) {
  float* o = row_of(ctx, op.out, r);
  const float* g = row_of(ctx, op.in, r);
  const int n = width_of(ctx, op.out);
  for (int i = 0; i < n; ++i) o[i] *= sigmoidf(g[i]);
}

void causal_conv_silu_tile(const Op& op, const StepContext& ctx, int r) {
  RecurrentState& st = *ctx.rows[r].state;
  float* x = row_of(ctx, op.out, r);
  const int C = width_of(ctx, op.out), K = op.n_norm / C, hist = K - 1;
  float* win = st.conv_at(op.cache_layer());
  for (int c = 0; c < C; ++c) {
    const float* w = op.norm + static_cast<size_t>(c) * K;
    float acc = 0.f;
    for (int j = 0; j < hist; ++j) acc += w[j] * win[static_cast<size_t>(j) * C + c];
    acc += w[hist] * x[c];
    for (int j = 0; j + 1 < hist; ++j) win[static_cast<size_t>(j) * C + c] = win[static_cast<size_t>(j + 1) * C + c];
    if (hist > 0) win[static_cast<size_t>(hist - 1) * C + c] = x[c];
    x[c] = silu(acc);
  }
}

namespace {

// KDA (Kimi Delta Attention) for head h of row r: the delta rule with a decay
// per key channel, S stored [k][v] (row j couples key channel j with every
// value component, flash-linear-attention's orientation):
//   a_j = gate_bound * sigmoid(exp(A_log[h]) * (g_j + dt_bias_j)),
//   S = diag(exp(a)) S;  pred = k^T S;  S += k (x) beta (v - pred);  o = q^T S.
// Two passes over S: decay and predict, then update and read out; each row of
// S is one axpy per pass, accumulated in row order.
void kda_tile(const Op& op, const StepContext& ctx, int r, int h) {
  RecurrentState& st = *ctx.rows[r].state;
  const int H = op.n_head, Dv = op.head_dim;
  const int Dk = key_dim_of(op, width_of(ctx, op.in));
  const float* qkv = row_of(ctx, op.in, r);
  const float* g = row_of(ctx, op.in2, r) + static_cast<size_t>(h) * Dk;
  const float beta = sigmoidf(row_of(ctx, op.in3, r)[h]);
  const float* dtb = op.dt_bias + static_cast<size_t>(h) * Dk;
  const float A = std::exp(op.norm[h]);
  thread_local std::vector<float> qn, kn, pred, d;
  qn.resize(static_cast<size_t>(Dk));
  kn.resize(static_cast<size_t>(Dk));
  pred.assign(static_cast<size_t>(Dv), 0.f);
  d.resize(static_cast<size_t>(Dv));
  l2norm(qkv + static_cast<size_t>(h) * Dk, Dk, op.eps, op.scale, qn.data());
  l2norm(qkv + static_cast<size_t>(H + h) * Dk, Dk, op.eps, 1.f, kn.data());
  const float* v = qkv + static_cast<size_t>(2 * H) * Dk + static_cast<size_t>(h) * Dv;
  float* S = st.S_at(op.cache_layer(), h);
  float* o = row_of(ctx, op.out, r) + static_cast<size_t>(h) * Dv;
  auto axpy = ctx.scalar ? axpy_f32_scalar : axpy_f32;
  for (int j = 0; j < Dk; ++j) {
    float* Sj = S + static_cast<size_t>(j) * Dv;
    const float decay = std::exp(op.gate_bound * sigmoidf(A * (g[j] + dtb[j])));
    for (int i = 0; i < Dv; ++i) Sj[i] *= decay;
    axpy(kn[static_cast<size_t>(j)], Sj, pred.data(), Dv);
  }
  for (int i = 0; i < Dv; ++i) d[static_cast<size_t>(i)] = beta * (v[i] - pred[static_cast<size_t>(i)]);
  std::fill(o, o + Dv, 0.f);
  for (int j = 0; j < Dk; ++j) {
    float* Sj = S + static_cast<size_t>(j) * Dv;
    axpy(kn[static_cast<size_t>(j)], d.data(), Sj, Dv);
    axpy(qn[static_cast<size_t>(j)], Sj, o, Dv);
  }
}

}  // namespace

void delta_rule_tile(const Op& op, const StepContext& ctx, int r, int h) {
  if (op.kda) {
    kda_tile(op, ctx, r, h);
    return;
  }
  RecurrentState& st = *ctx.rows[r].state;
  const int Hv = op.n_head, Hk = op.n_head_kv, Dv = op.head_dim;
  const int Dk = key_dim_of(op, width_of(ctx, op.in));
  const int kh = h / (Hv / Hk);
  const float* qkv = row_of(ctx, op.in, r);
  const float* ba = row_of(ctx, op.in2, r);
  thread_local std::vector<float> qn, kn;
  qn.resize(static_cast<size_t>(Dk));
  kn.resize(static_cast<size_t>(Dk));
  l2norm(qkv + static_cast<size_t>(kh) * Dk, Dk, op.eps, op.scale, qn.data());
  l2norm(qkv + static_cast<size_t>(Hk + kh) * Dk, Dk, op.eps, 1.f, kn.data());
  const float* v = qkv + static_cast<size_t>(2 * Hk) * Dk + static_cast<size_t>(h) * Dv;
  const float beta = sigmoidf(ba[h]);
  const float g = -std::exp(op.norm[h]) * softplusf(ba[Hv + h] + op.dt_bias[h]);
  const float decay = std::exp(g);
  float* S = st.S_at(op.cache_layer(), h);
  float* o = row_of(ctx, op.out, r) + static_cast<size_t>(h) * Dv;
  auto dot = ctx.scalar ? dot_f32_scalar : dot_f32;
  auto axpy = ctx.scalar ? axpy_f32_scalar : axpy_f32;
  // Row i of S only meets v[i] and o[i]: decay, predict, update and read out
  // one row at a time, so the state streams through once.
  for (int i = 0; i < Dv; ++i) {
    float* Si = S + static_cast<size_t>(i) * Dk;
    for (int j = 0; j < Dk; ++j) Si[j] *= decay;
    const float pred = dot(Si, kn.data(), Dk);
    axpy(beta * (v[i] - pred), kn.data(), Si, Dk);
    o[i] = dot(Si, qn.data(), Dk);
  }
}

void gated_rmsnorm_tile(const Op& op, const StepContext& ctx, int r) {
  float* o = row_of(ctx, op.out, r);
  const float* z = row_of(ctx, op.in, r);
  const int D = op.head_dim;
  for (int h = 0; h < op.n_head; ++h) {
    float* oh = o + static_cast<size_t>(h) * D;
    const float* zh = z + static_cast<size_t>(h) * D;
    rmsnorm(oh, op.norm, D, op.eps, oh);
    if (op.kda)
      for (int i = 0; i < D; ++i) oh[i] *= sigmoidf(zh[i]);
    else
      for (int i = 0; i < D; ++i) oh[i] *= silu(zh[i]);
  }
}

void validate_recurrent_rows(const DecodeProgram& p, const RowInput* rows, int n_rows) {
  for (int r = 0; r < n_rows; ++r) {
    const RecurrentState* st = rows[r].state;
    if (!st) fail("row {} has no recurrent state ({} has recurrent layers)", r, p.model_name);
    for (int q = 0; q < r; ++q)
      if (rows[q].state == st || rows[q].cache == rows[r].cache)
        fail("rows {} and {} belong to the same sequence; a step of {} holds at most one row per sequence", q, r,
             p.model_name);
    for (const Op& op : p.ops) {
      if (op.kind != OpKind::CausalConvSilu && op.kind != OpKind::DeltaRule) continue;
      if (op.cache_layer() >= st->n_layer)
        fail("row {}: recurrent state has {} layers, op '{}' of layer {} needs index {}", r, st->n_layer, op.name,
             op.layer, op.cache_layer());
      if (op.kind == OpKind::CausalConvSilu) {
        const int C = p.slots[static_cast<size_t>(op.out)].width;
        if (st->conv_dim != C || st->conv_hist != op.n_norm / C - 1)
          fail("row {}: recurrent state conv window [{}][{}] does not fit op '{}' ([{}][{}])", r, st->conv_hist,
               st->conv_dim, op.name, op.n_norm / C - 1, C);
      } else {
        const int Dk = key_dim_of(op, p.slots[static_cast<size_t>(op.in)].width);
        if (st->n_v_heads != op.n_head || st->v_dim != op.head_dim || st->k_dim != Dk)
          fail("row {}: recurrent state S [{}][{}][{}] does not fit op '{}' ([{}][{}][{}])", r, st->n_v_heads,
               st->v_dim, st->k_dim, op.name, op.n_head, op.head_dim, Dk);
      }
    }
  }
}

}  // namespace megakern
