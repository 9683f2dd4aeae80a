// `megakern run` and `megakern chat`.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/gguf.h"
#include "runtime/model.h"
#include "spec/drafter.h"
#include "spec/generator.h"
#include "spec/speculative.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tools/commands.h"

namespace megakern::cli {
namespace {

struct GenOptions {
  std::string model = "smollm2-135m";
  std::string prompt;
  std::string system;
  std::string chat_template;
  int n_predict = 256;
  int threads = 0;
  bool raw = false;
  bool quiet = false;
  int tp = 1;  // run --tp: tensor parallelism over MPI processes
  ModelFlags model_flags;
  GeneratorOptions gen;  // context, executor, ubatch, sampling; run --spec: speculative decoding
};

void add_common(CLI::App* cmd, GenOptions& o) {
  add_model_flags(cmd, o.model, o.model_flags);
  cmd->add_option("-s,--system", o.system, "System message (chat template only)");
  cmd->add_option("--chat-template", o.chat_template,
                  "Chat format instead of the model's own: a Jinja template file or a built-in name (" +
                      builtin_chat_format_names() + ")");
  cmd->add_option("-n,--n-predict", o.n_predict, "Maximum tokens to generate per answer")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-c,--context", o.gen.n_ctx, "Context size in tokens")->capture_default_str()->check(CLI::Range(16, 1 << 20));
  cmd->add_option("-t,--threads", o.threads, "Worker threads (0: one per core)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--ubatch", o.gen.ubatch,
                  "Prompt positions computed per executor step; also the rows a step may take (default: 32 for "
                  "models with recurrent state, whose chunked prompt pass depends on it, 128 for the others)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--executor", o.gen.executor, "Decode executor: mega, opbyop or reference")
      ->capture_default_str()
      ->check(CLI::IsMember({"mega", "opbyop", "reference"}));
  // The sampler's own checks (validate) hold too; these name the flag and
  // run before the model loads.
  cmd->add_option("--temp", o.gen.sampling.temperature, "Sampling temperature (0: greedy)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            const double t = std::strtod(v.c_str(), nullptr);
            return std::isfinite(t) && t >= 0 && t <= 1e6 ? "" : "must be a finite number in [0, 1e6], got " + v;
          },
          "TEMP"));
  cmd->add_option("--top-k", o.gen.sampling.top_k, "Keep only the k most likely tokens (0: all)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--top-p", o.gen.sampling.top_p, "Nucleus sampling mass in (0, 1]")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            const double p = std::strtod(v.c_str(), nullptr);
            return p > 0 && p <= 1 ? "" : "must be in (0, 1], got " + v;
          },
          "(0,1]"));
  check_seed(cmd->add_option("--seed", o.gen.sampling.seed, "Random seed for sampling")->capture_default_str());
}

// Everything a generation needs, loaded once.
struct Loaded {
  std::unique_ptr<Model> model;
  const Tokenizer* tokenizer = nullptr;
  std::unique_ptr<ThreadPool> pool;
  double load_ms = 0;
  int rank = 0;  // with --tp: this process's rank (only rank 0 prints)
};

Loaded load(const GenOptions& o) {
  validate(o.gen.sampling);
  const ModelOptions mo = o.model_flags.options();
  auto t0 = Clock::now();
  Loaded L;
  L.model = load_model(o.model, mo);
  if (o.tp > 1 && !o.gen.drafter.empty()) fail("--tp does not combine with --spec yet");
  L.rank = apply_tensor_parallel(*L.model, o.tp);
  if (L.rank != 0 && !std::freopen("/dev/null", "w", stdout)) fail("rank {}: cannot silence stdout", L.rank);
  if (!o.chat_template.empty()) L.model->set_chat_format(chat_format_from_option(o.chat_template));
  L.tokenizer = &L.model->tokenizer();
  L.pool = std::make_unique<ThreadPool>(o.threads);
  L.load_ms = ms_since(t0);
  return L;
}

