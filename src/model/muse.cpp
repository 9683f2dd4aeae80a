#include "model/muse.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/architecture.h"
#include "core/rng.h"
#include "core/units.h"
#include "ops/norm.h"
#include "io/config_value.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"

namespace megakern {

MuseModel::~MuseModel() = default;

namespace {

DType format_of(const MuseTensor& t, DType dense, DType experts) {
  if (!t.matrix) return DType::F32;
  return t.format == 'd' ? dense : t.format == 'e' ? experts : DType::F32;
}

// The safetensors dtype a format is stored as, "U8" for the block formats.
std::string st_dtype(DType d) {
  const char* f = safetensors_float_dtype(d);
  return f ? f : "U8";
}

// Stored shape: the logical one, or with the last dimension in bytes.
std::vector<int64_t> stored_shape(const MuseTensor& t, DType d) {
  std::vector<int64_t> s = t.shape;
  if (st_dtype(d) == "U8") s.back() = static_cast<int64_t>(row_bytes(d, s.back()));
  return s;
}

size_t stored_bytes(const MuseTensor& t, DType d) {
  if (!t.matrix) return static_cast<size_t>(t.numel()) * 4;
  const int64_t cols = t.shape.back();
  return static_cast<size_t>(t.numel() / cols) * row_bytes(d, cols);
}

MatView view(DType d, int64_t rows, int64_t cols, const uint8_t* data) {
  MatView v;
  v.type = d;
  v.rows = rows;
  v.cols = cols;
  v.row_bytes = row_bytes(d, cols);
  v.data = data;
  return v;
}

// Quantises w [rows][cols] row by row into out (rows * row_bytes bytes).
void quantize_rows(DType d, const float* w, int64_t rows, int64_t cols, uint8_t* out) {
  const auto& tr = dtype_traits(d);
  const size_t rb = row_bytes(d, cols);
  for (int64_t r = 0; r < rows; ++r) tr.quantize(w + r * cols, out + static_cast<size_t>(r) * rb, cols);
}

// Largest e4m3 value times the largest e2m1 value: NVFP4's global scale maps
// a matrix's absmax there.
constexpr float kNvfp4Range = 448.f * 6.f;

// Fills the bytes of tensor t (index ti in muse_tensors order) from seed.
// Expert matrices in NVFP4 get a global scale per expert, returned in scales
// (for the moe.experts.scale tensor of the same layer, [3][E]).
void synth_tensor(const MuseTensor& t, size_t ti, uint64_t seed, DType d, uint8_t* out,
                  float* expert_scales) {
  Rng rng{seed * 0x2545f4914f6cdd1dull + ti * 0x9e3779b97f4a7c15ull + 1};
  const std::string& n = t.name;
  auto ends_with = [&](const char* suf) {
    const size_t k = std::strlen(suf);
    return n.size() >= k && n.compare(n.size() - k, k, suf) == 0;
  };
  if (!t.matrix) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    if (ends_with("gamma"))
      for (auto& x : v) x = 0.5f * rng.symmetric();
    else if (ends_with("router_bias"))
      for (auto& x : v) x = 0.02f * rng.symmetric();
    else if (ends_with("experts.scale"))
      std::fill(v.begin(), v.end(), 1.f);  // overwritten by the expert matrices when NVFP4
    else
      for (auto& x : v) x = 1.f + 0.1f * rng.symmetric();
    std::memcpy(out, v.data(), v.size() * 4);
    return;
  }
  const int64_t cols = t.shape.back(), rows = t.shape[t.shape.size() - 2];
  const int64_t mats = t.shape.size() == 3 ? t.shape[0] : 1;
  const float bound = std::sqrt(3.f / static_cast<float>(cols));
  const size_t mat_bytes = static_cast<size_t>(rows) * row_bytes(d, cols);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  const int which = ends_with("gate") ? 0 : ends_with("up") ? 1 : 2;
  for (int64_t m = 0; m < mats; ++m) {
    float amax = 0.f;
    for (auto& x : w) {
      x = bound * rng.symmetric();
      amax = std::max(amax, std::fabs(x));
    }
    if (t.kind == MuseTensor::Kind::Experts && d == DType::NVFP4) {
      const float g = amax > 0.f ? amax / kNvfp4Range : 1.f;
      for (auto& x : w) x /= g;
      expert_scales[static_cast<size_t>(which) * static_cast<size_t>(mats) + static_cast<size_t>(m)] = g;
    }
    quantize_rows(d, w.data(), rows, cols, out + static_cast<size_t>(m) * mat_bytes);
  }
}

// An integer field in [lo, hi] (io/config_value.h).
int json_int(const nlohmann::json& j, const std::string& path, const char* key, int64_t lo = 1,
             int64_t hi = kMaxConfigDim) {
  auto it = j.find(key);
  if (it == j.end()) fail("{}: '{}' is missing", path, key);
  return static_cast<int>(json_int_in(*it, path, key, lo, hi));
}
// A number field, finite and in (lo, hi]; def when absent.
double json_num(const nlohmann::json& j, const std::string& path, const char* key, double def, double lo = 0,
                double hi = 1e12) {
  auto it = j.find(key);
  if (it == j.end()) return def;
  return json_float_in(*it, path, key, lo, hi);
}
DType json_format(const nlohmann::json& j, const std::string& path, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) fail("{}: '{}' is missing or not a string", path, key);
  auto d = dtype_from_name(it->get<std::string>());
  if (!d) fail("{}: '{}' names an unknown format '{}'", path, key, it->get<std::string>());
  return *d;
}

}  // namespace

