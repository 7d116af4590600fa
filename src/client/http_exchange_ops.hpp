// start_exchange's definition (http_exchange.hpp), for the two units that compile it:
// http_exchange.cpp and http_exchange_tls.cpp.  Private to src/client.
#pragma once

#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include "http_exchange.hpp"

namespace kgate::client {

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
