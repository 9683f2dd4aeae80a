#include "model/muse_config.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"
#include "core/units.h"

namespace megakern {

// Full-size figures (muse-spark-1.2), from parameter_count() and checked in
// tests/test_muse.cpp. The shapes are the reference's (musespark/config.py
// Config defaults, musespark/__init__.py weight dict): H = 8192, 62 layers,
// qd = 128 * 64 = 8192, kvd = 16 * 64 = 1024, E = 256, F = 4096, D = 4096,
// V = 202048:
//   embedding, lm_head   2 * 202048 * 8192                          =   3,310,354,432
//   attention  62 * (q, gate, o 3 * 8192*8192 + k, v 2 * 1024*8192) =  13,522,436,096
//   router     62 * (256*8192 + 256)                                =     130,039,296
//   pre/post + pre/post-expert norms 62 * (2 * 4096*8192 + 2*4096)  =   4,161,257,472
//   experts    62 * 256 * 3 * 4096*4096                             = 798,863,917,056
//   expert global scales 62 * 3 * 256                               =          47,616
//   layer norms and gammas 62 * 5 * 8192, final norm 8192           =       2,547,712
//   total                                                           = 819,990,599,680
//   without the embedding and the LM head                           = 816,680,245,248
//   active (8 of 256 experts per layer)                             =  46,091,133,904
//   active without the embedding and the LM head                    =  42,780,779,472
// The checkpoint's name ("Muse-Spark-1.2-816B-A42B", quoted in
// musespark/quant.py) gives 816 B / 42 B: the counts without the embedding
// and the LM head.

namespace {

std::vector<MuseConfig> make_presets() {
  std::vector<MuseConfig> v;
  // vocab_used: musespark/config.py: ids >= 201818 are untrained padding
  v.push_back({.name = "muse-spark-1.2", .n_layer = 62, .hidden = 8192, .vocab = 202048, .vocab_used = 201818,
               .n_head = 128, .n_head_kv = 16, .head_dim = 64, .window = 2048, .rope_theta = 5e5, .n_expert = 256,
               .top_k = 8, .expert_ff = 4096, .expert_dim = 4096});
  // Tiny, for tests and `run`: 4 layers (one full NoPE layer at l = 1), a
  // window of 8 so short sequences already slide, 8 experts top-2, every
  // matrix width a multiple of 128 so int4_g128, nvfp4 and int8_col apply.
  // Vocabulary 512 of which 260 are used (256 bytes and 4 specials).
  v.push_back({.name = "muse-spark-mini", .n_layer = 4, .hidden = 128, .vocab = 512, .vocab_used = 260, .n_head = 4,
               .n_head_kv = 2, .head_dim = 32, .window = 8, .rope_theta = 5e5, .n_expert = 8, .top_k = 2,
               .expert_ff = 128, .expert_dim = 128});
  // All 62 layers and the real head dim / top-k at an eighth of the width
  // and 32 experts: with bf16 dense and int4_g128 experts a step reads
  // 0.83 GB and the whole model is 1.50 GB (describe() prints the figures).
  v.push_back({.name = "muse-spark-bench", .n_layer = 62, .hidden = 1024, .vocab = 32768, .vocab_used = 32000,
               .n_head = 16, .n_head_kv = 2, .head_dim = 64, .window = 2048, .rope_theta = 5e5, .n_expert = 32,
               .top_k = 8, .expert_ff = 512, .expert_dim = 512});
  for (const auto& c : v) c.validate();
  return v;
}

// Bytes of a tensor stored with the given formats; for the experts (shape
// [E][rows][cols]) `n_experts` of the E are counted.
int64_t tensor_bytes(const MuseTensor& t, DType dense, DType experts, int64_t n_experts) {
  if (!t.matrix) return t.numel() * 4;
  const DType d = t.format == 'd' ? dense : t.format == 'e' ? experts : DType::F32;
  const int64_t cols = t.shape.back(), rows = t.shape[t.shape.size() - 2];
  const int64_t mats = t.shape.size() == 3 ? n_experts : 1;
  return mats * rows * static_cast<int64_t>(row_bytes(d, cols));
}

}  // namespace

double MuseConfig::softmax_scale() const { return qk_scale_factor / std::sqrt(static_cast<double>(head_dim)); }

int MuseConfig::n_full_layers() const {
  int n = 0;
  for (int l = 0; l < n_layer; ++l) n += is_full_attention(l) ? 1 : 0;
  return n;
}

void MuseConfig::validate() const {
  const std::string who = name.empty() ? std::string("muse config") : name;
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) fail("{}: {} must be > 0, got {}", who, field, v);
  };
  positive("n_layer", n_layer);
  positive("hidden", hidden);
  positive("vocab", vocab);
  positive("vocab_used", vocab_used);
  positive("n_head", n_head);
  positive("n_head_kv", n_head_kv);
  positive("head_dim", head_dim);
  positive("window", window);
  positive("full_attn_interval", full_attn_interval);
  positive("n_expert", n_expert);
  positive("top_k", top_k);
  positive("expert_ff", expert_ff);
  positive("expert_dim", expert_dim);
  if (vocab_used > vocab) fail("{}: vocab_used ({}) exceeds vocab ({})", who, vocab_used, vocab);
  if (n_head % n_head_kv != 0) fail("{}: n_head ({}) must be a multiple of n_head_kv ({})", who, n_head, n_head_kv);
  // musespark/config.py Config.__post_init__: the attention width is the hidden width.
  if (q_dim() != hidden)
    fail("{}: n_head * head_dim ({} * {} = {}) must equal hidden ({})", who, n_head, head_dim, q_dim(), hidden);
  if (head_dim % 2 != 0) fail("{}: head_dim must be even for RoPE, got {}", who, head_dim);
  if (top_k > n_expert) fail("{}: top_k ({}) exceeds n_expert ({})", who, top_k, n_expert);
  if (full_attn_offset < 0 || full_attn_offset >= full_attn_interval)
    fail("{}: full_attn_offset must be in [0, {}), got {}", who, full_attn_interval, full_attn_offset);
  // Every matrix is read in rows of hidden, q_dim, expert_dim or expert_ff
  // values; 128 lets every block format (int4_g128, int8_col, nvfp4) apply.
  for (auto [field, val] : {std::pair<const char*, int64_t>{"hidden", hidden}, {"q_dim", q_dim()},
                            {"expert_dim", expert_dim}, {"expert_ff", expert_ff}})
    if (val % 128 != 0) fail("{}: {} ({}) must be a multiple of 128", who, field, val);
  if (!(rms_eps > 0) || !(post_eps > 0) || !(rope_theta > 0) || !(qk_scale_factor > 0) || !(router_scale > 0) ||
      !(logit_scale > 0) || !(logit_cap > 0))
    fail("{}: rms_eps, post_eps, rope_theta, qk_scale_factor, router_scale, logit_scale and logit_cap must be > 0",
         who);
  if (!(route_eps >= 0)) fail("{}: route_eps must be >= 0, got {}", who, route_eps);
}

