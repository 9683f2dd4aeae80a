// Kimi K3 through the DecodeProgram.
//
//  - Preset sizes against hand arithmetic.
//  - The MINI model of the committed fixture tests/fixtures/kimi_mini/
//    (weights and expected values from scripts/fixtures/gen_kimi_fixture.py,
//    a plain NumPy implementation of the equations, whose KDA the generator
//    checked against flash-linear-attention and whose MLA and router against
//    transformers' DeepSeek-V3, figures in reference.json): every executor decodes
//    the reference tokens one row per step. With the experts re-blocked to
//    FP8 (f32 activations everywhere) logits, final KDA states and conv
//    windows agree within 1e-4 of the largest reference magnitude; with
//    MXFP4 experts the optimised executors quantise the expert inputs to
//    int16 per 32 (exec/qmatmul.h), so their bound there is 2e-3, and the
//    scalar reference executor, which does not, stays within 1e-4.
//  - Megakernel and op-by-op are bit-identical at batch 1, 2 and 4 with rows
//    of different sequences at different positions, and a row's logits do not
//    depend on the batch.
//  - Router selection ties, save/load round trip, clear errors on bad input,
//    and finite activations through 93 layers of synthetic weights.
#include <gtest/gtest.h>

#include <map>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "exec/executor.h"
#include "exec/op_kernels.h"
#include "exec/recurrent_kernels.h"
#include "io/safetensors.h"
#include "model/kimi.h"
#include "sharded_checkpoint.h"
#include "test_util.h"
#include "model_state.h"

namespace megakern {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& tag) {
  const fs::path d = fs::temp_directory_path() / fmt::format("megakern_kimi_{}_{}", tag, getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

ThreadPool& pool() {
  static ThreadPool p(2);
  return p;
}

// ---------------------------------------------------------------------------
// Presets.

TEST(KimiConfig, FullPresetSizes) {
  const KimiConfig* c = find_kimi_preset("kimi-k3");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->n_layer, 93);
  EXPECT_EQ(c->n_mla_layers(), 24);  // l % 4 == 3 (23 layers) and layer 92
  EXPECT_EQ(c->n_kda_layers(), 69);
  EXPECT_TRUE(c->is_mla(92));
  EXPECT_FALSE(c->is_mla(90));
  EXPECT_EQ(c->n_res_blocks(), 9);  // embedding + ceil(93 / 12)
  const KimiParamCount pc = parameter_count(*c);
  // KDA: fused in-projection 7168 * (4 * 12288 + 96), f_a 7168 * 128, f_b 128 * 12288,
  // conv 36864 * 4, A_log 96, dt_bias 12288, o_norm 128, o_proj 12288 * 7168.
  EXPECT_EQ(pc.kda_per_layer, 353009664 + 917504 + 1572864 + 147456 + 96 + 12288 + 128 + 88080384);
  // MLA with the reference's 96 heads (kimi/__init__.py Config.heads): q_a
  // 7168*1536 + 1536, q_b 1536*96*192, kv_a 7168*576 + 512, kv_b 512*96*256,
  // gate 7168*12288, o_proj 12288*7168.
  EXPECT_EQ(c->mla_n_head, 96);
  EXPECT_EQ(pc.mla_per_layer, 11010048 + 1536 + 28311552 + 4128768 + 512 + 12582912 + 88080384 + 88080384);
  EXPECT_EQ(pc.expert_each, 3LL * 3072 * 3584);
  EXPECT_EQ(pc.experts, 92LL * 896 * 3 * 3072 * 3584);
  // 64 heads (the earlier assumption) gave 2,777,746,693,728; the 32 more
  // heads add 24 x 72,351,744.
  EXPECT_EQ(pc.total(), 2777746693728LL + 24LL * 72351744);
  EXPECT_EQ(pc.total(), 2779483135584LL);
  EXPECT_EQ(pc.active, pc.total() - 163839LL * 7168 - 92LL * (896 - 16) * 33030144);
  // Expanded K (96 * 192) and V (96 * 128) of 24 layers, f32.
  EXPECT_EQ(kv_bytes_per_token(*c), 24LL * 96 * (192 + 128) * 4);
  EXPECT_EQ(recurrent_state_bytes(*c).kda_state, 69LL * 96 * 128 * 128 * 4);
  EXPECT_EQ(recurrent_state_bytes(*c).conv_window, 69LL * 3 * 3 * 12288 * 4);
  const std::string d = describe(*c);
  EXPECT_NE(d.find("2,779,483,135,584"), std::string::npos);
  EXPECT_NE(d.find("KV cache per token: 2,949,120 B"), std::string::npos);
}

TEST(KimiConfig, BenchAndMiniPresets) {
  const KimiConfig* b = find_kimi_preset("kimi-k3-bench");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->n_layer, 93);
  EXPECT_EQ(b->n_mla_layers(), 24);
  EXPECT_EQ(b->kda_head_dim, 128);
  EXPECT_GE(weight_bytes_per_step(*b, DType::BF16, DType::MXFP4), 320LL * 1000 * 1000);
  EXPECT_LT(weight_bytes_total(*b, DType::BF16, DType::MXFP4), 4LL << 30);
  const KimiConfig* m = find_kimi_preset("kimi-k3-mini");
  ASSERT_NE(m, nullptr);
  EXPECT_LE(m->vocab, 512);
  EXPECT_TRUE(m->is_mla(3) && m->is_mla(7) && m->is_mla(9) && !m->is_mla(8));
  EXPECT_EQ(find_kimi_preset("kimi-k4"), nullptr);
}