std::unique_ptr<MuseModel> MuseModel::synthetic(const MuseConfig& c, uint64_t seed, DType dense, DType experts) {
  c.validate();
  std::unique_ptr<MuseModel> m(new MuseModel());
  m->cfg_ = c;
  m->dense_ = dense;
  m->expert_ = experts;
  const std::vector<MuseTensor> ts = muse_tensors(c);
  m->owned_.reserve(ts.size());
  for (const auto& t : ts) {
    const DType d = format_of(t, dense, experts);
    m->owned_.emplace_back(stored_bytes(t, d));
    m->tensor_data_[t.name] = m->owned_.back().data();
  }
  // Each tensor has its own stream, so the tensors can be filled in parallel
  // and the bytes do not depend on the thread count. The expert scales of a
  // layer are written by its three expert matrices (distinct rows of [3][E]).
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < ts.size();) {
      const MuseTensor& t = ts[i];
      if (t.name.ends_with("experts.scale")) continue;
      float* scales = nullptr;
      if (t.kind == MuseTensor::Kind::Experts) {
        // The layer's [3][E] scale tensor (the map is only read here).
        const std::string layer = t.name.substr(0, t.name.rfind("experts.") + 8);
        scales = reinterpret_cast<float*>(const_cast<uint8_t*>(m->tensor_data_.at(layer + "scale")));
      }
      synth_tensor(t, i, seed, format_of(t, dense, experts), m->owned_[i].data(), scales);
    }
  };
  // The scales start at 1 before any expert matrix may overwrite them.
  for (size_t i = 0; i < ts.size(); ++i)
    if (ts[i].name.ends_with("experts.scale")) synth_tensor(ts[i], i, seed, DType::F32, m->owned_[i].data(), nullptr);
  const unsigned n_threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::thread> team;
  for (unsigned w = 1; w < n_threads; ++w) team.emplace_back(work);
  work();
  for (auto& th : team) th.join();
  m->bind();
  return m;
}

std::unique_ptr<MuseModel> MuseModel::shapes_only(const MuseConfig& c, DType dense, DType experts) {
  c.validate();
  std::unique_ptr<MuseModel> m(new MuseModel());
  m->cfg_ = c;
  m->dense_ = dense;
  m->expert_ = experts;
  const std::vector<MuseTensor> ts = muse_tensors(c);
  size_t matrix_bytes = 0;
  for (const auto& t : ts)
    if (t.matrix) matrix_bytes += stored_bytes(t, format_of(t, dense, experts)) + 64;
  m->reserved_ = std::make_unique<ReservedSpace>(matrix_bytes, /*readable=*/false);
  m->owned_.reserve(ts.size());
  for (const auto& t : ts) {
    const size_t n = stored_bytes(t, format_of(t, dense, experts));
    if (t.matrix) {
      m->tensor_data_[t.name] = m->reserved_->take(n);
    } else {
      m->owned_.emplace_back(n);
      m->tensor_data_[t.name] = m->owned_.back().data();
    }
  }
  m->bind();
  return m;
}

