#include "model/qwen38.h"
#include "core/units.h"

#include <cmath>
#include <filesystem>
#include <cstring>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/architecture.h"
#include "io/config_value.h"
#include "io/gguf.h"
#include "io/hf_config.h"
#include "model/dense_families.h"
#include "model/gguf_weights.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "core/rng.h"
#include "kernels/cpu/matmul.h"

namespace megakern {

Qwen38Model::~Qwen38Model() = default;

namespace {

// Row ranges [begin, end) of a fused checkpoint matrix, in the order the
// engine stacks them into one of its matrices.
struct Rows {
  int64_t begin, end;
};
// q_proj / attn_q, rows [head][query | gate]: the queries (gate false) or
// the gates of every head.
std::vector<Rows> query_rows(const Qwen38Config& c, bool gate) {
  const int64_t Dh = c.head_dim;
  std::vector<Rows> v;
  for (int64_t h = 0; h < c.n_head; ++h) v.push_back({2 * h * Dh + (gate ? Dh : 0), 2 * h * Dh + (gate ? 2 * Dh : Dh)});
  return v;
}
// Qwen3-Next's in_proj_qkvz (ssm_in in older GGUF files), rows per key head g
// [q (dk) | k (dk) | v (r dv) | z (r dv)], r value heads per key head:
// all q, all k, all v (value head g r + j), or (z true) all z.
std::vector<Rows> qkvz_rows(const Qwen38Config& c, bool z) {
  const int64_t nk = c.la_n_k_heads, dk = c.la_k_head_dim, rv = int64_t(c.la_n_v_heads / c.la_n_k_heads) * c.la_v_head_dim;
  const int64_t group = 2 * dk + 2 * rv;
  std::vector<Rows> v;
  if (z) {
    for (int64_t g = 0; g < nk; ++g) v.push_back({g * group + 2 * dk + rv, (g + 1) * group});
    return v;
  }
  for (int64_t part : {int64_t{0}, dk, 2 * dk})  // q, k, v
    for (int64_t g = 0; g < nk; ++g) v.push_back({g * group + part, g * group + part + (part == 2 * dk ? rv : dk)});
  return v;
}
// Qwen3-Next's in_proj_ba / ssm_ba, rows per key head [b (r) | a (r)]: all b, then all a.
std::vector<Rows> ba_rows(const Qwen38Config& c) {
  const int64_t nk = c.la_n_k_heads, r = c.la_n_v_heads / c.la_n_k_heads;
  std::vector<Rows> v;
  for (int64_t part : {int64_t{0}, r})
    for (int64_t g = 0; g < nk; ++g) v.push_back({g * 2 * r + part, g * 2 * r + part + r});
  return v;
}
// Value heads stored tiled (Qwen3.5 GGUF: value head g r + j of key head g
// at position j n_k + g), blocks of `per_head` rows from `offset`: the rows in
// grouped order.
std::vector<Rows> untiled_rows(const Qwen38Config& c, int64_t offset, int64_t per_head) {
  const int64_t nk = c.la_n_k_heads, r = c.la_n_v_heads / c.la_n_k_heads;
  std::vector<Rows> v;
  for (int64_t h = 0; h < c.la_n_v_heads; ++h) {
    const int64_t pos = (h % r) * nk + h / r;
    v.push_back({offset + pos * per_head, offset + (pos + 1) * per_head});
  }
  return v;
}

}  // namespace

struct Qwen38Loader {
  Qwen38Model& m;
  const SafetensorsModel* st;   // the checkpoint (null for a GGUF file)
  std::optional<DType> target;  // convert matrices to this format
  std::string path;             // the file, for messages

  const SafetensorsTensor& get(const std::string& name) const {
    const SafetensorsTensor* t = st->find(m.prefix_ + name);
    if (!t && name == "lm_head.weight") t = st->find(name);
    if (!t) fail("{}: tensor '{}' is missing", path, name == "lm_head.weight" ? name : m.prefix_ + name);
    return *t;
  }

  std::vector<float>& own(size_t bytes) {
    m.owned_.emplace_back((bytes + 3) / 4);
    return m.owned_.back();
  }

