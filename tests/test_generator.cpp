// The generation loop: the per-token rules of Generation (stop strings over
// several tokens, UTF-8 characters split over tokens, end of text, max tokens,
// a full context), and the Generator's plain and speculative decoding, the
// server's scheduler and `megakern run` giving the same text.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "runtime/model.h"
#include "server/scheduler.h"
#include "spec/generator.h"
#include "spec/speculative.h"
#include "test_util.h"

namespace megakern {
namespace {

// dense-mini's byte vocabulary: token b is byte b, the last id is the end
// of text.
const Model& byte_model() {
  static auto m = load_model("dense-mini");
  return *m;
}

std::vector<int32_t> bytes_of(const std::string& s) {
  std::vector<int32_t> t;
  for (unsigned char c : s) t.push_back(c);
  return t;
}

// Pushes tokens until the generation ends; returns the text of each delta.
std::vector<std::string> push_all(Generation& g, const std::vector<int32_t>& tokens) {
  std::vector<std::string> texts;
  for (int32_t t : tokens) {
    texts.push_back(g.push(t).text);
    if (g.done()) break;
  }
  return texts;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x;
  return s;
}

TEST(Generation, StopStringSpanningTokensIsHeldBackThenCut) {
  const Tokenizer& tok = byte_model().tokenizer();
  GenerationParams p;
  p.max_tokens = 100;
  p.stop = {"<END>"};
  Generation g(tok, p, 4, 256);
  // "ab<EN" may still become "<END>": only "ab" is released.
  const auto texts = push_all(g, bytes_of("ab<EN"));
  EXPECT_EQ(joined(texts), "ab");
  EXPECT_FALSE(g.done());
  EXPECT_EQ(g.push('D').text, "");
  const Delta& d = g.push('>');
  EXPECT_EQ(d.text, "");
  EXPECT_EQ(d.stop, StopReason::StopString);
  EXPECT_EQ(d.generated, 7);
  EXPECT_THROW(g.push('x'), Error);

  // A partial match that does not complete is ordinary text.
  Generation h(tok, p, 4, 256);
  EXPECT_EQ(joined(push_all(h, bytes_of("x<ENx"))), "x<ENx");
  EXPECT_FALSE(h.done());
}

TEST(Generation, Utf8CharacterSplitOverTokensComesOutWhole) {
  const Tokenizer& tok = byte_model().tokenizer();
  GenerationParams p;
  p.max_tokens = 100;
  Generation g(tok, p, 1, 256);
  // "é" is C3 A9, "€" E2 82 AC: nothing until each character is complete.
  const auto texts = push_all(g, {'a', 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 'b'});
  EXPECT_EQ(texts, (std::vector<std::string>{"a", "", "\xC3\xA9", "", "", "\xE2\x82\xAC", "b"}));
  // A character cut by the end of generation is released as it is.
  GenerationParams q;
  q.max_tokens = 2;
  Generation h(tok, q, 1, 256);
  EXPECT_EQ(h.push('z').text, "z");
  const Delta& d = h.push(0xE2);
  EXPECT_EQ(d.text, "\xE2");
  EXPECT_EQ(d.stop, StopReason::MaxTokens);
}

TEST(Generation, EndOfTextEndsWithoutCountingAndReleasesWhatIsHeld) {
  const Tokenizer& tok = byte_model().tokenizer();
  const int32_t eos = tok.eos_id();
  ASSERT_GE(eos, 256);
  GenerationParams p;
  p.max_tokens = 100;
  p.stop = {"STOP"};
  Generation g(tok, p, 1, 256);
  EXPECT_EQ(joined(push_all(g, bytes_of("hi ST"))), "hi ");
  const Delta& d = g.push(eos);
  EXPECT_EQ(d.stop, StopReason::EndOfText);
  EXPECT_EQ(d.text, "ST");  // the partial stop string was text after all
  EXPECT_EQ(d.generated, 5);

  // ignore_eos: the end token is an ordinary (counted, textless) token.
  p.ignore_eos = true;
  Generation h(tok, p, 1, 256);
  EXPECT_FALSE(h.push(eos).done());
  EXPECT_EQ(h.generated(), 1);
  // is_end: the caller's end tokens instead of the tokenizer's.
  GenerationParams e;
  e.is_end = [](int32_t t) { return t == 'q'; };
  Generation k(tok, e, 1, 256);
  EXPECT_FALSE(k.push(eos).done());
  EXPECT_EQ(k.push('q').stop, StopReason::EndOfText);
}

TEST(Generation, MaxTokensAndAFullContextEndIt) {
  const Tokenizer& tok = byte_model().tokenizer();
  GenerationParams p;
  p.max_tokens = 3;
  Generation g(tok, p, 10, 256);
  EXPECT_EQ(joined(push_all(g, bytes_of("abcdef"))), "abc");
  EXPECT_EQ(g.stop_reason(), StopReason::MaxTokens);
  EXPECT_EQ(g.generated(), 3);

  // 5 prompt tokens in 7 positions: tokens fed at 5 and 6, and a third one
  // sampled from position 6's logits that has no position to be fed at.
  p.max_tokens = 100;
  Generation c(tok, p, 5, 7);
  EXPECT_FALSE(c.push('a').done());
  EXPECT_EQ(c.position(), 5);
  EXPECT_FALSE(c.push('b').done());
  EXPECT_EQ(c.position(), 6);
  EXPECT_EQ(c.push('c').stop, StopReason::ContextFull);
  EXPECT_EQ(c.generated(), 3);

  p.max_tokens = 0;
  EXPECT_THROW(Generation(tok, p, 1, 8), Error);
}

// Greedy speculative decoding through the Generator gives plain decoding's
// tokens and text, with and without stop strings, on an attention model and
// a recurrent one.
TEST(Generator, SpeculativeEqualsPlainGreedy) {
  ThreadPool pool(2);
  for (const char* name : {"dense-mini", "qwen3.8-mini"}) {
    auto m = load_model(name);
    GeneratorOptions o;
    o.n_ctx = 160;
    Generator plain(*m, pool, o);
    o.drafter = "ngram";
    o.draft = 4;
    Generator ngram(*m, pool, o);
    o.drafter = "self";
    Generator self(*m, pool, o);
    EXPECT_EQ(plain.spec_stats(), nullptr);
    ASSERT_NE(ngram.spec_stats(), nullptr);
    const std::vector<int32_t> prompt = bytes_of("abcabcabcabc hello abcabc");
    for (int n : {1, 7, 60}) {
      GenerationParams p;
      p.max_tokens = n;
      p.ignore_eos = true;
      plain.reset();
      const GenResult want = plain.generate(prompt, p);
      ASSERT_EQ(static_cast<int>(want.tokens.size()), n);
      for (Generator* g : {&ngram, &self}) {
        SCOPED_TRACE(std::string(name) + " " + g->drafter()->name() + " n " + std::to_string(n));
        std::string streamed;
        const GenResult got = g->generate(prompt, p, [&](const Delta& d) { streamed += d.text; });
        EXPECT_EQ(got.tokens, want.tokens);
        EXPECT_EQ(got.text, want.text);
        EXPECT_EQ(streamed, want.text);
        EXPECT_EQ(got.stop, StopReason::MaxTokens);
      }
    }
    // A stop string inside the text: both cut at the same place.
    GenerationParams p;
    p.max_tokens = 60;
    p.ignore_eos = true;
    plain.reset();
    const GenResult full = plain.generate(prompt, p);
    ASSERT_GE(full.text.size(), 12u);
    p.stop = {full.text.substr(8, 3)};
    plain.reset();
    const GenResult want = plain.generate(prompt, p);
    EXPECT_EQ(want.stop, StopReason::StopString);
    EXPECT_EQ(want.text, full.text.substr(0, full.text.find(p.stop[0])));
    const GenResult got = ngram.generate(prompt, p);
    EXPECT_EQ(got.stop, StopReason::StopString);
    EXPECT_EQ(got.text, want.text);
    EXPECT_EQ(got.tokens, want.tokens);
  }
}

// A small context: both stop at the same token, the context being full.
TEST(Generator, SpeculativeAndPlainStopAtAFullContext) {
  ThreadPool pool(2);
  auto m = load_model("dense-mini");
  GeneratorOptions o;
  o.n_ctx = 32;
  Generator plain(*m, pool, o);
  o.drafter = "ngram";
  Generator spec(*m, pool, o);
  GenerationParams p;
  p.max_tokens = 100;
  p.ignore_eos = true;
  const std::vector<int32_t> prompt = bytes_of("abcabcabcabcabcabcabcabc");  // 24 tokens
  const GenResult a = plain.generate(prompt, p), b = spec.generate(prompt, p);
  EXPECT_EQ(a.stop, StopReason::ContextFull);
  EXPECT_EQ(a.tokens.size(), 32u - 24u + 1u);
  EXPECT_EQ(b.stop, StopReason::ContextFull);
  EXPECT_EQ(b.tokens, a.tokens);
}

// A second generate() keeps the cached prefix (plain decoding), with the
// same tokens as a fresh generator.
TEST(Generator, ReusesTheCachedPrefix) {
  ThreadPool pool(2);
  auto m = load_model("dense-mini");
  GeneratorOptions o;
  o.n_ctx = 128;
  Generator g(*m, pool, o), fresh(*m, pool, o);
  GenerationParams p;
  p.max_tokens = 8;
  p.ignore_eos = true;
  std::vector<int32_t> prompt = bytes_of("the first turn");
  const GenResult first = g.generate(prompt, p);
  EXPECT_EQ(first.prompt_computed, first.prompt_tokens);
  prompt.insert(prompt.end(), first.tokens.begin(), first.tokens.end());
  const std::vector<int32_t> more = bytes_of(" and then");
  prompt.insert(prompt.end(), more.begin(), more.end());
  const GenResult second = g.generate(prompt, p);
  // Everything but the last generated token (never fed) was cached.
  EXPECT_EQ(second.prompt_computed, static_cast<int>(more.size()) + 1);
  EXPECT_EQ(second.tokens, fresh.generate(prompt, p).tokens);
  g.reset();
  EXPECT_EQ(g.generate(prompt, p).prompt_computed, static_cast<int>(prompt.size()));
}

// The same prompt and seed give the same text through the server's
// scheduler (a batch of several requests), the Generator and `megakern run`.
TEST(Generator, SchedulerGeneratorAndCliAgree) {
  ThreadPool pool(2);
  auto m = load_model("dense-mini");
  const std::string text = "Hello there, how are";
  const std::vector<int32_t> prompt = m->tokenizer().encode(text, m->tokenizer().add_bos_default(), false);
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.top_p = 0.95f;
  sp.seed = 1234;
  const int n = 40;

  GeneratorOptions o;
  o.n_ctx = 256;
  o.sampling = sp;
  Generator gen(*m, pool, o);
  GenerationParams p;
  p.max_tokens = n;
  const GenResult want = gen.generate(prompt, p);
  ASSERT_FALSE(want.text.empty());

  server::SchedulerOptions so;
  so.max_rows = 4;
  so.n_ctx = 256;
  server::Scheduler sched(*m, pool, so);
  std::vector<std::shared_ptr<server::Job>> jobs;
  for (uint64_t seed : {sp.seed, sp.seed + 1, sp.seed}) {
    server::GenRequest req;
    req.prompt = prompt;
    req.max_tokens = n;
    req.sampling = sp;
    req.sampling.seed = seed;
    jobs.push_back(sched.submit(req));
    ASSERT_NE(jobs.back(), nullptr);
  }
  EXPECT_EQ(jobs[0]->wait_all().text, want.text);
  EXPECT_EQ(jobs[2]->wait_all().text, want.text);
  const auto other = jobs[1]->wait_all();
  EXPECT_TRUE(other.finished);

  // With a stop string cut from the text: the scheduler and the Generator
  // cut it at the same place.
  ASSERT_GE(want.text.size(), 10u);
  p.stop = {want.text.substr(6, 2)};
  gen.reset();
  Generator again(*m, pool, o);
  const GenResult cut = again.generate(prompt, p);
  EXPECT_EQ(cut.stop, StopReason::StopString);
  server::GenRequest req;
  req.prompt = prompt;
  req.max_tokens = n;
  req.sampling = sp;
  req.stop = p.stop;
  const auto u = sched.submit(req)->wait_all();
  EXPECT_EQ(u.text, cut.text);
  EXPECT_EQ(u.finish, server::FinishReason::Stop);

  const CliResult cli = run_cli("run -m dense-mini --raw -q -t 2 -n 40 --temp 0.9 --top-p 0.95 --seed 1234 -c 256 -p '" +
                                text + "'");
  ASSERT_EQ(cli.status, 0) << cli.err;
  EXPECT_EQ(cli.out, want.text + "\n");
}

}  // namespace
}  // namespace megakern
