#include "server/http_server.h"

#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "core/thread_pool.h"
#include "server/http_guard.h"
#include "runtime/model.h"
#include "tokenizer/tokenizer.h"

namespace megakern::server {

const char* const kServerVersion = "0.1.0";

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump_json(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, error_body(e)); }

// Runs a handler body, turning every exception into an HTTP error: ApiError
// as it says, other bad input (megakern::Error, JSON type errors) as 400,
// anything else as 500. No exception escapes into httplib.
template <typename F>
void guarded(httplib::Response& res, F&& body) {
  try {
    body();
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const Error& e) {
    send_error(res, ApiError(400, e.what()));
  } catch (const json::exception& e) {
    send_error(res, ApiError(400, fmt::format("malformed request: {}", e.what())));
  } catch (const std::exception& e) {
    send_error(res, ApiError(500, fmt::format("internal error: {}", e.what()), "server_error"));
  }
}

// How often a waiting HTTP thread looks at its job, and how long a response
// may go without a write before one is made only to learn whether the client
// is still there (sockets report a closed peer only when written to).
constexpr auto kPoll = std::chrono::milliseconds(100);
constexpr auto kProbeAfter = std::chrono::milliseconds(1000);

// httplib reports a failed bind as false only: bind once more, the same way,
// to learn why ("Address already in use", "Cannot assign requested address").
std::string bind_failure(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0)
    return fmt::format("cannot resolve the address ({})", ::gai_strerror(rc));
  std::string why = "unknown reason";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int s = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (s < 0) {
      why = std::strerror(errno);
      continue;
    }
    int yes = 1;
    ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    const int rc = ::bind(s, a->ai_addr, a->ai_addrlen);
    why = rc == 0 ? "address in use by a listener that raced us" : std::strerror(errno);
    ::close(s);
    if (rc != 0) break;
  }
  ::freeaddrinfo(res);
  if (why == std::strerror(EADDRINUSE)) why += " (another server listens on this port)";
  return why;
}

}  // namespace

std::string default_model_id(const std::string& name_or_path) {
  std::filesystem::path p(name_or_path);
  if (p.extension() == ".gguf") return p.stem().string();
  return name_or_path;
}

struct HttpServer::Impl {
  std::mutex mu;
  std::map<int, uint64_t> responses_by_status;  // HTTP responses sent, by status
  std::atomic<uint64_t> next_id{1};
  uint32_t nonce = std::random_device{}();
  int64_t started = unix_now();
};

HttpServer::HttpServer(const Model& model, ThreadPool& pool, ServerOptions opts)
    : model_(model), opts_(std::move(opts)), impl_(std::make_unique<Impl>()) {
  model_id_ = opts_.model_id.empty() ? default_model_id(model_.name()) : opts_.model_id;
  if (opts_.max_tokens < 1) fail("--max-tokens must be at least 1, got {}", opts_.max_tokens);
  SchedulerOptions so;
  so.max_rows = opts_.batch;
  so.n_ctx = opts_.n_ctx;
  so.queue_limit = opts_.queue;
  so.executor = opts_.executor;
  scheduler_ = std::make_unique<Scheduler>(model_, pool, so);
  ConnectionLimits cl;
  // Every connection has its own thread: even a full queue leaves threads to
  // answer 503, and connections beyond them are answered 503 at once.
  cl.max_connections = opts_.http_threads > 0 ? opts_.http_threads : std::max(8, opts_.batch + opts_.queue + 8);
  cl.header_timeout = std::chrono::milliseconds(std::max(1, opts_.header_timeout_ms));
  cl.body_timeout = std::chrono::milliseconds(std::max(1, opts_.body_timeout_ms));
  cl.idle_timeout = std::chrono::milliseconds(std::max(1, opts_.idle_timeout_ms));
  cl.overflow_timeout = std::min(cl.overflow_timeout, cl.header_timeout);
  cl.max_body = opts_.max_body;
  // Clients such as the openai package keep a pool of connections; let them
  // reuse one for many requests.
  cl.max_requests_per_connection = 1000;
  http_ = std::make_unique<GuardedServer>(cl);
  setup_routes();
}