  // Rows [b, e) of several 2-D tensors, stacked, as one matrix. Zero-copy when
  // there is one piece of a supported dtype with aligned data.
  struct Piece {
    const SafetensorsTensor* t;
    int64_t begin, end;
  };
  MatView stack(const std::vector<Piece>& pieces) {
    const int64_t cols = pieces[0].t->shape.back();  // a 3-D tensor is read as [d0 * d1][d2]
    const std::optional<DType> first = safetensors_float_format(pieces[0].t->dtype);
    DType dt = first.value_or(DType::F32);
    size_t elem = first ? dtype_traits(dt).block_bytes : 4;
    bool keep = first.has_value();
    for (const auto& p : pieces) {
      if (safetensors_float_format(p.t->dtype) != first) keep = false;
      MK_CHECK(p.t->shape.size() >= 2 && p.t->shape.back() == cols, "stacked pieces must share their width");
    }
    if (!keep) {
      dt = DType::F32;
      elem = 4;
    }
    MatView v;
    v.type = dt;
    v.cols = cols;
    v.row_bytes = static_cast<size_t>(cols) * elem;
    for (const auto& p : pieces) v.rows += p.end - p.begin;
    if (target && *target != dt) {
      const size_t n_owned = m.owned_.size();
      const MatView q = convert(stack_as_is(pieces, v, keep), pieces[0].t->name);
      if (m.owned_.size() == n_owned + 2)  // drop the intermediate copy
        m.owned_.erase(m.owned_.begin() + static_cast<std::ptrdiff_t>(n_owned));
      return q;
    }
    return stack_as_is(pieces, v, keep);
  }
  // v re-encoded row by row in the target format.
  MatView convert(const MatView& v, const std::string& tensor) {
    const auto& tr = dtype_traits(*target);
    if (v.cols % tr.block_size != 0)
      fail("{}: tensor '{}' has rows of {} values, which {} blocks of {} do not divide; load it in another format",
           path, tensor, v.cols, tr.name, tr.block_size);
    MatView q;
    q.type = *target;
    q.cols = v.cols;
    q.rows = v.rows;
    q.row_bytes = row_bytes(*target, v.cols);
    auto& buf = own(q.row_bytes * static_cast<size_t>(q.rows));
    uint8_t* dst = reinterpret_cast<uint8_t*>(buf.data());
    std::vector<float> row(static_cast<size_t>(v.cols));
    for (int64_t j = 0; j < v.rows; ++j) {
      dequantize_row(v, j, row.data());
      tr.quantize(row.data(), dst + static_cast<size_t>(j) * q.row_bytes, v.cols);
    }
    q.data = dst;
    return q;
  }
  MatView stack_as_is(const std::vector<Piece>& pieces, MatView v, bool keep) {
    const int64_t cols = v.cols;
    const size_t elem = v.row_bytes / static_cast<size_t>(cols);
    if (keep && pieces.size() == 1 && pieces[0].begin == 0 &&
        reinterpret_cast<uintptr_t>(pieces[0].t->data) % elem == 0) {
      v.data = pieces[0].t->data;
      return v;
    }
    auto& buf = own(v.row_bytes * static_cast<size_t>(v.rows));
    uint8_t* dst = reinterpret_cast<uint8_t*>(buf.data());
    std::map<const SafetensorsTensor*, std::vector<float>> converted;  // each source converted once
    for (const auto& p : pieces) {
      const size_t n = static_cast<size_t>(p.end - p.begin) * v.row_bytes;
      if (keep) {
        std::memcpy(dst, p.t->data + static_cast<size_t>(p.begin) * v.row_bytes, n);
      } else {
        auto it = converted.find(p.t);
        if (it == converted.end()) it = converted.emplace(p.t, to_f32(*p.t)).first;
        std::memcpy(dst, it->second.data() + static_cast<size_t>(p.begin) * cols, n);
      }
      dst += n;
    }
    v.data = reinterpret_cast<const uint8_t*>(buf.data());
    return v;
  }
  static std::vector<Piece> pieces(const SafetensorsTensor& t, const std::vector<Rows>& rows) {
    std::vector<Piece> v;
    for (const Rows& r : rows) v.push_back({&t, r.begin, r.end});
    return v;
  }
  MatView mat(const std::string& name) {
    const auto& t = get(name);
    return stack({{&t, 0, t.shape[0]}});
  }
  std::vector<float> vec(const std::string& name, float add = 0.f) {
    std::vector<float> v = to_f32(get(name));
    if (add != 0.f)
      for (auto& x : v) x += add;
    return v;
  }
};

std::unique_ptr<Qwen38Model> Qwen38Model::load(const std::string& dir, std::optional<DType> weights) {
  std::unique_ptr<Qwen38Model> m(new Qwen38Model());
  const HFConfig hf = HFConfig::load(dir);
  m->cfg_ = qwen38_config_from_hf(hf);
  m->st_ = std::make_unique<SafetensorsModel>(SafetensorsModel::open(dir));
  return load_from(std::move(m), hf.name(), weights);
}

std::unique_ptr<Qwen38Model> Qwen38Model::synthetic(const Qwen38Config& c, uint64_t seed,
                                                    std::optional<DType> weights) {
  c.validate();
  std::unique_ptr<Qwen38Model> m(new Qwen38Model());
  m->cfg_ = c;
  m->image_ = safetensors_bytes(qwen38_synthetic_tensors(c, seed));
  const std::string name = fmt::format("{} (synthetic, seed {})", c.name, seed);
  m->st_ = std::make_unique<SafetensorsModel>(
      SafetensorsModel::from_file(SafetensorsFile::parse(m->image_.data(), m->image_.size(), name), name));
  return load_from(std::move(m), c.name, weights);
}

std::unique_ptr<Qwen38Model> Qwen38Model::shapes_only(const Qwen38Config& c) {
  c.validate();
  std::unique_ptr<Qwen38Model> m(new Qwen38Model());
  m->cfg_ = c;
  std::vector<SafetensorsEntry> entries;
  for (const Qwen38Tensor& t : qwen38_tensors(c)) entries.push_back({t.name, t.matrix ? "BF16" : "F32", t.shape});
  size_t data_bytes = 0;
  const std::string head = safetensors_head(entries, {}, data_bytes);
  m->reserved_ = std::make_unique<ReservedSpace>(head.size() + data_bytes, /*readable=*/true);
  std::memcpy(m->reserved_->data(), head.data(), head.size());
  const std::string name = fmt::format("{} (shapes only)", c.name);
  m->st_ = std::make_unique<SafetensorsModel>(SafetensorsModel::from_file(
      SafetensorsFile::parse(m->reserved_->data(), head.size() + data_bytes, name), name));
  return load_from(std::move(m), c.name, std::nullopt);
}

std::unique_ptr<Qwen38Model> Qwen38Model::load_from(std::unique_ptr<Qwen38Model> m, const std::string& config_name,
                                                    std::optional<DType> weights) {
  const Qwen38Config& c = m->cfg_;
  const SafetensorsModel& st = *m->st_;
  if (st.find("model.embed_tokens.weight"))
    m->prefix_ = "model.";
  else if (st.find("model.language_model.embed_tokens.weight"))
    m->prefix_ = "model.language_model.";
  else
    fail("{}: no 'model.embed_tokens.weight' nor 'model.language_model.embed_tokens.weight'; not a Qwen3.5-family "
         "checkpoint",
         st.path());

  // Transformers 5's Qwen3.5-MoE keeps each layer's experts in two 3-D
  // tensors; the checkpoint may hold them so or one matrix per expert.
  const bool fused_experts = c.moe() && st.find(m->prefix_ + "layers.0.mlp.experts.gate_up_proj");
  // Every tensor with its expected shape, before anything is read.
  for (const Qwen38Tensor& t : qwen38_tensors(c, m->prefix_, fused_experts)) {
    const SafetensorsTensor* f = st.find(t.name);
    if (!f) fail("{}: tensor '{}' is missing (expected shape {})", st.path(), t.name, shape_str(t.shape));
    if (f->shape != t.shape)
      fail("{}: tensor '{}' has shape {}, expected {} for config {}", st.path(), t.name, shape_str(f->shape),
           shape_str(t.shape), config_name);
    if (t.matrix && !safetensors_float_format(f->dtype) && f->dtype != "F64" && f->dtype.rfind("F8", 0) != 0)
      fail("{}: tensor '{}' has dtype {}; expected a float type (F32, F16, BF16)", st.path(), t.name, f->dtype);
  }

  Qwen38Loader L{*m, &st, weights, st.path()};
  // "model.language_model." checkpoints keep lm_head.weight at the top level,
  // which get() handles; embed/norm carry the prefix.
  m->tok_embd_ = L.mat("embed_tokens.weight");
  // Tied embeddings (the small Qwen3.5 models): the LM head is the
  // embedding's view, one copy in memory; a stored lm_head.weight is then
  // ignored, as transformers ties it over.
  m->lm_head_ = c.tie_embeddings ? m->tok_embd_ : L.mat("lm_head.weight");
  m->final_norm_ = L.vec("norm.weight", 1.f);
  int n_attn = 0, n_delta = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    Qwen38Layer Ly;
    const std::string p = fmt::format("layers.{}.", l);
    Ly.attention = c.is_full_attention(l);
    Ly.input_norm = L.vec(p + "input_layernorm.weight", 1.f);
    Ly.post_norm = L.vec(p + "post_attention_layernorm.weight", 1.f);
    if (Ly.attention) {
      Ly.cache_index = n_attn++;
      const std::string a = p + "self_attn.";
      const auto& q = L.get(a + "q_proj.weight");
      Ly.wq = L.stack(L.pieces(q, query_rows(c, false)));
      Ly.wgate = L.stack(L.pieces(q, query_rows(c, true)));
      Ly.wk = L.mat(a + "k_proj.weight");
      Ly.wv = L.mat(a + "v_proj.weight");
      Ly.wo = L.mat(a + "o_proj.weight");
      Ly.q_norm = L.vec(a + "q_norm.weight", 1.f);
      Ly.k_norm = L.vec(a + "k_norm.weight", 1.f);
    } else {
      Ly.cache_index = n_delta++;
      const std::string a = p + "linear_attn.";
      if (c.fused_qkvz) {
        const auto& qkvz = L.get(a + "in_proj_qkvz.weight");
        const auto& ba = L.get(a + "in_proj_ba.weight");
        Ly.w_qkv = L.stack(L.pieces(qkvz, qkvz_rows(c, false)));
        Ly.w_z = L.stack(L.pieces(qkvz, qkvz_rows(c, true)));
        Ly.w_ba = L.stack(L.pieces(ba, ba_rows(c)));
      } else {
        Ly.w_qkv = L.mat(a + "in_proj_qkv.weight");
        Ly.w_z = L.mat(a + "in_proj_z.weight");
        const auto& b = L.get(a + "in_proj_b.weight");
        const auto& av = L.get(a + "in_proj_a.weight");
        Ly.w_ba = L.stack({{&b, 0, b.shape[0]}, {&av, 0, av.shape[0]}});
      }
      Ly.w_out = L.mat(a + "out_proj.weight");
      Ly.conv = L.vec(a + "conv1d.weight");  // [C][1][K] row-major is [C][K]
      Ly.a_log = L.vec(a + "A_log");
      Ly.dt_bias = L.vec(a + "dt_bias");
      Ly.gated_norm = L.vec(a + "norm.weight");
    }
    const std::string mp = p + "mlp.";
    if (c.moe()) {
      Ly.router = L.mat(mp + "gate.weight");
      ExpertBank& B = Ly.experts;
      B.n_expert = c.n_expert;
      B.d_in = c.hidden;
      B.d_ff = c.moe_intermediate;
      const int64_t F = c.moe_intermediate, H = c.hidden;
      for (int e = 0; e < c.n_expert; ++e) {
        if (fused_experts) {
          // experts.gate_up_proj [E][gate F | up F][H], experts.down_proj [E][H][F].
          const auto& gu = L.get(mp + "experts.gate_up_proj");
          const auto& dn = L.get(mp + "experts.down_proj");
          B.gate.push_back(L.stack({{&gu, 2 * F * e, 2 * F * e + F}}));
          B.up.push_back(L.stack({{&gu, 2 * F * e + F, 2 * F * (e + 1)}}));
          B.down.push_back(L.stack({{&dn, H * e, H * (e + 1)}}));
          continue;
        }
        const std::string x = fmt::format("{}experts.{}.", mp, e);
        B.gate.push_back(L.mat(x + "gate_proj.weight"));
        B.up.push_back(L.mat(x + "up_proj.weight"));
        B.down.push_back(L.mat(x + "down_proj.weight"));
      }
      Ly.sh_gate = L.mat(mp + "shared_expert.gate_proj.weight");
      Ly.sh_up = L.mat(mp + "shared_expert.up_proj.weight");
      Ly.sh_down = L.mat(mp + "shared_expert.down_proj.weight");
      Ly.sh_gate_inp = L.mat(mp + "shared_expert_gate.weight");
    } else {
      Ly.w_gate = L.mat(mp + "gate_proj.weight");
      Ly.w_up = L.mat(mp + "up_proj.weight");
      Ly.w_down = L.mat(mp + "down_proj.weight");
    }
    m->layers_.push_back(std::move(Ly));
  }
  return m;
}