const std::vector<MuseConfig>& muse_presets() {
  static const std::vector<MuseConfig> presets = make_presets();
  return presets;
}

const MuseConfig* find_muse_preset(const std::string& name) {
  for (const auto& p : muse_presets())
    if (p.name == name) return &p;
  return nullptr;
}

int64_t MuseTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<MuseTensor> muse_tensors(const MuseConfig& c) {
  using K = MuseTensor::Kind;
  const int64_t H = c.hidden, E = c.n_expert, F = c.expert_ff, D = c.expert_dim;
  std::vector<MuseTensor> t;
  t.push_back({"embed.weight", {c.vocab, H}, K::Embedding, -1, 'd', true});
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    t.push_back({p + "attn_norm", {H}, K::Norm, l, 'f', false});
    t.push_back({p + "attn.q", {c.q_dim(), H}, K::Attention, l, 'd', true});
    t.push_back({p + "attn.k", {c.kv_dim(), H}, K::Attention, l, 'd', true});
    t.push_back({p + "attn.v", {c.kv_dim(), H}, K::Attention, l, 'd', true});
    t.push_back({p + "attn.gate", {c.q_dim(), H}, K::Attention, l, 'd', true});
    t.push_back({p + "attn.o", {H, c.q_dim()}, K::Attention, l, 'd', true});
    t.push_back({p + "attn_gamma", {H}, K::Norm, l, 'f', false});
    t.push_back({p + "ffn_norm", {H}, K::Norm, l, 'f', false});
    t.push_back({p + "moe.router", {E, H}, K::Router, l, 'f', true});
    t.push_back({p + "moe.router_bias", {E}, K::Router, l, 'f', false});
    t.push_back({p + "moe.pre", {D, H}, K::MoeDense, l, 'd', true});
    t.push_back({p + "moe.pre_norm", {D}, K::MoeDense, l, 'f', false});
    t.push_back({p + "moe.experts.gate", {E, F, D}, K::Experts, l, 'e', true});
    t.push_back({p + "moe.experts.up", {E, F, D}, K::Experts, l, 'e', true});
    t.push_back({p + "moe.experts.down", {E, D, F}, K::Experts, l, 'e', true});
    t.push_back({p + "moe.experts.scale", {3, E}, K::ExpertAux, l, 'f', false});
    t.push_back({p + "moe.experts.norm", {D}, K::MoeDense, l, 'f', false});
    t.push_back({p + "moe.post", {H, D}, K::MoeDense, l, 'd', true});
    t.push_back({p + "post_ffn_norm", {H}, K::Norm, l, 'f', false});
    t.push_back({p + "ffn_gamma", {H}, K::Norm, l, 'f', false});
  }
  t.push_back({"final_norm", {H}, K::Norm, -1, 'f', false});
  t.push_back({"lm_head.weight", {c.vocab, H}, K::LmHead, -1, 'd', true});
  return t;
}

