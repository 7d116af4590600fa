// kgate's own MCP server: the tools of kgate-mcp over Streamable HTTP at {base}mcp, for an MCP
// client on another machine, or one that prefers a URL to a process (README "MCP over HTTP").
// One implementation with kgate-mcp (kgate_mcp: McpSession, Translator); only the transport is
// here.
//
// - POST {base}mcp carries one JSON-RPC message. `initialize` opens a session: its reply has an
//   Mcp-Session-Id, which every later request of the session carries. A request is answered
//   with its JSON-RPC reply (application/json); a notification or a response with 202. A
//   tools/call whose POST accepts text/event-stream is answered with an event stream when it
//   has something to send before its reply: progress, or input() asked of the user through
//   elicitation/create (whose answer the client POSTs as a JSON-RPC response).
// - DELETE {base}mcp with the session's id ends it; GET is 405 (no server-initiated stream).
// - Each session has its own Translator, so its own current-kernel pointer and its own agent
//   id, as a kgate-mcp process has. The Translator reaches this kgate as a client would (over
//   loopback or the Unix socket), with kgate's token.
// - A session ends when it is deleted, when kgate stops, or when nothing was asked of it for
//   kIdleTimeout: its calls are cancelled, its auto kernel stopped, its claims freed.
//
// Threading: post/del and the reaper run on the Asio thread. McpSession::handle runs there too
// (it never blocks: tools/call runs on a thread of its own); McpSession::close, which may wait
// for calls and stops the auto kernel through this kgate's own API, runs on a thread of its own.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kgate/jupyter/wire.hpp"
#include "http/net.hpp"

namespace kgate::mcp {
class McpSession;
class Translator;
}  // namespace kgate::mcp

namespace kgate::gw {

class Services;
struct Call;

class McpHttp {
 public:
  // At most this many sessions at once: an initialize past it is refused (503).
  static constexpr std::size_t kMaxSessions = 1000;
  // A session with no request and no call in flight for this long ends.
  static constexpr std::chrono::minutes kIdleTimeout{60};

  explicit McpHttp(Services& server);
  ~McpHttp();

  void post(Call& c);
  void del(Call& c);
  // kgate stops: every session ends (on threads of their own; not waited for).
  void close_all();
  std::size_t size() const { return sessions_.size(); }

 private:
  struct Pending;
  struct Entry {
    std::shared_ptr<mcp::Translator> translator;
    std::shared_ptr<mcp::McpSession> session;
    std::chrono::steady_clock::time_point last_used;
    std::vector<std::weak_ptr<Pending>> pending;  // POSTs still waiting for their reply
  };

  void reap();
  // A 2026-07-28 request without a session: served by a session of its own, ended once answered.
  void stateless(Call& c, const json& msg, bool request);
  void end(const std::string& id, const std::string& why);
  void end_task_session(const std::string& task, const std::string& why);

  Services& server_;
  std::map<std::string, Entry> sessions_;
  // Stateless requests whose tools/call became a task (the 2026-07-28 tasks extension): their
  // session lives on, by task id, for the tasks/get, tasks/update and tasks/cancel that name the
  // task, until it has been idle for kIdleTimeout with nothing in flight.
  std::map<std::string, Entry> task_sessions_;
  net::steady_timer reaper_;
};

}  // namespace kgate::gw
