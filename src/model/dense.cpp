#include "model/dense.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "core/error.h"
#include "io/config_value.h"
#include "io/gguf.h"
#include "model/gguf_weights.h"

namespace megakern {
namespace {

std::string arch_key(const DenseConfig& c, const char* k) { return c.arch_name + "." + k; }

// YaRN's per-frequency divisors (transformers' _compute_yarn_parameters):
// rotation i keeps its frequency above the beta_fast correction dim, is
// divided by `factor` below the beta_slow one, and blends linearly between;
// without truncation the correction dims are not rounded outward.
std::vector<float> yarn_divisors(int rope_dim, double base, double factor, double orig_ctx, double beta_fast,
                                 double beta_slow, bool truncate) {
  auto corr_dim = [&](double rot) {
    return rope_dim * std::log(orig_ctx / (rot * 2 * 3.14159265358979323846)) / (2 * std::log(base));
  };
  double lo = corr_dim(beta_fast), hi = corr_dim(beta_slow);
  if (truncate) lo = std::floor(lo), hi = std::ceil(hi);
  lo = std::max(lo, 0.0);
  hi = std::min(hi, static_cast<double>(rope_dim - 1));
  if (lo == hi) hi += 0.001;
  std::vector<float> out;
  for (int i = 0; i < rope_dim / 2; ++i) {
    const double ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);  // 1: interpolated
    const double extrap = 1.0 - ramp;
    out.push_back(static_cast<float>(1.0 / (ramp / factor + extrap)));
  }
  return out;
}

std::string supported_list() {
  std::string s;
  for (const DenseFamily& fam : dense_families()) s += (s.empty() ? "" : ", ") + std::string(fam.gguf_arch);
  return s;
}

}  // namespace

