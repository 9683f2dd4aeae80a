// Scalar reference decoders and dot products of every tensor element format,
// and the table of formats (the reference quantisers: core/quantize.cpp).
//
// The block layouts are GGML's (as stored in GGUF files), so these functions
// must stay bit-compatible with ggml's dequantisers: a model file written by
// llama.cpp tools has to decode here to exactly the values ggml would produce.
// All multi-byte fields are little-endian, as GGUF is; we read them with
// memcpy because blocks are packed (an 18-byte Q4_0 block leaves its
// successors unaligned).
//
// Bit-exactness of dequantisation does not hinge on evaluation order: a
// stored scale is an f16 (11 significant bits) and quants and sub-block scales
// are small integers, so every product below (f16 * int6 * int8 at most, fewer
// than 24 bits) is exact in f32. Each element therefore sees at most one
// rounding, in the final addition of Q4_1's m or subtraction of Q4_K's
// min, and any order or FMA contraction gives the same bits as ggml. The dot
// products, whose rounding does depend on contraction, are compiled without
// it: ISO-mode GCC does not contract and clang is told so below, so results
// agree between compilers.
#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype_blocks.h"
#include "core/error.h"
#include "core/half.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace megakern {

using namespace dtype_detail;

static_assert(std::endian::native == std::endian::little,
              "GGUF blocks are little-endian and are read here with memcpy");

namespace {

// ---------------------------------------------------------------------------
// Plain floats. Their "block" is one element.

void deq_f32(const uint8_t* b, float* y) { std::memcpy(y, b, 4); }
void deq_f16(const uint8_t* b, float* y) { *y = f16_to_f32(load_u16(b)); }
void deq_bf16(const uint8_t* b, float* y) { *y = bf16_to_f32(load_u16(b)); }

// ---------------------------------------------------------------------------
// Q4_0: f16 d, then 16 bytes whose low nibbles are elements 0..15 and high
// nibbles elements 16..31; value = (q - 8) * d.

void deq_q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = (float)((int)(qs[j] & 0x0f) - 8) * d;
    y[j + kQK / 2] = (float)((int)(qs[j] >> 4) - 8) * d;
  }
}

// ---------------------------------------------------------------------------
// Q4_1: f16 d, f16 m, 16 nibble bytes as in Q4_0; value = q * d + m.

void deq_q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = (float)(qs[j] & 0x0f) * d + m;
    y[j + kQK / 2] = (float)(qs[j] >> 4) * d + m;
  }
}

// ---------------------------------------------------------------------------
// Q5_0: f16 d, u32 qh, 16 nibble bytes. Element j (< 16) takes its low four
// bits from the low nibble of qs[j] and its fifth bit from qh bit j; element
// j + 16 takes the high nibble of qs[j] and qh bit j + 16. value = (q - 16) * d.

void deq_q5_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint32_t qh = load_u32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < kQK / 2; ++j) {
    const int q0 = (int)((qs[j] & 0x0fu) | (((qh >> j) & 1u) << 4));
    const int q1 = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
    y[j] = (float)(q0 - 16) * d;
    y[j + kQK / 2] = (float)(q1 - 16) * d;
  }
}

// ---------------------------------------------------------------------------
// Q8_0: f16 d, 32 int8 quants; value = q * d.

void deq_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < kQK; ++j) y[j] = (float)(int8_t)b[2 + j] * d;
}

// ---------------------------------------------------------------------------
// Q4_K: f16 d, f16 dmin, 12 bytes of packed 6-bit (scale, min) pairs for the
// eight 32-element sub-blocks, 128 bytes of nibbles.
//
// Scale packing (sc[i], m[i] are 6-bit): bytes 0..3 hold sc[0..3] in their low
// six bits, bytes 4..7 hold m[0..3] likewise; sub-blocks 4..7 keep their low
// four bits in bytes 8..11 (scale in the low nibble, min in the high one) and
// their top two bits in the spare top bits of bytes 0..3 (scales) and 4..7
// (mins).
//
// Quants: each 64-element chunk c owns qs[32c .. 32c+31]; the low nibbles are
// elements 64c .. 64c+31 (sub-block 2c), the high nibbles 64c+32 .. 64c+63
// (sub-block 2c+1). value = d * sc * q - dmin * m.

