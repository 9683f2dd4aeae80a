#include "exec/recurrent_kernels.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "exec/op_kernels.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec.h"

namespace megakern {

namespace {

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
  if (ctx.scalar)
    glu_act_scalar(GluKind::Sigmoid, g, o, 1.f, 1.f, o, n);
  else
    glu_act(GluKind::Sigmoid, g, o, 1.f, 1.f, o, n);
}

namespace {

// Rows of one sequence form a block of adjacent rows sharing a state; the
// block's first row does the work of the whole block, in order.
bool continues_block(const StepContext& ctx, int r) { return r > 0 && ctx.rows[r - 1].state == ctx.rows[r].state; }
int block_end(const StepContext& ctx, int r) {
  int e = r + 1;
  while (e < ctx.n_rows && ctx.rows[e].state == ctx.rows[r].state) ++e;
  return e;
}

}  // namespace

void causal_conv_silu_tile(const Op& op, const StepContext& ctx, int r) {
  if (continues_block(ctx, r)) return;
  RecurrentState& st = *ctx.rows[r].state;
  const int C = width_of(ctx, op.out), K = op.n_norm / C, hist = K - 1;
  float* win = st.conv_at(op.cache_layer());
  // The window the block starts from: its own (advanced in place) or, for a
  // row of a chained verify block, the previous row's (read, never written).
  const RecurrentState* src = ctx.rows[r].state_in;
  const float* in = src ? const_cast<RecurrentState*>(src)->conv_at(op.cache_layer()) : win;
  const int end = block_end(ctx, r);
  // The convolution of every channel first, then SiLU over the row at once
  // (vectorised on the fast path; silu(a) * 1 is silu(a)).
  thread_local std::vector<float> acc, ones;
  acc.resize(static_cast<size_t>(C));
  if (ones.size() < static_cast<size_t>(C)) ones.assign(static_cast<size_t>(C), 1.f);
  for (int rr = r; rr < end; ++rr) {
    float* x = row_of(ctx, op.out, rr);
    for (int c = 0; c < C; ++c) {
      const float* w = op.norm + static_cast<size_t>(c) * K;
      float a = 0.f;
      for (int j = 0; j < hist; ++j) a += w[j] * in[static_cast<size_t>(j) * C + c];
      a += w[hist] * x[c];
      for (int j = 0; j + 1 < hist; ++j) win[static_cast<size_t>(j) * C + c] = in[static_cast<size_t>(j + 1) * C + c];
      if (hist > 0) win[static_cast<size_t>(hist - 1) * C + c] = x[c];
      acc[static_cast<size_t>(c)] = a;
    }
    if (ctx.scalar)
      glu_act_scalar(GluKind::SiLU, acc.data(), ones.data(), 1.f, 1.f, x, C);
    else
      glu_act(GluKind::SiLU, acc.data(), ones.data(), 1.f, 1.f, x, C);
    in = win;  // the block's later rows continue from this row's window
  }
}

namespace {

// The per-row inputs of value head h at row r: q and k L2-normed (q scaled),
// v, beta = sigmoid(b), and the log decay g = -exp(A_log) * softplus(a + dt_bias).
struct DeltaInputs {
  const float* v;
  float beta, g;
};
DeltaInputs delta_inputs(const Op& op, const StepContext& ctx, int r, int h, int Dk, float* qn, float* kn) {
  const int Hv = op.n_head, Hk = op.n_head_kv, Dv = op.head_dim;
  const int kh = h / (Hv / Hk);
  const float* qkv = row_of(ctx, op.in, r);
  const float* ba = row_of(ctx, op.in2, r);
  l2norm(qkv + static_cast<size_t>(kh) * Dk, Dk, op.eps, op.scale, qn);
  l2norm(qkv + static_cast<size_t>(Hk + kh) * Dk, Dk, op.eps, 1.f, kn);
  DeltaInputs in;
  in.v = qkv + static_cast<size_t>(2 * Hk) * Dk + static_cast<size_t>(h) * Dv;
  in.beta = sigmoidf(ba[h]);
  in.g = -std::exp(op.norm[h]) * softplusf(ba[Hv + h] + op.dt_bias[h]);
  return in;
}

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

// A block of T tokens of one sequence through KDA in the chunked form. With
// the per-channel log decays cumulated over the block, G_t = a_0 + ... + a_t
// (vectors over the key channels) and D_t = diag(exp(G_t)), the state after
// token t is
//   S_t = D_t S_0 + sum_{j<=t} (exp(G_t - G_j) * k_j) u_j^T          (S is [k][v])
// where the corrections u_t = beta_t (v_t - pred_t) solve
//   u_t + beta_t sum_{j<t} <k_t, exp(G_t - G_j) * k_j> u_j = beta_t (v_t - S_0^T (exp(G_t) * k_t)),
// the outputs are o_t = S_0^T (exp(G_t) * q_t) + sum_{j<=t} <q_t, exp(G_t - G_j) * k_j> u_j,
// and the block leaves S_{T-1}. S_0 is read and the new state written once.
void kda_block(const Op& op, const StepContext& ctx, int r0, int T, int h) {
  const int H = op.n_head, Dv = op.head_dim;
  const int Dk = key_dim_of(op, width_of(ctx, op.in));
  const size_t uT = static_cast<size_t>(T), uDk = static_cast<size_t>(Dk), uDv = static_cast<size_t>(Dv);
  thread_local std::vector<float> Q, K, G, A, B, beta, P, U;
  Q.resize(uT * uDk);
  K.resize(uT * uDk);
  G.resize(uT * uDk);
  A.assign(uT * uT, 0.f);
  B.assign(uT * uT, 0.f);
  beta.resize(uT);
  P.assign(uT * uDv, 0.f);  // S_0^T (e^G k), then the corrections u
  U.assign(uT * uDv, 0.f);  // S_0^T (e^G q), then the outputs
  auto axpy = ctx.scalar ? axpy_f32_scalar : axpy_f32;
  const float Aexp = std::exp(op.norm[h]);
  const float* dtb = op.dt_bias + static_cast<size_t>(h) * Dk;
  for (int t = 0; t < T; ++t) {
    const int r = r0 + t;
    const float* qkv = row_of(ctx, op.in, r);
    const float* g = row_of(ctx, op.in2, r) + static_cast<size_t>(h) * Dk;
    l2norm(qkv + static_cast<size_t>(h) * Dk, Dk, op.eps, op.scale, &Q[t * uDk]);
    l2norm(qkv + static_cast<size_t>(H + h) * Dk, Dk, op.eps, 1.f, &K[t * uDk]);
    beta[static_cast<size_t>(t)] = sigmoidf(row_of(ctx, op.in3, r)[h]);
    for (int c = 0; c < Dk; ++c) {
      const float a = op.gate_bound * sigmoidf(Aexp * (g[c] + dtb[c]));
      G[t * uDk + c] = (t ? G[(t - 1) * uDk + c] : 0.f) + a;
    }
  }
  for (int t = 0; t < T; ++t)
    for (int j = 0; j <= t; ++j) {
      float kk = 0.f, qk = 0.f;
      for (int c = 0; c < Dk; ++c) {
        const float w = std::exp(G[t * uDk + c] - G[j * uDk + c]) * K[j * uDk + c];
        kk += K[t * uDk + c] * w;
        qk += Q[t * uDk + c] * w;
      }
      if (j < t) A[t * uT + j] = beta[static_cast<size_t>(t)] * kk;
      B[t * uT + j] = qk;
    }
  RecurrentState& st = *ctx.rows[r0].state;
  float* S = st.S_at(op.cache_layer(), h);
  for (int c = 0; c < Dk; ++c) {
    const float* Sc = S + static_cast<size_t>(c) * uDv;
    for (int t = 0; t < T; ++t) {
      const float e = std::exp(G[t * uDk + c]);
      axpy(e * K[t * uDk + c], Sc, &P[t * uDv], Dv);
      axpy(e * Q[t * uDk + c], Sc, &U[t * uDv], Dv);
    }
  }
  for (int t = 0; t < T; ++t) {
    const int r = r0 + t;
    const float* v = row_of(ctx, op.in, r) + static_cast<size_t>(2 * H) * Dk + static_cast<size_t>(h) * Dv;
    float* u = &P[t * uDv];
    for (int i = 0; i < Dv; ++i) u[i] = beta[static_cast<size_t>(t)] * (v[i] - u[i]);
    for (int j = 0; j < t; ++j) axpy(-A[t * uT + j], &P[j * uDv], u, Dv);
    float* o = row_of(ctx, op.out, r) + static_cast<size_t>(h) * Dv;
    std::copy_n(&U[t * uDv], Dv, o);
    for (int j = 0; j <= t; ++j) axpy(B[t * uT + j], &P[j * uDv], o, Dv);
  }
  const size_t last = (uT - 1) * uDk;
  for (int c = 0; c < Dk; ++c) {
    float* Sc = S + static_cast<size_t>(c) * uDv;
    const float keep = std::exp(G[last + c]);
    for (int i = 0; i < Dv; ++i) Sc[i] *= keep;
    for (int t = 0; t < T; ++t)
      axpy(std::exp(G[last + c] - G[t * uDk + c]) * K[t * uDk + c], &P[t * uDv], Sc, Dv);
  }
}

// One token: S = exp(g) S; pred = S k; S += beta (v - pred) k^T; o = S q.
void delta_rule_step(const Op& op, const StepContext& ctx, int r, int h, int Dk, const RecurrentState* src) {
  const int Dv = op.head_dim;
  thread_local std::vector<float> qn, kn;
  qn.resize(static_cast<size_t>(Dk));
  kn.resize(static_cast<size_t>(Dk));
  const DeltaInputs in = delta_inputs(op, ctx, r, h, Dk, qn.data(), kn.data());
  const float decay = std::exp(in.g);
  float* S = ctx.rows[r].state->S_at(op.cache_layer(), h);
  // The state this row starts from: S itself, or the previous row's of a
  // chained block (the decay reads it once, then S is updated in place).
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
    axpy(in.beta * (in.v[i] - pred), kn.data(), Si, Dk);
    o[i] = dot(Si, qn.data(), Dk);
  }
}

// A block of T tokens of one sequence in the chunked form. With the log
// decays cumulated over the block, G_t = g_0 + ... + g_t, the state after
// token t is
//   S_t = e^{G_t} S_0 + sum_{j<=t} e^{G_t - G_j} u_j k_j^T,
// where the corrections u_t = beta_t (v_t - pred_t) solve the lower-triangular
// system
//   u_t + sum_{j<t} beta_t e^{G_t - G_j} (k_t . k_j) u_j = beta_t (v_t - e^{G_t} S_0 k_t),
// the outputs are o_t = e^{G_t} S_0 q_t + sum_{j<=t} e^{G_t - G_j} (k_j . q_t) u_j,
// and the block leaves S_{T-1}. Every coefficient couples tokens only, so each
// row i of S (value component i) is processed on its own: S_0 is read and
// the new state written once per block, whatever T.
void delta_rule_block(const Op& op, const StepContext& ctx, int r0, int T, int h, int Dk) {
  const int Dv = op.head_dim;
  const size_t uT = static_cast<size_t>(T), uDk = static_cast<size_t>(Dk), uDv = static_cast<size_t>(Dv);
  thread_local std::vector<float> Q, K, A, B, G, beta, SK, SQ, coef;
  thread_local std::vector<const float*> V;
  Q.resize(uT * uDk);
  K.resize(uT * uDk);
  A.assign(uT * uT, 0.f);
  B.assign(uT * uT, 0.f);
  G.resize(uT);
  beta.resize(uT);
  V.resize(uT);
  SK.resize(uT * uDv);  // [t][i]: (S_0 k_t)_i, then the corrections u_t
  SQ.resize(uT * uDv);  // [t][i]: (S_0 q_t)_i
  coef.resize(uT);
  auto dot = ctx.scalar ? dot_f32_scalar : dot_f32;
  auto axpy = ctx.scalar ? axpy_f32_scalar : axpy_f32;
  float cum = 0.f;
  for (int t = 0; t < T; ++t) {
    const DeltaInputs in = delta_inputs(op, ctx, r0 + t, h, Dk, &Q[t * uDk], &K[t * uDk]);
    V[static_cast<size_t>(t)] = in.v;
    beta[static_cast<size_t>(t)] = in.beta;
    cum += in.g;
    G[static_cast<size_t>(t)] = cum;
  }
  for (int t = 0; t < T; ++t)
    for (int j = 0; j <= t; ++j) {
      const float d = std::exp(G[static_cast<size_t>(t)] - G[static_cast<size_t>(j)]);
      if (j < t) A[t * uT + j] = beta[static_cast<size_t>(t)] * d * dot(&K[t * uDk], &K[j * uDk], Dk);
      B[t * uT + j] = d * dot(&K[j * uDk], &Q[t * uDk], Dk);
    }
  const float tail = G[uT - 1];
  for (int t = 0; t < T; ++t) coef[static_cast<size_t>(t)] = std::exp(tail - G[static_cast<size_t>(t)]);
  float* S = ctx.rows[r0].state->S_at(op.cache_layer(), h);
  // S_0 k_t and S_0 q_t for every token: one pass over S_0.
  for (int i = 0; i < Dv; ++i) {
    const float* Si = S + static_cast<size_t>(i) * uDk;
    for (int t = 0; t < T; ++t) {
      SK[t * uDv + i] = dot(Si, &K[t * uDk], Dk);
      SQ[t * uDv + i] = dot(Si, &Q[t * uDk], Dk);
    }
  }
  // Corrections and outputs token by token, each a vector over the value
  // components: u_t = beta_t (v_t - e^{G_t} S_0 k_t) - sum_{j<t} A_tj u_j,
  // o_t = e^{G_t} S_0 q_t + sum_{j<=t} B_tj u_j.
  for (int t = 0; t < T; ++t) {
    const float e = std::exp(G[static_cast<size_t>(t)]), bt = beta[static_cast<size_t>(t)];
    float* u = &SK[t * uDv];
    const float* v = V[static_cast<size_t>(t)];
    for (int i = 0; i < Dv; ++i) u[i] = bt * (v[i] - e * u[i]);
    for (int j = 0; j < t; ++j) axpy(-A[t * uT + j], &SK[j * uDv], u, Dv);
    float* o = row_of(ctx, op.out, r0 + t) + static_cast<size_t>(h) * Dv;
    for (int i = 0; i < Dv; ++i) o[i] = e * SQ[t * uDv + i];
    for (int j = 0; j <= t; ++j) axpy(B[t * uT + j], &SK[j * uDv], o, Dv);
  }
  // S = e^{G_T} S_0 + sum_t e^{G_T - G_t} u_t k_t^T, row by row.
  const float keep = std::exp(tail);
  for (int i = 0; i < Dv; ++i) {
    float* Si = S + static_cast<size_t>(i) * uDk;
    for (int j = 0; j < Dk; ++j) Si[j] *= keep;
    for (int t = 0; t < T; ++t) axpy(coef[static_cast<size_t>(t)] * SK[t * uDv + i], &K[t * uDk], Si, Dk);
  }
}

}  // namespace

