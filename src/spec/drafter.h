// Drafters for speculative decoding: cheap guesses at the next few tokens of
// a sequence, which the target model then checks in one verify step
// (spec/speculative.h).
//
//  - NgramDrafter: prompt lookup. The last n tokens (n = max_n..min_n) are
//    looked up earlier in the sequence (prompt and generated text) in an
//    index of n-grams kept as the sequence grows; the tokens that followed
//    the most recent occurrence of the longest matching one are proposed,
//    copied on past the end of the sequence when the proposal overtakes it.
//    Each proposal says how long a suffix it continues (Draft::match), from
//    which the generator judges how much of it is worth verifying.
//  - ModelDrafter: a small model run autoregressively over its own cache. It
//    is either a separate model sharing the target's vocabulary ("draft
//    model"), or the target itself with some layers skipped ("self-drafting":
//    the same weights, a shorter program, its own KV cache and state).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "exec/executor.h"
#include "ir/program.h"
#include "runtime/model.h"
#include "runtime/sampler.h"

namespace megakern {

class ThreadPool;

// A sparse distribution over token ids: (id, probability) pairs summing to 1,
// as Sampler::distribution returns them.
using TokenDist = std::vector<std::pair<int32_t, double>>;

// A uniform double in [0, 1) from the top 53 bits (as Sampler draws).
double uniform01(std::mt19937_64& rng);
// The token where the cumulative probability of `dist`, in its order, first
// exceeds u (the last token when rounding leaves the sum short of u).
int32_t draw(const TokenDist& dist, double u);

// One proposal: up to k tokens continuing the sequence. `dists`, when not
// empty, holds for each token the distribution q it was drawn from (random
// drafters); when empty the drafter is deterministic and q is one-hot on the
// proposed token.
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<TokenDist> dists;
  // Drafters that grade their proposals (Drafter::grades_drafts): how many
  // tokens at the end of the context the proposal's source agrees with (for
  // prompt lookup, the length of the matched suffix, at most kMaxMatch). 0:
  // no grade.
  static constexpr int kMaxMatch = 64;
  int match = 0;
  void clear() {
    tokens.clear();
    dists.clear();
    match = 0;
  }
};

class Drafter {
 public:
  virtual ~Drafter();
  virtual std::string name() const = 0;
  // Proposes up to k tokens that follow `context` (the whole sequence so far,
  // prompt and generated tokens; its last token is the one the next verify
  // step starts from). An empty proposal is allowed.
  virtual void propose(const std::vector<int32_t>& context, int k, Draft& out) = 0;
  // Takes in a prompt before the first proposal (a model drafter computes
  // it), so that proposals cost only the drafting itself.
  virtual void prepare(const std::vector<int32_t>& context) { (void)context; }
  // How many tokens of the last proposal the target accepted.
  virtual void accepted(int n_accepted) { (void)n_accepted; }
  // True when proposals cost next to nothing, are deterministic (one-hot q)
  // and carry a grade (Draft::match): the generator then asks for the most
  // tokens it could verify and chooses how many of them to verify from the
  // acceptance it has seen at that grade.
  virtual bool grades_drafts() const { return false; }
  // Forgets any per-sequence state (a new prompt follows).
  virtual void reset() {}
  // Drafters conditioned on the target's hidden states (spec/block_drafter.h)
  // name the target layers whose residual stream they need; the generator
  // then runs the target with taps after those layers (Engine::enable_taps)
  // and hands over, after the prompt pass and after each verify, the taps of
  // the positions that are now final: taps [n_rows][n_taps * H_target] of
  // positions pos0..pos0+n_rows-1 (the anchor and the accepted drafts, never
  // a rejected one). Empty (the default): no taps.
  virtual const std::vector<int>& tap_layers() const {
    static const std::vector<int> none;
    return none;
  }
  bool wants_taps() const { return !tap_layers().empty(); }
  virtual void observe_taps(const float* taps, int n_rows, int pos0) {
    (void)taps;
    (void)n_rows;
    (void)pos0;
  }
};

// Prompt lookup over the context itself.
//
// Every n-gram (n = min_n..max_n) of the context that has a token after it is
// kept in a hash index under its most recent end position; the index follows
// the context as it grows (each new token adds max_n - min_n + 1 entries), so
// a proposal costs O(max_n + k) whatever the context's length. A context that
// is not a continuation of the one indexed (a new prompt, or another
// sequence) is indexed afresh.
//
// A proposal continues the longest suffix of the context (n = max_n first)
// found earlier in it: at the most recent occurrence, or for a max_n-gram at
// the one of its last kCandidates occurrences that agrees furthest back with
// the context's end; the tokens that followed that occurrence, up to k. When they run into the end of the
// context the copy goes on from the proposal itself (the text repeating with
// the period the match implies). Draft::match is the length of the agreement
// between the context's end and the occurrence, counted back past max_n (up
// to Draft::kMaxMatch): how strongly the text is being repeated.
class NgramDrafter final : public Drafter {
 public:
  // Suffix lengths tried, longest first. Throws unless 1 <= min_n <= max_n <= 64.
  explicit NgramDrafter(int max_n = 3, int min_n = 1);
  std::string name() const override;
  void propose(const std::vector<int32_t>& context, int k, Draft& out) override;
  void reset() override;
  bool grades_drafts() const override { return true; }