namespace {

// Several row ranges of GGUF matrices of one format and width, copied into
// one matrix (rows are contiguous in every format, so any format keeps).
MatView gather_rows(std::vector<std::vector<float>>& owned, const std::vector<MatView>& parts) {
  MatView v = parts.at(0);
  v.rows = 0;
  v.packed = nullptr;
  for (const MatView& p : parts) {
    MK_CHECK(p.type == v.type && p.cols == v.cols, "gathered rows must share their format and width");
    v.rows += p.rows;
  }
  owned.emplace_back((v.row_bytes * static_cast<size_t>(v.rows) + 3) / 4);
  uint8_t* dst = reinterpret_cast<uint8_t*>(owned.back().data());
  v.data = dst;
  for (const MatView& p : parts) {
    std::memcpy(dst, p.data, p.row_bytes * static_cast<size_t>(p.rows));
    dst += p.row_bytes * static_cast<size_t>(p.rows);
  }
  return v;
}
std::vector<MatView> row_parts(const MatView& m, const std::vector<Rows>& rows) {
  std::vector<MatView> v;
  for (const Rows& r : rows) v.push_back(row_range(m, r.begin, r.end - r.begin));
  return v;
}
// Elements of a vector of rows of `width` values, reordered by `rows`.
std::vector<float> gather_values(const std::vector<float>& src, const std::vector<Rows>& rows, int64_t width) {
  std::vector<float> v;
  for (const Rows& r : rows)
    v.insert(v.end(), src.begin() + r.begin * width, src.begin() + r.end * width);
  return v;
}

}  // namespace

