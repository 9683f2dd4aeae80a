#include "server/scheduler.h"

#include "core/units.h"

#include "core/zeroed_buffer.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "runtime/generation.h"
#include "runtime/model.h"
#include "runtime/engine.h"
#include "spec/drafter.h"
#include "spec/speculative.h"

namespace megakern::server {

namespace {
// Echo with logprobs: every prompt row's logits are wanted.
bool scores_prompt(const GenRequest& r) { return r.echo && r.logprobs >= 0; }
}  // namespace

// ---- Job ---------------------------------------------------------------------

Job::Update Job::take(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return finished_ || !pending_.empty(); });
  return take_locked();
}

Job::Update Job::wait_all() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return finished_; });
  return take_locked();
}

Job::Update Job::take_locked() {
  Update u;
  u.text.swap(pending_);
  u.logprobs.swap(pending_logprobs_);
  u.finished = finished_;
  u.finish = finish_;
  u.usage = {static_cast<int>(request.prompt.size()), completion_tokens_, cached_tokens_};
  u.error = error_;
  return u;
}

bool Job::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

void Job::append(const std::string& text, int completion_tokens, const TokenLogprob* logprob) {
  std::function<void()> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ += text;
    if (logprob) pending_logprobs_.push_back(*logprob);
    completion_tokens_ = completion_tokens;
    if (!text.empty()) listener = listener_;
  }
  if (!text.empty()) cv_.notify_all();
  if (listener) listener();
}

void Job::add_logprobs(std::vector<TokenLogprob> entries) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& e : entries) pending_logprobs_.push_back(std::move(e));
}

void Job::set_cached_tokens(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  cached_tokens_ = n;
}

void Job::set_listener(std::function<void()> f) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(f);
}

void Job::finish(FinishReason reason, int completion_tokens, const std::string& error) {
  std::function<void()> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
    finish_ = reason;
    completion_tokens_ = completion_tokens;
    error_ = error;
    listener = listener_;
  }
  cv_.notify_all();
  if (listener) listener();
}

// ---- Scheduler -----------------------------------------------------------------

// One slot of the batch: a sequence state and, while in use, the request it
// serves with that request's sampler and Generation (detokenizer, stop
// strings, limits).
struct Scheduler::BatchRow {
  SequenceState seq;
  // The tokens of the positions seq holds computed, in order: the prompt
  // and generated tokens of the sequence it served last (or serves now).
  // Kept when the row is released, for the next request's prefix.
  std::vector<int32_t> held;
  SeqId id = 0;              // the policy's id of the sequence; 0 while free
  std::shared_ptr<Job> job;  // null while free
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<Generation> gen;  // null when only the prompt is scored (max_tokens 0)
  // Echo with logprobs: the prompt tokens' entries, gathered chunk by chunk
  // and handed to the job once the prompt is done.
  bool score = false;
  std::vector<TokenLogprob> prompt_logprobs;
  // --spec: this row's drafter (and draft model), made once; the proposal
  // for the next step and the context it continues (held, then the newest
  // token); recurrent models: the states after each draft row.
  std::unique_ptr<Model> draft_model;
  std::unique_ptr<Drafter> drafter;
  Draft draft;
  std::vector<int32_t> context;
  std::vector<RecurrentState> snapshots;
};

