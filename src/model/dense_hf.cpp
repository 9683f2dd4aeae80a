#include "model/dense_hf.h"

#include <cmath>
#include <cstring>
#include <numbers>

#include <fmt/format.h>

#include "core/error.h"
#include "io/gguf.h"
#include "io/config_value.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "core/dtype.h"
#include "kernels/cpu/ops.h"
#include "model/dense_families.h"

namespace megakern {
namespace {

using T = DenseTensor;

// The RoPE settings of a config: transformers 5 writes `rope_parameters`
// (per layer type for Gemma 3), earlier versions `rope_theta` and
// `rope_scaling`.
struct Rope {
  double theta = 10000.0;
  std::string type = "default";
  nlohmann::json params;  // the scaling parameters
  std::string where;      // the key params came from, for messages
};

// Bytes of one MXFP4 block of 32 values (an E8M0 scale, 16 bytes of codes).
const size_t kMxBlockBytes = dtype_traits(DType::MXFP4).block_bytes;

// RoPE bases and scaling parameters beyond this are refused.
constexpr double kMaxRopeBase = 1e12;

// The GGUF keys every converted family writes: name, depth, widths and the
// attention shape, as llama.cpp's converter names them.
struct ShapeKeys {
  int64_t n_layer, n_embd, n_ff, n_head, n_kv, head_dim;
  double eps;
};
void write_shape_keys(GGUFWriter& w, const std::string& a, const HFConfig& hf, const ShapeKeys& k) {
  w.set_string("general.architecture", a);
  w.set_string("general.name", hf.name());
  w.set_u32(a + ".block_count", static_cast<uint32_t>(k.n_layer));
  w.set_u32(a + ".context_length", static_cast<uint32_t>(hf.get_int_in_or("max_position_embeddings", 2048, 1, int64_t{1} << 30)));
  w.set_u32(a + ".embedding_length", static_cast<uint32_t>(k.n_embd));
  w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(k.n_ff));
  w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(k.n_head));
  w.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(k.n_kv));
  w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(k.head_dim));
  w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(k.head_dim));
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(k.eps));
}

Rope read_rope(const HFConfig& hf, const char* layer_type) {
  Rope r;
  if (const nlohmann::json* rp = hf.find("rope_parameters")) {
    const nlohmann::json* p = rp;
    if (rp->is_object() && rp->contains(layer_type) && (*rp)[layer_type].is_object()) p = &(*rp)[layer_type];
    if (!p->is_object()) fail("{}: 'rope_parameters' must be an object", hf.name());
    r.params = *p;
    r.where = p == rp ? "rope_parameters" : std::string("rope_parameters.") + layer_type;
  } else if (const nlohmann::json* rs = hf.find("rope_scaling")) {
    if (!rs->is_object()) fail("{}: 'rope_scaling' must be an object", hf.name());
    r.params = *rs;
    r.where = "rope_scaling";
  }
  if (r.params.contains("rope_theta") && !r.params["rope_theta"].is_null())
    r.theta = json_float_in(r.params["rope_theta"], hf.name(), r.where + ".rope_theta", 0, kMaxRopeBase);
  else
    r.theta = hf.get_float_in_or("rope_theta", 10000.0, 0, kMaxRopeBase);
  for (const char* k : {"rope_type", "type"})
    if (r.params.contains(k) && r.params[k].is_string()) {
      r.type = r.params[k].get<std::string>();
      break;
    }
  return r;
}

double rope_param(const HFConfig& hf, const Rope& r, const char* key) {
  if (!r.params.contains(key) || !r.params[key].is_number())
    fail("{}: RoPE scaling '{}' needs the parameter '{}'", hf.name(), r.type, key);
  return json_float_in(r.params[key], hf.name(), r.where + "." + key, 0, kMaxRopeBase);
}

// Llama 3 scaling as the frequency divisors llama.cpp's converter writes
// (rope_freqs): 1 for short wavelengths, `factor` for long ones, a smooth
// blend between; the base frequencies in float32 as the converter has them.
std::vector<float> llama3_factors(const HFConfig& hf, const Rope& r, int rope_dim) {
  const double factor = rope_param(hf, r, "factor"), lo = rope_param(hf, r, "low_freq_factor"),
               hi = rope_param(hf, r, "high_freq_factor"), old = rope_param(hf, r, "original_max_position_embeddings");
  if (!(hi > lo)) fail("{}: RoPE high_freq_factor {} must exceed low_freq_factor {}", hf.name(), hi, lo);
  const double lo_wl = old / lo, hi_wl = old / hi;
  std::vector<float> out;
  for (int i = 0; i < rope_dim; i += 2) {
    const float e = static_cast<float>(i) / static_cast<float>(rope_dim);
    const float freq = 1.0f / std::pow(static_cast<float>(r.theta), e);
    const double wl = 2 * std::numbers::pi / static_cast<double>(freq);
    double f;
    if (wl < hi_wl)
      f = 1.0;
    else if (wl > lo_wl)
      f = factor;
    else {
      const double smooth = (old / wl - lo) / (hi - lo);
      f = 1.0 / ((1 - smooth) / factor + smooth);
    }
    out.push_back(static_cast<float>(f));
  }
  return out;
}

