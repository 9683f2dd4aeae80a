// The megakernel's schedule as data, and tools to run and check it.
//
// compile() cuts every op of a program into tiles (op_tile_count), gives each
// tile to one worker (each worker's tiles in program order) and lists, per
// tile, the producer tiles it must wait for: read-after-write,
// write-after-write and write-after-read on its slots, narrowed to one row
// where producer and consumer are both per-row. The megakernel executor runs
// a compiled Schedule with one thread per worker; run_schedule_serial() runs
// the same schedule on one thread, so a schedule can be stepped through,
// stopped after any op, and diff-tested against the reference executor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "exec/executor.h"
#include "exec/op_kernels.h"
#include "ir/program.h"

namespace megakern {

struct OpInfo;  // ir/op_info.h

// A tile of an op, placed on one worker.
struct Task {
  int op = 0;
  int tile = 0;
  int n_tiles = 0;
  int flag = 0;                         // this tile's global flag index
  uint32_t dep_begin = 0, dep_end = 0;  // its producers: flags Schedule::deps[dep_begin, dep_end)
  // What the tile streams (static tiles), for the prefetch plan.
  const uint8_t* weights = nullptr;
  size_t weight_bytes = 0;
  // Routed-expert tiles (MoeGlu / MoeDown): the weights depend on the step's
  // routing, known once the route op's tiles, flags [route_begin, route_end),
  // are done; `weights` is then unused.
  bool routed = false;
  int route_begin = 0, route_end = 0;
  // Shared work: a matrix-product tile is cut into `chunks` consecutive
  // ranges of its output columns (chunk c of tile t is tile t * chunks + c of
  // n_tiles * chunks, a range nested in the tile's; run_task_chunk). Its
  // worker claims chunks from the front, and a worker that would otherwise
  // wait may claim them from the back once the tile's own dependencies are
  // done; whoever finishes the last chunk signals the tile. Which worker
  // runs a chunk changes no result: a column is computed the same way in
  // any range.
  bool shared = false;
  int chunks = 1;
};

struct Schedule {
  int n_rows = 0, n_workers = 0;
  bool chained = false;                            // compiled for chained recurrent rows
  std::vector<int> op_flag;                        // [op] flag of the op's tile 0; its tiles are consecutive
  std::vector<int> op_tiles;                       // [op] tile count
  std::vector<std::vector<Task>> worker_tasks;     // [worker] in program order
  std::vector<std::vector<size_t>> weight_prefix;  // [worker][task + 1] weight bytes before each task
  std::vector<int> deps;                           // flag indices
  int n_flags = 0;
};

struct CompileOptions {
  // Rows of one sequence chain their recurrent states (RowInput::state_in):
  // each recurrent tile of row r also waits for the same op's tile of row r - 1.
  bool chained = false;
  // Routed-expert tiles join the prefetch plan once routing is done.
  bool prefetch_experts = true;
  // The tiles of shareable ops (op_tiles_shareable: matrix products, routed
  // experts, attention) are shared (Task::shared), the matrix products' cut
  // into chunks of about chunk_bytes of weights (at most max_chunks); false:
  // every tile is its worker's alone.
  bool share_matmuls = true;
  size_t chunk_bytes = size_t{256} << 10;
  int max_chunks = 64;
  // The registry entry compile() orders each op's tiles by (null: op_info).
  // Tests hand it a wrong one to see race_check (exec/race_check.h) catch
  // the schedule it gives.
  const OpInfo& (*info)(const Op& op) = nullptr;
};

// How many shared tiles of another worker's list, from the last it started,
// an idle worker looks at for a chunk to take.
constexpr int kShareLookahead = 3;

// Whether an op's tiles may be shared, run by whichever worker claims them
// (OpInfo::shareable): matrix products, and the kinds whose tiles are
// uneven and would otherwise leave the worker with the lighter ones waiting
// at the next op: routed experts' products (an expert's rows vary with the
// step's routing) and attention (a tile's cost grows with its rows'
// positions).
bool op_tiles_shareable(const Op& op);
// Whether they may also be cut into chunks (OpInfo::chunkable): matrix
// products, whose tile t of n is the output columns [matmul_tile_range), so
// tile t * c + k of n * c lies inside tile t for every k < c. (The others'
// shared tiles are one chunk each.)
bool op_tiles_chunkable(const Op& op);

// Runs chunk c of a task (the whole tile when it has one chunk).
void run_task_chunk(const Op& op, const StepContext& ctx, const Task& t, int c);

// Compiles the program for steps of n_rows rows on a team of n_workers.
Schedule compile(const DecodeProgram& p, int n_rows, int n_workers, const CompileOptions& opts = {});

// Checks the schedule's invariants against the program, independently of how
// compile() derived them, and throws std::logic_error naming the first broken
// one: every tile of every op is on exactly one worker's list, each list is in
// program order, every dependency points to an earlier op (or, chained, an
// earlier tile of the same recurrent op), every tile waits (directly or
// through other tiles) for each tile of an earlier op that touches one of its
// rows and writes a slot it reads or writes, or reads a slot it writes, and
// only tiles of shareable ops are shared and only those of chunkable ops cut
// into chunks, never into more chunks than the tile has 4-column units.
// The rows and tiles each op touches come from the same registry entries
// compile() uses (info, null: op_info), so a wrong entry misleads both alike;
// race_check (exec/race_check.h) derives them from the kernels instead.
void check_schedule(const DecodeProgram& p, const Schedule& s, const OpInfo& (*info)(const Op& op) = nullptr);

// Runs a schedule's tiles on the calling thread in an order its dependency
// lists allow. order_seed 0: each worker's list as far as its dependencies
// allow before the next worker's (so tiles run out of program order wherever
// the lists permit it), each shared tile's chunks by its own worker;
// otherwise one chunk at a time: a pseudo-random choice among the ready
// workers' next chunks and the back chunks of the ready ones among the next
// kShareLookahead shared tiles of any list (as the megakernel's idle workers
// take them).
// Stops after the tiles of op stop_after_op (-1: the whole step). Throws
// std::logic_error when no tile can run (a dependency on a tile that never
// runs first).
void run_schedule_serial(const DecodeProgram& p, const Schedule& s, const StepContext& ctx, int stop_after_op = -1,
                         uint64_t order_seed = 0);

// An executor stepping a compiled schedule on one thread (run_schedule_serial),
// with the fast kernels (bit for bit the megakernel's results for the same
// team size) or the scalar reference kernels (with one worker: the reference
// executor's order and results). For bisecting a wrong result it can stop a
// step after any op and show any slot.
class SerialExecutor final : public Executor {
 public:
  SerialExecutor(const DecodeProgram& p, int n_workers, bool scalar, uint64_t order_seed = 0);
  ~SerialExecutor() override;
  const char* name() const override { return "serial"; }
  void step(const std::vector<RowInput>& rows, float* logits) override;
  void prepare(int n_rows) override;
  // The following steps stop after op `op` (-1: run the whole step).
  void set_stop_after_op(int op);
  // Row r of slot s as the last step left it.
  const float* slot_row(int s, int r) const;
  const Schedule& schedule(int n_rows, bool chained);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The program cut after its first n_layers layers: the ops of later layers
// (and their taps) are dropped, the global ops kept (a final
// attention-residual mixture mixes only the blocks the kept layers write).
// Slot ids are unchanged. Throws megakern::Error when n_layers is out of range.
DecodeProgram truncate_layers(const DecodeProgram& p, int n_layers);

}  // namespace megakern
