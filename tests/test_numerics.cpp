// The two numerics modes at the level of whole models (core/numerics.h): in
// each mode the op-by-op and megakernel executors give the same bits, a
// row's logits do not depend on the other rows of its step, the dense
// batched prompt pass equals the program run a token at a time; the fast
// mode is a different computation from the exact one and stays close to it.
// (Greedy speculative decoding in the fast mode: test_spec.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "runtime/engine.h"
#include "runtime/model.h"

namespace megakern {
namespace {

struct Case {
  const char* model;
  const char* weights;  // nullptr: the preset's own formats
};

std::unique_ptr<Model> load(const Case& c, Numerics n) {
  ModelOptions o;
  o.numerics = n;
  if (c.weights) o.weights = dtype_from_name(c.weights);
  return load_model(c.model, o);
}

// Logits of `steps` steps of `n_seq` sequences stepped together (row r is
// sequence r at position s + 2r, its first 2r positions filled alone).
std::vector<float> run(const Model& m, const std::string& executor, int n_seq, int steps) {
  ThreadPool pool(2);
  Engine e(m, pool, 8, executor);
  const int V = m.n_vocab();
  std::vector<SequenceState> seqs;
  for (int r = 0; r < n_seq; ++r) seqs.push_back(m.new_sequence(64));
  std::vector<float> scratch(static_cast<size_t>(V));
  for (int r = 0; r < n_seq; ++r)
    for (int p = 0; p < 2 * r; ++p)
      e.step({seqs[static_cast<size_t>(r)].row((p * 11 + r) % V, p)}, scratch.data());
  std::vector<float> out(static_cast<size_t>(steps) * n_seq * V);
  for (int s = 0; s < steps; ++s) {
    std::vector<RowInput> rows;
    for (int r = 0; r < n_seq; ++r) rows.push_back(seqs[static_cast<size_t>(r)].row((s * 31 + r * 17 + 5) % V, s + 2 * r));
    e.step(rows, &out[static_cast<size_t>(s) * n_seq * V]);
  }
  return out;
}

const Case kCases[] = {
    {"dense-mini", nullptr},          // q4_0
    {"qwen3.8-mini", "q4_1"},         // a format with mins
    {"qwen3.8-mini", "q8_0"},         // recurrent layers, signed 8-bit weights
    {"qwen3.8-mini", "mxfp4"},        // table format
    {"muse-spark-mini", nullptr},     // int4_g128 experts
    {"kimi-k3-mini", nullptr},        // mxfp4 experts, MLA, KDA
};

TEST(Numerics, ExecutorsAgreeBitForBitInEachMode) {
  for (const Case& c : kCases) {
    for (Numerics n : {Numerics::Exact, Numerics::Fast}) {
      SCOPED_TRACE(std::string(c.model) + " " + (c.weights ? c.weights : "") + " " + numerics_name(n));
      const auto m = load(c, n);
      const auto a = run(*m, "opbyop", 3, 4);
      const auto b = run(*m, "mega", 3, 4);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
    }
  }
}

TEST(Numerics, RowDoesNotDependOnBatchInFastMode) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(c.model) + " " + (c.weights ? c.weights : ""));
    const auto m = load(c, Numerics::Fast);
    const int V = m->n_vocab();
    const auto batched = run(*m, "mega", 4, 3);
    const auto alone = run(*m, "mega", 1, 3);  // row 0 alone: same tokens, same positions
    for (int s = 0; s < 3; ++s)
      ASSERT_EQ(0, std::memcmp(&alone[static_cast<size_t>(s) * V], &batched[static_cast<size_t>(s) * 4 * V],
                               sizeof(float) * static_cast<size_t>(V)))
          << "step " << s;
  }
}

TEST(Numerics, FastDiffersFromExactButStaysClose) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(c.model) + " " + (c.weights ? c.weights : ""));
    const auto ex = load(c, Numerics::Exact);
    const auto fa = load(c, Numerics::Fast);
    EXPECT_EQ(ex->numerics(), Numerics::Exact);
    EXPECT_EQ(fa->numerics(), Numerics::Fast);
    EXPECT_EQ(fa->build_program(2).numerics, Numerics::Fast);
    const auto a = run(*ex, "mega", 2, 3);
    const auto b = run(*fa, "mega", 2, 3);
    EXPECT_NE(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
    // 8-bit activations move logits by a few per cent of their range on
    // these small random models; far more would mean a wrong kernel.
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num = std::max(num, (double)std::fabs(a[i] - b[i]));
      den = std::max(den, (double)std::fabs(a[i]));
    }
    EXPECT_LT(num / den, 0.1);
  }
}

TEST(Numerics, DensePromptPassEqualsTokenByTokenInEachMode) {
  for (Numerics n : {Numerics::Exact, Numerics::Fast}) {
    SCOPED_TRACE(numerics_name(n));
    const auto m = load({"dense-mini", nullptr}, n);
    ThreadPool pool(2);
    Engine e(*m, pool, 1, "mega");
    const int V = m->n_vocab();
    std::vector<int32_t> toks;
    for (int i = 0; i < 37; ++i) toks.push_back((i * 29 + 3) % V);
    SequenceState a = m->new_sequence(64), b = m->new_sequence(64);
    std::vector<float> la(static_cast<size_t>(V)), lb(static_cast<size_t>(V));
    e.prefill(a, toks.data(), static_cast<int>(toks.size()), 0, la.data());  // batched prompt pass
    for (int i = 0; i < static_cast<int>(toks.size()); ++i) e.step({b.row(toks[static_cast<size_t>(i)], i)}, lb.data());
    ASSERT_EQ(0, std::memcmp(la.data(), lb.data(), sizeof(float) * static_cast<size_t>(V)));
  }
}

}  // namespace
}  // namespace megakern
