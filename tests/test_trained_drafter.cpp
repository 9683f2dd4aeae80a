// The DSpark drafter's draft vocabulary and shared target embedding/head,
// the shipped trained drafter for SmolLM2 (checksum, refusal of a target it
// does not fit, lossless and accepted drafts), and SHA-256.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "core/sha256.h"
#include "core/thread_pool.h"
#include "runtime/engine.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "spec/block_drafter.h"
#include "spec/drafter.h"
#include "spec/speculative.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"

namespace megakern {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

TEST(Sha256, KnownDigests) {
  auto hex = [](const std::string& s) { return sha256_hex(reinterpret_cast<const uint8_t*>(s.data()), s.size()); };
  EXPECT_EQ(hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 56 bytes: the length no longer fits the first block's padding.
  EXPECT_EQ(hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  TempDir d;
  const std::string big(200000, 'a');
  spit(d.path + "/f", big);
  EXPECT_EQ(sha256_file_hex(d.path + "/f"), hex(big));
  EXPECT_THROW(sha256_file_hex(d.path + "/missing"), Error);
}

// A shared-embedding DSpark drafter for dense-mini over the whole vocabulary
// (exact Markov argmax), and the same drafter restricted to every third id:
// the restricted one's logits are the full one's columns d2t, and its drafts
// the argmax over those columns with the bias of the previous draft's row
// (none for an anchor outside the draft vocabulary).
TEST(TrainedDrafter, DraftVocabularyIsTheFullDrafterRestricted) {
  auto m = load_model("dense-mini");
  ThreadPool pool(2);
  BlockDrafterConfig cf = BlockDrafterConfig::mini(BlockDrafterKind::DSpark, *m);
  cf.tie_target = true;
  cf.markov_top_m = 0;
  cf.markov_rank = 8;
  BlockDrafterWeights full = synthetic_block_drafter(cf);
  for (auto& x : full.markov_w2) x *= 30.f;  // a bias that changes drafts
  BlockDrafterWeights part = full;
  part.config.draft_vocab = 0;
  for (int id = 1; id < cf.n_vocab; id += 3) part.d2t.push_back(id);
  part.config.draft_vocab = static_cast<int>(part.d2t.size());
  const size_t r = static_cast<size_t>(cf.markov_rank);
  part.markov_w1.clear();
  part.markov_w2.clear();
  for (int32_t id : part.d2t) {
    part.markov_w1.insert(part.markov_w1.end(), full.markov_w1.begin() + id * r, full.markov_w1.begin() + (id + 1) * r);
    part.markov_w2.insert(part.markov_w2.end(), full.markov_w2.begin() + id * r, full.markov_w2.begin() + (id + 1) * r);
  }
  EXPECT_TRUE(full.embed.empty() && full.lm_head.empty());  // shared, not stored
  const int H = cf.target_hidden * cf.n_taps();
  Rng rng(5);
  std::vector<float> taps(static_cast<size_t>(9 * H));
  for (auto& x : taps) x = rng.centred(2.f);
  std::vector<int32_t> ctx = {3, 8, 1, 4, 4, 9, 2, 6, 5, 3};  // anchor 3: outside d2t (1, 4, 7, ...)
  ASSERT_EQ(ctx.back() % 3, 0);
  TempDir dir;
  save_block_drafter(part, dir.path);
  const std::string cfg = slurp(dir.path + "/config.json");
  EXPECT_NE(cfg.find("\"draft_vocab_size\""), std::string::npos);
  EXPECT_NE(cfg.find("\"tie_target_embeddings\": true"), std::string::npos);
  BlockDrafter a(*m, full, pool, 64), b(*m, part, pool, 64), c(*m, load_block_drafter(dir.path, *m), pool, 64);
  for (BlockDrafter* d : {&a, &b, &c}) d->observe_taps(taps.data(), 9, 0);
  const int B = cf.block, V = cf.n_vocab, Vd = part.config.draft_vocab;
  std::vector<float> lf, lp;
  a.block_logits(ctx, B, lf);
  b.block_logits(ctx, B, lp);
  ASSERT_EQ(lp.size(), static_cast<size_t>(B * Vd));
  for (int i = 0; i < B; ++i)
    for (int j = 0; j < Vd; ++j)
      ASSERT_NEAR(lp[static_cast<size_t>(i * Vd + j)], lf[static_cast<size_t>(i * V + part.d2t[static_cast<size_t>(j)])],
                  1e-4f * (1.f + std::fabs(lp[static_cast<size_t>(i * Vd + j)])));
  // The drafts by hand from the full logits.
  std::vector<int32_t> want;
  int prev = -1;
  for (int i = 0; i < B; ++i) {
    int best = -1;
    float bv = -INFINITY;
    for (int j = 0; j < Vd; ++j) {
      const int id = part.d2t[static_cast<size_t>(j)];
      float v = lf[static_cast<size_t>(i * V + id)];
      if (prev >= 0)
        for (size_t q = 0; q < r; ++q) v += full.markov_w2[id * r + q] * full.markov_w1[prev * r + q];
      if (v > bv) bv = v, best = id;
    }
    want.push_back(best);
    prev = best;
  }
  Draft db, dc;
  b.propose(ctx, B, db);
  c.propose(ctx, B, dc);
  EXPECT_EQ(db.tokens, want);
  EXPECT_EQ(dc.tokens, want);
  // Drafts of the full drafter leave the draft vocabulary somewhere.
  Draft da;
  a.propose(ctx, B, da);
  EXPECT_NE(da.tokens, want);

  // Bad draft vocabularies are refused, naming what is wrong.
  BlockDrafterWeights bad = part;
  std::swap(bad.d2t[0], bad.d2t[1]);
  try {
    BlockDrafter x(*m, bad, pool, 64);
    ADD_FAILURE() << "a descending d2t was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ids must ascend"), std::string::npos) << e.what();
  }
  bad = part;
  bad.d2t.pop_back();
  EXPECT_THROW(BlockDrafter(*m, bad, pool, 64), Error);
}

// The drafter trained for SmolLM2 and committed under assets/.
class ShippedDrafter : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = test_model_path("smollm2-135m");
    if (path_.empty()) GTEST_SKIP() << "models/smollm2-135m.gguf not fetched";
    m_ = load_model(path_);
  }
  std::string path_;
  std::unique_ptr<Model> m_;
};

