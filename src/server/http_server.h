// The OpenAI-compatible HTTP server: routes on the event-driven connection
// layer of http_io.h, generation through the continuous-batching Scheduler.
//
// Endpoints: GET /health, /version, /metrics (Prometheus text), /v1/models,
// /v1/models/{id}; POST /tokenize, /detokenize, /v1/completions,
// /v1/chat/completions (streamed as server-sent events with "stream": true).
// Every error is a JSON body {"error": {"message", "type", "param", "code"}}.
// A known path asked with another method gets 405 with an Allow header
// (OPTIONS gets 204 with it); an unknown path 404.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "server/http_io.h"
#include "server/scheduler.h"

namespace megakern::server {

extern const char* const kServerVersion;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;          // 0: any free port (see HttpServer::port())
  std::string api_key;      // when set, every endpoint but /health wants "Authorization: Bearer <key>"
  int n_ctx = 2048;         // positions per sequence
  int max_tokens = 256;     // default and upper limit of a request's max_tokens
  int batch = 8;            // sequences decoded together
  int step_tokens = 0;      // rows per engine step, decode and prompt rows (0: SchedulerOptions' default)
  int queue = 64;           // requests that may wait for a row before 503
  std::string executor = "mega";
  bool prefix_cache = true;  // reuse a free row's held prompt prefix (SchedulerOptions::prefix_cache)
  std::string spec;          // speculative decoding's drafter (SchedulerOptions::spec); empty: none
  int draft = 6;             // most draft tokens per sequence and step
  std::string model_id;     // the name reported and accepted in "model" (empty: the model's name)
  // Connection handling (see http_io.h). io_threads serve every connection.
  // Beyond max_connections an idle keep-alive connection is closed to make
  // room; when none is idle, requests other than /health get 503 at once.
  // A client must send a request's headers within header_timeout_ms of its
  // first byte, and its body within body_timeout_ms; an idle keep-alive
  // connection is closed after idle_timeout_ms, and one that does not read
  // what is written for write_timeout_ms. Bodies over max_body bytes get
  // 413, whatever their transfer encoding.
  int io_threads = 2;
  int max_connections = 4096;
  int header_timeout_ms = 10000;
  int body_timeout_ms = 30000;
  int idle_timeout_ms = 5000;
  int write_timeout_ms = 5000;
  size_t max_body = 16u << 20;
};

class HttpServer {
 public:
  // Builds the scheduler (engine and sequence states) and the routes; does
  // not bind yet. The model and pool must outlive the server.
  HttpServer(const Model& model, ThreadPool& pool, ServerOptions opts);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds to host:port (throws megakern::Error when that fails) and serves
  // on a background thread. Returns the port bound.
  int start();
  int port() const { return port_; }
  const std::string& model_id() const { return model_id_; }

  // Stops cleanly: new generation requests get 503 at once; in-flight ones
  // may finish for up to `drain`, then are cancelled (streams end with an
  // error event); then the listener closes and the serving threads are
  // joined. Idempotent.
  void shutdown(std::chrono::milliseconds drain);
  // The first half of shutdown(): refuse new generation requests (503) and
  // report "stopping" on /health, while in-flight ones carry on.
  void begin_shutdown();
  // Whether shutdown() has been asked.
  bool stopping() const { return stopping_.load(); }

  Scheduler& scheduler() { return *scheduler_; }

  // Prometheus text of the counters (what GET /metrics returns).
  std::string metrics_text() const;

 private:
  struct Impl;
  void setup_routes();
  std::optional<HttpResponse> early(const HttpRequest& req);
  HttpReply handle(HttpRequest& req);
  HttpReply generate(Endpoint ep, const HttpRequest& req);

  const Model& model_;
  ServerOptions opts_;
  std::string model_id_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<HttpListener> http_;
  int port_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
  // Generation responses not yet completely written; shutdown() waits for
  // them so that no stream loses its last events when the listener stops.
  std::atomic<int> open_responses_{0};
};

// The name a model is served under: the file name without ".gguf" for a
// path ("models/smollm2-135m.gguf" -> "smollm2-135m"), else the name itself.
std::string default_model_id(const std::string& name_or_path);

}  // namespace megakern::server
