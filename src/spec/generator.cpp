#include "spec/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "runtime/model.h"
#include "spec/drafter.h"
#include "spec/speculative.h"

namespace megakern {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
}  // namespace

struct Generator::Owned {
  std::unique_ptr<Session> session;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<Model> draft_model;
  std::unique_ptr<Drafter> drafter;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<SequenceState> seq;
  std::unique_ptr<SpeculativeGenerator> spec;
};

Generator::Generator(const Model& model, ThreadPool& pool, const GeneratorOptions& o) : owned_(new Owned) {
  Owned& w = *owned_;
  const int ubatch = o.ubatch > 0 ? o.ubatch : default_prompt_block(model);
  if (o.drafter.empty()) {
    w.session = std::make_unique<Session>(model, pool, o.n_ctx, o.executor, ubatch);
    w.sampler = std::make_unique<Sampler>(o.sampling);
    session_ = w.session.get();
    sampler_ = w.sampler.get();
    return;
  }
  w.drafter = make_drafter(o.drafter, model, pool, o.n_ctx, o.sampling, w.draft_model, o.executor);
  // A verify block of draft + 1 rows, and the prompt in blocks of ubatch
  // positions as plain decoding computes it (a recurrent model's chunked
  // prompt pass then gives the same state; it goes through the full
  // program, so that has ubatch rows at least).
  w.engine = std::make_unique<Engine>(model, pool, model.recurrent() ? std::max(ubatch, o.draft + 1) : o.draft + 1,
                                      o.executor);
  if (!model.recurrent()) w.engine->set_prefill_rows(ubatch);
  w.seq = std::make_unique<SequenceState>(model.new_sequence(o.n_ctx));
  SpecOptions so;
  so.draft = o.draft;
  so.adaptive = !o.fixed_draft;
  so.sampling = o.sampling;
  w.spec = std::make_unique<SpeculativeGenerator>(*w.engine, *w.seq, *w.drafter, so);
  spec_ = w.spec.get();
}

Generator::Generator(Session& session, Sampler& sampler) : session_(&session), sampler_(&sampler) {}

Generator::Generator(SpeculativeGenerator& spec) : spec_(&spec) {}

Generator::~Generator() = default;

int Generator::n_ctx() const { return spec_ ? spec_->n_ctx() : session_->n_ctx(); }

const Tokenizer& Generator::tokenizer() const {
  return spec_ ? spec_->model().tokenizer() : session_->engine().model().tokenizer();
}

void Generator::reset() {
  if (session_) session_->reset();
}

const Drafter* Generator::drafter() const { return spec_ ? &spec_->drafter() : nullptr; }
const SpecStats* Generator::spec_stats() const { return spec_ ? &spec_->stats() : nullptr; }
void Generator::reset_spec_stats() {
  if (spec_) spec_->reset_stats();
}

GenResult Generator::generate(const std::vector<int32_t>& prompt, const GenerationParams& params,
                              const OnDelta& on_delta) {
  GenResult r;
  r.prompt_tokens = static_cast<int>(prompt.size());
  Generation g(tokenizer(), params, r.prompt_tokens, n_ctx(), sampler_);
  // Takes one token; false once the generation is over.
  auto take = [&](int32_t t) {
    const Delta& d = g.push(t);
    if (d.generated > static_cast<int>(r.tokens.size())) r.tokens.push_back(t);
    r.text += d.text;
    if (on_delta) on_delta(d);
    return !d.done();
  };
  if (spec_) {
    // Each round emits 1..draft + 1 tokens, of which the Generation may take
    // fewer (an end token, a stop string); a round is asked for no more than
    // the generation may still emit.
    const double prefill_before = spec_->stats().prefill_ms;
    const auto t0 = Clock::now();
    std::vector<int32_t> out{spec_->start(prompt)};
    r.prompt_computed = r.prompt_tokens;
    r.prefill_ms = spec_->stats().prefill_ms - prefill_before;
    // The Generation ends at a full context before a round could be refused.
    for (bool more = true; more;) {
      for (int32_t t : out)
        if (!(more = take(t))) break;
      out.clear();
      if (more && spec_->round(g.remaining(), out) == 0) fail("a speculative round past the context");
    }
    r.decode_ms = ms_since(t0) - r.prefill_ms;
  } else {
    r.prompt_computed = r.prompt_tokens - static_cast<int>(session_->reusable_prefix(prompt));
    const auto t0 = Clock::now();
    session_->set_tokens(prompt);
    r.prefill_ms = ms_since(t0);
    const auto t1 = Clock::now();
    for (;;) {
      const std::vector<float>& logits = session_->logits();
      if (!take(g.sample(logits.data(), static_cast<int64_t>(logits.size())))) break;
      session_->append(g.last_token());
    }
    r.decode_ms = ms_since(t1);
  }
  r.stop = g.stop_reason();
  return r;
}

}  // namespace megakern