void MuseModel::bind() {
  const MuseConfig& c = cfg_;
  const int64_t H = c.hidden, E = c.n_expert, F = c.expert_ff, D = c.expert_dim;
  auto data = [&](const std::string& n) {
    auto it = tensor_data_.find(n);
    MK_CHECK(it != tensor_data_.end(), "tensor {} not bound", n);
    return it->second;
  };
  auto vec = [&](const std::string& n, int64_t count) {
    std::vector<float> v(static_cast<size_t>(count));
    std::memcpy(v.data(), data(n), v.size() * 4);
    return v;
  };
  auto mat = [&](const std::string& n, DType d, int64_t rows, int64_t cols) { return view(d, rows, cols, data(n)); };
  embed_ = mat("embed.weight", dense_, c.vocab, H);
  lm_head_ = mat("lm_head.weight", dense_, c.vocab, H);
  final_norm_ = vec("final_norm", H);
  ones_.assign(static_cast<size_t>(c.head_dim), 1.f);
  ones_h_.assign(static_cast<size_t>(H), 1.f);
  vocab_mask_.assign(static_cast<size_t>(c.vocab), 0.f);
  for (int i = c.vocab_used; i < c.vocab; ++i) vocab_mask_[static_cast<size_t>(i)] = -INFINITY;
  layers_.clear();
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    MuseLayer L;
    L.full = c.is_full_attention(l);
    L.attn_norm = vec(p + "attn_norm", H);
    L.ffn_norm = vec(p + "ffn_norm", H);
    L.wq = mat(p + "attn.q", dense_, c.q_dim(), H);
    L.wk = mat(p + "attn.k", dense_, c.kv_dim(), H);
    L.wv = mat(p + "attn.v", dense_, c.kv_dim(), H);
    L.wgate = mat(p + "attn.gate", dense_, c.q_dim(), H);
    L.wo = mat(p + "attn.o", dense_, H, c.q_dim());
    L.attn_gamma = vec(p + "attn_gamma", H);
    L.ffn_gamma = vec(p + "ffn_gamma", H);
    L.post_ffn_norm = vec(p + "post_ffn_norm", H);
    L.attn_gate = residual_gate_coefficients(L.attn_gamma);
    L.ffn_gate = residual_gate_coefficients(L.ffn_gamma);
    L.ffn_gate.insert(L.ffn_gate.end(), L.post_ffn_norm.begin(), L.post_ffn_norm.end());
    L.router = mat(p + "moe.router", DType::F32, E, H);
    L.router_bias = vec(p + "moe.router_bias", E);
    L.pre = mat(p + "moe.pre", dense_, D, H);
    L.pre_norm = vec(p + "moe.pre_norm", D);
    L.post = mat(p + "moe.post", dense_, H, D);
    ExpertBank& b = L.experts;
    b.n_expert = static_cast<int>(E);
    b.d_in = static_cast<int>(D);
    b.d_ff = static_cast<int>(F);
    b.act = ExpertAct::SwiGLU;
    b.out_norm_eps = static_cast<float>(c.post_eps);
    const size_t glu_bytes = glu_stride_ ? glu_stride_ : static_cast<size_t>(F) * row_bytes(expert_, D);
    const size_t down_bytes = static_cast<size_t>(D) * row_bytes(expert_, F);
    for (int64_t e = 0; e < E; ++e) {
      b.gate.push_back(view(expert_, F, D, data(p + "moe.experts.gate") + static_cast<size_t>(e) * glu_bytes));
      b.up.push_back(view(expert_, F, D, data(p + "moe.experts.up") + static_cast<size_t>(e) * glu_bytes));
      b.down.push_back(view(expert_, D, F, data(p + "moe.experts.down") + static_cast<size_t>(e) * down_bytes));
    }
    const std::vector<float> sc = vec(p + "moe.experts.scale", 3 * E);
    b.gate_scale.assign(sc.begin(), sc.begin() + E);
    b.up_scale.assign(sc.begin() + E, sc.begin() + 2 * E);
    b.down_scale.assign(sc.begin() + 2 * E, sc.end());
    b.out_norm = vec(p + "moe.experts.norm", D);
    layers_.push_back(std::move(L));
  }
}

