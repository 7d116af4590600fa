// The one place gateway code includes Asio and Beast from, with the short aliases it uses.
#pragma once

#include <utility>  // Boost 1.74 asio/awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "kgate/client/websocket.hpp"  // Beast's websocket stream itself is compiled in src/client only

namespace kgate::gw {
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = net::ip::tcp;
}  // namespace kgate::gw
