#include "exec/schedule.h"

#include <algorithm>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.h"
#include "exec/exec_common.h"
#include "exec/recurrent_kernels.h"
#include "ops/matmul.h"
#include "ops/registry.h"

namespace megakern {

bool op_tiles_shareable(const Op& op) { return op_info(op).shareable; }
bool op_tiles_chunkable(const Op& op) { return op_info(op).shareable && op_info(op).chunkable; }

void run_task_chunk(const Op& op, const StepContext& ctx, const Task& t, int c) {
  if (t.chunks == 1)
    run_op_tile(op, ctx, t.tile, t.n_tiles);
  else
    run_op_tile(op, ctx, t.tile * t.chunks + c, t.n_tiles * t.chunks);
}

namespace {

// The 4-column units of a shareable op's tile: the most chunks it can be cut into.
int64_t tile_units(const Op& op, int t, int n_tiles) {
  int64_t b = 0, e = 0;
  matmul_tile_range(op, t, n_tiles, b, e);
  return (e - b + 3) / 4;
}

void weight_region(const Op& op, int tile, int n_tiles, Task& task) {
  const OpInfo& i = op_info(op);
  if (i.tile_weights) {
    i.tile_weights(op, tile, n_tiles, task.weights, task.weight_bytes);
  } else if (i.small_weights && tile == 0) {
    const std::span<const float> w = i.small_weights(op);
    task.weights = w.empty() ? nullptr : reinterpret_cast<const uint8_t*>(w.data());
    task.weight_bytes = sizeof(float) * w.size();
  }
}

// The rows [r0, r1) a tile touches; false when it touches every row.
bool tile_rows(const OpInfo& i, const Op& op, int t, int n_tiles, int n_rows, int& r0, int& r1) {
  if (i.tile_rows) {
    i.tile_rows(op, t, n_tiles, n_rows, r0, r1);
    return true;
  }
  r0 = t;
  r1 = t + 1;
  return i.row_tiled;
}

}  // namespace

// Dependencies of recurrent tiles on the previous row's (chained) point to
// earlier tiles of the same op, which every worker list also holds in order,
// so the earliest unfinished tile can always run.
Schedule compile(const DecodeProgram& p, int n_rows, int W, const CompileOptions& opts) {
  Schedule s;
  s.n_rows = n_rows;
  s.n_workers = W;
  s.chained = opts.chained;
  auto info_of = [&](const Op& op) -> const OpInfo& { return opts.info ? opts.info(op) : op_info(op); };
  s.worker_tasks.resize(static_cast<size_t>(W));
  const size_t n_ops = p.ops.size();
  s.op_tiles.resize(n_ops);
  s.op_flag.resize(n_ops);
  for (size_t i = 0; i < n_ops; ++i) {
    s.op_tiles[i] = op_tile_count(p.ops[i], n_rows, W);
    s.op_flag[i] = s.n_flags;
    s.n_flags += s.op_tiles[i];
  }
  const auto& n_tiles = s.op_tiles;
  const auto& flag_base = s.op_flag;
  // Producer ops of each op: last writer of each slot read or written (RAW,
  // WAW) and every reader of a written slot since its last write (WAR).
  std::vector<int> last_writer(p.slots.size(), -1);
  std::vector<std::vector<int>> readers_since(p.slots.size());
  for (size_t i = 0; i < n_ops; ++i) {
    const Op& op = p.ops[i];
    const OpInfo& info = info_of(op);
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
      weight_region(op, t, n_tiles[i], task);
      if (opts.prefetch_experts && info.routed_weights && last_writer[static_cast<size_t>(op.in2)] >= 0) {
        const size_t route_op = static_cast<size_t>(last_writer[static_cast<size_t>(op.in2)]);
        task.routed = true;
        task.route_begin = flag_base[route_op];
        task.route_end = flag_base[route_op] + n_tiles[route_op];
      }
      task.dep_begin = static_cast<uint32_t>(s.deps.size());
      int r0 = 0, r1 = 0;
      const bool some_rows = tile_rows(info, op, t, n_tiles[i], n_rows, r0, r1);
      for (int pr : producers) {
        const Op& pop = p.ops[static_cast<size_t>(pr)];
        // A row-wise producer feeds a consumer of some rows through those rows
        // only (attention: the (row block, KV head, part) tiles of their
        // blocks). StoreKV is the exception: rows of one sequence read each
        // other's keys, so attention waits for every row's store.
        const OpInfo& pinfo = info_of(pop);
        const bool narrow = some_rows && !pinfo.feeds_all_rows;
        if (narrow && pinfo.row_tiled && !pinfo.tile_rows) {
          for (int r = r0; r < r1; ++r) s.deps.push_back(flag_base[static_cast<size_t>(pr)] + r);
          continue;
        }
        for (int pt = 0; pt < n_tiles[static_cast<size_t>(pr)]; ++pt) {
          if (info.reads_tile && !info.reads_tile(op, pop, n_rows, t, n_tiles[i], pt, n_tiles[static_cast<size_t>(pr)]))
            continue;
          int p0 = 0, p1 = 0;
          if (!narrow || !tile_rows(pinfo, pop, pt, n_tiles[static_cast<size_t>(pr)], n_rows, p0, p1) || (p0 < r1 && r0 < p1))
            s.deps.push_back(flag_base[static_cast<size_t>(pr)] + pt);
        }
      }
      if (opts.chained && op_is_recurrent(op)) {
        const int per_row = n_tiles[i] / n_rows;  // 1 (conv) or n_head (delta rule)
        if (t >= per_row) s.deps.push_back(flag_base[i] + t - per_row);
      }
      task.dep_end = static_cast<uint32_t>(s.deps.size());
      if (opts.share_matmuls && op_tiles_shareable(op)) {
        task.shared = true;
        if (op_tiles_chunkable(op)) {
          const size_t by_bytes = opts.chunk_bytes ? task.weight_bytes / opts.chunk_bytes : 1;
          // (The megakernel counts a tile's chunks in 16 bits.)
          const int64_t c = std::min<int64_t>(
              {static_cast<int64_t>(by_bytes), opts.max_chunks, tile_units(op, t, n_tiles[i]), int64_t{0xffff}});
          task.chunks = static_cast<int>(std::max<int64_t>(1, c));
        }
      }
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
      const Op& op = p.ops[static_cast<size_t>(t.op)];
      prefix[k + 1] = prefix[k] + (t.routed ? op_info(op).routed_weight_bytes(op, n_rows, t.tile, t.n_tiles) : t.weight_bytes);
    }
    s.weight_prefix.push_back(std::move(prefix));
  }
  return s;
}