// ---------------------------------------------------------------------------
// Router.

// Runs the MoeRoute op of a Kimi MINI layer on given router logits; returns
// [k ids | k weights].
std::vector<float> route(const std::vector<float>& logits, const std::vector<float>& bias, int k) {
  DecodeProgram p;
  p.max_rows = 1;
  const int in = p.add_slot("logits", -1, static_cast<int>(logits.size()));
  const int out = p.add_slot("route", -1, 2 * k);
  Op& op = p.add_op(OpKind::MoeRoute, 1, "moe_route");
  op.in = in;
  op.out = out;
  op.as<ops::MoeRoute>().bias = bias;
  op.as<ops::MoeRoute>().eps = 0.f;  // as kimi.cpp builds it: no eps in the weight normalisation
  op.as<ops::MoeRoute>().top_k = k;
  std::vector<float> x = logits, y(static_cast<size_t>(2 * k));
  StepContext ctx;
  ctx.program = &p;
  ctx.slot = {x.data(), y.data()};
  ctx.n_rows = 1;
  for (bool scalar : {true, false}) {
    ctx.scalar = scalar;
    run_op_tile(p.ops[0], ctx, 0, 1);
  }
  return y;
}

TEST(KimiRouter, TiesGoToTheLowestIndex) {
  // Equal scores, no bias: the first k ids, equal weights.
  std::vector<float> r = route(std::vector<float>(8, 0.f), std::vector<float>(8, 0.f), 3);
  EXPECT_EQ(r[0], 0.f);
  EXPECT_EQ(r[1], 1.f);
  EXPECT_EQ(r[2], 2.f);
  for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(r[3 + j], 1.f / 3);
  // The bias decides selection, the sigmoid scores the weights. Experts 5
  // and 6 tie exactly (logit 0, bias 0.125) and 5 comes first; expert 1 has
  // the best score but a bias that drops it.
  const std::vector<float> lg = {-1.f, 3.f, -1.f, -1.f, -1.f, 0.f, 0.f, 2.f};
  const std::vector<float> bias = {0.f, -1.f, 0.f, 0.f, 0.f, 0.125f, 0.125f, 0.f};
  r = route(lg, bias, 3);
  EXPECT_EQ(r[0], 7.f);
  EXPECT_EQ(r[1], 5.f);
  EXPECT_EQ(r[2], 6.f);
  const float s7 = 1.f / (1.f + std::exp(-2.f)), sum = s7 + 0.5f + 0.5f;
  EXPECT_NEAR(r[3], s7 / sum, 1e-6);
  EXPECT_NEAR(r[4], 0.5f / sum, 1e-6);
  EXPECT_NEAR(r[5], 0.5f / sum, 1e-6);
}

// ---------------------------------------------------------------------------
// Synthetic model: executors agree, batching, save/load.

const KimiModel& synthetic_mini() {
  static const std::unique_ptr<KimiModel> m = KimiModel::synthetic(*find_kimi_preset("kimi-k3-mini"), 7);
  return *m;
}

struct Seq {
  KVCache cache;
  RecurrentState state;
  int pos = 0;
};

// Decodes `tokens` one row per step; returns all logits [T][V].
std::vector<float> decode(const KimiModel& m, Executor& ex, const std::vector<int32_t>& tokens, Seq* keep = nullptr) {
  Seq s{make_cache(m, 32), make_state(m), 0};
  const size_t V = static_cast<size_t>(m.n_vocab());
  std::vector<float> logits(tokens.size() * V);
  for (size_t t = 0; t < tokens.size(); ++t) {
    RowInput row{tokens[t], static_cast<int32_t>(t), &s.cache, &s.state};
    ex.step({row}, &logits[t * V]);
  }
  if (keep) *keep = std::move(s);
  return logits;
}

