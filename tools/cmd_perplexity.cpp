// `megakern perplexity`: perplexity of a model over a text file, and the KL
// divergence of its token distributions against those saved from a base run
// (usually the f32 computation of the same weights, --weights f32).
//
// Method (the one llama.cpp's perplexity tool uses, so figures compare): the
// text is tokenised once (the model's BOS first when its tokenizer adds one),
// cut into chunks of n_ctx tokens, and every chunk is computed from an empty
// KV cache, its first token replaced by BOS when the tokenizer adds one. The
// first half of a chunk is context only; the positions first = n_ctx/2 ..
// n_ctx-2 are scored, each by the log-probability it gives the next token.
//
// Log-probability file (--save-logits, read by --kl-base), little-endian:
//   char     magic[8]   "MKLOGPRB"
//   uint32   version    1
//   uint32   n_vocab
//   uint32   n_ctx      chunk size in tokens
//   uint32   n_chunks
//   uint32   n_scored   scored positions per chunk, n_ctx - 1 - n_ctx/2
//   uint32   name_len   then name_len bytes: the model name (UTF-8, no NUL)
//   int32    tokens[n_chunks][n_ctx]   the tokens as computed (BOS substituted)
//   float32  logp[n_chunks][n_scored][n_vocab]
// Row i of chunk c is the log-softmax of position n_ctx/2 + i, which predicts
// tokens[c][n_ctx/2 + i + 1].
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "runtime/engine.h"
#include "runtime/logprobs.h"
#include "runtime/model.h"
#include "tools/commands.h"