TEST_F(ShippedDrafter, LoadsByDefaultAndIsLosslessAndAccepted) {
  ThreadPool pool(2);
  const std::string dir = shipped_block_drafter(*m_, BlockDrafterKind::DSpark);
  ASSERT_FALSE(dir.empty());
  EXPECT_EQ(shipped_block_drafter(*m_, BlockDrafterKind::DFlash), "");
  EXPECT_LE(fs::file_size(dir + "/model.safetensors"), 20u << 20);
  std::unique_ptr<Model> owned;
  auto d = make_drafter("dspark", *m_, pool, 1024, {}, owned);
  auto& bd = dynamic_cast<BlockDrafter&>(*d);
  const BlockDrafterConfig& c = bd.weights().config;
  EXPECT_TRUE(c.tie_target);
  EXPECT_GT(c.draft_vocab, 0);
  EXPECT_EQ(c.target_layers, 30);
  const std::vector<std::string> texts = {
      "Explain what a glacier is in three sentences.",
      "Write a short poem about the sea.",
      "Summarise this text in one sentence: The library will open a new reading room in May. It will have forty "
      "seats and stay open until ten in the evening.",
  };
  // The same shape with random weights, for comparison.
  BlockDrafter random(*m_, synthetic_block_drafter(c), pool, 1024);
  double accept_first = 0, accept_random = 0;
  for (const std::string& text : texts) {
    SCOPED_TRACE(text);
    const std::string chat = render_chat(m_->chat_format(), {{"user", text}}, true);
    const auto prompt = m_->tokenizer().encode(chat, m_->tokenizer().add_bos_default(), true);
    Session plain(*m_, pool, 1024);
    Engine eng(*m_, pool, 8);
    SequenceState seq = m_->new_sequence(1024);
    SpecOptions o;
    o.draft = 7;
    o.adaptive = false;  // always verify 7 drafts: the acceptance is the drafter's
    SpeculativeGenerator gen(eng, seq, *d, o);
    Sampler s({});
    const auto want = generate_plain(plain, s, prompt, 64);
    EXPECT_EQ(gen.generate(prompt, 64), want);
    if (accept_first == 0) {
      accept_first = gen.stats().mean_accept();
      SequenceState seq2 = m_->new_sequence(1024);
      SpeculativeGenerator rgen(eng, seq2, random, o);
      EXPECT_EQ(rgen.generate(prompt, 64), want);
      accept_random = rgen.stats().mean_accept();
    }
  }
  // Random weights of the same shape are accepted about never (1.0); the
  // trained drafter's drafts are, on a held-out topic.
  EXPECT_GT(accept_first, 1.1) << "acceptance length of the shipped drafter";
  EXPECT_GT(accept_first, accept_random + 0.08) << "trained " << accept_first << ", random " << accept_random;
}

