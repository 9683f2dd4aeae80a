// Sampling: greedy, temperature, top-k, top-p and seeding.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include <cmath>
#include <limits>
#include <map>
#include <string>

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

// Sampling with a nucleus follows the renormalised nucleus (expectation
// worked out by hand, not taken from distribution()).
TEST(Sampler, NucleusFrequenciesFollowTheDistribution) {
  const std::vector<float> l = {0.f, 0.5f, 1.f, 1.5f, -3.f};
  Sampler s({1.f, 0, 0.8f, 99});
  // By hand: softmax weights e^1.5, e^1, e^0.5, e^0, e^-3 have masses
  // .4754 .2883 .1749 .1061 .0052, so the nucleus of 0.8 is ids 3, 2, 1 and
  // its renormalised probabilities are e^1.5, e^1, e^0.5 over their sum.
  const double z = std::exp(1.5) + std::exp(1.0) + std::exp(0.5);
  const std::map<int, double> expect = {{3, std::exp(1.5) / z}, {2, std::exp(1.0) / z}, {1, std::exp(0.5) / z}};
  const int N = 30000;
  std::map<int, int> count;
  for (int i = 0; i < N; ++i) count[s.sample(l.data(), 5)]++;
  double chi2 = 0;
  for (const auto& [id, p] : expect) chi2 += (count[id] - N * p) * (count[id] - N * p) / (N * p);
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

// ---------------------------------------------------------------------------
// Independent expectations. `reference_probs` is written from the definitions
// (not from sampler.cpp): every finite logit is a candidate; candidates are
// ordered by decreasing logit, ties by increasing id; top-k keeps the first k;
// the softmax at temperature T is taken over what top-k kept; top-p then keeps
// the shortest prefix of that order whose probability mass reaches p, and the
// kept probabilities are renormalised. Temperature 0 is the argmax (ties to the
// lowest id). It uses a full sort and long double, so it shares neither the
// partial sorts nor the double arithmetic of the implementation.
std::vector<double> reference_probs(const std::vector<float>& l, float T, int k, float p) {
  const size_t n = l.size();
  std::vector<double> out(n, 0.0);
  std::vector<size_t> order;
  for (size_t i = 0; i < n; ++i)
    if (std::isfinite(l[i])) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return l[a] > l[b]; });
  if (order.empty()) return out;
  if (T == 0.f) {
    out[order[0]] = 1.0;
    return out;
  }
  if (k > 0 && static_cast<size_t>(k) < order.size()) order.resize(static_cast<size_t>(k));
  std::vector<long double> w(order.size());
  long double z = 0;
  for (size_t r = 0; r < order.size(); ++r) {
    w[r] = std::exp((static_cast<long double>(l[order[r]]) - l[order[0]]) / static_cast<long double>(T));
    z += w[r];
  }
  size_t keep = order.size();
  if (p < 1.f) {
    long double cum = 0;
    for (size_t r = 0; r < order.size(); ++r) {
      cum += w[r] / z;
      if (cum >= static_cast<long double>(p)) {
        keep = r + 1;
        break;
      }
    }
  }
  long double kept = 0;
  for (size_t r = 0; r < keep; ++r) kept += w[r];
  for (size_t r = 0; r < keep; ++r) out[order[r]] = static_cast<double>(w[r] / kept);
  return out;
}

// The chi-square quantile with `df` degrees of freedom at upper tail 1e-6
// (Wilson-Hilferty approximation, z = 4.753): a correct sampler exceeds it
// once in a million runs.
double chi2_bound(int df) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + 4.753 * std::sqrt(a), 3.0);
}

struct Case {
  float T;
  int k;
  float p;
};

std::string describe(const Case& c) {
  return "T=" + std::to_string(c.T) + " top_k=" + std::to_string(c.k) + " top_p=" + std::to_string(c.p);
}

// Logit vectors with ties (also at the top-k and top-p boundaries), -inf
// entries and a wide spread of magnitudes.
std::vector<std::vector<float>> test_logits() {
  std::vector<std::vector<float>> out;
  std::mt19937_64 g(12345);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (int v = 0; v < 4; ++v) {
    std::vector<float> l(37);
    for (auto& x : l) x = nd(g);
    l[3] = l[11];  // a tie somewhere in the middle
    if (v >= 1) {
      l[0] = -INFINITY;
      l[20] = -INFINITY;
    }
    if (v == 2) {
      // Ties at the top: ids 5, 9 and 30 share the largest logit.
      l[5] = l[9] = l[30] = 9.f;
    }
    if (v == 3)
      for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(i % 5) * 0.25f;  // five-way ties
    out.push_back(l);
  }
  return out;
}

const std::vector<Case>& grid() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> c;
    for (float T : {0.f, 0.05f, 0.7f, 1.f, 3.f})
      for (int k : {0, 1, 2, 3, 7, 36, 37, 100})
        for (float p : {0.05f, 0.5f, 0.9f, 1.f}) c.push_back({T, k, p});
    return c;
  }();
  return cases;
}

