#include "server/http_server.h"

#include <filesystem>
#include <map>
#include <random>

#include "core/thread_pool.h"
#include "runtime/model.h"
#include "tokenizer/tokenizer.h"

namespace megakern::server {

const char* const kServerVersion = "0.1.0";

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

HttpResponse json_response(int status, const json& j) {
  HttpResponse r;
  r.status = status;
  r.body = dump_json(j);
  return r;
}

HttpResponse error_response(const ApiError& e) { return json_response(e.status, error_body(e)); }

// Runs a handler body, turning every exception into an HTTP error: ApiError
// as it says, other bad input (megakern::Error, JSON type errors) as 400,
// anything else as 500.
template <typename F>
HttpReply guarded(F&& body) {
  try {
    return body();
  } catch (const ApiError& e) {
    return {error_response(e), nullptr};
  } catch (const Error& e) {
    return {error_response(ApiError(400, e.what())), nullptr};
  } catch (const json::exception& e) {
    return {error_response(ApiError(400, fmt::format("malformed request: {}", e.what()))), nullptr};
  } catch (const std::exception& e) {
    return {error_response(ApiError(500, fmt::format("internal error: {}", e.what()), "server_error")), nullptr};
  }
}

// The error a job that did not complete reports.
ApiError job_error(const Job::Update& u) {
  if (u.finish == FinishReason::Cancelled)
    return ApiError(503, "the request was cancelled: the server is shutting down", "server_error", "", "cancelled");
  return ApiError(500, u.error.empty() ? "generation failed" : u.error, "server_error");
}

bool completed(const Job::Update& u) { return u.finish == FinishReason::Stop || u.finish == FinishReason::Length; }

// What one choice of a response has produced so far.
struct ChoiceState {
  std::string text;
  std::vector<TokenLogprob> logprobs;
  int64_t offset = 0;  // completions: text offset of the next logprob entry
  bool started = false;  // streams: its first chunk is sent
  bool entries_sent = false;  // streams: its first logprob entries are sent
  bool done = false;     // streams: its finish chunk is sent
  Job::Update last;      // the final update, once finished
};

// A generation's response, one job per choice; it holds `open` until it is
// written or dropped (see HttpServer::open_responses_) and cancels its jobs
// when dropped early.
class JobSource : public ResponseSource {
 public:
  JobSource(std::vector<std::shared_ptr<Job>> jobs, ResponseId rid, Scheduler& sched, const Model& model,
            std::shared_ptr<void> open)
      : jobs_(std::move(jobs)), rid_(std::move(rid)), sched_(sched), model_(model), open_(std::move(open)),
        choices_(jobs_.size()) {}
  ~JobSource() override {
    bool any = false;
    for (auto& job : jobs_) {
      job->set_listener(nullptr);
      if (!job->finished()) {
        job->cancel();
        any = true;
      }
    }
    if (any) sched_.notify();
  }
  void start(std::function<void()> wake) override {
    for (auto& job : jobs_) job->set_listener(wake);
  }

 protected:
  // Takes every job's news into choices_; true when all have finished. A
  // job's first text is preceded by its echoed prompt.
  bool collect(std::vector<Job::Update>& news) {
    bool all = true;
    news.resize(jobs_.size());
    for (size_t i = 0; i < jobs_.size(); ++i) {
      Job::Update& u = news[i];
      if (choices_[i].last.finished) {
        u = Job::Update{};
        u.finished = true;
        continue;
      }
      u = jobs_[i]->take(std::chrono::milliseconds(0));
      if (u.finished) choices_[i].last = u;
      all = all && u.finished;
    }
    return all;
  }
  // The first job that did not complete, or null.
  const Job::Update* failure() const {
    for (const auto& c : choices_)
      if (!completed(c.last)) return &c.last;
    return nullptr;
  }
  Usage usage() const {
    Usage total;
    for (const auto& c : choices_) {
      total.prompt_tokens += c.last.usage.prompt_tokens;
      total.completion_tokens += c.last.usage.completion_tokens;
      total.cached_tokens += c.last.usage.cached_tokens;
    }
    return total;
  }
  // The logprobs object of entries of choice i (null when not asked).
  json logprobs_json(size_t i, const std::vector<TokenLogprob>& entries, bool leading) {
    const GenRequest& req = jobs_[i]->request;
    if (req.logprobs < 0) return nullptr;
    if (rid_.endpoint == Endpoint::ChatCompletions) return chat_logprobs(model_.tokenizer(), entries);
    return completion_logprobs(model_.tokenizer(), entries, choices_[i].offset,
                               leading && req.echo ? req.echo_offset_skip : 0);
  }