void unpack_q4_k_scale_min(const uint8_t* s, int i, int& sc, int& m) { k_scale_min(s, i, sc, m); }

void deq_q4_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c) {
    int sc_lo, m_lo, sc_hi, m_hi;
    unpack_q4_k_scale_min(scales, 2 * c, sc_lo, m_lo);
    unpack_q4_k_scale_min(scales, 2 * c + 1, sc_hi, m_hi);
    // Sub-block scale and offset first, then q * scale - offset, as ggml does.
    const float d_lo = d * (float)sc_lo, off_lo = dmin * (float)m_lo;
    const float d_hi = d * (float)sc_hi, off_hi = dmin * (float)m_hi;
    const uint8_t* q = qs + 32 * c;
    float* out = y + 64 * c;
    for (int l = 0; l < 32; ++l) {
      out[l] = d_lo * (float)(q[l] & 0x0f) - off_lo;
      out[l + 32] = d_hi * (float)(q[l] >> 4) - off_hi;
    }
  }
}

// ---------------------------------------------------------------------------
// Q6_K: 128 bytes ql (low four bits), 64 bytes qh (high two bits), 16 int8
// sub-block scales (one per 16 elements), f16 d; value = d * scale * (q - 32).
//
// Interleaving: the block is two 128-element halves h, each using ql[64h ..
// 64h+63] and qh[32h .. 32h+31]. Inside a half, element 32g + l (g = 0..3,
// l = 0..31) takes its low bits from ql[64h + l + 32*(g & 1)] (low nibble for
// g < 2, high nibble for g >= 2) and its high bits from bits 2g, 2g+1 of
// qh[32h + l]. The scale of element e is scales[e / 16].

void deq_q6_k(const uint8_t* b, float* y) {
  const float d = load_f16(b + kQ6_KD);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b + 64 * h;
    const uint8_t* qh = b + kQ6_KQh + 32 * h;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + kQ6_KScales) + 8 * h;
    float* out = y + 128 * h;
    for (int l = 0; l < 32; ++l) {
      const int s = l / 16;
      const int q0 = (int)((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) - 32;
      const int q1 = (int)((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q2 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q3 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      out[l] = d * (float)sc[s] * (float)q0;
      out[l + 32] = d * (float)sc[s + 2] * (float)q1;
      out[l + 64] = d * (float)sc[s + 4] * (float)q2;
      out[l + 96] = d * (float)sc[s + 6] * (float)q3;
    }
  }
}

// ---------------------------------------------------------------------------
// Q5_K (GGML id 13, block_q5_K): f16 d, f16 dmin, the 12 scale bytes of Q4_K,
// 32 bytes qh, 128 bytes qs. The low four bits of each element sit exactly as
// in Q4_K (chunk c = sub-blocks 2c, 2c+1 share qs[32c .. 32c+31], low then high
// nibbles); element l of sub-block sb (l = 0..31) takes its fifth bit from bit
// sb of qh[l]. value = d * sc * q - dmin * m with q in 0..31.

void deq_q5_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const uint8_t* qh = b + kQ5_KQh;
  for (int sb = 0; sb < 8; ++sb) {
    int sc, m;
    unpack_q4_k_scale_min(b + 4, sb, sc, m);
    const float ds = d * (float)sc, off = dmin * (float)m;
    const uint8_t* q = b + kQ5_KQs + 32 * (sb / 2);
    for (int l = 0; l < 32; ++l) {
      const int lo = sb % 2 ? q[l] >> 4 : q[l] & 0x0f;
      const int v = lo | (((qh[l] >> sb) & 1) << 4);
      y[32 * sb + l] = ds * (float)v - off;
    }
  }
}

