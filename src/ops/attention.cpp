#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "ops/registry.h"

namespace megakern {

int attention_row_block(int n_rows) {
  constexpr int kRows = 16;
  return n_rows <= 8 ? 1 : kRows;
}

int attention_group_split(const Op& op, int n_blocks, int n_workers) {
  // A tile does the query heads of one KV head (its keys and values read
  // once), unless that leaves the team unevenly loaded: then the group is
  // cut into the fewest equal parts that give whole rounds of tiles or at
  // least four tiles per worker.
  const auto& a = op.as<ops::Attention>();
  const int group = a.n_head / a.n_head_kv;
  for (int s = 1; s < group; ++s) {
    if (group % s) continue;
    const int tiles = n_blocks * a.n_head_kv * s;
    if (tiles % n_workers == 0 || tiles >= 4 * n_workers) return s;
  }
  return group;
}

namespace {

bool yes(const Op&) { return true; }

void head_norm_rope_tile(const Op& op, const StepContext& ctx, int t, int) {
  const auto& a = op.as<ops::HeadNormRope>();
  float* v = row_of(ctx, op.out, t);
  // LongRoPE: a sequence whose context exceeds the original one rotates all
  // its positions by the long factors.
  std::span<const float> factors = a.freq_factors;
  if (!a.freq_factors_long.empty()) {
    MK_CHECK(ctx.rows[t].cache, "{}: long rope factors need the row's sequence", op.name);
    if (ctx.rows[t].cache->n_ctx > a.long_context) factors = a.freq_factors_long;
  }
  const RopeAngles& angles = rope_angles(a.rope_dim, ctx.rows[t].pos, a.rope_base,
                                         factors.empty() ? nullptr : factors.data());
  for (int h = 0; h < a.n_head; ++h) {
    float* vh = v + h * a.head_dim;
    if (!a.head_norm.empty()) rmsnorm(vh, a.head_norm.data(), a.head_dim, a.eps, vh);
    rope_apply(vh + a.rope_offset, a.rope_dim, angles, a.rope_neox);
    if (a.amplitude != 1.f)
      for (int i = 0; i < a.rope_dim; ++i) vh[a.rope_offset + i] *= a.amplitude;
  }
}

void store_kv_tile(const Op& op, const StepContext& ctx, int t, int) {
  ctx.rows[t].cache->store(op.cache_layer(), ctx.rows[t].pos, row_of(ctx, op.in, t), row_of(ctx, op.in2, t));
}

// Attention of step rows [r0, r1) for the query heads of part `part` of KV
// head g's group (GQA: n_head / n_head_kv query heads share it). Rows of one
// sequence (adjacent in the step, consecutive positions) go through the
// tiled kernel together, so each tile of the KV head's keys and values is
// read once for all of them and all their heads; every output has the bits
// of that row and head computed alone (kernels/cpu/attention.h).
void attention_tile(const Op& op_, const StepContext& ctx, int r0, int r1, int g, int part, int n_parts) {
  const ops::Attention& op = op_.as<ops::Attention>();
  const int hd = op.head_dim, group = op.n_head / op.n_head_kv / n_parts;
  const int vd = op.v_dim();
  const int h0 = g * group * n_parts + part * group;  // first query head of this tile
  const int layer = op_.cache_layer();
  for (int r = r0; r < r1;) {
    KVCache& cache = *ctx.rows[r].cache;
    int e = r + 1;
    while (e < r1 && ctx.rows[e].cache == &cache) ++e;
    AttentionBlock a;
    a.q = row_of(ctx, op_.in, r) + static_cast<size_t>(h0) * hd;
    a.q_stride = width_of(ctx, op_.in);
    a.out = row_of(ctx, op_.out, r) + static_cast<size_t>(h0) * vd;
    a.out_stride = width_of(ctx, op_.out);
    a.n_rows = e - r;
    a.pos0 = ctx.rows[r].pos;
    a.n_heads = group;
    a.head_dim = hd;
    a.v_dim = vd;
    a.window = op.window;
    a.scale = op.scale;
    a.softcap = op.softcap;
    a.sinks = op.sinks.empty() ? nullptr : op.sinks.data() + h0;
    // KV head g's positions: their own contiguous run in a head-major cache,
    // else every kv_dim values of a position-major one (heads = 1).
    // Offsets and strides count values; a cache of another type than f32
    // holds the same layout in bytes (sequence_state.h), q8_0 blocks never
    // straddling two heads (check_kv_type).
    size_t k_off, v_off;
    int64_t k_stride, v_stride;
    if (cache.heads == op.n_head_kv) {
      k_off = cache.k_head_offset(layer, g);
      v_off = cache.v_head_offset(layer, g);
      k_stride = hd;
      v_stride = vd;
    } else {
      MK_CHECK(cache.heads == 1, "attention over {} KV heads: the cache is laid out for {}", op.n_head_kv, cache.heads);
      MK_CHECK(cache.type != KvType::q8_0 || (hd % kKvQ8Block == 0 && vd % kKvQ8Block == 0),
               "a q8_0 KV cache needs head widths that are multiples of {}, attention reads {} / {}", kKvQ8Block, hd,
               vd);
      k_off = cache.k_head_offset(layer, 0) + static_cast<size_t>(g) * hd;
      v_off = cache.v_head_offset(layer, 0) + static_cast<size_t>(g) * vd;
      k_stride = cache.kv_dim;
      v_stride = cache.v_width();
    }
    KvHeadView kv;
    kv.type = cache.type;
    if (cache.type == KvType::f32) {
      kv.k = cache.k.data() + k_off;
      kv.v = cache.v.data() + v_off;
      kv.k_stride = k_stride;
      kv.v_stride = v_stride;
    } else {
      kv.kb = cache.kq.data() + kv_row_bytes(cache.type, static_cast<int64_t>(k_off));
      kv.vb = cache.vq.data() + kv_row_bytes(cache.type, static_cast<int64_t>(v_off));
      kv.k_stride = static_cast<int64_t>(kv_row_bytes(cache.type, k_stride));
      kv.v_stride = static_cast<int64_t>(kv_row_bytes(cache.type, v_stride));
    }
    kv.ring = cache.ring_len(layer);
    attention_block(a, kv, ctx.scalar);
    r = e;
  }
}

// The reference and fast kernels of attention differ inside attention_tile,
// which reads ctx.scalar.
int n_row_blocks(int n_rows) { return (n_rows + attention_row_block(n_rows) - 1) / attention_row_block(n_rows); }

void attention_op_tile(const Op& op, const StepContext& ctx, int t, int n_tiles) {
  const AttentionTileCut c = attention_tile_cut(op, ctx.n_rows, t, n_tiles);
  attention_tile(op, ctx, c.r0, c.r1, c.kv_head, c.part, c.n_parts);
}

}  // namespace

AttentionTileCut attention_tile_cut(const Op& op, int n_rows, int t, int n_tiles) {
  const int rows_per_block = attention_row_block(n_rows);
  const int per_block = n_tiles / n_row_blocks(n_rows);
  AttentionTileCut c;
  c.n_parts = per_block / op.as<ops::Attention>().n_head_kv;
  const int b = t / per_block;
  c.r0 = b * rows_per_block;
  c.r1 = std::min(n_rows, (b + 1) * rows_per_block);
  c.kv_head = t % per_block / c.n_parts;
  c.part = t % c.n_parts;
  return c;
}

namespace {

// NoPE MLA key: head h is [k_nope of head h | the shared extra dims].
void mla_key_tile(const Op& op, const StepContext& ctx, int r, int) {
  const auto& a = op.as<ops::MlaKey>();
  const int shared = width_of(ctx, op.in2), own = a.head_dim - shared;
  const float* kn = row_of(ctx, op.in, r);
  const float* ke = row_of(ctx, op.in2, r);
  float* out = row_of(ctx, op.out, r);
  for (int h = 0; h < a.n_head; ++h) {
    float* oh = out + static_cast<size_t>(h) * a.head_dim;
    std::memcpy(oh, kn + static_cast<size_t>(h) * own, sizeof(float) * static_cast<size_t>(own));
    std::memcpy(oh + own, ke, sizeof(float) * static_cast<size_t>(shared));
  }
}

}  // namespace

extern const OpInfo kHeadNormRopeOp = {
    .name = "head_norm_rope",
    .reads_out = yes,
    .small_weights = [](const Op& op) { return op.as<ops::HeadNormRope>().head_norm; },
    .verify = [](const Op& op, const VerifyContext& v) {
      const auto& a = op.as<ops::HeadNormRope>();
      MK_CHECK(a.n_head > 0 && a.head_dim > 0 && a.n_head * a.head_dim == v.width(op.out), "{}: heads", v.where);
      MK_CHECK(a.rope_dim >= 0 && a.rope_dim % 2 == 0 && a.rope_offset >= 0 &&
                   a.rope_offset + a.rope_dim <= a.head_dim,
               "{}: rope_dim", v.where);
      MK_CHECK(a.freq_factors.empty() || static_cast<int>(a.freq_factors.size()) == a.rope_dim / 2,
               "{}: {} rope frequency factors for a rotated width of {}", v.where, a.freq_factors.size(), a.rope_dim);
      MK_CHECK(a.freq_factors_long.empty() || static_cast<int>(a.freq_factors_long.size()) == a.rope_dim / 2,
               "{}: {} long rope frequency factors for a rotated width of {}", v.where, a.freq_factors_long.size(),
               a.rope_dim);
      MK_CHECK(a.long_context >= 0 && std::isfinite(a.amplitude) && a.amplitude > 0, "{}: long_context / amplitude",
               v.where);
      MK_CHECK(a.head_norm.empty() || a.head_norm.size() == static_cast<size_t>(a.head_dim), "{}: head norm length",
               v.where);
    },
    .ref = head_norm_rope_tile,
    .fast = head_norm_rope_tile,
};

extern const OpInfo kStoreKVOp = {
    .name = "store_kv",
    .feeds_all_rows = true,
    .state_bytes = [](const Op&, const DecodeProgram& p, int) { return 2 * sizeof(float) * static_cast<size_t>(p.kv_dim); },
    .verify = [](const Op& op, const VerifyContext& v) {
      MK_CHECK(op.in >= 0 && op.in2 >= 0 && v.width(op.in) == v.p.kv_dim && v.width(op.in2) == v.p.v_width(),
               "{}: kv widths", v.where);
      MK_CHECK(op.layer >= 0 && op.layer < v.p.n_layer, "{}: layer", v.where);
    },
    .ref = store_kv_tile,
    .fast = store_kv_tile,
};

extern const OpInfo kAttentionOp = {
    .name = "attention",
    .row_tiled = false,
    .shareable = true,  // uneven: a tile's cost grows with its rows' positions
    .tile_count = [](const Op& op, int n_rows, int n_workers) {
      const int n_blocks = n_row_blocks(n_rows);
      return n_blocks * op.as<ops::Attention>().n_head_kv * attention_group_split(op, n_blocks, n_workers);
    },
    .tile_rows = [](const Op&, int t, int n_tiles, int n_rows, int& r0, int& r1) {
      const int rows_per_block = attention_row_block(n_rows);
      r0 = t / (n_tiles / n_row_blocks(n_rows)) * rows_per_block;
      r1 = std::min(n_rows, r0 + rows_per_block);
    },
    .state_bytes = [](const Op& op, const DecodeProgram&, int pos) {
      const auto& a = op.as<ops::Attention>();
      const int n = a.window > 0 ? std::min(pos + 1, a.window) : pos + 1;
      return 2 * sizeof(float) * static_cast<size_t>(n) * a.n_head_kv * a.head_dim;
    },
    .verify = [](const Op& op, const VerifyContext& v) {
      const auto& a = op.as<ops::Attention>();
      MK_CHECK(op.in >= 0 && op.in2 >= 0 && a.n_head_kv > 0 && a.n_head % a.n_head_kv == 0, "{}: heads", v.where);
      MK_CHECK(v.width(op.in) == a.n_head * a.head_dim, "{}: q width", v.where);
      MK_CHECK(v.width(op.out) == a.n_head * a.v_dim(), "{}: output width", v.where);
      MK_CHECK(a.sinks.empty() || static_cast<int>(a.sinks.size()) == a.n_head, "{}: {} sink logits for {} heads",
               v.where, a.sinks.size(), a.n_head);
      MK_CHECK(a.n_head_kv * a.head_dim == v.p.kv_dim && a.n_head_kv * a.v_dim() == v.p.v_width(), "{}: kv heads",
               v.where);
      MK_CHECK(v.marker_layer[static_cast<size_t>(op.in2)] == op.cache_layer() && op.cache_layer() >= 0,
               "{}: in2 must be the cache marker written by the store_kv of cache layer {}", v.where,
               op.cache_layer());
    },
    .ref = attention_op_tile,
    .fast = attention_op_tile,
};

extern const OpInfo kMlaKeyOp = {
    .name = "mla_key",
    .verify = [](const Op& op, const VerifyContext& v) {
      const auto& a = op.as<ops::MlaKey>();
      MK_CHECK(op.in >= 0 && op.in2 >= 0 && a.n_head > 0 && v.width(op.out) == a.n_head * a.head_dim &&
                   v.width(op.in) + a.n_head * v.width(op.in2) == v.width(op.out),
               "{}: widths", v.where);
    },
    .ref = mla_key_tile,
    .fast = mla_key_tile,
};

}  // namespace megakern