void MuseModel::save(const std::string& dir) const {
  const MuseConfig& c = cfg_;
  nlohmann::json cj = {{"model_type", "muse_spark"},
                       {"name", c.name},
                       {"n_layer", c.n_layer},
                       {"hidden", c.hidden},
                       {"vocab", c.vocab},
                       {"vocab_used", c.vocab_used},
                       {"rms_eps", c.rms_eps},
                       {"post_eps", c.post_eps},
                       {"qk_scale_factor", c.qk_scale_factor},
                       {"route_eps", c.route_eps},
                       {"n_head", c.n_head},
                       {"n_head_kv", c.n_head_kv},
                       {"head_dim", c.head_dim},
                       {"window", c.window},
                       {"rope_theta", c.rope_theta},
                       {"full_attn_interval", c.full_attn_interval},
                       {"full_attn_offset", c.full_attn_offset},
                       {"n_expert", c.n_expert},
                       {"top_k", c.top_k},
                       {"expert_ff", c.expert_ff},
                       {"expert_dim", c.expert_dim},
                       {"router_scale", c.router_scale},
                       {"logit_scale", c.logit_scale},
                       {"logit_cap", c.logit_cap},
                       {"dense_format", dtype_traits(dense_).name},
                       {"expert_format", dtype_traits(expert_).name}};
  write_checkpoint_config(dir, cj.dump(2) + "\n");
  // Tensors back to back in muse_tensors order; every size is a multiple of 4
  // (all widths are multiples of 128), so every tensor is aligned for its dtype.
  SafetensorsWriter w;
  for (const auto& t : muse_tensors(c)) {
    const DType d = format_of(t, dense_, expert_);
    const uint8_t* data = tensor_data_.at(t.name);
    const size_t n = stored_bytes(t, d);
    std::vector<uint8_t> bytes;
    if (glu_stride_ && (t.name.ends_with("experts.gate") || t.name.ends_with("experts.up"))) {
      const size_t per = n / static_cast<size_t>(c.n_expert);  // gathered from the fused tensor's row ranges
      for (size_t e = 0; e < static_cast<size_t>(c.n_expert); ++e)
        bytes.insert(bytes.end(), data + e * glu_stride_, data + e * glu_stride_ + per);
    } else {
      bytes.assign(data, data + n);
    }
    w.add(t.name, st_dtype(d), stored_shape(t, d), std::move(bytes));
  }
  w.set_metadata("format", "muse_spark");
  w.write(dir + "/model.safetensors");
}