MuseParamCount parameter_count(const MuseConfig& c) {
  using K = MuseTensor::Kind;
  MuseParamCount pc;
  for (const auto& t : muse_tensors(c)) {
    const int64_t n = t.numel();
    switch (t.kind) {
      case K::Embedding: pc.embedding += n; break;
      case K::LmHead: pc.lm_head += n; break;
      case K::Attention: pc.attention += n; break;
      case K::Router: pc.router += n; break;
      case K::MoeDense: pc.moe_dense += n; break;
      case K::Experts: pc.experts += n; break;
      case K::ExpertAux: pc.expert_aux += n; break;
      case K::Norm: pc.norms += n; break;
    }
  }
  // Per-expert tensors scale with top_k / n_expert for one token.
  pc.active = pc.total() - (pc.experts + pc.expert_aux) / c.n_expert * (c.n_expert - c.top_k);
  return pc;
}

int64_t weight_bytes_per_step(const MuseConfig& c, DType dense, DType experts) {
  int64_t bytes = 0;
  for (const auto& t : muse_tensors(c)) {
    if (t.kind == MuseTensor::Kind::Embedding)
      bytes += static_cast<int64_t>(row_bytes(dense, t.shape[1]));
    else if (t.kind == MuseTensor::Kind::Experts || t.kind == MuseTensor::Kind::ExpertAux)
      bytes += t.kind == MuseTensor::Kind::Experts ? tensor_bytes(t, dense, experts, c.top_k)
                                                   : t.numel() / c.n_expert * c.top_k * 4;
    else
      bytes += tensor_bytes(t, dense, experts, 1);
  }
  return bytes;
}

int64_t weight_bytes_total(const MuseConfig& c, DType dense, DType experts) {
  int64_t bytes = 0;
  for (const auto& t : muse_tensors(c)) bytes += tensor_bytes(t, dense, experts, c.n_expert);
  return bytes;
}

int64_t kv_bytes_per_token(const MuseConfig& c, int elem_bytes) {
  return int64_t(c.n_layer) * 2 * c.kv_dim() * elem_bytes;
}

