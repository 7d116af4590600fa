// One HTTP connection: reads requests one at a time, checks them, dispatches them.
#include "http/http_session.hpp"

#include <unistd.h>

#include <boost/beast/core/detect_ssl.hpp>
#include <spdlog/spdlog.h>

#include "http/auth.hpp"
#include "http/request.hpp"
#include "http/http_io.hpp"
#include "http/listener.hpp"
#include "http/redact.hpp"

namespace kgate::gw {

namespace {
constexpr auto kReadTimeout = std::chrono::seconds(300);      // an idle keep-alive connection
// A connection that has not passed the checks has this long for each request's header (its
// first one included, so an idle one goes too): slowloris and idle floods hold nothing for long.
constexpr auto kHeaderTimeout = std::chrono::seconds(10);
// A refused request's unread body is read and dropped for at most this long before the close.
constexpr auto kLingerTimeout = std::chrono::seconds(2);
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);  // a TLS client that says nothing
constexpr auto kShutdownTimeout = std::chrono::seconds(5);    // a TLS peer that never answers close_notify
// An answer in parts whose client does not read: past this many bytes waiting to be written,
// the connection is closed (the client sees its stream cut short) rather than kgate holding more.
constexpr std::size_t kMaxQueuedParts = std::size_t{64} << 20;
}

HttpSession::HttpSession(Stream stream, const HttpHost& host) : stream_(std::move(stream)), host_(host) {
  beast::error_code ec;
  if (auto* u = std::get_if<UnixStream>(&stream_)) {
    peer_loopback_ = true;  // only this machine reaches a Unix socket
    auto uid = unix_peer_uid(u->socket().native_handle());
    const auto& allowed = host_.options.unix_allow_uids;
    if (!uid) {
      refused_ = "kgate cannot tell which user connected to its Unix socket, so it serves nobody there";
      spdlog::warn("refused a connection on unix:{}: the peer's uid is unknown", host_.unix_socket.string());
    } else if (!unix_peer_allowed(*uid, allowed)) {
      refused_ = "uid " + std::to_string(*uid) + " may not use this kgate: its Unix socket serves uid " +
                 std::to_string(::geteuid()) + " (kgate's own) and the uids in unix_allow_uids of kgate.toml";
      spdlog::warn("refused a connection on unix:{} from uid {} (not kgate's uid {}, nor in unix_allow_uids)",
                   host_.unix_socket.string(), *uid, ::geteuid());
    }
    return;
  }
  auto& tcp_layer = std::holds_alternative<TlsStream>(stream_) ? std::get<TlsStream>(stream_).next_layer()
                                                               : std::get<TcpStream>(stream_);
  auto peer = tcp_layer.socket().remote_endpoint(ec);
  peer_loopback_ = !ec && peer.address().is_loopback();
  tcp_layer.socket().set_option(tcp::no_delay(true), ec);
}

bool HttpSession::accept(Stream stream, const HttpHost& host) {
  auto session = std::make_shared<HttpSession>(std::move(stream), host);
  std::weak_ptr<HttpSession> weak = session;
  session->slot_ = host.gate.admit([weak] {
    if (auto s = weak.lock()) s->evict();
  });
  if (!session->slot_) {
    // Every place is held by a connection that passed the checks: the owner's own. Refused
    // without a word (there is no request yet to answer), and counted by the caller's log.
    session->evict();
    return false;
  }
  session->run();
  return true;
}

void HttpSession::evict() {
  std::visit(
      [](auto& s) {
        beast::error_code ec;
        beast::get_lowest_layer(s).socket().close(ec);  // its operations end, and so does the session
      },
      stream_);
}

void HttpSession::run() {
  auto self = shared_from_this();
  net::dispatch(std::visit([](auto& s) { return s.get_executor(); }, stream_), [self] {
    auto* tls = std::get_if<TlsStream>(&self->stream_);
    if (!tls) return self->do_read();
    // The handshake has a deadline and runs on the Asio thread like everything else.  It
    // starts by looking at the first bytes: a plain http request gets a plain answer.
    tls->next_layer().expires_after(kHandshakeTimeout);
    beast::async_detect_ssl(tls->next_layer(), self->buffer_,
                            beast::bind_front_handler(&HttpSession::on_detect, self));
  });
}

