// The megakernel executor.
//
// At first use for a given row count the program is compiled into a static
// schedule: every op is cut into tiles, every tile is given to one worker, and
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
// Deadlock freedom: every dependency points to an earlier op, each worker's
// list is in program order, and every tile is on exactly one list, so the
// earliest unfinished tile overall can always run.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/thread_pool.h"
#include "exec/exec_common.h"
#include "exec/executor.h"
#include "exec/moe_kernels.h"
#include "exec/op_kernels.h"
#include "exec/recurrent_kernels.h"

namespace megakern {
namespace {

struct alignas(64) Flag {
  std::atomic<uint64_t> epoch{0};
};

struct Region {
  const uint8_t* begin = nullptr;
  size_t bytes = 0;
};

struct Task {
  int op = 0;
  int tile = 0;
  int n_tiles = 0;
  int flag = 0;                // this tile's global flag index
  uint32_t dep_begin = 0, dep_end = 0;  // range in Schedule::deps
  Region weights;              // what the tile streams (static tiles)
  // Routed-expert tiles (MoeGlu / MoeDown): the weights depend on the step's
  // routing, so they are looked up once the route op's tiles, flags
  // [route_begin, route_end), are done; `weights` is then unused.
  bool routed = false;
  int route_begin = 0, route_end = 0;
};

struct Schedule {
  int n_rows = 0;
  std::vector<std::vector<Task>> worker_tasks;  // [worker] in program order
  std::vector<std::vector<size_t>> weight_prefix;  // [worker][task + 1] bytes before each task
  std::vector<int> deps;                          // global flag indices
  int n_flags = 0;
};

Region weight_region(const Op& op, int tile, int n_tiles) {
  Region r;
  if (op.kind == OpKind::MatMul) {
    int64_t b, e;
    matmul_tile_range(op, tile, n_tiles, b, e);
    r.begin = op.mat.data + static_cast<size_t>(b) * op.mat.row_bytes;
    r.bytes = static_cast<size_t>(e - b) * op.mat.row_bytes;
  } else if (op.norm && tile == 0) {
    r.begin = reinterpret_cast<const uint8_t*>(op.norm);
    r.bytes = sizeof(float) * static_cast<size_t>(op.n_norm);
  }
  return r;
}

// chained: rows of one sequence chain their recurrent states (RowInput::
// state_in), so each recurrent tile of row r also waits for the same op's
// tile of row r - 1 (same head). Those dependencies point to earlier tiles of
// the same op, which every worker list also holds in order, so the earliest
// unfinished tile can still always run.
Schedule compile(const DecodeProgram& p, int n_rows, int W, bool chained, bool prefetch_experts) {
  Schedule s;
  s.n_rows = n_rows;
  s.worker_tasks.resize(static_cast<size_t>(W));
  const size_t n_ops = p.ops.size();
  std::vector<int> n_tiles(n_ops), flag_base(n_ops);
  for (size_t i = 0; i < n_ops; ++i) {
    n_tiles[i] = op_tile_count(p.ops[i], n_rows, W);
    flag_base[i] = s.n_flags;
    s.n_flags += n_tiles[i];
  }
  // Producer ops of each op: last writer of each slot read or written (RAW,
  // WAW) and every reader of a written slot since its last write (WAR).
  std::vector<int> last_writer(p.slots.size(), -1);
  std::vector<std::vector<int>> readers_since(p.slots.size());
  for (size_t i = 0; i < n_ops; ++i) {
    const Op& op = p.ops[i];
    std::set<int> producers;
    for (int sl : op.reads())
      if (last_writer[static_cast<size_t>(sl)] >= 0) producers.insert(last_writer[static_cast<size_t>(sl)]);
    if (op.out >= 0) {
      // WAR: wait for every reader since the last write. Those readers
      // waited for the last writer themselves, so the WAW dependency on it is
      // only needed when there were none.
      bool other_readers = false;
      for (int rd : readers_since[static_cast<size_t>(op.out)])
        if (rd != static_cast<int>(i)) {
          producers.insert(rd);
          other_readers = true;
        }
      if (!other_readers && last_writer[static_cast<size_t>(op.out)] >= 0)
        producers.insert(last_writer[static_cast<size_t>(op.out)]);
    }
    for (int t = 0; t < n_tiles[i]; ++t) {
      Task task;
      task.op = static_cast<int>(i);
      task.tile = t;
      task.n_tiles = n_tiles[i];
      task.flag = flag_base[i] + t;
      task.weights = weight_region(op, t, n_tiles[i]);
      if (prefetch_experts && (op.kind == OpKind::MoeGlu || op.kind == OpKind::MoeDown) &&
          last_writer[static_cast<size_t>(op.in2)] >= 0) {
        const size_t route_op = static_cast<size_t>(last_writer[static_cast<size_t>(op.in2)]);
        task.routed = true;
        task.route_begin = flag_base[route_op];
        task.route_end = flag_base[route_op] + n_tiles[route_op];
      }
      task.dep_begin = static_cast<uint32_t>(s.deps.size());
      // The rows [r0, r1) this tile touches, when it touches only some.
      int r0 = 0, r1 = 0;
      const bool some_rows = op_tile_rows(op, t, n_tiles[i], n_rows, r0, r1);
      for (int pr : producers) {
        const Op& pop = p.ops[static_cast<size_t>(pr)];
        // A row-wise producer feeds a consumer of some rows through those
        // rows only. StoreKV is the exception: rows of one sequence read
        // each other's keys, so attention waits for every row's store.
        if (some_rows && op_is_row_tiled(pop) && pop.kind != OpKind::StoreKV) {
          for (int r = r0; r < r1; ++r) s.deps.push_back(flag_base[static_cast<size_t>(pr)] + r);
        } else if (some_rows && pop.kind == OpKind::Attention) {
          // Attention tiles are (row block, KV head, part of the group): a
          // consumer of some rows needs only the tiles of their blocks.
          int t0 = 0, t1 = 0;
          attention_tiles_of_rows(pop, r0, r1, n_tiles[static_cast<size_t>(pr)], n_rows, t0, t1);
          for (int pt = t0; pt < t1; ++pt) s.deps.push_back(flag_base[static_cast<size_t>(pr)] + pt);
        } else {
          for (int pt = 0; pt < n_tiles[static_cast<size_t>(pr)]; ++pt)
            s.deps.push_back(flag_base[static_cast<size_t>(pr)] + pt);
        }
      }
      if (chained && op_is_recurrent(op)) {
        const int per_row = n_tiles[i] / n_rows;  // 1 (conv) or n_head (delta rule)
        if (t >= per_row) s.deps.push_back(flag_base[i] + t - per_row);
      }
      task.dep_end = static_cast<uint32_t>(s.deps.size());
      // Placement: matrix tiles one per worker (contiguous weight streams);
      // row-wise tiles by row, so a row's small ops stay on one core while
      // the others prefetch; attention tiles round-robin.
      s.worker_tasks[static_cast<size_t>(t % W)].push_back(task);
    }
    for (int sl : op.reads()) readers_since[static_cast<size_t>(sl)].push_back(static_cast<int>(i));
    if (op.out >= 0) {
      last_writer[static_cast<size_t>(op.out)] = static_cast<int>(i);
      readers_since[static_cast<size_t>(op.out)].clear();
    }
  }
  for (const auto& tasks : s.worker_tasks) {
    std::vector<size_t> prefix(tasks.size() + 1, 0);
    for (size_t k = 0; k < tasks.size(); ++k) {
      const Task& t = tasks[k];
      prefix[k + 1] = prefix[k] + (t.routed ? moe_tile_weight_bytes(p.ops[static_cast<size_t>(t.op)], n_rows, t.tile,
                                                                     t.n_tiles)
                                            : t.weights.bytes);
    }
    s.weight_prefix.push_back(std::move(prefix));
  }
  return s;
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
          n_ranges = moe_tile_weights(program->ops[static_cast<size_t>(t.op)], *ctx, t.tile, t.n_tiles, ranges);
        }
        size_t off = offset;
        int k = 0;
        while (k < n_ranges && off >= ranges[k].bytes) off -= ranges[k++].bytes;
        if (k < n_ranges) line = ranges[k].begin + off;
      } else if (offset < t.weights.bytes) {
        line = t.weights.begin + offset;
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
    if (!sched) sched = std::make_unique<Schedule>(compile(p_, n_rows, pool_.size(), false, opts_.prefetch_experts));
  }

