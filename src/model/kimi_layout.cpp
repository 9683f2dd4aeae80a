// Kimi K3 in the checkpoint layout of the published reference
// (Inferact/tpu-megakernels kimi/__init__.py Config.from_checkpoint for the
// config keys, kimi/load.py Checkpoint for the tensor names): translated, on
// load, into the names and shapes KimiModel::load reads (model/kimi.h).
//
// Reference name (prefix P = "language_model.model.")      ours ("model.")
//   P embed_tokens.weight, P norm.weight                     model.embed_tokens.weight, model.norm.weight
//   language_model.lm_head.weight                            lm_head.weight
//   P output_attn_res_norm.weight x _proj.weight (folded)    model.attn_res.weight
//   P layers.l.self_attention_res_{norm,proj}.weight         model.layers.l.attn_res.weight (folded)
//   P layers.l.mlp_res_{norm,proj}.weight                    model.layers.l.mlp_res.weight (folded)
//   P layers.l.block_sparse_moe.gate.*                       model.layers.l.mlp.gate.*
//   ... block_sparse_moe.routed_expert_{down,up}_proj        mlp.latent_{down,up}_proj
//   ... block_sparse_moe.routed_expert_norm                  mlp.latent_norm
//   ... block_sparse_moe.shared_experts.*                    mlp.shared_experts.*
//   ... block_sparse_moe.experts.e.{w1,w3,w2}.weight_packed  mlp.experts.e.{gate,up,down}_proj.weight_blocks
//       [N][K/2] U8, low nibble first                        [N][K/32][16] (the same bytes)
//   ... experts.e.{w1,w3,w2}.weight_scale [N][K/32] E8M0     ....weight_scales (exponents 0 and 255
//                                                            rejected, as kimi/load.py does)
//   every other name (self_attn.*, input_layernorm, post_attention_layernorm, layer 0's mlp.*)
//   keeps its suffix.
// The AttnRes fold is the reference's (kimi/load.py dense `folded`): the
// score weight is norm.weight * proj.weight, element by element, in f32.
// The translation copies no weight: every tensor but the folded ones is a
// view of the mapped checkpoint files (the packed experts keep their bytes;
// only their shape is read differently).
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"
#include "io/config_value.h"
#include "io/safetensors.h"
#include "model/kimi.h"

namespace megakern {

namespace {

constexpr const char* kPrefix = "language_model.model.";

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = s.find(from, at)) != std::string::npos; at += to.size()) s.replace(at, from.size(), to);
}

}  // namespace

bool is_kimi_reference_config(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    return j.is_object() && (j.contains("text_config") || j.contains("routed_expert_hidden_size"));
  } catch (const std::exception&) {
    return false;
  }
}

std::string kimi_reference_name(const std::string& ours) {
  if (ours == "lm_head.weight") return "language_model.lm_head.weight";
  if (!starts_with(ours, "model.")) return ours;
  std::string n = std::string(kPrefix) + ours.substr(std::strlen("model."));
  if (n == std::string(kPrefix) + "attn_res.weight") return std::string(kPrefix) + "output_attn_res_norm.weight";
  replace_all(n, ".attn_res.weight", ".self_attention_res_norm.weight");
  replace_all(n, ".mlp_res.weight", ".mlp_res_norm.weight");
  // The MoE layers' names (layer 0's dense MLP keeps mlp.*).
  for (const char* moe : {".mlp.gate.", ".mlp.experts.", ".mlp.latent_", ".mlp.shared_experts."})
    if (n.find(moe) != std::string::npos) {
      replace_all(n, ".mlp.", ".block_sparse_moe.");
      replace_all(n, ".latent_down_proj.", ".routed_expert_down_proj.");
      replace_all(n, ".latent_up_proj.", ".routed_expert_up_proj.");
      replace_all(n, ".latent_norm.", ".routed_expert_norm.");
      if (n.find(".experts.") != std::string::npos) {
        replace_all(n, ".gate_proj.", ".w1.");
        replace_all(n, ".up_proj.", ".w3.");
        replace_all(n, ".down_proj.", ".w2.");
        replace_all(n, ".weight_blocks", ".weight_packed");
        replace_all(n, ".weight_scales", ".weight_scale");
      }
      break;
    }
  return n;
}

