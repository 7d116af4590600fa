// Websocket over TLS over TCP: the factories.  Its operations are compiled in
// websocket_tls_io.cpp (read, write) and websocket_tls_handshake.cpp (accept, open, close), each
// about half of what one unit took (90 s).
#include "websocket_impl.hpp"

namespace kgate::client {

std::unique_ptr<Websocket> Websocket::over(Tls&& s) {
  return std::make_unique<WebsocketOver<Tls>>(nullptr, std::move(s));
}

std::unique_ptr<Websocket> tls_client(std::shared_ptr<ssl::context> tls, net::io_context& ioc) {
  auto& ctx = *tls;
  return std::make_unique<WebsocketOver<Websocket::Tls>>(std::move(tls), ioc, ctx);
}

}  // namespace kgate::client