namespace megakern::cli {
namespace {

constexpr std::array<char, 8> kMagic = {'M', 'K', 'L', 'O', 'G', 'P', 'R', 'B'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxNameLen = 4096;

struct PerplexityOptions {
  std::string model = "smollm2-135m";
  ModelFlags model_flags;
  std::string text_file;
  int n_ctx = 512;
  int chunks = 0;  // 0: every whole chunk of the text
  std::string save_logits;
  std::string kl_base;
  int threads = 0;
  std::string executor = "mega";
  int ubatch = 0;           // 0: the model's prompt block (default_prompt_block)
  bool no_batched = false;  // every position through the full program
};

struct LogitsHeader {
  uint32_t n_vocab = 0, n_ctx = 0, n_chunks = 0, n_scored = 0;
  std::string name;
  std::vector<int32_t> tokens;  // [n_chunks][n_ctx]
};

size_t header_bytes(const LogitsHeader& h) {
  return kMagic.size() + 6 * sizeof(uint32_t) + h.name.size() + h.tokens.size() * sizeof(int32_t);
}

void write_u32(std::ofstream& out, uint32_t v) { out.write(reinterpret_cast<const char*>(&v), sizeof v); }

void write_header(std::ofstream& out, const LogitsHeader& h) {
  out.write(kMagic.data(), kMagic.size());
  write_u32(out, kVersion);
  write_u32(out, h.n_vocab);
  write_u32(out, h.n_ctx);
  write_u32(out, h.n_chunks);
  write_u32(out, h.n_scored);
  write_u32(out, static_cast<uint32_t>(h.name.size()));
  out.write(h.name.data(), static_cast<std::streamsize>(h.name.size()));
  out.write(reinterpret_cast<const char*>(h.tokens.data()),
            static_cast<std::streamsize>(h.tokens.size() * sizeof(int32_t)));
}

// Reads and checks the header of a log-probability file; the stream is left
// at the first row. Throws megakern::Error naming what is wrong.
LogitsHeader read_header(std::ifstream& in, const std::string& path) {
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  std::array<char, 8> magic{};
  in.read(magic.data(), magic.size());
  if (!in || magic != kMagic) fail("--kl-base '{}': not a megakern log-probability file (bad magic)", path);
  uint32_t f[6];
  in.read(reinterpret_cast<char*>(f), sizeof f);
  if (!in) fail("--kl-base '{}': truncated header", path);
  if (f[0] != kVersion) fail("--kl-base '{}': format version {} (this build reads {})", path, f[0], kVersion);
  LogitsHeader h;
  h.n_vocab = f[1];
  h.n_ctx = f[2];
  h.n_chunks = f[3];
  h.n_scored = f[4];
  if (h.n_vocab == 0 || h.n_ctx < 4 || h.n_chunks == 0 || h.n_scored != h.n_ctx - 1 - h.n_ctx / 2 ||
      f[5] > kMaxNameLen)
    fail("--kl-base '{}': inconsistent header (vocab {}, chunk {}, chunks {}, scored {}, name length {})", path,
         h.n_vocab, h.n_ctx, h.n_chunks, h.n_scored, f[5]);
  h.name.resize(f[5]);
  in.read(h.name.data(), f[5]);
  const uint64_t n_tokens = uint64_t{h.n_chunks} * h.n_ctx;
  const uint64_t expect = kMagic.size() + sizeof f + f[5] + n_tokens * sizeof(int32_t) +
                          uint64_t{h.n_chunks} * h.n_scored * h.n_vocab * sizeof(float);
  if (size != expect)
    fail("--kl-base '{}': {} bytes, but its header (vocab {}, {} chunks of {}) describes {} bytes (truncated?)", path,
         size, h.n_vocab, h.n_chunks, h.n_ctx, expect);
  h.tokens.resize(n_tokens);
  in.read(reinterpret_cast<char*>(h.tokens.data()), static_cast<std::streamsize>(n_tokens * sizeof(int32_t)));
  if (!in) fail("--kl-base '{}': truncated token list", path);
  return h;
}

size_t argmax(const float* x, size_t n) { return static_cast<size_t>(std::max_element(x, x + n) - x); }

// Mean and its standard error.
struct MeanErr {
  double mean = 0, err = 0;
};
MeanErr mean_err(double sum, double sum_sq, size_t n) {
  MeanErr r;
  if (n == 0) return r;
  r.mean = sum / static_cast<double>(n);
  if (n > 1) {
    const double var = std::max(0.0, sum_sq / static_cast<double>(n) - r.mean * r.mean);
    r.err = std::sqrt(var / static_cast<double>(n - 1));
  }
  return r;
}

// The q-quantile of sorted values, interpolating between neighbours.
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double x = q * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(x);
  if (i + 1 >= sorted.size()) return sorted.back();
  return sorted[i] + (x - static_cast<double>(i)) * (sorted[i + 1] - sorted[i]);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("-f: cannot read text file '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.empty()) fail("-f: text file '{}' is empty", path);
  return s;
}

void run_perplexity(const PerplexityOptions& o) {
  if (o.text_file.empty()) fail("-f: a text file is required");
  const std::string text = read_text(o.text_file);
  const auto t_load = Clock::now();
  std::unique_ptr<Model> model = load_model(o.model, o.model_flags.options());
  ThreadPool pool(o.threads);
  const size_t V = static_cast<size_t>(model->n_vocab());
  const Tokenizer& tok = model->tokenizer();
  const bool add_bos = tok.add_bos_default() && tok.bos_id() >= 0;
  const std::vector<int32_t> all = tok.encode(text, add_bos, false);
  const int n_ctx = o.n_ctx;
  const size_t avail = all.size() / static_cast<size_t>(n_ctx);
  if (avail == 0)
    fail("-f '{}': the text is {} tokens, fewer than one chunk of {} (-c)", o.text_file, all.size(), n_ctx);
  const size_t n_chunks = o.chunks > 0 ? std::min(avail, static_cast<size_t>(o.chunks)) : avail;
  if (o.chunks > 0 && static_cast<size_t>(o.chunks) > avail)
    fmt::print(stderr, "note: the text holds {} chunks of {} tokens; --chunks {} reduced to {}\n", avail, n_ctx,
               o.chunks, avail);
  const int first = n_ctx / 2;
  const int n_scored = n_ctx - 1 - first;
  const int n_out = n_ctx - first;  // positions first..n_ctx-1 (the last predicts nothing)

  // The tokens as computed, chunk by chunk.
  LogitsHeader h;
  h.n_vocab = static_cast<uint32_t>(V);
  h.n_ctx = static_cast<uint32_t>(n_ctx);
  h.n_chunks = static_cast<uint32_t>(n_chunks);
  h.n_scored = static_cast<uint32_t>(n_scored);
  h.name = model->name();
  h.tokens.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n_chunks * n_ctx));
  if (add_bos)
    for (size_t c = 0; c < n_chunks; ++c) h.tokens[c * n_ctx] = tok.bos_id();

