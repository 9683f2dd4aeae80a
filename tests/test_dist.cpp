// The collectives of a tensor-parallel group (ir/collective.h) on an
// in-process group of threads, and the partition's refusals
// (dist/tensor_parallel.h). Over MPI: the tp.* ctests (CMakeLists.txt).
#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "dist/local_comm.h"
#include "dist/tensor_parallel.h"
#include "ops/registry.h"
#include "runtime/model.h"

namespace megakern {
namespace {

// Runs one tile of op on rank p's context, a thread per rank.
template <class Fill, class Check>
void on_ranks(int n, int in_w, int out_w, OpKind kind, int rows, Fill fill, Check check) {
  LocalGroup g(n);
  std::vector<std::thread> ts;
  for (int p = 0; p < n; ++p)
    ts.emplace_back([&, p] {
      DecodeProgram prog;
      const int in = prog.add_slot("in", -1, kind == OpKind::AllGather ? share_width(out_w, n, p) : in_w);
      const int out = prog.add_slot("out", -1, out_w);
      Op& op = prog.add_op(kind, 0, "c");
      op.in = in;
      op.out = out;
      if (kind == OpKind::AllReduce) op.as<ops::AllReduce>().comm = &g.rank(p);
      else op.as<ops::AllGather>().comm = &g.rank(p);
      std::vector<float> a(static_cast<size_t>(rows * prog.slots[0].width)), b(static_cast<size_t>(rows * out_w));
      fill(p, a);
      StepContext ctx;
      ctx.program = &prog;
      ctx.slot = {a.data(), b.data()};
      ctx.n_rows = rows;
      op_info(op).fast(op, ctx, 0, 1);
      check(p, b);
    });
  for (auto& t : ts) t.join();
}

TEST(Dist, AllReduceSumsInRankOrder) {
  // Values whose sum depends on the order: ((1e8 + 1) + -1e8) is 0 in f32,
  // ((1e8 + -1e8) + 1) is 1.
  const float parts[3] = {1e8f, 1.f, -1e8f};
  on_ranks(3, 5, 5, OpKind::AllReduce, 2,
           [&](int p, std::vector<float>& a) {
             for (size_t i = 0; i < a.size(); ++i) a[i] = parts[p];
           },
           [&](int, const std::vector<float>& b) {
             const float want = (parts[0] + parts[1]) + parts[2];
             for (float v : b) EXPECT_EQ(v, want);
           });
}

TEST(Dist, AllGatherUnevenShares) {
  // 7 columns over 3 ranks: shares of 2, 2, 3; two rows.
  on_ranks(3, 0, 7, OpKind::AllGather, 2,
           [&](int p, std::vector<float>& a) {
             const int w = share_width(7, 3, p);
             for (int r = 0; r < 2; ++r)
               for (int j = 0; j < w; ++j) a[static_cast<size_t>(r * w + j)] = 100.f * r + share_begin(7, 3, p) + j;
           },
           [&](int, const std::vector<float>& b) {
             for (int r = 0; r < 2; ++r)
               for (int j = 0; j < 7; ++j) EXPECT_EQ(b[static_cast<size_t>(r * 7 + j)], 100.f * r + j);
           });
}

TEST(Dist, PartitionRefusals) {
  LocalGroup g(4);
  TpWeights w;
  // dense-mini: 4 query heads, 2 key/value heads: 4 ranks do not split it.
  std::unique_ptr<Model> m = load_model("dense-mini");
  const DecodeProgram p = m->build_program(1);
  try {
    partition_tensor_parallel(p, g.rank(0), w);
    FAIL() << "4 ranks accepted for 2 key/value heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 query heads and 2 key/value heads"), std::string::npos) << e.what();
  }
  // A recurrent model is refused by name.
  std::unique_ptr<Model> q = load_model("qwen3.8-mini");
  EXPECT_THROW(partition_tensor_parallel(q->build_program(1), g.rank(0), w), Error);
  // Two ranks: every rank's program verifies, with its share of the cache.
  LocalGroup g2(2);
  const DecodeProgram part = partition_tensor_parallel(p, g2.rank(1), w);
  EXPECT_EQ(part.kv_dim * 2, p.kv_dim);
  EXPECT_GT(w.bytes(), 0u);
  EXPECT_LT(part.weight_bytes(), p.weight_bytes());
}

}  // namespace
}  // namespace megakern
