// Teacher-forced logits of the real models against an independent reference
// (tests/fixtures/fidelity_*.json, written by scripts/fixtures/gen_fidelity_fixture.py
// from transformers running the dequantised GGUF weights in float32).
//
// Tolerances: top-1 agreement >= 99 % of positions; the reference's top-16
// logits within 2.5e-2 absolute at every position, and the log-sum-exp within
// 2.5e-2. The reference runs f32 activations; our quantised-weight kernels
// quantise activations to int16 per 32 values (kernels/cpu/qmatmul.h), which
// moves logits by at most about 0.012 (measured: SmolLM2 0.0116, Gemma 3
// 0.0044 with AVX2; 0.0125 / 0.0066 on the scalar path).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "io/gguf.h"
#include "model/dense.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/engine.h"
#include "test_util.h"
#include "model_state.h"

namespace megakern {
namespace {

struct Agreement {
  int positions = 0, top1_match = 0;
  double max_abs = 0, sum_abs = 0;
  int n_abs = 0;
  double max_lse = 0;
};

// One row of logits against the fixture's position entry: top-1, the
// reference's top-k logits and the log-sum-exp.
void add_position(const float* l, int V, const nlohmann::json& ref, Agreement& a) {
  a.positions++;
  a.top1_match += argmax(l, V) == ref.at("top1").get<int>();
  const auto ids = ref.at("topk_ids").get<std::vector<int>>();
  const auto vals = ref.at("topk_logits").get<std::vector<double>>();
  for (size_t k = 0; k < ids.size(); ++k) {
    const double d = std::fabs(l[ids[k]] - vals[k]);
    a.max_abs = std::max(a.max_abs, d);
    a.sum_abs += d;
    a.n_abs++;
  }
  double mx = -INFINITY, s = 0;
  for (int v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(l[v]));
  for (int v = 0; v < V; ++v) s += std::exp(l[v] - mx);
  a.max_lse = std::max(a.max_lse, std::fabs(mx + std::log(s) - ref.at("lse").get<double>()));
}

Agreement check_model(const std::string& model_name, const std::string& fixture) {
  Agreement a;
  std::ifstream in(fixture_path(fixture));
  EXPECT_TRUE(in.good()) << "missing fixture " << fixture;
  if (!in.good()) return a;
  const nlohmann::json j = nlohmann::json::parse(in);
  auto m = load_model(test_model_path(model_name));
  ThreadPool pool(0);
  Engine e(*m, pool, default_prompt_block(*m));
  const int V = m->n_vocab();
  for (const auto& p : j.at("prompts")) {
    const std::vector<int32_t> toks = p.at("tokens").get<std::vector<int32_t>>();
    const auto& pos = p.at("positions");
    const int n = static_cast<int>(toks.size());
    EXPECT_EQ(static_cast<int>(pos.size()), n);
    SequenceState seq = m->new_sequence(n);
    const std::vector<float> logits = forced_logits(e, seq, toks);
    for (int t = 0; t < n && t < static_cast<int>(pos.size()); ++t) {
      add_position(&logits[static_cast<size_t>(t) * V], V, pos[static_cast<size_t>(t)], a);
    }
  }
  return a;
}

void report(const std::string& name, const Agreement& a) {
  const double top1 = a.positions ? 100.0 * a.top1_match / a.positions : 0;
  std::printf("[fidelity] %s: %d positions, top-1 agreement %.2f %%, |logit diff| max %.5f mean %.6f, |lse diff| max %.5f\n",
              name.c_str(), a.positions, top1, a.max_abs, a.n_abs ? a.sum_abs / a.n_abs : 0.0, a.max_lse);
  ::testing::Test::RecordProperty("top1_percent", std::to_string(top1));
  ::testing::Test::RecordProperty("max_abs_logit_diff", std::to_string(a.max_abs));
  EXPECT_GE(a.positions, 192);
  EXPECT_GE(top1, 99.0);
  // The matrix kernels quantise activations to int16 per 32-block (see
  // src/kernels/cpu/qmatmul.h), which moves logits more than f32 summation
  // order did (~1e-4). Measured with it: |logit diff| max 0.0116 (AVX2) /
  // 0.0125 (scalar) for SmolLM2, 0.0044 / 0.0066 for Gemma 3; |lse diff| max
  // 0.0106 / 0.0113 and 0.0037 / 0.0056; top-1 agreement 100 % for both.
  // The bounds are about 2x the largest of these.
  EXPECT_LT(a.max_abs, 2.5e-2);
  EXPECT_LT(a.max_lse, 2.5e-2);
}

TEST(Fidelity, SmolLM2MatchesReference) {
  if (test_model_path("smollm2-135m").empty()) GTEST_SKIP() << "models/smollm2-135m.gguf not fetched";
  report("smollm2-135m", check_model("smollm2-135m", "fidelity_smollm2.json"));
}

TEST(Fidelity, Gemma3MatchesReference) {
  if (test_model_path("gemma3-270m").empty()) GTEST_SKIP() << "models/gemma3-270m.gguf not fetched";
  report("gemma3-270m", check_model("gemma3-270m", "fidelity_gemma3.json"));
}

// Qwen2.5-Coder-0.5B-Instruct (qwen2: q/k/v biases; Q5_0 / Q8_0 / Q4_K / Q6_K).
TEST(Fidelity, Qwen25CoderMatchesReference) {
  if (test_model_path("qwen2.5-coder-0.5b").empty()) GTEST_SKIP() << "models/qwen2.5-coder-0.5b.gguf not fetched";
  report("qwen2.5-coder-0.5b", check_model("qwen2.5-coder-0.5b", "fidelity_qwen25coder.json"));
}

// ---- The real models through the engine that serves, in both numerics modes ----
//
// The fixtures' prompts in steps of 16 rows (causal within a step, as a
// prompt block) through each executor. Exact mode: the bounds above, and
// the op-by-op and megakernel logits the same bits. Fast mode (8-bit
// activations): against the reference top-1 and the exact mode's full
// distributions, KL(exact || fast) per position. Measured (Zen 4; the fast
// mode's bits are the same on every ISA): SmolLM2 KL mean 0.0035, max
// 0.046, top-1 vs reference 97.1 %; Gemma 3 mean 0.0043, max 0.029, top-1
// 95.4 %; Qwen2.5-Coder mean 0.0012, max 0.050, top-1 98.7 % (238-239
// positions each). The bounds, about 1.4x / 2x / 1.4 points from the worst:
// KL mean <= 0.006, max <= 0.1, top-1 >= 94 %. (llama.cpp quotes KL ~0.003
// and same-top-1 ~96.5 % for its q8 activations over long contexts; Gemma 3
// is above that here.)
struct EngineRun {
  std::vector<std::vector<float>> logits;  // per prompt, [n][V]
  int V = 0;
};

EngineRun run_engine(const std::string& model_name, const nlohmann::json& j, const std::string& executor,
                     Numerics numerics) {
  ModelOptions opts;
  opts.numerics = numerics;
  auto m = load_model(test_model_path(model_name), opts);
  ThreadPool pool(2);
  constexpr int kBlock = 16;
  Engine e(*m, pool, kBlock, executor);
  EngineRun r;
  r.V = e.n_vocab();
  for (const auto& p : j.at("prompts")) {
    const auto toks = p.at("tokens").get<std::vector<int32_t>>();
    const int n = static_cast<int>(toks.size());
    SequenceState seq = m->new_sequence(n);
    std::vector<float> all(static_cast<size_t>(n) * r.V);
    for (int t0 = 0; t0 < n; t0 += kBlock) {
      std::vector<RowInput> rows;
      for (int t = t0; t < std::min(n, t0 + kBlock); ++t) rows.push_back(seq.row(toks[t], t));
      e.step(rows, all.data() + static_cast<size_t>(t0) * r.V);
    }
    r.logits.push_back(std::move(all));
  }
  return r;
}

Agreement agreement(const EngineRun& r, const nlohmann::json& j) {
  Agreement a;
  size_t i = 0;
  for (const auto& p : j.at("prompts")) {
    const auto& pos = p.at("positions");
    const std::vector<float>& l = r.logits[i++];
    for (size_t t = 0; t < pos.size(); ++t) add_position(&l[t * r.V], r.V, pos[t], a);
  }
  return a;
}

// KL(p || q) of two rows of logits, in double.
double kl_logits(const float* p, const float* q, int V) {
  double mp = -INFINITY, mq = -INFINITY;
  for (int v = 0; v < V; ++v) mp = std::max(mp, (double)p[v]), mq = std::max(mq, (double)q[v]);
  double zp = 0, zq = 0;
  for (int v = 0; v < V; ++v) zp += std::exp(p[v] - mp), zq += std::exp(q[v] - mq);
  const double lp0 = mp + std::log(zp), lq0 = mq + std::log(zq);
  double kl = 0;
  for (int v = 0; v < V; ++v) {
    const double lp = p[v] - lp0, lq = q[v] - lq0;
    kl += std::exp(lp) * (lp - lq);
  }
  return kl;
}

void check_engine_modes(const std::string& model_name, const std::string& fixture) {
  std::ifstream in(fixture_path(fixture));
  ASSERT_TRUE(in.good()) << "missing fixture " << fixture;
  const nlohmann::json j = nlohmann::json::parse(in);
  const EngineRun exact = run_engine(model_name, j, "mega", Numerics::Exact);
  {
    const Agreement a = agreement(exact, j);
    report(model_name + " mega exact", a);
    const EngineRun ob = run_engine(model_name, j, "opbyop", Numerics::Exact);
    for (size_t i = 0; i < exact.logits.size(); ++i)
      EXPECT_EQ(std::memcmp(exact.logits[i].data(), ob.logits[i].data(), exact.logits[i].size() * sizeof(float)), 0)
          << "op-by-op and megakernel logits differ, prompt " << i;
  }
  for (const char* ex : {"mega", "opbyop"}) {
    const EngineRun fast = run_engine(model_name, j, ex, Numerics::Fast);
    const Agreement a = agreement(fast, j);
    double kl_sum = 0, kl_max = 0;
    int n = 0;
    for (size_t i = 0; i < exact.logits.size(); ++i)
      for (size_t t = 0; t * exact.V < exact.logits[i].size(); ++t) {
        const double kl = kl_logits(&exact.logits[i][t * exact.V], &fast.logits[i][t * fast.V], exact.V);
        kl_sum += kl;
        kl_max = std::max(kl_max, kl);
        ++n;
      }
    const double top1 = 100.0 * a.top1_match / std::max(1, a.positions);
    std::printf("[fidelity] %s %s fast: %d positions, top-1 vs reference %.2f %%, KL(exact||fast) mean %.5f max %.5f, "
                "|logit diff| max %.4f\n",
                model_name.c_str(), ex, n, top1, kl_sum / n, kl_max, a.max_abs);
    EXPECT_GT(kl_sum / n, 0.0) << "the fast mode should differ from the exact one";
    EXPECT_LE(kl_sum / n, 0.006) << model_name << " " << ex;
    EXPECT_LE(kl_max, 0.1) << model_name << " " << ex;
    EXPECT_GE(top1, 94.0) << model_name << " " << ex;
  }
}

TEST(Fidelity, SmolLM2ThroughTheExecutorsInBothModes) {
  if (test_model_path("smollm2-135m").empty()) GTEST_SKIP() << "models/smollm2-135m.gguf not fetched";
  check_engine_modes("smollm2-135m", "fidelity_smollm2.json");
}

TEST(Fidelity, Gemma3ThroughTheExecutorsInBothModes) {
  if (test_model_path("gemma3-270m").empty()) GTEST_SKIP() << "models/gemma3-270m.gguf not fetched";
  check_engine_modes("gemma3-270m", "fidelity_gemma3.json");
}

TEST(Fidelity, Qwen25CoderThroughTheExecutorsInBothModes) {
  if (test_model_path("qwen2.5-coder-0.5b").empty()) GTEST_SKIP() << "models/qwen2.5-coder-0.5b.gguf not fetched";
  check_engine_modes("qwen2.5-coder-0.5b", "fidelity_qwen25coder.json");
}

// ---- Small random-weight qwen3 and gemma3 models against transformers ----------------
//
// tests/fixtures/dense_{qwen3,gemma3}_mini.gguf and fidelity_{qwen3,gemma3}_mini.json,
// written by scripts/fixtures/gen_dense_mini_fixture.py: weights stored exactly (F32,
// or F16 for gemma3, with transformers given the same rounded values), so what is
// left is float32 rounding (summation order, exp/tanh implementations). The
// reference's own float32-vs-float64 difference (checks.fp64_max_abs) is 5.7e-6
// (qwen3) and 2.5e-5 (gemma3) on logits of RMS ~3-4; ours, measured on every path
// (direct forward, reference / op-by-op / megakernel executors, AVX2 and scalar):
// max 6.6e-6 (qwen3) and 3.0e-4 (gemma3, 720 positions). The bound, 2e-3 absolute
// on the top-16 logits and the log-sum-exp, is ~7x the largest of these and ~4
// orders of magnitude below what switching gemma3's window off does
// (checks.no_window_max_abs = 25). Top-1 must agree wherever the reference's
// top-1/top-2 gap exceeds twice the bound.

constexpr double kMiniTol = 2e-3;

// Per-position checks of one row of logits against the fixture's position entry.
void compare_position(const float* l, int V, const nlohmann::json& ref, Agreement& a) {
  a.positions++;
  const auto ids = ref.at("topk_ids").get<std::vector<int>>();
  const auto vals = ref.at("topk_logits").get<std::vector<double>>();
  const bool clear_top1 = vals.size() < 2 || vals[0] - vals[1] > 2 * kMiniTol;
  const int top1 = argmax(l, V);
  a.top1_match += top1 == ref.at("top1").get<int>() || !clear_top1;
  for (size_t k = 0; k < ids.size(); ++k) {
    const double d = std::fabs(l[ids[k]] - vals[k]);
    a.max_abs = std::max(a.max_abs, d);
    a.sum_abs += d;
    a.n_abs++;
  }
  double mx = -INFINITY, s = 0;
  for (int v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(l[v]));
  for (int v = 0; v < V; ++v) s += std::exp(l[v] - mx);
  const double dl = std::fabs(mx + std::log(s) - ref.at("lse").get<double>());
  a.max_lse = std::max(a.max_lse, dl);
}

void expect_mini_agreement(const std::string& what, const Agreement& a, int want_positions) {
  std::printf("[fidelity] %s: %d positions, top-1 %d/%d, |logit diff| max %.3g mean %.3g, |lse diff| max %.3g\n",
              what.c_str(), a.positions, a.top1_match, a.positions, a.max_abs, a.n_abs ? a.sum_abs / a.n_abs : 0.0,
              a.max_lse);
  EXPECT_EQ(a.positions, want_positions) << what;
  EXPECT_EQ(a.top1_match, a.positions) << what;
  EXPECT_LT(a.max_abs, kMiniTol) << what;
  EXPECT_LT(a.max_lse, kMiniTol) << what;
}

int fixture_positions(const nlohmann::json& j) {
  int n = 0;
  for (const auto& p : j.at("prompts")) n += static_cast<int>(p.at("tokens").size());
  return n;
}

// The prompt pass (Engine::teacher_forced_logits in blocks of the model's
// prompt block, one pass of each prompt).
void check_mini_direct(const std::string& gguf, const std::string& fixture) {
  const auto& j = fixture_json(fixture);
  auto m = load_model(fixture_path(gguf));
  ThreadPool pool(2);
  Engine e(*m, pool, default_prompt_block(*m));
  const int V = m->n_vocab();
  Agreement a;
  for (const auto& p : j.at("prompts")) {
    const auto toks = p.at("tokens").get<std::vector<int32_t>>();
    SequenceState seq = m->new_sequence(static_cast<int>(toks.size()));
    const std::vector<float> logits = forced_logits(e, seq, toks);
    const int n = static_cast<int>(toks.size());
    for (int t = 0; t < n; ++t) compare_position(&logits[static_cast<size_t>(t) * V], V, p.at("positions")[t], a);
  }
  expect_mini_agreement(gguf + " direct forward", a, fixture_positions(j));
}

// The DecodeProgram executors, one decode step per position (the path of
// generation, the server and speculation; sliding-window layers keep a ring
// of positions there).
void check_mini_executor(const std::string& gguf, const std::string& fixture, const std::string& executor) {
  const auto& j = fixture_json(fixture);
  auto m = load_model(fixture_path(gguf));
  ThreadPool pool(2);
  Engine e(*m, pool, 1, executor);
  const int V = e.n_vocab();
  Agreement a;
  std::vector<float> logits(static_cast<size_t>(V));
  for (const auto& p : j.at("prompts")) {
    const auto toks = p.at("tokens").get<std::vector<int32_t>>();
    SequenceState seq = m->new_sequence(static_cast<int>(toks.size()));
    for (size_t t = 0; t < toks.size(); ++t) {
      e.step({seq.row(toks[t], static_cast<int32_t>(t))}, logits.data());
      compare_position(logits.data(), V, p.at("positions")[t], a);
    }
  }
  expect_mini_agreement(gguf + " " + executor + " executor", a, fixture_positions(j));
}

TEST(Fidelity, Qwen3MiniMatchesTransformers) {
  check_mini_direct("dense_qwen3_mini.gguf", "fidelity_qwen3_mini.json");
  for (const char* ex : {"reference", "opbyop", "mega"})
    check_mini_executor("dense_qwen3_mini.gguf", "fidelity_qwen3_mini.json", ex);
}

// 720 positions with a window of 48: every sliding-window layer drops keys
// at 672 of them.
TEST(Fidelity, Gemma3MiniBeyondTheSlidingWindowMatchesTransformers) {
  const auto& j = fixture_json("fidelity_gemma3_mini.json");
  ASSERT_GE(fixture_positions(j), 700);
  const int window = j.at("config").at("window").get<int>();
  ASSERT_LE(window * 10, fixture_positions(j));
  // The fixture discriminates: without the window the reference moves by
  // more than the bound by three orders of magnitude.
  EXPECT_GT(j.at("checks").at("no_window_max_abs").get<double>(), 1000 * kMiniTol);
  auto f = GGUFFile::open(fixture_path("dense_gemma3_mini.gguf"));
  auto m = DenseModel::load(*f);
  EXPECT_EQ(m->config().sliding_window, window);
  check_mini_direct("dense_gemma3_mini.gguf", "fidelity_gemma3_mini.json");
  for (const char* ex : {"reference", "opbyop", "mega"})
    check_mini_executor("dense_gemma3_mini.gguf", "fidelity_gemma3_mini.json", ex);
}

}  // namespace
}  // namespace megakern
