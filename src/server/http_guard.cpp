#include "server/http_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace megakern::server {

namespace {

using Clock = std::chrono::steady_clock;

// How a connection handed to the task queue is to be served.
enum class Mode { Regular, Overflow, Reject };
thread_local Mode t_mode = Mode::Regular;

// What the handlers of the request being processed on this thread learned
// or asked for.
struct RequestState {
  bool too_large = false;
  bool close = false;
};
thread_local RequestState* t_request = nullptr;

// Waits on a socket are cut into slices this long, so that shutdown
// (abort_connections) is noticed promptly without any descriptor juggling.
constexpr auto kSlice = std::chrono::milliseconds(50);

// Waits for `events` on `sock` until `deadline`, or until `abort` is set.
bool wait_socket(int sock, short events, Clock::time_point deadline, const std::atomic<bool>& abort) {
  for (;;) {
    if (abort.load()) return false;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    pollfd p{sock, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min(left, std::chrono::milliseconds(kSlice)).count()) + 1);
    if (r > 0) return true;  // readable, writable, or an error/hang-up that the next call reports
    if (r < 0 && errno != EINTR) return false;
  }
}

// The listening socket: SO_REUSEADDR only (a restarted server may bind while
// old connections sit in TIME_WAIT), never SO_REUSEPORT, which would let a
// second server bind the same port and take half of the connections.
void listening_socket_options(socket_t sock) {
  int yes = 1;
  ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
}

std::string address_string(const sockaddr_storage& a, int& port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf);
    port = ntohs(v6->sin6_port);
  }
  return buf;
}

// Reads and discards what the client still sends, for a bounded time, after
// our side has shut down writing: closing a socket with unread input makes
// the kernel reset the connection, which can destroy the response the client
// has not read yet.
void drain_input(int sock, std::chrono::milliseconds for_at_most, const std::atomic<bool>& abort) {
  const auto deadline = Clock::now() + for_at_most;
  size_t total = 0;
  char buf[16384];
  while (total < (8u << 20) && wait_socket(sock, POLLIN, deadline, abort)) {
    const ssize_t r = ::recv(sock, buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0) return;
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return;
    }
    total += static_cast<size_t>(r);
  }
}

}  // namespace

// The task queue: one thread per connection up to the cap, then a few
// overflow threads, then refusal on the accepting thread itself.
class GuardedServer::Queue : public httplib::TaskQueue {
 public:
  explicit Queue(GuardedServer& srv) : srv_(srv) {
    const auto& l = srv_.limits_;
    for (int i = 0; i < std::max(1, l.max_connections); ++i)
      threads_.emplace_back([this] { work(regular_, Mode::Regular); });
    for (int i = 0; i < std::max(1, l.overflow_threads); ++i)
      threads_.emplace_back([this] { work(overflow_, Mode::Overflow); });
  }
  ~Queue() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (srv_.active_.load() < std::max(1, srv_.limits_.max_connections)) {
      ++srv_.active_;
      regular_.push_back(std::move(fn));
      cv_.notify_all();
      return;
    }
    if (srv_.idle_.load() > srv_.evict_.load()) {
      // An idle keep-alive connection closes within a wait slice and its
      // thread takes this one.
      ++srv_.evict_;
      ++srv_.active_;
      regular_.push_back(std::move(fn));
      cv_.notify_all();
      return;
    }
    ++srv_.overflowed_;
    if (static_cast<int>(overflow_.size()) < srv_.limits_.overflow_queue) {
      overflow_.push_back(std::move(fn));
      cv_.notify_all();
      return;
    }
    lock.unlock();
    // Even the overflow path is saturated: answer without reading, here on
    // the accepting thread (a non-blocking write and a close).
    t_mode = Mode::Reject;
    fn();
    t_mode = Mode::Regular;
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void work(std::deque<std::function<void()>>& jobs, Mode mode) {
    t_mode = mode;
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !jobs.empty(); });
        if (jobs.empty()) return;  // stopping, nothing left
        fn = std::move(jobs.front());
        jobs.pop_front();
      }
      fn();
      if (mode == Mode::Regular) --srv_.active_;
    }
  }

  GuardedServer& srv_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> regular_, overflow_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

