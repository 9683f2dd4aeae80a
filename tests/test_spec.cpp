// Speculative decoding: greedy output identical to plain decoding for every
// drafter and model (attention and recurrent), the sampling output
// distribution equal to plain sampling (chi-square against the exact
// distribution, and shown to catch a biased acceptance rule), drafters, and
// errors on bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "spec/drafter.h"
#include "spec/speculative.h"
#include "test_util.h"
#include "tiny_model.h"

namespace megakern {
namespace {

struct TempFile {
  std::string path;
  explicit TempFile(const std::vector<uint8_t>& bytes) {
    char tmpl[] = "/tmp/megakern-spec-XXXXXX";
    const int fd = mkstemp(tmpl);
    close(fd);
    path = std::string(tmpl) + ".gguf";
    std::filesystem::rename(tmpl, path);
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                static_cast<std::streamsize>(bytes.size()));
  }
  ~TempFile() { std::filesystem::remove(path); }
};

// Prompts with repeated spans (so prompt lookup finds matches) and without.
std::vector<std::vector<int32_t>> prompts_for(int n_vocab) {
  std::vector<std::vector<int32_t>> ps;
  std::vector<int32_t> a;
  for (int i = 0; i < 24; ++i) a.push_back((i * 37 + 11) % n_vocab);
  std::vector<int32_t> rep = a;
  rep.insert(rep.end(), a.begin(), a.begin() + 16);
  ps.push_back(rep);
  std::vector<int32_t> b;
  for (int i = 0; i < 30; ++i) b.push_back((i % 5) * 3 + 40);
  ps.push_back(b);
  ps.push_back({static_cast<int32_t>(7 % n_vocab)});
  const std::string text = "the cat sat on the mat. the cat sat on the ";
  std::vector<int32_t> t;
  for (char c : text) t.push_back(static_cast<uint8_t>(c) % n_vocab);
  ps.push_back(t);
  return ps;
}

struct Drafters {
  std::vector<std::unique_ptr<Drafter>> list;
};

// Greedy speculative output equals plain greedy output for each prompt,
// several lengths (inside one round, crossing round boundaries), and a small
// context that generation runs into.
// engine_rows: rows per step of the target's engine (0: draft + 1, a verify
// in one step; recurrent models also verify row by row on a 1-row engine).
void expect_lossless(const Model& m, Drafter& d, int draft, bool adaptive, const std::string& executor = "mega",
                     int engine_rows = 0) {
  ThreadPool pool(2);
  SCOPED_TRACE(m.name() + " / " + d.name() + " / k=" + std::to_string(draft) + (adaptive ? " adaptive" : " fixed") +
               " / " + executor + " / engine rows " + std::to_string(engine_rows));
  for (int n_ctx : {256, 48}) {
    Session plain(m, pool, n_ctx, executor);
    Engine eng(m, pool, engine_rows > 0 ? engine_rows : draft + 1, executor);
    SequenceState seq = m.new_sequence(n_ctx);
    SpecOptions o;
    o.draft = draft;
    o.adaptive = adaptive;
    SpeculativeGenerator gen(eng, seq, d, o);
    for (const auto& prompt : prompts_for(m.n_vocab())) {
      for (int n : {1, 5, 13, 40}) {
        SCOPED_TRACE("n_ctx " + std::to_string(n_ctx) + " prompt " + std::to_string(prompt.size()) + " n " +
                     std::to_string(n));
        Sampler s({});
        const auto want = generate_plain(plain, s, prompt, n);
        const auto got = gen.generate(prompt, n);
        ASSERT_EQ(got, want);
      }
    }
  }
}

TEST(SpecNgram, ProposesTheContinuationOfTheLongestRecentMatch) {
  NgramDrafter d(3, 1);
  Draft out;
  // ... 1 2 3 [9 8] ... 1 2 3 [5 6 7] 1 2 3: the 3-gram "1 2 3" last occurred
  // followed by 5 6 7.
  d.propose({1, 2, 3, 9, 8, 1, 2, 3, 5, 6, 7, 1, 2, 3}, 2, out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(out.dists.empty());
  EXPECT_EQ(out.match, 3);
  // Past the end of the context the copy reads the proposal itself: the text
  // repeats with the period of the match (5 6 7 1 2 3).
  d.propose({1, 2, 3, 9, 8, 1, 2, 3, 5, 6, 7, 1, 2, 3}, 10, out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{5, 6, 7, 1, 2, 3, 5, 6, 7, 1}));
  // Only a 1-gram matches: 4 ... 4.
  d.propose({4, 10, 11, 12, 4}, 3, out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{10, 11, 12}));
  d.propose({1, 2, 3}, 3, out);
  EXPECT_TRUE(out.tokens.empty());
  d.propose({5}, 3, out);
  EXPECT_TRUE(out.tokens.empty());
  NgramDrafter two(2, 2);
  two.propose({4, 10, 11, 12, 4}, 3, out);  // no 2-gram match, 1-grams not tried
  EXPECT_TRUE(out.tokens.empty());
  EXPECT_THROW(NgramDrafter(2, 0), Error);
  EXPECT_THROW(NgramDrafter(1, 2), Error);
  EXPECT_THROW(NgramDrafter(65, 1), Error);
}

