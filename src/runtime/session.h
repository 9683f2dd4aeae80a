// Engines and sessions over a runtime Model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exec/executor.h"
#include "ir/program.h"
#include "runtime/model.h"

namespace megakern {

class ThreadPool;

// Prompt positions per executor step that the commands use (for dense
// models also the least block an Engine prefills with), measured for the
// recurrent models:
// on qwen3.8-bench (q4_0, fast, 256-token prompt, 2 cores) 8 rows gave
// 13 tok/s, 32 rows 19 and 64 rows 25 (op-by-op 34) with the megakernel.
// Plain and speculative generation must prefill with the same block size:
// a recurrent model's chunked prompt pass equals the per-token form only
// within a tolerance, which the fast mode's int8 grid can turn into a
// different token.
inline constexpr int kDefaultUbatch = 32;

// Steps of one model's DecodeProgram on one executor, for any set of
// sequences: the batching primitive under sessions, the server and
// speculative decoding.
class Engine {
 public:
  // The program is built for up to max_rows rows per step.
  Engine(const Model& model, ThreadPool& pool, int max_rows, const std::string& executor = "mega");
  // The executor refers to program_, so an Engine stays where it was built.
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Model& model() const { return model_; }
  const DecodeProgram& program() const { return program_; }
  Executor& executor() { return *exec_; }
  ThreadPool& pool() { return pool_; }
  int max_rows() const { return program_.max_rows; }
  int n_vocab() const { return program_.n_vocab; }

  // One step; logits [rows.size()][n_vocab]. Throws megakern::Error on bad rows.
  // With `taps` (engines with taps enabled), also the residual-stream taps
  // of every row, [rows.size()][tap_width()].
  void step(const std::vector<RowInput>& rows, float* logits, float* taps = nullptr);
  // Computes tokens[0..n) of seq at positions pos0.., writing the logits of
  // the last one: the model's batched prompt pass when it has one, else
  // executor steps over blocks of prefill_rows() positions. Blocks whose
  // logits are not needed run the program without its output head (the
  // trailing ops after the last layer), which updates caches and states
  // exactly as the full program does. With `taps`, the taps of every
  // position, [n][tap_width()] (always by steps of the full program in blocks
  // of max_rows: the batched prompt pass has no taps).
  void prefill(SequenceState& seq, const int32_t* tokens, int n, int pos0, float* logits, float* taps = nullptr);
  // Positions per prefill step. By default max_rows for models with
  // recurrent state (their chunked prompt pass depends on the block size
  // within a tolerance, so every engine of a model must agree), and at least
  // kDefaultUbatch for the others (whose rows do not depend on the block).
  int prefill_rows() const { return prefill_rows_; }
  void set_prefill_rows(int rows);

  // Rebuilds the program with residual-stream taps after `layers` (see
  // add_taps in ir/program.h) and a new executor of the same kind. Calling it
  // again with the same layers does nothing; other layers throw. Steps
  // without a tap buffer behave as before.
  void enable_taps(const std::vector<int>& layers);
  const std::vector<int>& tap_layers() const { return tap_layers_; }
  int tap_width() const { return program_.tap_width; }

 private:
  const Model& model_;
  ThreadPool& pool_;
  DecodeProgram program_;
  std::unique_ptr<Executor> exec_;
  std::string exec_kind_;
  std::vector<int> tap_layers_;
  std::vector<float> block_logits_;
  int prefill_rows_ = 0;
  // The program without its output head, for prefill_rows_ rows, and its
  // executor (built on first use).
  DecodeProgram headless_;
  std::unique_ptr<Executor> headless_exec_;
};

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