void check_schedule(const DecodeProgram& p, const Schedule& s, const OpInfo& (*info)(const Op& op)) {
  const size_t n_ops = p.ops.size();
  auto info_of = [&](const Op& op) -> const OpInfo& { return info ? info(op) : op_info(op); };
  auto bad = [&](const std::string& what) { throw std::logic_error("schedule of " + p.model_name + ": " + what); };
  if (s.op_tiles.size() != n_ops || s.op_flag.size() != n_ops) bad("op tables do not match the program");
  if (static_cast<int>(s.worker_tasks.size()) != s.n_workers) bad("worker count");
  // Flags belong to tiles: op i's tile t is flag op_flag[i] + t.
  std::vector<int> flag_op(static_cast<size_t>(s.n_flags), -1), flag_tile(static_cast<size_t>(s.n_flags), -1);
  int next = 0;
  for (size_t i = 0; i < n_ops; ++i) {
    if (s.op_tiles[i] != op_tile_count(p.ops[i], s.n_rows, s.n_workers) || s.op_flag[i] != next)
      bad(fmt::format("op {} has {} tiles at flag {}", i, s.op_tiles[i], s.op_flag[i]));
    for (int t = 0; t < s.op_tiles[i]; ++t) {
      flag_op[static_cast<size_t>(next)] = static_cast<int>(i);
      flag_tile[static_cast<size_t>(next++)] = t;
    }
  }
  if (next != s.n_flags) bad("flag count");
  // Every tile exactly once, each list in program order.
  std::vector<int> seen(static_cast<size_t>(s.n_flags), 0);
  std::vector<const Task*> task_of(static_cast<size_t>(s.n_flags), nullptr);
  for (size_t w = 0; w < s.worker_tasks.size(); ++w) {
    int prev = -1;
    for (const Task& t : s.worker_tasks[w]) {
      if (t.flag < 0 || t.flag >= s.n_flags || flag_op[static_cast<size_t>(t.flag)] != t.op ||
          flag_tile[static_cast<size_t>(t.flag)] != t.tile || t.n_tiles != s.op_tiles[static_cast<size_t>(t.op)])
        bad(fmt::format("worker {}: task (op {}, tile {}) has flag {}", w, t.op, t.tile, t.flag));
      if (t.flag <= prev) bad(fmt::format("worker {}: op {} tile {} is out of program order", w, t.op, t.tile));
      prev = t.flag;
      const Op& op = p.ops[static_cast<size_t>(t.op)];
      if (t.chunks < 1 || (t.shared && !op_tiles_shareable(op)) || (t.chunks > 1 && !op_tiles_chunkable(op)) ||
          (t.chunks > 1 && t.chunks > tile_units(op, t.tile, t.n_tiles)))
        bad(fmt::format("op {} ('{}') tile {}: {} chunks{} on a kind whose tiles {}", t.op, op.name, t.tile, t.chunks,
                        t.shared ? ", shared," : "",
                        !op_tiles_shareable(op) ? "cannot be shared"
                        : !op_tiles_chunkable(op) ? "cannot be cut into chunks"
                                                   : "have fewer 4-column units"));
      ++seen[static_cast<size_t>(t.flag)];
      task_of[static_cast<size_t>(t.flag)] = &t;
      for (uint32_t d = t.dep_begin; d < t.dep_end; ++d) {
        const int f = s.deps[d];
        if (f < 0 || f >= s.n_flags) bad(fmt::format("op {} tile {}: dependency {} out of range", t.op, t.tile, f));
        const int dop = flag_op[static_cast<size_t>(f)];
        const bool chain = s.chained && dop == t.op && op_is_recurrent(p.ops[static_cast<size_t>(t.op)]) && f < t.flag;
        if (dop >= t.op && !chain)
          bad(fmt::format("op {} tile {} waits for op {}, not an earlier op", t.op, t.tile, dop));
      }
    }
  }
  for (int f = 0; f < s.n_flags; ++f)
    if (seen[static_cast<size_t>(f)] != 1)
      bad(fmt::format("op {} tile {} is on {} worker lists", flag_op[static_cast<size_t>(f)],
                      flag_tile[static_cast<size_t>(f)], seen[static_cast<size_t>(f)]));
  // Rows a tile touches, from what each kind of op does: one row for per-row
  // tiles, a block of rows for attention; every row otherwise. A KV store
  // feeds the attention of every row of its sequence.
  // [r0, r1): the consumer's rows; all = true when it touches every row.
  auto touches = [&](int f, bool all, int r0, int r1) {
    const Op& op = p.ops[static_cast<size_t>(flag_op[static_cast<size_t>(f)])];
    const int t = flag_tile[static_cast<size_t>(f)], n = s.op_tiles[static_cast<size_t>(flag_op[static_cast<size_t>(f)])];
    if (info_of(op).feeds_all_rows || all) return true;
    int p0 = 0, p1 = 0;
    return !tile_rows(info_of(op), op, t, n, s.n_rows, p0, p1) || (p0 < r1 && r0 < p1);
  };
  // Ancestors of each tile (every tile it waits for, transitively), in flag order.
  std::vector<std::vector<bool>> anc(static_cast<size_t>(s.n_flags));
  for (int f = 0; f < s.n_flags; ++f) {
    auto& a = anc[static_cast<size_t>(f)];
    a.assign(static_cast<size_t>(s.n_flags), false);
    const Task& t = *task_of[static_cast<size_t>(f)];
    for (uint32_t d = t.dep_begin; d < t.dep_end; ++d) {
      const int g = s.deps[d];
      if (g >= f) bad(fmt::format("op {} tile {} waits for a later tile", t.op, t.tile));
      a[static_cast<size_t>(g)] = true;
      const auto& ag = anc[static_cast<size_t>(g)];
      for (int k = 0; k < g; ++k)
        if (ag[static_cast<size_t>(k)]) a[static_cast<size_t>(k)] = true;
    }
  }
  // Hazards between ops, each checked at tile level.
  for (size_t j = 0; j < n_ops; ++j) {
    const Op& c = p.ops[j];
    const std::vector<int> c_reads = c.reads();
    for (size_t i = 0; i < j; ++i) {
      const Op& pr = p.ops[i];
      const std::vector<int> p_reads = pr.reads();
      auto has = [](const std::vector<int>& v, int x) { return x >= 0 && std::find(v.begin(), v.end(), x) != v.end(); };
      const bool raw = has(c_reads, pr.out), waw = c.out >= 0 && c.out == pr.out, war = has(p_reads, c.out);
      if (!raw && !waw && !war) continue;
      // Reading only, of a producer some of whose tiles it declares it reads.
      const bool some_tiles = info_of(c).reads_tile && !waw && !war;
      for (int tc = 0; tc < s.op_tiles[j]; ++tc) {
        const int fc = s.op_flag[j] + tc;
        int r0 = 0, r1 = 0;
        const bool all = !tile_rows(info_of(c), c, tc, s.op_tiles[j], s.n_rows, r0, r1);
        for (int tp = 0; tp < s.op_tiles[i]; ++tp) {
          const int fp = s.op_flag[i] + tp;
          if (some_tiles && !info_of(c).reads_tile(c, pr, s.n_rows, tc, s.op_tiles[j], tp, s.op_tiles[i])) continue;
          if (touches(fp, all, r0, r1) && !anc[static_cast<size_t>(fc)][static_cast<size_t>(fp)])
            bad(fmt::format("op {} ('{}' layer {}) tile {} does not wait for op {} ('{}') tile {}", j, c.name, c.layer,
                            tc, i, pr.name, tp));
        }
      }
    }
  }
  // Chained recurrent rows: row r's tiles after row r - 1's of the same op and head.
  if (s.chained)
    for (size_t i = 0; i < n_ops; ++i) {
      if (!op_is_recurrent(p.ops[i])) continue;
      const int per_row = s.op_tiles[i] / s.n_rows;
      for (int t = per_row; t < s.op_tiles[i]; ++t)
        if (!anc[static_cast<size_t>(s.op_flag[i] + t)][static_cast<size_t>(s.op_flag[i] + t - per_row)])
          bad(fmt::format("op {} tile {} does not wait for the previous row's tile", i, t));
    }
}

