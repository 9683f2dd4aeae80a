#include "model/qwen38_config.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"
#include "core/units.h"
#include "io/config_value.h"
#include "io/gguf.h"
#include "model/gguf_weights.h"
#include "io/hf_config.h"
#include "model/dense_hf.h"

namespace megakern {

// Full-size figures (qwen3.8-27b), computed by parameter_count() and checked
// by hand in tests/test_qwen38_config.cpp:
//   embedding      248320 * 5120                       =  1,271,398,400
//   lm_head        (untied, same shape)                =  1,271,398,400
//   attention      16 layers * 104,858,112             =  1,677,729,792
//     q_proj 5120*12288 + k,v 2*5120*1024 + o 6144*5120 + q/k norm 2*256
//   deltanet       48 layers * 115,876,064             =  5,562,051,072
//     in_proj_qkv 5120*10240 + z 5120*6144 + b,a 2*5120*48 + conv 10240*4
//     + A_log, dt_bias 2*48 + norm 128 + out_proj 6144*5120
//   mlp            64 layers * 3*5120*17408            = 17,112,760,320
//   norms          (2*64 + 1) * 5120                   =        660,480
//   total                                              = 26,895,998,464
// Cross-check: the public Qwen3.5-27B / Qwen3.6-27B text configs (transformers
// model_type "qwen3_5_text", as quoted by several public loaders) have exactly
// these hyperparameters (64 layers, hidden 5120, MLP 17408, 24/4 heads of 256,
// partial_rotary_factor 0.25, rope_theta 1e7, DeltaNet 16 key / 48 value heads
// of 128, conv 4, vocab 248320, untied), public loaders count 851 language-model
// tensors for them (qwen38_tensors() gives 851 too) and quote the model as
// "27B" / total_params_b 27.0. Our 26.90 B is the language model alone; the
// released checkpoints add a vision encoder and an MTP layer that Qwen3.8 does
// not include. (Exact published totals were not available offline.)
// Weights read per decode step at batch 1
// (all but 248319 embedding rows): 25,624,605,184 parameters, i.e. about
// 51.2 GB in bf16, 27.2 GB in q8_0, 14.4 GB in q4_0.

namespace {

std::vector<Qwen38Config> make_presets() {
  std::vector<Qwen38Config> v;
  v.push_back({.name = "qwen3.8-27b", .n_layer = 64, .hidden = 5120, .intermediate = 17408, .vocab = 248320,
               .rms_eps = 1e-6, .n_head = 24, .n_head_kv = 4, .head_dim = 256, .rotary_dim = 64, .rope_theta = 1e7,
               .la_n_k_heads = 16, .la_n_v_heads = 48, .la_k_head_dim = 128, .la_v_head_dim = 128, .conv_kernel = 4});
  // Tiny, for tests: 4 layers (3 DeltaNet + 1 attention), every width a
  // multiple of 32 so all block formats apply; the same ratios as the full
  // model (GQA, 3 value heads per key head, rotary on a quarter of the head).
  // Must match tests/fixtures/qwen38_mini/config.json.
  v.push_back({.name = "qwen3.8-mini", .n_layer = 4, .hidden = 64, .intermediate = 160, .vocab = 256, .rms_eps = 1e-6,
               .n_head = 4, .n_head_kv = 2, .head_dim = 64, .rotary_dim = 16, .rope_theta = 1e7, .la_n_k_heads = 2,
               .la_n_v_heads = 6, .la_k_head_dim = 32, .la_v_head_dim = 32, .conv_kernel = 4});
  // The full 64-layer pattern (16 attention, 48 DeltaNet) with the real
  // head dims (256 attention, 128 DeltaNet) at a quarter-ish width.
  // 869,203,520 parameters: 471 MB read per step in q4_0 (>= 10 x 32 MiB
  // = 335.5 MB, with matrices q4_0 and small tensors f32), 1.74 GB total
  // in bf16.
  v.push_back({.name = "qwen3.8-bench", .n_layer = 64, .hidden = 1024, .intermediate = 3072, .vocab = 32768,
               .rms_eps = 1e-6, .n_head = 4, .n_head_kv = 1, .head_dim = 256, .rotary_dim = 64, .rope_theta = 1e7,
               .la_n_k_heads = 2, .la_n_v_heads = 6, .la_k_head_dim = 128, .la_v_head_dim = 128, .conv_kernel = 4});
  for (const auto& c : v) c.validate();
  return v;
}

int64_t small_bytes(int64_t n) { return n * 4; }  // f32

int64_t tensor_bytes(const Qwen38Tensor& t, DType d) {
  if (!t.matrix) return small_bytes(t.numel());
  return t.shape[0] * static_cast<int64_t>(row_bytes(d, t.shape[1]));
}

}  // namespace

int Qwen38Config::n_full_attention_layers() const {
  int n = 0;
  for (int l = 0; l < n_layer; ++l) n += is_full_attention(l) ? 1 : 0;
  return n;
}

void Qwen38Config::validate() const {
  const std::string who = name.empty() ? std::string("qwen3.8 config") : name;
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) fail("{}: {} must be > 0, got {}", who, field, v);
  };
  positive("n_layer", n_layer);
  positive("hidden", hidden);
  positive("intermediate", intermediate);
  positive("vocab", vocab);
  positive("n_head", n_head);
  positive("n_head_kv", n_head_kv);
  positive("head_dim", head_dim);
  positive("full_attn_interval", full_attn_interval);
  positive("la_n_k_heads", la_n_k_heads);
  positive("la_n_v_heads", la_n_v_heads);
  positive("la_k_head_dim", la_k_head_dim);
  positive("la_v_head_dim", la_v_head_dim);
  positive("conv_kernel", conv_kernel);
  if (!(rms_eps > 0)) fail("{}: rms_eps must be > 0, got {}", who, rms_eps);
  if (!(rope_theta > 0)) fail("{}: rope_theta must be > 0, got {}", who, rope_theta);
  if (n_head % n_head_kv != 0)
    fail("{}: n_head ({}) must be a multiple of n_head_kv ({})", who, n_head, n_head_kv);
  if (la_n_v_heads % la_n_k_heads != 0)
    fail("{}: la_n_v_heads ({}) must be a multiple of la_n_k_heads ({})", who, la_n_v_heads, la_n_k_heads);
  if (rotary_dim <= 0 || rotary_dim > head_dim || rotary_dim % 2 != 0)
    fail("{}: rotary_dim must be even and in (0, head_dim={}], got {}", who, head_dim, rotary_dim);
  if (n_expert < 0 || n_expert > 4096) fail("{}: n_expert must be in [0, 4096], got {}", who, n_expert);
  if (moe()) {
    if (n_expert_used < 1 || n_expert_used > n_expert)
      fail("{}: n_expert_used must be in [1, n_expert={}], got {}", who, n_expert, n_expert_used);
    positive("moe_intermediate", moe_intermediate);
    positive("shared_intermediate", shared_intermediate);
  }
}