std::unique_ptr<DenseModel> DenseModel::load(const GGUFFile& f, std::optional<DType> weights) {
  if (weights && *weights != DType::F32)
    fail("{}: a GGUF file keeps the formats it was written in; --weights can only be f32 (dequantised at load), "
         "got {}",
         f.name(), dtype_traits(*weights).name);
  auto m = std::unique_ptr<DenseModel>(new DenseModel());
  DenseConfig& c = m->cfg_;
  c.arch_name = f.get_string("general.architecture");
  c.family = dense_family_of_gguf(c.arch_name);
  if (!c.family) {
    if (auto why = unsupported_gguf_reason(c.arch_name))
      fail("{}: architecture '{}' is not supported: {}", f.name(), c.arch_name, *why);
    fail("{}: architecture '{}' is not supported (expected one of {})", f.name(), c.arch_name, supported_list());
  }
  const DenseFamily& fam = *c.family;
  using T = DenseTensor;
  auto name = [](T t, int l = 0, std::string_view suffix = "weight") { return dense_tensor_name(t, l, suffix); };

  c.n_layer = gguf_int_in(f, arch_key(c, "block_count"));
  c.n_embd = gguf_int_in(f, arch_key(c, "embedding_length"));
  c.n_ff = gguf_int_in(f, arch_key(c, "feed_forward_length"));
  c.n_head = gguf_int_in(f, arch_key(c, "attention.head_count"));
  if (fam.mla) {
    // Multi-head latent attention. llama.cpp's converter writes the per-head
    // key and value widths as key_length_mla / value_length_mla (key_length
    // and value_length then describe its latent-space form); older files
    // give them as key_length / value_length.
    c.mla = true;
    c.n_head_kv = c.n_head;
    c.kv_lora_rank = gguf_int_in(f, arch_key(c, "attention.kv_lora_rank"));
    c.q_lora_rank = f.has(arch_key(c, "attention.q_lora_rank")) ? gguf_int_in(f, arch_key(c, "attention.q_lora_rank")) : 0;
    const bool mla_keys = f.has(arch_key(c, "attention.key_length_mla"));
    c.head_dim = gguf_int_in(f, arch_key(c, mla_keys ? "attention.key_length_mla" : "attention.key_length"));
    c.v_head_dim = gguf_int_in(f, arch_key(c, mla_keys ? "attention.value_length_mla" : "attention.value_length"));
    c.qk_rope = gguf_int_in(f, arch_key(c, "rope.dimension_count"));
    if (c.qk_rope % 2 != 0 || c.qk_rope >= c.head_dim)
      fail("{}: rope.dimension_count {} must be even and below the key head size {}", f.name(), c.qk_rope, c.head_dim);
    c.qk_nope = c.head_dim - c.qk_rope;
  } else {
  c.n_head_kv = f.has(arch_key(c, "attention.head_count_kv")) ? gguf_int_in(f, arch_key(c, "attention.head_count_kv"))
                                                                : c.n_head;
  }
  if (c.n_head % c.n_head_kv != 0)
    fail("{}: head_count {} is not a multiple of head_count_kv {}", f.name(), c.n_head, c.n_head_kv);
  if (!c.mla)
    c.head_dim = f.has(arch_key(c, "attention.key_length")) ? gguf_int_in(f, arch_key(c, "attention.key_length"))
                                                             : c.n_embd / c.n_head;
  if (c.head_dim <= 0) fail("{}: embedding_length {} is smaller than head_count {}", f.name(), c.n_embd, c.n_head);
  if (!c.mla && f.has(arch_key(c, "attention.value_length")) &&
      gguf_int_in(f, arch_key(c, "attention.value_length")) != c.head_dim)
    fail("{}: key_length and value_length differ, which this engine does not support", f.name());
  c.n_ctx_train = f.has(arch_key(c, "context_length")) ? gguf_int_in(f, arch_key(c, "context_length"), 1, int64_t{1} << 30) : 2048;
  c.eps = gguf_float_in(f, arch_key(c, "attention.layer_norm_rms_epsilon"), 0.0, 1.0);
  c.rope_base = gguf_float_in(f, arch_key(c, "rope.freq_base"), 0.0, 1e12, 10000.0);
  c.rope_dim = f.has(arch_key(c, "rope.dimension_count")) ? gguf_int_in(f, arch_key(c, "rope.dimension_count"))
                                                           : c.head_dim;
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0)
    fail("{}: rope.dimension_count {} must be even and at most the head size {}", f.name(), c.rope_dim,
         c.head_dim);
  std::vector<float> yarn;
  float yarn_attn = 1.f;
  if (auto type = f.get_string_opt(arch_key(c, "rope.scaling.type"));
      type && *type == "yarn" && (fam.gpt_oss || fam.mla)) {
    const double factor = gguf_float_in(f, arch_key(c, "rope.scaling.factor"), 0.0, 1e6);
    const double orig = gguf_int_in(f, arch_key(c, "rope.scaling.original_context_length"), 1, int64_t{1} << 30);
    const double bf = gguf_float_in(f, arch_key(c, "rope.scaling.yarn_beta_fast"), 0.0, 1e6, 32.0);
    const double bs = gguf_float_in(f, arch_key(c, "rope.scaling.yarn_beta_slow"), 0.0, 1e6, 1.0);
    if (factor < 1.0) fail("{}: '{}' is {}; YaRN needs a factor of at least 1", f.name(), arch_key(c, "rope.scaling.factor"), factor);
    // gpt-oss's released config does not truncate the correction range;
    // DeepSeek's (transformers' default) does.
    yarn = yarn_divisors(c.rope_dim, c.rope_base, factor, orig, bf, bs, fam.mla);
    if (fam.gpt_oss) {
      // The attention factor scales cos and sin of the whole head, so q.k by
      // its square.
      const double mscale = factor <= 1.0 ? 1.0 : 0.1 * std::log(factor) + 1.0;
      yarn_attn = static_cast<float>(gguf_float_in(f, arch_key(c, "rope.scaling.yarn_attn_factor"), 0.0, 1e6, mscale));
    } else {
      // DeepSeek: the rotated part keeps its amplitude (mscale equals
      // mscale_all_dim in every released config, so their ratio is 1) and
      // the softmax scale of the whole head is multiplied by m^2, m = 1 +
      // 0.1 mscale_all_dim ln(factor). llama.cpp's converter stores 0.1 x
      // mscale_all_dim as yarn_log_multiplier.
      const std::string log_mul = arch_key(c, "rope.scaling.yarn_log_multiplier");
      if (!f.has(log_mul))
        fail("{}: rope.scaling.type 'yarn' without '{}' (0.1 x mscale_all_dim, which DeepSeek's attention-scale "
             "correction needs) is not supported",
             f.name(), log_mul);
      const double mul = gguf_float_in(f, log_mul, 0.0, 100.0);
      const std::string amp = arch_key(c, "rope.scaling.yarn_attn_factor");
      if (f.has(amp) && gguf_float_in(f, amp, 0.0, 1e6) != 1.0)
        fail("{}: '{}' is {}; DeepSeek's YaRN is supported with the rotation amplitude 1 only", f.name(), amp,
             f.get_float(amp));
      yarn_attn = static_cast<float>(factor <= 1.0 ? 1.0 : 1.0 + mul * std::log(factor));
    }
  } else if (auto type = f.get_string_opt(arch_key(c, "rope.scaling.type"));
             type && *type != "none" && *type != "linear" && *type != "longrope")
    fail("{}: rope.scaling.type '{}' is not supported (Llama 3 scaling comes as the rope_freqs tensor)", f.name(),
         *type);
  // LongRoPE (llama.cpp's converter for Phi-3): two global factor tensors,
  // the original context and the attention factor as rope.scaling keys.
  const bool longrope = f.find_tensor(name(T::RopeFactorsLong)) || f.find_tensor(name(T::RopeFactorsShort));
  if (f.get_string_opt(arch_key(c, "rope.scaling.type")).value_or("") == "longrope" && !longrope)
    fail("{}: rope.scaling.type 'longrope' without the tensors '{}' and '{}'", f.name(), name(T::RopeFactorsLong),
         name(T::RopeFactorsShort));
  if (longrope) {
    if (!yarn.empty()) fail("{}: both LongRoPE factors and YaRN scaling are given", f.name());
    if (c.mla) fail("{}: LongRoPE factors are not supported with multi-head latent attention", f.name());
    for (T t : {T::RopeFactorsLong, T::RopeFactorsShort})
      if (!f.find_tensor(name(t))) fail("{}: LongRoPE needs both factor tensors; '{}' is missing", f.name(), name(t));
    const std::string orig_key = arch_key(c, "rope.scaling.original_context_length");
    if (!f.has(orig_key)) fail("{}: LongRoPE factors without '{}'", f.name(), orig_key);
    c.rope_long_context = gguf_int_in(f, orig_key, 2, int64_t{1} << 30);
    // transformers' default when the file gives none: sqrt(1 + ln(s) /
    // ln(original)), s = trained context / original context, 1 for s <= 1.
    const double s = static_cast<double>(c.n_ctx_train) / c.rope_long_context;
    const double dflt = s <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(s) / std::log(static_cast<double>(c.rope_long_context)));
    c.rope_amplitude = gguf_float_in(f, arch_key(c, "rope.scaling.attn_factor"), 0.0, 1e3, dflt);
  }
  // Linear scaling (positions divided by the factor) is the same as every
  // frequency divided by it.
  float linear_factor = 1.f;
  if (auto factor = f.get_float_opt(arch_key(c, "rope.scaling.factor")); factor && *factor != 1.0 && yarn.empty()) {
    if (longrope)
      fail("{}: both LongRoPE factors and '{}' {} are given", f.name(), arch_key(c, "rope.scaling.factor"), *factor);
    const std::string type = f.get_string_opt(arch_key(c, "rope.scaling.type")).value_or("linear");
    config_float_in(f.name(), arch_key(c, "rope.scaling.factor"), *factor, 0, 1e6);
    if (type != "linear") fail("{}: rope.scaling.factor {} (type {}) is not supported", f.name(), *factor, type);
    linear_factor = static_cast<float>(*factor);
  }
  c.attn_scale = 1.f / std::sqrt(static_cast<float>(c.head_dim)) * yarn_attn * yarn_attn;
  c.gpt_oss = fam.gpt_oss;
  c.layer_swa.assign(static_cast<size_t>(c.n_layer), false);
  c.rope_neox = fam.rope_neox;
  c.qk_norm = fam.qk_norm;
  c.sandwich_norm = fam.sandwich_norm;
  c.gelu = fam.gelu;
  if (fam.embd_scale_sqrt) c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
  c.rope_base_local = fam.rope_base_local > 0 ? fam.rope_base_local : c.rope_base;
  if (auto s = f.get_float_opt(arch_key(c, "attention.query_pre_attn_scalar"))) {
    config_float_in(f.name(), arch_key(c, "attention.query_pre_attn_scalar"), *s, 0, 1e9);
    c.attn_scale = static_cast<float>(1.0 / std::sqrt(*s));
  }
  const std::string window_key = arch_key(c, "attention.sliding_window");
  const bool has_window = f.has(window_key) && f.get_int(window_key) != 0;
  if (fam.swa != SwaPattern::None || (fam.window_all && has_window)) {
    if (fam.swa != SwaPattern::None || has_window) c.sliding_window = gguf_int_in(f, window_key, 1, int64_t{1} << 30);
    for (int l = 0; l < c.n_layer; ++l) {
      bool swa = fam.window_all;
      if (fam.swa == SwaPattern::EvenLayers) swa = l % 2 == 0;
      if (fam.swa == SwaPattern::FiveOfSix) swa = (l + 1) % 6 != 0;  // every sixth layer is global
      c.layer_swa[static_cast<size_t>(l)] = swa;
    }
  }
  auto softcap = [&](const char* key) -> float {
    const std::string k = arch_key(c, key);
    if (!f.has(k)) return 0.f;
    return gguf_float_in(f, k, 0.0, 1e6);
  };
  c.attn_softcap = softcap("attn_logit_softcapping");
  c.final_softcap = softcap("final_logit_softcapping");
  if (fam.moe) {
    c.n_expert = gguf_int_in(f, arch_key(c, "expert_count"), 1, 4096);
    c.n_expert_used = gguf_int_in(f, arch_key(c, "expert_used_count"), 1, 4096);
    c.n_ff_exp = gguf_int_in(f, arch_key(c, "expert_feed_forward_length"));
    if (c.n_expert_used > c.n_expert || c.n_expert > 4096)
      fail("{}: expert_used_count {} must be at most expert_count {} (at most 4096)", f.name(), c.n_expert_used,
           c.n_expert);
    // llama.cpp's default for deepseek2 and qwen2moe is no renormalisation, for the others renormalisation.
    c.expert_weights_norm = f.get_bool_opt(arch_key(c, "expert_weights_norm")).value_or(fam.expert_norm_default);
    if (fam.gated_shared_expert) {
      c.n_ff_shexp = gguf_int_in(f, arch_key(c, "expert_shared_feed_forward_length"));
      c.shared_gate = true;
    }
    if (c.mla) {
      const int64_t shared = f.has(arch_key(c, "expert_shared_count")) ? f.get_int(arch_key(c, "expert_shared_count")) : 0;
      if (shared < 0 || shared > 64) fail("{}: '{}' is {}", f.name(), arch_key(c, "expert_shared_count"), shared);
      c.n_ff_shexp = static_cast<int>(shared) * c.n_ff_exp;
      const int64_t lead = f.has(arch_key(c, "leading_dense_block_count"))
                               ? f.get_int(arch_key(c, "leading_dense_block_count"))
                               : 0;
      if (lead < 0 || lead > c.n_layer)
        fail("{}: '{}' is {}, it must be in [0, {}]", f.name(), arch_key(c, "leading_dense_block_count"), lead, c.n_layer);
      c.n_dense_lead = static_cast<int>(lead);
      const int64_t gating = f.has(arch_key(c, "expert_gating_func")) ? f.get_int(arch_key(c, "expert_gating_func")) : 1;
      if (gating != 1 && gating != 2)
        fail("{}: '{}' is {} (1: softmax, 2: sigmoid)", f.name(), arch_key(c, "expert_gating_func"), gating);
      c.gating_sigmoid = gating == 2;
      c.expert_weights_scale = gguf_float_in(f, arch_key(c, "expert_weights_scale"), 0.0, 1e6, 1.0);
      const int64_t groups = f.has(arch_key(c, "expert_group_count")) ? f.get_int(arch_key(c, "expert_group_count")) : 1;
      const int64_t used =
          f.has(arch_key(c, "expert_group_used_count")) ? f.get_int(arch_key(c, "expert_group_used_count")) : groups;
      c.n_group = static_cast<int>(std::max<int64_t>(groups, 1));
      c.topk_group = static_cast<int>(std::max<int64_t>(used, 1));
      if (groups > 1 && (c.n_expert % c.n_group != 0 || c.topk_group > c.n_group ||
                         c.n_expert_used > c.topk_group * (c.n_expert / c.n_group) ||
                         (c.gating_sigmoid && c.n_expert / c.n_group < 2)))
        fail("{}: {} experts in expert_group_count {} groups with expert_group_used_count {} cannot route the top {}",
             f.name(), c.n_expert, groups, used, c.n_expert_used);
    } else if (f.has(arch_key(c, "expert_shared_count")) && f.get_int(arch_key(c, "expert_shared_count")) != 0) {
      fail("{}: shared experts are not supported for {}", f.name(), c.arch_name);
    }
  }

  // Bounds that keep every index computation of the model's programs (at
  // most kDenseMaxRows rows per step) inside int.
  constexpr int64_t kMaxWidth = int64_t{1} << 21;  // x kDenseMaxRows = 2^30
  const int64_t qdim64 = int64_t{c.n_head} * c.head_dim;
  if (c.n_embd > kMaxWidth || c.n_ff > kMaxWidth || qdim64 > kMaxWidth)
    fail("{}: model widths ({} {}, {} {}, head_count x key_length {}) exceed the supported {}", f.name(),
         arch_key(c, "embedding_length"), c.n_embd, arch_key(c, "feed_forward_length"), c.n_ff, qdim64, kMaxWidth);
  const int qdim = static_cast<int>(qdim64), kvdim = c.n_head_kv * c.head_dim;
  const std::string embd = name(T::TokenEmbd);
  if (f.tensor(embd).shape.size() != 2 || f.tensor(embd).shape.back() > kMaxWidth)
    fail("{}: {} must be 2-D with at most {} rows", f.name(), embd, kMaxWidth);
  m->tok_embd_ = gguf_mat(f, embd, c.n_embd, f.tensor(embd).shape.back());
  c.n_vocab = static_cast<int>(m->tok_embd_.rows);
  m->output_ = f.find_tensor(name(T::Output)) ? gguf_mat(f, name(T::Output), c.n_embd, c.n_vocab) : m->tok_embd_;
  m->output_norm_ = gguf_vec(f, name(T::OutputNorm), c.n_embd);
  if (longrope) {
    if (f.find_tensor(name(T::RopeFreqs))) fail("{}: both rope_freqs and LongRoPE factors are given", f.name());
    m->rope_freqs_ = gguf_vec(f, name(T::RopeFactorsShort), c.rope_dim / 2);
    m->rope_freqs_long_ = gguf_vec(f, name(T::RopeFactorsLong), c.rope_dim / 2);
    for (T t : {T::RopeFactorsShort, T::RopeFactorsLong})
      for (float x : t == T::RopeFactorsShort ? m->rope_freqs_ : m->rope_freqs_long_)
        if (!(x > 0)) fail("{}: tensor '{}' holds a frequency factor {} (must be positive)", f.name(), name(t), x);
  } else if (f.find_tensor(name(T::RopeFreqs))) {
    if (!yarn.empty()) fail("{}: both rope_freqs and YaRN scaling are given", f.name());
    m->rope_freqs_ = gguf_vec(f, name(T::RopeFreqs), c.rope_dim / 2);
    for (float x : m->rope_freqs_)
      if (!(x > 0)) fail("{}: tensor '{}' holds a frequency factor {} (must be positive)", f.name(), name(T::RopeFreqs), x);
    if (linear_factor != 1.f) fail("{}: both rope_freqs and a linear rope.scaling.factor are given", f.name());
  } else if (!yarn.empty()) {
    m->rope_freqs_ = yarn;
  } else if (linear_factor != 1.f) {
    m->rope_freqs_.assign(static_cast<size_t>(c.rope_dim / 2), linear_factor);
  }
  m->layers_.resize(static_cast<size_t>(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    DenseLayer& L = m->layers_[static_cast<size_t>(l)];
    L.attn_norm = gguf_vec(f, name(T::AttnNorm, l), c.n_embd);
    L.ffn_norm = gguf_vec(f, name(fam.gpt_oss ? T::AttnPostNorm : T::FfnNorm, l), c.n_embd);
    if (c.mla) {
      m->load_mla_layer(f, l);
    } else if (fam.fused_qkv) {
      const MatView qkv = gguf_mat(f, name(T::AttnQkv, l), c.n_embd, qdim + 2 * kvdim);
      L.wq = row_range(qkv, 0, qdim);
      L.wk = row_range(qkv, qdim, kvdim);
      L.wv = row_range(qkv, qdim + kvdim, kvdim);
    } else {
      L.wq = gguf_mat(f, name(T::AttnQ, l), c.n_embd, qdim);
      L.wk = gguf_mat(f, name(T::AttnK, l), c.n_embd, kvdim);
      L.wv = gguf_mat(f, name(T::AttnV, l), c.n_embd, kvdim);
    }
    if (!c.mla) L.wo = gguf_mat(f, name(T::AttnOut, l), qdim, c.n_embd);
    if (c.layer_moe(l)) {
      L.router = gguf_mat(f, name(T::FfnGateInp, l), c.n_embd, c.n_expert);
      ExpertBank& B = L.experts;
      B.n_expert = c.n_expert;
      B.d_in = c.n_embd;
      B.d_ff = c.n_ff_exp;
      B.act = fam.gpt_oss ? ExpertAct::SwiGluOai : ExpertAct::SwiGLU;
      auto slabs = [&](T kind, int64_t cols, int64_t rows, std::vector<MatView>& out) {
        out = gguf_expert_slabs(f, name(kind, l), cols, rows, c.n_expert);
      };
      slabs(T::FfnGateExps, c.n_embd, c.n_ff_exp, B.gate);
      slabs(T::FfnUpExps, c.n_embd, c.n_ff_exp, B.up);
      slabs(T::FfnDownExps, c.n_ff_exp, c.n_embd, B.down);
      if (fam.gpt_oss) {
        // Router and expert biases: [n_expert], [n_expert][n_ff_exp] (GGUF
        // shape {n_ff_exp, n_expert}), [n_expert][n_embd].
        L.router_b = gguf_vec(f, name(T::FfnGateInp, l, "bias"), c.n_expert);
        auto bias2 = [&](T kind, int64_t per) { return gguf_values(f, name(kind, l, "bias"), {per, c.n_expert}); };
        B.gate_bias = bias2(T::FfnGateExps, c.n_ff_exp);
        B.up_bias = bias2(T::FfnUpExps, c.n_ff_exp);
        B.down_bias = bias2(T::FfnDownExps, c.n_embd);
      }
      if (c.mla && f.find_tensor(name(T::FfnExpProbsB, l, "bias")))
        L.router_bias = gguf_vec(f, name(T::FfnExpProbsB, l, "bias"), c.n_expert);
      if (c.n_ff_shexp > 0) {
        L.sh_gate = gguf_mat(f, name(T::FfnGateShexp, l), c.n_embd, c.n_ff_shexp);
        L.sh_up = gguf_mat(f, name(T::FfnUpShexp, l), c.n_embd, c.n_ff_shexp);
        L.sh_down = gguf_mat(f, name(T::FfnDownShexp, l), c.n_ff_shexp, c.n_embd);
      }
      if (c.shared_gate) L.sh_gate_inp = gguf_row_mat(f, name(T::FfnGateInpShexp, l), c.n_embd);
    } else if (fam.fused_gate_up) {
      const MatView gu = gguf_mat(f, name(T::FfnUp, l), c.n_embd, 2 * int64_t{c.n_ff});
      L.w_gate = row_range(gu, 0, c.n_ff);
      L.w_up = row_range(gu, c.n_ff, c.n_ff);
    } else {
      L.w_gate = gguf_mat(f, name(T::FfnGate, l), c.n_embd, c.n_ff);
      L.w_up = gguf_mat(f, name(T::FfnUp, l), c.n_embd, c.n_ff);
    }
    if (!c.layer_moe(l)) L.w_down = gguf_mat(f, name(T::FfnDown, l), c.n_ff, c.n_embd);
    if (c.mla) continue;
    // q/k/v biases: required where the family has them, read where a file
    // of another family carries them (some llama conversions do).
    for (auto [t, dst, n] : {std::tuple{T::AttnQ, &L.bq, qdim}, std::tuple{T::AttnK, &L.bk, kvdim},
                             std::tuple{T::AttnV, &L.bv, kvdim}}) {
      const std::string bn = name(fam.fused_qkv ? T::AttnQkv : t, l, "bias");
      if (fam.fused_qkv) {
        if (f.find_tensor(bn)) fail("{}: tensor '{}': fused q/k/v biases are not supported", f.name(), bn);
        continue;
      }
      if (fam.qkv_bias || f.find_tensor(bn)) *dst = gguf_vec(f, bn, n);
    }
    if (fam.gpt_oss) {
      L.bo = gguf_vec(f, name(T::AttnOut, l, "bias"), c.n_embd);
      L.sinks = gguf_vec(f, name(T::AttnSinks, l), c.n_head);
    } else if (f.find_tensor(name(T::AttnOut, l, "bias")))
      fail("{}: tensor '{}': an output-projection bias is not supported", f.name(), name(T::AttnOut, l, "bias"));
    if (c.qk_norm) {
      L.q_norm = gguf_vec(f, name(T::AttnQNorm, l), c.head_dim);
      L.k_norm = gguf_vec(f, name(T::AttnKNorm, l), c.head_dim);
    }
    if (c.sandwich_norm) {
      L.post_attn_norm = gguf_vec(f, name(T::AttnPostNorm, l), c.n_embd);
      L.post_ffn_norm = gguf_vec(f, name(T::FfnPostNorm, l), c.n_embd);
    }
  }
  if (weights) m->dequantize_all_to_f32();
  return m;
}