// The grade counts the agreement back past max_n; a short period repeats.
TEST(SpecNgram, GradesByTheWholeMatchAndRepeatsAShortPeriod) {
  NgramDrafter d(2, 1);
  Draft out;
  // 7 8 9 1 2 3 [4] ... 0 8 9 1 2 3: the 2-gram "2 3" matches, and the
  // agreement goes back over "8 9 1 2 3" (5 tokens), stopping at 7 != 0.
  d.propose({7, 8, 9, 1, 2, 3, 4, 5, 0, 8, 9, 1, 2, 3}, 3, out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{4, 5, 0}));
  EXPECT_EQ(out.match, 5);
  // A run of one token: the match is the whole run but one, the copy goes on.
  d.propose({3, 6, 6, 6, 6}, 5, out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{6, 6, 6, 6, 6}));
  EXPECT_EQ(out.match, 3);
  // The agreement is capped.
  std::vector<int32_t> longrep;
  for (int i = 0; i < 3 * Draft::kMaxMatch; ++i) longrep.push_back(i % 11);
  d.propose(longrep, 4, out);
  EXPECT_EQ(out.match, Draft::kMaxMatch);
  std::vector<int32_t> next4;
  for (size_t i = 0; i < 4; ++i) next4.push_back(static_cast<int32_t>((longrep.size() + i) % 11));
  EXPECT_EQ(out.tokens, next4);
  // No match: no grade.
  d.propose({1, 2, 3}, 3, out);
  EXPECT_TRUE(out.tokens.empty());
  EXPECT_EQ(out.match, 0);
}

// The plain definition of what NgramDrafter proposes: the longest suffix of
// n = max_n..min_n tokens found earlier, its most recent occurrence (for a
// max_n suffix: of its last 8 occurrences, the one agreeing furthest back
// with the context's end), the continuation copied on (periodically) to k
// tokens.
Draft ngram_by_search(const std::vector<int32_t>& c, int max_n, int min_n, int k) {
  Draft out;
  const int L = static_cast<int>(c.size());
  auto agreement = [&](int p, int n) {
    int match = n;
    while (match < Draft::kMaxMatch && p - match >= 0 && c[static_cast<size_t>(p - match)] == c[static_cast<size_t>(L - 1 - match)])
      ++match;
    return match;
  };
  for (int n = std::min(max_n, L - 1); n >= min_n; --n) {
    // Occurrences of the n-token suffix, most recent first; a full-length
    // (max_n) suffix takes the one of its last 8 that agrees furthest back.
    int best = -1, best_match = 0, seen = 0;
    for (int p = L - 2; p >= n - 1; --p) {
      if (!std::equal(c.end() - n, c.end(), c.begin() + (p - n + 1))) continue;
      const int match = agreement(p, n);
      if (match > best_match) best = p, best_match = match;
      if (n < max_n || ++seen == 8) break;
    }
    if (best < 0) continue;
    out.match = best_match;
    std::vector<int32_t> ext = c;
    for (int i = 0; i < k; ++i) ext.push_back(ext[static_cast<size_t>(best + 1 + i)]);
    out.tokens.assign(ext.begin() + L, ext.end());
    return out;
  }
  return out;
}

// Of several occurrences of the last max_n tokens, the proposal follows the
// one whose preceding text agrees longest with the context's, not simply the
// most recent: here "5 1 2 3" earlier and "9 1 2 3" later, context ending "5
// 1 2 3".
TEST(SpecNgram, FollowsTheOccurrenceThatAgreesFurthestBack) {
  NgramDrafter d(3, 1);
  Draft out;
  d.propose({5, 1, 2, 3, 40, 41, 9, 1, 2, 3, 50, 51, 7, 5, 1, 2, 3}, 2, out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{40, 41}));
  EXPECT_EQ(out.match, 4);
  // Equal agreement: the most recent.
  d.propose({8, 1, 2, 3, 40, 41, 9, 1, 2, 3, 50, 51, 7, 6, 1, 2, 3}, 2, out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{50, 51}));
  EXPECT_EQ(out.match, 3);
}

