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

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "io/gguf.h"
#include "model/dense.h"
#include "runtime/sampler.h"
#include "test_util.h"

namespace megakern {
namespace {

struct Agreement {
  int positions = 0, top1_match = 0;
  double max_abs = 0, sum_abs = 0;
  int n_abs = 0;
  double max_lse = 0;
};

Agreement check_model(const std::string& model_name, const std::string& fixture) {
  Agreement a;
  std::ifstream in(fixture_path(fixture));
  EXPECT_TRUE(in.good()) << "missing fixture " << fixture;
  if (!in.good()) return a;
  const nlohmann::json j = nlohmann::json::parse(in);
  auto f = GGUFFile::open(test_model_path(model_name));
  auto m = DenseModel::load(*f);
  ThreadPool pool(0);
  const int V = m->config().n_vocab;
  for (const auto& p : j.at("prompts")) {
    const std::vector<int32_t> toks = p.at("tokens").get<std::vector<int32_t>>();
    const auto& pos = p.at("positions");
    const int n = static_cast<int>(toks.size());
    EXPECT_EQ(static_cast<int>(pos.size()), n);
    KVCache cache = m->make_cache(n);
    std::vector<float> logits(static_cast<size_t>(n) * V);
    m->forward(pool, cache, toks.data(), n, 0, n, logits.data());
    for (int t = 0; t < n && t < static_cast<int>(pos.size()); ++t) {
      const float* l = &logits[static_cast<size_t>(t) * V];
      const auto& ref = pos[static_cast<size_t>(t)];
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

}  // namespace
}  // namespace megakern
