// The megakernel executor.
//
// At first use for a given row count the program is compiled into a static
// schedule (exec/schedule.h): every op is cut into tiles, every tile is given to one worker, and
// each worker gets its tiles as one list in program order. Each tile lists the
// producer tiles it must wait for (read-after-write, write-after-write
// and write-after-read on its slots), so a worker only waits where data it
// needs is not ready yet: independent ops (the q, k and v products; gate and
// up) run back to back with no barrier, and row-wise ops wait only for their
// own row. (The lists are sufficient, not minimal: some entries are implied by
// others.) Completion is signalled by writing the step's epoch into the
// tile's flag, so flags never need resetting.
//
// Prefetch plan: every tile that streams weights records its byte range. A
// worker keeps a cursor into the weights of its own upcoming tiles and, while
// it waits on a dependency, issues prefetches into its L2 from that cursor,
// up to `prefetch_bytes` past the start of the tile it is about to run.
// Before a small (non-matrix) tile it also issues a short burst from the
// cursor (the weights of the next matrix tile), so the
// memory system stays busy across op and layer boundaries, where the
// op-by-op executor leaves it idle. The small tensors of the next layer (norm
// weights) are part of the same plan. Routed experts join the plan as soon
// as the step's routing is done: the cursor stops at a routed-expert tile
// until the route op's tiles have finished, then looks up the expert that
// tile will read and streams it in while the worker still computes the
// shared expert and the other tiles before it.
//
// Shared tiles: a matrix product's tiles are cut into chunks (Task::shared),
// and the tiles of routed experts and attention (uneven: an expert's rows
// vary with the routing, attention's cost with its rows' positions) are
// shared whole, as one chunk each.
// A worker runs its own tile's chunks from the front; a worker whose next
// tile waits, or whose list is done, takes chunks from the back of a tile
// among the next few shared ones of another list whose dependencies are
// done, so the uneven ends of products (the output head's above all) are
// split between the workers at run time. Each worker publishes where it is
// in its list at its shared tiles.
//
// Deadlock freedom: every dependency points to an earlier op, each worker's
// list is in program order, and every tile is on exactly one list, so the
// earliest unfinished tile overall can always run; a worker takes another's
// chunk only when that tile's dependencies are done, and never waits for a
// chunk it did not take.
#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "core/error.h"
#include "core/thread_pool.h"
#include "exec/exec_common.h"
#include "exec/executor.h"
#include "exec/op_kernels.h"
#include "exec/recurrent_kernels.h"
#include "exec/schedule.h"
#include "kernels/cpu/matmul.h"
#include "ops/matmul.h"
#include "ops/moe.h"
#include "ops/registry.h"

