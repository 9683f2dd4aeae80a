#include "spec/block_drafter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
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
  j["rope_base"] = rope_base;
  j["eps"] = eps;
  j["seed"] = seed;
  return j.dump(2) + "\n";
}

BlockDrafterConfig BlockDrafterConfig::from_json(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail("{}: drafter config is not valid JSON: {}", where, e.what());
  }
  if (!j.is_object()) fail("{}: drafter config is not a JSON object", where);
  auto need = [&](const char* key) -> const nlohmann::json& {
    if (!j.contains(key)) fail("{}: drafter config has no '{}'", where, key);
    return j.at(key);
  };
  auto get_int = [&](const char* key) {
    const auto& v = need(key);
    if (!v.is_number_integer()) fail("{}: drafter config field '{}' is not an integer", where, key);
    return v.get<int>();
  };
  BlockDrafterConfig c;
  const auto& kind = need("drafter");
  if (!kind.is_string()) fail("{}: drafter config field 'drafter' is not a string", where);
  const std::string k = kind.get<std::string>();
  if (k == "dspark")
    c.kind = BlockDrafterKind::DSpark;
  else if (k == "dflash")
    c.kind = BlockDrafterKind::DFlash;
  else
    fail("{}: drafter '{}' is neither dspark nor dflash", where, k);
  c.target_hidden = get_int("target_hidden");
  c.n_vocab = get_int("n_vocab");
  const auto& taps = need("tap_layers");
  if (!taps.is_array()) fail("{}: drafter config field 'tap_layers' is not an array", where);
  for (const auto& t : taps) {
    if (!t.is_number_integer()) fail("{}: drafter config field 'tap_layers' holds a non-integer", where);
    c.tap_layers.push_back(t.get<int>());
  }
  c.hidden = get_int("hidden");
  c.n_layer = get_int("n_layer");
  c.n_head = get_int("n_head");
  c.n_head_kv = get_int("n_head_kv");
  c.head_dim = get_int("head_dim");
  c.ffn = get_int("ffn");
  c.block = get_int("block");
  c.markov_rank = get_int("markov_rank");
  if (j.contains("rope_base")) c.rope_base = j.at("rope_base").get<float>();
  if (j.contains("eps")) c.eps = j.at("eps").get<float>();
  if (j.contains("seed")) c.seed = j.at("seed").get<uint64_t>();
  c.validate();
  return c;
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
  c.markov_rank = kind == BlockDrafterKind::DSpark ? 16 : 0;
  c.validate();
  return c;
}

// ---------------------------------------------------------------- weights

