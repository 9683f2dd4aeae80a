// The megakernel schedule as data (exec/schedule.h): its invariants on every
// architecture's program, the serial interpreter against the megakernel and
// the reference executor, stopping after an op, and programs cut to N layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "exec/executor.h"
#include "exec/exec_common.h"
#include "exec/recurrent_kernels.h"
#include "exec/schedule.h"
#include "ir/expert_bank.h"
#include "ops/matmul.h"
#include "runtime/model.h"
#include "test_util.h"

namespace megakern {
namespace {

const char* const kArchs[] = {"dense-mini", "qwen3.8-mini", "kimi-k3-mini", "muse-spark-mini"};

// Steps of `n_seq` sequences, `block` rows each, over `steps` steps; returns
// every step's logits.
std::vector<float> run(const Model& m, const DecodeProgram& p, Executor& ex, int n_seq, int block, int steps) {
  std::vector<SequenceState> seqs;
  for (int s = 0; s < n_seq; ++s) seqs.push_back(m.new_sequence(64));
  const size_t V = static_cast<size_t>(p.n_vocab), R = static_cast<size_t>(n_seq * block);
  std::vector<float> out(static_cast<size_t>(steps) * R * V);
  for (int t = 0; t < steps; ++t) {
    std::vector<RowInput> rows;
    for (int s = 0; s < n_seq; ++s)
      for (int b = 0; b < block; ++b)
        rows.push_back(seqs[static_cast<size_t>(s)].row((t * 37 + s * 11 + b * 5 + 3) % p.n_vocab, t * block + b));
    ex.step(rows, &out[static_cast<size_t>(t) * R * V]);
  }
  return out;
}

// A schedule compiled with the given options, stepped by run_schedule_serial.
class OptionsSerial final : public Executor {
 public:
  OptionsSerial(const DecodeProgram& p, int workers, CompileOptions o, uint64_t seed)
      : p_(p), w_(workers), o_(o), seed_(seed), arena_(p) {}
  const char* name() const override { return "options-serial"; }
  void step(const std::vector<RowInput>& rows, float* logits) override {
    validate_rows(p_, rows);
    CompileOptions o = o_;
    o.chained = p_.recurrent && rows_chained(rows.data(), static_cast<int>(rows.size()));
    const Schedule s = compile(p_, static_cast<int>(rows.size()), w_, o);
    check_schedule(p_, s);
    for (const auto& list : s.worker_tasks)
      for (const Task& t : list) max_chunks = std::max(max_chunks, t.chunks);
    StepContext ctx;
    ctx.program = &p_;
    ctx.rows = rows.data();
    ctx.n_rows = static_cast<int>(rows.size());
    arena_.bind(ctx, p_, logits);
    run_schedule_serial(p_, s, ctx, -1, seed_);
  }
  int max_chunks = 0;  // the most chunks a tile of the steps had

