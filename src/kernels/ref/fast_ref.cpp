// Scalar reference of the fast-mode matrix kernel (kernels/cpu/qmatmul_fast.h
// states the arithmetic). It is the portable path of matmul_rows in the fast
// mode and the bit-exact oracle of the AVX2 kernel: it computes each integer
// sum directly from the signed weights, as the contract writes it.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/qmatmul_fast.h"
#include "kernels/ref/i16_ref.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace megakern {
namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// A 256-element K-quant block as the fast contract sees it: signed weights,
// integer group scales (group size G), the f32 super-block scale d and, for
// formats with mins, the integer mins of the 32-element groups and -dmin.
struct KBlock {
  int8_t w[256];
  int32_t sc[16];
  int32_t m[8];
  int group = 32;
  float d = 0, nmin = 0;
  bool has_min = false;
};

void decode_k_block(DType t, const uint8_t* b, KBlock& o) {
  switch (t) {
    case DType::Q4_K: {
      o.group = 32;
      o.has_min = true;
      o.d = f16_at(b);
      o.nmin = -f16_at(b + 2);
      const uint8_t* s = b + 4;
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        k_scale_min(s, j, sc, m);
        o.sc[j] = sc;
        o.m[j] = m;
        const uint8_t* q = b + 16 + 32 * (j / 2);
        for (int i = 0; i < 32; ++i) o.w[32 * j + i] = (int8_t)(j % 2 ? q[i] >> 4 : q[i] & 0x0f);
      }
      break;
    }
    case DType::Q5_K: {  // Q4_K's scales and nibbles plus a fifth bit per element (qh)
      o.group = 32;
      o.has_min = true;
      o.d = f16_at(b);
      o.nmin = -f16_at(b + 2);
      const uint8_t* s = b + 4;
      const uint8_t* qh = b + 16;
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        k_scale_min(s, j, sc, m);
        o.sc[j] = sc;
        o.m[j] = m;
        const uint8_t* q = b + 48 + 32 * (j / 2);
        for (int i = 0; i < 32; ++i)
          o.w[32 * j + i] = (int8_t)((j % 2 ? q[i] >> 4 : q[i] & 0x0f) | (((qh[i] >> j) & 1) << 4));
      }
      break;
    }
    case DType::IQ4_XS: {  // IQ4_NL's table per 32 elements under signed 6-bit scales
      static constexpr int8_t kTable[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
      o.group = 32;
      o.has_min = false;
      o.d = f16_at(b);
      uint16_t sh;
      std::memcpy(&sh, b + 2, 2);
      for (int j = 0; j < 8; ++j) {
        o.sc[j] = (((b[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | (((sh >> (2 * j)) & 3) << 4)) - 32;
        const uint8_t* q = b + 8 + 16 * j;
        for (int i = 0; i < 16; ++i) {
          o.w[32 * j + i] = kTable[q[i] & 0x0f];
          o.w[32 * j + 16 + i] = kTable[q[i] >> 4];
        }
      }
      break;
    }
    case DType::Q6_K: {
      o.group = 16;
      o.has_min = false;
      o.d = f16_at(b + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      for (int g = 0; g < 16; ++g) o.sc[g] = sc[g];
      for (int e = 0; e < 256; ++e) {
        const int h = e / 128, j = (e % 128) / 32, i = e % 32;
        const uint8_t* ql = b + 64 * h + (j % 2) * 32;
        const uint8_t* qh = b + 128 + 32 * h;
        const int lo = j >= 2 ? ql[i] >> 4 : ql[i] & 0x0f;
        const int hi = (qh[i] >> (2 * j)) & 3;
        o.w[e] = (int8_t)((lo | (hi << 4)) - 32);
      }
      break;
    }
    default:
      fail("fast kernel: {} is not a K-quant format", dtype_traits(t).name);
  }
}

float dot_k_row(DType t, const uint8_t* row, const Q8Acts& A, int64_t ti) {
  const int8_t* q = A.q_row(ti);
  const float* dx = A.d_row(ti);
  const size_t bytes = dtype_traits(t).block_bytes;
  float acc = 0.f;
  KBlock kb;
  for (int64_t k = 0; k < A.nb; ++k) {
    decode_k_block(t, row + k * bytes, kb);
    const int8_t* qk = q + 256 * k;
    int32_t isum = 0, msum = 0;
    for (int g = 0; g < 256 / kb.group; ++g) {
      int32_t s = 0, sq = 0;
      for (int i = g * kb.group; i < (g + 1) * kb.group; ++i) {
        s += (int32_t)kb.w[i] * qk[i];
        sq += qk[i];
      }
      isum += kb.sc[g] * s;
      if (kb.has_min) msum += kb.m[g] * sq;
    }
    acc = std::fma((float)isum, kb.d * dx[k], acc);
    if (kb.has_min) acc = std::fma((float)msum, kb.nmin * dx[k], acc);
  }
  return acc;
}

float dot_32_row(DType t, const uint8_t* row, const Q8Acts& A, int64_t ti) {
  const int8_t* q = A.q_row(ti);
  const float* dx = A.d_row(ti);
  const float* sx = A.sx_row(ti);
  const bool two = t == DType::NVFP4 || t == DType::Q3_K;
  float accs[2] = {0.f, 0.f};  // even and odd blocks
  I16Sub sub;
  for (int64_t k = 0; k < A.nb; ++k) {
    float& acc = accs[k % 2];
    decode_i16_sub(t, row, k, sub);
    const int8_t* qk = q + 32 * k;
    int32_t lo = 0, hi = 0;
    for (int i = 0; i < 16; ++i) lo += (int32_t)sub.w[i] * qk[i];
    for (int i = 16; i < 32; ++i) hi += (int32_t)sub.w[i] * qk[i];
    if (two) {
      acc = std::fma((float)lo, sub.sc[0] * dx[k], acc);
      acc = std::fma((float)hi, sub.sc[1] * dx[k], acc);
    } else {
      acc = std::fma((float)(lo + hi), sub.sc[0] * dx[k], acc);
    }
    if (sub.has_min) acc = std::fma(sub.mn, sx[k], acc);
  }
  return accs[0] + accs[1];
}

}  // namespace

void matmul_rows_fast_ref(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t row_begin,
                          int64_t row_end) {
  MK_CHECK(A.block == fast_act_block(W.type) && A.cols == W.cols);
  const bool k_quant = A.block == 256;
  for (int64_t j = row_begin; j < row_end; ++j)
    for (int64_t t = 0; t < A.n_x; ++t)
      Y[t * ldy + j] = k_quant ? dot_k_row(W.type, W.row(j), A, t) : dot_32_row(W.type, W.row(j), A, t);
}

}  // namespace megakern