std::unique_ptr<Qwen38Model> Qwen38Model::load_gguf(std::unique_ptr<GGUFFile> file, std::optional<DType> weights) {
  if (weights && *weights != DType::F32)
    fail("{}: a GGUF file keeps the formats it was written in; --weights can only be f32 (dequantised at load), "
         "got {}",
         file->name(), dtype_traits(*weights).name);
  std::unique_ptr<Qwen38Model> m(new Qwen38Model());
  m->cfg_ = qwen38_config_from_gguf(*file);
  m->gguf_ = std::move(file);
  Qwen38Config& c = m->cfg_;
  const GGUFFile& f = *m->gguf_;
  using T = DenseTensor;
  auto name = [](T t, int l = 0, std::string_view suffix = "weight") { return dense_tensor_name(t, l, suffix); };
  const int64_t H = c.hidden;
  c.vocab = gguf_vocab_rows(f, name(T::TokenEmbd), H);
  // No output.weight: the embeddings are tied (llama.cpp's converter then
  // leaves it out).
  c.tie_embeddings = !f.find_tensor(name(T::Output));
  c.validate();

  Qwen38Loader L{*m, nullptr, weights, f.name()};
  std::vector<std::vector<float>>& owned = m->owned_;
  auto fin = [&](MatView v, const std::string& tensor) { return weights ? L.convert(v, tensor) : v; };
  auto mat = [&](const std::string& n, int64_t cols, int64_t rows) { return fin(gguf_mat(f, n, cols, rows), n); };
  auto gathered = [&](const std::vector<MatView>& parts, const std::string& n) {
    return fin(gather_rows(owned, parts), n);
  };
  m->tok_embd_ = mat(name(T::TokenEmbd), H, c.vocab);
  m->lm_head_ = c.tie_embeddings ? m->tok_embd_ : mat(name(T::Output), H, c.vocab);
  m->final_norm_ = gguf_vec(f, name(T::OutputNorm), H);  // stored as 1 + w

  const int64_t nk = c.la_n_k_heads, dk = c.la_k_head_dim, nv = c.la_n_v_heads, dv = c.la_v_head_dim;
  const int64_t C = c.la_conv_dim(), VD = c.la_value_dim(), K = c.conv_kernel;
  const int64_t qd = int64_t(c.n_head) * c.head_dim, kvd = int64_t(c.n_head_kv) * c.head_dim;
  // Qwen3.5's tiled value heads, as grouped rows: v of the qkv rows, z, b, a
  // (one row per head) and A, dt_bias, the conv's v channels.
  auto grouped = [&](int64_t offset, int64_t head_rows, int64_t total) {
    if (!c.tiled_v_heads) return std::vector<Rows>{{0, total}};
    std::vector<Rows> v;
    if (offset > 0) v.push_back({0, offset});
    for (const Rows& r : untiled_rows(c, offset, head_rows)) v.push_back(r);
    return v;
  };
  int n_attn = 0, n_delta = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    Qwen38Layer Ly;
    Ly.attention = c.is_full_attention(l);
    Ly.input_norm = gguf_vec(f, name(T::AttnNorm, l), H);
    Ly.post_norm = gguf_vec(f, name(T::AttnPostNorm, l), H);
    if (Ly.attention) {
      Ly.cache_index = n_attn++;
      const MatView q = gguf_mat(f, name(T::AttnQ, l), H, 2 * qd);  // per head [query | gate]
      Ly.wq = gathered(row_parts(q, query_rows(c, false)), name(T::AttnQ, l));
      Ly.wgate = gathered(row_parts(q, query_rows(c, true)), name(T::AttnQ, l));
      Ly.wk = mat(name(T::AttnK, l), H, kvd);
      Ly.wv = mat(name(T::AttnV, l), H, kvd);
      Ly.wo = mat(name(T::AttnOut, l), qd, H);
      Ly.q_norm = gguf_vec(f, name(T::AttnQNorm, l), c.head_dim);
      Ly.k_norm = gguf_vec(f, name(T::AttnKNorm, l), c.head_dim);
    } else {
      Ly.cache_index = n_delta++;
      if (f.find_tensor(name(T::AttnQkv, l)) || !f.find_tensor(name(T::SsmIn, l))) {
        const MatView qkv = gguf_mat(f, name(T::AttnQkv, l), H, C);
        const MatView z = gguf_mat(f, name(T::AttnGate, l), H, VD);
        if (c.tiled_v_heads) {
          Ly.w_qkv = gathered(row_parts(qkv, grouped(2 * nk * dk, dv, C)), name(T::AttnQkv, l));
          Ly.w_z = gathered(row_parts(z, grouped(0, dv, VD)), name(T::AttnGate, l));
        } else {
          Ly.w_qkv = fin(qkv, name(T::AttnQkv, l));
          Ly.w_z = fin(z, name(T::AttnGate, l));
        }
      } else {  // older qwen3next files: in_proj_qkvz as is
        const MatView in = gguf_mat(f, name(T::SsmIn, l), H, C + VD);
        Ly.w_qkv = gathered(row_parts(in, qkvz_rows(c, false)), name(T::SsmIn, l));
        Ly.w_z = gathered(row_parts(in, qkvz_rows(c, true)), name(T::SsmIn, l));
      }
      if (c.fused_qkvz) {
        const MatView ba = gguf_mat(f, name(T::SsmBa, l), H, 2 * nv);
        Ly.w_ba = gathered(row_parts(ba, ba_rows(c)), name(T::SsmBa, l));
      } else {
        const MatView b = gguf_mat(f, name(T::SsmBeta, l), H, nv);
        const MatView a = gguf_mat(f, name(T::SsmAlpha, l), H, nv);
        std::vector<MatView> parts = row_parts(b, grouped(0, 1, nv));
        for (const MatView& p : row_parts(a, grouped(0, 1, nv))) parts.push_back(p);
        Ly.w_ba = gathered(parts, name(T::SsmBeta, l));
      }
      Ly.conv = gather_values(gguf_values(f, name(T::SsmConv1d, l), {K, C}), grouped(2 * nk * dk, dv, C), K);
      Ly.dt_bias = gather_values(gguf_vec(f, name(T::SsmDt, l, "bias"), nv), grouped(0, 1, nv), 1);
      const std::string a_name = name(T::SsmA, l, "");
      const std::vector<float> A = gather_values(gguf_vec(f, a_name, nv), grouped(0, 1, nv), 1);
      for (size_t h = 0; h < A.size(); ++h) {
        if (!(A[h] < 0.f))
          fail("{}: tensor '{}' holds {} at index {}; it stores A = -exp(A_log), which is negative", f.name(), a_name,
               A[h], h);
        Ly.a_log.push_back(std::log(-A[h]));
      }
      Ly.gated_norm = gguf_vec(f, name(T::SsmNorm, l), dv);  // used as is
      const MatView out = gguf_mat(f, name(T::SsmOut, l), VD, H);
      if (c.tiled_v_heads) {
        // Columns tiled as the rows above: regrouped per row, in f32 unless
        // the format's blocks divide a head's columns.
        const auto& tr = dtype_traits(out.type);
        MatView src = out;
        if (dv % tr.block_size != 0) src = Qwen38Loader{*m, nullptr, DType::F32, f.name()}.convert(out, name(T::SsmOut, l));
        const size_t head_bytes = row_bytes(src.type, dv);
        const std::vector<Rows> heads = untiled_rows(c, 0, 1);  // grouped head h sits at heads[h].begin
        owned.emplace_back((src.row_bytes * static_cast<size_t>(src.rows) + 3) / 4);
        uint8_t* dst = reinterpret_cast<uint8_t*>(owned.back().data());
        for (int64_t j = 0; j < src.rows; ++j)
          for (size_t h = 0; h < heads.size(); ++h)
            std::memcpy(dst + static_cast<size_t>(j) * src.row_bytes + h * head_bytes,
                        src.row(j) + static_cast<size_t>(heads[h].begin) * head_bytes, head_bytes);
        src.data = dst;
        src.packed = nullptr;
        Ly.w_out = weights && src.type != *weights ? L.convert(src, name(T::SsmOut, l)) : src;
      } else {
        Ly.w_out = fin(out, name(T::SsmOut, l));
      }
    }
    if (c.moe()) {
      Ly.router = mat(name(T::FfnGateInp, l), H, c.n_expert);
      ExpertBank& B = Ly.experts;
      B.n_expert = c.n_expert;
      B.d_in = c.hidden;
      B.d_ff = c.moe_intermediate;
      const int64_t F = c.moe_intermediate;
      if (f.find_tensor(name(T::FfnGateUpExps, l))) {
        // Fused (newer converters): per expert F gate rows, then F up rows.
        for (const std::string& split : {name(T::FfnGateExps, l), name(T::FfnUpExps, l)})
          if (f.find_tensor(split))
            fail("{}: both '{}' and '{}' are present; a layer's experts come fused or split, not both", f.name(),
                 name(T::FfnGateUpExps, l), split);
        for (const MatView& e : gguf_expert_slabs(f, name(T::FfnGateUpExps, l), H, 2 * F, c.n_expert)) {
          B.gate.push_back(row_range(e, 0, F));
          B.up.push_back(row_range(e, F, F));
        }
      } else {
        B.gate = gguf_expert_slabs(f, name(T::FfnGateExps, l), H, F, c.n_expert);
        B.up = gguf_expert_slabs(f, name(T::FfnUpExps, l), H, F, c.n_expert);
      }
      B.down = gguf_expert_slabs(f, name(T::FfnDownExps, l), c.moe_intermediate, H, c.n_expert);
      for (auto* v : {&B.gate, &B.up, &B.down})
        for (MatView& e : *v) e = fin(e, name(T::FfnGateExps, l));
      const int64_t S = c.shared_intermediate;
      Ly.sh_gate = mat(name(T::FfnGateShexp, l), H, S);
      Ly.sh_up = mat(name(T::FfnUpShexp, l), H, S);
      Ly.sh_down = mat(name(T::FfnDownShexp, l), S, H);
      Ly.sh_gate_inp = fin(gguf_row_mat(f, name(T::FfnGateInpShexp, l), H), name(T::FfnGateInpShexp, l));
    } else {
      Ly.w_gate = mat(name(T::FfnGate, l), H, c.intermediate);
      Ly.w_up = mat(name(T::FfnUp, l), H, c.intermediate);
      Ly.w_down = mat(name(T::FfnDown, l), c.intermediate, H);
    }
    m->layers_.push_back(std::move(Ly));
  }
  return m;
}

