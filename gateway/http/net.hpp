// The one place gateway code includes Asio and Beast from, with the short aliases it uses.
#pragma once

// Not <boost/asio.hpp>, which parses all of Asio (coroutines, serial ports, ...) into every unit:
// the parts the gateway uses.  A unit that needs more includes it itself.
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

namespace kgate::gw {
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = net::ip::tcp;
}  // namespace kgate::gw
