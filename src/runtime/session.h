// Sessions: one sequence over an Engine (runtime/engine.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace megakern {

class ThreadPool;

// One sequence being generated: its state, the tokens already in it, and the
// logits of the last position.
class Session {
 public:
  // Decode steps run on `executor` ("mega", "opbyop" or "reference"); the
  // program takes up to max_rows rows (0: 8), the prefill block size.
  Session(const Model& model, ThreadPool& pool, int n_ctx, const std::string& executor = "mega", int max_rows = 0);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Number of leading tokens of `tokens` already in the cache, at most
  // tokens.size() - 1 (the last one is always recomputed for its logits).
  // Recurrent models can only reuse the whole cached sequence (their state
  // cannot be rewound), so for them it is tokens_.size() or 0.
  size_t reusable_prefix(const std::vector<int32_t>& tokens) const;

  // Makes the cache hold exactly `tokens`: the longest reusable prefix is
  // kept and only the rest is computed (prefill). Returns the logits of the
  // last token. Throws megakern::Error if tokens is empty or exceeds the context.
  const std::vector<float>& set_tokens(const std::vector<int32_t>& tokens);
  // Appends one token (decode step) and returns the new logits.
  const std::vector<float>& append(int32_t token);

  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<float>& logits() const { return logits_; }
  int n_ctx() const { return seq_.n_ctx(); }
  void reset() {
    tokens_.clear();
    seq_.clear();
  }
  Engine& engine() { return engine_; }
  SequenceState& sequence() { return seq_; }

 private:
  Engine engine_;
  SequenceState seq_;
  std::vector<int32_t> tokens_;  // what the cache holds, in order
  std::vector<float> logits_;    // [n_vocab] of the last token
};

// Finds a model by path or by the name of a fetched model ("smollm2-135m",
// "gemma3-270m"), looking in $MEGAKERN_MODELS_DIR, then the models/ folder
// next to the build directory of the running program, then ./models.
std::string resolve_model_path(const std::string& name_or_path);
// Names of the models scripts/setup.sh fetches.
const std::vector<std::string>& known_model_names();

}  // namespace megakern