std::unique_ptr<MuseModel> MuseModel::load(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string cpath = (fs::path(dir) / "config.json").string();
  std::ifstream cf(cpath);
  if (!cf) fail("{}: cannot open (a Muse Spark model directory needs config.json and model.safetensors)", cpath);
  const std::string text((std::istreambuf_iterator<char>(cf)), std::istreambuf_iterator<char>());
  const nlohmann::json j = parse_config_json(text, cpath);
  // A Hugging Face style config (the reference's checkpoints) has its
  // fields under text_config, or hidden_size at the top level.
  if (j.is_object() && (j.contains("text_config") || j.contains("hidden_size"))) return load_reference(dir, cpath);
  if (!j.is_object() || j.value("model_type", std::string()) != "muse_spark")
    fail("{}: model_type must be \"muse_spark\"", cpath);
  std::unique_ptr<MuseModel> m(new MuseModel());
  MuseConfig& c = m->cfg_;
  c.name = j.value("name", std::string("muse-spark"));
  c.n_layer = json_int(j, cpath, "n_layer", 1, kMaxConfigLayers);
  c.hidden = json_int(j, cpath, "hidden");
  c.vocab = json_int(j, cpath, "vocab");
  c.vocab_used = json_int(j, cpath, "vocab_used");
  c.rms_eps = json_num(j, cpath, "rms_eps", c.rms_eps, 0, 1);
  c.post_eps = json_num(j, cpath, "post_eps", c.post_eps, 0, 1);
  c.qk_scale_factor = json_num(j, cpath, "qk_scale_factor", c.qk_scale_factor);
  c.route_eps = config_float_in_closed(cpath, "route_eps", json_num(j, cpath, "route_eps", c.route_eps, -1, 1), 0, 1);
  c.n_head = json_int(j, cpath, "n_head");
  c.n_head_kv = json_int(j, cpath, "n_head_kv");
  c.head_dim = json_int(j, cpath, "head_dim");
  c.window = json_int(j, cpath, "window", 1, int64_t{1} << 30);
  c.rope_theta = json_num(j, cpath, "rope_theta", c.rope_theta);
  c.full_attn_interval = json_int(j, cpath, "full_attn_interval", 1, kMaxConfigLayers);
  c.full_attn_offset = json_int(j, cpath, "full_attn_offset", 0, kMaxConfigLayers);
  c.n_expert = json_int(j, cpath, "n_expert", 1, 4096);
  c.top_k = json_int(j, cpath, "top_k", 1, 4096);
  c.expert_ff = json_int(j, cpath, "expert_ff");
  c.expert_dim = json_int(j, cpath, "expert_dim");
  c.router_scale = json_num(j, cpath, "router_scale", c.router_scale);
  c.logit_scale = json_num(j, cpath, "logit_scale", c.logit_scale);
  c.logit_cap = json_num(j, cpath, "logit_cap", c.logit_cap);
  c.validate();
  m->dense_ = json_format(j, cpath, "dense_format");
  m->expert_ = json_format(j, cpath, "expert_format");

  m->st_ = std::make_unique<SafetensorsModel>(SafetensorsModel::open(dir));
  const SafetensorsModel& st = *m->st_;
  for (const MuseTensor& t : muse_tensors(c)) {
    const DType d = format_of(t, m->dense_, m->expert_);
    const std::vector<int64_t> want = stored_shape(t, d);
    const std::string want_dtype = st_dtype(d);
    const SafetensorsTensor* f = st.find(t.name);
    if (!f)
      fail("{}: tensor '{}' is missing (expected {} {})", st.path(), t.name, want_dtype, shape_str(want));
    if (f->dtype != want_dtype || f->shape != want)
      fail("{}: tensor '{}' is {} {}, expected {} {} ({} in {})", st.path(), t.name, f->dtype, shape_str(f->shape),
           want_dtype, shape_str(want), shape_str(t.shape), dtype_traits(d).name);
    const size_t align = want_dtype == "U8" ? 1 : want_dtype == "F32" ? 4 : 2;
    // Vectors are copied by bind(); matrices are used in place when aligned.
    if (!t.matrix || reinterpret_cast<uintptr_t>(f->data) % align == 0) {
      m->tensor_data_[t.name] = f->data;
    } else {
      m->owned_.emplace_back(f->data, f->data + f->n_bytes);
      m->tensor_data_[t.name] = m->owned_.back().data();
    }
  }
  m->bind();
  return m;
}

