// AVX2 versions of the gated GLU activations (kernels/cpu/ops.h): exp from a
// range reduction to [-ln2/2, ln2/2] and a degree-6 polynomial (Cephes'
// coefficients), tanh from an odd polynomial near zero and from exp further
// out. Inputs are clamped so exp never overflows; the tail of a range that is
// not a multiple of 8 goes through the same vector code on a padded copy, so a
// value's result never depends on its place in the range.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace megakern {
namespace {

inline __m256 exp_ps(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
  // n = round(x / ln2); r = x - n ln2 in two parts for accuracy.
  const __m256 fx = _mm256_round_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  const __m256 z = _mm256_mul_ps(r, r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, z, _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  // 2^n through the exponent field (n >= -127: 2^-127 becomes 0, harmless here).
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  // Below -87 the result (under 1.7e-38) is returned as 0: from -87.34 to
  // -87.68 it would be a subnormal, and in a softmax over widely spread
  // scores (a peaked attention head) every multiply with such a weight runs
  // at a fraction of the normal speed (a 128-row attention block with
  // scores spread over hundreds: 11.5 ms, 8.3 ms flushed, the same outputs).
  // Such a weight is below 2^-125 of the row's largest, which is 1.
  return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), _mm256_cmp_ps(x, _mm256_set1_ps(-87.f), _CMP_GE_OQ));
}

inline __m256 sigmoid_ps(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

inline __m256 tanh_ps(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256 ax = _mm256_andnot_ps(sign, x);
  // |x| < 0.625: x + x^3 P(x^2).
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
  // Otherwise 1 - 2 / (e^{2|x|} + 1), with the sign of x.
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 e = exp_ps(_mm256_add_ps(ax, ax));
  const __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.f), _mm256_add_ps(e, one)));
  const __m256 big_signed = _mm256_or_ps(big, _mm256_and_ps(sign, x));
  return _mm256_blendv_ps(big_signed, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
}

template <GluKind K>
inline __m256 act8(__m256 a, __m256 b) {
  if constexpr (K == GluKind::SiLU) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), a));
    return _mm256_mul_ps(_mm256_div_ps(a, _mm256_add_ps(_mm256_set1_ps(1.f), e)), b);
  } else if constexpr (K == GluKind::GeluTanh) {
    const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(a, a), a);
    const __m256 inner = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                                       _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, a));
    const __m256 t = _mm256_add_ps(_mm256_set1_ps(1.f), tanh_ps(inner));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), a), t), b);
  } else if constexpr (K == GluKind::Sigmoid) {
    return _mm256_mul_ps(b, sigmoid_ps(a));
  } else if constexpr (K == GluKind::SwiGluOai) {
    const __m256 lim = _mm256_set1_ps(kSwiGluOaiLimit);
    const __m256 x = _mm256_min_ps(a, lim);
    const __m256 y = _mm256_max_ps(_mm256_min_ps(b, lim), _mm256_sub_ps(_mm256_setzero_ps(), lim));
    const __m256 sx = sigmoid_ps(_mm256_mul_ps(_mm256_set1_ps(kSwiGluOaiAlpha), x));
    return _mm256_mul_ps(_mm256_mul_ps(x, sx), _mm256_add_ps(y, _mm256_set1_ps(1.f)));
  } else {
    const __m256 tg = _mm256_mul_ps(_mm256_set1_ps(4.f), tanh_ps(_mm256_mul_ps(a, _mm256_set1_ps(0.25f))));
    const __m256 tu = _mm256_mul_ps(_mm256_set1_ps(25.f), tanh_ps(_mm256_div_ps(b, _mm256_set1_ps(25.f))));
    return _mm256_mul_ps(_mm256_mul_ps(tg, sigmoid_ps(a)), tu);
  }
}

// o[i..i+8) = f(a[i..i+8), b[i..i+8)) over [0, n); the tail goes through
// f on zero-padded copies, so a value's result never depends on where the
// range ends. o may alias a or b.
template <class F>
inline void map8(const float* a, const float* b, float* o, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, f(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  if (i < n) {
    alignas(32) float at[8] = {}, bt[8] = {}, ot[8];
    std::copy(a + i, a + n, at);
    std::copy(b + i, b + n, bt);
    _mm256_store_ps(ot, f(_mm256_load_ps(at), _mm256_load_ps(bt)));
    std::copy(ot, ot + (n - i), o + i);
  }
}

template <GluKind K>
void glu_range(const float* g, const float* u, float gs, float us, float* o, int64_t n) {
  const __m256 vgs = _mm256_set1_ps(gs), vus = _mm256_set1_ps(us);
  map8(g, u, o, n, [&](__m256 a, __m256 b) { return act8<K>(_mm256_mul_ps(vgs, a), _mm256_mul_ps(vus, b)); });
}

}  // namespace