 private:
  const DecodeProgram& p_;
  int w_;
  CompileOptions o_;
  uint64_t seed_;
  SlotArena arena_;
};

TEST(Schedule, InvariantsHoldOnEveryArchitecture) {
  for (const char* name : kArchs) {
    SCOPED_TRACE(name);
    auto m = load_model(name);
    // Past 8 rows attention tiles by blocks of rows (ops/attention.h); 40
    // rows end in a partial block.
    const DecodeProgram p = m->build_program(40);
    for (int workers : {1, 2, 3})
      for (int rows : {1, 3, 4, 9, 40})
        for (bool chained : {false, true}) {
          if (chained && !p.recurrent) continue;
          CompileOptions o;
          o.chained = chained;
          const Schedule s = compile(p, rows, workers, o);
          EXPECT_NO_THROW(check_schedule(p, s)) << workers << " workers, " << rows << " rows";
          // Every matrix product cut as finely as its tiles allow.
          if (workers == 1) continue;
          o.chunk_bytes = 1;
          o.max_chunks = 1 << 12;
          const Schedule fine = compile(p, rows, workers, o);
          EXPECT_NO_THROW(check_schedule(p, fine)) << workers << " workers, " << rows << " rows, fine chunks";
        }
  }
}

// Shared tiles are the matrix products' and attention's; the products' are
// cut by weight bytes into chunks whose column ranges nest in their tile's
// and cover it, in order.
TEST(Schedule, SharedTilesAreMatrixProductsInNestedChunksAndAttention) {
  auto m = load_model("dense-mini");
  const DecodeProgram p = m->build_program(8);
  for (bool share : {true, false}) {
    CompileOptions o;
    o.share_matmuls = share;
    o.chunk_bytes = 2048;
    o.max_chunks = 5;
    const Schedule s = compile(p, 8, 2, o);
    ASSERT_NO_THROW(check_schedule(p, s));
    int cut = 0;
    for (const auto& list : s.worker_tasks)
      for (const Task& t : list) {
        const Op& op = p.ops[static_cast<size_t>(t.op)];
        // Matrix products and attention (uneven tiles) are shared; only the
        // products are cut into chunks.
        const bool shareable = op.kind == OpKind::MatMul || op.kind == OpKind::Attention;
        EXPECT_EQ(t.shared, share && shareable) << op.name;
        if (!t.shared || op.kind != OpKind::MatMul) {
          EXPECT_EQ(t.chunks, 1) << op.name;
          continue;
        }
        int64_t b = 0, e = 0;
        matmul_tile_range(op, t.tile, t.n_tiles, b, e);
        const size_t want = std::min<size_t>({t.weight_bytes / 2048, 5, static_cast<size_t>((e - b + 3) / 4)});
        EXPECT_EQ(t.chunks, static_cast<int>(std::max<size_t>(1, want))) << op.name << " tile " << t.tile;
        cut += t.chunks > 1;
        int64_t at = b;
        for (int c = 0; c < t.chunks; ++c) {
          int64_t cb = 0, ce = 0;
          matmul_tile_range(op, t.tile * t.chunks + c, t.n_tiles * t.chunks, cb, ce);
          EXPECT_EQ(cb, at) << op.name << " tile " << t.tile << " chunk " << c;
          EXPECT_LE(cb, ce);
          at = ce;
        }
        EXPECT_EQ(at, e) << op.name << " tile " << t.tile;
      }
    EXPECT_EQ(cut > 0, share);
  }
}

// A routed expert's down projection waits for the up projection of its own
// expert slot (every output range of it) and for no other slot's: the
// megakernel's workers then run a slot's two products without waiting for
// each other's experts.
TEST(Schedule, ExpertDownWaitsForItsOwnSlotOnly) {
  for (const char* name : {"kimi-k3-mini", "muse-spark-mini"}) {
    SCOPED_TRACE(name);
    auto m = load_model(name);
    const DecodeProgram p = m->build_program(8);
    for (int n_rows : {1, 2, 5, 8}) {
      const Schedule s = compile(p, n_rows, 2, {});
      ASSERT_NO_THROW(check_schedule(p, s));
      int checked = 0;
      for (size_t j = 0; j < p.ops.size(); ++j) {
        const Op& down = p.ops[j];
        if (down.kind != OpKind::MoeDown) continue;
        size_t i = j;
        while (i > 0 && !(p.ops[i - 1].kind == OpKind::MoeGlu && p.ops[i - 1].out == down.in)) --i;
        ASSERT_GT(i, 0u) << "no up projection before op " << j;
        const size_t g = i - 1;
        const auto& x = down.as<ops::MoeDown>();
        const int slots = std::min(x.bank->n_expert, n_rows * x.top_k);
        const int nd = s.op_tiles[j], ng = s.op_tiles[g];
        ASSERT_EQ(nd % slots, 0);
        ASSERT_EQ(ng % slots, 0);
        for (const auto& list : s.worker_tasks)
          for (const Task& t : list) {
            if (t.op != static_cast<int>(j)) continue;
            std::vector<int> glu;
            for (uint32_t d = t.dep_begin; d < t.dep_end; ++d)
              if (s.deps[d] >= s.op_flag[g] && s.deps[d] < s.op_flag[g] + ng) glu.push_back(s.deps[d] - s.op_flag[g]);
            std::sort(glu.begin(), glu.end());
            const int slot = t.tile / (nd / slots), per = ng / slots;
            std::vector<int> want;
            for (int c = 0; c < per; ++c) want.push_back(slot * per + c);
            EXPECT_EQ(glu, want) << "op " << j << " tile " << t.tile << " of " << nd << ", " << n_rows << " rows";
            ++checked;
          }
      }
      EXPECT_GT(checked, 0);
    }
  }
}

// check_schedule catches what a wrong compiler could produce.
TEST(Schedule, CheckCatchesBrokenSchedules) {
  auto m = load_model("qwen3.8-mini");
  const DecodeProgram p = m->build_program(4);
  const Schedule good = compile(p, 3, 2);
  ASSERT_NO_THROW(check_schedule(p, good));
  // The dependencies of the first matrix product dropped: nothing orders it
  // after the norm it reads.
  {
    Schedule s = good;
    bool dropped = false;
    for (auto& list : s.worker_tasks)
      for (auto& t : list)
        if (!dropped && p.ops[static_cast<size_t>(t.op)].kind == OpKind::MatMul) {
          ASSERT_GT(t.dep_end, t.dep_begin);
          t.dep_end = t.dep_begin;
          dropped = true;
        }
    ASSERT_TRUE(dropped);
    EXPECT_THROW(check_schedule(p, s), std::logic_error);
  }
  // A tile on two lists, and a tile missing.
  {
    Schedule s = good;
    s.worker_tasks[1].insert(s.worker_tasks[1].begin(), s.worker_tasks[0].front());
    EXPECT_THROW(check_schedule(p, s), std::logic_error);
    Schedule t = good;
    t.worker_tasks[0].pop_back();
    EXPECT_THROW(check_schedule(p, t), std::logic_error);
  }
  // A tile that is not a matrix product's shared, or cut into chunks; a
  // matrix product's tile cut into more chunks than it has 4-column units.
  {
    auto not_matmul = [&](Schedule& s) -> Task& {
      for (auto& list : s.worker_tasks)
        for (auto& t : list)
          if (p.ops[static_cast<size_t>(t.op)].kind == OpKind::RmsNorm) return t;
      throw std::logic_error("no norm");
    };
    auto matmul = [&](Schedule& s) -> Task& {
      for (auto& list : s.worker_tasks)
        for (auto& t : list)
          if (p.ops[static_cast<size_t>(t.op)].kind == OpKind::MatMul) return t;
      throw std::logic_error("no matrix product");
    };
    Schedule s = good;
    not_matmul(s).shared = true;
    EXPECT_THROW(check_schedule(p, s), std::logic_error);
    Schedule t = good;
    not_matmul(t).chunks = 2;
    EXPECT_THROW(check_schedule(p, t), std::logic_error);
    Schedule u = good;
    Task& mm = matmul(u);
    int64_t b = 0, e = 0;
    matmul_tile_range(p.ops[static_cast<size_t>(mm.op)], mm.tile, mm.n_tiles, b, e);
    mm.chunks = static_cast<int>((e - b + 3) / 4);
    EXPECT_NO_THROW(check_schedule(p, u));
    ++mm.chunks;
    EXPECT_THROW(check_schedule(p, u), std::logic_error);
    mm.chunks = 0;
    EXPECT_THROW(check_schedule(p, u), std::logic_error);
  }
  // A list out of program order.
  {
    Schedule s = good;
    std::swap(s.worker_tasks[0][0], s.worker_tasks[0][1]);
    EXPECT_THROW(check_schedule(p, s), std::logic_error);
  }
  // The serial interpreter refuses a schedule whose dependency never completes.
  {
    Schedule s = good;
    auto& t = s.worker_tasks[0][2];
    s.deps.push_back(s.n_flags - 1);  // waits for the last tile of the step
    t.dep_begin = static_cast<uint32_t>(s.deps.size() - 1);
    t.dep_end = static_cast<uint32_t>(s.deps.size());
    auto seq = m->new_sequence(8);
    std::vector<RowInput> rows = {seq.row(1, 0), seq.row(2, 1), seq.row(3, 2)};
    std::vector<float> logits(static_cast<size_t>(3 * p.n_vocab));
    StepContext ctx;
    ctx.program = &p;
    ctx.rows = rows.data();
    ctx.n_rows = 3;
    SlotArena arena(p);
    arena.bind(ctx, p, logits.data());
    EXPECT_THROW(run_schedule_serial(p, s, ctx), std::logic_error);
  }
}

// The serial interpreter, in its worker-by-worker order and in random orders
// its dependency lists allow, gives the megakernel's bits for the same team
// size (a missing dependency would let some order read a value too early);
// with the scalar kernels and one worker it gives the reference executor's.
TEST(Schedule, SerialInterpreterMatchesMegakernelAndReference) {
  ThreadPool pool(2);
  for (const char* name : kArchs) {
    SCOPED_TRACE(name);
    auto m = load_model(name);
    const DecodeProgram p = m->build_program(4);
    auto mega = make_mega_executor(p, pool);
    auto ref = make_reference_executor(p);
    for (int block : {1, 2}) {
      const int n_seq = block == 1 ? 3 : 2;
      const auto want = run(*m, p, *mega, n_seq, block, 3);
      for (uint64_t seed : {0, 1, 2, 3, 4, 5}) {
        SerialExecutor serial(p, 2, false, seed);
        const auto got = run(*m, p, serial, n_seq, block, 3);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), sizeof(float) * want.size())) << "block " << block << " order " << seed;
      }
      // Matrix products cut as finely as they allow, their chunks taken by
      // whichever worker the order picks: the same bits.
      for (uint64_t seed : {0, 1, 2, 3}) {
        CompileOptions o;
        o.chunk_bytes = 1;
        o.max_chunks = 1 << 12;
        OptionsSerial fine(p, 2, o, seed);
        const auto got = run(*m, p, fine, n_seq, block, 3);
        EXPECT_GT(fine.max_chunks, 1);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), sizeof(float) * want.size())) << "block " << block << " chunked order " << seed;
      }
      const auto want_ref = run(*m, p, *ref, n_seq, block, 3);
      SerialExecutor scalar(p, 1, true);
      const auto got_ref = run(*m, p, scalar, n_seq, block, 3);
      ASSERT_EQ(0, std::memcmp(want_ref.data(), got_ref.data(), sizeof(float) * want_ref.size())) << "block " << block;
    }
  }
}

