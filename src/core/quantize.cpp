// The reference quantisers of core/dtype.h's formats, one block at a time
// (the layouts: core/dtype.cpp, with each format's decoder). The legacy
// formats follow ggml's reference arithmetic byte for byte; the K-quants,
// IQ4 and our own formats use the fits documented here.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "core/dtype_blocks.h"
#include "core/error.h"
#include "core/half.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace megakern::dtype_detail {

// Round half away from zero, like C's roundf, returned as an int.
static int nearest_int(float v) { return (int)std::lround(v); }

void quant_f32(const float* x, uint8_t* b) { std::memcpy(b, x, 4); }

void quant_f16(const float* x, uint8_t* b) { store_u16(b, f32_to_f16(*x)); }

void quant_bf16(const float* x, uint8_t* b) { store_u16(b, f32_to_bf16(*x)); }

// Signed value of largest magnitude in x[0..n) (the first one on ties), which
// the symmetric formats map to the most negative quant so the asymmetric
// integer range (-8..7, -16..15) is used to the full on that side.
static float signed_absmax(const float* x, int64_t n) {
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

void quant_q8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_u16(b, scale_to_f16(d));
  for (int j = 0; j < kQK; ++j) b[2 + j] = (uint8_t)(int8_t)std::clamp(nearest_int(x[j] * id), -127, 127);
}

static void pack_q4_k_scale_min(const uint8_t sc[8], const uint8_t m[8], uint8_t* s) {
  for (int i = 0; i < 4; ++i) {
    s[i] = (uint8_t)((sc[i] & 63) | ((sc[i + 4] >> 4) << 6));
    s[i + 4] = (uint8_t)((m[i] & 63) | ((m[i + 4] >> 4) << 6));
    s[i + 8] = (uint8_t)((sc[i + 4] & 0x0f) | ((m[i + 4] & 0x0f) << 4));
  }
}

// Fits x[i] ~= scale * q[i] - minv with q[i] in 0..nmax, scale >= 0 and
// minv >= 0 (the offset is never positive, so zero stays representable,
// matching how GGML's K-quant quantisers treat the minimum). A handful of
// candidate grids around the min/max one are tried; for each, the quants are
// fixed and (scale, offset) refit by least squares, keeping the lowest error.
static void fit_scale_min(const float* x, int n, int nmax, float& scale, float& minv) {
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

// The K-quant fit shared by Q4_K and Q5_K: each 32-element sub-block i is
// fitted as scale * q - min with q in 0..nmax (fit_scale_min); the super-block
// scales d, dmin map the largest sub-block scale / min to the 6-bit code 63;
// the codes sc[i], m[i] are chosen against the f16-rounded d, dmin actually
// stored, and every element is then requantised against the sub-block scale
// and offset it will decode with.
static void quantize_k_scale_min(const float* x, int nmax, uint16_t& d_h, uint16_t& dmin_h, uint8_t sc[8], uint8_t m[8],
                          uint8_t q[kQKK]) {
  float scale[8], minv[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int i = 0; i < 8; ++i) {
    fit_scale_min(x + 32 * i, 32, nmax, scale[i], minv[i]);
    max_scale = std::max(max_scale, scale[i]);
    max_min = std::max(max_min, minv[i]);
  }
  d_h = scale_to_f16(max_scale / 63.0f);
  dmin_h = scale_to_f16(max_min / 63.0f);
  const float d = f16_to_f32(d_h), dmin = f16_to_f32(dmin_h);
  for (int i = 0; i < 8; ++i) {
    sc[i] = d > 0.0f ? (uint8_t)std::clamp(nearest_int(scale[i] / d), 0, 63) : 0;
    m[i] = dmin > 0.0f ? (uint8_t)std::clamp(nearest_int(minv[i] / dmin), 0, 63) : 0;
  }
  for (int i = 0; i < 8; ++i) {
    const float ds = d * (float)sc[i], off = dmin * (float)m[i];
    for (int l = 0; l < 32; ++l) {
      q[32 * i + l] = ds > 0.0f ? (uint8_t)std::clamp(nearest_int((x[32 * i + l] + off) / ds), 0, nmax) : 0;
    }
  }
}

void quant_q4_k(const float* x, uint8_t* b) {
  uint16_t d_h, dmin_h;
  uint8_t sc[8], m[8], q[kQKK];
  quantize_k_scale_min(x, 15, d_h, dmin_h, sc, m, q);
  store_u16(b, d_h);
  store_u16(b + 2, dmin_h);
  pack_q4_k_scale_min(sc, m, b + 4);
  uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
  }
}

