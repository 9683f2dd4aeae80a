#include <algorithm>
#include <cmath>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "core/error.h"
#include "ops/registry.h"

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

const ops::DeltaRule& dr(const Op& op) { return op.as<ops::DeltaRule>(); }

int key_dim_of(const Op& op, int in_width) { return (in_width - dr(op).n_head * dr(op).head_dim) / (2 * dr(op).n_head_kv); }




// Rows of one sequence form a block of adjacent rows sharing a state; the
// block's first row does the work of the whole block, in order.
bool continues_block(const StepContext& ctx, int r) { return r > 0 && ctx.rows[r - 1].state == ctx.rows[r].state; }
int block_end(const StepContext& ctx, int r) {
  int e = r + 1;
  while (e < ctx.n_rows && ctx.rows[e].state == ctx.rows[r].state) ++e;
  return e;
}


template <class Kn>
void causal_conv_silu_tile(const Op& op, const StepContext& ctx, int r) {
  if (continues_block(ctx, r)) return;
  RecurrentState& st = *ctx.rows[r].state;
  const auto& taps = op.as<ops::CausalConvSilu>().taps;
  const int C = width_of(ctx, op.out), K = static_cast<int>(taps.size()) / C, hist = K - 1;
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
      const float* w = taps.data() + static_cast<size_t>(c) * K;
      float a = 0.f;
      for (int j = 0; j < hist; ++j) a += w[j] * in[static_cast<size_t>(j) * C + c];
      a += w[hist] * x[c];
      for (int j = 0; j + 1 < hist; ++j) win[static_cast<size_t>(j) * C + c] = in[static_cast<size_t>(j + 1) * C + c];
      if (hist > 0) win[static_cast<size_t>(hist - 1) * C + c] = x[c];
      acc[static_cast<size_t>(c)] = a;
    }
    Kn::glu(GluKind::SiLU, acc.data(), ones.data(), 1.f, 1.f, x, C);
    in = win;  // the block's later rows continue from this row's window
  }
}


// The per-row inputs of value head h at row r: q and k L2-normed (q scaled),
// v, beta = sigmoid(b), and the log decay g = -exp(A_log) * softplus(a + dt_bias).
struct DeltaInputs {
  const float* v;
  float beta, g;
};
DeltaInputs delta_inputs(const Op& op, const StepContext& ctx, int r, int h, int Dk, float* qn, float* kn) {
  const int Hv = dr(op).n_head, Hk = dr(op).n_head_kv, Dv = dr(op).head_dim;
  const int kh = h / (Hv / Hk);
  const float* qkv = row_of(ctx, op.in, r);
  const float* ba = row_of(ctx, op.in2, r);
  l2norm(qkv + static_cast<size_t>(kh) * Dk, Dk, dr(op).eps, dr(op).scale, qn);
  l2norm(qkv + static_cast<size_t>(Hk + kh) * Dk, Dk, dr(op).eps, 1.f, kn);
  DeltaInputs in;
  in.v = qkv + static_cast<size_t>(2 * Hk) * Dk + static_cast<size_t>(h) * Dv;
  in.beta = sigmoidf(ba[h]);
  in.g = -std::exp(dr(op).a_log[static_cast<size_t>(h)]) * softplusf(ba[Hv + h] + dr(op).dt_bias[static_cast<size_t>(h)]);
  return in;
}

// KDA's log decay of one key channel from its gate input x = g + dt_bias and
// A = exp(A_log): Kimi K3's bounded sigmoid or Kimi Linear's softplus.
inline float kda_log_decay(const Op& op, float A, float x) {
  return dr(op).softplus_gate ? -A * softplusf(x) : dr(op).gate_bound * sigmoidf(A * x);
}