// One MLA layer's attention tensors (deepseek2). The key and value
// expansions come as the fused attn_kv_b (per head: nope key rows, then v
// value rows; the rows are gathered into one matrix each, in the file's
// format) or as attn_k_b (each head's block transposed; transposed back, in
// f32) and attn_v_b (a view).
void DenseModel::load_mla_layer(const GGUFFile& f, int l) {
  using T = DenseTensor;
  const DenseConfig& c = cfg_;
  DenseLayer& L = layers_[static_cast<size_t>(l)];
  auto name = [l](T t) { return dense_tensor_name(t, l); };
  const int64_t nh = c.n_head, Dk = c.head_dim, kvl = c.kv_lora_rank, nope = c.qk_nope, Dv = c.v_head_dim;
  if (c.q_lora_rank > 0) {
    L.q_a = gguf_mat(f, name(T::AttnQA), c.n_embd, c.q_lora_rank);
    L.q_a_norm = gguf_vec(f, name(T::AttnQANorm), c.q_lora_rank);
    L.q_b = gguf_mat(f, name(T::AttnQB), c.q_lora_rank, nh * Dk);
  } else {
    L.q_b = gguf_mat(f, name(T::AttnQ), c.n_embd, nh * Dk);
  }
  L.kv_a = gguf_mat(f, name(T::AttnKvAMqa), c.n_embd, kvl + c.qk_rope);
  L.kv_a_norm = gguf_vec(f, name(T::AttnKvANorm), kvl);
  L.wo = gguf_mat(f, name(T::AttnOut), nh * Dv, c.n_embd);
  auto tensor3 = [&](T kind, int64_t d0, int64_t d1) -> const GGUFTensorInfo& {
    const GGUFTensorInfo& t = f.tensor(name(kind));
    if (t.shape.size() != 3 || t.shape[0] != d0 || t.shape[1] != d1 || t.shape[2] != nh)
      fail("{}: tensor '{}' has shape [{}], expected [{}, {}, {}]", f.name(), name(kind), fmt::join(t.shape, ", "), d0,
           d1, nh);
    return t;
  };
  if (f.find_tensor(name(T::AttnKB))) {
    std::vector<float> k = gguf_mla_k_b(f, name(T::AttnKB), nh, nope, kvl);
    const GGUFTensorInfo& vb = tensor3(T::AttnVB, kvl, Dv);
    L.kv_b_k = MatView{};
    L.kv_b_k.type = DType::F32;
    L.kv_b_k.rows = nh * nope;
    L.kv_b_k.cols = kvl;
    L.kv_b_k.row_bytes = row_bytes(DType::F32, kvl);
    L.kv_b_k.data = reinterpret_cast<const uint8_t*>(k.data());
    owned_.push_back(std::move(k));
    L.kv_b_v.type = vb.type;
    L.kv_b_v.rows = nh * Dv;
    L.kv_b_v.cols = kvl;
    L.kv_b_v.row_bytes = row_bytes(vb.type, kvl);
    L.kv_b_v.data = vb.data;
  } else {
    const MatView kvb = gguf_mat(f, name(T::AttnKvB), kvl, nh * (nope + Dv));
    for (auto [dst, first, n] : {std::tuple{&L.kv_b_k, int64_t{0}, nope}, std::tuple{&L.kv_b_v, nope, Dv}}) {
      std::vector<uint8_t> bytes(static_cast<size_t>(nh * n) * kvb.row_bytes);
      for (int64_t h = 0; h < nh; ++h)
        std::memcpy(bytes.data() + static_cast<size_t>(h * n) * kvb.row_bytes, kvb.row(h * (nope + Dv) + first),
                    static_cast<size_t>(n) * kvb.row_bytes);
      *dst = kvb;
      dst->rows = nh * n;
      dst->data = bytes.data();
      owned_bytes_.push_back(std::move(bytes));
    }
  }
}