// The incremental index proposes what a search of the whole context would,
// on contexts that grow a few tokens at a time (as generation extends them),
// and on contexts that are not continuations of the previous one.
TEST(SpecNgram, IncrementalIndexEqualsASearchOfTheContext) {
  std::mt19937_64 rng(5);
  for (auto [max_n, min_n] : {std::pair{3, 1}, std::pair{6, 2}, std::pair{1, 1}}) {
    NgramDrafter d(max_n, min_n);
    for (int seqno = 0; seqno < 30; ++seqno) {
      // Small alphabets repeat often; a few copied spans make long matches.
      const int alphabet = 2 + static_cast<int>(rng() % 12);
      std::vector<int32_t> c;
      const int len = 1 + static_cast<int>(rng() % 120);
      for (int i = 0; i < len; ++i) {
        if (c.size() > 8 && rng() % 10 == 0) {
          const size_t from = rng() % (c.size() - 4), n = 1 + rng() % 6;
          for (size_t j = 0; j < n && from + j < c.size(); ++j) c.push_back(c[from + j]);
        } else {
          c.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(alphabet)));
        }
      }
      // Propose along growing prefixes of c (some steps of several tokens),
      // as generation would, sometimes jumping back (a new prompt).
      for (size_t L = 1; L <= c.size(); L += 1 + rng() % 3) {
        const std::vector<int32_t> ctx(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(L));
        const int k = 1 + static_cast<int>(rng() % 9);
        Draft got;
        d.propose(ctx, k, got);
        const Draft want = ngram_by_search(ctx, max_n, min_n, k);
        ASSERT_EQ(got.tokens, want.tokens) << "n " << max_n << ".." << min_n << " seq " << seqno << " L " << L;
        ASSERT_EQ(got.match, want.match) << "n " << max_n << ".." << min_n << " seq " << seqno << " L " << L;
      }
      // The same length with one token changed inside: not a continuation.
      if (c.size() > 4) {
        std::vector<int32_t> changed = c;
        changed[c.size() / 2] = static_cast<int32_t>(alphabet + 1);
        Draft got;
        d.propose(changed, 4, got);
        const Draft want = ngram_by_search(changed, max_n, min_n, 4);
        ASSERT_EQ(got.tokens, want.tokens) << "changed context, seq " << seqno;
        ASSERT_EQ(got.match, want.match) << "changed context, seq " << seqno;
      }
    }
  }
}

TEST(SpecSkipLayers, KeepsOnlyTheChosenLayers) {
  auto m = load_model("dense-mini");
  const DecodeProgram full = m->build_program(4);
  const auto keep = first_and_last_layers(full.n_layer, 2);
  EXPECT_EQ(keep, (std::vector<bool>{true, false, false, true}));
  const DecodeProgram p = skip_layers(full, keep);
  for (const Op& op : p.ops) EXPECT_TRUE(op.layer < 0 || op.layer == 0 || op.layer == 3) << op.name;
  EXPECT_LT(p.ops.size(), full.ops.size());
  EXPECT_LT(p.weight_bytes(), full.weight_bytes());
  EXPECT_EQ(skip_layers(full, std::vector<bool>(4, true)).ops.size(), full.ops.size());
  EXPECT_THROW(skip_layers(full, std::vector<bool>(4, false)), Error);
  EXPECT_THROW(skip_layers(full, std::vector<bool>(3, true)), Error);
  EXPECT_THROW(first_and_last_layers(4, 5), Error);
  // Skipping changes the output (it is a different, cheaper model).
  ThreadPool pool(2);
  auto a = make_executor("reference", full, pool);
  auto b = make_executor("reference", p, pool);
  SequenceState s1 = m->new_sequence(8), s2 = m->new_sequence(8);
  std::vector<float> l1(static_cast<size_t>(m->n_vocab())), l2(l1.size());
  a->step({s1.row(5, 0)}, l1.data());
  b->step({s2.row(5, 0)}, l2.data());
  EXPECT_NE(l1, l2);
}

TEST(SpecLossless, DenseMiniEveryDrafter) {
  auto m = load_model("dense-mini");
  ThreadPool pool(2);
  TinySpec ts;
  ts.arch = "qwen3";
  ts.n_vocab = m->n_vocab();
  TempFile draft_file(tiny_model(ts, 3));
  auto draft_model = load_model(draft_file.path);
  NgramDrafter ngram;
  ModelDrafter self(*m, first_and_last_layers(4, 2), pool, 256, {});
  ModelDrafter other(*draft_model, m->n_vocab(), pool, 256, {});
  ModelDrafter same(*m, m->n_vocab(), pool, 256, {});  // accepts everything
  for (Drafter* d : std::vector<Drafter*>{&ngram, &self, &other, &same})
  {
    expect_lossless(*m, *d, 1, false);
    expect_lossless(*m, *d, 5, true);
  }
  expect_lossless(*m, ngram, 7, false, "opbyop");
}

TEST(SpecLossless, RecurrentQwen38MiniEveryDrafter) {
  auto m = load_model("qwen3.8-mini");
  ModelOptions mo;
  mo.seed = 2;
  auto other_model = load_model("qwen3.8-mini", mo);  // different weights, same vocabulary
  ThreadPool pool(2);
  NgramDrafter ngram;
  ModelDrafter self(*m, first_and_last_layers(4, 2), pool, 256, {});
  ModelDrafter other(*other_model, m->n_vocab(), pool, 256, {});
  ModelDrafter same(*m, m->n_vocab(), pool, 256, {});
  // One-step verify (recurrent rows chained through state snapshots).
  for (Drafter* d : std::vector<Drafter*>{&ngram, &self, &other, &same}) expect_lossless(*m, *d, 3, false);
  expect_lossless(*m, same, 6, true, "opbyop");
  // Row-by-row verify on a one-row engine.
  expect_lossless(*m, other, 4, false, "mega", 1);
}