DecodeProgram build_muse_program(const MuseModel& model, int max_rows) {
  if (max_rows < 1 || max_rows > 64) fail("max_rows must be in [1, 64], got {}", max_rows);
  const MuseConfig& c = model.config();
  DecodeProgram p;
  p.model_name = c.name.empty() ? "muse-spark" : c.name;
  p.n_layer = c.n_layer;
  p.max_rows = max_rows;
  p.n_vocab = c.vocab;
  p.kv_dim = static_cast<int>(c.kv_dim());
  const int H = c.hidden, qd = static_cast<int>(c.q_dim()), kvd = p.kv_dim, E = c.n_expert, k = c.top_k;
  const int D = c.expert_dim, F = c.expert_ff;
  const float eps = static_cast<float>(c.rms_eps);
  const float post_eps = static_cast<float>(c.post_eps);

  const int s = p.add_slot("s", -1, H);             // the f32 residual stream
  const int xn = p.add_slot("xn", -1, H);
  const int q = p.add_slot("q", -1, qd);
  const int kk = p.add_slot("k", -1, kvd);
  const int v = p.add_slot("v", -1, kvd);
  const int g = p.add_slot("attn_gate", -1, qd);
  const int e0 = p.add_slot("embed_raw", -1, H);
  const int att = p.add_slot("att", -1, qd);
  const int proj = p.add_slot("proj", -1, H);
  const int rlogit = p.add_slot("router_logits", -1, E);
  const int route = p.add_slot("route", -1, 2 * k);
  const int zp = p.add_slot("moe_pre", -1, D);
  const int z = p.add_slot("moe_in", -1, D);
  const int h = p.add_slot("moe_h", -1, k * F);
  const int y = p.add_slot("moe_y", -1, k * D);
  const int mo = p.add_slot("moe_out", -1, D);

  // The embedding row is RMS-normalised without a weight before the first
  // layer (musespark/__init__.py embed).
  Op& emb = p.add_op(OpKind::Embed, -1, "token_embd");
  emb.mat = model.tok_embd();
  emb.out = e0;
  p.add_rmsnorm(-1, "token_embd_norm", model.unit_hidden(), eps, e0, s);

  for (int l = 0; l < c.n_layer; ++l) {
    const MuseLayer& L = model.layers()[static_cast<size_t>(l)];
    p.add_rmsnorm(l, "attn_norm", L.attn_norm, eps, s, xn);
    p.add_matmul(l, "attn_q", L.wq, xn, q);
    p.add_matmul(l, "attn_k", L.wk, xn, kk);
    p.add_matmul(l, "attn_v", L.wv, xn, v);
    p.add_matmul(l, "attn_gate", L.wgate, xn, g);
    // rope_neox: rotate-half; scale: musespark/config.py softmax_scale
    p.add_attention_core({.layer = l, .q = q, .k = kk, .v = v, .att = att, .n_head = c.n_head,
                          .n_head_kv = c.n_head_kv, .head_dim = c.head_dim, .rope_dim = L.full ? 0 : c.head_dim,
                          .rope_base = static_cast<float>(c.rope_theta), .rope_neox = true, .eps = eps,
                          .q_norm = &model.unit_norm(), .k_norm = &model.unit_norm(),
                          .scale = static_cast<float>(c.softmax_scale()), .window = L.full ? 0 : c.window,
                          .cache_index = l});
    Op& hg = p.add_op(OpKind::HeadNormGate, l, "attn_out_norm_gate");
    hg.in = g;
    hg.out = att;
    hg.as<ops::HeadNormGate>().n_head = c.n_head;
    hg.as<ops::HeadNormGate>().head_dim = c.head_dim;
    hg.as<ops::HeadNormGate>().eps = eps;
    p.add_matmul(l, "attn_output", L.wo, att, proj);
    Op& ra = p.add_op(OpKind::GatedResidual, l, "attn_residual");
    ra.in = proj;
    ra.out = s;
    ra.as<ops::GatedResidual>().coef = L.attn_gate;
    ra.as<ops::GatedResidual>().eps = post_eps;

    p.add_rmsnorm(l, "ffn_norm", L.ffn_norm, eps, s, xn);
    p.add_matmul(l, "moe_router", L.router, xn, rlogit);
    Op& rt = p.add_op(OpKind::MoeRoute, l, "moe_route");
    rt.in = rlogit;
    rt.out = route;
    rt.as<ops::MoeRoute>().top_k = k;
    rt.as<ops::MoeRoute>().scale = static_cast<float>(c.router_scale);
    rt.as<ops::MoeRoute>().bias = L.router_bias;
    rt.as<ops::MoeRoute>().eps = static_cast<float>(c.route_eps);
    p.add_matmul(l, "moe_pre", L.pre, xn, zp);
    p.add_rmsnorm(l, "moe_pre_norm", L.pre_norm, eps, zp, z);
    p.add_moe_experts(l, &L.experts, k, route, z, h, y, mo);
    p.add_matmul(l, "moe_post", L.post, mo, proj);
    Op& rf = p.add_op(OpKind::GatedResidual, l, "ffn_residual");
    rf.in = proj;
    rf.out = s;
    rf.as<ops::GatedResidual>().coef = L.ffn_gate;
    rf.as<ops::GatedResidual>().eps = post_eps;
  }
  const int logits = p.add_slot("logits", -1, c.vocab);
  p.add_rmsnorm(-1, "output_norm", model.final_norm(), eps, s, xn);
  p.add_matmul(-1, "output", model.lm_head(), xn, logits);
  Op& sc = p.add_op(OpKind::LogitSoftcap, -1, "logit_softcap");
  sc.out = logits;
  sc.as<ops::LogitSoftcap>().scale = static_cast<float>(c.logit_scale);
  sc.as<ops::LogitSoftcap>().cap = static_cast<float>(c.logit_cap);
  if (c.vocab_used < c.vocab) {
    sc.as<ops::LogitSoftcap>().mask = model.vocab_mask();
  }
  p.logits_slot = logits;
  p.verify();
  return p;
}

