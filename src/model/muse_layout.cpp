// Muse Spark in the checkpoint layout of the published reference
// (Inferact/tpu-megakernels: musespark/config.py Config.from_checkpoint,
// musespark/__init__.py canonical_layer_from_checkpoint /
// canonical_global_from_checkpoint, musespark/load.py LAYER_SUFFIXES): the
// reader behind MuseModel::load for such a directory, and the writer
// MuseModel::save_reference. See model/muse.h for the names.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/units.h"
#include "io/config_value.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/muse.h"

namespace megakern {

namespace {

// Checkpoint names (musespark/load.py PREFIX, GLOBAL_KEYS, LAYER_SUFFIXES).
constexpr const char* kPrefix = "model.language_model.";
// musespark/config.py: ids >= 201818 are untrained padding rows; the
// reference's loader masks from min(201818, vocab_size).
constexpr int kVocabUsed = 201818;

std::string layer_key(int l, const char* suffix) { return fmt::format("{}layers.{}.{}", kPrefix, l, suffix); }

const char* float_dtype(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    default: return nullptr;
  }
}

std::optional<DType> dtype_of_name(const std::string& st) {
  if (st == "F32") return DType::F32;
  if (st == "F16") return DType::F16;
  if (st == "BF16") return DType::BF16;
  return std::nullopt;
}

// One of the reference config's fields, with its path in the error.
const nlohmann::json& field(const nlohmann::json& c, const std::string& path, const char* key) {
  auto it = c.find(key);
  if (it == c.end()) fail("{}: text_config is missing '{}' (a Muse Spark checkpoint config needs it)", path, key);
  return *it;
}
// An integer field in [lo, hi] (io/config_value.h).
int int_field(const nlohmann::json& c, const std::string& path, const char* key, int64_t lo = 1,
              int64_t hi = kMaxConfigDim) {
  return static_cast<int>(json_int_in(field(c, path, key), path, key, lo, hi));
}
// A number field, finite and in (lo, hi].
double num_field(const nlohmann::json& c, const std::string& path, const char* key, double lo = 0, double hi = 1e12) {
  return json_float_in(field(c, path, key), path, key, lo, hi);
}

// The reference's eff_weight: a zero-centred gain w means r16(1 + w).
float effective(float w) { return bf16_to_f32(f32_to_bf16(1.0f + w)); }

}  // namespace

