// Websocket over a Unix stream socket: Beast's websocket::stream<basic_stream<local>>, compiled here only.
#include "websocket_ops.hpp"

namespace kgate::client {

template class WebsocketOver<Websocket::Unix>;

std::unique_ptr<Websocket> Websocket::over(Unix&& s) {
  return std::make_unique<WebsocketOver<Unix>>(nullptr, std::move(s));
}

std::unique_ptr<Websocket> unix_client(net::io_context& ioc) {
  return std::make_unique<WebsocketOver<Websocket::Unix>>(nullptr, ioc);
}

}  // namespace kgate::client