Scheduler::Scheduler(const Model& model, ThreadPool& pool, const SchedulerOptions& opts)
    : model_(model), opts_(opts) {
  if (opts_.max_rows < 1) fail("--batch must be at least 1, got {}", opts_.max_rows);
  if (opts_.n_ctx < 2) fail("--context must be at least 2, got {}", opts_.n_ctx);
  if (opts_.queue_limit < 0) fail("--queue must be >= 0, got {}", opts_.queue_limit);
  // A recurrent model's prompt goes in blocks of --batch positions, as it
  // always has here; the others' prompt rows may be cut anywhere.
  PolicyOptions po;
  po.max_seqs = opts_.max_rows;
  po.prompt_block = model_.recurrent() ? opts_.max_rows : 0;
  po.prompt_per_decode = opts_.prompt_per_decode;
  po.min_prompt_rows = opts_.min_prompt_rows;
  if (opts_.step_tokens == 0)
    opts_.step_tokens = std::max(kDefaultStepTokens, opts_.max_rows + std::max(1, po.prompt_block));
  if (opts_.step_tokens < 0) fail("--step-tokens must be positive, got {}", opts_.step_tokens);
  if (opts_.headless_min_rows < 1) fail("head-less prompt steps need at least 1 row, got {}", opts_.headless_min_rows);
  if (opts_.step_tokens > model_.max_program_rows())
    fail("--step-tokens {} is more rows than a step of {} can have ({}): use a smaller --step-tokens{}",
         opts_.step_tokens, model_.name(), model_.max_program_rows(),
         opts_.max_rows + std::max(1, po.prompt_block) > model_.max_program_rows() ? " and --batch" : "");
  po.step_tokens = opts_.step_tokens;
  policy_ = std::make_unique<StepPolicy>(po);
  engine_ = std::make_unique<Engine>(model_, pool, opts_.step_tokens, opts_.executor);
  for (int i = 0; i < opts_.max_rows; ++i) {
    auto s = std::make_unique<BatchRow>();
    s->seq = model_.new_sequence(opts_.n_ctx);
    rows_.push_back(std::move(s));
  }
  if (!opts_.spec.empty()) setup_spec(pool);
  // Each cache is committed only as it fills, and each alone was checked
  // against physical memory; all rows at full context must fit as well.
  double kv_bytes = 0;
  for (const auto& s : rows_)
    kv_bytes += static_cast<double>(s->seq.cache.bytes());
  if (const size_t phys = physical_memory_bytes(); phys > 0 && kv_bytes > static_cast<double>(phys))
    fail("--batch {} x --context {} needs KV caches of {} in all, more than the {} of physical memory: use a "
         "smaller --batch or --context",
         opts_.max_rows, opts_.n_ctx, human_bytes(kv_bytes), human_bytes(static_cast<double>(phys)));
  logits_.resize(static_cast<size_t>(opts_.step_tokens) * static_cast<size_t>(engine_->n_vocab()));
  if (engine_->tap_width() > 0) taps_.resize(static_cast<size_t>(opts_.step_tokens) * static_cast<size_t>(engine_->tap_width()));
  // Steps take any number of rows up to step_tokens; the megakernel compiles
  // a schedule per row count at its first use, which would land in the
  // middle of some stream. Compile them all now.
  for (int n = 1; n <= opts_.step_tokens; ++n) engine_->executor().prepare(n);
  thread_ = std::thread([this] { loop(); });
}

void Scheduler::setup_spec(ThreadPool& pool) {
  if (opts_.draft < 1 || opts_.draft > SpecOptions::kMaxDraft)
    fail("--draft must be in 1..{}, got {}", SpecOptions::kMaxDraft, opts_.draft);
  if (opts_.draft + 1 > opts_.step_tokens)
    fail("--draft {} needs {} rows of a step for one sequence's verify, more than --step-tokens {}", opts_.draft,
         opts_.draft + 1, opts_.step_tokens);
  // A ring layer keeps only its window's positions: the rows of rejected
  // drafts could overwrite positions the sequence still attends to.
  const auto& ring = rows_.front()->seq.cache.ring;
  if (std::any_of(ring.begin(), ring.end(), [](int r) { return r > 0; }))
    fail("--spec: {} has sliding-window layers, whose ring caches cannot take draft rows that may be rejected",
         model_.name());
  // Drafts are the drafter's most likely tokens, never sampled: a sampled
  // request then keeps its random stream and so its exact tokens (take_token
  // draws each verify row as plain decoding would, and a draft counts as
  // accepted when the drawn token is the draft).
  SamplingParams greedy;
  for (auto& s : rows_)
    s->drafter = make_drafter(opts_.spec, model_, pool, opts_.n_ctx, greedy, s->draft_model, opts_.executor);
  const Drafter& d = *rows_.front()->drafter;
  if (d.wants_taps()) {
    // The drafter sees the taps of every position: every prompt row goes
    // through the full program and from position 0 (no held prefix).
    engine_->enable_taps(d.tap_layers());
    opts_.headless_min_rows = std::numeric_limits<int>::max();
    opts_.prefix_cache = false;
  }
  if (!opts_.fixed_draft) estimates_ = std::make_unique<DraftEstimates>(opts_.step_tokens);
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    accepting_ = false;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<Job> Scheduler::submit(GenRequest req) {
  std::shared_ptr<Job> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A request counts against the queue until it gets a row: the queue is
    // full when more requests wait than there are free rows plus queue_limit.
    const int free_rows = opts_.max_rows - active_;
    if (!accepting_ || static_cast<int>(queue_.size()) >= opts_.queue_limit + std::max(0, free_rows)) {
      ++stats_.requests_rejected;
      return nullptr;
    }
    job = std::make_shared<Job>(std::move(req));
    queue_.push_back(job);
    ++stats_.requests_submitted;
    stats_.queue_depth = static_cast<int>(queue_.size());
  }
  cv_.notify_all();
  return job;
}