// ---------------------------------------------------------------------------
// Q3_K (GGML id 11, block_q3_K): 32 bytes hmask, 64 bytes qs, 12 bytes of
// sixteen 6-bit scales, f16 d; 110 bytes per 256 elements.
//
// Elements: the block is two 128-element halves h; inside a half, element
// 32j + l (j = 0..3, l = 0..31) takes its low two bits from bits 2j, 2j+1 of
// qs[32h + l] and its high bit from bit 4h + j of hmask[l]. The quant is
// low - 4 when that high bit is clear and low when it is set, so -4..3.
// Scales: element e uses scale index e / 16 (so a 32-element sub-block sb has
// two: 2sb, 2sb+1); scale i (6 bits, biased by 32) has its low nibble in
// scales[i] (i < 8) or the high nibble of scales[i - 8] (i >= 8), and its top
// two bits in bits 2(i / 4), +1 of scales[8 + i % 4].
// value = d * (scale - 32) * quant.

int q3_k_scale(const uint8_t* s, int i) {
  const int lo = i < 8 ? s[i] & 0x0f : s[i - 8] >> 4;
  const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

void deq_q3_k(const uint8_t* b, float* y) {
  const float d = load_f16(b + kQ3_KD);
  for (int sb = 0; sb < 8; ++sb) {
    const int h = sb / 4, j = sb % 4;
    const uint8_t* qs = b + kQ3_KQs + 32 * h;
    for (int half = 0; half < 2; ++half) {
      const float dl = d * (float)q3_k_scale(b + kQ3_KScales, 2 * sb + half);
      for (int l = 16 * half; l < 16 * half + 16; ++l) {
        const int low = (qs[l] >> (2 * j)) & 3;
        const int q = ((b[l] >> (4 * h + j)) & 1) ? low : low - 4;
        y[32 * sb + l] = dl * (float)q;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// IQ4_NL (GGML id 20, block_iq4_nl): f16 d, 16 bytes of 4-bit indices split as
// in Q4_0 (low nibbles elements 0..15, high nibbles 16..31); value =
// d * kIQ4NL[index]. IQ4_XS (GGML id 23, block_iq4_xs): f16 d, u16 scales_h,
// 4 bytes scales_l, 128 bytes qs; sub-block ib (32 elements) has the 6-bit
// scale ls = (nibble ib % 2 of scales_l[ib / 2]) | (bits 2ib, 2ib+1 of
// scales_h) << 4 and its 16 index bytes at qs[16 ib] split as in IQ4_NL;
// value = d * (ls - 32) * kIQ4NL[index].

void deq_iq4_nl(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * (float)kIQ4NL[b[2 + j] & 0x0f];
    y[j + kQK / 2] = d * (float)kIQ4NL[b[2 + j] >> 4];
  }
}

int iq4_xs_scale(const uint8_t* b, int ib) {
  const int lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f;
  const int hi = (load_u16(b + 2) >> (2 * ib)) & 3;
  return (lo | (hi << 4)) - 32;
}

void deq_iq4_xs(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int ib = 0; ib < 8; ++ib) {
    const float dl = d * (float)iq4_xs_scale(b, ib);
    const uint8_t* qs = b + 8 + 16 * ib;
    for (int j = 0; j < 16; ++j) {
      y[32 * ib + j] = dl * (float)kIQ4NL[qs[j] & 0x0f];
      y[32 * ib + j + 16] = dl * (float)kIQ4NL[qs[j] >> 4];
    }
  }
}

// ---------------------------------------------------------------------------
// Microscaling and other "new" formats (the e2m1 grid and E8M0 scales:
// core/dtype_blocks.h).

}  // namespace

// OCP FP8 e4m3 "fn": 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
// infinities; 0x7f / 0xff are NaN; largest finite 448.
float fp8_e4m3_to_f32(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 15 && m == 7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp((float)m, -9);
  } else {
    v = std::ldexp(1.0f + (float)m / 8.0f, e - 7);
  }
  return (b & 0x80) ? -v : v;
}

// f32 -> e4m3fn, round to nearest even, saturating to +-448 (NaN -> 0x7f).
float e2m1_value(int code) {
  const float m = static_cast<float>(kE2M1x2[code & 7]) * 0.5f;
  return code & 8 ? -m : m;
}

int e2m1_code(float v) {
  for (int c = 0; c < 8; ++c) {
    if (v == e2m1_value(c) && !std::signbit(v)) return c;
    if (v == -e2m1_value(c) && c > 0) return 8 + c;
  }
  if (v == 0.f) return 0;  // -0
  return -1;
}

void mx_block_codes(DType t, const uint8_t* b, uint8_t& scale, uint8_t* codes) {
  scale = b[0];
  if (t == DType::MXFP4) {
    for (int j = 0; j < 16; ++j) {
      codes[j] = b[1 + j] & 0x0f;
      codes[j + 16] = b[1 + j] >> 4;
    }
    return;
  }
  for (int j = 0; j < 32; ++j) {
    const int c = e2m1_code(fp8_e4m3_to_f32(b[1 + j]));
    if (c < 0) fail("expert weight block holds a value that is not e2m1; cannot write it as MXFP4");
    codes[j] = static_cast<uint8_t>(c);
  }
}

void mx_codes_block(DType t, uint8_t scale, const uint8_t* codes, uint8_t* b) {
  b[0] = scale;
  if (t == DType::MXFP4) {
    for (int j = 0; j < 16; ++j) b[1 + j] = static_cast<uint8_t>(codes[j] | (codes[j + 16] << 4));
    return;
  }
  for (int j = 0; j < 32; ++j) b[1 + j] = f32_to_fp8_e4m3(e2m1_value(codes[j]));
}

uint8_t f32_to_fp8_e4m3(float v) {
  if (std::isnan(v)) return 0x7f;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  float a = std::fabs(v);
  if (a >= 448.0f) return sign | 0x7e;
  int code;
  if (a < 0x1p-6f) {
    // Subnormal range, step 2^-9; a code of 8 is the smallest normal.
    code = (int)std::nearbyint(a * 512.0f);
  } else {
    int exp;
    (void)std::frexp(a, &exp);  // a = f * 2^exp, f in [0.5, 1)
    const int e = exp - 1;      // a in [2^e, 2^(e+1))
    const int m = (int)std::nearbyint(std::ldexp(a, 3 - e));  // 8..16
    // The encoding is monotonic: a carry from m = 16 lands on the next binade.
    code = ((e + 7) << 3) + (m - 8);
  }
  return (uint8_t)(sign | std::min(code, 0x7e));
}

namespace {

// ---------------------------------------------------------------------------
// MXFP4 (GGML id 39, block_mxfp4): u8 e, 16 bytes qs; element j < 16 is the
// low nibble of qs[j], element j + 16 its high nibble (the Q4_0 split);
// value = kE2M1x2[code] * e8m0_half(e).

void deq_mxfp4(const uint8_t* b, float* y) {
  const float d = e8m0_half(b[0]);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = (float)kE2M1x2[b[1 + j] & 0x0f] * d;
    y[j + kQK / 2] = (float)kE2M1x2[b[1 + j] >> 4] * d;
  }
}

// ---------------------------------------------------------------------------
// FP8_E4M3 (ours): u8 E8M0 scale e, then 32 e4m3fn bytes; value =
// fp8(q) * 2^(e-127). The product is exact (a power-of-two scaling) unless it
// leaves f32's normal range.

void deq_fp8(const uint8_t* b, float* y) {
  const float d = e8m0(b[0]);
  for (int j = 0; j < kQK; ++j) y[j] = fp8_e4m3_to_f32(b[1 + j]) * d;
}

// ---------------------------------------------------------------------------
// NVFP4 (ours; the layout of GGML's block_nvfp4): 64 elements as four
// 16-element sub-blocks s. Bytes 0..3 are the sub-blocks' unsigned e4m3
// scales; bytes 4..35 are nibbles: sub-block s owns qs[8s .. 8s+7], low
// nibbles elements 16s+0..7, high nibbles 16s+8..15. value =
// kE2M1x2[code] * ue4m3(scale) / 2. A scale byte's sign bit is ignored and
// 0x7f (NaN) decodes as 0, as in GGML. The per-tensor global scale is left
// to the caller (see dtype.h).

float ue4m3_half(uint8_t s) {
  s &= 0x7f;
  if (s == 0x7f) return 0.0f;
  return fp8_e4m3_to_f32(s) * 0.5f;
}

void deq_nvfp4(const uint8_t* b, float* y) {
  for (int s = 0; s < 4; ++s) {
    const float d = ue4m3_half(b[s]);
    const uint8_t* qs = b + 4 + 8 * s;
    for (int j = 0; j < 8; ++j) {
      y[16 * s + j] = (float)kE2M1x2[qs[j] & 0x0f] * d;
      y[16 * s + 8 + j] = (float)kE2M1x2[qs[j] >> 4] * d;
    }
  }
}

// ---------------------------------------------------------------------------
// INT4_G128 (ours): f16 d, then four 16-byte groups; group g holds elements
// 32g..32g+31 as Q4_0 does (low nibbles 32g+0..15, high nibbles 32g+16..31).
// Codes are q + 8 for q in -8..7; value = (code - 8) * d.

void deq_int4_g128(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int g = 0; g < 4; ++g) {
    const uint8_t* qs = b + 2 + 16 * g;
    for (int j = 0; j < 16; ++j) {
      y[32 * g + j] = (float)((int)(qs[j] & 0x0f) - 8) * d;
      y[32 * g + 16 + j] = (float)((int)(qs[j] >> 4) - 8) * d;
    }
  }
}

