// The server's scheduling policy, apart from everything that makes it run:
// which sequences hold a row slot, which of them decode in the next engine
// step, and which chunks of their prompts are computed next to those decode
// rows, within a budget of rows per step. It has no threads, locks, clocks
// or model; the scheduler thread (server/scheduler.h) calls schedule(), runs
// the plan through the engine, samples, and reports back with postprocess().
//
// Rules, in the order schedule() applies them:
//  1. Waiting sequences take free slots in the order they were added. With
//     a reuse callback (prefix caching), each takes the free slot whose
//     state already holds the longest prefix of its prompt, and starts
//     with those positions computed; among slots holding nothing of it, the
//     one released longest ago (so recently used states are kept longest).
//     A reused prefix leaves at least the prompt's last position to compute
//     (its logits give the first token) and, with a prompt block, is a whole
//     number of blocks.
//  2. Every sequence whose prompt is done decodes one row (its newest token).
//  3. The rows left in the budget go to the prompts not yet done, the one
//     with the fewest tokens left first (then the oldest): each gets the
//     next chunk of its prompt, as many positions as fit. A short request
//     arriving while a long prompt is computed so starts at once instead of
//     after it; the long one cannot be put off for long, since a short
//     prompt soon decodes and only free slots let new ones in. The budget is step_tokens minus the decode rows and, when some
//     sequence decodes and prompt_per_decode > 0, at most
//     max(min_prompt_rows, prompt_per_decode x decode rows): on a machine
//     where a step's cost grows with its rows, a chunk in proportion to the
//     decode rows bounds how much longer than a plain decode step a step
//     with a chunk is, whether one sequence decodes or a full batch. With
//     nothing decoding, a prompt takes the whole step. With a prompt block (recurrent
//     models), a chunk is exactly the next block of prompt_block positions
//     counted from position 0 (the prompt's tail may be shorter) and a prompt
//     whose next block does not fit waits: a recurrent model's rows of one
//     sequence in one step are computed in a chunked form that depends on the
//     block, so fixed blocks keep its output the same whatever else is in the
//     step.
//  4. Speculative decoding: the rows still left go to draft rows, each the
//     verify of one draft token after a decoding sequence's newest token
//     (its decode row and its draft rows form one verify block). Each
//     decoding sequence offers its drafts with the tokens each is expected
//     to add (the chance that it and every draft before it are accepted);
//     the offers are taken best first (equal ones spread evenly over the
//     sequences, the fewest taken first, then slot order), a sequence's
//     drafts always as a prefix. With a step cost, as many are taken as give
//     the most expected tokens per cost of the whole step (none when a plain
//     step does best); without one, every draft that fits. So when the rows
//     cannot hold every sequence's drafts, the likeliest drafts are verified
//     and the rest of each proposal is left out: drafts never take rows from
//     decode rows or prompt chunks.
// Since decode rows always come first and the budget leaves room for at
// least one chunk beside a full decode batch, a long prompt delays the other
// sequences by the cost of one step of step_tokens rows, never by its whole
// prompt.
//
// Not thread-safe: one thread owns a StepPolicy.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "spec/graded_acceptance.h"

namespace megakern::server {

struct PolicyOptions {
  int max_seqs = 8;       // sequences holding a slot at once (rows of a decode step)
  int step_tokens = 32;   // rows of one engine step: decode rows plus prompt rows
  int prompt_block = 0;   // > 0: prompt chunks are whole blocks of this many positions
  // Prompt rows beside d > 0 decode rows: at most max(min_prompt_rows,
  // prompt_per_decode * d) (and what step_tokens leaves); 0: no such limit.
  double prompt_per_decode = 0;
  int min_prompt_rows = 1;  // raised to prompt_block when that is larger
};

using SeqId = uint64_t;

// One decode row: the sequence's newest token at position `pos`, and
// `draft` rows after it verifying the first `draft` tokens it proposed (at
// positions pos + 1 .. pos + draft).
struct DecodeRow {
  SeqId id = 0;
  int slot = 0;
  int pos = 0;
  int draft = 0;
};

// Prompt positions [begin, begin + n) of one sequence; `last` when they end
// its prompt (the last row's logits then give the first generated token).
struct PromptChunk {
  SeqId id = 0;
  int slot = 0;
  int begin = 0;
  int n = 0;
  bool last = false;
};

// What one engine step computes. Its rows are the decode rows in order (each
// followed by its draft rows), then each chunk's rows in order; `admitted` lists the sequences that took a
// slot in this schedule() (their chunks, if any, are in `prefill`).
struct StepPlan {
  struct Admission {
    SeqId id = 0;
    int slot = 0;
    int reused = 0;  // leading prompt positions the slot's state already held
  };
  std::vector<Admission> admitted;
  std::vector<DecodeRow> decode;
  std::vector<PromptChunk> prefill;
  int rows() const;
  int prompt_rows() const;
  int draft_rows() const;
  bool empty() const { return decode.empty() && prefill.empty(); }
};

class StepPolicy {
 public:
  // Throws megakern::Error naming the option when the budget cannot hold a
  // full decode batch and a chunk beside it (step_tokens < max_seqs +
  // max(1, prompt_block)), or when a value is below 1 (prompt_block and
  // prompt_per_decode below 0).
  explicit StepPolicy(const PolicyOptions& opts);