// distribution() equals the independent definition: same support (up to
// tokens of negligible mass), same order (decreasing probability, ties by id),
// probabilities to 1e-12.
TEST(Sampler, DistributionMatchesIndependentDefinition) {
  for (const auto& l : test_logits())
    for (const Case& c : grid()) {
      Sampler s({c.T, c.k, c.p, 1});
      const auto d = s.distribution(l.data(), static_cast<int64_t>(l.size()));
      const auto ref = reference_probs(l, c.T, c.k, c.p);
      // The same support, except that the implementation's double sums may
      // reach the nucleus mass (or 1 when top_p is 1) before the last tokens
      // of negligible probability: the reference mass it leaves out must be
      // below 1e-12.
      std::vector<bool> in_d(l.size(), false);
      for (const auto& e : d) in_d[static_cast<size_t>(e.first)] = true;
      double missing = 0;
      for (size_t i = 0; i < l.size(); ++i)
        if (!in_d[i]) missing += ref[i];
      EXPECT_LT(missing, 1e-12) << describe(c);
      double prev = 2.0;
      for (size_t i = 0; i < d.size(); ++i) {
        const auto [id, q] = d[i];
        ASSERT_GE(id, 0);
        ASSERT_LT(static_cast<size_t>(id), l.size());
        EXPECT_GT(ref[static_cast<size_t>(id)], 0.0) << describe(c) << " id " << id << " is outside the support";
        EXPECT_NEAR(q, ref[static_cast<size_t>(id)], 1e-12) << describe(c) << " id " << id;
        EXPECT_LE(q, prev + 1e-15) << describe(c) << ": not in decreasing order";
        if (i > 0 && q == d[i - 1].second) EXPECT_GT(id, d[i - 1].first) << describe(c) << ": tie not by id";
        prev = q;
      }
    }
}

// Empirical frequencies of sample() against the independent definition, for
// every path through the sampler: plain temperature (the unsorted fast path),
// top-k, top-p, both together, and the extremes of each parameter. Tokens
// outside the support must never be drawn.
TEST(Sampler, FrequenciesMatchIndependentDistributions) {
  const std::vector<Case> cases = {
      {1.f, 0, 1.f},    {0.5f, 0, 1.f},  {2.5f, 0, 1.f},  {1.f, 5, 1.f},   {0.8f, 1, 1.f},
      {1.f, 0, 0.6f},   {1.5f, 0, 0.95f}, {1.f, 6, 0.7f}, {2.f, 20, 0.5f}, {1.f, 3, 0.999f},
      {1.f, 37, 1.f},   {1e4f, 0, 1.f},  {1.f, 0, 1e-7f}, {1e-4f, 4, 0.9f}};
  const int N = 24000;
  uint64_t seed = 7;
  for (const auto& l : test_logits())
    for (const Case& c : cases) {
      Sampler s({c.T, c.k, c.p, seed++});
      const auto ref = reference_probs(l, c.T, c.k, c.p);
      std::vector<int> count(l.size(), 0);
      for (int i = 0; i < N; ++i) {
        const int32_t x = s.sample(l.data(), static_cast<int64_t>(l.size()));
        ASSERT_GE(x, 0);
        ASSERT_LT(static_cast<size_t>(x), l.size());
        count[static_cast<size_t>(x)]++;
      }
      // Cells with an expected count below 5 are pooled (the usual validity
      // condition of the chi-square approximation).
      double chi2 = 0, pooled_e = 0, pooled_o = 0;
      int df = -1;
      for (size_t i = 0; i < l.size(); ++i) {
        if (ref[i] == 0) {
          EXPECT_EQ(count[i], 0) << describe(c) << ": drew id " << i << ", which has probability 0";
          continue;
        }
        const double e = N * ref[i];
        if (e < 5) {
          pooled_e += e;
          pooled_o += count[i];
          continue;
        }
        chi2 += (count[i] - e) * (count[i] - e) / e;
        ++df;
      }
      if (pooled_e > 0) {
        chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / std::max(pooled_e, 1e-9);
        ++df;
      }
      if (df >= 1) EXPECT_LT(chi2, chi2_bound(df)) << describe(c) << " (" << df << " degrees of freedom)";
    }
}

