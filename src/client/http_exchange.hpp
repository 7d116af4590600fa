// One request and its response on a connection of HttpClient, connecting it first when it is
// not: a function per transport, so that Beast's HTTP and TLS state machines are compiled once
// each, in http_exchange.cpp (TCP, Unix socket) and http_exchange_tls.cpp
// (their definition is in http_exchange_ops.hpp).  Private to src/client.
#pragma once

#include <boost/beast/http/parser.hpp>

#include "connect.hpp"

namespace kgate::client {

struct Exchange {
  const Endpoint& ep;
  const http::request<http::string_body>& req;
  http::response_parser<http::string_body>& parser;
  beast::flat_buffer& buffer;
  std::chrono::milliseconds timeout;          // the request's; the exchange's deadline is 5 s more
  std::chrono::milliseconds connect_timeout;  // per connect step
  bool& connected;                            // in: the connection is open; out: it was opened
  // Out:
  beast::error_code ec;
  std::size_t response_bytes = 0;
  std::string open_error;  // a failed TLS handshake or Unix connect, named
};

// Starts the exchange; the caller runs the io_context.  `resolver` outlives the run.
void start_exchange(beast::tcp_stream& s, tcp::resolver& resolver, Exchange& x);
void start_exchange(tls::TlsStream& s, tcp::resolver& resolver, Exchange& x);
void start_exchange(tls::UnixStream& s, tcp::resolver& resolver, Exchange& x);

}  // namespace kgate::client