// ---------------------------------------------------------------------------
// INT8_COL (ours): f32 scale d, then 128 int8; value = q * d. Every block of a
// row carries the same d (the row's absmax / 127): see quantize_row_int8_col.

void deq_int8_col(const uint8_t* b, float* y) {
  float d;
  std::memcpy(&d, b, 4);
  for (int j = 0; j < kG128; ++j) y[j] = (float)(int8_t)b[4 + j] * d;
}

// ---------------------------------------------------------------------------
// Row kernels, generated from the per-block functions above.

using DeqBlockFn = void (*)(const uint8_t*, float*);
using QuantBlockFn = void (*)(const float*, uint8_t*);

template <int64_t BS, size_t BB, DeqBlockFn Deq>
void dequantize_row(const void* src, float* dst, int64_t n) {
  MK_DCHECK(n >= 0 && n % BS == 0, "n={} block={}", n, BS);
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n / BS; ++i) Deq(p + (size_t)i * BB, dst + i * BS);
}

template <int64_t BS, size_t BB, QuantBlockFn Quant>
void quantize_row(const float* src, void* dst, int64_t n) {
  MK_DCHECK(n >= 0 && n % BS == 0, "n={} block={}", n, BS);
  auto* p = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / BS; ++i) Quant(src + i * BS, p + (size_t)i * BB);
}

