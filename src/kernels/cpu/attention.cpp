#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/kv_decode.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec.h"

namespace megakern {
namespace {

int row_start(const AttentionBlock& a, int i) {
  const int pos = a.pos0 + i;
  return a.window > 0 ? std::max(0, pos - a.window + 1) : 0;
}

}  // namespace

int attention_tile_positions(const AttentionBlock& a) {
  // One row: short tiles, the next one prefetched while this one is used
  // (the single-row kernel's shape). Several rows: as many positions as fit
  // 16 KiB of keys, so a tile of keys or values stays in L1 while every row
  // and head of the block uses it.
  if (a.n_rows <= 1) return 16;
  const int w = std::max(a.head_dim, a.v_dim);
  return std::clamp(4096 / std::max(w, 1), 8, 128);
}

void attention_block(const AttentionBlock& a, const KvHeadView& kv, bool scalar) {
  if (a.n_rows <= 0 || a.n_heads <= 0) return;
  const int hd = a.head_dim, vd = a.v_dim, G = a.n_heads, R = a.n_rows;
  const int last = a.pos0 + R - 1;
  const int first = row_start(a, 0);  // starts grow with the row
  // Scores: row i, head j at scores + off[i] + j * len(i), len(i) =
  // positions row i sees, indexed by position - start_i.
  thread_local std::vector<float> scores;
  thread_local std::vector<int64_t> off;
  // With sinks each score vector has one more entry, the sink's, last.
  const int extra = a.sinks ? 1 : 0;
  off.resize(static_cast<size_t>(R) + 1);
  off[0] = 0;
  for (int i = 0; i < R; ++i)
    off[static_cast<size_t>(i) + 1] =
        off[static_cast<size_t>(i)] + static_cast<int64_t>(G) * (a.pos0 + i - row_start(a, i) + 1 + extra);
  scores.resize(static_cast<size_t>(off[static_cast<size_t>(R)]));
  auto score_row = [&](int i, int j) {
    const int len = a.pos0 + i - row_start(a, i) + 1 + extra;
    return scores.data() + off[static_cast<size_t>(i)] + static_cast<int64_t>(j) * len;
  };

  // Tiles never cross a ring layer's wrap (positions of a tile are stored
  // back to back).
  const int T = attention_tile_positions(a);
  auto tile_end = [&](int p) {
    const int run = kv.ring > 0 ? std::min(last + 1, p + kv.ring - p % kv.ring) : last + 1;
    return std::min(run, p + T);
  };
  // A head's key or value of one position is a short run every stride
  // floats: consecutive positions fall in different pages, where hardware
  // prefetchers stop, so over long histories the next tile's lines are
  // prefetched in software while this one is used. Short histories are left
  // to the caches (mostly still there from the previous step's layer).
  constexpr int kPrefetchFrom = 1024;
  const bool prefetch = last - first + 1 >= kPrefetchFrom;
  auto prefetch_tile = [&](bool values, int p) {
    if (!prefetch || p > last) return;
    const int e = tile_end(p);
    const int64_t w = kv_row_bytes(kv.type, values ? vd : hd);
    for (int q = p; q < e; ++q) {
      const char* line = kv.type != KvType::f32 ? reinterpret_cast<const char*>(values ? kv.vb_at(q) : kv.kb_at(q))
                                                : reinterpret_cast<const char*>(values ? kv.v_at(q) : kv.k_at(q));
      for (int64_t c = 0; c < w; c += 64) __builtin_prefetch(line + c, 0, 3);
    }
  };

  // A head-major cache (attention.h's KvHeadView: stride = the head's
  // width) holds a tile as one contiguous run, read where it is. In a
  // position-major one a head's key of one position is a short run every
  // stride floats, and strides of 4 KiB (8 KV heads of 128) put every
  // position of the tile in the same few L1 sets, so that the rows and heads
  // of the block would each fetch the tile again from L2: there a tile's keys
  // (then values) are first copied into a packed buffer, which stays in L1
  // for all of them. The values are the same floats; the bits do not change.
  // A single row reads its tile once, straight from the cache. A cache of
  // another type than f32 always goes through the buffer, its tile decoded
  // there (exactly: the same floats on every ISA).
  const bool decoding = kv.type != KvType::f32;
  const bool packing = decoding || (R > 1 && (kv.k_stride != hd || kv.v_stride != vd));
  const int64_t ks = packing ? hd : kv.k_stride, vs = packing ? vd : kv.v_stride;
  thread_local std::vector<float> packed;
  if (packing) packed.resize(static_cast<size_t>(T) * static_cast<size_t>(std::max(hd, vd)));
  auto pack = [&](bool values, int p, int e) -> const float* {
    if (!packing) return values ? kv.v_at(p) : kv.k_at(p);
    const int w = values ? vd : hd;
    if (decoding) {
      // The tile's slots are consecutive (tiles never cross a ring's wrap).
      kv_decode_rows(kv.type, values ? kv.vb_at(p) : kv.kb_at(p), values ? kv.v_stride : kv.k_stride, e - p, w,
                     packed.data(), scalar);
      return packed.data();
    }
    for (int q = p; q < e; ++q)
      std::memcpy(packed.data() + static_cast<size_t>(q - p) * w, values ? kv.v_at(q) : kv.k_at(q),
                  sizeof(float) * static_cast<size_t>(w));
    return packed.data();
  };

  // Pass 1: scaled scores, tile by tile.
  for (int p = first; p <= last;) {
    const int e = tile_end(p);
    prefetch_tile(false, e);
    const float* k = pack(false, p, e);
    for (int i = std::max(0, p - a.pos0); i < R; ++i) {
      // Row i sees [start_i, pos0 + i]; rows before p - pos0 see none of the tile.
      const int lo = std::max(p, row_start(a, i)), hi = std::min(e, a.pos0 + i + 1);
      if (lo >= hi) continue;
      const float* kt = k + static_cast<int64_t>(lo - p) * ks;
      for (int j = 0; j < G; ++j) {
        const float* qh = a.q + static_cast<int64_t>(i) * a.q_stride + static_cast<int64_t>(j) * hd;
        float* s = score_row(i, j) + (lo - row_start(a, i));
        if (!scalar && j + 1 < G) {  // two heads of the row at once (the same bits)
          float* s1 = score_row(i, j + 1) + (lo - row_start(a, i));
          dot_f32_rows2(qh, qh + hd, kt, ks, hi - lo, hd, s, s1);
          for (int t = 0; t < hi - lo; ++t) s[t] *= a.scale, s1[t] *= a.scale;
          ++j;
          continue;
        }
        if (scalar)
          for (int t = 0; t < hi - lo; ++t) s[t] = dot_f32_scalar(qh, kt + static_cast<int64_t>(t) * ks, hd);
        else
          dot_f32_rows(qh, kt, ks, hi - lo, hd, s);
        for (int t = 0; t < hi - lo; ++t) s[t] *= a.scale;
      }
    }
    p = e;
  }
  // Softmax over each row's whole score vector (four score vectors at a
  // time, each with the bits it has alone), and zeroed outputs.
  {
    float* xs[4];
    int64_t ns[4];
    int k = 0;
    for (int i = 0; i < R; ++i) {
      const int len = a.pos0 + i - row_start(a, i) + 1;
      for (int j = 0; j < G; ++j) {
        if (a.softcap > 0.f) {
          if (scalar)
            softcap_scalar(score_row(i, j), len, a.softcap, 1.f);
          else
            softcap(score_row(i, j), len, a.softcap, 1.f);
        }
        if (a.sinks) score_row(i, j)[len] = a.sinks[j];
        if (scalar) {
          softmax_inplace_scalar(score_row(i, j), len + extra);
        } else {
          xs[k] = score_row(i, j);
          ns[k] = len + extra;
          if (++k == 4) softmax_rows(xs, ns, k), k = 0;
        }
        float* o = a.out + static_cast<int64_t>(i) * a.out_stride + static_cast<int64_t>(j) * vd;
        std::fill(o, o + vd, 0.f);
      }
    }
    if (k > 0) softmax_rows(xs, ns, k);
  }
  // Pass 2: values, tile by tile in increasing position order, so each
  // output element accumulates its positions in order.
  for (int p = first; p <= last;) {
    const int e = tile_end(p);
    prefetch_tile(true, e);
    const float* v = pack(true, p, e);
    for (int i = std::max(0, p - a.pos0); i < R; ++i) {
      const int lo = std::max(p, row_start(a, i)), hi = std::min(e, a.pos0 + i + 1);
      if (lo >= hi) continue;
      const float* vt = v + static_cast<int64_t>(lo - p) * vs;
      for (int j = 0; j < G; ++j) {
        const float* w = score_row(i, j) + (lo - row_start(a, i));
        float* o = a.out + static_cast<int64_t>(i) * a.out_stride + static_cast<int64_t>(j) * vd;
        if (!scalar && j + 1 < G) {
          axpy_f32_rows2(w, score_row(i, j + 1) + (lo - row_start(a, i)), vt, vs, hi - lo, o, o + vd, vd);
          ++j;
          continue;
        }
        if (scalar)
          for (int t = 0; t < hi - lo; ++t) axpy_f32_scalar(w[t], vt + static_cast<int64_t>(t) * vs, o, vd);
        else
          axpy_f32_rows(w, vt, vs, hi - lo, o, vd);
      }
    }
    p = e;
  }
}

void attention_rows_reference(const AttentionBlock& a, const KvHeadView& kv, bool scalar) {
  std::vector<float> s;
  // Another type than f32: each position's key or value decoded by the
  // scalar decoder, alone.
  std::vector<float> kd(static_cast<size_t>(a.head_dim)), vd(static_cast<size_t>(a.v_dim));
  auto key = [&](int p) -> const float* {
    if (kv.type == KvType::f32) return kv.k_at(p);
    kv_decode_rows_scalar(kv.type, kv.kb_at(p), 0, 1, a.head_dim, kd.data());
    return kd.data();
  };
  auto value = [&](int p) -> const float* {
    if (kv.type == KvType::f32) return kv.v_at(p);
    kv_decode_rows_scalar(kv.type, kv.vb_at(p), 0, 1, a.v_dim, vd.data());
    return vd.data();
  };
  const int extra = a.sinks ? 1 : 0;
  for (int i = 0; i < a.n_rows; ++i) {
    const int pos = a.pos0 + i, start = row_start(a, i), n = pos - start + 1;
    for (int j = 0; j < a.n_heads; ++j) {
      const float* qh = a.q + static_cast<int64_t>(i) * a.q_stride + static_cast<int64_t>(j) * a.head_dim;
      s.assign(static_cast<size_t>(n + extra), 0.f);
      for (int p = start; p <= pos; ++p) {
        const float d = scalar ? dot_f32_scalar(qh, key(p), a.head_dim) : dot_f32(qh, key(p), a.head_dim);
        s[static_cast<size_t>(p - start)] = d * a.scale;
      }
      if (a.softcap > 0.f) {
        if (scalar)
          softcap_scalar(s.data(), n, a.softcap, 1.f);
        else
          softcap(s.data(), n, a.softcap, 1.f);
      }
      if (a.sinks) s[static_cast<size_t>(n)] = a.sinks[j];
      if (scalar)
        softmax_inplace_scalar(s.data(), n + extra);
      else
        softmax_inplace(s.data(), n + extra);
      float* o = a.out + static_cast<int64_t>(i) * a.out_stride + static_cast<int64_t>(j) * a.v_dim;
      std::fill(o, o + a.v_dim, 0.f);
      for (int p = start; p <= pos; ++p) {
        if (scalar)
          axpy_f32_scalar(s[static_cast<size_t>(p - start)], value(p), o, a.v_dim);
        else
          axpy_f32(s[static_cast<size_t>(p - start)], value(p), o, a.v_dim);
      }
    }
  }
}

}  // namespace megakern