// A connection's byte stream. Unlike httplib's, it lives as long as the
// connection, so bytes of a pipelined request read together with the one
// before it are kept for the next process_request; and each read honours the
// request's deadline and byte limits rather than a per-read timeout only.
class GuardedServer::Stream : public httplib::Stream {
 public:
  Stream(socket_t sock, const GuardedServer& srv) : sock_(sock), srv_(srv) {}

  // Waits up to `timeout` for the first byte of a next request.
  bool wait_request(std::chrono::milliseconds timeout) {
    if (pos_ < end_) return true;
    return wait_socket(sock_, POLLIN, Clock::now() + timeout, srv_.aborting_);
  }
  bool buffered() const { return pos_ < end_; }
  // A request begins: its line and headers must arrive by `deadline`.
  void begin_request(Clock::time_point deadline) {
    deadline_ = deadline;
    delivered_ = 0;
    byte_limit_ = kHeaderBytes;
    req_ = nullptr;
  }
  // Its headers are in: the body, if any, must arrive by `deadline`, and
  // reads fail once `req.body` has grown past max_body.
  void begin_body(const httplib::Request& req, Clock::time_point deadline) {
    deadline_ = deadline;
    delivered_ = 0;
    req_ = &req;
    // Chunk framing may add a few bytes per chunk; a body whose framing
    // outweighs its content several times over is not a reasonable one.
    byte_limit_ = 8 * srv_.limits_.max_body + kHeaderBytes;
  }
  // No more reads for this request (a refused body is not read at all).
  void refuse() { refused_ = true; }
  bool failed() const { return failed_; }

  bool is_readable() const override {
    return pos_ < end_ || wait_socket(sock_, POLLIN, deadline_, srv_.aborting_);
  }
  bool is_writable() const override {
    return wait_socket(sock_, POLLOUT, Clock::now() + srv_.limits_.write_timeout, srv_.aborting_);
  }