namespace megakern {
namespace {

struct alignas(64) Flag {
  std::atomic<uint64_t> epoch{0};
};

// The chunks of a shared tile (Task::shared) this step: [front, back) are
// unclaimed, `done` finished. Both words carry the step's epoch in their high
// half; a word of an earlier step reads as "nothing claimed, nothing done",
// so they never need resetting.
struct alignas(64) Claims {
  std::atomic<uint64_t> range{0};  // epoch << 32 | front << 16 | back
  std::atomic<uint64_t> done{0};   // epoch << 32 | chunks finished
};

// Claims a chunk of a tile of n chunks, from the front (its own worker) or
// the back (another); -1 when every chunk is claimed.
int claim_chunk(Claims& c, uint64_t epoch, int n, bool back) {
  epoch &= 0xffffffff;
  uint64_t v = c.range.load(std::memory_order_relaxed);
  for (;;) {
    uint64_t f = 0, b = static_cast<uint64_t>(n);
    if ((v >> 32) == epoch) {
      f = (v >> 16) & 0xffff;
      b = v & 0xffff;
    }
    if (f >= b) return -1;
    const uint64_t nf = back ? f : f + 1, nb = back ? b - 1 : b;
    if (c.range.compare_exchange_weak(v, epoch << 32 | nf << 16 | nb, std::memory_order_acq_rel,
                                      std::memory_order_relaxed))
      return static_cast<int>(back ? nb : f);
  }
}

// Counts a finished chunk; true for the tile's last one.
bool finish_chunk(Claims& c, uint64_t epoch, int n) {
  epoch &= 0xffffffff;
  uint64_t v = c.done.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t k = ((v >> 32) == epoch ? (v & 0xffffffff) : 0) + 1;
    if (c.done.compare_exchange_weak(v, epoch << 32 | k, std::memory_order_acq_rel, std::memory_order_relaxed))
      return k == static_cast<uint64_t>(n);
  }
}

inline void prefetch_l2(const uint8_t* p) {
#if defined(__x86_64__)
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

// A worker's walk over the weights of its upcoming tiles. Positions are
// absolute byte offsets into the concatenation of the worker's tile weights
// (prefix[k] = bytes of tiles before k), so "how far ahead" is a subtraction.
// A routed-expert tile's weights are looked up when the cursor reaches it,
// once the step's routing is done (until then the cursor waits there): so
// the selected experts are prefetched right after routing, while the worker
// still computes the tiles before them.
struct PrefetchCursor {
  const std::vector<Task>* tasks = nullptr;
  const std::vector<size_t>* prefix = nullptr;  // [tasks + 1]
  const DecodeProgram* program = nullptr;
  const StepContext* ctx = nullptr;
  const Flag* flags = nullptr;
  uint64_t epoch = 0;
  size_t task = 0;    // the next line to prefetch is in this tile...
  size_t offset = 0;  // ...at this byte offset
  size_t limit = 0;   // absolute position the cursor must not pass
  int n_ranges = -1;  // the routed tile under the cursor: ranges looked up (-1: not yet)
  ByteRange ranges[2];

  void next_task() {
    ++task;
    offset = 0;
    n_ranges = -1;
  }
  // The worker is about to run tile i: the cursor never lags behind it and
  // may run `budget` bytes past its start.
  void at_tile(size_t i, size_t budget) {
    if (task < i) {
      task = i - 1;
      next_task();
    }
    limit = (*prefix)[i] + budget;
  }
  bool routing_done(const Task& t) const {
    for (int f = t.route_begin; f < t.route_end; ++f)
      if (flags[f].epoch.load(std::memory_order_acquire) < epoch) return false;
    return true;
  }
  // Issues up to `lines` prefetches.
  void issue(size_t lines) {
    while (lines > 0 && task < tasks->size() && (*prefix)[task] + offset < limit) {
      const Task& t = (*tasks)[task];
      const uint8_t* line = nullptr;
      if (t.routed) {
        if (n_ranges < 0) {
          if (!routing_done(t)) return;
          const Op& op = program->ops[static_cast<size_t>(t.op)];
          n_ranges = op_info(op).routed_weights(op, *ctx, t.tile, t.n_tiles, ranges);
        }
        size_t off = offset;
        int k = 0;
        while (k < n_ranges && off >= ranges[k].bytes) off -= ranges[k++].bytes;
        if (k < n_ranges) line = ranges[k].begin + off;
      } else if (offset < t.weight_bytes) {
        line = t.weights + offset;
      }
      if (!line) {
        next_task();
        continue;
      }
      prefetch_l2(line);
      offset += 64;
      --lines;
    }
  }
};

class MegaExecutor final : public Executor {
 public:
  MegaExecutor(const DecodeProgram& p, ThreadPool& pool, const MegaOptions& o)
      : p_(p),
        pool_(pool),
        opts_(o),
        arena_(p),
        schedules_(static_cast<size_t>(p.max_rows) + 1),
        chained_schedules_(static_cast<size_t>(p.max_rows) + 1) {}
  const char* name() const override { return "mega"; }

  void prepare(int n_rows) override {
    if (n_rows < 1 || n_rows > p_.max_rows) fail("a step needs 1 to {} rows, got {}", p_.max_rows, n_rows);
    auto& sched = schedules_[static_cast<size_t>(n_rows)];
    if (!sched) sched = std::make_unique<Schedule>(compile(p_, n_rows, pool_.size(), {false, opts_.prefetch_experts, opts_.share_matmuls}));
  }

  void step(const std::vector<RowInput>& rows, float* logits) override {
    validate_rows(p_, rows);
    const int n_rows = static_cast<int>(rows.size());
    prepare(n_rows);
    const bool chained = p_.recurrent && rows_chained(rows.data(), n_rows);
    if (chained && !chained_schedules_[static_cast<size_t>(n_rows)])
      chained_schedules_[static_cast<size_t>(n_rows)] =
          std::make_unique<Schedule>(compile(p_, n_rows, pool_.size(), {true, opts_.prefetch_experts, opts_.share_matmuls}));
    auto& sched = chained ? chained_schedules_[static_cast<size_t>(n_rows)] : schedules_[static_cast<size_t>(n_rows)];
    if (static_cast<int>(flags_.size()) < sched->n_flags) {
      // Resizing is only safe between steps; flags restart from epoch 0.
      flags_ = std::vector<Flag>(static_cast<size_t>(sched->n_flags));
      claims_ = std::vector<Claims>(static_cast<size_t>(sched->n_flags));
      epoch_ = 0;
    }
    if (positions_.size() != static_cast<size_t>(pool_.size()))
      positions_ = std::vector<Flag>(static_cast<size_t>(pool_.size()));
    ++epoch_;
    StepContext ctx;
    ctx.program = &p_;
    ctx.rows = rows.data();
    ctx.n_rows = n_rows;
    ctx.step_id = next_step_id();
    arena_.bind(ctx, p_, logits);
    ctx.taps = taps_;
    const uint64_t epoch = epoch_;
    const Schedule& s = *sched;
    if (trace_) {
      worker_events_.assign(static_cast<size_t>(pool_.size()), {});
      t0_ = std::chrono::steady_clock::now();
    }
    pool_.run([&](int w) { run_worker(s, ctx, w, epoch); });
    if (trace_)
      for (auto& ev : worker_events_) trace_->insert(trace_->end(), ev.begin(), ev.end());
  }

  void set_trace(std::vector<TraceEvent>* sink) override { trace_ = sink; }

 private:
  double now_us() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0_).count();
  }

