// Scalar reference implementations of every tensor element format.
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

#include "core/error.h"
#include "core/half.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace megakern {

static_assert(std::endian::native == std::endian::little,
              "GGUF blocks are little-endian and are read here with memcpy");

namespace {

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

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
float load_f16(const uint8_t* p) { return f16_to_f32(load_u16(p)); }
void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// f32 -> f16 for a block scale. A finite scale too large for f16 saturates to
// the largest finite half instead of becoming inf, so an extreme block decodes
// to clipped values rather than to inf/NaN everywhere. For every input ggml
// itself can represent this equals plain round-to-nearest-even.
uint16_t scale_to_f16(float v) {
  const uint16_t h = f32_to_f16(v);
  if ((h & 0x7fffu) == 0x7c00u && std::isfinite(v)) return (uint16_t)((h & 0x8000u) | 0x7bffu);
  return h;
}

// Round half away from zero, like C's roundf, returned as an int.
int nearest_int(float v) { return (int)std::lround(v); }

// ---------------------------------------------------------------------------
// Plain floats. Their "block" is one element.

void deq_f32(const uint8_t* b, float* y) { std::memcpy(y, b, 4); }
void quant_f32(const float* x, uint8_t* b) { std::memcpy(b, x, 4); }
void deq_f16(const uint8_t* b, float* y) { *y = f16_to_f32(load_u16(b)); }
void quant_f16(const float* x, uint8_t* b) { store_u16(b, f32_to_f16(*x)); }
void deq_bf16(const uint8_t* b, float* y) { *y = bf16_to_f32(load_u16(b)); }
void quant_bf16(const float* x, uint8_t* b) { store_u16(b, f32_to_bf16(*x)); }

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

// Signed value of largest magnitude in x[0..n) (the first one on ties), which
// the symmetric formats map to the most negative quant so the asymmetric
// integer range (-8..7, -16..15) is used to the full on that side.
float signed_absmax(const float* x, int64_t n) {
  float amax = 0.0f, max = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// The quantisers of the legacy formats follow ggml's reference arithmetic
// (scale from the block extreme in f32, truncation after adding 8.5 / 16.5,
// roundf for Q8_0) so that their output is byte-identical to ggml's.
void quant_q4_0(const float* x, uint8_t* b) {
  const float d = signed_absmax(x, kQK) / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_u16(b, scale_to_f16(d));
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = std::clamp((int)(x[j] * id + 8.5f), 0, 15);
    const int hi = std::clamp((int)(x[j + kQK / 2] * id + 8.5f), 0, 15);
    b[2 + j] = (uint8_t)(lo | (hi << 4));
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

void quant_q4_1(const float* x, uint8_t* b) {
  float lo = std::numeric_limits<float>::max(), hi = -std::numeric_limits<float>::max();
  for (int j = 0; j < kQK; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  const float d = (hi - lo) / 15.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_u16(b, scale_to_f16(d));
  store_u16(b + 2, scale_to_f16(lo));
  for (int j = 0; j < kQK / 2; ++j) {
    const int q0 = std::clamp((int)((x[j] - lo) * id + 0.5f), 0, 15);
    const int q1 = std::clamp((int)((x[j + kQK / 2] - lo) * id + 0.5f), 0, 15);
    b[4 + j] = (uint8_t)(q0 | (q1 << 4));
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

void quant_q5_0(const float* x, uint8_t* b) {
  const float d = signed_absmax(x, kQK) / -16.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_u16(b, scale_to_f16(d));
  uint32_t qh = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    const int q0 = std::clamp((int)(x[j] * id + 16.5f), 0, 31);
    const int q1 = std::clamp((int)(x[j + kQK / 2] * id + 16.5f), 0, 31);
    b[6 + j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
    qh |= (uint32_t)(q0 >> 4) << j;
    qh |= (uint32_t)(q1 >> 4) << (j + 16);
  }
  store_u32(b + 2, qh);
}

// ---------------------------------------------------------------------------
// Q8_0: f16 d, 32 int8 quants; value = q * d.

void deq_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < kQK; ++j) y[j] = (float)(int8_t)b[2 + j] * d;
}

void quant_q8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_u16(b, scale_to_f16(d));
  for (int j = 0; j < kQK; ++j) b[2 + j] = (uint8_t)(int8_t)std::clamp(nearest_int(x[j] * id), -127, 127);
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

void unpack_q4_k_scale_min(const uint8_t* s, int i, int& sc, int& m) {
  if (i < 4) {
    sc = s[i] & 63;
    m = s[i + 4] & 63;
  } else {
    sc = (s[i + 4] & 0x0f) | ((s[i - 4] >> 6) << 4);
    m = (s[i + 4] >> 4) | ((s[i] >> 6) << 4);
  }
}

void pack_q4_k_scale_min(const uint8_t sc[8], const uint8_t m[8], uint8_t* s) {
  for (int i = 0; i < 4; ++i) {
    s[i] = (uint8_t)((sc[i] & 63) | ((sc[i + 4] >> 4) << 6));
    s[i + 4] = (uint8_t)((m[i] & 63) | ((m[i + 4] >> 4) << 6));
    s[i + 8] = (uint8_t)((sc[i + 4] & 0x0f) | ((m[i + 4] & 0x0f) << 4));
  }
}

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

// Fits x[i] ~= scale * q[i] - minv with q[i] in 0..nmax, scale >= 0 and
// minv >= 0 (the offset is never positive, so zero stays representable,
// matching how GGML's K-quant quantisers treat the minimum). A handful of
// candidate grids around the min/max one are tried; for each, the quants are
// fixed and (scale, offset) refit by least squares, keeping the lowest error.
void fit_scale_min(const float* x, int n, int nmax, float& scale, float& minv) {
  constexpr int kMaxN = 32;
  MK_DCHECK(n > 0 && n <= kMaxN);
  float lo = 0.0f, hi = x[0];
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (!(hi > lo)) {  // constant non-positive block
    scale = 0.0f;
    minv = -lo;
    return;
  }
  // The plain min/max grid is always a valid answer.
  scale = (hi - lo) / (float)nmax;
  minv = -lo;
  double best_err = 0.0;
  for (int i = 0; i < n; ++i) {
    const int q = std::clamp(nearest_int((x[i] - lo) / scale), 0, nmax);
    const double e = (double)scale * q - minv - x[i];
    best_err += e * e;
  }
  for (int step = -10; step <= 10; ++step) {
    const float iscale = ((float)nmax + 0.1f * (float)step) / (hi - lo);
    double sl = 0, sl2 = 0, sx = 0, sxl = 0;
    int qs[kMaxN];
    for (int i = 0; i < n; ++i) {
      qs[i] = std::clamp(nearest_int(iscale * (x[i] - lo)), 0, nmax);
      sl += qs[i];
      sl2 += (double)qs[i] * qs[i];
      sx += x[i];
      sxl += (double)x[i] * qs[i];
    }
    const double det = n * sl2 - sl * sl;
    if (det <= 0) continue;
    double s = (n * sxl - sl * sx) / det;
    double off = (sl2 * sx - sl * sxl) / det;
    if (off > 0) {  // the offset must not be positive: refit the scale alone
      off = 0;
      s = sxl / sl2;
    }
    if (!(s > 0)) continue;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = s * qs[i] + off - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      scale = (float)s;
      minv = (float)-off;
    }
  }
}

void quant_q4_k(const float* x, uint8_t* b) {
  float scale[8], minv[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int i = 0; i < 8; ++i) {
    fit_scale_min(x + 32 * i, 32, 15, scale[i], minv[i]);
    max_scale = std::max(max_scale, scale[i]);
    max_min = std::max(max_min, minv[i]);
  }
  // The super-block scales map the largest sub-block scale/min to 63; the
  // 6-bit codes are then chosen against the f16-rounded values actually stored.
  const uint16_t d_h = scale_to_f16(max_scale / 63.0f);
  const uint16_t dmin_h = scale_to_f16(max_min / 63.0f);
  const float d = f16_to_f32(d_h), dmin = f16_to_f32(dmin_h);
  uint8_t sc[8], m[8];
  for (int i = 0; i < 8; ++i) {
    sc[i] = d > 0.0f ? (uint8_t)std::clamp(nearest_int(scale[i] / d), 0, 63) : 0;
    m[i] = dmin > 0.0f ? (uint8_t)std::clamp(nearest_int(minv[i] / dmin), 0, 63) : 0;
  }
  store_u16(b, d_h);
  store_u16(b + 2, dmin_h);
  pack_q4_k_scale_min(sc, m, b + 4);
  // Requantise every element against the scale and offset it will decode with.
  uint8_t q[kQKK];
  for (int i = 0; i < 8; ++i) {
    const float ds = d * (float)sc[i], off = dmin * (float)m[i];
    for (int l = 0; l < 32; ++l) {
      q[32 * i + l] = ds > 0.0f ? (uint8_t)std::clamp(nearest_int((x[32 * i + l] + off) / ds), 0, 15) : 0;
    }
  }
  uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
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

// Fits x[i] ~= scale * q[i] with q[i] in -nmax..nmax-1. The element of largest
// magnitude anchors the grid at -nmax (the side with one extra level); nearby
// grids are tried and the scale refit by least squares for each.
float fit_symmetric(const float* x, int n, int nmax) {
  constexpr int kMaxN = 32;
  MK_DCHECK(n > 0 && n <= kMaxN);
  const float max = signed_absmax(x, n);
  if (max == 0.0f) return 0.0f;
  float best_scale = max / (float)-nmax;
  double best_err = std::numeric_limits<double>::infinity();
  for (int step = -9; step <= 9; ++step) {
    const float iscale = -((float)nmax + 0.1f * (float)step) / max;
    double sxl = 0, sl2 = 0;
    int qs[kMaxN];
    for (int i = 0; i < n; ++i) {
      qs[i] = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      sxl += (double)x[i] * qs[i];
      sl2 += (double)qs[i] * qs[i];
    }
    if (sl2 <= 0) continue;
    const double s = sxl / sl2;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = s * qs[i] - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_scale = (float)s;
    }
  }
  return best_scale;
}

void quant_q6_k(const float* x, uint8_t* b) {
  float scale[16];
  float smax = 0.0f;  // the sub-block scale of largest magnitude, signed
  for (int i = 0; i < 16; ++i) {
    scale[i] = fit_symmetric(x + 16 * i, 16, 32);
    if (std::fabs(scale[i]) > std::fabs(smax)) smax = scale[i];
  }
  // That scale becomes the int8 code -128; the others are quantised against
  // the f16-rounded super-block scale that is actually stored.
  const uint16_t d_h = scale_to_f16(smax / -128.0f);
  const float d = f16_to_f32(d_h);
  int8_t sc[16];
  for (int i = 0; i < 16; ++i) sc[i] = d != 0.0f ? (int8_t)std::clamp(nearest_int(scale[i] / d), -128, 127) : 0;

  uint8_t q[kQKK];  // quants biased by +32 into 0..63
  for (int i = 0; i < 16; ++i) {
    const float ds = d * (float)sc[i];
    for (int l = 0; l < 16; ++l) {
      const int v = ds != 0.0f ? std::clamp(nearest_int(x[16 * i + l] / ds), -32, 31) : 0;
      q[16 * i + l] = (uint8_t)(v + 32);
    }
  }
  std::memset(b, 0, kQ6_KBytes);
  for (int h = 0; h < 2; ++h) {
    uint8_t* ql = b + 64 * h;
    uint8_t* qh = b + kQ6_KQh + 32 * h;
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t v = q[128 * h + 32 * g + l];
        ql[l + 32 * (g & 1)] |= (uint8_t)((v & 0x0f) << (g < 2 ? 0 : 4));
        qh[l] |= (uint8_t)((v >> 4) << (2 * g));
      }
    }
  }
  std::memcpy(b + kQ6_KScales, sc, 16);
  store_u16(b + kQ6_KD, d_h);
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

constexpr const DTypeTraits* kAllTraits[] = {&kF32, &kF16, &kBF16, &kQ4_0, &kQ4_1, &kQ5_0, &kQ8_0, &kQ4_K, &kQ6_K};

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

}  // namespace megakern