// The fast numerics mode keeps greedy speculation lossless: a row's logits
// do not depend on the rows verified with it in that mode either.
TEST(SpecLossless, FastNumericsDenseAndRecurrent) {
  ModelOptions mo;
  mo.numerics = Numerics::Fast;
  auto dense = load_model("dense-mini", mo);
  mo.weights = DType::Q8_0;
  auto rec = load_model("qwen3.8-mini", mo);
  ThreadPool pool(2);
  NgramDrafter ngram;
  ModelDrafter self(*dense, first_and_last_layers(4, 2), pool, 256, {});
  ModelDrafter same(*rec, rec->n_vocab(), pool, 256, {});
  expect_lossless(*dense, ngram, 5, true);
  expect_lossless(*dense, self, 3, false, "opbyop");
  // A recurrent prompt is computed in blocks of the engine's rows with the
  // chunked delta rule, which equals the per-token form only within its
  // tolerance; 8-bit activations can turn such a last-bit difference into a
  // different token, so both sides prefill in blocks of the same size (8).
  expect_lossless(*rec, same, 4, false, "mega", 8);
  expect_lossless(*rec, ngram, 3, true, "opbyop", 8);
}

// Rows of one sequence chained through per-row state snapshots give, on
// every executor, the logits and states of the same tokens run one per step.
TEST(SpecRecurrentChain, OneStepEqualsStepByStepOnEveryExecutor) {
  auto m = load_model("qwen3.8-mini");
  ThreadPool pool(2);
  const std::vector<int32_t> prefix = {5, 17, 99, 3}, block = {42, 7, 7, 200, 13, 1};
  const int B = static_cast<int>(block.size());
  const size_t V = static_cast<size_t>(m->n_vocab());
  std::vector<float> opbyop_logits;
  for (const char* ex : {"reference", "opbyop", "mega"}) {
    SCOPED_TRACE(ex);
    Engine one(*m, pool, 1, ex), many(*m, pool, 8, ex);
    SequenceState a = m->new_sequence(32), b = m->new_sequence(32);
    std::vector<float> l(V), want(V * B), got(V * B);
    one.prefill(a, prefix.data(), 4, 0, l.data());
    one.prefill(b, prefix.data(), 4, 0, l.data());
    std::vector<RecurrentState> want_states;
    for (int i = 0; i < B; ++i) {
      one.step({a.row(block[static_cast<size_t>(i)], 4 + i)}, want.data() + V * i);
      want_states.push_back(a.state);
    }
    std::vector<RecurrentState> snaps(static_cast<size_t>(B - 1), b.state);
    std::vector<RowInput> rows;
    for (int i = 0; i < B; ++i) {
      RowInput r = b.row(block[static_cast<size_t>(i)], 4 + i);
      if (i > 0) {
        r.state = &snaps[static_cast<size_t>(i - 1)];
        r.state_in = rows.back().state;
      }
      rows.push_back(r);
    }
    many.step(rows, got.data());
    EXPECT_EQ(got, want);
    EXPECT_EQ(b.state.S, want_states[0].S);
    EXPECT_EQ(b.state.conv, want_states[0].conv);
    for (int i = 1; i < B; ++i) {
      EXPECT_EQ(snaps[static_cast<size_t>(i - 1)].S, want_states[static_cast<size_t>(i)].S) << i;
      EXPECT_EQ(snaps[static_cast<size_t>(i - 1)].conv, want_states[static_cast<size_t>(i)].conv) << i;
    }
    if (std::string(ex) == "opbyop") opbyop_logits = got;
    if (std::string(ex) == "mega") EXPECT_EQ(got, opbyop_logits);
    // Unchained rows of one sequence, or two rows writing one state, are refused.
    std::vector<RowInput> bad = rows;
    bad[2].state_in = nullptr;
    EXPECT_THROW(many.step(bad, got.data()), Error);
    bad = rows;
    bad[3].state = bad[1].state;
    EXPECT_THROW(many.step(bad, got.data()), Error);
    bad = rows;
    bad[3].state_in = bad[1].state;
    EXPECT_THROW(many.step(bad, got.data()), Error);
  }
}

TEST(SpecLossless, SmolLM2EveryDrafter) {
  const std::string path = test_model_path("smollm2-135m");
  if (path.empty()) GTEST_SKIP() << "models/smollm2-135m.gguf not fetched";
  auto m = load_model(path);
  auto again = load_model(path);
  ThreadPool pool(2);
  const std::string text =
      "Rewrite this text: The quick brown fox jumps over the lazy dog. The quick brown fox is quick.";
  const auto prompt = m->tokenizer().encode(text, m->tokenizer().add_bos_default(), false);
  NgramDrafter ngram;
  ModelDrafter self(*m, first_and_last_layers(30, 15), pool, 512, {});
  ModelDrafter same(*again, m->n_vocab(), pool, 512, {});
  for (Drafter* d : std::vector<Drafter*>{&ngram, &self, &same}) {
    SCOPED_TRACE(d->name());
    Session plain(*m, pool, 512);
    Engine eng(*m, pool, 8);
    SequenceState seq = m->new_sequence(512);
    SpecOptions o;
    o.draft = 7;
    SpeculativeGenerator gen(eng, seq, *d, o);
    Sampler s({});
    EXPECT_EQ(gen.generate(prompt, 40), generate_plain(plain, s, prompt, 40));
    EXPECT_GT(gen.stats().rounds, 0);
    EXPECT_LE(gen.stats().rounds, 40);
  }
}