// The dot product accumulates a partial sum per chunk in f32, left to right,
// then adds the chunk's sum to the running total. A chunk is one block for the
// quantised formats and 32 elements (the last one possibly shorter) for the
// plain floats, so the rounding is fixed by n alone and bounded by about
// (chunk + n / chunk) ulps of sum |w*x|.
template <int64_t BS, size_t BB, DeqBlockFn Deq>
float dot_row(const void* w, const float* x, int64_t n) {
  MK_DCHECK(n >= 0 && n % BS == 0, "n={} block={}", n, BS);
  constexpr int64_t kBlocksPerChunk = BS >= 32 ? 1 : 32 / BS;
  constexpr int64_t kChunk = BS * kBlocksPerChunk;
  const auto* p = static_cast<const uint8_t*>(w);
  const int64_t nb = n / BS;
  float buf[kChunk];
  float total = 0.0f;
  for (int64_t i = 0; i < nb; i += kBlocksPerChunk) {
    const int64_t cnt = std::min(kBlocksPerChunk, nb - i);
    for (int64_t k = 0; k < cnt; ++k) Deq(p + (size_t)(i + k) * BB, buf + k * BS);
    const float* xs = x + i * BS;
    float s = 0.0f;
    for (int64_t j = 0; j < cnt * BS; ++j) s += buf[j] * xs[j];
    total += s;
  }
  return total;
}

