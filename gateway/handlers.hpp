// The contract between the route table and the handlers: the Call a handler gets, and every
// handler the table names (routes.cpp), each defined beside what it serves (api/: the Jupyter
// API and the kgate extensions; ws/: the websockets).  A handler uses the daemon through
// Call::services (services.hpp), never through the Server.
//
// Threading: every handler runs on the gateway's Asio thread.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "http/auth.hpp"
#include "http/request.hpp"
#include "http/stream.hpp"
#include "services.hpp"

namespace kgate::gw {

// One request on its way to its handler.  It lives only for the handler's call: a handler that
// answers later takes what it needs (respond, the request's version and keep-alive) by value,
// never a reference to the Call or to its request.
struct Call {
  Services& services;               // what a handler may use of the daemon (services.hpp)
  Request& req;                      // a websocket handler may move it into its session
  const RequestContext& ctx;
  std::string path;                  // percent-decoded, relative to base_url, with a leading '/'
  std::string query;                 // as sent (query_param decodes)
  std::vector<std::string> params;   // the pattern's {name} segments, in order
  Respond respond;                   // exactly once
  std::function<Stream()> take_stream;  // websocket routes only: the connection, handed over whole
  // An answer in parts instead of `respond` (request.hpp); null for HTTP/1.0, HEAD and upgrades.
  RespondInParts respond_in_parts;

  const std::string& param(std::size_t i) const { return params.at(i); }
};
using Handler = void (*)(Call&);

// ---- The handlers the table names ----

// api.cpp: the Jupyter server API.
void api_root(Call&);              // GET /api: version, and the kgate extension's features
void api_status(Call&);            // GET /api/status
void kernels_list(Call&);          // GET /api/kernels
void kernels_start(Call&);         // POST /api/kernels
void kernel_get(Call&);            // GET /api/kernels/{kernel_id}
void kernel_delete(Call&);         // DELETE /api/kernels/{kernel_id}
void kernel_interrupt(Call&);      // POST .../interrupt
void kernel_restart(Call&);        // POST .../restart
void kernelspecs_list(Call&);      // GET /api/kernelspecs
void kernelspec_get(Call&);        // GET /api/kernelspecs/{name}
void kernelspec_resource(Call&);   // GET /kernelspecs/{name}/{file*}: a logo, kernel.js, ...
void root_redirect(Call&);         // GET /: to the observe page
void observe(Call&);               // GET /observe: the observe page

// mcp_http.cpp: MCP over Streamable HTTP (mcp_http.hpp).
void mcp_post(Call&);              // POST /mcp: one JSON-RPC message
void mcp_delete(Call&);            // DELETE /mcp: ends the session named by Mcp-Session-Id

// metrics.cpp.
void metrics_page(Call&);          // GET /metrics: Prometheus text format

// sessions_api.cpp: the sessions API (sessions.hpp).
void sessions_list(Call&);         // GET /api/sessions
void session_create(Call&);        // POST /api/sessions
void session_get(Call&);           // GET /api/sessions/{session_id}
void session_patch(Call&);         // PATCH /api/sessions/{session_id}: path, name, type, kernel
void session_delete(Call&);        // DELETE /api/sessions/{session_id}

// ws_session.cpp and agent_session.cpp: the websockets.
void kernel_channels(Call&);       // /api/kernels/{kernel_id}/channels
void agent_socket(Call&);          // /api/kgate/agent?agent=ID: an agent's liveness

// discovery_api.cpp and jobs_api.cpp: the kgate extensions (README "Session records").
void kgate_kernelspecs(Call&);     // GET /api/kgate/kernelspecs: the whole catalog, with reasons
void kgate_pool(Call&);            // GET /api/kgate/pool
void kgate_launchers(Call&);       // GET /api/kgate/launchers
void jobs_list(Call&);             // GET /api/kgate/jobs
void job_get(Call&);               // GET /api/kgate/jobs/{job}
void job_interrupt(Call&);         // POST /api/kgate/jobs/{job}/interrupt
void job_input(Call&);             // POST /api/kgate/jobs/{job}/input: the answer to its input()
void kgate_kernels_list(Call&);    // GET /api/kgate/kernels
void kgate_kernel_get(Call&);      // GET /api/kgate/kernels/{kernel_id}
void kgate_kernel_keep(Call&);     // POST /api/kgate/kernels/{kernel_id}/keep
void kgate_execute(Call&);         // POST /api/kgate/kernels/{kernel_id}/execute
void kgate_restart(Call&);         // POST /api/kgate/kernels/{kernel_id}/restart
void kgate_digest(Call&);          // GET /api/kgate/kernels/{kernel_id}/digest
void kgate_digest_ack(Call&);      // POST /api/kgate/kernels/{kernel_id}/digest/ack
void kgate_notebook(Call&);        // GET /api/kgate/kernels/{kernel_id}/notebook

}  // namespace kgate::gw