DecodeProgram build_qwen38_program(const Qwen38Model& model, int max_rows) {
  if (max_rows < 1 || max_rows > 64) fail("max_rows must be in [1, 64], got {}", max_rows);
  const Qwen38Config& c = model.config();
  DecodeProgram p;
  p.model_name = c.name.empty() ? "qwen3.8" : c.name;
  p.n_layer = c.n_layer;
  p.max_rows = max_rows;
  p.n_vocab = c.vocab;
  p.kv_dim = c.n_head_kv * c.head_dim;
  p.recurrent = c.n_deltanet_layers() > 0;
  const int H = c.hidden, FF = c.intermediate, qd = c.n_head * c.head_dim, kvd = p.kv_dim;
  const int C = static_cast<int>(c.la_conv_dim()), VD = static_cast<int>(c.la_value_dim());
  const float eps = static_cast<float>(c.rms_eps);

  const int x = p.add_slot("x", -1, H);
  const int xn = p.add_slot("xn", -1, H);
  const int proj = p.add_slot("proj", -1, H);
  int gate = -1, up = -1, act = -1, rlog = -1, route = -1, eh = -1, ye = -1;
  DecodeProgram::SharedExpertSlots shared;
  if (c.moe()) {
    rlog = p.add_slot("router_logits", -1, c.n_expert);
    route = p.add_slot("route", -1, 2 * c.n_expert_used);
    eh = p.add_slot("expert_hidden", -1, c.n_expert_used * c.moe_intermediate);
    ye = p.add_slot("expert_out", -1, c.n_expert_used * H);
    shared.gate = p.add_slot("shared_gate", -1, c.shared_intermediate);
    shared.up = p.add_slot("shared_up", -1, c.shared_intermediate);
    shared.act = p.add_slot("shared_act", -1, c.shared_intermediate);
    shared.out = p.add_slot("shared_out", -1, H);
    shared.logit = p.add_slot("shared_gate_logit", -1, 1);
  } else {
    gate = p.add_slot("gate", -1, FF);
    up = p.add_slot("up", -1, FF);
    act = p.add_slot("act", -1, FF);
  }
  int q = -1, qgate = -1, k = -1, v = -1, att = -1, qkv = -1, z = -1, ba = -1, o = -1;
  if (c.n_full_attention_layers() > 0) {
    q = p.add_slot("q", -1, qd);
    qgate = p.add_slot("q_gate", -1, qd);
    k = p.add_slot("k", -1, kvd);
    v = p.add_slot("v", -1, kvd);
    att = p.add_slot("att", -1, qd);
  }
  if (c.n_deltanet_layers() > 0) {
    qkv = p.add_slot("qkv", -1, C);
    z = p.add_slot("z", -1, VD);
    ba = p.add_slot("ba", -1, 2 * c.la_n_v_heads);
    o = p.add_slot("delta_o", -1, VD);
  }

  Op& emb = p.add_op(OpKind::Embed, -1, "token_embd");
  emb.mat = model.tok_embd();
  emb.out = x;

  for (int l = 0; l < c.n_layer; ++l) {
    const Qwen38Layer& L = model.layers()[static_cast<size_t>(l)];
    p.add_rmsnorm(l, "attn_norm", L.input_norm, eps, x, xn);
    if (L.attention) {
      p.add_matmul(l, "attn_q", L.wq, xn, q);
      p.add_matmul(l, "attn_q_gate", L.wgate, xn, qgate);
      p.add_matmul(l, "attn_k", L.wk, xn, k);
      p.add_matmul(l, "attn_v", L.wv, xn, v);
      // rope_neox: rotate-half
      p.add_attention_core({.layer = l, .q = q, .k = k, .v = v, .att = att, .n_head = c.n_head,
                            .n_head_kv = c.n_head_kv, .head_dim = c.head_dim, .rope_dim = c.rotary_dim,
                            .rope_base = static_cast<float>(c.rope_theta), .rope_neox = true, .eps = eps,
                            .q_norm = &L.q_norm, .k_norm = &L.k_norm,
                            .scale = 1.f / std::sqrt(static_cast<float>(c.head_dim)), .cache_index = L.cache_index});
      Op& g = p.add_op(OpKind::SigmoidGate, l, "attn_gate");
      g.in = qgate;
      g.out = att;
      p.add_matmul(l, "attn_output", L.wo, att, proj);
    } else {
      p.add_matmul(l, "la_qkv", L.w_qkv, xn, qkv);
      p.add_matmul(l, "la_z", L.w_z, xn, z);
      p.add_matmul(l, "la_ba", L.w_ba, xn, ba);
      Op& cv = p.add_op(OpKind::CausalConvSilu, l, "la_conv");
      cv.out = qkv;
      cv.as<ops::CausalConvSilu>().taps = L.conv;
      cv.as<ops::CausalConvSilu>().cache_index = L.cache_index;
      Op& dr = p.add_op(OpKind::DeltaRule, l, "la_delta");
      dr.in = qkv;
      dr.in2 = ba;
      dr.out = o;
      dr.as<ops::DeltaRule>().n_head = c.la_n_v_heads;
      dr.as<ops::DeltaRule>().n_head_kv = c.la_n_k_heads;
      dr.as<ops::DeltaRule>().head_dim = c.la_v_head_dim;
      dr.as<ops::DeltaRule>().scale = 1.f / std::sqrt(static_cast<float>(c.la_k_head_dim));
      dr.as<ops::DeltaRule>().eps = 1e-6f;  // the L2 norm's, fixed in the reference
      dr.as<ops::DeltaRule>().a_log = L.a_log;
      dr.as<ops::DeltaRule>().dt_bias = L.dt_bias;
      dr.as<ops::DeltaRule>().cache_index = L.cache_index;
      Op& gn = p.add_op(OpKind::GatedRmsNorm, l, "la_gated_norm");
      gn.in = z;
      gn.out = o;
      gn.as<ops::GatedRmsNorm>().n_head = c.la_n_v_heads;
      gn.as<ops::GatedRmsNorm>().head_dim = c.la_v_head_dim;
      gn.as<ops::GatedRmsNorm>().weight = L.gated_norm;
      gn.as<ops::GatedRmsNorm>().eps = eps;
      p.add_matmul(l, "la_output", L.w_out, o, proj);
    }
    p.add_residual(l, "attn_residual", x, proj, {}, eps);
    p.add_rmsnorm(l, "ffn_norm", L.post_norm, eps, x, xn);
    if (c.moe()) {
      // Softmax over every expert, the top k (renormalised when
      // norm_topk_prob) weighting their SwiGLU outputs; plus the shared
      // expert scaled by its sigmoid gate.
      p.add_matmul(l, "ffn_gate_inp", L.router, xn, rlog);
      Op& rt = p.add_op(OpKind::MoeRoute, l, "moe_route");
      rt.in = rlog;
      rt.out = route;
      auto& r = rt.as<ops::MoeRoute>();
      r.top_k = c.n_expert_used;
      r.softmax = true;
      r.normalize = c.norm_topk_prob;
      r.eps = 0.f;
      p.add_moe_experts(l, &L.experts, c.n_expert_used, route, xn, eh, ye, proj);
      p.add_shared_expert(l, shared, L.sh_gate, L.sh_up, L.sh_down, L.sh_gate_inp, xn, proj, eps);
    } else {
      p.add_matmul(l, "ffn_gate", L.w_gate, xn, gate);
      p.add_matmul(l, "ffn_up", L.w_up, xn, up);
      p.add_glu(l, "ffn_act", gate, up, act, GluKind::SiLU);
      p.add_matmul(l, "ffn_down", L.w_down, act, proj);
    }
    p.add_residual(l, "ffn_residual", x, proj, {}, eps);
  }
  const int logits = p.add_slot("logits", -1, c.vocab);
  p.add_rmsnorm(-1, "output_norm", model.final_norm(), eps, x, xn);
  p.add_matmul(-1, "output", model.lm_head(), xn, logits);
  p.logits_slot = logits;
  p.verify();
  return p;
}

