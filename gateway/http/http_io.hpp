// Reading a request and writing a response on any of the gateway's streams (stream.hpp), as
// functions that are not templates: Beast's HTTP parser and serializer are compiled once per
// transport, in http_read.cpp and http_write.cpp, not in every unit that serves HTTP.
#pragma once

#include <functional>

#include "http/stream.hpp"

#include <boost/beast/http/parser.hpp>

namespace kgate::gw {

using IoHandler = std::function<void(beast::error_code, std::size_t)>;

// http::async_read_header / http::async_read / http::async_write over `s`; the caller sets the
// deadline.  async_read_request after async_read_header on the same parser reads the body.
void async_read_header(Stream& s, beast::flat_buffer& buf, http::request_parser<http::string_body>& parser,
                       IoHandler done);
void async_read_request(Stream& s, beast::flat_buffer& buf, http::request_parser<http::string_body>& parser,
                        IoHandler done);
void async_write_response(Stream& s, const http::response<http::string_body>& res, IoHandler done);
// A response sent in parts (chunked transfer coding): its header (`res` has chunked() set; its
// body is not sent), then each part as one chunk; `last` adds the last chunk after `data` (which
// may then be empty). `data` must outlive the write.
// "HTTP/1.1 100 Continue": the answer to `Expect: 100-continue` once the header passed its checks.
void async_write_continue(Stream& s, IoHandler done);
void async_write_head(Stream& s, const http::response<http::string_body>& res, IoHandler done);
void async_write_chunk(Stream& s, const std::string& data, bool last, IoHandler done);

}  // namespace kgate::gw
