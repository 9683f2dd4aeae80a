// The HTTP/1.1 connection layer of the server, on Boost.Beast's parser and
// Asio's event loop: a few I/O threads serve every connection (no thread per
// connection), so idle keep-alive clients cost a socket and a buffer only.
//
// Framing follows RFC 9112 strictly: a request with both Content-Length and
// Transfer-Encoding, differing Content-Lengths, a Transfer-Encoding other
// than chunked, a malformed chunk size or header line, a repeated Host,
// Authorization or Content-Type, or an HTTP/1.1 request without Host is
// refused with 400 and the connection closed; headers beyond
// max_header_bytes or max_header_fields get 431. Deadlines run from the first
// byte of a request to the end of its headers (header_timeout) and from there
// to the end of its body (body_timeout); a keep-alive connection waits
// idle_timeout for its next request; a write that the client does not take
// within write_timeout ends the connection. The body limit holds for the
// decoded body, whatever the transfer encoding. Pipelined requests are read
// one after the other and answered in order.
//
// This header does not include Boost: the server's routes see only the plain
// types below.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megakern::server {

struct HttpLimits {
  int io_threads = 2;
  // Connections held at once. A connection beyond them first makes an idle
  // keep-alive connection close; when none is idle it is still served, but
  // marked overflow (the routes answer only /health on it).
  int max_connections = 4096;
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds body_timeout{30000};
  std::chrono::milliseconds idle_timeout{5000};
  std::chrono::milliseconds write_timeout{5000};
  size_t max_body = 16u << 20;          // decoded body bytes: 413 beyond
  size_t max_header_bytes = 16u << 10;  // request line and headers: 431 beyond
  size_t max_header_fields = 100;       // header lines: 431 beyond
  size_t max_requests_per_connection = 1000;
  int listen_backlog = 1024;            // the kernel caps it at net.core.somaxconn
};

struct HttpRequest {
  std::string method;
  std::string target;  // as sent
  std::string path;    // target without its query
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;    // decoded; empty when given to the early handler
  bool overflow = false;  // its connection came beyond max_connections
  // The first value of a header (name compared case-insensitively), or "".
  std::string header(std::string_view name) const;
  size_t header_count(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;  // close the connection once written
};

// A response produced over time (a generation). Its methods run on the
// connection's event loop and must not block.
class ResponseSource {
 public:
  virtual ~ResponseSource() = default;
  // Gives the source the function to call, from any thread, when it has
  // something new.
  virtual void start(std::function<void()> wake) = 0;
  // Before the head is sent: true when `head` is filled. With `chunked`
  // false, head.body is the whole body and the response ends there; with it
  // true, body() gives the rest. `idle`: nothing was written for the probe
  // interval (see HttpListener::kProbeInterval).
  virtual bool head(HttpResponse& head, bool& chunked, bool idle) = 0;
  // After a chunked head: appends what is ready to `out`; true when the body
  // is complete. With `idle` set, the source should write something (a
  // client that has gone away makes the write fail).
  virtual bool body(std::string& out, bool idle) = 0;
};

struct HttpReply {
  HttpResponse response;                   // used when source is null
  std::shared_ptr<ResponseSource> source;
};

// The routes: `early` sees each request once its headers are complete (body
// empty) and may answer at once, unread body and all (the connection then
// closes); `handle` sees the whole request.
struct HttpHandlers {
  std::function<std::optional<HttpResponse>(const HttpRequest&)> early;
  std::function<HttpReply(HttpRequest&)> handle;
  std::function<void(int status)> on_status;  // every response head written
};

class HttpListener {
 public:
  static constexpr std::chrono::milliseconds kProbeInterval{1000};

  HttpListener(HttpLimits limits, HttpHandlers handlers);
  ~HttpListener();
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  // Binds and listens (backlog limits().listen_backlog) without accepting
  // yet; port 0 takes any free port. Returns the port; throws
  // megakern::Error naming the reason when it cannot.
  int bind(const std::string& host, int port);
  // Starts the I/O threads, which accept and serve.
  void start();
  // Closes the listener and every connection, and joins the threads.
  // Idempotent.
  void stop();

  const HttpLimits& limits() const;
  int open_connections() const;
  uint64_t overflow_count() const;

  struct Impl;  // defined in http_io.cpp only

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace megakern::server
