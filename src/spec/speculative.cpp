#include "spec/speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "spec/generator.h"

namespace megakern {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double prob_of(const TokenDist& d, int32_t id) {
  for (const auto& e : d)
    if (e.first == id) return e.second;
  return 0.0;
}

}  // namespace

bool accept_exact(const TokenDist& p, const TokenDist* q, int32_t d, std::mt19937_64& rng, int32_t& resampled) {
  const double pd = prob_of(p, d);
  const double qd = q ? prob_of(*q, d) : 1.0;
  // A draft its own drafter gave no mass cannot have been drawn from q; it is
  // accepted on p alone (q(d) = 0 only arises from rounding at the tail).
  const double ratio = qd > 0 ? pd / qd : (pd > 0 ? 1.0 : 0.0);
  if (ratio >= 1.0 || uniform01(rng) < ratio) return true;
  // Residual r(x) = max(0, p(x) - q(x)) over p's support (outside it r is 0).
  TokenDist r;
  r.reserve(p.size());
  double sum = 0;
  for (const auto& [id, pp] : p) {
    const double w = pp - (q ? prob_of(*q, id) : (id == d ? 1.0 : 0.0));
    if (w > 0) {
      r.emplace_back(id, w);
      sum += w;
    }
  }
  // Rejection has probability sum(r) > 0; if rounding left nothing, p itself
  // is the answer up to that rounding.
  if (!(sum > 0)) {
    resampled = draw(p, uniform01(rng));
    return false;
  }
  for (auto& e : r) e.second /= sum;
  resampled = draw(r, uniform01(rng));
  return false;
}

SpeculativeGenerator::SpeculativeGenerator(Engine& target, SequenceState& seq, Drafter& drafter,
                                           const SpecOptions& opts)
    : engine_(target), seq_(seq), drafter_(drafter), opts_(opts), sampler_(opts.sampling), rng_(opts.sampling.seed),
      accept_(accept_exact) {
  if (opts.draft < 1 || opts.draft > SpecOptions::kMaxDraft)
    fail("draft length must be in [1, {}], got {}", SpecOptions::kMaxDraft, opts.draft);
  if ((!seq.recurrent || target.max_rows() > 1) && opts.draft + 1 > target.max_rows())
    fail("a draft of {} tokens needs {} rows per verify step, but the engine's program takes at most {}", opts.draft,
         opts.draft + 1, target.max_rows());
  if (!opts.row_cost.empty()) {
    if (static_cast<int>(opts.row_cost.size()) != opts.draft + 1)
      fail("row costs: need one for each verify step of 1..{} rows, got {}", opts.draft + 1, opts.row_cost.size());
    for (double c : opts.row_cost)
      if (!(c > 0) || !std::isfinite(c)) fail("row costs must be positive, got {}", c);
  }
  if (seq.recurrent != target.model().recurrent())
    fail("the sequence state does not belong to model {}", target.model().name());
  if (drafter.wants_taps()) {
    target.enable_taps(drafter.tap_layers());
    taps_.resize(static_cast<size_t>(opts.draft + 1) * static_cast<size_t>(target.tap_width()));
  }
  k_ = opts.draft;
  verify_ms_.assign(static_cast<size_t>(opts.draft) + 2, 0.0);
  logits_.resize(static_cast<size_t>(opts.draft + 1) * static_cast<size_t>(target.n_vocab()));
}

int32_t SpeculativeGenerator::start(const std::vector<int32_t>& prompt) {
  if (prompt.empty()) fail("the prompt is empty: there is nothing to run");
  if (static_cast<int64_t>(prompt.size()) > seq_.n_ctx())
    fail("the prompt has {} tokens, more than the context of {} (raise --context)", prompt.size(), seq_.n_ctx());
  seq_.clear();
  drafter_.reset();
  // What earlier generations measured (costs, acceptance) still holds; the
  // acceptance by grade only in part, as a new prompt may be copied more or
  // less than the last.
  k_ = opts_.adaptive ? choose_draft_length() : opts_.draft;
  acceptance_.fade(0.25);
  rng_.seed(opts_.sampling.seed);
  const int64_t V = engine_.n_vocab();
  const auto t0 = Clock::now();
  std::vector<float> prompt_taps;
  if (drafter_.wants_taps()) prompt_taps.resize(prompt.size() * static_cast<size_t>(engine_.tap_width()));
  engine_.prefill(seq_, prompt.data(), static_cast<int>(prompt.size()), 0, logits_.data(),
                  prompt_taps.empty() ? nullptr : prompt_taps.data());
  stats_.prefill_ms += ms_since(t0);
  const int32_t first = opts_.sampling.temperature == 0.f ? argmax(logits_.data(), V)
                                                          : draw(sampler_.distribution(logits_.data(), V), uniform01(rng_));
  tokens_ = prompt;
  tokens_.push_back(first);
  // The drafter takes in the prompt too (timed as prompt work, so the
  // drafting cost the adaptive length sees is that of drafting alone).
  const auto t1 = Clock::now();
  if (!prompt_taps.empty()) drafter_.observe_taps(prompt_taps.data(), static_cast<int>(prompt.size()), 0);
  drafter_.prepare(tokens_);
  stats_.prefill_ms += ms_since(t1);
  return first;
}

