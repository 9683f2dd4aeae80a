#include "spec/block_drafter.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/rng.h"
#include "core/sha256.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "ir/program.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec.h"
#include "runtime/model.h"
#include "runtime/sampler.h"

namespace megakern {

const char* block_drafter_kind_name(BlockDrafterKind k) { return k == BlockDrafterKind::DSpark ? "dspark" : "dflash"; }

// ---------------------------------------------------------------- config

std::string BlockDrafterConfig::to_json() const {
  nlohmann::json j;
  if (kind == BlockDrafterKind::DSpark) {
    // The reference system's keys (its DraftConfig.from_checkpoint).
    nlohmann::json layer;
    layer["hidden_size"] = hidden;
    layer["num_hidden_layers"] = n_layer;
    layer["num_attention_heads"] = n_head;
    layer["num_key_value_heads"] = n_head_kv;
    layer["head_dim"] = head_dim;
    layer["intermediate_size"] = ffn;
    layer["vocab_size"] = n_vocab;
    layer["sliding_window"] = window;
    layer["rope_parameters"] = {{"rope_theta", rope_base}};
    layer["rms_norm_eps"] = eps;
    j["speculators_model_type"] = "dspark";
    j["transformer_layer_config"] = layer;
    std::vector<int> ids;
    for (int l : tap_layers) ids.push_back(l + 1);
    j["aux_hidden_state_layer_ids"] = ids;
    j["mask_token_id"] = mask_token;
    j["markov_rank"] = markov_rank;
    j["markov_top_m"] = markov_top_m;
    j["block_size"] = block;
    j["seed"] = seed;
    if (draft_vocab > 0) j["draft_vocab_size"] = draft_vocab;
    if (tie_target) j["tie_target_embeddings"] = true;
    if (target_layers > 0) j["target_num_hidden_layers"] = target_layers;
    return j.dump(2) + "\n";
  }
  j["drafter"] = block_drafter_kind_name(kind);
  j["target_hidden"] = target_hidden;
  j["n_vocab"] = n_vocab;
  j["tap_layers"] = tap_layers;
  j["hidden"] = hidden;
  j["n_layer"] = n_layer;
  j["n_head"] = n_head;
  j["n_head_kv"] = n_head_kv;
  j["head_dim"] = head_dim;
  j["ffn"] = ffn;
  j["block"] = block;
  j["markov_rank"] = markov_rank;
  j["window"] = window;
  j["rope_base"] = rope_base;
  j["eps"] = eps;
  j["seed"] = seed;
  return j.dump(2) + "\n";
}

namespace {

// Field readers over one JSON object, naming `where` and the field in errors.
struct JsonFields {
  const nlohmann::json& j;
  std::string where;
  const nlohmann::json& need(const char* key) const {
    if (!j.contains(key)) fail("{}: drafter config has no '{}'", where, key);
    return j.at(key);
  }
  int get_int(const char* key) const {
    const auto& v = need(key);
    if (!v.is_number_integer()) fail("{}: drafter config field '{}' is not an integer", where, key);
    return v.get<int>();
  }
  float get_float(const char* key) const {
    const auto& v = need(key);
    if (!v.is_number()) fail("{}: drafter config field '{}' is not a number", where, key);
    return v.get<float>();
  }
  std::vector<int> get_ints(const char* key) const {
    const auto& v = need(key);
    if (!v.is_array()) fail("{}: drafter config field '{}' is not an array", where, key);
    std::vector<int> out;
    for (const auto& t : v) {
      if (!t.is_number_integer()) fail("{}: drafter config field '{}' holds a non-integer", where, key);
      out.push_back(t.get<int>());
    }
    return out;
  }
};

// The reference system's DSpark config.json.
BlockDrafterConfig dspark_from_json(const nlohmann::json& j, const std::string& where) {
  const JsonFields top{j, where};
  if (j.contains("speculators_model_type") &&
      (!j.at("speculators_model_type").is_string() || j.at("speculators_model_type").get<std::string>() != "dspark"))
    fail("{}: speculators_model_type is {}, this loader reads dspark", where, j.at("speculators_model_type").dump());
  const auto& layer = top.need("transformer_layer_config");
  if (!layer.is_object()) fail("{}: drafter config field 'transformer_layer_config' is not an object", where);
  const JsonFields f{layer, where + " (transformer_layer_config)"};
  BlockDrafterConfig c;
  c.kind = BlockDrafterKind::DSpark;
  c.hidden = f.get_int("hidden_size");
  c.target_hidden = c.hidden;  // fc maps n_taps target streams of this width
  c.n_layer = f.get_int("num_hidden_layers");
  c.n_head = f.get_int("num_attention_heads");
  c.n_head_kv = f.get_int("num_key_value_heads");
  c.head_dim = f.get_int("head_dim");
  c.ffn = f.get_int("intermediate_size");
  c.n_vocab = f.get_int("vocab_size");
  c.window = f.get_int("sliding_window");
  const auto& rope = f.need("rope_parameters");
  if (!rope.is_object()) fail("{}: drafter config field 'rope_parameters' is not an object", f.where);
  c.rope_base = JsonFields{rope, f.where + " (rope_parameters)"}.get_float("rope_theta");
  c.eps = f.get_float("rms_norm_eps");
  for (int id : top.get_ints("aux_hidden_state_layer_ids")) {
    // Id L names the stream entering target layer L: our tap after L - 1.
    if (id < 1) fail("{}: aux_hidden_state_layer_ids holds {}: the stream entering layer {} is not tapped", where, id, id);
    c.tap_layers.push_back(id - 1);
  }
  c.mask_token = top.get_int("mask_token_id");
  c.markov_rank = top.get_int("markov_rank");
  if (j.contains("block_size")) c.block = top.get_int("block_size");
  if (j.contains("markov_top_m")) c.markov_top_m = top.get_int("markov_top_m");
  if (j.contains("seed")) c.seed = j.at("seed").get<uint64_t>();
  if (j.contains("draft_vocab_size")) c.draft_vocab = top.get_int("draft_vocab_size");
  if (j.contains("tie_target_embeddings")) {
    if (!j.at("tie_target_embeddings").is_boolean())
      fail("{}: drafter config field 'tie_target_embeddings' is not true or false", where);
    c.tie_target = j.at("tie_target_embeddings").get<bool>();
  }
  if (j.contains("target_num_hidden_layers")) c.target_layers = top.get_int("target_num_hidden_layers");
  c.validate();
  return c;
}

}  // namespace

BlockDrafterConfig BlockDrafterConfig::from_json(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail("{}: drafter config is not valid JSON: {}", where, e.what());
  }
  if (!j.is_object()) fail("{}: drafter config is not a JSON object", where);
  try {
    if (j.contains("transformer_layer_config")) return dspark_from_json(j, where);
    const JsonFields f{j, where};
    BlockDrafterConfig c;
    const auto& kind = f.need("drafter");
    if (!kind.is_string()) fail("{}: drafter config field 'drafter' is not a string", where);
    const std::string k = kind.get<std::string>();
    if (k == "dflash")
      c.kind = BlockDrafterKind::DFlash;
    else if (k == "dspark")
      fail("{}: a dspark drafter config is in the reference layout (transformer_layer_config, "
           "aux_hidden_state_layer_ids, mask_token_id, markov_rank)", where);
    else
      fail("{}: drafter '{}' is neither dspark nor dflash", where, k);
    c.target_hidden = f.get_int("target_hidden");
    c.n_vocab = f.get_int("n_vocab");
    c.tap_layers = f.get_ints("tap_layers");
    c.hidden = f.get_int("hidden");
    c.n_layer = f.get_int("n_layer");
    c.n_head = f.get_int("n_head");
    c.n_head_kv = f.get_int("n_head_kv");
    c.head_dim = f.get_int("head_dim");
    c.ffn = f.get_int("ffn");
    c.block = f.get_int("block");
    c.markov_rank = f.get_int("markov_rank");
    if (j.contains("window")) c.window = f.get_int("window");
    if (j.contains("rope_base")) c.rope_base = f.get_float("rope_base");
    if (j.contains("eps")) c.eps = f.get_float("eps");
    if (j.contains("seed")) c.seed = j.at("seed").get<uint64_t>();
    c.validate();
    return c;
  } catch (const nlohmann::json::exception& e) {
    fail("{}: drafter config: {}", where, e.what());
  }
}