TEST(KimiModel, SyntheticMiniRunsUnderEveryExecutor) {
  const KimiModel& m = synthetic_mini();
  const DecodeProgram p = build_kimi_program(m, 4);
  EXPECT_TRUE(p.recurrent);
  const std::vector<int32_t> toks = {72, 101, 108, 108, 111, 32, 75, 105};
  auto ref = make_reference_executor(p);
  auto obo = make_opbyop_executor(p, pool());
  auto mega = make_mega_executor(p, pool());
  const auto a = decode(m, *ref, toks), b = decode(m, *obo, toks), c = decode(m, *mega, toks);
  for (float x : a) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ(std::memcmp(b.data(), c.data(), b.size() * sizeof(float)), 0) << "mega and op-by-op differ";
  // MXFP4 experts: the optimised path quantises their inputs (int16 per 32).
  EXPECT_LT(rel_diff(b.data(), a.data(), a.size()), 2e-3);
}

TEST(KimiModel, FullHeadWidthsAgreeAcrossExecutors) {
  // The full model's per-head widths (KDA 128x128 states, MLA keys 128 + 64,
  // values 128) at a small hidden size; FP8 experts keep every product in f32,
  // so the scalar reference and the optimised kernels agree closely.
  KimiConfig c = *find_kimi_preset("kimi-k3-mini");
  c.name = "kimi-wide-heads";
  c.n_layer = 5;
  c.kda_n_head = 1;
  c.kda_head_dim = 128;
  c.qk_nope_dim = 128;
  c.qk_extra_dim = 64;
  c.v_head_dim = 128;
  KimiWeightOptions o;
  o.fp8_experts = true;
  o.dense = DType::F32;
  const auto m = KimiModel::synthetic(c, 11, o);
  const DecodeProgram p = build_kimi_program(*m, 1);
  auto ref = make_reference_executor(p);
  auto mega = make_mega_executor(p, pool());
  const std::vector<int32_t> toks = {5, 6, 7, 8, 9, 10};
  Seq sa, sb;
  const auto a = decode(*m, *ref, toks, &sa), b = decode(*m, *mega, toks, &sb);
  EXPECT_LT(rel_diff(b.data(), a.data(), a.size()), 1e-5);
  EXPECT_LT(rel_diff(sb.state.S.data(), sa.state.S.data(), sa.state.S.size()), 1e-5);
}

TEST(KimiModel, ProgramReadsWhatTheConfigArithmeticSays) {
  const KimiModel& m = synthetic_mini();
  const KimiConfig& c = m.config();
  const DecodeProgram p = build_kimi_program(m, 1);
  // The config counts one embedding row, which the Embed op does not report.
  EXPECT_EQ(static_cast<int64_t>(p.weight_bytes()) + static_cast<int64_t>(row_bytes(DType::BF16, c.hidden)),
            weight_bytes_per_step(c, DType::BF16, DType::MXFP4));
  const std::string d = p.dump();
  EXPECT_NE(d.find("moe_glu"), std::string::npos);
  EXPECT_NE(d.find("attn_res_restart"), std::string::npos);
  int n_delta = 0, n_attention = 0, n_restart = 0;
  for (const Op& op : p.ops) {
    n_delta += op.kind == OpKind::DeltaRule && op.as<ops::DeltaRule>().kda;
    n_attention += op.kind == OpKind::Attention;
    n_restart += op.kind == OpKind::AttnResAdd && op.as<ops::AttnResAdd>().overwrite && op.layer >= 0;
  }
  EXPECT_EQ(n_delta, 7);
  EXPECT_EQ(n_attention, 3);
  EXPECT_EQ(n_restart, 3);  // layers 0, 4 and 8
}

// With each KV cache type the MLA layers take (their heads, 24 / 16 wide,
// are no multiple of q8_0's blocks of 32: refused below).
class KimiKvTest : public ::testing::TestWithParam<KvType> {};

TEST_P(KimiKvTest, MegaMatchesOpByOpBitForBitAtBatch124) {
  const KimiModel& m = synthetic_mini();
  const DecodeProgram p = build_kimi_program(m, 4);
  auto obo = make_opbyop_executor(p, pool());
  auto mega = make_mega_executor(p, pool());
  const size_t V = static_cast<size_t>(m.n_vocab());
  // Four sequences, prefilled to different lengths, then stepped together.
  auto run = [&](Executor& ex, int batch) {
    std::vector<Seq> seqs;
    for (int s = 0; s < 4; ++s) seqs.push_back({make_cache(m, 32, 0, GetParam()), make_state(m), 0});
    std::vector<float> out, scratch(V);
    for (int s = 0; s < 4; ++s)
      for (int t = 0; t < 1 + s; ++t) {
        RowInput row{(17 * s + 5 * t) % 256, seqs[s].pos++, &seqs[s].cache, &seqs[s].state};
        ex.step({row}, scratch.data());
      }
    for (int step = 0; step < 2; ++step)
      for (int first = 0; first < 4; first += batch) {
        std::vector<RowInput> rows;
        for (int s = first; s < first + batch; ++s)
          rows.push_back({(31 * s + 7 * step + 3) % 256, seqs[s].pos++, &seqs[s].cache, &seqs[s].state});
        std::vector<float> l(rows.size() * V);
        ex.step(rows, l.data());
        out.insert(out.end(), l.begin(), l.end());
      }
    return out;
  };
  const auto single = run(*obo, 1);
  for (int batch : {1, 2, 4}) {
    const auto a = run(*obo, batch), b = run(*mega, batch);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "batch " << batch;
    EXPECT_EQ(std::memcmp(a.data(), single.data(), a.size() * sizeof(float)), 0)
        << "batch " << batch << " differs from one row at a time";
  }
}

