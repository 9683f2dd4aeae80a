#include "model/gguf_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "core/error.h"
#include "io/config_value.h"
#include "io/gguf.h"

namespace megakern {

int gguf_int_in(const GGUFFile& f, const std::string& key, int64_t lo, int64_t hi) {
  return static_cast<int>(config_int_in(f.name(), key, f.get_int(key), lo, hi < 0 ? kMaxConfigDim : hi));
}

float gguf_float_in(const GGUFFile& f, const std::string& key, double lo, double hi, std::optional<double> fallback) {
  const std::optional<double> v = fallback ? f.get_float_opt(key) : std::optional<double>(f.get_float(key));
  if (!v) return static_cast<float>(*fallback);
  return static_cast<float>(config_float_in(f.name(), key, *v, lo, hi));
}

MatView gguf_mat(const GGUFFile& f, const std::string& name, int64_t cols, int64_t rows) {
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

int gguf_vocab_rows(const GGUFFile& f, const std::string& name, int64_t n_embd) {
  const GGUFTensorInfo& e = f.tensor(name);
  if (e.shape.size() != 2 || e.shape[0] != n_embd)
    fail("{}: tensor '{}' has shape [{}], expected [{}, n_vocab]", f.name(), name, fmt::join(e.shape, ", "), n_embd);
  return static_cast<int>(config_int_in(f.name(), name + " rows", e.shape[1], 1, kMaxConfigDim));
}

MatView gguf_row_mat(const GGUFFile& f, const std::string& name, int64_t cols) {
  const GGUFTensorInfo& t = f.tensor(name);
  if (t.shape.size() == 1 && t.shape[0] == cols) {
    MatView m;
    m.type = t.type;
    m.cols = cols;
    m.rows = 1;
    m.data = t.data;
    m.row_bytes = row_bytes(t.type, cols);
    return m;
  }
  if (t.shape.size() != 2 || t.shape[0] != cols || t.shape[1] != 1)
    fail("{}: tensor '{}' has shape [{}], expected [{}] or [{}, 1]", f.name(), name, fmt::join(t.shape, ", "), cols,
         cols);
  return gguf_mat(f, name, cols, 1);
}

std::vector<MatView> gguf_expert_slabs(const GGUFFile& f, const std::string& name, int64_t cols, int64_t rows,
                                       int64_t n_expert) {
  const GGUFTensorInfo& t = f.tensor(name);
  if (t.shape.size() != 3 || t.shape[0] != cols || t.shape[1] != rows || t.shape[2] != n_expert)
    fail("{}: tensor '{}' has shape [{}], expected [{}, {}, {}]", f.name(), name, fmt::join(t.shape, ", "), cols, rows,
         n_expert);
  std::vector<MatView> out;
  for (int64_t e = 0; e < n_expert; ++e) {
    MatView m;
    m.type = t.type;
    m.cols = cols;
    m.rows = rows;
    m.row_bytes = row_bytes(t.type, cols);
    m.data = t.data + static_cast<size_t>(e) * static_cast<size_t>(rows) * m.row_bytes;
    out.push_back(m);
  }
  return out;
}

std::vector<float> gguf_mla_k_b(const GGUFFile& f, const std::string& name, int64_t n_head, int64_t nope,
                                int64_t kv_lora_rank) {
  const GGUFTensorInfo& t = f.tensor(name);
  const int64_t kvl = kv_lora_rank;
  if (t.shape.size() != 3 || t.shape[0] != nope || t.shape[1] != kvl || t.shape[2] != n_head)
    fail("{}: tensor '{}' has shape [{}], expected [{}, {}, {}]", f.name(), name, fmt::join(t.shape, ", "), nope, kvl,
         n_head);
  std::vector<float> src(static_cast<size_t>(n_head * kvl * nope)), k(src.size());
  dtype_traits(t.type).dequantize(t.data, src.data(), static_cast<int64_t>(src.size()));
  for (int64_t h = 0; h < n_head; ++h)  // src[h][j][i] (j < kvl, i < nope) -> k[h * nope + i][j]
    for (int64_t j = 0; j < kvl; ++j)
      for (int64_t i = 0; i < nope; ++i)
        k[static_cast<size_t>((h * nope + i) * kvl + j)] = src[static_cast<size_t>((h * kvl + j) * nope + i)];
  return k;
}

MatView row_range(const MatView& m, int64_t b, int64_t n) {
  MatView v = m;
  v.rows = n;
  v.data = m.data + static_cast<size_t>(b) * m.row_bytes;
  return v;
}

std::vector<float> gguf_values(const GGUFFile& f, const std::string& name, const std::vector<int64_t>& shape) {
  const GGUFTensorInfo& t = f.tensor(name);
  if (t.shape != shape)
    fail("{}: tensor '{}' has shape [{}], expected [{}]", f.name(), name, fmt::join(t.shape, ", "),
         fmt::join(shape, ", "));
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> out(static_cast<size_t>(n));
  dtype_traits(t.type).dequantize(t.data, out.data(), n);
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(out[static_cast<size_t>(i)]))
      fail("{}: tensor '{}' holds a non-finite value at index {}", f.name(), name, i);
  return out;
}

}  // namespace megakern
