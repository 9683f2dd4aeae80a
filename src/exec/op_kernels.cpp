#include "exec/op_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "exec/recurrent_kernels.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec.h"
#include "ops/registry.h"

namespace megakern {

bool op_is_row_tiled(const Op& op) { return op_info(op).row_tiled; }

int op_tile_count(const Op& op, int n_rows, int n_workers) {
  const OpInfo& i = op_info(op);
  return i.tile_count ? i.tile_count(op, n_rows, n_workers) : n_rows;
}

void run_op_tile(const Op& op, const StepContext& ctx, int t, int n_tiles) {
  const OpInfo& i = op_info(op);
  (ctx.scalar ? i.ref : i.fast)(op, ctx, t, n_tiles);
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
      const int len = c.ring_len(op.cache_layer()), window = op.as<ops::Attention>().window;
      if (window <= 0 || window + block - 1 > len)
        fail("row {}: KV layer {} keeps {} positions, too few for attention window {} over a block of {} rows", r,
             op.cache_layer(), len, window, block);
    }
  }
  if (p.recurrent) validate_recurrent_rows(p, rows.data(), static_cast<int>(rows.size()));
}

// Attention of row r for the query heads of KV head g (GQA: n_head /
// n_head_kv query heads share it). The positions are visited in chunks small
// enough to stay in L1, and every query head of the group uses a chunk's keys
// (then values) before the next is loaded, so a KV head is read from memory
// once per row rather than once per query head. Each head's scores and output
// are computed exactly as one head at a time would (same kernels over the same
// positions in the same order), so the grouping does not change any bit.
void attention_tile(const Op& op_, const StepContext& ctx, int r, int g, int part, int n_parts) {
  const ops::Attention& op = op_.as<ops::Attention>();
  const RowInput& row = ctx.rows[r];
  KVCache& cache = *row.cache;
  const int hd = op.head_dim, group = op.n_head / op.n_head_kv / n_parts;
  const int vd = op.v_dim();
  const int pos = row.pos;
  const int start = op.window > 0 ? std::max(0, pos - op.window + 1) : 0;
  const int n = pos - start + 1;
  const int h0 = g * group * n_parts + part * group;  // first query head of this tile
  const float* q = row_of(ctx, op_.in, r) + static_cast<size_t>(h0) * hd;
  thread_local std::vector<float> scores;  // [group][n]
  scores.resize(static_cast<size_t>(group) * n);
  const int layer = op_.cache_layer();
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
  float* out = row_of(ctx, op_.out, r) + static_cast<size_t>(h0) * vd;
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

}  // namespace megakern