  // Queues a sequence whose prompt has prompt_len tokens (at least 1); ids
  // are the caller's and must be unique among the sequences held.
  void add(SeqId id, int prompt_len);
  // Forgets a sequence wherever it is (cancelled, failed): its slot is free
  // for the next schedule(). False when it is not held. Allowed between
  // schedule() and postprocess(): the plan's rows of that sequence are then
  // ignored by postprocess().
  bool remove(SeqId id);

  // How many leading positions of waiting sequence `id`'s prompt the state
  // of free slot `slot` holds computed (0: none). Asked at admission only.
  using Reuse = std::function<int(SeqId id, int slot)>;
  // Speculative decoding (rule 4): the drafts decoding sequence `id` offers
  // for this step, as the expected tokens each adds (`gains`, cleared
  // before the call, at most one per draft proposed, each in [0, 1] and
  // none above the one before).
  using Drafts = std::function<void(SeqId id, std::vector<double>& gains)>;
  // The cost of an engine step of `rows` rows (any unit, > 0).
  using StepCost = std::function<double(int rows)>;

  // The next step. Empty when nothing can run (no sequences held). Must be
  // followed by postprocess() before the next schedule(). Without `reuse`
  // every prompt is computed from position 0 in the first free slot;
  // without `drafts` no draft rows are planned; without `cost` every draft
  // that fits is.
  StepPlan schedule(const Reuse& reuse = {}, const Drafts& drafts = {}, const StepCost& cost = {});
  // Accounts for the step that ran `plan` (the last schedule()): decode rows
  // advance their sequence by one position plus accepted[i] for
  // plan.decode[i] (the drafts accepted, at most its draft rows; empty: none),
  // chunks advance their prompt, and a last chunk makes its sequence decode
  // from the next step on. Sequences in `finished` (their generation ended on
  // this step's row) leave and free their slots.
  void postprocess(const StepPlan& plan, const std::vector<SeqId>& finished, const std::vector<int>& accepted = {});

  const PolicyOptions& options() const { return opts_; }
  int free_slots() const;
  int waiting() const { return static_cast<int>(waiting_.size()); }
  int running() const;  // sequences holding a slot
  bool empty() const { return waiting_.empty() && running() == 0; }
  // Positions of the sequence computed so far (its prompt's done part, then
  // each decoded token); -1 when it is not held or still waiting.
  int cached(SeqId id) const;

 private:
  struct Slot {
    bool used = false;
    SeqId id = 0;
    int prompt_len = 0;
    int cached = 0;        // positions computed: prompt first, then decoded tokens
    uint64_t order = 0;    // admission order, to break ties between prompts
    uint64_t released = 0; // while free: when it was last released (0: never used)
    bool decoding() const { return cached >= prompt_len; }
  };
  struct Waiting {
    SeqId id;
    int prompt_len;
  };
  Slot* find(SeqId id);
  const Slot* find(SeqId id) const;
  // Rule 4: adds draft rows to the plan's decode rows.
  void plan_drafts(StepPlan& plan, const Drafts& drafts, const StepCost& cost) const;

  PolicyOptions opts_;
  std::vector<Slot> slots_;  // max_seqs of them
  std::deque<Waiting> waiting_;
  uint64_t next_order_ = 0;
  uint64_t next_release_ = 1;
  bool planned_ = false;  // schedule() called, postprocess() not yet
};

// Speculative decoding's estimates for the server, without clocks: the
// cost of a step by its rows, from measured times, and the chance that a
// draft is accepted, by grade (spec/graded_acceptance.h).
class DraftEstimates {
 public:
  explicit DraftEstimates(int max_rows);
  // A step of `rows` rows took `seconds`.
  void record_step(int rows, double seconds);
  // The expected seconds of a step of `rows` rows. Once steps of different
  // row counts were measured: a straight line a + b x rows fitted to the
  // recent steps (least squares, old steps fading), which one noisy step or
  // a row count measured once cannot bend much; a is what a step costs
  // whatever its rows (the weights read once), the saving draft rows live
  // on. Before: the smoothed measurement, or for a row count never measured
  // an optimistic guess (so that it gets tried): in proportion to the rows
  // below the fewest measured, else 5% a row above the nearest measured
  // count below it. 0 when nothing was measured yet.
  double step_cost(int rows) const;
  // Draft `index` of a proposal of grade `match` was judged against the
  // target's token: accepted or not. The sequences share the estimates, so
  // old judgements fade slowly (0.98 a judgement of the grade).
  void judge(int match, int index, bool accepted) { acceptance_.judge(match, index, accepted); }
  // The chance that a draft of that grade is accepted once those before it
  // were (GradedAcceptance::alpha).
  double alpha(int match, int index) const { return acceptance_.alpha(match, index); }
  // The expected tokens drafts 0..n-1 of a proposal of grade `match` add.
  void gains(int match, int n, std::vector<double>& out) const;

 private:
  std::vector<double> step_s_;  // [rows]: smoothed seconds, 0 when not measured
  double w_ = 0, sr_ = 0, st_ = 0, srr_ = 0, srt_ = 0;  // decayed sums over steps: 1, rows, seconds, rows^2, rows x seconds
  GradedAcceptance acceptance_{0.98};
};

}  // namespace megakern::server