// Generates after `prompt`, streaming the text to stdout.
GenResult generate(Generator& gen, const std::vector<int32_t>& prompt, int n_predict) {
  GenerationParams p;
  p.max_tokens = n_predict;
  GenResult r = gen.generate(prompt, p, [&](const Delta& d) {
    std::fputs(d.text.c_str(), stdout);
    if (!d.done()) std::fflush(stdout);
  });
  if (r.stop == StopReason::ContextFull)
    fmt::print(stderr, "\n[context of {} tokens is full; stopping]\n", gen.n_ctx());
  std::fputs("\n", stdout);
  std::fflush(stdout);
  return r;
}

void print_stats(const Loaded& L, const Generator& gen, const GenResult& r) {
  fmt::print(stderr, "\n[model {} | {} | load {:.0f} ms | {} threads]\n", L.model->name(), L.model->description(),
             L.load_ms, L.pool->size());
  const int n = static_cast<int>(r.tokens.size());
  const double tps = r.decode_ms > 0 ? n * 1000.0 / r.decode_ms : 0.0;
  const SpecStats* st = gen.spec_stats();
  if (!st) {
    fmt::print(stderr, "[prompt: {} tokens ({} computed) in {:.1f} ms, {:.1f} tok/s]\n", r.prompt_tokens,
               r.prompt_computed, r.prefill_ms, r.prefill_ms > 0 ? r.prompt_computed * 1000.0 / r.prefill_ms : 0.0);
    fmt::print(stderr, "[decode: {} tokens in {:.1f} ms, {:.2f} tok/s]\n", n, r.decode_ms, tps);
    return;
  }
  fmt::print(stderr, "[prompt: {} tokens in {:.1f} ms]\n", r.prompt_tokens, r.prefill_ms);
  fmt::print(stderr, "[decode: {} tokens in {:.1f} ms, {:.2f} tok/s]\n", n, r.decode_ms, tps);
  fmt::print(stderr,
             "[speculative, drafter {}: {} verify steps, acceptance length {:.2f} tokens per verify, {}/{} drafts "
             "accepted ({:.0f}%), draft {:.0f} ms, verify {:.0f} ms]\n",
             gen.drafter()->name(), st->rounds, st->mean_accept(), st->accepted, st->proposed,
             100.0 * st->acceptance_rate(), st->draft_ms, st->verify_ms);
}

std::vector<int32_t> encode_conversation(const Loaded& L, const std::vector<ChatMessage>& msgs) {
  const std::string text = render_chat(L.model->chat_format(), msgs, /*add_generation_prompt=*/true);
  return L.tokenizer->encode(text, L.tokenizer->add_bos_default(), /*parse_special=*/true);
}

void run_cmd(const GenOptions& o) {
  Loaded L = load(o);
  std::vector<int32_t> tokens;
  // A model without a chat template in its metadata is treated as a base
  // model: the prompt is continued as plain text (gemma3-270m is one).
  const bool has_template = L.model->declares_chat_template();
  const ChatTemplate chat = L.model->chat_format().kind;
  if (!o.raw && !has_template)
    fmt::print(stderr, "[{} has no chat template in its metadata: continuing the prompt as plain text]\n", o.model);
  else if (!o.raw && chat == ChatTemplate::None)
    fmt::print(stderr, "[{}'s chat template is not one this engine knows: continuing the prompt as plain text]\n",
               o.model);
  if (o.raw || !has_template || chat == ChatTemplate::None) {
    tokens = L.tokenizer->encode(o.prompt, L.tokenizer->add_bos_default(), /*parse_special=*/false);
  } else {
    std::vector<ChatMessage> msgs;
    if (!o.system.empty()) msgs.push_back({"system", o.system});
    msgs.push_back({"user", o.prompt});
    tokens = encode_conversation(L, msgs);
  }
  Generator gen(*L.model, *L.pool, o.gen);
  const GenResult r = generate(gen, tokens, o.n_predict);
  if (!o.quiet && L.rank == 0) print_stats(L, gen, r);
}