void HttpSession::on_detect(beast::error_code ec, bool tls) {
  if (ec) {
    if (ec != beast::error::timeout && ec != net::error::eof && ec != net::error::connection_reset)
      spdlog::debug("tls: {}", ec.message());
    return;  // the connection closes with the session
  }
  if (!tls) {
    // Go on in clear text, only to tell the client which scheme to use.
    TcpStream plain(std::move(std::get<TlsStream>(stream_).next_layer()));
    stream_.emplace<TcpStream>(std::move(plain));
    plain_on_tls_ = true;
    return do_read();
  }
  auto& s = std::get<TlsStream>(stream_);
  s.async_handshake(ssl::stream_base::server, buffer_.data(),
                    beast::bind_front_handler(&HttpSession::on_handshake, shared_from_this()));
}

void HttpSession::on_handshake(beast::error_code ec, std::size_t used) {
  if (ec) {
    spdlog::debug("tls handshake: {}", ec.message());
    return;
  }
  buffer_.consume(used);
  do_read();
}

void HttpSession::do_read() {
  parser_.emplace();
  parser_->body_limit(host_.options.max_body_bytes);
  parser_->header_limit(static_cast<std::uint32_t>(host_.options.max_header_bytes));
  const auto timeout = slot_ && slot_->is_authenticated() ? kReadTimeout : kHeaderTimeout;
  std::visit([timeout](auto& s) { beast::get_lowest_layer(s).expires_after(timeout); }, stream_);
  async_read_header(stream_, buffer_, *parser_, beast::bind_front_handler(&HttpSession::on_header, shared_from_this()));
}

void HttpSession::on_header(beast::error_code ec, std::size_t n) {
  if (ec) return on_read(ec, n);  // the same answers: a header over the limit, a timeout, a close
  const Request& head = parser_->get();
  if (!refused_.empty() || plain_on_tls_) {
    // A peer that is never served (another uid on the Unix socket, plain http on the TLS port):
    // the connection closes after the answer.
    auto res = !refused_.empty()
                   ? json_error(head, http::status::forbidden, refused_)
                   : json_error(head, http::status::bad_request,
                                "This port serves https: use https://" + std::string(head[http::field::host]) +
                                    std::string(head.target().substr(0, head.target().find('?'))));
    res.keep_alive(false);
    linger_ = !parser_->is_done();
    return write(std::move(res));
  }
  if (auto refusal = check_request(host_.options, head, RequestContext{peer_loopback_, is_unix(stream_), slot_})) {
    if (!is_cors_preflight(head)) add_cors_headers(host_.options, std::string(head[http::field::origin]), *refusal);
    return refuse(std::move(*refusal));
  }
  if (slot_) slot_->authenticated();
  if (parser_->is_done()) return on_read({}, 0);
  std::visit([](auto& s) { beast::get_lowest_layer(s).expires_after(kReadTimeout); }, stream_);
  auto read_body = [self = shared_from_this()] {
    async_read_request(self->stream_, self->buffer_, *self->parser_,
                       beast::bind_front_handler(&HttpSession::on_read, self));
  };
  if (!beast::iequals(head[http::field::expect], "100-continue")) return read_body();
  async_write_continue(stream_, [self = shared_from_this(), read_body](beast::error_code e, std::size_t) {
    if (e) return self->do_close();
    read_body();
  });
}

void HttpSession::refuse(http::response<http::string_body> res) {
  if (!parser_->is_done()) {  // its body was not read: the connection cannot go on
    res.keep_alive(false);
    linger_ = true;
  }
  write(std::move(res));
}