  std::vector<std::shared_ptr<Job>> jobs_;
  ResponseId rid_;
  Scheduler& sched_;
  const Model& model_;
  std::shared_ptr<void> open_;
  std::vector<ChoiceState> choices_;
};

// A non-streamed answer. Short generations are answered whole, with their
// real status. A longer one switches to a chunked body so that the
// connection can be probed with leading whitespace (valid before a JSON
// value): a client that has gone away makes the write fail, and its request
// is cancelled.
class WholeSource : public JobSource {
 public:
  using JobSource::JobSource;
  bool head(HttpResponse& head, bool& chunked, bool idle) override {
    if (gather()) {
      const Job::Update* f = failure();
      head = f ? error_response(job_error(*f)) : json_response(200, whole());
      chunked = false;
      return true;
    }
    if (!idle) return false;
    head.status = 200;
    chunked = true;
    return true;
  }
  bool body(std::string& out, bool idle) override {
    if (gather()) {
      const Job::Update* f = failure();
      out += dump_json(f ? error_body(job_error(*f)) : whole());
      return true;
    }
    if (idle) out += " ";
    return false;
  }

 private:
  bool gather() {
    std::vector<Job::Update> news;
    const bool all = collect(news);
    for (size_t i = 0; i < news.size(); ++i) {
      choices_[i].text += news[i].text;
      for (auto& e : news[i].logprobs) choices_[i].logprobs.push_back(std::move(e));
    }
    return all;
  }
  json whole() {
    std::vector<Choice> out;
    for (size_t i = 0; i < jobs_.size(); ++i) {
      const GenRequest& req = jobs_[i]->request;
      Choice c;
      c.index = req.index;
      c.finish = choices_[i].last.finish;
      c.logprobs = logprobs_json(i, choices_[i].logprobs, true);
      if (rid_.endpoint == Endpoint::ChatCompletions)
        c.message = chat_message(model_.chat_format(), choices_[i].text);
      else
        c.text = (req.echo ? req.echo_text : std::string()) + choices_[i].text;
      out.push_back(std::move(c));
    }
    return completion_body(rid_, out, usage());
  }
};

// A streamed answer: server-sent events as the text comes, each choice's
// chunks with its index.
class StreamSource : public JobSource {
 public:
  using JobSource::JobSource;
  bool head(HttpResponse& head, bool& chunked, bool) override {
    head.status = 200;
    head.content_type = "text/event-stream";
    head.headers = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
    chunked = true;
    return true;
  }
  bool body(std::string& out, bool idle) override {
    const bool usage_wanted = jobs_[0]->request.include_usage;
    const bool chat = rid_.endpoint == Endpoint::ChatCompletions;
    std::vector<Job::Update> news;
    const bool all = collect(news);
    for (size_t i = 0; i < jobs_.size(); ++i) {
      ChoiceState& c = choices_[i];
      const GenRequest& req = jobs_[i]->request;
      Job::Update& u = news[i];
      if (c.done) continue;
      // Chat streams open with the assistant role, before any text.
      if (!c.started && chat) {
        out += sse_event(stream_chunk(rid_, "", std::nullopt, true, usage_wanted, req.index));
        c.started = true;
      }
      std::string text = u.text;
      if (!chat && !c.started && req.echo) text = req.echo_text + text;  // the echoed prompt comes first
      if (!text.empty() || !u.logprobs.empty()) {
        json lp = u.logprobs.empty() ? json(nullptr) : logprobs_json(i, u.logprobs, !c.entries_sent);
        c.entries_sent = c.entries_sent || !u.logprobs.empty();
        out += sse_event(stream_chunk(rid_, text, std::nullopt, false, usage_wanted, req.index, lp));
        c.started = true;
      }
      if (u.finished && completed(u)) {
        out += sse_event(stream_chunk(rid_, "", u.finish, false, usage_wanted, req.index));
        c.done = true;
      }
    }
    if (all) {
      if (const Job::Update* f = failure()) {
        out += sse_event(error_body(job_error(*f)));
        return true;
      }
      if (usage_wanted) out += sse_event(usage_chunk(rid_, usage()));
      out += kSseDone;
      return true;
    }
    // An SSE comment: clients ignore it, a closed socket refuses it.
    if (out.empty() && idle) out = ": keep-alive\n\n";
    return false;
  }
};

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
  // The routes: a path (or a path prefix ending in '/') and a method each.
  struct Route {
    std::string method;
    std::string path;
    bool prefix = false;
    std::function<HttpReply(HttpRequest&, const std::string& rest)> fn;
  };
  std::vector<Route> routes;
};

