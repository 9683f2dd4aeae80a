// The server's scheduling policy (server/step_policy.h) on its own: no model,
// no threads. Plans are checked row by row: admission order, decode rows
// every step, prompt chunks within the budget, recurrent blocks, removal.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "core/error.h"
#include "server/step_policy.h"

namespace megakern::server {
namespace {

PolicyOptions opts(int seqs, int step_tokens, int block = 0, double per_decode = 0, int min_rows = 1) {
  PolicyOptions o;
  o.max_seqs = seqs;
  o.step_tokens = step_tokens;
  o.prompt_block = block;
  o.prompt_per_decode = per_decode;
  o.min_prompt_rows = min_rows;
  return o;
}

std::vector<SeqId> decode_ids(const StepPlan& p) {
  std::vector<SeqId> ids;
  for (const auto& d : p.decode) ids.push_back(d.id);
  return ids;
}

TEST(StepPolicy, RefusesBudgetsThatCannotHoldABatchAndAChunk) {
  EXPECT_THROW(StepPolicy(opts(8, 8)), Error);
  EXPECT_NO_THROW(StepPolicy(opts(8, 9)));
  EXPECT_THROW(StepPolicy(opts(4, 11, 8)), Error);  // 4 decode rows + one block of 8 need 12
  EXPECT_NO_THROW(StepPolicy(opts(4, 12, 8)));
  EXPECT_THROW(StepPolicy(opts(0, 8)), Error);
  EXPECT_THROW(StepPolicy(opts(2, 8, -1)), Error);
  EXPECT_THROW(StepPolicy(opts(2, 8, 0, -1)), Error);
  EXPECT_THROW(StepPolicy(opts(2, 8, 0, 1, 0)), Error);
  try {
    StepPolicy p(opts(8, 4));
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--step-tokens 4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at least 9"), std::string::npos) << e.what();
  }
  StepPolicy p(opts(2, 8));
  EXPECT_THROW(p.add(1, 0), Error);
}

TEST(StepPolicy, EmptyPolicyPlansNothing) {
  StepPolicy p(opts(2, 8));
  EXPECT_TRUE(p.empty());
  const StepPlan plan = p.schedule();
  EXPECT_TRUE(plan.empty());
  EXPECT_EQ(plan.rows(), 0);
  p.postprocess(plan, {});
}

TEST(StepPolicy, ShortPromptThenDecodeUntilFinished) {
  StepPolicy p(opts(2, 8));
  p.add(7, 3);
  StepPlan a = p.schedule();
  ASSERT_EQ(a.admitted.size(), 1u);
  EXPECT_EQ(a.admitted[0].id, 7u);
  EXPECT_TRUE(a.decode.empty());
  ASSERT_EQ(a.prefill.size(), 1u);
  EXPECT_EQ(a.prefill[0].begin, 0);
  EXPECT_EQ(a.prefill[0].n, 3);
  EXPECT_TRUE(a.prefill[0].last);
  p.postprocess(a, {});
  EXPECT_EQ(p.cached(7), 3);
  for (int pos = 3; pos < 6; ++pos) {
    StepPlan d = p.schedule();
    ASSERT_EQ(d.decode.size(), 1u);
    EXPECT_EQ(d.decode[0].pos, pos);
    EXPECT_TRUE(d.prefill.empty());
    p.postprocess(d, pos == 5 ? std::vector<SeqId>{7} : std::vector<SeqId>{});
  }
  EXPECT_TRUE(p.empty());
  EXPECT_EQ(p.cached(7), -1);
}

// A long prompt admitted while others decode is cut into chunks of the rows
// the decode rows leave; every step still decodes every other sequence.
TEST(StepPolicy, LongPromptNeverDisplacesDecodeRows) {
  StepPolicy p(opts(4, 10));
  for (SeqId id : {1, 2, 3}) p.add(id, 2);
  p.postprocess(p.schedule(), {});  // three prompts of 2 rows in one step
  p.add(9, 100);
  int prompt_done = 0, steps = 0;
  while (p.cached(9) < 100 || prompt_done == 0) {
    StepPlan s = p.schedule();
    EXPECT_EQ(decode_ids(s), (std::vector<SeqId>{1, 2, 3})) << "step " << steps;
    EXPECT_LE(s.rows(), 10);
    ASSERT_EQ(s.prefill.size(), 1u);
    EXPECT_EQ(s.prefill[0].begin, p.cached(9));
    EXPECT_EQ(s.prefill[0].n, std::min(7, 100 - p.cached(9)));
    if (s.prefill[0].last) ++prompt_done;
    p.postprocess(s, {});
    ++steps;
  }
  EXPECT_EQ(steps, 15);  // ceil(100 / 7)
  StepPlan s = p.schedule();
  EXPECT_EQ(decode_ids(s), (std::vector<SeqId>{1, 2, 3, 9}));
  EXPECT_EQ(s.decode[3].pos, 100);
  p.postprocess(s, {});
}

// Beside d decode rows at most max(min_prompt_rows, per_decode * d) prompt
// rows; with nothing decoding, the whole step.
TEST(StepPolicy, PromptRowsScaleWithTheDecodeRows) {
  {
    StepPolicy p(opts(8, 32, 0, 1.5, 6));
    p.add(100, 1000);
    const StepPlan s = p.schedule();
    EXPECT_EQ(s.prompt_rows(), 32);  // nothing decodes: the full budget
    p.postprocess(s, {});
  }
  const std::map<int, int> want = {{1, 6}, {2, 6}, {4, 6}, {6, 9}, {7, 10}, {8, 12}};
  for (const auto& [d, rows] : want) {
    StepPolicy p(opts(9, 32, 0, 1.5, 6));
    for (int i = 0; i < d; ++i) p.add(static_cast<SeqId>(i + 1), 1);
    p.postprocess(p.schedule(), {});
    p.add(100, 1000);
    const StepPlan s = p.schedule();
    EXPECT_EQ(static_cast<int>(s.decode.size()), d);
    EXPECT_EQ(s.prompt_rows(), rows) << d << " decode rows";
    p.postprocess(s, {});
  }
  // Without the proportional limit the rows left in the budget go to the prompt.
  StepPolicy p(opts(8, 32));
  p.add(1, 1);
  p.postprocess(p.schedule(), {});
  p.add(2, 1000);
  EXPECT_EQ(p.schedule().prompt_rows(), 31);
}

// The prompt with the fewest tokens left goes first (ties: the oldest), and
// several prompts share a step.
TEST(StepPolicy, ShortestPromptFirstAndSeveralChunksInOneStep) {
  StepPolicy p(opts(4, 10));
  p.add(3, 20);
  p.add(1, 4);
  p.add(2, 4);
  StepPlan s = p.schedule();
  ASSERT_EQ(s.prefill.size(), 3u);
  EXPECT_EQ(s.prefill[0].id, 1u);
  EXPECT_EQ(s.prefill[1].id, 2u);
  EXPECT_EQ(s.prefill[2].id, 3u);
  EXPECT_EQ(s.prefill[2].n, 2);
  EXPECT_FALSE(s.prefill[2].last);
  EXPECT_EQ(s.rows(), 10);
  p.postprocess(s, {1});  // 1 ended on its first token
  // A short prompt arriving while the long one is computed goes before it.
  p.add(4, 3);
  s = p.schedule();
  EXPECT_EQ(decode_ids(s), (std::vector<SeqId>{2}));
  ASSERT_EQ(s.prefill.size(), 2u);
  EXPECT_EQ(s.prefill[0].id, 4u);
  EXPECT_EQ(s.prefill[0].n, 3);
  EXPECT_EQ(s.prefill[1].id, 3u);
  EXPECT_EQ(s.prefill[1].begin, 2);
  EXPECT_EQ(s.prefill[1].n, 6);
  p.postprocess(s, {});
}

TEST(StepPolicy, WaitingSequencesTakeFreedSlotsInOrder) {
  StepPolicy p(opts(2, 4));
  for (SeqId id = 1; id <= 4; ++id) p.add(id, 1);
  StepPlan s = p.schedule();
  ASSERT_EQ(s.admitted.size(), 2u);
  EXPECT_EQ(s.admitted[0].id, 1u);
  EXPECT_EQ(s.admitted[1].id, 2u);
  EXPECT_EQ(p.waiting(), 2);
  EXPECT_EQ(p.free_slots(), 0);
  p.postprocess(s, {});
  s = p.schedule();
  EXPECT_TRUE(s.admitted.empty());
  p.postprocess(s, {1});
  EXPECT_EQ(p.free_slots(), 1);
  s = p.schedule();
  ASSERT_EQ(s.admitted.size(), 1u);
  EXPECT_EQ(s.admitted[0].id, 3u);
  EXPECT_EQ(s.admitted[0].slot, 0);  // the slot 1 left
  EXPECT_EQ(decode_ids(s), (std::vector<SeqId>{2}));
  p.postprocess(s, {});
}

// Recurrent models: a prompt's rows in one step are exactly the next block
// from position 0 (the tail shorter); a block that does not fit waits while
// a younger prompt's shorter tail may go.
TEST(StepPolicy, RecurrentPromptsGoInWholeBlocks) {
  StepPolicy p(opts(3, 12, 4));
  p.add(1, 10);
  std::vector<std::pair<int, int>> chunks;
  while (p.cached(1) < 10) {
    StepPlan s = p.schedule();
    ASSERT_EQ(s.prefill.size(), 1u);
    chunks.emplace_back(s.prefill[0].begin, s.prefill[0].n);
    p.postprocess(s, {});
  }
  EXPECT_EQ(chunks, (std::vector<std::pair<int, int>>{{0, 4}, {4, 4}, {8, 2}}));
  // One decoding sequence leaves 11 rows: two prompts get one block each
  // (never two blocks of one prompt in a step), a third waits.
  p.add(2, 9);
  p.add(3, 9);
  StepPlan s = p.schedule();
  EXPECT_EQ(decode_ids(s), (std::vector<SeqId>{1}));
  ASSERT_EQ(s.prefill.size(), 2u);
  EXPECT_EQ(s.prefill[0].n, 4);
  EXPECT_EQ(s.prefill[1].n, 4);
  p.postprocess(s, {});
  // A budget of 2 + 1 decode rows + a floor raised to the block: 4 prompt
  // rows fit beside the decode rows, the second prompt's block waits.
  StepPolicy q(opts(2, 8, 4, 0.5, 1));
  q.add(1, 1);
  q.postprocess(q.schedule(), {});
  q.add(2, 8);
  s = q.schedule();
  EXPECT_EQ(decode_ids(s), (std::vector<SeqId>{1}));
  ASSERT_EQ(s.prefill.size(), 1u);
  EXPECT_EQ(s.prefill[0].n, 4);
  q.postprocess(s, {});
}

TEST(StepPolicy, RemovedSequencesFreeTheirSlotsEvenMidStep) {
  StepPolicy p(opts(2, 8));
  p.add(2, 1);
  p.add(1, 20);
  p.add(3, 1);
  EXPECT_TRUE(p.remove(3));  // still waiting
  EXPECT_FALSE(p.remove(3));
  StepPlan s = p.schedule();
  EXPECT_EQ(s.admitted.size(), 2u);
  EXPECT_TRUE(p.remove(1));  // between schedule and postprocess
  p.postprocess(s, {});      // the plan's chunk of 1 is ignored
  EXPECT_EQ(p.cached(1), -1);
  EXPECT_EQ(p.cached(2), 1);
  EXPECT_EQ(p.free_slots(), 1);
}

// Prefix caching at admission: the free slot holding most of the prompt
// wins, ties (and nothing held anywhere) go to the slot released longest
// ago; a reuse leaves the prompt's last position to compute and, with a
// prompt block, is whole blocks; the first chunk starts after it.
TEST(StepPolicy, PrefixReuseTakesTheSlotHoldingMostOfThePrompt) {
  StepPolicy p(opts(3, 16));
  for (SeqId id = 1; id <= 3; ++id) p.add(id, 1);
  StepPlan s = p.schedule();
  ASSERT_EQ(s.admitted.size(), 3u);  // slots 0, 1, 2
  p.postprocess(s, {});
  // Released in the order slot 1, slot 2, slot 0.
  p.postprocess(p.schedule(), {2});
  p.postprocess(p.schedule(), {3});
  p.postprocess(p.schedule(), {1});
  std::map<int, int> held;  // slot -> positions of the next prompt it holds
  const StepPolicy::Reuse reuse = [&](SeqId, int slot) { return held.count(slot) ? held[slot] : 0; };
  auto admit = [&](SeqId id, int prompt_len) {
    p.add(id, prompt_len);
    const StepPlan plan = p.schedule(reuse);
    EXPECT_EQ(plan.admitted.size(), 1u);
    return plan;
  };
  // Slots 2 and 0 hold 6 positions, slot 1 holds 3: of the two with 6, slot
  // 2 was released first.
  held = {{0, 6}, {1, 3}, {2, 6}};
  s = admit(10, 10);
  EXPECT_EQ(s.admitted[0].slot, 2);
  EXPECT_EQ(s.admitted[0].reused, 6);
  EXPECT_EQ(p.cached(10), 6);
  ASSERT_EQ(s.prefill.size(), 1u);
  EXPECT_EQ(s.prefill[0].begin, 6);
  EXPECT_EQ(s.prefill[0].n, 4);
  EXPECT_TRUE(s.prefill[0].last);
  p.postprocess(s, {10});  // slot 2 is now the most recently released
  // Nothing held anywhere: the slot released longest ago (1).
  held.clear();
  s = admit(11, 5);
  EXPECT_EQ(s.admitted[0].slot, 1);
  EXPECT_EQ(s.admitted[0].reused, 0);
  EXPECT_EQ(s.prefill[0].begin, 0);
  p.postprocess(s, {11});
  // A slot holding the whole prompt (or more): all but its last position.
  held = {{2, 40}};
  s = admit(12, 8);
  EXPECT_EQ(s.admitted[0].slot, 2);
  EXPECT_EQ(s.admitted[0].reused, 7);
  ASSERT_EQ(s.prefill.size(), 1u);
  EXPECT_EQ(s.prefill[0].begin, 7);
  EXPECT_EQ(s.prefill[0].n, 1);
  p.postprocess(s, {12});
  // A negative answer from the callback is an internal error.
  held = {{0, -1}};
  p.add(13, 4);
  EXPECT_ANY_THROW(p.schedule(reuse));

  // With a prompt block of 4, a held 7 counts as 4, and 3 as none: the
  // slot holding 7 wins over the one holding 3 (and the one released
  // longest ago) only by its whole block.
  StepPolicy q(opts(2, 12, 4));
  q.add(1, 1);
  q.add(2, 1);
  StepPlan t = q.schedule();
  q.postprocess(t, {1, 2});  // both slots free, slot 0 released first
  const StepPolicy::Reuse blocks = [](SeqId, int slot) { return slot == 1 ? 7 : 3; };
  q.add(3, 9);
  t = q.schedule(blocks);
  ASSERT_EQ(t.admitted.size(), 1u);
  EXPECT_EQ(t.admitted[0].slot, 1);
  EXPECT_EQ(t.admitted[0].reused, 4);
  ASSERT_EQ(t.prefill.size(), 1u);
  EXPECT_EQ(t.prefill[0].begin, 4);
  EXPECT_EQ(t.prefill[0].n, 4);
  q.postprocess(t, {});
}

TEST(StepPolicy, CallsOutOfOrderAreInternalErrors) {
  StepPolicy p(opts(2, 8));
  p.add(1, 2);
  const StepPlan s = p.schedule();
  EXPECT_ANY_THROW(p.schedule());
  p.postprocess(s, {});
  EXPECT_ANY_THROW(p.postprocess(s, {}));
}

// Rule 4: draft rows take only the rows that decode rows and prompt chunks
// leave; the likeliest drafts first, equal ones spread evenly over the
// sequences, each sequence's as a prefix of its proposal; accepted drafts
// advance their sequence.
TEST(StepPolicy, DraftRowsFillOnlyTheRowsLeftLikeliestFirst) {
  StepPolicy p(opts(4, 12));
  for (SeqId id : {1, 2, 3}) p.add(id, 2);
  p.postprocess(p.schedule(), {});  // three prompts of 2 rows in one step
  std::map<SeqId, std::vector<double>> offer = {{1, {1, 1, 1, 1, 1, 1}}, {2, {1, 1, 1, 1, 1, 1}}, {3, {1, 1}}};
  auto drafts = [&](SeqId id, std::vector<double>& g) { g = offer[id]; };
  // A long prompt arriving is not held back by drafts: 3 decode rows, 9 left.
  p.add(4, 50);
  StepPlan a = p.schedule({}, drafts);
  ASSERT_EQ(a.decode.size(), 3u);
  ASSERT_EQ(a.prefill.size(), 1u);
  EXPECT_EQ(a.prefill[0].n, 9);
  EXPECT_EQ(a.draft_rows(), 0);
  p.postprocess(a, {4});  // the long prompt goes away (cancelled)
  // 3 decode rows and 9 draft rows: sequence 3 offers 2, the rest is spread
  // evenly over 1 and 2.
  StepPlan b = p.schedule({}, drafts);
  ASSERT_EQ(b.decode.size(), 3u);
  EXPECT_EQ(b.rows(), 12);
  EXPECT_EQ(b.decode[0].draft, 4);
  EXPECT_EQ(b.decode[1].draft, 3);
  EXPECT_EQ(b.decode[2].draft, 2);
  // Accepted drafts advance their sequence past the decode row's position.
  p.postprocess(b, {}, {4, 1, 0});
  EXPECT_EQ(p.cached(1), 3 + 1 + 4);  // the prompt, step a's row, b's
  EXPECT_EQ(p.cached(2), 3 + 1 + 1);
  EXPECT_EQ(p.cached(3), 3 + 1);
  // Likeliest first: sequence 2's drafts beat sequence 1's second and later.
  offer = {{1, {0.9, 0.2, 0.1}}, {2, {0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.3, 0.3, 0.3, 0.3}}, {3, {}}};
  StepPlan c = p.schedule({}, drafts);
  EXPECT_EQ(c.decode[0].draft, 1);
  EXPECT_EQ(c.decode[1].draft, 8);
  EXPECT_EQ(c.decode[2].draft, 0);
  EXPECT_EQ(c.decode[1].pos, 5);
  EXPECT_THROW(p.postprocess(c, {}, {2, 0, 0}), std::logic_error);  // more accepted than drafted
}

// With a step cost, as many drafts are taken as give the most expected
// tokens per cost: none when rows cost in proportion, those of high gain
// when extra rows are cheap up to a point.
TEST(StepPolicy, DraftRowsPayForTheirCostOrAreLeftOut) {
  StepPolicy p(opts(2, 16));
  for (SeqId id : {1, 2}) p.add(id, 2);
  p.postprocess(p.schedule(), {});
  auto drafts = [](SeqId, std::vector<double>& g) { g = {0.9, 0.8, 0.5, 0.1}; };
  auto linear = [](int rows) { return static_cast<double>(rows); };
  StepPlan a = p.schedule({}, drafts, linear);
  EXPECT_EQ(a.draft_rows(), 0);
  p.postprocess(a, {});
  // Up to 6 rows cost as much as 2; beyond, each row costs one more.
  auto flat = [](int rows) { return rows <= 6 ? 2.0 : 2.0 + (rows - 6); };
  StepPlan b = p.schedule({}, drafts, flat);
  EXPECT_EQ(b.decode[0].draft, 2);
  EXPECT_EQ(b.decode[1].draft, 2);
  p.postprocess(b, {});
  auto bad = [](SeqId, std::vector<double>& g) { g = {0.5, 0.9}; };  // rising: not a chain of acceptances
  EXPECT_THROW(p.schedule({}, bad), std::logic_error);
}

// The estimates: optimistic costs for row counts never measured, and
// acceptance by grade leaning on all grades while a grade has few.
TEST(DraftEstimates, CostsAndAcceptanceFollowTheMeasurements) {
  DraftEstimates e(16);
  EXPECT_EQ(e.step_cost(4), 0.0);
  EXPECT_DOUBLE_EQ(e.alpha(0, 0), 0.5);
  e.record_step(4, 0.008);
  EXPECT_DOUBLE_EQ(e.step_cost(4), 0.008);
  EXPECT_DOUBLE_EQ(e.step_cost(2), 0.004);
  EXPECT_DOUBLE_EQ(e.step_cost(6), 0.008 * 1.1);
  // Two row counts: the line through them (then fitted to every step).
  e.record_step(8, 0.02);
  EXPECT_NEAR(e.step_cost(8), 0.02, 1e-12);
  EXPECT_NEAR(e.step_cost(12), 0.032, 1e-12);
  for (int i = 0; i < 200; ++i) e.record_step(4 + 4 * (i % 3), 0.01 + 0.001 * (4 + 4 * (i % 3)));
  e.record_step(12, 0.05);  // one step slowed down by something else
  EXPECT_NEAR(e.step_cost(16), 0.026, 0.004);
  for (int i = 0; i < 50; ++i) {
    e.judge(10, 0, true);
    e.judge(0, 1, false);
  }
  EXPECT_GT(e.alpha(10, 0), 0.9);
  EXPECT_LT(e.alpha(0, 1), 0.1);
  std::vector<double> g;
  e.gains(10, 3, g);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_GT(g[0], g[1]);
  EXPECT_GE(g[1], g[2]);
}

}  // namespace
}  // namespace megakern::server
