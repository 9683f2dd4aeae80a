#include "model/kimi.h"
#include "core/units.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <sys/mman.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "model/architecture.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"

namespace megakern {

namespace {

constexpr int kBlock = 32;  // MXFP4 / FP8 block

// A deterministic stream per tensor: the seed hashed with its name (FNV-1a).
uint64_t hash_name(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

}  // namespace

KimiModel::~KimiModel() {
  if (reserved_) munmap(reserved_, reserved_bytes_);
}

uint8_t* KimiModel::own(size_t bytes) {
  if (reserved_) {
    const size_t at = reserved_used_;
    reserved_used_ += (bytes + 63) / 64 * 64;
    if (reserved_used_ > reserved_bytes_) fail("shapes-only Kimi model: {} bytes of address space reserved, more needed", reserved_bytes_);
    return reserved_ + at;
  }
  owned_.emplace_back(bytes, 0);
  return owned_.back().data();
}

// Everything that fills a KimiModel's fields: synthetic weights, the
// checkpoint reader and writer.
struct KimiBuilder {
  KimiModel& m;

  uint8_t* own(size_t bytes) { return m.own(bytes); }
  bool shapes_only() const { return m.reserved_ != nullptr; }

  // An uninitialised matrix of type t, [rows][cols].
  MatView alloc(DType t, int64_t rows, int64_t cols) {
    MatView v;
    v.type = t;
    v.rows = rows;
    v.cols = cols;
    v.row_bytes = row_bytes(t, cols);
    v.data = m.own(v.row_bytes * static_cast<size_t>(rows));
    return v;
  }
  // A matrix of type t from f32 rows [rows][cols].
  MatView from_f32(DType t, int64_t rows, int64_t cols, const float* src) {
    MatView v = alloc(t, rows, cols);
    const auto& tr = dtype_traits(t);
    for (int64_t r = 0; r < rows; ++r) tr.quantize(src + r * cols, const_cast<uint8_t*>(v.row(r)), cols);
    return v;
  }

  // Re-blocks an MXFP4 matrix to FP8 e4m3 (exact: every e2m1 value is an e4m3 value).
  MatView mxfp4_to_fp8(const MatView& src) {
    MatView v = src;
    v.type = DType::FP8_E4M3;
    v.row_bytes = row_bytes(DType::FP8_E4M3, src.cols);
    uint8_t* d = m.own(v.row_bytes * static_cast<size_t>(src.rows));
    if (shapes_only()) {
      v.data = d;
      return v;
    }
    const size_t nb = static_cast<size_t>(src.cols / kBlock);
    const size_t sb = dtype_traits(DType::MXFP4).block_bytes, db = dtype_traits(DType::FP8_E4M3).block_bytes;
    uint8_t scale, codes[kBlock];
    for (int64_t r = 0; r < src.rows; ++r)
      for (size_t b = 0; b < nb; ++b) {
        mx_block_codes(DType::MXFP4, src.row(r) + b * sb, scale, codes);
        mx_codes_block(DType::FP8_E4M3, scale, codes, d + static_cast<size_t>(r) * v.row_bytes + b * db);
      }
    v.data = d;
    return v;
  }
};

namespace {

// The expert bank of a MoE layer: views of expert e's rows of the stacked matrices.
void make_bank(KimiLayer& L, const KimiConfig& c) {
  ExpertBank& b = L.experts;
  b.n_expert = c.n_expert;
  b.d_in = c.moe_latent;
  b.d_ff = c.expert_ff;
  b.act = ExpertAct::SiTU;
  const int64_t F = c.expert_ff, Lt = c.moe_latent;
  auto rows = [](const MatView& m, int64_t first, int64_t n) {
    MatView v = m;
    v.data = m.row(first);
    v.rows = n;
    return v;
  };
  b.gate.clear();
  b.up.clear();
  b.down.clear();
  for (int64_t e = 0; e < c.n_expert; ++e) {
    b.gate.push_back(rows(L.experts_gu, e * 2 * F, F));
    b.up.push_back(rows(L.experts_gu, e * 2 * F + F, F));
    b.down.push_back(rows(L.experts_down, e * Lt, Lt));
  }
}

// ---------------------------------------------------------------------------
// Synthetic weights.

struct Synth {
  KimiBuilder& B;
  uint64_t seed;
  DType dense;

