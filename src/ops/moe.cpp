#include "ops/moe.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <variant>
#include <vector>

#include "core/error.h"
#include "ir/expert_bank.h"
#include "kernels/cpu/matmul.h"
#include "ops/registry.h"

namespace megakern {

namespace {

// The bank and top_k of a MoeGlu, MoeDown or MoeCombine op.
const ops::MoeExperts& experts_of(const Op& op) {
  return std::visit(
      [](const auto& p) -> const ops::MoeExperts& {
        if constexpr (std::is_base_of_v<ops::MoeExperts, std::decay_t<decltype(p)>>)
          return p;
        else
          fail("op is not an expert op");
      },
      op.params);
}

int n_slots(const Op& op, int n_rows) {
  const auto& x = experts_of(op);
  return std::min(x.bank->n_expert, n_rows * x.top_k);
}

// Output rows [begin, end) of chunk c of n over `rows` (balanced, multiples of 4).
void chunk_range(int rows, int c, int n, int& begin, int& end) {
  const int units = (rows + 3) / 4;
  begin = std::min(rows, units * c / n * 4);
  end = std::min(rows, units * (c + 1) / n * 4);
}

// The rows (r, j) of the step that selected the expert of this tile's slot,
// and that expert; false when the slot is unused this step.
struct SlotWork {
  int expert = -1;
  std::vector<int> row, sel;  // [m]: step row and selection index j
};

// The expert of a slot: the slot-th smallest distinct expert any row of the
// step selected, or -1 when fewer were selected.
int slot_expert(const Op& op, const StepContext& ctx, int slot) {
  const int k = experts_of(op).top_k;
  thread_local std::vector<int> ids;
  ids.clear();
  for (int r = 0; r < ctx.n_rows; ++r) {
    const float* route = row_of(ctx, op.in2, r);
    for (int j = 0; j < k; ++j) ids.push_back(static_cast<int>(route[j]));
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  if (slot >= static_cast<int>(ids.size())) return -1;
  const int e = ids[static_cast<size_t>(slot)];
  MK_DCHECK(e >= 0 && e < experts_of(op).bank->n_expert);
  return e;
}

bool slot_work(const Op& op, const StepContext& ctx, int slot, SlotWork& w) {
  const int k = experts_of(op).top_k;
  w.expert = slot_expert(op, ctx, slot);
  if (w.expert < 0) return false;
  w.row.clear();
  w.sel.clear();
  for (int r = 0; r < ctx.n_rows; ++r) {
    const float* route = row_of(ctx, op.in2, r);
    for (int j = 0; j < k; ++j)
      if (static_cast<int>(route[j]) == w.expert) {
        w.row.push_back(r);
        w.sel.push_back(j);
      }
  }
  return true;
}

float scale_of(const std::vector<float>& s, int e) { return s.empty() ? 1.f : s[static_cast<size_t>(e)]; }

}  // namespace

float swiglu_act(float g, float u) { return silu(g) * u; }
float situ_act(float g, float u) { return situ(g, u); }

int moe_tile_count(const Op& op, int n_rows, int n_workers) {
  const int slots = n_slots(op, n_rows);
  const ExpertBank& b = *experts_of(op).bank;
  const int out_rows = op.kind == OpKind::MoeGlu ? b.d_ff : b.d_in;
  // Enough output ranges that a single-row step still spreads over the team,
  // never ranges under 16 rows.
  const int chunks = std::clamp((n_workers + slots - 1) / slots, 1, std::max(1, out_rows / 16));
  return slots * chunks;
}

MoeTileCut moe_tile_cut(const Op& op, int n_rows, int t, int n_tiles) {
  const int chunks = n_tiles / n_slots(op, n_rows);
  MoeTileCut c;
  c.slot = t / chunks;
  const ExpertBank& b = *experts_of(op).bank;
  chunk_range(op.kind == OpKind::MoeGlu ? b.d_ff : b.d_in, t % chunks, chunks, c.begin, c.end);
  return c;
}

int moe_tile_weights(const Op& op, const StepContext& ctx, int t, int n_tiles, ByteRange out[2]) {
  const ExpertBank& b = *experts_of(op).bank;
  const MoeTileCut c = moe_tile_cut(op, ctx.n_rows, t, n_tiles);
  const int e = slot_expert(op, ctx, c.slot);
  if (e < 0) return 0;
  const bool glu = op.kind == OpKind::MoeGlu;
  int n = 0;
  for (const MatView* m : {glu ? &b.gate[static_cast<size_t>(e)] : &b.down[static_cast<size_t>(e)],
                           glu ? &b.up[static_cast<size_t>(e)] : nullptr}) {
    if (!m) continue;
    out[n].begin = m->data + static_cast<size_t>(c.begin) * m->row_bytes;
    out[n].bytes = static_cast<size_t>(c.end - c.begin) * m->row_bytes;
    ++n;
  }
  return n;
}

size_t moe_tile_weight_bytes(const Op& op, int n_rows, int t, int n_tiles) {
  const ExpertBank& b = *experts_of(op).bank;
  const MoeTileCut c = moe_tile_cut(op, n_rows, t, n_tiles);
  const size_t row_bytes = op.kind == OpKind::MoeGlu ? b.gate[0].row_bytes + b.up[0].row_bytes : b.down[0].row_bytes;
  return static_cast<size_t>(c.end - c.begin) * row_bytes;
}

namespace {

// One pass of the router's top-k: the index of the largest key not yet
// taken (taken keys are -inf), strictly greater wins so ties go to the
// lowest index; a NaN key is taken only when nothing else is left; 0 when
// every key is taken.
int largest_untaken(const std::vector<float>& key, int E) {
  int best = -1;
  for (int e = 0; e < E; ++e) {
    const float v = key[static_cast<size_t>(e)];
    if (v == -INFINITY) continue;
    if (best < 0 || v > key[static_cast<size_t>(best)]) best = e;
  }
  return best < 0 ? 0 : best;
}

// v[0..n) replaced by its softmax, in double from the largest value: every
// weight rounds once to f32.
void softmax_f64(float* v, int n) {
  double mx = -INFINITY, sum = 0;
  for (int i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(v[i]));
  for (int i = 0; i < n; ++i) sum += std::exp(static_cast<double>(v[i]) - mx);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(std::exp(static_cast<double>(v[i]) - mx) / sum);
}

void moe_route_tile(const Op& op, const StepContext& ctx, int r, int) {
  const auto& a = op.as<ops::MoeRoute>();
  const int E = width_of(ctx, op.in), k = a.top_k;
  const float* logit = row_of(ctx, op.in, r);
  float* out = row_of(ctx, op.out, r);
  thread_local std::vector<float> score, key;
  score.resize(static_cast<size_t>(E));
  key.resize(static_cast<size_t>(E));
  // The multiplier acts inside the sigmoid and the weights are the unbiased
  // scores over (their sum + eps): the reference's musespark/moe.py
  // route_from_logits (scale = output_multiplier, eps = route_eps) and, with
  // scale 1 and eps 0, kimi/__init__.py route.
  if (a.softmax_selected) {
    // gpt-oss: the top k of the logits (+ bias), ties to the lowest index,
    // weighted by the softmax over the selected logits alone.
    for (int e = 0; e < E; ++e)
      key[static_cast<size_t>(e)] = logit[e] + (a.bias.empty() ? 0.f : a.bias[static_cast<size_t>(e)]);
    for (int j = 0; j < k; ++j) {
      const int best = largest_untaken(key, E);
      out[j] = static_cast<float>(best);
      out[k + j] = key[static_cast<size_t>(best)];
      key[static_cast<size_t>(best)] = -INFINITY;
    }
    softmax_f64(out + k, k);
    return;
  }
  if (a.softmax) {
    for (int e = 0; e < E; ++e) score[static_cast<size_t>(e)] = a.scale * logit[e];
    softmax_f64(score.data(), E);
  } else {
    for (int e = 0; e < E; ++e) score[static_cast<size_t>(e)] = sigmoidf(a.scale * logit[e]);
  }
  for (int e = 0; e < E; ++e)
    key[static_cast<size_t>(e)] = score[static_cast<size_t>(e)] + (a.bias.empty() ? 0.f : a.bias[static_cast<size_t>(e)]);
  if (a.n_group > 1) {
    // Group-limited routing: each group scored by its best key (or the sum
    // of its two best), the topk_group best groups kept, the others' keys
    // removed before the top-k.
    const int G = a.n_group, per = E / G;
    thread_local std::vector<float> gscore;
    gscore.assign(static_cast<size_t>(G), 0.f);
    for (int g = 0; g < G; ++g) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int e = g * per; e < (g + 1) * per; ++e) {
        const float v = key[static_cast<size_t>(e)];
        if (v > b1) {
          b2 = b1;
          b1 = v;
        } else if (v > b2) {
          b2 = v;
        }
      }
      gscore[static_cast<size_t>(g)] = a.group_top2 ? b1 + b2 : b1;
    }
    thread_local std::vector<char> keep;
    keep.assign(static_cast<size_t>(G), 0);
    for (int j = 0; j < a.topk_group; ++j) {
      int best = -1;
      for (int g = 0; g < G; ++g)
        if (!keep[static_cast<size_t>(g)] && (best < 0 || gscore[static_cast<size_t>(g)] > gscore[static_cast<size_t>(best)]))
          best = g;
      keep[static_cast<size_t>(best)] = 1;
    }
    for (int e = 0; e < E; ++e)
      if (!keep[static_cast<size_t>(e / per)]) key[static_cast<size_t>(e)] = -INFINITY;
  }
  // k passes of largest_untaken, each taken entry then marked -inf.
  float sum = 0.f;
  for (int j = 0; j < k; ++j) {
    const int best = largest_untaken(key, E);
    key[static_cast<size_t>(best)] = -INFINITY;
    out[j] = static_cast<float>(best);
    out[k + j] = score[static_cast<size_t>(best)];
    sum += score[static_cast<size_t>(best)];
  }
  if (a.normalize) {
    const float den = sum + a.eps;
    for (int j = 0; j < k; ++j) out[k + j] = den > 0.f ? out[k + j] / den : 0.f;
  }
  if (a.weight_scale != 1.f)
    for (int j = 0; j < k; ++j) out[k + j] *= a.weight_scale;
}

// Y[i][o] = W[o] . X[i] for o in [b, e): X [m][W.cols], Y [m][ldy].
template <class K>
void expert_matmul(const StepContext& ctx, const MatView& W, const float* X, int m, float* Y, int64_t ldy, int b,
                   int e) {
  K::matmul(*ctx.program, W, X, m, Y, ldy, b, e);
}

template <class K>
void moe_glu_tile(const Op& op, const StepContext& ctx, int t, int n_tiles) {
  const ExpertBank& b = *experts_of(op).bank;
  const MoeTileCut c = moe_tile_cut(op, ctx.n_rows, t, n_tiles);
  thread_local SlotWork w;
  if (!slot_work(op, ctx, c.slot, w)) return;
  const int fb = c.begin, fe = c.end;
  const int m = static_cast<int>(w.row.size()), D = b.d_in, F = b.d_ff;
  thread_local std::vector<float> X, G, U;
  X.resize(static_cast<size_t>(m) * D);
  G.resize(static_cast<size_t>(m) * F);
  U.resize(static_cast<size_t>(m) * F);
  for (int i = 0; i < m; ++i) std::copy_n(row_of(ctx, op.in, w.row[static_cast<size_t>(i)]), D, X.data() + static_cast<size_t>(i) * D);
  const int e = w.expert;
  expert_matmul<K>(ctx, b.gate[static_cast<size_t>(e)], X.data(), m, G.data(), F, fb, fe);
  expert_matmul<K>(ctx, b.up[static_cast<size_t>(e)], X.data(), m, U.data(), F, fb, fe);
  float gs = scale_of(b.gate_scale, e), us = scale_of(b.up_scale, e);
  const GluKind kind = b.act == ExpertAct::SiTU      ? GluKind::SiTU
                       : b.act == ExpertAct::SwiGluOai ? GluKind::SwiGluOai
                                                       : GluKind::SiLU;
  if (!b.gate_bias.empty()) {
    // Biases are added after the scales, in f32, before the activation.
    const float* bg = b.gate_bias.data() + static_cast<size_t>(e) * F;
    const float* bu = b.up_bias.data() + static_cast<size_t>(e) * F;
    for (int i = 0; i < m; ++i) {
      float* g = G.data() + static_cast<size_t>(i) * F;
      float* u = U.data() + static_cast<size_t>(i) * F;
      for (int f = fb; f < fe; ++f) {
        g[f] = gs * g[f] + bg[f];
        u[f] = us * u[f] + bu[f];
      }
    }
    gs = us = 1.f;
  }
  for (int i = 0; i < m; ++i) {
    float* h = row_of(ctx, op.out, w.row[static_cast<size_t>(i)]) + static_cast<size_t>(w.sel[static_cast<size_t>(i)]) * F;
    const float* g = G.data() + static_cast<size_t>(i) * F;
    const float* u = U.data() + static_cast<size_t>(i) * F;
    K::glu(kind, g + fb, u + fb, gs, us, h + fb, fe - fb);
  }
}

template <class K>
void moe_down_tile(const Op& op, const StepContext& ctx, int t, int n_tiles) {
  const ExpertBank& b = *experts_of(op).bank;
  const MoeTileCut c = moe_tile_cut(op, ctx.n_rows, t, n_tiles);
  thread_local SlotWork w;
  if (!slot_work(op, ctx, c.slot, w)) return;
  const int db = c.begin, de = c.end;
  const int m = static_cast<int>(w.row.size()), D = b.d_in, F = b.d_ff;
  thread_local std::vector<float> X, Y;
  X.resize(static_cast<size_t>(m) * F);
  Y.resize(static_cast<size_t>(m) * D);
  for (int i = 0; i < m; ++i)
    std::copy_n(row_of(ctx, op.in, w.row[static_cast<size_t>(i)]) + static_cast<size_t>(w.sel[static_cast<size_t>(i)]) * F,
                F, X.data() + static_cast<size_t>(i) * F);
  const int e = w.expert;
  expert_matmul<K>(ctx, b.down[static_cast<size_t>(e)], X.data(), m, Y.data(), D, db, de);
  const float ds = scale_of(b.down_scale, e);
  const float* bd = b.down_bias.empty() ? nullptr : b.down_bias.data() + static_cast<size_t>(e) * D;
  for (int i = 0; i < m; ++i) {
    float* y = row_of(ctx, op.out, w.row[static_cast<size_t>(i)]) + static_cast<size_t>(w.sel[static_cast<size_t>(i)]) * D;
    const float* src = Y.data() + static_cast<size_t>(i) * D;
    if (bd)
      for (int d = db; d < de; ++d) y[d] = ds * src[d] + bd[d];
    else
      for (int d = db; d < de; ++d) y[d] = ds * src[d];
  }
}

void moe_combine_tile(const Op& op, const StepContext& ctx, int r, int) {
  const ExpertBank& b = *experts_of(op).bank;
  const int k = experts_of(op).top_k, D = b.d_in;
  const float* route = row_of(ctx, op.in2, r);
  const float* y = row_of(ctx, op.in, r);
  float* out = row_of(ctx, op.out, r);
  thread_local std::vector<float> tmp;
  tmp.resize(static_cast<size_t>(D));
  std::fill(out, out + D, 0.f);
  for (int j = 0; j < k; ++j) {
    const float wj = route[k + j];
    const float* yj = y + static_cast<size_t>(j) * D;
    if (!b.out_norm.empty()) {
      // The shared weight scales the expert output before a weightless norm
      // (musespark/moe.py finalize: t = Y * w_post, t * rsqrt(mean(t^2) + post_eps)).
      for (int d = 0; d < D; ++d) tmp[static_cast<size_t>(d)] = yj[d] * b.out_norm[static_cast<size_t>(d)];
      rmsnorm(tmp.data(), nullptr, D, b.out_norm_eps, tmp.data());
      yj = tmp.data();
    }
    for (int d = 0; d < D; ++d) out[d] += wj * yj[d];
  }
}

void verify_experts(const Op& op, const VerifyContext& v) {
  const ops::MoeExperts& x = experts_of(op);
  const ExpertBank* b = x.bank;
  const std::string& where = v.where;
  MK_CHECK(b && b->n_expert > 0 && x.top_k > 0 && x.top_k <= b->n_expert, "{}: expert bank", where);
  MK_CHECK(op.in >= 0 && op.in2 >= 0 && v.width(op.in2) == 2 * x.top_k, "{}: route slot", where);
  const size_t E = static_cast<size_t>(b->n_expert);
  MK_CHECK(b->gate.size() == E && b->up.size() == E && b->down.size() == E, "{}: bank matrices", where);
  for (size_t e = 0; e < E; ++e)
    MK_CHECK(b->gate[e].data && b->up[e].data && b->down[e].data && b->gate[e].rows == b->d_ff &&
                 b->gate[e].cols == b->d_in && b->up[e].rows == b->d_ff && b->up[e].cols == b->d_in &&
                 b->down[e].rows == b->d_in && b->down[e].cols == b->d_ff,
             "{}: expert {} matrices do not match [{}][{}] / [{}][{}]", where, e, b->d_ff, b->d_in, b->d_in, b->d_ff);
  for (const auto* s : {&b->gate_scale, &b->up_scale, &b->down_scale})
    MK_CHECK(s->empty() || s->size() == E, "{}: expert scales", where);
  const size_t F = static_cast<size_t>(b->d_ff), Din = static_cast<size_t>(b->d_in);
  MK_CHECK(b->gate_bias.size() == b->up_bias.size() && (b->gate_bias.empty() || b->gate_bias.size() == E * F) &&
               (b->down_bias.empty() || b->down_bias.size() == E * Din),
           "{}: expert biases ({} / {} / {} floats for {} experts of [{}][{}])", where, b->gate_bias.size(),
           b->up_bias.size(), b->down_bias.size(), E, F, Din);
  MK_CHECK(b->out_norm.empty() || b->out_norm.size() == static_cast<size_t>(b->d_in),
           "{}: expert output norm weight ({} floats, want {})", where, b->out_norm.size(), b->d_in);
  const int k = x.top_k, in = v.width(op.in), out = v.width(op.out);
  if (op.kind == OpKind::MoeGlu)
    MK_CHECK(in == b->d_in && out == k * b->d_ff, "{}: widths", where);
  else if (op.kind == OpKind::MoeDown)
    MK_CHECK(in == k * b->d_ff && out == k * b->d_in, "{}: widths", where);
  else
    MK_CHECK(in == k * b->d_in && out == b->d_in, "{}: widths", where);
}

// Routed weight bytes of n rows: the expected number of distinct experts n
// rows select under uniform independent routing, E (1 - (1 - k/E)^n), instead of k.
double routed_bytes_for_rows(const Op& op, int n_rows) {
  const double w = static_cast<double>(op.weight_bytes());
  const ops::MoeExperts& x = experts_of(op);
  if (!x.bank || x.top_k <= 0) return w;
  const double E = x.bank->n_expert, k = x.top_k;
  const double distinct = E * (1.0 - std::pow(1.0 - k / E, n_rows));
  return w / k * distinct;
}

}  // namespace