const std::vector<Qwen38Config>& qwen38_presets() {
  static const std::vector<Qwen38Config> presets = make_presets();
  return presets;
}

const Qwen38Config* find_qwen38_preset(const std::string& name) {
  for (const auto& p : qwen38_presets())
    if (p.name == name) return &p;
  return nullptr;
}

int64_t Qwen38Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<Qwen38Tensor> qwen38_tensors(const Qwen38Config& c, const std::string& model_prefix,
                                         bool fused_experts) {
  using K = Qwen38Tensor::Kind;
  const int64_t H = c.hidden;
  std::vector<Qwen38Tensor> t;
  t.push_back({model_prefix + "embed_tokens.weight", {c.vocab, H}, K::Embedding, -1, true});
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = fmt::format("{}layers.{}.", model_prefix, l);
    t.push_back({p + "input_layernorm.weight", {H}, K::Norm, l, false});
    if (c.is_full_attention(l)) {
      const std::string a = p + "self_attn.";
      const int64_t kv = int64_t(c.n_head_kv) * c.head_dim;
      t.push_back({a + "q_proj.weight", {c.q_proj_rows(), H}, K::Attention, l, true});
      t.push_back({a + "k_proj.weight", {kv, H}, K::Attention, l, true});
      t.push_back({a + "v_proj.weight", {kv, H}, K::Attention, l, true});
      t.push_back({a + "o_proj.weight", {H, int64_t(c.n_head) * c.head_dim}, K::Attention, l, true});
      t.push_back({a + "q_norm.weight", {c.head_dim}, K::Attention, l, false});
      t.push_back({a + "k_norm.weight", {c.head_dim}, K::Attention, l, false});
    } else {
      const std::string a = p + "linear_attn.";
      if (c.fused_qkvz) {
        t.push_back({a + "in_proj_qkvz.weight", {c.la_conv_dim() + c.la_value_dim(), H}, K::DeltaNet, l, true});
        t.push_back({a + "in_proj_ba.weight", {2 * int64_t(c.la_n_v_heads), H}, K::DeltaNet, l, true});
      } else {
        t.push_back({a + "in_proj_qkv.weight", {c.la_conv_dim(), H}, K::DeltaNet, l, true});
        t.push_back({a + "in_proj_z.weight", {c.la_value_dim(), H}, K::DeltaNet, l, true});
        t.push_back({a + "in_proj_b.weight", {c.la_n_v_heads, H}, K::DeltaNet, l, true});
        t.push_back({a + "in_proj_a.weight", {c.la_n_v_heads, H}, K::DeltaNet, l, true});
      }
      t.push_back({a + "conv1d.weight", {c.la_conv_dim(), 1, c.conv_kernel}, K::DeltaNet, l, false});
      t.push_back({a + "dt_bias", {c.la_n_v_heads}, K::DeltaNet, l, false});
      t.push_back({a + "A_log", {c.la_n_v_heads}, K::DeltaNet, l, false});
      t.push_back({a + "norm.weight", {c.la_v_head_dim}, K::DeltaNet, l, false});
      t.push_back({a + "out_proj.weight", {H, c.la_value_dim()}, K::DeltaNet, l, true});
    }
    t.push_back({p + "post_attention_layernorm.weight", {H}, K::Norm, l, false});
    if (c.moe()) {
      const int64_t F = c.moe_intermediate, S = c.shared_intermediate;
      t.push_back({p + "mlp.gate.weight", {c.n_expert, H}, K::Mlp, l, true});
      if (fused_experts) {
        t.push_back({p + "mlp.experts.gate_up_proj", {c.n_expert, 2 * F, H}, K::Mlp, l, true});
        t.push_back({p + "mlp.experts.down_proj", {c.n_expert, H, F}, K::Mlp, l, true});
      }
      for (int e = 0; e < c.n_expert && !fused_experts; ++e) {
        const std::string x = fmt::format("{}mlp.experts.{}.", p, e);
        t.push_back({x + "gate_proj.weight", {F, H}, K::Mlp, l, true});
        t.push_back({x + "up_proj.weight", {F, H}, K::Mlp, l, true});
        t.push_back({x + "down_proj.weight", {H, F}, K::Mlp, l, true});
      }
      t.push_back({p + "mlp.shared_expert.gate_proj.weight", {S, H}, K::Mlp, l, true});
      t.push_back({p + "mlp.shared_expert.up_proj.weight", {S, H}, K::Mlp, l, true});
      t.push_back({p + "mlp.shared_expert.down_proj.weight", {H, S}, K::Mlp, l, true});
      t.push_back({p + "mlp.shared_expert_gate.weight", {1, H}, K::Mlp, l, true});
      continue;
    }
    t.push_back({p + "mlp.gate_proj.weight", {c.intermediate, H}, K::Mlp, l, true});
    t.push_back({p + "mlp.up_proj.weight", {c.intermediate, H}, K::Mlp, l, true});
    t.push_back({p + "mlp.down_proj.weight", {H, c.intermediate}, K::Mlp, l, true});
  }
  t.push_back({model_prefix + "norm.weight", {H}, K::Norm, -1, false});
  if (!c.tie_embeddings) t.push_back({"lm_head.weight", {c.vocab, H}, K::LmHead, -1, true});
  return t;
}