  // The base file is checked before any computation.
  std::ifstream base;
  LogitsHeader bh;
  if (!o.kl_base.empty()) {
    base.open(o.kl_base, std::ios::binary);
    if (!base) fail("--kl-base: cannot read '{}'", o.kl_base);
    bh = read_header(base, o.kl_base);
    if (bh.n_vocab != h.n_vocab)
      fail("--kl-base '{}': vocabulary of {} tokens, this model has {} (a different model?)", o.kl_base, bh.n_vocab,
           h.n_vocab);
    if (bh.n_ctx != h.n_ctx || bh.n_chunks != h.n_chunks)
      fail("--kl-base '{}': {} chunks of {} tokens, this run has {} chunks of {} (use the same -c and --chunks)",
           o.kl_base, bh.n_chunks, bh.n_ctx, h.n_chunks, h.n_ctx);
    for (size_t i = 0; i < h.tokens.size(); ++i)
      if (bh.tokens[i] != h.tokens[i])
        fail("--kl-base '{}': token {} of chunk {} is {}, this run has {} (a different text or tokenizer?)", o.kl_base,
             i % n_ctx, i / n_ctx, bh.tokens[i], h.tokens[i]);
  }
  std::ofstream save;
  if (!o.save_logits.empty()) {
    save.open(o.save_logits, std::ios::binary | std::ios::trunc);
    if (!save) fail("--save-logits: cannot write '{}'", o.save_logits);
    write_header(save, h);
  }

  const bool batched = !o.no_batched;
  const int rows = o.ubatch > 0 ? std::min(o.ubatch, model->max_program_rows()) : default_prompt_block(*model);
  fmt::print("model {} ({}), load {:.0f} ms; numerics {}; KV cache {}\n", model->name(), model->description(),
             ms_since(t_load), numerics_name(model->numerics()), kv_type_name(model->kv_type()));
  fmt::print("text {}: {} tokens; {} chunks of {} (first {} of each as context, {} scored each); {}; {} threads\n",
             o.text_file, all.size(), n_chunks, n_ctx, first, n_scored,
             fmt::format("executor steps ({}, {} rows{})", o.executor, rows,
                         batched ? "; unscored positions without the output head" : ""),
             pool.size());

