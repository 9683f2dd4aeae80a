// Log-probabilities of a model's next-token distribution, as the server
// reports them and the perplexity tool scores them: the log-softmax of the
// model's raw logits, before any temperature, top-k or top-p (the sampler's
// shaping), accumulated in double. This is what OpenAI's and vLLM's
// "logprobs" report: the model's own distribution, whatever was sampled.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace megakern {

// log(sum_i exp(logits[i])), in double around the largest finite logit.
// NaN entries are skipped; -inf when no entry is finite or +inf (+inf when
// one is +inf).
double log_sum_exp(const float* logits, int64_t n);

// log-softmax of logits[0..n) into out (each logits[i] - log_sum_exp).
void log_softmax(const float* logits, int64_t n, float* out);

// One token with its log-probability and the `top` most likely tokens at
// that position. `scored` is false for a token nothing predicts (the first
// token of a prompt), whose logprob is reported as null.
struct TokenLogprob {
  int32_t token = -1;
  bool scored = false;
  double logprob = 0;
  std::vector<std::pair<int32_t, double>> top;  // by decreasing log-probability, ties by id
};

// `token`'s log-probability under logits[0..n), with the top_n most likely
// tokens (top_n >= 0). Throws megakern::Error on a token out of range.
TokenLogprob token_logprob(const float* logits, int64_t n, int32_t token, int top_n);

}  // namespace megakern
