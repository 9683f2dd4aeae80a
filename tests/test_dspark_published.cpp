// The DSpark drafter in the reference system's layout: a synthetic checkpoint
// (tests/fixtures/dspark_published, written by
// scripts/fixtures/gen_dspark_fixture.py with an independent NumPy decode of
// the published formulas) loads through load_block_drafter and gives the
// NumPy logits and drafts; checkpoints that do not fit the target are refused
// naming the mismatch; Kimi K3 taps are the raw running block prefixes (the
// streams the reference system captures), which the final mixture reads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/safetensors_writer.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "spec/block_drafter.h"
#include "test_util.h"

namespace megakern {
namespace {

const std::string kDir = fixture_path("dspark_published");

std::vector<int32_t> ints_of(const nlohmann::json& j) {
  std::vector<int32_t> out;
  for (const auto& v : j) out.push_back(v.get<int32_t>());
  return out;
}

TEST(DSparkPublished, ConfigKeysAndTapIdsAsTheReferenceWritesThem) {
  auto m = load_model("kimi-k3-mini");
  const BlockDrafterWeights w = load_block_drafter(kDir, *m);
  const BlockDrafterConfig& c = w.config;
  EXPECT_EQ(c.kind, BlockDrafterKind::DSpark);
  // aux_hidden_state_layer_ids [2, 6, 10]: the streams entering layers 2, 6
  // and 10, i.e. our taps after layers 1, 5 and 9 (the last layer).
  EXPECT_EQ(c.tap_layers, (std::vector<int>{1, 5, 9}));
  EXPECT_EQ(c.hidden, 64);
  EXPECT_EQ(c.target_hidden, 64);
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.ffn, 96);
  EXPECT_EQ(c.mask_token, 253);
  EXPECT_EQ(c.window, 6);
  EXPECT_EQ(c.markov_rank, 8);
  EXPECT_EQ(c.block, 5);
  EXPECT_EQ(c.markov_top_m, 16);  // not a checkpoint key: the reference's default
  // Written back in the same keys.
  const auto j = nlohmann::json::parse(c.to_json());
  EXPECT_EQ(j.at("aux_hidden_state_layer_ids"), nlohmann::json::parse("[2, 6, 10]"));
  EXPECT_EQ(j.at("transformer_layer_config").at("sliding_window"), 6);
  EXPECT_EQ(j.at("mask_token_id"), 253);
  const auto back = BlockDrafterConfig::from_json(c.to_json(), "round trip");
  EXPECT_EQ(back.tap_layers, c.tap_layers);
  EXPECT_EQ(back.window, c.window);
  EXPECT_EQ(back.mask_token, c.mask_token);
}

// Logits within 1e-4 of the float64 NumPy decode (they agree to ~1e-6; the
// weights are the same BF16 values, the arithmetic f32 here), drafts equal,
// with the exact Markov step (this checkpoint's default: 16 candidates per
// 32nd of a 256-token vocabulary is all of it) and with 2 candidates.
TEST(DSparkPublished, SyntheticCheckpointDecodesAsTheNumpyReference) {
  auto m = load_model("kimi-k3-mini");
  ThreadPool pool(2);
  const BlockDrafterWeights w = load_block_drafter(kDir, *m);
  const auto& fx = fixture_json("dspark_published/expected.json");
  const std::vector<float> taps = flatten(fx.at("taps"));
  const size_t W = static_cast<size_t>(w.config.n_taps() * w.config.target_hidden);
  ASSERT_EQ(taps.size() % W, 0u);
  for (const auto& cs : fx.at("cases")) {
    const int n_ctx = cs.at("n_ctx").get<int>();
    SCOPED_TRACE("context of " + std::to_string(n_ctx));
    const auto tokens = ints_of(cs.at("tokens"));
    const auto want_logits = flatten(cs.at("logits"));
    const auto want_drafts = ints_of(cs.at("drafts"));
    BlockDrafter d(*m, w, pool, 64);
    d.observe_taps(taps.data(), n_ctx, 0);
    std::vector<float> logits;
    d.block_logits(tokens, w.config.block, logits);
    ASSERT_EQ(logits.size(), want_logits.size());
    float worst = 0;
    for (size_t i = 0; i < logits.size(); ++i) worst = std::max(worst, std::fabs(logits[i] - want_logits[i]));
    EXPECT_LT(worst, 1e-4f);
    Draft out;
    d.propose(tokens, 20, out);  // at most the block: every slot drafts
    EXPECT_EQ(out.tokens, want_drafts);
    d.propose(tokens, 3, out);  // causal in the block: a prefix
    EXPECT_EQ(out.tokens, std::vector<int32_t>(want_drafts.begin(), want_drafts.begin() + 3));
    // The reference's candidate Markov step, 2 per 32nd of the vocabulary.
    {
      BlockDrafterWeights w2 = w;
      w2.config.markov_top_m = 2;
      BlockDrafter dc(*m, w2, pool, 64);
      dc.observe_taps(taps.data(), n_ctx, 0);
      dc.propose(tokens, 20, out);
      EXPECT_EQ(out.tokens, ints_of(cs.at("drafts_top2")));
    }
    // Fed in two pieces (as verify steps do): the same context.
    BlockDrafter d2(*m, w, pool, 64);
    d2.observe_taps(taps.data(), 2, 0);
    d2.observe_taps(taps.data() + 2 * W, n_ctx - 2, 2);
    d2.propose(tokens, 20, out);
    EXPECT_EQ(out.tokens, want_drafts);
    if (n_ctx > w.config.window) {
      // The window is applied: attending to the whole context gives other logits.
      BlockDrafterWeights all = w;
      all.config.window = 0;
      BlockDrafter d3(*m, all, pool, 64);
      d3.observe_taps(taps.data(), n_ctx, 0);
      std::vector<float> l3;
      d3.block_logits(tokens, w.config.block, l3);
      float diff = 0;
      for (size_t i = 0; i < l3.size(); ++i) diff = std::max(diff, std::fabs(l3[i] - want_logits[i]));
      EXPECT_GT(diff, 1e-2f);
    }
  }
}

// A copy of the fixture directory with config.json edited by `edit`.
std::string edited_copy(const std::string& root, const std::string& name,
                        const std::function<void(nlohmann::json&)>& edit) {
  const std::string dir = root + "/" + name;
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kDir + "/model.safetensors", dir + "/model.safetensors");
  std::ifstream in(kDir + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  write_file_atomic(dir + "/config.json", j.dump(2));
  return dir;
}

TEST(DSparkPublished, CheckpointNotFittingTheTargetIsRefusedNamingTheMismatch) {
  auto m = load_model("kimi-k3-mini");
  TempDir root;
  auto expect_error = [&](const std::string& dir, std::initializer_list<const char*> words) {
    const std::string e = thrown_message([&] { load_block_drafter(dir, *m); });
    ASSERT_FALSE(e.empty()) << dir << " was accepted";
    for (const char* w : words) EXPECT_NE(e.find(w), std::string::npos) << e;
  };
  // A tap layer beyond the target's 10 layers (id 11: entering layer 11).
  expect_error(edited_copy(root.path, "taps", [](auto& j) { j["aux_hidden_state_layer_ids"] = {2, 6, 11}; }),
               {"tap layer 10", "outside the 10 layers"});
  expect_error(edited_copy(root.path, "tap0", [](auto& j) { j["aux_hidden_state_layer_ids"] = {0, 6, 10}; }),
               {"aux_hidden_state_layer_ids", "0"});
  // Another hidden width than the target's stream.
  expect_error(edited_copy(root.path, "hidden",
                           [](auto& j) { j["transformer_layer_config"]["hidden_size"] = 32; }),
               {"hidden width of 32", "has 64"});
  // Another vocabulary.
  expect_error(edited_copy(root.path, "vocab",
                           [](auto& j) { j["transformer_layer_config"]["vocab_size"] = 300; }),
               {"vocabulary of 300", "has 256"});
  // A tensor whose shape does not follow the config.
  expect_error(edited_copy(root.path, "rank", [](auto& j) { j["markov_rank"] = 4; }),
               {"markov_head.markov_w1.weight", "[256, 8]", "[256, 4]"});
  // A missing key is named.
  expect_error(edited_copy(root.path, "nokey", [](auto& j) { j.erase("mask_token_id"); }), {"mask_token_id"});
  expect_error(edited_copy(root.path, "nowindow",
                           [](auto& j) { j["transformer_layer_config"].erase("sliding_window"); }),
               {"sliding_window"});
  // A mask token outside the vocabulary.
  expect_error(edited_copy(root.path, "mask", [](auto& j) { j["mask_token_id"] = 256; }), {"mask token 256"});
  // The untouched copy loads.
  EXPECT_NO_THROW(load_block_drafter(edited_copy(root.path, "ok", [](auto&) {}), *m));
  // And the wrong target for the untouched one: dense-mini (vocabulary 512).
  auto dense = load_model("dense-mini");
  const std::string e = thrown_message([&] { load_block_drafter(kDir, *dense); });
  EXPECT_NE(e.find("vocabulary of 256"), std::string::npos) << e;
}

// Runs a 3-token prefix then a 4-row block on the reference executor with
// taps; returns the block rows' taps and logits, and the block's tokens.
std::vector<float> kimi_block_taps(const Model& m, const DecodeProgram& p, ThreadPool& pool, std::vector<float>& logits,
                                   std::vector<int32_t>& block) {
  auto ex = make_executor("reference", p, pool);
  SequenceState seq = m.new_sequence(32);
  const std::vector<int32_t> prefix = {5, 17, 99};
  block = {42, 7, 7, 13};
  logits.assign(static_cast<size_t>(m.n_vocab()) * 4, 0.f);
  std::vector<float> taps(static_cast<size_t>(p.tap_width) * 4, -1.f);
  std::vector<RowInput> rows;
  for (int i = 0; i < 3; ++i) rows.push_back(seq.row(prefix[static_cast<size_t>(i)], i));
  ex->step(rows, logits.data());
  rows.clear();
  for (int i = 0; i < 4; ++i) rows.push_back(seq.row(block[static_cast<size_t>(i)], 3 + i));
  ex->set_tap_output(taps.data());
  ex->step(rows, logits.data());
  return taps;
}

// kimi-k3-mini: 10 layers in residual blocks of 4, so the blocks are the
// embedding, layers 0-3, 4-7 and 8-9. Taps after layers 3, 7 and 9 are the
// three finished block sums; mixing them with the embedding by the published
// attention-residual formula (written out here) and applying the final norm
// and head gives the model's logits. A tap in the middle of a block is the
// partial sum, not a mixture: after layer 4 (the first of its block) it holds
// layer 4's own outputs only, so it differs from both neighbours.
TEST(DSparkPublished, KimiTapsAreTheRawRunningBlockPrefixes) {
  auto m = load_model("kimi-k3-mini");
  ThreadPool pool(2);
  DecodeProgram p = m->build_program(4);
  ASSERT_EQ(p.n_layer, 10);
  const int H = add_taps(p, {3, 7, 9, 4});
  const Op* embed = nullptr;
  const Op* final_mix = nullptr;
  const Op* norm = nullptr;
  const Op* head = nullptr;
  for (const Op& op : p.ops) {
    if (op.kind == OpKind::Embed) embed = &op;
    if (op.kind == OpKind::AttnResMix && op.layer < 0) final_mix = &op;
    if (op.kind == OpKind::RmsNorm && op.layer < 0) norm = &op;
    if (op.kind == OpKind::MatMul && op.out == p.logits_slot) head = &op;
  }
  ASSERT_TRUE(embed && final_mix && norm && head);
  const auto& fm = final_mix->as<ops::AttnResMix>();
  ASSERT_EQ(fm.n_blocks, 4);
  std::vector<float> logits;
  std::vector<int32_t> block;
  const auto taps = kimi_block_taps(*m, p, pool, logits, block);
  const size_t V = static_cast<size_t>(m->n_vocab()), Hs = static_cast<size_t>(H);
  for (size_t r = 0; r < 4; ++r) {
    const float* t = taps.data() + r * 4 * Hs;
    std::vector<std::vector<double>> values(4, std::vector<double>(Hs));
    std::vector<float> e(Hs);
    dequantize_row(embed->mat, block[r], e.data());
    for (size_t j = 0; j < Hs; ++j) {
      values[0][j] = static_cast<double>(e[j]) * embed->as<ops::Embed>().scale;
      for (size_t b = 0; b < 3; ++b) values[b + 1][j] = t[b * Hs + j];
    }
    // score_b = (v_b . w) / rms(v_b), softmax, weighted sum.
    std::vector<double> score(4);
    double top = -1e300;
    for (size_t b = 0; b < 4; ++b) {
      double dot = 0, ss = 0;
      for (size_t j = 0; j < Hs; ++j) {
        dot += values[b][j] * fm.query[j];
        ss += values[b][j] * values[b][j];
      }
      score[b] = dot / std::sqrt(ss / static_cast<double>(Hs) + fm.eps);
      top = std::max(top, score[b]);
    }
    double z = 0;
    for (auto& s : score) z += (s = std::exp(s - top));
    std::vector<float> mix(Hs, 0.f), xn(Hs), out(V);
    for (size_t j = 0; j < Hs; ++j) {
      double acc = 0;
      for (size_t b = 0; b < 4; ++b) acc += score[b] / z * values[b][j];
      mix[j] = static_cast<float>(acc);
    }
    const auto& nw = norm->as<ops::RmsNorm>();
    rmsnorm(mix.data(), nw.weight.data(), H, nw.eps, xn.data());
    matmul_rows(head->mat, xn.data(), 1, out.data(), p.n_vocab, 0, p.n_vocab);
    double num = 0, den = 0;
    for (size_t i = 0; i < V; ++i) {
      const double d = out[i] - logits[r * V + i];
      num += d * d;
      den += static_cast<double>(logits[r * V + i]) * logits[r * V + i];
    }
    EXPECT_LT(std::sqrt(num / den), 2e-4) << "row " << r;
    // The tap after layer 4 starts a new block sum.
    const float* t4 = t + 3 * Hs;
    double d3 = 0, d7 = 0;
    for (size_t j = 0; j < Hs; ++j) {
      d3 += std::fabs(t4[j] - t[j]);
      d7 += std::fabs(t4[j] - t[Hs + j]);
    }
    EXPECT_GT(d3, 1e-3);
    EXPECT_GT(d7, 1e-3);
  }
}

}  // namespace
}  // namespace megakern