template <DType T, int64_t BS, size_t BB, DeqBlockFn Deq, QuantBlockFn Quant>
constexpr DTypeTraits make_traits(const char* name) {
  return DTypeTraits{T, name, BS, BB, &dequantize_row<BS, BB, Deq>, &quantize_row<BS, BB, Quant>,
                     &dot_row<BS, BB, Deq>};
}

constexpr DTypeTraits kF32 = make_traits<DType::F32, 1, 4, deq_f32, quant_f32>("f32");
constexpr DTypeTraits kF16 = make_traits<DType::F16, 1, 2, deq_f16, quant_f16>("f16");
constexpr DTypeTraits kBF16 = make_traits<DType::BF16, 1, 2, deq_bf16, quant_bf16>("bf16");
constexpr DTypeTraits kQ4_0 = make_traits<DType::Q4_0, kQK, kQ4_0Bytes, deq_q4_0, quant_q4_0>("q4_0");
constexpr DTypeTraits kQ4_1 = make_traits<DType::Q4_1, kQK, kQ4_1Bytes, deq_q4_1, quant_q4_1>("q4_1");
constexpr DTypeTraits kQ5_0 = make_traits<DType::Q5_0, kQK, kQ5_0Bytes, deq_q5_0, quant_q5_0>("q5_0");
constexpr DTypeTraits kQ8_0 = make_traits<DType::Q8_0, kQK, kQ8_0Bytes, deq_q8_0, quant_q8_0>("q8_0");
constexpr DTypeTraits kQ4_K = make_traits<DType::Q4_K, kQKK, kQ4_KBytes, deq_q4_k, quant_q4_k>("q4_k");
constexpr DTypeTraits kQ6_K = make_traits<DType::Q6_K, kQKK, kQ6_KBytes, deq_q6_k, quant_q6_k>("q6_k");
constexpr DTypeTraits kQ3_K = make_traits<DType::Q3_K, kQKK, kQ3_KBytes, deq_q3_k, quant_q3_k>("q3_k");
constexpr DTypeTraits kQ5_K = make_traits<DType::Q5_K, kQKK, kQ5_KBytes, deq_q5_k, quant_q5_k>("q5_k");
constexpr DTypeTraits kIQ4_NL = make_traits<DType::IQ4_NL, kQK, kIQ4_NLBytes, deq_iq4_nl, quant_iq4_nl>("iq4_nl");
constexpr DTypeTraits kIQ4_XS = make_traits<DType::IQ4_XS, kQKK, kIQ4_XSBytes, deq_iq4_xs, quant_iq4_xs>("iq4_xs");

constexpr DTypeTraits kMXFP4 = make_traits<DType::MXFP4, kQK, kMXFP4Bytes, deq_mxfp4, quant_mxfp4>("mxfp4");
constexpr DTypeTraits kFP8 = make_traits<DType::FP8_E4M3, kQK, kFP8Bytes, deq_fp8, quant_fp8>("fp8_e4m3");
constexpr DTypeTraits kNVFP4 =
    make_traits<DType::NVFP4, kNVFP4Block, kNVFP4Bytes, deq_nvfp4, quant_nvfp4>("nvfp4");
constexpr DTypeTraits kInt4G128 =
    make_traits<DType::INT4_G128, kG128, kInt4G128Bytes, deq_int4_g128, quant_int4_g128>("int4_g128");
constexpr DTypeTraits kInt8Col = [] {
  DTypeTraits t = make_traits<DType::INT8_COL, kG128, kInt8ColBytes, deq_int8_col, quant_int8_col>("int8_col");
  t.quantize = &quantize_row_int8_col;  // one scale for the whole row
  return t;
}();

