#include "server/http_io.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "core/error.h"

namespace megakern::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

std::string reason_phrase(int status) {
  const auto r = bhttp::obsolete_reason(bhttp::int_to_status(static_cast<unsigned>(status)));
  return r.empty() ? std::string("Unknown") : std::string(r);
}

// The head of a response: status line, content type, framing, connection.
std::string serialize_head(const HttpResponse& r, bool chunked, bool keep_alive) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_phrase(r.status) + "\r\n";
  if (!r.content_type.empty()) out += "Content-Type: " + r.content_type + "\r\n";
  for (const auto& [k, v] : r.headers) out += k + ": " + v + "\r\n";
  if (chunked)
    out += "Transfer-Encoding: chunked\r\n";
  else
    out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  out += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return out;
}

void append_chunk(std::string& out, const std::string& data) {
  if (data.empty()) return;
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  out += size;
  out += data;
  out += "\r\n";
}

HttpResponse error_response(int status, const std::string& message, const std::string& code) {
  HttpResponse r;
  r.status = status;
  // A JSON string of the message (it is our own text: no quotes or controls).
  r.body = "{\"error\":{\"message\":\"" + message + "\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":" +
           (code.empty() ? std::string("null") : "\"" + code + "\"") + "}}";
  r.close = true;
  return r;
}

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequal(k, name)) return v;
  return {};
}

size_t HttpRequest::header_count(std::string_view name) const {
  size_t n = 0;
  for (const auto& [k, v] : headers) n += iequal(k, name);
  return n;
}

class Connection;

struct HttpListener::Impl {
  HttpLimits limits;
  HttpHandlers handlers;
  // Declared before the context: connections destroyed with it count down here.
  std::atomic<int> open{0};
  std::atomic<uint64_t> overflowed{0};
  std::atomic<bool> stopping{false};
  std::mutex mu;  // guards conns
  std::unordered_map<Connection*, std::weak_ptr<Connection>> conns;
  asio::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  bool started = false, stopped = false;

  explicit Impl(HttpLimits l, HttpHandlers h) : limits(std::move(l)), handlers(std::move(h)) {}
  void accept();
  // At the connection cap: asks one idle keep-alive connection to close.
  bool evict_idle();
};