  void step(const std::vector<RowInput>& rows, float* logits) override {
    validate_rows(p_, rows);
    const int n_rows = static_cast<int>(rows.size());
    prepare(n_rows);
    const bool chained = p_.recurrent && rows_chained(rows.data(), n_rows);
    if (chained && !chained_schedules_[static_cast<size_t>(n_rows)])
      chained_schedules_[static_cast<size_t>(n_rows)] =
          std::make_unique<Schedule>(compile(p_, n_rows, pool_.size(), true, opts_.prefetch_experts));
    auto& sched = chained ? chained_schedules_[static_cast<size_t>(n_rows)] : schedules_[static_cast<size_t>(n_rows)];
    if (static_cast<int>(flags_.size()) < sched->n_flags) {
      // Resizing is only safe between steps; flags restart from epoch 0.
      flags_ = std::vector<Flag>(static_cast<size_t>(sched->n_flags));
      epoch_ = 0;
    }
    ++epoch_;
    StepContext ctx;
    ctx.program = &p_;
    ctx.rows = rows.data();
    ctx.n_rows = n_rows;
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
    for (size_t i = 0; i < tasks.size(); ++i) {
      const Task& t = tasks[i];
      if (budget) pf.at_tile(i, budget);
      const double wait_start = events ? now_us() : 0;
      for (uint32_t d = t.dep_begin; d < t.dep_end; ++d) {
        const auto& f = flags_[static_cast<size_t>(s.deps[d])].epoch;
        int spins = 0;
        while (f.load(std::memory_order_acquire) < epoch) {
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
        run_op_tile(op, ctx, t.tile, t.n_tiles);
        events->push_back({w, t.op, t.tile, start, now_us() - start});
      } else {
        run_op_tile(op, ctx, t.tile, t.n_tiles);
      }
      flags_[static_cast<size_t>(t.flag)].epoch.store(epoch, std::memory_order_release);
    }
  }

  const DecodeProgram& p_;
  ThreadPool& pool_;
  MegaOptions opts_;
  SlotArena arena_;
  std::vector<std::unique_ptr<Schedule>> schedules_;
  std::vector<std::unique_ptr<Schedule>> chained_schedules_;  // steps with chained recurrent rows
  std::vector<Flag> flags_;
  uint64_t epoch_ = 0;
  std::vector<TraceEvent>* trace_ = nullptr;
  std::vector<std::vector<TraceEvent>> worker_events_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

std::unique_ptr<Executor> make_mega_executor(const DecodeProgram& program, ThreadPool& pool, const MegaOptions& opts) {
  return std::make_unique<MegaExecutor>(program, pool, opts);
}

}  // namespace megakern
