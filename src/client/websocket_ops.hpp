// The operations of WebsocketOver<Next> (websocket_impl.hpp).  Included only by the units that
// compile them, each for its transports: no other unit instantiates Beast's websocket state
// machines.
#pragma once

#include "kgate/client/gateways_toml.hpp"
#include "websocket_impl.hpp"

namespace kgate::client {

// Opens a websocket to `target` on `ep`: the transport (async_open, `timeout` per step), then
// the handshake with kgate's User-Agent, the token and, when not empty, `subprotocol`.  Then
// done(ec, open_error, protocol): `open_error` names a failed TLS handshake or Unix connect,
// `protocol` is the subprotocol the server chose.  The caller sets the stream's options
// (read_message_max, timeouts) and runs the io_context.
template <class Ws>
void async_open_websocket(Ws& ws, tcp::resolver& resolver, const Endpoint& ep, std::string target,
                          std::string subprotocol, std::chrono::milliseconds timeout,
                          std::function<void(beast::error_code, std::string, std::string)> done) {
  async_open(ws.next_layer().next_layer(), resolver, ep, timeout,
             [&ws, &ep, target = std::move(target), subprotocol = std::move(subprotocol),
              done](beast::error_code oec, std::string open_error) mutable {
               if (oec) return done(oec, std::move(open_error), "");
               set_no_delay(beast::get_lowest_layer(ws));
               ws.set_option(websocket::stream_base::decorator([&ep, subprotocol](websocket::request_type& r) {
                 r.set(http::field::user_agent, user_agent());
                 if (!subprotocol.empty()) r.set(http::field::sec_websocket_protocol, subprotocol);
                 if (const std::string token = send_token(ep); !token.empty())
                   r.set(http::field::authorization, "token " + token);
               }));
               auto res = std::make_shared<websocket::response_type>();
               ws.async_handshake(*res, ep.host_header(), target, [&ws, res, done](beast::error_code hec) {
                 if (hec) return done(hec, "", "");
                 beast::get_lowest_layer(ws).expires_never();
                 done({}, "", std::string((*res)[http::field::sec_websocket_protocol]));
               });
             });
}

template <class Next>
void WebsocketOver<Next>::async_read(beast::flat_buffer& buf, IoHandler done) {
  ws_.async_read(buf, std::move(done));
}

template <class Next>
void WebsocketOver<Next>::async_write(Buffers data, IoHandler done) {
  ws_.async_write(std::move(data), std::move(done));
}

template <class Next>
void WebsocketOver<Next>::async_close(const websocket::close_reason& why, Handler done) {
  ws_.async_close(why, std::move(done));
}

template <class Next>
void WebsocketOver<Next>::async_accept(const http::request<http::string_body>& req, Handler done) {
  ws_.async_accept(req, std::move(done));
}

template <class Next>
void WebsocketOver<Next>::async_open(tcp::resolver& resolver, const Endpoint& ep, std::string target,
                                     std::string subprotocol, std::chrono::milliseconds timeout, OpenHandler done) {
  async_open_websocket(ws_, resolver, ep, std::move(target), std::move(subprotocol), timeout, std::move(done));
}

}  // namespace kgate::client