extern const OpInfo kMoeRouteOp = {
    .name = "moe_route",
    .small_weights = [](const Op& op) { return op.as<ops::MoeRoute>().bias; },
    .verify = [](const Op& op, const VerifyContext& v) {
      const auto& a = op.as<ops::MoeRoute>();
      MK_CHECK(op.in >= 0 && a.top_k > 0 && a.top_k <= v.width(op.in), "{}: top_k {} of {}", v.where, a.top_k,
               op.in >= 0 ? v.width(op.in) : 0);
      MK_CHECK(v.width(op.out) == 2 * a.top_k, "{}: route slot width {} vs 2 x top_k", v.where, v.width(op.out));
      MK_CHECK(a.bias.empty() || a.bias.size() == static_cast<size_t>(v.width(op.in)), "{}: bias length", v.where);
      MK_CHECK(std::isfinite(a.weight_scale), "{}: weight_scale", v.where);
      if (a.n_group != 1) {
        const int E = op.in >= 0 ? v.width(op.in) : 0;
        MK_CHECK(a.n_group > 1 && E % a.n_group == 0 && a.topk_group >= 1 && a.topk_group <= a.n_group &&
                     a.top_k <= a.topk_group * (E / a.n_group) && (!a.group_top2 || E / a.n_group >= 2),
                 "{}: {} experts in {} groups, {} groups kept, top {}", v.where, E, a.n_group, a.topk_group, a.top_k);
      }
    },
    .ref = moe_route_tile,
    .fast = moe_route_tile,
};