void BlockDrafterConfig::validate() const {
  auto bad = [&](const std::string& what) { fail("block drafter config: {}", what); };
  if (target_hidden <= 0 || n_vocab <= 0) bad("target_hidden and n_vocab must be positive");
  if (tap_layers.empty()) bad("no tap layers");
  if (hidden <= 0 || n_layer <= 0 || ffn <= 0) bad("hidden, n_layer and ffn must be positive");
  if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0)
    bad(fmt::format("{} query heads cannot share {} key-value heads", n_head, n_head_kv));
  if (head_dim <= 0 || head_dim % 2 != 0) bad(fmt::format("head_dim {} must be positive and even (RoPE)", head_dim));
  if (block < 2 || block > 33) bad(fmt::format("block {} must be in [2, 33]", block));
  if (kind == BlockDrafterKind::DSpark && markov_rank <= 0) bad("a DSpark drafter needs markov_rank >= 1");
  if (kind == BlockDrafterKind::DSpark && (mask_token < 0 || mask_token >= n_vocab))
    bad(fmt::format("mask token {} is outside the vocabulary of {}", mask_token, n_vocab));
  if (kind == BlockDrafterKind::DSpark && hidden != target_hidden)
    bad(fmt::format("a DSpark drafter's fc maps target streams of its own width: hidden {} vs target {}", hidden,
                    target_hidden));
  if (kind == BlockDrafterKind::DFlash && mask_token != -1) bad("a DFlash drafter has a learned mask embedding (mask_token -1)");
  if (window < 0) bad(fmt::format("window {} is negative", window));
  if (markov_top_m < 0) bad(fmt::format("markov_top_m {} is negative", markov_top_m));
  if (draft_vocab < 0 || draft_vocab > n_vocab)
    bad(fmt::format("draft vocabulary of {} tokens: must be 0 (all) to the vocabulary's {}", draft_vocab, n_vocab));
  if (target_layers < 0) bad(fmt::format("target_num_hidden_layers {} is negative", target_layers));
  if (kind == BlockDrafterKind::DFlash && (draft_vocab != 0 || tie_target))
    bad("draft_vocab_size and tie_target_embeddings are DSpark keys (DFlash always shares the target's)");
  if (kind == BlockDrafterKind::DFlash && markov_rank != 0) bad("a DFlash drafter has no Markov bias (markov_rank 0)");
  if (kind == BlockDrafterKind::DFlash && hidden != target_hidden)
    bad(fmt::format("a DFlash drafter shares the target's embedding and head, so hidden ({}) must equal the target's ({})",
                    hidden, target_hidden));
}

