#include "runtime/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace megakern {

double log_sum_exp(const float* logits, int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(logits[i])) mx = std::max(mx, static_cast<double>(logits[i]));
  if (!std::isfinite(mx)) return mx;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(logits[i])) sum += std::exp(static_cast<double>(logits[i]) - mx);
  return mx + std::log(sum);
}

void log_softmax(const float* logits, int64_t n, float* out) {
  const double lse = log_sum_exp(logits, n);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<double>(logits[i]) - lse);
}

TokenLogprob token_logprob(const float* logits, int64_t n, int32_t token, int top_n) {
  if (token < 0 || token >= n) fail("logprob of token {}: outside the vocabulary of {} tokens", token, n);
  if (top_n < 0) fail("top_n must be >= 0, got {}", top_n);
  const double lse = log_sum_exp(logits, n);
  auto lp = [&](int64_t i) { return static_cast<double>(logits[i]) - lse; };
  TokenLogprob r;
  r.token = token;
  r.scored = true;
  r.logprob = lp(token);
  const int64_t k = std::min<int64_t>(top_n, n);
  if (k == 0) return r;
  // The k largest logits, NaNs last, ties to the lower id.
  auto before = [&](int32_t a, int32_t b) {
    const float x = logits[a], y = logits[b];
    if (std::isnan(x) != std::isnan(y)) return std::isnan(y);
    return x > y || (!(x < y) && a < b);
  };
  std::vector<int32_t> best;
  best.reserve(static_cast<size_t>(k) + 1);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    if (static_cast<int64_t>(best.size()) == k && !before(id, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), id, before), id);
    if (static_cast<int64_t>(best.size()) > k) best.pop_back();
  }
  for (int32_t id : best) r.top.emplace_back(id, lp(id));
  return r;
}

}  // namespace megakern
