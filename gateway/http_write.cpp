// async_write_response (http_io.hpp): Beast's response serializer over TCP, TLS and the Unix socket.
#include "http_io.hpp"

namespace kgate::gw {

void async_write_response(Stream& s, const http::response<http::string_body>& res, IoHandler done) {
  std::visit([&](auto& stream) { http::async_write(stream, res, std::move(done)); }, s);
}

}  // namespace kgate::gw