void DenseModel::dequantize_all_to_f32() {
  // A tied output matrix is the embedding: it is converted once and both
  // views keep pointing at the same storage.
  const bool tied = output_.data == tok_embd_.data;
  auto convert = [this](MatView& m) {
    if (m.type == DType::F32) return;
    std::vector<float> out(static_cast<size_t>(m.rows) * static_cast<size_t>(m.cols));
    for (int64_t j = 0; j < m.rows; ++j) dequantize_row(m, j, out.data() + static_cast<size_t>(j) * m.cols);
    m.type = DType::F32;
    m.row_bytes = row_bytes(DType::F32, m.cols);
    m.data = reinterpret_cast<const uint8_t*>(out.data());
    owned_.push_back(std::move(out));  // moving a vector keeps its buffer where it is
  };
  convert(tok_embd_);
  if (tied)
    output_ = tok_embd_;
  else
    convert(output_);
  for (DenseLayer& L : layers_) {
    for (MatView* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.router, &L.q_a, &L.q_b, &L.kv_a,
                       &L.kv_b_k, &L.kv_b_v, &L.sh_gate, &L.sh_up, &L.sh_down, &L.sh_gate_inp})
      if (m->data) convert(*m);
    for (auto* v : {&L.experts.gate, &L.experts.up, &L.experts.down})
      for (MatView& m : *v) convert(m);
  }
}

size_t DenseModel::weight_bytes() const {
  auto b = [](const MatView& m) { return m.row_bytes * static_cast<size_t>(m.rows); };
  size_t total = b(output_);
  for (const auto& L : layers_) {
    total += b(L.wq) + b(L.wk) + b(L.wv) + b(L.wo) + b(L.w_gate) + b(L.w_up) + b(L.w_down) + b(L.router);
    total += b(L.q_a) + b(L.q_b) + b(L.kv_a) + b(L.kv_b_k) + b(L.kv_b_v) + b(L.sh_gate) + b(L.sh_up) + b(L.sh_down) + b(L.sh_gate_inp);
    // The routed experts a token selects: top_k of the layer's.
    for (int e = 0; e < cfg_.n_expert_used && e < L.experts.n_expert; ++e)
      total += L.experts.glu_bytes(e) + L.experts.down_bytes(e);
  }
  return total;
}

}  // namespace megakern
