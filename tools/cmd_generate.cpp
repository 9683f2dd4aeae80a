// `megakern run` and `megakern chat`.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/gguf.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tools/commands.h"
#include "tools/spec_cli.h"

namespace megakern::cli {
namespace {

struct GenOptions {
  std::string model = "smollm2-135m";
  std::string prompt;
  std::string system;
  int n_predict = 256;
  int n_ctx = 4096;
  int threads = 0;
  bool raw = false;
  bool quiet = false;
  std::string executor = "mega";
  int ubatch = kDefaultUbatch;  // rows per prompt step on the executor path
  ModelFlags model_flags;
  SamplingParams sampling;
  SpecCliOptions spec;  // run --spec: speculative decoding
};

void add_common(CLI::App* cmd, GenOptions& o) {
  add_model_flags(cmd, o.model, o.model_flags);
  cmd->add_option("-s,--system", o.system, "System message (chat template only)");
  cmd->add_option("-n,--n-predict", o.n_predict, "Maximum tokens to generate per answer")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-c,--context", o.n_ctx, "Context size in tokens")->capture_default_str()->check(CLI::Range(16, 1 << 20));
  cmd->add_option("-t,--threads", o.threads, "Worker threads (0: one per core)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--ubatch", o.ubatch,
                  "Prompt positions computed per executor step (models without a batched prompt pass: Qwen3.8, "
                  "Kimi K3, Muse Spark); also the rows a step may take")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--executor", o.executor, "Decode executor: mega, opbyop or reference")
      ->capture_default_str()
      ->check(CLI::IsMember({"mega", "opbyop", "reference"}));
  cmd->add_option("--temp", o.sampling.temperature, "Sampling temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", o.sampling.top_k, "Keep only the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--top-p", o.sampling.top_p, "Nucleus sampling mass in (0, 1]")->capture_default_str();
  cmd->add_option("--seed", o.sampling.seed, "Random seed for sampling")->capture_default_str();
}

// Everything a generation needs, loaded once.
struct Loaded {
  std::unique_ptr<Model> model;
  const Tokenizer* tokenizer = nullptr;
  std::unique_ptr<ThreadPool> pool;
  double load_ms = 0;
};

Loaded load(const GenOptions& o) {
  validate(o.sampling);
  const ModelOptions mo = o.model_flags.options();
  auto t0 = Clock::now();
  Loaded L;
  L.model = load_model(o.model, mo);
  L.tokenizer = &L.model->tokenizer();
  L.pool = std::make_unique<ThreadPool>(o.threads);
  L.load_ms = ms_since(t0);
  return L;
}

struct GenStats {
  int prompt_tokens = 0;
  int new_prompt_tokens = 0;
  double prefill_ms = 0;
  int generated = 0;
  double decode_ms = 0;
};

// Generates from the session's current logits until an end-of-generation
// token or n_predict tokens, streaming text to `out`. Returns the text.
std::string generate(Loaded& L, Session& s, Sampler& sampler, int n_predict, FILE* out, GenStats& st) {
  StreamDecoder dec(*L.tokenizer);
  std::string text;
  auto t0 = Clock::now();
  for (int i = 0; i < n_predict; ++i) {
    const auto& logits = s.logits();
    const int32_t tok = sampler.sample(logits.data(), static_cast<int64_t>(logits.size()));
    if (L.tokenizer->is_end_of_generation(tok)) break;
    const std::string piece = dec.push(tok);
    text += piece;
    if (out) {
      std::fputs(piece.c_str(), out);
      std::fflush(out);
    }
    ++st.generated;
    if (i + 1 == n_predict) break;
    if (static_cast<int>(s.tokens().size()) >= s.n_ctx()) {
      fmt::print(stderr, "\n[context of {} tokens is full; stopping]\n", s.n_ctx());
      break;
    }
    s.append(tok);
  }
  const std::string rest = dec.flush();
  text += rest;
  if (out) std::fputs(rest.c_str(), out);
  st.decode_ms += ms_since(t0);
  return text;
}

void print_stats(const Loaded& L, const GenStats& st) {
  fmt::print(stderr, "\n[model {} | {} | load {:.0f} ms | {} threads]\n", L.model->name(), L.model->description(),
             L.load_ms, L.pool->size());
  fmt::print(stderr, "[prompt: {} tokens ({} computed) in {:.1f} ms, {:.1f} tok/s]\n", st.prompt_tokens,
             st.new_prompt_tokens, st.prefill_ms,
             st.prefill_ms > 0 ? st.new_prompt_tokens * 1000.0 / st.prefill_ms : 0.0);
  fmt::print(stderr, "[decode: {} tokens in {:.1f} ms, {:.2f} tok/s]\n", st.generated, st.decode_ms,
             st.decode_ms > 0 ? st.generated * 1000.0 / st.decode_ms : 0.0);
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
  if (!o.spec.drafter.empty()) {
    run_speculative(*L.model, *L.pool, tokens, o.n_ctx, o.n_predict, o.sampling, o.executor, o.spec, o.quiet,
                    L.load_ms, o.ubatch);
    return;
  }
  Session s(*L.model, *L.pool, o.n_ctx, o.executor, o.ubatch);
  Sampler sampler(o.sampling);
  GenStats st;
  st.prompt_tokens = st.new_prompt_tokens = static_cast<int>(tokens.size());
  auto t0 = Clock::now();
  s.set_tokens(tokens);
  st.prefill_ms = ms_since(t0);
  generate(L, s, sampler, o.n_predict, stdout, st);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (!o.quiet) print_stats(L, st);
}

void chat_cmd(const GenOptions& o) {
  Loaded L = load(o);
  if (L.model->chat_format().kind == ChatTemplate::None)
    fail("model '{}' has no chat template this engine knows; use 'megakern run --raw' instead", o.model);
  if (!L.model->declares_chat_template())
    fmt::print(stderr, "[{} has no chat template in its metadata; using the {} turn format of its architecture, "
               "which a base model may not follow]\n", o.model, chat_template_name(L.model->chat_format().kind));
  Session s(*L.model, *L.pool, o.n_ctx, o.executor, o.ubatch);
  Sampler sampler(o.sampling);
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
      s.reset();
      fmt::print(stderr, "[conversation reset]\n");
      continue;
    }
    if (line.empty()) continue;
    msgs.push_back({"user", line});
    const auto tokens = encode_conversation(L, msgs);
    GenStats st;
    st.prompt_tokens = static_cast<int>(tokens.size());
    st.new_prompt_tokens = static_cast<int>(tokens.size() - s.reusable_prefix(tokens));
    auto t0 = Clock::now();
    try {
      s.set_tokens(tokens);
    } catch (const Error& e) {
      msgs.pop_back();
      fmt::print(stderr, "error: {}\n", e.what());
      continue;
    }
    st.prefill_ms = ms_since(t0);
    const std::string answer = generate(L, s, sampler, o.n_predict, stdout, st);
    std::fputs("\n", stdout);
    std::fflush(stdout);
    msgs.push_back({"assistant", answer});
    if (!o.quiet)
      fmt::print(stderr, "[{} prompt tokens ({} new) {:.0f} ms | {} tokens at {:.2f} tok/s]\n", st.prompt_tokens,
                 st.new_prompt_tokens, st.prefill_ms, st.generated,
                 st.decode_ms > 0 ? st.generated * 1000.0 / st.decode_ms : 0.0);
  }
}


}  // namespace