Qwen38ParamCount parameter_count(const Qwen38Config& c) {
  using K = Qwen38Tensor::Kind;
  Qwen38ParamCount pc;
  const int first_attn = c.full_attn_interval - 1;
  for (const auto& t : qwen38_tensors(c)) {
    const int64_t n = t.numel();
    switch (t.kind) {
      case K::Embedding: pc.embedding += n; break;
      case K::LmHead: pc.lm_head += n; break;
      case K::Attention:
        pc.attention += n;
        if (t.layer == first_attn) pc.attention_per_layer += n;
        break;
      case K::DeltaNet:
        pc.deltanet += n;
        if (t.layer == 0) pc.deltanet_per_layer += n;
        break;
      case K::Mlp:
        pc.mlp += n;
        if (t.layer == 0) pc.mlp_per_layer += n;
        break;
      case K::Norm: pc.norms += n; break;
    }
  }
  return pc;
}

double weight_bytes_per_step(const Qwen38Config& c, double bytes_per_param) {
  const Qwen38ParamCount pc = parameter_count(c);
  const int64_t read = pc.total() - pc.embedding + c.hidden;  // one embedding row
  return static_cast<double>(read) * bytes_per_param;
}

int64_t weight_bytes_per_step(const Qwen38Config& c, DType d) {
  int64_t bytes = 0;
  for (const auto& t : qwen38_tensors(c)) {
    if (t.kind == Qwen38Tensor::Kind::Embedding)
      bytes += static_cast<int64_t>(row_bytes(d, t.shape[1]));  // one row
    else
      bytes += tensor_bytes(t, d);
  }
  return bytes;
}

