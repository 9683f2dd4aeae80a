// Kimi Linear on the Kimi K3 architecture (model/kimi.h, model/kimi_config.h).
//
// Kimi Linear is the same KDA + NoPE MLA hybrid without Kimi K3's additions:
// a plain residual stream (no attention residuals), KDA's forget gate
// a = -exp(A_log) * softplus(g + dt_bias) (no lower bound), a low-rank KDA
// output gate (g_a, g_b), MLA without an output gate (and, in the released
// configs, without a query rank), SwiGLU MLPs, and DeepSeek-V3's MoE on the
// hidden state: sigmoid router scores, top-k of score + bias, the selected
// scores renormalised and scaled by routed_scaling_factor, shared experts,
// first_k_dense_replace dense layers. KimiConfig's options select these.
//
// GGUF (general.architecture kimi-linear), as llama.cpp's converter writes it:
//   keys  block_count, embedding_length, feed_forward_length,
//         attention.head_count (MLA and KDA heads alike), attention.head_count_kv
//         (an array: 1 for an MLA layer, 0 for a KDA layer), attention.layer_norm_rms_epsilon,
//         attention.q_lora_rank (absent without a query rank), attention.kv_lora_rank,
//         attention.key_length_mla (nope + rope), attention.value_length_mla,
//         rope.dimension_count (the shared extra key dims), ssm.conv_kernel, kda.head_dim,
//         expert_count, expert_used_count, expert_feed_forward_length, expert_shared_count,
//         leading_dense_block_count, expert_weights_scale.
//   It writes no forget- or output-gate rank (read from ssm_f_a / ssm_g_a), no
//   router function (sigmoid), no renormalisation flag (read from
//   expert_weights_norm when present, else on, as the released configs), no
//   expert groups (refused when present and other than 1).
//   tensors  token_embd, output, output_norm; per layer attn_norm, ffn_norm;
//   KDA: attn_q / attn_k / attn_v, ssm_conv1d_{q,k,v} {K, 1, n d, 1}, ssm_f_a,
//        ssm_f_b, ssm_beta, ssm_g_a, ssm_g_b, ssm_a (-exp(A_log), n values),
//        ssm_dt.bias [n d], ssm_norm [d], attn_output;
//   MLA: attn_q (or attn_q_a, attn_q_a_norm, attn_q_b), attn_kv_a_mqa,
//        attn_kv_a_norm, attn_k_b (per head transposed), attn_v_b, attn_output;
//   MLP: ffn_gate / ffn_up / ffn_down (dense layers), or ffn_gate_inp,
//        exp_probs_b.bias, ffn_{gate,up,down}_exps, ffn_{gate,up,down}_shexp.
// A Hugging Face directory (model_type kimi_linear) is converted to that
// image first (the converter's renames and transforms), so the two forms are
// one code path.
#include <cmath>
#include <cstring>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config_value.h"
#include "io/gguf.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/dense_families.h"
#include "model/gguf_weights.h"
#include "model/kimi.h"
#include "model/kimi_builder.h"