void Scheduler::notify() { cv_.notify_all(); }

void Scheduler::begin_shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  accepting_ = false;
}

void Scheduler::cancel_all() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    cancel_all_ = true;
  }
  cv_.notify_all();
}

bool Scheduler::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.empty() && active_ == 0;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerStats s = stats_;
  s.queue_depth = static_cast<int>(queue_.size());
  s.active = active_;
  return s;
}

void Scheduler::loop() {
  for (;;) {
    bool cancel_everything = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || cancel_all_ || active_ > 0 || !queue_.empty(); });
      cancel_everything = stop_ || cancel_all_;
      // Requests cancelled while waiting leave the queue without a row.
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (cancel_everything || (*it)->cancelled()) {
          ++stats_.finished_cancelled;
          (*it)->finish(FinishReason::Cancelled, 0);
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      if (stop_ && active_ == 0) return;
    }
    for (auto& s : rows_)
      if (s->job && (cancel_everything || s->job->cancelled())) {
        policy_->remove(s->id);
        release(*s, FinishReason::Cancelled);
      }
    if (cancel_everything) {
      std::lock_guard<std::mutex> lock(mu_);
      cancel_all_ = false;
      if (stop_) return;
      continue;
    }
    take_queued();
    StepPolicy::Drafts drafts;
    StepPolicy::StepCost cost;
    if (!opts_.spec.empty()) {
      for (auto& s : rows_) s->draft.clear();
      drafts = [this](SeqId id, std::vector<double>& gains) {
        for (auto& s : rows_)
          if (s->job && s->id == id) return offer_drafts(*s, gains);
      };
      // Costs once some step was measured (before, every draft that fits).
      if (estimates_ && estimates_->step_cost(1) > 0) cost = [this](int rows) { return estimates_->step_cost(rows); };
    }
    const StepPlan plan =
        policy_->schedule([this](SeqId id, int slot) { return reusable(id, slot); }, drafts, cost);
    for (const auto& a : plan.admitted) {
      BatchRow& s = *rows_[static_cast<size_t>(a.slot)];
      MK_CHECK(!s.job && !admitting_.empty() && admitting_.front().first == a.id,
               "the policy admitted sequence {} out of order", a.id);
      s.id = a.id;
      s.job = std::move(admitting_.front().second);
      admitting_.pop_front();
      start(s, a.reused);
    }
    MK_CHECK(admitting_.empty(), "{} queued sequences were not admitted", admitting_.size());
    std::vector<int> accepted;
    const std::vector<SeqId> finished = plan.empty() ? std::vector<SeqId>{} : run_step(plan, accepted);
    policy_->postprocess(plan, finished, accepted);
  }
}