void run_schedule_serial(const DecodeProgram& p, const Schedule& s, const StepContext& ctx, int stop_after_op,
                         uint64_t order_seed) {
  const int last = stop_after_op < 0 ? static_cast<int>(p.ops.size()) - 1 : stop_after_op;
  // Per tile: chunks claimed from the front and from the back, chunks done.
  struct Claims {
    int front = 0, back = 0, done = 0;
  };
  std::vector<Claims> claims(static_cast<size_t>(s.n_flags));
  for (const auto& tasks : s.worker_tasks)
    for (const Task& t : tasks) claims[static_cast<size_t>(t.flag)].back = t.chunks;
  std::vector<char> done(static_cast<size_t>(s.n_flags), 0);
  std::vector<size_t> pos(s.worker_tasks.size(), 0);
  const int W = static_cast<int>(s.worker_tasks.size());
  auto deps_done = [&](const Task& t) {
    if (t.op > last) return false;
    for (uint32_t d = t.dep_begin; d < t.dep_end; ++d)
      if (!done[static_cast<size_t>(s.deps[d])]) return false;
    return true;
  };
  auto unclaimed = [&](const Task& t) {
    const Claims& c = claims[static_cast<size_t>(t.flag)];
    return c.front < c.back;
  };
  // A worker moves past a tile once every chunk of it is claimed.
  auto skip_claimed = [&](int w) {
    const auto& tasks = s.worker_tasks[static_cast<size_t>(w)];
    size_t& i = pos[static_cast<size_t>(w)];
    while (i < tasks.size() && !unclaimed(tasks[i])) ++i;
  };
  auto ready = [&](int w) {
    skip_claimed(w);
    const auto& tasks = s.worker_tasks[static_cast<size_t>(w)];
    return pos[static_cast<size_t>(w)] < tasks.size() && deps_done(tasks[pos[static_cast<size_t>(w)]]);
  };
  auto run_chunk = [&](const Task& t, bool from_back) {
    Claims& c = claims[static_cast<size_t>(t.flag)];
    run_task_chunk(p.ops[static_cast<size_t>(t.op)], ctx, t, from_back ? --c.back : c.front++);
    if (++c.done == t.chunks) done[static_cast<size_t>(t.flag)] = 1;
  };
  auto next_of = [&](int w) -> const Task& { return s.worker_tasks[static_cast<size_t>(w)][pos[static_cast<size_t>(w)]]; };
  uint64_t rng = order_seed * 0x9E3779B97F4A7C15ull + 1;
  for (;;) {
    bool progressed = false, pending = false;
    if (order_seed == 0) {
      for (int w = 0; w < W; ++w)
        while (ready(w)) {
          const Task& t = next_of(w);
          while (unclaimed(t)) run_chunk(t, false);
          progressed = true;
        }
    } else {
      // Choices: a ready worker's next chunk (w >= 0), or the back chunk of a
      // ready shared tile near some worker's position (w = -1).
      std::vector<std::pair<int, const Task*>> choices;
      for (int w = 0; w < W; ++w) {
        if (ready(w)) choices.push_back({w, &next_of(w)});
        const auto& tasks = s.worker_tasks[static_cast<size_t>(w)];
        int seen = 0;
        for (size_t k = pos[static_cast<size_t>(w)]; k < tasks.size() && seen < kShareLookahead; ++k) {
          if (!tasks[k].shared) continue;
          ++seen;
          if (unclaimed(tasks[k]) && deps_done(tasks[k])) choices.push_back({-1, &tasks[k]});
        }
      }
      if (!choices.empty()) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        const auto& [w, t] = choices[static_cast<size_t>(rng % choices.size())];
        run_chunk(*t, w < 0);
        progressed = true;
      }
    }
    for (int w = 0; w < W; ++w) {
      skip_claimed(w);
      const auto& tasks = s.worker_tasks[static_cast<size_t>(w)];
      if (pos[static_cast<size_t>(w)] < tasks.size() && tasks[pos[static_cast<size_t>(w)]].op <= last) pending = true;
    }
    if (!pending) return;
    if (!progressed) throw std::logic_error("schedule of " + p.model_name + ": no tile can run (a dependency never completes)");
  }
}