BlockDrafterConfig BlockDrafterConfig::mini(BlockDrafterKind kind, const Model& target) {
  const DecodeProgram p = target.build_program(1);
  BlockDrafterConfig c;
  c.kind = kind;
  c.n_vocab = target.n_vocab();
  // The stream width: what add_taps reports for the last layer.
  DecodeProgram probe = p;
  c.target_hidden = add_taps(probe, {p.n_layer - 1});
  const int n_taps = std::min(3, p.n_layer);
  for (int i = 0; i < n_taps; ++i) c.tap_layers.push_back((i + 1) * p.n_layer / n_taps - 1);
  c.hidden = c.target_hidden;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = c.hidden / c.n_head;
  if (c.head_dim % 2 != 0 || c.head_dim == 0)
    fail("target {} has hidden width {}: a MINI drafter needs a multiple of 8", target.name(), c.hidden);
  c.ffn = 2 * c.hidden;
  c.block = 8;
  c.markov_rank = kind == BlockDrafterKind::DSpark ? 256 : 0;
  c.mask_token = kind == BlockDrafterKind::DSpark ? c.n_vocab - 1 : -1;
  c.window = kind == BlockDrafterKind::DSpark ? 2048 : 0;
  c.validate();
  return c;
}

// ---------------------------------------------------------------- weights