void delta_rule_tile(const Op& op, const StepContext& ctx, int r, int h) {
  if (continues_block(ctx, r)) return;
  // Long blocks go in chunks of kChunk tokens: the chunked form's work per
  // token grows with the chunk (its T x T couplings), the state traffic it
  // saves does not, and 16 is past the break-even on this hardware.
  constexpr int kChunk = 16;
  const int end = block_end(ctx, r);
  const int Dk = key_dim_of(op, width_of(ctx, op.in));
  // A block that continues a chained predecessor (RowInput::state_in) starts
  // from that state: the one-token delta rule reads it directly, the other
  // forms start from a copy of this head's part of it.
  const RecurrentState* src = ctx.rows[r].state_in;
  if (src && (op.kda || end - r > 1)) {
    const size_t n = static_cast<size_t>(op.head_dim) * static_cast<size_t>(Dk);
    std::copy_n(const_cast<RecurrentState*>(src)->S_at(op.cache_layer(), h), n,
                ctx.rows[r].state->S_at(op.cache_layer(), h));
    src = nullptr;
  }
  for (int c = r; c < end; c += kChunk) {
    const int T = std::min(kChunk, end - c);
    if (op.kda)
      T == 1 ? kda_tile(op, ctx, c, h) : kda_block(op, ctx, c, T, h);
    else
      T == 1 ? delta_rule_step(op, ctx, c, h, Dk, c == r ? src : nullptr) : delta_rule_block(op, ctx, c, T, h, Dk);
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
    const GluKind gate = op.kda ? GluKind::Sigmoid : GluKind::SiLU;
    if (ctx.scalar)
      glu_act_scalar(gate, zh, oh, 1.f, 1.f, oh, D);
    else
      glu_act(gate, zh, oh, 1.f, 1.f, oh, D);
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
      if (q == r) continue;
      // Rows sharing a state are one sequence's block: adjacent, one cache.
      if (rows[q].state == st && (rows[q].cache != rows[r].cache || (q < r && rows[r - 1].state != st)))
        fail("rows {} and {} write the same recurrent state but are not adjacent rows of one sequence",
             std::min(q, r), std::max(q, r));
      // A row may start from the state of the row just before it (a chain)
      // but not from one another row of the step is still writing.
      if (q != r - 1 && rows[r].state_in && rows[q].state == rows[r].state_in)
        fail("row {} starts from the state row {} writes; only the previous row's state can be continued", r, q);
    }
    // validate_rows has made rows of one cache adjacent at consecutive
    // positions; each one after the first shares the previous one's state
    // (a block) or starts from it (a chain).
    if (r > 0 && rows[r - 1].cache == rows[r].cache && rows[r - 1].state != st && rows[r].state_in != rows[r - 1].state)
      fail("rows {} and {} belong to the same sequence, so row {} must share row {}'s state or start from it "
           "(state_in)",
           r - 1, r, r, r - 1);
    if (r > 0 && rows[r - 1].state == st && rows[r].state_in)
      fail("row {} continues row {}'s block (the same state) and cannot also start from another state", r, r - 1);
    if (r > 0 && rows[r - 1].cache != rows[r].cache && rows[r].state_in)
      fail("row {} starts from another state but does not continue the previous row's sequence", r);
    const RecurrentState* in = rows[r].state_in;
    if (in && (in->n_layer != st->n_layer || in->conv_dim != st->conv_dim || in->conv_hist != st->conv_hist ||
               in->n_v_heads != st->n_v_heads || in->v_dim != st->v_dim || in->k_dim != st->k_dim))
      fail("row {}: the state it starts from and the state it writes have different shapes", r);
    if (r > 0 && rows[r - 1].state == st) continue;  // checked with the block's first row
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
