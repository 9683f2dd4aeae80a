#include "server/step_policy.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace megakern::server {

int StepPlan::rows() const { return static_cast<int>(decode.size()) + draft_rows() + prompt_rows(); }

int StepPlan::draft_rows() const {
  int n = 0;
  for (const auto& d : decode) n += d.draft;
  return n;
}

int StepPlan::prompt_rows() const {
  int n = 0;
  for (const auto& c : prefill) n += c.n;
  return n;
}

StepPolicy::StepPolicy(const PolicyOptions& opts) : opts_(opts) {
  if (opts_.max_seqs < 1) fail("--batch must be at least 1, got {}", opts_.max_seqs);
  if (opts_.prompt_block < 0) fail("prompt block must be >= 0, got {}", opts_.prompt_block);
  if (opts_.prompt_per_decode < 0 || !(opts_.prompt_per_decode == opts_.prompt_per_decode))
    fail("prompt rows per decode row must be >= 0, got {}", opts_.prompt_per_decode);
  if (opts_.min_prompt_rows < 1) fail("the least prompt rows of a step must be at least 1, got {}", opts_.min_prompt_rows);
  // A recurrent prompt's chunk is a whole block: the floor must hold one, or
  // a prompt would wait for as long as anything decodes.
  opts_.min_prompt_rows = std::max(opts_.min_prompt_rows, opts_.prompt_block);
  const int chunk = std::max(1, opts_.prompt_block);
  if (opts_.step_tokens < opts_.max_seqs + chunk)
    fail("--step-tokens {} cannot hold a full decode batch of --batch {} and a prompt chunk of {} beside it: "
         "it must be at least {}",
         opts_.step_tokens, opts_.max_seqs, chunk, opts_.max_seqs + chunk);
  slots_.resize(static_cast<size_t>(opts_.max_seqs));
}

StepPolicy::Slot* StepPolicy::find(SeqId id) {
  return const_cast<Slot*>(std::as_const(*this).find(id));
}

const StepPolicy::Slot* StepPolicy::find(SeqId id) const {
  for (const auto& s : slots_)
    if (s.used && s.id == id) return &s;
  return nullptr;
}

void StepPolicy::add(SeqId id, int prompt_len) {
  if (prompt_len < 1) fail("a sequence needs a prompt of at least 1 token, got {}", prompt_len);
  MK_CHECK(!find(id) && std::none_of(waiting_.begin(), waiting_.end(), [&](const Waiting& w) { return w.id == id; }),
           "sequence {} added twice", id);
  waiting_.push_back({id, prompt_len});
}

bool StepPolicy::remove(SeqId id) {
  if (Slot* s = find(id)) {
    *s = Slot{};
    s->released = next_release_++;
    return true;
  }
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
    if (it->id == id) {
      waiting_.erase(it);
      return true;
    }
  return false;
}

int StepPolicy::free_slots() const {
  return static_cast<int>(std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.used; }));
}

int StepPolicy::running() const { return static_cast<int>(slots_.size()) - free_slots(); }

int StepPolicy::cached(SeqId id) const {
  const Slot* s = find(id);
  return s ? s->cached : -1;
}