std::vector<BlockDrafterWeights::TensorRef> BlockDrafterWeights::tensors() {
  const BlockDrafterConfig& c = config;
  const int64_t D = c.hidden, T = static_cast<int64_t>(c.n_taps()) * c.target_hidden, V = c.n_vocab;
  const int64_t QD = static_cast<int64_t>(c.n_head) * c.head_dim, KD = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
  const int64_t F = c.ffn;
  std::vector<TensorRef> t;
  t.push_back({"tap_proj.weight", {D, T}, &tap_proj});
  t.push_back({"tap_norm.weight", {D}, &tap_norm});
  layers.resize(static_cast<size_t>(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    Layer& L = layers[static_cast<size_t>(l)];
    const std::string p = "layers." + std::to_string(l) + ".";
    t.push_back({p + "attn_norm.weight", {D}, &L.attn_norm});
    t.push_back({p + "q_proj.weight", {QD, D}, &L.wq});
    t.push_back({p + "k_proj.weight", {KD, D}, &L.wk});
    t.push_back({p + "v_proj.weight", {KD, D}, &L.wv});
    t.push_back({p + "o_proj.weight", {D, QD}, &L.wo});
    t.push_back({p + "ffn_norm.weight", {D}, &L.ffn_norm});
    t.push_back({p + "gate_proj.weight", {F, D}, &L.w_gate});
    t.push_back({p + "up_proj.weight", {F, D}, &L.w_up});
    t.push_back({p + "down_proj.weight", {D, F}, &L.w_down});
  }
  t.push_back({"final_norm.weight", {D}, &final_norm});
  if (c.kind == BlockDrafterKind::DSpark) {
    t.push_back({"embed_tokens.weight", {V + 1, D}, &embed});
    t.push_back({"lm_head.weight", {V, D}, &lm_head});
    t.push_back({"markov.w1", {V, c.markov_rank}, &markov_w1});
    t.push_back({"markov.w2", {V, c.markov_rank}, &markov_w2});
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
    } else if (t.name == "embed_tokens.weight" || t.name == "mask_embed" || t.name == "markov.w1") {
      for (auto& x : *t.data) x = rng.centred(1.f);
    } else {
      const float sd = 1.f / std::sqrt(static_cast<float>(t.shape.back()));
      for (auto& x : *t.data) x = rng.centred(sd);
    }
  }
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
  const std::string cfg = w.config.to_json();
  out.set_metadata("drafter_config", cfg);
  out.write((std::filesystem::path(dir) / "model.safetensors").string());
  write_file_atomic((std::filesystem::path(dir) / "config.json").string(), cfg);
}

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
  if (c.n_vocab != target.n_vocab())
    fail("drafter {}: made for a vocabulary of {} tokens, the target {} has {}", path, c.n_vocab, target.name(),
         target.n_vocab());
  for (auto& t : w.tensors()) {
    const SafetensorsTensor* s = st->find(t.name);
    if (!s) fail("drafter {}: tensor '{}' is missing from {}", path, t.name, file);
    if (s->shape != t.shape)
      fail("drafter {}: tensor '{}' has shape {}, expected {}", path, t.name, shape_string(s->shape),
           shape_string(t.shape));
    if (s->dtype != "F32") fail("drafter {}: tensor '{}' is {}, expected F32", path, t.name, s->dtype);
    t.data->resize(static_cast<size_t>(numel(t.shape)));
    std::memcpy(t.data->data(), s->data, s->n_bytes);
  }
  return w;
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
  const DecodeProgram p = target.build_program(1);
  if (c.n_vocab != target.n_vocab())
    fail("block drafter: made for a vocabulary of {} tokens, the target {} has {}", c.n_vocab, target.name(),
         target.n_vocab());
  for (int l : c.tap_layers)
    if (l < 0 || l >= p.n_layer)
      fail("block drafter: tap layer {} is outside the {} layers of {}", l, p.n_layer, target.name());
  DecodeProgram probe = p;
  const int H = add_taps(probe, c.tap_layers);
  if (H != c.target_hidden)
    fail("block drafter: made for a target hidden width of {}, the residual stream of {} has {}", c.target_hidden,
         target.name(), H);
  // Every tensor at its size (weights built by hand are checked here too).
  for (const auto& t : w_.tensors())
    if (static_cast<int64_t>(t.data->size()) != numel(t.shape))
      fail("block drafter: tensor '{}' holds {} values, its shape {} needs {}", t.name, t.data->size(),
           shape_string(t.shape), numel(t.shape));
  if (c.kind == BlockDrafterKind::DFlash) {
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
  if (c.kind == BlockDrafterKind::DSpark) {
    lm_head_ = f32_view(w_.lm_head, c.n_vocab, D);
    markov_w2_ = f32_view(w_.markov_w2, c.n_vocab, c.markov_rank);
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
    for (int r = 0; r < n_rows; ++r)
      for (int h = 0; h < c.n_head_kv; ++h)
        rope_inplace(K + r * KD + static_cast<size_t>(h * c.head_dim), c.head_dim, pos0 + r, c.rope_base, true);
  }
  n_filled_ = pos0 + n_rows;
}

void BlockDrafter::embed_row(int32_t token, bool mask, float* out) const {
  const BlockDrafterConfig& c = w_.config;
  const size_t D = static_cast<size_t>(c.hidden);
  if (c.kind == BlockDrafterKind::DSpark) {
    const size_t row = mask ? static_cast<size_t>(c.n_vocab) : static_cast<size_t>(token);
    std::copy_n(w_.embed.data() + row * D, D, out);
    return;
  }
  if (mask) {
    std::copy_n(w_.mask_embed.data(), D, out);
    return;
  }
  dequantize_row(target_embed_, token, out);
  if (target_embed_scale_ != 1.f)
    for (size_t i = 0; i < D; ++i) out[i] *= target_embed_scale_;
}

