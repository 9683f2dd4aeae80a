#include "spec/drafter.h"

#include "spec/block_drafter.h"

#include <algorithm>
#include <charconv>

#include "core/error.h"
#include "exec/recurrent_kernels.h"

namespace megakern {

Drafter::~Drafter() = default;

double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

int32_t draw(const TokenDist& dist, double u) {
  if (dist.empty()) fail("cannot draw from an empty distribution");
  double cum = 0;
  for (const auto& d : dist) {
    cum += d.second;
    if (u < cum) return d.first;
  }
  return dist.back().first;
}

// ---------------------------------------------------------------- n-gram

NgramDrafter::NgramDrafter(int max_n, int min_n) : max_n_(max_n), min_n_(min_n) {
  if (min_n < 1 || max_n < min_n || max_n > 64)
    fail("n-gram drafter: need 1 <= min_n <= max_n <= 64, got min_n {} and max_n {}", min_n, max_n);
}

std::string NgramDrafter::name() const { return fmt::format("ngram (n = {}..{})", max_n_, min_n_); }

namespace {

// One more token (going backwards) into the hash of an n-gram: the n-gram
// t_{p-n+1..p} hashes as mix(...mix(mix(seed, t_p), t_{p-1})..., t_{p-n+1}),
// so the hashes of all n-grams ending at p come out of one pass.
uint64_t mix(uint64_t h, int32_t t) {
  h += static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}
constexpr uint64_t kSeed = 0x6e6772616d5f6978ull;

}  // namespace

void NgramDrafter::reset() {
  seen_.clear();
  indexed_ = 0;
  last_end_.clear();
  prev_end_.clear();
}

void NgramDrafter::index(const std::vector<int32_t>& context) {
  const int L = static_cast<int>(context.size());
  // A continuation of what was indexed keeps the index; anything else (a
  // shorter or different context) starts it again. The check is a compare of
  // the tokens, far below the cost of any verify step.
  if (seen_.size() > context.size() || !std::equal(seen_.begin(), seen_.end(), context.begin())) reset();
  seen_.insert(seen_.end(), context.begin() + static_cast<std::ptrdiff_t>(seen_.size()), context.end());
  // n-grams ending at p <= L - 2 have a token after them to propose.
  prev_end_.resize(static_cast<size_t>(std::max(L - 1, 0)), -1);
  for (int p = indexed_; p <= L - 2; ++p) {
    uint64_t h = kSeed;
    for (int n = 1; n <= max_n_ && n <= p + 1; ++n) {
      h = mix(h, context[static_cast<size_t>(p - n + 1)]);
      if (n < min_n_) continue;
      // Later positions overwrite: the most recent is kept; for max_n-grams
      // the one it replaces is chained behind it.
      auto [it, fresh] = last_end_.try_emplace(h, p);
      if (!fresh) {
        if (n == max_n_) prev_end_[static_cast<size_t>(p)] = it->second;
        it->second = p;
      }
    }
  }
  indexed_ = std::max(indexed_, L - 1);
}

void NgramDrafter::propose(const std::vector<int32_t>& context, int k, Draft& out) {
  out.clear();
  const int L = static_cast<int>(context.size());
  if (k <= 0 || L < 2) return;
  index(context);
  // The hashes of the context's suffixes of 1..max_n tokens.
  uint64_t hashes[65];
  uint64_t h = kSeed;
  const int top = std::min(max_n_, L - 1);
  for (int n = 1; n <= top; ++n) hashes[n] = h = mix(h, context[static_cast<size_t>(L - n)]);
  // Longer suffixes first: a match of n tokens is a stronger sign that the
  // text is repeating than a match of fewer. The index holds the most recent
  // occurrence (text being copied tends to be the latest).
  const int32_t* ctx = context.data();
  // How far back the context's end and the text ending at p agree (0: not
  // even the n-gram, a hash collision).
  auto agreement = [&](int p, int n) {
    if (p - n + 1 < 0 || !std::equal(ctx + (L - n), ctx + L, ctx + (p - n + 1))) return 0;
    int match = n;
    while (match < Draft::kMaxMatch && p - match >= 0 && ctx[p - match] == ctx[L - 1 - match]) ++match;
    return match;
  };
  for (int n = top; n >= min_n_; --n) {
    const auto it = last_end_.find(hashes[n]);
    if (it == last_end_.end()) continue;
    int p = it->second;  // the occurrence ends at p < L - 1
    int match = agreement(p, n);
    // Full-length n-grams: of the last kCandidates occurrences, the one that
    // agrees furthest back (the most recent among equals).
    if (n == max_n_)
      for (int q = prev_end_[static_cast<size_t>(p)], c = 1; q >= 0 && c < kCandidates;
           q = prev_end_[static_cast<size_t>(q)], ++c)
        if (const int m = agreement(q, n); m > match) p = q, match = m;
    if (match == 0) continue;
    out.match = match;
    // Copy what followed the occurrence; past the context's end the copy
    // reads the proposal itself (position L + i is proposal token i).
    out.tokens.reserve(static_cast<size_t>(k));
    for (int i = 0; i < k; ++i) {
      const int src = p + 1 + i;
      out.tokens.push_back(src < L ? ctx[src] : out.tokens[static_cast<size_t>(src - L)]);
    }
    return;
  }
}

// ---------------------------------------------------------------- layer skipping

DecodeProgram skip_layers(const DecodeProgram& program, const std::vector<bool>& keep) {
  if (static_cast<int>(keep.size()) != program.n_layer)
    fail("layer filter has {} entries, the program {} has {} layers", keep.size(), program.model_name,
         program.n_layer);
  if (std::none_of(keep.begin(), keep.end(), [](bool b) { return b; }))
    fail("layer filter keeps none of the {} layers of {}", program.n_layer, program.model_name);
  DecodeProgram p = program;
  p.ops.clear();
  for (const Op& op : program.ops)
    if (op.layer < 0 || keep[static_cast<size_t>(op.layer)]) p.ops.push_back(op);
  p.verify();
  return p;
}

std::vector<bool> first_and_last_layers(int n_layer, int n_keep) {
  if (n_keep < 1 || n_keep > n_layer) fail("self-drafting keeps 1 to {} layers, got {}", n_layer, n_keep);
  std::vector<bool> keep(static_cast<size_t>(n_layer), false);
  for (int l = 0; l + 1 < n_keep; ++l) keep[static_cast<size_t>(l)] = true;
  keep[static_cast<size_t>(n_layer - 1)] = true;
  return keep;
}

// ---------------------------------------------------------------- model drafter

ModelDrafter::ModelDrafter(const Model& draft, int target_vocab, ThreadPool& pool, int n_ctx,
                           const SamplingParams& sampling, const std::string& executor)
    : model_(draft), sampling_(sampling), sampler_(sampling), rng_(sampling.seed ^ 0x5eedd4af7ull) {
  if (draft.n_vocab() != target_vocab)
    fail("draft model '{}' has a vocabulary of {} tokens but the target has {}: a draft model must share the "
         "target's vocabulary",
         draft.name(), draft.n_vocab(), target_vocab);
  name_ = fmt::format("model {}", draft.name());
  program_ = draft.build_program(draft.recurrent() ? 1 : 32);
  init(pool, n_ctx, executor);
}

ModelDrafter::ModelDrafter(const Model& model, const std::vector<bool>& keep, ThreadPool& pool, int n_ctx,
                           const SamplingParams& sampling, const std::string& executor)
    : model_(model), sampling_(sampling), sampler_(sampling), rng_(sampling.seed ^ 0x5eedd4af7ull) {
  program_ = skip_layers(model.build_program(model.recurrent() ? 1 : 32), keep);
  const int kept = static_cast<int>(std::count(keep.begin(), keep.end(), true));
  name_ = fmt::format("self ({} of {} layers)", kept, program_.n_layer);
  init(pool, n_ctx, executor);
}

void ModelDrafter::init(ThreadPool& pool, int n_ctx, const std::string& executor) {
  pool_ = &pool;
  exec_ = make_executor(executor, program_, pool);
  seq_ = model_.new_sequence(n_ctx);
  snapshot_ = seq_.state;
  logits_.resize(static_cast<size_t>(program_.n_vocab));
}

void ModelDrafter::reset() {
  cached_.clear();
  seq_.clear();
  snapshot_ = seq_.state;
}

void ModelDrafter::feed(const int32_t* tokens, int n, int pos0) {
  if (n <= 0) return;
  const int block = program_.max_rows;
  const size_t V = static_cast<size_t>(program_.n_vocab);
  block_logits_.resize(static_cast<size_t>(block) * V);
  std::vector<RowInput> rows;
  for (int i = 0; i < n; i += block) {
    const int m = std::min(block, n - i);
    rows.clear();
    for (int r = 0; r < m; ++r) rows.push_back(seq_.row(tokens[i + r], pos0 + i + r));
    exec_->step(rows, block_logits_.data());
    if (i + m == n) std::copy_n(block_logits_.data() + static_cast<size_t>(m - 1) * V, V, logits_.data());
  }
}

void ModelDrafter::prepare(const std::vector<int32_t>& context) {
  if (!context.empty() && static_cast<int>(context.size()) <= seq_.n_ctx()) sync(context);
}

void ModelDrafter::sync(const std::vector<int32_t>& context) {
  const int n = static_cast<int>(context.size());
  size_t common = 0;
  while (common < cached_.size() && common < context.size() && cached_[common] == context[common]) ++common;
  if (seq_.recurrent) {
    // The state cannot be rewound, only restored: from the snapshot after
    // cached_ when the context extends it, else from zero.
    if (common < cached_.size() || cached_.size() >= context.size()) {
      reset();
    } else {
      seq_.state = snapshot_;
    }
    const int c = static_cast<int>(cached_.size());
    feed(context.data() + c, n - 1 - c, c);
    snapshot_ = seq_.state;
    cached_.assign(context.begin(), context.end() - 1);
    feed(context.data() + n - 1, 1, n - 1);
  } else {
    // Keys and values past the common prefix are overwritten; the last
    // context token is always recomputed for its logits.
    common = std::min(common, context.size() - 1);
    feed(context.data() + common, n - static_cast<int>(common), static_cast<int>(common));
    cached_ = context;
  }
}

void ModelDrafter::propose(const std::vector<int32_t>& context, int k, Draft& out) {
  out.clear();
  const int n = static_cast<int>(context.size());
  // Draft i (0-based) is predicted from the logits of position n - 1 + i, so
  // the last draft needs position n + k - 2 in the cache.
  k = std::min(k, seq_.n_ctx() - n + 1);
  if (k <= 0 || n == 0) return;
  sync(context);
  const bool greedy = sampling_.temperature == 0.f;
  for (int i = 0; i < k; ++i) {
    int32_t t;
    if (greedy) {
      t = argmax(logits_.data(), program_.n_vocab);
    } else {
      out.dists.push_back(sampler_.distribution(logits_.data(), program_.n_vocab));
      t = draw(out.dists.back(), uniform01(rng_));
    }
    out.tokens.push_back(t);
    if (i + 1 == k) break;
    exec_->step({seq_.row(t, n + i)}, logits_.data());
    if (!seq_.recurrent) cached_.push_back(t);
  }
}

// ---------------------------------------------------------------- factory

namespace {

int parse_count(const std::string& spec, const std::string& arg, int min = 1) {
  int v = 0;
  const auto [p, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), v);
  if (ec != std::errc() || p != arg.data() + arg.size() || v < min)
    fail("drafter '{}': '{}' is not a whole number >= {}", spec, arg, min);
  return v;
}

}  // namespace