namespace megakern {

namespace {

using T = DenseTensor;
constexpr const char* kArch = "kimi-linear";

std::string tname(T t, int l = 0, std::string_view suffix = "weight") { return dense_tensor_name(t, l, suffix); }
std::string key(const char* k) { return fmt::format("{}.{}", kArch, k); }

// The GGUF kinds of a layer: per layer type (KDA or MLA attention, dense or
// MoE MLP) with their checkpoint names ("{}" the layer). One table serves the
// checkpoint conversion; the loader asks dense_tensor_name for the GGUF names.
struct Entry {
  T kind;
  const char* suffix;  // GGUF suffix ("" none)
  const char* hf;      // checkpoint name pattern
};
constexpr Entry kKda[] = {
    {T::AttnQ, "weight", "model.layers.{}.self_attn.q_proj.weight"},
    {T::AttnK, "weight", "model.layers.{}.self_attn.k_proj.weight"},
    {T::AttnV, "weight", "model.layers.{}.self_attn.v_proj.weight"},
    {T::SsmConv1dQ, "weight", "model.layers.{}.self_attn.q_conv1d.weight"},
    {T::SsmConv1dK, "weight", "model.layers.{}.self_attn.k_conv1d.weight"},
    {T::SsmConv1dV, "weight", "model.layers.{}.self_attn.v_conv1d.weight"},
    {T::SsmFA, "weight", "model.layers.{}.self_attn.f_a_proj.weight"},
    {T::SsmFB, "weight", "model.layers.{}.self_attn.f_b_proj.weight"},
    {T::SsmBeta, "weight", "model.layers.{}.self_attn.b_proj.weight"},
    {T::SsmGA, "weight", "model.layers.{}.self_attn.g_a_proj.weight"},
    {T::SsmGB, "weight", "model.layers.{}.self_attn.g_b_proj.weight"},
    {T::SsmA, "", "model.layers.{}.self_attn.A_log"},
    {T::SsmDt, "bias", "model.layers.{}.self_attn.dt_bias"},
    {T::SsmNorm, "weight", "model.layers.{}.self_attn.o_norm.weight"},
    {T::AttnOut, "weight", "model.layers.{}.self_attn.o_proj.weight"},
};
constexpr Entry kMla[] = {
    {T::AttnKvAMqa, "weight", "model.layers.{}.self_attn.kv_a_proj_with_mqa.weight"},
    {T::AttnKvANorm, "weight", "model.layers.{}.self_attn.kv_a_layernorm.weight"},
    {T::AttnKvB, "weight", "model.layers.{}.self_attn.kv_b_proj.weight"},  // split into attn_k_b / attn_v_b
    {T::AttnOut, "weight", "model.layers.{}.self_attn.o_proj.weight"},
};
constexpr Entry kMlaQ[] = {{T::AttnQ, "weight", "model.layers.{}.self_attn.q_proj.weight"}};
constexpr Entry kMlaQLora[] = {
    {T::AttnQA, "weight", "model.layers.{}.self_attn.q_a_proj.weight"},
    {T::AttnQANorm, "weight", "model.layers.{}.self_attn.q_a_layernorm.weight"},
    {T::AttnQB, "weight", "model.layers.{}.self_attn.q_b_proj.weight"},
};
constexpr Entry kDense[] = {
    {T::FfnGate, "weight", "model.layers.{}.mlp.gate_proj.weight"},
    {T::FfnUp, "weight", "model.layers.{}.mlp.up_proj.weight"},
    {T::FfnDown, "weight", "model.layers.{}.mlp.down_proj.weight"},
};
constexpr Entry kMoe[] = {
    {T::FfnGateInp, "weight", "model.layers.{}.block_sparse_moe.gate.weight"},
    {T::FfnExpProbsB, "bias", "model.layers.{}.block_sparse_moe.gate.e_score_correction_bias"},
    {T::FfnGateExps, "weight", "model.layers.{}.block_sparse_moe.experts.{}.w1.weight"},
    {T::FfnDownExps, "weight", "model.layers.{}.block_sparse_moe.experts.{}.w2.weight"},
    {T::FfnUpExps, "weight", "model.layers.{}.block_sparse_moe.experts.{}.w3.weight"},
    {T::FfnGateShexp, "weight", "model.layers.{}.block_sparse_moe.shared_experts.gate_proj.weight"},
    {T::FfnUpShexp, "weight", "model.layers.{}.block_sparse_moe.shared_experts.up_proj.weight"},
    {T::FfnDownShexp, "weight", "model.layers.{}.block_sparse_moe.shared_experts.down_proj.weight"},
};
constexpr Entry kNorms[] = {
    {T::AttnNorm, "weight", "model.layers.{}.input_layernorm.weight"},
    {T::FfnNorm, "weight", "model.layers.{}.post_attention_layernorm.weight"},
};

// ---------------------------------------------------------------------------
// Hyperparameters.

KimiConfig config_from_gguf(const GGUFFile& f) {
  KimiConfig c;
  c.name = f.get_string_opt("general.name").value_or(f.name());
  c.n_layer = gguf_int_in(f, key("block_count"), 1, kMaxConfigLayers);
  c.hidden = gguf_int_in(f, key("embedding_length"));
  c.rms_eps = gguf_float_in(f, key("attention.layer_norm_rms_epsilon"), 0, 1);
  c.kda_n_head = c.mla_n_head = gguf_int_in(f, key("attention.head_count"));
  // The layer pattern: head_count_kv per layer, nonzero for the MLA layers.
  const std::string kv = key("attention.head_count_kv");
  const GGUFValue* v = f.find(kv);
  if (!v) fail("{}: key '{}' is missing (the per-layer array of MLA layers)", f.name(), kv);
  if (v->type != GGUFValueType::ARRAY)
    fail("{}: key '{}' must be an array with one entry per layer (0 for a KDA layer)", f.name(), kv);
  const std::vector<int64_t>& kvh = f.get_int_array(kv);
  if (kvh.size() != static_cast<size_t>(c.n_layer))
    fail("{}: key '{}' has {} entries for {} layers", f.name(), kv, kvh.size(), c.n_layer);
  for (int l = 0; l < c.n_layer; ++l) {
    const int64_t h = kvh[static_cast<size_t>(l)];
    if (h < 0) fail("{}: key '{}'[{}] is {}", f.name(), kv, l, h);
    if (h > 0) c.mla_layers.push_back(l);
  }
  if (c.mla_layers.empty()) c.mla_layers.push_back(-1);  // no MLA layer: refused by validate below
  c.conv_kernel = gguf_int_in(f, key("ssm.conv_kernel"), 1, 64);
  c.kda_head_dim = gguf_int_in(f, key("kda.head_dim"));
  if (f.has(key("kda.gate_lower_bound")))
    fail("{}: {} is not supported for Kimi Linear (its forget gate is -exp(A_log) softplus(g + dt_bias))", f.name(),
         key("kda.gate_lower_bound"));
  c.q_lora_rank = f.has(key("attention.q_lora_rank")) ? gguf_int_in(f, key("attention.q_lora_rank")) : 0;
  c.kv_lora_rank = gguf_int_in(f, key("attention.kv_lora_rank"));
  c.qk_extra_dim = gguf_int_in(f, key("rope.dimension_count"), 0);
  const int kmla = gguf_int_in(f, key("attention.key_length_mla"));
  if (kmla <= c.qk_extra_dim)
    fail("{}: {} {} must exceed {} {}", f.name(), key("attention.key_length_mla"), kmla, key("rope.dimension_count"),
         c.qk_extra_dim);
  c.qk_nope_dim = kmla - c.qk_extra_dim;
  c.v_head_dim = gguf_int_in(f, key("attention.value_length_mla"));
  if (f.has(key("attention.key_length")) && f.get_int(key("attention.key_length")) != c.kv_lora_rank + c.qk_extra_dim)
    fail("{}: {} {} is not {} + {} ({} + {})", f.name(), key("attention.key_length"),
         f.get_int(key("attention.key_length")), key("attention.kv_lora_rank"), key("rope.dimension_count"),
         c.kv_lora_rank, c.qk_extra_dim);
  c.n_dense_layers = f.has(key("leading_dense_block_count"))
                         ? gguf_int_in(f, key("leading_dense_block_count"), 0, c.n_layer)
                         : 0;
  c.dense_ff = c.n_dense_layers > 0 ? gguf_int_in(f, key("feed_forward_length")) : 0;
  if (c.n_dense_layers < c.n_layer) {
    c.n_expert = gguf_int_in(f, key("expert_count"), 1, 1 << 16);
    c.n_expert_used = gguf_int_in(f, key("expert_used_count"), 1, c.n_expert);
    c.expert_ff = gguf_int_in(f, key("expert_feed_forward_length"));
    const int shared = gguf_int_in(f, key("expert_shared_count"), 0, 1 << 10);
    if (shared == 0) fail("{}: {} 0 is not supported (Kimi Linear has shared experts)", f.name(), key("expert_shared_count"));
    c.shared_ff = shared * c.expert_ff;
    c.routed_scale = gguf_float_in(f, key("expert_weights_scale"), 0, 1e6, 1.0);
    c.expert_norm = f.get_bool_opt(key("expert_weights_norm")).value_or(true);
    if (f.has(key("expert_gating_func")) && f.get_int(key("expert_gating_func")) != 2)
      fail("{}: {} {} is not supported (Kimi Linear's router is sigmoid, 2)", f.name(), key("expert_gating_func"),
           f.get_int(key("expert_gating_func")));
    for (const char* k : {"expert_group_count", "expert_group_used_count"})
      if (f.has(key(k)) && f.get_int(key(k)) != 1)
        fail("{}: {} {} is not supported (group-limited routing; only 1)", f.name(), key(k), f.get_int(key(k)));
  }
  // Kimi Linear's options on the Kimi K3 architecture.
  c.attn_res = false;
  c.kda_softplus_gate = true;
  c.mla_gate = false;
  c.silu = true;
  c.moe_latent = 0;
  c.vocab = 0;  // from token_embd
  return c;
}

// The first KDA layer's row count of a low-rank tensor [rank][H].
int rank_of(const GGUFFile& f, const KimiConfig& c, T kind) {
  for (int l = 0; l < c.n_layer; ++l) {
    if (c.is_mla(l)) continue;
    const GGUFTensorInfo& t = f.tensor(tname(kind, l));
    if (t.shape.size() != 2 || t.shape[0] != c.hidden)
      fail("{}: tensor '{}' has shape [{}], expected [{}, rank]", f.name(), tname(kind, l), fmt::join(t.shape, ", "),
           c.hidden);
    return static_cast<int>(config_int_in(f.name(), tname(kind, l) + " rows", t.shape[1], 1, kMaxConfigDim));
  }
  return 1;  // no KDA layer
}

// Rows of several matrices of one width as one matrix: copied in their
// format when they share it, else in f32.
MatView stack_rows(KimiBuilder& B, const std::vector<MatView>& parts) {
  int64_t rows = 0;
  bool same = true;
  for (const MatView& p : parts) {
    rows += p.rows;
    same &= p.type == parts[0].type;
  }
  const DType t = same ? parts[0].type : DType::F32;
  MatView m = B.alloc(t, rows, parts[0].cols);
  uint8_t* dst = const_cast<uint8_t*>(m.data);
  for (const MatView& p : parts) {
    if (same) {
      std::memcpy(dst, p.data, p.row_bytes * static_cast<size_t>(p.rows));
    } else {
      for (int64_t j = 0; j < p.rows; ++j)
        dequantize_row(p, j, reinterpret_cast<float*>(dst + static_cast<size_t>(j) * m.row_bytes));
    }
    dst += m.row_bytes * static_cast<size_t>(p.rows);
  }
  return m;
}

// A small tensor of n values in any GGUF shape of that many elements (the
// converter keeps the checkpoint's shape, e.g. A_log's [1, 1, n, 1]).
std::vector<float> gguf_any_shape(const GGUFFile& f, const std::string& name, int64_t n) {
  const GGUFTensorInfo& t = f.tensor(name);
  if (static_cast<int64_t>(t.n_elements) != n)
    fail("{}: tensor '{}' has shape [{}], expected {} values", f.name(), name, fmt::join(t.shape, ", "), n);
  return gguf_values(f, name, t.shape);
}

// A depthwise conv {K, 1, C, 1} (the converter's shape) or {K, C}: [C][K].
std::vector<float> gguf_conv(const GGUFFile& f, const std::string& name, int64_t K, int64_t C) {
  const GGUFTensorInfo& t = f.tensor(name);
  const std::vector<int64_t> four = {K, 1, C, 1}, two = {K, C};
  if (t.shape != four && t.shape != two)
    fail("{}: tensor '{}' has shape [{}], expected [{}]", f.name(), name, fmt::join(t.shape, ", "), fmt::join(four, ", "));
  return gguf_values(f, name, t.shape);
}

}  // namespace

std::unique_ptr<KimiModel> KimiModel::load_gguf(std::unique_ptr<GGUFFile> file) {
  const std::string arch = file->get_string("general.architecture");
  if (arch != kArch) fail("{}: architecture '{}' is not a Kimi Linear file ({})", file->name(), arch, kArch);
  std::unique_ptr<KimiModel> m(new KimiModel());
  m->gguf_ = std::move(file);
  const GGUFFile& f = *m->gguf_;
  KimiConfig& c = m->cfg_;
  c = config_from_gguf(f);
  const int64_t H = c.hidden;
  c.vocab = gguf_vocab_rows(f, tname(T::TokenEmbd), H);
  c.kda_gate_rank = rank_of(f, c, T::SsmFA);
  c.kda_out_gate_rank = rank_of(f, c, T::SsmGA);
  c.validate();

  KimiBuilder B{*m};
  const int64_t nh = c.kda_n_head, D = c.kda_head_dim, KD = c.kda_key_dim(), K = c.conv_kernel;
  m->tok_embd_ = gguf_mat(f, tname(T::TokenEmbd), H, c.vocab);
  m->lm_head_ = gguf_mat(f, tname(T::Output), H, c.vocab);
  m->final_norm_ = gguf_vec(f, tname(T::OutputNorm), H);
  int n_mla = 0, n_kda = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    KimiLayer L;
    auto mat = [&](T t, int64_t cols, int64_t rows) { return gguf_mat(f, tname(t, l), cols, rows); };
    L.mla = c.is_mla(l);
    L.dense = c.is_dense(l);
    L.cache_index = L.mla ? n_mla++ : n_kda++;
    L.attn_norm = gguf_vec(f, tname(T::AttnNorm, l), H);
    L.mlp_norm = gguf_vec(f, tname(T::FfnNorm, l), H);
    if (L.mla) {
      const int64_t mh = c.mla_n_head, Dk = c.mla_k_dim(), kvl = c.kv_lora_rank;
      if (c.q_lora_rank > 0) {
        L.q_a = mat(T::AttnQA, H, c.q_lora_rank);
        L.q_a_norm = gguf_vec(f, tname(T::AttnQANorm, l), c.q_lora_rank);
        L.q_b = mat(T::AttnQB, c.q_lora_rank, mh * Dk);
      } else {
        L.q_b = mat(T::AttnQ, H, mh * Dk);
      }
      L.kv_a = mat(T::AttnKvAMqa, H, kvl + c.qk_extra_dim);
      L.kv_a_norm = gguf_vec(f, tname(T::AttnKvANorm, l), kvl);
      const std::vector<float> kb = gguf_mla_k_b(f, tname(T::AttnKB, l), mh, c.qk_nope_dim, kvl);
      L.kv_b_k = B.from_f32(DType::F32, mh * c.qk_nope_dim, kvl, kb.data());
      const std::vector<MatView> vb = gguf_expert_slabs(f, tname(T::AttnVB, l), kvl, c.v_head_dim, mh);
      L.kv_b_v = vb[0];
      L.kv_b_v.rows = mh * c.v_head_dim;
      L.o_proj = mat(T::AttnOut, mh * c.v_head_dim, H);
    } else {
      L.kda_in = stack_rows(B, {mat(T::AttnQ, H, KD), mat(T::AttnK, H, KD), mat(T::AttnV, H, KD), mat(T::SsmBeta, H, nh)});
      L.f_a = mat(T::SsmFA, H, c.kda_gate_rank);
      L.f_b = mat(T::SsmFB, c.kda_gate_rank, KD);
      L.g_a = mat(T::SsmGA, H, c.kda_out_gate_rank);
      L.g_b = mat(T::SsmGB, c.kda_out_gate_rank, KD);
      for (T t : {T::SsmConv1dQ, T::SsmConv1dK, T::SsmConv1dV}) {
        const std::vector<float> w = gguf_conv(f, tname(t, l), K, KD);
        L.conv.insert(L.conv.end(), w.begin(), w.end());
      }
      const std::string a_name = tname(T::SsmA, l, "");
      const std::vector<float> A = gguf_any_shape(f, a_name, nh);
      for (size_t h = 0; h < A.size(); ++h) {
        if (!(A[h] < 0.f))
          fail("{}: tensor '{}' holds {} at index {}; it stores A = -exp(A_log), which is negative", f.name(), a_name,
               A[h], h);
        L.a_log.push_back(std::log(-A[h]));
      }
      L.dt_bias = gguf_vec(f, tname(T::SsmDt, l, "bias"), KD);
      L.o_norm = gguf_vec(f, tname(T::SsmNorm, l), D);
      L.o_proj = mat(T::AttnOut, KD, H);
    }
    if (L.dense) {
      L.mlp_gate = mat(T::FfnGate, H, c.dense_ff);
      L.mlp_up = mat(T::FfnUp, H, c.dense_ff);
      L.mlp_down = mat(T::FfnDown, c.dense_ff, H);
    } else {
      const int64_t E = c.n_expert, F = c.expert_ff;
      L.router = mat(T::FfnGateInp, H, E);
      L.router_bias = gguf_vec(f, tname(T::FfnExpProbsB, l, "bias"), E);
      ExpertBank& eb = L.experts;
      eb.n_expert = c.n_expert;
      eb.d_in = c.hidden;
      eb.d_ff = c.expert_ff;
      eb.act = ExpertAct::SwiGLU;
      eb.gate = gguf_expert_slabs(f, tname(T::FfnGateExps, l), H, F, E);
      eb.up = gguf_expert_slabs(f, tname(T::FfnUpExps, l), H, F, E);
      eb.down = gguf_expert_slabs(f, tname(T::FfnDownExps, l), F, H, E);
      L.mlp_gate = mat(T::FfnGateShexp, H, c.shared_ff);
      L.mlp_up = mat(T::FfnUpShexp, H, c.shared_ff);
      L.mlp_down = mat(T::FfnDownShexp, c.shared_ff, H);
    }
    m->layers_.push_back(std::move(L));
  }
  return m;
}