extern const OpInfo kMoeGluOp = {
    .name = "moe_glu",
    .row_tiled = false,
    .shareable = true,  // uneven: an expert's rows vary with the routing
    .tile_count = moe_tile_count,
    // What one row reads (top_k experts, sized as expert 0).
    .weight_bytes = [](const Op& op) {
      const auto& x = experts_of(op);
      return x.bank ? static_cast<size_t>(x.top_k) * x.bank->glu_bytes(0) : 0;
    },
    .routed_weights = moe_tile_weights,
    .routed_weight_bytes = moe_tile_weight_bytes,
    .weight_bytes_for_rows = routed_bytes_for_rows,
    .verify = verify_experts,
    .ref = moe_glu_tile<RefKernels>,
    .fast = moe_glu_tile<FastKernels>,
};

extern const OpInfo kMoeDownOp = {
    .name = "moe_down",
    .row_tiled = false,
    .shareable = true,  // uneven: an expert's rows vary with the routing
    .tile_count = moe_tile_count,
    // A slot's down projection reads the hidden values of its own expert's
    // rows only: the up projection tiles of that slot (every output range).
    .reads_tile = [](const Op& op, const Op& producer, int n_rows, int t, int n_tiles, int pt, int np) {
      // Only the read of the up projection's values is narrowed (not a
      // write-after-read or write-after-write on the same pair of ops).
      if (producer.kind != OpKind::MoeGlu || producer.out != op.in || producer.in2 != op.in2 ||
          producer.out == op.out || producer.in == op.out || producer.in2 == op.out ||
          experts_of(producer).bank != experts_of(op).bank)
        return true;
      return moe_tile_cut(op, n_rows, t, n_tiles).slot == moe_tile_cut(producer, n_rows, pt, np).slot;
    },
    .weight_bytes = [](const Op& op) {
      const auto& x = experts_of(op);
      return x.bank ? static_cast<size_t>(x.top_k) * x.bank->down_bytes(0) : 0;
    },
    .routed_weights = moe_tile_weights,
    .routed_weight_bytes = moe_tile_weight_bytes,
    .weight_bytes_for_rows = routed_bytes_for_rows,
    .verify = verify_experts,
    .ref = moe_down_tile<RefKernels>,
    .fast = moe_down_tile<FastKernels>,
};

extern const OpInfo kMoeCombineOp = {
    .name = "moe_combine",
    .weight_bytes = [](const Op& op) {  // one shared [d_in] weight
      const auto& x = experts_of(op);
      return x.bank ? sizeof(float) * x.bank->out_norm.size() : 0;
    },
    .verify = verify_experts,
    .ref = moe_combine_tile,
    .fast = moe_combine_tile,
};

}  // namespace megakern