void HttpSession::linger() {
  // What the client still sends is read and dropped, for a while: closing with unread bytes
  // would reset the connection, and the client might lose the answer it was sent.
  if (!scratch_) {
    scratch_ = std::make_shared<std::array<char, 16384>>();
    std::visit([](auto& s) { beast::get_lowest_layer(s).expires_after(kLingerTimeout); }, stream_);
  }
  std::visit(
      [self = shared_from_this()](auto& s) {
        s.async_read_some(net::buffer(*self->scratch_), [self](beast::error_code ec, std::size_t) {
          if (!ec) self->linger();
        });
      },
      stream_);
}

void HttpSession::on_read(beast::error_code ec, std::size_t) {
  if (ec == http::error::end_of_stream) return do_close();
  if (ec == http::error::body_limit || ec == http::error::header_limit) {
    Request req;
    req.version(11);
    req.keep_alive(false);
    bool body = ec == http::error::body_limit;
    auto res = json_error(req, body ? http::status::payload_too_large : http::status::request_header_fields_too_large,
                          body ? "The request body is over the limit of " +
                                     std::to_string(host_.options.max_body_bytes) + " bytes"
                               : "The request header is over the limit of " +
                                     std::to_string(host_.options.max_header_bytes) + " bytes");
    return write(std::move(res));
  }
  if (ec) {
    if (ec != beast::error::timeout && ec != net::error::operation_aborted &&
        ec != net::error::connection_reset && ec != ssl::error::stream_truncated)
      spdlog::debug("http read: {}", ec.message());
    return do_close();
  }
  Request req = parser_->release();
  // No request may take the daemon down: an exception from a handler is the client's 500.
  std::string method(req.method_string()), target(req.target());
  try {
    dispatch(std::move(req));
  } catch (const std::exception& e) {
    log_internal_error(method, target, e.what());
    Request bare;
    bare.version(11);
    bare.keep_alive(false);
    write(json_error(bare, http::status::internal_server_error, std::string("kgate: internal error: ") + e.what()));
  }
}

void HttpSession::dispatch(http::request<http::string_body> req) {
  // CORS: every answer to a listed Origin carries Access-Control-Allow-Origin (errors too, so
  // the page can read them); a preflight's answer has its own.
  // Its header passed check_request (on_header).
  const std::string origin(req[http::field::origin]);
  RequestContext ctx{peer_loopback_, is_unix(stream_), slot_};
  auto respond = [self = shared_from_this(), origin](Response res) {
    add_cors_headers(self->host_.options, origin, res);
    self->write(std::move(res));
  };
  if (websocket::is_upgrade(req)) {
    // A websocket route takes the whole stream (TLS state included): this session is then done.
    auto hand_over = [this] {
      std::visit([](auto& s) { beast::get_lowest_layer(s).expires_never(); }, stream_);
      return std::move(stream_);
    };
    return host_.dispatch(req, ctx, std::move(respond), hand_over, nullptr);
  }
  RespondInParts in_parts;
  if (req.version() >= 11)
    in_parts = [self = shared_from_this(), origin](Response head) {
      add_cors_headers(self->host_.options, origin, head);
      return self->open_parts(std::move(head));
    };
  host_.dispatch(req, ctx, std::move(respond), nullptr, std::move(in_parts));
}

// What a handler holds while it answers in parts. It keeps the connection's session alive: a
// session streaming an answer has no read or write in flight between parts.
class HttpSession::Parts : public PartsWriter {
 public:
  explicit Parts(std::shared_ptr<HttpSession> s) : s_(std::move(s)) {}
  void send(std::string part) override { s_->queue_part(std::move(part)); }
  void end() override { s_->end_parts(); }
  void on_gone(std::function<void()> fn) override { s_->parts_gone_ = std::move(fn); }

 private:
  std::shared_ptr<HttpSession> s_;
};

std::shared_ptr<PartsWriter> HttpSession::open_parts(Response head) {
  parts_ = {};
  parts_.open = true;
  parts_.writing = true;
  parts_.keep_alive = head.keep_alive();
  head.body().clear();
  head.chunked(true);
  res_ = std::make_shared<Response>(std::move(head));
  std::visit([](auto& s) { beast::get_lowest_layer(s).expires_after(kReadTimeout); }, stream_);
  async_write_head(stream_, *res_, beast::bind_front_handler(&HttpSession::on_part_written, shared_from_this()));
  return std::make_shared<Parts>(shared_from_this());
}