  ssize_t read(char* ptr, size_t size) override {
    if (pos_ == end_ && !fill()) return -1;
    const size_t n = std::min(size, end_ - pos_);
    std::memcpy(ptr, buf_ + pos_, n);
    pos_ += n;
    delivered_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    size_t done = 0;
    while (done < size) {
      const ssize_t r = ::send(sock_, ptr + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r > 0) {
        done += static_cast<size_t>(r);
      } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        if (!is_writable()) return -1;
      } else {
        return -1;
      }
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    port = 0;
    if (::getpeername(sock_, reinterpret_cast<sockaddr*>(&a), &len) == 0) ip = address_string(a, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    port = 0;
    if (::getsockname(sock_, reinterpret_cast<sockaddr*>(&a), &len) == 0) ip = address_string(a, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  // httplib reads headers with its own line limit but no limit on their
  // number; 64 KiB of request line and headers is plenty for any client.
  static constexpr size_t kHeaderBytes = 64u << 10;

  bool fill() {
    if (refused_) failed_ = true;
    if (failed_) return false;
    if ((req_ && req_->body.size() > srv_.limits_.max_body) || delivered_ > byte_limit_) {
      // A body over the limit (or headers without end): stop reading.
      if (req_ && t_request) t_request->too_large = true;
      failed_ = true;
      return false;
    }
    for (;;) {
      if (!wait_socket(sock_, POLLIN, deadline_, srv_.aborting_)) break;
      const ssize_t r = ::recv(sock_, buf_, sizeof buf_, MSG_DONTWAIT);
      if (r > 0) {
        pos_ = 0;
        end_ = static_cast<size_t>(r);
        return true;
      }
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      break;  // closed by the client, or an error
    }
    failed_ = true;
    return false;
  }

  socket_t sock_;
  const GuardedServer& srv_;
  char buf_[16384];
  size_t pos_ = 0, end_ = 0;
  Clock::time_point deadline_ = Clock::now();
  size_t delivered_ = 0;   // bytes given to httplib in this phase of the request
  size_t byte_limit_ = kHeaderBytes;
  const httplib::Request* req_ = nullptr;
  bool refused_ = false;
  bool failed_ = false;
};

GuardedServer::GuardedServer(ConnectionLimits limits) : limits_(limits) {
  set_socket_options([this](socket_t sock) {
    listening_socket_options(sock);
    listen_sock_ = sock;  // the last one offered is the one bound
  });
  // Content-Length bodies over the limit are refused by httplib itself
  // (413) once setup (below) has made sure it will not read them.
  set_payload_max_length(limits_.max_body);
  set_keep_alive_max_count(limits_.max_requests_per_connection);
  new_task_queue = [this] { return new Queue(*this); };
}

GuardedServer::~GuardedServer() = default;

bool GuardedServer::apply_listen_backlog() {
  if (listen_sock_ == INVALID_SOCKET || !is_valid()) return false;
  // listen() on a listening socket sets its backlog anew.
  return ::listen(listen_sock_, std::max(1, limits_.listen_backlog)) == 0;
}

bool GuardedServer::overflow_request() { return t_mode == Mode::Overflow; }
bool GuardedServer::body_too_large() { return t_request && t_request->too_large; }
void GuardedServer::close_after_response() {
  if (t_request) t_request->close = true;
}

void GuardedServer::abort_connections() { aborting_ = true; }

bool GuardedServer::process_and_close_socket(socket_t sock) {
  if (t_mode == Mode::Reject) {
    static const std::string busy = [] {
      const std::string body =
          R"({"error":{"message":"the server has too many open connections, retry later","type":"server_error",)"
          R"("param":null,"code":"too_many_connections"}})";
      return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
             "Connection: close\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body;
    }();
    ::send(sock, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return true;
  }
  serve_connection(sock, t_mode == Mode::Overflow);
  return true;
}

bool GuardedServer::wait_next_request(Stream& strm, socket_t sock) {
  if (strm.buffered()) return true;
  ++idle_;
  const auto deadline = Clock::now() + limits_.idle_timeout;
  bool ready = false;
  while (!aborting_ && Clock::now() < deadline) {
    int e = evict_.load();
    if (e > 0 && evict_.compare_exchange_strong(e, e - 1)) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{sock, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 0, kSlice.count())) + 1);
    if (r > 0) {
      ready = true;
      break;
    }
  }
  --idle_;
  return ready;
}

void GuardedServer::serve_connection(socket_t sock, bool overflow) {
  Stream strm(sock, *this);
  const auto first_wait = overflow ? limits_.overflow_timeout : limits_.header_timeout;
  size_t served = 0;
  bool drain = false;
  while (!aborting_) {
    if (served == 0 ? !strm.wait_request(first_wait) : !wait_next_request(strm, sock)) break;
    RequestState st;
    t_request = &st;
    const auto start = Clock::now();
    strm.begin_request(start + (overflow ? limits_.overflow_timeout : limits_.header_timeout));
    // An overflow connection gets one request; its body is never read.
    const bool last = overflow || served + 1 >= limits_.max_requests_per_connection || aborting_;
    bool closed = false;
    process_request(strm, last, closed, [&](httplib::Request& req) {
      // A Range header would make httplib cut our JSON bodies into a
      // truncated "200": ranges are ignored, as HTTP allows.
      req.ranges.clear();
      req.headers.erase("Range");
      strm.begin_body(req, overflow ? start + limits_.overflow_timeout : Clock::now() + limits_.body_timeout);
      if (req.has_header("Content-Length")) {
        const std::string v = req.get_header_value("Content-Length");
        char* end = nullptr;
        errno = 0;
        const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
        if (errno != 0 || end == v.c_str() || *end != '\0') {
          strm.refuse();  // httplib answers 400 for a length it cannot read
        } else if (n > limits_.max_body) {
          st.too_large = true;
          strm.refuse();
        }
      }
    });
    t_request = nullptr;
    ++served;
    // A response written over unread request bytes: let them drain so that
    // the client reads the response instead of a reset. (A client that was
    // too slow is not waited for.)
    if (st.too_large || st.close) drain = true;
    if (last || closed || st.close || st.too_large || strm.failed()) break;
  }
  ::shutdown(sock, SHUT_WR);
  if (drain && !aborting_) drain_input(sock, overflow ? limits_.overflow_timeout : std::chrono::milliseconds(1000), aborting_);
  ::close(sock);
}

}  // namespace megakern::server
