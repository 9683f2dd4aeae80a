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
// Formats of our own (not in GGML) take ids from 64 up, clear of GGML's.
//
// GGML's K-quants and 4-bit non-linear formats beyond Q4_K / Q6_K (layouts in
// dtype.cpp): Q3_K (3-bit, 256-element super-blocks, signed 6-bit scales per
// 16), Q5_K (Q4_K plus a fifth bit per element), IQ4_NL (32 elements, f16
// scale, 4-bit indices into a fixed 16-entry non-linear table) and IQ4_XS
// (IQ4_NL's table in 256-element super-blocks with 6-bit scales per 32).
// Their quantisers are ours (documented in dtype.cpp), not GGML's
// importance-weighted ones; the decoders are bit-exact with GGML's.
//
// Formats beyond GGML's classic set (layouts in dtype.cpp):
//   MXFP4     GGML id 39, GGML's block_mxfp4: 32 e2m1 values per block, one
//             E8M0 power-of-two scale byte then 16 bytes of nibbles.
//   FP8_E4M3  ours: 32 OCP e4m3 "fn" bytes per block after one E8M0 scale byte.
//   NVFP4     ours: 64 e2m1 values in four 16-value sub-blocks, each with an
//             e4m3 scale: 4 scale bytes then 32 bytes of nibbles. The
//             per-tensor f32 global scale of NVIDIA's format is NOT stored:
//             the caller folds it (multiplies the matmul output by it, or
//             into the next op); our quantiser assumes a global scale of 1.
//   INT4_G128 ours: groups of 128 with an f16 scale absmax/7 and values
//             round-half-even clipped to -8..7, packed as nibbles.
//   INT8_COL  ours: int8 with one f32 scale per output row (= absmax/127 of
//             the row), stored in every 128-element block of that row so a
//             row stays self-contained (4 bytes per 128 values, 3 %). The
//             quantiser must be given one row at a time to get per-row
//             scales (given a longer span it uses one scale for the span).
enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q8_0 = 8,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ4_NL = 20,
  IQ4_XS = 23,
  BF16 = 30,
  MXFP4 = 39,
  FP8_E4M3 = 64,
  NVFP4 = 65,
  INT4_G128 = 66,
  INT8_COL = 67,
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
// The supported type with this GGML id, or nullopt. Our own ids (>= 64) are
// accepted too, so a GGUF file written here with them reads back.
std::optional<DType> dtype_from_ggml(uint32_t id);
// Name of any GGML type id, including ones we cannot compute with ("q2_k").
std::string_view ggml_type_name(uint32_t id);
// Every supported type, in table order.
const DType* all_dtypes(size_t* count);
// Parses "q4_0", "F16", "mxfp4", "fp8_e4m3", "nvfp4", "int4_g128", "int8_col",
// ... (case-insensitive); nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view name);

// OCP FP8 e4m3 "fn" <-> f32 (round to nearest even, saturating at +-448;
// 0x7f / 0xff are NaN).
float fp8_e4m3_to_f32(uint8_t b);
uint8_t f32_to_fp8_e4m3(float v);

// e2m1, the 4-bit element of MXFP4 / NVFP4: the value of a code (8..15 are
// the negatives of 0..7, 8 being -0), and the code of an exactly
// representable value (0, +-0.5 .. +-6; -0 gives 0), or -1.
float e2m1_value(int code);
int e2m1_code(float v);
// An MXFP4 block (GGML layout: element j < 16 in the low nibble of byte 1 + j,
// j + 16 in its high nibble), or its lossless FP8 e4m3 re-blocking (same E8M0
// scale byte, each e2m1 value as an e4m3 byte), as its scale byte and 32 e2m1
// codes, and back. t is MXFP4 or FP8_E4M3; an FP8 block holding a value that
// is not e2m1 throws megakern::Error.
void mx_block_codes(DType t, const uint8_t* block, uint8_t& scale, uint8_t* codes);
void mx_codes_block(DType t, uint8_t scale, const uint8_t* codes, uint8_t* block);

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12
// packed scale bytes s of a super-block (GGML's layout).
void k_scale_min(const uint8_t* s, int j, int& sc, int& m);

// Bytes needed by a row of n elements; throws if n is not a multiple of the block size.
size_t row_bytes(DType t, int64_t n);

}  // namespace megakern