// LongRoPE (rope type "longrope", earlier "su": Phi-3 128k, Phi-3.5) as
// llama.cpp's converter writes it: the short and long factors as the global
// tensors rope_factors_short / rope_factors_long, the original context and
// the attention factor as rope.scaling keys. Without an attention_factor the
// default is transformers': sqrt(1 + ln(s) / ln(original)) for s > 1, where s
// is `factor` or else max_position_embeddings / original.
struct LongRope {
  std::vector<float> short_factors, long_factors;
  int64_t original = 0;
  double attn_factor = 1.0;
};
LongRope longrope_params(const HFConfig& hf, const Rope& r, int rope_dim) {
  auto given = [&](const char* key) { return r.params.contains(key) && !r.params[key].is_null(); };
  LongRope lr;
  for (const char* key : {"short_factor", "long_factor"}) {
    if (!given(key) || !r.params[key].is_array())
      fail("{}: RoPE scaling '{}' needs '{}.{}' (a list of numbers)", hf.name(), r.type, r.where, key);
    const nlohmann::json& a = r.params[key];
    if (static_cast<int64_t>(a.size()) != rope_dim / 2)
      fail("{}: '{}.{}' has {} factors; the rotated width {} needs {}", hf.name(), r.where, key, a.size(), rope_dim,
           rope_dim / 2);
    std::vector<float>& out = std::string_view(key) == "short_factor" ? lr.short_factors : lr.long_factors;
    for (size_t i = 0; i < a.size(); ++i)
      out.push_back(static_cast<float>(json_float_in(a[i], hf.name(), fmt::format("{}.{}[{}]", r.where, key, i), 0, 1e6)));
  }
  const int64_t max_ctx = int64_t{1} << 30;
  lr.original = given("original_max_position_embeddings")
                    ? json_int_in(r.params["original_max_position_embeddings"], hf.name(),
                                  r.where + ".original_max_position_embeddings", 2, max_ctx)
                    : hf.get_int_in("original_max_position_embeddings", 2, max_ctx);
  const double s = given("factor") ? json_float_in(r.params["factor"], hf.name(), r.where + ".factor", 0, 1e6)
                                   : static_cast<double>(hf.get_int_in_or("max_position_embeddings", 2048, 1, max_ctx)) /
                                         static_cast<double>(lr.original);
  lr.attn_factor = given("attention_factor")
                       ? json_float_in(r.params["attention_factor"], hf.name(), r.where + ".attention_factor", 0, 1e3)
                   : s <= 1.0 ? 1.0
                              : std::sqrt(1.0 + std::log(s) / std::log(static_cast<double>(lr.original)));
  return lr;
}

std::vector<float> to_f32(const SafetensorsTensor& t, const std::string& file) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == "F32") {
    std::memcpy(out.data(), t.data, out.size() * 4);
  } else if (auto dt = safetensors_float_format(t.dtype)) {
    dtype_traits(*dt).dequantize(t.data, out.data(), t.numel());
  } else {
    fail("{}: tensor '{}' has dtype {}; expected F32, F16 or BF16", file, t.name, t.dtype);
  }
  return out;
}

class Converter {
 public:
  Converter(const HFConfig& hf, const DenseFamily& fam, const SafetensorsModel& st, std::optional<DType> weights)
      : hf_(hf), fam_(fam), st_(st), weights_(weights) {}

  // The tensor, checked against its expected shape (row-major, HF order).
  const SafetensorsTensor& get(const std::string& name, std::vector<int64_t> shape) {
    const SafetensorsTensor* t = st_.find(name);
    if (!t) fail("{}: tensor '{}' is missing", st_.path(), name);
    if (t->shape != shape)
      fail("{}: tensor '{}' has shape [{}], expected [{}] for {}", st_.path(), name, fmt::join(t->shape, ", "),
           fmt::join(shape, ", "), hf_.name());
    return *t;
  }

  // A vector: f32, plus one for Gemma's norms.
  void vec(T kind, int layer, int64_t n, bool norm, std::string_view suffix = "weight") {
    const std::string src = *hf_tensor_name(fam_, kind, layer, suffix);
    std::vector<float> v = to_f32(get(src, {n}), st_.path());
    if (norm && fam_.hf_norm_plus_one)
      for (float& x : v) x += 1.f;
    w_.add_tensor(dense_tensor_name(kind, layer, suffix), DType::F32, {n}, v.data(), v.size() * 4);
  }

  // A matrix [rows][cols]: kept in its float format, or converted to
  // `weights`; rows permuted per head for adjacent-pair RoPE when asked.
  // With n_expert > 0, the experts' matrices (one checkpoint tensor each)
  // stacked into one [n_expert][rows][cols] tensor, as GGUF stores them.
  void mat(T kind, int layer, int64_t rows, int64_t cols, int permute_heads = 0, int n_expert = 0) {
    const int n_mat = n_expert > 0 ? n_expert : 1;
    const std::string dst = dense_tensor_name(kind, layer);
    std::optional<DType> keep;
    std::string src;
    std::vector<uint8_t> bytes;
    for (int e = 0; e < n_mat; ++e) {
      src = *hf_tensor_name(fam_, kind, layer, "weight", e);
      const SafetensorsTensor& t = get(src, {rows, cols});
      const std::optional<DType> fmt = safetensors_float_format(t.dtype);
      if (!fmt) fail("{}: tensor '{}' has dtype {}; expected F32, F16 or BF16", st_.path(), src, t.dtype);
      if (keep && *fmt != *keep)
        fail("{}: tensor '{}' has dtype {}, unlike the layer's other experts", st_.path(), src, t.dtype);
      keep = fmt;
      const size_t rb = static_cast<size_t>(cols) * t.elem_bytes;
      if (bytes.empty()) bytes.resize(static_cast<size_t>(n_mat) * static_cast<size_t>(rows) * rb);
      uint8_t* base = bytes.data() + static_cast<size_t>(e) * static_cast<size_t>(rows) * rb;
      // Row r of the result is row src_row(r) of the checkpoint: llama.cpp's
      // converter reorders each head's rows (0, d/2, 1, d/2 + 1, ...) so that
      // adjacent-pair RoPE on them is rotate-half RoPE on the original.
      const int64_t per = permute_heads ? rows / permute_heads : rows, half = per / 2;
      for (int64_t r = 0; r < rows; ++r) {
        int64_t s = r;
        if (permute_heads) {
          const int64_t h = r / per, i = r % per;
          s = h * per + (i % 2) * half + i / 2;
        }
        std::memcpy(base + static_cast<size_t>(r) * rb, t.data + static_cast<size_t>(s) * rb, rb);
      }
    }
    std::vector<int64_t> shape = {cols, rows};
    if (n_expert > 0) shape.push_back(n_expert);
    if (weights_ && *weights_ != *keep) {
      std::vector<float> f(static_cast<size_t>(n_mat * rows * cols));
      dtype_traits(*keep).dequantize(bytes.data(), f.data(), n_mat * rows * cols);
      const int64_t block = dtype_traits(*weights_).block_size;
      if (cols % block != 0)
        fail("{}: --weights {} needs rows of a multiple of {} values; tensor '{}' has {}", hf_.name(),
             dtype_traits(*weights_).name, block, src, cols);
      w_.add_tensor_f32(dst, *weights_, shape, f.data());
      return;
    }
    w_.add_tensor(dst, *keep, shape, bytes.data(), bytes.size());
  }

