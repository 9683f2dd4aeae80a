// `megakern serve` (the OpenAI-compatible server) and `megakern bench-serve`
// (a streaming load generator for it).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <csignal>
#include <ctime>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "runtime/model.h"
#include "server/bench_client.h"
#include "server/http_server.h"
#include "spec/speculative.h"
#include "tools/commands.h"

namespace megakern::cli {
namespace {

struct ServeOptions {
  std::string model = "smollm2-135m";
  std::string numerics = "exact";
  std::string kv_type = "f32";
  std::string chat_template;
  int threads = 0;
  int drain_s = 30;
  double idle_timeout_s = 5;
  std::string prefix_cache = "on";
  server::ServerOptions server;
};

// Waits up to `timeout` for SIGINT or SIGTERM (blocked in every thread, see
// serve_cmd); returns the signal, or 0 on timeout.
int wait_signal(const sigset_t& set, std::chrono::milliseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000), static_cast<long>(timeout.count() % 1000) * 1000000L};
  const int sig = sigtimedwait(&set, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

void serve_cmd(const ServeOptions& o) {
  // SIGINT and SIGTERM are taken synchronously by this thread: they are
  // blocked before any other thread exists, so every thread inherits the
  // mask and none is interrupted. A peer that closes its socket must not
  // kill the process either.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  ModelOptions mo;
  mo.numerics = parse_numerics(o.numerics);
  mo.kv_type = parse_kv_type(o.kv_type);
  auto model = load_model(o.model, mo);
  if (!o.chat_template.empty()) model->set_chat_format(chat_format_from_option(o.chat_template));
  ThreadPool pool(o.threads);
  server::ServerOptions so = o.server;
  if (so.model_id.empty()) so.model_id = server::default_model_id(o.model);
  so.idle_timeout_ms = static_cast<int>(std::max(1.0, o.idle_timeout_s * 1000));
  so.prefix_cache = o.prefix_cache == "on";
  server::HttpServer srv(*model, pool, so);
  const int port = srv.start();
  fmt::print(stderr,
             "megakern serve: {} ({}) on http://{}:{} | batch {} | step tokens {} | context {} | {} threads | {} executor | "
             "{} numerics\n",
             srv.model_id(), model->description(), so.host, port, so.batch, srv.scheduler().options().step_tokens,
             so.n_ctx, pool.size(), so.executor,
             numerics_name(model->numerics()));
  if (!so.spec.empty())
    fmt::print(stderr, "megakern serve: speculative decoding with {}, at most {} drafts per sequence and step\n", so.spec,
               so.draft);
  if (!so.api_key.empty()) fmt::print(stderr, "megakern serve: an API key is required (Authorization: Bearer ...)\n");
  std::fflush(stderr);

  int sig = 0;
  while (!(sig = wait_signal(set, std::chrono::milliseconds(1000)))) {
  }
  fmt::print(stderr, "megakern serve: {} received; finishing in-flight requests (up to {} s, again to cancel them)\n",
             sig == SIGINT ? "SIGINT" : "SIGTERM", o.drain_s);
  srv.begin_shutdown();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.drain_s);
  while (!srv.scheduler().idle() && std::chrono::steady_clock::now() < deadline) {
    if (wait_signal(set, std::chrono::milliseconds(50))) {
      fmt::print(stderr, "megakern serve: cancelling in-flight requests\n");
      break;
    }
  }
  srv.shutdown(std::chrono::milliseconds(0));
  const auto st = srv.scheduler().stats();
  fmt::print(stderr, "megakern serve: stopped after {} requests, {} tokens generated\n", st.requests_submitted,
             st.generated_tokens);
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  check_non_empty(cmd->add_option("-m,--model", o->model,
                                   "Model: a GGUF file, a checkpoint directory, a fetched model name or a preset (" +
                                       fmt::format("{}", fmt::join(known_model_and_preset_names(), ", ")) + ")")
                       ->capture_default_str());
  add_numerics_flag(cmd, o->numerics);
  add_kv_type_flag(cmd, o->kv_type);
  cmd->add_option("--chat-template", o->chat_template,
                  "Chat format instead of the model's own: a Jinja template file or a built-in name (" +
                      builtin_chat_format_names() + ")");
  check_non_empty(
      cmd->add_option("--host", o->server.host, "Address to listen on (127.0.0.1: this machine only)")->capture_default_str());
  cmd->add_option("--port", o->server.port, "Port to listen on (0: any free port, printed at start)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->server.api_key, "Require 'Authorization: Bearer KEY' on every endpoint but /health")
      ->check(
          [](const std::string& key) -> std::string {
            // An empty key would turn authentication off without a word: a
            // key that came from an unset variable must stop the start.
            if (key.find_first_not_of(" \t\r\n") == std::string::npos)
              return "the API key is empty (leave --api-key out to serve without one)";
            for (unsigned char c : key)
              if (c < 0x21 || c == 0x7f) return "the API key must not contain spaces or control characters";
            return "";
          },
          "KEY");
  cmd->add_option("-c,--context", o->server.n_ctx, "Context size in tokens of each sequence")
      ->capture_default_str()
      ->check(CLI::Range(16, 1 << 20));
  cmd->add_option("--max-tokens", o->server.max_tokens, "Default and upper limit of a request's max_tokens")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--batch", o->server.batch, "Sequences decoded together (rows of one decode step)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--step-tokens", o->server.step_tokens,
                  "Most rows of one engine step: the decode rows of every active sequence plus chunks of pending "
                  "prompts (default: " + std::to_string(server::kDefaultStepTokens) +
                      ", or --batch plus one prompt chunk when that is more). Beside d decode rows a step takes at "
                      "most " + fmt::format("max({}, {:g} x d)", server::kMinPromptRows, server::kPromptRowsPerDecodeRow) +
                      " prompt rows")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--prefix-cache", o->prefix_cache,
                  "on: a request starts in the free row that already holds the longest prefix of its prompt (an "
                  "earlier chat turn, a shared system prompt) and computes only the rest; attention models only; "
                  "off: every prompt from its first token")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  auto* spec = check_drafters(cmd->add_option("--spec", o->server.spec,
                                 "Speculative decoding with this drafter (as for run: ngram, ngram:N, self, self:N, "
                                 "self:skip=A-B, model:PATH, dspark[:PATH], dflash[:PATH]): each decoding sequence's "
                                 "drafts are verified as rows of the same step, in the rows --step-tokens leaves"));
  cmd->add_option("--draft", o->server.draft, "Speculative decoding: most draft tokens per sequence and step")
      ->capture_default_str()
      ->check(CLI::Range(1, SpecOptions::kMaxDraft))
      ->needs(spec);
  cmd->add_option("--queue", o->server.queue, "Requests that may wait for a batch row; beyond that, HTTP 503")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  cmd->add_option("--executor", o->server.executor, "Decode executor: mega, opbyop or reference")
      ->capture_default_str()
      ->check(CLI::IsMember({"mega", "opbyop", "reference"}));
  cmd->add_option("-t,--threads", o->threads, "Worker threads for decoding (0: one per core)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--http-threads", o->server.io_threads, "Threads serving every HTTP connection (event-driven)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--max-connections", o->server.max_connections,
                  "Connections held at once; beyond, idle ones close to make room, else only /health is served "
                  "(each takes a file descriptor: raise ulimit -n to match)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--idle-timeout", o->idle_timeout_s, "Seconds a keep-alive connection may wait for its next request")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 86400.0));
  check_non_empty(cmd->add_option("--model-id", o->server.model_id, "Name the model is served under (default: from --model)"));
  cmd->add_option("--drain-timeout", o->drain_s, "Seconds in-flight requests may finish after SIGINT/SIGTERM")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600));
  cmd->callback([o] { run_guarded([&] { serve_cmd(*o); }); });
}