int64_t weight_bytes_total(const Qwen38Config& c, DType d) {
  int64_t bytes = 0;
  for (const auto& t : qwen38_tensors(c)) bytes += tensor_bytes(t, d);
  return bytes;
}

int64_t kv_bytes_per_token(const Qwen38Config& c, int elem_bytes) {
  return int64_t(c.n_full_attention_layers()) * 2 * c.n_head_kv * c.head_dim * elem_bytes;
}

Qwen38StateBytes recurrent_state_bytes(const Qwen38Config& c, int conv_elem_bytes) {
  Qwen38StateBytes s;
  const int64_t n = c.n_deltanet_layers();
  s.delta_state = n * c.la_n_v_heads * int64_t(c.la_v_head_dim) * c.la_k_head_dim * 4;
  s.conv_window = n * (c.conv_kernel - 1) * c.la_conv_dim() * conv_elem_bytes;
  return s;
}

std::string describe(const Qwen38Config& c) {
  const Qwen38ParamCount pc = parameter_count(c);
  std::string s;
  s += fmt::format("{}: Qwen3.8 (Gated DeltaNet + gated attention hybrid)\n", c.name);
  s += fmt::format("  layers {} ({} gated attention at l % {} == {}, {} Gated DeltaNet)\n", c.n_layer,
                   c.n_full_attention_layers(), c.full_attn_interval, c.full_attn_interval - 1,
                   c.n_deltanet_layers());
  s += fmt::format("  hidden {}, MLP {} (SwiGLU), vocab {}, eps {:g}, {} embeddings, zero-centred RMSNorm\n",
                   c.hidden, c.intermediate, c.vocab, c.rms_eps, c.tie_embeddings ? "tied" : "untied");
  s += fmt::format("  attention: {} q heads, {} kv heads, head dim {}, RoPE on {} dims (rotate-half, theta {:g}), "
                   "sigmoid output gate\n",
                   c.n_head, c.n_head_kv, c.head_dim, c.rotary_dim, c.rope_theta);
  s += fmt::format("  DeltaNet: {} key heads x {}, {} value heads x {}, conv width {}\n", c.la_n_k_heads,
                   c.la_k_head_dim, c.la_n_v_heads, c.la_v_head_dim, c.conv_kernel);
  s += "\n  parameters\n";
  auto row = [&](const char* what, int64_t n) {
    s += fmt::format("    {:<22} {:>18}  ({:5.2f} %)\n", what, with_commas(n),
                     100.0 * static_cast<double>(n) / static_cast<double>(pc.total()));
  };
  row("embedding", pc.embedding);
  row("attention layers", pc.attention);
  row("DeltaNet layers", pc.deltanet);
  row("MLP", pc.mlp);
  row("norms", pc.norms);
  row("LM head", pc.lm_head);
  row("total", pc.total());
  s += fmt::format("    per layer: attention {}, DeltaNet {}, MLP {}\n", with_commas(pc.attention_per_layer),
                   with_commas(pc.deltanet_per_layer), with_commas(pc.mlp_per_layer));
  s += "\n  weights          read per decode step (batch 1)     stored in total\n";
  for (DType d : {DType::BF16, DType::Q8_0, DType::Q4_0}) {
    const int64_t step = weight_bytes_per_step(c, d);
    const int64_t total = weight_bytes_total(c, d);
    s += fmt::format("    {:<6} {:>18} B ({:>10})  {:>18} B ({:>10})\n", dtype_traits(d).name, with_commas(step),
                     human_bytes(static_cast<double>(step)), with_commas(total),
                     human_bytes(static_cast<double>(total)));
  }
  s += "    (matrices in the format, norm vectors / conv taps / A_log / dt_bias in f32;\n"
       "     the embedding contributes one row per step, the LM head all of it)\n";
  s += fmt::format("\n  KV cache per token: {} B f32, {} B bf16 ({} attention layers x K,V x {} x {})\n",
                   with_commas(kv_bytes_per_token(c, 4)), with_commas(kv_bytes_per_token(c, 2)),
                   c.n_full_attention_layers(), c.n_head_kv, c.head_dim);
  const Qwen38StateBytes st = recurrent_state_bytes(c);
  s += fmt::format("  recurrent state per sequence: {} B ({})\n", with_commas(st.total()),
                   human_bytes(static_cast<double>(st.total())));
  s += fmt::format("    DeltaNet S  {} layers x {} heads x {} x {} f32 = {} B\n", c.n_deltanet_layers(),
                   c.la_n_v_heads, c.la_v_head_dim, c.la_k_head_dim, with_commas(st.delta_state));
  s += fmt::format("    conv window {} layers x {} previous inputs x {} channels (q,k,v) f32 = {} B\n",
                   c.n_deltanet_layers(), c.conv_kernel - 1, c.la_conv_dim(), with_commas(st.conv_window));
  return s;
}