// ---------------------------------------------------------------------------
// A checkpoint directory, as the GGUF image llama.cpp's converter writes.

namespace {

class Converter {
 public:
  explicit Converter(const SafetensorsModel& st) : st_(st) {}

  const SafetensorsTensor& get(const std::string& name) {
    const SafetensorsTensor* t = st_.find(name);
    if (!t) fail("{}: tensor '{}' is missing", st_.path(), name);
    if (!safetensors_float_format(t->dtype))
      fail("{}: tensor '{}' has dtype {}; expected F32, F16 or BF16", st_.path(), name, t->dtype);
    return *t;
  }
  // The tensor as it is, its shape reversed (GGUF order).
  void keep(const std::string& gguf, const std::string& hf) {
    const SafetensorsTensor& t = get(hf);
    std::vector<int64_t> shape(t.shape.rbegin(), t.shape.rend());
    w_.add_tensor(gguf, *safetensors_float_format(t.dtype), shape, t.data, t.numel() * t.elem_bytes);
    names_[gguf] = hf;
  }
  // A depthwise conv [C, 1, K] or [C, K] as {K, 1, C, 1}.
  void conv(const std::string& gguf, const std::string& hf) {
    const SafetensorsTensor& t = get(hf);
    const bool ok = (t.shape.size() == 3 && t.shape[1] == 1) || t.shape.size() == 2;
    if (!ok) fail("{}: tensor '{}' has shape [{}], expected [channels, 1, taps]", st_.path(), hf, fmt::join(t.shape, ", "));
    w_.add_tensor(gguf, *safetensors_float_format(t.dtype), {t.shape.back(), 1, t.shape[0], 1}, t.data,
                  t.numel() * t.elem_bytes);
    names_[gguf] = hf;
  }
  // A_log as A = -exp(A_log) in f32, shape kept.
  void a_from_log(const std::string& gguf, const std::string& hf) {
    const SafetensorsTensor& t = get(hf);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    dtype_traits(*safetensors_float_format(t.dtype)).dequantize(t.data, v.data(), t.numel());
    for (float& x : v) x = static_cast<float>(-std::exp(static_cast<double>(x)));
    std::vector<int64_t> shape(t.shape.rbegin(), t.shape.rend());
    w_.add_tensor(gguf, DType::F32, shape, v.data(), v.size() * 4);
    names_[gguf] = hf;
  }
  // kv_b [n_head * (nope + v)][kvl] as attn_k_b {nope, kvl, n_head} (each
  // head's key block transposed) and attn_v_b {kvl, v, n_head}, in its format.
  void kv_b(int l, const std::string& hf, int64_t nh, int64_t nope, int64_t vd, int64_t kvl) {
    const SafetensorsTensor& t = get(hf);
    if (t.shape != std::vector<int64_t>{nh * (nope + vd), kvl})
      fail("{}: tensor '{}' has shape [{}], expected [{}, {}]", st_.path(), hf, fmt::join(t.shape, ", "),
           nh * (nope + vd), kvl);
    const size_t eb = t.elem_bytes;
    std::vector<uint8_t> k(static_cast<size_t>(nh * nope * kvl) * eb), v(static_cast<size_t>(nh * vd * kvl) * eb);
    for (int64_t h = 0; h < nh; ++h) {
      const uint8_t* head = t.data + static_cast<size_t>(h * (nope + vd) * kvl) * eb;
      for (int64_t i = 0; i < nope; ++i)  // src row h*(nope+vd)+i, column j -> k[h][j][i]
        for (int64_t j = 0; j < kvl; ++j)
          std::memcpy(&k[static_cast<size_t>((h * kvl + j) * nope + i) * eb], head + static_cast<size_t>(i * kvl + j) * eb, eb);
      std::memcpy(&v[static_cast<size_t>(h * vd * kvl) * eb], head + static_cast<size_t>(nope * kvl) * eb,
                  static_cast<size_t>(vd * kvl) * eb);
    }
    const DType dt = *safetensors_float_format(t.dtype);
    w_.add_tensor(tname(T::AttnKB, l), dt, {nope, kvl, nh}, k.data(), k.size());
    w_.add_tensor(tname(T::AttnVB, l), dt, {kvl, vd, nh}, v.data(), v.size());
    names_[tname(T::AttnKB, l)] = names_[tname(T::AttnVB, l)] = hf;
  }
  // One matrix per expert, stacked {cols, rows, n_expert}.
  void experts(const std::string& gguf, const std::string& pattern, int l, int64_t n_expert) {
    std::vector<uint8_t> bytes;
    std::vector<int64_t> shape;
    std::optional<DType> dt;
    for (int64_t e = 0; e < n_expert; ++e) {
      const std::string hf = fmt::format(fmt::runtime(pattern), l, e);
      const SafetensorsTensor& t = get(hf);
      if (e == 0) {
        shape = t.shape;
        dt = safetensors_float_format(t.dtype);
      } else if (t.shape != shape || safetensors_float_format(t.dtype) != dt) {
        fail("{}: tensor '{}' has shape [{}] and dtype {}, unlike expert 0's [{}]", st_.path(), hf,
             fmt::join(t.shape, ", "), t.dtype, fmt::join(shape, ", "));
      }
      if (t.shape.size() != 2) fail("{}: tensor '{}' must be a matrix", st_.path(), hf);
      bytes.insert(bytes.end(), t.data, t.data + t.numel() * t.elem_bytes);
    }
    w_.add_tensor(gguf, *dt, {shape[1], shape[0], n_expert}, bytes.data(), bytes.size());
    names_[gguf] = fmt::format(fmt::runtime(pattern), l, "e");
  }