  void run_worker(const Schedule& s, const StepContext& ctx, int w, uint64_t epoch) {
    const auto& tasks = s.worker_tasks[static_cast<size_t>(w)];
    std::vector<TraceEvent>* events = trace_ ? &worker_events_[static_cast<size_t>(w)] : nullptr;
    PrefetchCursor pf;
    pf.tasks = &tasks;
    pf.prefix = &s.weight_prefix[static_cast<size_t>(w)];
    pf.program = &p_;
    pf.ctx = &ctx;
    pf.flags = flags_.data();
    pf.epoch = epoch;
    const size_t budget = opts_.prefetch_bytes;
    auto& position = positions_[static_cast<size_t>(w)].epoch;
    for (size_t i = 0; i < tasks.size(); ++i) {
      const Task& t = tasks[i];
      // Published at shared tiles only: the others read it when idle.
      if (t.shared) position.store((epoch & 0xffffffff) << 32 | i, std::memory_order_release);
      if (budget) pf.at_tile(i, budget);
      double wait_start = events ? now_us() : 0;
      for (uint32_t d = t.dep_begin; d < t.dep_end; ++d) {
        const auto& f = flags_[static_cast<size_t>(s.deps[d])].epoch;
        int spins = 0;
        while (f.load(std::memory_order_acquire) < epoch) {
          // Rather than wait, finish part of a shared tile another worker
          // has yet to: the one this worker waits for, or one before it.
          if (spins % 8 == 0 && take_shared(s, ctx, w, epoch, events, wait_start)) {
            spins = 0;
            continue;
          }
          if (budget) pf.issue(4);
          spin_pause();
          if (++spins > kSpinsBeforeYield) std::this_thread::yield();
        }
      }
      const Op& op = p_.ops[static_cast<size_t>(t.op)];
      // A small tile leaves the memory system idle; start the next stream.
      if (budget && op.kind != OpKind::MatMul) pf.issue(64);
      if (events) {
        const double start = now_us();
        if (start - wait_start > 0.05) events->push_back({w, -1, 0, wait_start, start - wait_start});
      }
      if (!t.shared) {
        const double start = events ? now_us() : 0;
        run_op_tile(op, ctx, t.tile, t.n_tiles);
        if (events) events->push_back({w, t.op, t.tile, start, now_us() - start});
        flags_[static_cast<size_t>(t.flag)].epoch.store(epoch, std::memory_order_release);
        continue;
      }
      // Its own tile's chunks from the front; past it once all are claimed
      // (a worker that took some signals the tile when it finishes last).
      Claims& c = claims_[static_cast<size_t>(t.flag)];
      for (int k; (k = claim_chunk(c, epoch, t.chunks, false)) >= 0;) run_chunk(t, k, ctx, w, epoch, events, true);
    }
    // Its list done, it helps with the others' last shared tiles (the output
    // head's chunks, mostly) rather than leave the step's end to them.
    double idle_start = events ? now_us() : 0;
    while (take_shared(s, ctx, w, epoch, events, idle_start)) {
    }
  }