struct SerialExecutor::Impl {
  const DecodeProgram& p;
  int n_workers;
  bool scalar;
  uint64_t seed;
  int stop = -1;
  SlotArena arena;
  StepContext ctx;
  std::vector<std::unique_ptr<Schedule>> plain, chained;
  Impl(const DecodeProgram& p_, int w, bool sc, uint64_t sd)
      : p(p_), n_workers(w), scalar(sc), seed(sd), arena(p_),
        plain(static_cast<size_t>(p_.max_rows) + 1), chained(static_cast<size_t>(p_.max_rows) + 1) {}
};

SerialExecutor::SerialExecutor(const DecodeProgram& p, int n_workers, bool scalar, uint64_t order_seed)
    : impl_(std::make_unique<Impl>(p, n_workers, scalar, order_seed)) {
  if (n_workers < 1) fail("a serial schedule needs at least one worker, got {}", n_workers);
}
SerialExecutor::~SerialExecutor() = default;

const Schedule& SerialExecutor::schedule(int n_rows, bool chained) {
  if (n_rows < 1 || n_rows > impl_->p.max_rows) fail("a step needs 1 to {} rows, got {}", impl_->p.max_rows, n_rows);
  auto& slot = (chained ? impl_->chained : impl_->plain)[static_cast<size_t>(n_rows)];
  if (!slot) {
    CompileOptions o;
    o.chained = chained;
    slot = std::make_unique<Schedule>(compile(impl_->p, n_rows, impl_->n_workers, o));
  }
  return *slot;
}