std::vector<BlockDrafterWeights::TensorRef> BlockDrafterWeights::tensors() {
  const BlockDrafterConfig& c = config;
  const int64_t D = c.hidden, T = static_cast<int64_t>(c.n_taps()) * c.target_hidden, V = c.n_vocab,
                VO = c.out_vocab();
  const int64_t QD = static_cast<int64_t>(c.n_head) * c.head_dim, KD = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
  const int64_t F = c.ffn, hd = c.head_dim;
  const bool ds = c.kind == BlockDrafterKind::DSpark;  // the reference system's names
  std::vector<TensorRef> t;
  t.push_back({ds ? "fc.weight" : "tap_proj.weight", {D, T}, &tap_proj});
  t.push_back({ds ? "hidden_norm.weight" : "tap_norm.weight", {D}, &tap_norm});
  layers.resize(static_cast<size_t>(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    Layer& L = layers[static_cast<size_t>(l)];
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::string a = ds ? p + "self_attn." : p, m = ds ? p + "mlp." : p;
    t.push_back({ds ? p + "input_layernorm.weight" : p + "attn_norm.weight", {D}, &L.attn_norm});
    t.push_back({a + "q_proj.weight", {QD, D}, &L.wq});
    t.push_back({a + "k_proj.weight", {KD, D}, &L.wk});
    t.push_back({a + "v_proj.weight", {KD, D}, &L.wv});
    t.push_back({a + "o_proj.weight", {D, QD}, &L.wo});
    t.push_back({a + "q_norm.weight", {hd}, &L.q_norm});
    t.push_back({a + "k_norm.weight", {hd}, &L.k_norm});
    t.push_back({ds ? p + "post_attention_layernorm.weight" : p + "ffn_norm.weight", {D}, &L.ffn_norm});
    t.push_back({m + "gate_proj.weight", {F, D}, &L.w_gate});
    t.push_back({m + "up_proj.weight", {F, D}, &L.w_up});
    t.push_back({m + "down_proj.weight", {D, F}, &L.w_down});
  }
  t.push_back({ds ? "norm.weight" : "final_norm.weight", {D}, &final_norm});
  if (ds) {
    if (!c.tie_target) {
      t.push_back({"embed_tokens.weight", {V, D}, &embed});
      t.push_back({"lm_head.weight", {VO, D}, &lm_head});
    }
    t.push_back({"markov_head.markov_w1.weight", {VO, c.markov_rank}, &markov_w1});
    t.push_back({"markov_head.markov_w2.weight", {VO, c.markov_rank}, &markov_w2});
  } else {
    t.push_back({"mask_embed", {D}, &mask_embed});
  }
  return t;
}

namespace {

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

BlockDrafterWeights synthetic_block_drafter(const BlockDrafterConfig& config) {
  config.validate();
  BlockDrafterWeights w;
  w.config = config;
  Rng rng(config.seed * 0x2545F4914F6CDD1Dull + 17);
  for (auto& t : w.tensors()) {
    const int64_t n = numel(t.shape);
    t.data->resize(static_cast<size_t>(n));
    const bool vector = t.shape.size() == 1;
    if (vector && t.name != "mask_embed") {
      // Norm weights: near one.
      for (auto& x : *t.data) x = 1.f + rng.centred(0.05f);
    } else if (t.name == "embed_tokens.weight" || t.name == "mask_embed" ||
               t.name == "markov_head.markov_w1.weight") {
      for (auto& x : *t.data) x = rng.centred(1.f);
    } else {
      const float sd = 1.f / std::sqrt(static_cast<float>(t.shape.back()));
      for (auto& x : *t.data) x = rng.centred(sd);
    }
  }
  // A draft vocabulary of evenly spread ids.
  for (int i = 0; i < config.draft_vocab; ++i)
    w.d2t.push_back(static_cast<int32_t>(static_cast<int64_t>(i) * config.n_vocab / config.draft_vocab));
  return w;
}

void save_block_drafter(const BlockDrafterWeights& weights, const std::string& dir) {
  BlockDrafterWeights w = weights;  // tensors() needs non-const access
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("cannot create directory {}: {}", dir, ec.message());
  SafetensorsWriter out;
  for (const auto& t : w.tensors()) {
    if (static_cast<int64_t>(t.data->size()) != numel(t.shape))
      fail("drafter tensor {} holds {} values, its shape {} needs {}", t.name, t.data->size(), shape_string(t.shape),
           numel(t.shape));
    out.add_f32(t.name, t.shape, t.data->data());
  }
  if (w.config.draft_vocab > 0) {
    if (static_cast<int>(w.d2t.size()) != w.config.draft_vocab)
      fail("drafter tensor d2t holds {} ids, the draft vocabulary has {}", w.d2t.size(), w.config.draft_vocab);
    std::vector<uint8_t> bytes(w.d2t.size() * sizeof(int32_t));
    std::memcpy(bytes.data(), w.d2t.data(), bytes.size());
    out.add("d2t", "I32", {static_cast<int64_t>(w.d2t.size())}, std::move(bytes));
  }
  const std::string cfg = w.config.to_json();
  out.set_metadata("drafter_config", cfg);
  out.write((std::filesystem::path(dir) / "model.safetensors").string());
  write_file_atomic((std::filesystem::path(dir) / "config.json").string(), cfg);
}

namespace {

// The target facts a drafter config must match: vocabulary, tap layers
// inside the target, tapped stream width. `who` starts each message.
void check_fits_target(const BlockDrafterConfig& c, const Model& target, const std::string& who) {
  if (c.n_vocab != target.n_vocab())
    fail("{}: made for a vocabulary of {} tokens, the target {} has {}", who, c.n_vocab, target.name(),
         target.n_vocab());
  const DecodeProgram p = target.build_program(1);
  if (c.target_layers > 0 && c.target_layers != p.n_layer)
    fail("{}: made for a target of {} layers, {} has {}", who, c.target_layers, target.name(), p.n_layer);
  for (int l : c.tap_layers)
    if (l < 0 || l >= p.n_layer)
      fail("{}: tap layer {} (the stream entering layer {}) is outside the {} layers of {}", who, l, l + 1, p.n_layer,
           target.name());
  DecodeProgram probe = p;
  const int H = add_taps(probe, c.tap_layers);
  if (H != c.target_hidden)
    fail("{}: made for a target hidden width of {}, the residual stream of {} has {}", who, c.target_hidden,
         target.name(), H);
}

}  // namespace

BlockDrafterWeights load_block_drafter(const std::string& path, const Model& target) {
  namespace fs = std::filesystem;
  std::string file = path, config_text, config_where;
  if (fs::is_directory(path)) file = (fs::path(path) / "model.safetensors").string();
  if (!fs::exists(file)) fail("drafter weights {}: no such file", file);
  auto st = SafetensorsFile::open(file);
  const auto& meta = st->metadata();
  if (fs::is_directory(path) || meta.find("drafter_config") == meta.end()) {
    const fs::path cfg = fs::is_directory(path) ? fs::path(path) / "config.json" : fs::path(file).parent_path() / "config.json";
    std::ifstream in(cfg);
    if (!in) fail("drafter weights {}: no config ({} is missing, and the file has no drafter_config metadata)", path,
                  cfg.string());
    std::stringstream ss;
    ss << in.rdbuf();
    config_text = ss.str();
    config_where = cfg.string();
  } else {
    config_text = meta.at("drafter_config");
    config_where = file + " (drafter_config metadata)";
  }
  BlockDrafterWeights w;
  w.config = BlockDrafterConfig::from_json(config_text, config_where);
  const BlockDrafterConfig& c = w.config;
  check_fits_target(c, target, "drafter " + path);
  for (auto& t : w.tensors()) {
    const SafetensorsTensor* s = st->find(t.name);
    if (!s) fail("drafter {}: tensor '{}' is missing from {}", path, t.name, file);
    if (s->shape != t.shape)
      fail("drafter {}: tensor '{}' has shape {}, expected {}", path, t.name, shape_string(s->shape),
           shape_string(t.shape));
    const size_t n = static_cast<size_t>(numel(t.shape));
    t.data->resize(n);
    float* dst = t.data->data();
    if (s->dtype == "F32") {
      std::memcpy(dst, s->data, s->n_bytes);
    } else if (s->dtype == "BF16" || s->dtype == "F16") {
      const bool bf = s->dtype == "BF16";
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s->data + 2 * i, 2);
        dst[i] = bf ? bf16_to_f32(h) : f16_to_f32(h);
      }
    } else {
      fail("drafter {}: tensor '{}' is {}, expected F32, BF16 or F16", path, t.name, s->dtype);
    }
  }
  if (c.draft_vocab > 0) {
    const SafetensorsTensor* s = st->find("d2t");
    if (!s) fail("drafter {}: tensor 'd2t' (the draft vocabulary's target ids) is missing from {}", path, file);
    if (s->shape != std::vector<int64_t>{c.draft_vocab})
      fail("drafter {}: tensor 'd2t' has shape {}, expected [{}]", path, shape_string(s->shape), c.draft_vocab);
    w.d2t.resize(static_cast<size_t>(c.draft_vocab));
    for (size_t i = 0; i < w.d2t.size(); ++i) {
      if (s->dtype == "I32") {
        std::memcpy(&w.d2t[i], s->data + 4 * i, 4);
      } else if (s->dtype == "I64") {
        int64_t v;
        std::memcpy(&v, s->data + 8 * i, 8);
        w.d2t[i] = v < 0 || v > INT32_MAX ? -1 : static_cast<int32_t>(v);
      } else {
        fail("drafter {}: tensor 'd2t' is {}, expected I32 or I64", path, s->dtype);
      }
    }
  }
  return w;
}

