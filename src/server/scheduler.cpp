#include "server/scheduler.h"

#include "core/units.h"

#include "core/zeroed_buffer.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/generation.h"
#include "runtime/model.h"
#include "runtime/engine.h"

namespace megakern::server {

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
  u.usage = {static_cast<int>(request.prompt.size()), completion_tokens_};
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

// One row of the batch: a sequence state and, while in use, the request it
// serves with that request's sampler and Generation (detokenizer, stop
// strings, limits).
struct Scheduler::BatchRow {
  SequenceState seq;
  std::shared_ptr<Job> job;  // null while free
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<Generation> gen;
};

Scheduler::Scheduler(const Model& model, ThreadPool& pool, const SchedulerOptions& opts)
    : model_(model), opts_(opts) {
  if (opts_.max_rows < 1) fail("--batch must be at least 1, got {}", opts_.max_rows);
  if (opts_.n_ctx < 2) fail("--context must be at least 2, got {}", opts_.n_ctx);
  if (opts_.queue_limit < 0) fail("--queue must be >= 0, got {}", opts_.queue_limit);
  engine_ = std::make_unique<Engine>(model_, pool, opts_.max_rows, opts_.executor);
  for (int i = 0; i < opts_.max_rows; ++i) {
    auto s = std::make_unique<BatchRow>();
    s->seq = model_.new_sequence(opts_.n_ctx);
    rows_.push_back(std::move(s));
  }
  // Each cache is committed only as it fills, and each alone was checked
  // against physical memory; all rows at full context must fit as well.
  double kv_bytes = 0;
  for (const auto& s : rows_)
    kv_bytes += static_cast<double>(s->seq.cache.k.size() + s->seq.cache.v.size()) * sizeof(float);
  if (const size_t phys = physical_memory_bytes(); phys > 0 && kv_bytes > static_cast<double>(phys))
    fail("--batch {} x --context {} needs KV caches of {} in all, more than the {} of physical memory: use a "
         "smaller --batch or --context",
         opts_.max_rows, opts_.n_ctx, human_bytes(kv_bytes), human_bytes(static_cast<double>(phys)));
  logits_.resize(static_cast<size_t>(opts_.max_rows) * static_cast<size_t>(engine_->n_vocab()));
  thread_ = std::thread([this] { loop(); });
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
      if (s->job && (cancel_everything || s->job->cancelled())) release(*s, FinishReason::Cancelled);
    if (cancel_everything) {
      std::lock_guard<std::mutex> lock(mu_);
      cancel_all_ = false;
      if (stop_) return;
      continue;
    }
    admit();
    if (std::any_of(rows_.begin(), rows_.end(), [](const auto& s) { return s->job != nullptr; })) decode_step();
  }
}

void Scheduler::admit() {
  for (auto& row : rows_) {
    if (row->job) continue;
    std::shared_ptr<Job> job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
      ++active_;
    }
    BatchRow& s = *row;
    s.job = job;
    const GenRequest& req = job->request;
    const auto& prompt = req.prompt;
    s.sampler = std::make_unique<Sampler>(req.sampling);
    GenerationParams gp;
    gp.max_tokens = req.max_tokens;
    gp.stop = req.stop;
    gp.ignore_eos = req.ignore_eos;
    const bool score = req.echo && req.logprobs >= 0;
    if (req.max_tokens == 0 && !score) {
      // Echo alone: nothing to compute.
      release(s, FinishReason::Length);
      continue;
    }
    const auto t0 = Clock::now();
    try {
      if (req.max_tokens > 0)
        s.gen = std::make_unique<Generation>(model_.tokenizer(), gp, static_cast<int>(prompt.size()), s.seq.n_ctx(),
                                             s.sampler.get());
      s.seq.clear();
      // The logits of the last prompt token land in row 0 of logits_; no
      // other row is live between steps.
      if (score)
        score_prompt(s);
      else
        engine_->prefill(s.seq, prompt.data(), static_cast<int>(prompt.size()), 0, logits_.data());
    } catch (const std::exception& e) {
      release(s, FinishReason::Error, fmt::format("prefill failed: {}", e.what()));
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.prefill_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      ++stats_.prefills;
      stats_.prompt_tokens += prompt.size();
    }
    if (!s.gen) {
      release(s, FinishReason::Length);  // max_tokens 0: the prompt scored, nothing generated
      continue;
    }
    take_token(s, logits_.data());
  }
}

void Scheduler::score_prompt(BatchRow& s) {
  const GenRequest& req = s.job->request;
  const std::vector<int32_t>& prompt = req.prompt;
  const int n = static_cast<int>(prompt.size());
  const int64_t V = engine_->n_vocab();
  // Chunks of whole blocks of max_rows positions (a recurrent model's
  // blocks then fall where prefill's do), of about 128 positions, so that
  // the logits held stay small whatever the prompt's length.
  const int rows = engine_->max_rows();
  const int chunk = std::max(1, 128 / rows) * rows;
  std::vector<float> buf(static_cast<size_t>(std::min(chunk, n)) * static_cast<size_t>(V));
  std::vector<TokenLogprob> entries;
  entries.reserve(static_cast<size_t>(n));
  TokenLogprob first;
  first.token = prompt[0];  // nothing predicts it: null
  entries.push_back(first);
  for (int i = 0; i < n; i += chunk) {
    const int m = std::min(chunk, n - i);
    engine_->teacher_forced_logits(s.seq, prompt.data() + i, m, i, m, buf.data());
    for (int r = 0; r < m; ++r) {
      const float* row = buf.data() + static_cast<size_t>(r) * static_cast<size_t>(V);
      if (i + r + 1 < n)
        entries.push_back(token_logprob(row, V, prompt[static_cast<size_t>(i + r + 1)], req.logprobs));
      else
        std::copy_n(row, V, logits_.data());
    }
  }
  s.job->add_logprobs(std::move(entries));
}

void Scheduler::decode_step() {
  const size_t V = static_cast<size_t>(engine_->n_vocab());
  std::vector<RowInput> rows;
  std::vector<BatchRow*> order;
  for (auto& s : rows_) {
    if (!s->job) continue;
    rows.push_back(s->seq.row(s->gen->last_token(), s->gen->position()));
    order.push_back(s.get());
  }
  const auto t0 = Clock::now();
  try {
    engine_->step(rows, logits_.data());
  } catch (const std::exception& e) {
    for (BatchRow* s : order) release(*s, FinishReason::Error, fmt::format("decode step failed: {}", e.what()));
    return;
  }
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps;
    stats_.step_rows += rows.size();
    stats_.step_seconds += dt;
  }
  for (size_t i = 0; i < order.size(); ++i) take_token(*order[i], logits_.data() + i * V);
}

void Scheduler::take_token(BatchRow& s, const float* logits) {
  Generation& g = *s.gen;
  const int before = g.generated();
  const int32_t token = g.sample(logits, engine_->n_vocab());
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
  if (d.done()) release(s, length ? FinishReason::Length : FinishReason::Stop);
}

void Scheduler::release(BatchRow& s, FinishReason reason, const std::string& error) {
  std::shared_ptr<Job> job = std::move(s.job);
  const int generated = s.gen ? s.gen->generated() : 0;
  s.gen.reset();
  s.sampler.reset();
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