std::unique_ptr<MuseModel> MuseModel::load_reference(const std::string& dir, const std::string& cpath) {
  nlohmann::json root;
  {
    std::ifstream f(cpath);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    root = parse_config_json(text, cpath);
  }
  const nlohmann::json& t = root.contains("text_config") ? root["text_config"] : root;
  if (!t.is_object()) fail("{}: text_config must be an object", cpath);
  // The settings the reference asserts (Config.from_checkpoint `required`).
  auto expect = [&](const char* key, const nlohmann::json& want) {
    const auto& v = field(t, cpath, key);
    if (v != want) fail("{}: unsupported Muse Spark setting {} = {} (expected {})", cpath, key, v.dump(), want.dump());
  };
  expect("attention_bias", false);
  expect("hidden_act", "silu");
  expect("num_shared_experts", 0);
  expect("routed_scaling_factor", 1.0);
  expect("tie_word_embeddings", false);
  const auto& rope = field(t, cpath, "rope_parameters");
  if (!rope.is_object() || rope.value("rope_type", std::string()) != "default" || !rope.contains("rope_theta") ||
      !rope["rope_theta"].is_number())
    fail("{}: rope_parameters must be {{\"rope_type\": \"default\", \"rope_theta\": <number>}}, got {}", cpath, rope.dump());

  std::unique_ptr<MuseModel> m(new MuseModel());
  MuseConfig& c = m->cfg_;
  c.name = root.value("name", t.value("name", std::string("muse-spark")));
  c.n_layer = int_field(t, cpath, "num_hidden_layers", 1, kMaxConfigLayers);
  c.hidden = int_field(t, cpath, "hidden_size");
  c.expert_dim = int_field(t, cpath, "moe_hidden_size");
  c.expert_ff = int_field(t, cpath, "moe_intermediate_size");
  c.n_expert = int_field(t, cpath, "num_local_experts", 1, 4096);
  c.top_k = int_field(t, cpath, "num_experts_per_tok", 1, 4096);
  c.n_head = int_field(t, cpath, "num_attention_heads");
  c.n_head_kv = int_field(t, cpath, "num_key_value_heads");
  c.head_dim = int_field(t, cpath, "head_dim");
  c.vocab = int_field(t, cpath, "vocab_size");
  c.vocab_used = std::min(kVocabUsed, c.vocab);
  c.window = int_field(t, cpath, "sliding_window", 1, int64_t{1} << 30);
  c.rope_theta = json_float_in(rope["rope_theta"], cpath, "rope_parameters.rope_theta", 0, 1e12);
  c.rms_eps = num_field(t, cpath, "rms_norm_eps", 0, 1);
  c.post_eps = num_field(t, cpath, "post_norm_eps", 0, 1);
  c.qk_scale_factor = num_field(t, cpath, "qk_scale_factor");
  c.router_scale = c.logit_scale = num_field(t, cpath, "output_multiplier");
  c.logit_cap = num_field(t, cpath, "final_logit_softcapping");
  // The residual gates divide by 0.3 (ops/norm.cpp).
  if (num_field(t, cpath, "residual_gate_temperature") != 0.3)
    fail("{}: residual_gate_temperature {} is not supported (only 0.3)", cpath,
         num_field(t, cpath, "residual_gate_temperature"));
  c.validate();
  // The layer pattern: full attention (and NoPE, rope theta 0) at l % 4 == 1.
  const auto& types = field(t, cpath, "layer_types");
  const auto& thetas = field(t, cpath, "layer_rope_theta");
  const auto& mlp = field(t, cpath, "mlp_layer_types");
  if (!types.is_array() || !thetas.is_array() || !mlp.is_array() || types.size() != static_cast<size_t>(c.n_layer) ||
      thetas.size() != static_cast<size_t>(c.n_layer) || mlp.size() != static_cast<size_t>(c.n_layer))
    fail("{}: layer_types, layer_rope_theta and mlp_layer_types must be arrays of num_hidden_layers ({}) entries", cpath,
         c.n_layer);
  for (int l = 0; l < c.n_layer; ++l) {
    const size_t i = static_cast<size_t>(l);
    const bool full = c.is_full_attention(l);
    if (types[i] != (full ? "full_attention" : "sliding_attention"))
      fail("{}: layer_types[{}] is {}; Muse Spark's pattern is sliding, full, sliding, sliding repeating", cpath, l,
           types[i].dump());
    if (!thetas[i].is_number() || thetas[i].get<double>() != (full ? 0.0 : c.rope_theta))
      fail("{}: layer_rope_theta[{}] is {}, expected {}", cpath, l, thetas[i].dump(), full ? 0.0 : c.rope_theta);
    if (mlp[i] != "sparse") fail("{}: mlp_layer_types[{}] is {}; every Muse Spark layer is sparse", cpath, l, mlp[i].dump());
  }

  m->st_ = std::make_unique<SafetensorsModel>(SafetensorsModel::open(dir));
  const SafetensorsModel& st = *m->st_;
  auto get = [&](const std::string& name, const std::vector<int64_t>& shape) -> const SafetensorsTensor& {
    const SafetensorsTensor* f = st.find(name);
    if (!f) fail("{}: tensor '{}' is missing (expected a float tensor of shape {})", st.path(), name, shape_str(shape));
    if (f->shape != shape)
      fail("{}: tensor '{}' has shape {}, expected {}", st.path(), name, shape_str(f->shape), shape_str(shape));
    if (!dtype_of_name(f->dtype))
      fail("{}: tensor '{}' is {}, expected F32, F16 or BF16", st.path(), name, f->dtype);
    return *f;
  };
  auto own = [&](std::vector<uint8_t> bytes) {
    m->owned_.push_back(std::move(bytes));
    return static_cast<const uint8_t*>(m->owned_.back().data());
  };
  auto own_f32 = [&](const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return own(std::move(b));
  };
  // A matrix in format d: used in place when stored so and aligned, else
  // converted row by row (through f32).
  auto matrix = [&](const SafetensorsTensor& f, DType d, int64_t rows, int64_t cols) -> const uint8_t* {
    const size_t align = d == DType::F32 ? 4 : 2;
    if (dtype_of_name(f.dtype) == d && reinterpret_cast<uintptr_t>(f.data) % align == 0) return f.data;
    const std::vector<float> v = to_f32(f);
    std::vector<uint8_t> out(static_cast<size_t>(rows) * row_bytes(d, cols));
    const auto& tr = dtype_traits(d);
    for (int64_t r = 0; r < rows; ++r)
      tr.quantize(v.data() + r * cols, out.data() + static_cast<size_t>(r) * row_bytes(d, cols), cols);
    return own(std::move(out));
  };
  auto norm = [&](const std::string& name, int64_t n, bool zero_centred) {
    std::vector<float> v = to_f32(get(name, {n}));
    if (zero_centred)
      for (auto& x : v) x = effective(x);
    return own_f32(v);
  };
  auto vec = [&](const std::string& name, int64_t n) { return own_f32(to_f32(get(name, {n}))); };

  const int64_t H = c.hidden, E = c.n_expert, F = c.expert_ff, D = c.expert_dim, V = c.vocab;
  const SafetensorsTensor& emb = get(std::string(kPrefix) + "embed_tokens.weight", {V, H});
  // Every dense matrix is held in the embedding's format, the experts in
  // the format of layer 0's gate_up_proj.
  m->dense_ = *dtype_of_name(emb.dtype);
  m->expert_ = *dtype_of_name(get(layer_key(0, "mlp.experts.gate_up_proj"), {E, 2 * F, D}).dtype);
  auto& td = m->tensor_data_;
  td["embed.weight"] = matrix(emb, m->dense_, V, H);
  td["lm_head.weight"] = matrix(get("lm_head.weight", {V, H}), m->dense_, V, H);
  td["final_norm"] = norm(std::string(kPrefix) + "norm.weight", H, false);  // as-is, no + 1
  const DType xd = m->expert_;
  const size_t glu_row = row_bytes(xd, D);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    auto dense = [&](const char* suffix, int64_t rows, int64_t cols) {
      return matrix(get(layer_key(l, suffix), {rows, cols}), m->dense_, rows, cols);
    };
    td[p + "attn_norm"] = norm(layer_key(l, "input_layernorm.weight"), H, true);
    td[p + "attn.q"] = dense("self_attn.q_proj.weight", c.q_dim(), H);
    td[p + "attn.k"] = dense("self_attn.k_proj.weight", c.kv_dim(), H);
    td[p + "attn.v"] = dense("self_attn.v_proj.weight", c.kv_dim(), H);
    td[p + "attn.gate"] = dense("self_attn.gate_proj.weight", c.q_dim(), H);
    td[p + "attn.o"] = dense("self_attn.o_proj.weight", H, c.q_dim());
    td[p + "attn_gamma"] = vec(layer_key(l, "post_attention_residual_gate.gate"), H);
    td[p + "ffn_norm"] = norm(layer_key(l, "pre_feedforward_layernorm.weight"), H, true);
    td[p + "moe.router"] = own_f32(to_f32(get(layer_key(l, "mlp.gate.weight"), {E, H})));
    td[p + "moe.router_bias"] = vec(layer_key(l, "mlp.gate.e_score_correction_bias"), E);
    td[p + "moe.pre"] = dense("mlp.pre_expert_proj.weight", D, H);
    td[p + "moe.pre_norm"] = norm(layer_key(l, "mlp.pre_expert_norm.weight"), D, true);
    // gate_up_proj [E][2F][D]: rows [0, F) of expert e are its gate, [F, 2F)
    // its up (canonical_experts: concatenated, not interleaved), so gate and
    // up are row ranges of the one tensor, F rows apart, 2F rows per expert.
    {
      const SafetensorsTensor& gu = get(layer_key(l, "mlp.experts.gate_up_proj"), {E, 2 * F, D});
      const uint8_t* src = matrix(gu, xd, E * 2 * F, D);
      td[p + "moe.experts.gate"] = src;
      td[p + "moe.experts.up"] = src + static_cast<size_t>(F) * glu_row;
    }
    td[p + "moe.experts.down"] = matrix(get(layer_key(l, "mlp.experts.down_proj"), {E, D, F}), xd, E * D, F);
    td[p + "moe.experts.scale"] = own_f32(std::vector<float>(static_cast<size_t>(3 * E), 1.f));
    td[p + "moe.experts.norm"] = norm(layer_key(l, "mlp.experts.post_expert_norm.weight"), D, true);
    td[p + "moe.post"] = dense("mlp.post_expert_proj.weight", H, D);
    td[p + "post_ffn_norm"] = norm(layer_key(l, "post_feedforward_layernorm.weight"), H, true);
    td[p + "ffn_gamma"] = vec(layer_key(l, "post_feedforward_residual_gate.gate"), H);
  }
  m->glu_stride_ = 2 * static_cast<size_t>(F) * glu_row;
  m->bind();
  return m;
}