  GGUFWriter& writer() { return w_; }

 private:
  const HFConfig& hf_;
  const DenseFamily& fam_;
  const SafetensorsModel& st_;
  std::optional<DType> weights_;
  GGUFWriter w_;
};

// DeepSeek's YaRN (rope_scaling type yarn) as the keys llama.cpp's converter
// writes for deepseek2: factor, original context, beta_fast / beta_slow and
// 0.1 x mscale_all_dim as yarn_log_multiplier. transformers rotates the
// rope part with the amplitude mscale(factor, mscale) / mscale(factor,
// mscale_all_dim) (or attention_factor) and multiplies the softmax scale by
// mscale(factor, mscale_all_dim)^2; the engine runs the released setting,
// where the amplitude is 1, and refuses others naming them.
void deepseek_yarn_keys(const HFConfig& hf, const Rope& r, GGUFWriter& w, const std::string& a) {
  // transformers: original_max_position_embeddings at the config's top level
  // first, then in the RoPE parameters, else max_position_embeddings.
  double orig = static_cast<double>(hf.get_int_in_or("max_position_embeddings", 2048, 1, int64_t{1} << 30));
  if (hf.json().contains("original_max_position_embeddings"))
    orig = static_cast<double>(hf.get_int_in("original_max_position_embeddings", 1, int64_t{1} << 30));
  else if (r.params.contains("original_max_position_embeddings") && !r.params["original_max_position_embeddings"].is_null())
    orig = rope_param(hf, r, "original_max_position_embeddings");
  const double factor = rope_param(hf, r, "factor");
  if (factor < 1.0) fail("{}: '{}.factor' is {}; YaRN needs a factor of at least 1", hf.name(), r.where, factor);
  auto opt = [&](const char* k) -> double {
    if (!r.params.contains(k) || r.params[k].is_null()) return 0.0;
    return rope_param(hf, r, k);
  };
  auto get_mscale = [&](double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
  const double ms = opt("mscale"), ms_all = opt("mscale_all_dim");
  double amplitude = ms != 0 && ms_all != 0 ? get_mscale(ms) / get_mscale(ms_all) : get_mscale(1.0);
  if (r.params.contains("attention_factor") && !r.params["attention_factor"].is_null())
    amplitude = rope_param(hf, r, "attention_factor");
  if (std::abs(amplitude - 1.0) > 1e-12)
    fail("{}: YaRN with '{}' mscale {} and mscale_all_dim {} rotates with the amplitude {}; DeepSeek's YaRN is "
         "supported where it is 1 (mscale equal to mscale_all_dim, as the released configs have it)",
         hf.name(), r.where, ms, ms_all, amplitude);
  if (r.params.contains("truncate") && (!r.params["truncate"].is_boolean() || !r.params["truncate"].get<bool>()))
    fail("{}: '{}.truncate' must be true (or absent) for DeepSeek's YaRN", hf.name(), r.where);
  w.set_string(a + ".rope.scaling.type", "yarn");
  w.set_f32(a + ".rope.scaling.factor", static_cast<float>(factor));
  if (orig != std::floor(orig) || orig > (int64_t{1} << 30))
    fail("{}: '{}.original_max_position_embeddings' {} must be a whole number of positions", hf.name(), r.where, orig);
  w.set_u32(a + ".rope.scaling.original_context_length", static_cast<uint32_t>(orig));
  w.set_f32(a + ".rope.scaling.yarn_log_multiplier", static_cast<float>(0.1 * ms_all));
  for (auto [k, key] : {std::pair{"beta_fast", "yarn_beta_fast"}, std::pair{"beta_slow", "yarn_beta_slow"}})
    if (r.params.contains(k) && !r.params[k].is_null())
      w.set_f32(a + ".rope.scaling." + key, static_cast<float>(rope_param(hf, r, k)));
}

// DeepSeek-V2 / V3 (model_type deepseek_v2 / deepseek_v3) as the deepseek2
// GGUF form: the MLA key and value expansion kept fused (attn_kv_b), the
// routing settings as llama.cpp's keys.
void deepseek_from_hf(const HFConfig& hf, const DenseFamily& fam, const SafetensorsModel& st, Converter& cv,
                      int n_layer, int n_embd, int n_ff, int n_head, int n_vocab, double eps) {
  GGUFWriter& w = cv.writer();
  const std::string a(fam.gguf_arch), mt = hf.model_type();
  const bool v3 = mt == "deepseek_v3";
  auto pos = [&](const char* k) { return static_cast<int>(hf.get_int_in(k, 1, kMaxConfigDim)); };
  int q_lora = 0;
  if (const nlohmann::json* q = hf.find("q_lora_rank"); q && !q->is_null()) q_lora = pos("q_lora_rank");
  const int kvl = pos("kv_lora_rank"), nope = pos("qk_nope_head_dim"), rope = pos("qk_rope_head_dim"),
            vd = pos("v_head_dim"), n_exp = pos("n_routed_experts"), used = pos("num_experts_per_tok"),
            ff_exp = pos("moe_intermediate_size");
  const int shared = static_cast<int>(hf.get_int_or("n_shared_experts", 0));
  const int lead = static_cast<int>(hf.get_int_or("first_k_dense_replace", 0));
  if (shared < 0 || lead < 0 || lead > n_layer)
    fail("{}: n_shared_experts {} / first_k_dense_replace {} out of range", hf.name(), shared, lead);
  if (hf.get_int_or("moe_layer_freq", 1) != 1) fail("{}: 'moe_layer_freq' other than 1 is not supported", hf.name());
  if (hf.get_bool_or("attention_bias", false)) fail("{}: 'attention_bias' true is not supported", hf.name());
  const std::string scoring = hf.get_string_or("scoring_func", v3 ? "sigmoid" : "softmax");
  if (scoring != "sigmoid" && scoring != "softmax") fail("{}: scoring_func '{}' is not supported", hf.name(), scoring);
  if (scoring != (v3 ? "sigmoid" : "softmax"))
    fail("{}: scoring_func '{}' is not the one transformers' {} router computes", hf.name(), scoring, mt);
  int n_group = static_cast<int>(hf.get_int_or("n_group", 1)), topk_group = static_cast<int>(hf.get_int_or("topk_group", 1));
  if (!v3 && hf.get_string_or("topk_method", "greedy") == "greedy") n_group = topk_group = 1;
  if (n_group < 1 || topk_group < 1) fail("{}: n_group {} / topk_group {} must be positive", hf.name(), n_group, topk_group);
  const double scale = hf.get_float_or("routed_scaling_factor", 1.0);
  const Rope r = read_rope(hf, "full_attention");
  if (r.type != "default" && r.type != "yarn") fail("{}: RoPE scaling '{}' is not supported for {}", hf.name(), r.type, mt);

  w.set_u32(a + ".block_count", static_cast<uint32_t>(n_layer));
  w.set_u32(a + ".context_length", static_cast<uint32_t>(hf.get_int_or("max_position_embeddings", 2048)));
  w.set_u32(a + ".embedding_length", static_cast<uint32_t>(n_embd));
  w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(n_ff));
  w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(n_head));
  w.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(n_head));
  w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(nope + rope));
  w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(vd));
  w.set_u32(a + ".attention.kv_lora_rank", static_cast<uint32_t>(kvl));
  if (q_lora > 0) w.set_u32(a + ".attention.q_lora_rank", static_cast<uint32_t>(q_lora));
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(eps));
  w.set_u32(a + ".rope.dimension_count", static_cast<uint32_t>(rope));
  w.set_f32(a + ".rope.freq_base", static_cast<float>(r.theta));
  w.set_u32(a + ".leading_dense_block_count", static_cast<uint32_t>(lead));
  w.set_u32(a + ".expert_count", static_cast<uint32_t>(n_exp));
  w.set_u32(a + ".expert_used_count", static_cast<uint32_t>(used));
  w.set_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(ff_exp));
  w.set_u32(a + ".expert_shared_count", static_cast<uint32_t>(shared));
  w.set_f32(a + ".expert_weights_scale", static_cast<float>(scale));
  // transformers' V2 router never renormalises; V3's does per norm_topk_prob.
  w.set_bool(a + ".expert_weights_norm", v3 && hf.get_bool_or("norm_topk_prob", true));
  w.set_u32(a + ".expert_gating_func", v3 ? 2u : 1u);
  w.set_u32(a + ".expert_group_count", static_cast<uint32_t>(n_group));
  w.set_u32(a + ".expert_group_used_count", static_cast<uint32_t>(topk_group));
  if (r.type == "yarn") deepseek_yarn_keys(hf, r, w, a);

  const int Dk = nope + rope;
  cv.mat(T::TokenEmbd, 0, n_vocab, n_embd);
  const bool tied = !st.find(*hf_tensor_name(fam, T::Output, 0)) || hf.get_bool_or("tie_word_embeddings", false);
  if (!tied) cv.mat(T::Output, 0, n_vocab, n_embd);
  cv.vec(T::OutputNorm, 0, n_embd, true);
  for (int l = 0; l < n_layer; ++l) {
    cv.vec(T::AttnNorm, l, n_embd, true);
    if (q_lora > 0) {
      cv.mat(T::AttnQA, l, q_lora, n_embd);
      cv.vec(T::AttnQANorm, l, q_lora, true);
      cv.mat(T::AttnQB, l, int64_t{n_head} * Dk, q_lora);
    } else {
      cv.mat(T::AttnQ, l, int64_t{n_head} * Dk, n_embd);
    }
    cv.mat(T::AttnKvAMqa, l, kvl + rope, n_embd);
    cv.vec(T::AttnKvANorm, l, kvl, true);
    cv.mat(T::AttnKvB, l, int64_t{n_head} * (nope + vd), kvl);
    cv.mat(T::AttnOut, l, n_embd, int64_t{n_head} * vd);
    cv.vec(T::FfnNorm, l, n_embd, true);
    if (l < lead) {
      cv.mat(T::FfnGate, l, n_ff, n_embd);
      cv.mat(T::FfnUp, l, n_ff, n_embd);
      cv.mat(T::FfnDown, l, n_embd, n_ff);
      continue;
    }
    cv.mat(T::FfnGateInp, l, n_exp, n_embd);
    if (st.find(*hf_tensor_name(fam, T::FfnExpProbsB, l, "e_score_correction_bias"))) {
      const std::string src = *hf_tensor_name(fam, T::FfnExpProbsB, l, "e_score_correction_bias");
      std::vector<float> b = to_f32(cv.get(src, {n_exp}), st.path());
      w.add_tensor(dense_tensor_name(T::FfnExpProbsB, l, "bias"), DType::F32, {n_exp}, b.data(), b.size() * 4);
    } else if (v3) {
      fail("{}: tensor '{}' is missing", st.path(), *hf_tensor_name(fam, T::FfnExpProbsB, l, "e_score_correction_bias"));
    }
    cv.mat(T::FfnGateExps, l, ff_exp, n_embd, 0, n_exp);
    cv.mat(T::FfnUpExps, l, ff_exp, n_embd, 0, n_exp);
    cv.mat(T::FfnDownExps, l, n_embd, ff_exp, 0, n_exp);
    if (shared > 0) {
      const int64_t sf = int64_t{shared} * ff_exp;
      cv.mat(T::FfnGateShexp, l, sf, n_embd);
      cv.mat(T::FfnUpShexp, l, sf, n_embd);
      cv.mat(T::FfnDownShexp, l, n_embd, sf);
    }
  }
}

