// Reference and op-by-op executors, and the shared slot arena.
#include <atomic>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "exec/exec_common.h"
#include "exec/executor.h"
#include "exec/op_kernels.h"

namespace megakern {

SlotArena::SlotArena(const DecodeProgram& p) {
  size_t total = 0;
  offsets.resize(p.slots.size());
  for (size_t s = 0; s < p.slots.size(); ++s) {
    offsets[s] = total;
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
    ctx.scalar = true;
    arena_.bind(ctx, p_, logits);
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
    arena_.bind(ctx, p_, logits);
    const int W = pool_.size();
    // One team-wide job per step: each worker walks the ops, does its share of
    // each, and meets the others at a spinning barrier before the next op, as
    // a conventional engine with a persistent thread team does.
    pool_.run([&](int w) {
      for (const Op& op : p_.ops) {
        const int n = op_tile_count(op, ctx.n_rows, W);
        for (int t = w; t < n; t += W) run_op_tile(op, ctx, t, n);
        barrier_.arrive_and_wait();
      }
    });
  }

 private:
  const DecodeProgram& p_;
  ThreadPool& pool_;
  SlotArena arena_;
  SpinBarrier barrier_;
};

}  // namespace

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
  fail("unknown executor '{}' (expected reference, opbyop or mega)", kind);
}

}  // namespace megakern