  // Runs chunk k of shared tile t and signals the tile if it was the last.
  // `front`: taken in order from the front by the tile's own worker, whose
  // next chunk is then most likely k + 1, named to the kernels as the rows
  // that follow (weight_lookahead), so that a kernel which prefetches its
  // next panel does so across the chunk's end rather than starting every
  // chunk on cold weights (the tiled f32 kernel; qwen3.8-bench, bf16, batch
  // 8, one run: the megakernel at 0.88x of op-by-op without, 1.03x with;
  // other runs on the same host put both within its run-to-run spread).
  void run_chunk(const Task& t, int k, const StepContext& ctx, int w, uint64_t epoch, std::vector<TraceEvent>* events,
                 bool front = false) {
    const Op& op = p_.ops[static_cast<size_t>(t.op)];
    const double start = events ? now_us() : 0;
    struct Lookahead {  // named for this call only
      WeightLookahead& next = weight_lookahead();
      ~Lookahead() { next = {}; }
    } la;
    if (front && k + 1 < t.chunks && op.kind == OpKind::MatMul) {
      int64_t b = 0, e = 0;
      matmul_tile_range(op, t.tile * t.chunks + k + 1, t.n_tiles * t.chunks, b, e);
      la.next = {op.mat.row(b), op.mat.row(e)};
    }
    run_task_chunk(op, ctx, t, k);
    if (events) events->push_back({w, t.op, t.tile, start, now_us() - start});
    if (finish_chunk(claims_[static_cast<size_t>(t.flag)], epoch, t.chunks))
      flags_[static_cast<size_t>(t.flag)].epoch.store(epoch, std::memory_order_release);
  }

  // A waiting worker takes one back chunk of a shared tile among the next
  // few shared tiles of another worker's list (from the last it started)
  // whose dependencies are done; false when there is none. (The tile's own
  // worker may be running its front chunks: the claims keep each chunk to
  // one worker.)
  bool take_shared(const Schedule& s, const StepContext& ctx, int w, uint64_t epoch, std::vector<TraceEvent>* events,
                   double& wait_start) {
    for (int v = 0; v < s.n_workers; ++v) {
      if (v == w) continue;
      const auto& list = s.worker_tasks[static_cast<size_t>(v)];
      const uint64_t at = positions_[static_cast<size_t>(v)].epoch.load(std::memory_order_acquire);
      const size_t from = (at >> 32) == (epoch & 0xffffffff) ? (at & 0xffffffff) : 0;
      int seen = 0;
      for (size_t i = from; i < list.size() && seen < kShareLookahead; ++i) {
        const Task& t = list[i];
        if (!t.shared) continue;
        ++seen;
        if (flags_[static_cast<size_t>(t.flag)].epoch.load(std::memory_order_acquire) >= epoch) continue;
        bool ready = true;
        for (uint32_t d = t.dep_begin; d < t.dep_end && ready; ++d)
          ready = flags_[static_cast<size_t>(s.deps[d])].epoch.load(std::memory_order_acquire) >= epoch;
        if (!ready) continue;
        const int k = claim_chunk(claims_[static_cast<size_t>(t.flag)], epoch, t.chunks, true);
        if (k < 0) continue;
        if (events) {
          const double now = now_us();
          if (now - wait_start > 0.05) events->push_back({w, -1, 0, wait_start, now - wait_start});
        }
        run_chunk(t, k, ctx, w, epoch, events);
        if (events) wait_start = now_us();
        return true;
      }
    }
    return false;
  }

  const DecodeProgram& p_;
  ThreadPool& pool_;
  MegaOptions opts_;
  SlotArena arena_;
  std::vector<std::unique_ptr<Schedule>> schedules_;
  std::vector<std::unique_ptr<Schedule>> chained_schedules_;  // steps with chained recurrent rows
  std::vector<Flag> flags_;
  std::vector<Claims> claims_;    // [flag] chunks of shared tiles
  std::vector<Flag> positions_;  // [worker] epoch << 32 | index of the tile in its list it is at
  uint64_t epoch_ = 0;
  std::vector<TraceEvent>* trace_ = nullptr;
  std::vector<std::vector<TraceEvent>> worker_events_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

std::unique_ptr<Executor> make_mega_executor(const DecodeProgram& program, ThreadPool& pool, const MegaOptions& opts) {
  MegaOptions o = opts;
  // MEGAKERN_MEGA_SHARE=0 turns shared matrix-product tiles off wherever the
  // megakernel is made (prompt passes, the server), for A/B runs.
  if (const char* e = std::getenv("MEGAKERN_MEGA_SHARE"); e && std::string_view(e) == "0") o.share_matmuls = false;
  return std::make_unique<MegaExecutor>(program, pool, o);
}

}  // namespace megakern
