// Reading a model's weights and hyperparameters from a GGUF file, with the
// checks every GGUF loader makes: a tensor's shape (GGUF order, innermost
// first), a hyperparameter's range, finite small weights. Each throws
// megakern::Error naming the file and the tensor or key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace megakern {

class GGUFFile;

// An integer hyperparameter in [lo, hi] (io/config_value.h); by default a
// size or count.
int gguf_int_in(const GGUFFile& f, const std::string& key, int64_t lo = 1, int64_t hi = -1);

// A float hyperparameter that must be finite and in (lo, hi]; `fallback`
// when the key is absent (required when there is none).
float gguf_float_in(const GGUFFile& f, const std::string& key, double lo, double hi,
                    std::optional<double> fallback = std::nullopt);

// A 2-D weight of GGUF shape {cols, rows}, zero-copy; checks both extents.
MatView gguf_mat(const GGUFFile& f, const std::string& name, int64_t cols, int64_t rows);

// The vocabulary size: the rows of the embedding `name`, GGUF shape
// {n_embd, n_vocab}.
int gguf_vocab_rows(const GGUFFile& f, const std::string& name, int64_t n_embd);

// A one-row weight [1][cols]: GGUF shape {cols} or {cols, 1} (llama.cpp's
// converter keeps a [1][cols] checkpoint tensor 2-D).
MatView gguf_row_mat(const GGUFFile& f, const std::string& name, int64_t cols);

// The experts of one 3-D tensor of GGUF shape {cols, rows, n_expert}:
// expert e's matrix is the e-th slab of rows, zero-copy.
std::vector<MatView> gguf_expert_slabs(const GGUFFile& f, const std::string& name, int64_t cols, int64_t rows,
                                       int64_t n_expert);

// Rows [b, b + n) of a matrix (a fused projection's part), zero-copy: rows
// are contiguous in every format.
MatView row_range(const MatView& m, int64_t b, int64_t n);

// MLA's key expansion stored as attn_k_b, GGUF shape {nope, kv_lora_rank,
// n_head} (each head's block transposed, as llama.cpp's converter writes it),
// transposed back to rows [n_head * nope][kv_lora_rank] in f32.
std::vector<float> gguf_mla_k_b(const GGUFFile& f, const std::string& name, int64_t n_head, int64_t nope,
                                int64_t kv_lora_rank);

// A small weight of GGUF shape `shape` (innermost first), dequantised to
// f32 in its element order; every value must be finite.
std::vector<float> gguf_values(const GGUFFile& f, const std::string& name, const std::vector<int64_t>& shape);

// A 1-D weight, dequantised to f32.
inline std::vector<float> gguf_vec(const GGUFFile& f, const std::string& name, int64_t n) {
  return gguf_values(f, name, {n});
}

}  // namespace megakern