  GGUFWriter& writer() { return w_; }
  // The checkpoint name a GGUF tensor came from.
  const std::map<std::string, std::string>& names() const { return names_; }

 private:
  const SafetensorsModel& st_;
  GGUFWriter w_;
  std::map<std::string, std::string> names_;
};

int positive(const HFConfig& hf, const nlohmann::json& j, const char* where, const char* k) {
  if (!j.contains(k) || !j[k].is_number_integer())
    fail("{}: '{}{}' is missing or not an integer", hf.name(), where, k);
  const int64_t v = j[k].get<int64_t>();
  return static_cast<int>(config_int_in(hf.name(), std::string(where) + k, v, 1, kMaxConfigDim));
}

// The 1-based layer list `k` of linear_attn_config.
std::vector<int> layer_list(const HFConfig& hf, const nlohmann::json& lac, const char* k, int n_layer) {
  if (!lac.contains(k) || !lac[k].is_array()) fail("{}: 'linear_attn_config.{}' is missing or not a list", hf.name(), k);
  std::vector<int> v;
  for (const auto& e : lac[k]) {
    if (!e.is_number_integer() || e.get<int64_t>() < 1 || e.get<int64_t>() > n_layer)
      fail("{}: 'linear_attn_config.{}' holds {}; entries are layer numbers 1..{}", hf.name(), k, e.dump(), n_layer);
    v.push_back(static_cast<int>(e.get<int64_t>()) - 1);
  }
  return v;
}

}  // namespace