// A graded drafter with a script: the target's own greedy continuation of
// the prompt (every draft passes), or each of its tokens plus one (no draft
// ever passes). Its grade is fixed.
class ScriptDrafter final : public Drafter {
 public:
  ScriptDrafter(std::vector<int32_t> script, size_t n_prompt, bool wrong, int n_vocab)
      : script_(std::move(script)), n_prompt_(n_prompt), wrong_(wrong), n_vocab_(n_vocab) {}
  std::string name() const override { return wrong_ ? "always wrong" : "always right"; }
  bool grades_drafts() const override { return true; }
  void propose(const std::vector<int32_t>& context, int k, Draft& out) override {
    out.clear();
    // context: the prompt and g generated tokens; the next is script_[g].
    const size_t g = context.size() - n_prompt_;
    for (size_t j = g; j < g + static_cast<size_t>(k) && j < script_.size(); ++j)
      out.tokens.push_back(wrong_ ? (script_[j] + 1) % n_vocab_ : script_[j]);
    out.match = 8;
    ++proposals;
  }
  int proposals = 0;

 private:
  std::vector<int32_t> script_;
  size_t n_prompt_;
  bool wrong_;
  int n_vocab_;
};

// The adaptive length of graded drafts: drafts that never pass are soon not
// verified at all (plain steps, the drafts still judged for free), drafts
// that always pass are verified at the full length; the output is plain
// decoding's either way. Verify costs are given, so the choices are
// reproducible.
TEST(SpecGraded, VerifiesWhatPaysAndFallsBackToPlainSteps) {
  auto m = load_model("dense-mini");
  ThreadPool pool(2);
  const int n = 80;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 12; ++i) prompt.push_back((i * 29 + 5) % m->n_vocab());
  Session plain(*m, pool, 256);
  Sampler s({});
  const auto want = generate_plain(plain, s, prompt, n);
  ASSERT_EQ(static_cast<int>(want.size()), n);
  SpecOptions o;
  o.draft = 5;
  o.row_cost = {1.0, 1.26, 1.45, 1.71, 1.9, 2.1};
  for (bool wrong : {true, false}) {
    ScriptDrafter d(want, prompt.size(), wrong, m->n_vocab());
    Engine eng(*m, pool, o.draft + 1);
    SequenceState seq = m->new_sequence(256);
    SpeculativeGenerator gen(eng, seq, d, o);
    EXPECT_EQ(gen.generate(prompt, n), want) << d.name();
    const SpecStats& st = gen.stats();
    std::printf("%s: %lld rounds, %lld plain; %lld drafted, %lld verified, %lld accepted\n", d.name().c_str(),
                static_cast<long long>(st.rounds), static_cast<long long>(st.plain_rounds),
                static_cast<long long>(st.drafted), static_cast<long long>(st.proposed),
                static_cast<long long>(st.accepted));
    // Drafted every round, verified or not (but the last, which may emit only one token).
    EXPECT_GE(d.proposals, st.rounds - 1) << d.name();
    if (wrong) {
      EXPECT_EQ(st.accepted, 0);
      EXPECT_LE(st.proposed, 6);  // a few tries, then plain steps
      EXPECT_GE(st.plain_rounds, st.rounds - 4);
      EXPECT_GT(st.drafted, 5 * st.proposed);
    } else {
      EXPECT_EQ(st.accepted, st.proposed);
      EXPECT_GE(st.mean_accept(), 5.0);  // of at most 6 a round
      EXPECT_LE(st.plain_rounds, 1);
    }
  }
  // Given costs must fit the draft length and be positive.
  Engine eng(*m, pool, 6);
  SequenceState seq = m->new_sequence(64);
  NgramDrafter ngram;
  o.row_cost = {1.0, 1.2};
  EXPECT_THROW(SpeculativeGenerator(eng, seq, ngram, o), Error);
  o.row_cost = {1.0, 1.26, 1.45, 0.0, 1.9, 2.1};
  EXPECT_THROW(SpeculativeGenerator(eng, seq, ngram, o), Error);
}

// The exact probability of every sequence of n_tok tokens after `prompt`
// under plain sampling, by enumerating the (top-k limited) tree.
std::map<std::vector<int32_t>, double> exact_joint(const Model& m, ThreadPool& pool, const SamplingParams& sp,
                                                   const std::vector<int32_t>& prompt, int n_tok) {
  Session s(m, pool, 128, "reference");
  Sampler sampler(sp);
  std::map<std::vector<int32_t>, double> out;
  std::function<void(std::vector<int32_t>&, int, double)> rec = [&](std::vector<int32_t>& seq, int depth, double pr) {
    if (depth == n_tok) {
      out[std::vector<int32_t>(seq.end() - n_tok, seq.end())] += pr;
      return;
    }
    s.set_tokens(seq);
    const auto dist = sampler.distribution(s.logits().data(), m.n_vocab());
    for (const auto& [id, p] : dist) {
      seq.push_back(id);
      rec(seq, depth + 1, pr * p);
      seq.pop_back();
    }
  };
  std::vector<int32_t> seq = prompt;
  rec(seq, 0, 1.0);
  return out;
}

