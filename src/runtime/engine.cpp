#include "runtime/engine.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace megakern {

Engine::Engine(const Model& model, ThreadPool& pool, int max_rows, const std::string& executor)
    : model_(model),
      pool_(pool),
      program_(model.build_program(max_rows)),
      exec_(make_executor(executor, program_, pool)),
      exec_kind_(executor) {
  set_prefill_rows(model.recurrent() ? max_rows : std::max(max_rows, default_prompt_block(model)));
}

int default_prompt_block(const Model& model) {
  return model.recurrent() ? kDefaultUbatch : std::min(kDefaultPromptBlock, model.max_program_rows());
}

void Engine::set_prefill_rows(int rows) {
  if (rows < 1) fail("prefill block of {} rows: must be at least 1", rows);
  if (model_.recurrent() && rows > max_rows())
    fail("prefill block of {} rows: a recurrent model's blocks go through the full program, of {} rows", rows,
         max_rows());
  if (rows == prefill_rows_) return;
  prefill_rows_ = rows;
  headless_exec_.reset();
}


void Engine::step(const std::vector<RowInput>& rows, float* logits, float* taps) {
  if (taps && program_.tap_width == 0) fail("taps requested from an engine without taps (enable_taps first)");
  exec_->set_tap_output(taps);
  try {
    exec_->step(rows, logits);
  } catch (...) {
    exec_->set_tap_output(nullptr);
    throw;
  }
  exec_->set_tap_output(nullptr);
}

void Engine::enable_taps(const std::vector<int>& layers) {
  if (!tap_layers_.empty()) {
    if (layers == tap_layers_) return;
    fail("the engine already taps other layers");
  }
  DecodeProgram p = model_.build_program(program_.max_rows);
  add_taps(p, layers);
  // The executor refers to the program: replace both together.
  exec_.reset();
  program_ = std::move(p);
  exec_ = make_executor(exec_kind_, program_, pool_);
  exec_->set_trace(trace_);
  tap_layers_ = layers;
  headless_exec_.reset();
}

void Engine::set_trace(std::vector<TraceEvent>* sink) {
  trace_ = sink;
  exec_->set_trace(sink);
  if (headless_exec_) headless_exec_->set_trace(sink);
}

void Engine::teacher_forced_logits(SequenceState& seq, const int32_t* tokens, int n, int pos0, int n_out,
                                   float* logits, bool batched) {
  if (n <= 0) fail("teacher forcing of {} tokens: nothing to compute", n);
  if (n_out < 0 || n_out > n) fail("teacher forcing of {} tokens: {} output positions asked", n, n_out);
  if (pos0 < 0 || static_cast<int64_t>(pos0) + n > seq.n_ctx())
    fail("teacher forcing of {} tokens at position {} does not fit the context of {} tokens", n, pos0, seq.n_ctx());
  const size_t V = static_cast<size_t>(n_vocab());
  const int block = max_rows(), first = n - n_out;
  // The positions before the first output without the head: all of them
  // where rows do not depend on the block, else the whole blocks of
  // max_rows (the head-less program's blocks then have that size too).
  int done = 0;
  if (batched && !seq.recurrent)
    done = first;
  else if (batched && prefill_rows_ == block)
    done = first / block * block;
  run_headless(seq, tokens, done, pos0);
  block_logits_.resize(static_cast<size_t>(block) * V);
  for (int i = done; i < n; i += block) {
    const int m = std::min(block, n - i);
    step(rows_of(seq, tokens + i, m, pos0 + i), block_logits_.data());
    for (int r = 0; r < m; ++r)
      if (i + r >= first)
        std::copy_n(block_logits_.data() + static_cast<size_t>(r) * V, V, logits + static_cast<size_t>(i + r - first) * V);
  }
}

const std::vector<RowInput>& Engine::rows_of(SequenceState& seq, const int32_t* tokens, int m, int pos) {
  rows_.clear();
  for (int r = 0; r < m; ++r) rows_.push_back(seq.row(tokens[r], pos + r));
  return rows_;
}

void Engine::step_headless(const std::vector<RowInput>& rows) {
  if (rows.size() > static_cast<size_t>(prefill_rows_))
    fail("a head-less step of {} rows exceeds the engine's prefill block of {} rows", rows.size(), prefill_rows_);
  if (!headless_exec_) {
    headless_ = without_head(model_.build_program(prefill_rows_));
    headless_exec_ = make_executor(exec_kind_, headless_, pool_);
    headless_exec_->set_trace(trace_);
  }
  // The head-less program writes no logits; the buffer is its scratch.
  block_logits_.resize(std::max(block_logits_.size(), rows.size() * static_cast<size_t>(n_vocab())));
  headless_exec_->step(rows, block_logits_.data());
}

void Engine::run_headless(SequenceState& seq, const int32_t* tokens, int n, int pos0) {
  for (int i = 0; i < n; i += prefill_rows_) step_headless(rows_of(seq, tokens + i, std::min(prefill_rows_, n - i), pos0 + i));
}

void Engine::prefill(SequenceState& seq, const int32_t* tokens, int n, int pos0, float* logits, float* taps) {
  if (n <= 0) fail("prefill of {} tokens: nothing to compute", n);
  if (pos0 < 0 || static_cast<int64_t>(pos0) + n > seq.n_ctx())
    fail("prefill of {} tokens at position {} does not fit the context of {} tokens", n, pos0, seq.n_ctx());
  const size_t V = static_cast<size_t>(n_vocab());
  if (taps) {
    const int block = max_rows();
    block_logits_.resize(static_cast<size_t>(block) * V);
    for (int i = 0; i < n; i += block) {
      const int m = std::min(block, n - i);
      step(rows_of(seq, tokens + i, m, pos0 + i), block_logits_.data(),
           taps + static_cast<size_t>(i) * static_cast<size_t>(tap_width()));
      if (i + m == n) std::copy_n(block_logits_.data() + static_cast<size_t>(m - 1) * V, V, logits);
    }
    return;
  }
  // Only the last position's logits are needed. A model whose rows do not
  // depend on the block runs every other position head-less and that one
  // alone; a recurrent one keeps the blocks of prefill_rows() whole (its
  // chunked form depends on the block) and takes the last through the full
  // program.
  const int last = seq.recurrent ? (n - 1) / prefill_rows_ * prefill_rows_ : n - 1;
  const int m = n - last;
  if (m > max_rows()) fail("prefill: a block of {} rows exceeds the engine's {} rows", m, max_rows());
  run_headless(seq, tokens, last, pos0);
  block_logits_.resize(std::max(block_logits_.size(), static_cast<size_t>(m) * V));
  step(rows_of(seq, tokens + last, m, pos0 + last), block_logits_.data());
  std::copy_n(block_logits_.data() + static_cast<size_t>(m - 1) * V, V, logits);
}

}  // namespace megakern
