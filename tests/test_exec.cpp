// The three executors over the same DecodeProgram: megakernel and op-by-op
// logits are identical bit for bit for every batch size 1..8, a row's logits
// do not depend on the other rows of its batch, both match the scalar
// reference interpreter within a stated tolerance, and the program agrees
// with the direct dense forward pass.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "exec/exec_common.h"
#include "exec/executor.h"
#include "io/gguf.h"
#include "model/dense.h"
#include "runtime/model.h"
#include "model/dense_program.h"
#include "model/presets.h"
#include "test_util.h"
#include "tiny_model.h"
#include "model_state.h"

namespace megakern {
namespace {

// A multi-sequence workload: row r is sequence r, starting at position 3*r
// (its cache pre-filled with earlier tokens by the same executor), so rows sit
// at different positions.
struct Workload {
  int n_rows;
  int steps;
  int n_vocab;
  int32_t token(int step, int row) const { return static_cast<int32_t>((step * 31 + row * 17 + 5) % n_vocab); }
};

// Runs the workload on one executor; returns logits of every step [steps][rows][vocab].
std::vector<float> run_workload(const DenseModel& m, Executor& ex, const Workload& w, KvType kv = KvType::f32) {
  std::vector<KVCache> caches;
  for (int r = 0; r < w.n_rows; ++r) caches.push_back(make_cache(m, 64, 0, kv));
  std::vector<float> out(static_cast<size_t>(w.steps) * w.n_rows * w.n_vocab);
  for (int s = 0; s < w.steps; ++s) {
    std::vector<RowInput> rows;
    for (int r = 0; r < w.n_rows; ++r) rows.push_back({w.token(s, r), s + 3 * r, &caches[static_cast<size_t>(r)]});
    ex.step(rows, &out[static_cast<size_t>(s) * w.n_rows * w.n_vocab]);
  }
  return out;
}

// Prefills each row's cache positions [0, 3r) by single-row steps first so
// that the positions in run_workload have real history behind them.
std::vector<float> run_with_history(const DenseModel& m, Executor& ex, const Workload& w, KvType kv = KvType::f32) {
  std::vector<KVCache> caches;
  for (int r = 0; r < w.n_rows; ++r) caches.push_back(make_cache(m, 64, 0, kv));
  std::vector<float> scratch(static_cast<size_t>(w.n_vocab));
  for (int r = 0; r < w.n_rows; ++r)
    for (int p = 0; p < 3 * r; ++p) ex.step({{static_cast<int32_t>((p * 7 + r) % w.n_vocab), p, &caches[static_cast<size_t>(r)]}}, scratch.data());
  std::vector<float> out(static_cast<size_t>(w.steps) * w.n_rows * w.n_vocab);
  for (int s = 0; s < w.steps; ++s) {
    std::vector<RowInput> rows;
    for (int r = 0; r < w.n_rows; ++r) rows.push_back({w.token(s, r), s + 3 * r, &caches[static_cast<size_t>(r)]});
    ex.step(rows, &out[static_cast<size_t>(s) * w.n_rows * w.n_vocab]);
  }
  return out;
}

double max_normalized_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, static_cast<double>(std::fabs(a[i] - b[i])));
    den = std::max(den, static_cast<double>(std::fabs(b[i])));
  }
  return num / std::max(den, 1e-30);
}

// Each architecture with each KV cache type (core/kv_type.h): the
// guarantees hold for every type (q8_0 with heads of 32, its block).
class ExecArchTest : public ::testing::TestWithParam<std::tuple<std::string, KvType>> {
 protected:
  KvType kv() const { return std::get<1>(GetParam()); }
  TinySpec spec() const {
    TinySpec s;
    s.arch = std::get<0>(GetParam());
    if (kv() == KvType::q8_0) s.head_dim = 32;
    return s;
  }
};

