// Token sampling: greedy, temperature, top-k, top-p, with a seeded generator
// so a given seed always gives the same tokens.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace megakern {

struct SamplingParams {
  float temperature = 0.f;  // 0: greedy (argmax, ties to the lowest id)
  int top_k = 0;            // 0: no limit
  float top_p = 1.f;        // nucleus mass in (0, 1]
  uint64_t seed = 0;
};

// Throws megakern::Error naming the bad parameter (temperature < 0 or not
// finite, top_k < 0, top_p outside (0, 1]).
void validate(const SamplingParams& p);

// Index of the largest value; NaNs are ignored and ties go to the lowest index.
int32_t argmax(const float* logits, int64_t n);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  const SamplingParams& params() const { return p_; }
  // Picks a token from logits [n].
  int32_t sample(const float* logits, int64_t n);
  // The distribution sample() draws from, as (id, probability) pairs sorted by
  // decreasing probability (ties by id); for greedy, the single argmax.
  std::vector<std::pair<int32_t, double>> distribution(const float* logits, int64_t n) const;

 private:
  int32_t sample_sorted(const float* logits, int64_t n);  // walks distribution()
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace megakern