void Scheduler::take_queued() {
  std::vector<std::shared_ptr<Job>> nothing_to_compute;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!queue_.empty() && policy_->free_slots() > policy_->waiting()) {
      std::shared_ptr<Job> job = std::move(queue_.front());
      queue_.pop_front();
      const GenRequest& req = job->request;
      if (req.max_tokens == 0 && !scores_prompt(req)) {
        // Echo alone: the text is the prompt, nothing to compute.
        ++stats_.finished_length;
        nothing_to_compute.push_back(std::move(job));
        continue;
      }
      ++active_;
      const SeqId id = next_id_++;
      policy_->add(id, static_cast<int>(req.prompt.size()));
      admitting_.emplace_back(id, std::move(job));
    }
  }
  for (auto& job : nothing_to_compute) job->finish(FinishReason::Length, 0);
}

int Scheduler::reusable(SeqId id, int slot) const {
  if (!opts_.prefix_cache || model_.recurrent()) return 0;  // a recurrent state cannot go back to a prefix
  const BatchRow& row = *rows_[static_cast<size_t>(slot)];
  const auto it = std::find_if(admitting_.begin(), admitting_.end(), [&](const auto& a) { return a.first == id; });
  if (it == admitting_.end()) return 0;
  const GenRequest& req = it->second->request;
  if (scores_prompt(req)) return 0;
  const auto& p = req.prompt;
  const size_t n = std::min(row.held.size(), p.size());
  const size_t same =
      static_cast<size_t>(std::mismatch(row.held.begin(), row.held.begin() + static_cast<std::ptrdiff_t>(n), p.begin()).first -
                          row.held.begin());
  // A ring layer (sliding window) has overwritten the slots of positions
  // before the held ones' window: only a prefix that is all the row holds
  // continues it exactly.
  if (!row.seq.cache.ring.empty() && same != row.held.size()) return 0;
  return static_cast<int>(same);
}

void Scheduler::start(BatchRow& s, int reused) {
  const GenRequest& req = s.job->request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.prefix_lookup_tokens += req.prompt.size();
    if (reused > 0) {
      ++stats_.prefix_hits;
      stats_.prefix_tokens += static_cast<uint64_t>(reused);
    }
  }
  s.held.resize(static_cast<size_t>(reused));
  if (reused > 0) s.job->set_cached_tokens(reused);
  s.sampler = std::make_unique<Sampler>(req.sampling);
  s.score = scores_prompt(req);
  s.prompt_logprobs.clear();
  if (s.score) {
    TokenLogprob first;
    first.token = req.prompt[0];  // nothing predicts it: null
    s.prompt_logprobs.push_back(first);
  }
  GenerationParams gp;
  gp.max_tokens = req.max_tokens;
  gp.stop = req.stop;
  gp.ignore_eos = req.ignore_eos;
  try {
    if (req.max_tokens > 0)
      s.gen = std::make_unique<Generation>(model_.tokenizer(), gp, static_cast<int>(req.prompt.size()), s.seq.n_ctx(),
                                           s.sampler.get());
  } catch (const std::exception& e) {
    policy_->remove(s.id);
    release(s, FinishReason::Error, fmt::format("prefill failed: {}", e.what()));
    return;
  }
  if (reused == 0) s.seq.clear();
  if (s.drafter) s.drafter->reset();
}

void Scheduler::offer_drafts(BatchRow& s, std::vector<double>& gains) {
  if (!s.drafter || !s.gen) return;
  try {
    propose(s);
  } catch (const std::exception& e) {
    // The step goes on without this sequence's drafts (plain decoding is
    // never wrong); the failure is reported.
    s.draft.clear();
    fmt::print(stderr, "megakern serve: drafter {} failed, sequence {} decodes plainly this step: {}\n",
               s.drafter->name(), s.id, e.what());
  }
  const int n = static_cast<int>(s.draft.tokens.size());
  if (estimates_)
    estimates_->gains(s.draft.match, n, gains);
  else
    gains.assign(static_cast<size_t>(n), 1.0);
}

