#include "model/dense.h"

#include "core/units.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/gguf.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec.h"

namespace megakern {
namespace {

std::string arch_key(const DenseConfig& c, const char* k) { return c.arch_name + "." + k; }

int positive_int(const GGUFFile& f, const std::string& key) {
  const int64_t v = f.get_int(key);
  if (v <= 0 || v > (int64_t{1} << 30)) fail("{}: '{}' must be a positive integer, got {}", f.name(), key, v);
  return static_cast<int>(v);
}

// A 2-D weight of GGUF shape {cols, rows}; checks both extents.
MatView mat(const GGUFFile& f, const std::string& name, int64_t cols, int64_t rows) {
  const GGUFTensorInfo& t = f.tensor(name);
  if (t.shape.size() != 2 || t.shape[0] != cols || t.shape[1] != rows)
    fail("{}: tensor '{}' has shape [{}], expected [{}, {}]", f.name(), name, fmt::join(t.shape, ", "), cols,
         rows);
  MatView m;
  m.type = t.type;
  m.cols = cols;
  m.rows = rows;
  m.data = t.data;
  m.row_bytes = row_bytes(t.type, cols);
  return m;
}

// A 1-D weight, dequantised to f32.
std::vector<float> vec(const GGUFFile& f, const std::string& name, int64_t n) {
  const GGUFTensorInfo& t = f.tensor(name);
  if (t.shape.size() != 1 || t.shape[0] != n)
    fail("{}: tensor '{}' has shape [{}], expected [{}]", f.name(), name, fmt::join(t.shape, ", "), n);
  std::vector<float> out(static_cast<size_t>(n));
  dtype_traits(t.type).dequantize(t.data, out.data(), n);
  return out;
}

}  // namespace

std::unique_ptr<DenseModel> DenseModel::load(const GGUFFile& f, std::optional<DType> weights) {
  if (weights && *weights != DType::F32)
    fail("{}: a GGUF file keeps the formats it was written in; --weights can only be f32 (dequantised at load), "
         "got {}",
         f.name(), dtype_traits(*weights).name);
  auto m = std::unique_ptr<DenseModel>(new DenseModel());
  DenseConfig& c = m->cfg_;
  c.arch_name = f.get_string("general.architecture");
  if (c.arch_name == "llama")
    c.arch = DenseArch::Llama;
  else if (c.arch_name == "qwen3")
    c.arch = DenseArch::Qwen3;
  else if (c.arch_name == "gemma3")
    c.arch = DenseArch::Gemma3;
  else
    fail("{}: architecture '{}' is not supported (expected llama, qwen3 or gemma3)", f.name(), c.arch_name);

  c.n_layer = positive_int(f, arch_key(c, "block_count"));
  c.n_embd = positive_int(f, arch_key(c, "embedding_length"));
  c.n_ff = positive_int(f, arch_key(c, "feed_forward_length"));
  c.n_head = positive_int(f, arch_key(c, "attention.head_count"));
  c.n_head_kv = f.has(arch_key(c, "attention.head_count_kv")) ? positive_int(f, arch_key(c, "attention.head_count_kv"))
                                                                : c.n_head;
  if (c.n_head % c.n_head_kv != 0)
    fail("{}: head_count {} is not a multiple of head_count_kv {}", f.name(), c.n_head, c.n_head_kv);
  c.head_dim = f.has(arch_key(c, "attention.key_length")) ? positive_int(f, arch_key(c, "attention.key_length"))
                                                           : c.n_embd / c.n_head;
  if (f.has(arch_key(c, "attention.value_length")) &&
      positive_int(f, arch_key(c, "attention.value_length")) != c.head_dim)
    fail("{}: key_length and value_length differ, which this engine does not support", f.name());
  c.n_ctx_train = f.has(arch_key(c, "context_length")) ? positive_int(f, arch_key(c, "context_length")) : 2048;
  c.eps = static_cast<float>(f.get_float(arch_key(c, "attention.layer_norm_rms_epsilon")));
  c.rope_base = static_cast<float>(f.get_float_opt(arch_key(c, "rope.freq_base")).value_or(10000.0));
  c.rope_dim = f.has(arch_key(c, "rope.dimension_count")) ? positive_int(f, arch_key(c, "rope.dimension_count"))
                                                           : c.head_dim;
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0)
    fail("{}: rope.dimension_count {} must be even and at most the head size {}", f.name(), c.rope_dim,
         c.head_dim);
  c.attn_scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  c.layer_swa.assign(static_cast<size_t>(c.n_layer), false);

