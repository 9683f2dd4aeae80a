// Continuous batching: one thread owns the Engine and the sequence states.
// Each iteration it admits queued requests (prefill), then runs ONE engine
// step over the newest token of every active sequence, each sequence one row,
// samples each row with its request's sampler, and hands the new text to the
// request. Finished, stopped and cancelled requests leave the batch at once,
// so their rows go to waiting requests on the next iteration.
//
// Thread safety: submit(), cancel(), begin_shutdown(), stats() and the Job
// accessors may be called from any thread; everything else is private to the
// scheduler thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/api.h"

namespace megakern {
class Model;
class ThreadPool;
class Engine;
struct SequenceState;
}  // namespace megakern

namespace megakern::server {

using Clock = std::chrono::steady_clock;

// One generation request as the scheduler and the HTTP thread serving it
// share it. The scheduler appends text and finally marks it finished; the
// HTTP thread takes the text as it comes, and may cancel.
class Job {
 public:
  explicit Job(GenRequest req) : request(std::move(req)), submitted(Clock::now()) {}
  const GenRequest request;
  const Clock::time_point submitted;

  // What take() hands over: text produced since the last call, and once the
  // request is over, how it ended.
  struct Update {
    std::string text;
    // Log-probabilities (requests that ask for them) of the tokens produced
    // since the last call: with echo, the prompt's first; then one per
    // generated token, in order. A token's entry may come before its text
    // does (text held back by a stop string or an incomplete character).
    std::vector<TokenLogprob> logprobs;
    bool finished = false;
    FinishReason finish = FinishReason::Stop;
    Usage usage;
    std::string error;  // set when finish is Error
  };
  // Waits until there is new text or the job is finished, at most `timeout`.
  Update take(std::chrono::milliseconds timeout);
  // Waits for the end and returns all text not yet taken.
  Update wait_all();
  bool finished() const;
  // Called (from the scheduler thread, without locks held) whenever text is
  // appended or the job finishes, so that an event loop can take it without
  // waiting; set it before the job can produce anything, or expect the
  // first call to come late and take() what is already there.
  void set_listener(std::function<void()> f);

  // Asks the scheduler to drop the request (client gone). Idempotent.
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

  // Scheduler side. `logprob`, when not null, is the entry of the token
  // that produced `text`; add_logprobs() adds entries without text (a
  // prompt's, before its first generated token).
  void append(const std::string& text, int completion_tokens, const TokenLogprob* logprob = nullptr);
  void add_logprobs(std::vector<TokenLogprob> entries);
  void finish(FinishReason reason, int completion_tokens, const std::string& error = {});

 private:
  Update take_locked();  // with mu_ held
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string pending_;
  std::vector<TokenLogprob> pending_logprobs_;
  bool finished_ = false;
  FinishReason finish_ = FinishReason::Stop;
  int completion_tokens_ = 0;
  std::string error_;
  std::atomic<bool> cancelled_{false};
  std::function<void()> listener_;  // under mu_
};

struct SchedulerOptions {
  int max_rows = 8;        // sequences decoded together (rows of one step)
  int n_ctx = 2048;        // positions per sequence
  int queue_limit = 64;    // requests waiting for a row; more are refused
  std::string executor = "mega";
};

// Counters for /metrics. Totals only grow; the gauges are current values.
struct SchedulerStats {
  uint64_t requests_submitted = 0;
  uint64_t requests_rejected = 0;  // queue full or shutting down
  uint64_t finished_stop = 0, finished_length = 0, finished_cancelled = 0, finished_error = 0;
  uint64_t prompt_tokens = 0;      // prefilled
  uint64_t generated_tokens = 0;   // sampled
  uint64_t steps = 0;              // engine steps
  uint64_t step_rows = 0;          // rows over all steps
  double step_seconds = 0;         // time in engine steps
  double prefill_seconds = 0;
  uint64_t prefills = 0;
  int queue_depth = 0;
  int active = 0;
};

class Scheduler {
 public:
  // Builds the engine (program for max_rows rows) and the sequence states,
  // and starts the scheduler thread.
  Scheduler(const Model& model, ThreadPool& pool, const SchedulerOptions& opts);
  // Cancels whatever is left and joins the thread.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; nullptr when the queue is full or the scheduler is
  // shutting down (the caller answers 503).
  std::shared_ptr<Job> submit(GenRequest req);
  // Wakes the scheduler so that it notices cancelled jobs promptly.
  void notify();

  // Refuses new requests from now on; queued and active ones continue.
  void begin_shutdown();
  // Cancels every queued and active request.
  void cancel_all();
  // True when nothing is queued or active.
  bool idle() const;

  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return opts_; }

 private:
  struct BatchRow;
  void loop();
  void admit();
  void decode_step();
  // Samples a batch row's next token from its logits and hands the text to its
  // request, releasing the row when the generation is over.
  void take_token(BatchRow& s, const float* logits);
  // Echo with logprobs: computes every position of the row's prompt by
  // teacher forcing, hands the prompt tokens' log-probabilities to its job,
  // and leaves the last position's logits in row 0 of logits_ and the
  // sequence as prefill would.
  void score_prompt(BatchRow& s);
  void release(BatchRow& s, FinishReason reason, const std::string& error = {});

  const Model& model_;
  SchedulerOptions opts_;
  std::unique_ptr<Engine> engine_;
  std::vector<std::unique_ptr<BatchRow>> rows_;  // max_rows of them
  std::vector<float> logits_;                 // [max_rows][n_vocab]

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool accepting_ = true;
  bool stop_ = false;
  bool cancel_all_ = false;  // cancel_all() asked; the scheduler thread clears it
  int active_ = 0;
  SchedulerStats stats_;
  std::thread thread_;
};

}  // namespace megakern::server