HttpServer::~HttpServer() { shutdown(std::chrono::milliseconds(0)); }

int HttpServer::start() {
  if (port_ >= 0) fail("the server is already started (port {})", port_);
  if (opts_.port == 0) {
    port_ = http_->bind_to_any_port(opts_.host);
    if (port_ < 0) fail("could not listen on {} (any port)", opts_.host);
  } else {
    if (!http_->bind_to_port(opts_.host, opts_.port))
      fail("could not listen on {}:{}: {}", opts_.host, opts_.port, bind_failure(opts_.host, opts_.port));
    port_ = opts_.port;
  }
  if (!http_->apply_listen_backlog()) fail("could not set the listen backlog on {}:{}", opts_.host, port_);
  listener_ = std::thread([this] {
    http_->listen_after_bind();
    listener_done_ = true;
  });
  return port_;
}

void HttpServer::begin_shutdown() {
  stopping_ = true;
  scheduler_->begin_shutdown();
}

void HttpServer::shutdown(std::chrono::milliseconds drain) {
  if (stopped_.exchange(true)) return;
  begin_shutdown();
  const auto deadline = Clock::now() + drain;
  while (!scheduler_->idle() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  scheduler_->cancel_all();
  while (!scheduler_->idle()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // Every job is finished; the responses still being written end within a
  // poll or two (a client that stopped reading is given up on).
  const auto written_by = Clock::now() + std::chrono::seconds(10);
  while (open_responses_ > 0 && Clock::now() < written_by) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // httplib's stop() closes the listener and waits for its threads.
  if (port_ >= 0) {
    // Idle and slow clients must not hold the serving threads: their reads
    // and waits end now (in-flight responses were given their time above).
    http_->abort_connections();
    // stop() only acts on a running listener: give a just-started one the
    // moment it needs to get there.
    while (!http_->is_running() && !listener_done_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    http_->stop();
  }
  if (listener_.joinable()) listener_.join();
}

std::string HttpServer::metrics_text() const {
  const SchedulerStats s = scheduler_->stats();
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, const std::string& lines) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}", name, help, name, type, lines);
  };
  auto line = [](const char* name, auto value, const std::string& labels = {}) {
    return fmt::format("{}{} {}\n", name, labels.empty() ? "" : "{" + labels + "}", value);
  };
  metric("megakern_requests_total", "counter", "Generation requests accepted into the queue.",
         line("megakern_requests_total", s.requests_submitted));
  metric("megakern_requests_rejected_total", "counter",
         "Generation requests refused with 503 (queue full or shutting down).",
         line("megakern_requests_rejected_total", s.requests_rejected));
  metric("megakern_requests_finished_total", "counter", "Generation requests finished, by how they ended.",
         line("megakern_requests_finished_total", s.finished_stop, "reason=\"stop\"") +
             line("megakern_requests_finished_total", s.finished_length, "reason=\"length\"") +
             line("megakern_requests_finished_total", s.finished_cancelled, "reason=\"cancelled\"") +
             line("megakern_requests_finished_total", s.finished_error, "reason=\"error\""));
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    std::string lines;
    for (const auto& [status, n] : impl_->responses_by_status)
      lines += line("megakern_http_responses_total", n, fmt::format("status=\"{}\"", status));
    metric("megakern_http_responses_total", "counter", "HTTP responses sent, by status.", lines);
  }
  metric("megakern_http_connections_overflow_total", "counter",
         "Connections beyond the connection cap (answered 503, or /health only).",
         line("megakern_http_connections_overflow_total", http_->overflow_count()));
  metric("megakern_prompt_tokens_total", "counter", "Prompt tokens prefilled.",
         line("megakern_prompt_tokens_total", s.prompt_tokens));
  metric("megakern_generation_tokens_total", "counter", "Tokens generated.",
         line("megakern_generation_tokens_total", s.generated_tokens));
  metric("megakern_queue_depth", "gauge", "Requests waiting for a batch row.",
         line("megakern_queue_depth", s.queue_depth));
  metric("megakern_active_sequences", "gauge", "Sequences in the decode batch.",
         line("megakern_active_sequences", s.active));
  metric("megakern_batch_rows", "gauge", "Rows per decode step (--batch).",
         line("megakern_batch_rows", scheduler_->options().max_rows));
  metric("megakern_step_seconds", "summary", "Time in decode steps (one step advances every active sequence).",
         line("megakern_step_seconds_sum", s.step_seconds) + line("megakern_step_seconds_count", s.steps));
  metric("megakern_step_rows_total", "counter", "Rows computed over all decode steps.",
         line("megakern_step_rows_total", s.step_rows));
  metric("megakern_prefill_seconds", "summary", "Time in prompt prefills.",
         line("megakern_prefill_seconds_sum", s.prefill_seconds) + line("megakern_prefill_seconds_count", s.prefills));
  return out;
}

