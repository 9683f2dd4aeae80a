// Lossless speculative decoding over an Engine and one SequenceState.
//
// The sequence is kept as its tokens t_0..t_N, of which t_0..t_{N-1} are in
// the target's cache and t_N, the anchor, is the last token emitted. A round:
//  1. the drafter proposes d_1..d_k continuing t_0..t_N;
//  2. verify: the target computes the anchor and the drafts as k+1 rows of
//     one step at positions N..N+k (attention is causal within the block, see
//     ir/program.h), so row i's logits give the target's distribution p_i of
//     the token after t_N, d_1..d_i;
//  3. accept: d_{i+1} is checked against p_i, in order. Greedy: accepted while
//     it equals argmax p_i. Sampling: accepted with probability
//     min(1, p_i(d)/q_i(d)), q_i the drafter's distribution (one-hot for
//     deterministic drafters); the first rejection instead draws from the
//     residual max(0, p_i - q_i), normalised. When all k are accepted, a
//     bonus token is drawn from p_k.
//  The round emits the a accepted drafts plus that one target token (1..k+1
//  tokens), which becomes the new anchor. The keys and values the target
//  stored for rejected drafts lie past the accepted positions and are
//  overwritten by the next round.
//
// Why sampling is lossless: a draft x is emitted with probability
// q(x) min(1, p(x)/q(x)) = min(q(x), p(x)); a rejection happens with
// probability 1 - sum_y min(q(y), p(y)) = sum_y max(0, p(y) - q(y)) and then
// emits x with probability max(0, p(x) - q(x)) / that sum. Together x comes
// out with probability min(q(x), p(x)) + max(0, p(x) - q(x)) = p(x).
// Greedy is the special case where p is one-hot on the argmax, so the tokens
// equal plain greedy decoding; and since each row's logits do not depend on
// the other rows of its step, they are bit-identical to it.
//
// Recurrent targets (DeltaNet states and conv windows advanced one token per
// row) verify in one step too when the engine takes k+1 rows: row 0 advances
// the sequence's state in place, row i > 0 starts from row i-1's state and
// writes its own snapshot (RowInput::state_in; the executors order the
// recurrent tiles along that chain). After a accepted drafts the sequence's
// state is replaced by row a's snapshot: the state after exactly the anchor
// and the accepted drafts. With an engine of one row per step they verify
// with single-row steps instead, run lazily: row i+1 is computed only once
// d_{i+1} has been accepted, so the state never needs rolling back (but no
// target steps are saved).
//
// Drafters that want the target's hidden states (Drafter::tap_layers, e.g.
// the block drafters of spec/block_drafter.h) get them: the generator turns
// on taps in the target's engine, and hands the drafter the taps of the
// prompt after the prompt pass and, after each verify, those of the anchor
// and the accepted drafts (rows 0..a) only. The prompt is then computed by
// executor steps (the batched prompt pass has no taps).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/session.h"
#include "spec/drafter.h"
#include "spec/graded_acceptance.h"

namespace megakern {

struct SpecOptions {
  static constexpr int kMaxDraft = 32;
  int draft = 4;          // most tokens proposed per round, 1..kMaxDraft
  // Choose each round's proposal length (0..draft) for the most tokens per
  // unit of time, from the measured acceptance rate, verify cost per row
  // count and drafting cost (choose_draft_length); otherwise always `draft`.
  // Drafters that grade their drafts (Drafter::grades_drafts, e.g. prompt
  // lookup) draft `draft` tokens each round and the length is chosen from
  // the acceptance seen at the draft's grade (choose_graded_length); 0 (a
  // plain step) whenever no length is expected to beat a plain step.
  bool adaptive = true;
  // When not empty: the cost of a verify step of r rows is row_cost[r - 1]
  // (r = 1..draft + 1, any unit, each > 0) and drafting is free, instead of
  // the measured times: the adaptive choices then depend on acceptance alone
  // (reproducible runs, tests).
  std::vector<double> row_cost;
  SamplingParams sampling;
};

struct SpecStats {
  int64_t rounds = 0;       // verify rounds
  int64_t drafted = 0;      // draft tokens the drafter proposed (graded drafters: also those not verified)
  int64_t proposed = 0;     // draft tokens verified
  int64_t accepted = 0;     // draft tokens accepted
  int64_t emitted = 0;      // tokens emitted by rounds (accepted drafts + one target token each)
  int64_t target_rows = 0;  // rows the target computed in verify steps
  int64_t plain_rounds = 0; // rounds that verified no draft (a plain step)
  double prefill_ms = 0, draft_ms = 0, verify_ms = 0;
  // Rounds by the rows their verify computed (1: a plain step).
  std::array<int64_t, SpecOptions::kMaxDraft + 2> rounds_by_rows{};
  // Mean tokens emitted per verify round (the acceptance length).
  double mean_accept() const { return rounds ? static_cast<double>(emitted) / static_cast<double>(rounds) : 0.0; }
  double acceptance_rate() const {
    return proposed ? static_cast<double>(accepted) / static_cast<double>(proposed) : 0.0;
  }
};

// Decides one draft token d against the target distribution p, given the
// drafter's distribution q (null: one-hot on d). Returns true when d is
// accepted; otherwise stores the replacement token in `resampled`.
using AcceptRule =
    std::function<bool(const TokenDist& p, const TokenDist* q, int32_t d, std::mt19937_64& rng, int32_t& resampled)>;
// The exact rule: accept with probability min(1, p(d)/q(d)), else draw from
// the normalised residual max(0, p - q).
bool accept_exact(const TokenDist& p, const TokenDist* q, int32_t d, std::mt19937_64& rng, int32_t& resampled);

class SpeculativeGenerator {
 public:
  // The target's engine must take draft + 1 rows per step (non-recurrent
  // models; recurrent ones verify row by row on an engine of fewer rows). Throws megakern::Error when opts.draft is out of range or the
  // engine is too narrow. engine, seq and drafter must outlive the generator.
  SpeculativeGenerator(Engine& target, SequenceState& seq, Drafter& drafter, const SpecOptions& opts);

