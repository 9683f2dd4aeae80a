// Kimi K3 checkpoints: config.json, and the safetensors writer and reader
// (our layout, and the published reference's through model/kimi_layout.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"
#include "io/config_value.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/kimi.h"
#include "model/kimi_builder.h"

namespace megakern {

namespace {
constexpr int kBlock = kKimiMxBlock;
}  // namespace

// ---------------------------------------------------------------------------
// config.json

std::string kimi_config_to_json(const KimiConfig& c) {
  nlohmann::ordered_json j;
  j["model_type"] = "kimi_k3";
  j["name"] = c.name;
  j["num_hidden_layers"] = c.n_layer;
  j["hidden_size"] = c.hidden;
  j["vocab_size"] = c.vocab;
  j["rms_norm_eps"] = c.rms_eps;
  j["tie_word_embeddings"] = false;
  j["full_attn_interval"] = c.mla_interval;
  j["attn_res_block_size"] = c.attn_res_block;
  j["linear_attn_config"] = {{"num_heads", c.kda_n_head},
                             {"head_dim", c.kda_head_dim},
                             {"gate_low_rank_dim", c.kda_gate_rank},
                             {"short_conv_kernel_size", c.conv_kernel},
                             {"gate_lower_bound", c.kda_lower_bound}};
  j["num_attention_heads"] = c.mla_n_head;
  j["q_lora_rank"] = c.q_lora_rank;
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_dim;
  j["qk_rope_head_dim"] = c.qk_extra_dim;  // the extra (unrotated) dims, DeepSeek-V3's field
  j["v_head_dim"] = c.v_head_dim;
  j["intermediate_size"] = c.dense_ff;
  j["first_k_dense_replace"] = c.n_dense_layers;
  j["n_routed_experts"] = c.n_expert;
  j["num_experts_per_tok"] = c.n_expert_used;
  j["moe_intermediate_size"] = c.expert_ff;
  j["moe_latent_size"] = c.moe_latent;
  j["shared_expert_intermediate_size"] = c.shared_ff;
  return j.dump(2) + "\n";
}

KimiConfig kimi_config_from_json(const std::string& text, const std::string& where) {
  const nlohmann::json j = parse_config_json(text, where);
  if (!j.is_object()) fail("{}: expected a JSON object", where);
  if (j.value("model_type", std::string()) != "kimi_k3")
    fail("{}: model_type is '{}', expected 'kimi_k3'", where, j.value("model_type", std::string("(missing)")));
  // Integers in [lo, hi], numbers finite and in (lo, hi] (io/config_value.h).
  auto get_int = [&](const nlohmann::json& o, const char* key, const std::string& path, int64_t lo = 1,
                     int64_t hi = kMaxConfigDim) -> int {
    if (!o.contains(key)) fail("{}: key '{}' is missing", where, path + key);
    return static_cast<int>(json_int_in(o[key], where, path + key, lo, hi));
  };
  auto get_float = [&](const nlohmann::json& o, const char* key, const std::string& path, double def,
                       double lo = -1e6, double hi = 1e6) -> double {
    if (!o.contains(key)) return def;
    return json_float_in(o[key], where, path + key, lo, hi);
  };
  KimiConfig c;
  c.name = j.value("name", std::string("kimi-k3"));
  c.n_layer = get_int(j, "num_hidden_layers", "", 1, kMaxConfigLayers);
  c.hidden = get_int(j, "hidden_size", "");
  c.vocab = get_int(j, "vocab_size", "");
  c.rms_eps = get_float(j, "rms_norm_eps", "", 1e-5, 0, 1);
  if (j.value("tie_word_embeddings", false)) fail("{}: tied embeddings are not supported for Kimi K3", where);
  c.mla_interval = get_int(j, "full_attn_interval", "", 1, kMaxConfigLayers);
  c.attn_res_block = get_int(j, "attn_res_block_size", "", 1, kMaxConfigLayers);
  if (!j.contains("linear_attn_config") || !j["linear_attn_config"].is_object())
    fail("{}: key 'linear_attn_config' (an object) is missing", where);
  const auto& la = j["linear_attn_config"];
  c.kda_n_head = get_int(la, "num_heads", "linear_attn_config.");
  c.kda_head_dim = get_int(la, "head_dim", "linear_attn_config.");
  c.kda_gate_rank = get_int(la, "gate_low_rank_dim", "linear_attn_config.");
  c.conv_kernel = get_int(la, "short_conv_kernel_size", "linear_attn_config.");
  c.kda_lower_bound = static_cast<float>(get_float(la, "gate_lower_bound", "linear_attn_config.", -5.0));
  c.mla_n_head = get_int(j, "num_attention_heads", "");
  c.q_lora_rank = get_int(j, "q_lora_rank", "");
  c.kv_lora_rank = get_int(j, "kv_lora_rank", "");
  c.qk_nope_dim = get_int(j, "qk_nope_head_dim", "");
  c.qk_extra_dim = get_int(j, "qk_rope_head_dim", "", 0);
  c.v_head_dim = get_int(j, "v_head_dim", "");
  c.dense_ff = get_int(j, "intermediate_size", "");
  c.n_dense_layers = get_int(j, "first_k_dense_replace", "", 0, kMaxConfigLayers);
  c.n_expert = get_int(j, "n_routed_experts", "", 1, 4096);
  c.n_expert_used = get_int(j, "num_experts_per_tok", "", 1, 4096);
  c.expert_ff = get_int(j, "moe_intermediate_size", "");
  c.moe_latent = get_int(j, "moe_latent_size", "");
  c.shared_ff = get_int(j, "shared_expert_intermediate_size", "");
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  return c;
}

// ---------------------------------------------------------------------------
// Writing.

namespace {

struct Writer {
  SafetensorsWriter w;

