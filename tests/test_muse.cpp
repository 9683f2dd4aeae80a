// Muse Spark: preset sizes, the quantisers against their definitions, the MoE
// and gate kernels, and the muse-spark-mini model under every executor.
//
// Agreement with the plain NumPy reference (scripts/fixtures/muse_numpy_ref.py,
// float64, fixture tests/fixtures/muse_mini/: bf16 dense, int4_g128 experts):
// logits of a 24-token decode, max |diff| / max |ref| over the used
// vocabulary, within 1e-5 for the reference executor (f32 maths on the
// exact weights; measured 1.2e-6) and 3e-4 for op-by-op and mega (whose int4
// products quantise activations to int16 per 32 values; measured 1.0e-4). Megakernel and op-by-op agree bit for
// bit, at every batch size, with rows at different positions, and a row's
// logits do not depend on its batch mates, on being part of a multi-row
// (prefill) block, or on the ring KV cache.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "exec/executor.h"
#include "ops/moe.h"
#include "ops/norm.h"
#include "exec/op_kernels.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/muse.h"
#include "sharded_checkpoint.h"
#include "test_util.h"
#include "model_state.h"

namespace megakern {
namespace {

namespace fs = std::filesystem;

const std::string& mini_dir() {
  static const std::string d = fixture_path("muse_mini");
  return d;
}

const nlohmann::json& reference() { return fixture_json("muse_mini/reference.json"); }

const MuseModel& fixture_model() {
  static const std::unique_ptr<MuseModel> m = MuseModel::load(mini_dir());
  return *m;
}

const MuseConfig& mini_config() { return *find_muse_preset("muse-spark-mini"); }

// A synthetic mini model per (dense, experts) format pair, built once.
const MuseModel& synthetic_mini(DType dense, DType experts) {
  static std::map<std::pair<DType, DType>, std::unique_ptr<MuseModel>> cache;
  auto& m = cache[{dense, experts}];
  if (!m) m = MuseModel::synthetic(mini_config(), 7, dense, experts);
  return *m;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Decodes tokens with `block` rows per step (one sequence), returns logits [T][V].
std::vector<float> decode(const MuseModel& m, Executor& ex, const std::vector<int32_t>& tokens, KVCache& cache,
                          int block = 1) {
  const int V = m.n_vocab();
  std::vector<float> logits(tokens.size() * static_cast<size_t>(V));
  for (size_t t0 = 0; t0 < tokens.size(); t0 += static_cast<size_t>(block)) {
    std::vector<RowInput> rows;
    for (size_t t = t0; t < std::min(tokens.size(), t0 + static_cast<size_t>(block)); ++t)
      rows.push_back({tokens[t], static_cast<int32_t>(t), &cache, nullptr});
    ex.step(rows, &logits[t0 * static_cast<size_t>(V)]);
  }
  return logits;
}

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return t;
}

// ---------------------------------------------------------------------------
// Presets

TEST(MuseConfig, PresetSizes) {
  const MuseConfig* full = find_muse_preset("muse-spark-1.2");
  ASSERT_NE(full, nullptr);
  EXPECT_EQ(full->n_full_layers(), 16);  // l = 1, 5, ..., 61
  EXPECT_TRUE(full->is_full_attention(1));
  EXPECT_FALSE(full->is_full_attention(0));
  const MuseParamCount pc = parameter_count(*full);
  // By hand (muse_config.cpp) from the reference's shapes (musespark/config.py):
  // H = 8192, 62 layers, E = 256, F = D = 4096, the attention gate [qd][H].
  const int64_t L = 62, H = 8192, E = 256, F = 4096, D = 4096, V = 202048;
  EXPECT_EQ(pc.embedding, V * H);
  EXPECT_EQ(pc.attention, L * (3 * H * H + 2 * 1024 * H));
  EXPECT_EQ(pc.experts, L * E * 3 * F * D);
  EXPECT_EQ(pc.total(), 819'990'599'680);
  EXPECT_EQ(pc.active, 46'091'133'904);
  // The checkpoint's name, Muse-Spark-1.2-816B-A42B (musespark/quant.py),
  // counts without the embedding and the LM head.
  const int64_t io = pc.embedding + pc.lm_head;
  EXPECT_EQ(pc.total() - io, 816'680'245'248);
  EXPECT_EQ(pc.active - io, 42'780'779'472);
  EXPECT_EQ((pc.total() - io) / 1'000'000'000, 816);
  EXPECT_EQ((pc.active - io) / 1'000'000'000, 42);
  // The reference's constants (musespark/config.py Config).
  EXPECT_EQ(full->vocab_used, 201818);
  EXPECT_EQ(full->rms_eps, 1e-5);
  EXPECT_EQ(full->post_eps, 1e-8);
  EXPECT_EQ(full->route_eps, 1e-15);
  EXPECT_NEAR(full->softmax_scale(), 5.4730064863875 / 8.0, 1e-15);
  // BOS 200000, EOS 200001 / 200008 and pad 200018 stay emittable.
  for (int id : {200000, 200001, 200008, 200018}) EXPECT_LT(id, full->vocab_used);
  // int4_g128: 66 bytes per 128 values; 8 of 256 experts read per layer.
  const int64_t step = weight_bytes_per_step(*full, DType::BF16, DType::INT4_G128);
  EXPECT_EQ(step - weight_bytes_per_step(*full, DType::BF16, DType::F32),
            L * 8 * 3 * F * D / 128 * 66 - L * 8 * 3 * F * D * 4);
  EXPECT_EQ(kv_bytes_per_token(*full, 2), L * 2 * 16 * 64 * 2);

  const MuseConfig* bench = find_muse_preset("muse-spark-bench");
  ASSERT_NE(bench, nullptr);
  EXPECT_EQ(bench->n_layer, 62);
  EXPECT_GE(weight_bytes_per_step(*bench, DType::BF16, DType::INT4_G128), 320'000'000);
  EXPECT_GE(weight_bytes_per_step(*bench, DType::INT8_COL, DType::INT4_G128), 320'000'000);
  EXPECT_LT(weight_bytes_total(*bench, DType::BF16, DType::NVFP4), 4LL << 30);

  const MuseConfig& mini = mini_config();
  EXPECT_GE(mini.vocab, 256);
  EXPECT_EQ(mini.n_full_layers(), 1);
  const std::string d = describe(*full);
  EXPECT_NE(d.find("819,990,599,680"), std::string::npos);
  EXPECT_NE(d.find("816,680,245,248"), std::string::npos);
  EXPECT_NE(d.find("active per token"), std::string::npos);
  EXPECT_NE(d.find("nvfp4"), std::string::npos);

  MuseConfig bad = mini;
  bad.top_k = bad.n_expert + 1;
  EXPECT_THROW(bad.validate(), Error);
  bad = mini;
  bad.expert_ff = 100;
  EXPECT_THROW(bad.validate(), Error);
}

// ---------------------------------------------------------------------------
// Quantisers against their definitions

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

TEST(MuseQuant, Int4G128MatchesDefinition) {
  // musespark/quant.py quantize_int4_np: scale = bf16(absmax * f32(1/7)),
  // q = round-half-even(x * f32(1/scale)) clipped to [-8, 7].
  std::vector<float> x = random_values(4 * 128, 1, 0.05f);
  // One group with exact halves: absmax 7 gives scale 1, so x / d = x.
  for (int i = 0; i < 128; ++i) x[128 + static_cast<size_t>(i)] = (i % 15) - 7 + ((i % 3 == 0) ? 0.5f : 0.f);
  x[128] = 7.f;
  // A group whose absmax / 7 is not a bf16 value: 0.3 / 7 rounds to
  // 0.04296875 in bf16 but 0.04284668 in f16, so the two scales differ.
  for (int i = 0; i < 128; ++i) x[256 + static_cast<size_t>(i)] = 0.3f * static_cast<float>(i % 9 - 4) / 4.f;
  const auto& tr = dtype_traits(DType::INT4_G128);
  std::vector<uint8_t> q(row_bytes(DType::INT4_G128, static_cast<int64_t>(x.size())));
  tr.quantize(x.data(), q.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(x.size());
  tr.dequantize(q.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t g = 0; g < x.size() / 128; ++g) {
    float amax = 0;
    for (size_t i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(x[g * 128 + i]));
    const float d = bf16_to_f32(f32_to_bf16(amax * (1.f / 7.f)));
    ASSERT_EQ(f16_to_f32(f32_to_f16(d)), d) << "the bf16 scale is exact in f16";
    for (size_t i = 0; i < 128; ++i) {
      const float xi = x[g * 128 + i];
      const float qi = std::clamp(std::nearbyint(xi * (1.f / d)), -8.f, 7.f);  // default rounding: half to even
      ASSERT_EQ(y[g * 128 + i], qi * d) << "group " << g << " element " << i << " x " << xi;
    }
  }
  EXPECT_EQ(y[256 + 8], 0.04296875f * 7.f);  // x = 0.3: the bf16 scale, not the f16 one
  // The exact halves went to even.
  auto decoded = [&](float v) {
    for (size_t i = 128; i < 256; ++i)
      if (x[i] == v) return y[i];
    return NAN;
  };
  EXPECT_EQ(decoded(2.5f), 2.f);
  EXPECT_EQ(decoded(-6.5f), -6.f);
  EXPECT_EQ(decoded(-0.5f), 0.f);
  EXPECT_EQ(decoded(-3.5f), -4.f);
  EXPECT_EQ(decoded(5.5f), 6.f);
}

TEST(MuseQuant, Nvfp4MatchesDefinition) {
  // musespark/quant.py quantize_nvfp4_np: per 16 values an e4m3 scale s =
  // e4m3(absmax / 6) clamped to [2^-9, 448], rounded to nearest (ties to
  // even); values e2m1(x / s) to the nearest of {0, .5, 1, 1.5, 2, 3, 4, 6}
  // (signed), ties to the even code, above 6 clipped. With a global scale
  // g = absmax / (448 * 6) applied outside the block format.
  std::vector<float> x = random_values(8 * 64, 2, 3.f);
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float g = amax / (448.f * 6.f);
  std::vector<float> xs(x.size());
  for (size_t i = 0; i < x.size(); ++i) xs[i] = x[i] / g;
  // A sub-block of exact ties at scale 1 (absmax 6): each value sits halfway
  // between two codes and goes to the even one.
  const float ties[16] = {6.f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f, -0.25f, -0.75f, -1.25f, -1.75f, -2.5f, -3.5f, -5.f, 0.f};
  std::copy(ties, ties + 16, xs.begin() + 64);
  // A sub-block whose absmax / 6 rounds down to an e4m3 value (6.3 / 6 =
  // 1.05 -> 1.0), so its largest value clips to 6 * 1.0.
  for (int i = 0; i < 16; ++i) xs[80 + static_cast<size_t>(i)] = i == 0 ? 6.3f : 0.1f * static_cast<float>(i);
  const auto& tr = dtype_traits(DType::NVFP4);
  std::vector<uint8_t> q(row_bytes(DType::NVFP4, static_cast<int64_t>(x.size())));
  tr.quantize(xs.data(), q.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(x.size());
  tr.dequantize(q.data(), y.data(), static_cast<int64_t>(x.size()));
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (size_t b = 0; b < x.size() / 64; ++b)
    for (size_t s = 0; s < 4; ++s) {
      const uint8_t sb = q[b * 36 + s];
      const float sc = fp8_e4m3_to_f32(sb);
      float sub_max = 0;
      for (size_t i = 0; i < 16; ++i) sub_max = std::max(sub_max, std::fabs(xs[b * 64 + s * 16 + i]));
      const float want = std::clamp(sub_max / 6.f, 0x1p-9f, 448.f);
      ASSERT_EQ(sb, f32_to_fp8_e4m3(want)) << "block " << b << " sub-block " << s;
      // Nearest: no other e4m3 value is closer to absmax / 6.
      if (sb < 0x7e) ASSERT_LE(std::fabs(sc - want), std::fabs(fp8_e4m3_to_f32(static_cast<uint8_t>(sb + 1)) - want));
      if (sb > 1) ASSERT_LE(std::fabs(sc - want), std::fabs(fp8_e4m3_to_f32(static_cast<uint8_t>(sb - 1)) - want));
      for (size_t i = 0; i < 16; ++i) {
        const size_t k = b * 64 + s * 16 + i;
        const float v = std::fabs(xs[k] / sc);
        float best = INFINITY;
        for (float gv : grid) best = std::min(best, std::fabs(gv - std::min(v, 6.f)));
        // The decoded magnitude is a nearest grid value of min(|x / s|, 6).
        ASSERT_EQ(std::fabs(std::fabs(y[k] / sc) - std::min(v, 6.f)), best) << "element " << k;
      }
    }
  const float even[16] = {6.f, 0.f, 1.f, 1.f, 2.f, 2.f, 4.f, 4.f, -0.f, -1.f, -1.f, -2.f, -2.f, -4.f, -4.f, 0.f};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(y[64 + static_cast<size_t>(i)], even[i]) << "tie " << ties[i];
  EXPECT_EQ(q[36 + 1], f32_to_fp8_e4m3(1.f));  // block 1, sub-block 1: 6.3 / 6 rounds to the scale 1.0 ...
  EXPECT_EQ(y[80], 6.f);                        // ... and 6.3 clips to 6
}

TEST(MuseQuant, Int8ColMatchesDefinition) {
  const int64_t cols = 256;
  std::vector<float> x = random_values(static_cast<size_t>(cols), 3, 1.f);
  std::vector<uint8_t> q(row_bytes(DType::INT8_COL, cols));
  dtype_traits(DType::INT8_COL).quantize(x.data(), q.data(), cols);
  std::vector<float> y(static_cast<size_t>(cols));
  dtype_traits(DType::INT8_COL).dequantize(q.data(), y.data(), cols);
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float d = amax / 127.f;
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], std::clamp(std::nearbyint(x[i] / d), -127.f, 127.f) * d);
}

// ---------------------------------------------------------------------------
// A row-major f32 matrix view of w.
MatView f32_view(const std::vector<float>& w, int64_t rows, int64_t cols) {
  MatView m;
  m.type = DType::F32;
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = static_cast<size_t>(cols) * 4;
  m.data = reinterpret_cast<const uint8_t*>(w.data());
  return m;
}

// Kernels on hand-made inputs

TEST(MuseKernels, RouteTiesAndWeights) {
  // musespark/moe.py route_from_logits: score = sigmoid(logit * scale),
  // top-k of score + bias (ties to the lowest index), weights = the unbiased
  // scores / (their sum + eps).
  DecodeProgram p;
  p.max_rows = 1;
  const int logits = p.add_slot("logits", -1, 6);
  const int route = p.add_slot("route", -1, 6);
  std::vector<float> bias = {0, 0, 0, 0.25f, 0, 0};
  Op& op = p.add_op(OpKind::MoeRoute, 0, "route");
  op.in = logits;
  op.out = route;
  op.as<ops::MoeRoute>().top_k = 3;
  op.as<ops::MoeRoute>().scale = 0.5f;
  op.as<ops::MoeRoute>().eps = 0.125f;  // large, so its place in the formula shows
  op.as<ops::MoeRoute>().bias = bias;
  std::vector<float> in = {0.f, 1.f, 1.f, -10.f, 1.f, 2.f}, out(6);
  StepContext ctx;
  ctx.program = &p;
  ctx.slot = {in.data(), out.data()};
  ctx.n_rows = 1;
  run_op_tile(p.ops[0], ctx, 0, 1);
  // score = sigmoid(0.5 logit), key = score + bias: expert 5 has 0.731;
  // experts 1, 2, 4 tie at 0.622 (the lowest indices win); expert 3's bias
  // lifts it only to 0.257, expert 0 has 0.5.
  EXPECT_EQ(out[0], 5.f);
  EXPECT_EQ(out[1], 1.f);
  EXPECT_EQ(out[2], 2.f);
  auto sig = [](float v) { return 1.f / (1.f + std::exp(-0.5f * v)); };
  const float den = sig(2.f) + sig(1.f) + sig(1.f) + 0.125f;
  EXPECT_FLOAT_EQ(out[3], sig(2.f) / den);
  EXPECT_FLOAT_EQ(out[4], sig(1.f) / den);
  EXPECT_FLOAT_EQ(out[5], sig(1.f) / den);
  // The scale inside the sigmoid changes the selection: a bias of 0.2 on
  // expert 0 (logit 0) beats expert 5 (logit 2) under 0.5 * sigmoid(logit)
  // (0.45 > 0.44) but not under sigmoid(0.5 logit) (0.70 < 0.73).
  bias = {0.2f, 0, 0, 0, 0, 0};
  op.as<ops::MoeRoute>().top_k = 1;
  run_op_tile(p.ops[0], ctx, 0, 1);
  EXPECT_EQ(out[0], 5.f);
}

// The byte ranges the megakernel prefetches after routing are exactly the
// rows of the selected experts each MoE tile reads: together the tiles of a
// step cover every selected expert's matrices once and nothing else.
TEST(MuseKernels, RoutedTileWeightsCoverTheSelectedExpertsOnce) {
  const int E = 6, K = 2, D = 8, F = 20, R = 3;
  std::vector<std::vector<float>> w(static_cast<size_t>(3 * E), std::vector<float>(static_cast<size_t>(F) * D));
  ExpertBank bank;
  bank.n_expert = E;
  bank.d_in = D;
  bank.d_ff = F;
  for (int e = 0; e < E; ++e) {
    bank.gate.push_back(f32_view(w[static_cast<size_t>(3 * e)], F, D));
    bank.up.push_back(f32_view(w[static_cast<size_t>(3 * e + 1)], F, D));
    bank.down.push_back(f32_view(w[static_cast<size_t>(3 * e + 2)], D, F));
  }
  DecodeProgram p;
  p.max_rows = R;
  const int route = p.add_slot("route", -1, 2 * K);
  // Rows select {1, 4}, {4, 2}, {5, 1}: experts 1, 2, 4, 5 are used, 0 and 3 not.
  std::vector<float> routes = {1, 4, 0.5f, 0.5f, 4, 2, 0.5f, 0.5f, 5, 1, 0.5f, 0.5f};
  StepContext ctx;
  ctx.program = &p;
  ctx.slot = {routes.data()};
  ctx.n_rows = R;
  for (OpKind kind : {OpKind::MoeGlu, OpKind::MoeDown}) {
    Op op;
    op.kind = kind;
    op.in2 = route;
    if (kind == OpKind::MoeGlu)
      op.params = ops::MoeGlu{{K, &bank}};
    else
      op.params = ops::MoeDown{{K, &bank}};
    for (int workers : {1, 2, 5}) {
      const int n = moe_tile_count(op, R, workers);
      // Bytes covered per matrix (gate, up, down of each expert).
      std::vector<size_t> covered(static_cast<size_t>(3 * E), 0);
      for (int t = 0; t < n; ++t) {
        ByteRange r[2];
        const int m = moe_tile_weights(op, ctx, t, n, r);
        size_t bytes = 0;
        for (int i = 0; i < m; ++i) {
          bytes += r[i].bytes;
          bool found = false;
          for (size_t k = 0; k < w.size(); ++k) {
            const auto* b = reinterpret_cast<const uint8_t*>(w[k].data());
            if (r[i].begin >= b && r[i].begin + r[i].bytes <= b + w[k].size() * 4) {
              covered[k] += r[i].bytes;
              found = true;
            }
          }
          EXPECT_TRUE(found) << "tile " << t << " range " << i << " outside every expert matrix";
        }
        if (m > 0) EXPECT_EQ(bytes, moe_tile_weight_bytes(op, R, t, n)) << "tile " << t;
      }
      for (int e = 0; e < E; ++e) {
        const bool used = e == 1 || e == 2 || e == 4 || e == 5;
        const size_t full = static_cast<size_t>(F) * D * 4;
        const size_t s = static_cast<size_t>(3 * e);
        if (kind == OpKind::MoeGlu) {
          EXPECT_EQ(covered[s], used ? full : 0) << "gate of expert " << e << ", " << workers << " workers";
          EXPECT_EQ(covered[s + 1], used ? full : 0) << "up of expert " << e;
          EXPECT_EQ(covered[s + 2], 0u);
        } else {
          EXPECT_EQ(covered[s], 0u);
          EXPECT_EQ(covered[s + 2], used ? full : 0) << "down of expert " << e << ", " << workers << " workers";
        }
      }
    }
  }
}

TEST(MuseKernels, ActivationsAndGates) {
  EXPECT_FLOAT_EQ(swiglu_act(1.f, 2.f), 2.f / (1.f + std::exp(-1.f)));
  const float g = 3.f, u = 30.f;
  EXPECT_NEAR(situ_act(g, u), 4 * std::tanh(g / 4) / (1 + std::exp(-g)) * 25 * std::tanh(u / 25), 1e-5);
  // gamma 0: beta = 1/2, alpha = sqrt(1/2 * 3/2); gamma -30: beta ~ 0, alpha ~ 1;
  // gamma 30: beta ~ 1 and alpha hits the 1e-3 floor.
  const std::vector<float> ab = residual_gate_coefficients({0.f, -30.f});
  EXPECT_FLOAT_EQ(ab[2], 0.5f);
  EXPECT_FLOAT_EQ(ab[0], std::sqrt(0.75f));
  EXPECT_FLOAT_EQ(ab[1], 1.f);
  EXPECT_LT(ab[3], 1e-40f);
  const std::vector<float> pos = residual_gate_coefficients({30.f});
  EXPECT_FLOAT_EQ(pos[0], std::sqrt(1e-3f));
  EXPECT_FLOAT_EQ(pos[1], 1.f);
}

// The post-FFN boundary (musespark/__init__.py decoder_layer): the FFN output
// is scaled by post_ffn_norm BEFORE the weightless post-norm, s = alpha s +
// beta n0(out * w, 1e-8). With a 2H norm the op has no input scale.
TEST(MuseKernels, GatedResidualScalesItsInputBeforeTheNorm) {
  const int n = 4;
  DecodeProgram p;
  p.max_rows = 1;
  const int in = p.add_slot("in", -1, n), out = p.add_slot("s", -1, n);
  std::vector<float> coef = {0.5f, 1.f, 2.f, 0.25f, 1.f, 0.5f, 1.f, 2.f, /*w*/ 1.f, 3.f, 0.5f, 2.f};
  Op& op = p.add_op(OpKind::GatedResidual, 0, "ffn_residual");
  op.in = in;
  op.out = out;
  op.as<ops::GatedResidual>().coef = coef;
  op.as<ops::GatedResidual>().eps = 1e-8f;
  std::vector<float> x = {1.f, -2.f, 4.f, 0.5f}, s0 = {1.f, 1.f, -1.f, 2.f};
  for (int with_scale : {1, 0}) {
    op.as<ops::GatedResidual>().coef = std::span<const float>(coef).first(static_cast<size_t>(with_scale ? 3 * n : 2 * n));
    std::vector<float> s = s0;
    StepContext ctx;
    ctx.program = &p;
    ctx.slot = {x.data(), s.data()};
    ctx.n_rows = 1;
    run_op_tile(p.ops[0], ctx, 0, 1);
    double ms = 0;
    for (int i = 0; i < n; ++i) {
      const double t = x[static_cast<size_t>(i)] * (with_scale ? coef[static_cast<size_t>(2 * n + i)] : 1.f);
      ms += t * t / n;
    }
    for (int i = 0; i < n; ++i) {
      const size_t k = static_cast<size_t>(i);
      const double t = x[k] * (with_scale ? coef[2 * n + k] : 1.f);
      const double want = coef[k] * s0[k] + coef[n + k] * t / std::sqrt(ms + 1e-8);
      EXPECT_NEAR(s[k], want, 1e-6) << "channel " << i << (with_scale ? " with" : " without") << " the input scale";
    }
  }
}

// The experts' output norm (musespark/moe.py finalize): one weight shared by
// the experts multiplies each expert's output BEFORE a weightless norm with
// eps 1e-8, then the routing weights mix them: out = sum_j w_j n0(y_j * w).
TEST(MuseKernels, ExpertOutputNormIsASharedWeightBeforeTheNorm) {
  const int D = 8, K = 2, E = 4;
  std::vector<float> zero(static_cast<size_t>(D) * D, 0.f);
  ExpertBank bank;
  bank.n_expert = E;
  bank.d_in = D;
  bank.d_ff = D;
  for (int e = 0; e < E; ++e) {
    bank.gate.push_back(f32_view(zero, D, D));
    bank.up.push_back(f32_view(zero, D, D));
    bank.down.push_back(f32_view(zero, D, D));
  }
  bank.out_norm = {1.f, 4.f, 0.5f, 2.f, 1.f, 0.25f, 3.f, 1.f};
  bank.out_norm_eps = 1e-8f;
  DecodeProgram p;
  p.max_rows = 1;
  const int y = p.add_slot("y", -1, K * D), route = p.add_slot("route", -1, 2 * K), out = p.add_slot("out", -1, D);
  Op& op = p.add_op(OpKind::MoeCombine, 0, "moe_combine");
  op.in = y;
  op.in2 = route;
  op.out = out;
  op.as<ops::MoeCombine>() = {{K, &bank}};
  std::vector<float> yv(static_cast<size_t>(K) * D), rv = {3.f, 1.f, 0.75f, 0.25f}, ov(static_cast<size_t>(D));
  for (int i = 0; i < K * D; ++i) yv[static_cast<size_t>(i)] = static_cast<float>((i * 7) % 11) - 5.f;
  StepContext ctx;
  ctx.program = &p;
  ctx.slot = {yv.data(), rv.data(), ov.data()};
  ctx.n_rows = 1;
  run_op_tile(p.ops[0], ctx, 0, 1);
  for (int d = 0; d < D; ++d) {
    double want = 0;
    for (int j = 0; j < K; ++j) {
      double ms = 0;
      for (int i = 0; i < D; ++i) {
        const double t = yv[static_cast<size_t>(j * D + i)] * bank.out_norm[static_cast<size_t>(i)];
        ms += t * t / D;
      }
      want += rv[static_cast<size_t>(K + j)] * yv[static_cast<size_t>(j * D + d)] * bank.out_norm[static_cast<size_t>(d)] /
              std::sqrt(ms + 1e-8);
    }
    EXPECT_NEAR(ov[static_cast<size_t>(d)], want, 1e-5) << "channel " << d;
  }
}

// The MoE ops with the other flags (Kimi-style: SiTU activation, no
// per-expert norm, no router bias, scale 1) on a hand-made f32 bank, run by
// every executor against a direct double-precision computation:
//   x = E[token]; route on W_r x; out = W_o sum_j w_j ds_e W_down,e situ(gs_e W_g,e x, us_e W_u,e x)
TEST(MuseKernels, MoeOpsWithSiTUAndNoNormUnderEveryExecutor) {
  const int V = 16, D = 64, F = 48, E = 6, K = 3;
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto fill = [&](size_t n, float s) {
    std::vector<float> v(n);
    for (auto& x : v) x = s * u(rng);
    return v;
  };
  const std::vector<float> table = fill(static_cast<size_t>(V) * D, 1.f), wr = fill(static_cast<size_t>(E) * D, 0.3f),
                           wo = fill(static_cast<size_t>(V) * D, 0.2f);
  std::vector<std::vector<float>> wg, wu, wd;
  ExpertBank bank;
  bank.n_expert = E;
  bank.d_in = D;
  bank.d_ff = F;
  bank.act = ExpertAct::SiTU;
  for (int e = 0; e < E; ++e) {
    wg.push_back(fill(static_cast<size_t>(F) * D, 0.3f));
    wu.push_back(fill(static_cast<size_t>(F) * D, 0.3f));
    wd.push_back(fill(static_cast<size_t>(D) * F, 0.3f));
    bank.gate_scale.push_back(1.f + 0.1f * static_cast<float>(e));
    bank.up_scale.push_back(2.f);
    bank.down_scale.push_back(0.5f);
  }
  for (int e = 0; e < E; ++e) {
    bank.gate.push_back(f32_view(wg[static_cast<size_t>(e)], F, D));
    bank.up.push_back(f32_view(wu[static_cast<size_t>(e)], F, D));
    bank.down.push_back(f32_view(wd[static_cast<size_t>(e)], D, F));
  }
  DecodeProgram p;
  p.model_name = "moe-situ";
  p.n_layer = 1;
  p.max_rows = 4;
  p.n_vocab = V;
  const int x = p.add_slot("x", -1, D), rl = p.add_slot("router_logits", -1, E), route = p.add_slot("route", -1, 2 * K);
  const int h = p.add_slot("h", -1, K * F), y = p.add_slot("y", -1, K * D), mo = p.add_slot("moe_out", -1, D);
  const int logits = p.add_slot("logits", -1, V);
  Op& emb = p.add_op(OpKind::Embed, -1, "embed");
  emb.mat = f32_view(table, V, D);
  emb.out = x;
  p.add_matmul(0, "router", f32_view(wr, E, D), x, rl);
  Op& rt = p.add_op(OpKind::MoeRoute, 0, "route");
  rt.in = rl;
  rt.out = route;
  rt.as<ops::MoeRoute>().top_k = K;
  rt.as<ops::MoeRoute>().eps = 0.f;  // weights / sum, as Kimi K3 routes
  p.add_moe_experts(0, &bank, K, route, x, h, y, mo);
  p.add_matmul(-1, "head", f32_view(wo, V, D), mo, logits);
  p.logits_slot = logits;
  p.verify();

  // Direct computation in double.
  auto direct = [&](int tok) {
    const float* xv = &table[static_cast<size_t>(tok) * D];
    std::vector<std::pair<double, int>> key;
    std::vector<double> score(E);
    for (int e = 0; e < E; ++e) {
      double l = 0;
      for (int i = 0; i < D; ++i) l += static_cast<double>(wr[static_cast<size_t>(e) * D + i]) * xv[i];
      score[static_cast<size_t>(e)] = 1 / (1 + std::exp(-l));
      key.push_back({-score[static_cast<size_t>(e)], e});
    }
    std::sort(key.begin(), key.end());
    double sum = 0;
    for (int j = 0; j < K; ++j) sum += score[static_cast<size_t>(key[static_cast<size_t>(j)].second)];
    std::vector<double> r(D, 0.0), out(V, 0.0);
    for (int j = 0; j < K; ++j) {
      const size_t e = static_cast<size_t>(key[static_cast<size_t>(j)].second);
      std::vector<double> hh(F);
      for (int f = 0; f < F; ++f) {
        double g = 0, uu = 0;
        for (int i = 0; i < D; ++i) {
          g += static_cast<double>(wg[e][static_cast<size_t>(f) * D + i]) * xv[i];
          uu += static_cast<double>(wu[e][static_cast<size_t>(f) * D + i]) * xv[i];
        }
        g *= bank.gate_scale[e];
        uu *= bank.up_scale[e];
        hh[static_cast<size_t>(f)] = 4 * std::tanh(g / 4) / (1 + std::exp(-g)) * 25 * std::tanh(uu / 25);
      }
      for (int d = 0; d < D; ++d) {
        double acc = 0;
        for (int f = 0; f < F; ++f) acc += static_cast<double>(wd[e][static_cast<size_t>(d) * F + f]) * hh[static_cast<size_t>(f)];
        r[static_cast<size_t>(d)] += score[e] / sum * bank.down_scale[e] * acc;
      }
    }
    for (int v = 0; v < V; ++v)
      for (int d = 0; d < D; ++d) out[static_cast<size_t>(v)] += static_cast<double>(wo[static_cast<size_t>(v) * D + d]) * r[static_cast<size_t>(d)];
    return out;
  };
  const std::vector<int32_t> toks = {3, 7, 3, 12};  // rows 0 and 2 share their experts
  std::vector<float> want;
  for (int32_t t : toks)
    for (double v : direct(t)) want.push_back(static_cast<float>(v));
  ThreadPool pool(2);
  std::map<std::string, std::vector<float>> got;
  for (const char* kind : {"reference", "opbyop", "mega"}) {
    auto ex = make_executor(kind, p, pool);
    std::vector<KVCache> caches(4);
    std::vector<RowInput> rows;
    for (size_t r = 0; r < 4; ++r) {
      caches[r].n_ctx = 1;
      rows.push_back({toks[r], 0, &caches[r], nullptr});
    }
    std::vector<float> out(4 * static_cast<size_t>(V));
    ex->step(rows, out.data());
    EXPECT_LE(rel_diff(out.data(), want.data(), want.size()), 1e-5) << kind;
    got[kind] = out;
  }
  EXPECT_TRUE(same_bits(got["mega"], got["opbyop"]));
}

// ---------------------------------------------------------------------------
// The model against the NumPy reference

TEST(MuseModel, LoadsFixtureAndVerifies) {
  const MuseModel& m = fixture_model();
  EXPECT_EQ(m.config().name, "muse-spark-mini");
  EXPECT_EQ(m.dense_format(), DType::BF16);
  EXPECT_EQ(m.expert_format(), DType::INT4_G128);
  // The fixture uses the preset's hyperparameters.
  const MuseConfig& p = mini_config();
  EXPECT_EQ(m.config().hidden, p.hidden);
  EXPECT_EQ(m.config().n_expert, p.n_expert);
  EXPECT_EQ(m.config().window, p.window);
  EXPECT_EQ(m.config().vocab_used, p.vocab_used);
  const DecodeProgram prog = build_muse_program(m, 4);
  const std::string d = prog.dump();
  for (const char* kind : {"moe_route", "moe_glu", "moe_down", "moe_combine", "gated_residual", "head_norm_gate",
                           "logit_softcap", "window 8"})
    EXPECT_NE(d.find(kind), std::string::npos) << kind;
  DecodeProgram broken = prog;
  for (Op& op : broken.ops)
    if (op.kind == OpKind::MoeRoute) op.as<ops::MoeRoute>().top_k = 3;  // route slot holds 2 x 2
  EXPECT_THROW(broken.verify(), std::logic_error);
  broken = prog;
  for (Op& op : broken.ops)
    if (op.kind == OpKind::GatedResidual) op.as<ops::GatedResidual>().coef = op.as<ops::GatedResidual>().coef.first(1);
  EXPECT_THROW(broken.verify(), std::logic_error);
}

TEST(MuseModel, ExecutorsMatchNumpyReference) {
  const MuseModel& m = fixture_model();
  const DecodeProgram prog = build_muse_program(m, 4);
  ThreadPool pool(3, /*oversubscribe=*/true);
  const auto tokens = reference()["tokens"].get<std::vector<int32_t>>();
  const int used = reference()["vocab_used"].get<int>();
  const int V = m.n_vocab();
  std::vector<float> ref;
  for (const auto& row : reference()["logits"])
    for (const auto& v : row) ref.push_back(v.get<float>());
  ASSERT_EQ(ref.size(), tokens.size() * static_cast<size_t>(used));
  std::map<std::string, std::vector<float>> got;
  for (const char* kind : {"reference", "opbyop", "mega"}) {
    auto ex = make_executor(kind, prog, pool);
    KVCache cache = make_cache(m, 64, 4);
    const std::vector<float> logits = decode(m, *ex, tokens, cache);
    std::vector<float> head;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const float* row = &logits[t * static_cast<size_t>(V)];
      head.insert(head.end(), row, row + used);
      for (int i = used; i < V; ++i) ASSERT_EQ(row[i], -INFINITY) << kind << " position " << t << " id " << i;
    }
    const double dl = rel_diff(head.data(), ref.data(), ref.size());
    std::printf("muse-spark-mini %-9s vs NumPy (max |diff| / max |ref|, %zu tokens): logits %.3e\n", kind,
                tokens.size(), dl);
    // The optimised executors quantise activations to int16 per 32 values
    // for the BF16 and int4 products (the exact mode); with the reference's
    // softmax scale (5.47x the old 1/sqrt(D)) that shows as up to 8.2e-4
    // here (f32 weights: 2.7e-6), so the bound is 1.5e-3; top-1 is exact.
    EXPECT_LE(dl, std::string(kind) == "reference" ? 1e-5 : 1.5e-3) << kind;
    size_t same_top = 0;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const float* a = &head[t * static_cast<size_t>(used)];
      const float* b = &ref[t * static_cast<size_t>(used)];
      same_top += std::max_element(a, a + used) - a == std::max_element(b, b + used) - b;
    }
    EXPECT_EQ(same_top, tokens.size()) << kind;
    got[kind] = logits;
  }
  EXPECT_TRUE(same_bits(got["mega"], got["opbyop"]));
}

// The fixture tells every formula the reference fixed apart: with any one of
// them as this project had it before (reference.json "reverted", computed by
// muse_numpy_ref.py), the first positions' logits move far outside the
// agreement tolerance, so ExecutorsMatchNumpyReference fails on the old math.
TEST(MuseModel, FixtureTellsEachReferenceFormulaApart) {
  const MuseModel& m = fixture_model();
  const DecodeProgram prog = build_muse_program(m, 4);
  ThreadPool pool(1);
  auto ex = make_executor("reference", prog, pool);
  const auto tokens = reference()["tokens"].get<std::vector<int32_t>>();
  const int used = reference()["vocab_used"].get<int>();
  const auto& reverted = reference()["reverted"];
  ASSERT_TRUE(reverted.is_object());
  for (const char* name : {"qk_scale", "router", "embed_norm", "post_ffn_norm", "expert_norm", "gate_per_head"})
    ASSERT_TRUE(reverted.contains(name)) << name;
  const size_t n = reverted.begin()->size();
  KVCache cache = make_cache(m, 64, 4);
  const std::vector<float> logits = decode(m, *ex, std::vector<int32_t>(tokens.begin(), tokens.begin() + static_cast<long>(n)), cache);
  std::vector<float> ours, ref;
  for (size_t t = 0; t < n; ++t) {
    const float* row = &logits[t * static_cast<size_t>(m.n_vocab())];
    ours.insert(ours.end(), row, row + used);
    for (const auto& v : reference()["logits"][t]) ref.push_back(v.get<float>());
  }
  EXPECT_LE(rel_diff(ours.data(), ref.data(), ref.size()), 1e-5);
  for (auto it = reverted.begin(); it != reverted.end(); ++it) {
    std::vector<float> alt;
    for (const auto& row : *it)
      for (const auto& v : row) alt.push_back(v.get<float>());
    ASSERT_EQ(alt.size(), ours.size()) << it.key();
    const double d = rel_diff(ours.data(), alt.data(), alt.size());
    std::printf("muse-spark-mini with the old %-14s: logits move by %.3e (max |diff| / max |ref|)\n", it.key().c_str(), d);
    EXPECT_GE(d, 10 * 1.5e-3) << it.key() << " is not visible in the fixture";
  }
}

// The constants the program takes from the config are the reference's
// (musespark/config.py): q/k and attention-output norms eps 1e-5, the post
// norms 1e-8, the softmax scale qk_scale_factor / sqrt(head_dim), a gate per
// attention channel, a parameter-free norm right after the embedding, route
// eps 1e-15. The values are visible in the program, so a drift is caught
// even where the fixture's logits could not resolve it (an eps of 1e-6
// against 1e-5 moves them by ~1e-6).
TEST(MuseModel, ProgramUsesTheReferenceConstants) {
  const MuseModel& m = fixture_model();
  const MuseConfig& c = m.config();
  const DecodeProgram prog = build_muse_program(m, 1);
  ASSERT_GE(prog.ops.size(), 2u);
  EXPECT_EQ(prog.ops[0].kind, OpKind::Embed);
  EXPECT_EQ(prog.ops[1].kind, OpKind::RmsNorm);
  EXPECT_FLOAT_EQ(prog.ops[1].as<ops::RmsNorm>().eps, 1e-5f);
  int attn = 0, heads = 0, resid = 0, route = 0, combine = 0;
  for (const Op& op : prog.ops) {
    if (op.kind == OpKind::Attention) {
      EXPECT_FLOAT_EQ(op.as<ops::Attention>().scale, static_cast<float>(5.4730064863875 / std::sqrt(32.0)));
      ++attn;
    } else if (op.kind == OpKind::HeadNormRope) {
      EXPECT_FLOAT_EQ(op.as<ops::HeadNormRope>().eps, 1e-5f) << op.name;
    } else if (op.kind == OpKind::HeadNormGate) {
      EXPECT_FLOAT_EQ(op.as<ops::HeadNormGate>().eps, 1e-5f);
      EXPECT_EQ(prog.slots[static_cast<size_t>(op.in)].width, c.n_head * c.head_dim);
      ++heads;
    } else if (op.kind == OpKind::GatedResidual) {
      EXPECT_FLOAT_EQ(op.as<ops::GatedResidual>().eps, 1e-8f);
      EXPECT_EQ(op.as<ops::GatedResidual>().coef.size(), static_cast<size_t>((op.name == "ffn_residual" ? 3 : 2) * c.hidden)) << op.name;
      ++resid;
    } else if (op.kind == OpKind::MoeRoute) {
      EXPECT_FLOAT_EQ(op.as<ops::MoeRoute>().eps, 1e-15f);
      EXPECT_FLOAT_EQ(op.as<ops::MoeRoute>().scale, 0.17677669529663687f);
      ++route;
    } else if (op.kind == OpKind::MoeCombine) {
      EXPECT_FLOAT_EQ(op.as<ops::MoeCombine>().bank->out_norm_eps, 1e-8f);
      EXPECT_EQ(op.as<ops::MoeCombine>().bank->out_norm.size(), static_cast<size_t>(c.expert_dim));
      ++combine;
    }
  }
  EXPECT_EQ(attn, c.n_layer);
  EXPECT_EQ(heads, c.n_layer);
  EXPECT_EQ(resid, 2 * c.n_layer);
  EXPECT_EQ(route, c.n_layer);
  EXPECT_EQ(combine, c.n_layer);
}

// ---------------------------------------------------------------------------
// Executors agree with each other

// Eight sequences prefilled to different lengths (positions 2, 7, ..., 37
// next), and their next tokens.
struct Batch {
  std::vector<KVCache> caches;
  std::vector<int32_t> next;
  int pos(int s) const { return 2 + 5 * s; }
};

Batch prefilled_batch(const MuseModel& m, Executor& ex, KvType kv = KvType::f32) {
  Batch b;
  for (int s = 0; s < 8; ++s) {
    b.caches.push_back(make_cache(m, 64, 8, kv));
    const auto toks = random_tokens(b.pos(s) + 1, m.config().vocab_used, 100 + static_cast<uint32_t>(s));
    decode(m, ex, std::vector<int32_t>(toks.begin(), toks.end() - 1), b.caches.back(), 8);
    b.next.push_back(toks.back());
  }
  return b;
}

// One step over the first n sequences of a copy of the batch.
std::vector<float> batched_step(const MuseModel& m, Executor& ex, Batch b, int n) {
  std::vector<RowInput> rows;
  for (int s = 0; s < n; ++s) rows.push_back({b.next[static_cast<size_t>(s)], b.pos(s), &b.caches[static_cast<size_t>(s)], nullptr});
  std::vector<float> logits(static_cast<size_t>(n) * m.n_vocab());
  ex.step(rows, logits.data());
  return logits;
}

// Each test of this suite runs with every KV cache type (ring layers included).
class MuseKvTest : public ::testing::TestWithParam<KvType> {};

TEST_P(MuseKvTest, MegaMatchesOpByOpBitwiseAtEveryBatch) {
  ThreadPool pool(2);
  for (auto [dense, experts] : {std::pair{DType::BF16, DType::INT4_G128}, std::pair{DType::INT8_COL, DType::NVFP4}}) {
    const MuseModel& m = synthetic_mini(dense, experts);
    const DecodeProgram prog = build_muse_program(m, 8);
    auto op = make_executor("opbyop", prog, pool);
    auto mega = make_executor("mega", prog, pool);
    const Batch batch = prefilled_batch(m, *op, GetParam());
    const size_t V = static_cast<size_t>(m.n_vocab());
    // Each row alone, at batch 1.
    std::vector<float> alone;
    for (int s = 0; s < 8; ++s) {
      Batch one = batch;
      std::swap(one.caches[0], one.caches[static_cast<size_t>(s)]);
      std::swap(one.next[0], one.next[static_cast<size_t>(s)]);
      std::vector<RowInput> rows = {{one.next[0], batch.pos(s), &one.caches[0], nullptr}};
      alone.resize(alone.size() + V);
      op->step(rows, alone.data() + static_cast<size_t>(s) * V);
    }
    for (int n : {1, 2, 4, 8}) {
      const std::vector<float> a = batched_step(m, *op, batch, n);
      const std::vector<float> b = batched_step(m, *mega, batch, n);
      const std::string what = fmt::format("{}/{} batch {}", dtype_traits(dense).name, dtype_traits(experts).name, n);
      EXPECT_TRUE(same_bits(a, b)) << what;
      EXPECT_TRUE(same_bits(a, std::vector<float>(alone.begin(), alone.begin() + static_cast<ptrdiff_t>(n * V))))
          << "a row depends on its batch mates: " << what;
      for (int s = 0; s < n; ++s)
        for (int i = 0; i < m.config().vocab_used; ++i) ASSERT_TRUE(std::isfinite(a[static_cast<size_t>(s) * V + i]));
    }
  }
}

TEST(MuseModel, TileCutsDoNotChangeResults) {
  // Team sizes 1, 2 and 5 cut the expert products into 1..3 output ranges
  // per selected expert (and the matrices differently): same bits.
  const MuseModel& m = synthetic_mini(DType::INT8_COL, DType::NVFP4);
  const DecodeProgram prog = build_muse_program(m, 4);
  const auto toks = random_tokens(9, m.config().vocab_used, 17);
  std::vector<std::vector<float>> runs;
  for (int w : {1, 2, 5}) {
    ThreadPool pool(w, /*oversubscribe=*/true);
    auto ex = make_executor("mega", prog, pool);
    KVCache c = make_cache(m, 16, 4);
    runs.push_back(decode(m, *ex, toks, c, 3));
  }
  for (const Op& op : prog.ops)
    if (op.kind == OpKind::MoeGlu) {
      EXPECT_EQ(op_tile_count(op, 1, 1), 2);  // top-2: two slots of one range
      EXPECT_EQ(op_tile_count(op, 1, 5), 6);  // three ranges each
      EXPECT_EQ(op_tile_count(op, 8, 5), 8);  // at most n_expert slots
      break;
    }
  EXPECT_TRUE(same_bits(runs[0], runs[1]));
  EXPECT_TRUE(same_bits(runs[0], runs[2]));
}

TEST_P(MuseKvTest, PrefillBlocksMatchSingleSteps) {
  const MuseModel& m = synthetic_mini(DType::BF16, DType::INT4_G128);
  const DecodeProgram prog = build_muse_program(m, 8);
  ThreadPool pool(2);
  const auto toks = random_tokens(29, m.config().vocab_used, 5);
  for (const char* kind : {"opbyop", "mega"}) {
    auto ex = make_executor(kind, prog, pool);
    const KvType kv = GetParam();
    KVCache c1 = make_cache(m, 64, 8, kv), c8 = make_cache(m, 64, 8, kv), c3 = make_cache(m, 64, 8, kv);
    const auto one = decode(m, *ex, toks, c1, 1);
    EXPECT_TRUE(same_bits(one, decode(m, *ex, toks, c8, 8))) << kind;
    EXPECT_TRUE(same_bits(one, decode(m, *ex, toks, c3, 3))) << kind;
  }
  // The scalar reference agrees too (its own bits).
  auto ref = make_executor("reference", prog, pool);
  KVCache r1 = make_cache(m, 64, 8, GetParam()), r8 = make_cache(m, 64, 8, GetParam());
  EXPECT_TRUE(same_bits(decode(m, *ref, toks, r1, 1), decode(m, *ref, toks, r8, 8)));
}

TEST_P(MuseKvTest, RingCacheMatchesFullCache) {
  const MuseModel& m = synthetic_mini(DType::BF16, DType::INT4_G128);
  const DecodeProgram prog = build_muse_program(m, 4);
  ThreadPool pool(2);
  const int window = m.config().window;
  const auto toks = random_tokens(5 * window, m.config().vocab_used, 9);
  for (const char* kind : {"reference", "mega"}) {
    auto ex = make_executor(kind, prog, pool);
    const KvType kv = GetParam();
    KVCache ring = make_cache(m, 64, 4, kv), full = make_cache(m, 64, /*ring_block=*/0, kv);
    // Windowed layers hold window + 3 positions; the full layer all 64.
    EXPECT_EQ(ring.ring_len(0), window + 3);
    EXPECT_EQ(ring.ring_len(1), 0);
    EXPECT_EQ(ring.k_values(), static_cast<size_t>(3 * (window + 3) + 64) * ring.kv_dim);
    EXPECT_EQ(full.k_values(), static_cast<size_t>(4 * 64) * full.kv_dim);
    EXPECT_EQ(ring.bytes(), kv_row_bytes(kv, static_cast<int64_t>(ring.k_values() + ring.v_values())));
    EXPECT_TRUE(same_bits(decode(m, *ex, toks, ring, 4), decode(m, *ex, toks, full, 4))) << kind;
  }
  // A block longer than the ring allows is refused.
  auto ex = make_executor("opbyop", prog, pool);
  KVCache small = make_cache(m, 64, 2, GetParam());
  std::vector<float> logits(4 * static_cast<size_t>(m.n_vocab()));
  std::vector<RowInput> rows;
  for (int t = 0; t < 4; ++t) rows.push_back({1, t, &small, nullptr});
  EXPECT_THROW(ex->step(rows, logits.data()), Error);
}

INSTANTIATE_TEST_SUITE_P(KvTypes, MuseKvTest, ::testing::ValuesIn(kAllKvTypes), KvTypeName());

TEST(MuseModel, SyntheticIsDeterministicAndFiniteOverManyLayers) {
  MuseConfig c = mini_config();
  c.name = "muse-deep";
  c.n_layer = 62;
  c.n_expert = 4;
  {
    const auto a = MuseModel::synthetic(mini_config(), 3, DType::BF16, DType::NVFP4);
    const auto b = MuseModel::synthetic(mini_config(), 3, DType::BF16, DType::NVFP4);
    const auto& ea = a->layers()[2].experts;
    const auto& eb = b->layers()[2].experts;
    EXPECT_EQ(std::memcmp(ea.down[3].data, eb.down[3].data, ea.down_bytes(3)), 0);
    EXPECT_EQ(ea.gate_scale, eb.gate_scale);
    EXPECT_NE(ea.gate_scale[0], 1.f);  // NVFP4 carries its global scale
    const auto other = MuseModel::synthetic(mini_config(), 4, DType::BF16, DType::NVFP4);
    EXPECT_NE(std::memcmp(ea.down[3].data, other->layers()[2].experts.down[3].data, ea.down_bytes(3)), 0);
  }
  const auto a = MuseModel::synthetic(c, 3, DType::BF16, DType::INT4_G128);
  const DecodeProgram prog = build_muse_program(*a, 2);
  auto ex = make_reference_executor(prog);
  KVCache cache = make_cache(*a, 32, 2);
  const auto logits = decode(*a, *ex, random_tokens(12, c.vocab_used, 4), cache, 2);
  for (size_t t = 0; t < 12; ++t)
    for (int i = 0; i < c.vocab_used; ++i) {
      const float v = logits[t * static_cast<size_t>(c.vocab) + static_cast<size_t>(i)];
      ASSERT_TRUE(std::isfinite(v) && std::fabs(v) <= 20.f);
    }
}

// ---------------------------------------------------------------------------
// Save / load

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) : path(fs::temp_directory_path() / fmt::format("mk_muse_{}_{}", tag, ::getpid())) {
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

TEST(MuseModel, SaveLoadRoundTrip) {
  const MuseModel& m = synthetic_mini(DType::INT8_COL, DType::NVFP4);
  TempDir dir("rt");
  m.save(dir.path.string());
  const auto back = MuseModel::load(dir.path.string());
  EXPECT_EQ(back->dense_format(), DType::INT8_COL);
  EXPECT_EQ(back->expert_format(), DType::NVFP4);
  EXPECT_EQ(back->layers()[2].experts.down_scale, m.layers()[2].experts.down_scale);
  EXPECT_EQ(back->layers()[3].ffn_gate, m.layers()[3].ffn_gate);
  const auto& x = m.layers()[1].experts.up[5];
  EXPECT_EQ(std::memcmp(x.data, back->layers()[1].experts.up[5].data, x.row_bytes * x.rows), 0);
  ThreadPool pool(2);
  const auto toks = random_tokens(10, m.config().vocab_used, 11);
  const DecodeProgram p1 = build_muse_program(m, 2), p2 = build_muse_program(*back, 2);
  auto e1 = make_executor("opbyop", p1, pool);
  auto e2 = make_executor("opbyop", p2, pool);
  KVCache c1 = make_cache(m, 16, 2), c2 = make_cache(*back, 16, 2);
  EXPECT_TRUE(same_bits(decode(m, *e1, toks, c1, 2), decode(*back, *e2, toks, c2, 2)));
  // Saving the loaded model gives the same file.
  TempDir dir2("rt2");
  back->save(dir2.path.string());
  std::ifstream f1(dir.path / "model.safetensors", std::ios::binary), f2(dir2.path / "model.safetensors", std::ios::binary);
  const std::string s1((std::istreambuf_iterator<char>(f1)), {}), s2((std::istreambuf_iterator<char>(f2)), {});
  EXPECT_EQ(s1, s2);
}

TEST(MuseModel, LoadsMisalignedTensors) {
  // The fixture rewritten with its data buffer at an odd file offset: the
  // BF16 and F32 tensors are then misaligned and must be copied on load.
  TempDir dir("odd");
  fs::create_directories(dir.path);
  fs::copy_file(mini_dir() + "/config.json", dir.path / "config.json");
  std::ifstream in(mini_dir() + "/model.safetensors", std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  const std::string data = file.substr(8 + n);
  std::string header = file.substr(8, n);
  while (!header.empty() && header.back() == ' ') header.pop_back();
  while ((8 + header.size()) % 4 != 1) header += ' ';
  n = header.size();
  {
    std::ofstream out(dir.path / "model.safetensors", std::ios::binary);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  const auto odd = MuseModel::load(dir.path.string());
  const MuseModel& m = fixture_model();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m.tok_embd().data) % 2, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(odd->tok_embd().data) % 2, 0u);  // copied
  const DecodeProgram p1 = build_muse_program(m, 1), p2 = build_muse_program(*odd, 1);
  auto e1 = make_reference_executor(p1);
  auto e2 = make_reference_executor(p2);
  const auto toks = random_tokens(6, m.config().vocab_used, 13);
  KVCache c1 = make_cache(m, 8, 1), c2 = make_cache(*odd, 8, 1);
  EXPECT_TRUE(same_bits(decode(m, *e1, toks, c1), decode(*odd, *e2, toks, c2)));
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MuseModel, BadInputGivesClearErrors) {
  const MuseModel& m = synthetic_mini(DType::BF16, DType::INT4_G128);
  TempDir dir("bad");
  m.save(dir.path.string());
  const fs::path st = dir.path / "model.safetensors", cfg = dir.path / "config.json";
  nlohmann::json j;
  std::ifstream(cfg) >> j;

  // A config whose expert width disagrees with the tensors: the first expert
  // tensor is named with both shapes.
  nlohmann::json j2 = j;
  j2["expert_ff"] = 256;
  std::ofstream(cfg) << j2.dump();
  std::string e = error_of([&] { MuseModel::load(dir.path.string()); });
  EXPECT_NE(e.find("layers.0.moe.experts.gate"), std::string::npos) << e;
  EXPECT_NE(e.find("expected U8 [8, 256, 66]"), std::string::npos) << e;

  // A dense format that is not what was stored.
  j2 = j;
  j2["dense_format"] = "f32";
  std::ofstream(cfg) << j2.dump();
  e = error_of([&] { MuseModel::load(dir.path.string()); });
  EXPECT_NE(e.find("embed.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("expected F32 [512, 128]"), std::string::npos) << e;

  j2 = j;
  j2.erase("top_k");
  std::ofstream(cfg) << j2.dump();
  EXPECT_NE(error_of([&] { MuseModel::load(dir.path.string()); }).find("top_k"), std::string::npos);

  // A truncated weights file.
  std::ofstream(cfg) << j.dump();
  const auto size = fs::file_size(st);
  fs::resize_file(st, size - 1000);
  e = error_of([&] { MuseModel::load(dir.path.string()); });
  EXPECT_FALSE(e.empty());
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;

  EXPECT_FALSE(error_of([&] { MuseModel::load((dir.path / "nowhere").string()); }).empty());
  EXPECT_THROW(build_muse_program(m, 65), Error);
  EXPECT_THROW(make_cache(m, 0, 64), Error);
}

// ---------------------------------------------------------------------------
// The reference's checkpoint layout (model/muse_layout.cpp)

// tests/fixtures/muse_reflayout: a checkpoint written in the reference's
// layout by scripts/fixtures/gen_muse_reference_layout.py, with its NumPy
// logits (zero-centred norms, fused gate_up_proj, text_config keys).
TEST(MuseReferenceLayout, LoadsTheReferenceCheckpointAndMatchesNumpy) {
  const std::string dir = fixture_path("muse_reflayout");
  const nlohmann::json& ref = fixture_json("muse_reflayout/reference.json");
  const auto m = MuseModel::load(dir);
  const MuseConfig& c = m->config();
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_expert, 4);
  EXPECT_EQ(c.top_k, 2);
  EXPECT_EQ(c.vocab_used, c.vocab);  // min(201818, vocab_size)
  EXPECT_EQ(m->dense_format(), DType::BF16);
  EXPECT_EQ(m->expert_format(), DType::BF16);
  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  std::vector<float> want;
  for (const auto& row : ref["logits"])
    for (const auto& v : row) want.push_back(v.get<float>());
  ASSERT_EQ(want.size(), tokens.size() * static_cast<size_t>(c.vocab));
  const DecodeProgram prog = build_muse_program(*m, 4);
  ThreadPool pool(2);
  for (const char* kind : {"reference", "mega"}) {
    auto ex = make_executor(kind, prog, pool);
    KVCache cache = make_cache(*m, 32, 4);
    const std::vector<float> got = decode(*m, *ex, tokens, cache);
    const double d = rel_diff(got.data(), want.data(), want.size());
    std::printf("muse reference layout %-9s vs NumPy (max |diff| / max |ref|, %zu tokens): logits %.3e\n", kind,
                tokens.size(), d);
    EXPECT_LE(d, std::string(kind) == "reference" ? 1e-5 : 3e-4) << kind;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const float* a = &got[t * static_cast<size_t>(c.vocab)];
      const float* b = &want[t * static_cast<size_t>(c.vocab)];
      EXPECT_EQ(std::max_element(a, a + c.vocab) - a, std::max_element(b, b + c.vocab) - b) << kind << " position " << t;
    }
  }
}

// save_reference then load: the config and every matrix come back (block
// formats dequantised with their global scales folded in, exactly), the
// norms up to the bf16 rounding of 1 + w the loader applies; a second round
// trip is bit-stable. (The logits of the first round trip are not compared:
// the rounded norms can flip an expert choice, which moves them far.)
TEST(MuseReferenceLayout, SaveReferenceRoundTrip) {
  const MuseModel& m = synthetic_mini(DType::BF16, DType::NVFP4);
  TempDir d1("ref1"), d2("ref2");
  m.save_reference(d1.path.string());
  nlohmann::json j;
  std::ifstream(d1.path / "config.json") >> j;
  ASSERT_TRUE(j.contains("text_config"));
  EXPECT_EQ(j["text_config"]["num_local_experts"], 8);
  EXPECT_EQ(j["text_config"]["layer_types"][1], "full_attention");
  const auto a = MuseModel::load(d1.path.string());
  const MuseConfig &c0 = m.config(), &ca = a->config();
  EXPECT_EQ(ca.n_layer, c0.n_layer);
  EXPECT_EQ(ca.n_expert, c0.n_expert);
  EXPECT_EQ(ca.expert_ff, c0.expert_ff);
  EXPECT_EQ(ca.window, c0.window);
  EXPECT_EQ(ca.qk_scale_factor, c0.qk_scale_factor);
  EXPECT_EQ(ca.vocab_used, ca.vocab);  // min(201818, vocab_size)
  EXPECT_EQ(a->dense_format(), DType::BF16);
  EXPECT_EQ(a->expert_format(), DType::F32);  // NVFP4 written dequantised, global scale folded in
  for (size_t l = 0; l < m.layers().size(); ++l) {
    const MuseLayer &L0 = m.layers()[l], &La = a->layers()[l];
    // One expert row: the NVFP4 values times the global scale, exactly.
    const auto& src = L0.experts;
    std::vector<float> x(static_cast<size_t>(src.d_in));
    dtype_traits(DType::NVFP4).dequantize(src.up[3].row(5), x.data(), src.d_in);
    const float* y = reinterpret_cast<const float*>(La.experts.up[3].row(5));
    for (int i = 0; i < src.d_in; ++i) ASSERT_EQ(y[i], x[static_cast<size_t>(i)] * src.up_scale[3]) << i;
    EXPECT_EQ(std::memcmp(L0.wgate.data, La.wgate.data, L0.wgate.row_bytes * static_cast<size_t>(L0.wgate.rows)), 0);
    EXPECT_EQ(std::memcmp(L0.router.data, La.router.data, L0.router.row_bytes * static_cast<size_t>(L0.router.rows)), 0);
    EXPECT_EQ(L0.attn_gamma, La.attn_gamma);
    EXPECT_EQ(L0.ffn_gamma, La.ffn_gamma);
    EXPECT_EQ(L0.router_bias, La.router_bias);
    // Norms: bf16(1 + (n - 1)).
    for (size_t i = 0; i < L0.post_ffn_norm.size(); ++i)
      ASSERT_EQ(La.post_ffn_norm[i], bf16_to_f32(f32_to_bf16(L0.post_ffn_norm[i])));
    for (size_t i = 0; i < L0.experts.out_norm.size(); ++i)
      ASSERT_EQ(La.experts.out_norm[i], bf16_to_f32(f32_to_bf16(L0.experts.out_norm[i])));
  }
  EXPECT_EQ(a->final_norm(), m.final_norm());  // stored as-is
  a->save_reference(d2.path.string());
  const auto b = MuseModel::load(d2.path.string());
  ThreadPool pool(2);
  const auto toks = random_tokens(8, c0.vocab_used, 5);
  const DecodeProgram pa = build_muse_program(*a, 2), pb = build_muse_program(*b, 2);
  auto ea = make_executor("opbyop", pa, pool);
  auto eb = make_executor("opbyop", pb, pool);
  KVCache ka = make_cache(*a, 16, 2), kb = make_cache(*b, 16, 2);
  EXPECT_TRUE(same_bits(decode(*a, *ea, toks, ka, 2), decode(*b, *eb, toks, kb, 2)));
}

// `megakern gen-model --layout reference` writes such a checkpoint, and it
// loads with the reference's config keys.
// The muse-spark-mini preset (bf16 weights) in the reference layout, split
// over three shards: every matrix is a view of the mapped shards (the fused
// gate_up_proj as two row ranges per expert), so eight loads keep the logits
// bits of the single file and add much less anonymous memory than eight
// checkpoints' worth. What is still copied: the norms (stored as w, held as
// bf16(1 + w) in f32), the router (held in f32), the other vectors.
TEST(MuseReferenceLayout, ShardedCheckpointIsMappedNotCopied) {
  const MuseModel& m = synthetic_mini(DType::BF16, DType::BF16);
  TempDir d1("shard1"), d3("shard3");
  const std::string one = d1.path.string(), dir = d3.path.string();
  m.save_reference(one);
  const size_t ckpt = write_sharded_checkpoint(one + "/model.safetensors", dir, 3);
  ThreadPool pool(2);
  const auto toks = random_tokens(8, m.config().vocab_used, 5);
  auto logits = [&](const MuseModel& x) {
    const DecodeProgram p = build_muse_program(x, 2);
    auto e = make_executor("opbyop", p, pool);
    KVCache k = make_cache(x, 16, 2);
    return decode(x, *e, toks, k, 2);
  };
  const auto a = logits(*MuseModel::load(one));
  std::vector<std::unique_ptr<MuseModel>> models;
  const LoadCost cost = measure_loads("muse", 8, ckpt, [&] { models.push_back(MuseModel::load(dir)); });
  EXPECT_LT(cost.heap_share, 0.25);
  if (cost.anon_share >= 0) EXPECT_LT(cost.anon_share, 0.25);
  const auto b = logits(*models.back());
  EXPECT_TRUE(same_bits(a, b));
  std::printf("muse: logits hash %016llx\n", static_cast<unsigned long long>(bits_hash(b)));
  EXPECT_EQ(bits_hash(b), 0x7dc9a20fa05a6cfaull);  // as loaded by copying
}

TEST(MuseReferenceLayout, GenModelWritesTheReferenceLayout) {
  TempDir dir("refgen");
  const std::string cmd = fmt::format("{} gen-model --config muse-spark-mini --layout reference -o {} > {} 2>&1",
                                      MEGAKERN_BINARY, (dir.path / "m").string(), (dir.path / "log").string());
  fs::create_directories(dir.path);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  nlohmann::json j;
  std::ifstream(dir.path / "m" / "config.json") >> j;
  EXPECT_EQ(j["text_config"]["num_experts_per_tok"], 2);
  auto st = SafetensorsFile::open((dir.path / "m" / "model.safetensors").string());
  bool found = false;
  for (const SafetensorsTensor& t : st->tensors())
    found = found || t.name == "model.language_model.layers.3.mlp.experts.gate_up_proj";
  EXPECT_TRUE(found);
  const auto m = MuseModel::load((dir.path / "m").string());
  EXPECT_EQ(m->config().n_layer, 4);
  const std::string bad = fmt::format("{} gen-model --config kimi-k3-mini --layout reference -o {} > {} 2>&1",
                                      MEGAKERN_BINARY, (dir.path / "k").string(), (dir.path / "log").string());
  EXPECT_NE(std::system(bad.c_str()), 0);
}

// A missing or misshapen tensor, a missing config key or a wrong layer
// pattern is named in the error.
TEST(MuseReferenceLayout, BadInputNamesWhatIsWrong) {
  const std::string src = fixture_path("muse_reflayout");
  TempDir dir("refbad");
  fs::create_directories(dir.path);
  const fs::path cfg = dir.path / "config.json";
  fs::copy_file(src + "/config.json", cfg);
  auto file = SafetensorsFile::open(src + "/model.safetensors");
  auto rewrite = [&](const std::string& drop, const std::string& reshape) {
    SafetensorsWriter w;
    for (const SafetensorsTensor& t : file->tensors()) {
      if (t.name == drop) continue;
      std::vector<int64_t> shape = t.shape;
      if (t.name == reshape) std::swap(shape[0], shape[1]);
      w.add(t.name, t.dtype, shape, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    }
    w.write((dir.path / "model.safetensors").string());
  };
  rewrite("model.language_model.layers.1.mlp.experts.post_expert_norm.weight", "");
  std::string e = error_of([&] { MuseModel::load(dir.path.string()); });
  EXPECT_NE(e.find("'model.language_model.layers.1.mlp.experts.post_expert_norm.weight' is missing"), std::string::npos)
      << e;
  rewrite("", "model.language_model.layers.0.self_attn.k_proj.weight");
  e = error_of([&] { MuseModel::load(dir.path.string()); });
  EXPECT_NE(e.find("'model.language_model.layers.0.self_attn.k_proj.weight' has shape [128, 64], expected [64, 128]"),
            std::string::npos)
      << e;
  rewrite("", "");
  EXPECT_NO_THROW(MuseModel::load(dir.path.string()));
  nlohmann::json j;
  std::ifstream(src + "/config.json") >> j;
  nlohmann::json j2 = j;
  j2["text_config"].erase("moe_hidden_size");
  std::ofstream(cfg) << j2.dump();
  e = error_of([&] { MuseModel::load(dir.path.string()); });
  EXPECT_NE(e.find("moe_hidden_size"), std::string::npos) << e;
  j2 = j;
  j2["text_config"]["layer_types"][1] = "sliding_attention";
  std::ofstream(cfg) << j2.dump();
  e = error_of([&] { MuseModel::load(dir.path.string()); });
  EXPECT_NE(e.find("layer_types[1]"), std::string::npos) << e;
  j2 = j;
  j2["text_config"]["num_shared_experts"] = 1;
  std::ofstream(cfg) << j2.dump();
  e = error_of([&] { MuseModel::load(dir.path.string()); });
  EXPECT_NE(e.find("num_shared_experts"), std::string::npos) << e;
}

}  // namespace
}  // namespace megakern