StepPlan StepPolicy::schedule(const Reuse& reuse, const Drafts& drafts, const StepCost& cost) {
  MK_CHECK(!planned_, "schedule() called twice without postprocess()");
  StepPlan plan;
  // 1. Admission, first come first served, each to the free slot that holds
  // most of its prompt (then the one released longest ago).
  while (!waiting_.empty() && free_slots() > 0) {
    const Waiting w = waiting_.front();
    waiting_.pop_front();
    int best = -1, best_reused = -1;
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].used) continue;
      int r = reuse ? reuse(w.id, static_cast<int>(i)) : 0;
      MK_CHECK(r >= 0, "reuse of slot {} for sequence {} is negative ({})", i, w.id, r);
      r = std::min(r, w.prompt_len - 1);
      if (opts_.prompt_block > 0) r -= r % opts_.prompt_block;
      if (r > best_reused || (r == best_reused && slots_[i].released < slots_[static_cast<size_t>(best)].released)) {
        best = static_cast<int>(i);
        best_reused = r;
      }
    }
    slots_[static_cast<size_t>(best)] = Slot{true, w.id, w.prompt_len, best_reused, next_order_++, 0};
    plan.admitted.push_back({w.id, best, best_reused});
  }
  // 2. A row for every decoding sequence.
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.used && s.decoding()) plan.decode.push_back({s.id, static_cast<int>(i), s.cached});
  }
  // 3. Prompt chunks in the rows left, the fewest tokens left first.
  std::vector<int> pending;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].used && !slots_[i].decoding()) pending.push_back(static_cast<int>(i));
  std::sort(pending.begin(), pending.end(), [&](int a, int b) {
    const Slot& x = slots_[static_cast<size_t>(a)];
    const Slot& y = slots_[static_cast<size_t>(b)];
    const int lx = x.prompt_len - x.cached, ly = y.prompt_len - y.cached;
    return lx != ly ? lx < ly : x.order < y.order;
  });
  const int n_decode = static_cast<int>(plan.decode.size());
  int budget = opts_.step_tokens - n_decode;
  if (n_decode > 0 && opts_.prompt_per_decode > 0)
    budget = std::min(budget, std::max(opts_.min_prompt_rows,
                                       static_cast<int>(opts_.prompt_per_decode * static_cast<double>(n_decode))));
  for (int i : pending) {
    if (budget <= 0) break;
    const Slot& s = slots_[static_cast<size_t>(i)];
    const int left = s.prompt_len - s.cached;
    int n = 0;
    if (opts_.prompt_block > 0) {
      n = std::min(opts_.prompt_block, left);
      if (n > budget) continue;  // its block does not fit this step; a later, shorter tail may
    } else {
      n = std::min(budget, left);
    }
    plan.prefill.push_back({s.id, i, s.cached, n, n == left});
    budget -= n;
  }
  // 4. Draft rows in the rows still left, the likeliest first.
  if (drafts && n_decode > 0 && plan.rows() < opts_.step_tokens) plan_drafts(plan, drafts, cost);
  MK_CHECK(plan.rows() <= opts_.step_tokens, "plan of {} rows over the budget of {}", plan.rows(), opts_.step_tokens);
  planned_ = true;
  return plan;
}

void StepPolicy::plan_drafts(StepPlan& plan, const Drafts& drafts, const StepCost& cost) const {
  const size_t n = plan.decode.size();
  std::vector<std::vector<double>> offers(n);
  for (size_t i = 0; i < n; ++i) {
    drafts(plan.decode[i].id, offers[i]);
    for (size_t j = 0; j < offers[i].size(); ++j)
      MK_CHECK(offers[i][j] >= 0 && offers[i][j] <= 1 && (j == 0 || offers[i][j] <= offers[i][j - 1]),
               "sequence {}: draft {} offers {} expected tokens", plan.decode[i].id, j, offers[i][j]);
  }
  // Take offers one at a time, best first; remember after how many the
  // step promises the most tokens per cost. A draft row must promise 5% more
  // than the plain step: the estimates are noisy, and a row that does not
  // pay costs more than one that barely pays gains.
  constexpr double kMargin = 1.05;
  const int rows = plan.rows(), left = opts_.step_tokens - rows;
  std::vector<int> taken(n, 0);
  std::vector<size_t> order;
  double tokens = static_cast<double>(n);
  auto cost_of = [&](int r) {
    const double c = cost(r);
    MK_CHECK(c > 0, "the cost of a step of {} rows is {}", r, c);
    return c;
  };
  double best_rate = cost ? kMargin * tokens / cost_of(rows) : 0;
  size_t best = 0;
  for (int k = 1; k <= left; ++k) {
    size_t pick = n;
    for (size_t i = 0; i < n; ++i) {
      if (static_cast<size_t>(taken[i]) >= offers[i].size()) continue;
      if (pick == n) {
        pick = i;
        continue;
      }
      const double g = offers[i][static_cast<size_t>(taken[i])], bg = offers[pick][static_cast<size_t>(taken[pick])];
      if (g > bg || (g == bg && taken[i] < taken[pick])) pick = i;
    }
    if (pick == n) break;
    tokens += offers[pick][static_cast<size_t>(taken[pick]++)];
    order.push_back(pick);
    if (!cost) {
      best = order.size();
    } else if (const double rate = tokens / cost_of(rows + k); rate > best_rate) {
      best_rate = rate;
      best = order.size();
    }
  }
  for (size_t j = 0; j < best; ++j) ++plan.decode[order[j]].draft;
}