// gpt-oss (model_type gpt_oss) as the gpt-oss GGUF form llama.cpp's
// converter writes: the pre-MLP norm as post_attention_norm, sinks as
// attn_sinks, the experts' interleaved gate/up tensor split into
// ffn_gate_exps / ffn_up_exps (with their biases), YaRN as rope.scaling keys.
// Experts stored as MXFP4 blocks and scales (the released checkpoints) stay
// MXFP4, their nibbles reordered into GGUF's block; experts stored as floats
// become f32 (or `weights`).
void gpt_oss_from_hf(const HFConfig& hf, const DenseFamily& fam, const SafetensorsModel& st, Converter& cv,
                     std::optional<DType> weights, int n_layer, int n_embd, int n_head, int n_kv, int head_dim,
                     int n_vocab, double eps) {
  GGUFWriter& w = cv.writer();
  const std::string a(fam.gguf_arch);
  const int n_ff = static_cast<int>(hf.get_int_in("intermediate_size", 1, kMaxConfigDim));
  const int E = static_cast<int>(hf.get_int_in("num_local_experts", 1, 4096));
  const int used = static_cast<int>(hf.get_int_in("num_experts_per_tok", 1, E));
  const double limit = hf.get_float_in_or("swiglu_limit", kSwiGluOaiLimit, 0, 1e6);
  const double alpha = hf.get_float_in_or("swiglu_alpha", kSwiGluOaiAlpha, 0, 1e6);
  if (static_cast<float>(limit) != kSwiGluOaiLimit || static_cast<float>(alpha) != kSwiGluOaiAlpha)
    fail("{}: swiglu_limit {} / swiglu_alpha {}: this engine runs gpt-oss's clamped SwiGLU with limit {} and alpha {}",
         hf.name(), limit, alpha, kSwiGluOaiLimit, kSwiGluOaiAlpha);
  if (!hf.get_bool_or("attention_bias", true)) fail("{}: gpt_oss without attention biases is not supported", hf.name());
  const int64_t window = hf.get_int_in("sliding_window", 1, int64_t{1} << 30);
  if (const nlohmann::json* lt = hf.find("layer_types")) {
    if (!lt->is_array() || static_cast<int>(lt->size()) != n_layer)
      fail("{}: 'layer_types' must list {} layers", hf.name(), n_layer);
    for (int l = 0; l < n_layer; ++l) {
      const std::string want = l % 2 == 0 ? "sliding_attention" : "full_attention";
      if ((*lt)[static_cast<size_t>(l)] != want)
        fail("{}: layer_types[{}] is {}; gpt-oss alternates sliding (even layers) and full attention, so it must be "
             "'{}'",
             hf.name(), l, (*lt)[static_cast<size_t>(l)].dump(), want);
    }
  }
  const Rope r = read_rope(hf, "full_attention");
  write_shape_keys(w, a, hf, {n_layer, n_embd, n_ff, n_head, n_kv, head_dim, eps});
  w.set_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(n_ff));
  w.set_u32(a + ".attention.sliding_window", static_cast<uint32_t>(window));
  w.set_u32(a + ".rope.dimension_count", static_cast<uint32_t>(head_dim));
  w.set_f32(a + ".rope.freq_base", static_cast<float>(r.theta));
  w.set_u32(a + ".expert_count", static_cast<uint32_t>(E));
  w.set_u32(a + ".expert_used_count", static_cast<uint32_t>(used));
  if (r.type == "yarn") {
    if (r.params.contains("truncate") && !r.params["truncate"].is_boolean())
      fail("{}: '{}.truncate' must be a boolean", hf.name(), r.where);
    if (!r.params.contains("truncate") || r.params["truncate"].get<bool>())
      fail("{}: YaRN with a truncated correction range ('{}.truncate' true or absent) is not supported for gpt_oss; "
           "its released configs set it false",
           hf.name(), r.where);
    for (const char* k : {"attention_factor", "mscale", "mscale_all_dim"})
      if (r.params.contains(k) && !r.params[k].is_null())
        fail("{}: YaRN '{}.{}' is not supported for gpt_oss", hf.name(), r.where, k);
    w.set_string(a + ".rope.scaling.type", "yarn");
    w.set_f32(a + ".rope.scaling.factor", static_cast<float>(rope_param(hf, r, "factor")));
    w.set_u32(a + ".rope.scaling.original_context_length",
              static_cast<uint32_t>(rope_param(hf, r, "original_max_position_embeddings")));
    for (auto [k, key] : {std::pair{"beta_fast", "yarn_beta_fast"}, std::pair{"beta_slow", "yarn_beta_slow"}})
      if (r.params.contains(k) && !r.params[k].is_null())
        w.set_f32(a + ".rope.scaling." + key, static_cast<float>(rope_param(hf, r, k)));
  } else if (r.type != "default") {
    fail("{}: RoPE scaling '{}' is not supported for gpt_oss (default and yarn are)", hf.name(), r.type);
  }

  const int qd = n_head * head_dim, kvd = n_kv * head_dim;
  cv.mat(T::TokenEmbd, 0, n_vocab, n_embd);
  const bool tied = !st.find(*hf_tensor_name(fam, T::Output, 0)) || hf.get_bool_or("tie_word_embeddings", false);
  if (!tied) cv.mat(T::Output, 0, n_vocab, n_embd);
  cv.vec(T::OutputNorm, 0, n_embd, false);
  auto raw_vec = [&](const std::string& src, std::vector<int64_t> shape, const std::string& dst,
                     std::vector<int64_t> gguf_shape) {
    std::vector<float> v = to_f32(cv.get(src, std::move(shape)), st.path());
    w.add_tensor(dst, DType::F32, gguf_shape, v.data(), v.size() * 4);
  };
  for (int l = 0; l < n_layer; ++l) {
    cv.vec(T::AttnNorm, l, n_embd, false);
    cv.mat(T::AttnQ, l, qd, n_embd);
    cv.mat(T::AttnK, l, kvd, n_embd);
    cv.mat(T::AttnV, l, kvd, n_embd);
    cv.mat(T::AttnOut, l, n_embd, qd);
    cv.vec(T::AttnQ, l, qd, false, "bias");
    cv.vec(T::AttnK, l, kvd, false, "bias");
    cv.vec(T::AttnV, l, kvd, false, "bias");
    cv.vec(T::AttnOut, l, n_embd, false, "bias");
    raw_vec(*hf_tensor_name(fam, T::AttnSinks, l, "sinks"), {n_head}, dense_tensor_name(T::AttnSinks, l), {n_head});
    cv.vec(T::AttnPostNorm, l, n_embd, false);
    cv.mat(T::FfnGateInp, l, E, n_embd);
    cv.vec(T::FfnGateInp, l, E, false, "bias");

    // Biases: gate_up's interleaved [E][2F] split, down's [E][D] as is.
    const std::string gu = *hf_tensor_name(fam, T::FfnGateUpExps, l, "gate_up_proj");
    const std::string dn = *hf_tensor_name(fam, T::FfnDownExps, l, "down_proj");
    {
      std::vector<float> b = to_f32(cv.get(gu + "_bias", {E, 2 * int64_t{n_ff}}), st.path()), g, u;
      for (size_t i = 0; i < b.size(); ++i) (i % 2 == 0 ? g : u).push_back(b[i]);
      w.add_tensor(dense_tensor_name(T::FfnGateExps, l, "bias"), DType::F32, {n_ff, E}, g.data(), g.size() * 4);
      w.add_tensor(dense_tensor_name(T::FfnUpExps, l, "bias"), DType::F32, {n_ff, E}, u.data(), u.size() * 4);
      raw_vec(dn + "_bias", {E, n_embd}, dense_tensor_name(T::FfnDownExps, l, "bias"), {n_embd, E});
    }
    if (st.find(gu + "_blocks")) {
      // MXFP4: row r of a matrix [rows][cols] is cols / 32 blocks of 16
      // bytes (element 2i in the low nibble of byte i, 2i + 1 in the high
      // one) with one E8M0 scale each, value = e2m1 * 2^(scale - 127):
      // GGUF's MXFP4 block with the same scale byte, elements reordered.
      auto mx = [&](const std::string& src, int64_t rows, int64_t cols, int row0, int step, T kind) {
        if (cols % 32 != 0) fail("{}: tensor '{}_blocks': rows of {} values are not whole MXFP4 blocks", st.path(), src, cols);
        const int64_t nb = cols / 32;
        const SafetensorsTensor& bt = cv.get(src + "_blocks", {E, rows, nb, 16});
        const SafetensorsTensor& sc = cv.get(src + "_scales", {E, rows, nb});
        if (bt.dtype != "U8" || sc.dtype != "U8")
          fail("{}: tensors '{}_blocks' / '_scales' have dtypes {} / {}; expected U8", st.path(), src, bt.dtype, sc.dtype);
        const int64_t out_rows = rows / step;
        std::vector<uint8_t> out(static_cast<size_t>(E * out_rows * nb) * kMxBlockBytes);
        uint8_t codes[32];
        for (int64_t e = 0; e < E; ++e)
          for (int64_t o = 0; o < out_rows; ++o) {
            const int64_t rr = o * step + row0;
            for (int64_t b = 0; b < nb; ++b) {
              const size_t blk = static_cast<size_t>((e * rows + rr) * nb + b);
              const uint8_t* q = bt.data + blk * 16;
              for (int i = 0; i < 16; ++i) {
                codes[2 * i] = q[i] & 0x0f;
                codes[2 * i + 1] = q[i] >> 4;
              }
              mx_codes_block(DType::MXFP4, sc.data[blk], codes,
                             out.data() + static_cast<size_t>((e * out_rows + o) * nb + b) * kMxBlockBytes);
            }
          }
        if (weights && *weights != DType::MXFP4) {
          std::vector<float> f(static_cast<size_t>(E * out_rows * cols));
          dtype_traits(DType::MXFP4).dequantize(out.data(), f.data(), static_cast<int64_t>(f.size()));
          w.add_tensor_f32(dense_tensor_name(kind, l), *weights, {cols, out_rows, E}, f.data());
          return;
        }
        w.add_tensor(dense_tensor_name(kind, l), DType::MXFP4, {cols, out_rows, E}, out.data(), out.size());
      };
      mx(gu, 2 * int64_t{n_ff}, n_embd, 0, 2, T::FfnGateExps);
      mx(gu, 2 * int64_t{n_ff}, n_embd, 1, 2, T::FfnUpExps);
      mx(dn, n_embd, n_ff, 0, 1, T::FfnDownExps);
    } else {
      // Float experts, transposed: gate_up [E][D][2F] (gate = even columns),
      // down [E][F][D].
      const std::vector<float> x = to_f32(cv.get(gu, {E, n_embd, 2 * int64_t{n_ff}}), st.path());
      const std::vector<float> d = to_f32(cv.get(dn, {E, n_ff, n_embd}), st.path());
      const size_t F = static_cast<size_t>(n_ff), D = static_cast<size_t>(n_embd);
      std::vector<float> g(E * F * D), u(E * F * D), o(E * D * F);
      for (size_t e = 0; e < static_cast<size_t>(E); ++e)
        for (size_t i = 0; i < D; ++i)
          for (size_t f = 0; f < F; ++f) {
            g[(e * F + f) * D + i] = x[(e * D + i) * 2 * F + 2 * f];
            u[(e * F + f) * D + i] = x[(e * D + i) * 2 * F + 2 * f + 1];
            o[(e * D + i) * F + f] = d[(e * F + f) * D + i];
          }
      const DType t = weights.value_or(DType::F32);
      for (auto [kind, v, cols, rows] : {std::tuple{T::FfnGateExps, &g, n_embd, n_ff}, std::tuple{T::FfnUpExps, &u, n_embd, n_ff},
                                         std::tuple{T::FfnDownExps, &o, n_ff, n_embd}}) {
        if (cols % dtype_traits(t).block_size != 0)
          fail("{}: --weights {} needs rows of a multiple of {} values; the experts have {}", hf.name(),
               dtype_traits(t).name, dtype_traits(t).block_size, cols);
        w.add_tensor_f32(dense_tensor_name(kind, l), t, {cols, rows, E}, v->data());
      }
    }
  }
}

}  // namespace