void HttpServer::setup_routes() {
  using httplib::Request;
  using httplib::Response;
  auto& svr = *http_;

  svr.set_pre_routing_handler([this](const Request& req, Response& res) {
    // Beyond the connection cap only /health is served (a monitor must see
    // the server alive when clients have taken every connection); the rest
    // are told to come back, before their bodies are read.
    if (GuardedServer::overflow_request() && req.path != "/health") {
      GuardedServer::close_after_response();
      send_json(res, 503,
                error_body("the server has too many open connections, retry later", "server_error", "",
                           "too_many_connections"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (opts_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + opts_.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    // The body is not read: the connection cannot carry another request.
    GuardedServer::close_after_response();
    send_json(res, 401,
              error_body("invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                         "invalid_request_error", "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // Unknown paths and methods get an error body like every other error.
  svr.set_error_handler([this](const Request& req, Response& res) {
    if (GuardedServer::body_too_large() || res.status == 413) {
      res.status = 413;
      res.set_content(dump_json(error_body(fmt::format("the request body is larger than the limit of {} bytes",
                                                       opts_.max_body),
                                           "invalid_request_error", "", "request_too_large")),
                      "application/json");
      return;
    }
    if (!res.body.empty()) return;
    const std::string msg = res.status == 404 ? fmt::format("no such endpoint: {} {}", printable(req.method, 32), printable(req.path))
                                              : fmt::format("HTTP {}", res.status);
    res.set_content(dump_json(error_body(msg, "invalid_request_error")), "application/json");
  });
  svr.set_exception_handler([](const Request&, Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_json(res, 500, error_body("internal error: " + what, "server_error"));
  });
  svr.set_logger([this](const Request&, const Response& res) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    ++impl_->responses_by_status[res.status];
  });

  svr.Get("/health", [this](const Request&, Response& res) {
    if (stopping_)
      send_json(res, 503, {{"status", "stopping"}});
    else
      send_json(res, 200, {{"status", "ok"}});
  });
  svr.Get("/version", [this](const Request&, Response& res) {
    send_json(res, 200,
              {{"version", kServerVersion},
               {"engine", "megakern"},
               {"model", model_id_},
               {"description", model_.description()},
               {"executor", opts_.executor},
               {"numerics", numerics_name(model_.numerics())},
               {"batch", opts_.batch},
               {"context", opts_.n_ctx},
               {"max_tokens", opts_.max_tokens}});
  });
  svr.Get("/metrics", [this](const Request&, Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  auto model_object = [this] {
    return json{{"id", model_id_}, {"object", "model"}, {"created", impl_->started}, {"owned_by", "megakern"}};
  };
  svr.Get("/v1/models", [model_object](const Request&, Response& res) {
    send_json(res, 200, {{"object", "list"}, {"data", json::array({model_object()})}});
  });
  svr.Get(R"(/v1/models/(.+))", [this, model_object](const Request& req, Response& res) {
    if (req.matches[1] == model_id_)
      send_json(res, 200, model_object());
    else
      send_error(res, ApiError(404, fmt::format("the model '{}' does not exist", printable(req.matches[1].str())),
                               "invalid_request_error", "model", "model_not_found"));
  });

  svr.Post("/tokenize", [this](const Request& req, Response& res) {
    guarded(res, [&] {
      const json body = parse_json_object(req.body);
      auto it = body.find("content");
      if (it == body.end() || !it->is_string()) bad_param("content", "'content' must be a string");
      auto flag = [&](const char* key, bool dflt) {
        auto f = body.find(key);
        if (f == body.end() || f->is_null()) return dflt;
        if (!f->is_boolean()) bad_param(key, "'{}' must be a boolean", key);
        return f->get<bool>();
      };
      const bool add_special = flag("add_special", false);
      const bool parse_special = flag("parse_special", true);
      const Tokenizer& tok = model_.tokenizer();
      const auto ids = tok.encode(it->get<std::string>(), add_special && tok.bos_id() >= 0, parse_special);
      send_json(res, 200, {{"tokens", ids}});
    });
  });
  svr.Post("/detokenize", [this](const Request& req, Response& res) {
    guarded(res, [&] {
      const json body = parse_json_object(req.body);
      auto it = body.find("tokens");
      if (it == body.end() || !it->is_array()) bad_param("tokens", "'tokens' must be an array of token ids");
      std::vector<int32_t> ids;
      const int n_vocab = model_.tokenizer().n_vocab();
      for (const auto& t : *it) {
        if (!t.is_number_integer()) bad_param("tokens", "'tokens' must hold integers only");
        const int64_t id = t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)
                               ? int64_t{-1}
                               : t.get<int64_t>();
        if (id < 0 || id >= n_vocab)
          bad_param("tokens", "token id {} is outside the vocabulary of {}", t.dump(), n_vocab);
        ids.push_back(static_cast<int32_t>(id));
      }
      send_json(res, 200, {{"content", model_.tokenizer().decode(ids, /*skip_special=*/false)}});
    });
  });

  auto generate = [this](Endpoint ep) {
    return [this, ep](const Request& req, Response& res) {
      guarded(res, [&] {
        const json body = parse_json_object(req.body);
        ApiLimits limits;
        limits.model_names = {model_id_};
        if (model_.name() != model_id_) limits.model_names.push_back(model_.name());
        limits.n_ctx = opts_.n_ctx;
        limits.max_tokens = opts_.max_tokens;
        GenRequest g = ep == Endpoint::Completions ? parse_completion_request(body, model_, limits)
                                                   : parse_chat_request(body, model_, limits);
        auto job = scheduler_->submit(std::move(g));
        if (!job)
          throw ApiError(503,
                         stopping_ ? "the server is shutting down"
                                   : "the server is busy: the request queue is full, retry later",
                         "server_error", "", stopping_ ? "shutting_down" : "queue_full");
        // Nothing below should throw; if something does, the job must not
        // run on for a response that will never be written.
        struct CancelUnlessAnswered {
          Job& job;
          Scheduler& sched;
          bool answered = false;
          ~CancelUnlessAnswered() {
            if (!answered) {
              job.cancel();
              sched.notify();
            }
          }
        } guard{*job, *scheduler_};
        ResponseId rid;
        rid.endpoint = ep;
        rid.id = fmt::format("{}-{:08x}{:06x}", ep == Endpoint::Completions ? "cmpl" : "chatcmpl", impl_->nonce,
                             impl_->next_id.fetch_add(1));
        rid.created = unix_now();
        rid.model = model_id_;
        ++open_responses_;
        std::shared_ptr<void> open(nullptr, [this](void*) { --open_responses_; });
        if (job->request.stream)
          respond_stream(job, rid, res, std::move(open));
        else
          respond_whole(job, rid, res, std::move(open));
        guard.answered = true;
      });
    };
  };
  svr.Post("/v1/completions", generate(Endpoint::Completions));
  svr.Post("/v1/chat/completions", generate(Endpoint::ChatCompletions));
  // Without the /v1 prefix too, as other servers accept them.
  svr.Post("/completions", generate(Endpoint::Completions));
  svr.Post("/chat/completions", generate(Endpoint::ChatCompletions));
}

namespace {

// The error a job that did not complete reports.
ApiError job_error(const Job::Update& u) {
  if (u.finish == FinishReason::Cancelled)
    return ApiError(503, "the request was cancelled: the server is shutting down", "server_error", "", "cancelled");
  return ApiError(500, u.error.empty() ? "generation failed" : u.error, "server_error");
}

}  // namespace

void HttpServer::respond_whole(const std::shared_ptr<Job>& job, const ResponseId& rid, httplib::Response& res,
                               std::shared_ptr<void> open) {
  // Short generations are answered whole, with their real status. A longer
  // one switches to a chunked body so that the connection can be probed with
  // leading whitespace (valid before a JSON value): a client that has gone
  // away makes the write fail, and its request is cancelled.
  std::string text;
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < kProbeAfter) {
    Job::Update u = job->take(kPoll);
    text += u.text;
    if (!u.finished) continue;
    if (u.finish == FinishReason::Stop || u.finish == FinishReason::Length)
      send_json(res, 200, completion_body(rid, text, u.finish, u.usage));
    else
      send_error(res, job_error(u));
    return;
  }
  Scheduler* sched = scheduler_.get();
  auto last_write = std::make_shared<Clock::time_point>(Clock::now());
  auto acc = std::make_shared<std::string>(std::move(text));
  res.status = 200;
  res.set_chunked_content_provider(
      "application/json",
      [job, rid, sched, last_write, acc](size_t, httplib::DataSink& sink) {
        Job::Update u = job->take(kPoll);
        *acc += u.text;
        if (u.finished) {
          const json body = (u.finish == FinishReason::Stop || u.finish == FinishReason::Length)
                                ? completion_body(rid, *acc, u.finish, u.usage)
                                : error_body(job_error(u));
          const std::string s = dump_json(body);
          if (!sink.write(s.data(), s.size())) return false;
          sink.done();
          return true;
        }
        if (Clock::now() - *last_write >= kProbeAfter) {
          *last_write = Clock::now();
          if (!sink.write(" ", 1)) {
            job->cancel();
            sched->notify();
            return false;
          }
        }
        return true;
      },
      [job, sched, open](bool) {
        if (!job->finished()) {
          job->cancel();
          sched->notify();
        }
      });
}

void HttpServer::respond_stream(const std::shared_ptr<Job>& job, const ResponseId& rid, httplib::Response& res,
                                std::shared_ptr<void> open) {
  Scheduler* sched = scheduler_.get();
  struct State {
    bool first = true;
    Clock::time_point last_write = Clock::now();
  };
  auto st = std::make_shared<State>();
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, rid, sched, st](size_t, httplib::DataSink& sink) {
        const bool usage = job->request.include_usage;
        std::string out;
        // Chat streams open with the assistant role, before any text.
        if (st->first && rid.endpoint == Endpoint::ChatCompletions) {
          out += sse_event(stream_chunk(rid, "", std::nullopt, true, usage));
          st->first = false;
        }
        Job::Update u = job->take(kPoll);
        if (!u.text.empty()) {
          out += sse_event(stream_chunk(rid, u.text, std::nullopt, st->first, usage));
          st->first = false;
        }
        if (u.finished) {
          if (u.finish == FinishReason::Stop || u.finish == FinishReason::Length) {
            out += sse_event(stream_chunk(rid, "", u.finish, st->first, usage));
            if (usage) out += sse_event(usage_chunk(rid, u.usage));
            out += kSseDone;
          } else {
            out += sse_event(error_body(job_error(u)));
          }
        } else if (out.empty() && Clock::now() - st->last_write >= kProbeAfter) {
          out = ": keep-alive\n\n";  // an SSE comment: clients ignore it, a closed socket refuses it
        }
        if (!out.empty()) {
          st->last_write = Clock::now();
          if (!sink.write(out.data(), out.size())) {
            job->cancel();
            sched->notify();
            return false;
          }
        }
        if (u.finished) sink.done();
        return true;
      },
      [job, sched, open](bool) {
        if (!job->finished()) {
          job->cancel();
          sched->notify();
        }
      });
}

}  // namespace megakern::server