// ---------------------------------------------------------------- shipped weights

namespace {

// Trained drafters committed under assets/drafters/: (target model name,
// kind, directory). scripts/train_drafter.py writes them.
struct ShippedDrafter {
  const char* target;
  BlockDrafterKind kind;
  const char* dir;
};
constexpr ShippedDrafter kShipped[] = {
    {"smollm2-135m", BlockDrafterKind::DSpark, "drafters/smollm2-135m-dspark"},
};

}  // namespace

std::string shipped_block_drafter(const Model& target, BlockDrafterKind kind) {
  namespace fs = std::filesystem;
  // The target by its model name, or a path's file name without .gguf.
  const std::string name = fs::path(target.name()).stem().string();
  const ShippedDrafter* hit = nullptr;
  for (const auto& s : kShipped)
    if (s.kind == kind && name == s.target) hit = &s;
  if (!hit) return "";
  std::vector<fs::path> roots;
  if (const char* env = std::getenv("MEGAKERN_ASSETS_DIR")) roots.emplace_back(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    roots.push_back(exe.parent_path() / "assets");
    roots.push_back(exe.parent_path().parent_path() / "assets");
  }
  roots.emplace_back("assets");
  std::string looked;
  for (const auto& r : roots) {
    const fs::path d = r / hit->dir;
    if (fs::is_regular_file(d / "model.safetensors", ec)) return d.string();
    looked += (looked.empty() ? "" : ", ") + d.string();
  }
  fail("the trained {} drafter for {} is not where it should be (looked in {})", block_drafter_kind_name(kind), name,
       looked);
}

void verify_block_drafter_checksum(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path weights = fs::path(dir) / "model.safetensors", sum = fs::path(dir) / "model.safetensors.sha256";
  std::ifstream in(sum);
  std::string want;
  if (!(in >> want) || want.size() != 64)
    fail("drafter {}: no sha256 checksum in {} to check the weights against", dir, sum.string());
  const std::string got = sha256_file_hex(weights.string());
  if (got != want)
    fail("drafter {}: {} has sha256 {}, but {} expects {} (a damaged or replaced file)", dir, weights.string(), got,
         sum.string(), want);
}

// ---------------------------------------------------------------- drafter

namespace {

MatView f32_view(const std::vector<float>& v, int64_t rows, int64_t cols) {
  MatView m;
  m.type = DType::F32;
  m.rows = rows;
  m.cols = cols;
  m.data = reinterpret_cast<const uint8_t*>(v.data());
  m.row_bytes = sizeof(float) * static_cast<size_t>(cols);
  return m;
}

}  // namespace

