// The agent's liveness connection (see agent_session.hpp).
#include "ws/agent_session.hpp"

#include <spdlog/spdlog.h>

#include "kgate/version.hpp"
#include "handlers.hpp"
#include "services.hpp"

namespace kgate::gw {

namespace {
constexpr std::size_t kMaxAgentMessage = 64 << 10;  // the agent has nothing to say but pings
}

AgentSession::AgentSession(Stream stream, Services& server, AgentRef agent)
    : ws_(to_websocket(std::move(stream))), server_(server), agent_(std::move(agent)) {}

void AgentSession::run(http::request<http::string_body> req) {
  ws_->expires_never();
  ws_->set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
  ws_->set_option(websocket::stream_base::decorator(
      [](websocket::response_type& res) { res.set(http::field::server, kgate::server_header()); }));
  ws_->read_message_max(kMaxAgentMessage);
  ws_->async_accept(req, beast::bind_front_handler(&AgentSession::on_accept, shared_from_this()));
}

void AgentSession::on_accept(beast::error_code ec) {
  if (ec) {
    spdlog::info("agent {}: websocket handshake failed: {}", agent_.agent, ec.message());
    return;
  }
  connected_ = true;
  server_.jobs().agent_connected(agent_);
  spdlog::info("agent {} connected{}", agent_.agent, agent_.label.empty() ? "" : " (" + agent_.label + ")");
  hello_ = json{{"type", "hello"},
                {"agent", agent_.agent},
                {"claim_grace_seconds", server_.jobs().limits().claim_grace.count() / 1000.0}}
               .dump();
  ws_->text(true);
  ws_->async_write(net::buffer(hello_), [self = shared_from_this()](beast::error_code, std::size_t) {});
  do_read();
}

void AgentSession::do_read() {
  ws_->async_read(rbuf_, beast::bind_front_handler(&AgentSession::on_read, shared_from_this()));
}

void AgentSession::on_read(beast::error_code ec, std::size_t) {
  if (!ec) {
    rbuf_.clear();  // nothing the agent sends is needed: it only keeps the connection
    server_.jobs().touch_agent(agent_);
    return do_read();
  }
  auto code = ws_->reason().code;
  bool clean = ec == websocket::error::closed && code == websocket::close_code::normal;
  if (connected_) {
    connected_ = false;
    server_.jobs().agent_disconnected(agent_.agent, clean);
    spdlog::info("agent {} {}", agent_.agent,
                 clean ? "exited (closed its connection)" : "dropped its connection (" + ec.message() + ")");
    // On this machine a link dropped without a close frame means kgate-mcp's process is gone
    // (kill -9, a crash): its foreground cells are stopped now, not run to their end for nobody.
    // Over a network a drop may be the network: they run on through the claim grace. (A clean
    // close is kgate-mcp's own end, or a stateless call's: it stops what it means to.)
    if (local_ && !clean)
      for (const auto& job : server_.jobs().agent_process_gone(agent_.agent))
        server_.interrupt_as_agent(job, agent_.agent, "its agent's connection dropped (kgate-mcp is gone)");
  }
}

// The route (routes.hpp): ?agent=ID (required) and ?label=, each at most 256 bytes.
void agent_socket(Call& c) {
  std::string agent = query_param(c.query, "agent");
  std::string label = query_param(c.query, "label");
  if (agent.empty() || agent.size() > 256 || label.size() > 256)
    return c.respond(json_error(c.req, http::status::bad_request, "agent=ID is required (at most 256 bytes; label too)"));
  const bool on_this_host = c.ctx.peer_loopback;  // read before the stream is taken
  auto s = std::make_shared<AgentSession>(c.take_stream(), c.services, AgentRef{agent, label});
  s->hold_place(c.ctx.connection);
  s->set_local(on_this_host);
  s->run(std::move(c.req));
}

}  // namespace kgate::gw
