// async_write_response (http_io.hpp).  The response's bytes are laid out once, whatever the
// transport: Beast's serializer, run synchronously, writes the header (and, for a chunked body,
// the whole message with its framing) into a string; then one gathered net::async_write (header,
// body in place) per transport sends them.  Beast's own http::async_write composes the
// serializer with each stream's write operation, and cost ~28 s of compile for the three
// transports at -O2 (docs/dev/build-and-test.md); the bytes on the wire are the same.
#include <array>
#include <memory>
#include <string>

#include "http/http_io.hpp"

#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_range.hpp>
#include <boost/beast/core/buffers_cat.hpp>
#include <boost/beast/http/chunk_encode.hpp>
#include <boost/beast/http/serializer.hpp>

namespace kgate::gw {
namespace {

using Response = http::response<http::string_body>;

// The header's bytes as Beast writes them, or the whole message when `whole`.
std::string serialize(const Response& res, bool whole, beast::error_code& ec) {
  http::response_serializer<http::string_body> sr{res};
  sr.split(!whole);
  std::string out;
  while (!ec && !(whole ? sr.is_done() : sr.is_header_done())) {
    sr.next(ec, [&](beast::error_code&, const auto& buffers) {
      for (auto b : beast::buffers_range_ref(buffers)) out.append(static_cast<const char*>(b.data()), b.size());
      sr.consume(beast::buffer_bytes(buffers));
    });
  }
  return out;
}

// Sends `head`, then `body` (kept alive by the caller), on `s`; or reports the serializer's `ec`.
void send_serialized(Stream& s, const beast::error_code& ec, std::shared_ptr<std::string> head,
                     net::const_buffer body, IoHandler done) {
  std::visit(
      [&](auto& stream) {
        if (ec) {
          net::post(stream.get_executor(), [ec, done = std::move(done)] { done(ec, 0); });
          return;
        }
        std::array<net::const_buffer, 2> bytes{net::buffer(*head), body};
        net::async_write(stream, bytes, [head, done = std::move(done)](beast::error_code e, std::size_t n) {
          done(e, n);
        });
      },
      s);
}

}  // namespace

void async_write_response(Stream& s, const Response& res, IoHandler done) {
  beast::error_code ec;
  // A string body goes out as it is unless it is chunked; then the serializer frames it.
  const bool chunked = res.chunked();
  auto head = std::make_shared<std::string>(serialize(res, chunked, ec));
  send_serialized(s, ec, std::move(head), chunked ? net::const_buffer{} : net::buffer(res.body()), std::move(done));
}

void async_write_continue(Stream& s, IoHandler done) {
  static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
  send_serialized(s, {}, std::make_shared<std::string>(kContinue), net::const_buffer{}, std::move(done));
}

void async_write_head(Stream& s, const Response& res, IoHandler done) {
  beast::error_code ec;
  auto head = std::make_shared<std::string>(serialize(res, false, ec));
  send_serialized(s, ec, std::move(head), net::const_buffer{}, std::move(done));
}

void async_write_chunk(Stream& s, const std::string& data, bool last, IoHandler done) {
  std::visit(
      [&](auto& stream) {
        auto finish = [done = std::move(done)](beast::error_code e, std::size_t n) { done(e, n); };
        if (data.empty())  // a chunk of size 0 would end the body: only the last one may be empty
          return net::async_write(stream, http::make_chunk_last(), std::move(finish));
        auto chunk = http::make_chunk(net::buffer(data));
        if (last) return net::async_write(stream, beast::buffers_cat(chunk, http::make_chunk_last()), std::move(finish));
        net::async_write(stream, chunk, std::move(finish));
      },
      s);
}

}  // namespace kgate::gw