TEST(Schedule, StopAfterOpLeavesLaterOpsUnrun) {
  auto m = load_model("dense-mini");
  const DecodeProgram p = m->build_program(2);
  SerialExecutor ex(p, 2, false);
  auto seq = m->new_sequence(8);
  const std::vector<RowInput> rows = {seq.row(5, 0), seq.row(9, 1)};
  std::vector<float> full(static_cast<size_t>(2 * p.n_vocab)), part(full.size(), NAN);
  ex.step(rows, full.data());
  // Stopped after the embedding: its slot holds the tokens' rows, the logits were not written.
  ASSERT_EQ(p.ops[0].kind, OpKind::Embed);
  ex.set_stop_after_op(0);
  auto seq2 = m->new_sequence(8);
  ex.step({seq2.row(5, 0), seq2.row(9, 1)}, part.data());
  const int w = p.slots[static_cast<size_t>(p.ops[0].out)].width;
  std::vector<float> e(static_cast<size_t>(w));
  dtype_traits(p.ops[0].mat.type).dequantize(p.ops[0].mat.row(9), e.data(), w);
  for (int i = 0; i < w; ++i) ASSERT_EQ(e[static_cast<size_t>(i)] * p.ops[0].as<ops::Embed>().scale, ex.slot_row(p.ops[0].out, 1)[i]) << i;
  for (float x : part) ASSERT_TRUE(std::isnan(x));
  // Stopped after the last op: the whole step.
  ex.set_stop_after_op(static_cast<int>(p.ops.size()) - 1);
  auto seq3 = m->new_sequence(8);
  ex.step({seq3.row(5, 0), seq3.row(9, 1)}, part.data());
  EXPECT_EQ(0, std::memcmp(full.data(), part.data(), sizeof(float) * full.size()));
  EXPECT_THROW(ex.set_stop_after_op(static_cast<int>(p.ops.size())), Error);
}