void HttpSession::queue_part(std::string part) {
  if (!parts_.open || parts_.ended || parts_.failed || part.empty()) return;
  if (parts_.queued.size() + part.size() > kMaxQueuedParts) {
    spdlog::warn("an answer in parts has {} bytes its client did not read (the limit is {}): its connection is closed",
                 parts_.queued.size() + part.size(), kMaxQueuedParts);
    parts_.failed = true;
    parts_.queued.clear();
    if (auto gone = std::exchange(parts_gone_, nullptr)) gone();
    if (!parts_.writing) do_close();  // else the write in flight fails or ends, and closes then
    return;
  }
  parts_.queued += part;
  pump_parts();
}

void HttpSession::end_parts() {
  if (!parts_.open || parts_.ended) return;
  parts_.ended = true;
  pump_parts();
}

void HttpSession::pump_parts() {
  if (parts_.writing || parts_.failed || (parts_.queued.empty() && !parts_.ended)) return;
  parts_.in_flight = std::move(parts_.queued);
  parts_.queued.clear();
  parts_.last_sent = parts_.ended;
  parts_.writing = true;
  // Each write has its own deadline: between parts nothing waits on the connection.
  std::visit([](auto& s) { beast::get_lowest_layer(s).expires_after(kReadTimeout); }, stream_);
  async_write_chunk(stream_, parts_.in_flight, parts_.last_sent,
                    beast::bind_front_handler(&HttpSession::on_part_written, shared_from_this()));
}

void HttpSession::on_part_written(beast::error_code ec, std::size_t) {
  parts_.writing = false;
  res_.reset();
  if (ec || parts_.failed) {
    parts_.failed = true;
    parts_.queued.clear();
    if (auto gone = std::exchange(parts_gone_, nullptr)) gone();
    return do_close();
  }
  if (!parts_.last_sent) return pump_parts();
  const bool keep_alive = parts_.keep_alive;
  parts_ = {};
  parts_gone_ = nullptr;
  if (!keep_alive) return do_close();
  do_read();
}

void HttpSession::write(Response res) {
  bool keep_alive = res.keep_alive();
  res_ = std::make_shared<Response>(std::move(res));
  // A response may come long after the read (a wait of up to 600 s): give the write its own
  // deadline rather than what is left of the read's.
  std::visit([](auto& s) { beast::get_lowest_layer(s).expires_after(kReadTimeout); }, stream_);
  async_write_response(stream_, *res_,
                       beast::bind_front_handler(&HttpSession::on_write, shared_from_this(), keep_alive));
}

void HttpSession::on_write(bool keep_alive, beast::error_code ec, std::size_t) {
  res_.reset();
  if (ec) return do_close();
  if (!keep_alive) return do_close();
  do_read();
}

void HttpSession::do_close() {
  if (linger_ && !std::holds_alternative<TlsStream>(stream_)) {
    linger_ = false;
    std::visit(
        [](auto& s) {
          beast::error_code ec;
          beast::get_lowest_layer(s).socket().shutdown(net::socket_base::shutdown_send, ec);
        },
        stream_);
    return linger();
  }
  if (auto* tls = std::get_if<TlsStream>(&stream_)) {
    // close_notify, so the client knows the response was not cut short; bounded.
    tls->next_layer().expires_after(kShutdownTimeout);
    tls->async_shutdown([self = shared_from_this()](beast::error_code) {
      beast::error_code ignored;
      std::get<TlsStream>(self->stream_).next_layer().socket().shutdown(tcp::socket::shutdown_both, ignored);
    });
    return;
  }
  std::visit(
      [](auto& s) {
        beast::error_code ec;
        beast::get_lowest_layer(s).socket().shutdown(net::socket_base::shutdown_send, ec);
      },
      stream_);
}

}  // namespace kgate::gw