// One client connection. Every handler runs on its strand; the socket, the
// parser and the buffer belong to it.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpListener::Impl& srv, tcp::socket sock, bool overflow)
      : srv_(srv),
        sock_(std::move(sock)),
        deadline_(sock_.get_executor()),
        write_timer_(sock_.get_executor()),
        probe_(sock_.get_executor()),
        overflow_(overflow) {
    ++srv_.open;
  }
  ~Connection() { --srv_.open; }

  void start() {
    sock_.set_option(tcp::no_delay(true));
    begin_request();
  }
  // Safe from any thread.
  void close_async() {
    asio::post(sock_.get_executor(), [self = shared_from_this()] { self->close(); });
  }
  bool idle() const { return idle_.load(); }
  tcp::socket::executor_type executor() { return sock_.get_executor(); }

 private:
  struct Waker {
    std::mutex mu;
    std::function<void()> fn;
    void wake() {
      std::lock_guard<std::mutex> lock(mu);
      if (fn) fn();
    }
  };

  void begin_request() {
    if (closed_) return;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(srv_.limits.max_header_bytes));
    parser_->body_limit(srv_.limits.max_body);
    parser_->eager(true);
    first_byte_ = false;
    header_checked_ = false;
    idle_ = true;
    arm_deadline(srv_.limits.idle_timeout);
    parse();
  }

  void arm_deadline(std::chrono::milliseconds t) {
    deadline_.expires_after(t);
    deadline_.async_wait([w = weak_from_this()](beast::error_code ec) {
      if (ec) return;
      if (auto self = w.lock()) self->on_deadline();
    });
  }

  void on_deadline() {
    if (closed_ || !reading_) return;
    if (first_byte_) {
      respond_and_close(error_response(408, "the request was not received in time", "request_timeout"));
      return;
    }
    close();
  }

  // Feeds what is buffered to the parser; reads more when it needs more.
  void parse() {
    reading_ = true;
    for (;;) {
      if (closed_) return;
      if (buf_.size() == 0) return read_more();
      if (!first_byte_) {
        first_byte_ = true;
        idle_ = false;
        arm_deadline(srv_.limits.header_timeout);
      }
      beast::error_code ec;
      const size_t n = parser_->put(buf_.data(), ec);
      buf_.consume(n);
      if (ec == bhttp::error::need_more) {
        if (n > 0) continue;
        return read_more();
      }
      if (ec) return refuse(ec);
      if (parser_->is_header_done() && !header_checked_) {
        header_checked_ = true;
        if (!check_header()) return;
        if (parser_->is_done()) break;
        arm_deadline(srv_.limits.body_timeout);
        if (iequal(std::string(parser_->get()[bhttp::field::expect]), "100-continue")) {
          // The client waits for this before it sends the body.
          write_raw(std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n"), [this] { parse(); });
          return;
        }
      }
      if (parser_->is_done()) break;
    }
    dispatch();
  }

  void read_more() {
    if (buf_.size() > srv_.limits.max_header_bytes + 65536) return refuse(bhttp::error::header_limit);
    sock_.async_read_some(buf_.prepare(16384), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec || self->closed_) return self->close();
      self->buf_.commit(n);
      self->parse();
    });
  }

  void refuse(beast::error_code ec) {
    if (ec == bhttp::error::header_limit)
      return respond_and_close(error_response(431, "the request headers are too large", "headers_too_large"));
    if (ec == bhttp::error::body_limit)
      return respond_and_close(error_response(
          413, "the request body is larger than the limit of " + std::to_string(srv_.limits.max_body) + " bytes",
          "request_too_large"));
    respond_and_close(error_response(400, "malformed HTTP request: " + ec.message(), "bad_request"));
  }

  // The request as the routes see it (the body once complete).
  HttpRequest make_request(bool with_body) {
    auto& msg = parser_->get();
    HttpRequest req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    req.path = req.target.substr(0, req.target.find('?'));
    for (const auto& f : msg) req.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    if (with_body) req.body = std::move(msg.body());
    req.overflow = overflow_;
    return req;
  }

  // Checks beyond the parser's own; false when the request was refused.
  bool check_header() {
    const auto& msg = parser_->get();
    size_t fields = 0;
    for (auto it = msg.begin(); it != msg.end(); ++it) ++fields;
    if (fields > srv_.limits.max_header_fields)
      return respond_and_close(error_response(431, "too many request header lines", "headers_too_large")), false;
    if (msg.count(bhttp::field::transfer_encoding) > 0 && !parser_->chunked())
      return respond_and_close(error_response(400, "unsupported Transfer-Encoding (only chunked is accepted)",
                                              "bad_request")),
             false;
    for (auto f : {bhttp::field::host, bhttp::field::authorization, bhttp::field::content_type})
      if (msg.count(f) > 1)
        return respond_and_close(error_response(400, "repeated header: " + std::string(bhttp::to_string(f)),
                                                "bad_request")),
               false;
    if (msg.version() >= 11 && msg.count(bhttp::field::host) == 0)
      return respond_and_close(error_response(400, "a Host header is required (version 1.1)", "bad_request")),
             false;
    if (srv_.handlers.early) {
      if (auto r = srv_.handlers.early(make_request(false))) {
        r->close = true;
        return respond_and_close(std::move(*r)), false;
      }
    }
    return true;
  }

  void dispatch() {
    reading_ = false;
    deadline_.cancel();
    ++served_;
    keep_alive_ = parser_->get().keep_alive() && served_ < srv_.limits.max_requests_per_connection &&
                  !srv_.stopping.load();
    HttpRequest req = make_request(true);
    HttpReply reply;
    try {
      reply = srv_.handlers.handle(req);
    } catch (const std::exception& e) {
      reply = {};
      reply.response = error_response(500, "internal error", "server_error");
    }
    if (!reply.source) {
      if (reply.response.close) keep_alive_ = false;
      write_response(std::move(reply.response));
      return;
    }
    source_ = std::move(reply.source);
    // Nothing else holds the connection while it waits for the source.
    hold_ = shared_from_this();
    head_sent_ = false;
    waker_ = std::make_shared<Waker>();
    waker_->fn = [w = weak_from_this(), ex = sock_.get_executor()] {
      asio::post(ex, [w] {
        if (auto self = w.lock()) self->pump(false);
      });
    };
    source_->start([wk = waker_] { wk->wake(); });
    last_write_ = std::chrono::steady_clock::now();
    pump(false);
  }

  void respond_and_close(HttpResponse r) {
    reading_ = false;
    deadline_.cancel();
    keep_alive_ = false;
    write_response(std::move(r));
  }

  void write_response(HttpResponse r) {
    if (srv_.handlers.on_status) srv_.handlers.on_status(r.status);
    auto out = std::make_shared<std::string>(serialize_head(r, false, keep_alive_));
    *out += r.body;
    write_raw(std::move(out), [this] { end_response(); });
  }

  // Moves a streamed response on: its head, then its chunks.
  void pump(bool idle) {
    if (closed_ || !source_) return;
    if (writing_) {
      wake_pending_ = true;
      return;
    }
    wake_pending_ = false;
    auto out = std::make_shared<std::string>();
    bool done = false;
    if (!head_sent_) {
      HttpResponse head;
      bool chunked = false;
      if (!source_->head(head, chunked, idle)) return arm_probe();
      head_sent_ = true;
      if (srv_.handlers.on_status) srv_.handlers.on_status(head.status);
      if (!chunked) {
        if (head.close) keep_alive_ = false;
        *out = serialize_head(head, false, keep_alive_) + head.body;
        done = true;
      } else {
        *out = serialize_head(head, true, keep_alive_);
        idle = false;
      }
    }
    if (!done) {
      std::string data;
      done = source_->body(data, idle);
      append_chunk(*out, data);
      if (done) *out += "0\r\n\r\n";
    }
    if (out->empty()) return arm_probe();
    write_raw(std::move(out), [this, done] {
      if (done) return end_response();
      if (wake_pending_) return pump(false);
      arm_probe();
    });
  }

  void arm_probe() {
    probe_.expires_at(last_write_ + HttpListener::kProbeInterval);
    probe_.async_wait([w = weak_from_this()](beast::error_code ec) {
      if (ec) return;
      if (auto self = w.lock()) {
        if (self->writing_ || !self->source_) return;
        if (std::chrono::steady_clock::now() - self->last_write_ >= HttpListener::kProbeInterval)
          self->pump(true);
        else
          self->arm_probe();
      }
    });
  }

  template <typename F>
  void write_raw(std::shared_ptr<std::string> data, F then) {
    writing_ = true;
    write_timer_.expires_after(srv_.limits.write_timeout);
    write_timer_.async_wait([w = weak_from_this()](beast::error_code ec) {
      if (ec) return;
      if (auto self = w.lock()) self->close();  // the client does not read
    });
    asio::async_write(sock_, asio::buffer(*data),
                      [self = shared_from_this(), data, then](beast::error_code ec, size_t) {
                        self->writing_ = false;
                        self->write_timer_.cancel();
                        if (ec || self->closed_) return self->close();
                        self->last_write_ = std::chrono::steady_clock::now();
                        then();
                      });
  }

  void end_response() {
    drop_source();
    if (!keep_alive_) {
      beast::error_code ec;
      sock_.shutdown(tcp::socket::shutdown_send, ec);
      return close();
    }
    begin_request();
  }

  void drop_source() {
    if (waker_) {
      std::lock_guard<std::mutex> lock(waker_->mu);
      waker_->fn = nullptr;
    }
    waker_.reset();
    probe_.cancel();
    source_.reset();  // a source whose body is not complete gives up its work here
    hold_.reset();    // callers hold their own reference
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    idle_ = false;
    drop_source();
    deadline_.cancel();
    write_timer_.cancel();
    beast::error_code ec;
    sock_.close(ec);
    std::lock_guard<std::mutex> lock(srv_.mu);
    srv_.conns.erase(this);
  }

  HttpListener::Impl& srv_;
  tcp::socket sock_;
  asio::steady_timer deadline_, write_timer_, probe_;
  beast::flat_buffer buf_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  const bool overflow_;
  std::atomic<bool> idle_{false};
  bool first_byte_ = false, header_checked_ = false, reading_ = false, writing_ = false, closed_ = false;
  bool keep_alive_ = true, head_sent_ = false, wake_pending_ = false;
  size_t served_ = 0;
  std::shared_ptr<ResponseSource> source_;
  std::shared_ptr<Waker> waker_;
  std::shared_ptr<Connection> hold_;
  std::chrono::steady_clock::time_point last_write_;
};