void chat_cmd(const GenOptions& o) {
  Loaded L = load(o);
  if (L.model->chat_format().kind == ChatTemplate::None)
    fail("model '{}' has no chat template this engine knows; use 'megakern run --raw' instead", o.model);
  if (!L.model->declares_chat_template())
    fmt::print(stderr, "[{} has no chat template in its metadata; using the {} turn format of its architecture, "
               "which a base model may not follow]\n", o.model, chat_template_name(L.model->chat_format().kind));
  Generator gen(*L.model, *L.pool, o.gen);
  std::vector<ChatMessage> msgs;
  if (!o.system.empty()) msgs.push_back({"system", o.system});
  const bool tty = isatty(STDIN_FILENO);
  if (tty) fmt::print(stderr, "Chatting with {}. Commands: /reset starts over, /exit quits.\n", o.model);
  std::string line;
  for (;;) {
    if (tty) fmt::print(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      msgs.resize(o.system.empty() ? 0 : 1);
      gen.reset();
      fmt::print(stderr, "[conversation reset]\n");
      continue;
    }
    if (line.empty()) continue;
    msgs.push_back({"user", line});
    GenResult r;
    try {
      r = generate(gen, encode_conversation(L, msgs), o.n_predict);
    } catch (const Error& e) {
      msgs.pop_back();
      fmt::print(stderr, "error: {}\n", e.what());
      continue;
    }
    msgs.push_back({"assistant", r.text});
    if (!o.quiet)
      fmt::print(stderr, "[{} prompt tokens ({} new) {:.0f} ms | {} tokens at {:.2f} tok/s]\n", r.prompt_tokens,
                 r.prompt_computed, r.prefill_ms, r.tokens.size(),
                 r.decode_ms > 0 ? r.tokens.size() * 1000.0 / r.decode_ms : 0.0);
  }
}


}  // namespace

void register_run(CLI::App& app) {
  auto o = std::make_shared<GenOptions>();
  auto* cmd = app.add_subcommand("run", "Generate a continuation of a prompt (text on stdout, statistics on stderr)");
  cmd->add_option("-p,--prompt", o->prompt, "The prompt (with the model's chat template unless --raw)")->required();
  cmd->add_flag("--raw", o->raw, "Feed the prompt as plain text, without the chat template");
  cmd->add_flag("-q,--quiet", o->quiet, "Do not print statistics");
  add_tp_flag(cmd, o->tp);
  check_drafters(cmd->add_option("--spec", o->gen.drafter,
                                 "Speculative decoding with this drafter: ngram, ngram:N, self, self:skip=A-B, self:N (layers kept), model:PATH, "
                                 "dspark[:PATH] or dflash[:PATH] (block drafters on target taps; without PATH dspark loads the trained "
                                 "drafter shipped for SmolLM2, other targets get random MINI weights: acceptance near zero)"));
  cmd->add_option("--draft", o->gen.draft, "Speculative decoding: most draft tokens per verify step")
      ->capture_default_str()
      ->check(CLI::Range(1, 32));
  cmd->add_flag("--fixed-draft", o->gen.fixed_draft, "Speculative decoding: always propose --draft tokens");
  add_common(cmd, *o);
  cmd->callback([o] { run_guarded([&] { run_cmd(*o); }); });
}

void register_chat(CLI::App& app) {
  auto o = std::make_shared<GenOptions>();
  o->gen.sampling.temperature = 0.7f;
  o->gen.sampling.top_p = 0.9f;
  o->gen.sampling.seed = 42;
  auto* cmd = app.add_subcommand("chat", "Interactive chat in the terminal (one user turn per line of input)");
  cmd->add_flag("-q,--quiet", o->quiet, "Do not print statistics");
  add_common(cmd, *o);
  cmd->callback([o] { run_guarded([&] { chat_cmd(*o); }); });
}

}  // namespace megakern::cli
