#include "kernels/ref/i16_ref.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/half.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace megakern {
namespace {

constexpr int8_t kE2M1x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// GGML's kvalues_iq4nl (IQ4_NL / IQ4_XS), as in core/dtype.cpp.
constexpr int8_t kIQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
  return bits_to_f32(bits);
}

float ue4m3_half(uint8_t s) {
  s &= 0x7f;
  return s == 0x7f ? 0.0f : fp8_e4m3_to_f32(s) * 0.5f;
}

// Q4_0-style 16 bytes: low nibbles -> elements 0..15, high -> 16..31.
void split_nibbles(const uint8_t* qs, uint8_t code[32]) {
  for (int j = 0; j < 16; ++j) {
    code[j] = qs[j] & 0x0f;
    code[j + 16] = qs[j] >> 4;
  }
}

}  // namespace

void decode_i16_sub(DType t, const uint8_t* row, int64_t k, I16Sub& o) {
  o.mn = 0.0f;
  o.has_min = false;
  o.int_scales = false;
  uint8_t code[32];
  switch (t) {
    case DType::Q4_0: {
      const uint8_t* b = row + k * 18;
      split_nibbles(b + 2, code);
      for (int i = 0; i < 32; ++i) o.w[i] = (int8_t)(code[i] - 8);
      o.sc[0] = o.sc[1] = f16_at(b);
      break;
    }
    case DType::Q4_1: {
      const uint8_t* b = row + k * 20;
      split_nibbles(b + 4, code);
      for (int i = 0; i < 32; ++i) o.w[i] = (int8_t)code[i];
      o.sc[0] = o.sc[1] = f16_at(b);
      o.mn = f16_at(b + 2);
      o.has_min = true;
      break;
    }
    case DType::Q5_0: {
      const uint8_t* b = row + k * 22;
      uint32_t qh;
      std::memcpy(&qh, b + 2, 4);
      split_nibbles(b + 6, code);
      for (int i = 0; i < 32; ++i) o.w[i] = (int8_t)((code[i] | (((qh >> i) & 1u) << 4)) - 16);
      o.sc[0] = o.sc[1] = f16_at(b);
      break;
    }
    case DType::Q8_0: {
      const uint8_t* b = row + k * 34;
      std::memcpy(o.w, b + 2, 32);
      o.sc[0] = o.sc[1] = f16_at(b);
      break;
    }
    case DType::Q4_K: {
      const uint8_t* b = row + (k / 8) * 144;
      const int sb = (int)(k % 8);
      const uint8_t* s = b + 4;
      int sc, m;
      k_scale_min(s, sb, sc, m);
      const uint8_t* q = b + 16 + 32 * (sb / 2);
      for (int i = 0; i < 32; ++i) o.w[i] = (int8_t)(sb % 2 ? q[i] >> 4 : q[i] & 0x0f);
      o.sc[0] = o.sc[1] = f16_at(b) * (float)sc;
      o.mn = -(f16_at(b + 2) * (float)m);
      o.has_min = true;
      break;
    }
    case DType::Q6_K: {
      const uint8_t* b = row + (k / 8) * 210;
      const int sb = (int)(k % 8), h = sb / 4, j = sb % 4;
      const uint8_t* ql = b + 64 * h + (j % 2) * 32;
      const uint8_t* qh = b + 128 + 32 * h;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h + 2 * j;
      for (int i = 0; i < 32; ++i) {
        const int lo = j >= 2 ? ql[i] >> 4 : ql[i] & 0x0f;
        const int hi = (qh[i] >> (2 * j)) & 3;
        o.w[i] = (int8_t)((lo | (hi << 4)) - 32);
      }
      const float d = f16_at(b + 208);
      o.sc[0] = d * (float)sc[0];
      o.sc[1] = d * (float)sc[1];
      o.int_scales = true;
      o.isc[0] = sc[0];
      o.isc[1] = sc[1];
      o.d = d;
      break;
    }
    case DType::Q3_K: {
      // Quants -4..3; one signed 6-bit scale per 16 elements (dtype.cpp).
      const uint8_t* b = row + (k / 8) * 110;
      const int sb = (int)(k % 8), h = sb / 4, j = sb % 4;
      const uint8_t* qs = b + 32 + 32 * h;
      for (int i = 0; i < 32; ++i) {
        const int low = (qs[i] >> (2 * j)) & 3;
        o.w[i] = (int8_t)(((b[i] >> (4 * h + j)) & 1) ? low : low - 4);
      }
      const uint8_t* s = b + 96;
      const float d = f16_at(b + 108);
      for (int half = 0; half < 2; ++half) {
        const int idx = 2 * sb + half;
        const int lo = idx < 8 ? s[idx] & 0x0f : s[idx - 8] >> 4;
        const int hi = (s[8 + idx % 4] >> (2 * (idx / 4))) & 3;
        o.isc[half] = (int8_t)((lo | (hi << 4)) - 32);
        o.sc[half] = d * (float)o.isc[half];
      }
      o.int_scales = true;
      o.d = d;
      break;
    }
    case DType::Q5_K: {
      // Q4_K's scales and nibbles plus a fifth bit: w is the code 0..31.
      const uint8_t* b = row + (k / 8) * 176;
      const int sb = (int)(k % 8);
      const uint8_t* s = b + 4;
      int sc, m;
      k_scale_min(s, sb, sc, m);
      const uint8_t* qh = b + 16;
      const uint8_t* q = b + 48 + 32 * (sb / 2);
      for (int i = 0; i < 32; ++i) {
        const int lo = sb % 2 ? q[i] >> 4 : q[i] & 0x0f;
        o.w[i] = (int8_t)(lo | (((qh[i] >> sb) & 1) << 4));
      }
      o.sc[0] = o.sc[1] = f16_at(b) * (float)sc;
      o.mn = -(f16_at(b + 2) * (float)m);
      o.has_min = true;
      break;
    }
    case DType::IQ4_NL: {
      const uint8_t* b = row + k * 18;
      split_nibbles(b + 2, code);
      for (int i = 0; i < 32; ++i) o.w[i] = kIQ4NL[code[i]];
      o.sc[0] = o.sc[1] = f16_at(b);
      break;
    }
    case DType::IQ4_XS: {
      const uint8_t* b = row + (k / 8) * 136;
      const int ib = (int)(k % 8);
      split_nibbles(b + 8 + 16 * ib, code);
      for (int i = 0; i < 32; ++i) o.w[i] = kIQ4NL[code[i]];
      uint16_t sh;
      std::memcpy(&sh, b + 2, 2);
      const int ls = (((b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((sh >> (2 * ib)) & 3) << 4)) - 32;
      o.sc[0] = o.sc[1] = f16_at(b) * (float)ls;
      break;
    }
    case DType::MXFP4: {
      const uint8_t* b = row + k * 17;
      split_nibbles(b + 1, code);
      for (int i = 0; i < 32; ++i) o.w[i] = kE2M1x2[code[i]];
      o.sc[0] = o.sc[1] = e8m0_half(b[0]);
      break;
    }
    case DType::NVFP4: {
      const uint8_t* b = row + (k / 2) * 36;
      const int h = (int)(k % 2);
      for (int s = 0; s < 2; ++s) {
        const uint8_t* qs = b + 4 + 8 * (2 * h + s);
        for (int j = 0; j < 8; ++j) {
          o.w[16 * s + j] = kE2M1x2[qs[j] & 0x0f];
          o.w[16 * s + 8 + j] = kE2M1x2[qs[j] >> 4];
        }
        o.sc[s] = ue4m3_half(b[2 * h + s]);
      }
      break;
    }
    case DType::INT4_G128: {
      const uint8_t* b = row + (k / 4) * 66;
      split_nibbles(b + 2 + 16 * (k % 4), code);
      for (int i = 0; i < 32; ++i) o.w[i] = (int8_t)(code[i] - 8);
      o.sc[0] = o.sc[1] = f16_at(b);
      break;
    }
    case DType::INT8_COL: {
      const uint8_t* b = row + (k / 4) * 132;
      std::memcpy(o.w, b + 4 + 32 * (k % 4), 32);
      float d;
      std::memcpy(&d, b, 4);
      o.sc[0] = o.sc[1] = d;
      break;
    }
    default:
      fail("decode_i16_sub: {} is not an int8-activation format", dtype_traits(t).name);
  }
}

namespace {

// acc + the contribution of sub-block k, lane by lane (see qmatmul.h). The
// integer sums come first in their own loop (which the compiler vectorises),
// then the eight lanes' f32 steps.
void contrib(DType t, const I16Sub& sub, const int16_t* xq, const float* xd, int64_t k, float acc[8]) {
  const int16_t* x = xq + 32 * k;
  int32_t lo[8], hi[8];
  for (int l = 0; l < 8; ++l) {
    lo[l] = (int32_t)sub.w[2 * l] * x[2 * l] + (int32_t)sub.w[2 * l + 1] * x[2 * l + 1];
    hi[l] = (int32_t)sub.w[16 + 2 * l] * x[16 + 2 * l] + (int32_t)sub.w[17 + 2 * l] * x[17 + 2 * l];
  }
  if (sub.int_scales) {
    // The premultiplied codes isc * w: their lane sums are isc0 * lo + isc1 * hi.
    const float s0 = sub.d * xd[k];
    for (int l = 0; l < 8; ++l) acc[l] = std::fma((float)(sub.isc[0] * lo[l] + sub.isc[1] * hi[l]), s0, acc[l]);
    return;
  }
  const float s0 = sub.sc[0] * xd[k];
  if (t == DType::NVFP4) {
    const float s1 = sub.sc[1] * xd[k];
    for (int l = 0; l < 8; ++l) acc[l] = std::fma((float)lo[l], s0, acc[l]);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma((float)hi[l], s1, acc[l]);
  } else {
    for (int l = 0; l < 8; ++l) acc[l] = std::fma((float)(lo[l] + hi[l]), s0, acc[l]);
  }
}

}  // namespace

namespace {

// The kernel for one input over a row already decoded into subs[0..nb).
float dot_decoded(DType t, const I16Sub* subs, const QuantizedActs& A, int64_t ti) {
  const int16_t* xq = A.q_row(ti);
  const float* xd = A.d_row(ti);
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  // The mins of the group of sub-blocks k0 .. k0 + n - 1, lane l taking
  // sub-block k0 + l (qmatmul.h).
  const bool mins = subs[0].has_min;
  auto group_mins = [&](int64_t k0, int64_t n) {
    for (int64_t l = 0; l < n; ++l) acc[l] = std::fma(subs[k0 + l].mn, A.sum_row(ti)[k0 + l], acc[l]);
  };
  int64_t k = 0;
  // Sub-blocks in pairs: a pair is summed from zero, then added (as the AVX2
  // kernel does to shorten its dependency chain); an odd last one directly.
  for (; k + 2 <= A.nb; k += 2) {
    float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    contrib(t, subs[k], xq, xd, k, tmp);
    contrib(t, subs[k + 1], xq, xd, k + 1, tmp);
    for (int l = 0; l < 8; ++l) acc[l] += tmp[l];
    if (mins && (k + 2) % 8 == 0) group_mins(k + 2 - 8, 8);
  }
  if (k < A.nb) contrib(t, subs[k], xq, xd, k, acc);
  if (mins && A.nb % 8 != 0) group_mins(A.nb - A.nb % 8, A.nb % 8);
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

void decode_row(DType t, const uint8_t* row, int64_t nb, std::vector<I16Sub>& subs) {
  if (subs.size() < (size_t)nb) subs.resize((size_t)nb);
  for (int64_t k = 0; k < nb; ++k) decode_i16_sub(t, row, k, subs[(size_t)k]);
}

}  // namespace

// Each row is decoded once and reused for every input; the per-output
// arithmetic is dot_decoded's whatever n_x.
void matmul_rows_i16_ref(const MatView& W, const QuantizedActs& A, float* Y, int64_t ldy, int64_t row_begin,
                         int64_t row_end) {
  thread_local std::vector<I16Sub> subs;
  for (int64_t j = row_begin; j < row_end; ++j) {
    decode_row(W.type, W.row(j), A.nb, subs);
    for (int64_t t = 0; t < A.n_x; ++t) Y[t * ldy + j] = dot_decoded(W.type, subs.data(), A, t);
  }
}

}  // namespace megakern