TEST(Schedule, TruncatedProgramsRun) {
  ThreadPool pool(2);
  for (const char* name : kArchs) {
    SCOPED_TRACE(name);
    auto m = load_model(name);
    const DecodeProgram p = m->build_program(2);
    EXPECT_THROW(truncate_layers(p, 0), Error);
    EXPECT_THROW(truncate_layers(p, p.n_layer + 1), Error);
    const DecodeProgram same = truncate_layers(p, p.n_layer);
    EXPECT_EQ(same.ops.size(), p.ops.size());
    const DecodeProgram one = truncate_layers(p, 1);
    EXPECT_LT(one.ops.size(), p.ops.size());
    for (const Op& op : one.ops) EXPECT_LT(op.layer, 1) << op.name;
    auto mega = make_mega_executor(one, pool);
    const auto a = run(*m, one, *mega, 2, 1, 2);
    for (float x : a) ASSERT_FALSE(std::isnan(x));  // a mask may remove tokens (-inf)
    // The cut program is the full one's first layer: the stream after it is
    // what the full program computes there.
    SerialExecutor s1(one, 1, false), sf(p, 1, false);
    auto q1 = m->new_sequence(8), qf = m->new_sequence(8);
    std::vector<float> l1(static_cast<size_t>(p.n_vocab)), lf(l1.size());
    int last_l0 = -1;
    for (size_t i = 0; i < one.ops.size(); ++i)
      if (one.ops[i].layer == 0) last_l0 = static_cast<int>(i);
    s1.set_stop_after_op(last_l0);
    sf.set_stop_after_op(last_l0);
    s1.step({q1.row(3, 0)}, l1.data());
    sf.step({qf.row(3, 0)}, lf.data());
    const int slot = one.ops[static_cast<size_t>(last_l0)].out;
    const int w = one.slots[static_cast<size_t>(slot)].width;
    EXPECT_EQ(0, std::memcmp(s1.slot_row(slot, 0), sf.slot_row(slot, 0), sizeof(float) * static_cast<size_t>(w)));
  }
}