// The extremes of each parameter, with exact expectations.
TEST(Sampler, ParameterExtremes) {
  const std::vector<float> l = {0.3f, 2.f, -1.f, 2.f, 1.9f, -INFINITY, 0.f};
  const int64_t n = static_cast<int64_t>(l.size());
  auto draws = [&](const SamplingParams& p, int times) {
    Sampler s(p);
    std::map<int, int> c;
    for (int i = 0; i < times; ++i) c[s.sample(l.data(), n)]++;
    return c;
  };
  // top_k = 1 or a tiny top_p: always the argmax (id 1: ties go to the
  // lowest id), whatever the temperature.
  for (const SamplingParams& p : {SamplingParams{5.f, 1, 1.f, 3}, SamplingParams{5.f, 0, 1e-30f, 3},
                                  SamplingParams{1e-30f, 3, 0.5f, 3}}) {
    const auto c = draws(p, 300);
    ASSERT_EQ(c.size(), 1u) << "T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p;
    EXPECT_EQ(c.begin()->first, 1);
  }
  // A vanishing temperature (down to the smallest denormal) without top-k or
  // top-p: the two tied maxima (ids 1 and 3) share the mass, nothing else is
  // drawn, and the near-maximum 1.9 (id 4) never is.
  for (const SamplingParams& p : {SamplingParams{1e-30f, 0, 1.f, 3},
                                  SamplingParams{std::numeric_limits<float>::denorm_min(), 0, 1.f, 3}}) {
    const auto c = draws(p, 400);
    ASSERT_EQ(c.size(), 2u) << "T " << p.temperature;
    EXPECT_GT(c.at(1), 140);
    EXPECT_GT(c.at(3), 140);
  }
  // top_k = 2 keeps the tied pair (ids 1 and 3), each with probability 1/2;
  // top_k = 3 adds 1.9 (id 4), not the later 2.0 nor the earlier 0.3.
  {
    Sampler s({1.f, 2, 1.f, 0});
    const auto d = s.distribution(l.data(), n);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d[0].first, 1);
    EXPECT_EQ(d[1].first, 3);
    EXPECT_DOUBLE_EQ(d[0].second, 0.5);
    Sampler s3({1.f, 3, 1.f, 0});
    const auto d3 = s3.distribution(l.data(), n);
    ASSERT_EQ(d3.size(), 3u);
    EXPECT_EQ(d3[2].first, 4);
    const double z = 2 + std::exp(-0.1);
    EXPECT_NEAR(d3[2].second, std::exp(-0.1) / z, 1e-7);  // 1.9f - 2.f is -0.1 to float precision
  }
  // A huge temperature (FLT_MAX) or top_k beyond the vocabulary with top_p 1:
  // every finite logit, uniformly at T = FLT_MAX; the -inf entry never.
  {
    Sampler s({std::numeric_limits<float>::max(), std::numeric_limits<int>::max(), 1.f, 0});
    const auto d = s.distribution(l.data(), n);
    ASSERT_EQ(d.size(), 6u);
    for (const auto& [id, q] : d) {
      EXPECT_NE(id, 5);
      EXPECT_NEAR(q, 1.0 / 6.0, 1e-12);
    }
  }
  // top_p = 1 and top_k = 0 is the plain softmax.
  {
    Sampler s({1.f, 0, 1.f, 0});
    const auto d = s.distribution(l.data(), n);
    const auto ref = reference_probs(l, 1.f, 0, 1.f);
    double z = 0;
    for (float x : l)
      if (std::isfinite(x)) z += std::exp(static_cast<double>(x));
    for (const auto& [id, q] : d) EXPECT_NEAR(q, std::exp(static_cast<double>(l[static_cast<size_t>(id)])) / z, 1e-12);
    EXPECT_EQ(d.size(), 6u);
  }
  // An exact nucleus boundary: four equal logits, top_p = 0.5 is reached by
  // exactly two of them (0.25 + 0.25), so two are kept, the lowest ids.
  {
    const std::vector<float> eq = {1.f, 1.f, 1.f, 1.f};
    Sampler s({1.f, 0, 0.5f, 0});
    const auto d = s.distribution(eq.data(), 4);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d[0].first, 0);
    EXPECT_EQ(d[1].first, 1);
    EXPECT_DOUBLE_EQ(d[0].second, 0.5);
  }
  // A single token vocabulary and a single finite logit.
  {
    const std::vector<float> one = {-3.f};
    Sampler s({1.f, 0, 0.3f, 0});
    EXPECT_EQ(s.sample(one.data(), 1), 0);
    const std::vector<float> lone = {-INFINITY, -INFINITY, 4.f};
    Sampler t({2.f, 0, 1.f, 0});
    for (int i = 0; i < 20; ++i) EXPECT_EQ(t.sample(lone.data(), 3), 2);
  }
}

// Seeds: equal seeds give equal token sequences on every sampling path
// (unsorted temperature, top-k, top-p, both), different seeds different ones,
// and a sampler does not depend on the samplers made before it.
TEST(Sampler, SeedsReproduceOnEveryPath) {
  std::vector<float> l(200);
  for (size_t i = 0; i < l.size(); ++i) l[i] = 3.f * std::sin(0.37f * static_cast<float>(i));
  const int64_t n = static_cast<int64_t>(l.size());
  for (const Case& c : {Case{1.f, 0, 1.f}, Case{1.3f, 50, 1.f}, Case{1.f, 0, 0.9f}, Case{0.9f, 40, 0.8f}}) {
    auto seq = [&](uint64_t seed) {
      Sampler s({c.T, c.k, c.p, seed});
      std::vector<int32_t> out;
      for (int i = 0; i < 64; ++i) out.push_back(s.sample(l.data(), n));
      return out;
    };
    const auto a = seq(0), b = seq(0), c1 = seq(1), d = seq(~uint64_t{0});
    EXPECT_EQ(a, b) << describe(c);
    EXPECT_NE(a, c1) << describe(c);
    EXPECT_NE(a, d) << describe(c);
    EXPECT_NE(c1, d) << describe(c);
  }
}

}  // namespace
}  // namespace megakern
