// One sequence being generated: its KV cache, the tokens already in it, and
// the logits of the last position.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exec/executor.h"
#include "ir/program.h"
#include "model/dense.h"

namespace megakern {

class ThreadPool;

class Session {
 public:
  // Decode steps run on `executor` ("mega", "opbyop" or "reference") over the
  // model's DecodeProgram; prompts are prefilled by the batched forward pass.
  Session(const DenseModel& model, ThreadPool& pool, int n_ctx, const std::string& executor = "mega");
  // The executor refers to program_, so a Session stays where it was built.
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Number of leading tokens of `tokens` already in the cache, at most
  // tokens.size() - 1 (the last one is always recomputed for its logits).
  size_t reusable_prefix(const std::vector<int32_t>& tokens) const;

  // Makes the cache hold exactly `tokens`: the longest prefix already cached
  // is kept and only the rest is computed (prefill). Returns the logits of the
  // last token. Throws megakern::Error if tokens is empty or exceeds the context.
  const std::vector<float>& set_tokens(const std::vector<int32_t>& tokens);
  // Appends one token (decode step) and returns the new logits.
  const std::vector<float>& append(int32_t token);

  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<float>& logits() const { return logits_; }
  int n_ctx() const { return cache_.n_ctx; }
  void reset() { tokens_.clear(); }

 private:
  const DenseModel& model_;
  ThreadPool& pool_;
  KVCache cache_;
  DecodeProgram program_;
  std::unique_ptr<Executor> exec_;
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
