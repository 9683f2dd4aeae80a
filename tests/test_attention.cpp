// The tiled attention kernel (kernels/cpu/attention.h) against its
// definition, one row and one head at a time, bit for bit: odd head sizes,
// GQA groups of 1 to 8, windows smaller and larger than the block, blocks
// starting mid-cache, values narrower or wider than keys (MLA), and
// ring-buffer layers whose slots wrap inside the block's history; keys and
// values in a position-major cache (packed per tile) and in a head-major one
// (read in place). Then
// through the executors: a row of a sequence gives the same logits whether
// it is computed alone, in a step of 8 rows or in a chunk of 64.
#include <gtest/gtest.h>

#include <cmath>

#include <cstring>
#include <vector>

#include "core/rng.h"
#include "core/thread_pool.h"
#include "exec/executor.h"
#include "io/gguf.h"
#include "kernels/cpu/attention.h"
#include "model/dense.h"
#include "model/dense_program.h"
#include "model_state.h"
#include "runtime/engine.h"
#include "runtime/model.h"
#include "tiny_model.h"

namespace megakern {
namespace {

struct Case {
  int head_dim, v_dim, n_heads, n_rows, pos0, window, ring;
};

// Keys and values of 2 KV heads (the view is the second one's), random
// queries, and the block's outputs by both kernels.
// With `sinks`, every head gets a learned sink logit (gpt-oss).
void check_case(const Case& c, bool scalar, bool sinks = false) {
  SCOPED_TRACE(::testing::Message() << "hd " << c.head_dim << " vd " << c.v_dim << " heads " << c.n_heads << " rows "
                                    << c.n_rows << " pos0 " << c.pos0 << " window " << c.window << " ring " << c.ring
                                    << (scalar ? " scalar" : " vector") << (sinks ? " sinks" : ""));
  const int n_kv = 2, last = c.pos0 + c.n_rows - 1;
  const int slots = c.ring > 0 ? c.ring : last + 1;
  const int64_t ks = int64_t{n_kv} * c.head_dim + 3, vs = int64_t{n_kv} * c.v_dim + 5;  // padded strides
  std::vector<float> k(static_cast<size_t>(slots * ks)), v(static_cast<size_t>(slots * vs));
  Rng rng(static_cast<uint64_t>(c.head_dim * 131 + c.n_rows * 7 + c.pos0 + c.window * 3 + c.ring));
  for (float& x : k) x = rng.symmetric();
  for (float& x : v) x = rng.symmetric();
  const int64_t qs = int64_t{c.n_heads} * c.head_dim + 1, os = int64_t{c.n_heads} * c.v_dim + 2;
  std::vector<float> q(static_cast<size_t>(c.n_rows * qs));
  for (float& x : q) x = rng.symmetric();
  KvHeadView kv;
  kv.k = k.data() + c.head_dim;
  kv.v = v.data() + c.v_dim;
  kv.k_stride = ks;
  kv.v_stride = vs;
  kv.ring = c.ring;
  AttentionBlock a;
  a.q = q.data();
  a.q_stride = qs;
  a.out_stride = os;
  a.n_rows = c.n_rows;
  a.pos0 = c.pos0;
  a.n_heads = c.n_heads;
  a.head_dim = c.head_dim;
  a.v_dim = c.v_dim;
  a.window = c.window;
  a.scale = 0.37f;
  std::vector<float> sink(static_cast<size_t>(c.n_heads));
  for (size_t j = 0; j < sink.size(); ++j) sink[j] = 2.f * rng.symmetric() + (j == 0 ? 3.f : 0.f);  // head 0: a dominant sink
  if (sinks) a.sinks = sink.data();
  std::vector<float> tiled(static_cast<size_t>(c.n_rows * os), -7.f), ref = tiled;
  a.out = tiled.data();
  attention_block(a, kv, scalar);
  a.out = ref.data();
  attention_rows_reference(a, kv, scalar);
  for (int i = 0; i < c.n_rows; ++i)
    for (int j = 0; j < c.n_heads; ++j) {
      const size_t o = static_cast<size_t>(i * os + j * c.v_dim);
      ASSERT_EQ(0, std::memcmp(&tiled[o], &ref[o], sizeof(float) * static_cast<size_t>(c.v_dim)))
          << "row " << i << " head " << j << ": " << tiled[o] << " vs " << ref[o];
    }
  // The same keys and values in a head-major cache (KVCache's layout: the
  // head's positions contiguous, stride = the head's width), read in place
  // rather than packed: the same bits.
  {
    std::vector<float> kh(static_cast<size_t>(slots * c.head_dim)), vh(static_cast<size_t>(slots * c.v_dim));
    const size_t kb = sizeof(float) * static_cast<size_t>(c.head_dim), vb = sizeof(float) * static_cast<size_t>(c.v_dim);
    for (int s = 0; s < slots; ++s) {
      std::memcpy(&kh[static_cast<size_t>(s * c.head_dim)], kv.k + s * ks, kb);
      std::memcpy(&vh[static_cast<size_t>(s * c.v_dim)], kv.v + s * vs, vb);
    }
    KvHeadView hm = kv;
    hm.k = kh.data();
    hm.v = vh.data();
    hm.k_stride = c.head_dim;
    hm.v_stride = c.v_dim;
    std::vector<float> head_major(tiled.size(), -7.f);
    a.out = head_major.data();
    attention_block(a, hm, scalar);
    ASSERT_EQ(0, std::memcmp(head_major.data(), tiled.data(), sizeof(float) * tiled.size())) << "head-major cache";
  }
  // Padding between heads' outputs is left alone.
  for (int i = 0; i < c.n_rows; ++i) ASSERT_EQ(tiled[static_cast<size_t>(i * os + os - 1)], -7.f);
  // Each row alone (a block of one at its position) gives the same bits.
  std::vector<float> alone(static_cast<size_t>(os));
  for (int i = 0; i < c.n_rows; i += std::max(1, c.n_rows / 5)) {
    AttentionBlock one = a;
    one.q = q.data() + i * qs;
    one.n_rows = 1;
    one.pos0 = c.pos0 + i;
    one.out = alone.data();
    attention_block(one, kv, scalar);
    ASSERT_EQ(0, std::memcmp(alone.data(), &tiled[static_cast<size_t>(i * os)],
                             sizeof(float) * static_cast<size_t>(c.n_heads * c.v_dim)))
        << "row " << i << " alone";
  }
}

TEST(Kernels, AttentionBlockMatchesRowByRowBitForBit) {
  const std::vector<Case> cases = {
      // head_dim, v_dim, heads, rows, pos0, window, ring
      {64, 64, 3, 1, 0, 0, 0},        // one row, first position
      {64, 64, 3, 1, 700, 0, 0},      // one row, long history
      {64, 64, 3, 40, 0, 0, 0},       // a first prompt chunk
      {64, 64, 3, 33, 250, 0, 0},     // a chunk mid-cache
      {128, 128, 1, 17, 60, 0, 0},    // no GQA
      {128, 128, 8, 9, 1100, 0, 0},   // group of 8, prefetched history
      {256, 256, 4, 20, 31, 0, 0},    // wide heads (short tiles)
      {37, 37, 3, 21, 5, 0, 0},       // odd head size
      {72, 72, 2, 19, 40, 0, 0},      // head size not a multiple of 32
      {64, 64, 3, 30, 100, 8, 0},     // window smaller than the block
      {64, 64, 3, 12, 300, 64, 0},    // window larger than the block
      {64, 64, 3, 12, 5, 64, 0},      // window reaching back past position 0
      {64, 64, 2, 24, 150, 32, 64},   // ring layer, slots wrap in the history
      {64, 64, 2, 40, 1000, 40, 80},  // ring exactly window + block
      {192, 128, 4, 25, 77, 0, 0},    // MLA: values narrower than keys
      {48, 80, 2, 13, 33, 0, 0},      // values wider than keys
      {576, 512, 2, 10, 20, 0, 0},    // MLA latent sizes
  };
  for (bool scalar : {false, true})
    for (const Case& c : cases) check_case(c, scalar);
  for (bool scalar : {false, true})
    for (const Case& c : cases)
      if (c.head_dim == c.v_dim) check_case(c, scalar, true);
}

// A sink takes its share of the softmax and contributes no value: one key
// with value x and score s against a sink t gives x * e^s / (e^s + e^t).
TEST(Kernels, AttentionSinkTakesItsShareOfTheSoftmax) {
  const int hd = 4;
  std::vector<float> k = {1, 0, 0, 0}, v = {2, -1, 0.5f, 4}, q = {0.7f, 0, 0, 0}, out(hd);
  const float sink = 0.3f;
  KvHeadView kv;
  kv.k = k.data();
  kv.v = v.data();
  kv.k_stride = kv.v_stride = hd;
  AttentionBlock a;
  a.q = q.data();
  a.q_stride = hd;
  a.out = out.data();
  a.out_stride = hd;
  a.n_rows = 1;
  a.n_heads = 1;
  a.head_dim = a.v_dim = hd;
  a.scale = 1.f;
  a.sinks = &sink;
  for (bool scalar : {false, true}) {
    attention_block(a, kv, scalar);
    const double w = std::exp(0.7) / (std::exp(0.7) + std::exp(0.3));
    for (int i = 0; i < hd; ++i) EXPECT_NEAR(out[static_cast<size_t>(i)], w * v[static_cast<size_t>(i)], 1e-6) << i;
  }
}

// Through the executors, on a tiny gemma3 (sliding-window and global layers,
// GQA): 64 positions of one sequence prefilled as one step, as steps of 8 and
// one row per step give the same logits for every position, bit for bit,
// for every KV cache type (core/kv_type.h).
class ExecKvTest : public ::testing::TestWithParam<KvType> {};

TEST_P(ExecKvTest, RowGivesSameBitsAloneInEightAndInLongChunk) {
  for (const char* arch : {"gemma3", "llama"}) {
    TinySpec spec;
    spec.arch = arch;
    spec.n_layer = 6;
    spec.n_head = 6;
    spec.n_head_kv = 2;
    spec.head_dim = 128;  // tiles of 32 positions: the chunk's history spans several
    const auto bytes = tiny_model(spec, 11);
    auto f = GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
    auto m = DenseModel::load(*f);
    const int N = 64, V = m->config().n_vocab;
    const DecodeProgram prog = build_dense_program(*m, N);
    ThreadPool pool(2);
    for (const char* kind : {"opbyop", "mega"}) {
      SCOPED_TRACE(std::string(arch) + " " + kind);
      auto ex = make_executor(kind, prog, pool);
      std::vector<int32_t> toks(N);
      for (int p = 0; p < N; ++p) toks[static_cast<size_t>(p)] = (p * 29 + 3) % V;
      auto run = [&](int block) {
        KVCache c = make_cache(*m, 128, 0, GetParam());
        std::vector<float> out(static_cast<size_t>(N) * V);
        for (int p0 = 0; p0 < N; p0 += block) {
          std::vector<RowInput> rows;
          for (int p = p0; p < std::min(N, p0 + block); ++p) rows.push_back({toks[static_cast<size_t>(p)], p, &c});
          ex->step(rows, &out[static_cast<size_t>(p0) * V]);
        }
        return out;
      };
      const auto one = run(1), eight = run(8), chunk = run(N);
      for (int p = 0; p < N; ++p) {
        ASSERT_EQ(0, std::memcmp(&one[static_cast<size_t>(p) * V], &eight[static_cast<size_t>(p) * V], sizeof(float) * V))
            << "position " << p << " in 8";
        ASSERT_EQ(0, std::memcmp(&one[static_cast<size_t>(p) * V], &chunk[static_cast<size_t>(p) * V], sizeof(float) * V))
            << "position " << p << " in " << N;
      }
    }
  }
}

// Engine::prefill runs a dense prompt in blocks through the program without
// its output head, and the last position alone through the full program:
// the logits are those of one row per step, bit for bit, for any block.
TEST_P(ExecKvTest, PrefillInHeadlessBlocksEqualsOneRowPerStep) {
  ModelOptions mo;
  mo.kv_type = GetParam();
  auto m = load_model("dense-mini", mo);
  ThreadPool pool(2);
  const int n = 70, V = m->n_vocab();
  std::vector<int32_t> toks(n);
  for (int p = 0; p < n; ++p) toks[static_cast<size_t>(p)] = (p * 37 + 11) % V;
  Engine ref(*m, pool, 1, "opbyop");
  SequenceState s0 = m->new_sequence(n);
  std::vector<float> want(static_cast<size_t>(V)), got(static_cast<size_t>(V));
  for (int p = 0; p < n; ++p) ref.step({s0.row(toks[static_cast<size_t>(p)], p)}, want.data());
  for (const char* kind : {"mega", "opbyop"})
    for (int block : {1, 8, 32, 64}) {
      Engine e(*m, pool, 8, kind);
      e.set_prefill_rows(block);
      SequenceState s = m->new_sequence(n);
      e.prefill(s, toks.data(), n, 0, got.data());
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), sizeof(float) * V)) << kind << ", blocks of " << block;
    }
}

INSTANTIATE_TEST_SUITE_P(KvTypes, ExecKvTest, ::testing::ValuesIn(kAllKvTypes), KvTypeName());

}  // namespace
}  // namespace megakern