Qwen38Config qwen38_config_from_hf(const HFConfig& hf) {
  const std::string mt = hf.model_type();
  const bool next = mt == "qwen3_next", moe35 = mt == "qwen3_5_moe_text" || mt == "qwen3_5_moe";
  if (mt != "qwen3_5_text" && mt != "qwen3_5" && !next && !moe35)
    fail("{}: model_type '{}' is not a Qwen3.5-family config (expected qwen3_5_text, qwen3_5, qwen3_5_moe_text, "
         "qwen3_5_moe or qwen3_next)",
         hf.name(), mt);
  Qwen38Config c;
  if (next || moe35) {
    // Qwen3-Next and Qwen3.5-MoE: a mixture of experts with a gated shared
    // expert in every layer; Qwen3-Next fuses the DeltaNet projections.
    c.fused_qkvz = next;
    c.n_expert = static_cast<int>(hf.get_int_in("num_experts", 1, 4096));
    c.n_expert_used = static_cast<int>(hf.get_int_in("num_experts_per_tok", 1, c.n_expert));
    c.moe_intermediate = static_cast<int>(hf.get_int_in("moe_intermediate_size", 1, kMaxConfigDim));
    c.shared_intermediate = static_cast<int>(hf.get_int_in("shared_expert_intermediate_size", 1, kMaxConfigDim));
    // Qwen3.5-MoE's router always renormalises the selected weights.
    c.norm_topk_prob = next ? hf.get_bool_or("norm_topk_prob", true) : true;
    require_every_layer_sparse(hf);
  }
  c.name = hf.name();
  auto dim = [&](const char* key) { return static_cast<int>(hf.get_int_in(key, 1, kMaxConfigDim)); };
  c.n_layer = static_cast<int>(hf.get_int_in("num_hidden_layers", 1, kMaxConfigLayers));
  c.hidden = dim("hidden_size");
  c.intermediate = dim("intermediate_size");
  c.vocab = dim("vocab_size");
  c.rms_eps = hf.get_float_in_or("rms_norm_eps", 1e-6, 0, 1);
  c.n_head = dim("num_attention_heads");
  c.n_head_kv = dim("num_key_value_heads");
  c.head_dim = static_cast<int>(hf.get_int_in_or("head_dim", c.hidden / c.n_head, 1, kMaxConfigDim));
  c.la_n_k_heads = dim("linear_num_key_heads");
  c.la_n_v_heads = dim("linear_num_value_heads");
  c.la_k_head_dim = dim("linear_key_head_dim");
  c.la_v_head_dim = dim("linear_value_head_dim");
  c.conv_kernel = static_cast<int>(hf.get_int_in_or("linear_conv_kernel_dim", 4, 1, 1024));
  c.full_attn_interval = static_cast<int>(hf.get_int_in_or("full_attention_interval", 4, 1, kMaxConfigLayers));
  // A composite config (qwen3_5 with a text_config) ties at its top level,
  // which the lookup reads first.
  c.tie_embeddings = hf.get_bool_or("tie_word_embeddings", false);

  constexpr double kMaxRopeBase = 1e12;
  double theta = hf.get_float_in_or("rope_theta", 1e7, 0, kMaxRopeBase);
  double partial = hf.get_float_in_or("partial_rotary_factor", 0.25, 0, 1);
  if (const nlohmann::json* rp = hf.find("rope_parameters"); rp && rp->is_object()) {
    if (auto it = rp->find("rope_type"); it != rp->end() && it->is_string() && it->get<std::string>() != "default")
      fail("{}: rope_parameters.rope_type '{}' is not supported (only 'default')", hf.name(),
           it->get<std::string>());
    if (auto it = rp->find("rope_theta"); it != rp->end() && !it->is_null())
      theta = json_float_in(*it, hf.name(), "rope_parameters.rope_theta", 0, kMaxRopeBase);
    if (auto it = rp->find("partial_rotary_factor"); it != rp->end() && !it->is_null())
      partial = json_float_in(*it, hf.name(), "rope_parameters.partial_rotary_factor", 0, 1);
  }
  c.rope_theta = theta;
  if (int64_t{c.n_head} * c.head_dim > kMaxConfigDim || int64_t{c.la_n_v_heads} * c.la_v_head_dim > kMaxConfigDim ||
      int64_t{c.la_n_k_heads} * c.la_k_head_dim > kMaxConfigDim)
    fail("{}: num_attention_heads x head_dim ({} x {}) or the linear-attention heads x head dims exceed {}", hf.name(),
         c.n_head, c.head_dim, kMaxConfigDim);
  const double rd = c.head_dim * partial;
  if (std::floor(rd) != rd) fail("{}: head_dim {} * partial_rotary_factor {} is not an integer", hf.name(),
                                 c.head_dim, partial);
  c.rotary_dim = static_cast<int>(rd);

  if (const nlohmann::json* lt = hf.find("layer_types")) {
    if (!lt->is_array() || lt->size() != static_cast<size_t>(c.n_layer))
      fail("{}: layer_types must be a list of num_hidden_layers ({}) strings", hf.name(), c.n_layer);
    for (int l = 0; l < c.n_layer; ++l) {
      const auto& e = (*lt)[static_cast<size_t>(l)];
      const std::string want = c.is_full_attention(l) ? "full_attention" : "linear_attention";
      if (!e.is_string() || e.get<std::string>() != want)
        fail("{}: layer_types[{}] is {}, expected \"{}\" (layer l is full attention iff l % {} == {})", hf.name(),
             l, e.dump(), want, c.full_attn_interval, c.full_attn_interval - 1);
    }
  }
  const std::string act = hf.get_string_or("hidden_act", "silu");
  if (act != "silu") fail("{}: hidden_act '{}' is not supported (expected silu)", hf.name(), act);
  if (hf.get_bool_or("attention_bias", false)) fail("{}: attention_bias is not supported", hf.name());
  c.validate();
  return c;
}

