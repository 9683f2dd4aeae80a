#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/registry.h"

namespace megakern {
namespace {

// Attention residuals: the sublayer input is a softmax mixture of the first
// n_blocks blocks (the embedding, the finished blocks and the running
// prefix). Block i is scored by its dot with the learned query w, divided by
// its RMS:
//   score_i = (v_i . w) * rsqrt(mean(v_i^2) + eps),  p = softmax(score),
//   out = sum_i p_i v_i     (sums in block order).
template <class K>
void attn_res_mix_tile(const Op& op, const StepContext& ctx, int r, int) {
  const auto& a = op.as<ops::AttnResMix>();
  const int H = width_of(ctx, op.out), n = a.n_blocks;
  const float* blocks = row_of(ctx, op.in, r);  // [n_blocks][H]
  float* out = row_of(ctx, op.out, r);
  thread_local std::vector<float> score;
  score.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const float* v = blocks + static_cast<size_t>(i) * H;
    double ss = 0;
    for (int j = 0; j < H; ++j) ss += static_cast<double>(v[j]) * v[j];
    const float inv_rms = static_cast<float>(1.0 / std::sqrt(ss / H + a.eps));
    score[static_cast<size_t>(i)] = K::dot(v, a.query.data(), H) * inv_rms;
  }
  K::softmax(score.data(), n);
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(H));
  for (int i = 0; i < n; ++i) K::axpy(score[static_cast<size_t>(i)], blocks + static_cast<size_t>(i) * H, out, H);
}

void attn_res_add_tile(const Op& op, const StepContext& ctx, int r, int) {
  const auto& a = op.as<ops::AttnResAdd>();
  const int H = width_of(ctx, op.in);
  const float* in = row_of(ctx, op.in, r);
  float* dst = row_of(ctx, op.out, r) + static_cast<size_t>(a.block) * H;
  if (a.overwrite)
    std::memcpy(dst, in, sizeof(float) * static_cast<size_t>(H));
  else
    for (int j = 0; j < H; ++j) dst[j] += in[j];
}

void tap_tile(const Op& op, const StepContext& ctx, int t, int) {
  if (!ctx.taps) return;
  const auto& a = op.as<ops::Tap>();
  const int w = a.width > 0 ? a.width : width_of(ctx, op.in);
  std::memcpy(ctx.taps + static_cast<size_t>(t) * static_cast<size_t>(ctx.program->tap_width) + a.offset,
              row_of(ctx, op.in, t) + a.src, sizeof(float) * static_cast<size_t>(w));
}

}  // namespace

extern const OpInfo kAttnResMixOp = {
    .name = "attn_res_mix",
    .small_weights = [](const Op& op) { return op.as<ops::AttnResMix>().query; },
    .verify = [](const Op& op, const VerifyContext& v) {
      const auto& a = op.as<ops::AttnResMix>();
      MK_CHECK(op.in >= 0 && a.query.size() == static_cast<size_t>(v.width(op.out)) && a.n_blocks >= 1 &&
                   a.n_blocks * v.width(op.out) <= v.width(op.in),
               "{}: {} blocks of {} from a slot of {}", v.where, a.n_blocks, v.width(op.out), v.width(op.in));
    },
    .ref = attn_res_mix_tile<RefKernels>,
    .fast = attn_res_mix_tile<FastKernels>,
};

extern const OpInfo kAttnResAddOp = {
    .name = "attn_res_add",
    .reads_out = [](const Op& op) { return !op.as<ops::AttnResAdd>().overwrite; },
    .verify = [](const Op& op, const VerifyContext& v) {
      const auto& a = op.as<ops::AttnResAdd>();
      MK_CHECK(op.in >= 0 && a.block >= 0 && (a.block + 1) * v.width(op.in) <= v.width(op.out),
               "{}: block {} of {} in a slot of {}", v.where, a.block, v.width(op.in), v.width(op.out));
    },
    .ref = attn_res_add_tile,
    .fast = attn_res_add_tile,
};

extern const OpInfo kTapOp = {
    .name = "tap",
    .verify = [](const Op& op, const VerifyContext& v) {
      const auto& a = op.as<ops::Tap>();
      const int w = op.in < 0 ? 0 : a.width > 0 ? a.width : v.width(op.in);
      MK_CHECK(op.in >= 0 && op.out < 0 && a.src >= 0 && a.width >= 0 && a.src + w <= v.width(op.in),
               "{}: tap of columns [{}, {}) of a slot of {}", v.where, a.src, a.src + w,
               op.in >= 0 ? v.width(op.in) : 0);
      MK_CHECK(a.offset >= 0 && a.offset + w <= v.p.tap_width, "{}: tap columns [{}, {}) outside the tap row of {}",
               v.where, a.offset, a.offset + w, v.p.tap_width);
    },
    .ref = tap_tile,
    .fast = tap_tile,
};

}  // namespace megakern
