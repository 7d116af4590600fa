// Websocket (include/kgate/client/websocket.hpp) over one transport: Beast's websocket::stream,
// its operations compiled once per transport: websocket_tcp.cpp, websocket_unix.cpp, and for TLS
// (the heaviest) websocket_tls_io.cpp and websocket_tls_handshake.cpp; websocket.cpp has the
// factories and the blocking open.
// Private to src/client.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cstdint>
#include <optional>
#include <type_traits>

#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>

#include "connect.hpp"
#include "kgate/client/websocket.hpp"

namespace kgate::client {

// tcp_sent.cpp: what a TCP socket has taken from its writer (bytes_taken).
std::optional<std::uint64_t> tcp_bytes_taken(int fd);

// The layer between Beast's websocket::stream and the transport, which can hold a batch of
// messages back: a synchronous write on it keeps its bytes here (no I/O, nothing waits), and the
// next asynchronous write hands what was held and its own bytes to the transport in one
// gathered write. So Beast still frames every message, and a batch costs one write on the socket
// and one pass of the event loop instead of one each (Websocket::hold_message). Reads, and
// asynchronous writes while nothing is held, go straight through.
template <class Next>
class Holding {
 public:
  using next_layer_type = Next;
  using executor_type = typename Next::executor_type;

  template <class... Args>
  explicit Holding(Args&&... args) : next_(std::forward<Args>(args)...) {}

  Next& next_layer() { return next_; }
  const Next& next_layer() const { return next_; }
  executor_type get_executor() { return next_.get_executor(); }

  template <class Buffers, class Handler>
  auto async_read_some(const Buffers& b, Handler&& h) {
    return next_.async_read_some(b, std::forward<Handler>(h));
  }
  template <class Buffers>
  std::size_t read_some(const Buffers& b, beast::error_code& ec) {
    return next_.read_some(b, ec);
  }
  template <class Buffers>
  std::size_t read_some(const Buffers& b) {
    return next_.read_some(b);
  }

  // Holds the bytes, for the next asynchronous write.
  template <class Buffers>
  std::size_t write_some(const Buffers& b, beast::error_code& ec) {
    ec = {};
    for (auto piece : beast::buffers_range_ref(b)) held_.append(static_cast<const char*>(piece.data()), piece.size());
    return net::buffer_size(b);
  }
  template <class Buffers>
  std::size_t write_some(const Buffers& b) {
    beast::error_code ec;
    return write_some(b, ec);
  }

  template <class Buffers, class Handler>
  auto async_write_some(const Buffers& b, Handler&& handler) {
    return net::async_initiate<Handler, void(beast::error_code, std::size_t)>(
        [this](auto h, const Buffers& bufs) { write_some_async(bufs, std::move(h)); }, handler, b);
  }

 private:
  template <class Buffers, class H>
  void write_some_async(const Buffers& b, H h) {
    if (held_.empty()) return next_.async_write_some(b, std::move(h));
    // What was held, then these bytes, in one write; the handler hears of its own bytes only.
    const std::size_t n = net::buffer_size(b);
    sending_.swap(held_);  // held_ takes sending_'s empty buffer, capacity and all
    pieces_.clear();
    pieces_.push_back(net::buffer(sending_));
    for (auto piece : beast::buffers_range_ref(b)) pieces_.push_back(piece);
    net::async_write(next_, pieces_, [this, n, h = std::move(h)](beast::error_code ec, std::size_t) mutable {
      sending_.clear();
      std::move(h)(ec, ec ? 0 : n);
    });
  }

  Next next_;
  std::string held_, sending_;
  std::vector<net::const_buffer> pieces_;
};

// Beast's websocket closes through its next layer's teardown: this one's is its transport's.
template <class Next>
void teardown(beast::role_type role, Holding<Next>& s, beast::error_code& ec) {
  using beast::websocket::teardown;
  teardown(role, s.next_layer(), ec);
}

template <class Next, class TeardownHandler>
void async_teardown(beast::role_type role, Holding<Next>& s, TeardownHandler&& handler) {
  using beast::websocket::async_teardown;
  async_teardown(role, s.next_layer(), std::forward<TeardownHandler>(handler));
}

template <class Next>
class WebsocketOver final : public Websocket {
 public:
  // `tls` (a client's TLS context, or null) is kept for as long as the stream that points at it.
  template <class... Args>
  explicit WebsocketOver(std::shared_ptr<ssl::context> tls, Args&&... args)
      : tls_(std::move(tls)), ws_(std::forward<Args>(args)...) {}

  void read_message_max(std::size_t bytes) override { ws_.read_message_max(bytes); }
  void auto_fragment(bool on) override { ws_.auto_fragment(on); }
  void set_option(const websocket::stream_base::timeout& t) override { ws_.set_option(t); }
  void set_option(websocket::stream_base::decorator d) override { ws_.set_option(std::move(d)); }
  void text(bool on) override { ws_.text(on); }
  void binary(bool on) override { ws_.binary(on); }
  bool got_text() const override { return ws_.got_text(); }
  bool got_binary() const override { return ws_.got_binary(); }
  const websocket::close_reason& reason() const override { return ws_.reason(); }

  // The operations: declared here, defined in websocket_ops.hpp, which only the units that
  // compile them include (the TLS stream's are split over two units).
  void async_read(beast::flat_buffer& buf, IoHandler done) override;
  using Websocket::async_write;
  void async_write(Buffers data, IoHandler done) override;
  void async_close(const websocket::close_reason& why, Handler done) override;
  void async_accept(const http::request<http::string_body>& req, Handler done) override;
  void expires_never() override { beast::get_lowest_layer(ws_).expires_never(); }
  void close_transport() override {
    beast::error_code ignored;
    beast::get_lowest_layer(ws_).socket().close(ignored);
  }
  void cork(bool on) override {
    auto& sock = beast::get_lowest_layer(ws_).socket();
    if constexpr (std::is_same_v<typename std::decay_t<decltype(sock)>::protocol_type, tcp>) {
      int v = on ? 1 : 0;
      if (sock.is_open()) ::setsockopt(sock.native_handle(), IPPROTO_TCP, TCP_CORK, &v, sizeof v);
    }
  }
  bool hold_message(const Buffers& data) override {
    beast::error_code ec;
    ws_.write(data, ec);
    return !ec;
  }
  void on_ping(std::function<void(std::size_t)> f) override {
    if (!f) return ws_.control_callback();
    ws_.control_callback([f = std::move(f)](websocket::frame_type t, beast::string_view payload) {
      if (t == websocket::frame_type::ping) f(payload.size());
    });
  }
  std::optional<std::uint64_t> bytes_taken() override {
    if constexpr (std::is_same_v<Next, Websocket::Tcp>) {
      auto& sock = beast::get_lowest_layer(ws_).socket();
      if (sock.is_open()) return tcp_bytes_taken(sock.native_handle());
    }
    return std::nullopt;
  }
  void async_open(tcp::resolver& resolver, const Endpoint& ep, std::string target, std::string subprotocol,
                  std::chrono::milliseconds timeout, OpenHandler done) override;

 private:
  std::shared_ptr<ssl::context> tls_;
  websocket::stream<Holding<Next>> ws_;
};

// Not connected client sockets, one per unit.
std::unique_ptr<Websocket> tcp_client(net::io_context& ioc);
std::unique_ptr<Websocket> tls_client(std::shared_ptr<ssl::context> tls, net::io_context& ioc);
std::unique_ptr<Websocket> unix_client(net::io_context& ioc);

}  // namespace kgate::client
