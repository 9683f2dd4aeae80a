#include "model/dense.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/gguf.h"
#include "exec/executor.h"
#include "model/dense_program.h"

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
  if (pos0 < 0 || static_cast<int64_t>(pos0) + n > cache.n_ctx)
    fail("context full: positions {}..{} do not fit in a context of {} tokens", pos0, static_cast<int64_t>(pos0) + n - 1,
         cache.n_ctx);
  for (int t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= c.n_vocab)
      fail("token id {} is outside the vocabulary of {} tokens", tokens[t], c.n_vocab);
  // The model's decode program on the megakernel executor, in steps of up to
  // kMaxChunk positions of this sequence. Positions whose logits are not
  // wanted go through the program without its output head. Every position's
  // result has the bits of that position computed alone (rows do not depend
  // on the step they are in).
  const int rows = std::min(n, kMaxChunk), first_out = n - n_out;
  DecodeProgram full = build_dense_program(*this, rows);
  full.numerics = numerics;
  DecodeProgram headless = without_head(full);
  std::unique_ptr<Executor> ex_full, ex_headless;
  std::vector<RowInput> in;
  auto run = [&](int b, int e, bool head) {
    if (b >= e) return;
    in.clear();
    for (int t = b; t < e; ++t) in.push_back({tokens[t], pos0 + t, &cache});
    std::unique_ptr<Executor>& ex = head ? ex_full : ex_headless;
    if (!ex) ex = make_executor("mega", head ? full : headless, pool);
    ex->step(in, head ? logits + static_cast<size_t>(b - first_out) * static_cast<size_t>(c.n_vocab) : nullptr);
  };
  for (int c0 = 0; c0 < n; c0 += rows) {
    const int c1 = std::min(n, c0 + rows), split = std::clamp(first_out, c0, c1);
    run(c0, split, false);
    run(split, c1, true);
  }
}

}  // namespace megakern