INSTANTIATE_TEST_SUITE_P(KvTypes, KimiKvTest, ::testing::Values(KvType::f32, KvType::f16, KvType::bf16),
                         KvTypeName());

TEST(KimiModel, Q8KvCacheIsRefusedNamingTheHeadWidth) {
  const KimiModel& m = synthetic_mini();
  try {
    make_cache(m, 32, 0, KvType::q8_0);
    FAIL() << "a q8_0 cache of 24-wide MLA key heads was made";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("q8_0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("heads of 24 (keys)"), std::string::npos) << msg;
  }
}

TEST(KimiModel, SaveLoadRoundTrip) {
  const KimiModel& m = synthetic_mini();
  const fs::path dir = temp_dir("roundtrip");
  m.save(dir.string());
  const auto back = KimiModel::load(dir.string());
  EXPECT_EQ(back->config().n_layer, m.config().n_layer);
  EXPECT_EQ(back->config().name, "kimi-k3-mini");
  const DecodeProgram p1 = build_kimi_program(m, 1), p2 = build_kimi_program(*back, 1);
  EXPECT_EQ(p1.weight_bytes(), p2.weight_bytes());
  auto e1 = make_reference_executor(p1), e2 = make_reference_executor(p2);
  const std::vector<int32_t> toks = {1, 2, 3, 250, 77};
  const auto a = decode(m, *e1, toks), b = decode(*back, *e2, toks);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  // The same checkpoint with the experts re-blocked to FP8: same values.
  KimiWeightOptions o;
  o.fp8_experts = true;
  const auto fp8 = KimiModel::load(dir.string(), o);
  EXPECT_EQ(fp8->layers()[1].experts_gu.type, DType::FP8_E4M3);
  const DecodeProgram p3 = build_kimi_program(*fp8, 1);
  auto e3 = make_reference_executor(p3);
  const auto c = decode(*fp8, *e3, toks);
  EXPECT_LT(rel_diff(c.data(), a.data(), a.size()), 1e-5);
  // Saving the FP8 form writes the original MXFP4 blocks back.
  const fs::path dir2 = temp_dir("roundtrip_fp8");
  fp8->save(dir2.string());
  const auto again = KimiModel::load(dir2.string());
  for (size_t l = 1; l < m.layers().size(); ++l) {
    const MatView &x = m.layers()[l].experts_gu, &y = again->layers()[l].experts_gu;
    const MatView &xd = m.layers()[l].experts_down, &yd = again->layers()[l].experts_down;
    ASSERT_EQ(y.type, DType::MXFP4);
    EXPECT_EQ(std::memcmp(x.data, y.data, x.row_bytes * static_cast<size_t>(x.rows)), 0) << "layer " << l;
    EXPECT_EQ(std::memcmp(xd.data, yd.data, xd.row_bytes * static_cast<size_t>(xd.rows)), 0) << "layer " << l;
  }
  fs::remove_all(dir);
  fs::remove_all(dir2);
}

TEST(KimiModel, SyntheticIsDeterministic) {
  const KimiConfig& c = *find_kimi_preset("kimi-k3-mini");
  const auto a = KimiModel::synthetic(c, 7), b = KimiModel::synthetic(c, 7), d = KimiModel::synthetic(c, 8);
  const MatView& x = a->layers()[2].experts_gu;
  EXPECT_EQ(std::memcmp(x.data, b->layers()[2].experts_gu.data, x.row_bytes * x.rows), 0);
  EXPECT_NE(std::memcmp(x.data, d->layers()[2].experts_gu.data, x.row_bytes * x.rows), 0);
}

TEST(KimiModel, ActivationsStayFiniteOver93Layers) {
  // The full layer count and block rule at the mini's widths.
  KimiConfig c = *find_kimi_preset("kimi-k3-mini");
  c.name = "kimi-93-narrow";
  c.n_layer = 93;
  c.attn_res_block = 12;
  const auto m = KimiModel::synthetic(c, 3);
  const DecodeProgram p = build_kimi_program(*m, 1);
  auto ex = make_opbyop_executor(p, pool());
  const auto logits = decode(*m, *ex, {10, 20, 30, 40});
  double amax = 0;
  for (float x : logits) {
    ASSERT_TRUE(std::isfinite(x));
    amax = std::max(amax, static_cast<double>(std::fabs(x)));
  }
  EXPECT_GT(amax, 1e-3);
  EXPECT_LT(amax, 1e3);
}

// ---------------------------------------------------------------------------
// The MINI fixture against the NumPy reference.

const std::string& mini_dir() {
  static const std::string d = fixture_path("kimi_mini");
  return d;
}

const nlohmann::json& reference() { return fixture_json("kimi_mini/reference.json"); }

const KimiModel& fixture_model(bool fp8) {
  static const std::unique_ptr<KimiModel> mx = KimiModel::load(mini_dir());
  static const std::unique_ptr<KimiModel> f8 = [] {
    KimiWeightOptions o;
    o.fp8_experts = true;
    return KimiModel::load(mini_dir(), o);
  }();
  return fp8 ? *f8 : *mx;
}

struct Agreement {
  double logits = 0, state = 0, conv = 0, k = 0, v = 0;
  double worst() const { return std::max({logits, state, conv, k, v}); }
};

// Decodes the reference tokens one row per step and compares everything the
// fixture holds; each figure is the largest over steps / layers of
// max |c++ - numpy| / max |numpy|.
Agreement against_numpy(const KimiModel& m, Executor& ex) {
  const nlohmann::json& ref = reference();
  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  Seq s;
  const auto logits = decode(m, ex, tokens, &s);
  const size_t V = static_cast<size_t>(m.n_vocab());
  Agreement a;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const auto want = flatten(ref["logits"][t]);
    a.logits = std::max(a.logits, rel_diff(&logits[t * V], want.data(), V));
  }
  const auto kda_layers = ref["kda_layers"].get<std::vector<int>>();
  for (size_t i = 0; i < kda_layers.size(); ++i) {
    const KimiLayer& L = m.layers()[static_cast<size_t>(kda_layers[i])];
    EXPECT_FALSE(L.mla);
    const auto S = flatten(ref["kda_state"][i]);
    const auto conv = flatten(ref["conv_window"][i]);
    EXPECT_EQ(S.size(), static_cast<size_t>(s.state.n_v_heads * s.state.v_dim * s.state.k_dim));
    a.state = std::max(a.state, rel_diff(s.state.S_at(L.cache_index, 0), S.data(), S.size()));
    a.conv = std::max(a.conv, rel_diff(s.state.conv_at(L.cache_index), conv.data(), conv.size()));
  }
  const auto mla_layers = ref["mla_layers"].get<std::vector<int>>();
  for (size_t i = 0; i < mla_layers.size(); ++i) {
    const KimiLayer& L = m.layers()[static_cast<size_t>(mla_layers[i])];
    EXPECT_TRUE(L.mla);
    const auto K = flatten(ref["mla_k"][i]);
    const auto Vv = flatten(ref["mla_v"][i]);
    EXPECT_EQ(K.size(), tokens.size() * static_cast<size_t>(s.cache.kv_dim));
    EXPECT_EQ(Vv.size(), tokens.size() * static_cast<size_t>(s.cache.v_width()));
    // The cache as [position][K or V row] (it is stored head-major).
    std::vector<float> k_rows(K.size()), v_rows(Vv.size());
    for (size_t p = 0; p < tokens.size(); ++p)
      s.cache.load(L.cache_index, static_cast<int>(p), k_rows.data() + p * static_cast<size_t>(s.cache.kv_dim),
                   v_rows.data() + p * static_cast<size_t>(s.cache.v_width()));
    a.k = std::max(a.k, rel_diff(k_rows.data(), K.data(), K.size()));
    a.v = std::max(a.v, rel_diff(v_rows.data(), Vv.data(), Vv.size()));
  }
  fmt::print("  {:<10} vs NumPy: logits {:.2e}, KDA S {:.2e}, conv {:.2e}, MLA K {:.2e}, V {:.2e}\n", ex.name(),
             a.logits, a.state, a.conv, a.k, a.v);
  return a;
}

