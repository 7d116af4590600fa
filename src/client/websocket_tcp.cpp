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

std::unique_ptr<Websocket> Websocket::client(const Endpoint& ep, std::shared_ptr<ssl::context> tls,
                                             net::io_context& ioc) {
  if (ep.is_unix()) return unix_client(ioc);
  if (tls) return tls_client(std::move(tls), ioc);
  return tcp_client(ioc);
}

}  // namespace kgate::client