// ---------------------------------------------------------------------------
// The architecture (model/architecture.h).

namespace {

class MuseArchModel final : public ArchModel {
 public:
  explicit MuseArchModel(std::unique_ptr<MuseModel> m) : m_(std::move(m)) {}
  DecodeProgram build_program(int max_rows) const override { return build_muse_program(*m_, max_rows); }
  int n_vocab() const override { return m_->config().vocab; }
  // Windowed layers keep window + 63 positions: enough for steps of up to 64
  // rows of one sequence (build_muse_program's largest).
  int ring_block() const override { return 64; }
  std::string description() const override {
    const MuseConfig& c = m_->config();
    return fmt::format(
        "muse-spark (MoE, sliding-window + NoPE attention): {} layers, hidden {}, {} experts top-{}, vocab {}, dense "
        "{}, experts {} ({:.1f} MB read per step)",
        c.n_layer, c.hidden, c.n_expert, c.top_k, c.vocab, dtype_traits(m_->dense_format()).name,
        dtype_traits(m_->expert_format()).name, build_program(1).weight_bytes() / 1e6);
  }
  const MuseModel& model() const { return *m_; }

 private:
  std::unique_ptr<MuseModel> m_;
};

class MuseArchitecture final : public Architecture {
 public:
  std::string name() const override { return "muse-spark"; }
  std::vector<std::string> presets() const override {
    std::vector<std::string> v;
    for (const auto& c : muse_presets()) v.push_back(c.name);
    return v;
  }
  bool runnable(const std::string& preset) const override { return preset != "muse-spark-1.2"; }
  std::vector<std::string> hf_model_types() const override { return {"muse_spark"}; }
  std::unique_ptr<ArchModel> synthetic(const std::string& preset, const ModelOptions& o) const override {
    if (!runnable(preset)) fail_full_size(preset, 446.5);
    return std::make_unique<MuseArchModel>(MuseModel::synthetic(*find_muse_preset(preset), o.seed,
                                                                o.weights.value_or(DType::BF16),
                                                                o.experts.value_or(DType::INT4_G128)));
  }
  std::unique_ptr<ArchModel> load_dir(const std::string& dir, const ModelOptions& o) const override {
    if (o.weights) fail("{}: a Muse Spark checkpoint keeps the formats it was written in (drop --weights)", dir);
    return std::make_unique<MuseArchModel>(MuseModel::load(dir));
  }
  void generate(const std::string& preset, const GenOptions& o, const std::string& dir) const override {
    if (!runnable(preset))
      fail("--config {}: ~454 GB of weights (bf16 dense, int4 experts) is too large to generate; use a mini or bench preset", preset);
    const auto model = MuseModel::synthetic(*find_muse_preset(preset), o.seed, o.weights.value_or(DType::BF16),
                                            o.experts.value_or(DType::INT4_G128));
    if (o.layout == "reference")
      model->save_reference(dir);
    else
      model->save(dir);
  }
  bool writes_reference_layout() const override { return true; }
  std::string describe(const std::string& preset) const override { return megakern::describe(*find_muse_preset(preset)); }
  std::unique_ptr<ArchModel> shapes_only(const std::string& preset) const override {
    return std::make_unique<MuseArchModel>(MuseModel::shapes_only(*find_muse_preset(preset)));
  }
};

}  // namespace

const Architecture& muse_architecture() {
  static const MuseArchitecture a;
  return a;
}

}  // namespace megakern