TEST(KimiFixture, ConfigMatchesThePreset) {
  const KimiConfig& c = fixture_model(false).config();
  const KimiConfig& p = *find_kimi_preset("kimi-k3-mini");
  EXPECT_EQ(kimi_config_to_json(c), kimi_config_to_json(p));
  // The flash-linear-attention check the generator ran (fla computes in f32).
  for (const auto& [k, v] : reference()["fla_agreement"].items()) EXPECT_LT(v.get<double>(), 1e-5) << k;
  // And of MLA and the router against transformers' DeepSeek-V3 modules
  // (their softmax and router run in f32).
  const auto& tf = reference()["transformers_deepseek_v3_agreement"];
  EXPECT_LT(tf["mla_attention"].get<double>(), 1e-5);
  EXPECT_LT(tf["router_weights"].get<double>(), 1e-5);
  EXPECT_EQ(tf["router_ids_mismatch"].get<int>(), 0);
}

TEST(KimiFixture, ReferenceExecutorMatchesNumpy) {
  for (bool fp8 : {false, true}) {
    const KimiModel& m = fixture_model(fp8);
    const DecodeProgram p = build_kimi_program(m, 1);
    auto ex = make_reference_executor(p);
    EXPECT_LT(against_numpy(m, *ex).worst(), 1e-4) << (fp8 ? "fp8 experts" : "mxfp4 experts");
  }
}