void HttpListener::Impl::accept() {
  acceptor->async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket sock) {
    if (ec) {
      if (stopping || !acceptor->is_open()) return;
      // Out of descriptors and the like: retry soon rather than spin.
      auto t = std::make_shared<asio::steady_timer>(ioc, std::chrono::milliseconds(50));
      t->async_wait([this, t](beast::error_code) { accept(); });
      return;
    }
    if (stopping) {
      beast::error_code ignored;
      sock.close(ignored);
      return accept();
    }
    bool overflow = false;
    if (open.load() >= limits.max_connections && !evict_idle()) {
      overflow = true;
      ++overflowed;
    }
    auto c = std::make_shared<Connection>(*this, std::move(sock), overflow);
    {
      std::lock_guard<std::mutex> lock(mu);
      conns.emplace(c.get(), c);
    }
    asio::post(c->executor(), [c] { c->start(); });
    accept();
  });
}

bool HttpListener::Impl::evict_idle() {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [p, w] : conns) {
    if (auto c = w.lock(); c && c->idle()) {
      c->close_async();
      return true;
    }
  }
  return false;
}

HttpListener::HttpListener(HttpLimits limits, HttpHandlers handlers)
    : impl_(std::make_unique<Impl>(std::move(limits), std::move(handlers))) {}