  // Computes the prompt (from position 0) and draws the first token from its
  // last logits, which becomes the anchor. Returns that token. Throws if the
  // prompt is empty or longer than the context.
  int32_t start(const std::vector<int32_t>& prompt);
  // One round; appends 1..k+1 tokens to `out` (at most max_new >= 1) and
  // returns how many. Returns 0 when the anchor's position is past the context.
  int round(int max_new, std::vector<int32_t>& out);
  // start() then rounds through a Generator (spec/generator.h): the
  // tokens plain decoding would emit after prompt, at most n_predict,
  // stopping before the first token for which stop() is true and after a
  // token at position n_ctx (the cache is full).
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int n_predict,
                                const std::function<bool(int32_t)>& stop = {});

  // Prompt, then every emitted token (the last is the anchor).
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const SpecStats& stats() const { return stats_; }
  const Model& model() const { return engine_.model(); }
  int n_ctx() const { return seq_.n_ctx(); }
  Drafter& drafter() const { return drafter_; }
  void reset_stats() { stats_ = {}; }
  // The seed the random stream restarts from at each start() (initially
  // the options' sampling seed).
  void set_seed(uint64_t seed) { opts_.sampling.seed = seed; }
  // Replaces the sampling acceptance rule (accept_exact by default).
  void set_accept_rule(AcceptRule rule) { accept_ = std::move(rule); }

 private:
  Engine& engine_;
  SequenceState& seq_;
  Drafter& drafter_;
  SpecOptions opts_;
  Sampler sampler_;  // its distribution() at the sampling parameters
  std::mt19937_64 rng_;
  AcceptRule accept_;
  int k_ = 0;  // current proposal length
  // Adaptive length: decayed counts of drafts accepted and of drafts judged
  // (accepted ones plus the first rejection of a round), the smoothed verify
  // time per row count (0: not measured yet) and drafting time per token.
  double judged_ = 0, accepted_ = 0;
  std::vector<double> verify_ms_;
  double draft_ms_per_token_ = 0;
  void update_length(int m, int a, int rows, double draft_ms, double verify_ms);
  int choose_draft_length() const;
  // The expected time of a verify step of `rows` rows from the smoothed
  // measurements (unmeasured row counts guessed optimistically, so they get
  // tried); <= 0 when nothing is measured yet.
  double verify_cost(int rows) const;
  // Graded drafters: how often drafts of each grade were accepted (old
  // judgements fading by 0.9). Drafts proposed but not verified are judged
  // too when the round gets that far: the first of them against the
  // target's own next token (for a one-hot draft, equal with the
  // probability the draft would be accepted), which keeps every grade's
  // estimate alive while it is not being verified.
  GradedAcceptance acceptance_{0.9};
  // The number of the m graded drafts (of grade match, match + 1, ...) to
  // verify: the one of most expected tokens per unit of verify time, 0 when
  // a plain step is expected to do best.
  int choose_graded_length(int match, int m) const;
  std::vector<int32_t> tokens_;
  Draft draft_;
  std::vector<RowInput> rows_;
  std::vector<RecurrentState> snapshots_;  // recurrent one-step verify: state after row i (i >= 1)
  std::vector<float> logits_;
  std::vector<float> taps_;  // drafters with taps: the verify rows' taps, [draft + 1][tap width]
  SpecStats stats_;
};

// Plain decoding as `megakern run` does it (a Generator over session and
// sampler), for comparison: the prompt is computed afresh in `session`, then
// tokens are drawn with `sampler` and appended one step at a time; same
// stopping rules as SpeculativeGenerator::generate.
// prefill_ms, when given, receives the time spent on the prompt.
std::vector<int32_t> generate_plain(Session& session, Sampler& sampler, const std::vector<int32_t>& prompt,
                                    int n_predict, const std::function<bool(int32_t)>& stop = {},
                                    double* prefill_ms = nullptr);

}  // namespace megakern
