// Reference and op-by-op executors, and the shared slot arena.
#include <atomic>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "core/thread_pool.h"
#include "exec/exec_common.h"
#include "exec/executor.h"
#include "exec/op_kernels.h"
#include "exec/recurrent_kernels.h"
#include "exec/schedule.h"

namespace megakern {

SlotArena::SlotArena(const DecodeProgram& p) {
  size_t total = 0;
  offsets.resize(p.slots.size());
  for (size_t s = 0; s < p.slots.size(); ++s) {
    offsets[s] = total;
    // The logits slot is the caller's buffer (bind): nothing to hold here
    // (it would be max_rows x n_vocab floats, 134 MB for a 262144-token
    // vocabulary at 128 rows).
    if (static_cast<int>(s) == p.logits_slot) continue;
    // Each slot starts on its own cache line so tiles of different ops never
    // share one.
    const size_t floats = static_cast<size_t>(p.slots[s].width) * static_cast<size_t>(p.max_rows);
    total += (floats + 15) / 16 * 16;
  }
  storage.assign(total + 16, 0.f);
}

void SlotArena::bind(StepContext& ctx, const DecodeProgram& p, float* logits) {
  // Align the base to 64 bytes.
  float* base = storage.data();
  while (reinterpret_cast<uintptr_t>(base) % 64 != 0) ++base;
  ctx.slot.resize(p.slots.size());
  for (size_t s = 0; s < p.slots.size(); ++s) ctx.slot[s] = base + offsets[s];
  ctx.slot[static_cast<size_t>(p.logits_slot)] = logits;
}

namespace {

class ReferenceExecutor final : public Executor {
 public:
  explicit ReferenceExecutor(const DecodeProgram& p) : p_(p), arena_(p) {}
  const char* name() const override { return "reference"; }
  void step(const std::vector<RowInput>& rows, float* logits) override {
    validate_rows(p_, rows);
    StepContext ctx;
    ctx.program = &p_;
    ctx.rows = rows.data();
    ctx.n_rows = static_cast<int>(rows.size());
    ctx.step_id = next_step_id();
    ctx.scalar = true;
    arena_.bind(ctx, p_, logits);
    ctx.taps = taps_;
    for (const Op& op : p_.ops) {
      const int n = op_tile_count(op, ctx.n_rows, 1);
      for (int t = 0; t < n; ++t) run_op_tile(op, ctx, t, n);
    }
  }

 private:
  const DecodeProgram& p_;
  SlotArena arena_;
};

class OpByOpExecutor final : public Executor {
 public:
  OpByOpExecutor(const DecodeProgram& p, ThreadPool& pool) : p_(p), pool_(pool), arena_(p), barrier_(pool.size()) {}
  const char* name() const override { return "opbyop"; }
  void step(const std::vector<RowInput>& rows, float* logits) override {
    validate_rows(p_, rows);
    StepContext ctx;
    ctx.program = &p_;
    ctx.rows = rows.data();
    ctx.n_rows = static_cast<int>(rows.size());
    ctx.step_id = next_step_id();
    arena_.bind(ctx, p_, logits);
    ctx.taps = taps_;
    const int W = pool_.size();
    // One team-wide job per step: each worker walks the ops, does its share of
    // each, and meets the others at a spinning barrier before the next op, as
    // a conventional engine with a persistent thread team does.
    if (trace_) {
      worker_events_.assign(static_cast<size_t>(W), {});
      t0_ = std::chrono::steady_clock::now();
    }
    // Rows whose recurrent states chain (a verify block of one sequence) run
    // a recurrent op one row at a time, a barrier between rows.
    const bool chained = p_.recurrent && rows_chained(rows.data(), ctx.n_rows);
    pool_.run([&](int w) {
      std::vector<TraceEvent>* ev = trace_ ? &worker_events_[static_cast<size_t>(w)] : nullptr;
      for (size_t i = 0; i < p_.ops.size(); ++i) {
        const Op& op = p_.ops[i];
        const int n = op_tile_count(op, ctx.n_rows, W);
        const int waves = chained && op_is_recurrent(op) ? ctx.n_rows : 1;
        for (int wave = 0; wave < waves; ++wave) {
          const int t0 = n / waves * wave, t1 = n / waves * (wave + 1);
          for (int t = t0 + w; t < t1; t += W) {
            const double start = ev ? now_us() : 0;
            run_op_tile(op, ctx, t, n);
            if (ev) ev->push_back({w, static_cast<int>(i), t, start, now_us() - start});
          }
          const double wait_start = ev ? now_us() : 0;
          barrier_.arrive_and_wait();
          if (ev) ev->push_back({w, -1, 0, wait_start, now_us() - wait_start});
        }
      }
    });
    if (trace_)
      for (auto& ev : worker_events_) trace_->insert(trace_->end(), ev.begin(), ev.end());
  }
  void set_trace(std::vector<TraceEvent>* sink) override { trace_ = sink; }

 private:
  const DecodeProgram& p_;
  ThreadPool& pool_;
  SlotArena arena_;
  SpinBarrier barrier_;
  std::vector<TraceEvent>* trace_ = nullptr;
  std::vector<std::vector<TraceEvent>> worker_events_;
  std::chrono::steady_clock::time_point t0_;
  double now_us() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0_).count();
  }
};

}  // namespace

std::string trace_to_json(const DecodeProgram& program, const std::vector<TraceEvent>& events) {
  std::string out = "{\"traceEvents\":[\n";
  bool first = true;
  for (const auto& e : events) {
    std::string name = "wait";
    if (e.op >= 0) {
      const Op& op = program.ops[static_cast<size_t>(e.op)];
      name = op.layer >= 0 ? fmt::format("{} L{} t{}", op.name, op.layer, e.tile) : fmt::format("{} t{}", op.name, e.tile);
    }
    out += fmt::format("{}{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{:.3f},\"dur\":{:.3f},\"pid\":1,\"tid\":{}}}",
                       first ? "" : ",\n", name, e.op >= 0 ? op_kind_name(program.ops[static_cast<size_t>(e.op)].kind) : "wait",
                       e.start_us, e.dur_us, e.worker);
    first = false;
  }
  out += "\n]}\n";
  return out;
}

std::unique_ptr<Executor> make_reference_executor(const DecodeProgram& program) {
  return std::make_unique<ReferenceExecutor>(program);
}
std::unique_ptr<Executor> make_opbyop_executor(const DecodeProgram& program, ThreadPool& pool) {
  return std::make_unique<OpByOpExecutor>(program, pool);
}
std::unique_ptr<Executor> make_executor(const std::string& kind, const DecodeProgram& program, ThreadPool& pool) {
  if (kind == "reference") return make_reference_executor(program);
  if (kind == "opbyop") return make_opbyop_executor(program, pool);
  if (kind == "mega") return make_mega_executor(program, pool);
  if (kind == "serial") return std::make_unique<SerialExecutor>(program, pool.size(), false);
  fail("unknown executor '{}' (expected reference, opbyop, mega or serial)", kind);
}

}  // namespace megakern
