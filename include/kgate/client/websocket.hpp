// A websocket over TCP, TLS over TCP or a Unix stream socket, behind one interface that is not a
// template: the gateway's sessions (server side) and every client of a gateway (agent link,
// kernel channel, proxy link) use it.
//
// Why not Beast's websocket::stream<T> directly: it is a template over its transport, and each of
// its operations a template over its completion handler.  Each unit that used it compiled the
// read, write, accept, handshake and close state machines for three transports and its own
// handler types: 60-100 s per unit at -O2.  Here each state machine is compiled once per
// transport, in src/client/websocket_{tcp,tls,unix}.cpp, for std::function handlers; the cost at
// run time is one virtual call and one std::function per operation.
//
// Threading: as Beast's stream.  One read, one write and one close may be pending at a time;
// completions run on the transport's executor (the gateway's strand, or the client's io_context).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/core/basic_stream.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <boost/beast/websocket/error.hpp>
#include <boost/beast/websocket/rfc6455.hpp>
#include <boost/beast/websocket/stream_base.hpp>

#include "kgate/client/endpoint.hpp"

namespace kgate::client {

class Websocket {
 public:
  using Tcp = boost::beast::tcp_stream;
  using Tls = boost::beast::ssl_stream<boost::beast::tcp_stream>;
  using Unix = boost::beast::basic_stream<boost::asio::local::stream_protocol>;
  using error_code = boost::beast::error_code;
  using IoHandler = std::function<void(error_code, std::size_t)>;
  using Handler = std::function<void(error_code)>;
  // done(ec, open_error, protocol): `open_error` names a failed TLS handshake or Unix connect,
  // `protocol` is the subprotocol the server chose ("" for none).
  using OpenHandler = std::function<void(error_code, std::string, std::string)>;

  // The server side of an upgrade: the accepted connection moved in whole (buffers, deadline,
  // TLS state).
  static std::unique_ptr<Websocket> over(Tcp&& s);
  static std::unique_ptr<Websocket> over(Tls&& s);
  static std::unique_ptr<Websocket> over(Unix&& s);
  // The client side, not yet connected: a Unix socket for a unix:// endpoint, TLS when `tls` is
  // set (https), else plain TCP.  async_open() connects it.
  static std::unique_ptr<Websocket> client(const Endpoint& ep, std::shared_ptr<boost::asio::ssl::context> tls,
                                           boost::asio::io_context& ioc);

  virtual ~Websocket() = default;

  // Options, as Beast's websocket::stream of the same names.
  virtual void read_message_max(std::size_t bytes) = 0;
  virtual void auto_fragment(bool on) = 0;
  virtual void set_option(const boost::beast::websocket::stream_base::timeout& t) = 0;
  virtual void set_option(boost::beast::websocket::stream_base::decorator d) = 0;
  virtual void text(bool on) = 0;
  virtual void binary(bool on) = 0;
  virtual bool got_text() const = 0;
  virtual bool got_binary() const = 0;
  virtual const boost::beast::websocket::close_reason& reason() const = 0;

  // Operations, as Beast's.
  virtual void async_read(boost::beast::flat_buffer& buf, IoHandler done) = 0;
  // One message from these pieces, in order (a gathered write: nothing is copied to join them).
  // The bytes must stay put until `done` runs.
  using Buffers = std::vector<boost::asio::const_buffer>;
  virtual void async_write(Buffers data, IoHandler done) = 0;
  void async_write(boost::asio::const_buffer data, IoHandler done) {
    async_write(Buffers{data}, std::move(done));
  }
  virtual void async_close(const boost::beast::websocket::close_reason& why, Handler done) = 0;

  // Server side: answers the upgrade request `req` (already read and authorised).
  virtual void async_accept(const boost::beast::http::request<boost::beast::http::string_body>& req,
                            Handler done) = 0;
  // The transport's deadline off (the HTTP read timeout it had until the upgrade).
  virtual void expires_never() = 0;
  // Closes the socket at once: pending operations end with operation_aborted.
  virtual void close_transport() = 0;
  // TCP_CORK on the transport's socket (a no-op on a Unix socket): while on, the messages
  // written leave as full segments, and whatever is left goes when it is turned off.  So a
  // batch of small messages costs the loopback one packet, and the reader one wake, not one
  // each.  Whoever turns it on must turn it off when its batch is written (Linux sends a
  // corked remainder after 200 ms anyway).
  virtual void cork(bool on) = 0;
  // Frames one message (text or binary, as set) and keeps its bytes, with no I/O: the next
  // async_write (a message or a close frame) takes them to the socket ahead of its own, in one
  // write. So a batch of N messages costs the socket one write and the event loop one pass, not
  // N. A held message has reached the socket only when that write is done. False when the
  // stream has failed.
  virtual bool hold_message(const Buffers& data) = 0;
  // On a plain TCP transport, the count of bytes its socket has taken from kgate so far, from an
  // arbitrary origin (tcp_bytes_taken, two syscalls): two readings tell what was handed to the
  // socket in between, which Beast does not (a write in flight when the stream fails ends with
  // operation_aborted even when its last bytes had gone).  nullopt on TLS (the socket carries
  // records, not frames), on a Unix socket, or when the kernel will not say.
  virtual std::optional<std::uint64_t> bytes_taken() = 0;
  // Called with the payload size of each ping read (Beast answers it with a pong of its own).
  virtual void on_ping(std::function<void(std::size_t payload_bytes)> f) = 0;

  // Client side: resolves and connects to `ep` (TLS handshake with the peer checked, or the Unix
  // socket), deadline `timeout` per step, then the websocket handshake for `target` with kgate's
  // User-Agent, the endpoint's token and, when not empty, `subprotocol`.  The caller runs the
  // io_context; `resolver` outlives the operation.
  virtual void async_open(boost::asio::ip::tcp::resolver& resolver, const Endpoint& ep, std::string target,
                          std::string subprotocol, std::chrono::milliseconds timeout, OpenHandler done) = 0;

  // The same, blocking: runs `ioc` (which has nothing else to do) until the handshake is done,
  // then restarts it for the caller's loop.  Once open, Beast's suggested client timeouts are
  // set (pings when idle; the caller may set others).  Returns "" and no `ec` when open, else
  // why not, as one sentence (a failed TLS handshake or Unix connect named).  `protocol`, when
  // given, gets the subprotocol the server chose.
  std::string open(boost::asio::io_context& ioc, const Endpoint& ep, const std::string& target,
                   const std::string& subprotocol, std::chrono::milliseconds timeout, error_code& ec,
                   std::string* protocol = nullptr);
};

}  // namespace kgate::client
