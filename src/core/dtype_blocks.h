// The block layouts shared by the decoders (core/dtype.cpp) and the
// reference quantisers (core/quantize.cpp) of core/dtype.h's formats:
// elements and bytes per block, field offsets, little-endian field access.
// The layouts themselves are described with each format's decoder.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/half.h"

namespace megakern::dtype_detail {
// Elements per block of the "legacy" formats and per super-block of the K-quants.
constexpr int64_t kQK = 32;
constexpr int64_t kQKK = 256;

// Bytes per block, following GGML's block structs field by field.
constexpr size_t kQ4_0Bytes = 2 + kQK / 2;                  // d, qs
constexpr size_t kQ4_1Bytes = 2 + 2 + kQK / 2;              // d, m, qs
constexpr size_t kQ5_0Bytes = 2 + 4 + kQK / 2;              // d, qh, qs
constexpr size_t kQ8_0Bytes = 2 + kQK;                      // d, qs
constexpr size_t kQ4_KBytes = 2 + 2 + 12 + kQKK / 2;        // d, dmin, scales, qs
constexpr size_t kQ6_KBytes = kQKK / 2 + kQKK / 4 + kQKK / 16 + 2;  // ql, qh, scales, d
static_assert(kQ4_0Bytes == 18 && kQ4_1Bytes == 20 && kQ5_0Bytes == 22 && kQ8_0Bytes == 34);
static_assert(kQ4_KBytes == 144 && kQ6_KBytes == 210);

// Q6_K field offsets inside a block.
constexpr size_t kQ6_KQh = kQKK / 2;
constexpr size_t kQ6_KScales = kQ6_KQh + kQKK / 4;
constexpr size_t kQ6_KD = kQ6_KScales + kQKK / 16;
inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float load_f16(const uint8_t* p) { return f16_to_f32(load_u16(p)); }
inline void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
inline void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// f32 -> f16 for a block scale. A finite scale too large for f16 saturates to
// the largest finite half instead of becoming inf, so an extreme block decodes
// to clipped values rather than to inf/NaN everywhere. For every input ggml
// itself can represent this equals plain round-to-nearest-even.
inline uint16_t scale_to_f16(float v) {
  const uint16_t h = f32_to_f16(v);
  if ((h & 0x7fffu) == 0x7c00u && std::isfinite(v)) return (uint16_t)((h & 0x8000u) | 0x7bffu);
  return h;
}
constexpr size_t kQ5_KBytes = 2 + 2 + 12 + kQKK / 8 + kQKK / 2;  // d, dmin, scales, qh, qs
constexpr size_t kQ5_KQh = 16, kQ5_KQs = kQ5_KQh + kQKK / 8;
static_assert(kQ5_KBytes == 176);
constexpr size_t kQ3_KBytes = kQKK / 8 + kQKK / 4 + 12 + 2;  // hmask, qs, scales, d
constexpr size_t kQ3_KQs = kQKK / 8, kQ3_KScales = kQ3_KQs + kQKK / 4, kQ3_KD = kQ3_KScales + 12;
static_assert(kQ3_KBytes == 110);

// GGML's kvalues_iq4nl: the non-linear 4-bit grid, ascending.
constexpr int8_t kIQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
constexpr size_t kIQ4_NLBytes = 2 + kQK / 2;
constexpr size_t kIQ4_XSBytes = 2 + 2 + kQKK / 64 + kQKK / 2;
static_assert(kIQ4_NLBytes == 18 && kIQ4_XSBytes == 136);

// e2m1 (1 sign, 2 exponent, 1 mantissa bit) values doubled, indexed by the
// 4-bit code, exactly as GGML's kvalues_mxfp4: {0, .5, 1, 1.5, 2, 3, 4, 6}
// times two, codes 8..15 negative. The scales below are halved to match, so
// every decoded value is (integer in -12..12) * (power of two or e4m3 / 2).
constexpr int8_t kE2M1x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
constexpr size_t kMXFP4Bytes = 1 + kQK / 2;
constexpr size_t kFP8Bytes = 1 + kQK;
constexpr int64_t kNVFP4Block = 64;
constexpr size_t kNVFP4Bytes = 4 + kNVFP4Block / 2;
constexpr int64_t kG128 = 128;
constexpr size_t kInt4G128Bytes = 2 + kG128 / 2;
constexpr size_t kInt8ColBytes = 4 + kG128;

// E8M0 scale byte e -> 2^(e-127) / 2 = 2^(e-128), GGML's
// GGML_E8M0_TO_FP32_HALF (e = 0 and 1 give the f32 subnormals 2^-128, 2^-127;
// e = 255, NaN in OCP, is not special-cased, as in GGML).
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
  return bits_to_f32(bits);
}
// E8M0 -> 2^(e-127) (e = 0 gives 2^-127, a subnormal).
inline float e8m0(uint8_t e) { return e == 0 ? bits_to_f32(0x00400000u) : bits_to_f32((uint32_t)e << 23); }

// The reference quantiser of each format, one block at a time (core/quantize.cpp).
void quant_f32(const float* x, uint8_t* b);
void quant_f16(const float* x, uint8_t* b);
void quant_bf16(const float* x, uint8_t* b);
void quant_q4_0(const float* x, uint8_t* b);
void quant_q4_1(const float* x, uint8_t* b);
void quant_q5_0(const float* x, uint8_t* b);
void quant_q8_0(const float* x, uint8_t* b);
void quant_q4_k(const float* x, uint8_t* b);
void quant_q6_k(const float* x, uint8_t* b);
void quant_q5_k(const float* x, uint8_t* b);
void quant_q3_k(const float* x, uint8_t* b);
void quant_iq4_nl(const float* x, uint8_t* b);
void quant_iq4_xs(const float* x, uint8_t* b);
void quant_mxfp4(const float* x, uint8_t* b);
void quant_fp8(const float* x, uint8_t* b);
void quant_nvfp4(const float* x, uint8_t* b);
void quant_int4_g128(const float* x, uint8_t* b);
void quant_int8_col(const float* x, uint8_t* b);
void quantize_row_int8_col(const float* src, void* dst, int64_t n);

}  // namespace megakern::dtype_detail
