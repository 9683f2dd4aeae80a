#include "ir/sequence_state.h"

#include <cstring>

#include "core/error.h"
#include "core/units.h"
#include "ir/program.h"

namespace megakern {

void KVCache::init_rings(const std::vector<int>& ring_lens) {
  ring.assign(static_cast<size_t>(n_layer), 0);
  layer_offset.assign(static_cast<size_t>(n_layer) + 1, 0);
  for (int l = 0; l < n_layer; ++l) {
    const int len = l < static_cast<int>(ring_lens.size()) ? ring_lens[static_cast<size_t>(l)] : 0;
    ring[static_cast<size_t>(l)] = len > 0 && len < n_ctx ? len : 0;
    const int kept = ring[static_cast<size_t>(l)] > 0 ? ring[static_cast<size_t>(l)] : n_ctx;
    layer_offset[static_cast<size_t>(l) + 1] = layer_offset[static_cast<size_t>(l)] + static_cast<size_t>(kept) * kv_dim;
  }
  k.assign(layer_offset.back(), 0.f);
  v.assign(v_offset(layer_offset.back()), 0.f);
}

void KVCache::store(int layer, int pos, const float* k_row, const float* v_row) {
  const size_t hk = static_cast<size_t>(head_k()), hv = static_cast<size_t>(head_v());
  for (int h = 0; h < heads; ++h) {
    std::memcpy(k_at(layer, h, pos), k_row + h * hk, sizeof(float) * hk);
    std::memcpy(v_at(layer, h, pos), v_row + h * hv, sizeof(float) * hv);
  }
}

void KVCache::load(int layer, int pos, float* k_row, float* v_row) const {
  const size_t hk = static_cast<size_t>(head_k()), hv = static_cast<size_t>(head_v());
  const size_t s = static_cast<size_t>(slot(layer, pos));
  for (int h = 0; h < heads; ++h) {
    std::memcpy(k_row + h * hk, k.data() + k_head_offset(layer, h) + s * hk, sizeof(float) * hk);
    std::memcpy(v_row + h * hv, v.data() + v_head_offset(layer, h) + s * hv, sizeof(float) * hv);
  }
}

RecurrentState::RecurrentState(int n_layer_, int conv_dim_, int conv_hist_, int n_v_heads_, int v_dim_, int k_dim_)
    : n_layer(n_layer_), conv_dim(conv_dim_), conv_hist(conv_hist_), n_v_heads(n_v_heads_), v_dim(v_dim_), k_dim(k_dim_) {
  conv.assign(static_cast<size_t>(n_layer) * conv_hist * conv_dim, 0.f);
  S.assign(static_cast<size_t>(n_layer) * n_v_heads * v_dim * k_dim, 0.f);
}

void RecurrentState::reset() {
  std::fill(conv.begin(), conv.end(), 0.f);
  std::fill(S.begin(), S.end(), 0.f);
}

SequenceShape sequence_shape(const DecodeProgram& p) {
  SequenceShape s;
  s.kv_dim = p.kv_dim;
  s.v_dim = p.v_dim;
  auto width = [&](int slot) { return p.slots[static_cast<size_t>(slot)].width; };
  // Sets a recurrent dimension, checking that every op agrees on it.
  auto agree = [&](int& field, int value, const Op& op, const char* what) {
    if (field != 0 && field != value)
      fail("{}: op '{}' of layer {} needs a recurrent {} of {}, another op {}", p.model_name, op.name, op.layer, what,
           value, field);
    field = value;
  };
  bool heads_seen = false, mixed = false;
  for (const Op& op : p.ops) {
    const int l = op.cache_layer();
    if (op.kind == OpKind::StoreKV) {
      s.kv_layers = std::max(s.kv_layers, l + 1);
    } else if (op.kind == OpKind::Attention) {
      if (static_cast<int>(s.window.size()) <= l) s.window.resize(static_cast<size_t>(l) + 1, 0);
      s.window[static_cast<size_t>(l)] = op.as<ops::Attention>().window;
      // Attention ops that disagree on the KV heads share the
      // position-major layout (heads = 1), which serves any split.
      const int heads = op.as<ops::Attention>().n_head_kv;
      mixed = mixed || (heads_seen && heads != s.kv_heads);
      s.kv_heads = mixed ? 1 : heads;
      heads_seen = true;
    } else if (op.kind == OpKind::CausalConvSilu) {
      s.rec_layers = std::max(s.rec_layers, l + 1);
      const int C = width(op.out);
      agree(s.conv_dim, C, op, "conv width");
      agree(s.conv_hist, static_cast<int>(op.as<ops::CausalConvSilu>().taps.size()) / C - 1, op, "conv history");
    } else if (op.kind == OpKind::DeltaRule) {
      s.rec_layers = std::max(s.rec_layers, l + 1);
      // The conv'd q|k|v input: n_head_kv key heads of q and of k, then the
      // n_head value heads.
      const auto& d = op.as<ops::DeltaRule>();
      const int Dk = (width(op.in) - d.n_head * d.head_dim) / (2 * d.n_head_kv);
      agree(s.n_v_heads, d.n_head, op, "value head count");
      agree(s.rec_v_dim, d.head_dim, op, "value head width");
      agree(s.rec_k_dim, Dk, op, "key head width");
    }
  }
  s.window.resize(static_cast<size_t>(s.kv_layers), 0);
  if (s.kv_heads <= 0 || s.kv_dim % s.kv_heads != 0 || (s.v_dim > 0 ? s.v_dim : s.kv_dim) % s.kv_heads != 0)
    fail("{}: {} KV heads do not divide the cache widths K {} / V {}", p.model_name, s.kv_heads, s.kv_dim,
         s.v_dim > 0 ? s.v_dim : s.kv_dim);
  s.recurrent = p.recurrent;
  return s;
}

SequenceState make_sequence_state(const SequenceShape& shape, int n_ctx, int ring_block) {
  if (n_ctx <= 0) fail("context size must be positive, got {}", n_ctx);
  if (ring_block < 0) fail("ring_block must not be negative, got {}", ring_block);
  SequenceState s;
  KVCache& kv = s.cache;
  kv.n_ctx = n_ctx;
  kv.n_layer = shape.kv_layers;
  kv.kv_dim = shape.kv_dim;
  kv.v_dim = shape.v_dim;
  kv.heads = shape.kv_heads;
  std::vector<int> lens(static_cast<size_t>(shape.kv_layers), 0);
  bool rings = false;
  if (ring_block > 0)
    for (size_t l = 0; l < lens.size(); ++l)
      if (shape.window[l] > 0) {
        lens[l] = shape.window[l] + ring_block - 1;
        rings = true;
      }
  // The cache is committed only as positions fill, but a context whose full
  // cache could never fit would fail (or swap) far into a generation: refuse
  // it now, naming the sizes. (Rings are small; the plain layers count.)
  const double plain = static_cast<double>(kv.n_layer) * n_ctx * (kv.kv_dim + kv.v_width()) * sizeof(float);
  if (const size_t phys = physical_memory_bytes(); !rings && phys > 0 && plain > static_cast<double>(phys))
    fail("a context of {} positions needs a KV cache of {} ({} layers x {} positions x {} values x 2 (K and V) x "
         "4 bytes), more than the {} of physical memory: use a smaller --context",
         n_ctx, human_bytes(plain), kv.n_layer, n_ctx, kv.kv_dim, human_bytes(static_cast<double>(phys)));
  if (rings) {
    kv.init_rings(lens);
  } else {
    kv.k.assign(kv.floats_for(kv.n_layer), 0.f);
    kv.v.assign(kv.v_offset(kv.floats_for(kv.n_layer)), 0.f);
  }
  if (shape.recurrent) {
    s.state = RecurrentState(shape.rec_layers, shape.conv_dim, shape.conv_hist, shape.n_v_heads, shape.rec_v_dim,
                             shape.rec_k_dim);
    s.recurrent = true;
  }
  return s;
}

}  // namespace megakern
