// Dense models on tiny synthetic GGUF models of each architecture, through
// the runtime's one prompt path (Engine::teacher_forced_logits): a prompt
// pass equals step-by-step decode, results do not depend on the thread
// count, and malformed models are rejected with clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/gguf.h"
#include "model/dense.h"
#include "model/presets.h"
#include "runtime/model.h"
#include "test_util.h"
#include "tiny_model.h"
#include "model_state.h"

namespace megakern {
namespace {

class DenseArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DenseArchTest, PrefillEqualsStepByStepDecodeBitForBit) {
  TinySpec s;
  s.arch = GetParam();
  s.n_layer = s.arch == "gemma3" ? 6 : 3;  // gemma3: five windowed layers and one global
  const auto bytes = tiny_model(s);
  auto m = load_model(GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf"));
  ThreadPool pool(2);
  const std::vector<int32_t> toks = {1, 5, 9, 33, 2, 99, 0, 42, 17, 8};
  const int n = static_cast<int>(toks.size()), V = m->n_vocab();
  for (const char* kind : {"mega", "opbyop", "reference"}) {
    SCOPED_TRACE(kind);
    // The prompt in steps of 4 rows, its first half without the head, and
    // then one position per step on a second sequence.
    Engine whole(*m, pool, 4, kind), single(*m, pool, 1, kind);
    SequenceState s1 = m->new_sequence(32), s2 = m->new_sequence(32);
    const std::vector<float> all = forced_logits(whole, s1, toks, 0, n / 2);
    const std::vector<float> every = forced_logits(whole, s2, toks);
    ASSERT_EQ(0, std::memcmp(all.data(), &every[static_cast<size_t>(n - n / 2) * V], sizeof(float) * all.size()));
    SequenceState s3 = m->new_sequence(32);
    for (int t = 0; t < n; ++t) {
      const std::vector<float> step = forced_logits(single, s3, {toks[t]}, t);
      ASSERT_EQ(0, std::memcmp(step.data(), &every[static_cast<size_t>(t) * V], sizeof(float) * V)) << "position " << t;
    }
    for (float x : every) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST_P(DenseArchTest, ThreadCountDoesNotChangeResults) {
  TinySpec s;
  s.arch = GetParam();
  const auto bytes = tiny_model(s, 11);
  auto m = load_model(GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf"));
  const std::vector<int32_t> toks = {3, 1, 4, 1, 5, 9, 2, 6};
  ThreadPool p1(1), p2(2);
  Engine e1(*m, p1, 8), e2(*m, p2, 8);
  SequenceState s1 = m->new_sequence(16), s2 = m->new_sequence(16);
  EXPECT_EQ(forced_logits(e1, s1, toks), forced_logits(e2, s2, toks));
}

INSTANTIATE_TEST_SUITE_P(Archs, DenseArchTest, ::testing::Values("llama", "qwen3", "gemma3"));

// A sliding-window layer must ignore keys older than the window: changing a
// token outside every window leaves the last logits unchanged only when all
// layers are windowed, so here we check the converse on a global layer.
TEST(Dense, GemmaWindowAndGlobalLayers) {
  TinySpec s;
  s.arch = "gemma3";
  s.n_layer = 6;
  const auto bytes = tiny_model(s);
  auto f = GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
  auto m = DenseModel::load(*f);
  const auto& c = m->config();
  for (int l = 0; l < 5; ++l) EXPECT_TRUE(c.layer_swa[l]);
  EXPECT_FALSE(c.layer_swa[5]);
  EXPECT_EQ(c.sliding_window, 4);
  EXPECT_FLOAT_EQ(c.embd_scale, 8.f);
  // With a global layer present, an early token influences the last logits.
  ThreadPool pool(2);
  auto model = load_model(GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf"));
  Engine e(*model, pool, 8);
  std::vector<int32_t> t1 = {1, 2, 3, 4, 5, 6, 7, 8}, t2 = t1;
  t2[0] = 50;
  SequenceState k1 = model->new_sequence(16), k2 = model->new_sequence(16);
  EXPECT_NE(forced_logits(e, k1, t1, 0, 1), forced_logits(e, k2, t2, 0, 1));
}

// The window itself, by its effect: with one sliding-window layer (window 4)
// the logits at position 7 see positions 4..7 only. Changing token 3 (just
// outside) leaves them bit for bit unchanged, changing token 4 (the oldest
// inside) changes them. (The executors are checked beyond the window against
// transformers in test_fidelity.cpp.)
TEST(Dense, GemmaSlidingWindowSeesExactlyItsPositions) {
  TinySpec s;
  s.arch = "gemma3";
  s.n_layer = 1;
  const auto bytes = tiny_model(s);
  auto f = GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
  auto m = DenseModel::load(*f);
  ASSERT_EQ(m->config().sliding_window, 4);
  ASSERT_TRUE(m->config().layer_swa[0]);
  ThreadPool pool(2);
  auto model = load_model(GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf"));
  Engine e(*model, pool, 8);
  const std::vector<int32_t> base = {1, 2, 3, 4, 5, 6, 7, 8};
  auto last_logits = [&](const std::vector<int32_t>& t) {
    SequenceState k = model->new_sequence(16);
    return forced_logits(e, k, t, 0, 1);
  };
  auto outside = base, inside = base;
  outside[3] = 50;
  inside[4] = 50;
  EXPECT_EQ(last_logits(base), last_logits(outside)) << "a token outside the window changed the logits";
  EXPECT_NE(last_logits(base), last_logits(inside)) << "a token inside the window did not matter";
}

TEST(Dense, RejectsWrongShapesAndMissingTensors) {
  TinySpec s;
  auto bytes = tiny_model(s);
  {
    GGUFWriter w;
    w.set_string("general.architecture", "mamba");
    auto b = w.serialize();
    auto f = GGUFFile::parse(b.data(), b.size(), "x.gguf");
    try {
      DenseModel::load(*f);
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'mamba' is not supported"), std::string::npos);
    }
  }
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 1);
  w.set_u32("llama.embedding_length", 64);
  w.set_u32("llama.feed_forward_length", 96);
  w.set_u32("llama.attention.head_count", 4);
  w.set_f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  std::vector<float> emb(64 * 10, 0.1f), nrm(64, 1.f), q(32 * 64, 0.f);
  w.add_tensor_f32("token_embd.weight", DType::F32, {64, 10}, emb.data());
  w.add_tensor_f32("output_norm.weight", DType::F32, {64}, nrm.data());
  w.add_tensor_f32("blk.0.attn_norm.weight", DType::F32, {64}, nrm.data());
  w.add_tensor_f32("blk.0.ffn_norm.weight", DType::F32, {64}, nrm.data());
  w.add_tensor_f32("blk.0.attn_q.weight", DType::F32, {64, 32}, q.data());  // should be {64, 64}
  auto b = w.serialize();
  auto g = GGUFFile::parse(b.data(), b.size(), "bad.gguf");
  try {
    DenseModel::load(*g);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'blk.0.attn_q.weight' has shape [64, 32], expected [64, 64]"),
              std::string::npos)
        << e.what();
  }
}

// GGUF files whose matrices are Q3_K, Q5_K, IQ4_NL or IQ4_XS (written by our
// writer with our quantisers) load and run, and their logits stay close to
// those of the same model in f32: the dense-mini preset draws the same f32
// weights whatever its format, so only quantisation separates the runs. The
// bound on the logits' relative RMS difference is the format's own weight
// error times 5, the error being the mean relative RMS of a round trip of
// Gaussian rows (test_dtype: 0.143, 0.036, 0.073, 0.073). The measured
// ratio is 3.3-3.6 for all four (and so scales with the format's own error):
// each of the 4 layers' seven matrices adds an independent error. A
// mis-decoded block gives errors of order 1 or more.
TEST(Dense, NewFormatsLoadAndTrackF32) {
  DensePreset p = *find_dense_preset("dense-mini");
  ThreadPool pool(2);
  const std::vector<int32_t> toks = {7, 300, 12, 99, 250, 3};
  const int n = static_cast<int>(toks.size());
  auto logits = [&](DType t) {
    p.wtype = t;
    const auto bytes = make_dense_gguf(p, 5);
    auto f = GGUFFile::parse(bytes.data(), bytes.size(), "mini.gguf");
    EXPECT_EQ(f->tensor("blk.0.ffn_up.weight").type, t);
    auto m = load_model(std::move(f));
    Engine e(*m, pool, 8);
    SequenceState c = m->new_sequence(16);
    return forced_logits(e, c, toks);
  };
  const auto ref = logits(DType::F32);
  double ref2 = 0;
  for (float v : ref) ref2 += (double)v * v;
  for (const auto& [t, weight_err] : {std::pair{DType::Q3_K, 0.143}, std::pair{DType::Q5_K, 0.036},
                                      std::pair{DType::IQ4_NL, 0.073}, std::pair{DType::IQ4_XS, 0.073}}) {
    SCOPED_TRACE(dtype_traits(t).name);
    const auto got = logits(t);
    double d2 = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << i;
      d2 += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
    }
    const double rel = std::sqrt(d2 / ref2);
    std::printf("[dense-mini] %s logits vs f32: relative RMS %.4f\n", dtype_traits(t).name, rel);
    EXPECT_LE(rel, 5.0 * weight_err);
    EXPECT_GT(rel, 0.0);  // it did run in the quantised format
  }
}

TEST(Dense, ContextOverflowIsAnError) {
  TinySpec s;
  const auto bytes = tiny_model(s);
  auto m = load_model(GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf"));
  ThreadPool pool(1);
  Engine e(*m, pool, 8);
  SequenceState c = m->new_sequence(4);
  std::vector<int32_t> toks = {1, 2, 3, 4, 5};
  EXPECT_NE(thrown_message([&] { forced_logits(e, c, toks, 0, 1); }).find("does not fit the context of 4 tokens"),
            std::string::npos);
  toks = {1000};
  EXPECT_NE(thrown_message([&] { forced_logits(e, c, toks, 0, 1); }).find("1000"), std::string::npos);
  // Token ids run without a tokenizer; text needs one, and the message says
  // why there is none.
  EXPECT_NE(thrown_message([&] { (void)m->tokenizer(); }).find("too small for the byte tokenizer"),
            std::string::npos);
}

}  // namespace
}  // namespace megakern
