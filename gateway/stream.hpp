// The byte streams a gateway connection runs over: plain TCP, TLS over TCP, or a Unix stream
// socket, as one std::variant each for HTTP and for websockets.  The sessions write their I/O
// once, in generic lambdas handed to std::visit; a websocket is made by moving the whole HTTP
// stream into it (TLS state included).
#pragma once

#include <variant>

#include "net.hpp"  // first: it includes Beast's websocket headers the gateway's way

#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket/ssl.hpp>

namespace kgate::gw {

namespace ssl = net::ssl;
using local = net::local::stream_protocol;

using TcpStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;
using UnixStream = beast::basic_stream<local>;

// One accepted connection; the alternative says which listener it came from.
using Stream = std::variant<TcpStream, TlsStream, UnixStream>;
using Websocket =
    std::variant<websocket::stream<TcpStream>, websocket::stream<TlsStream>, websocket::stream<UnixStream>>;

// The websocket over `s` (moved in whole: buffers, timers and TLS state).
inline Websocket to_websocket(Stream&& s) {
  return std::visit(
      [](auto&& next) -> Websocket {
        using Next = std::decay_t<decltype(next)>;
        return Websocket(std::in_place_type<websocket::stream<Next>>, std::move(next));
      },
      std::move(s));
}

inline bool is_tls(const Stream& s) { return std::holds_alternative<TlsStream>(s); }
inline bool is_unix(const Stream& s) { return std::holds_alternative<UnixStream>(s); }

}  // namespace kgate::gw