constexpr const DTypeTraits* kAllTraits[] = {&kF32,   &kF16,    &kBF16,   &kQ4_0,  &kQ4_1,     &kQ5_0,
                                             &kQ8_0,  &kQ4_K,   &kQ6_K,   &kQ3_K,  &kQ5_K,     &kIQ4_NL,
                                             &kIQ4_XS, &kMXFP4, &kFP8,    &kNVFP4, &kInt4G128, &kInt8Col};
constexpr DType kAllTypes[] = {DType::F32,      DType::F16,    DType::BF16,     DType::Q4_0,     DType::Q4_1,
                               DType::Q5_0,     DType::Q8_0,   DType::Q4_K,     DType::Q6_K,     DType::Q3_K,
                               DType::Q5_K,     DType::IQ4_NL, DType::IQ4_XS,   DType::MXFP4,    DType::FP8_E4M3,
                               DType::NVFP4,    DType::INT4_G128, DType::INT8_COL};
static_assert(std::size(kAllTypes) == std::size(kAllTraits));

const DTypeTraits* find_traits(uint32_t id) {
  for (const DTypeTraits* t : kAllTraits) {
    if ((uint32_t)t->type == id) return t;
  }
  return nullptr;
}

// GGML's type names by id, lowercased ("q2_K" becomes "q2_k") so that names
// compare uniformly. Ids whose support GGML has since removed keep their
// historical names, which is more useful in an error message than "unknown".
constexpr std::array<std::string_view, 42> kGgmlNames = {
    "f32",      "f16",        "q4_0",       "q4_1",       "q4_2",   "q4_3",    "q5_0",   "q5_1",   "q8_0",
    "q8_1",     "q2_k",       "q3_k",       "q4_k",       "q5_k",   "q6_k",    "q8_k",   "iq2_xxs", "iq2_xs",
    "iq3_xxs",  "iq1_s",      "iq4_nl",     "iq3_s",      "iq2_s",  "iq4_xs",  "i8",     "i16",    "i32",
    "i64",      "f64",        "iq1_m",      "bf16",       "q4_0_4_4", "q4_0_4_8", "q4_0_8_8", "tq1_0", "tq2_0",
    "iq4_nl_4_4", "iq4_nl_4_8", "iq4_nl_8_8", "mxfp4",    "nvfp4",  "q1_0",
};

}  // namespace

const DTypeTraits& dtype_traits(DType t) {
  const uint32_t id = (uint32_t)t;
  if (const DTypeTraits* traits = find_traits(id)) return *traits;
  fail("tensor type {} (GGML id {}) is not supported", ggml_type_name(id), id);
}

const DType* all_dtypes(size_t* count) {
  *count = std::size(kAllTypes);
  return kAllTypes;
}

std::optional<DType> dtype_from_ggml(uint32_t id) {
  if (const DTypeTraits* traits = find_traits(id)) return traits->type;
  return std::nullopt;
}

std::string_view ggml_type_name(uint32_t id) {
  if (id < kGgmlNames.size()) return kGgmlNames[id];
  return "unknown";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const DTypeTraits* t : kAllTraits) {
    const std::string_view ours = t->name;
    if (ours.size() != name.size()) continue;
    bool same = true;
    for (size_t i = 0; i < ours.size() && same; ++i) {
      same = std::tolower((unsigned char)name[i]) == (unsigned char)ours[i];
    }
    if (same) return t->type;
  }
  return std::nullopt;
}

size_t row_bytes(DType t, int64_t n) {
  const DTypeTraits& traits = dtype_traits(t);
  if (n < 0 || n % traits.block_size != 0) {
    fail("a row of {} elements cannot be stored as {}: the length must be a non-negative multiple of its "
         "block size {}",
         n, traits.name, traits.block_size);
  }
  return (size_t)(n / traits.block_size) * traits.block_bytes;
}

void k_scale_min(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

}  // namespace megakern