HttpListener::~HttpListener() { stop(); }

const HttpLimits& HttpListener::limits() const { return impl_->limits; }
int HttpListener::open_connections() const { return impl_->open.load(); }
uint64_t HttpListener::overflow_count() const { return impl_->overflowed.load(); }

int HttpListener::bind(const std::string& host, int port) {
  Impl& m = *impl_;
  if (m.acceptor) fail("the listener is already bound");
  if (port < 0 || port > 65535) fail("port {} is out of range 0..65535", port);
  beast::error_code ec;
  tcp::resolver resolver(m.ioc);
  const auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || results.empty()) fail("could not listen on {}:{}: cannot resolve the address ({})", host, port, ec.message());
  std::string why;
  for (const auto& r : results) {
    tcp::acceptor a(m.ioc);
    const tcp::endpoint ep = r.endpoint();
    if (a.open(ep.protocol(), ec)) {
      why = ec.message();
      continue;
    }
    // SO_REUSEADDR only (restart while old connections linger in TIME_WAIT);
    // never SO_REUSEPORT, so that a second server on the port fails to bind.
    a.set_option(tcp::acceptor::reuse_address(true), ec);
    if (a.bind(ep, ec)) {
      why = ec.message();
      if (ec == asio::error::address_in_use) why += " (another server listens on this port)";
      continue;
    }
    if (a.listen(m.limits.listen_backlog, ec)) {
      why = ec.message();
      continue;
    }
    const int bound = a.local_endpoint().port();
    m.acceptor.emplace(std::move(a));
    return bound;
  }
  fail("could not listen on {}:{}: {}", host, port, why.empty() ? "no address" : why);
}

void HttpListener::start() {
  Impl& m = *impl_;
  if (!m.acceptor) fail("the listener is not bound");
  if (m.started) return;
  m.started = true;
  m.work.emplace(m.ioc.get_executor());
  m.accept();
  const int n = std::max(1, m.limits.io_threads);
  for (int i = 0; i < n; ++i) m.threads.emplace_back([&m] { m.ioc.run(); });
}

void HttpListener::stop() {
  Impl& m = *impl_;
  if (m.stopped) return;
  m.stopped = true;
  m.stopping = true;
  if (m.acceptor) {
    asio::post(m.ioc, [&m] {
      beast::error_code ec;
      m.acceptor->close(ec);
    });
  }
  {
    std::lock_guard<std::mutex> lock(m.mu);
    for (auto& [p, w] : m.conns)
      if (auto c = w.lock()) c->close_async();
  }
  if (m.started) {
    // The closes run on the I/O threads; give them a moment, then stop.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (m.open.load() > 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  m.work.reset();
  m.ioc.stop();
  for (auto& t : m.threads) t.join();
  m.threads.clear();
}

}  // namespace megakern::server