void StepPolicy::postprocess(const StepPlan& plan, const std::vector<SeqId>& finished, const std::vector<int>& accepted) {
  MK_CHECK(planned_, "postprocess() without a schedule()");
  planned_ = false;
  MK_CHECK(accepted.empty() || accepted.size() == plan.decode.size(), "{} accepted counts for {} decode rows",
           accepted.size(), plan.decode.size());
  for (size_t i = 0; i < plan.decode.size(); ++i) {
    const DecodeRow& d = plan.decode[i];
    Slot* s = find(d.id);
    if (!s) continue;  // removed during the step
    MK_CHECK(s->cached == d.pos, "sequence {} decoded at {} but holds {} positions", d.id, d.pos, s->cached);
    const int a = accepted.empty() ? 0 : accepted[i];
    MK_CHECK(a >= 0 && a <= d.draft, "sequence {}: {} of {} drafts accepted", d.id, a, d.draft);
    s->cached += 1 + a;
  }
  for (const PromptChunk& c : plan.prefill) {
    Slot* s = find(c.id);
    if (!s) continue;
    MK_CHECK(s->cached == c.begin, "sequence {} chunk at {} but holds {} positions", c.id, c.begin, s->cached);
    s->cached += c.n;
  }
  for (SeqId id : finished) remove(id);
}

// ---- DraftEstimates ------------------------------------------------------------

DraftEstimates::DraftEstimates(int max_rows) : step_s_(static_cast<size_t>(std::max(1, max_rows)) + 1, 0.0) {}

void DraftEstimates::record_step(int rows, double seconds) {
  if (rows < 1 || static_cast<size_t>(rows) >= step_s_.size() || !(seconds > 0)) return;
  constexpr double kSmooth = 0.2;
  double& t = step_s_[static_cast<size_t>(rows)];
  t = t > 0 ? (1 - kSmooth) * t + kSmooth * seconds : seconds;
  constexpr double kDecay = 0.995;  // a few hundred steps
  const double r = rows;
  w_ = w_ * kDecay + 1;
  sr_ = sr_ * kDecay + r;
  st_ = st_ * kDecay + seconds;
  srr_ = srr_ * kDecay + r * r;
  srt_ = srt_ * kDecay + r * seconds;
}

double DraftEstimates::step_cost(int rows) const {
  if (w_ > 0) {
    const double mr = sr_ / w_, mt = st_ / w_, var = srr_ / w_ - mr * mr;
    // Row counts spread by a quarter of a row at least: fit the line.
    if (var > 0.25) {
      const double b = std::max(0.0, (srt_ / w_ - mr * mt) / var), a = mt - b * mr;
      return std::max(a + b * rows, 0.05 * mt);
    }
  }
  size_t first = 1;
  while (first < step_s_.size() && step_s_[first] <= 0) ++first;
  if (first == step_s_.size()) return 0;
  if (rows < static_cast<int>(first)) return step_s_[first] * rows / static_cast<double>(first);
  int m = std::min(rows, static_cast<int>(step_s_.size()) - 1);
  while (step_s_[static_cast<size_t>(m)] <= 0) --m;  // stops at first
  return step_s_[static_cast<size_t>(m)] * (1.0 + 0.05 * (rows - m));
}

void DraftEstimates::gains(int match, int n, std::vector<double>& out) const {
  out.clear();
  double chain = 1;
  for (int i = 0; i < n; ++i) {
    chain *= acceptance_.alpha(match, i);
    out.push_back(chain);
  }
}

}  // namespace megakern::server
