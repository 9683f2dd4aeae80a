#include "model/presets.h"

#include <cmath>
#include <cstring>

#include "core/half.h"
#include "core/rng.h"
#include "io/gguf.h"

namespace megakern {

const std::vector<DensePreset>& dense_presets() {
  static const std::vector<DensePreset> presets = {
      {"dense-bench", "qwen3", 24, 2048, 5632, 16, 4, 128, 32000, DType::Q4_0},
      {"dense-mini", "qwen3", 4, 256, 512, 4, 2, 64, 512, DType::Q4_0},
  };
  return presets;
}

const DensePreset* find_dense_preset(const std::string& name) {
  for (const auto& p : dense_presets())
    if (p.name == name) return &p;
  return nullptr;
}

namespace {

// Random blocks of `type` for a [rows][cols] matrix: uniform quants with a
// block scale that gives each element a standard deviation of 1/sqrt(cols).
std::vector<uint8_t> random_matrix(DType type, int64_t cols, int64_t rows, Rng& rng) {
  const auto& tr = dtype_traits(type);
  const size_t rb = row_bytes(type, cols);
  std::vector<uint8_t> out(rb * static_cast<size_t>(rows));
  const float target = 1.f / std::sqrt(static_cast<float>(cols));
  if (type == DType::Q4_0 || type == DType::Q8_0) {
    // Q4_0: (q - 8) * d with q uniform in 0..15 has std 4.61 d.
    // Q8_0: q * d with q uniform in -128..127 has std 73.9 d.
    const float d = target / (type == DType::Q4_0 ? 4.61f : 73.9f);
    const uint16_t dh = f32_to_f16(d);
    for (size_t b = 0; b < out.size(); b += tr.block_bytes) {
      std::memcpy(&out[b], &dh, 2);
      for (size_t i = 2; i < tr.block_bytes; i += 8) {
        const uint64_t r = rng.next();
        std::memcpy(&out[b + i], &r, std::min<size_t>(8, tr.block_bytes - i));
      }
    }
    return out;
  }
  // Any other format: quantise normal-ish f32 values row by row.
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& x : row) {
      // Sum of 4 uniforms: approximately normal, std 1/sqrt(3).
      float s = 0;
      for (int k = 0; k < 4; ++k) s += static_cast<float>(rng.next() >> 40) * 0x1.0p-24f - 0.5f;
      x = s * 1.7320508f * target;
    }
    tr.quantize(row.data(), out.data() + static_cast<size_t>(r) * rb, cols);
  }
  return out;
}

}  // namespace

std::vector<uint8_t> make_dense_gguf(const DensePreset& p, uint64_t seed) {
  Rng rng{seed};
  GGUFWriter w;
  const std::string a = p.arch;
  w.set_string("general.architecture", a);
  w.set_string("general.name", p.name);
  w.set_u32(a + ".block_count", static_cast<uint32_t>(p.n_layer));
  w.set_u32(a + ".embedding_length", static_cast<uint32_t>(p.n_embd));
  w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(p.n_ff));
  w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(p.n_head));
  w.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(p.n_head_kv));
  w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(p.head_dim));
  w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(p.head_dim));
  w.set_u32(a + ".context_length", 4096);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
  w.set_f32(a + ".rope.freq_base", 1e6f);
  auto add = [&](const std::string& name, DType t, int64_t cols, int64_t rows) {
    const auto m = random_matrix(t, cols, rows, rng);
    w.add_tensor(name, t, {cols, rows}, m.data(), m.size());
  };
  auto ones = [&](const std::string& name, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n), 1.f);
    w.add_tensor(name, DType::F32, {n}, v.data(), v.size() * 4);
  };
  add("token_embd.weight", DType::Q8_0, p.n_embd, p.n_vocab);
  add("output.weight", p.wtype, p.n_embd, p.n_vocab);
  ones("output_norm.weight", p.n_embd);
  const int qd = p.n_head * p.head_dim, kvd = p.n_head_kv * p.head_dim;
  for (int l = 0; l < p.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    ones(b + "attn_norm.weight", p.n_embd);
    ones(b + "ffn_norm.weight", p.n_embd);
    ones(b + "attn_q_norm.weight", p.head_dim);
    ones(b + "attn_k_norm.weight", p.head_dim);
    add(b + "attn_q.weight", p.wtype, p.n_embd, qd);
    add(b + "attn_k.weight", p.wtype, p.n_embd, kvd);
    add(b + "attn_v.weight", p.wtype, p.n_embd, kvd);
    add(b + "attn_output.weight", p.wtype, qd, p.n_embd);
    add(b + "ffn_gate.weight", p.wtype, p.n_embd, p.n_ff);
    add(b + "ffn_up.weight", p.wtype, p.n_embd, p.n_ff);
    add(b + "ffn_down.weight", p.wtype, p.n_ff, p.n_embd);
  }
  return w.serialize();
}

}  // namespace megakern