std::string qwen38_hf_config_json(const Qwen38Config& c) {
  nlohmann::ordered_json j;
  j["model_type"] = "qwen3_5_text";
  j["architectures"] = {"Qwen3_5ForCausalLM"};
  j["num_hidden_layers"] = c.n_layer;
  j["hidden_size"] = c.hidden;
  j["intermediate_size"] = c.intermediate;
  j["vocab_size"] = c.vocab;
  j["rms_norm_eps"] = c.rms_eps;
  j["hidden_act"] = "silu";
  j["num_attention_heads"] = c.n_head;
  j["num_key_value_heads"] = c.n_head_kv;
  j["head_dim"] = c.head_dim;
  j["linear_num_key_heads"] = c.la_n_k_heads;
  j["linear_num_value_heads"] = c.la_n_v_heads;
  j["linear_key_head_dim"] = c.la_k_head_dim;
  j["linear_value_head_dim"] = c.la_v_head_dim;
  j["linear_conv_kernel_dim"] = c.conv_kernel;
  j["full_attention_interval"] = c.full_attn_interval;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["attention_bias"] = false;
  j["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", c.rope_theta},
                          {"partial_rotary_factor", static_cast<double>(c.rotary_dim) / c.head_dim}};
  nlohmann::ordered_json types = nlohmann::ordered_json::array();
  for (int l = 0; l < c.n_layer; ++l) types.push_back(c.is_full_attention(l) ? "full_attention" : "linear_attention");
  j["layer_types"] = types;
  return j.dump(2) + "\n";
}