 private:
  // Brings the index to `context`: adds the n-grams ending at positions
  // indexed_..L-2 (those with a token after them), first re-indexing from
  // scratch when context does not begin with the tokens indexed so far.
  void index(const std::vector<int32_t>& context);
  int max_n_, min_n_;
  std::vector<int32_t> seen_;  // the context the index was built from
  int indexed_ = 0;            // n-grams ending before this position are indexed
  std::unordered_map<uint64_t, int32_t> last_end_;  // hash of (n, n-gram) -> most recent end position
  // For positions p where a max_n-gram ends: the previous end of the same
  // max_n-gram (or of one with the same hash), -1 if none.
  std::vector<int32_t> prev_end_;
  static constexpr int kCandidates = 8;  // occurrences of a max_n-gram compared per proposal
};

// The program a self-drafter runs: `program` with the ops of every layer l
// where keep[l] is false removed. Each layer adds its output to the residual
// stream, so without its ops the stream passes through unchanged; the KV
// cache and recurrent state layout is kept (skipped layers' entries are
// simply never touched). Throws if keep does not have one entry per layer or
// keeps none.
DecodeProgram skip_layers(const DecodeProgram& program, const std::vector<bool>& keep);
// The default layer choice of self-drafting: the first n_keep - 1 layers
// and the last one (the last layer shapes the output distribution most).
std::vector<bool> first_and_last_layers(int n_layer, int n_keep);

// A model drafting for the target: draws (greedy or with `sampling`) one
// token per single-row step of its program.
class ModelDrafter final : public Drafter {
 public:
  // A separate draft model; throws unless its vocabulary size equals
  // target_vocab. The model must outlive the drafter.
  ModelDrafter(const Model& draft, int target_vocab, ThreadPool& pool, int n_ctx, const SamplingParams& sampling,
               const std::string& executor = "mega");
  // Self-drafting: `model`'s own program with only the layers in `keep`.
  ModelDrafter(const Model& model, const std::vector<bool>& keep, ThreadPool& pool, int n_ctx,
               const SamplingParams& sampling, const std::string& executor = "mega");
  ModelDrafter(const ModelDrafter&) = delete;
  ModelDrafter& operator=(const ModelDrafter&) = delete;

  std::string name() const override { return name_; }
  void propose(const std::vector<int32_t>& context, int k, Draft& out) override;
  void prepare(const std::vector<int32_t>& context) override;
  void reset() override;

 private:
  // Brings the cache (and, for recurrent models, the state) to `context`,
  // leaving the logits of its last token in logits_.
  void sync(const std::vector<int32_t>& context);
  void init(ThreadPool& pool, int n_ctx, const std::string& executor);
  // Runs tokens[0..n) at positions pos0.. in blocks of the program's rows
  // (recurrent programs compute a block in order), leaving the logits of the
  // last in logits_.
  void feed(const int32_t* tokens, int n, int pos0);

  const Model& model_;
  std::string name_;
  DecodeProgram program_;
  std::unique_ptr<Executor> exec_;
  SequenceState seq_;
  SamplingParams sampling_;
  Sampler sampler_;  // its distribution() at the sampling parameters
  std::mt19937_64 rng_;
  // Non-recurrent: the tokens whose keys and values are in seq_.cache, in
  // order. Recurrent: the tokens folded into snapshot_ (the state after
  // cached_), which is restored before the next proposal.
  std::vector<int32_t> cached_;
  RecurrentState snapshot_;
  std::vector<float> logits_, block_logits_;
  ThreadPool* pool_ = nullptr;
};

// Builds a drafter from its command-line name:
//   "ngram" (n = 3..1), "ngram:N" (n = N..1);
//   "self" (skip a quarter of the target's layers, from layer 2 on),
//   "self:N" (keep N layers: the first N-1 and the last), "self:skip=A-B"
//   (skip layers A..B);
//   "model:PATH" (a draft model; PATH as load_model accepts it), whose model
//   is stored in `owned_model`;
//   "dspark", "dflash" (block drafters conditioned on target taps, with
//   synthetic MINI weights sized to the target: random, so acceptance is
//   near zero), "dspark:PATH", "dflash:PATH" (weights from a directory or
//   .safetensors file as `megakern gen-drafter` writes them); see
//   spec/block_drafter.h.
// Whether spec names a drafter kind make_drafter knows (the part before
// ':'; its argument is checked when the drafter is made), and the forms it
// takes, for messages.
bool known_drafter_kind(const std::string& spec);
extern const char* const kDrafterForms;
std::unique_ptr<Drafter> make_drafter(const std::string& spec, const Model& target, ThreadPool& pool, int n_ctx,
                                      const SamplingParams& sampling, std::unique_ptr<Model>& owned_model,
                                      const std::string& executor = "mega");

}  // namespace megakern