TEST(KimiFixture, OptimisedExecutorsMatchNumpy) {
  for (bool fp8 : {true, false}) {
    const KimiModel& m = fixture_model(fp8);
    const DecodeProgram p = build_kimi_program(m, 2);
    auto obo = make_opbyop_executor(p, pool());
    auto mega = make_mega_executor(p, pool());
    const Agreement a = against_numpy(m, *obo), b = against_numpy(m, *mega);
    // FP8 experts: f32 activations everywhere. MXFP4: int16 expert inputs.
    const double tol = fp8 ? 1e-4 : 2e-3;
    EXPECT_LT(a.worst(), tol) << (fp8 ? "fp8" : "mxfp4");
    EXPECT_LT(b.worst(), tol) << (fp8 ? "fp8" : "mxfp4");
    EXPECT_EQ(a.logits, b.logits);
    EXPECT_EQ(a.state, b.state);
  }
}

// Prefill in blocks (5, 4, 3 rows of one sequence per step): KDA in its
// chunked form, MLA causal within the block. Logits of every position and the
// final KDA states agree with the NumPy reference within 1e-4 (FP8 experts,
// f32 activations), under every executor; op-by-op and mega bit for bit.
TEST(KimiFixture, ChunkedPrefillMatchesNumpy) {
  const KimiModel& m = fixture_model(true);
  const nlohmann::json& ref = reference();
  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  ASSERT_EQ(tokens.size(), 12u);
  const DecodeProgram p = build_kimi_program(m, 5);
  const size_t V = static_cast<size_t>(m.n_vocab());
  std::map<std::string, std::vector<float>> all;
  for (const char* kind : {"reference", "opbyop", "mega"}) {
    auto ex = make_executor(kind, p, pool());
    Seq s{make_cache(m, 32), make_state(m), 0};
    std::vector<float> logits(tokens.size() * V);
    size_t t = 0;
    for (int n : {5, 4, 3}) {
      std::vector<RowInput> rows;
      for (int i = 0; i < n; ++i) rows.push_back({tokens[t + i], static_cast<int32_t>(t + i), &s.cache, &s.state});
      ex->step(rows, &logits[t * V]);
      t += static_cast<size_t>(n);
    }
    double dl = 0, ds = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const auto want = flatten(ref["logits"][i]);
      dl = std::max(dl, rel_diff(&logits[i * V], want.data(), V));
    }
    const auto kda_layers = ref["kda_layers"].get<std::vector<int>>();
    for (size_t i = 0; i < kda_layers.size(); ++i) {
      const KimiLayer& L = m.layers()[static_cast<size_t>(kda_layers[i])];
      const auto S = flatten(ref["kda_state"][i]);
      ds = std::max(ds, rel_diff(s.state.S_at(L.cache_index, 0), S.data(), S.size()));
    }
    fmt::print("  {:<10} blocks 5,4,3 vs NumPy: logits {:.2e}, KDA S {:.2e}\n", kind, dl, ds);
    EXPECT_LT(dl, 1e-4) << kind;
    EXPECT_LT(ds, 1e-4) << kind;
    all[kind] = logits;
  }
  EXPECT_EQ(all["opbyop"], all["mega"]);
}

// E8M0 exponents 0 and 255 are rejected at load, as the reference loader does
// (kimi/load.py Checkpoint.experts: "expected normal, finite E8M0 scales");
// before, exponent 0 loaded as 2^-127 and 255 as 2^128.
TEST(KimiModel, RejectsNonNormalMxfp4Scales) {
  const KimiModel& m = synthetic_mini();
  const fs::path dir = temp_dir("e8m0");
  m.save(dir.string());
  const std::string name = "model.layers.4.mlp.experts.5.up_proj.weight_scales";
  const fs::path file = dir / "model.safetensors";
  uint64_t n = 0;
  nlohmann::json header;
  {
    std::ifstream f(file, std::ios::binary);
    f.read(reinterpret_cast<char*>(&n), 8);
    std::string h(n, ' ');
    f.read(h.data(), static_cast<std::streamsize>(n));
    header = nlohmann::json::parse(h);
  }
  ASSERT_TRUE(header.contains(name));
  const uint64_t at = 8 + n + header[name]["data_offsets"][0].get<uint64_t>() + 7;  // [32][1]: row 7, block 0
  for (int bad : {0, 255}) {
    {
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(at));
      const char b = static_cast<char>(bad);
      f.write(&b, 1);
    }
    try {
      KimiModel::load(dir.string());
      ADD_FAILURE() << "exponent " << bad << " loaded";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(name), std::string::npos) << msg;
      EXPECT_NE(msg.find(fmt::format("row 7 block 0 holds E8M0 exponent {}", bad)), std::string::npos) << msg;
    }
  }
  {  // A normal exponent loads again.
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    const char b = 127;
    f.write(&b, 1);
  }
  EXPECT_NO_THROW(KimiModel::load(dir.string()));
  fs::remove_all(dir);
}