BlockDrafter::BlockDrafter(const Model& target, BlockDrafterWeights weights, ThreadPool& pool, int n_ctx)
    : w_(std::move(weights)), pool_(pool), n_ctx_(n_ctx) {
  const BlockDrafterConfig& c = w_.config;
  c.validate();
  if (n_ctx < 1) fail("block drafter: context of {} positions", n_ctx);
  check_fits_target(c, target, "block drafter");
  const DecodeProgram p = target.build_program(1);
  // Every tensor at its size (weights built by hand are checked here too).
  for (const auto& t : w_.tensors())
    if (static_cast<int64_t>(t.data->size()) != numel(t.shape))
      fail("block drafter: tensor '{}' holds {} values, its shape {} needs {}", t.name, t.data->size(),
           shape_string(t.shape), numel(t.shape));
  if (c.kind == BlockDrafterKind::DFlash || c.tie_target) {
    // The target's token embedding and LM head, as its own program uses them.
    bool have_embed = false, have_head = false;
    for (const Op& op : p.ops) {
      if (op.kind == OpKind::Embed && !have_embed) {
        target_embed_ = op.mat;
        target_embed_scale_ = op.as<ops::Embed>().scale;
        have_embed = true;
      }
      if (op.kind == OpKind::MatMul && op.out == p.logits_slot) {
        target_head_ = op.mat;
        have_head = true;
      }
    }
    if (!have_embed || !have_head) fail("block drafter: cannot find the token embedding and LM head of {}", target.name());
    if (target_embed_.cols != c.hidden || target_head_.cols != c.hidden || target_head_.rows != c.n_vocab)
      fail("block drafter: the target's embedding ({} wide) or LM head ({} x {}) does not fit hidden {} / vocab {}",
           target_embed_.cols, target_head_.rows, target_head_.cols, c.hidden, c.n_vocab);
  }
  const int64_t D = c.hidden, QD = static_cast<int64_t>(c.n_head) * c.head_dim;
  const int64_t KD = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
  tap_proj_ = f32_view(w_.tap_proj, D, static_cast<int64_t>(c.n_taps()) * c.target_hidden);
  if (c.draft_vocab > 0) {
    if (static_cast<int>(w_.d2t.size()) != c.draft_vocab)
      fail("block drafter: d2t holds {} ids, the draft vocabulary has {}", w_.d2t.size(), c.draft_vocab);
    t2d_.assign(static_cast<size_t>(c.n_vocab), -1);
    for (size_t i = 0; i < w_.d2t.size(); ++i) {
      const int32_t id = w_.d2t[i];
      if (id < 0 || id >= c.n_vocab || (i > 0 && id <= w_.d2t[i - 1]))
        fail("block drafter: d2t entry {} is {}: ids must ascend within the vocabulary of {}", i, id, c.n_vocab);
      t2d_[static_cast<size_t>(id)] = static_cast<int32_t>(i);
    }
  }
  if (c.kind == BlockDrafterKind::DSpark) {
    if (!c.tie_target) {
      lm_head_ = f32_view(w_.lm_head, c.out_vocab(), D);
    } else if (c.draft_vocab > 0) {
      head_rows_.resize(w_.d2t.size() * static_cast<size_t>(D));
      for (size_t i = 0; i < w_.d2t.size(); ++i)
        dequantize_row(target_head_, w_.d2t[i], head_rows_.data() + i * static_cast<size_t>(D));
      lm_head_ = f32_view(head_rows_, c.out_vocab(), D);
    } else {
      lm_head_ = target_head_;
    }
    markov_w2_ = f32_view(w_.markov_w2, c.out_vocab(), c.markov_rank);
  }
  for (const auto& L : w_.layers)
    lv_.push_back({f32_view(L.wq, QD, D), f32_view(L.wk, KD, D), f32_view(L.wv, KD, D), f32_view(L.wo, D, QD),
                   f32_view(L.w_gate, c.ffn, D), f32_view(L.w_up, c.ffn, D), f32_view(L.w_down, D, c.ffn)});
  ctx_k_.assign(static_cast<size_t>(c.n_layer), std::vector<float>(static_cast<size_t>(n_ctx) * static_cast<size_t>(KD)));
  ctx_v_ = ctx_k_;
}

std::string BlockDrafter::name() const { return block_drafter_kind_name(w_.config.kind); }

void BlockDrafter::observe_taps(const float* taps, int n_rows, int pos0) {
  const BlockDrafterConfig& c = w_.config;
  if (n_rows <= 0) return;
  if (pos0 < 0 || pos0 > n_filled_)
    fail("{} drafter: taps of position {} arrive while only {} positions are held (a gap)", name(), pos0, n_filled_);
  if (pos0 + n_rows > n_ctx_)
    fail("{} drafter: taps of positions up to {} exceed its context of {}", name(), pos0 + n_rows - 1, n_ctx_);
  const size_t D = static_cast<size_t>(c.hidden), KD = static_cast<size_t>(c.n_head_kv * c.head_dim);
  std::vector<float> proj(static_cast<size_t>(n_rows) * D), ctx(proj.size());
  matmul(pool_, tap_proj_, taps, n_rows, proj.data());
  for (int r = 0; r < n_rows; ++r)
    rmsnorm(proj.data() + r * D, w_.tap_norm.data(), c.hidden, c.eps, ctx.data() + r * D);
  for (int l = 0; l < c.n_layer; ++l) {
    float* K = ctx_k_[static_cast<size_t>(l)].data() + static_cast<size_t>(pos0) * KD;
    float* V = ctx_v_[static_cast<size_t>(l)].data() + static_cast<size_t>(pos0) * KD;
    matmul(pool_, lv_[static_cast<size_t>(l)].wk, ctx.data(), n_rows, K);
    matmul(pool_, lv_[static_cast<size_t>(l)].wv, ctx.data(), n_rows, V);
    head_norm_rope(K, n_rows, c.n_head_kv, w_.layers[static_cast<size_t>(l)].k_norm.data(), pos0);
  }
  n_filled_ = pos0 + n_rows;
}

