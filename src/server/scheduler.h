// Continuous batching with chunked prefill: one thread owns the Engine and
// the sequence states. Each iteration it asks the policy (server/
// step_policy.h, which holds no locks and does no I/O) for a step plan, runs
// ONE engine step whose rows are the newest token of every decoding sequence
// plus chunks of the prompts not yet computed, within --step-tokens rows,
// samples each decode row (and each prompt's last row) with its request's
// sampler, hands the new text to the request, and reports back to the
// policy. Finished, stopped and cancelled requests leave the batch at once,
// so their slots go to waiting requests on the next iteration.
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
#include "server/step_policy.h"

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
  // Prompt tokens the request did not compute (taken from a held prefix).
  void set_cached_tokens(int n);
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
  int cached_tokens_ = 0;
  std::string error_;
  std::atomic<bool> cancelled_{false};
  std::function<void()> listener_;  // under mu_
};

// How a step's prompt rows are bounded, measured with SmolLM2 135M (Q4_1,
// exact numerics, megakernel, 2 threads on a shared 2-core AVX-512 VNNI
// machine). `megakern bench --batch` gives a step's cost by rows, 1: 5.9 ms,
// 2: 5.9, 3: 7.2, 4: 9.1, 6: 13.9, 8: 14.8, 12: 23.4, 16: 35, 24: 49, 32: 57,
// 40: 71; prompt rows cost more than that at long positions (their
// attention: a 2000-token prompt in steps of 8 rows runs at 3.1 ms a row
// against 2.4 for 256 tokens) and pay the output head. In the server (scripts/
// bench_long_prompt.py, 4 streams, a 2000-token prompt arriving) 1.5 prompt
// rows per decode row, at least 6, made the steps with a chunk 3.2x to 4.3x a
// stream's gap before the prompt arrived; 1 per decode row, at least 4, 2.3x
// (median) and 3.2x (longest), 1.8x the stream's median gap. With nothing
// decoding, 32 rows a step reach the best prompt throughput (558 tokens/s
// against 560 at 40).
inline constexpr double kPromptRowsPerDecodeRow = 1;
inline constexpr int kMinPromptRows = 4;
inline constexpr int kDefaultStepTokens = 32;
// The fewest prompt rows of a step that go through a step of their own
// without the output head (Scheduler::run_step). Below that the second pass
// over the weights costs more than the head saves: per row the head is
// 136 M multiply-adds of Qwen2.5-Coder-0.5B's 494 M (28 M of SmolLM2's
// 135 M), while the extra pass reads the whole 0.4 GB (0.1 GB) once, about
// one batch-1 decode step, the time of 8 to 10 rows' heads.
inline constexpr int kHeadlessMinRows = 16;

struct SchedulerOptions {
  int max_rows = 8;        // sequences decoded together (decode rows of one step)
  // Rows of one engine step, decode rows and prompt rows together; 0: the
  // default, max(kDefaultStepTokens, max_rows + the least prompt chunk).
  int step_tokens = 0;
  // Prompt rows of a step that go through a head-less step of their own
  // when at least this many need no logits (INT_MAX: never).
  int headless_min_rows = kHeadlessMinRows;
  // Beside d decode rows, a step computes at most max(min_prompt_rows,
  // prompt_per_decode * d) prompt rows (PolicyOptions); with nothing to
  // decode, step_tokens of them.
  double prompt_per_decode = kPromptRowsPerDecodeRow;
  int min_prompt_rows = kMinPromptRows;
  int n_ctx = 2048;        // positions per sequence
  int queue_limit = 64;    // requests waiting for a row; more are refused
  std::string executor = "mega";
  // Prefix caching: a request starts in the free row whose sequence state
  // already holds the longest prefix of its prompt (an earlier chat turn, a
  // shared system prompt) and computes only the rest. Attention models only.
  bool prefix_cache = true;
  // Speculative decoding: each decoding sequence's drafter (make_drafter's
  // names, spec/drafter.h; one drafter per row) proposes up to `draft`
  // tokens each step, verified as rows of the same step (StepPolicy rule 4).
  // Greedy and sampled requests alike keep exactly the tokens they would
  // get without it. Empty: no speculation.
  std::string spec;
  int draft = 6;
  // Verify every draft that fits the step; otherwise only as many as are
  // expected to pay (DraftEstimates).
  bool fixed_draft = false;
};

