// One request and its response on a connection of HttpClient, connecting it first when it is
// not: a function per transport, so that Beast's HTTP and TLS state machines are compiled once
// each, in http_exchange.cpp (TCP, Unix socket) and http_exchange_tls.cpp.  Private to src/client.
#pragma once

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

// The definition behind the three, for the units that compile them.
template <class S>
void start_exchange_on(S& s, tcp::resolver& resolver, Exchange& x) {
  auto exchange = [&s, &x] {
    beast::get_lowest_layer(s).expires_after(x.timeout + std::chrono::seconds(5));
    http::async_write(s, x.req, [&s, &x](beast::error_code wec, std::size_t) {
      if (wec) {
        x.ec = wec;
        return;
      }
      http::async_read(s, x.buffer, x.parser, [&x](beast::error_code rec, std::size_t n) {
        x.ec = rec;
        x.response_bytes = n;
      });
    });
  };
  if (x.connected) return exchange();
  async_open(s, resolver, x.ep, x.connect_timeout, [&s, &x, exchange](beast::error_code oec, std::string oerr) {
    if (oec) {
      x.ec = oec;
      x.open_error = std::move(oerr);
      return;
    }
    x.connected = true;
    set_no_delay(beast::get_lowest_layer(s));
    exchange();
  });
}

}  // namespace kgate::client