int SpeculativeGenerator::round(int max_new, std::vector<int32_t>& out) {
  if (tokens_.empty()) fail("speculative round before start()");
  if (max_new < 1) fail("a round emits at least one token, asked for {}", max_new);
  const int N = static_cast<int>(tokens_.size()) - 1;  // the anchor's position
  if (N >= seq_.n_ctx()) return 0;
  const int64_t V = engine_.n_vocab();
  // Proposal length: the current k, no more than the round may emit or the
  // context can hold (drafts occupy positions N+1..N+k).
  const int limit = std::min({opts_.draft, max_new - 1, seq_.n_ctx() - 1 - N});
  const bool graded = opts_.adaptive && drafter_.grades_drafts();
  const int k = graded ? limit : std::min(k_, limit);
  auto t0 = Clock::now();
  draft_.clear();
  // When the adaptive length has fallen to 0 (plain steps pay best), a
  // cheap drafter still drafts one token each round, unverified: whether the
  // target's own token matches it keeps the acceptance estimate alive. A
  // drafter costing a tenth of a step or more is left alone (it would also
  // have to catch up on every token since its last proposal): the rest of
  // the generation is plain decoding. (Graded drafters: see below.)
  int32_t probe = -1;
  const bool probing = !graded && k_ == 0 && max_new > 1 && N + 1 < seq_.n_ctx() && verify_ms_[1] > 0 &&
                       draft_ms_per_token_ < 0.1 * verify_ms_[1];
  if (k > 0) {
    drafter_.propose(tokens_, k, draft_);
  } else if (probing) {
    drafter_.propose(tokens_, 1, draft_);
    if (!draft_.tokens.empty()) probe = draft_.tokens[0];
    draft_.clear();
  }
  if (static_cast<int>(draft_.tokens.size()) > k) draft_.tokens.resize(static_cast<size_t>(k));
  for (int32_t d : draft_.tokens)
    if (d < 0 || d >= V) fail("drafter {} proposed token {}, outside the vocabulary of {}", drafter_.name(), d, V);
  if (!draft_.dists.empty() && draft_.dists.size() < draft_.tokens.size())
    fail("drafter {} gave {} distributions for {} tokens", drafter_.name(), draft_.dists.size(), draft_.tokens.size());
  // Graded drafts: verify the first `verified` of them, chosen from their
  // grade; the first one left out (the spare) is judged for free against
  // the token the target emits after the verified ones, should all pass.
  const int match = draft_.match;
  stats_.drafted += static_cast<int64_t>(draft_.tokens.size());
  int32_t spare = -1;
  if (graded) {
    const int verified = choose_graded_length(match, static_cast<int>(draft_.tokens.size()));
    if (verified < static_cast<int>(draft_.tokens.size())) {
      if (draft_.dists.empty()) spare = draft_.tokens[static_cast<size_t>(verified)];
      draft_.tokens.resize(static_cast<size_t>(verified));
      if (!draft_.dists.empty()) draft_.dists.resize(static_cast<size_t>(verified));
    }
  }
  const int m = static_cast<int>(draft_.tokens.size());
  const double draft_ms = ms_since(t0);
  stats_.draft_ms += draft_ms;

  t0 = Clock::now();
  auto token_at = [&](int i) { return i == 0 ? tokens_[static_cast<size_t>(N)] : draft_.tokens[static_cast<size_t>(i - 1)]; };
  // Row i's logits: all m + 1 rows in one step when the engine takes them
  // (recurrent rows chained through per-row state snapshots); otherwise
  // (recurrent models on a narrow engine) one step per row, on demand.
  int computed = 0;
  const bool one_step = m + 1 <= engine_.max_rows();
  if (one_step) {
    rows_.clear();
    if (seq_.recurrent)
      while (snapshots_.size() < static_cast<size_t>(m)) snapshots_.push_back(seq_.state);
    for (int i = 0; i <= m; ++i) {
      RowInput row = seq_.row(token_at(i), N + i);
      if (seq_.recurrent && i > 0) {
        row.state = &snapshots_[static_cast<size_t>(i - 1)];
        row.state_in = rows_.back().state;
      }
      rows_.push_back(row);
    }
    engine_.step(rows_, logits_.data(), taps_.empty() ? nullptr : taps_.data());
    computed = m + 1;
  }
  auto row_logits = [&](int i) -> const float* {
    if (!one_step && i >= computed) {
      engine_.step({seq_.row(token_at(i), N + i)}, logits_.data() + static_cast<size_t>(i) * V,
                   taps_.empty() ? nullptr : taps_.data() + static_cast<size_t>(i) * static_cast<size_t>(engine_.tap_width()));
      computed = i + 1;
    }
    return logits_.data() + static_cast<size_t>(i) * V;
  };

  const bool greedy = opts_.sampling.temperature == 0.f;
  int a = 0;
  int32_t next = 0;
  for (int i = 0;; ++i) {
    const float* L = row_logits(i);
    if (greedy) {
      next = argmax(L, V);
      if (i < m && draft_.tokens[static_cast<size_t>(i)] == next) {
        ++a;
        continue;
      }
      break;
    }
    const TokenDist p = sampler_.distribution(L, V);
    if (i == m) {
      next = draw(p, uniform01(rng_));
      break;
    }
    const TokenDist* q = draft_.dists.empty() ? nullptr : &draft_.dists[static_cast<size_t>(i)];
    if (!accept_(p, q, draft_.tokens[static_cast<size_t>(i)], rng_, next)) break;
    ++a;
  }
  const double verify_ms = ms_since(t0);
  stats_.verify_ms += verify_ms;

  // Recurrent one-step verify: the state after the anchor and a accepted
  // drafts is row a's (row 0 wrote the sequence's own state).
  if (one_step && seq_.recurrent && a > 0) {
    const RecurrentState& s = snapshots_[static_cast<size_t>(a - 1)];
    std::copy(s.conv.begin(), s.conv.end(), seq_.state.conv.begin());
    std::copy(s.S.begin(), s.S.end(), seq_.state.S.begin());
  }
  for (int i = 0; i < a; ++i) {
    out.push_back(draft_.tokens[static_cast<size_t>(i)]);
    tokens_.push_back(draft_.tokens[static_cast<size_t>(i)]);
  }
  out.push_back(next);
  tokens_.push_back(next);
  // The anchor and the accepted drafts are final: their taps go to the
  // drafter (rows after a were rejected and are not fed).
  if (!taps_.empty()) drafter_.observe_taps(taps_.data(), a + 1, N);
  drafter_.accepted(a);
  ++stats_.rounds;
  stats_.proposed += m;
  stats_.plain_rounds += m == 0 ? 1 : 0;
  stats_.accepted += a;
  stats_.emitted += a + 1;
  stats_.target_rows += computed;
  ++stats_.rounds_by_rows[static_cast<size_t>(computed)];
  if (graded) {
    for (int i = 0; i < a; ++i) acceptance_.judge(match, i, true);
    if (a < m)
      acceptance_.judge(match, a, false);
    else if (spare >= 0)
      acceptance_.judge(match, m, spare == next);
  }
  if (opts_.adaptive) {
    update_length(m, a, computed, draft_ms, verify_ms);
    if (probe >= 0) {
      judged_ += 1;
      accepted_ += probe == next ? 1 : 0;
      draft_ms_per_token_ = 0.8 * draft_ms_per_token_ + 0.2 * draft_ms;
    }
    k_ = choose_draft_length();
  }
  return a + 1;
}