// Pearson's chi-square of observed counts against expected probabilities,
// cells with an expected count under 5 pooled; returns (statistic, bound),
// the bound the 1e-4 upper quantile (Wilson-Hilferty) of its degrees of freedom.
std::pair<double, double> chi_square(const std::map<std::vector<int32_t>, double>& expect,
                                     const std::map<std::vector<int32_t>, int>& seen, int n) {
  double stat = 0, pool_e = 0, pool_o = 0;
  int cells = 0;
  for (const auto& [key, p] : expect) {
    const double e = p * n;
    const auto it = seen.find(key);
    const double o = it == seen.end() ? 0 : it->second;
    if (e < 5) {
      pool_e += e;
      pool_o += o;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++cells;
  }
  // Anything seen that the exact tree gives no mass would be an outright error.
  for (const auto& [key, c] : seen)
    if (!expect.count(key)) pool_o += c;
  if (pool_e > 0) {
    stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
    ++cells;
  } else if (pool_o > 0) {
    stat = INFINITY;
  }
  const double dof = std::max(1, cells - 1), z = 3.719;
  const double h = 2.0 / (9.0 * dof);
  return {stat, dof * std::pow(1 - h + z * std::sqrt(h), 3)};
}

struct SamplingCase {
  std::map<std::vector<int32_t>, int> counts;
  SpecStats stats;
};

// graded: the adaptive length (for graded drafters, the graded choice) of
// one generator over all runs (reseeded for each), so that a run's choices
// depend on the acceptance earlier runs saw; the costs make one verified
// draft pay off only at an acceptance rate above about 0.33.
SamplingCase run_sampling(const Model& target, Drafter& d, const SamplingParams& sp,
                          const std::vector<int32_t>& prompt, int n_tok, int runs, const AcceptRule& rule = {},
                          bool graded = false) {
  ThreadPool pool(1);
  Engine eng(target, pool, 4, "reference");
  SequenceState seq = target.new_sequence(128);
  SamplingCase c;
  SpecOptions o;
  o.draft = 3;
  o.adaptive = graded;
  if (graded) o.row_cost = {1.0, 1.27, 1.5, 1.7};
  o.sampling = sp;
  std::unique_ptr<SpeculativeGenerator> kept;
  for (int r = 0; r < runs; ++r) {
    o.sampling.seed = 1000 + static_cast<uint64_t>(r);
    std::unique_ptr<SpeculativeGenerator> fresh;
    if (!graded || !kept) {
      fresh = std::make_unique<SpeculativeGenerator>(eng, seq, d, o);
      if (rule) fresh->set_accept_rule(rule);
    }
    if (graded && !kept) kept = std::move(fresh);
    SpeculativeGenerator& gen = graded ? *kept : *fresh;
    gen.set_seed(o.sampling.seed);
    gen.reset_stats();
    const auto toks = gen.generate(prompt, n_tok);
    EXPECT_EQ(static_cast<int>(toks.size()), n_tok);
    ++c.counts[toks];
    c.stats.rounds += gen.stats().rounds;
    c.stats.proposed += gen.stats().proposed;
    c.stats.accepted += gen.stats().accepted;
    c.stats.plain_rounds += gen.stats().plain_rounds;
    c.stats.drafted += gen.stats().drafted;
  }
  return c;
}

// On rejection, draws from p itself instead of the residual: biased towards
// the drafts, the classic mistake.
bool accept_then_resample_from_p(const TokenDist& p, const TokenDist* q, int32_t d, std::mt19937_64& rng,
                                 int32_t& resampled) {
  if (accept_exact(p, q, d, rng, resampled)) return true;
  resampled = draw(p, uniform01(rng));
  return false;
}

// base, the target's greedy continuation of it, base again: prompt lookup
// then proposes that continuation, which the target finds plausible but not
// certain.
std::vector<int32_t> repeating_prompt(const Model& target, ThreadPool& pool, const std::vector<int32_t>& base) {
  std::vector<int32_t> prompt = base;
  Session s(target, pool, 64, "reference");
  Sampler g({});
  const auto c = generate_plain(s, g, base, 4);
  prompt.insert(prompt.end(), c.begin(), c.end());
  prompt.insert(prompt.end(), base.begin(), base.end());
  return prompt;
}

// Speculative sampling with drafter d reproduces the exact distribution
// `expect` of the first n_tok tokens (chi-square over `runs` seeds), with
// drafts both accepted and rejected, while the same test rejects resampling
// from p on rejection and, with accept_all_check, accepting every draft.
void expect_exact_sampling(const Model& target, Drafter& d, const SamplingParams& sp,
                           const std::vector<int32_t>& prompt, int n_tok, int runs,
                           const std::map<std::vector<int32_t>, double>& expect, bool accept_all_check,
                           bool graded = false) {
  SCOPED_TRACE(d.name() + (graded ? " graded" : ""));
  const auto ok = run_sampling(target, d, sp, prompt, n_tok, runs, {}, graded);
  EXPECT_GT(ok.stats.accepted, runs / 10);
  EXPECT_LT(ok.stats.accepted, ok.stats.proposed);
  const auto [stat, bound] = chi_square(expect, ok.counts, runs);
  std::printf("%s%s: accepted %lld of %lld drafts (%lld drafted); chi-square %.1f (bound %.1f)\n",
              d.name().c_str(), graded ? " (graded)" : "", static_cast<long long>(ok.stats.accepted),
              static_cast<long long>(ok.stats.proposed), static_cast<long long>(ok.stats.drafted), stat, bound);
  // The graded choice both verified drafts and left drafts unverified.
  if (graded) EXPECT_GT(ok.stats.drafted - ok.stats.proposed, runs / 20);
  EXPECT_LT(stat, bound) << "speculative sampling differs from plain sampling";
  const auto bad = run_sampling(target, d, sp, prompt, n_tok, runs, accept_then_resample_from_p, graded);
  const auto [bstat, bbound] = chi_square(expect, bad.counts, runs);
  std::printf("  resampling from p: chi-square %.1f (bound %.1f)\n", bstat, bbound);
  EXPECT_GT(bstat, bbound) << "the chi-square test does not see a biased acceptance rule";
  if (!accept_all_check) return;
  const auto all = run_sampling(target, d, sp, prompt, n_tok, runs,
                                [](const TokenDist&, const TokenDist*, int32_t, std::mt19937_64&, int32_t&) {
                                  return true;
                                }, graded);
  const auto [astat, abound] = chi_square(expect, all.counts, runs);
  std::printf("  accepting every draft: chi-square %.1f (bound %.1f)\n", astat, abound);
  EXPECT_GT(astat, abound) << "the chi-square test does not see accept-always";
}

TEST(SpecSampling, OutputDistributionEqualsPlainSampling) {
  TinySpec ts;
  ts.n_vocab = 256;
  TempFile target_file(tiny_model(ts, 7)), draft_file(tiny_model(ts, 8));
  auto target = load_model(target_file.path);
  auto draft = load_model(draft_file.path);
  ThreadPool pool(1);
  SamplingParams sp;
  sp.temperature = 1.5f;
  sp.top_k = 4;
  const std::vector<int32_t> prompt = repeating_prompt(*target, pool, {3, 14, 15, 92});
  const int n_tok = 3, runs = 1500;
  const auto expect = exact_joint(*target, pool, sp, prompt, n_tok);
  double total = 0;
  for (const auto& e : expect) total += e.second;
  ASSERT_NEAR(total, 1.0, 1e-9);

  // Random drafters (a model sampled at the same settings: the target with a
  // layer skipped, and another model) and a deterministic one.
  ModelDrafter self_drafter(*target, {true, false, true}, pool, 128, sp, "reference");
  ModelDrafter model_drafter(*draft, target->n_vocab(), pool, 128, sp, "reference");
  NgramDrafter ngram;
  for (Drafter* d : std::vector<Drafter*>{&self_drafter, &model_drafter, &ngram})
    expect_exact_sampling(*target, *d, sp, prompt, n_tok, runs, expect, true);
  // Prompt lookup with the graded choice of how many drafts to verify.
  expect_exact_sampling(*target, ngram, sp, prompt, n_tok, runs, expect, true, true);
}

// The same on the recurrent model, whose verify chains per-row state
// snapshots and restores the accepted one.
TEST(SpecSampling, RecurrentOutputDistributionEqualsPlainSampling) {
  auto target = load_model("qwen3.8-mini");
  ThreadPool pool(1);
  SamplingParams sp;
  sp.temperature = 1.5f;
  sp.top_k = 4;
  const std::vector<int32_t> prompt = repeating_prompt(*target, pool, {72, 101, 108, 108});
  const int n_tok = 3, runs = 1500;
  const auto expect = exact_joint(*target, pool, sp, prompt, n_tok);
  // A random drafter (the model with a layer skipped, sampled); prompt
  // lookup finds nothing to propose after this prompt.
  ModelDrafter self_drafter(*target, {true, false, true, true}, pool, 128, sp, "reference");
  expect_exact_sampling(*target, self_drafter, sp, prompt, n_tok, runs, expect, false);
}

TEST(SpecSampling, AcceptExactMatchesTheTargetOnOneStep) {
  // p and q over 4 tokens; the draft is drawn from q, then accepted or
  // replaced: the result must be distributed as p.
  const TokenDist p = {{0, 0.5}, {1, 0.3}, {2, 0.15}, {3, 0.05}};
  const TokenDist q = {{2, 0.6}, {0, 0.2}, {3, 0.2}};
  std::mt19937_64 rng(5);
  std::vector<int> hist(4, 0);
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const int32_t d = draw(q, uniform01(rng));
    int32_t r = -1;
    ++hist[static_cast<size_t>(accept_exact(p, &q, d, rng, r) ? d : r)];
  }
  for (const auto& [id, pr] : p) EXPECT_NEAR(hist[static_cast<size_t>(id)] / double(n), pr, 0.005) << id;
}