std::vector<SafetensorsOut> qwen38_synthetic_tensors(const Qwen38Config& c, uint64_t seed) {
  c.validate();
  std::vector<SafetensorsOut> out;
  Rng rng(seed);
  for (const Qwen38Tensor& t : qwen38_tensors(c)) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    const auto ends = [&](const char* suffix) { return t.name.ends_with(suffix); };
    if (t.matrix) {
      float std = 1.f / std::sqrt(static_cast<float>(t.shape[1]));
      if (t.kind == Qwen38Tensor::Kind::Embedding) std = 1.f;
      if (t.kind == Qwen38Tensor::Kind::LmHead) std *= 2.f;
      for (auto& x : v) x = rng.centred(std);
    } else if (ends("A_log")) {
      for (auto& x : v) x = std::log(1.f + 15.f * rng.uniform());
    } else if (ends("dt_bias")) {
      for (auto& x : v) x = 1.f + rng.centred(0.1f);
    } else if (ends("conv1d.weight")) {
      for (auto& x : v) x = rng.centred(0.5f);
    } else if (ends("linear_attn.norm.weight")) {
      for (auto& x : v) x = 1.f + rng.centred(0.1f);  // used as is
    } else {
      for (auto& x : v) x = rng.centred(0.1f);  // zero-centred norms: 1 + w
    }
    out.push_back(t.matrix ? safetensors_bf16(t.name, t.shape, v) : safetensors_f32(t.name, t.shape, v));
  }
  return out;
}