const std::vector<std::string>& qwen38_gguf_architectures() {
  static const std::vector<std::string> v = {"qwen3next", "qwen35", "qwen35moe"};
  return v;
}

Qwen38Config qwen38_config_from_gguf(const GGUFFile& f) {
  const std::string arch = f.get_string("general.architecture");
  bool known = false;
  for (const std::string& a : qwen38_gguf_architectures()) known |= a == arch;
  if (!known) fail("{}: architecture '{}' is not a Qwen3-Next / Qwen3.5 file", f.name(), arch);
  auto key = [&](const char* k) { return arch + "." + k; };
  auto dim = [&](const char* k) { return gguf_int_in(f, key(k)); };
  Qwen38Config c;
  c.name = f.get_string_opt("general.name").value_or(f.name());
  const int blocks = gguf_int_in(f, key("block_count"), 1, kMaxConfigLayers);
  const int nextn = f.has(key("nextn_predict_layers")) ? gguf_int_in(f, key("nextn_predict_layers"), 0, blocks - 1) : 0;
  c.n_layer = blocks - nextn;
  c.hidden = dim("embedding_length");
  c.vocab = 0;  // from token_embd
  c.rms_eps = gguf_float_in(f, key("attention.layer_norm_rms_epsilon"), 0, 1);
  c.n_head = dim("attention.head_count");
  c.n_head_kv = f.has(key("attention.head_count_kv")) ? dim("attention.head_count_kv") : c.n_head;
  c.head_dim = f.has(key("attention.key_length")) ? dim("attention.key_length") : c.hidden / c.n_head;
  if (f.has(key("attention.value_length")) && dim("attention.value_length") != c.head_dim)
    fail("{}: {} and {} differ, which Qwen3.8 does not support", f.name(), key("attention.key_length"),
         key("attention.value_length"));
  c.rope_theta = gguf_float_in(f, key("rope.freq_base"), 0, 1e12, 10000.0);
  c.rotary_dim = f.has(key("rope.dimension_count")) ? dim("rope.dimension_count") : c.head_dim;
  if (auto type = f.get_string_opt(key("rope.scaling.type")); type && *type != "none")
    fail("{}: {} '{}' is not supported (only plain RoPE)", f.name(), key("rope.scaling.type"), *type);
  c.conv_kernel = gguf_int_in(f, key("ssm.conv_kernel"), 1, 1024);
  c.la_k_head_dim = dim("ssm.state_size");
  c.la_n_k_heads = dim("ssm.group_count");
  c.la_n_v_heads = dim("ssm.time_step_rank");
  const int inner = dim("ssm.inner_size");
  if (inner % c.la_n_v_heads != 0)
    fail("{}: {} {} is not a multiple of {} {}", f.name(), key("ssm.inner_size"), inner, key("ssm.time_step_rank"),
         c.la_n_v_heads);
  c.la_v_head_dim = inner / c.la_n_v_heads;
  c.full_attn_interval =
      f.has(key("full_attention_interval")) ? gguf_int_in(f, key("full_attention_interval"), 1, kMaxConfigLayers) : 4;
  if (f.has(key("attention.recurrent_layers"))) {
    const std::vector<int64_t>& rec = f.get_int_array(key("attention.recurrent_layers"));
    if (rec.size() < static_cast<size_t>(c.n_layer))
      fail("{}: {} has {} entries for {} layers", f.name(), key("attention.recurrent_layers"), rec.size(), c.n_layer);
    for (int l = 0; l < c.n_layer; ++l)
      if ((rec[static_cast<size_t>(l)] != 0) == c.is_full_attention(l))
        fail("{}: {}[{}] is {}, but Qwen3.8 runs layer l as full attention iff l % {} == {}", f.name(),
             key("attention.recurrent_layers"), l, rec[static_cast<size_t>(l)] != 0, c.full_attn_interval,
             c.full_attn_interval - 1);
  }
  c.tiled_v_heads = arch != "qwen3next";
  if (arch == "qwen35") {
    c.intermediate = dim("feed_forward_length");
  } else {
    c.fused_qkvz = arch == "qwen3next";  // the [b | a] pairs per key head of ssm_ba
    c.n_expert = gguf_int_in(f, key("expert_count"), 1, 4096);
    c.n_expert_used = gguf_int_in(f, key("expert_used_count"), 1, c.n_expert);
    c.moe_intermediate = dim("expert_feed_forward_length");
    c.shared_intermediate = dim("expert_shared_feed_forward_length");
    c.intermediate = f.has(key("feed_forward_length")) ? dim("feed_forward_length") : c.moe_intermediate;
    // llama.cpp renormalises the selected experts' weights for these files.
    c.norm_topk_prob = f.get_bool_opt(key("expert_weights_norm")).value_or(true);
    if (f.has(key("expert_weights_scale"))) {
      const float s = gguf_float_in(f, key("expert_weights_scale"), -1, 1e6);
      if (s != 0.f && s != 1.f) fail("{}: {} {} is not supported (only 1)", f.name(), key("expert_weights_scale"), s);
    }
  }
  return c;  // validated once the vocabulary is known
}

}  // namespace megakern
