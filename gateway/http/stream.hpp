// The byte streams a gateway connection runs over: plain TCP, TLS over TCP, or a Unix stream
// socket, as one std::variant for HTTP (read and written through http_io.hpp; deadlines set in
// generic lambdas handed to std::visit).  A websocket is made by moving the whole HTTP stream
// into a client::Websocket (TLS state included), whose Beast stream is compiled in src/client only.
#pragma once

#include <memory>
#include <variant>

#include "kgate/client/websocket.hpp"  // Beast's websocket stream itself is compiled in src/client only
#include "http/net.hpp"

#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>

namespace kgate::gw {

namespace ssl = net::ssl;
using local = net::local::stream_protocol;

using TcpStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;
using UnixStream = beast::basic_stream<local>;

// One accepted connection; the alternative says which listener it came from.
using Stream = std::variant<TcpStream, TlsStream, UnixStream>;
using client::Websocket;

// The websocket over `s` (moved in whole: buffers, timers and TLS state).
inline std::unique_ptr<Websocket> to_websocket(Stream&& s) {
  return std::visit([](auto&& next) { return Websocket::over(std::move(next)); }, std::move(s));
}

inline bool is_tls(const Stream& s) { return std::holds_alternative<TlsStream>(s); }
inline bool is_unix(const Stream& s) { return std::holds_alternative<UnixStream>(s); }

}  // namespace kgate::gw