// Fits x[i] ~= scale * q[i] with q[i] in -nmax..nmax-1. The element of largest
// magnitude anchors the grid at -nmax (the side with one extra level); nearby
// grids are tried and the scale refit by least squares for each.
static float fit_symmetric(const float* x, int n, int nmax) {
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

// Our quantiser: the Q4_K fit (quantize_k_scale_min) with 32 levels.
void quant_q5_k(const float* x, uint8_t* b) {
  uint16_t d_h, dmin_h;
  uint8_t sc[8], m[8], q[kQKK];
  quantize_k_scale_min(x, 31, d_h, dmin_h, sc, m, q);
  std::memset(b, 0, kQ5_KBytes);
  store_u16(b, d_h);
  store_u16(b + 2, dmin_h);
  pack_q4_k_scale_min(sc, m, b + 4);
  for (int sb = 0; sb < 8; ++sb) {
    uint8_t* qs = b + kQ5_KQs + 32 * (sb / 2);
    for (int l = 0; l < 32; ++l) {
      const uint8_t v = q[32 * sb + l];
      qs[l] |= (uint8_t)((v & 0x0f) << (sb % 2 ? 4 : 0));
      b[kQ5_KQh + l] |= (uint8_t)((v >> 4) << sb);
    }
  }
}

// Our quantiser: each 16-element group is fitted symmetrically with quants
// -4..3 (fit_symmetric); the group scale of largest magnitude becomes the
// code -32 of the super-block scale d (stored as f16), the others are rounded
// against that stored d, and every element is requantised against the group
// scale it will decode with.
void quant_q3_k(const float* x, uint8_t* b) {
  float scale[16];
  float smax = 0.0f;
  for (int i = 0; i < 16; ++i) {
    scale[i] = fit_symmetric(x + 16 * i, 16, 4);
    if (std::fabs(scale[i]) > std::fabs(smax)) smax = scale[i];
  }
  const uint16_t d_h = scale_to_f16(smax / -32.0f);
  const float d = f16_to_f32(d_h);
  int sc[16];
  for (int i = 0; i < 16; ++i) sc[i] = d != 0.0f ? std::clamp(nearest_int(scale[i] / d), -32, 31) : 0;
  std::memset(b, 0, kQ3_KBytes);
  uint8_t* s = b + kQ3_KScales;
  for (int i = 0; i < 16; ++i) {
    const int u = sc[i] + 32;
    s[i < 8 ? i : i - 8] |= (uint8_t)((u & 0x0f) << (i < 8 ? 0 : 4));
    s[8 + i % 4] |= (uint8_t)((u >> 4) << (2 * (i / 4)));
  }
  for (int e = 0; e < kQKK; ++e) {
    const float ds = d * (float)sc[e / 16];
    const int q = ds != 0.0f ? std::clamp(nearest_int(x[e] / ds), -4, 3) : 0;
    const int code = q + 4;  // low two bits, and the high bit set for q >= 0
    const int h = e / 128, j = (e % 128) / 32, l = e % 32;
    b[kQ3_KQs + 32 * h + l] |= (uint8_t)((code & 3) << (2 * j));
    b[l] |= (uint8_t)((code >> 2) << (4 * h + j));
  }
  store_u16(b + kQ3_KD, d_h);
}

// Index of the grid value nearest to v (the lower one on a tie).
static int nearest_iq4(float v) {
  int best = 0;
  float best_err = std::fabs(v - (float)kIQ4NL[0]);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(v - (float)kIQ4NL[i]);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return best;
}

// Fits x[i] ~= s * kIQ4NL[idx[i]] over n <= 32 values and returns s (signed;
// 0 for an all-zero block). Candidate grids map the element of largest
// magnitude near either end of the table (-127 or 113, a few steps either
// side); for each, the indices are fixed and s refit by least squares; the
// lowest squared error wins. This is a plain nearest-value search, not GGML's
// importance-weighted one.
static float fit_iq4(const float* x, int n) {
  constexpr int kMaxN = 32;
  MK_DCHECK(n > 0 && n <= kMaxN);
  const float max = signed_absmax(x, n);
  if (max == 0.0f) return 0.0f;
  float best_s = max / (float)kIQ4NL[0];
  double best_err = std::numeric_limits<double>::infinity();
  for (const int edge : {-127, 113}) {
    for (int step = -10; step <= 10; ++step) {
      const float iscale = ((float)edge + (float)step) / max;
      double sxt = 0, st2 = 0;
      int idx[kMaxN];
      for (int i = 0; i < n; ++i) {
        idx[i] = nearest_iq4(iscale * x[i]);
        sxt += (double)x[i] * kIQ4NL[idx[i]];
        st2 += (double)kIQ4NL[idx[i]] * kIQ4NL[idx[i]];
      }
      const double s = sxt / st2;  // st2 > 0: the table has no zero
      double err = 0;
      for (int i = 0; i < n; ++i) {
        const double e = s * kIQ4NL[idx[i]] - x[i];
        err += e * e;
      }
      if (err < best_err) {
        best_err = err;
        best_s = (float)s;
      }
    }
  }
  return best_s;
}

// 16 index bytes for 32 values at scale ds (ds = 0 writes index 8, value +1,
// which decodes to zero).
static void put_iq4_indices(const float* x, float ds, uint8_t* qs) {
  auto idx = [&](float v) { return ds != 0.0f ? nearest_iq4(v / ds) : 8; };
  for (int j = 0; j < 16; ++j) qs[j] = (uint8_t)(idx(x[j]) | (idx(x[j + 16]) << 4));
}

// Our quantiser: fit_iq4, the scale stored as f16, indices chosen against it.
void quant_iq4_nl(const float* x, uint8_t* b) {
  const uint16_t d_h = scale_to_f16(fit_iq4(x, kQK));
  store_u16(b, d_h);
  put_iq4_indices(x, f16_to_f32(d_h), b + 2);
}

// Our quantiser: fit_iq4 per 32 elements; the sub-block scale of largest
// magnitude becomes the code -32 of d (stored as f16), the others are rounded
// against that d, and indices are chosen against each decoded sub-block scale.
void quant_iq4_xs(const float* x, uint8_t* b) {
  float scale[8];
  float smax = 0.0f;
  for (int ib = 0; ib < 8; ++ib) {
    scale[ib] = fit_iq4(x + 32 * ib, 32);
    if (std::fabs(scale[ib]) > std::fabs(smax)) smax = scale[ib];
  }
  const uint16_t d_h = scale_to_f16(smax / -32.0f);
  const float d = f16_to_f32(d_h);
  std::memset(b, 0, kIQ4_XSBytes);
  store_u16(b, d_h);
  uint16_t scales_h = 0;
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = d != 0.0f ? std::clamp(nearest_int(scale[ib] / d), -32, 31) : 0;
    const int u = ls + 32;
    b[4 + ib / 2] |= (uint8_t)((u & 0x0f) << (4 * (ib % 2)));
    scales_h |= (uint16_t)((u >> 4) << (2 * ib));
    put_iq4_indices(x + 32 * ib, d * (float)ls, b + 8 + 16 * ib);
  }
  store_u16(b + 2, scales_h);
}

