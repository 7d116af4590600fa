// Websocket over plain TCP: Beast's websocket::stream<tcp_stream>, compiled here only.
#include "websocket_ops.hpp"

namespace kgate::client {

template class WebsocketOver<Websocket::Tcp>;

std::unique_ptr<Websocket> Websocket::over(Tcp&& s) {
  return std::make_unique<WebsocketOver<Tcp>>(nullptr, std::move(s));
}

std::unique_ptr<Websocket> tcp_client(net::io_context& ioc) {
  return std::make_unique<WebsocketOver<Websocket::Tcp>>(nullptr, ioc);
}

}  // namespace kgate::client