void SpeculativeGenerator::update_length(int m, int a, int rows, double draft_ms, double verify_ms) {
  // Each draft is accepted with probability alpha (given the ones before it
  // were): a round judges a drafts that pass and, unless all m passed, one
  // that fails, so alpha ~ accepted / judged. Old rounds fade out.
  constexpr double kDecay = 0.95, kSmooth = 0.2;
  if (m > 0) {
    judged_ = judged_ * kDecay + a + (a < m ? 1 : 0);
    accepted_ = accepted_ * kDecay + a;
    const double per_token = draft_ms / m;
    draft_ms_per_token_ = draft_ms_per_token_ > 0 ? (1 - kSmooth) * draft_ms_per_token_ + kSmooth * per_token : per_token;
  }
  // Verify time by rows per step, or per row when the rows ran one per step
  // (recurrent models on a narrow engine: kept under index 1).
  const bool per_row = seq_.recurrent && engine_.max_rows() == 1;
  const size_t r = per_row ? 1 : static_cast<size_t>(rows);
  const double ms = per_row ? verify_ms / rows : verify_ms;
  if (r < verify_ms_.size()) verify_ms_[r] = verify_ms_[r] > 0 ? (1 - kSmooth) * verify_ms_[r] + kSmooth * ms : ms;
}

