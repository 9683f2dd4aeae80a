#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace megakern {

void validate(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    fail("temperature must be a finite number >= 0, got {}", p.temperature);
  if (p.top_k < 0) fail("top_k must be >= 0 (0 disables it), got {}", p.top_k);
  if (!(p.top_p > 0 && p.top_p <= 1)) fail("top_p must be in (0, 1], got {}", p.top_p);
}

int32_t argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  float bv = -INFINITY;
  bool found = false;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(logits[i])) continue;
    if (!found || logits[i] > bv) {
      bv = logits[i];
      best = i;
      found = true;
    }
  }
  return static_cast<int32_t>(best);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { validate(p); }

std::vector<std::pair<int32_t, double>> Sampler::distribution(const float* logits, int64_t n) const {
  if (p_.temperature == 0.f) return {{argmax(logits, n), 1.0}};
  // Infinite logits would turn the softmax into NaNs: +inf entries take all
  // the mass (shared equally), and a vector with no finite or +inf entry is
  // an error, not a silent pick.
  std::vector<std::pair<int32_t, double>> infinite;
  bool any_finite = false;
  for (int64_t i = 0; i < n; ++i) {
    if (logits[i] == INFINITY) infinite.emplace_back(static_cast<int32_t>(i), 0.0);
    any_finite = any_finite || std::isfinite(logits[i]);
  }
  if (!infinite.empty()) {
    for (auto& d : infinite) d.second = 1.0 / static_cast<double>(infinite.size());
    return infinite;
  }
  if (!any_finite) fail("cannot sample: no logit is finite");
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(logits[i])) ids.push_back(static_cast<int32_t>(i));
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  const double mx = logits[*std::min_element(ids.begin(), ids.end(), by_logit)];
  auto weight = [&](int32_t id) { return std::exp((logits[id] - mx) / p_.temperature); };
  // Softmax at the temperature, in double: `sum` is the mass of every
  // candidate top-k keeps.
  double sum = 0;
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < ids.size()) {
    const size_t keep = static_cast<size_t>(p_.top_k);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(keep), ids.end(), by_logit);
    ids.resize(keep);
    for (int32_t id : ids) sum += weight(id);
  } else {
    for (int32_t id : ids) sum += weight(id);
    if (p_.top_p < 1.f) {
      // Only the nucleus needs ordering: sort a growing head of the
      // candidates until its mass reaches top_p (usually a few dozen tokens).
      size_t m = std::min<size_t>(64, ids.size());
      for (;;) {
        std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(m), ids.end(), by_logit);
        double mass = 0;
        for (size_t i = 0; i < m; ++i) mass += weight(ids[i]);
        if (mass >= p_.top_p * sum || m == ids.size()) break;
        m = std::min(ids.size(), m * 4);
      }
      ids.resize(m);
    } else {
      std::sort(ids.begin(), ids.end(), by_logit);
    }
  }
  std::vector<std::pair<int32_t, double>> dist;
  dist.reserve(ids.size());
  for (int32_t id : ids) dist.emplace_back(id, weight(id) / sum);
  // Nucleus: the shortest prefix whose mass reaches top_p.
  double cum = 0;
  size_t cut = dist.size();
  for (size_t i = 0; i < dist.size(); ++i) {
    cum += dist[i].second;
    if (cum >= p_.top_p) {
      cut = i + 1;
      break;
    }
  }
  dist.resize(cut);
  double kept = 0;
  for (auto& d : dist) kept += d.second;
  for (auto& d : dist) d.second /= kept;
  return dist;
}

int32_t Sampler::sample(const float* logits, int64_t n) {
  if (p_.temperature > 0.f && p_.top_k == 0 && p_.top_p >= 1.f) {
    // Plain temperature: the whole vocabulary in id order, no sorting.
    float mx = -INFINITY;
    bool finite = false;
    for (int64_t i = 0; i < n; ++i) {
      if (logits[i] == INFINITY) return sample_sorted(logits, n);  // the +inf entries share the mass
      if (std::isfinite(logits[i])) {
        mx = std::max(mx, logits[i]);
        finite = true;
      }
    }
    if (!finite) fail("cannot sample: no logit is finite");
    double sum = 0;
    for (int64_t i = 0; i < n; ++i)
      if (std::isfinite(logits[i])) sum += std::exp((logits[i] - mx) / p_.temperature);
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * sum;
    double cum = 0;
    int64_t last = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(logits[i])) continue;
      cum += std::exp((logits[i] - mx) / p_.temperature);
      last = i;
      if (u < cum) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(last);
  }
  return sample_sorted(logits, n);
}

int32_t Sampler::sample_sorted(const float* logits, int64_t n) {
  const auto dist = distribution(logits, n);
  if (dist.size() == 1) return dist[0].first;
  // A uniform double in [0, 1) from the top 53 bits: portable across standard
  // libraries, unlike std::uniform_real_distribution.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  double cum = 0;
  for (const auto& d : dist) {
    cum += d.second;
    if (u < cum) return d.first;
  }
  return dist.back().first;
}

}  // namespace megakern