// The e2m1 code nearest to v / d (ties to the lower index, as GGML's
// best_index_mxfp4 scans), with v / d compared in doubled units.
static uint8_t nearest_e2m1(float v, float d) {
  int best = 0;
  float best_err = std::fabs((float)kE2M1x2[0] * d - v);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs((float)kE2M1x2[i] * d - v);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return (uint8_t)best;
}

// GGML's quantize_row_mxfp4_ref: the scale exponent puts the block maximum in
// [4, 8) in e2m1 units (values above 6 clip to 6), then each value takes the
// nearest grid point.
void quant_mxfp4(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const int e = amax > 0.0f ? std::clamp((int)std::floor(std::log2(amax)) - 2 + 127, 0, 254) : 0;
  const float d = e8m0_half((uint8_t)e);
  b[0] = (uint8_t)e;
  for (int j = 0; j < kQK / 2; ++j) {
    b[1 + j] = (uint8_t)(nearest_e2m1(x[j], d) | (nearest_e2m1(x[j + kQK / 2], d) << 4));
  }
}

// The scale is the smallest power of two that brings the block maximum
// within 448; each value then rounds to nearest even e4m3.
void quant_fp8(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  int e = 127;
  if (amax > 0.0f && std::isfinite(amax)) {
    e = std::clamp((int)std::ceil(std::log2(amax / 448.0f)) + 127, 0, 254);
    while (e < 254 && amax / e8m0((uint8_t)e) > 448.0f) ++e;  // guard log2 rounding
  }
  const float d = e8m0((uint8_t)e);
  b[0] = (uint8_t)e;
  for (int j = 0; j < kQK; ++j) b[1 + j] = f32_to_fp8_e4m3(x[j] / d);
}

