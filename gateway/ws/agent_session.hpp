// The agent's liveness connection: GET {base}api/kgate/agent?agent=A&label=L (websocket).
//
// kgate-mcp holds it open while it has a current kernel; the claim of an agent lasts while it
// is open, and for claim_grace after it dropped without a close frame.  A close with code 1000
// means the agent exited: its claim is free at once.  Lives on the Asio thread.
#pragma once

#include <memory>
#include <string>

#include "kgate/records/jobs.hpp"
#include "http/stream.hpp"

namespace kgate::gw {

class Services;

class AgentSession : public std::enable_shared_from_this<AgentSession> {
 public:
  AgentSession(Stream stream, Services& server, AgentRef agent);
  void run(http::request<http::string_body> req);

  // The connection's place among those kgate holds (RequestContext::connection), kept with it.
  void hold_place(std::shared_ptr<void> place) { connection_ = std::move(place); }
  // The agent is on this machine (a loopback or Unix connection): a drop means it is gone.
  void set_local(bool on_this_host) { local_ = on_this_host; }

 private:
  void on_accept(beast::error_code ec);
  void do_read();
  void on_read(beast::error_code ec, std::size_t n);

  std::unique_ptr<Websocket> ws_;  // over TCP, TLS or the Unix socket
  Services& server_;
  std::shared_ptr<void> connection_;
  bool local_ = false;  // the connection's place (http/connection_gate.hpp), held with it
  AgentRef agent_;
  beast::flat_buffer rbuf_;
  std::string hello_;
  bool connected_ = false;
};

}  // namespace kgate::gw
