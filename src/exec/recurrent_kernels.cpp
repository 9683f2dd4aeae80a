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
  // The window this row starts from: its own (advanced in place) or the
  // previous row's of a chained block (read before this row's is written).
  const RecurrentState* src = ctx.rows[r].state_in;
  const float* in = src ? const_cast<RecurrentState*>(src)->conv_at(op.cache_layer()) : win;
  for (int c = 0; c < C; ++c) {
    const float* w = op.norm + static_cast<size_t>(c) * K;
    float acc = 0.f;
    for (int j = 0; j < hist; ++j) acc += w[j] * in[static_cast<size_t>(j) * C + c];
    acc += w[hist] * x[c];
    for (int j = 0; j + 1 < hist; ++j) win[static_cast<size_t>(j) * C + c] = in[static_cast<size_t>(j + 1) * C + c];
    if (hist > 0) win[static_cast<size_t>(hist - 1) * C + c] = x[c];
    x[c] = silu(acc);
  }
}

void delta_rule_tile(const Op& op, const StepContext& ctx, int r, int h) {
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
  // The state this row starts from: S itself, or the previous row's of a
  // chained block (the decay reads it once, then S is updated in place).
  const RecurrentState* src = ctx.rows[r].state_in;
  const float* S0 = src ? const_cast<RecurrentState*>(src)->S_at(op.cache_layer(), h) : S;
  float* o = row_of(ctx, op.out, r) + static_cast<size_t>(h) * Dv;
  auto dot = ctx.scalar ? dot_f32_scalar : dot_f32;
  auto axpy = ctx.scalar ? axpy_f32_scalar : axpy_f32;
  // Row i of S only meets v[i] and o[i]: decay, predict, update and read out
  // one row at a time, so the state streams through once.
  for (int i = 0; i < Dv; ++i) {
    float* Si = S + static_cast<size_t>(i) * Dk;
    const float* S0i = S0 + static_cast<size_t>(i) * Dk;
    for (int j = 0; j < Dk; ++j) Si[j] = S0i[j] * decay;
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
    for (int i = 0; i < D; ++i) oh[i] *= silu(zh[i]);
  }
}

bool rows_chained(const RowInput* rows, int n_rows) {
  for (int r = 1; r < n_rows; ++r)
    if (rows[r].state_in && rows[r].state_in == rows[r - 1].state) return true;
  return false;
}

void validate_recurrent_rows(const DecodeProgram& p, const RowInput* rows, int n_rows) {
  for (int r = 0; r < n_rows; ++r) {
    const RecurrentState* st = rows[r].state;
    if (!st) fail("row {} has no recurrent state ({} has recurrent layers)", r, p.model_name);
    for (int q = 0; q < n_rows; ++q) {
      if (q != r && rows[q].state == st)
        fail("rows {} and {} write the same recurrent state; rows of one sequence in a step each need their own "
             "(RowInput::state_in chains them)",
             std::min(q, r), std::max(q, r));
      // A row may start from the state of the row just before it (a chain)
      // but not from one another row of the step is still writing.
      if (q != r - 1 && rows[r].state_in && rows[q].state == rows[r].state_in)
        fail("row {} starts from the state row {} writes; only the previous row's state can be continued", r, q);
    }
    // validate_rows has made rows of one cache adjacent at consecutive
    // positions; each one after the first must continue the previous one.
    if (r > 0 && rows[r - 1].cache == rows[r].cache && rows[r].state_in != rows[r - 1].state)
      fail("rows {} and {} belong to the same sequence, so row {} must start from row {}'s state (state_in)", r - 1, r,
           r, r - 1);
    const RecurrentState* in = rows[r].state_in;
    if (in && (in->n_layer != st->n_layer || in->conv_dim != st->conv_dim || in->conv_hist != st->conv_hist ||
               in->n_v_heads != st->n_v_heads || in->v_dim != st->v_dim || in->k_dim != st->k_dim))
      fail("row {}: the state it starts from and the state it writes have different shapes", r);
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