void write_qwen38_synthetic(const Qwen38Config& c, uint64_t seed, const std::string& dir) {
  write_checkpoint_config(dir, qwen38_hf_config_json(c));
  write_safetensors(dir + "/model.safetensors", qwen38_synthetic_tensors(c, seed),
                    {{"format", "pt"}, {"megakern.synthetic_seed", std::to_string(seed)}, {"megakern.preset", c.name}});
}

// ---------------------------------------------------------------------------
// The architecture (model/architecture.h).

namespace {

class Qwen38ArchModel final : public ArchModel {
 public:
  explicit Qwen38ArchModel(std::unique_ptr<Qwen38Model> m) : m_(std::move(m)) {}
  DecodeProgram build_program(int max_rows) const override { return build_qwen38_program(*m_, max_rows); }
  int n_vocab() const override { return m_->config().vocab; }
  const GGUFFile* gguf() const override { return m_->gguf(); }
  std::string description() const override {
    const Qwen38Config& c = m_->config();
    return fmt::format("qwen3.8 (Gated DeltaNet + gated attention): {} layers, hidden {}, vocab {}, {} ({:.1f} MB "
                       "read per step)",
                       c.n_layer, c.hidden, c.vocab, dtype_traits(m_->lm_head().type).name,
                       build_program(1).weight_bytes() / 1e6);
  }

 private:
  std::unique_ptr<Qwen38Model> m_;
};

class Qwen38Architecture final : public Architecture {
 public:
  std::string name() const override { return "qwen3.8"; }
  std::vector<std::string> presets() const override {
    std::vector<std::string> v;
    for (const auto& c : qwen38_presets()) v.push_back(c.name);
    return v;
  }
  bool runnable(const std::string& preset) const override { return preset != "qwen3.8-27b"; }
  std::vector<std::string> hf_model_types() const override {
    return {"qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next"};
  }
  std::vector<std::string> gguf_architectures() const override { return qwen38_gguf_architectures(); }
  std::unique_ptr<ArchModel> load_gguf(std::unique_ptr<GGUFFile> file, const ModelOptions& o) const override {
    return std::make_unique<Qwen38ArchModel>(Qwen38Model::load_gguf(std::move(file), o.weights));
  }
  std::unique_ptr<ArchModel> synthetic(const std::string& preset, const ModelOptions& o) const override {
    const Qwen38Config& c = *find_qwen38_preset(preset);
    if (!runnable(preset)) fail_full_size(preset, weight_bytes_total(c, DType::BF16) / 1e9);
    return std::make_unique<Qwen38ArchModel>(Qwen38Model::synthetic(c, o.seed, o.weights));
  }
  std::unique_ptr<ArchModel> load_dir(const std::string& dir, const ModelOptions& o) const override {
    return std::make_unique<Qwen38ArchModel>(Qwen38Model::load(dir, o.weights));
  }
  void generate(const std::string& preset, const GenOptions& o, const std::string& dir) const override {
    const Qwen38Config& c = *find_qwen38_preset(preset);
    const double gb = static_cast<double>(weight_bytes_total(c, DType::BF16)) / 1e9;
    if (gb > 8) fail("--config {}: {:.0f} GB of bf16 weights is too large to generate; use a mini or bench preset", preset, gb);
    if (o.weights || o.experts)
      fail("--config {}: the checkpoint is written in bf16 (convert at load with --weights)", preset);
    write_qwen38_synthetic(c, o.seed, dir);
  }
  std::string describe(const std::string& preset) const override { return megakern::describe(*find_qwen38_preset(preset)); }
  std::unique_ptr<ArchModel> shapes_only(const std::string& preset) const override {
    return std::make_unique<Qwen38ArchModel>(Qwen38Model::shapes_only(*find_qwen38_preset(preset)));
  }
};

}  // namespace

const Architecture& qwen38_architecture() {
  static const Qwen38Architecture a;
  return a;
}

}  // namespace megakern
