// Sampling: greedy, temperature, top-k, top-p and seeding.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

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

// The nucleus is found by sorting only a growing head of the vocabulary; it
// must equal the nucleus of a full sort, for heads that need growing too.
TEST(Sampler, NucleusOfPartialSortEqualsFullSort) {
  std::mt19937_64 g(7);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int trial = 0; trial < 6; ++trial) {
    const int n = 5000;
    std::vector<float> l(n);
    for (auto& x : l) x = nd(g);
    l[static_cast<size_t>(trial)] = l[static_cast<size_t>(trial + 1)];  // a tie
    for (float top_p : {0.05f, 0.5f, 0.9f, 0.999f}) {
      const float T = trial % 2 ? 0.6f : 2.5f;  // 2.5: the nucleus spans thousands of tokens
      Sampler s({T, 0, top_p, 1});
      const auto d = s.distribution(l.data(), n);
      std::vector<int> ids(n);
      for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i;
      std::sort(ids.begin(), ids.end(), [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
      double z = 0;
      for (int i : ids) z += std::exp((l[i] - l[ids[0]]) / T);
      size_t cut = 0;
      double cum = 0;
      while (cut < ids.size()) {
        cum += std::exp((l[ids[cut]] - l[ids[0]]) / T) / z;
        ++cut;
        if (cum >= top_p) break;
      }
      ASSERT_EQ(d.size(), cut) << "top_p " << top_p << " T " << T;
      for (size_t i = 0; i < cut; ++i) EXPECT_EQ(d[i].first, ids[i]);
    }
  }
}

// Sampling with a nucleus follows the renormalised nucleus.
TEST(Sampler, NucleusFrequenciesFollowTheDistribution) {
  const std::vector<float> l = {0.f, 0.5f, 1.f, 1.5f, -3.f};
  Sampler s({1.f, 0, 0.8f, 99});
  const auto d = s.distribution(l.data(), 5);
  ASSERT_EQ(d.size(), 3u);  // 1.5, 1.0, 0.5 hold >= 80 %
  const int N = 30000;
  std::map<int, int> count;
  for (int i = 0; i < N; ++i) count[s.sample(l.data(), 5)]++;
  double chi2 = 0;
  for (const auto& [id, p] : d) chi2 += (count[id] - N * p) * (count[id] - N * p) / (N * p);
  EXPECT_EQ(count[0] + count[4], 0);
  EXPECT_LT(chi2, 30.0);
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