void register_bench_serve(CLI::App& app) {
  auto o = std::make_shared<server::BenchOptions>();
  auto* cmd = app.add_subcommand(
      "bench-serve", "Streaming load test of a running server: time to first token, time per output token, tokens/s");
  cmd->add_option("--url", o->url, "Server base URL")->capture_default_str();
  cmd->add_option("--concurrency", o->concurrency, "Clients sending requests at the same time")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--requests", o->requests, "Requests in all")->capture_default_str()->check(CLI::Range(1, 1000000));
  cmd->add_option("--output-len", o->output_len, "Tokens generated per request (max_tokens, end-of-text ignored)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--prompt", o->prompt, "Prompt text")->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "API key, when the server wants one");
  cmd->add_option("--model", o->model, "Value of the request's 'model' field (default: none sent)");
  cmd->add_flag("--chat", o->chat, "Use /v1/chat/completions (the prompt as one user message)");
  cmd->add_option("--turns", o->turns,
                  "With --chat: each request a conversation of this many turns, every turn sending the history "
                  "(the answers received and --follow-up after each); later turns' TTFT and cached tokens are "
                  "reported apart")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--follow-up", o->follow_up, "With --turns: the user message of every turn after the first")
      ->capture_default_str();
  cmd->callback([o] {
    run_guarded([&] {
      const auto s = server::run_bench(*o);
      fmt::print("{}", server::format_summary(*o, s));
      std::fflush(stdout);
      if (s.failed > 0) fail("{} of {} requests failed", s.failed, o->requests * o->turns);
    });
  });
}

}  // namespace megakern::cli
