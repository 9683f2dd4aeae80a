// Generator: one sequence end to end: the prompt pass (ubatch-row blocks,
// reusing a cached prefix), then decode steps or speculative rounds (greedy
// lossless, sampling exact), each token through a Generation
// (runtime/generation.h), each Delta to a callback. `megakern run`/`chat` and
// bench-spec use it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/generation.h"
#include "runtime/session.h"

namespace megakern {

class Model;
class ThreadPool;
class Drafter;
class SpeculativeGenerator;
struct SpecStats;

// Counts and times of one Generator::generate.
struct GenResult {
  std::vector<int32_t> tokens;  // generated tokens (an ending end-of-text token excluded)
  std::string text;             // all text released
  StopReason stop = StopReason::None;
  int prompt_tokens = 0;
  int prompt_computed = 0;  // prompt tokens computed (the rest came from the cache)
  double prefill_ms = 0;    // prompt pass (speculative: and the drafter taking in the prompt)
  double decode_ms = 0;     // everything after it
};

struct GeneratorOptions {
  int n_ctx = 4096;
  std::string executor = "mega";
  int ubatch = 0;  // rows per prompt step (0: default_prompt_block of the model)
  SamplingParams sampling;      // one random stream over every generate() call
  std::string drafter;          // speculative decoding with it (make_drafter in spec/drafter.h); empty: plain
  int draft = 6;                // most draft tokens per verify step
  bool fixed_draft = false;     // always propose `draft` tokens (else adapt the length each round)
};

class Generator {
 public:
  // Called with each token's Delta, the last one done().
  using OnDelta = std::function<void(const Delta&)>;

  // Builds the engine, sequence state and (speculative) drafter.
  Generator(const Model& model, ThreadPool& pool, const GeneratorOptions& opts);
  // Plain decoding over a session and sampler the caller keeps.
  Generator(Session& session, Sampler& sampler);
  // Speculative decoding over a speculative generator the caller keeps.
  explicit Generator(SpeculativeGenerator& spec);
  ~Generator();

  // Generates after `prompt`. Plain decoding keeps the longest cached
  // prefix of the previous prompt and output (a conversation's earlier
  // turns); speculative decoding computes the whole prompt. Throws
  // megakern::Error on an empty prompt or one longer than the context.
  GenResult generate(const std::vector<int32_t>& prompt, const GenerationParams& params, const OnDelta& on_delta = {});
  // Forgets the cached sequence: the next prompt is computed in full.
  void reset();

  int n_ctx() const;
  // Speculative decoding only (null otherwise).
  const Drafter* drafter() const;
  const SpecStats* spec_stats() const;
  void reset_spec_stats();

 private:
  const Tokenizer& tokenizer() const;
  struct Owned;  // what the first constructor builds
  std::unique_ptr<Owned> owned_;
  // What generate() drives: a session and sampler, or a speculative generator.
  Session* session_ = nullptr;
  Sampler* sampler_ = nullptr;
  SpeculativeGenerator* spec_ = nullptr;
};

}  // namespace megakern