  switch (c.arch) {
    case DenseArch::Llama:
      // llama GGUF files store q/k rows permuted for adjacent-pair rotation.
      c.rope_neox = false;
      break;
    case DenseArch::Qwen3:
      c.rope_neox = true;
      c.qk_norm = true;
      break;
    case DenseArch::Gemma3:
      c.rope_neox = true;
      c.qk_norm = true;
      c.sandwich_norm = true;
      c.gelu = true;
      c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
      // Gemma 3 uses a sliding window on five of every six layers; the sixth
      // is global. Local layers use a fixed RoPE base of 10000.
      c.sliding_window = positive_int(f, arch_key(c, "attention.sliding_window"));
      c.rope_base_local = 10000.f;
      for (int l = 0; l < c.n_layer; ++l) c.layer_swa[static_cast<size_t>(l)] = (l + 1) % 6 != 0;
      if (auto s = f.get_float_opt(arch_key(c, "attention.query_pre_attn_scalar")))
        c.attn_scale = static_cast<float>(1.0 / std::sqrt(*s));
      break;
  }

  // Bounds that keep every index computation of forward() (at most
  // kMaxChunk positions at a time) inside int.
  constexpr int64_t kMaxWidth = int64_t{1} << 22;
  const int64_t qdim64 = int64_t{c.n_head} * c.head_dim;
  if (c.n_embd > kMaxWidth || c.n_ff > kMaxWidth || qdim64 > kMaxWidth)
    fail("{}: model widths (embedding {}, feed-forward {}, heads x head size {}) exceed the supported {}", f.name(),
         c.n_embd, c.n_ff, qdim64, kMaxWidth);
  const int qdim = static_cast<int>(qdim64), kvdim = c.n_head_kv * c.head_dim;
  if (f.tensor("token_embd.weight").shape.size() != 2 || f.tensor("token_embd.weight").shape.back() > kMaxWidth)
    fail("{}: token_embd.weight must be 2-D with at most {} rows", f.name(), kMaxWidth);
  m->tok_embd_ = mat(f, "token_embd.weight", c.n_embd, f.tensor("token_embd.weight").shape.back());
  c.n_vocab = static_cast<int>(m->tok_embd_.rows);
  m->output_ = f.find_tensor("output.weight") ? mat(f, "output.weight", c.n_embd, c.n_vocab) : m->tok_embd_;
  m->output_norm_ = vec(f, "output_norm.weight", c.n_embd);
  m->layers_.resize(static_cast<size_t>(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    DenseLayer& L = m->layers_[static_cast<size_t>(l)];
    const std::string p = fmt::format("blk.{}.", l);
    L.attn_norm = vec(f, p + "attn_norm.weight", c.n_embd);
    L.ffn_norm = vec(f, p + "ffn_norm.weight", c.n_embd);
    L.wq = mat(f, p + "attn_q.weight", c.n_embd, qdim);
    L.wk = mat(f, p + "attn_k.weight", c.n_embd, kvdim);
    L.wv = mat(f, p + "attn_v.weight", c.n_embd, kvdim);
    L.wo = mat(f, p + "attn_output.weight", qdim, c.n_embd);
    L.w_gate = mat(f, p + "ffn_gate.weight", c.n_embd, c.n_ff);
    L.w_up = mat(f, p + "ffn_up.weight", c.n_embd, c.n_ff);
    L.w_down = mat(f, p + "ffn_down.weight", c.n_ff, c.n_embd);
    if (c.qk_norm) {
      L.q_norm = vec(f, p + "attn_q_norm.weight", c.head_dim);
      L.k_norm = vec(f, p + "attn_k_norm.weight", c.head_dim);
    }
    if (c.sandwich_norm) {
      L.post_attn_norm = vec(f, p + "post_attention_norm.weight", c.n_embd);
      L.post_ffn_norm = vec(f, p + "post_ffw_norm.weight", c.n_embd);
    }
  }
  if (weights) m->dequantize_all_to_f32();
  return m;
}

void DenseModel::dequantize_all_to_f32() {
  // A tied output matrix is the embedding: it is converted once and both
  // views keep pointing at the same storage.
  const bool tied = output_.data == tok_embd_.data;
  auto convert = [this](MatView& m) {
    if (m.type == DType::F32) return;
    std::vector<float> out(static_cast<size_t>(m.rows) * static_cast<size_t>(m.cols));
    for (int64_t j = 0; j < m.rows; ++j) dequantize_row(m, j, out.data() + static_cast<size_t>(j) * m.cols);
    m.type = DType::F32;
    m.row_bytes = row_bytes(DType::F32, m.cols);
    m.data = reinterpret_cast<const uint8_t*>(out.data());
    owned_.push_back(std::move(out));  // moving a vector keeps its buffer where it is
  };
  convert(tok_embd_);
  if (tied)
    output_ = tok_embd_;
  else
    convert(output_);
  for (DenseLayer& L : layers_)
    for (MatView* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) convert(*m);
}

size_t DenseModel::weight_bytes() const {
  auto b = [](const MatView& m) { return m.row_bytes * static_cast<size_t>(m.rows); };
  size_t total = b(output_);
  for (const auto& L : layers_)
    total += b(L.wq) + b(L.wk) + b(L.wv) + b(L.wo) + b(L.w_gate) + b(L.w_up) + b(L.w_down);
  return total;
}

void DenseModel::forward(ThreadPool& pool, KVCache& cache, const int32_t* tokens, int n, int pos0, int n_out,
                         float* logits, Numerics numerics) const {
  const DenseConfig& c = cfg_;
  if (n <= 0) fail("forward needs at least one token");
  if (n_out < 0 || n_out > n) fail("forward: n_out {} must be in [0, {}]", n_out, n);
  if (cache.n_layer != c.n_layer || cache.kv_dim != c.n_head_kv * c.head_dim ||
      cache.k.size() < static_cast<size_t>(c.n_layer) * cache.n_ctx * cache.kv_dim ||
      cache.v.size() != cache.k.size())
    fail("forward: the KV cache was not made for this model");
  // Long prompts run in chunks: per-position results do not depend on the
  // chunking (each position's products and attention are computed alone),
  // and scratch memory stays bounded.
  if (n > kMaxChunk) {
    const int first_out = n - n_out;
    for (int c0 = 0; c0 < n; c0 += kMaxChunk) {
      const int cn = std::min(kMaxChunk, n - c0);
      const int out_begin = std::max(c0, first_out);
      const int cn_out = std::max(0, c0 + cn - out_begin);
      forward(pool, cache, tokens + c0, cn, pos0 + c0, cn_out,
              logits + static_cast<size_t>(out_begin - first_out) * static_cast<size_t>(c.n_vocab), numerics);
    }
    return;
  }
  if (pos0 < 0 || pos0 + n > cache.n_ctx)
    fail("context full: positions {}..{} do not fit in a context of {} tokens", pos0, pos0 + n - 1, cache.n_ctx);
  for (int t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= c.n_vocab)
      fail("token id {} is outside the vocabulary of {} tokens", tokens[t], c.n_vocab);

  const int D = c.n_embd, hd = c.head_dim, H = c.n_head, Hkv = c.n_head_kv;
  const int qdim = H * hd, kvdim = Hkv * hd;
  const size_t N = static_cast<size_t>(n);
  std::vector<float> x(N * D);            // [n][D] residual stream
  std::vector<float> xn(N * D);           // [n][D] normed input of a sublayer
  std::vector<float> q(N * qdim);         // [n][H*hd]
  std::vector<float> k(N * kvdim);        // [n][Hkv*hd]
  std::vector<float> v(N * kvdim);        // [n][Hkv*hd]
  std::vector<float> att(N * qdim);       // [n][H*hd] attention output
  std::vector<float> proj(N * D);         // [n][D] sublayer output
  std::vector<float> gate(N * c.n_ff);    // [n][n_ff]
  std::vector<float> up(N * c.n_ff);      // [n][n_ff]

  for (int t = 0; t < n; ++t) {
    dequantize_row(tok_embd_, tokens[t], &x[t * D]);
    if (c.embd_scale != 1.f)
      for (int i = 0; i < D; ++i) x[t * D + i] *= c.embd_scale;
  }

  const int group = H / Hkv;
  for (int l = 0; l < c.n_layer; ++l) {
    const DenseLayer& L = layers_[static_cast<size_t>(l)];
    const bool swa = c.layer_swa[static_cast<size_t>(l)];
    const float base = swa ? c.rope_base_local : c.rope_base;

    for (int t = 0; t < n; ++t) rmsnorm(&x[t * D], L.attn_norm.data(), D, c.eps, &xn[t * D]);
    matmul(pool, L.wq, xn.data(), n, q.data(), numerics);
    matmul(pool, L.wk, xn.data(), n, k.data(), numerics);
    matmul(pool, L.wv, xn.data(), n, v.data(), numerics);
    for (int t = 0; t < n; ++t) {
      const int pos = pos0 + t;
      thread_local RopeAngles angles;
      angles.compute(c.rope_dim, pos, base);
      for (int h = 0; h < H; ++h) {
        float* qh = &q[t * qdim + h * hd];
        if (c.qk_norm) rmsnorm(qh, L.q_norm.data(), hd, c.eps, qh);
        rope_apply(qh, c.rope_dim, angles, c.rope_neox);
      }
      for (int h = 0; h < Hkv; ++h) {
        float* kh = &k[t * kvdim + h * hd];
        if (c.qk_norm) rmsnorm(kh, L.k_norm.data(), hd, c.eps, kh);
        rope_apply(kh, c.rope_dim, angles, c.rope_neox);
      }
      std::memcpy(cache.k_at(l, pos), &k[t * kvdim], sizeof(float) * kvdim);
      std::memcpy(cache.v_at(l, pos), &v[t * kvdim], sizeof(float) * kvdim);
    }

    // Causal attention: row t sees positions [start, pos0 + t]; a windowed
    // layer only the last sliding_window of them.
    pool.parallel_for(static_cast<int64_t>(n) * H, 1, [&](int64_t b, int64_t e) {
      std::vector<float> scores;
      for (int64_t idx = b; idx < e; ++idx) {
        const int t = static_cast<int>(idx / H), h = static_cast<int>(idx % H);
        const int pos = pos0 + t;
        const int start = (swa && c.sliding_window > 0) ? std::max(0, pos - c.sliding_window + 1) : 0;
        const int kvh = h / group;
        const float* qh = &q[t * qdim + h * hd];
        scores.resize(static_cast<size_t>(pos - start + 1));
        // Positions are stored back to back (kv_dim apart): the many-row
        // kernels, with the bits of one dot / axpy per position.
        const int np = pos - start + 1;
        dot_f32_rows(qh, cache.k_at(l, start) + kvh * hd, cache.kv_dim, np, hd, scores.data());
        for (int p = 0; p < np; ++p) scores[static_cast<size_t>(p)] *= c.attn_scale;
        softmax_inplace(scores.data(), static_cast<int64_t>(scores.size()));
        float* out = &att[t * qdim + h * hd];
        std::fill(out, out + hd, 0.f);
        axpy_f32_rows(scores.data(), cache.v_at(l, start) + kvh * hd, cache.kv_dim, np, out, hd);
      }
    });

    matmul(pool, L.wo, att.data(), n, proj.data(), numerics);
    for (int t = 0; t < n; ++t) {
      if (c.sandwich_norm) rmsnorm(&proj[t * D], L.post_attn_norm.data(), D, c.eps, &proj[t * D]);
      for (int i = 0; i < D; ++i) x[t * D + i] += proj[t * D + i];
      rmsnorm(&x[t * D], L.ffn_norm.data(), D, c.eps, &xn[t * D]);
    }

    matmul(pool, L.w_gate, xn.data(), n, gate.data(), numerics);
    matmul(pool, L.w_up, xn.data(), n, up.data(), numerics);
    glu_act(c.gelu ? GluKind::GeluTanh : GluKind::SiLU, gate.data(), up.data(), 1.f, 1.f, gate.data(),
            static_cast<int64_t>(gate.size()));
    matmul(pool, L.w_down, gate.data(), n, proj.data(), numerics);
    for (int t = 0; t < n; ++t) {
      if (c.sandwich_norm) rmsnorm(&proj[t * D], L.post_ffn_norm.data(), D, c.eps, &proj[t * D]);
      for (int i = 0; i < D; ++i) x[t * D + i] += proj[t * D + i];
    }
  }

  if (n_out == 0) return;
  const int first = n - n_out;
  for (int t = first; t < n; ++t) rmsnorm(&x[t * D], output_norm_.data(), D, c.eps, &xn[t * D]);
  matmul(pool, output_, &xn[static_cast<size_t>(first) * D], n_out, logits, numerics);
}

}  // namespace megakern
