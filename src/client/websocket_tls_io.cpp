// Websocket over TLS over TCP: reading and writing messages.
#include "websocket_ops.hpp"

namespace kgate::client {

template void WebsocketOver<Websocket::Tls>::async_read(beast::flat_buffer&, IoHandler);
template void WebsocketOver<Websocket::Tls>::async_write(Buffers, IoHandler);

}  // namespace kgate::client