// `megakern step`: stop after an op, cut layers, compare with the reference.
TEST(Schedule, StepCommand) {
  CliResult r = run_cli("step -m dense-mini -p 'hello there' --rows 2 --stop-after-op 0 --compare");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("stopped after op 0: embed 'token_embd' layer -1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("row 1: hash"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max |diff| 0 "), std::string::npos) << r.out;  // the embedding is exact
  r = run_cli("step -m qwen3.8-mini --layers 1 --rows 3 --compare");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(", 1 layers,"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("slot 'logits'"), std::string::npos) << r.out;
  // A scan for the first op over a tolerance: the products' int16 activations
  // are ~1e-5 off the scalar reference, nothing is 1e-3 off.
  r = run_cli("step -m dense-mini -p abcd --rows 2 --bisect 1e-6");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("first op over 1e-06 of the reference: op 2 (matmul 'attn_q' layer 0)"), std::string::npos) << r.out;
  r = run_cli("step -m dense-mini -p abcd --rows 2 --bisect 1e-3");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("every op's output is within 0.001 of the reference"), std::string::npos) << r.out;
  r = run_cli("step -m dense-mini --stop-after-op 100000");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("the program has ops 0 to"), std::string::npos) << r.err;
  r = run_cli("step -m dense-mini --stop-after-op 3 --executor mega");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("need --executor serial or reference"), std::string::npos) << r.err;
  r = run_cli("step -m dense-mini --layers 99");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--layers 99"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace megakern