void register_run(CLI::App& app) {
  auto o = std::make_shared<GenOptions>();
  auto* cmd = app.add_subcommand("run", "Generate a continuation of a prompt (text on stdout, statistics on stderr)");
  cmd->add_option("-p,--prompt", o->prompt, "The prompt (with the model's chat template unless --raw)")->required();
  cmd->add_flag("--raw", o->raw, "Feed the prompt as plain text, without the chat template");
  cmd->add_flag("-q,--quiet", o->quiet, "Do not print statistics");
  cmd->add_option("--spec", o->spec.drafter,
                  "Speculative decoding with this drafter: ngram, ngram:N, self, self:skip=A-B, self:N (layers kept), model:PATH, "
                  "dspark[:PATH] or dflash[:PATH] (block drafters on target taps; without PATH random MINI weights, "
                  "so acceptance is near zero)");
  cmd->add_option("--draft", o->spec.draft, "Speculative decoding: most draft tokens per verify step")
      ->capture_default_str()
      ->check(CLI::Range(1, 32));
  cmd->add_flag("--fixed-draft", o->spec.fixed, "Speculative decoding: always propose --draft tokens");
  add_common(cmd, *o);
  cmd->callback([o] { run_guarded([&] { run_cmd(*o); }); });
}

void register_chat(CLI::App& app) {
  auto o = std::make_shared<GenOptions>();
  o->sampling.temperature = 0.7f;
  o->sampling.top_p = 0.9f;
  o->sampling.seed = 42;
  auto* cmd = app.add_subcommand("chat", "Interactive chat in the terminal (one user turn per line of input)");
  cmd->add_flag("-q,--quiet", o->quiet, "Do not print statistics");
  add_common(cmd, *o);
  cmd->callback([o] { run_guarded([&] { chat_cmd(*o); }); });
}

}  // namespace megakern::cli
