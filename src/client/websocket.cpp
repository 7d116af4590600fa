// Websocket: what is not a state machine of Beast's.  The factories (TLS over TCP's here: its
// operations are compiled in websocket_tls_io.cpp and websocket_tls_handshake.cpp, each about half
// of what one unit took, 90 s), and the blocking open every client uses.
#include "websocket_impl.hpp"

namespace kgate::client {

std::unique_ptr<Websocket> Websocket::over(Tls&& s) {
  return std::make_unique<WebsocketOver<Tls>>(nullptr, std::move(s));
}

std::unique_ptr<Websocket> tls_client(std::shared_ptr<ssl::context> tls, net::io_context& ioc) {
  auto& ctx = *tls;
  return std::make_unique<WebsocketOver<Websocket::Tls>>(std::move(tls), ioc, ctx);
}

std::unique_ptr<Websocket> Websocket::client(const Endpoint& ep, std::shared_ptr<ssl::context> tls,
                                             net::io_context& ioc) {
  if (ep.is_unix()) return unix_client(ioc);
  if (tls) return tls_client(std::move(tls), ioc);
  return tcp_client(ioc);
}

std::string Websocket::open(net::io_context& ioc, const Endpoint& ep, const std::string& target,
                            const std::string& subprotocol, std::chrono::milliseconds timeout, error_code& ec,
                            std::string* protocol) {
  tcp::resolver resolver(ioc);
  std::string why;
  ec = net::error::operation_aborted;  // until the handshake says otherwise (ioc stopped early)
  async_open(resolver, ep, target, subprotocol, timeout,
             [&](error_code oec, std::string open_error, std::string chosen) {
               ec = oec;
               why = oec ? (open_error.empty() ? oec.message() : std::move(open_error)) : "";
               if (protocol) *protocol = std::move(chosen);
             });
  ioc.run();
  ioc.restart();
  if (ec && why.empty()) why = ec.message();
  if (!ec) set_option(websocket::stream_base::timeout::suggested(beast::role_type::client));
  return why;
}

}  // namespace kgate::client