// The e2m1 code of v (already divided by its scale): nearest magnitude,
// ties to the even ordinal, above 6 clipped to 6, as the modelopt quantiser
// the Muse Spark reference follows (musespark/quant.py e2m1_encode).
static uint8_t e2m1_ties_even(float v) {
  static constexpr float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float a = std::fabs(v);
  int ord = 0;
  for (int i = 0; i < 7; ++i) ord += (a > kMid[i] || (i % 2 == 1 && a == kMid[i])) ? 1 : 0;
  return (uint8_t)((v < 0.0f ? 8 : 0) | ord);
}

// Scale = sub-block absmax / 6 clamped to [2^-9, 448] and rounded to the
// nearest e4m3 (ties to even), values e2m1_ties_even(x / scale), as
// musespark/quant.py quantize_nvfp4_np (x already divided by the global scale).
void quant_nvfp4(const float* x, uint8_t* b) {
  for (int s = 0; s < 4; ++s) {
    const float* xs = x + 16 * s;
    float amax = 0.0f;
    for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(xs[j]));
    const uint8_t sc = f32_to_fp8_e4m3(std::clamp(amax / 6.0f, 0x1p-9f, 448.0f)) & 0x7f;
    b[s] = sc;
    const float d = fp8_e4m3_to_f32(sc);
    uint8_t* qs = b + 4 + 8 * s;
    for (int j = 0; j < 8; ++j)
      qs[j] = (uint8_t)(e2m1_ties_even(xs[j] / d) | (e2m1_ties_even(xs[8 + j] / d) << 4));
  }
}

// d = bf16(absmax * f32(1/7)), stored as f16 (exact for a bf16 value in f16's
// normal range); q = round-half-even(x * f32(1/d)) clipped to -8..7: the
// Muse Spark reference's quantiser (musespark/quant.py quantize_int4_np).
void quant_int4_g128(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < kG128; ++j) amax = std::max(amax, std::fabs(x[j]));
  const uint16_t dh = scale_to_f16(bf16_to_f32(f32_to_bf16(amax * (1.0f / 7.0f))));
  const float d = f16_to_f32(dh);
  const float inv = d > 0.0f ? 1.0f / d : 0.0f;
  store_u16(b, dh);
  auto code = [&](float v) {
    const int q = d > 0.0f ? (int)std::clamp(std::nearbyint(v * inv), -8.0f, 7.0f) : 0;
    return (uint8_t)(q + 8);
  };
  for (int g = 0; g < 4; ++g) {
    for (int j = 0; j < 16; ++j) {
      b[2 + 16 * g + j] = (uint8_t)(code(x[32 * g + j]) | (code(x[32 * g + 16 + j]) << 4));
    }
  }
}

// Per-block form (unused by the row quantiser below, kept for the table's shape).
static void quant_int8_col_block(const float* x, uint8_t* b, float d) {
  std::memcpy(b, &d, 4);
  for (int j = 0; j < kG128; ++j) {
    const int q = d > 0.0f ? (int)std::clamp(std::nearbyint(x[j] / d), -127.0f, 127.0f) : 0;
    b[4 + j] = (uint8_t)(int8_t)q;
  }
}

void quant_int8_col(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < kG128; ++j) amax = std::max(amax, std::fabs(x[j]));
  quant_int8_col_block(x, b, amax / 127.0f);
}

// The whole span [0, n) shares one scale: call it per row.
void quantize_row_int8_col(const float* src, void* dst, int64_t n) {
  MK_DCHECK(n >= 0 && n % kG128 == 0, "n={} block={}", n, kG128);
  float amax = 0.0f;
  for (int64_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(src[j]));
  const float d = amax / 127.0f;
  auto* p = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kG128; ++i) quant_int8_col_block(src + i * kG128, p + (size_t)i * kInt8ColBytes, d);
}

}  // namespace megakern::dtype_detail