  std::vector<float> rand(const std::string& name, size_t n, float scale, float offset = 0.f) {
    Rng r{hash_name(seed, name)};
    std::vector<float> v(n);
    for (auto& x : v) x = offset + scale * r.symmetric53();
    return v;
  }
  // Uniform with variance gain^2 / fan_in (uniform(-1,1) has variance 1/3).
  MatView mat(const std::string& name, int64_t rows, int64_t cols, float gain = 1.f, DType t = DType::F32) {
    const DType type = t == DType::F32 ? dense : t;
    if (B.shapes_only()) return B.alloc(type, rows, cols);
    const float a = gain * std::sqrt(3.f / static_cast<float>(cols));
    const auto v = rand(name, static_cast<size_t>(rows * cols), a);
    return B.from_f32(type, rows, cols, v.data());
  }
};

}  // namespace

std::unique_ptr<KimiModel> KimiModel::synthetic(const KimiConfig& c, uint64_t seed, const KimiWeightOptions& o) {
  c.validate();
  if (o.dense != DType::F32 && o.dense != DType::F16 && o.dense != DType::BF16)
    fail("synthetic Kimi weights: dense type must be f32, f16 or bf16, got {}", dtype_traits(o.dense).name);
  std::unique_ptr<KimiModel> m(new KimiModel());
  m->cfg_ = c;
  if (o.shapes_only) {
    // Address space only: PROT_NONE and no reservation of memory, so any
    // access faults at once. 4 TiB covers the largest preset (~1.5 TB).
    const size_t bytes = size_t{1} << 42;
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail("shapes-only Kimi model: cannot reserve {} bytes of address space", bytes);
    m->reserved_ = static_cast<uint8_t*>(p);
    m->reserved_bytes_ = bytes;
  }
  KimiBuilder B{*m};
  Synth S{B, seed, o.dense};
  const int64_t H = c.hidden, V = c.vocab, KD = c.kda_key_dim(), D = c.kda_head_dim;
  // Embedding rows of unit variance; everything else scaled by fan-in.
  m->tok_embd_ = S.mat("embed", V, H, std::sqrt(static_cast<float>(H)));
  m->lm_head_ = S.mat("lm_head", V, H);
  m->final_norm_ = S.rand("final_norm", static_cast<size_t>(H), 0.1f, 1.f);
  m->final_res_ = S.rand("final_res", static_cast<size_t>(H), 0.5f / std::sqrt(static_cast<float>(H)));
  int n_mla = 0, n_kda = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    KimiLayer L;
    const std::string p = fmt::format("l{}.", l);
    L.mla = c.is_mla(l);
    L.dense = c.is_dense(l);
    L.cache_index = L.mla ? n_mla++ : n_kda++;
    L.attn_norm = S.rand(p + "attn_norm", static_cast<size_t>(H), 0.1f, 1.f);
    L.mlp_norm = S.rand(p + "mlp_norm", static_cast<size_t>(H), 0.1f, 1.f);
    L.attn_res = S.rand(p + "attn_res", static_cast<size_t>(H), 0.5f / std::sqrt(static_cast<float>(H)));
    L.mlp_res = S.rand(p + "mlp_res", static_cast<size_t>(H), 0.5f / std::sqrt(static_cast<float>(H)));
    if (L.mla) {
      const int64_t nh = c.mla_n_head;
      L.q_a = S.mat(p + "q_a", c.q_lora_rank, H);
      L.q_a_norm = S.rand(p + "q_a_norm", static_cast<size_t>(c.q_lora_rank), 0.1f, 1.f);
      L.q_b = S.mat(p + "q_b", nh * c.mla_k_dim(), c.q_lora_rank);
      L.kv_a = S.mat(p + "kv_a", c.kv_lora_rank + c.qk_extra_dim, H);
      L.kv_a_norm = S.rand(p + "kv_a_norm", static_cast<size_t>(c.kv_lora_rank), 0.1f, 1.f);
      L.kv_b_k = S.mat(p + "kv_b_k", nh * c.qk_nope_dim, c.kv_lora_rank);
      L.kv_b_v = S.mat(p + "kv_b_v", nh * c.v_head_dim, c.kv_lora_rank);
      L.gate = S.mat(p + "gate", nh * c.v_head_dim, H);
      L.o_proj = S.mat(p + "o_proj", H, nh * c.v_head_dim, 0.5f);
    } else {
      L.kda_in = S.mat(p + "kda_in", c.kda_in_rows(), H);
      L.f_a = S.mat(p + "f_a", c.kda_gate_rank, H);
      L.f_b = S.mat(p + "f_b", KD, c.kda_gate_rank);
      L.conv = S.rand(p + "conv", static_cast<size_t>(c.kda_conv_dim() * c.conv_kernel),
                      std::sqrt(3.f / static_cast<float>(c.conv_kernel)));
      // A = exp(A_log) in [1, 16], as flash-linear-attention initialises it.
      L.a_log = S.rand(p + "a_log", static_cast<size_t>(c.kda_n_head), 0.5f * std::log(16.f), 0.5f * std::log(16.f));
      L.dt_bias = S.rand(p + "dt_bias", static_cast<size_t>(KD), 1.f);
      L.o_norm = S.rand(p + "o_norm", static_cast<size_t>(D), 0.1f, 1.f);
      L.o_proj = S.mat(p + "o_proj", H, KD, 0.5f);
    }
    if (L.dense) {
      L.mlp_gate = S.mat(p + "gate_proj", c.dense_ff, H);
      L.mlp_up = S.mat(p + "up_proj", c.dense_ff, H);
      L.mlp_down = S.mat(p + "down_proj", H, c.dense_ff, 0.5f);
    } else {
      const int64_t E = c.n_expert, F = c.expert_ff, Lt = c.moe_latent;
      L.router = S.mat(p + "router", E, H);
      L.router_bias = S.rand(p + "router_bias", static_cast<size_t>(E), 0.1f);
      L.latent_down = S.mat(p + "latent_down", Lt, H);
      L.latent_norm = S.rand(p + "latent_norm", static_cast<size_t>(Lt), 0.1f, 1.f);
      L.latent_up = S.mat(p + "latent_up", H, Lt, 0.5f);
      L.experts_gu = S.mat(p + "experts_gu", E * 2 * F, Lt, 1.f, DType::MXFP4);
      L.experts_down = S.mat(p + "experts_down", E * Lt, F, 1.f, DType::MXFP4);
      if (o.fp8_experts) {
        L.experts_gu = B.mxfp4_to_fp8(L.experts_gu);
        L.experts_down = B.mxfp4_to_fp8(L.experts_down);
      }
      make_bank(L, c);
      L.mlp_gate = S.mat(p + "shared_gate", c.shared_ff, H);
      L.mlp_up = S.mat(p + "shared_up", c.shared_ff, H);
      L.mlp_down = S.mat(p + "shared_down", H, c.shared_ff, 0.5f);
    }
    m->layers_.push_back(std::move(L));
  }
  return m;
}

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
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail("{}: not valid JSON ({})", where, e.what());
  }
  if (!j.is_object()) fail("{}: expected a JSON object", where);
  if (j.value("model_type", std::string()) != "kimi_k3")
    fail("{}: model_type is '{}', expected 'kimi_k3'", where, j.value("model_type", std::string("(missing)")));
  auto get_int = [&](const nlohmann::json& o, const char* key, const std::string& path) -> int {
    if (!o.contains(key)) fail("{}: key '{}' is missing", where, path + key);
    const auto& v = o[key];
    if (!v.is_number_integer()) fail("{}: key '{}' must be an integer, got {}", where, path + key, v.dump());
    const int64_t x = v.get<int64_t>();
    if (x < 0 || x > (int64_t(1) << 30)) fail("{}: key '{}' = {} is out of range", where, path + key, x);
    return static_cast<int>(x);
  };
  auto get_float = [&](const nlohmann::json& o, const char* key, const std::string& path, double def) -> double {
    if (!o.contains(key)) return def;
    if (!o[key].is_number()) fail("{}: key '{}' must be a number, got {}", where, path + key, o[key].dump());
    return o[key].get<double>();
  };
  KimiConfig c;
  c.name = j.value("name", std::string("kimi-k3"));
  c.n_layer = get_int(j, "num_hidden_layers", "");
  c.hidden = get_int(j, "hidden_size", "");
  c.vocab = get_int(j, "vocab_size", "");
  c.rms_eps = get_float(j, "rms_norm_eps", "", 1e-5);
  if (j.value("tie_word_embeddings", false)) fail("{}: tied embeddings are not supported for Kimi K3", where);
  c.mla_interval = get_int(j, "full_attn_interval", "");
  c.attn_res_block = get_int(j, "attn_res_block_size", "");
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
  c.qk_extra_dim = get_int(j, "qk_rope_head_dim", "");
  c.v_head_dim = get_int(j, "v_head_dim", "");
  c.dense_ff = get_int(j, "intermediate_size", "");
  c.n_dense_layers = get_int(j, "first_k_dense_replace", "");
  c.n_expert = get_int(j, "n_routed_experts", "");
  c.n_expert_used = get_int(j, "num_experts_per_tok", "");
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
  const SafetensorsModel& st;

  const SafetensorsTensor& get(const std::string& name, const std::vector<int64_t>& shape) const {
    const SafetensorsTensor* t = st.find(name);
    if (!t) fail("{}: tensor '{}' is missing (expected shape {})", st.path(), name, shape_str(shape));
    if (t->shape != shape) fail("{}: tensor '{}' has shape {}, expected {}", st.path(), name, shape_str(t->shape), shape_str(shape));
    return *t;
  }
  // Several 2-D tensors [rows_i][cols] stacked into one matrix; kept in their
  // float type when they share one of F32/F16/BF16, else converted to F32.
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
        fail("{}: tensor '{}' has dtype {}; expected a float type", st.path(), p.t->name, p.t->dtype);
    }
    if (!keep) dt = DType::F32;
    MatView v;
    v.type = dt;
    v.cols = cols;
    v.row_bytes = row_bytes(dt, cols);
    for (const auto& p : pieces) v.rows += p.end - p.begin;
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
    if (!t) fail("{}: tensor '{}' is missing (expected {} values)", st.path(), name, n);
    if (t->numel() != n) fail("{}: tensor '{}' has shape {} ({} values), expected {} values", st.path(), name, shape_str(t->shape), t->numel(), n);
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
        fail("{}: tensor '{}' has shape {}, expected {}", st.path(), f->name, shape_str(f->shape), shape_str({rows, cols}));
      const std::vector<float> v = to_f32(*f);
      for (int64_t r = 0; r < rows; ++r)
        dtype_traits(DType::MXFP4).quantize(v.data() + r * cols, out + static_cast<size_t>(r) * dst.row_bytes, cols);
      return;
    }
    const auto& blocks = get(name + ".weight_blocks", {rows, nb, 16});
    const auto& scales = get(name + ".weight_scales", {rows, nb});
    if (blocks.dtype != "U8" || scales.dtype != "U8")
      fail("{}: '{}.weight_blocks' / '.weight_scales' must be U8, got {} / {}", st.path(), name, blocks.dtype, scales.dtype);
    // E8M0 exponents 0 (2^-127) and 255 (NaN in the OCP format) are not
    // normal, finite scales; the reference loader rejects them (kimi/load.py
    // Checkpoint.experts / expert), and so do we, naming the first one.
    for (size_t i = 0; i < static_cast<size_t>(rows * nb); ++i)
      if (scales.data[i] == 0 || scales.data[i] == 255)
        fail("{}: '{}.weight_scales' row {} block {} holds E8M0 exponent {}; expected a normal, finite scale (1..254)",
             st.path(), name, static_cast<int64_t>(i) / nb, static_cast<int64_t>(i) % nb, scales.data[i]);
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
  // A checkpoint in the reference's layout is translated into ours in memory
  // (model/kimi_layout.cpp); `translated` holds its bytes while loading.
  std::vector<uint8_t> translated;
  const bool reference = is_kimi_reference_config(text);
  if (!reference) m->cfg_ = kimi_config_from_json(text, cfg_path);
  const SafetensorsModel st =
      reference ? open_kimi_reference(dir, cfg_path, text, m->cfg_, translated) : SafetensorsModel::open(dir);
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
      make_bank(L, c);
      L.mlp_gate = R.mat(mp + "shared_experts.gate_proj.weight", c.shared_ff, H);
      L.mlp_up = R.mat(mp + "shared_experts.up_proj.weight", c.shared_ff, H);
      L.mlp_down = R.mat(mp + "shared_experts.down_proj.weight", H, c.shared_ff);
    }
    m->layers_.push_back(std::move(L));
  }
  return m;
}

