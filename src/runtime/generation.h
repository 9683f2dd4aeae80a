// What happens to each token a model produces, in one place.
//  - Generation: one sequence's state machine. It takes tokens (sampled with
//    its Sampler, or decided elsewhere, e.g. by a speculative round) and
//    applies the rules every front end shares: end-of-text tokens, incremental
//    UTF-8-safe detokenisation (StreamDecoder), stop strings (StopMatcher),
//    max_tokens and a full context. It computes nothing: the owner of the
//    engine feeds the token at position(). The server's scheduler keeps one
//    per batch row and advances them all inside its batched step.
//  - Generator (spec/generator.h): one sequence end to end, each token
//    through a Generation.
// Where what comes next slots in:
//  - Speculation in the server: a SpeculativeGenerator per batch row, its
//    round split at the verify step (propose; verify rows placed in the
//    batched step; accept), each round's tokens pushed through the row's
//    Generation as Generator::generate does.
//  - Logprobs: the server's scheduler takes each counted token's
//    log-probability (runtime/logprobs.h) from the logits it sampled it from;
//    speculative rounds would return their verify rows' distributions with
//    the tokens.
//  - Chunked prefill: the scheduler would compute a long prompt in slices
//    (Engine::prefill with pos0 advancing) between decode steps; the
//    Generation begins at the first sample, unchanged.
//  - Prefix cache: at admission, pick the batch row (or a copied cache) sharing
//    the longest prefix with the prompt (Session::reusable_prefix does this for one
//    sequence) and prefill only the rest; Generation needs only the prompt
//    length.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/stop_matcher.h"
#include "tokenizer/tokenizer.h"

namespace megakern {

// Why a generation ended (None while it goes on). EndOfText: an
// end-of-generation token (not output); StopString: neither it nor anything
// after it is output; ContextFull: the last token has no position left.
enum class StopReason { None, EndOfText, StopString, MaxTokens, ContextFull };

struct GenerationParams {
  int max_tokens = 256;                  // >= 1
  std::vector<std::string> stop;         // stop strings (empty ones are ignored)
  bool ignore_eos = false;               // end-of-generation tokens are ordinary tokens
  std::function<bool(int32_t)> is_end;  // the end tokens (null: the tokenizer's)
};

// What one token changed.
struct Delta {
  int32_t token = -1;
  std::string text;   // text released by it (the last one: also what was held back, unless a stop string matched)
  int generated = 0;  // tokens generated so far (an end-of-text token is not counted)
  StopReason stop = StopReason::None;
  bool done() const { return stop != StopReason::None; }
};

class Generation {
 public:
  // n_prompt: tokens in the cache before the first generated one; n_ctx: the
  // cache's positions. sampler (kept by the caller, may be null when tokens
  // come from elsewhere) is what sample() draws with.
  Generation(const Tokenizer& tokenizer, const GenerationParams& params, int n_prompt, int n_ctx,
             Sampler* sampler = nullptr);

  // Draws the next token from the logits [n] of the last position.
  int32_t sample(const float* logits, int64_t n);
  // Takes the next token. While !done(), the token must then be fed at
  // position() to get the logits of the one after it.
  const Delta& push(int32_t token);
  // Ends the generation from outside (the engine cannot go on), releasing
  // the text held back.
  const Delta& end(StopReason reason);

  bool done() const { return delta_.done(); }
  StopReason stop_reason() const { return delta_.stop; }
  int generated() const { return delta_.generated; }
  // Tokens the generation may still emit.
  int remaining() const { return params_.max_tokens - delta_.generated; }
  // The position the last pushed token is fed at.
  int32_t position() const { return n_prompt_ + delta_.generated - 1; }
  int32_t last_token() const { return delta_.token; }

 private:
  const Delta& finish(StopReason reason);
  const Tokenizer& tokenizer_;
  GenerationParams params_;
  int n_prompt_, n_ctx_;
  Sampler* sampler_;
  StreamDecoder decoder_;
  StopMatcher stops_;
  Delta delta_;
};

}  // namespace megakern