void Scheduler::propose(BatchRow& s) {
  const int N = s.gen->position();
  // Drafts at N + 1 .. N + k: within the context, and no more than the
  // generation may still take after the token at N.
  const int k = std::min({opts_.draft, s.gen->remaining() - 1, s.seq.n_ctx() - 1 - N});
  if (k < 1) return;
  s.context.assign(s.held.begin(), s.held.end());
  MK_CHECK(static_cast<int>(s.context.size()) == N, "sequence {} holds {} tokens at position {}", s.id,
           s.context.size(), N);
  s.context.push_back(s.gen->last_token());
  s.drafter->propose(s.context, k, s.draft);
  if (static_cast<int>(s.draft.tokens.size()) > k) s.draft.tokens.resize(static_cast<size_t>(k));
  const int64_t V = engine_->n_vocab();
  for (int32_t t : s.draft.tokens)
    if (t < 0 || t >= V) fail("drafter {} proposed token {}, outside the vocabulary of {}", s.drafter->name(), t, V);
}

std::vector<SeqId> Scheduler::run_step(const StepPlan& plan, std::vector<int>& accepted) {
  const size_t V = static_cast<size_t>(engine_->n_vocab());
  accepted.assign(plan.decode.size(), 0);
  // Entries of the plan whose sequence failed to start have no row.
  auto live = [&](int slot, SeqId id) -> BatchRow* {
    BatchRow* s = rows_[static_cast<size_t>(slot)].get();
    if (s->job && s->id == id) return s;
    MK_CHECK(policy_->cached(id) < 0, "sequence {} is planned and held by the policy but has no row", id);
    return nullptr;
  };
  std::vector<RowInput> rows, headless;
  rows.reserve(static_cast<size_t>(plan.rows()));
  // Each decode row with its draft rows (a verify block): the plan's entry,
  // and where its rows start in the full step.
  struct Block {
    BatchRow* s;
    size_t entry;
    size_t first;
    int draft;
  };
  std::vector<Block> blocks;
  // Each chunk, and how many of its rows (its last ones) go through the full
  // program; the others go through the program without its output head.
  struct Chunk {
    BatchRow* s;
    const PromptChunk* c;
    int full;
  };
  std::vector<Chunk> chunks;
  for (size_t e = 0; e < plan.decode.size(); ++e) {
    const DecodeRow& d = plan.decode[e];
    BatchRow* s = live(d.slot, d.id);
    if (!s) continue;
    MK_CHECK(s->gen && s->gen->position() == d.pos, "sequence {}: the plan decodes position {}, the generation is at {}",
             d.id, d.pos, s->gen ? s->gen->position() : -1);
    MK_CHECK(d.draft <= static_cast<int>(s->draft.tokens.size()), "sequence {}: {} draft rows for {} drafts", d.id,
             d.draft, s->draft.tokens.size());
    blocks.push_back({s, e, rows.size(), d.draft});
    rows.push_back(s->seq.row(s->gen->last_token(), d.pos));
    // Draft row i verifies draft i - 1 at d.pos + i; a recurrent row starts
    // from the state the row before it left (a snapshot of its own).
    if (s->seq.recurrent)
      while (s->snapshots.size() < static_cast<size_t>(d.draft)) s->snapshots.push_back(s->seq.state);
    for (int i = 1; i <= d.draft; ++i) {
      RowInput row = s->seq.row(s->draft.tokens[static_cast<size_t>(i - 1)], d.pos + i);
      if (s->seq.recurrent) {
        row.state = &s->snapshots[static_cast<size_t>(i - 1)];
        row.state_in = rows.back().state;
      }
      rows.push_back(row);
    }
  }
  const size_t n_decode_rows = rows.size();
  // Prompt rows whose logits nobody reads (all but a prompt's last row,
  // unless the prompt is scored) skip the output head, a fifth to a quarter
  // of a small model's work per row, when there are enough of them to pay
  // for a second pass over the weights (the head-less step). A recurrent
  // model's chunk stays whole (its chunked form depends on the block): only
  // chunks that end before the prompt does go head-less.
  const bool recurrent = engine_->model().recurrent();
  int n_headless = 0;
  for (const PromptChunk& c : plan.prefill) {
    BatchRow* s = live(c.slot, c.id);
    if (!s) continue;
    int full = c.n;
    if (!s->score) full = c.last ? (recurrent ? c.n : 1) : 0;
    chunks.push_back({s, &c, full});
    n_headless += c.n - full;
  }
  if (n_headless < opts_.headless_min_rows) {
    for (Chunk& k : chunks) k.full = k.c->n;
    n_headless = 0;
  }
  for (const Chunk& k : chunks) {
    const auto& prompt = k.s->job->request.prompt;
    const PromptChunk& c = *k.c;
    for (int r = 0; r < c.n; ++r)
      (r < c.n - k.full ? headless : rows)
          .push_back(k.s->seq.row(prompt[static_cast<size_t>(c.begin + r)], c.begin + r));
  }
  std::vector<SeqId> finished;
  if (rows.empty() && headless.empty()) return finished;
  const auto t0 = Clock::now();
  try {
    if (!headless.empty()) engine_->step_headless(headless);
    const auto t1 = Clock::now();
    if (!rows.empty()) engine_->step(rows, logits_.data(), taps_.empty() ? nullptr : taps_.data());
    if (estimates_ && !rows.empty())
      estimates_->record_step(static_cast<int>(rows.size()), std::chrono::duration<double>(Clock::now() - t1).count());
  } catch (const std::exception& e) {
    // What the failed step wrote is unknown: these states hold nothing.
    for (const Block& b : blocks) {
      b.s->held.clear();
      finished.push_back(b.s->id);
      release(*b.s, FinishReason::Error, fmt::format("decode step failed: {}", e.what()));
    }
    for (const Chunk& k : chunks) {
      k.s->held.clear();
      finished.push_back(k.s->id);
      release(*k.s, FinishReason::Error, fmt::format("prefill failed: {}", e.what()));
    }
    return finished;
  }
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  const size_t n_rows = rows.size() + headless.size(), n_prompt = n_rows - n_decode_rows;
  // What each prompt's state now holds (before sampling, which may release it).
  for (const Chunk& k : chunks) {
    const auto& prompt = k.s->job->request.prompt;
    k.s->held.resize(static_cast<size_t>(k.c->begin));
    k.s->held.insert(k.s->held.end(), prompt.begin() + k.c->begin, prompt.begin() + k.c->begin + k.c->n);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps;
    stats_.step_rows += n_rows;
    stats_.prompt_rows += n_prompt;
    stats_.headless_rows += headless.size();
    if (n_prompt > 0 && !blocks.empty()) ++stats_.mixed_steps;
    stats_.step_seconds += dt;
    stats_.prefill_seconds += dt * static_cast<double>(n_prompt) / static_cast<double>(n_rows);
    stats_.prompt_tokens += n_prompt;
    for (const Chunk& k : chunks) stats_.prefills += k.c->last ? 1 : 0;
  }
  const size_t W = static_cast<size_t>(engine_->tap_width());
  uint64_t drafted = 0, drafts_accepted = 0;
  for (const Block& b : blocks) {
    BatchRow& s = *b.s;
    const SeqId id = s.id;  // release() clears it
    const int N = rows[b.first].pos;
    const Draft& draft = s.draft;
    // Row i gives the token after the anchor and drafts 0..i-1, drawn as
    // plain decoding draws it; draft i is accepted when that token is it,
    // and then row i + 1 holds the next token's logits. Every token drawn
    // judges the draft proposed for it (verified or not).
    int a = 0;
    bool done = false;
    for (int i = 0; i <= b.draft; ++i) {
      int32_t token = -1;
      done = take_token(s, logits_.data() + (b.first + static_cast<size_t>(i)) * V, &token);
      const bool hit = i < static_cast<int>(draft.tokens.size()) && token == draft.tokens[static_cast<size_t>(i)];
      if (estimates_ && i < static_cast<int>(draft.tokens.size())) estimates_->judge(draft.match, i, hit);
      if (hit && i < b.draft) ++a;
      if (done || !hit) break;
    }
    drafted += static_cast<uint64_t>(b.draft);
    drafts_accepted += static_cast<uint64_t>(a);
    // The state holds the anchor and the accepted drafts (the rows after
    // them are overwritten by the next step); a recurrent state is the
    // snapshot after the last accepted one.
    s.held.resize(static_cast<size_t>(N));
    s.held.push_back(rows[b.first].token);
    s.held.insert(s.held.end(), draft.tokens.begin(), draft.tokens.begin() + a);
    if (done) {
      finished.push_back(id);
      continue;
    }
    accepted[b.entry] = a;
    if (s.seq.recurrent && a > 0) {
      const RecurrentState& st = s.snapshots[static_cast<size_t>(a - 1)];
      std::copy(st.conv.begin(), st.conv.end(), s.seq.state.conv.begin());
      std::copy(st.S.begin(), st.S.end(), s.seq.state.S.begin());
    }
    if (W > 0) s.drafter->observe_taps(taps_.data() + b.first * W, a + 1, N);
  }
  if (!blocks.empty() && !opts_.spec.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.draft_tokens += drafted;
    stats_.accepted_tokens += drafts_accepted;
  }
  size_t at = n_decode_rows;  // the chunk's first row in the full step
  for (const Chunk& k : chunks) {
    BatchRow* s = k.s;
    const PromptChunk* c = k.c;
    const GenRequest& req = s->job->request;
    const int n_prompt_tokens = static_cast<int>(req.prompt.size());
    if (s->score)
      for (int r = 0; r < c->n; ++r) {
        const int next = c->begin + r + 1;  // the prompt token this row's logits predict
        if (next < n_prompt_tokens)
          s->prompt_logprobs.push_back(token_logprob(logits_.data() + (at + static_cast<size_t>(r)) * V,
                                                     engine_->n_vocab(), req.prompt[static_cast<size_t>(next)],
                                                     req.logprobs));
      }
    // Drafters on taps see every prompt row (all in the full step).
    if (W > 0 && s->drafter) s->drafter->observe_taps(taps_.data() + at * W, c->n, c->begin);
    const float* last = logits_.data() + (at + static_cast<size_t>(k.full) - 1) * V;
    at += static_cast<size_t>(k.full);
    if (!c->last) continue;
    if (s->score) s->job->add_logprobs(std::move(s->prompt_logprobs));
    const SeqId id = s->id;
    if (!s->gen) {
      release(*s, FinishReason::Length);  // max_tokens 0: the prompt scored, nothing generated
      finished.push_back(id);
    } else if (take_token(*s, last)) {
      finished.push_back(id);
    }
  }
  return finished;
}