  // Rows of several matrices (same type) stacked into one tensor.
  struct Rows {
    const MatView* m;
    int64_t begin, end;
  };
  void mat(const std::string& name, const std::vector<Rows>& pieces, std::vector<int64_t> shape = {}) {
    const MatView& m0 = *pieces[0].m;
    const char* dt = safetensors_float_dtype(m0.type);
    int64_t rows = 0;
    for (const auto& p : pieces) rows += p.end - p.begin;
    if (shape.empty()) shape = {rows, m0.cols};
    std::vector<uint8_t> bytes;
    for (const auto& p : pieces) {
      MK_CHECK(p.m->type == m0.type && p.m->cols == m0.cols, "stacked pieces of '{}' differ", name);
      for (int64_t r = p.begin; r < p.end; ++r) {
        if (dt) {
          bytes.insert(bytes.end(), p.m->row(r), p.m->row(r) + p.m->row_bytes);
        } else {  // a block format: written as f32
          std::vector<float> f(static_cast<size_t>(m0.cols));
          dtype_traits(m0.type).dequantize(p.m->row(r), f.data(), m0.cols);
          const auto* b = reinterpret_cast<const uint8_t*>(f.data());
          bytes.insert(bytes.end(), b, b + f.size() * 4);
        }
      }
    }
    w.add(name, dt ? dt : "F32", std::move(shape), std::move(bytes));
  }
  void mat(const std::string& name, const MatView& m) { mat(name, {{&m, 0, m.rows}}); }
  void vec(const std::string& name, const std::vector<float>& v, std::vector<int64_t> shape = {}) {
    if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
    w.add_f32(name, std::move(shape), v.data());
  }
  // Rows [first, first + n) of an expert matrix as gpt-oss style MXFP4 blocks and scales.
  void experts(const std::string& name, const MatView& m, int64_t first, int64_t n) {
    const int64_t nb = m.cols / kBlock;
    const size_t bb = dtype_traits(m.type).block_bytes;
    std::vector<uint8_t> blocks(static_cast<size_t>(n * nb * 16)), scales(static_cast<size_t>(n * nb));
    uint8_t codes[kBlock];
    for (int64_t r = 0; r < n; ++r)
      for (int64_t b = 0; b < nb; ++b) {
        const size_t i = static_cast<size_t>(r * nb + b);
        mx_block_codes(m.type, m.row(first + r) + static_cast<size_t>(b) * bb, scales[i], codes);
        for (int q = 0; q < 16; ++q) blocks[i * 16 + q] = static_cast<uint8_t>(codes[2 * q] | (codes[2 * q + 1] << 4));
      }
    w.add(name + ".weight_blocks", "U8", {n, nb, 16}, std::move(blocks));
    w.add(name + ".weight_scales", "U8", {n, nb}, std::move(scales));
  }
};

}  // namespace

void KimiModel::save(const std::string& dir) const {
  namespace fs = std::filesystem;
  const KimiConfig& c = cfg_;
  if (!c.attn_res || c.moe_latent == 0 || c.kda_out_gate_rank > 0 || !c.mla_layers.empty())
    fail("{}: only Kimi K3 models are written as checkpoints (this one is Kimi Linear, read from its own files)", dir);
  write_checkpoint_config(dir, kimi_config_to_json(c));
  Writer W;
  const int64_t KD = c.kda_key_dim(), D = c.kda_head_dim, K = c.conv_kernel;
  W.mat("model.embed_tokens.weight", tok_embd_);
  for (int l = 0; l < c.n_layer; ++l) {
    const KimiLayer& L = layers_[static_cast<size_t>(l)];
    const std::string p = fmt::format("model.layers.{}.", l);
    W.vec(p + "input_layernorm.weight", L.attn_norm);
    W.vec(p + "post_attention_layernorm.weight", L.mlp_norm);
    W.vec(p + "attn_res.weight", L.attn_res);
    W.vec(p + "mlp_res.weight", L.mlp_res);
    const std::string a = p + "self_attn.";
    if (L.mla) {
      const int64_t nh = c.mla_n_head, Dn = c.qk_nope_dim, Dv = c.v_head_dim;
      W.mat(a + "q_a_proj.weight", L.q_a);
      W.vec(a + "q_a_layernorm.weight", L.q_a_norm);
      W.mat(a + "q_b_proj.weight", L.q_b);
      W.mat(a + "kv_a_proj_with_mqa.weight", L.kv_a);
      W.vec(a + "kv_a_layernorm.weight", L.kv_a_norm);
      std::vector<Writer::Rows> kvb;
      for (int64_t h = 0; h < nh; ++h) {
        kvb.push_back({&L.kv_b_k, h * Dn, (h + 1) * Dn});
        kvb.push_back({&L.kv_b_v, h * Dv, (h + 1) * Dv});
      }
      W.mat(a + "kv_b_proj.weight", kvb);
      W.mat(a + "g_proj.weight", L.gate);
    } else {
      W.mat(a + "q_proj.weight", {{&L.kda_in, 0, KD}});
      W.mat(a + "k_proj.weight", {{&L.kda_in, KD, 2 * KD}});
      W.mat(a + "v_proj.weight", {{&L.kda_in, 2 * KD, 3 * KD}});
      W.mat(a + "g_proj.weight", {{&L.kda_in, 3 * KD, 4 * KD}});
      W.mat(a + "b_proj.weight", {{&L.kda_in, 4 * KD, 4 * KD + c.kda_n_head}});
      W.mat(a + "f_a_proj.weight", L.f_a);
      W.mat(a + "f_b_proj.weight", L.f_b);
      const char* conv_names[3] = {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"};
      for (int i = 0; i < 3; ++i)
        W.w.add_f32(a + conv_names[i], {KD, 1, K}, L.conv.data() + static_cast<size_t>(i * KD * K));
      W.vec(a + "A_log", L.a_log, {1, 1, c.kda_n_head, 1});
      W.vec(a + "dt_bias", L.dt_bias);
      W.vec(a + "o_norm.weight", L.o_norm, {D});
    }
    W.mat(a + "o_proj.weight", L.o_proj);
    const std::string mp = p + "mlp.";
    if (L.dense) {
      W.mat(mp + "gate_proj.weight", L.mlp_gate);
      W.mat(mp + "up_proj.weight", L.mlp_up);
      W.mat(mp + "down_proj.weight", L.mlp_down);
    } else {
      const int64_t F = c.expert_ff, Lt = c.moe_latent;
      W.mat(mp + "gate.weight", L.router);
      W.vec(mp + "gate.e_score_correction_bias", L.router_bias);
      W.mat(mp + "latent_down_proj.weight", L.latent_down);
      W.vec(mp + "latent_norm.weight", L.latent_norm);
      W.mat(mp + "latent_up_proj.weight", L.latent_up);
      for (int64_t e = 0; e < c.n_expert; ++e) {
        const std::string ep = fmt::format("{}experts.{}.", mp, e);
        W.experts(ep + "gate_proj", L.experts_gu, e * 2 * F, F);
        W.experts(ep + "up_proj", L.experts_gu, e * 2 * F + F, F);
        W.experts(ep + "down_proj", L.experts_down, e * Lt, Lt);
      }
      W.mat(mp + "shared_experts.gate_proj.weight", L.mlp_gate);
      W.mat(mp + "shared_experts.up_proj.weight", L.mlp_up);
      W.mat(mp + "shared_experts.down_proj.weight", L.mlp_down);
    }
  }
  W.vec("model.attn_res.weight", final_res_);
  W.vec("model.norm.weight", final_norm_);
  W.mat("lm_head.weight", lm_head_);
  W.w.set_metadata("format", "pt");
  W.w.write((fs::path(dir) / "model.safetensors").string());
}

// ---------------------------------------------------------------------------
// Loading.

namespace {

struct Loader {
  KimiBuilder& B;
  const KimiTensors& st;

  const SafetensorsTensor& get(const std::string& name, const std::vector<int64_t>& shape) const {
    const SafetensorsTensor* t = st.find(name);
    if (!t) fail("{}: tensor '{}' is missing (expected shape {})", st.path, name, shape_str(shape));
    if (t->shape != shape) fail("{}: tensor '{}' has shape {}, expected {}", st.path, name, shape_str(t->shape), shape_str(shape));
    return *t;
  }
  // Several 2-D tensors [rows_i][cols] stacked into one matrix; kept in their
  // float type when they share one of F32/F16/BF16, else converted to F32.
  // Pieces kept in their type that follow each other in the mapped file, at
  // an address aligned for the type, are used in place (a view, no copy).
  struct Piece {
    const SafetensorsTensor* t;
    int64_t begin, end;  // rows
  };
  MatView stack(const std::vector<Piece>& pieces) {
    const int64_t cols = pieces[0].t->shape.back();
    const std::optional<DType> first = safetensors_float_format(pieces[0].t->dtype);
    DType dt = first.value_or(DType::F32);
    bool keep = first.has_value();
    for (const auto& p : pieces) {
      if (safetensors_float_format(p.t->dtype) != first) keep = false;
      if (p.t->dtype.rfind("F", 0) != 0 && p.t->dtype != "BF16")
        fail("{}: tensor '{}' has dtype {}; expected a float type", st.path, p.t->name, p.t->dtype);
    }
    if (!keep) dt = DType::F32;
    MatView v;
    v.type = dt;
    v.cols = cols;
    v.row_bytes = row_bytes(dt, cols);
    for (const auto& p : pieces) v.rows += p.end - p.begin;
    if (keep) {
      const uint8_t* at = pieces[0].t->data + static_cast<size_t>(pieces[0].begin) * v.row_bytes;
      bool adjacent = reinterpret_cast<uintptr_t>(at) % (dt == DType::F32 ? 4 : 2) == 0;
      const uint8_t* next = at;
      for (const auto& p : pieces) {
        adjacent = adjacent && p.t->data + static_cast<size_t>(p.begin) * v.row_bytes == next;
        next += static_cast<size_t>(p.end - p.begin) * v.row_bytes;
      }
      if (adjacent) {
        v.data = at;
        return v;
      }
    }
    uint8_t* dst = B.own(v.row_bytes * static_cast<size_t>(v.rows));
    v.data = dst;
    for (const auto& p : pieces) {
      const size_t n = static_cast<size_t>(p.end - p.begin) * v.row_bytes;
      if (keep) {
        std::memcpy(dst, p.t->data + static_cast<size_t>(p.begin) * v.row_bytes, n);
      } else {
        const std::vector<float> f = to_f32(*p.t);
        std::memcpy(dst, f.data() + static_cast<size_t>(p.begin * cols), n);
      }
      dst += n;
    }
    return v;
  }
  MatView mat(const std::string& name, int64_t rows, int64_t cols) {
    const auto& t = get(name, {rows, cols});
    return stack({{&t, 0, rows}});
  }
  std::vector<float> vec(const std::string& name, const std::vector<int64_t>& shape) { return to_f32(get(name, shape)); }
  // A per-head vector of n values stored with any shape of n elements.
  std::vector<float> any_shape(const std::string& name, int64_t n) {
    const SafetensorsTensor* t = st.find(name);
    if (!t) fail("{}: tensor '{}' is missing (expected {} values)", st.path, name, n);
    if (t->numel() != n) fail("{}: tensor '{}' has shape {} ({} values), expected {} values", st.path, name, shape_str(t->shape), t->numel(), n);
    return to_f32(*t);
  }
  // Expert matrices [rows][cols] for every expert, written into rows
  // [e * stride + offset, + rows) of dst (an MXFP4 matrix).
  void expert(const std::string& name, int64_t rows, int64_t cols, MatView& dst, int64_t first_row) {
    const int64_t nb = cols / kBlock;
    const size_t bb = dtype_traits(DType::MXFP4).block_bytes;
    uint8_t* out = const_cast<uint8_t*>(dst.row(first_row));
    if (const SafetensorsTensor* f = st.find(name + ".weight")) {
      if (f->shape != std::vector<int64_t>{rows, cols})
        fail("{}: tensor '{}' has shape {}, expected {}", st.path, f->name, shape_str(f->shape), shape_str({rows, cols}));
      const std::vector<float> v = to_f32(*f);
      for (int64_t r = 0; r < rows; ++r)
        dtype_traits(DType::MXFP4).quantize(v.data() + r * cols, out + static_cast<size_t>(r) * dst.row_bytes, cols);
      return;
    }
    const auto& blocks = get(name + ".weight_blocks", {rows, nb, 16});
    const auto& scales = get(name + ".weight_scales", {rows, nb});
    if (blocks.dtype != "U8" || scales.dtype != "U8")
      fail("{}: '{}.weight_blocks' / '.weight_scales' must be U8, got {} / {}", st.path, name, blocks.dtype, scales.dtype);
    // E8M0 exponents 0 (2^-127) and 255 (NaN in the OCP format) are not
    // normal, finite scales; the reference loader rejects them (kimi/load.py
    // Checkpoint.experts / expert), and so do we, naming the first one.
    for (size_t i = 0; i < static_cast<size_t>(rows * nb); ++i)
      if (scales.data[i] == 0 || scales.data[i] == 255)
        fail("{}: '{}.weight_scales' row {} block {} holds E8M0 exponent {}; expected a normal, finite scale (1..254)",
             st.path, name, static_cast<int64_t>(i) / nb, static_cast<int64_t>(i) % nb, scales.data[i]);
    uint8_t codes[kBlock];
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < nb; ++b) {
        const size_t i = static_cast<size_t>(r * nb + b);
        for (int q = 0; q < 16; ++q) {
          const uint8_t byte = blocks.data[i * 16 + q];
          codes[2 * q] = byte & 0x0f;
          codes[2 * q + 1] = byte >> 4;
        }
        mx_codes_block(DType::MXFP4, scales.data[i], codes, out + static_cast<size_t>(r) * dst.row_bytes + static_cast<size_t>(b) * bb);
      }
  }
};

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

std::unique_ptr<KimiModel> KimiModel::load(const std::string& dir, const KimiWeightOptions& o) {
  try {
    return load_checkpoint(dir, o);
  } catch (const Error& e) {
    // In the reference's layout, name the tensor as that checkpoint does too.
    const std::string msg = e.what();
    std::ifstream f(std::filesystem::path(dir) / "config.json");
    std::stringstream ss;
    ss << f.rdbuf();
    const size_t a = msg.find("'model."), a2 = msg.find("'lm_head.");
    const size_t at = std::min(a, a2);
    if (!f || !is_kimi_reference_config(ss.str()) || at == std::string::npos) throw;
    const size_t end = msg.find('\'', at + 1);
    if (end == std::string::npos) throw;
    fail("{} (the tensor is '{}' in the reference layout)", msg, kimi_reference_name(msg.substr(at + 1, end - at - 1)));
  }
}

std::unique_ptr<KimiModel> KimiModel::load_checkpoint(const std::string& dir, const KimiWeightOptions& o) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) fail("'{}' is not a directory (expected config.json and model.safetensors)", dir);
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  std::unique_ptr<KimiModel> m(new KimiModel());
  const std::string text = read_text(cfg_path);
  // The weights are views of the mapped files where their format allows
  // (Loader::stack); a checkpoint in the reference's layout is read through
  // renamed views of its tensors (model/kimi_layout.cpp).
  const bool reference = is_kimi_reference_config(text);
  if (!reference) m->cfg_ = kimi_config_from_json(text, cfg_path);
  m->st_ = std::make_unique<SafetensorsModel>(SafetensorsModel::open(dir));
  const KimiTensors st = reference ? open_kimi_reference(*m->st_, cfg_path, text, m->cfg_) : kimi_tensors(*m->st_);
  const KimiConfig& c = m->cfg_;
  KimiBuilder B{*m};
  Loader R{B, st};
  const int64_t H = c.hidden, V = c.vocab, KD = c.kda_key_dim(), D = c.kda_head_dim, K = c.conv_kernel;
  m->tok_embd_ = R.mat("model.embed_tokens.weight", V, H);
  m->lm_head_ = R.mat("lm_head.weight", V, H);
  m->final_norm_ = R.vec("model.norm.weight", {H});
  m->final_res_ = R.vec("model.attn_res.weight", {H});
  int n_mla = 0, n_kda = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    KimiLayer L;
    const std::string p = fmt::format("model.layers.{}.", l);
    L.mla = c.is_mla(l);
    L.dense = c.is_dense(l);
    L.cache_index = L.mla ? n_mla++ : n_kda++;
    L.attn_norm = R.vec(p + "input_layernorm.weight", {H});
    L.mlp_norm = R.vec(p + "post_attention_layernorm.weight", {H});
    L.attn_res = R.vec(p + "attn_res.weight", {H});
    L.mlp_res = R.vec(p + "mlp_res.weight", {H});
    const std::string a = p + "self_attn.";
    if (L.mla) {
      const int64_t nh = c.mla_n_head, Dn = c.qk_nope_dim, Dv = c.v_head_dim, ql = c.q_lora_rank, kvl = c.kv_lora_rank;
      L.q_a = R.mat(a + "q_a_proj.weight", ql, H);
      L.q_a_norm = R.vec(a + "q_a_layernorm.weight", {ql});
      L.q_b = R.mat(a + "q_b_proj.weight", nh * c.mla_k_dim(), ql);
      L.kv_a = R.mat(a + "kv_a_proj_with_mqa.weight", kvl + c.qk_extra_dim, H);
      L.kv_a_norm = R.vec(a + "kv_a_layernorm.weight", {kvl});
      const auto& kvb = R.get(a + "kv_b_proj.weight", {nh * (Dn + Dv), kvl});
      std::vector<Loader::Piece> kp, vp;
      for (int64_t h = 0; h < nh; ++h) {
        kp.push_back({&kvb, h * (Dn + Dv), h * (Dn + Dv) + Dn});
        vp.push_back({&kvb, h * (Dn + Dv) + Dn, (h + 1) * (Dn + Dv)});
      }
      L.kv_b_k = R.stack(kp);
      L.kv_b_v = R.stack(vp);
      L.gate = R.mat(a + "g_proj.weight", nh * Dv, H);
      L.o_proj = R.mat(a + "o_proj.weight", H, nh * Dv);
    } else {
      const auto& q = R.get(a + "q_proj.weight", {KD, H});
      const auto& k = R.get(a + "k_proj.weight", {KD, H});
      const auto& v = R.get(a + "v_proj.weight", {KD, H});
      const auto& g = R.get(a + "g_proj.weight", {KD, H});
      const auto& b = R.get(a + "b_proj.weight", {c.kda_n_head, H});
      L.kda_in = R.stack({{&q, 0, KD}, {&k, 0, KD}, {&v, 0, KD}, {&g, 0, KD}, {&b, 0, c.kda_n_head}});
      L.f_a = R.mat(a + "f_a_proj.weight", c.kda_gate_rank, H);
      L.f_b = R.mat(a + "f_b_proj.weight", KD, c.kda_gate_rank);
      for (const char* cn : {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"}) {
        const auto w = R.vec(a + cn, {KD, 1, K});
        L.conv.insert(L.conv.end(), w.begin(), w.end());
      }
      L.a_log = R.any_shape(a + "A_log", c.kda_n_head);
      L.dt_bias = R.any_shape(a + "dt_bias", KD);
      L.o_norm = R.vec(a + "o_norm.weight", {D});
      L.o_proj = R.mat(a + "o_proj.weight", H, KD);
    }
    const std::string mp = p + "mlp.";
    if (L.dense) {
      L.mlp_gate = R.mat(mp + "gate_proj.weight", c.dense_ff, H);
      L.mlp_up = R.mat(mp + "up_proj.weight", c.dense_ff, H);
      L.mlp_down = R.mat(mp + "down_proj.weight", H, c.dense_ff);
    } else {
      const int64_t E = c.n_expert, F = c.expert_ff, Lt = c.moe_latent;
      L.router = R.mat(mp + "gate.weight", E, H);
      L.router_bias = R.vec(mp + "gate.e_score_correction_bias", {E});
      L.latent_down = R.mat(mp + "latent_down_proj.weight", Lt, H);
      L.latent_norm = R.vec(mp + "latent_norm.weight", {Lt});
      L.latent_up = R.mat(mp + "latent_up_proj.weight", H, Lt);
      L.experts_gu = B.alloc(DType::MXFP4, E * 2 * F, Lt);
      L.experts_down = B.alloc(DType::MXFP4, E * Lt, F);
      for (int64_t e = 0; e < E; ++e) {
        const std::string ep = fmt::format("{}experts.{}.", mp, e);
        R.expert(ep + "gate_proj", F, Lt, L.experts_gu, e * 2 * F);
        R.expert(ep + "up_proj", F, Lt, L.experts_gu, e * 2 * F + F);
        R.expert(ep + "down_proj", Lt, F, L.experts_down, e * Lt);
      }
      if (o.fp8_experts) {
        L.experts_gu = B.mxfp4_to_fp8(L.experts_gu);
        L.experts_down = B.mxfp4_to_fp8(L.experts_down);
      }
      kimi_expert_bank(L, c);
      L.mlp_gate = R.mat(mp + "shared_experts.gate_proj.weight", c.shared_ff, H);
      L.mlp_up = R.mat(mp + "shared_experts.up_proj.weight", c.shared_ff, H);
      L.mlp_down = R.mat(mp + "shared_experts.down_proj.weight", H, c.shared_ff);
    }
    m->layers_.push_back(std::move(L));
  }
  m->st_->release_tables();  // the views need the mappings only
  return m;
}


}  // namespace megakern