// Counters for /metrics. Totals only grow; the gauges are current values.
struct SchedulerStats {
  uint64_t requests_submitted = 0;
  uint64_t requests_rejected = 0;  // queue full or shutting down
  uint64_t finished_stop = 0, finished_length = 0, finished_cancelled = 0, finished_error = 0;
  uint64_t prompt_tokens = 0;      // prefilled
  uint64_t generated_tokens = 0;   // sampled
  uint64_t steps = 0;              // engine steps
  uint64_t step_rows = 0;          // rows over all steps, decode and prompt rows
  uint64_t prompt_rows = 0;        // of which prompt rows
  uint64_t mixed_steps = 0;        // steps with both decode rows and prompt rows
  uint64_t headless_rows = 0;      // prompt rows computed without the output head
  double step_seconds = 0;         // time in engine steps
  double prefill_seconds = 0;      // of which the prompt rows' share (by rows)
  uint64_t prefills = 0;           // prompts completed
  uint64_t prefix_hits = 0;        // requests that started on a held prefix
  uint64_t prefix_tokens = 0;      // prompt positions those did not recompute
  uint64_t prefix_lookup_tokens = 0;  // prompt tokens of every admitted request
  uint64_t draft_tokens = 0;       // draft tokens verified (draft rows of steps)
  uint64_t accepted_tokens = 0;    // of which accepted
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
  // Moves queued jobs into the policy while it has slots for them.
  void take_queued();
  // Sets up the row of a sequence the policy just admitted.
  void start(BatchRow& s, int reused);
  // Leading positions of waiting sequence id's prompt that row `slot`'s
  // state holds and may reuse (the policy's Reuse).
  int reusable(SeqId id, int slot) const;
  // Runs one plan through the engine and samples; returns the sequences
  // whose generation ended.
  // accepted[i] receives the drafts accepted for plan.decode[i].
  std::vector<SeqId> run_step(const StepPlan& plan, std::vector<int>& accepted);
  // --spec: makes every row's drafter and checks they fit the model.
  void setup_spec(ThreadPool& pool);
  // Samples a batch row's next token from its logits and hands the text to its
  // request; true when the generation is over (the row is then released).
  // `sampled`, when given, receives the token.
  bool take_token(BatchRow& s, const float* logits, int32_t* sampled = nullptr);
  // --spec: the drafts decoding row s offers for the next step (its
  // proposal in s.draft), as StepPolicy::Drafts wants them.
  void offer_drafts(BatchRow& s, std::vector<double>& gains);
  void propose(BatchRow& s);  // fills s.draft; throws when the drafter fails
  void release(BatchRow& s, FinishReason reason, const std::string& error = {});

  const Model& model_;
  SchedulerOptions opts_;
  std::unique_ptr<Engine> engine_;
  std::vector<std::unique_ptr<BatchRow>> rows_;  // max_rows of them: the policy's slots
  std::vector<float> logits_;                 // [step_tokens][n_vocab]
  std::vector<float> taps_;                   // drafters on target taps: [step_tokens][tap width]
  std::unique_ptr<DraftEstimates> estimates_;  // --spec without fixed_draft
  // Owned by the scheduler thread (like the rows): no lock.
  std::unique_ptr<StepPolicy> policy_;
  SeqId next_id_ = 1;
  // Admitted by the policy but not yet given a row: id -> job, in order.
  std::deque<std::pair<SeqId, std::shared_ptr<Job>>> admitting_;

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