TEST_F(ShippedDrafter, ChecksumAndTargetAreChecked) {
  ThreadPool pool(2);
  const std::string dir = shipped_block_drafter(*m_, BlockDrafterKind::DSpark);
  ASSERT_FALSE(dir.empty());
  EXPECT_NO_THROW(verify_block_drafter_checksum(dir));
  TempDir t;
  const std::string copy = t.path + "/drafters/smollm2-135m-dspark";
  fs::create_directories(copy);
  for (const char* f : {"config.json", "model.safetensors", "model.safetensors.sha256"})
    fs::copy_file(dir + "/" + f, copy + "/" + f);
  // One byte changed in the weights: refused at load, naming the file.
  std::string w = slurp(copy + "/model.safetensors");
  w[w.size() / 2] ^= 1;
  spit(copy + "/model.safetensors", w);
  try {
    verify_block_drafter_checksum(copy);
    ADD_FAILURE() << "a damaged file passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has sha256"), std::string::npos) << e.what();
  }
  // Through --spec dspark with the assets found in MEGAKERN_ASSETS_DIR.
  setenv("MEGAKERN_ASSETS_DIR", t.path.c_str(), 1);
  std::unique_ptr<Model> owned;
  EXPECT_THROW(make_drafter("dspark", *m_, pool, 256, {}, owned), Error);
  unsetenv("MEGAKERN_ASSETS_DIR");
  fs::remove(copy + "/model.safetensors.sha256");
  EXPECT_THROW(verify_block_drafter_checksum(copy), Error);

  // Another target: refused with a message (vocabulary, depth, taps).
  auto mini = load_model("dense-mini");
  try {
    load_block_drafter(dir, *mini);
    ADD_FAILURE() << "the SmolLM2 drafter loaded for dense-mini";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("made for a"), std::string::npos) << e.what();
  }
  // The same vocabulary and width but a depth it was not made for.
  std::string cfg = slurp(dir + "/config.json");
  const std::string key = "\"target_num_hidden_layers\": 30";
  ASSERT_NE(cfg.find(key), std::string::npos);
  const std::string d2 = t.path + "/other";
  fs::create_directories(d2);
  fs::copy_file(dir + "/model.safetensors", d2 + "/model.safetensors");
  spit(d2 + "/config.json", std::string(cfg).replace(cfg.find(key), key.size(), "\"target_num_hidden_layers\": 24"));
  try {
    load_block_drafter(d2, *m_);
    ADD_FAILURE() << "a drafter for a 24-layer target loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("made for a target of 24 layers"), std::string::npos) << e.what();
  }
  // A tap past the target's layers.
  const size_t ids = cfg.find("\"aux_hidden_state_layer_ids\"");
  ASSERT_NE(ids, std::string::npos);
  std::string taps = cfg;
  taps.replace(ids, cfg.find(']', ids) - ids + 1, "\"aux_hidden_state_layer_ids\": [10, 20, 31]");
  spit(d2 + "/config.json", taps);
  try {
    load_block_drafter(d2, *m_);
    ADD_FAILURE() << "a tap past the last layer loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tap layer 30"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megakern
