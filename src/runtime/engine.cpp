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
  if (batched && model_.prompt_forward_available() &&
      model_.prompt_forward_logits(pool_, seq, tokens, n, pos0, n_out, logits))
    return;
  // Executor steps: the positions as rows, block by block.
  const size_t V = static_cast<size_t>(n_vocab());
  const int block = max_rows();
  const int first = n - n_out;
  block_logits_.resize(static_cast<size_t>(block) * V);
  std::vector<RowInput> rows;
  for (int i = 0; i < n; i += block) {
    const int m = std::min(block, n - i);
    rows.clear();
    for (int r = 0; r < m; ++r) rows.push_back(seq.row(tokens[i + r], pos0 + i + r));
    step(rows, block_logits_.data());
    for (int r = 0; r < m; ++r)
      if (i + r >= first)
        std::copy_n(block_logits_.data() + static_cast<size_t>(r) * V, V, logits + static_cast<size_t>(i + r - first) * V);
  }
}

void Engine::prefill(SequenceState& seq, const int32_t* tokens, int n, int pos0, float* logits, float* taps) {
  if (n <= 0) fail("prefill of {} tokens: nothing to compute", n);
  if (pos0 < 0 || static_cast<int64_t>(pos0) + n > seq.n_ctx())
    fail("prefill of {} tokens at position {} does not fit the context of {} tokens", n, pos0, seq.n_ctx());
  const size_t V = static_cast<size_t>(n_vocab());
  std::vector<RowInput> rows;
  auto rows_of = [&](int i, int m) {
    rows.clear();
    for (int r = 0; r < m; ++r) rows.push_back(seq.row(tokens[i + r], pos0 + i + r));
    return rows;
  };
  if (taps) {
    const int block = max_rows();
    block_logits_.resize(static_cast<size_t>(block) * V);
    for (int i = 0; i < n; i += block) {
      const int m = std::min(block, n - i);
      step(rows_of(i, m), block_logits_.data(), taps + static_cast<size_t>(i) * static_cast<size_t>(tap_width()));
      if (i + m == n) std::copy_n(block_logits_.data() + static_cast<size_t>(m - 1) * V, V, logits);
    }
    return;
  }
  const int block = prefill_rows_;
  if (!headless_exec_) {
    DecodeProgram p = model_.build_program(block);
    headless_ = without_head(std::move(p));
    headless_exec_ = make_executor(exec_kind_, headless_, pool_);
    headless_exec_->set_trace(trace_);
  }
  block_logits_.resize(static_cast<size_t>(std::max(block, 1)) * V);
  for (int i = 0; i < n; i += block) {
    const int m = std::min(block, n - i);
    if (i + m < n) {
      headless_exec_->step(rows_of(i, m), block_logits_.data());
      continue;
    }
    // The last block: its last row's logits are needed. A model whose rows
    // do not depend on the block runs the others head-less and that row
    // alone; a recurrent one keeps the block whole (its chunked form
    // depends on the block) and takes it through the full program.
    if (!seq.recurrent && m > 1) {
      headless_exec_->step(rows_of(i, m - 1), block_logits_.data());
      step(rows_of(i + m - 1, 1), logits);
    } else if (m <= max_rows()) {
      step(rows_of(i, m), block_logits_.data());
      std::copy_n(block_logits_.data() + static_cast<size_t>(m - 1) * V, V, logits);
    } else {
      fail("prefill: a block of {} rows exceeds the engine's {} rows", m, max_rows());
    }
  }
}

}  // namespace megakern
