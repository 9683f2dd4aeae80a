#include "runtime/generation.h"

#include "core/error.h"

namespace megakern {

Generation::Generation(const Tokenizer& tokenizer, const GenerationParams& params, int n_prompt, int n_ctx,
                       Sampler* sampler)
    : tokenizer_(tokenizer),
      params_(params),
      n_prompt_(n_prompt),
      n_ctx_(n_ctx),
      sampler_(sampler),
      decoder_(tokenizer),
      stops_(params.stop) {
  if (params.max_tokens < 1) fail("max_tokens must be at least 1, got {}", params.max_tokens);
}

int32_t Generation::sample(const float* logits, int64_t n) {
  if (!sampler_) fail("this generation has no sampler: its tokens come from elsewhere");
  return sampler_->sample(logits, n);
}

const Delta& Generation::push(int32_t token) {
  if (done()) fail("a token pushed after the generation ended");
  delta_.token = token;
  delta_.text.clear();
  if (!params_.ignore_eos && (params_.is_end ? params_.is_end(token) : tokenizer_.is_end_of_generation(token)))
    return finish(StopReason::EndOfText);
  ++delta_.generated;
  delta_.text = stops_.push(decoder_.push(token));
  if (stops_.stopped())
    delta_.stop = StopReason::StopString;  // the text after the match is never released
  else if (delta_.generated >= params_.max_tokens)
    finish(StopReason::MaxTokens);
  else if (position() >= n_ctx_)
    finish(StopReason::ContextFull);  // no position left to feed the token at
  return delta_;
}

const Delta& Generation::end(StopReason reason) {
  if (done()) return delta_;
  delta_.text.clear();
  return finish(reason);
}

const Delta& Generation::finish(StopReason reason) {
  // What the decoder holds back (an incomplete UTF-8 sequence) may still
  // complete a stop string; otherwise everything held back is released.
  delta_.text += stops_.push(decoder_.flush());
  delta_.stop = stops_.stopped() ? StopReason::StopString : reason;
  if (!stops_.stopped()) delta_.text += stops_.flush();
  return delta_;
}
}  // namespace megakern