HttpServer::HttpServer(const Model& model, ThreadPool& pool, ServerOptions opts)
    : model_(model), opts_(std::move(opts)), impl_(std::make_unique<Impl>()) {
  model_id_ = opts_.model_id.empty() ? default_model_id(model_.name()) : opts_.model_id;
  if (opts_.max_tokens < 1) fail("--max-tokens must be at least 1, got {}", opts_.max_tokens);
  if (opts_.io_threads < 1 || opts_.io_threads > 256) fail("--http-threads must be in 1..256, got {}", opts_.io_threads);
  if (opts_.max_connections < 1) fail("--max-connections must be at least 1, got {}", opts_.max_connections);
  SchedulerOptions so;
  so.max_rows = opts_.batch;
  so.step_tokens = opts_.step_tokens;
  so.n_ctx = opts_.n_ctx;
  so.queue_limit = opts_.queue;
  so.executor = opts_.executor;
  so.prefix_cache = opts_.prefix_cache;
  so.spec = opts_.spec;
  so.draft = opts_.draft;
  scheduler_ = std::make_unique<Scheduler>(model_, pool, so);
  HttpLimits hl;
  hl.io_threads = opts_.io_threads;
  hl.max_connections = opts_.max_connections;
  hl.header_timeout = std::chrono::milliseconds(std::max(1, opts_.header_timeout_ms));
  hl.body_timeout = std::chrono::milliseconds(std::max(1, opts_.body_timeout_ms));
  hl.idle_timeout = std::chrono::milliseconds(std::max(1, opts_.idle_timeout_ms));
  hl.write_timeout = std::chrono::milliseconds(std::max(1, opts_.write_timeout_ms));
  hl.max_body = opts_.max_body;
  // Clients such as the openai package keep a pool of connections; let them
  // reuse one for many requests.
  hl.max_requests_per_connection = 1000;
  HttpHandlers h;
  h.early = [this](const HttpRequest& req) { return early(req); };
  h.handle = [this](HttpRequest& req) { return handle(req); };
  h.on_status = [this](int status) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    ++impl_->responses_by_status[status];
  };
  http_ = std::make_unique<HttpListener>(hl, std::move(h));
  setup_routes();
}

HttpServer::~HttpServer() { shutdown(std::chrono::milliseconds(0)); }

int HttpServer::start() {
  if (port_ >= 0) fail("the server is already started (port {})", port_);
  port_ = http_->bind(opts_.host, opts_.port);
  http_->start();
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
  // write or two (a client that stopped reading is given up on).
  const auto written_by = Clock::now() + std::chrono::seconds(10);
  while (open_responses_ > 0 && Clock::now() < written_by) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // Then the listener and every connection close, idle and slow ones too.
  http_->stop();
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
  metric("megakern_http_connections_open", "gauge", "HTTP connections open now.",
         line("megakern_http_connections_open", http_->open_connections()));
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
  metric("megakern_step_tokens", "gauge", "Most rows per engine step, decode and prompt rows (--step-tokens).",
         line("megakern_step_tokens", scheduler_->options().step_tokens));
  metric("megakern_step_seconds", "summary",
         "Time in engine steps (one step advances every decoding sequence and computes chunks of pending prompts).",
         line("megakern_step_seconds_sum", s.step_seconds) + line("megakern_step_seconds_count", s.steps));
  metric("megakern_step_rows_total", "counter", "Rows computed over all engine steps, decode and prompt rows.",
         line("megakern_step_rows_total", s.step_rows));
  metric("megakern_step_prompt_rows_total", "counter", "Prompt rows computed over all engine steps.",
         line("megakern_step_prompt_rows_total", s.prompt_rows));
  metric("megakern_mixed_steps_total", "counter", "Engine steps with both decode rows and prompt rows.",
         line("megakern_mixed_steps_total", s.mixed_steps));
  metric("megakern_step_headless_rows_total", "counter",
         "Prompt rows computed without the output head (no logits needed: not a prompt's last row, not scored).",
         line("megakern_step_headless_rows_total", s.headless_rows));
  metric("megakern_prefill_seconds", "summary",
         "Prompt rows' share of step time (a step's time split by rows); count: prompts completed.",
         line("megakern_prefill_seconds_sum", s.prefill_seconds) + line("megakern_prefill_seconds_count", s.prefills));
  metric("megakern_prefix_cache_hits_total", "counter", "Requests that started on a prompt prefix a row already held.",
         line("megakern_prefix_cache_hits_total", s.prefix_hits));
  metric("megakern_prefix_cache_tokens_total", "counter", "Prompt tokens taken from a held prefix, not recomputed.",
         line("megakern_prefix_cache_tokens_total", s.prefix_tokens));
  metric("megakern_prefix_cache_lookup_tokens_total", "counter",
         "Prompt tokens of every request started (hit rate: cache tokens over these).",
         line("megakern_prefix_cache_lookup_tokens_total", s.prefix_lookup_tokens));
  metric("megakern_spec_draft_tokens_total", "counter",
         "Speculative decoding (--spec): draft tokens verified, as draft rows of engine steps.",
         line("megakern_spec_draft_tokens_total", s.draft_tokens));
  metric("megakern_spec_accepted_tokens_total", "counter",
         "Speculative decoding: verified draft tokens accepted (acceptance rate: these over the draft tokens).",
         line("megakern_spec_accepted_tokens_total", s.accepted_tokens));
  return out;
}

