// Connection handling for the HTTP server, around cpp-httplib 0.11.
//
// cpp-httplib 0.11 (Debian bookworm) parses requests and routes them well,
// but its connection handling gives none of the guarantees a server open to
// careless or hostile clients needs:
//   - its default listening socket options set SO_REUSEPORT, so a second
//     server binds the same port and the kernel splits connections between
//     the two;
//   - its payload limit is checked against Content-Length only: a chunked
//     body is read whole, however large;
//   - its read timeout applies to each read, so a client that sends a byte
//     every few seconds holds a thread for ever, and its thread pool queues
//     connections without limit, so a few dozen such clients starve /health
//     and every other request;
//   - its socket stream is rebuilt for each request of a keep-alive
//     connection, dropping whatever pipelined bytes it had already read.
// Its request parser, router and response writer are reachable through the
// protected Server::process_request(Stream&, ...), and the per-connection
// loop through the virtual process_and_close_socket(). GuardedServer
// replaces that loop and the stream under it (deadlines, byte limits, a
// buffer that lives as long as the connection) and the task queue (a
// connection cap with a separate overflow path), keeping the rest.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstddef>

namespace megakern::server {

struct ConnectionLimits {
  int max_connections = 64;  // connections served at once (one thread each)
  // Connections beyond max_connections are answered by these threads, one
  // request each: /health normally, everything else 503. When even their
  // queue is full, a canned 503 is written without reading the request.
  int overflow_threads = 16;
  int overflow_queue = 256;
  std::chrono::milliseconds header_timeout{10000};    // first byte of a request to the end of its headers
  std::chrono::milliseconds body_timeout{30000};      // end of the headers to the end of the body
  std::chrono::milliseconds idle_timeout{5000};       // keep-alive wait for the next request
  std::chrono::milliseconds write_timeout{5000};      // longest a write may wait for the client to read
  std::chrono::milliseconds overflow_timeout{500};    // a whole request on the overflow path
  size_t max_body = 16u << 20;                        // decoded request body bytes, any transfer encoding
  size_t max_requests_per_connection = 1000;
  // Pending connections the kernel queues before accept (listen's backlog):
  // a burst of clients connecting at once must not overflow it while the
  // accepting thread waits for a core. The HTTP library listens with 5.
  int listen_backlog = 1024;
};

class GuardedServer : public httplib::Server {
 public:
  explicit GuardedServer(ConnectionLimits limits);
  ~GuardedServer() override;

  const ConnectionLimits& limits() const { return limits_; }

  // About the request being handled on the calling thread (handlers run on
  // their connection's thread):
  // whether it came in beyond the connection cap;
  static bool overflow_request();
  // whether its body was cut at max_body (the reply must be 413);
  static bool body_too_large();
  // make its connection close once the response is written.
  static void close_after_response();

  // Makes every connection's waits and reads end at once: used on shutdown,
  // after in-flight responses were given their time, so that slow or idle
  // clients cannot hold the serving threads.
  void abort_connections();
  bool aborting() const { return aborting_.load(); }

  // Connections on the regular path now (not counting overflow).
  int open_connections() const { return active_.load(); }

  // Number of connections refused on the overflow path (for /metrics).
  uint64_t overflow_count() const { return overflowed_.load(); }

  // After bind_to_port / bind_to_any_port: gives the listening socket
  // limits().listen_backlog (the kernel caps it at net.core.somaxconn).
  // False when no socket is bound or listen() fails.
  bool apply_listen_backlog();

 private:
  class Queue;
  class Stream;
  bool process_and_close_socket(socket_t sock) override;
  void serve_connection(socket_t sock, bool overflow);
  // Waits for the next request of a keep-alive connection; false when the
  // client sent none in time, or the connection was chosen to make room.
  bool wait_next_request(Stream& strm, socket_t sock);

  ConnectionLimits limits_;
  socket_t listen_sock_ = INVALID_SOCKET;  // the socket being bound (socket options callback)
  std::atomic<bool> aborting_{false};
  std::atomic<int> active_{0};
  std::atomic<uint64_t> overflowed_{0};
  // Keep-alive connections waiting for a next request, and how many of them
  // have been asked to close so that new connections get their threads: at
  // the cap, an idle connection gives way before a new one is refused.
  std::atomic<int> idle_{0};
  std::atomic<int> evict_{0};
};

}  // namespace megakern::server
