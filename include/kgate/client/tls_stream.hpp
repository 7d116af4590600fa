// TLS for https:// gateways: the client context (system CA store or ca_file, TLS >= 1.2, peer
// verification on unless verify = false), SNI and host name checks per connection, and the
// connection types HttpClient, AgentLink and KernelChannel use, each plain TCP (http://), TLS
// over TCP (https://) or a Unix stream socket (unix:///path).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <variant>

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>

#include "kgate/client/endpoint.hpp"

namespace kgate::client::tls {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;

using TlsStream = beast::ssl_stream<beast::tcp_stream>;
using UnixStream = beast::basic_stream<net::local::stream_protocol>;

// The client context for `ep` (null for http://).  With verify, peers are checked against the
// system store, or against ca_file alone when it is set.  Null and `error` when ca_file cannot
// be loaded.  verify = false logs one warning per endpoint per process.
std::shared_ptr<ssl::context> client_context(const Endpoint& ep, std::string& error);

// Sets SNI (DNS names only, as RFC 6066 says) and the name or address the certificate must
// match, on a fresh stream.  False and `error` if OpenSSL refuses them.
bool set_peer(TlsStream& s, const Endpoint& ep, std::string& error);

// A failed TLS handshake as one sentence: a certificate verify failure names OpenSSL's reason
// and what to set; anything else (no answer within `timeout` included: a plain http server
// waits for a request line) suggests the server may be plain http.
std::string handshake_message(const Endpoint& ep, TlsStream& s, const beast::error_code& ec,
                              std::chrono::milliseconds timeout);

// A byte stream to a gateway: TCP, TLS over TCP, or a Unix socket.  visit() hands the live
// alternative to a generic lambda, so the code that uses it is written once.
template <class Plain, class Tls, class Unix>
class Either {
 public:
  // A Unix socket for a unix:// endpoint, TLS when `ctx` is set (an https endpoint), else plain TCP.
  Either(const Endpoint& ep, std::shared_ptr<ssl::context> ctx, net::io_context& ioc)
      : ctx_(std::move(ctx)), v_(make(ep.is_unix(), ctx_.get(), ioc)) {}
  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit(std::forward<F>(f), v_);
  }
  bool is_tls() const { return v_.index() == 1; }

 private:
  using Variant = std::variant<Plain, Tls, Unix>;
  static Variant make(bool unix_socket, ssl::context* ctx, net::io_context& ioc) {
    if (unix_socket) return Variant(std::in_place_type<Unix>, ioc);
    if (ctx) return Variant(std::in_place_type<Tls>, ioc, *ctx);
    return Variant(std::in_place_type<Plain>, ioc);
  }
  std::shared_ptr<ssl::context> ctx_;  // outlives the stream that points at it
  Variant v_;
};

using Stream = Either<beast::tcp_stream, TlsStream, UnixStream>;

// The TLS layer under a stream, or null for plain TCP and Unix sockets.
inline TlsStream* tls_layer(beast::tcp_stream&) { return nullptr; }
inline TlsStream* tls_layer(UnixStream&) { return nullptr; }
inline TlsStream* tls_layer(TlsStream& s) { return &s; }

}  // namespace kgate::client::tls