void SerialExecutor::prepare(int n_rows) { schedule(n_rows, false); }

void SerialExecutor::set_stop_after_op(int op) {
  if (op < -1 || op >= static_cast<int>(impl_->p.ops.size()))
    fail("stop after op {}: the program has ops 0 to {}", op, impl_->p.ops.size() - 1);
  impl_->stop = op;
}

void SerialExecutor::step(const std::vector<RowInput>& rows, float* logits) {
  Impl& m = *impl_;
  validate_rows(m.p, rows);
  const int n_rows = static_cast<int>(rows.size());
  const bool chained = m.p.recurrent && rows_chained(rows.data(), n_rows);
  const Schedule& s = schedule(n_rows, chained);
  m.ctx = StepContext{};
  m.ctx.program = &m.p;
  m.ctx.rows = rows.data();
  m.ctx.n_rows = n_rows;
  m.ctx.step_id = next_step_id();
  m.ctx.scalar = m.scalar;
  m.arena.bind(m.ctx, m.p, logits);
  m.ctx.taps = taps_;
  run_schedule_serial(m.p, s, m.ctx, m.stop, m.seed);
}

const float* SerialExecutor::slot_row(int s, int r) const {
  const Impl& m = *impl_;
  if (m.ctx.slot.empty()) fail("no step has run yet");
  if (s < 0 || s >= static_cast<int>(m.p.slots.size())) fail("slot {} is not one of the program's {}", s, m.p.slots.size());
  if (r < 0 || r >= m.ctx.n_rows) fail("row {} is not one of the last step's {}", r, m.ctx.n_rows);
  return row_of(m.ctx, s, r);
}

DecodeProgram truncate_layers(const DecodeProgram& p, int n_layers) {
  if (n_layers < 1 || n_layers > p.n_layer) fail("--layers {}: {} has layers 1 to {}", n_layers, p.model_name, p.n_layer);
  DecodeProgram t = p;
  t.ops.clear();
  int top_block = -1;  // the highest attention-residual block the kept layers write
  for (const Op& op : p.ops) {
    if (op.layer >= n_layers) continue;
    if (op.kind == OpKind::AttnResAdd) top_block = std::max(top_block, op.as<ops::AttnResAdd>().block);
    t.ops.push_back(op);
    if (op.layer < 0 && op.kind == OpKind::AttnResMix && top_block >= 0) {
      int& n = t.ops.back().as<ops::AttnResMix>().n_blocks;
      n = std::min(n, top_block + 1);
    }
  }
  t.n_layer = n_layers;
  t.verify();
  return t;
}

}  // namespace megakern