TEST(SpecErrors, BadInputIsRefusedClearly) {
  auto m = load_model("dense-mini");
  ThreadPool pool(2);
  TinySpec ts;
  ts.n_vocab = 300;  // dense-mini has 512
  TempFile f(tiny_model(ts, 1));
  auto small = load_model(f.path);
  try {
    ModelDrafter d(*small, m->n_vocab(), pool, 64, {});
    FAIL() << "a draft model with another vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary of 300 tokens but the target has 512"), std::string::npos)
        << e.what();
  }
  std::unique_ptr<Model> owned;
  EXPECT_THROW(make_drafter("model:" + f.path, *m, pool, 64, {}, owned), Error);
  EXPECT_THROW(make_drafter("model:", *m, pool, 64, {}, owned), Error);
  EXPECT_THROW(make_drafter("magic", *m, pool, 64, {}, owned), Error);
  EXPECT_THROW(make_drafter("self:4", *m, pool, 64, {}, owned), Error);  // skips nothing
  EXPECT_THROW(make_drafter("ngram:x", *m, pool, 64, {}, owned), Error);
  EXPECT_NE(make_drafter("self", *m, pool, 64, {}, owned), nullptr);
  EXPECT_EQ(make_drafter("self:skip=1-2", *m, pool, 64, {}, owned)->name(), "self (2 of 4 layers)");
  EXPECT_EQ(make_drafter("self", *m, pool, 64, {}, owned)->name(), "self (3 of 4 layers)");
  EXPECT_THROW(make_drafter("self:skip=2-4", *m, pool, 64, {}, owned), Error);  // no layer 4
  EXPECT_THROW(make_drafter("self:skip=0-3", *m, pool, 64, {}, owned), Error);  // every layer
  EXPECT_NE(make_drafter("ngram:2", *m, pool, 64, {}, owned), nullptr);

  NgramDrafter ngram;
  Engine eng(*m, pool, 8);
  SequenceState seq = m->new_sequence(64);
  for (int k : {0, -1, 33}) {
    SpecOptions o;
    o.draft = k;
    EXPECT_THROW(SpeculativeGenerator(eng, seq, ngram, o), Error) << k;
  }
  SpecOptions o;
  o.draft = 8;  // 9 rows, the engine takes 8
  try {
    SpeculativeGenerator g(eng, seq, ngram, o);
    FAIL() << "a draft wider than the engine was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 9 rows"), std::string::npos) << e.what();
  }
  o.draft = 7;
  SpeculativeGenerator g(eng, seq, ngram, o);
  EXPECT_THROW(g.start({}), Error);
  EXPECT_THROW(g.start(std::vector<int32_t>(65, 1)), Error);
}