std::unique_ptr<Drafter> make_drafter(const std::string& spec, const Model& target, ThreadPool& pool, int n_ctx,
                                      const SamplingParams& sampling, std::unique_ptr<Model>& owned_model,
                                      const std::string& executor) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (kind == "ngram") return std::make_unique<NgramDrafter>(arg.empty() ? 3 : parse_count(spec, arg), 1);
  if (kind == "self") {
    const int n_layer = target.build_program(1).n_layer;
    if (arg.rfind("skip=", 0) == 0) {
      // self:skip=A-B skips layers A..B (or self:skip=A, one layer).
      const std::string range = arg.substr(5);
      const size_t dash = range.find('-');
      const int a = parse_count(spec, range.substr(0, dash), 0);
      const int b = dash == std::string::npos ? a : parse_count(spec, range.substr(dash + 1), 0);
      if (a > b || b >= n_layer) fail("drafter '{}': layers {}..{} are not a range within 0..{}", spec, a, b, n_layer - 1);
      std::vector<bool> keep(static_cast<size_t>(n_layer), true);
      for (int l = a; l <= b; ++l) keep[static_cast<size_t>(l)] = false;
      return std::make_unique<ModelDrafter>(target, keep, pool, n_ctx, sampling, executor);
    }
    if (arg.empty()) {
      // Default: skip a quarter of the layers, from the third on. The first
      // layers and the last ones shape the output most; on SmolLM2 skipping
      // layers 2..5 keeps about 60% of drafts, skipping the upper half none.
      if (n_layer < 2) fail("drafter '{}': the target has a single layer, none can be skipped", spec);
      const int a = std::min(2, n_layer - 1), n_skip = std::max(1, n_layer / 4);
      std::vector<bool> keep(static_cast<size_t>(n_layer), true);
      for (int l = a; l < std::min(n_layer, a + n_skip); ++l) keep[static_cast<size_t>(l)] = false;
      return std::make_unique<ModelDrafter>(target, keep, pool, n_ctx, sampling, executor);
    }
    const int n_keep = parse_count(spec, arg);
    if (n_keep >= n_layer)
      fail("drafter '{}': self-drafting must skip at least one of the target's {} layers", spec, n_layer);
    return std::make_unique<ModelDrafter>(target, first_and_last_layers(n_layer, n_keep), pool, n_ctx, sampling,
                                          executor);
  }
  if (kind == "model") {
    if (arg.empty()) fail("drafter '{}': name the draft model, as model:PATH", spec);
    ModelOptions mo;
    mo.numerics = target.numerics();  // the draft model computes in the target's mode
    owned_model = load_model(arg, mo);
    return std::make_unique<ModelDrafter>(*owned_model, target.n_vocab(), pool, n_ctx, sampling, executor);
  }
  if (kind == "dspark" || kind == "dflash") {
    const BlockDrafterKind k = kind == "dspark" ? BlockDrafterKind::DSpark : BlockDrafterKind::DFlash;
    BlockDrafterWeights w;
    if (colon == std::string::npos) {
      // The trained drafter shipped for this target, else random MINI weights.
      const std::string shipped = shipped_block_drafter(target, k);
      if (shipped.empty()) {
        w = synthetic_block_drafter(BlockDrafterConfig::mini(k, target));
      } else {
        verify_block_drafter_checksum(shipped);
        w = load_block_drafter(shipped, target);
      }
    } else {
      if (arg.empty()) fail("drafter '{}': name the weights, as {}:PATH", spec, kind);
      w = load_block_drafter(arg, target);
      if (w.config.kind != k)
        fail("drafter '{}': {} holds a {} drafter", spec, arg, block_drafter_kind_name(w.config.kind));
    }
    return std::make_unique<BlockDrafter>(target, std::move(w), pool, n_ctx);
  }
  fail("unknown drafter '{}' (expected {})", spec, kDrafterForms);
}

const char* const kDrafterForms = "ngram, ngram:N, self, self:N, self:skip=A-B, model:PATH, dspark[:PATH] or dflash[:PATH]";

bool known_drafter_kind(const std::string& spec) {
  const std::string kind = spec.substr(0, spec.find(':'));
  return kind == "ngram" || kind == "self" || kind == "model" || kind == "dspark" || kind == "dflash";
}

}  // namespace megakern