// ---------------------------------------------------------------------------
// The reference's checkpoint layout (model/kimi_layout.cpp).

// tests/fixtures/kimi_reflayout holds the kimi_mini weights in the reference's
// names, shapes and config keys (scripts/fixtures/gen_kimi_reference_layout.py,
// each attention-residual weight as a _norm x _proj pair): it loads to the
// same config and the same logits, bit for bit.
TEST(KimiReferenceLayout, LoadsTheReferenceCheckpointBitForBit) {
  const KimiModel& ours = fixture_model(false);
  const auto ref = KimiModel::load(fixture_path("kimi_reflayout"));
  KimiConfig a = ours.config(), b = ref->config();
  b.name = a.name;
  EXPECT_EQ(kimi_config_to_json(a), kimi_config_to_json(b));
  const auto tokens = reference()["tokens"].get<std::vector<int32_t>>();
  const DecodeProgram pa = build_kimi_program(ours, 1), pb = build_kimi_program(*ref, 1);
  auto ea = make_reference_executor(pa);
  auto eb = make_reference_executor(pb);
  const auto la = decode(ours, *ea, tokens), lb = decode(*ref, *eb, tokens);
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0);
}

// The reference-layout fixture split over three shards: the weights are
// views of the mapped shards, so eight loads of it keep their logits bits
// (the same as our layout's and the single file's) and add much less
// anonymous memory than eight checkpoints' worth. What is still copied: the
// experts, re-blocked from split blocks and scales into MXFP4 blocks; the
// KDA input projection, stacked from five tensors; kv_b, split per head;
// the vectors, read as f32.
TEST(KimiReferenceLayout, ShardedCheckpointIsMappedNotCopied) {
  const fs::path dir = temp_dir("sharded");
  const size_t ckpt = write_sharded_checkpoint(fixture_path("kimi_reflayout") + "/model.safetensors", dir.string(), 3);
  const KimiModel& ours = fixture_model(false);
  const auto tokens = reference()["tokens"].get<std::vector<int32_t>>();
  const DecodeProgram pa = build_kimi_program(ours, 1);
  auto ea = make_reference_executor(pa);
  const auto la = decode(ours, *ea, tokens);
  std::vector<std::unique_ptr<KimiModel>> models;
  const LoadCost cost = measure_loads("kimi", 8, ckpt, [&] { models.push_back(KimiModel::load(dir.string())); });
  EXPECT_LT(cost.heap_share, 0.6);
  if (cost.anon_share >= 0) EXPECT_LT(cost.anon_share, 0.6);
  const DecodeProgram pb = build_kimi_program(*models.back(), 1);
  auto eb = make_reference_executor(pb);
  const auto lb = decode(*models.back(), *eb, tokens);
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0);
  std::printf("kimi: logits hash %016llx\n", static_cast<unsigned long long>(bits_hash(lb)));
  EXPECT_EQ(bits_hash(lb), 0x7419dde4022a73d1ull);  // as loaded by copying
  models.clear();
  fs::remove_all(dir);
}