TEST(SpecCli, RunWithSpecPrintsTheSameTextAndTheAcceptanceLength) {
  const std::string base = "run -m dense-mini --raw -n 40 -t 2 -p 'abcabcabcabc hello abcabc'";
  const CliResult plain = run_cli(base);
  ASSERT_EQ(plain.status, 0) << plain.err;
  for (const char* spec : {"ngram", "self", "model:dense-mini"}) {
    const CliResult r = run_cli(base + " --spec " + spec + " --draft 5");
    ASSERT_EQ(r.status, 0) << spec << ": " << r.err;
    EXPECT_EQ(r.out, plain.out) << spec;
    EXPECT_NE(r.err.find("acceptance length"), std::string::npos) << r.err;
  }
  const CliResult bad = run_cli(base + " --spec nonsense");
  EXPECT_EQ(bad.status, 105);
  EXPECT_NE(bad.err.find("--spec: unknown drafter 'nonsense'"), std::string::npos) << bad.err;
  const CliResult wide = run_cli(base + " --spec ngram --draft 40");
  EXPECT_EQ(wide.status, 105);
  EXPECT_NE(wide.err.find("--draft: Value 40 not in range 1 to 32"), std::string::npos) << wide.err;
}

TEST(SpecCli, BenchSpecReportsSpeedupAcceptanceAndVerifyCost) {
  const CliResult r = run_cli("bench-spec -m dense-mini --spec ngram,self -n 24 -t 2 --verify-reps 2");
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  for (const char* want : {"plain decode", "verify step cost", "8 rows", "speedup", "accept len", "identical"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  EXPECT_EQ(r.out.find(" NO"), std::string::npos) << r.out;
  const CliResult b = run_cli("bench -m qwen3.8-mini --spec ngram -n 16 -t 2 --verify-reps 2");
  ASSERT_EQ(b.status, 0) << b.err << b.out;
  EXPECT_NE(b.out.find("chained through per-row state snapshots"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("8 rows"), std::string::npos) << b.out;
}

}  // namespace
}  // namespace megakern
