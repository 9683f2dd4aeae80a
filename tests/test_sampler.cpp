// Sampling: greedy, temperature, top-k, top-p and seeding.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "runtime/sampler.h"

namespace megakern {
namespace {

TEST(Sampler, GreedyPicksArgmaxWithTiesToLowestId) {
  const std::vector<float> l = {0.f, 3.f, 1.f, 3.f, NAN};
  Sampler s({});
  EXPECT_EQ(s.sample(l.data(), 5), 1);
  EXPECT_EQ(argmax(l.data(), 5), 1);
}

TEST(Sampler, RejectsBadParameters) {
  EXPECT_THROW(Sampler({-0.1f, 0, 1.f, 0}), Error);
  EXPECT_THROW(Sampler({NAN, 0, 1.f, 0}), Error);
  EXPECT_THROW(Sampler({1.f, -1, 1.f, 0}), Error);
  EXPECT_THROW(Sampler({1.f, 0, 0.f, 0}), Error);
  EXPECT_THROW(Sampler({1.f, 0, 1.5f, 0}), Error);
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> l(50);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(static_cast<float>(i));
  Sampler a({1.f, 0, 1.f, 99}), b({1.f, 0, 1.f, 99}), c({1.f, 0, 1.f, 100});
  int diff = 0;
  for (int i = 0; i < 100; ++i) {
    const int x = a.sample(l.data(), 50);
    EXPECT_EQ(x, b.sample(l.data(), 50));
    diff += x != c.sample(l.data(), 50);
  }
  EXPECT_GT(diff, 0);
}

TEST(Sampler, TopKAndTopPRestrictTheSupport) {
  const std::vector<float> l = {2.f, 1.f, 0.f, -1.f, 3.f};
  Sampler k2({1.f, 2, 1.f, 1});
  auto d = k2.distribution(l.data(), 5);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].first, 4);
  EXPECT_EQ(d[1].first, 0);
  EXPECT_NEAR(d[0].second, 1.0 / (1.0 + std::exp(-1.0)), 1e-12);
  // top_p: probabilities at T=1 are about .64 .24 .09 .03 .01 for ids 4 0 1 2 3.
  Sampler p({1.f, 0, 0.8f, 1});
  d = p.distribution(l.data(), 5);
  ASSERT_EQ(d.size(), 2u);
  for (int i = 0; i < 200; ++i) {
    const int x = p.sample(l.data(), 5);
    EXPECT_TRUE(x == 4 || x == 0);
  }
}

// Empirical frequencies match the softmax at the temperature (chi-square with
// a generous bound: the test fails only for a biased sampler, p < 1e-6).
TEST(Sampler, FrequenciesFollowTheDistribution) {
  const std::vector<float> l = {0.f, 0.5f, 1.f, 1.5f};
  const float T = 0.7f;
  Sampler s({T, 0, 1.f, 2024});
  const int N = 40000;
  std::map<int, int> count;
  for (int i = 0; i < N; ++i) count[s.sample(l.data(), 4)]++;
  double z = 0;
  for (float x : l) z += std::exp(x / T);
  double chi2 = 0;
  for (int i = 0; i < 4; ++i) {
    const double e = N * std::exp(l[i] / T) / z;
    chi2 += (count[i] - e) * (count[i] - e) / e;
  }
  EXPECT_LT(chi2, 30.0);  // 3 degrees of freedom
}

TEST(Sampler, InfiniteLogitsDoNotBreakSampling) {
  const std::vector<float> l = {INFINITY, 0.f, -INFINITY};
  Sampler s({1.f, 0, 1.f, 3});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(l.data(), 3), 0);
  const std::vector<float> none = {-INFINITY, NAN};
  EXPECT_THROW(s.sample(none.data(), 2), Error);
  // -inf entries are excluded, finite ones sampled normally.
  const std::vector<float> mixed = {-INFINITY, 1.f, 1.f};
  for (int i = 0; i < 20; ++i) EXPECT_NE(s.sample(mixed.data(), 3), 0);
}

}  // namespace
}  // namespace megakern