KimiTensors kimi_tensors(const SafetensorsModel& st) {
  KimiTensors out;
  out.path = st.path();
  for (const SafetensorsTensor* t : st.tensors()) out.tensors.emplace(t->name, *t);
  return out;
}

KimiTensors open_kimi_reference(const SafetensorsModel& st, const std::string& cfg_path, const std::string& text,
                                KimiConfig& c) {
  nlohmann::json root = parse_config_json(text, cfg_path);
  const nlohmann::json& t = root.contains("text_config") ? root["text_config"] : root;
  if (!t.is_object()) fail("{}: text_config must be an object", cfg_path);
  auto field = [&](const nlohmann::json& o, const char* key, const std::string& path) -> const nlohmann::json& {
    auto it = o.find(key);
    if (it == o.end()) fail("{}: key '{}' is missing (a Kimi K3 checkpoint config needs it)", cfg_path, path + key);
    return *it;
  };
  // Integers in [lo, hi], numbers finite and in (lo, hi] (io/config_value.h).
  auto get_int = [&](const nlohmann::json& o, const char* key, const std::string& path = "", int64_t lo = 1,
                     int64_t hi = kMaxConfigDim) {
    return static_cast<int>(json_int_in(field(o, key, path), cfg_path, path + key, lo, hi));
  };
  auto get_num = [&](const nlohmann::json& o, const char* key, const std::string& path = "", double lo = -1e6,
                     double hi = 1e6) {
    return json_float_in(field(o, key, path), cfg_path, path + key, lo, hi);
  };
  // The settings kimi/__init__.py Config.from_checkpoint requires.
  const std::vector<std::pair<const char*, nlohmann::json>> required = {
      {"mla_use_nope", true},          {"mla_use_output_gate", true},
      {"latent_moe_use_norm", true},   {"moe_renormalize", true},
      {"moe_router_activation_func", "sigmoid"}, {"hidden_act", "situ"},
      {"first_k_dense_replace", 1},    {"moe_layer_freq", 1},
      {"num_expert_group", 1},         {"routed_scaling_factor", 1.0}};
  for (const auto& [key, want] : required)
    if (field(t, key, "") != want)
      fail("{}: unsupported Kimi K3 setting {} = {} (expected {})", cfg_path, key, t[key].dump(), want.dump());
  const auto& la = field(t, "linear_attn_config", "");
  if (!la.is_object()) fail("{}: 'linear_attn_config' must be an object", cfg_path);
  if (field(la, "use_full_rank_gate", "linear_attn_config.") != true)
    fail("{}: Kimi K3 requires linear_attn_config.use_full_rank_gate = true", cfg_path);
  if (get_num(t, "activation_situ_beta") != 4.0 || get_num(t, "activation_situ_linear_beta") != 25.0)
    fail("{}: activation_situ_beta {} and activation_situ_linear_beta {}: only the SiTU betas 4 and 25 are supported",
         cfg_path, get_num(t, "activation_situ_beta"), get_num(t, "activation_situ_linear_beta"));

  c = KimiConfig{};
  c.name = root.value("name", t.value("name", std::string("kimi-k3")));
  c.hidden = get_int(t, "hidden_size");
  c.moe_latent = get_int(t, "routed_expert_hidden_size");
  c.expert_ff = get_int(t, "moe_intermediate_size");
  c.shared_ff = c.expert_ff * get_int(t, "num_shared_experts", "", 1, 64);
  c.dense_ff = get_int(t, "intermediate_size");
  c.n_expert = get_int(t, "num_experts", "", 1, 4096);
  c.n_expert_used = get_int(t, "num_experts_per_token", "", 1, 4096);
  c.n_layer = get_int(t, "num_hidden_layers", "", 1, kMaxConfigLayers);
  c.mla_n_head = c.kda_n_head = get_int(t, "num_attention_heads");
  c.kda_head_dim = get_int(la, "head_dim", "linear_attn_config.");
  c.qk_nope_dim = t.contains("qk_nope_head_dim") ? get_int(t, "qk_nope_head_dim") : c.kda_head_dim;
  c.v_head_dim = t.contains("v_head_dim") ? get_int(t, "v_head_dim") : c.kda_head_dim;
  c.q_lora_rank = get_int(t, "q_lora_rank");
  c.kv_lora_rank = get_int(t, "kv_lora_rank");
  c.qk_extra_dim = get_int(t, "qk_rope_head_dim", "", 0);
  c.vocab = get_int(t, "vocab_size");
  c.conv_kernel = get_int(la, "short_conv_kernel_size", "linear_attn_config.");
  c.attn_res_block = get_int(t, "attn_res_block_size", "", 1, kMaxConfigLayers);
  c.rms_eps = get_num(t, "rms_norm_eps", "", 0, 1);
  c.kda_lower_bound = static_cast<float>(get_num(la, "gate_lower_bound", "linear_attn_config."));
  if (t.value("tie_word_embeddings", false)) fail("{}: tied embeddings are not supported for Kimi K3", cfg_path);
  // full_attn_layers is 1-based (Config.from_checkpoint subtracts 1); our
  // pattern is every mla_interval-th layer plus the last, so the list must
  // be exactly that.
  const auto& fal = field(la, "full_attn_layers", "linear_attn_config.");
  if (!fal.is_array() || fal.empty() || !fal[0].is_number_integer())
    fail("{}: linear_attn_config.full_attn_layers must be a non-empty list of 1-based layer numbers", cfg_path);
  c.mla_interval = fal[0].get<int>();  // the first MLA layer is mla_interval - 1 (0-based)
  if (c.mla_interval < 1) fail("{}: linear_attn_config.full_attn_layers[0] must be >= 1", cfg_path);
  {
    std::set<int> want, got;
    for (int l = 0; l < c.n_layer; ++l)
      if (c.is_mla(l)) want.insert(l);
    for (const auto& v : fal) {
      if (!v.is_number_integer() || v.get<int>() < 1 || v.get<int>() > c.n_layer)
        fail("{}: linear_attn_config.full_attn_layers holds {}, not a layer number in [1, {}]", cfg_path, v.dump(),
             c.n_layer);
      got.insert(v.get<int>() - 1);
    }
    if (got != want)
      fail("{}: linear_attn_config.full_attn_layers does not follow the Kimi K3 pattern (every {}th layer and the last)",
           cfg_path, c.mla_interval);
  }

  // The forget gate's low rank is not in the config: f_a_proj's rows.
  for (int l = 0; l < c.n_layer && c.kda_gate_rank == 0; ++l)
    if (!c.is_mla(l)) {
      const std::string name = fmt::format("{}layers.{}.self_attn.f_a_proj.weight", kPrefix, l);
      const SafetensorsTensor* f = st.find(name);
      if (!f || f->shape.size() != 2) fail("{}: tensor '{}' is missing or not a matrix", st.path(), name);
      c.kda_gate_rank = static_cast<int>(f->shape[0]);
    }
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: {}", cfg_path, e.what());
  }

  KimiTensors out;
  out.path = st.path() + " (reference layout)";
  std::map<std::string, std::pair<const SafetensorsTensor*, const SafetensorsTensor*>> folds;  // ours -> (norm, proj)
  for (const SafetensorsTensor* f : st.tensors()) {
    std::string n = f->name;
    if (starts_with(n, "language_model.lm_head.")) {
      n = n.substr(std::strlen("language_model."));
    } else if (starts_with(n, kPrefix)) {
      n = "model." + n.substr(std::strlen(kPrefix));
    } else {
      continue;  // not part of the text model
    }
    // The AttnRes pairs, folded below once both halves are seen.
    bool fold = false;
    for (const auto& [stem, ours] : {std::pair<const char*, const char*>{"self_attention_res", "attn_res"},
                                     {"mlp_res", "mlp_res"},
                                     {"output_attn_res", "attn_res"}}) {
      for (const char* half : {"_norm.weight", "_proj.weight"}) {
        const std::string suffix = std::string(stem) + half;
        if (ends_with(n, suffix) && (n.size() == suffix.size() || n[n.size() - suffix.size() - 1] == '.')) {
          const std::string key = n.substr(0, n.size() - suffix.size()) + ours + ".weight";
          (std::strcmp(half, "_norm.weight") == 0 ? folds[key].first : folds[key].second) = f;
          fold = true;
        }
      }
    }
    if (fold) continue;
    replace_all(n, ".block_sparse_moe.", ".mlp.");
    replace_all(n, ".routed_expert_down_proj.", ".latent_down_proj.");
    replace_all(n, ".routed_expert_up_proj.", ".latent_up_proj.");
    replace_all(n, ".routed_expert_norm.", ".latent_norm.");
    SafetensorsTensor o = *f;
    o.name = n;
    if (n.find(".mlp.experts.") != std::string::npos) {
      replace_all(o.name, ".w1.", ".gate_proj.");
      replace_all(o.name, ".w3.", ".up_proj.");
      replace_all(o.name, ".w2.", ".down_proj.");
      if (ends_with(o.name, ".weight_packed")) {
        if (f->dtype != "U8" || f->shape.size() != 2 || f->shape[1] % 16 != 0)
          fail("{}: tensor '{}' is {} {}, expected U8 [N, K/2] with K a multiple of 32", st.path(), f->name, f->dtype,
               shape_str(f->shape));
        o.name = o.name.substr(0, o.name.size() - std::strlen("weight_packed")) + "weight_blocks";
        o.shape = {f->shape[0], f->shape[1] / 16, 16};
      } else if (ends_with(o.name, ".weight_scale")) {
        if (f->dtype != "U8") fail("{}: tensor '{}' is {}, expected U8 E8M0 scales", st.path(), f->name, f->dtype);
        for (size_t i = 0; i < o.n_bytes; ++i)
          if (o.data[i] == 0 || o.data[i] == 255)
            fail("{}: tensor '{}' element {} holds E8M0 exponent {}; expected a normal, finite scale (1..254)",
                 st.path(), f->name, i, o.data[i]);
        o.name += "s";
      }
    }
    const std::string key = o.name;
    if (!out.tensors.emplace(key, std::move(o)).second) fail("{}: two tensors are read as '{}'", st.path(), key);
  }
  for (const auto& [ours, pair] : folds) {
    const auto [norm, proj] = pair;
    if (!norm || !proj)
      fail("{}: '{}' has no {} partner: an attention-residual weight needs both its _norm.weight and _proj.weight",
           st.path(), (norm ? norm : proj)->name, norm ? "_proj.weight" : "_norm.weight");
    const std::vector<float> a = to_f32(*norm), b = to_f32(*proj);
    if (a.size() != b.size() || static_cast<int64_t>(a.size()) != c.hidden)
      fail("{}: '{}' ({}) and '{}' ({}) must both hold hidden_size = {} values", st.path(), norm->name,
           shape_str(norm->shape), proj->name, shape_str(proj->shape), c.hidden);
    std::vector<uint8_t>& bytes = out.computed.emplace_back(a.size() * 4);
    for (size_t i = 0; i < a.size(); ++i) {
      const float v = a[i] * b[i];
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    }
    SafetensorsTensor t;
    t.name = ours;
    t.dtype = "F32";
    t.elem_bytes = 4;
    t.shape = {c.hidden};
    t.data = bytes.data();
    t.n_bytes = bytes.size();
    if (!out.tensors.emplace(ours, std::move(t)).second) fail("{}: two tensors are read as '{}'", st.path(), ours);
  }
  return out;
}

}  // namespace megakern
