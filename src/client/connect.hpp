// The one connect path of every client of a gateway (HTTP, and the websockets of websocket_impl.hpp):
// resolve, connect (TCP with no Nagle, TLS with the peer checked, or a Unix socket).  Private to
// src/client.
#pragma once

#include <errno.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>

// The parts of Asio and Beast the clients use, not <boost/asio.hpp> (all of Asio) in every unit.
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/stream_traits.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "kgate/client/endpoint.hpp"
#include "kgate/client/gateways_toml.hpp"
#include "kgate/client/tls_stream.hpp"
#include "kgate/version.hpp"

namespace kgate::client {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

// "<program>/<version>": kgate-mcp, or kgate (kernels, proxy-kernel).
inline std::string user_agent() { return std::string(program_invocation_short_name) + "/" + std::string(kgate::version()); }

// A failed connect to a Unix socket as one sentence naming the path.
inline std::string unix_connect_message(const Endpoint& ep, const beast::error_code& ec) {
  std::string hint = ec == net::error::access_denied ? "the socket is its owner's only (mode 0600): run as kgate's user"
                     : ec == net::error::connection_refused ? "nobody accepts on it: a stale socket; is kgate running?"
                     : ec == beast::error::timeout ? "no answer: is kgate busy or stopped?"
                                                   : "is kgate serving with --unix?";
  return "cannot connect to " + ep.url + ": " + ec.message() + " (" + hint + ")";
}

// Resolves `ep`, connects the TCP layer of `s` (deadline `timeout`) and, when `s` is a TLS stream,
// does the TLS handshake (deadline `timeout` again).  Then done(ec, open_error): `open_error`
// names a failed handshake, else it is "".  The caller runs the io_context.
template <class Stream>
void async_open(Stream& s, tcp::resolver& resolver, const Endpoint& ep, std::chrono::milliseconds timeout,
                std::function<void(beast::error_code, std::string)> done) {
  resolver.async_resolve(ep.host, ep.port, [&s, &ep, timeout, done](beast::error_code rec,
                                                                   tcp::resolver::results_type results) {
    if (rec) return done(rec, "");
    beast::get_lowest_layer(s).expires_after(timeout);
    beast::get_lowest_layer(s).async_connect(results, [&s, &ep, timeout, done](beast::error_code cec,
                                                                               const tcp::endpoint&) {
      if (cec) return done(cec, "");
      // The default gateway on loopback: nothing goes to a port another user holds.
      if (std::string why = foreign_peer_error(ep, beast::get_lowest_layer(s).socket().native_handle()); !why.empty())
        return done(net::error::access_denied, why);
      tls::TlsStream* t = tls::tls_layer(s);
      if (!t) return done({}, "");
      std::string error;
      if (!tls::set_peer(*t, ep, error)) return done(net::error::invalid_argument, error);
      beast::get_lowest_layer(s).expires_after(timeout);
      t->async_handshake(ssl::stream_base::client, [t, &ep, timeout, done](beast::error_code hec) {
        done(hec, hec ? tls::handshake_message(ep, *t, hec, timeout) : "");
      });
    });
  });
}

// The same for a unix:// endpoint: connects to its socket path; `open_error` names the path.
inline void async_open(tls::UnixStream& s, tcp::resolver&, const Endpoint& ep, std::chrono::milliseconds timeout,
                std::function<void(beast::error_code, std::string)> done) {
  s.expires_after(timeout);
  s.async_connect(net::local::stream_protocol::endpoint(ep.socket_path),
                  [&ep, done](beast::error_code ec) { done(ec, ec ? unix_connect_message(ep, ec) : ""); });
}

inline void set_no_delay(beast::tcp_stream& s) {
  beast::error_code ignored;
  s.socket().set_option(tcp::no_delay(true), ignored);
}
inline void set_no_delay(tls::UnixStream&) {}

}  // namespace kgate::client