std::unique_ptr<KimiModel> KimiModel::load_kimi_linear_dir(const std::string& dir) {
  const HFConfig hf = HFConfig::load(dir);
  if (hf.model_type() != "kimi_linear")
    fail("{}: model_type '{}' is not kimi_linear", hf.name(), hf.model_type());
  const nlohmann::json& j = hf.json();
  auto pos = [&](const char* k) { return positive(hf, j, "", k); };
  const int n_layer = pos("num_hidden_layers"), H = pos("hidden_size"), n_head = pos("num_attention_heads");
  const nlohmann::json* lacp = hf.find("linear_attn_config");
  if (!lacp || !lacp->is_object()) fail("{}: 'linear_attn_config' is missing or not an object", hf.name());
  const nlohmann::json& lac = *lacp;
  const int kda_heads = positive(hf, lac, "linear_attn_config.", "num_heads");
  if (kda_heads != n_head)
    fail("{}: 'linear_attn_config.num_heads' {} differs from 'num_attention_heads' {}, which the GGUF form (one head "
         "count) cannot hold",
         hf.name(), kda_heads, n_head);
  const int D = positive(hf, lac, "linear_attn_config.", "head_dim");
  const int K = positive(hf, lac, "linear_attn_config.", "short_conv_kernel_size");
  if (lac.contains("gate_lower_bound") && !lac["gate_lower_bound"].is_null())
    fail("{}: 'linear_attn_config.gate_lower_bound' is not supported for kimi_linear (its forget gate is -exp(A_log) "
         "softplus(g + dt_bias))",
         hf.name());
  if (lac.value("use_full_rank_gate", false))
    fail("{}: 'linear_attn_config.use_full_rank_gate' true is not supported for kimi_linear", hf.name());
  const std::vector<int> kda = layer_list(hf, lac, "kda_layers", n_layer),
                         full = layer_list(hf, lac, "full_attn_layers", n_layer);
  std::vector<int> kind(static_cast<size_t>(n_layer), 0);  // 1 KDA, 2 MLA
  for (int l : kda) kind[static_cast<size_t>(l)] |= 1;
  for (int l : full) kind[static_cast<size_t>(l)] |= 2;
  for (int l = 0; l < n_layer; ++l)
    if (kind[static_cast<size_t>(l)] != 1 && kind[static_cast<size_t>(l)] != 2)
      fail("{}: layer {} must be in exactly one of 'linear_attn_config.kda_layers' and "
           "'linear_attn_config.full_attn_layers'",
           hf.name(), l + 1);
  int q_lora = 0;
  if (const nlohmann::json* q = hf.find("q_lora_rank"); q && !q->is_null()) q_lora = pos("q_lora_rank");
  const int kvl = pos("kv_lora_rank"), nope = pos("qk_nope_head_dim"), rope = pos("qk_rope_head_dim"),
            vd = pos("v_head_dim");
  if (!hf.get_bool_or("mla_use_nope", false))
    fail("{}: 'mla_use_nope' false (RoPE in MLA) is not supported; Kimi Linear's MLA is NoPE", hf.name());
  if (hf.get_bool_or("mla_use_output_gate", false))
    fail("{}: 'mla_use_output_gate' true is not supported for kimi_linear", hf.name());
  if (hf.get_string_or("hidden_act", "silu") != "silu")
    fail("{}: 'hidden_act' '{}' is not supported (silu)", hf.name(), hf.get_string("hidden_act"));
  if (hf.get_int_or("moe_layer_freq", 1) != 1) fail("{}: 'moe_layer_freq' other than 1 is not supported", hf.name());
  if (hf.get_string_or("moe_router_activation_func", "sigmoid") != "sigmoid")
    fail("{}: 'moe_router_activation_func' '{}' is not supported (sigmoid)", hf.name(),
         hf.get_string("moe_router_activation_func"));
  if (hf.get_bool_or("use_grouped_topk", true) &&
      (hf.get_int_or("num_expert_group", 1) != 1 || hf.get_int_or("topk_group", 1) != 1))
    fail("{}: 'num_expert_group' / 'topk_group' other than 1 (group-limited routing) is not supported", hf.name());
  if (hf.get_bool_or("tie_word_embeddings", false)) fail("{}: 'tie_word_embeddings' true is not supported", hf.name());
  if (hf.get_int_or("num_nextn_predict_layers", 0) != 0)
    fail("{}: 'num_nextn_predict_layers' other than 0 is not supported", hf.name());
  const int lead = static_cast<int>(hf.get_int_in_or("first_k_dense_replace", 0, 0, n_layer));
  const double eps = hf.get_float_in("rms_norm_eps", 0, 1);

  auto st = std::make_unique<SafetensorsModel>(SafetensorsModel::open(dir));
  Converter cv(*st);
  GGUFWriter& w = cv.writer();
  auto u32 = [&](const char* k, int64_t v) { w.set_u32(key(k), static_cast<uint32_t>(v)); };
  w.set_string("general.architecture", kArch);
  u32("block_count", n_layer);
  u32("context_length", hf.get_int_or("max_position_embeddings", 4096));
  u32("embedding_length", H);
  u32("attention.head_count", n_head);
  std::vector<int32_t> kv_heads;
  for (int l = 0; l < n_layer; ++l) kv_heads.push_back(kind[static_cast<size_t>(l)] == 2 ? 1 : 0);
  w.set_i32_array(key("attention.head_count_kv"), kv_heads);
  w.set_f32(key("attention.layer_norm_rms_epsilon"), static_cast<float>(eps));
  u32("ssm.conv_kernel", K);
  u32("kda.head_dim", D);
  if (q_lora > 0) u32("attention.q_lora_rank", q_lora);
  u32("attention.kv_lora_rank", kvl);
  u32("rope.dimension_count", rope);
  u32("attention.key_length", kvl + rope);
  u32("attention.key_length_mla", nope + rope);
  u32("attention.value_length_mla", vd);
  u32("leading_dense_block_count", lead);
  if (lead > 0) u32("feed_forward_length", pos("intermediate_size"));
  int n_exp = 0;
  if (lead < n_layer) {
    n_exp = pos("num_experts");
    u32("expert_count", n_exp);
    u32("expert_used_count", pos("num_experts_per_token"));
    u32("expert_feed_forward_length", pos("moe_intermediate_size"));
    u32("expert_shared_count", pos("num_shared_experts"));
    w.set_f32(key("expert_weights_scale"), static_cast<float>(hf.get_float_in_or("routed_scaling_factor", 1.0, 0, 1e6)));
    w.set_bool(key("expert_weights_norm"), hf.get_bool_or("moe_renormalize", true));
  }

  cv.keep(tname(T::TokenEmbd), "model.embed_tokens.weight");
  cv.keep(tname(T::Output), "lm_head.weight");
  cv.keep(tname(T::OutputNorm), "model.norm.weight");
  auto table = [&](int l, const Entry* b, const Entry* e) {
    for (const Entry* x = b; x != e; ++x) {
      const std::string gguf = tname(x->kind, l, x->suffix);
      if (x->kind == T::FfnGateExps || x->kind == T::FfnUpExps || x->kind == T::FfnDownExps) {
        cv.experts(gguf, x->hf, l, n_exp);
        continue;
      }
      const std::string src = fmt::format(fmt::runtime(x->hf), l);
      if (x->kind == T::SsmConv1dQ || x->kind == T::SsmConv1dK || x->kind == T::SsmConv1dV)
        cv.conv(gguf, src);
      else if (x->kind == T::SsmA)
        cv.a_from_log(gguf, src);
      else if (x->kind == T::AttnKvB)
        cv.kv_b(l, src, n_head, nope, vd, kvl);
      else
        cv.keep(gguf, src);
    }
  };
  for (int l = 0; l < n_layer; ++l) {
    table(l, std::begin(kNorms), std::end(kNorms));
    if (kind[static_cast<size_t>(l)] == 1) {
      table(l, std::begin(kKda), std::end(kKda));
    } else {
      if (q_lora > 0)
        table(l, std::begin(kMlaQLora), std::end(kMlaQLora));
      else
        table(l, std::begin(kMlaQ), std::end(kMlaQ));
      table(l, std::begin(kMla), std::end(kMla));
    }
    if (l < lead)
      table(l, std::begin(kDense), std::end(kDense));
    else
      table(l, std::begin(kMoe), std::end(kMoe));
  }
  std::vector<uint8_t> image = w.serialize();
  const std::map<std::string, std::string> names = cv.names();
  st.reset();
  try {
    auto file = GGUFFile::parse(image.data(), image.size(), hf.name());
    // The model keeps the image the parsed file points into.
    std::vector<uint8_t>* keep = nullptr;
    auto m = load_gguf(std::move(file));
    keep = &m->image_;
    *keep = std::move(image);  // moving a vector keeps its buffer where it is
    return m;
  } catch (const Error& e) {
    // Name the checkpoint's tensor too.
    std::string what = e.what();
    for (const auto& [g, h] : names)
      if (what.find("'" + g + "'") != std::string::npos) {
        what += fmt::format(" (checkpoint tensor '{}')", h);
        break;
      }
    fail("{}", what);
  }
}

}  // namespace megakern
