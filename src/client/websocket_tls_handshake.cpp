// Websocket over TLS over TCP: the opening and closing handshakes, server and client side.
#include "websocket_ops.hpp"

namespace kgate::client {

template void WebsocketOver<Websocket::Tls>::async_accept(const http::request<http::string_body>&, Handler);
template void WebsocketOver<Websocket::Tls>::async_open(tcp::resolver&, const Endpoint&, std::string, std::string,
                                                        std::chrono::milliseconds, OpenHandler);
template void WebsocketOver<Websocket::Tls>::async_close(const websocket::close_reason&, Handler);

}  // namespace kgate::client