void require_every_layer_sparse(const HFConfig& hf) {
  if (hf.get_int_or("decoder_sparse_step", 1) != 1)
    fail("{}: 'decoder_sparse_step' {} is not supported (every layer must be a mixture of experts)", hf.name(),
         hf.get_int_or("decoder_sparse_step", 1));
  if (const nlohmann::json* m = hf.find("mlp_only_layers"); m && !(m->is_array() && m->empty()))
    fail("{}: 'mlp_only_layers' must be empty (dense layers inside a mixture-of-experts model are not supported)",
         hf.name());
}

std::vector<uint8_t> dense_gguf_from_hf(const std::string& dir, std::optional<DType> weights) {
  const HFConfig hf = HFConfig::load(dir);
  const std::string mt = hf.model_type();
  const DenseFamily* famp = dense_family_of_hf(mt);
  if (!famp) fail("{}: model_type '{}' is not a dense family this engine reads", hf.name(), mt);
  const DenseFamily& fam = *famp;
  const SafetensorsModel st = SafetensorsModel::open(dir);

  auto pos = [&](const char* k) { return static_cast<int>(hf.get_int_in(k, 1, kMaxConfigDim)); };
  const int n_layer = static_cast<int>(hf.get_int_in("num_hidden_layers", 1, kMaxConfigLayers));
  const int n_embd = pos("hidden_size"), n_ff = pos("intermediate_size"), n_head = pos("num_attention_heads");
  const int n_kv = static_cast<int>(hf.get_int_in_or("num_key_value_heads", n_head, 1, kMaxConfigDim));
  const int head_dim = static_cast<int>(hf.get_int_in_or("head_dim", n_embd / n_head, 1, kMaxConfigDim));
  const int n_vocab = pos("vocab_size");
  if (head_dim <= 0) fail("{}: hidden_size {} is smaller than num_attention_heads {}", hf.name(), n_embd, n_head);
  if (int64_t{n_head} * head_dim > kMaxConfigDim)
    fail("{}: num_attention_heads {} x head_dim {} exceeds {}", hf.name(), n_head, head_dim, kMaxConfigDim);
  const double eps = hf.get_float_in_or("rms_norm_eps", 1e-6, 0, 1);
  double partial = hf.get_float_in_or("partial_rotary_factor", 1.0, 0, 1);
  // transformers 5 moves it into rope_parameters.
  if (const nlohmann::json* rp = hf.find("rope_parameters"); rp && rp->is_object())
    if (auto it = rp->find("partial_rotary_factor"); it != rp->end() && !it->is_null())
      partial = json_float_in(*it, hf.name(), "rope_parameters.partial_rotary_factor", 0, 1);
  const int rope_dim = static_cast<int>(std::lround(head_dim * partial));
  const std::string act = hf.get_string_or("hidden_activation", hf.get_string_or("hidden_act", fam.gelu ? "gelu_pytorch_tanh" : "silu"));
  const bool act_ok = fam.gelu ? (act == "gelu_pytorch_tanh" || act == "gelu_new" || act == "gelu") : act == "silu";
  if (!act_ok) fail("{}: hidden activation '{}' is not the {} family's", hf.name(), act, fam.name);
  if (hf.get_bool_or("mlp_bias", false)) fail("{}: 'mlp_bias' true is not supported", hf.name());
  if (hf.get_bool_or("use_sliding_window", false))
    fail("{}: 'use_sliding_window' true is not supported for {}", hf.name(), mt);
  if (fam.gpt_oss) {
    Converter cv(hf, fam, st, weights);
    gpt_oss_from_hf(hf, fam, st, cv, weights, n_layer, n_embd, n_head, n_kv, head_dim, n_vocab, eps);
    return cv.writer().serialize();
  }
  if (fam.mla) {
    Converter cv(hf, fam, st, weights);
    cv.writer().set_string("general.architecture", std::string(fam.gguf_arch));
    cv.writer().set_string("general.name", hf.name());
    deepseek_from_hf(hf, fam, st, cv, n_layer, n_embd, n_ff, n_head, n_vocab, eps);
    return cv.writer().serialize();
  }
  int n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
  if (fam.moe) {
    // Qwen3-MoE names the expert count num_experts (transformers 5 writes
    // num_local_experts); every layer must be sparse.
    n_expert = static_cast<int>(hf.has("num_experts") ? hf.get_int_in("num_experts", 1, 4096)
                                                      : hf.get_int_in("num_local_experts", 1, 4096));
    n_expert_used = static_cast<int>(hf.get_int_in("num_experts_per_tok", 1, 4096));
    n_ff_exp = pos("moe_intermediate_size");
    if (n_expert_used > n_expert || n_expert > 4096)
      fail("{}: num_experts_per_tok {} must be at most the expert count {} (at most 4096)", hf.name(), n_expert_used,
           n_expert);
    require_every_layer_sparse(hf);
    if (fam.gated_shared_expert)
      n_ff_shexp = pos("shared_expert_intermediate_size");
    else if (hf.get_int_or("shared_expert_intermediate_size", 0) != 0)
      fail("{}: shared experts are not supported for {}", hf.name(), mt);
  }
  if (fam.qkv_bias && !hf.get_bool_or("qkv_bias", true))
    fail("{}: 'qkv_bias' false is not supported for {} (its q/k/v projections carry biases)", hf.name(), mt);

  Converter cv(hf, fam, st, weights);
  GGUFWriter& w = cv.writer();
  const std::string a(fam.gguf_arch);
  write_shape_keys(w, a, hf, {n_layer, n_embd, n_ff, n_head, n_kv, head_dim, eps});
  w.set_u32(a + ".rope.dimension_count", static_cast<uint32_t>(rope_dim));
  if (fam.moe) {
    w.set_u32(a + ".expert_count", static_cast<uint32_t>(n_expert));
    w.set_u32(a + ".expert_used_count", static_cast<uint32_t>(n_expert_used));
    w.set_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(n_ff_exp));
    // transformers' Qwen2-MoE config does not renormalise by default, like
    // llama.cpp's qwen2moe.
    w.set_bool(a + ".expert_weights_norm", hf.get_bool_or("norm_topk_prob", fam.expert_norm_default));
    if (n_ff_shexp > 0) w.set_u32(a + ".expert_shared_feed_forward_length", static_cast<uint32_t>(n_ff_shexp));
  }

  const Rope rope = read_rope(hf, "full_attention");
  w.set_f32(a + ".rope.freq_base", static_cast<float>(rope.theta));
  std::vector<float> freqs;
  std::optional<LongRope> longrope;
  if (rope.type == "llama3") {
    freqs = llama3_factors(hf, rope, rope_dim);
  } else if (rope.type == "linear") {
    freqs.assign(static_cast<size_t>(rope_dim / 2), static_cast<float>(rope_param(hf, rope, "factor")));
  } else if (rope.type == "longrope" || rope.type == "su") {
    longrope = longrope_params(hf, rope, rope_dim);
    w.set_u32(a + ".rope.scaling.original_context_length", static_cast<uint32_t>(longrope->original));
    w.set_f32(a + ".rope.scaling.attn_factor", static_cast<float>(longrope->attn_factor));
  } else if (rope.type != "default") {
    fail("{}: RoPE scaling '{}' is not supported (default, linear, llama3 and longrope are)", hf.name(), rope.type);
  }
  if (fam.rope_base_local > 0) {
    const Rope local = read_rope(hf, "sliding_attention");
    const double local_theta = hf.has("rope_local_base_freq") ? hf.get_float_in("rope_local_base_freq", 0, kMaxRopeBase) : local.theta;
    if (local_theta != fam.rope_base_local)
      fail("{}: the sliding-window layers' RoPE base is {}; this engine runs {} with {}", hf.name(), local_theta,
           fam.name, fam.rope_base_local);
  }
  // transformers' Llama ignores a sliding_window key; Mistral applies it.
  const bool window_read = fam.swa != SwaPattern::None || (fam.window_all && mt != "llama");
  if (window_read) {
    if (hf.has("sliding_window")) {
      const int64_t win = hf.get_int_in("sliding_window", 1, int64_t{1} << 30);
      w.set_u32(a + ".attention.sliding_window", static_cast<uint32_t>(win));
    } else if (fam.swa != SwaPattern::None) {
      fail("{}: 'sliding_window' is required for {}", hf.name(), mt);
    }
  }
  if (const nlohmann::json* lt = hf.find("layer_types"); lt && fam.swa != SwaPattern::None) {
    if (!lt->is_array() || static_cast<int>(lt->size()) != n_layer)
      fail("{}: 'layer_types' must list {} layers", hf.name(), n_layer);
    for (int l = 0; l < n_layer; ++l) {
      const bool swa = fam.swa == SwaPattern::EvenLayers ? l % 2 == 0 : (l + 1) % 6 != 0;
      const std::string want = swa ? "sliding_attention" : "full_attention";
      if ((*lt)[static_cast<size_t>(l)] != want)
        fail("{}: layer_types[{}] is {}; this engine runs {} with the pattern that makes it '{}'", hf.name(), l,
             (*lt)[static_cast<size_t>(l)].dump(), fam.name, want);
    }
  }
  for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping"})
    if (hf.has(k)) {
      const double v = hf.get_float_in(k, 0, 1e6);
      w.set_f32(a + "." + k, static_cast<float>(v));
    }
  if (hf.has("query_pre_attn_scalar")) {
    const double s = hf.get_float_in("query_pre_attn_scalar", 0, 1e9);
    if (s != head_dim) w.set_f32(a + ".attention.query_pre_attn_scalar", static_cast<float>(s));
  }

  const int qd = n_head * head_dim, kvd = n_kv * head_dim;
  cv.mat(T::TokenEmbd, 0, n_vocab, n_embd);
  const bool tied = !st.find(*hf_tensor_name(fam, T::Output, 0)) || hf.get_bool_or("tie_word_embeddings", false);
  if (!tied) cv.mat(T::Output, 0, n_vocab, n_embd);
  cv.vec(T::OutputNorm, 0, n_embd, true);
  auto global_vec = [&](T kind, const std::vector<float>& v) {
    w.add_tensor(dense_tensor_name(kind, 0), DType::F32, {static_cast<int64_t>(v.size())}, v.data(), v.size() * 4);
  };
  if (!freqs.empty()) global_vec(T::RopeFreqs, freqs);
  if (longrope) {
    global_vec(T::RopeFactorsLong, longrope->long_factors);
    global_vec(T::RopeFactorsShort, longrope->short_factors);
  }
  const bool attn_bias = fam.qkv_bias || hf.get_bool_or("attention_bias", false);
  for (int l = 0; l < n_layer; ++l) {
    cv.vec(T::AttnNorm, l, n_embd, true);
    if (fam.fused_qkv) {
      cv.mat(T::AttnQkv, l, qd + 2 * kvd, n_embd);
    } else {
      cv.mat(T::AttnQ, l, qd, n_embd, fam.hf_permute_qk ? n_head : 0);
      cv.mat(T::AttnK, l, kvd, n_embd, fam.hf_permute_qk ? n_kv : 0);
      cv.mat(T::AttnV, l, kvd, n_embd);
      if (attn_bias) {
        if (fam.hf_permute_qk) fail("{}: q/k biases of a llama-family checkpoint are not supported", hf.name());
        cv.vec(T::AttnQ, l, qd, false, "bias");
        cv.vec(T::AttnK, l, kvd, false, "bias");
        cv.vec(T::AttnV, l, kvd, false, "bias");
      }
    }
    cv.mat(T::AttnOut, l, n_embd, qd);
    if (fam.qk_norm) {
      cv.vec(T::AttnQNorm, l, head_dim, true);
      cv.vec(T::AttnKNorm, l, head_dim, true);
    }
    cv.vec(T::FfnNorm, l, n_embd, true);
    if (fam.moe) {
      cv.mat(T::FfnGateInp, l, n_expert, n_embd);
      cv.mat(T::FfnGateExps, l, n_ff_exp, n_embd, 0, n_expert);
      cv.mat(T::FfnUpExps, l, n_ff_exp, n_embd, 0, n_expert);
      cv.mat(T::FfnDownExps, l, n_embd, n_ff_exp, 0, n_expert);
      if (n_ff_shexp > 0) {
        cv.mat(T::FfnGateShexp, l, n_ff_shexp, n_embd);
        cv.mat(T::FfnUpShexp, l, n_ff_shexp, n_embd);
        cv.mat(T::FfnDownShexp, l, n_embd, n_ff_shexp);
        cv.mat(T::FfnGateInpShexp, l, 1, n_embd);  // GGUF {n_embd, 1}, as llama.cpp's converter keeps it
      }
    } else if (fam.fused_gate_up) {
      cv.mat(T::FfnUp, l, 2 * int64_t{n_ff}, n_embd);
      cv.mat(T::FfnDown, l, n_embd, n_ff);
    } else {
      cv.mat(T::FfnGate, l, n_ff, n_embd);
      cv.mat(T::FfnUp, l, n_ff, n_embd);
      cv.mat(T::FfnDown, l, n_embd, n_ff);
    }
    if (fam.sandwich_norm) {
      cv.vec(T::AttnPostNorm, l, n_embd, true);
      cv.vec(T::FfnPostNorm, l, n_embd, true);
    }
  }
  return w.serialize();
}

}  // namespace megakern