bool Scheduler::take_token(BatchRow& s, const float* logits, int32_t* sampled) {
  Generation& g = *s.gen;
  const int before = g.generated();
  const int32_t token = g.sample(logits, engine_->n_vocab());
  if (sampled) *sampled = token;
  const Delta& d = g.push(token);
  if (d.generated > before) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.generated_tokens;
  }
  // A counted token's log-probability under the logits it was sampled from
  // (the model's, before the sampler's temperature and top-p).
  const int top = s.job->request.logprobs;
  if (top >= 0 && d.generated > before) {
    const TokenLogprob lp = token_logprob(logits, engine_->n_vocab(), token, top);
    s.job->append(d.text, d.generated, &lp);
  } else {
    s.job->append(d.text, d.generated);
  }
  const bool length = d.stop == StopReason::MaxTokens || d.stop == StopReason::ContextFull;
  if (!d.done()) return false;
  release(s, length ? FinishReason::Length : FinishReason::Stop);
  return true;
}

void Scheduler::release(BatchRow& s, FinishReason reason, const std::string& error) {
  std::shared_ptr<Job> job = std::move(s.job);
  const int generated = s.gen ? s.gen->generated() : 0;
  s.id = 0;
  s.gen.reset();
  s.sampler.reset();
  s.score = false;
  s.prompt_logprobs.clear();
  // The counters move before the job is marked finished, so that a client
  // who has its answer sees them include it.
  {
    std::lock_guard<std::mutex> lock(mu_);
    --active_;
    switch (reason) {
      case FinishReason::Stop: ++stats_.finished_stop; break;
      case FinishReason::Length: ++stats_.finished_length; break;
      case FinishReason::Cancelled: ++stats_.finished_cancelled; break;
      case FinishReason::Error: ++stats_.finished_error; break;
    }
  }
  job->finish(reason, generated, error);
}

}  // namespace megakern::server
