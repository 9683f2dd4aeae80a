#include "exec/op_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "exec/gate_kernels.h"
#include "exec/kimi_kernels.h"
#include "exec/moe_kernels.h"
#include "exec/recurrent_kernels.h"
#include "kernels/cpu/attention.h"
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

int attention_row_block(int n_rows) {
  // Up to 8 rows (decode batches of different sequences, short verify
  // blocks) a tile is one row, as many tiles as possible for the team. A
  // longer step is a prompt chunk: blocks of kRows rows share each tile of
  // keys and values, and still give several tiles per worker.
  constexpr int kRows = 16;
  return n_rows <= 8 ? 1 : kRows;
}

AttentionTiling attention_tiling(const Op& op, int n_rows, int n_tiles) {
  (void)op;
  AttentionTiling at;
  at.rows_per_block = attention_row_block(n_rows);
  at.n_blocks = (n_rows + at.rows_per_block - 1) / at.rows_per_block;
  at.per_block = n_tiles / at.n_blocks;
  return at;
}

bool op_tile_rows(const Op& op, int t, int n_tiles, int n_rows, int& r0, int& r1) {
  if (op_is_row_tiled(op)) {
    r0 = t;
    r1 = t + 1;
    return true;
  }
  if (op.kind != OpKind::Attention) return false;
  const AttentionTiling at = attention_tiling(op, n_rows, n_tiles);
  const int b = t / at.per_block;
  r0 = b * at.rows_per_block;
  r1 = std::min(n_rows, r0 + at.rows_per_block);
  return true;
}

void attention_tiles_of_rows(const Op& op, int r0, int r1, int n_tiles, int n_rows, int& t0, int& t1) {
  const AttentionTiling at = attention_tiling(op, n_rows, n_tiles);
  t0 = r0 / at.rows_per_block * at.per_block;
  t1 = ((r1 - 1) / at.rows_per_block + 1) * at.per_block;
}

int attention_group_split(const Op& op, int n_blocks, int n_workers) {
  // A tile does the query heads of one KV head (its keys and values read
  // once), unless that leaves the team unevenly loaded: then the group is
  // cut into the fewest equal parts that give whole rounds of tiles or at
  // least four tiles per worker.
  const int group = op.n_head / op.n_head_kv;
  for (int s = 1; s < group; ++s) {
    if (group % s) continue;
    const int tiles = n_blocks * op.n_head_kv * s;
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
    case OpKind::Attention: {
      const int n_blocks = (n_rows + attention_row_block(n_rows) - 1) / attention_row_block(n_rows);
      return n_blocks * op.n_head_kv * attention_group_split(op, n_blocks, n_workers);
    }
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

// Attention of step rows [r0, r1) for the query heads of part `part` of KV
// head g's group (GQA: n_head / n_head_kv query heads share it). Rows of one
// sequence (adjacent in the step, consecutive positions) go through the
// tiled kernel together, so each tile of the KV head's keys and values is
// read once for all of them and all their heads; every output has the bits
// of that row and head computed alone (kernels/cpu/attention.h).
void attention_tile(const Op& op, const StepContext& ctx, int r0, int r1, int g, int part, int n_parts) {
  const int hd = op.head_dim, group = op.n_head / op.n_head_kv / n_parts;
  const int vd = op.v_head_dim > 0 ? op.v_head_dim : hd;
  const int h0 = g * group * n_parts + part * group;  // first query head of this tile
  const int layer = op.cache_layer();
  for (int r = r0; r < r1;) {
    KVCache& cache = *ctx.rows[r].cache;
    int e = r + 1;
    while (e < r1 && ctx.rows[e].cache == &cache) ++e;
    AttentionBlock a;
    a.q = row_of(ctx, op.in, r) + static_cast<size_t>(h0) * hd;
    a.q_stride = width_of(ctx, op.in);
    a.out = row_of(ctx, op.out, r) + static_cast<size_t>(h0) * vd;
    a.out_stride = width_of(ctx, op.out);
    a.n_rows = e - r;
    a.pos0 = ctx.rows[r].pos;
    a.n_heads = group;
    a.head_dim = hd;
    a.v_dim = vd;
    a.window = op.window;
    a.scale = op.scale;
    KvHeadView kv;
    kv.k = cache.k_at(layer, 0) + static_cast<size_t>(g) * hd;
    kv.v = cache.v_at(layer, 0) + static_cast<size_t>(g) * vd;
    kv.k_stride = cache.kv_dim;
    kv.v_stride = cache.v_width();
    kv.ring = cache.ring_len(layer);
    attention_block(a, kv, ctx.scalar);
    r = e;
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
    case OpKind::Attention: {
      const AttentionTiling at = attention_tiling(op, ctx.n_rows, n_tiles);
      const int b = t / at.per_block, n_parts = at.per_block / op.n_head_kv;
      attention_tile(op, ctx, b * at.rows_per_block, std::min(ctx.n_rows, (b + 1) * at.rows_per_block),
                     t % at.per_block / n_parts, t % n_parts, n_parts);
      break;
    }
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