void glu_act_avx2(GluKind k, const float* g, const float* u, float gs, float us, float* o, int64_t n) {
  switch (k) {
    case GluKind::SiLU: glu_range<GluKind::SiLU>(g, u, gs, us, o, n); break;
    case GluKind::GeluTanh: glu_range<GluKind::GeluTanh>(g, u, gs, us, o, n); break;
    case GluKind::SiTU: glu_range<GluKind::SiTU>(g, u, gs, us, o, n); break;
    case GluKind::Sigmoid: glu_range<GluKind::Sigmoid>(g, u, gs, us, o, n); break;
    case GluKind::SwiGluOai: glu_range<GluKind::SwiGluOai>(g, u, gs, us, o, n); break;
  }
}

void softmax_inplace_avx2(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  const __m256 vmx = _mm256_set1_ps(mx);
  map8(x, x, x, n, [&](__m256 v, __m256) { return exp_ps(_mm256_sub_ps(v, vmx)); });
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += x[j];
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) x[j] *= inv;
}

void softmax_rows_avx2(float* const* x, const int64_t* n, int count) {
  MK_CHECK(count >= 0 && count <= 4, "softmax_rows: {} rows (at most 4)", count);
  int64_t longest = 0;
  for (int r = 0; r < count; ++r) {
    if (n[r] <= 0) continue;
    longest = std::max(longest, n[r]);
    // The maximum eight lanes at a time: max is exact, and vmaxps keeps its
    // second operand when the first is NaN, as std::max(mx, v) keeps mx (the
    // sign of a zero maximum may differ, which the exp below cannot see).
    __m256 m = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n[r]; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x[r] + i), m);
    float mx = -INFINITY;
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    for (float v : lanes) mx = std::max(mx, v);
    for (; i < n[r]; ++i) mx = std::max(mx, x[r][i]);
    const __m256 vmx = _mm256_set1_ps(mx);
    map8(x[r], x[r], x[r], n[r], [&](__m256 v, __m256) { return exp_ps(_mm256_sub_ps(v, vmx)); });
  }
  // The rows' sums side by side, one double lane each, every lane adding its
  // row's values in order (a row shorter than the longest adds +0.0, which
  // leaves a sum of non-negative values unchanged): four dependency chains
  // in flight instead of one.
  __m256d sum = _mm256_setzero_pd();
  int64_t j = 0;
  if (count == 4) {
    // Four positions of the four rows at a time, transposed in registers.
    const int64_t common = std::min(std::min(n[0], n[1]), std::min(n[2], n[3]));
    for (; j + 4 <= common; j += 4) {
      __m128 c0 = _mm_loadu_ps(x[0] + j), c1 = _mm_loadu_ps(x[1] + j), c2 = _mm_loadu_ps(x[2] + j),
             c3 = _mm_loadu_ps(x[3] + j);
      _MM_TRANSPOSE4_PS(c0, c1, c2, c3);  // c_t: position j + t of rows 0..3
      sum = _mm256_add_pd(sum, _mm256_cvtps_pd(c0));
      sum = _mm256_add_pd(sum, _mm256_cvtps_pd(c1));
      sum = _mm256_add_pd(sum, _mm256_cvtps_pd(c2));
      sum = _mm256_add_pd(sum, _mm256_cvtps_pd(c3));
    }
  }
  for (; j < longest; ++j) {
    float v[4];
    for (int r = 0; r < 4; ++r) v[r] = r < count && j < n[r] ? x[r][j] : 0.f;
    sum = _mm256_add_pd(sum, _mm256_cvtps_pd(_mm_setr_ps(v[0], v[1], v[2], v[3])));
  }
  alignas(32) double sums[4];
  _mm256_store_pd(sums, sum);
  for (int r = 0; r < count; ++r) {
    if (n[r] <= 0) continue;
    const float inv = static_cast<float>(1.0 / sums[r]);
    for (int64_t j = 0; j < n[r]; ++j) x[r][j] *= inv;
  }
}

void softcap_avx2(float* x, int64_t n, float cap, float scale) {
  const float inv_cap = 1.f / cap;
  const __m256 vcap = _mm256_set1_ps(cap), vscale = _mm256_set1_ps(scale), vinv = _mm256_set1_ps(inv_cap);
  map8(x, x, x, n,
       [&](__m256 v, __m256) { return _mm256_mul_ps(vcap, tanh_ps(_mm256_mul_ps(_mm256_mul_ps(v, vscale), vinv))); });
}

}  // namespace megakern