  auto engine = std::make_unique<Engine>(*model, pool, rows, o.executor);
  std::vector<float> logits(static_cast<size_t>(n_out) * V);
  std::vector<float> logp(V), blogp(V);
  double nll = 0, nll2 = 0;
  double base_nll = 0, base_nll2 = 0, diff = 0, diff2 = 0, kl_sum = 0, kl_sum2 = 0;
  size_t count = 0, same_top = 0;
  std::vector<double> kls;
  const auto t0 = Clock::now();
  for (size_t c = 0; c < n_chunks; ++c) {
    const int32_t* toks = h.tokens.data() + c * n_ctx;
    SequenceState seq = model->new_sequence(n_ctx);
    engine->teacher_forced_logits(seq, toks, n_ctx, 0, n_out, logits.data(), batched);
    for (int i = 0; i < n_scored; ++i) {
      log_softmax(logits.data() + static_cast<size_t>(i) * V, static_cast<int64_t>(V), logp.data());
      const int32_t next = toks[first + i + 1];
      const double l = -static_cast<double>(logp[static_cast<size_t>(next)]);
      nll += l;
      nll2 += l * l;
      if (save.is_open()) save.write(reinterpret_cast<const char*>(logp.data()), static_cast<std::streamsize>(V * sizeof(float)));
      if (base.is_open()) {
        base.read(reinterpret_cast<char*>(blogp.data()), static_cast<std::streamsize>(V * sizeof(float)));
        if (!base) fail("--kl-base '{}': read failed at chunk {}", o.kl_base, c);
        // KL(base || this) = sum_v p_base(v) (log p_base(v) - log p_this(v)).
        double kl = 0;
        for (size_t v = 0; v < V; ++v)
          kl += std::exp(static_cast<double>(blogp[v])) * (static_cast<double>(blogp[v]) - logp[v]);
        kls.push_back(kl);
        kl_sum += kl;
        kl_sum2 += kl * kl;
        const double bl = -static_cast<double>(blogp[static_cast<size_t>(next)]);
        base_nll += bl;
        base_nll2 += bl * bl;
        diff += l - bl;
        diff2 += (l - bl) * (l - bl);
        if (argmax(logp.data(), V) == argmax(blogp.data(), V)) ++same_top;
      }
      ++count;
    }
    fmt::print("[{}] {:.4f}{}", c + 1, std::exp(nll / static_cast<double>(count)), c + 1 == n_chunks ? "\n" : ", ");
    std::fflush(stdout);
  }
  if (save.is_open()) {
    save.flush();
    if (!save) fail("--save-logits: writing '{}' failed (disk full?)", o.save_logits);
  }
  const double secs = ms_since(t0) / 1000.0;
  const MeanErr m = mean_err(nll, nll2, count);
  const double ppl = std::exp(m.mean);
  fmt::print("{} scored tokens in {:.1f} s ({:.1f} tokens/s computed)\n", count, secs,
             static_cast<double>(n_chunks * n_ctx) / secs);
  fmt::print("Final estimate: PPL = {:.6f} +/- {:.6f}  (mean NLL {:.6f} +/- {:.6f})\n", ppl, m.err * ppl, m.mean, m.err);
  if (save.is_open())
    fmt::print("saved log-probabilities of {} positions x {} tokens to {}\n", count, V, o.save_logits);
  if (base.is_open()) {
    const MeanErr bm = mean_err(base_nll, base_nll2, count);
    const MeanErr dm = mean_err(diff, diff2, count);
    const MeanErr km = mean_err(kl_sum, kl_sum2, count);
    std::sort(kls.begin(), kls.end());
    const double p = static_cast<double>(same_top) / static_cast<double>(count);
    const double p_err = count > 1 ? std::sqrt(p * (1 - p) / static_cast<double>(count - 1)) : 0;
    fmt::print("against base {} ({}):\n", o.kl_base, bh.name);
    fmt::print("  PPL(base)            = {:.6f} +/- {:.6f}\n", std::exp(bm.mean), bm.err * std::exp(bm.mean));
    // KL divergences span orders of magnitude (exact mode: ~1e-8), so
    // they are printed with significant digits rather than decimals.
    fmt::print("  PPL(this)/PPL(base)  = {:.6f}  (mean ln ratio {:.6g} +/- {:.6g})\n", std::exp(dm.mean), dm.mean,
               dm.err);
    fmt::print("  KL divergence mean   = {:.6g} +/- {:.6g}\n", km.mean, km.err);
    fmt::print("  KL divergence median = {:.6g}\n", quantile(kls, 0.5));
    fmt::print("  KL divergence p99    = {:.6g}\n", quantile(kls, 0.99));
    fmt::print("  KL divergence max    = {:.6g}\n", kls.back());
    fmt::print("  same top-1           = {:.3f} +/- {:.3f} %  ({} of {})\n", 100 * p, 100 * p_err, same_top, count);
  }
}

}  // namespace

void register_perplexity(CLI::App& app) {
  auto o = std::make_shared<PerplexityOptions>();
  CLI::App* cmd = app.add_subcommand(
      "perplexity",
      "Perplexity over a text file in chunks (second half of each scored, as llama.cpp's perplexity does); "
      "optionally saves the log-probabilities, or reports KL divergence and same-top-1 against saved ones");
  add_model_flags(cmd, o->model, o->model_flags);
  cmd->add_option("-f,--file", o->text_file, "Text file to score (plain text, no chat template)")->required();
  cmd->add_option("-c,--ctx", o->n_ctx, "Chunk size in tokens")->capture_default_str()->check(CLI::Range(4, 1 << 20));
  cmd->add_option("--chunks", o->chunks, "Number of chunks to score (0: every whole chunk of the text)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  check_output_file(cmd->add_option("--save-logits", o->save_logits,
                                    "Write the f32 log-probabilities of every scored position to this file (format in "
                                    "tools/cmd_perplexity.cpp and the README)"));
  cmd->add_option("--kl-base", o->kl_base,
                  "Compare with a file written by --save-logits (same text, -c and --chunks): KL divergence "
                  "(base || this), same top-1, PPL ratio");
  cmd->add_option("-t,--threads", o->threads, "Worker threads (0: one per core)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--executor", o->executor,
                  "Executor of the steps (mega, opbyop, reference)")
      ->capture_default_str()
      ->check(CLI::IsMember({"mega", "opbyop", "reference", "serial"}));
  cmd->add_option("--ubatch", o->ubatch,
                  "Positions per executor step (0: the model's prompt block, 32 with recurrent state, else 128; "
                  "at most the model's program rows)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  cmd->add_flag("--no-batched", o->no_batched,
               "Run every position through the full program, output head included (the same bits as without; "
               "a cross-check)");
  cmd->callback([o] { run_guarded([&] { run_perplexity(*o); }); });
}

}  // namespace megakern::cli