void BlockDrafter::embed_row(int32_t token, bool mask, float* out) const {
  const BlockDrafterConfig& c = w_.config;
  const size_t D = static_cast<size_t>(c.hidden);
  if (c.kind == BlockDrafterKind::DSpark && !c.tie_target) {
    const size_t row = static_cast<size_t>(mask ? c.mask_token : token);
    std::copy_n(w_.embed.data() + row * D, D, out);
    return;
  }
  if (c.kind == BlockDrafterKind::DSpark) {
    token = mask ? c.mask_token : token;
  } else if (mask) {
    std::copy_n(w_.mask_embed.data(), D, out);
    return;
  }
  dequantize_row(target_embed_, token, out);
  if (target_embed_scale_ != 1.f)
    for (size_t i = 0; i < D; ++i) out[i] *= target_embed_scale_;
}

void BlockDrafter::head_norm_rope(float* x, int n_rows, int n_heads, const float* norm, int pos0) const {
  const BlockDrafterConfig& c = w_.config;
  const size_t hd = static_cast<size_t>(c.head_dim), width = static_cast<size_t>(n_heads) * hd;
  for (int r = 0; r < n_rows; ++r)
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + static_cast<size_t>(r) * width + static_cast<size_t>(h) * hd;
      rmsnorm(v, norm, c.head_dim, c.eps, v);
      rope_inplace(v, c.head_dim, pos0 + r, c.rope_base, true);
    }
}

void BlockDrafter::block_logits(const std::vector<int32_t>& context, int n, std::vector<float>& logits) {
  const BlockDrafterConfig& c = w_.config;
  if (context.empty()) fail("{} drafter: no anchor token", name());
  if (n < 1 || n > c.block) fail("{} drafter: {} block rows asked for, its block has {}", name(), n, c.block);
  const int N = static_cast<int>(context.size()) - 1;  // the anchor's position
  if (n_filled_ != N)
    fail("{} drafter: holds the taps of {} positions, but the anchor is at position {} (taps not fed?)", name(),
         n_filled_, N);
  const int32_t anchor = context[static_cast<size_t>(N)];
  if (anchor < 0 || anchor >= c.n_vocab) fail("{} drafter: anchor token {} is outside the vocabulary", name(), anchor);
  // Context entries attended: positions c0..N-1.
  const int c0 = c.window > 0 ? std::max(0, N - c.window) : 0, nc = N - c0;
  const size_t D = static_cast<size_t>(c.hidden), hd = static_cast<size_t>(c.head_dim);
  const size_t QD = static_cast<size_t>(c.n_head) * hd, KD = static_cast<size_t>(c.n_head_kv) * hd;
  const size_t F = static_cast<size_t>(c.ffn);
  const size_t rows = static_cast<size_t>(n);
  std::vector<float> h(rows * D), xn(rows * D), q(rows * QD), kb(rows * KD), vb(rows * KD), att(rows * QD),
      proj(rows * D), g(rows * F), u(rows * F), scores(static_cast<size_t>(nc + n));
  for (int i = 0; i < n; ++i) embed_row(anchor, i > 0, h.data() + static_cast<size_t>(i) * D);
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  const int group = c.n_head / c.n_head_kv;
  for (int l = 0; l < c.n_layer; ++l) {
    const auto& L = w_.layers[static_cast<size_t>(l)];
    const auto& V = lv_[static_cast<size_t>(l)];
    for (size_t i = 0; i < rows; ++i) rmsnorm(h.data() + i * D, L.attn_norm.data(), c.hidden, c.eps, xn.data() + i * D);
    matmul(pool_, V.wq, xn.data(), n, q.data());
    matmul(pool_, V.wk, xn.data(), n, kb.data());
    matmul(pool_, V.wv, xn.data(), n, vb.data());
    head_norm_rope(q.data(), n, c.n_head, L.q_norm.data(), N);
    head_norm_rope(kb.data(), n, c.n_head_kv, L.k_norm.data(), N);
    const float* CK = ctx_k_[static_cast<size_t>(l)].data() + static_cast<size_t>(c0) * KD;
    const float* CV = ctx_v_[static_cast<size_t>(l)].data() + static_cast<size_t>(c0) * KD;
    // Row i attends to the context entries c0..N-1 and block rows 0..i.
    for (int i = 0; i < n; ++i) {
      for (int hh = 0; hh < c.n_head; ++hh) {
        const size_t kvo = static_cast<size_t>(hh / group) * hd;
        const float* qh = q.data() + static_cast<size_t>(i) * QD + static_cast<size_t>(hh) * hd;
        const int m = nc + i + 1;
        if (nc > 0) dot_f32_rows(qh, CK + kvo, static_cast<int64_t>(KD), nc, static_cast<int64_t>(hd), scores.data());
        dot_f32_rows(qh, kb.data() + kvo, static_cast<int64_t>(KD), i + 1, static_cast<int64_t>(hd), scores.data() + nc);
        for (int s = 0; s < m; ++s) scores[static_cast<size_t>(s)] *= scale;
        softmax_inplace(scores.data(), m);
        float* o = att.data() + static_cast<size_t>(i) * QD + static_cast<size_t>(hh) * hd;
        std::fill(o, o + hd, 0.f);
        if (nc > 0) axpy_f32_rows(scores.data(), CV + kvo, static_cast<int64_t>(KD), nc, o, static_cast<int64_t>(hd));
        axpy_f32_rows(scores.data() + nc, vb.data() + kvo, static_cast<int64_t>(KD), i + 1, o, static_cast<int64_t>(hd));
      }
    }
    matmul(pool_, V.wo, att.data(), n, proj.data());
    for (size_t i = 0; i < h.size(); ++i) h[i] += proj[i];
    for (size_t i = 0; i < rows; ++i) rmsnorm(h.data() + i * D, L.ffn_norm.data(), c.hidden, c.eps, xn.data() + i * D);
    matmul(pool_, V.w_gate, xn.data(), n, g.data());
    matmul(pool_, V.w_up, xn.data(), n, u.data());
    glu_act(GluKind::SiLU, g.data(), u.data(), 1.f, 1.f, g.data(), static_cast<int64_t>(g.size()));
    matmul(pool_, V.w_down, g.data(), n, proj.data());
    for (size_t i = 0; i < h.size(); ++i) h[i] += proj[i];
  }
  for (size_t i = 0; i < rows; ++i) rmsnorm(h.data() + i * D, w_.final_norm.data(), c.hidden, c.eps, xn.data() + i * D);
  logits.resize(rows * static_cast<size_t>(c.out_vocab()));
  matmul(pool_, c.kind == BlockDrafterKind::DSpark ? lm_head_ : target_head_, xn.data(), n, logits.data());
}

