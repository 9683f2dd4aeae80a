// Tiny synthetic GGUF models of the dense architectures, for tests.
#pragma once

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "io/gguf.h"

namespace megakern {

struct TinySpec {
  std::string arch = "llama";
  int n_layer = 3, n_embd = 64, n_ff = 96, n_head = 4, n_head_kv = 2, head_dim = 16, n_vocab = 100;
  DType wtype = DType::Q8_0;
  bool tied = true;
};

// `edit`, when given, runs on the writer last (to replace or add metadata).
inline std::vector<uint8_t> tiny_model(const TinySpec& s, uint32_t seed = 7,
                                       const std::function<void(GGUFWriter&)>& edit = {}) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  GGUFWriter w;
  const std::string a = s.arch;
  w.set_string("general.architecture", a);
  w.set_u32(a + ".block_count", s.n_layer);
  w.set_u32(a + ".embedding_length", s.n_embd);
  w.set_u32(a + ".feed_forward_length", s.n_ff);
  w.set_u32(a + ".attention.head_count", s.n_head);
  w.set_u32(a + ".attention.head_count_kv", s.n_head_kv);
  w.set_u32(a + ".attention.key_length", s.head_dim);
  w.set_u32(a + ".attention.value_length", s.head_dim);
  w.set_u32(a + ".context_length", 256);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
  w.set_f32(a + ".rope.freq_base", 10000.f);
  if (a == "gemma3") w.set_u32(a + ".attention.sliding_window", 4);
  auto mat = [&](const std::string& name, int cols, int rows, DType t) {
    std::vector<float> v(static_cast<size_t>(cols) * rows);
    const float sc = 1.f / std::sqrt(static_cast<float>(cols));
    for (auto& x : v) x = nd(rng) * sc;
    w.add_tensor_f32(name, t, {cols, rows}, v.data());
  };
  auto norm = [&](const std::string& name, int n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = 1.f + 0.1f * nd(rng);
    w.add_tensor_f32(name, DType::F32, {n}, v.data());
  };
  std::vector<float> emb(static_cast<size_t>(s.n_embd) * s.n_vocab);
  for (auto& x : emb) x = nd(rng) * 0.5f;
  w.add_tensor_f32("token_embd.weight", DType::Q8_0, {s.n_embd, s.n_vocab}, emb.data());
  if (!s.tied) mat("output.weight", s.n_embd, s.n_vocab, s.wtype);
  norm("output_norm.weight", s.n_embd);
  const int qd = s.n_head * s.head_dim, kvd = s.n_head_kv * s.head_dim;
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight", s.n_embd);
    norm(p + "ffn_norm.weight", s.n_embd);
    mat(p + "attn_q.weight", s.n_embd, qd, s.wtype);
    mat(p + "attn_k.weight", s.n_embd, kvd, s.wtype);
    mat(p + "attn_v.weight", s.n_embd, kvd, s.wtype);
    mat(p + "attn_output.weight", qd, s.n_embd, s.wtype);
    mat(p + "ffn_gate.weight", s.n_embd, s.n_ff, s.wtype);
    mat(p + "ffn_up.weight", s.n_embd, s.n_ff, s.wtype);
    mat(p + "ffn_down.weight", s.n_ff, s.n_embd, s.wtype);
    if (a == "qwen3" || a == "gemma3") {
      norm(p + "attn_q_norm.weight", s.head_dim);
      norm(p + "attn_k_norm.weight", s.head_dim);
    }
    if (a == "gemma3") {
      norm(p + "post_attention_norm.weight", s.n_embd);
      norm(p + "post_ffw_norm.weight", s.n_embd);
    }
  }
  if (edit) edit(w);
  return w.serialize();
}

}  // namespace megakern