double SpeculativeGenerator::verify_cost(int rows) const {
  // Unmeasured row counts are guessed optimistically, so they get tried and
  // then judged on their measured cost: below the smallest measured count,
  // proportional to the rows; above a measured count, 5% dearer per extra row.
  if (!opts_.row_cost.empty()) return opts_.row_cost[static_cast<size_t>(std::clamp(rows, 1, opts_.draft + 1) - 1)];
  size_t first = 1;
  while (first < verify_ms_.size() && verify_ms_[first] <= 0) ++first;
  if (first == verify_ms_.size()) return 0;  // nothing measured yet
  if (rows < static_cast<int>(first)) return verify_ms_[first] * rows / static_cast<double>(first);
  int m = std::min(rows, static_cast<int>(verify_ms_.size()) - 1);
  while (verify_ms_[static_cast<size_t>(m)] <= 0) --m;  // stops at first
  return verify_ms_[static_cast<size_t>(m)] * (1.0 + 0.05 * (rows - m));
}

int SpeculativeGenerator::choose_draft_length() const {
  // With acceptance probability alpha, a proposal of k tokens emits
  // E(k) = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha) tokens
  // on average. It costs k drafting steps plus the verify: one step of k+1
  // rows (attention models), or one row per emitted token (recurrent, whose
  // rows after a rejection are never computed). Pick k maximising tokens per
  // unit of time; k = 0 (no proposal) when plain steps pay best.
  if (verify_cost(1) <= 0) return opts_.draft;  // nothing measured yet
  const double c1 = verify_cost(1);
  // A prior of 2 judged drafts at alpha = 0.5 keeps early estimates sane.
  const double alpha = std::clamp((accepted_ + 1.0) / (judged_ + 2.0), 0.0, 0.99);
  // k = 0: a plain one-row step.
  int best_k = 0;
  double best_rate = 1.0 / c1, e = 1, pw = 1;
  for (int k = 1; k <= opts_.draft; ++k) {
    pw *= alpha;
    e += pw;  // E(k)
    double cost = seq_.recurrent && engine_.max_rows() == 1 ? c1 * e : verify_cost(k + 1);
    if (opts_.row_cost.empty()) cost += k * draft_ms_per_token_;
    const double rate = e / cost;
    if (rate > best_rate) {
      best_rate = rate;
      best_k = k;
    }
  }
  return best_k;
}

int SpeculativeGenerator::choose_graded_length(int match, int m) const {
  // Draft i passes with probability alpha_i given drafts 0..i-1 passed
  // (alpha_i that of its grade), so verifying k drafts emits
  // E(k) = 1 + a_0 + a_0 a_1 + ... + a_0...a_{k-1} tokens, for the cost of a
  // verify step of k + 1 rows; the drafting is already done. k = 0 is a
  // plain one-row step. The first round of a generator (nothing measured)
  // is a plain step: its cost anchors the guesses for the rest.
  const bool per_row = seq_.recurrent && engine_.max_rows() == 1;
  const double c1 = verify_cost(1);
  if (c1 <= 0 || m <= 0) return 0;
  // A length must promise 5% more than a plain step: the estimates are
  // noisy, and a verify that does not pay costs more than one that barely
  // pays gains.
  constexpr double kMargin = 1.05;
  int best_k = 0;
  double best_rate = kMargin / c1, e = 1, pw = 1;
  for (int k = 1; k <= m; ++k) {
    pw *= acceptance_.alpha(match, k - 1);
    e += pw;
    const double cost = per_row ? c1 * e : verify_cost(k + 1);
    const double rate = e / cost;
    if (rate > best_rate) {
      best_rate = rate;
      best_k = k;
    }
  }
  return best_k;
}

namespace {

// The comparison helpers' rules: the end tokens are stop()'s (none without
// it), no stop strings.
GenerationParams token_params(int n_predict, const std::function<bool(int32_t)>& stop) {
  GenerationParams p;
  p.max_tokens = n_predict;
  p.is_end = stop;
  p.ignore_eos = !stop;
  return p;
}

}  // namespace

std::vector<int32_t> SpeculativeGenerator::generate(const std::vector<int32_t>& prompt, int n_predict,
                                                    const std::function<bool(int32_t)>& stop) {
  if (n_predict <= 0) return {};
  return Generator(*this).generate(prompt, token_params(n_predict, stop)).tokens;
}

std::vector<int32_t> generate_plain(Session& session, Sampler& sampler, const std::vector<int32_t>& prompt,
                                    int n_predict, const std::function<bool(int32_t)>& stop, double* prefill_ms) {
  session.reset();
  if (n_predict <= 0) return {};
  GenResult r = Generator(session, sampler).generate(prompt, token_params(n_predict, stop));
  if (prefill_ms) *prefill_ms = r.prefill_ms;
  return r.tokens;
}

}  // namespace megakern
