// async_read_header, async_read_request (http_io.hpp): Beast's request parser over TCP, TLS and
// the Unix socket.
#include "http/http_io.hpp"

#include <boost/beast/http/read.hpp>

namespace kgate::gw {

void async_read_header(Stream& s, beast::flat_buffer& buf, http::request_parser<http::string_body>& parser,
                       IoHandler done) {
  std::visit([&](auto& stream) { http::async_read_header(stream, buf, parser, std::move(done)); }, s);
}

void async_read_request(Stream& s, beast::flat_buffer& buf, http::request_parser<http::string_body>& parser,
                        IoHandler done) {
  std::visit([&](auto& stream) { http::async_read(stream, buf, parser, std::move(done)); }, s);
}

}  // namespace kgate::gw