TEST_P(ExecArchTest, MegaEqualsOpByOpBitForBitAndMatchesReference) {
  TinySpec spec = this->spec();
  spec.n_layer = spec.arch == "gemma3" ? 6 : 3;
  const auto bytes = tiny_model(spec);
  auto f = GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
  auto m = DenseModel::load(*f);
  const DecodeProgram prog = build_dense_program(*m, 8);
  ThreadPool pool(2);
  auto ref = make_reference_executor(prog);
  auto obo = make_opbyop_executor(prog, pool);
  auto mega = make_mega_executor(prog, pool);
  for (int rows : {1, 2, 3, 4, 8}) {
    const Workload w{rows, 6, m->config().n_vocab};
    const auto a = run_with_history(*m, *obo, w, kv());
    const auto b = run_with_history(*m, *mega, w, kv());
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * a.size())) << "rows " << rows;
    const auto r = run_with_history(*m, *ref, w, kv());
    // Scalar and vector kernels differ only in summation order: 1e-4 of the
    // largest logit. A rounded cache can turn such a difference into a
    // stored value one unit of its type apart (f16 2^-11 relative, bf16
    // 2^-8, q8_0 1/254 of its block's largest): about 3x the largest seen.
    const double tol = kv() == KvType::f32 ? 1e-4 : kv() == KvType::f16 ? 1e-3 : kv() == KvType::bf16 ? 3e-3 : 1e-2;
    EXPECT_LT(max_normalized_diff(a, r), tol) << "rows " << rows;
  }
}

TEST_P(ExecArchTest, RowResultDoesNotDependOnBatch) {
  const TinySpec spec = this->spec();
  const auto bytes = tiny_model(spec, 3);
  auto f = GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
  auto m = DenseModel::load(*f);
  const DecodeProgram prog = build_dense_program(*m, 8);
  ThreadPool pool(2);
  for (const char* kind : {"opbyop", "mega"}) {
    auto ex = make_executor(kind, prog, pool);
    const int V = m->config().n_vocab;
    const Workload w8{8, 4, V};
    const auto batched = run_workload(*m, *ex, w8, kv());
    // Row 5 of the batch, alone: same tokens at the same positions.
    KVCache c = make_cache(*m, 64, 0, kv());
    std::vector<float> alone(static_cast<size_t>(V));
    // Row 5's history (positions before 15) is empty in run_workload's
    // caches too, so only its own steps matter.
    for (int s = 0; s < w8.steps; ++s) {
      ex->step({{w8.token(s, 5), s + 15, &c}}, alone.data());
      ASSERT_EQ(0, std::memcmp(alone.data(), &batched[(static_cast<size_t>(s) * 8 + 5) * V], sizeof(float) * V))
          << kind << " step " << s;
    }
  }
}

