#include "ir/sequence_state.h"

#include <cstring>

#include "core/dtype_blocks.h"
#include "core/error.h"
#include "core/half.h"
#include "core/units.h"
#include "kernels/cpu/kv_decode.h"
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
  allocate(layer_offset.back(), v_offset(layer_offset.back()));
}

size_t KVCache::k_values() const {
  if (type == KvType::f32) return k.size();
  return head_k() > 0 ? kq.size() / kv_row_bytes(type, head_k()) * static_cast<size_t>(head_k()) : 0;
}

size_t KVCache::v_values() const {
  if (type == KvType::f32) return v.size();
  return head_v() > 0 ? vq.size() / kv_row_bytes(type, head_v()) * static_cast<size_t>(head_v()) : 0;
}

void KVCache::allocate(size_t k_vals, size_t v_vals) {
  k.reset(), v.reset(), kq.reset(), vq.reset();
  if (type == KvType::f32) {
    k.assign(k_vals, 0.f);
    v.assign(v_vals, 0.f);
  } else {
    kq.assign(kv_row_bytes(type, static_cast<int64_t>(k_vals)), 0);
    vq.assign(kv_row_bytes(type, static_cast<int64_t>(v_vals)), 0);
  }
}

namespace {

// n values of x into the bytes of type t at b (q8_0: n a multiple of 32).
void encode_kv(KvType t, const float* x, int n, uint8_t* b) {
  if (t == KvType::q8_0) {
    for (int i = 0; i < n; i += kKvQ8Block, b += kKvQ8BlockBytes) dtype_detail::quant_q8_0(x + i, b);
    return;
  }
  for (int i = 0; i < n; ++i)
    dtype_detail::store_u16(b + 2 * i, t == KvType::f16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]));
}

}  // namespace

void KVCache::store(int layer, int pos, const float* k_row, const float* v_row) {
  const size_t hk = static_cast<size_t>(head_k()), hv = static_cast<size_t>(head_v());
  if (type == KvType::f32) {
    for (int h = 0; h < heads; ++h) {
      std::memcpy(k_at(layer, h, pos), k_row + h * hk, sizeof(float) * hk);
      std::memcpy(v_at(layer, h, pos), v_row + h * hv, sizeof(float) * hv);
    }
    return;
  }
  const size_t s = static_cast<size_t>(slot(layer, pos));
  for (int h = 0; h < heads; ++h) {
    encode_kv(type, k_row + h * hk, head_k(), kq.data() + kv_row_bytes(type, k_head_offset(layer, h) + s * hk));
    encode_kv(type, v_row + h * hv, head_v(), vq.data() + kv_row_bytes(type, v_head_offset(layer, h) + s * hv));
  }
}

void KVCache::load(int layer, int pos, float* k_row, float* v_row) const {
  const size_t hk = static_cast<size_t>(head_k()), hv = static_cast<size_t>(head_v());
  const size_t s = static_cast<size_t>(slot(layer, pos));
  for (int h = 0; h < heads; ++h) {
    if (type == KvType::f32) {
      std::memcpy(k_row + h * hk, k.data() + k_head_offset(layer, h) + s * hk, sizeof(float) * hk);
      std::memcpy(v_row + h * hv, v.data() + v_head_offset(layer, h) + s * hv, sizeof(float) * hv);
    } else {
      kv_decode_rows_scalar(type, kq.data() + kv_row_bytes(type, k_head_offset(layer, h) + s * hk), 0, 1, head_k(),
                            k_row + h * hk);
      kv_decode_rows_scalar(type, vq.data() + kv_row_bytes(type, v_head_offset(layer, h) + s * hv), 0, 1, head_v(),
                            v_row + h * hv);
    }
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
      s.head_k.resize(s.window.size(), 0);
      s.head_v.resize(s.window.size(), 0);
      s.head_k[static_cast<size_t>(l)] = op.as<ops::Attention>().head_dim;
      s.head_v[static_cast<size_t>(l)] = op.as<ops::Attention>().v_dim();
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
  s.head_k.resize(static_cast<size_t>(s.kv_layers), 0);
  s.head_v.resize(static_cast<size_t>(s.kv_layers), 0);
  if (s.kv_heads <= 0 || s.kv_dim % s.kv_heads != 0 || (s.v_dim > 0 ? s.v_dim : s.kv_dim) % s.kv_heads != 0)
    fail("{}: {} KV heads do not divide the cache widths K {} / V {}", p.model_name, s.kv_heads, s.kv_dim,
         s.v_dim > 0 ? s.v_dim : s.kv_dim);
  s.recurrent = p.recurrent;
  return s;
}

void check_kv_type(const SequenceShape& shape, KvType kv_type) {
  if (kv_type != KvType::q8_0) return;
  // The cache's heads, and the heads each attention reads (a position-major
  // cache's heads = 1 row is cut into them): every block of 32 lies in one.
  const int v_width = shape.v_dim > 0 ? shape.v_dim : shape.kv_dim;
  const int ck = shape.kv_heads > 0 ? shape.kv_dim / shape.kv_heads : 0;
  const int cv = shape.kv_heads > 0 ? v_width / shape.kv_heads : 0;
  for (int l = 0; l < shape.kv_layers; ++l) {
    const size_t i = static_cast<size_t>(l);
    const int k = i < shape.head_k.size() && shape.head_k[i] > 0 ? shape.head_k[i] : ck;
    const int v = i < shape.head_v.size() && shape.head_v[i] > 0 ? shape.head_v[i] : cv;
    if (k % kKvQ8Block != 0 || v % kKvQ8Block != 0 || ck % kKvQ8Block != 0 || cv % kKvQ8Block != 0)
      fail("--kv-type q8_0 stores blocks of {} values along a head, but KV layer {} has heads of {} (keys) / {} "
           "(values) values: use f32, f16 or bf16",
           kKvQ8Block, l, k % kKvQ8Block != 0 ? k : ck, v % kKvQ8Block != 0 ? v : cv);
  }
}

SequenceState make_sequence_state(const SequenceShape& shape, int n_ctx, int ring_block, KvType kv_type) {
  if (n_ctx <= 0) fail("context size must be positive, got {}", n_ctx);
  if (ring_block < 0) fail("ring_block must not be negative, got {}", ring_block);
  check_kv_type(shape, kv_type);
  SequenceState s;
  KVCache& kv = s.cache;
  kv.type = kv_type;
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
  const double per_position = static_cast<double>(kv_row_bytes(kv_type, kv.kv_dim) + kv_row_bytes(kv_type, kv.v_width()));
  const double plain = static_cast<double>(kv.n_layer) * n_ctx * per_position;
  if (const size_t phys = physical_memory_bytes(); !rings && phys > 0 && plain > static_cast<double>(phys))
    fail("a context of {} positions needs a KV cache of {} ({} layers x {} positions x {} bytes of {} K and V), "
         "more than the {} of physical memory: use a smaller --context",
         n_ctx, human_bytes(plain), kv.n_layer, n_ctx, per_position, kv_type_name(kv_type),
         human_bytes(static_cast<double>(phys)));
  if (rings)
    kv.init_rings(lens);
  else
    kv.allocate(kv.floats_for(kv.n_layer), kv.v_offset(kv.floats_for(kv.n_layer)));
  if (shape.recurrent) {
    s.state = RecurrentState(shape.rec_layers, shape.conv_dim, shape.conv_hist, shape.n_v_heads, shape.rec_v_dim,
                             shape.rec_k_dim);
    s.recurrent = true;
  }
  return s;
}

}  // namespace megakern