void BlockDrafter::propose(const std::vector<int32_t>& context, int k, Draft& out) {
  out.clear();
  const BlockDrafterConfig& c = w_.config;
  if (context.empty() || k <= 0) return;
  const size_t Vn = static_cast<size_t>(c.n_vocab);
  std::vector<float> logits;
  if (c.kind == BlockDrafterKind::DFlash) {
    // Rows 1..n-1 (the masks) give the drafts.
    const int n = std::min(c.block, k + 1);
    block_logits(context, n, logits);
    for (int i = 1; i < n; ++i) out.tokens.push_back(argmax(logits.data() + static_cast<size_t>(i) * Vn, c.n_vocab));
    return;
  }
  // DSpark: every row drafts the position after its own, each draft biased
  // by the one before it (the anchor for the first).
  // Logits, candidates and Markov rows are over the draft vocabulary (the
  // whole one without it); a previous token outside it adds no bias.
  const int n = std::min(c.block, k);
  const int VO = c.out_vocab();
  const size_t Vo = static_cast<size_t>(VO);
  block_logits(context, n, logits);
  const size_t r = static_cast<size_t>(c.markov_rank);
  int32_t prev = t2d_.empty() ? context.back() : t2d_[static_cast<size_t>(context.back())];
  const int per = VO / kMarkovShards;
  if (c.markov_top_m > 0 && VO % kMarkovShards == 0 && c.markov_top_m < per) {
    // Candidates: the top markov_top_m base logits of each of the 32
    // contiguous vocabulary slices (in slice order, each in descending order,
    // ties to the lower id); the biased argmax is taken among them (the first
    // of equal maxima), the bias computed for the candidates only.
    const size_t m = static_cast<size_t>(c.markov_top_m);
    std::vector<int32_t> cand, order(static_cast<size_t>(per));
    for (int i = 0; i < n; ++i) {
      const float* L = logits.data() + static_cast<size_t>(i) * Vo;
      cand.clear();
      for (int sh = 0; sh < kMarkovShards; ++sh) {
        for (int j = 0; j < per; ++j) order[static_cast<size_t>(j)] = sh * per + j;
        std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(m), order.end(),
                          [&](int32_t a, int32_t b) { return L[a] > L[b] || (L[a] == L[b] && a < b); });
        cand.insert(cand.end(), order.begin(), order.begin() + static_cast<std::ptrdiff_t>(m));
      }
      const float* e = prev < 0 ? nullptr : w_.markov_w1.data() + static_cast<size_t>(prev) * r;
      float best = -INFINITY;
      int32_t pick = cand[0];
      for (int32_t id : cand) {
        const float v =
            L[id] + (e ? dot_f32(w_.markov_w2.data() + static_cast<size_t>(id) * r, e, static_cast<int64_t>(r)) : 0.f);
        if (v > best) {
          best = v;
          pick = id;
        }
      }
      prev = pick;
      out.tokens.push_back(to_target(prev));
    }
    return;
  }
  // Exact: the bias over the whole (draft) vocabulary.
  std::vector<float> bias(Vo);
  for (int i = 0; i < n; ++i) {
    float* L = logits.data() + static_cast<size_t>(i) * Vo;
    if (prev >= 0) {
      matmul(pool_, markov_w2_, w_.markov_w1.data() + static_cast<size_t>(prev) * r, 1, bias.data());
      for (size_t j = 0; j < Vo; ++j) L[j] += bias[j];
    }
    prev = argmax(L, VO);
    out.tokens.push_back(to_target(prev));
  }
}

}  // namespace megakern