std::optional<HttpResponse> HttpServer::early(const HttpRequest& req) {
  // Beyond the connection cap only /health is served (a monitor must see
  // the server alive when clients have taken every connection); the rest
  // are told to come back, before their bodies are read.
  if (req.overflow && req.path != "/health")
    return json_response(503, error_body("the server has too many open connections, retry later", "server_error", "",
                                         "too_many_connections"));
  if (opts_.api_key.empty() || req.path == "/health") return std::nullopt;
  if (req.header_count("Authorization") == 1 && req.header("Authorization") == "Bearer " + opts_.api_key)
    return std::nullopt;
  return json_response(401, error_body("invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                                       "invalid_request_error", "", "invalid_api_key"));
}

HttpReply HttpServer::handle(HttpRequest& req) {
  std::string allow;
  for (const auto& r : impl_->routes) {
    const bool match = r.prefix ? req.path.size() > r.path.size() && req.path.compare(0, r.path.size(), r.path) == 0
                                : req.path == r.path;
    if (!match) continue;
    if (r.method == req.method) return r.fn(req, r.prefix ? req.path.substr(r.path.size()) : std::string());
    if (allow.find(r.method) == std::string::npos) allow += (allow.empty() ? "" : ", ") + r.method;
  }
  HttpReply reply;
  if (allow.empty()) {
    reply.response = json_response(
        404, error_body(fmt::format("no such endpoint: {} {}", printable(req.method, 32), printable(req.path)),
                        "invalid_request_error"));
    return reply;
  }
  allow += ", OPTIONS";
  if (req.method == "OPTIONS") {
    reply.response.status = 204;
    reply.response.content_type.clear();
  } else {
    reply.response = json_response(
        405, error_body(fmt::format("the method {} is not allowed on {} (allowed: {})", printable(req.method, 32),
                                    printable(req.path), allow),
                        "invalid_request_error", "", "method_not_allowed"));
  }
  reply.response.headers.emplace_back("Allow", allow);
  return reply;
}

void HttpServer::setup_routes() {
  auto& routes = impl_->routes;
  auto add = [&](const char* method, std::string path, auto fn) {
    const bool prefix = !path.empty() && path.back() == '/';
    routes.push_back({method, std::move(path), prefix,
                      [fn](HttpRequest& req, const std::string& rest) { return guarded([&] { return fn(req, rest); }); }});
  };
  auto whole = [](HttpResponse r) { return HttpReply{std::move(r), nullptr}; };

  add("GET", "/health", [this, whole](HttpRequest&, const std::string&) {
    return whole(stopping_ ? json_response(503, {{"status", "stopping"}}) : json_response(200, {{"status", "ok"}}));
  });
  add("GET", "/version", [this, whole](HttpRequest&, const std::string&) {
    return whole(json_response(200, {{"version", kServerVersion},
                                     {"engine", "megakern"},
                                     {"model", model_id_},
                                     {"description", model_.description()},
                                     {"executor", opts_.executor},
                                     {"numerics", numerics_name(model_.numerics())},
                                     {"batch", opts_.batch},
                                     {"step_tokens", scheduler_->options().step_tokens},
                                     {"prefix_cache", scheduler_->options().prefix_cache},
                                     {"spec", opts_.spec},
                                     {"context", opts_.n_ctx},
                                     {"max_tokens", opts_.max_tokens}}));
  });
  add("GET", "/metrics", [this, whole](HttpRequest&, const std::string&) {
    HttpResponse r;
    r.body = metrics_text();
    r.content_type = "text/plain; version=0.0.4";
    return whole(std::move(r));
  });
  auto model_object = [this] {
    return json{{"id", model_id_}, {"object", "model"}, {"created", impl_->started}, {"owned_by", "megakern"}};
  };
  add("GET", "/v1/models", [model_object, whole](HttpRequest&, const std::string&) {
    return whole(json_response(200, {{"object", "list"}, {"data", json::array({model_object()})}}));
  });
  add("GET", "/v1/models/", [this, model_object, whole](HttpRequest&, const std::string& id) {
    if (id == model_id_) return whole(json_response(200, model_object()));
    return whole(error_response(ApiError(404, fmt::format("the model '{}' does not exist", printable(id)),
                                         "invalid_request_error", "model", "model_not_found")));
  });

  add("POST", "/tokenize", [this, whole](HttpRequest& req, const std::string&) {
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
    return whole(json_response(200, {{"tokens", ids}}));
  });
  add("POST", "/detokenize", [this, whole](HttpRequest& req, const std::string&) {
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
      if (id < 0 || id >= n_vocab) bad_param("tokens", "token id {} is outside the vocabulary of {}", t.dump(), n_vocab);
      ids.push_back(static_cast<int32_t>(id));
    }
    return whole(json_response(200, {{"content", model_.tokenizer().decode(ids, /*skip_special=*/false)}}));
  });

  for (const auto& [path, ep] : std::vector<std::pair<std::string, Endpoint>>{
           {"/v1/completions", Endpoint::Completions},
           {"/v1/chat/completions", Endpoint::ChatCompletions},
           // Without the /v1 prefix too, as other servers accept them.
           {"/completions", Endpoint::Completions},
           {"/chat/completions", Endpoint::ChatCompletions}}) {
    add("POST", path, [this, ep = ep](HttpRequest& req, const std::string&) { return generate(ep, req); });
  }
}

HttpReply HttpServer::generate(Endpoint ep, const HttpRequest& req) {
  const json body = parse_json_object(req.body);
  ApiLimits limits;
  limits.model_names = {model_id_};
  if (model_.name() != model_id_) limits.model_names.push_back(model_.name());
  limits.n_ctx = opts_.n_ctx;
  limits.max_tokens = opts_.max_tokens;
  std::vector<GenRequest> reqs;
  if (ep == Endpoint::Completions)
    reqs = parse_completion_requests(body, model_, limits);
  else
    reqs.push_back(parse_chat_request(body, model_, limits));
  const bool stream = reqs.front().stream;
  // More prompts than rows and queue places together could never be taken.
  if (const size_t room = static_cast<size_t>(opts_.batch) + static_cast<size_t>(std::max(0, opts_.queue));
      reqs.size() > room)
    bad_param("prompt", "'prompt' holds {} prompts, more than this server takes at once ({}: --batch {} + --queue {})",
              reqs.size(), room, opts_.batch, opts_.queue);
  std::vector<std::shared_ptr<Job>> jobs;
  for (auto& g : reqs) {
    auto job = scheduler_->submit(std::move(g));
    if (!job) {
      // All of a request's prompts or none.
      for (auto& j : jobs) j->cancel();
      if (!jobs.empty()) scheduler_->notify();
      throw ApiError(503,
                     stopping_ ? "the server is shutting down"
                               : "the server is busy: the request queue is full, retry later",
                     "server_error", "", stopping_ ? "shutting_down" : "queue_full");
    }
    jobs.push_back(std::move(job));
  }
  ResponseId rid;
  rid.endpoint = ep;
  rid.id = fmt::format("{}-{:08x}{:06x}", ep == Endpoint::Completions ? "cmpl" : "chatcmpl", impl_->nonce,
                       impl_->next_id.fetch_add(1));
  rid.created = unix_now();
  rid.model = model_id_;
  ++open_responses_;
  std::shared_ptr<void> open(nullptr, [this](void*) { --open_responses_; });
  HttpReply reply;
  if (stream)
    reply.source = std::make_shared<StreamSource>(std::move(jobs), rid, *scheduler_, model_, std::move(open));
  else
    reply.source = std::make_shared<WholeSource>(std::move(jobs), rid, *scheduler_, model_, std::move(open));
  return reply;
}

}  // namespace megakern::server
