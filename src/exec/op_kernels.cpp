#include "exec/op_kernels.h"

#include <algorithm>

#include "core/error.h"
#include "exec/recurrent_kernels.h"
#include "ops/registry.h"

namespace megakern {

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
    if (in.cache->n_layer < n_cache_layers || in.cache->k_values() < need ||
        in.cache->v_values() < in.cache->v_offset(need))
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

}  // namespace megakern