void MuseModel::save_reference(const std::string& dir) const {
  namespace fs = std::filesystem;
  const MuseConfig& c = cfg_;
  nlohmann::json layer_types = nlohmann::json::array(), thetas = nlohmann::json::array(),
                 mlp = nlohmann::json::array();
  for (int l = 0; l < c.n_layer; ++l) {
    layer_types.push_back(c.is_full_attention(l) ? "full_attention" : "sliding_attention");
    thetas.push_back(c.is_full_attention(l) ? 0.0 : c.rope_theta);
    mlp.push_back("sparse");
  }
  if (c.full_attn_interval != 4 || c.full_attn_offset != 1)
    fail("{}: the reference layout fixes full attention at l % 4 == 1", c.name);
  if (c.router_scale != c.logit_scale)
    fail("{}: the reference layout has one output_multiplier for the router and the logits", c.name);
  const nlohmann::json text = {
      {"model_type", "muse_spark"},
      {"num_hidden_layers", c.n_layer},
      {"hidden_size", c.hidden},
      {"moe_hidden_size", c.expert_dim},
      {"moe_intermediate_size", c.expert_ff},
      {"num_local_experts", c.n_expert},
      {"num_experts_per_tok", c.top_k},
      {"num_attention_heads", c.n_head},
      {"num_key_value_heads", c.n_head_kv},
      {"head_dim", c.head_dim},
      {"vocab_size", c.vocab},
      {"sliding_window", c.window},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", c.rope_theta}}},
      {"layer_types", layer_types},
      {"layer_rope_theta", thetas},
      {"mlp_layer_types", mlp},
      {"rms_norm_eps", c.rms_eps},
      {"post_norm_eps", c.post_eps},
      {"residual_gate_temperature", 0.3},
      {"qk_scale_factor", c.qk_scale_factor},
      {"output_multiplier", c.router_scale},
      {"final_logit_softcapping", c.logit_cap},
      {"attention_bias", false},
      {"hidden_act", "silu"},
      {"num_shared_experts", 0},
      {"routed_scaling_factor", 1.0},
      {"tie_word_embeddings", false},
      {"bos_token_id", 200000},
      {"eos_token_id", 200001},
      {"pad_token_id", 200018}};
  write_checkpoint_config(dir, nlohmann::json({{"name", c.name}, {"text_config", text}}).dump(2) + "\n");
  SafetensorsWriter w;
  auto vec = [&](const std::string& name, const std::vector<float>& v, bool zero_centred) {
    std::vector<float> out = v;
    if (zero_centred)
      for (auto& x : out) x -= 1.0f;
    w.add_f32(name, {static_cast<int64_t>(out.size())}, out.data());
  };
  // Rows of matrices (each with a row scale) as one tensor: as stored in a
  // float format without scaling, else dequantised (and scaled) to F32.
  struct Piece {
    const MatView* m;
    float scale;
  };
  auto mat = [&](const std::string& name, const std::vector<Piece>& pieces, std::vector<int64_t> shape) {
    const MatView& m0 = *pieces[0].m;
    bool raw = float_dtype(m0.type) != nullptr;
    for (const Piece& p : pieces) raw = raw && p.scale == 1.f;
    std::vector<uint8_t> bytes;
    for (const Piece& p : pieces)
      for (int64_t r = 0; r < p.m->rows; ++r) {
        if (raw) {
          bytes.insert(bytes.end(), p.m->row(r), p.m->row(r) + p.m->row_bytes);
        } else {
          std::vector<float> f(static_cast<size_t>(p.m->cols));
          dtype_traits(p.m->type).dequantize(p.m->row(r), f.data(), p.m->cols);
          for (auto& x : f) x *= p.scale;
          const auto* b = reinterpret_cast<const uint8_t*>(f.data());
          bytes.insert(bytes.end(), b, b + f.size() * 4);
        }
      }
    w.add(name, raw ? float_dtype(m0.type) : "F32", std::move(shape), std::move(bytes));
  };
  const int64_t H = c.hidden, E = c.n_expert, F = c.expert_ff, D = c.expert_dim, V = c.vocab;
  mat(std::string(kPrefix) + "embed_tokens.weight", {{&embed_, 1.f}}, {V, H});
  mat("lm_head.weight", {{&lm_head_, 1.f}}, {V, H});
  vec(std::string(kPrefix) + "norm.weight", final_norm_, false);
  for (int l = 0; l < c.n_layer; ++l) {
    const MuseLayer& L = layers_[static_cast<size_t>(l)];
    vec(layer_key(l, "input_layernorm.weight"), L.attn_norm, true);
    mat(layer_key(l, "self_attn.q_proj.weight"), {{&L.wq, 1.f}}, {c.q_dim(), H});
    mat(layer_key(l, "self_attn.k_proj.weight"), {{&L.wk, 1.f}}, {c.kv_dim(), H});
    mat(layer_key(l, "self_attn.v_proj.weight"), {{&L.wv, 1.f}}, {c.kv_dim(), H});
    mat(layer_key(l, "self_attn.gate_proj.weight"), {{&L.wgate, 1.f}}, {c.q_dim(), H});
    mat(layer_key(l, "self_attn.o_proj.weight"), {{&L.wo, 1.f}}, {H, c.q_dim()});
    vec(layer_key(l, "post_attention_residual_gate.gate"), L.attn_gamma, false);
    vec(layer_key(l, "pre_feedforward_layernorm.weight"), L.ffn_norm, true);
    mat(layer_key(l, "mlp.gate.weight"), {{&L.router, 1.f}}, {E, H});
    vec(layer_key(l, "mlp.gate.e_score_correction_bias"), L.router_bias, false);
    mat(layer_key(l, "mlp.pre_expert_proj.weight"), {{&L.pre, 1.f}}, {D, H});
    vec(layer_key(l, "mlp.pre_expert_norm.weight"), L.pre_norm, true);
    const ExpertBank& b = L.experts;
    auto sc = [](const std::vector<float>& s, int64_t e) { return s.empty() ? 1.f : s[static_cast<size_t>(e)]; };
    std::vector<Piece> gu, dn;
    for (int64_t e = 0; e < E; ++e) {
      gu.push_back({&b.gate[static_cast<size_t>(e)], sc(b.gate_scale, e)});
      gu.push_back({&b.up[static_cast<size_t>(e)], sc(b.up_scale, e)});
      dn.push_back({&b.down[static_cast<size_t>(e)], sc(b.down_scale, e)});
    }
    mat(layer_key(l, "mlp.experts.gate_up_proj"), gu, {E, 2 * F, D});
    mat(layer_key(l, "mlp.experts.down_proj"), dn, {E, D, F});
    vec(layer_key(l, "mlp.experts.post_expert_norm.weight"), b.out_norm, true);
    mat(layer_key(l, "mlp.post_expert_proj.weight"), {{&L.post, 1.f}}, {H, D});
    vec(layer_key(l, "post_feedforward_layernorm.weight"), L.post_ffn_norm, true);
    vec(layer_key(l, "post_feedforward_residual_gate.gate"), L.ffn_gamma, false);
  }
  w.set_metadata("format", "pt");
  w.write((fs::path(dir) / "model.safetensors").string());
}

}  // namespace megakern
