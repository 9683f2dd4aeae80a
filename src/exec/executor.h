// Executors of a DecodeProgram. All three run the same program with the same
// per-op kernels (exec/op_kernels.h):
//  - reference: one op at a time on one thread with the scalar kernels (the oracle);
//  - op-by-op:  every op split across the thread team, a spinning barrier after
//               each op (the conventional design, our baseline);
//  - megakernel: the program compiled into a static per-worker schedule of
//               tiles with per-tile dependency flags instead of barriers, and a
//               weight-prefetch plan that runs ahead across op and layer
//               boundaries; one call runs a whole step without returning.
// The op-by-op and megakernel executors give bit-identical logits; a row's
// logits do not depend on the other rows of its batch. Rows (RowInput) are in
// ir/sequence_state.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ir/program.h"
#include "ir/sequence_state.h"

namespace megakern {

class ThreadPool;

// One span of a worker's time in a traced step: a tile it computed, or a wait
// for a dependency (op = -1 marks a wait). Times in microseconds from the
// start of the step.
struct TraceEvent {
  int worker = 0;
  int op = -1;
  int tile = 0;
  double start_us = 0;
  double dur_us = 0;
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const char* name() const = 0;
  // Runs one decode step over rows (1..program.max_rows) and writes logits
  // [rows.size()][n_vocab]. Throws megakern::Error on bad rows (token out of
  // vocabulary, position outside the row's cache).
  virtual void step(const std::vector<RowInput>& rows, float* logits) = 0;
  // Does any per-row-count preparation (the megakernel compiles its schedule)
  // ahead of the first step, so it can be timed on its own.
  virtual void prepare(int n_rows) { (void)n_rows; }
  // When sink is non-null, the following steps append their tiles and waits
  // to it (executors that cannot trace leave it untouched).
  virtual void set_trace(std::vector<TraceEvent>* sink) { (void)sink; }
  // Where the following steps' Tap ops write: [rows][program.tap_width]
  // floats (row r of the step in row r). Null (the default) skips them.
  void set_tap_output(float* buf) { taps_ = buf; }
  float* tap_output() const { return taps_; }

 protected:
  float* taps_ = nullptr;
};

// Writes events as a Chrome / Perfetto trace (JSON "traceEvents").
std::string trace_to_json(const DecodeProgram& program, const std::vector<TraceEvent>& events);

std::unique_ptr<Executor> make_reference_executor(const DecodeProgram& program);
std::unique_ptr<Executor> make_opbyop_executor(const DecodeProgram& program, ThreadPool& pool);

struct MegaOptions {
  // Bytes of upcoming weights a worker may have prefetched ahead of the tile
  // it is computing (the "ring of in-flight slabs"); 0 disables prefetch.
  size_t prefetch_bytes = 512 * 1024;
  // Include routed experts in the plan: a worker prefetches the experts its
  // MoE tiles will read as soon as the step's routing is done.
  bool prefetch_experts = true;
  // Matrix-product tiles shared between the workers in chunks (see
  // CompileOptions::share_matmuls in exec/schedule.h).
  bool share_matmuls = true;
};
std::unique_ptr<Executor> make_mega_executor(const DecodeProgram& program, ThreadPool& pool,
                                             const MegaOptions& opts = {});

// "reference", "opbyop", "mega" or "serial" (exec/schedule.h); throws on anything else.
std::unique_ptr<Executor> make_executor(const std::string& kind, const DecodeProgram& program, ThreadPool& pool);

}  // namespace megakern