// ---------------------------------------------------------------------------
// The program.

namespace {

MatView row_range(const MatView& m, int64_t first, int64_t n) {
  MatView v = m;
  v.data = m.row(first);
  v.rows = n;
  return v;
}

}  // namespace

DecodeProgram build_kimi_program(const KimiModel& model, int max_rows) {
  if (max_rows < 1 || max_rows > 64) fail("max_rows must be in [1, 64], got {}", max_rows);
  const KimiConfig& c = model.config();
  DecodeProgram p;
  p.model_name = c.name.empty() ? "kimi-k3" : c.name;
  p.n_layer = c.n_layer;
  p.max_rows = max_rows;
  p.n_vocab = c.vocab;
  p.kv_dim = static_cast<int>(c.mla_n_head * c.mla_k_dim());
  p.v_dim = c.mla_n_head * c.v_head_dim;
  p.recurrent = c.n_kda_layers() > 0;
  const int H = c.hidden, NB = c.n_res_blocks(), KD = static_cast<int>(c.kda_key_dim()), nh = c.kda_n_head;
  const int mh = c.mla_n_head, Dk = static_cast<int>(c.mla_k_dim()), Dv = c.v_head_dim;
  const float eps = static_cast<float>(c.rms_eps);

  // Residual blocks: [NB][H] per row; block 0 is the embedding, block b >= 1
  // the prefix of layers [(b-1) * attn_res_block, b * attn_res_block).
  const int res = p.add_slot("res_blocks", -1, NB * H);
  const int emb = p.add_slot("embd", -1, H);
  const int mix = p.add_slot("mix", -1, H);
  const int xn = p.add_slot("xn", -1, H);
  const int proj = p.add_slot("proj", -1, H);
  int qkv = -1, kgate = -1, kbeta = -1, fa = -1, fg = -1, ko = -1;
  if (c.n_kda_layers() > 0) {
    qkv = p.add_slot("kda_qkv", -1, 3 * KD);
    kgate = p.add_slot("kda_gate", -1, KD);
    kbeta = p.add_slot("kda_beta", -1, nh);
    fa = p.add_slot("kda_f_a", -1, c.kda_gate_rank);
    fg = p.add_slot("kda_g", -1, KD);
    ko = p.add_slot("kda_o", -1, KD);
  }
  int qa = -1, qan = -1, q = -1, clat = -1, cn = -1, kext = -1, knope = -1, key = -1, val = -1, mgate = -1, att = -1;
  if (c.n_mla_layers() > 0) {
    qa = p.add_slot("mla_q_a", -1, c.q_lora_rank);
    qan = p.add_slot("mla_q_a_norm", -1, c.q_lora_rank);
    q = p.add_slot("mla_q", -1, mh * Dk);
    clat = p.add_slot("mla_c", -1, c.kv_lora_rank);
    cn = p.add_slot("mla_c_norm", -1, c.kv_lora_rank);
    kext = p.add_slot("mla_k_extra", -1, c.qk_extra_dim);
    knope = p.add_slot("mla_k_nope", -1, mh * c.qk_nope_dim);
    key = p.add_slot("mla_k", -1, mh * Dk);
    val = p.add_slot("mla_v", -1, mh * Dv);
    mgate = p.add_slot("mla_gate", -1, mh * Dv);
    att = p.add_slot("mla_att", -1, mh * Dv);
  }
  int dgate = -1, dup = -1, dact = -1;
  if (c.n_dense_layers > 0) {
    dgate = p.add_slot("dense_gate", -1, c.dense_ff);
    dup = p.add_slot("dense_up", -1, c.dense_ff);
    dact = p.add_slot("dense_act", -1, c.dense_ff);
  }
  int rlog = -1, route = -1, z = -1, eh = -1, ye = -1, rl = -1, rln = -1, sgate = -1, sup = -1, sact = -1, proj2 = -1;
  if (c.n_dense_layers < c.n_layer) {
    rlog = p.add_slot("router_logits", -1, c.n_expert);
    route = p.add_slot("route", -1, 2 * c.n_expert_used);
    z = p.add_slot("moe_latent", -1, c.moe_latent);
    eh = p.add_slot("expert_hidden", -1, c.n_expert_used * c.expert_ff);
    ye = p.add_slot("expert_out", -1, c.n_expert_used * c.moe_latent);
    rl = p.add_slot("moe_mix", -1, c.moe_latent);
    rln = p.add_slot("moe_mix_norm", -1, c.moe_latent);
    sgate = p.add_slot("shared_gate", -1, c.shared_ff);
    sup = p.add_slot("shared_up", -1, c.shared_ff);
    sact = p.add_slot("shared_act", -1, c.shared_ff);
    proj2 = p.add_slot("shared_out", -1, H);
  }

  Op& e = p.add_op(OpKind::Embed, -1, "token_embd");
  e.mat = model.tok_embd();
  e.out = emb;
  Op& e0 = p.add_op(OpKind::AttnResAdd, -1, "res_embd");
  e0.in = emb;
  e0.out = res;
  e0.as<ops::AttnResAdd>().block = 0;
  e0.as<ops::AttnResAdd>().overwrite = true;

  auto mixture = [&](int layer, const char* name, const std::vector<float>& w, int n_blocks) {
    Op& o = p.add_op(OpKind::AttnResMix, layer, name);
    o.in = res;
    o.out = mix;
    o.as<ops::AttnResMix>().query = w;
    o.as<ops::AttnResMix>().eps = eps;
    o.as<ops::AttnResMix>().n_blocks = n_blocks;
  };
  auto add_to_prefix = [&](int layer, const char* name, int in, int block, bool restart) {
    Op& o = p.add_op(OpKind::AttnResAdd, layer, name);
    o.in = in;
    o.out = res;
    o.as<ops::AttnResAdd>().block = block;
    o.as<ops::AttnResAdd>().overwrite = restart;
  };

  for (int l = 0; l < c.n_layer; ++l) {
    const KimiLayer& L = model.layers()[static_cast<size_t>(l)];
    const int blk = c.res_block_of(l);
    const bool restart = l % c.attn_res_block == 0;
    // Attention sublayer: at a block boundary the running prefix (block blk)
    // does not exist yet, so only the finished blocks are mixed.
    mixture(l, "attn_res_mix", L.attn_res, restart ? blk : blk + 1);
    p.add_rmsnorm(l, "attn_norm", L.attn_norm, eps, mix, xn);
    if (L.mla) {
      p.add_matmul(l, "mla_q_a", L.q_a, xn, qa);
      p.add_rmsnorm(l, "mla_q_a_norm", L.q_a_norm, eps, qa, qan);
      p.add_matmul(l, "mla_q_b", L.q_b, qan, q);
      p.add_matmul(l, "mla_kv_a", row_range(L.kv_a, 0, c.kv_lora_rank), xn, clat);
      p.add_matmul(l, "mla_k_extra", row_range(L.kv_a, c.kv_lora_rank, c.qk_extra_dim), xn, kext);
      p.add_matmul(l, "mla_gate", L.gate, xn, mgate);
      p.add_rmsnorm(l, "mla_kv_a_norm", L.kv_a_norm, eps, clat, cn);
      p.add_matmul(l, "mla_k_b", L.kv_b_k, cn, knope);
      p.add_matmul(l, "mla_v_b", L.kv_b_v, cn, val);
      Op& mk = p.add_op(OpKind::MlaKey, l, "mla_key");
      mk.in = knope;
      mk.in2 = kext;
      mk.out = key;
      mk.as<ops::MlaKey>().n_head = mh;
      mk.as<ops::MlaKey>().head_dim = Dk;
      const int marker = p.add_slot("kv_cache", l, 0);
      Op& sk = p.add_op(OpKind::StoreKV, l, "store_kv");
      sk.in = key;
      sk.in2 = val;
      sk.out = marker;
      sk.as<ops::StoreKV>().cache_index = L.cache_index;
      Op& at = p.add_op(OpKind::Attention, l, "attention");
      at.in = q;
      at.in2 = marker;
      at.out = att;
      at.as<ops::Attention>().n_head = mh;
      at.as<ops::Attention>().n_head_kv = mh;
      at.as<ops::Attention>().head_dim = Dk;
      at.as<ops::Attention>().v_head_dim = Dv;
      at.as<ops::Attention>().scale = 1.f / std::sqrt(static_cast<float>(Dk));
      at.as<ops::Attention>().cache_index = L.cache_index;
      Op& g = p.add_op(OpKind::SigmoidGate, l, "mla_out_gate");
      g.in = mgate;
      g.out = att;
      p.add_matmul(l, "mla_o", L.o_proj, att, proj);
    } else {
      // The fused input projection, issued as three products over
      // consecutive row ranges of one matrix.
      p.add_matmul(l, "kda_qkv", row_range(L.kda_in, 0, 3 * KD), xn, qkv);
      p.add_matmul(l, "kda_out_gate", row_range(L.kda_in, 3 * KD, KD), xn, kgate);
      p.add_matmul(l, "kda_beta", row_range(L.kda_in, 4 * KD, nh), xn, kbeta);
      p.add_matmul(l, "kda_f_a", L.f_a, xn, fa);
      p.add_matmul(l, "kda_f_b", L.f_b, fa, fg);
      Op& cv = p.add_op(OpKind::CausalConvSilu, l, "kda_conv");
      cv.out = qkv;
      cv.as<ops::CausalConvSilu>().taps = L.conv;
      cv.as<ops::CausalConvSilu>().cache_index = L.cache_index;
      Op& dr = p.add_op(OpKind::DeltaRule, l, "kda_delta");
      dr.as<ops::DeltaRule>().kda = true;
      dr.in = qkv;
      dr.in2 = fg;
      dr.in3 = kbeta;
      dr.out = ko;
      dr.as<ops::DeltaRule>().n_head = nh;
      dr.as<ops::DeltaRule>().n_head_kv = nh;
      dr.as<ops::DeltaRule>().head_dim = c.kda_head_dim;
      dr.as<ops::DeltaRule>().scale = 1.f / std::sqrt(static_cast<float>(c.kda_head_dim));
      dr.as<ops::DeltaRule>().eps = 1e-6f;  // flash-linear-attention's l2norm eps
      dr.as<ops::DeltaRule>().gate_bound = c.kda_lower_bound;
      dr.as<ops::DeltaRule>().a_log = L.a_log;
      dr.as<ops::DeltaRule>().dt_bias = L.dt_bias;
      dr.as<ops::DeltaRule>().cache_index = L.cache_index;
      Op& gn = p.add_op(OpKind::GatedRmsNorm, l, "kda_out_norm");
      gn.as<ops::GatedRmsNorm>().gate = GluKind::Sigmoid;
      gn.in = kgate;
      gn.out = ko;
      gn.as<ops::GatedRmsNorm>().n_head = nh;
      gn.as<ops::GatedRmsNorm>().head_dim = c.kda_head_dim;
      gn.as<ops::GatedRmsNorm>().weight = L.o_norm;
      gn.as<ops::GatedRmsNorm>().eps = eps;
      p.add_matmul(l, "kda_o", L.o_proj, ko, proj);
    }
    add_to_prefix(l, restart ? "attn_res_restart" : "attn_res_add", proj, blk, restart);

    // MLP sublayer.
    mixture(l, "mlp_res_mix", L.mlp_res, blk + 1);
    p.add_rmsnorm(l, "mlp_norm", L.mlp_norm, eps, mix, xn);
    if (L.dense) {
      p.add_matmul(l, "dense_gate", L.mlp_gate, xn, dgate);
      p.add_matmul(l, "dense_up", L.mlp_up, xn, dup);
      p.add_glu(l, "dense_act", dgate, dup, dact, GluKind::SiTU);
      p.add_matmul(l, "dense_down", L.mlp_down, dact, proj);
    } else {
      p.add_matmul(l, "router", L.router, xn, rlog);
      Op& rt = p.add_op(OpKind::MoeRoute, l, "moe_route");
      rt.in = rlog;
      rt.out = route;
      rt.as<ops::MoeRoute>().bias = L.router_bias;
      rt.as<ops::MoeRoute>().top_k = c.n_expert_used;
      rt.as<ops::MoeRoute>().eps = 0.f;  // kimi/__init__.py route: weights / sum, nothing added
      p.add_matmul(l, "latent_down", L.latent_down, xn, z);
      p.add_matmul(l, "shared_gate", L.mlp_gate, xn, sgate);
      p.add_matmul(l, "shared_up", L.mlp_up, xn, sup);
      // Routed experts in the latent space: [k][F] hidden, [k][L] outputs,
      // then the weighted sum in selection order.
      p.add_moe_experts(l, &L.experts, c.n_expert_used, route, z, eh, ye, rl);
      p.add_rmsnorm(l, "latent_norm", L.latent_norm, eps, rl, rln);
      p.add_matmul(l, "latent_up", L.latent_up, rln, proj);
      p.add_glu(l, "shared_act", sgate, sup, sact, GluKind::SiTU);
      p.add_matmul(l, "shared_down", L.mlp_down, sact, proj2);
      p.add_residual(l, "moe_plus_shared", proj, proj2, {}, eps);
    }
    add_to_prefix(l, "mlp_res_add", proj, blk, false);
  }
  mixture(-1, "final_res_mix", model.final_res(), c.res_block_of(c.n_layer - 1) + 1);
  const int logits = p.add_slot("logits", -1, c.vocab);
  p.add_rmsnorm(-1, "output_norm", model.final_norm(), eps, mix, xn);
  p.add_matmul(-1, "output", model.lm_head(), xn, logits);
  p.logits_slot = logits;
  p.verify();
  return p;
}

