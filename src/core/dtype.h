// The table of tensor element formats: plain floats and the block-quantised
// formats of GGUF. Every format is described once here (block size, bytes per
// block, scalar dequantise/quantise/dot); optimised kernels live elsewhere and
// are tested against these scalar versions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace megakern {

// Values are the GGML type ids, so a GGUF tensor's type field maps directly.
enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q8_0 = 8,
  Q4_K = 12,
  Q6_K = 14,
  BF16 = 30,
};

struct DTypeTraits {
  DType type;
  const char* name;     // "q4_0", "bf16", ...
  int64_t block_size;   // elements per block (1 for plain floats)
  size_t block_bytes;   // bytes per block
  // Scalar reference kernels. n must be a multiple of block_size.
  // dequantize: src holds n/block_size blocks; dst receives n floats.
  void (*dequantize)(const void* src, float* dst, int64_t n);
  // quantize: the reference quantiser (used by the writer and tests).
  void (*quantize)(const float* src, void* dst, int64_t n);
  // dot: sum_i w[i] * x[i] with w in this format and x in f32, accumulated in
  // a fixed order (block by block, in f32) so it is deterministic.
  float (*dot)(const void* w, const float* x, int64_t n);
};

// Traits of a supported type; throws megakern::Error for an unsupported one.
const DTypeTraits& dtype_traits(DType t);
// The supported type with this GGML id, or nullopt.
std::optional<DType> dtype_from_ggml(uint32_t id);
// Name of any GGML type id, including ones we cannot compute with ("q2_k").
std::string_view ggml_type_name(uint32_t id);
// Parses "q4_0", "F16", ... (case-insensitive); nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view name);

// Bytes needed by a row of n elements; throws if n is not a multiple of the block size.
size_t row_bytes(DType t, int64_t n);

}  // namespace megakern
