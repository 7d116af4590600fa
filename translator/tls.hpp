// TLS for https:// gateways: the client context (system CA store or ca_file, TLS >= 1.2, peer
// verification on unless verify = false), SNI and host name checks per connection, and the
// connection types HttpClient, AgentLink and KernelChannel use, each either plain TCP (http://)
// or TLS over TCP (https://).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <variant>

#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>

#include "gateway.hpp"

namespace kgate::mcp::tls {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;

using TlsStream = beast::ssl_stream<beast::tcp_stream>;

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

// A byte stream to a gateway: TCP, or TLS over TCP.  visit() hands the live alternative to a
// generic lambda, so the code that uses it is written once.
template <class Plain, class Tls>
class Either {
 public:
  // TLS when `ctx` is set (an https endpoint), else plain TCP.
  Either(std::shared_ptr<ssl::context> ctx, net::io_context& ioc)
      : ctx_(std::move(ctx)),
        v_(ctx_ ? std::variant<Plain, Tls>(std::in_place_type<Tls>, ioc, *ctx_)
                : std::variant<Plain, Tls>(std::in_place_type<Plain>, ioc)) {}
  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit(std::forward<F>(f), v_);
  }
  beast::tcp_stream& tcp() {
    return visit([](auto& s) -> beast::tcp_stream& { return beast::get_lowest_layer(s); });
  }
  bool is_tls() const { return v_.index() == 1; }

 private:
  std::shared_ptr<ssl::context> ctx_;  // outlives the stream that points at it
  std::variant<Plain, Tls> v_;
};

using Stream = Either<beast::tcp_stream, TlsStream>;
using Websocket = Either<beast::websocket::stream<beast::tcp_stream>, beast::websocket::stream<TlsStream>>;

// The TLS layer under a stream, or null for plain TCP.
inline TlsStream* tls_layer(beast::tcp_stream&) { return nullptr; }
inline TlsStream* tls_layer(TlsStream& s) { return &s; }
template <class Next>
TlsStream* tls_layer(beast::websocket::stream<Next>& ws) {
  return tls_layer(ws.next_layer());
}

}  // namespace kgate::mcp::tls