// ---------------------------------------------------------------------------
// The architecture (model/architecture.h).

namespace {

class KimiArchModel final : public ArchModel {
 public:
  explicit KimiArchModel(std::unique_ptr<KimiModel> m) : m_(std::move(m)) {}
  DecodeProgram build_program(int max_rows) const override { return build_kimi_program(*m_, max_rows); }
  int n_vocab() const override { return m_->config().vocab; }
  std::string description() const override {
    const KimiConfig& c = m_->config();
    return fmt::format("kimi-k3 (KDA + gated MLA, latent MoE): {} layers, hidden {}, {} experts top-{}, vocab {} ({:.1f} "
                       "MB read per step)",
                       c.n_layer, c.hidden, c.n_expert, c.n_expert_used, c.vocab, build_program(1).weight_bytes() / 1e6);
  }

 private:
  std::unique_ptr<KimiModel> m_;
};

// The experts' format flag: mxfp4 as stored, or fp8_e4m3 re-blocked from it.
bool fp8_experts(const std::optional<DType>& experts) {
  if (!experts) return false;
  if (*experts == DType::FP8_E4M3) return true;
  if (*experts != DType::MXFP4)
    fail("--experts: Kimi K3 experts are mxfp4, or fp8_e4m3 re-blocked from them; got {}", dtype_traits(*experts).name);
  return false;
}

class KimiArchitecture final : public Architecture {
 public:
  std::string name() const override { return "kimi-k3"; }
  std::vector<std::string> presets() const override {
    std::vector<std::string> v;
    for (const auto& c : kimi_presets()) v.push_back(c.name);
    return v;
  }
  bool runnable(const std::string& preset) const override { return preset != "kimi-k3"; }
  std::vector<std::string> hf_model_types() const override { return {"kimi_k3"}; }
  std::unique_ptr<ArchModel> synthetic(const std::string& preset, const ModelOptions& o) const override {
    if (!runnable(preset)) fail_full_size(preset, 1560);
    KimiWeightOptions k;
    if (o.weights) k.dense = *o.weights;
    k.fp8_experts = fp8_experts(o.experts);
    return std::make_unique<KimiArchModel>(KimiModel::synthetic(*find_kimi_preset(preset), o.seed, k));
  }
  std::unique_ptr<ArchModel> load_dir(const std::string& dir, const ModelOptions& o) const override {
    if (o.weights) fail("{}: a Kimi K3 checkpoint keeps the dense format it was written in (drop --weights)", dir);
    KimiWeightOptions k;
    k.fp8_experts = fp8_experts(o.experts);
    return std::make_unique<KimiArchModel>(KimiModel::load(dir, k));
  }
  void generate(const std::string& preset, const GenOptions& o, const std::string& dir) const override {
    if (!runnable(preset))
      fail("--config {}: ~1.5 TB of weights is too large to generate; use a mini or bench preset", preset);
    KimiWeightOptions k;
    k.dense = o.weights.value_or(DType::BF16);
    const DType ex = o.experts.value_or(DType::MXFP4);
    if (ex != DType::MXFP4 && ex != DType::FP8_E4M3) fail("--experts: Kimi K3 experts are mxfp4 or fp8_e4m3");
    k.fp8_experts = ex == DType::FP8_E4M3;
    KimiModel::synthetic(*find_kimi_preset(preset), o.seed, k)->save(dir);
  }
  std::string describe(const std::string& preset) const override { return megakern::describe(*find_kimi_preset(preset)); }
  std::unique_ptr<ArchModel> shapes_only(const std::string& preset) const override {
    KimiWeightOptions k;
    k.shapes_only = true;
    return std::make_unique<KimiArchModel>(KimiModel::synthetic(*find_kimi_preset(preset), 0, k));
  }
};

}  // namespace

const Architecture& kimi_architecture() {
  static const KimiArchitecture a;
  return a;
}

}  // namespace megakern
