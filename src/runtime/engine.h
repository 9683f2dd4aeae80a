// Engine: steps of one model's DecodeProgram on one executor, for any set
// of sequences, and its prompt pass.
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

// Prompt positions per executor step of models with recurrent state,
// measured on qwen3.8-bench (q4_0, fast, 256-token prompt, 2 cores): 8 rows
// gave 13 tok/s, 32 rows 19 and 64 rows 25 (op-by-op 34) with the
// megakernel. It is also their chunk: plain and speculative generation must
// prefill with the same block size, as a recurrent model's chunked prompt
// pass equals the per-token form only within a tolerance, which the fast
// mode's int8 grid can turn into a different token. So it stays at 32.
inline constexpr int kDefaultUbatch = 32;
// Prompt positions per executor step of the other models, whose rows give
// the same bits in any block: each weight tile decoded for a matrix product
// serves the block's rows, so larger blocks pay it less often. Measured
// (megakernel, 512-token prompt, 2 threads, two interleaved rounds, tok/s at
// 32 / 64 / 128 rows): 0.6B Q4_0 fast 141-145 / 156-189 / 161-206, exact
// 67-75 / 80-90 / 76-85; Q4_K_M fast 144-170 / 169-174 / 181-190; Q8_0 exact
// 73-78 / 81-83 / 86-90; SmolLM2 fast 460-489 / 493-564 / 526-536.
inline constexpr int kDefaultPromptBlock = 128;
// The prompt block a model gets when none is asked for (no more than its
// programs' most rows).
int default_prompt_block(const Model& model);

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
  // the last one, by executor steps over blocks of prefill_rows() positions
  // (every model's prompts go through its decode program). Blocks whose
  // logits are not needed run the program without its output head (the
  // trailing ops after the last layer), which updates caches and states
  // exactly as the full program does. With `taps`, the taps of every
  // position, [n][tap_width()] (by steps of the full program in blocks of
  // max_rows).
  void prefill(SequenceState& seq, const int32_t* tokens, int n, int pos0, float* logits, float* taps = nullptr);
  // One step of the program without its output head (at most
  // prefill_rows() rows): updates the rows' caches and states exactly as
  // step() does, and computes no logits. For prompt rows whose logits
  // nobody reads.
  void step_headless(const std::vector<RowInput>& rows);
  // Teacher forcing: computes tokens[0..n) of seq at positions pos0..,
  // writing the logits of the last n_out positions, [n_out][n_vocab], by
  // steps of the full program over blocks of max_rows() positions, which
  // leave a recurrent model's state as prefill() does when pos0 is a
  // multiple of max_rows(). With `batched`, the positions before the first
  // output run as prefill() runs them, without the head (in blocks of
  // prefill_rows(); for recurrent models only whole blocks of max_rows(),
  // when that is the prefill block): the same bits, less work.
  // `megakern perplexity` and the server's prompt scoring both use it.
  void teacher_forced_logits(SequenceState& seq, const int32_t* tokens, int n, int pos0, int n_out, float* logits,
                             bool batched = true);
  // Positions per prefill step. By default max_rows for models with
  // recurrent state (their chunked prompt pass depends on the block size
  // within a tolerance, so every engine of a model must agree), and at least
  // kDefaultPromptBlock for the others (whose rows do not depend on the
  // block).
  int prefill_rows() const { return prefill_rows_; }
  void set_prefill_rows(int rows);

  // Rebuilds the program with residual-stream taps after `layers` (see
  // add_taps in ir/program.h) and a new executor of the same kind. Calling it
  // again with the same layers does nothing; other layers throw. Steps
  // without a tap buffer behave as before.
  void enable_taps(const std::vector<int>& layers);
  const std::vector<int>& tap_layers() const { return tap_layers_; }
  // Records every later step of the engine's executors (prefill's head-less
  // blocks included) into sink, or stops when null (Executor::set_trace).
  void set_trace(std::vector<TraceEvent>* sink);
  int tap_width() const { return program_.tap_width; }

 private:
  const Model& model_;
  ThreadPool& pool_;
  DecodeProgram program_;
  std::unique_ptr<Executor> exec_;
  std::string exec_kind_;
  std::vector<int> tap_layers_;
  std::vector<float> block_logits_;
  std::vector<RowInput> rows_;
  // Rows of m consecutive positions of seq from pos (into rows_).
  const std::vector<RowInput>& rows_of(SequenceState& seq, const int32_t* tokens, int m, int pos);
  // tokens[0..n) of seq at positions pos0.. through the program without its
  // head, in blocks of prefill_rows_.
  void run_headless(SequenceState& seq, const int32_t* tokens, int n, int pos0);
  int prefill_rows_ = 0;
  // The program without its output head, for prefill_rows_ rows, and its
  // executor (built on first use).
  DecodeProgram headless_;
  std::unique_ptr<Executor> headless_exec_;
  std::vector<TraceEvent>* trace_ = nullptr;
};

}  // namespace megakern
