// The OpenAI-compatible HTTP server: routes on cpp-httplib, generation
// through the continuous-batching Scheduler.
//
// Endpoints: GET /health, /version, /metrics (Prometheus text), /v1/models,
// /v1/models/{id}; POST /tokenize, /detokenize, /v1/completions,
// /v1/chat/completions (streamed as server-sent events with "stream": true).
// Every error is a JSON body {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "server/scheduler.h"

namespace httplib {
class Server;
struct Response;
}

namespace megakern::server {

class GuardedServer;

extern const char* const kServerVersion;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;          // 0: any free port (see HttpServer::port())
  std::string api_key;      // when set, every endpoint but /health wants "Authorization: Bearer <key>"
  int n_ctx = 2048;         // positions per sequence
  int max_tokens = 256;     // default and upper limit of a request's max_tokens
  int batch = 8;            // sequences decoded together
  int queue = 64;           // requests that may wait for a row before 503
  std::string executor = "mega";
  int http_threads = 0;     // 0: batch + queue + 8, so that even a full queue leaves threads to answer 503
  std::string model_id;     // the name reported and accepted in "model" (empty: the model's name)
  // Connection handling (see http_guard.h). Connections beyond http_threads
  // get 503 at once (except /health); a client must send a request's
  // headers within header_timeout_ms of its first byte, and its body within
  // body_timeout_ms; an idle keep-alive connection is closed after
  // idle_timeout_ms. Bodies over max_body bytes get 413, whatever their
  // transfer encoding.
  int header_timeout_ms = 10000;
  int body_timeout_ms = 30000;
  int idle_timeout_ms = 5000;
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
  // Answer a queued generation: as one JSON body, or as server-sent events.
  // `open` is held by the response until it is written (see open_responses_).
  void respond_whole(const std::shared_ptr<Job>& job, const ResponseId& rid, httplib::Response& res,
                     std::shared_ptr<void> open);
  void respond_stream(const std::shared_ptr<Job>& job, const ResponseId& rid, httplib::Response& res,
                      std::shared_ptr<void> open);

  const Model& model_;
  ServerOptions opts_;
  std::string model_id_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<GuardedServer> http_;
  std::unique_ptr<Impl> impl_;
  std::thread listener_;
  int port_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<bool> listener_done_{false};
  // Generation responses not yet completely written; shutdown() waits for
  // them so that no stream loses its last events when the listener stops.
  std::atomic<int> open_responses_{0};
};

// The name a model is served under: the file name without ".gguf" for a
// path ("models/smollm2-135m.gguf" -> "smollm2-135m"), else the name itself.
std::string default_model_id(const std::string& name_or_path);

}  // namespace megakern::server