// KDA (Kimi Delta Attention) for head h of row r: the delta rule with a decay
// per key channel, S stored [k][v] (row j couples key channel j with every
// value component, flash-linear-attention's orientation):
//   a_j = gate_bound * sigmoid(exp(A_log[h]) * (g_j + dt_bias_j)),
//   S = diag(exp(a)) S;  pred = k^T S;  S += k (x) beta (v - pred);  o = q^T S.
// Two passes over S: decay and predict, then update and read out; each row of
// S is one axpy per pass, accumulated in row order.
template <class Kn>
void kda_tile(const Op& op, const StepContext& ctx, int r, int h) {
  RecurrentState& st = *ctx.rows[r].state;
  const int H = dr(op).n_head, Dv = dr(op).head_dim;
  const int Dk = key_dim_of(op, width_of(ctx, op.in));
  const float* qkv = row_of(ctx, op.in, r);
  const float* g = row_of(ctx, op.in2, r) + static_cast<size_t>(h) * Dk;
  const float beta = sigmoidf(row_of(ctx, op.in3, r)[h]);
  const float* dtb = dr(op).dt_bias.data() + static_cast<size_t>(h) * Dk;
  const float A = std::exp(dr(op).a_log[static_cast<size_t>(h)]);
  thread_local std::vector<float> qn, kn, pred, d;
  qn.resize(static_cast<size_t>(Dk));
  kn.resize(static_cast<size_t>(Dk));
  pred.assign(static_cast<size_t>(Dv), 0.f);
  d.resize(static_cast<size_t>(Dv));
  l2norm(qkv + static_cast<size_t>(h) * Dk, Dk, dr(op).eps, dr(op).scale, qn.data());
  l2norm(qkv + static_cast<size_t>(H + h) * Dk, Dk, dr(op).eps, 1.f, kn.data());
  const float* v = qkv + static_cast<size_t>(2 * H) * Dk + static_cast<size_t>(h) * Dv;
  float* S = st.S_at(op.cache_layer(), h);
  float* o = row_of(ctx, op.out, r) + static_cast<size_t>(h) * Dv;
  auto axpy = Kn::axpy;
  for (int j = 0; j < Dk; ++j) {
    float* Sj = S + static_cast<size_t>(j) * Dv;
    const float decay = std::exp(kda_log_decay(op, A, g[j] + dtb[j]));
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
template <class Kn>
void kda_block(const Op& op, const StepContext& ctx, int r0, int T, int h) {
  const int H = dr(op).n_head, Dv = dr(op).head_dim;
  const int Dk = key_dim_of(op, width_of(ctx, op.in));
  const size_t uT = static_cast<size_t>(T), uDk = static_cast<size_t>(Dk), uDv = static_cast<size_t>(Dv);
  thread_local std::vector<float> Q, K, G, A, B, beta, P, U, wk, wq;
  Q.resize(uT * uDk);
  K.resize(uT * uDk);
  G.resize(uT * uDk);
  A.assign(uT * uT, 0.f);
  B.assign(uT * uT, 0.f);
  beta.resize(uT);
  P.assign(uT * uDv, 0.f);  // S_0^T (e^G k), then the corrections u
  U.assign(uT * uDv, 0.f);  // S_0^T (e^G q), then the outputs
  auto axpy = Kn::axpy;
  const float Aexp = std::exp(dr(op).a_log[static_cast<size_t>(h)]);
  const float* dtb = dr(op).dt_bias.data() + static_cast<size_t>(h) * Dk;
  for (int t = 0; t < T; ++t) {
    const int r = r0 + t;
    const float* qkv = row_of(ctx, op.in, r);
    const float* g = row_of(ctx, op.in2, r) + static_cast<size_t>(h) * Dk;
    l2norm(qkv + static_cast<size_t>(h) * Dk, Dk, dr(op).eps, dr(op).scale, &Q[t * uDk]);
    l2norm(qkv + static_cast<size_t>(H + h) * Dk, Dk, dr(op).eps, 1.f, &K[t * uDk]);
    beta[static_cast<size_t>(t)] = sigmoidf(row_of(ctx, op.in3, r)[h]);
    for (int c = 0; c < Dk; ++c) {
      const float a = kda_log_decay(op, Aexp, g[c] + dtb[c]);
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
  // P_t = sum_c (e^{G_tc} k_tc) S_c and U_t likewise with q, the rows of S
  // in order for every element (the outputs kept in registers across them).
  wk.resize(uT * uDk);
  wq.resize(uT * uDk);
  for (size_t tc = 0; tc < uT * uDk; ++tc) {
    const float e = std::exp(G[tc]);
    wk[tc] = e * K[tc];
    wq[tc] = e * Q[tc];
  }
  for (int t = 0; t < T; ++t) Kn::axpy_rows2(&wk[t * uDk], &wq[t * uDk], S, Dv, Dk, &P[t * uDv], &U[t * uDv], Dv);
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
  // S_c = e^{G_c} S_0c + sum_t (e^{G_c - G_tc} k_tc) u_t, two rows of S at a
  // time, each element's updates in token order.
  const size_t last = (uT - 1) * uDk;
  wk.resize(2 * uT);
  for (int c = 0; c < Dk; c += 2) {
    const int n = std::min(2, Dk - c);
    for (int m = 0; m < n; ++m) {
      float* Sc = S + static_cast<size_t>(c + m) * uDv;
      const float keep = std::exp(G[last + c + m]);
      for (int i = 0; i < Dv; ++i) Sc[i] *= keep;
      for (int t = 0; t < T; ++t)
        wk[m * uT + t] = std::exp(G[last + c + m] - G[t * uDk + c + m]) * K[t * uDk + c + m];
    }
    float* Sc = S + static_cast<size_t>(c) * uDv;
    if (n == 2)
      Kn::axpy_rows2(wk.data(), wk.data() + uT, P.data(), Dv, T, Sc, Sc + uDv, Dv);
    else
      for (int t = 0; t < T; ++t) axpy(wk[static_cast<size_t>(t)], &P[t * uDv], Sc, Dv);
  }
}

// One token: S = exp(g) S; pred = S k; S += beta (v - pred) k^T; o = S q.
template <class Kn>
void delta_rule_step(const Op& op, const StepContext& ctx, int r, int h, int Dk, const RecurrentState* src) {
  const int Dv = dr(op).head_dim;
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
  auto dot = Kn::dot;
  auto axpy = Kn::axpy;
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
template <class Kn>
void delta_rule_block(const Op& op, const StepContext& ctx, int r0, int T, int h, int Dk) {
  const int Dv = dr(op).head_dim;
  const size_t uT = static_cast<size_t>(T), uDk = static_cast<size_t>(Dk), uDv = static_cast<size_t>(Dv);
  thread_local std::vector<float> KQ, A, B, G, beta, SK, SQ, coef, d0, d1, w0, w1;
  thread_local std::vector<const float*> V;
  KQ.resize(2 * uT * uDk);  // the T keys, then the T queries
  float* const K = KQ.data();
  float* const Q = KQ.data() + uT * uDk;
  A.assign(uT * uT, 0.f);
  B.assign(uT * uT, 0.f);
  G.resize(uT);
  beta.resize(uT);
  V.resize(uT);
  SK.resize(uT * uDv);  // [t][i]: (S_0 k_t)_i, then the corrections u_t
  SQ.resize(uT * uDv);  // [t][i]: (S_0 q_t)_i
  coef.resize(uT);
  auto dot = Kn::dot;
  auto axpy = Kn::axpy;
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
  // S_0 k_t and S_0 q_t for every token: one pass over S_0, two of its rows
  // at a time against the 2T keys and queries (the bits of one dot each).
  d0.resize(2 * uT);
  d1.resize(2 * uT);
  int i = 0;
  for (; i + 2 <= Dv; i += 2) {
    const float* Si = S + static_cast<size_t>(i) * uDk;
    Kn::dot_rows2(Si, Si + uDk, KQ.data(), Dk, 2 * T, Dk, d0.data(), d1.data());
    for (int t = 0; t < T; ++t) {
      SK[t * uDv + i] = d0[static_cast<size_t>(t)], SQ[t * uDv + i] = d0[uT + t];
      SK[t * uDv + i + 1] = d1[static_cast<size_t>(t)], SQ[t * uDv + i + 1] = d1[uT + t];
    }
  }
  for (; i < Dv; ++i) {
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
  // S = e^{G_T} S_0 + sum_t e^{G_T - G_t} u_t k_t^T, row by row (two rows
  // at a time, each element's updates in token order).
  const float keep = std::exp(tail);
  w0.resize(uT);
  w1.resize(uT);
  for (i = 0; i + 2 <= Dv; i += 2) {
    float* Si = S + static_cast<size_t>(i) * uDk;
    for (size_t j = 0; j < 2 * uDk; ++j) Si[j] *= keep;
    for (int t = 0; t < T; ++t) {
      w0[static_cast<size_t>(t)] = coef[static_cast<size_t>(t)] * SK[t * uDv + i];
      w1[static_cast<size_t>(t)] = coef[static_cast<size_t>(t)] * SK[t * uDv + i + 1];
    }
    Kn::axpy_rows2(w0.data(), w1.data(), K, Dk, T, Si, Si + uDk, Dk);
  }
  for (; i < Dv; ++i) {
    float* Si = S + static_cast<size_t>(i) * uDk;
    for (int j = 0; j < Dk; ++j) Si[j] *= keep;
    for (int t = 0; t < T; ++t) axpy(coef[static_cast<size_t>(t)] * SK[t * uDv + i], &K[t * uDk], Si, Dk);
  }
}


template <class Kn>
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
  if (src && (dr(op).kda || end - r > 1)) {
    const size_t n = static_cast<size_t>(dr(op).head_dim) * static_cast<size_t>(Dk);
    std::copy_n(const_cast<RecurrentState*>(src)->S_at(op.cache_layer(), h), n,
                ctx.rows[r].state->S_at(op.cache_layer(), h));
    src = nullptr;
  }
  for (int c = r; c < end; c += kChunk) {
    const int T = std::min(kChunk, end - c);
    if (dr(op).kda)
      T == 1 ? kda_tile<Kn>(op, ctx, c, h) : kda_block<Kn>(op, ctx, c, T, h);
    else
      T == 1 ? delta_rule_step<Kn>(op, ctx, c, h, Dk, c == r ? src : nullptr) : delta_rule_block<Kn>(op, ctx, c, T, h, Dk);
  }
}


// While a delta-rule tile runs, subnormal inputs and results count as zero
// (x86's DAZ and FTZ modes, the previous mode restored after). Under strong
// gates the chunked forms' decay factors e^{G_t - G_j} underflow within a
// block, and arithmetic on subnormals runs at a small fraction of the normal
// speed: a qwen3.8-bench prompt spent 15% of its time in the delta rule, 3%
// with them flushed. A subnormal is below 2^-126, so only values themselves
// near that range change. Both the reference and the fast tiles run under
// it, so they still agree.
class SubnormalsAsZero {
#if defined(__SSE__)
 public:
  SubnormalsAsZero() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kDazFtz); }
  ~SubnormalsAsZero() { _mm_setcsr(saved_); }
  SubnormalsAsZero(const SubnormalsAsZero&) = delete;
  SubnormalsAsZero& operator=(const SubnormalsAsZero&) = delete;

 private:
  static constexpr unsigned kDazFtz = 0x8040;
  unsigned saved_;
#endif
};

template <class Kn>
void delta_rule_op_tile(const Op& op, const StepContext& ctx, int t, int) {
  const SubnormalsAsZero flush;
  delta_rule_tile<Kn>(op, ctx, t / dr(op).n_head, t % dr(op).n_head);
}

template <class Kn>
void conv_op_tile(const Op& op, const StepContext& ctx, int t, int) {
  causal_conv_silu_tile<Kn>(op, ctx, t);
}

bool yes(const Op&) { return true; }

}  // namespace

extern const OpInfo kCausalConvSiluOp = {
    .name = "causal_conv_silu",
    .row_tiled = false,
    .recurrent = true,
    .reads_out = yes,
    .small_weights = [](const Op& op) { return op.as<ops::CausalConvSilu>().taps; },
    .state_bytes = [](const Op& op, const DecodeProgram& p, int) {  // (K - 1) x C, read and written
          const size_t C = static_cast<size_t>(p.slots[static_cast<size_t>(op.out)].width);
          return 2 * sizeof(float) * (op.as<ops::CausalConvSilu>().taps.size() - C);
        },
    .verify = [](const Op& op, const VerifyContext& v) {
      const size_t n = op.as<ops::CausalConvSilu>().taps.size();
      MK_CHECK(v.p.recurrent && op.cache_layer() >= 0, "{}: needs a recurrent program and a state layer", v.where);
      MK_CHECK(v.width(op.out) > 0 && n > 0 && n % static_cast<size_t>(v.width(op.out)) == 0,
               "{}: conv taps ({} floats) vs {} channels", v.where, n, v.width(op.out));
    },
    .ref = conv_op_tile<RefKernels>,
    .fast = conv_op_tile<FastKernels>,
};

extern const OpInfo kDeltaRuleOp = {
    .name = "delta_rule",
    .row_tiled = false,
    .recurrent = true,
    .tile_count = [](const Op& op, int n_rows, int) { return n_rows * dr(op).n_head; },
    .small_weights = [](const Op& op) { return dr(op).a_log; },
    .weight_bytes = [](const Op& op) {
      const auto& a = dr(op);
      // A_log [n_head] and dt_bias: [n_head], or with KDA [n_head * head_dim].
      return sizeof(float) * (a.a_log.size() + (a.kda ? static_cast<size_t>(a.n_head * a.head_dim) : a.a_log.size()));
    },
    .state_bytes = [](const Op& op, const DecodeProgram& p, int) {
      const auto& a = dr(op);
      const int dk = key_dim_of(op, p.slots[static_cast<size_t>(op.in)].width);
      return 2 * sizeof(float) * static_cast<size_t>(a.n_head) * a.head_dim * dk;
    },
    .verify = [](const Op& op, const VerifyContext& v) {
      const auto& a = dr(op);
      const std::string& where = v.where;
      MK_CHECK(v.p.recurrent && op.cache_layer() >= 0, "{}: needs a recurrent program and a state layer", where);
      MK_CHECK(op.in >= 0 && op.in2 >= 0 && a.n_head > 0 && a.n_head_kv > 0 && a.n_head % a.n_head_kv == 0 &&
                   a.head_dim > 0,
               "{}: heads", where);
      MK_CHECK(v.width(op.out) == a.n_head * a.head_dim, "{}: output width", where);
      const int kq = v.width(op.in) - a.n_head * a.head_dim;
      MK_CHECK(kq > 0 && kq % (2 * a.n_head_kv) == 0, "{}: q|k|v width {}", where, v.width(op.in));
      const size_t nh = static_cast<size_t>(a.n_head);
      if (a.kda) {
        const int dk = kq / (2 * a.n_head_kv);
        MK_CHECK(a.n_head_kv == a.n_head && v.width(op.in2) == a.n_head * dk,
                 "{}: forget-gate input width {} vs {} heads x {}", where, v.width(op.in2), a.n_head, dk);
        MK_CHECK(op.in3 >= 0 && v.width(op.in3) == a.n_head, "{}: beta width", where);
        MK_CHECK(a.dt_bias.size() == nh * static_cast<size_t>(dk), "{}: dt_bias length", where);
      } else {
        MK_CHECK(v.width(op.in2) == 2 * a.n_head, "{}: [b | a] width {} vs {} heads", where, v.width(op.in2),
                 a.n_head);
        MK_CHECK(a.dt_bias.size() == nh, "{}: dt_bias length", where);
      }
      MK_CHECK(a.a_log.size() == nh, "{}: A_log / dt_bias", where);
    },
    .ref = delta_rule_op_tile<RefKernels>,
    .fast = delta_rule_op_tile<FastKernels>,
};

}  // namespace megakern
