#include "exec/op_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "exec/gate_kernels.h"
#include "exec/kimi_kernels.h"
#include "exec/moe_kernels.h"
#include "exec/recurrent_kernels.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_rows.h"
#include "kernels/cpu/vec.h"

namespace megakern {

bool op_is_row_tiled(const Op& op) {
  // The recurrent ops compute a sequence's rows together (its first row's
  // tile does the block), and the expert ops are tiled by (expert, output
  // range): a tile of theirs is not one row's work.
  return op.kind != OpKind::MatMul && op.kind != OpKind::Attention && op.kind != OpKind::DeltaRule &&
         op.kind != OpKind::CausalConvSilu && op.kind != OpKind::MoeGlu && op.kind != OpKind::MoeDown;
}

int attention_group_split(const Op& op, int n_rows, int n_workers) {
  // A tile does the query heads of one KV head (its keys and values read
  // once), unless that leaves the team unevenly loaded: then the group is
  // cut into the fewest equal parts that give whole rounds of tiles or at
  // least four tiles per worker.
  const int group = op.n_head / op.n_head_kv;
  for (int s = 1; s < group; ++s) {
    if (group % s) continue;
    const int tiles = n_rows * op.n_head_kv * s;
    if (tiles % n_workers == 0 || tiles >= 4 * n_workers) return s;
  }
  return group;
}

int op_tile_count(const Op& op, int n_rows, int n_workers) {
  switch (op.kind) {
    case OpKind::MatMul: {
      // One contiguous range per worker, but never ranges under 4 rows.
      const int64_t max_tiles = std::max<int64_t>(1, op.mat.rows / 4);
      return static_cast<int>(std::min<int64_t>(n_workers, max_tiles));
    }
    case OpKind::Attention: return n_rows * op.n_head_kv * attention_group_split(op, n_rows, n_workers);
    case OpKind::DeltaRule: return n_rows * op.n_head;
    case OpKind::MoeGlu:
    case OpKind::MoeDown: return moe_tile_count(op, n_rows, n_workers);
    default: return n_rows;
  }
}

void matmul_tile_range(const Op& op, int t, int n, int64_t& begin, int64_t& end) {
  const int64_t units = (op.mat.rows + 3) / 4;
  begin = std::min(op.mat.rows, units * t / n * 4);
  end = std::min(op.mat.rows, units * (t + 1) / n * 4);
}

void validate_rows(const DecodeProgram& p, const std::vector<RowInput>& rows) {
  if (rows.empty() || static_cast<int>(rows.size()) > p.max_rows)
    fail("a step needs 1 to {} rows, got {}", p.max_rows, rows.size());
  int n_cache_layers = 0;
  for (const Op& op : p.ops)
    if (op.kind == OpKind::StoreKV) n_cache_layers = std::max(n_cache_layers, op.cache_layer() + 1);
  for (size_t r = 0; r < rows.size(); ++r) {
    const RowInput& in = rows[r];
    if (!in.cache) fail("row {} has no KV cache", r);
    if (in.token < 0 || in.token >= p.n_vocab)
      fail("row {}: token id {} is outside the vocabulary of {} tokens", r, in.token, p.n_vocab);
    if (in.pos < 0 || in.pos >= in.cache->n_ctx)
      fail("row {}: position {} is outside its context of {} tokens", r, in.pos, in.cache->n_ctx);
    if (in.cache->kv_dim != p.kv_dim || in.cache->v_width() != p.v_width())
      fail("row {}: KV cache widths K {} / V {} do not match the model's {} / {}", r, in.cache->kv_dim,
           in.cache->v_width(), p.kv_dim, p.v_width());
    const size_t need = in.cache->floats_for(n_cache_layers);
    if (in.cache->n_layer < n_cache_layers || in.cache->k.size() < need ||
        in.cache->v.size() < in.cache->v_offset(need))
      fail("row {}: the KV cache holds {} layers, the program needs {}", r, in.cache->n_layer, n_cache_layers);
    // Rows sharing a cache are one sequence's block: adjacent in the row
    // list at consecutive positions, so no two rows write the same entry and
    // each row's history is complete when it attends.
    for (size_t q = 0; q + 1 < r; ++q)
      if (rows[q].cache == in.cache && rows[r - 1].cache != in.cache)
        fail("rows {} and {} share a KV cache but are not adjacent in the step", q, r);
    if (r > 0 && rows[r - 1].cache == in.cache && rows[r - 1].pos + 1 != in.pos)
      fail("rows {} and {} share a KV cache but have positions {} and {} (must be consecutive)", r - 1, r,
           rows[r - 1].pos, in.pos);
  }
  // A ring-buffer layer keeps its last ring_len(layer) positions: attention
  // over it must be windowed, and the window of a block's first row must
  // survive the stores of the whole block (window + block - 1 positions).
  for (size_t r = 0; r < rows.size(); ++r) {
    const KVCache& c = *rows[r].cache;
    if (c.ring.empty()) continue;
    size_t first = r;
    while (first > 0 && rows[first - 1].cache == &c) --first;
    const int block = static_cast<int>(r - first) + 1;
    for (const Op& op : p.ops) {
      if (op.kind != OpKind::Attention || c.ring_len(op.cache_layer()) == 0) continue;
      const int len = c.ring_len(op.cache_layer());
      if (op.window <= 0 || op.window + block - 1 > len)
        fail("row {}: KV layer {} keeps {} positions, too few for attention window {} over a block of {} rows", r,
             op.cache_layer(), len, op.window, block);
    }
  }
  if (p.recurrent) validate_recurrent_rows(p, rows.data(), static_cast<int>(rows.size()));
}

namespace {

void matmul_scalar(const MatView& W, const float* X, int n_x, float* Y, int64_t ldy, int64_t b, int64_t e) {
  const auto& tr = dtype_traits(W.type);
  for (int64_t j = b; j < e; ++j)
    for (int t = 0; t < n_x; ++t) Y[t * ldy + j] = tr.dot(W.row(j), X + static_cast<int64_t>(t) * W.cols, W.cols);
}

// Attention of row r for the query heads of KV head g (GQA: n_head /
// n_head_kv query heads share it). The positions are visited in chunks small
// enough to stay in L1, and every query head of the group uses a chunk's keys
// (then values) before the next is loaded, so a KV head is read from memory
// once per row rather than once per query head. Each head's scores and output
// are computed exactly as one head at a time would (same kernels over the same
// positions in the same order), so the grouping does not change any bit.
void attention_tile(const Op& op, const StepContext& ctx, int r, int g, int part, int n_parts) {
  const RowInput& row = ctx.rows[r];
  KVCache& cache = *row.cache;
  const int hd = op.head_dim, group = op.n_head / op.n_head_kv / n_parts;
  const int vd = op.v_head_dim > 0 ? op.v_head_dim : hd;
  const int pos = row.pos;
  const int start = op.window > 0 ? std::max(0, pos - op.window + 1) : 0;
  const int n = pos - start + 1;
  const int h0 = g * group * n_parts + part * group;  // first query head of this tile
  const float* q = row_of(ctx, op.in, r) + static_cast<size_t>(h0) * hd;
  thread_local std::vector<float> scores;  // [group][n]
  scores.resize(static_cast<size_t>(group) * n);
  const int layer = op.cache_layer();
  // Positions in runs stored back to back (a ring layer wraps at most once),
  // cut into chunks of at most kChunk positions.
  constexpr int kChunk = 16, kPrefetchFrom = 1024;
  const int ring = cache.ring_len(layer);
  auto chunk_end = [&](int p) {
    const int run = ring > 0 ? std::min(pos + 1, p + ring - p % ring) : pos + 1;
    return std::min(run, p + kChunk);
  };
  // A head's keys or values of one position are a short run (hd floats)
  // every kv_dim floats: consecutive positions fall in different pages, where
  // the hardware prefetchers stop, so the next chunk's lines are prefetched
  // in software while this one is used. Short histories are left to the
  // caches (they are mostly still there from the previous step's layer).
  const bool prefetch = n >= kPrefetchFrom;
  auto prefetch_chunk = [&](bool values, int p) {
    if (!prefetch || p > pos) return;
    const int e = chunk_end(p);
    const int w = values ? vd : hd;
    const size_t stride = static_cast<size_t>(values ? cache.v_width() : cache.kv_dim);
    const float* base = values ? cache.v_at(layer, p) + g * vd : cache.k_at(layer, p) + g * hd;
    for (int i = 0; i < e - p; ++i)
      for (int c = 0; c < w; c += 16) __builtin_prefetch(base + i * stride + c, 0, 3);
  };
  for (int p = start; p <= pos;) {
    const int e = chunk_end(p);
    const float* k = cache.k_at(layer, p) + g * hd;
    prefetch_chunk(false, e);
    for (int j = 0; j < group; ++j) {
      const float* qh = q + static_cast<size_t>(j) * hd;
      float* s = scores.data() + static_cast<size_t>(j) * n + (p - start);
      if (ctx.scalar)
        for (int i = 0; i < e - p; ++i) s[i] = dot_f32_scalar(qh, k + static_cast<size_t>(i) * cache.kv_dim, hd);
      else
        dot_f32_rows(qh, k, cache.kv_dim, e - p, hd, s);
      for (int i = 0; i < e - p; ++i) s[i] *= op.scale;
    }
    p = e;
  }
  float* out = row_of(ctx, op.out, r) + static_cast<size_t>(h0) * vd;
  for (int j = 0; j < group; ++j) {
    float* s = scores.data() + static_cast<size_t>(j) * n;
    if (ctx.scalar)
      softmax_inplace_scalar(s, n);
    else
      softmax_inplace(s, n);
  }
  std::fill(out, out + static_cast<size_t>(group) * vd, 0.f);
  for (int p = start; p <= pos;) {
    const int e = chunk_end(p);
    const float* v = cache.v_at(layer, p) + g * vd;
    prefetch_chunk(true, e);
    for (int j = 0; j < group; ++j) {
      const float* w = scores.data() + static_cast<size_t>(j) * n + (p - start);
      float* oh = out + static_cast<size_t>(j) * vd;
      if (ctx.scalar)
        for (int i = 0; i < e - p; ++i) axpy_f32_scalar(w[i], v + static_cast<size_t>(i) * cache.v_width(), oh, vd);
      else
        axpy_f32_rows(w, v, cache.v_width(), e - p, oh, vd);
    }
    p = e;
  }
}

}  // namespace

void run_op_tile(const Op& op, const StepContext& ctx, int t, int n_tiles) {
  const DecodeProgram& p = *ctx.program;
  switch (op.kind) {
    case OpKind::Embed: {
      float* out = row_of(ctx, op.out, t);
      const int32_t tok = ctx.rows[t].token;
      if (ctx.scalar)
        dtype_traits(op.mat.type).dequantize(op.mat.row(tok), out, op.mat.cols);
      else
        dequantize_row(op.mat, tok, out);
      if (op.scale != 1.f)
        for (int64_t i = 0; i < op.mat.cols; ++i) out[i] *= op.scale;
      break;
    }
    case OpKind::RmsNorm:
      rmsnorm(row_of(ctx, op.in, t), op.norm, op.n_norm, op.eps, row_of(ctx, op.out, t));
      break;
    case OpKind::MatMul: {
      int64_t b, e;
      matmul_tile_range(op, t, n_tiles, b, e);
      const int64_t ldy = p.slots[static_cast<size_t>(op.out)].width;
      if (ctx.scalar)
        matmul_scalar(op.mat, ctx.slot[static_cast<size_t>(op.in)], ctx.n_rows, ctx.slot[static_cast<size_t>(op.out)], ldy, b, e);
      else
        matmul_rows(op.mat, ctx.slot[static_cast<size_t>(op.in)], ctx.n_rows, ctx.slot[static_cast<size_t>(op.out)], ldy, b, e,
                    p.numerics);
      break;
    }
    case OpKind::HeadNormRope: {
      float* v = row_of(ctx, op.out, t);
      thread_local RopeAngles angles;
      angles.compute(op.rope_dim, ctx.rows[t].pos, op.rope_base);
      for (int h = 0; h < op.n_head; ++h) {
        float* vh = v + h * op.head_dim;
        if (op.norm) rmsnorm(vh, op.norm, op.head_dim, op.eps, vh);
        rope_apply(vh, op.rope_dim, angles, op.rope_neox);
      }
      break;
    }
    case OpKind::StoreKV: {
      KVCache& c = *ctx.rows[t].cache;
      const int pos = ctx.rows[t].pos;
      std::memcpy(c.k_at(op.cache_layer(), pos), row_of(ctx, op.in, t), sizeof(float) * static_cast<size_t>(p.kv_dim));
      std::memcpy(c.v_at(op.cache_layer(), pos), row_of(ctx, op.in2, t), sizeof(float) * static_cast<size_t>(p.v_width()));
      break;
    }
    case OpKind::Attention:
    {
      const int per_row = n_tiles / ctx.n_rows, n_parts = per_row / op.n_head_kv;
      attention_tile(op, ctx, t / per_row, t % per_row / n_parts, t % n_parts, n_parts);
    }
      break;
    case OpKind::GluAct: {
      const float* g = row_of(ctx, op.in, t);
      const float* u = row_of(ctx, op.in2, t);
      float* o = row_of(ctx, op.out, t);
      const int n = p.slots[static_cast<size_t>(op.out)].width;
      const GluKind kind = op.situ ? GluKind::SiTU : op.gelu ? GluKind::GeluTanh : GluKind::SiLU;
      if (ctx.scalar)
        glu_act_scalar(kind, g, u, 1.f, 1.f, o, n);
      else
        glu_act(kind, g, u, 1.f, 1.f, o, n);
      break;
    }
    case OpKind::Residual: {
      float* x = row_of(ctx, op.out, t);
      const int n = p.slots[static_cast<size_t>(op.out)].width;
      const float* in = row_of(ctx, op.in, t);
      if (op.norm) {
        thread_local std::vector<float> tmp;
        tmp.resize(static_cast<size_t>(n));
        rmsnorm(in, op.norm, n, op.eps, tmp.data());
        for (int i = 0; i < n; ++i) x[i] += tmp[static_cast<size_t>(i)];
      } else {
        for (int i = 0; i < n; ++i) x[i] += in[i];
      }
      break;
    }
    case OpKind::SigmoidGate: sigmoid_gate_tile(op, ctx, t); break;
    case OpKind::CausalConvSilu: causal_conv_silu_tile(op, ctx, t); break;
    case OpKind::DeltaRule: delta_rule_tile(op, ctx, t / op.n_head, t % op.n_head); break;
    case OpKind::GatedRmsNorm: gated_rmsnorm_tile(op, ctx, t); break;
    case OpKind::GatedResidual: gated_residual_tile(op, ctx, t); break;
    case OpKind::HeadNormGate: head_norm_gate_tile(op, ctx, t); break;
    case OpKind::LogitSoftcap: logit_softcap_tile(op, ctx, t); break;
    case OpKind::AttnResMix: attn_res_mix_tile(op, ctx, t); break;
    case OpKind::AttnResAdd: attn_res_add_tile(op, ctx, t); break;
    case OpKind::MlaKey: mla_key_tile(op, ctx, t); break;
    case OpKind::MoeRoute: moe_route_tile(op, ctx, t); break;
    case OpKind::MoeGlu: moe_glu_tile(op, ctx, t, n_tiles); break;
    case OpKind::MoeDown: moe_down_tile(op, ctx, t, n_tiles); break;
    case OpKind::MoeCombine: moe_combine_tile(op, ctx, t); break;
    case OpKind::Tap:
      if (ctx.taps) {
        const int w = width_of(ctx, op.in);
        std::memcpy(ctx.taps + static_cast<size_t>(t) * static_cast<size_t>(p.tap_width) + op.tap_offset,
                    row_of(ctx, op.in, t), sizeof(float) * static_cast<size_t>(w));
      }
      break;
  }
}

}  // namespace megakern