void BlockDrafter::propose(const std::vector<int32_t>& context, int k, Draft& out) {
  out.clear();
  const BlockDrafterConfig& c = w_.config;
  if (context.empty() || k <= 0) return;
  const int N = static_cast<int>(context.size()) - 1;  // the anchor's position
  if (n_filled_ != N)
    fail("{} drafter: holds the taps of {} positions, but the anchor is at position {} (taps not fed?)", name(),
         n_filled_, N);
  const int n = std::min(c.block, k + 1);  // block rows computed: anchor + n-1 masks
  const size_t D = static_cast<size_t>(c.hidden), hd = static_cast<size_t>(c.head_dim);
  const size_t QD = static_cast<size_t>(c.n_head) * hd, KD = static_cast<size_t>(c.n_head_kv) * hd;
  const size_t F = static_cast<size_t>(c.ffn);
  const size_t rows = static_cast<size_t>(n);
  std::vector<float> h(rows * D), xn(rows * D), q(rows * QD), kb(rows * KD), vb(rows * KD), att(rows * QD),
      proj(rows * D), g(rows * F), u(rows * F), scores(static_cast<size_t>(N + n));
  for (int i = 0; i < n; ++i) embed_row(context[static_cast<size_t>(N)], i > 0, h.data() + static_cast<size_t>(i) * D);
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  const int group = c.n_head / c.n_head_kv;
  for (int l = 0; l < c.n_layer; ++l) {
    const auto& L = w_.layers[static_cast<size_t>(l)];
    const auto& V = lv_[static_cast<size_t>(l)];
    for (size_t i = 0; i < rows; ++i) rmsnorm(h.data() + i * D, L.attn_norm.data(), c.hidden, c.eps, xn.data() + i * D);
    matmul(pool_, V.wq, xn.data(), n, q.data());
    matmul(pool_, V.wk, xn.data(), n, kb.data());
    matmul(pool_, V.wv, xn.data(), n, vb.data());
    for (int i = 0; i < n; ++i) {
      for (int hh = 0; hh < c.n_head; ++hh)
        rope_inplace(q.data() + static_cast<size_t>(i) * QD + static_cast<size_t>(hh) * hd, c.head_dim, N + i, c.rope_base, true);
      for (int hh = 0; hh < c.n_head_kv; ++hh)
        rope_inplace(kb.data() + static_cast<size_t>(i) * KD + static_cast<size_t>(hh) * hd, c.head_dim, N + i, c.rope_base,
                     true);
    }
    const float* CK = ctx_k_[static_cast<size_t>(l)].data();
    const float* CV = ctx_v_[static_cast<size_t>(l)].data();
    // Row i attends to context 0..N-1 and block rows 0..i.
    for (int i = 0; i < n; ++i) {
      for (int hh = 0; hh < c.n_head; ++hh) {
        const size_t kvo = static_cast<size_t>(hh / group) * hd;
        const float* qh = q.data() + static_cast<size_t>(i) * QD + static_cast<size_t>(hh) * hd;
        const int m = N + i + 1;
        if (N > 0) dot_f32_rows(qh, CK + kvo, static_cast<int64_t>(KD), N, static_cast<int64_t>(hd), scores.data());
        dot_f32_rows(qh, kb.data() + kvo, static_cast<int64_t>(KD), i + 1, static_cast<int64_t>(hd), scores.data() + N);
        for (int s = 0; s < m; ++s) scores[static_cast<size_t>(s)] *= scale;
        softmax_inplace(scores.data(), m);
        float* o = att.data() + static_cast<size_t>(i) * QD + static_cast<size_t>(hh) * hd;
        std::fill(o, o + hd, 0.f);
        if (N > 0) axpy_f32_rows(scores.data(), CV + kvo, static_cast<int64_t>(KD), N, o, static_cast<int64_t>(hd));
        axpy_f32_rows(scores.data() + N, vb.data() + kvo, static_cast<int64_t>(KD), i + 1, o, static_cast<int64_t>(hd));
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
  // Rows 1..n-1 (the masks) give the drafts.
  const int nd = n - 1;
  if (nd <= 0) return;
  std::vector<float> hn(static_cast<size_t>(nd) * D);
  for (int i = 0; i < nd; ++i)
    rmsnorm(h.data() + static_cast<size_t>(i + 1) * D, w_.final_norm.data(), c.hidden, c.eps, hn.data() + static_cast<size_t>(i) * D);
  const size_t Vn = static_cast<size_t>(c.n_vocab);
  std::vector<float> logits(static_cast<size_t>(nd) * Vn);
  matmul(pool_, c.kind == BlockDrafterKind::DSpark ? lm_head_ : target_head_, hn.data(), nd, logits.data());
  if (c.kind == BlockDrafterKind::DFlash) {
    for (int i = 0; i < nd; ++i) out.tokens.push_back(argmax(logits.data() + static_cast<size_t>(i) * Vn, c.n_vocab));
    return;
  }
  // DSpark: each draft biased by the previous one (the anchor for the first).
  std::vector<float> bias(Vn);
  const size_t r = static_cast<size_t>(c.markov_rank);
  int32_t prev = context[static_cast<size_t>(N)];
  for (int i = 0; i < nd; ++i) {
    matmul(pool_, markov_w2_, w_.markov_w1.data() + static_cast<size_t>(prev) * r, 1, bias.data());
    float* L = logits.data() + static_cast<size_t>(i) * Vn;
    for (size_t j = 0; j < Vn; ++j) L[j] += bias[j];
    prev = argmax(L, c.n_vocab);
    out.tokens.push_back(prev);
  }
}

}  // namespace megakern