// The runtime's prompt path (Engine::teacher_forced_logits: a head-less
// program for the unscored positions, blocks of the full one for the rest)
// gives each position the bits of a bare executor stepping it alone.
TEST_P(ExecArchTest, EnginePromptPassMatchesSingleSteps) {
  const TinySpec spec = this->spec();
  const auto bytes = tiny_model(spec, 5);
  auto f = GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
  auto m = DenseModel::load(*f);
  const DecodeProgram prog = build_dense_program(*m, 4);
  ThreadPool pool(2);
  auto mega = make_mega_executor(prog, pool);
  ModelOptions mo;
  mo.kv_type = kv();
  auto model = load_model(GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf"), mo);
  Engine e(*model, pool, 4);
  const int V = m->config().n_vocab, n = 10;
  std::vector<int32_t> toks;
  for (int p = 0; p < n; ++p) toks.push_back((p * 13 + 1) % V);
  SequenceState seq = model->new_sequence(32);
  const std::vector<float> tail = forced_logits(e, seq, toks, 0, 7);
  ASSERT_EQ(seq.cache.type, kv());
  KVCache c2 = make_cache(*m, 32, 0, kv());
  std::vector<float> b(static_cast<size_t>(V));
  for (int p = 0; p < n; ++p) {
    mega->step({{toks[p], p, &c2}}, b.data());
    if (p >= n - 7)
      ASSERT_EQ(0, std::memcmp(&tail[static_cast<size_t>(p - (n - 7)) * V], b.data(), sizeof(float) * V))
          << "position " << p;
  }
}

// How ops are cut into tiles depends on the team size (attention cuts a
// query group into parts when KV heads alone would load the team unevenly),
// but no result does: one, two, three and five workers give the same bits,
// for grouped (n_head_kv < n_head) and single-KV-head attention.
TEST_P(ExecArchTest, ResultDoesNotDependOnTeamSize) {
  for (int n_head_kv : {1, 2}) {
    TinySpec spec = this->spec();
    spec.n_head = 6;
    spec.n_head_kv = n_head_kv;
    const auto bytes = tiny_model(spec, 5);
    auto f = GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
    auto m = DenseModel::load(*f);
    const DecodeProgram prog = build_dense_program(*m, 8);
    std::vector<float> first;
    for (int workers : {1, 2, 3, 5}) {
      ThreadPool pool(workers, /*oversubscribe=*/true);  // team sizes beyond the cores on purpose
      for (const char* kind : {"opbyop", "mega"}) {
        auto ex = make_executor(kind, prog, pool);
        for (int rows : {1, 3}) {
          const auto out = run_with_history(*m, *ex, Workload{rows, 3, m->config().n_vocab}, kv());
          if (rows == 3 && first.empty()) first = out;
          if (rows == 3)
            EXPECT_EQ(0, std::memcmp(first.data(), out.data(), sizeof(float) * out.size()))
                << kind << ", " << workers << " workers, " << n_head_kv << " KV heads";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ExecArchTest,
                         ::testing::Combine(::testing::Values("llama", "qwen3", "gemma3"),
                                            ::testing::ValuesIn(kAllKvTypes)),
                         [](const auto& info) {
                           // f32 keeps the architecture's own name.
                           const KvType t = std::get<1>(info.param);
                           return std::get<0>(info.param) + (t == KvType::f32 ? "" : std::string("_") + kv_type_name(t));
                         });

// The executors' guarantees hold for the Q3_K / Q5_K / IQ4_NL / IQ4_XS
// kernels too: on a two-layer dense-mini in each format, the megakernel
// equals op-by-op bit for bit, a row's logits do not depend on the batch
// (row 0 of a batch of 3 equals the same sequence run alone), and the scalar
// reference executor (f32 activations) agrees to within 3e-4 of the largest
// logit: the int16 activations round each input to 1/65534 of its
// 32-block's largest magnitude, and dense-mini's rows of 256 and 512 through
// two layers give differences of 0.7-1.1e-4 here (the tiny models above, with
// rows of 64 and 96, stay under 1e-4).
TEST(Exec, NewFormatsMegaEqualsOpByOpAndRowsIgnoreTheBatch) {
  DensePreset p = *find_dense_preset("dense-mini");
  p.n_layer = 2;
  ThreadPool pool(2);
  for (DType t : {DType::Q3_K, DType::Q5_K, DType::IQ4_NL, DType::IQ4_XS}) {
    SCOPED_TRACE(dtype_traits(t).name);
    p.wtype = t;
    const auto bytes = make_dense_gguf(p, 3);
    auto f = GGUFFile::parse(bytes.data(), bytes.size(), "mini.gguf");
    auto m = DenseModel::load(*f);
    const DecodeProgram prog = build_dense_program(*m, 4);
    auto ref = make_reference_executor(prog);
    auto obo = make_opbyop_executor(prog, pool);
    auto mega = make_mega_executor(prog, pool);
    const int V = m->config().n_vocab;
    const Workload w3{3, 3, V}, w1{1, 3, V};
    const auto a = run_workload(*m, *obo, w3);
    const auto b = run_workload(*m, *mega, w3);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * a.size()));
    const double diff = max_normalized_diff(a, run_workload(*m, *ref, w3));
    std::printf("[exec] dense-mini %s: op-by-op vs reference %.2e of the largest logit\n", dtype_traits(t).name, diff);
    EXPECT_LT(diff, 3e-4);
    // Row 0 of w3 is the sequence of w1 (same tokens, positions, history).
    const auto alone = run_workload(*m, *mega, w1);
    for (int s = 0; s < w1.steps; ++s)
      ASSERT_EQ(0, std::memcmp(&alone[static_cast<size_t>(s) * V], &b[static_cast<size_t>(s) * 3 * V], sizeof(float) * V))
          << "step " << s;
  }
}

// Rows of one sequence at consecutive positions in one step (a prefill chunk)
// give the same logits as one row per step: attention is causal in the block.
TEST(Exec, RowsOfOneSequenceAreCausal) {
  TinySpec spec;
  const auto bytes = tiny_model(spec, 9);
  auto f = GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
  auto m = DenseModel::load(*f);
  const DecodeProgram prog = build_dense_program(*m, 8);
  ThreadPool pool(2);
  auto mega = make_mega_executor(prog, pool);
  const int V = m->config().n_vocab;
  KVCache c1 = make_cache(*m, 16), c2 = make_cache(*m, 16);
  std::vector<RowInput> block;
  for (int p = 0; p < 6; ++p) block.push_back({(p * 11 + 2) % V, p, &c1});
  std::vector<float> chunk(static_cast<size_t>(6) * V), one(static_cast<size_t>(V));
  mega->step(block, chunk.data());
  for (int p = 0; p < 6; ++p) {
    mega->step({{block[static_cast<size_t>(p)].token, p, &c2}}, one.data());
    ASSERT_EQ(0, std::memcmp(one.data(), &chunk[static_cast<size_t>(p) * V], sizeof(float) * V)) << p;
  }
}

TEST(Exec, BadRowsAreRejected) {
  TinySpec spec;
  const auto bytes = tiny_model(spec);
  auto f = GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
  auto m = DenseModel::load(*f);
  const DecodeProgram prog = build_dense_program(*m, 2);
  ThreadPool pool(2);
  auto mega = make_mega_executor(prog, pool);
  KVCache c = make_cache(*m, 4);
  std::vector<float> out(static_cast<size_t>(3) * m->config().n_vocab);
  EXPECT_THROW(mega->step({}, out.data()), Error);
  EXPECT_THROW(mega->step({{1, 0, &c}, {1, 1, &c}, {1, 2, &c}}, out.data()), Error);  // 3 > max_rows
  EXPECT_THROW(mega->step({{-1, 0, &c}}, out.data()), Error);
  EXPECT_THROW(mega->step({{1, 4, &c}}, out.data()), Error);
  EXPECT_THROW(make_executor("warp", prog, pool), Error);
  // Two rows writing the same KV entry, or a block with a gap.
  KVCache c8 = make_cache(*m, 8);
  EXPECT_THROW(mega->step({{1, 2, &c8}, {1, 2, &c8}}, out.data()), Error);
  EXPECT_THROW(mega->step({{1, 2, &c8}, {1, 4, &c8}}, out.data()), Error);
  EXPECT_NO_THROW(mega->step({{1, 2, &c8}, {1, 3, &c8}}, out.data()));
  // A cache made for a model with fewer layers.
  TinySpec small = spec;
  small.n_layer = 1;
  const auto small_bytes = tiny_model(small);
  auto sf = GGUFFile::parse(small_bytes.data(), small_bytes.size(), "small.gguf");
  auto sm = DenseModel::load(*sf);
  KVCache short_cache = make_cache(*sm, 8);
  EXPECT_THROW(mega->step({{1, 0, &short_cache}}, out.data()), Error);
  KVCache empty;
  empty.n_ctx = 8;
  empty.kv_dim = prog.kv_dim;
  empty.n_layer = prog.n_layer;
  EXPECT_THROW(mega->step({{1, 0, &empty}}, out.data()), Error);
}

TEST(Exec, ProgramVerifiesAndDumps) {
  TinySpec spec;
  spec.arch = "gemma3";
  spec.n_layer = 6;
  const auto bytes = tiny_model(spec);
  auto f = GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
  auto m = DenseModel::load(*f);
  const DecodeProgram prog = build_dense_program(*m, 8);
  EXPECT_NO_THROW(prog.verify());
  const std::string d = prog.dump();
  EXPECT_NE(d.find("layer 5"), std::string::npos);
  EXPECT_NE(d.find("window 4"), std::string::npos);
  EXPECT_NE(d.find("ffn_down"), std::string::npos);
  // Weights read per step: every matrix once, the tied embedding as the head.
  EXPECT_GE(prog.weight_bytes(), m->weight_bytes());
  DecodeProgram broken = prog;
  broken.ops[3].in = 99999;
  EXPECT_THROW(broken.verify(), std::logic_error);
  // Attention must read the cache marker of its own layer's store.
  DecodeProgram miswired = prog;
  for (auto& op : miswired.ops)
    if (op.kind == OpKind::Attention && op.layer == 2) op.in2 = 0;
  EXPECT_THROW(miswired.verify(), std::logic_error);
}

// The executors' slot arena holds every slot but the logits, which bind()
// points at the caller's buffer: rows x vocabulary floats are never
// allocated (at 128 rows and a 262144-token vocabulary that would be 134 MB).
TEST(Exec, SlotArenaLeavesTheLogitsToTheCaller) {
  TinySpec spec;
  spec.arch = "gemma3";
  const auto bytes = tiny_model(spec);
  auto f = GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
  auto m = DenseModel::load(*f);
  const DecodeProgram prog = build_dense_program(*m, 64);
  ASSERT_GE(prog.logits_slot, 0);
  size_t want = 16;
  for (size_t s = 0; s < prog.slots.size(); ++s)
    if (static_cast<int>(s) != prog.logits_slot) want += (static_cast<size_t>(prog.slots[s].width) * 64 + 15) / 16 * 16;
  SlotArena arena(prog);
  EXPECT_EQ(arena.storage.size(), want);
  std::vector<float> logits(64 * static_cast<size_t>(prog.n_vocab));
  StepContext ctx;
  arena.bind(ctx, prog, logits.data());
  EXPECT_EQ(ctx.slot[static_cast<size_t>(prog.logits_slot)], logits.data());
  for (size_t s = 0; s < prog.slots.size(); ++s) {
    if (static_cast<int>(s) == prog.logits_slot) continue;
    EXPECT_GE(ctx.slot[s], arena.storage.data());
    EXPECT_LE(ctx.slot[s] + static_cast<size_t>(prog.slots[s].width) * 64, arena.storage.data() + arena.storage.size());
  }
}

TEST(Exec, RealSmolLM2MegaEqualsOpByOp) {
  const std::string path = test_model_path("smollm2-135m");
  if (path.empty()) GTEST_SKIP() << "models/smollm2-135m.gguf not fetched";
  auto f = GGUFFile::open(path);
  auto m = DenseModel::load(*f);
  const DecodeProgram prog = build_dense_program(*m, 8);
  ThreadPool pool(2);
  auto obo = make_opbyop_executor(prog, pool);
  auto mega = make_mega_executor(prog, pool);
  for (int rows : {1, 4}) {
    const Workload w{rows, 3, m->config().n_vocab};
    const auto a = run_workload(*m, *obo, w);
    const auto b = run_workload(*m, *mega, w);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * a.size())) << "rows " << rows;
  }
}

}  // namespace
}  // namespace megakern