TEST(KimiReferenceLayout, BadInputNamesWhatIsWrong) {
  const std::string src = fixture_path("kimi_reflayout");
  const fs::path dir = temp_dir("refbad");
  const fs::path cfg = dir / "config.json";
  fs::copy_file(src + "/config.json", cfg);
  auto file = SafetensorsFile::open(src + "/model.safetensors");
  auto rewrite = [&](const std::string& drop, const std::string& zero_scale) {
    nlohmann::json header = nlohmann::json::object();
    std::string data;
    for (const SafetensorsTensor& t : file->tensors()) {
      if (t.name == drop) continue;
      header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.n_bytes}}};
      data.append(reinterpret_cast<const char*>(t.data), t.n_bytes);
      if (t.name == zero_scale) data[data.size() - t.n_bytes + 2] = 0;
    }
    std::string h = header.dump();
    while (h.size() % 8) h += ' ';
    const uint64_t n = h.size();
    std::ofstream out(dir / "model.safetensors", std::ios::binary);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
  };
  auto error = [&] {
    try {
      KimiModel::load(dir.string());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string scale = "language_model.model.layers.4.block_sparse_moe.experts.5.w3.weight_scale";
  rewrite("", scale);
  std::string e = error();
  EXPECT_NE(e.find(scale + "' element 2 holds E8M0 exponent 0"), std::string::npos) << e;
  rewrite(scale, "");
  e = error();  // named as the loader reads it, in the translated (reference layout) checkpoint
  EXPECT_NE(e.find("model.layers.4.mlp.experts.5.up_proj.weight_scales' is missing"), std::string::npos) << e;
  EXPECT_NE(e.find("(the tensor is '" + scale + "' in the reference layout)"), std::string::npos) << e;
  rewrite("language_model.model.layers.2.mlp_res_proj.weight", "");
  e = error();
  EXPECT_NE(e.find("language_model.model.layers.2.mlp_res_norm.weight' has no _proj.weight partner"), std::string::npos)
      << e;
  rewrite("", "");
  EXPECT_NO_THROW(KimiModel::load(dir.string()));
  nlohmann::json j = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  nlohmann::json j2 = j;
  j2["text_config"].erase("num_experts_per_token");
  std::ofstream(cfg) << j2.dump();
  e = error();
  EXPECT_NE(e.find("num_experts_per_token"), std::string::npos) << e;
  j2 = j;
  j2["text_config"]["linear_attn_config"]["full_attn_layers"] = {4, 8};  // the last layer is missing
  std::ofstream(cfg) << j2.dump();
  e = error();
  EXPECT_NE(e.find("full_attn_layers does not follow"), std::string::npos) << e;
  j2 = j;
  j2["text_config"]["hidden_act"] = "silu";
  std::ofstream(cfg) << j2.dump();
  e = error();
  EXPECT_NE(e.find("hidden_act"), std::string::npos) << e;
  fs::remove_all(dir);
}

// ---------------------------------------------------------------------------
// Bad input.

TEST(KimiModel, BadInputGivesClearErrors) {
  const KimiModel& m = synthetic_mini();
  const fs::path dir = temp_dir("bad");
  m.save(dir.string());
  auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // A missing field in config.json.
  {
    std::ifstream f(dir / "config.json");
    nlohmann::json j = nlohmann::json::parse(f);
    j.erase("kv_lora_rank");
    std::ofstream(dir / "config.json") << j.dump();
    expect_error([&] { KimiModel::load(dir.string()); }, "kv_lora_rank");
    j["kv_lora_rank"] = 32;
    j["model_type"] = "deepseek_v3";
    std::ofstream(dir / "config.json") << j.dump();
    expect_error([&] { KimiModel::load(dir.string()); }, "kimi_k3");
    j["model_type"] = "kimi_k3";
    j["num_experts_per_tok"] = 9;
    std::ofstream(dir / "config.json") << j.dump();
    expect_error([&] { KimiModel::load(dir.string()); }, "n_expert_used must be in [1, n_expert]");
    j["num_experts_per_tok"] = 3;
    j["kv_lora_rank"] = 48;  // every MLA tensor now has the wrong shape
    std::ofstream(dir / "config.json") << j.dump();
    expect_error([&] { KimiModel::load(dir.string()); }, "model.layers.3.self_attn.kv_a_proj_with_mqa.weight' has shape [40, 64], expected [56, 64]");
  }
  // A missing tensor.
  {
    auto src = SafetensorsFile::open((dir / "model.safetensors").string());
    nlohmann::json header = nlohmann::json::object();
    std::string data;
    for (const SafetensorsTensor& t : src->tensors()) {
      if (t.name == "model.layers.4.mlp.experts.5.up_proj.weight_scales") continue;
      header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.n_bytes}}};
      data.append(reinterpret_cast<const char*>(t.data), t.n_bytes);
    }
    const fs::path d2 = temp_dir("bad2");
    std::filesystem::copy_file(dir / "config.json", d2 / "config.json");
    {
      nlohmann::json j = nlohmann::json::parse(std::ifstream(d2 / "config.json"));
      j["kv_lora_rank"] = 32;
      std::ofstream(d2 / "config.json") << j.dump();
    }
    std::string h = header.dump();
    while (h.size() % 8) h += ' ';
    const uint64_t n = h.size();
    std::ofstream out(d2 / "model.safetensors", std::ios::binary);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.close();
    expect_error([&] { KimiModel::load(d2.string()); }, "'model.layers.4.mlp.experts.5.up_proj.weight_scales' is missing");
    fs::remove_all(d2);
  }
  expect_error([&] { KimiModel::load((dir / "nowhere").string()); }, "not a directory");
  // A token outside the vocabulary, a row without state.
  const DecodeProgram p = build_kimi_program(m, 2);
  auto ex = make_reference_executor(p);
  KVCache kv = make_cache(m, 8);
  RecurrentState st = make_state(m);
  std::vector<float> logits(2 * 256);
  expect_error([&] { ex->step({{256, 0, &kv, &st}}, logits.data()); }, "outside the vocabulary");
  expect_error([&] { ex->step({{1, 0, &kv, nullptr}}, logits.data()); }, "no recurrent state");
  expect_error([&] { build_kimi_program(m, 0); }, "max_rows");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace megakern