std::string describe(const MuseConfig& c) {
  const MuseParamCount pc = parameter_count(c);
  std::string s;
  s += fmt::format("{}: Muse Spark (sliding-window + NoPE attention, sigmoid-routed MoE)\n", c.name);
  s += fmt::format("  layers {} ({} full attention without position encoding at l % {} == {}, {} sliding window "
                   "{} with RoPE theta {:g})\n",
                   c.n_layer, c.n_full_layers(), c.full_attn_interval, c.full_attn_offset, c.n_window_layers(),
                   c.window, c.rope_theta);
  s += fmt::format("  hidden {}, vocab {} ({} used), eps {:g} (post-norms {:g}), RMS-normed embedding, untied "
                   "head, gated residual stream\n",
                   c.hidden, c.vocab, c.vocab_used, c.rms_eps, c.post_eps);
  s += fmt::format("  attention: {} q heads, {} kv heads, head dim {}, softmax scale {:g}, per-head q/k RMSNorm, "
                   "per-head output norm and per-channel sigmoid gate\n",
                   c.n_head, c.n_head_kv, c.head_dim, c.softmax_scale());
  s += fmt::format("  MoE: {} experts, top-{}, router sigmoid(logit x {:g}), SwiGLU width {} in a latent of {}, "
                   "shared expert output norm\n",
                   c.n_expert, c.top_k, c.router_scale, c.expert_ff, c.expert_dim);
  s += fmt::format("  logits: {:g} * tanh(x * {:g} / {:g})\n", c.logit_cap, c.logit_scale, c.logit_cap);
  s += "\n  parameters\n";
  auto row = [&](const char* what, int64_t n) {
    s += fmt::format("    {:<26} {:>20}  ({:6.2f} %)\n", what, with_commas(n),
                     100.0 * static_cast<double>(n) / static_cast<double>(pc.total()));
  };
  row("embedding", pc.embedding);
  row("attention", pc.attention);
  row("router", pc.router);
  row("MoE pre/post projections", pc.moe_dense);
  row("routed experts", pc.experts);
  row("expert global scales", pc.expert_aux);
  row("norms and gammas", pc.norms);
  row("LM head", pc.lm_head);
  row("total", pc.total());
  row("active per token", pc.active);
  row("total w/o embedding, head", pc.total() - pc.embedding - pc.lm_head);
  row("active w/o embedding, head", pc.active - pc.embedding - pc.lm_head);
  s += "\n  weights (dense / experts)     read per decode step (batch 1)        stored in total\n";
  for (DType d : {DType::BF16, DType::INT8_COL})
    for (DType e : {DType::INT4_G128, DType::NVFP4}) {
      const int64_t step = weight_bytes_per_step(c, d, e);
      const int64_t total = weight_bytes_total(c, d, e);
      s += fmt::format("    {:<8} / {:<10} {:>20} B ({:>10})  {:>22} B ({:>10})\n", dtype_traits(d).name,
                       dtype_traits(e).name, with_commas(step), human_bytes(static_cast<double>(step)),
                       with_commas(total), human_bytes(static_cast<double>(total)));
    }
  s += "    (router and vectors in f32; one embedding row and top_k experts per layer per step;\n"
       "     the NVFP4 global scale is one f32 per expert matrix)\n";
  s += fmt::format("\n  KV cache per token: {} B f32, {} B bf16 ({} layers x K,V x {} x {});\n", with_commas(kv_bytes_per_token(c, 4)),
                   with_commas(kv_bytes_per_token(c, 2)), c.n_layer, c.n_head_kv, c.head_dim);
  s += fmt::format("    the {} windowed layers keep at most window + block - 1 positions, so past the window\n"
                   "    a sequence grows by {} B f32 per token (full-attention layers: {})\n",
                   c.n_window_layers(), with_commas(int64_t(c.n_full_layers()) * 2 * c.kv_dim() * 4),
                   c.n_full_layers());
  return s;
}

}  // namespace megakern
