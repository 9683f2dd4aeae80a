// Residual-stream taps (OpKind::Tap, add_taps, Engine taps) and the block
// drafters conditioned on them (spec/block_drafter.h): taps agree across
// executors and equal the stream the rest of the program reads; greedy
// speculative decoding with dspark / dflash equals plain decoding (also with
// drafts that get accepted, so the drafter's context skips rejected rows);
// weights round-trip through safetensors; loading names a bad tensor; the
// Markov bias matters exactly when W2 is nonzero.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/safetensors_writer.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "spec/block_drafter.h"
#include "spec/drafter.h"
#include "spec/speculative.h"
#include "test_util.h"

namespace megakern {
namespace {

std::vector<int> spread_layers(int n_layer) {
  if (n_layer == 1) return {0};
  return {0, n_layer / 2, n_layer - 1};
}

// Runs a 3-token prefix then a 4-row block of one sequence on `kind`, with
// taps; returns the block's taps (and logits).
std::vector<float> block_taps(const Model& m, const DecodeProgram& p, const std::string& kind, ThreadPool& pool,
                              std::vector<float>* logits_out = nullptr) {
  auto ex = make_executor(kind, p, pool);
  SequenceState seq = m.new_sequence(32);
  const std::vector<int32_t> prefix = {5, 17, 99}, block = {42, 7, 7, 13};
  std::vector<float> logits(static_cast<size_t>(m.n_vocab()) * 4), taps(static_cast<size_t>(p.tap_width) * 4, -1.f);
  std::vector<RowInput> rows;
  for (int i = 0; i < 3; ++i) rows.push_back(seq.row(prefix[static_cast<size_t>(i)], i));
  ex->step(rows, logits.data());  // no tap buffer: taps skipped
  rows.clear();
  for (int i = 0; i < 4; ++i) rows.push_back(seq.row(block[static_cast<size_t>(i)], 3 + i));
  ex->set_tap_output(taps.data());
  ex->step(rows, logits.data());
  if (logits_out) *logits_out = logits;
  return taps;
}

TEST(ExecTaps, OpByOpEqualsMegaAndReferenceOnEveryArchitecture) {
  ThreadPool pool(2);
  for (const char* name : {"dense-mini", "qwen3.8-mini", "kimi-k3-mini", "muse-spark-mini"}) {
    SCOPED_TRACE(name);
    auto m = load_model(name);
    const DecodeProgram plain = m->build_program(4);
    DecodeProgram p = plain;
    const auto layers = spread_layers(p.n_layer);
    const int H = add_taps(p, layers);
    EXPECT_EQ(p.tap_width, H * static_cast<int>(layers.size()));
    int n_tap_ops = 0;
    for (const Op& op : p.ops) n_tap_ops += op.kind == OpKind::Tap;
    EXPECT_EQ(n_tap_ops, static_cast<int>(layers.size()));
    EXPECT_EQ(plain.tap_width, 0);
    std::vector<float> l_ob, l_mega, l_ref, l_plain;
    const auto ob = block_taps(*m, p, "opbyop", pool, &l_ob);
    const auto mega = block_taps(*m, p, "mega", pool, &l_mega);
    const auto ref = block_taps(*m, p, "reference", pool, &l_ref);
    block_taps(*m, plain, "mega", pool, &l_plain);
    // Every tap column written.
    for (float x : mega) ASSERT_NE(x, -1.f);
    EXPECT_EQ(ob, mega);
    // Taps do not change the logits.
    EXPECT_EQ(l_mega, l_plain);
    EXPECT_EQ(l_ob, l_mega);
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      num += (ref[i] - mega[i]) * (ref[i] - mega[i]);
      den += ref[i] * ref[i];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-3);  // fast vs scalar kernels (quantised activations)
    // Tapping twice or out of range is refused.
    EXPECT_THROW(add_taps(p, {0}), Error);
    DecodeProgram q = plain;
    EXPECT_THROW(add_taps(q, {p.n_layer}), Error);
    EXPECT_THROW(add_taps(q, {0, 0}), Error);
  }
}

// The logits the program's final norm and head would compute from a
// stream vector.
std::vector<float> head_of(const DecodeProgram& p, const float* stream) {
  const Op* norm = nullptr;
  const Op* head = nullptr;
  for (const Op& op : p.ops) {
    if (op.kind == OpKind::MatMul && op.out == p.logits_slot) head = &op;
    if (op.kind == OpKind::RmsNorm && op.layer < 0) norm = &op;
  }
  EXPECT_TRUE(norm && head);
  const auto& nw = norm->as<ops::RmsNorm>();
  std::vector<float> xn(nw.weight.size()), out(static_cast<size_t>(p.n_vocab));
  rmsnorm(stream, nw.weight.data(), static_cast<int64_t>(nw.weight.size()), nw.eps, xn.data());
  matmul_rows(head->mat, xn.data(), 1, out.data(), p.n_vocab, 0, p.n_vocab);
  return out;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

// A tap after layer l is the stream a program ending at layer l feeds its
// final norm: the head applied to the tap gives that program's logits.
// (Kimi K3's taps are the raw block prefixes, not the mixture its head
// reads: test_dspark_published.cpp, KimiTapsAreTheRawRunningBlockPrefixes.)
TEST(ExecTaps, TapIsTheResidualStreamTheNextLayerReads) {
  ThreadPool pool(2);
  for (const char* name : {"dense-mini", "qwen3.8-mini"}) {
    SCOPED_TRACE(name);
    auto m = load_model(name);
    const DecodeProgram full = m->build_program(4);
    const int L = full.n_layer;
    // The last layer: against the full program's own logits.
    {
      DecodeProgram p = full;
      add_taps(p, {L - 1});
      std::vector<float> logits;
      const auto taps = block_taps(*m, p, "reference", pool, &logits);
      const size_t H = static_cast<size_t>(p.tap_width), V = static_cast<size_t>(m->n_vocab());
      for (size_t r = 0; r < 4; ++r) {
        const auto want = std::vector<float>(logits.begin() + static_cast<std::ptrdiff_t>(r * V),
                                             logits.begin() + static_cast<std::ptrdiff_t>((r + 1) * V));
        EXPECT_LT(rel_err(head_of(p, taps.data() + r * H), want), 2e-4) << "row " << r;
      }
    }
    // A middle layer: against the program with the layers after it removed.
    const int l = L / 2 - 1;
    std::vector<bool> keep(static_cast<size_t>(L), false);
    for (int j = 0; j <= l; ++j) keep[static_cast<size_t>(j)] = true;
    const DecodeProgram trunc = skip_layers(full, keep);
    DecodeProgram p = full;
    add_taps(p, {l});
    std::vector<float> trunc_logits;
    block_taps(*m, trunc, "reference", pool, &trunc_logits);
    const auto taps = block_taps(*m, p, "reference", pool);
    const size_t H = static_cast<size_t>(p.tap_width), V = static_cast<size_t>(m->n_vocab());
    for (size_t r = 0; r < 4; ++r) {
      const auto want = std::vector<float>(trunc_logits.begin() + static_cast<std::ptrdiff_t>(r * V),
                                           trunc_logits.begin() + static_cast<std::ptrdiff_t>((r + 1) * V));
      EXPECT_LT(rel_err(head_of(p, taps.data() + r * H), want), 2e-4) << "row " << r;
    }
  }
}

TEST(ExecTaps, EnginePrefillTapsMatchStepTaps) {
  auto m = load_model("dense-mini");
  ThreadPool pool(2);
  Engine eng(*m, pool, 4);
  {
    SequenceState s = m->new_sequence(8);
    std::vector<float> l(static_cast<size_t>(m->n_vocab())), t(64);
    EXPECT_THROW(eng.step({s.row(1, 0)}, l.data(), t.data()), Error);  // no taps enabled
  }
  eng.enable_taps({1, 3});
  eng.enable_taps({1, 3});                     // same layers: nothing to do
  EXPECT_THROW(eng.enable_taps({2}), Error);  // others: refused
  const std::vector<int32_t> toks = {3, 1, 4, 1, 5, 9, 2};
  const size_t W = static_cast<size_t>(eng.tap_width()), V = static_cast<size_t>(m->n_vocab());
  SequenceState a = m->new_sequence(16), b = m->new_sequence(16);
  std::vector<float> la(V), lb(V), ta(W * toks.size()), tb(W * toks.size());
  eng.prefill(a, toks.data(), static_cast<int>(toks.size()), 0, la.data(), ta.data());
  for (size_t i = 0; i < toks.size(); ++i) eng.step({b.row(toks[i], static_cast<int32_t>(i))}, lb.data(), tb.data() + i * W);
  EXPECT_EQ(ta, tb);
  EXPECT_EQ(la, lb);
}

// Wraps a block drafter: the drafter runs every round (so its context must be
// fed exactly up to the anchor), but the proposal is replaced by the true
// continuation for the first `good` tokens then a wrong one, `good` cycling
// 0..3, so drafts are accepted and rejected in every pattern.
class OracleWrapper final : public Drafter {
 public:
  OracleWrapper(BlockDrafter& inner, std::vector<int32_t> truth, int n_vocab)
      : inner_(inner), truth_(std::move(truth)), n_vocab_(n_vocab) {}
  std::string name() const override { return "oracle+" + inner_.name(); }
  void propose(const std::vector<int32_t>& context, int k, Draft& out) override {
    inner_.propose(context, k, out);  // throws if its context is out of step
    out.clear();
    const int good = round_++ % 4;
    for (int i = 0; i < k; ++i) {
      const size_t pos = context.size() + static_cast<size_t>(i);
      if (pos >= truth_.size()) break;
      out.tokens.push_back(i < good ? truth_[pos] : (truth_[pos] + 1) % n_vocab_);
    }
  }
  void reset() override {
    inner_.reset();
    round_ = 0;
  }
  const std::vector<int>& tap_layers() const override { return inner_.tap_layers(); }
  void observe_taps(const float* taps, int n_rows, int pos0) override { inner_.observe_taps(taps, n_rows, pos0); }

 private:
  BlockDrafter& inner_;
  std::vector<int32_t> truth_;
  int n_vocab_;
  int round_ = 0;
};

std::vector<std::vector<int32_t>> test_prompts(int n_vocab) {
  std::vector<int32_t> a;
  for (int i = 0; i < 20; ++i) a.push_back((i * 37 + 11) % n_vocab);
  return {a, {static_cast<int32_t>(7 % n_vocab)}, {1, 2, 3, 1, 2, 3, 1, 2}};
}

void expect_lossless_block(const Model& m, BlockDrafterKind kind, const std::string& executor) {
  ThreadPool pool(2);
  const int n_ctx = 96, n = 30, draft = 7;
  BlockDrafter d(m, synthetic_block_drafter(BlockDrafterConfig::mini(kind, m)), pool, n_ctx);
  SCOPED_TRACE(m.name() + " / " + d.name() + " / " + executor);
  Session plain(m, pool, n_ctx, executor);
  for (const auto& prompt : test_prompts(m.n_vocab())) {
    Sampler s({});
    const auto want = generate_plain(plain, s, prompt, n);
    // The drafter itself (random weights: mostly rejected), fixed and
    // adaptive length (which falls to single unverified probe drafts).
    for (bool adaptive : {false, true}) {
      Engine eng(m, pool, draft + 1, executor);
      SequenceState seq = m.new_sequence(n_ctx);
      SpecOptions o;
      o.draft = draft;
      o.adaptive = adaptive;
      SpeculativeGenerator gen(eng, seq, d, o);
      EXPECT_EQ(gen.generate(prompt, n), want);
      EXPECT_EQ(d.n_filled(), static_cast<int>(gen.tokens().size()) - 1);
    }
    // With accepted drafts.
    std::vector<int32_t> truth = prompt;
    truth.insert(truth.end(), want.begin(), want.end());
    OracleWrapper w(d, truth, m.n_vocab());
    Engine eng(m, pool, draft + 1, executor);
    SequenceState seq = m.new_sequence(n_ctx);
    SpecOptions o;
    o.draft = 4;
    o.adaptive = false;
    SpeculativeGenerator gen(eng, seq, w, o);
    EXPECT_EQ(gen.generate(prompt, n), want);
    EXPECT_GT(gen.stats().accepted, 0);
    EXPECT_LT(gen.stats().accepted, gen.stats().proposed);
    // The drafter's context (fed by verify rows, accepted ones only) equals
    // one fed by the prompt pass and then one-row steps over the generated
    // tokens (rows of a verify step equal one-row steps bit for bit): its
    // drafts agree.
    const auto& toks = gen.tokens();
    Engine ref(m, pool, 8, executor);
    ref.enable_taps(d.tap_layers());
    SequenceState s2 = m.new_sequence(n_ctx);
    const int N = static_cast<int>(toks.size()) - 1, P = static_cast<int>(prompt.size());
    const size_t W = static_cast<size_t>(ref.tap_width());
    std::vector<float> l(static_cast<size_t>(m.n_vocab())), taps(W * toks.size());
    ref.prefill(s2, toks.data(), P, 0, l.data(), taps.data());
    for (int i = P; i < N; ++i) ref.step({s2.row(toks[static_cast<size_t>(i)], i)}, l.data(), taps.data() + static_cast<size_t>(i) * W);
    BlockDrafter fresh(m, d.weights(), pool, n_ctx);
    fresh.observe_taps(taps.data(), N, 0);
    Draft a, b;
    d.propose(toks, 7, a);
    fresh.propose(toks, 7, b);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.tokens.size(), 7u);
  }
}

TEST(SpecBlockDrafter, GreedyLosslessDenseMini) {
  auto m = load_model("dense-mini");
  expect_lossless_block(*m, BlockDrafterKind::DSpark, "mega");
  expect_lossless_block(*m, BlockDrafterKind::DFlash, "mega");
  expect_lossless_block(*m, BlockDrafterKind::DSpark, "opbyop");
}

TEST(SpecBlockDrafter, GreedyLosslessRecurrentQwen38Mini) {
  auto m = load_model("qwen3.8-mini");
  expect_lossless_block(*m, BlockDrafterKind::DSpark, "mega");
  expect_lossless_block(*m, BlockDrafterKind::DFlash, "opbyop");
}

TEST(SpecBlockDrafter, GreedyLosslessKimiK3AndMuseSparkMini) {
  auto k = load_model("kimi-k3-mini");
  expect_lossless_block(*k, BlockDrafterKind::DSpark, "mega");
  expect_lossless_block(*k, BlockDrafterKind::DFlash, "mega");
  auto m = load_model("muse-spark-mini");
  expect_lossless_block(*m, BlockDrafterKind::DFlash, "mega");
}

// Taps of a few positions, as a target would give them (deterministic).
std::vector<float> fake_taps(const BlockDrafterConfig& c, int n) {
  std::vector<float> t(static_cast<size_t>(n) * static_cast<size_t>(c.n_taps() * c.target_hidden));
  for (size_t i = 0; i < t.size(); ++i) t[i] = std::sin(0.37f * static_cast<float>(i)) * 2.f;
  return t;
}

std::vector<int32_t> drafts_of(BlockDrafter& d, int n_ctx_fed = 9) {
  const auto taps = fake_taps(d.weights().config, n_ctx_fed);
  d.reset();
  d.observe_taps(taps.data(), n_ctx_fed, 0);
  std::vector<int32_t> ctx;
  for (int i = 0; i <= n_ctx_fed; ++i) ctx.push_back((i * 13 + 5) % d.weights().config.n_vocab);
  Draft out;
  d.propose(ctx, 7, out);
  return out.tokens;
}

TEST(SpecBlockDrafter, DraftsAreCausalWithinTheBlockAndNeedTheirContext) {
  auto m = load_model("dense-mini");
  ThreadPool pool(2);
  BlockDrafter d(*m, synthetic_block_drafter(BlockDrafterConfig::mini(BlockDrafterKind::DFlash, *m)), pool, 64);
  const auto all = drafts_of(d);
  ASSERT_EQ(all.size(), 7u);
  // A shorter proposal is a prefix of the longer one.
  Draft out;
  std::vector<int32_t> ctx;
  for (int i = 0; i <= 9; ++i) ctx.push_back((i * 13 + 5) % m->n_vocab());
  d.propose(ctx, 3, out);
  EXPECT_EQ(out.tokens, std::vector<int32_t>(all.begin(), all.begin() + 3));
  d.propose(ctx, 20, out);  // at most block - 1
  EXPECT_EQ(out.tokens, all);
  // The context decides the drafts: other taps, other drafts (somewhere).
  auto taps = fake_taps(d.weights().config, 9);
  for (auto& x : taps) x = -x;
  d.reset();
  d.observe_taps(taps.data(), 9, 0);
  d.propose(ctx, 7, out);
  EXPECT_NE(out.tokens, all);
  // Out of step with the context: refused.
  std::vector<int32_t> longer = ctx;
  longer.push_back(1);
  EXPECT_THROW(d.propose(longer, 3, out), Error);
  EXPECT_THROW(d.observe_taps(taps.data(), 1, 11), Error);  // a gap
}

TEST(SpecBlockDrafter, SafetensorsRoundTripGivesIdenticalDrafts) {
  auto m = load_model("dense-mini");
  ThreadPool pool(2);
  for (BlockDrafterKind kind : {BlockDrafterKind::DSpark, BlockDrafterKind::DFlash}) {
    SCOPED_TRACE(block_drafter_kind_name(kind));
    TempDir dir;
    const auto w = synthetic_block_drafter(BlockDrafterConfig::mini(kind, *m));
    save_block_drafter(w, dir.path);
    EXPECT_TRUE(std::filesystem::exists(dir.path + "/config.json"));
    BlockDrafter a(*m, w, pool, 64);
    BlockDrafter b(*m, load_block_drafter(dir.path, *m), pool, 64);
    BlockDrafter c(*m, load_block_drafter(dir.path + "/model.safetensors", *m), pool, 64);
    const auto da = drafts_of(a);
    EXPECT_EQ(drafts_of(b), da);
    EXPECT_EQ(drafts_of(c), da);
    EXPECT_EQ(b.weights().config.tap_layers, w.config.tap_layers);
    // Through make_drafter with a path.
    std::unique_ptr<Model> owned;
    auto d = make_drafter(std::string(block_drafter_kind_name(kind)) + ":" + dir.path, *m, pool, 64, {}, owned);
    EXPECT_EQ(d->name(), block_drafter_kind_name(kind));
    EXPECT_EQ(drafts_of(dynamic_cast<BlockDrafter&>(*d)), da);
    // Another seed gives other weights.
    BlockDrafterConfig c2 = w.config;
    c2.seed = 7;
    BlockDrafter e(*m, synthetic_block_drafter(c2), pool, 64);
    EXPECT_NE(e.weights().tap_proj, w.tap_proj);
    // The wrong kind for the name.
    EXPECT_THROW(make_drafter(std::string(kind == BlockDrafterKind::DSpark ? "dflash:" : "dspark:") + dir.path, *m, pool,
                              64, {}, owned),
                 Error);
  }
  // A drafter for another target is refused.
  auto q = load_model("qwen3.8-mini");
  const auto w = synthetic_block_drafter(BlockDrafterConfig::mini(BlockDrafterKind::DSpark, *q));
  if (q->n_vocab() != m->n_vocab()) EXPECT_THROW(BlockDrafter(*m, w, pool, 64), Error);
}

TEST(SpecBlockDrafter, LoadingNamesAMissingOrMisshapenTensor) {
  auto m = load_model("dense-mini");
  auto w = synthetic_block_drafter(BlockDrafterConfig::mini(BlockDrafterKind::DSpark, *m));
  auto write = [&](const std::string& dir, const std::string& drop, const std::string& reshape) {
    std::filesystem::create_directories(dir);
    SafetensorsWriter out;
    for (const auto& t : w.tensors()) {
      if (t.name == drop) continue;
      std::vector<int64_t> shape = t.shape;
      if (t.name == reshape) shape = {shape[0] * (shape.size() > 1 ? shape[1] : 1)};
      out.add_f32(t.name, shape, t.data->data());
    }
    out.write(dir + "/model.safetensors");
    write_file_atomic(dir + "/config.json", w.config.to_json());
  };
  TempDir d;
  write(d.path + "/ok", "", "");
  EXPECT_NO_THROW(load_block_drafter(d.path + "/ok", *m));
  write(d.path + "/missing", "layers.1.mlp.up_proj.weight", "");
  std::string e = thrown_message([&] { load_block_drafter(d.path + "/missing", *m); });
  EXPECT_NE(e.find("layers.1.mlp.up_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  write(d.path + "/shape", "", "markov_head.markov_w2.weight");
  e = thrown_message([&] { load_block_drafter(d.path + "/shape", *m); });
  EXPECT_NE(e.find("markov_head.markov_w2.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("shape"), std::string::npos) << e;
  // A bad config field is named too.
  write_file_atomic(d.path + "/ok/config.json", "{\"drafter\": \"dflash\"}");
  e = thrown_message([&] { load_block_drafter(d.path + "/ok", *m); });
  EXPECT_NE(e.find("target_hidden"), std::string::npos) << e;
  write_file_atomic(d.path + "/ok/config.json", "{\"transformer_layer_config\": {\"hidden_size\": 256}}");
  e = thrown_message([&] { load_block_drafter(d.path + "/ok", *m); });
  EXPECT_NE(e.find("num_hidden_layers"), std::string::npos) << e;
  e = thrown_message([&] { load_block_drafter(d.path + "/nowhere", *m); });
  EXPECT_NE(e.find("nowhere"), std::string::npos) << e;
}

TEST(SpecBlockDrafter, MarkovBiasMattersExactlyWhenW2IsNonzero) {
  auto m = load_model("dense-mini");
  ThreadPool pool(2);
  const auto w = synthetic_block_drafter(BlockDrafterConfig::mini(BlockDrafterKind::DSpark, *m));
  auto zero_w2 = w;
  std::fill(zero_w2.markov_w2.begin(), zero_w2.markov_w2.end(), 0.f);
  auto zero_w2_other_w1 = zero_w2;
  for (auto& x : zero_w2_other_w1.markov_w1) x = -3.f * x + 0.5f;
  auto other_w1 = w;
  other_w1.markov_w1 = zero_w2_other_w1.markov_w1;
  BlockDrafter with(*m, w, pool, 64), without(*m, zero_w2, pool, 64), without2(*m, zero_w2_other_w1, pool, 64),
      with2(*m, other_w1, pool, 64);
  // W2 = 0: W1 is irrelevant.
  const auto base = drafts_of(without);
  EXPECT_EQ(drafts_of(without2), base);
  // W2 != 0: the bias changes the drafts, and W1 then matters.
  const auto biased = drafts_of(with);
  EXPECT_NE(biased, base);
  EXPECT_NE(drafts_of(with2), biased);
}


TEST(SpecCli, BlockDraftersRunGenerateAndBench) {
  const std::string base = "run -m dense-mini --raw -n 30 -t 2 -p 'abcabcabcabc hello abcabc'";
  const CliResult plain = run_cli(base);
  ASSERT_EQ(plain.status, 0) << plain.err;
  TempDir dir;
  const CliResult g = run_cli("gen-drafter -m dense-mini --kind dflash -o " + dir.path + "/dflash");
  ASSERT_EQ(g.status, 0) << g.err;
  EXPECT_TRUE(std::filesystem::exists(dir.path + "/dflash/model.safetensors"));
  for (const std::string& spec : std::vector<std::string>{"dspark", "dflash", "dflash:" + dir.path + "/dflash"}) {
    const CliResult r = run_cli(base + " --spec " + spec + " --draft 7");
    ASSERT_EQ(r.status, 0) << spec << ": " << r.err;
    EXPECT_EQ(r.out, plain.out) << spec;
    EXPECT_NE(r.err.find("acceptance length"), std::string::npos) << r.err;
  }
  const CliResult bad = run_cli(base + " --spec dspark:" + dir.path + "/dflash");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("drafter 'dspark:" + dir.path + "/dflash': " + dir.path + "/dflash holds a dflash drafter"),
            std::string::npos)
      << bad.err;
  const CliResult b = run_cli("bench-spec -m dense-mini --drafters dspark,dflash -n 16 -t 2 --verify-reps 2");
  ASSERT_EQ(b.status, 0) << b.err << b.out;
  for (const char* want : {"dspark", "dflash", "accept len", "identical"})
    EXPECT_NE(b.out.find(want), std::string::npos) << want << "\n" << b.out;
  EXPECT_EQ(b.out.find(" NO"), std::string::npos) << b.out;
}

}  // namespace
}  // namespace megakern
