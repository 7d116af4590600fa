// The REST surface: /api, /api/status, /api/kernels..., /api/kernelspecs..., /kernelspecs/...
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kgate/discovery/discovery.hpp"
#include "kgate/kernel/kernel.hpp"
#include "http/net.hpp"
#include "options.hpp"

namespace kgate::gw {

class Server;

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;
using Respond = std::function<void(Response)>;

// The body of a response sent in parts as they come (chunked transfer coding): an event stream.
// Call it on the Asio thread only; the parts go out in order, and end() sends the last chunk
// (the connection then serves the next request). Dropped without end(), the connection closes
// and the client sees the body cut short.
class PartsWriter {
 public:
  virtual ~PartsWriter() = default;
  virtual void send(std::string part) = 0;
  virtual void end() = 0;
  // `fn` runs (once, on the Asio thread) if the client goes away before the end: a write of a
  // part failed, or the client left too much unread. Call on the Asio thread.
  virtual void on_gone(std::function<void()> fn) = 0;
};
// Starts a response in parts: `head` (its status and headers; chunked is set, its body ignored)
// goes out at once. Offered for HTTP/1.1 requests other than HEAD, as an alternative to Respond:
// a request is answered with one or the other, exactly once.
using RespondInParts = std::function<std::shared_ptr<PartsWriter>(Response head)>;

struct RequestContext {
  bool peer_loopback = false;  // the client connected from a loopback address (or the Unix socket)
  bool unix_socket = false;    // the client connected to the Unix socket
};

// A JSON error in jupyter_server's shape: {"message": ..., "reason": ...}.
Response json_error(const Request& req, http::status status, const std::string& message);
// 405 with an Allow header listing `allow` ("GET", "GET, POST").
Response method_not_allowed(const Request& req, const char* allow);
Response json_response(const Request& req, http::status status, const std::string& body);

// Checks Host, Origin and the token.  Returns the response to send instead of serving the
// request (a refusal, or the answer to a CORS preflight: cors_preflight), or nothing when allowed.
// The Host check applies on a loopback bind and on the Unix socket (both local listeners).
std::optional<Response> check_request(const Server& server, const Request& req, const RequestContext& ctx = {});

// CORS for the origins in allow_origins (README "Browser clients").  An entry matches an Origin
// exactly (ASCII case-insensitively; a trailing "/" on the entry is ignored); "*" matches any.
enum class OriginListing { none, exact, any };
OriginListing origin_listing(const GatewayOptions& opts, std::string_view origin);
// Whether `req` is a CORS preflight: OPTIONS with Origin and Access-Control-Request-Method.
bool is_cors_preflight(const Request& req);
// The answer to a preflight, without auth: 204 with the Access-Control-Allow-* headers for a listed
// origin, 403 (no CORS headers) for any other.
Response cors_preflight(const GatewayOptions& opts, const Request& req);
// The CORS headers of an actual response to a request from `origin` ("" = none): for a listed
// origin Access-Control-Allow-Origin (the origin itself, with Allow-Credentials; "*" without, for
// the "*" entry), Expose-Headers and Vary: Origin; nothing for an unlisted one.
void add_cors_headers(const GatewayOptions& opts, std::string_view origin, Response& res);

// A dashed UUID: 8-4-4-4-12 hex digits (either case).  POST /api/kernels's "kernel_id".
bool is_uuid(std::string_view s);

// The file GET /kernelspecs/{name}/{rel} serves: `rel` ('/'-separated, already percent-decoded)
// inside the kernelspec's directory `dir`, as a real path that is a regular file inside dir's
// real path (no "..", ".", absolute paths, NUL, or symlinks leading out).  nullopt otherwise.
std::optional<std::filesystem::path> kernelspec_file(const std::filesystem::path& dir, std::string_view rel);
// The Content-Type of a kernelspec file, by its extension; application/octet-stream otherwise.
std::string kernelspec_content_type(std::string_view file);

// When default_kernel does not name a launchable kernelspec of `cat`: the warning to log (it
// names the setting, what kgate uses instead and the kernelspecs there are).  "" when it does.
std::string default_kernel_warning(const Catalog& cat, const std::string& default_kernel);

// Handles one (already checked, non-upgrade) request through the route table (routes.hpp);
// calls `respond` exactly once, maybe later (POST /api/kernels waits for the kernel).
void handle_api(Server& server, Request& req, const RequestContext& ctx, Respond respond);

// Starts a kernel exactly as POST /api/kernels with `body` from a loopback client would (the
// env policy of a loopback client applies); `respond` gets that POST's answer (201, 202 or an
// error).  The sessions API starts its kernels with it.
void start_kernel_as_post(Server& server, const json& body, unsigned version, Respond respond);
// What a request's answer needs once the handler has returned (a wait, a kernel start): its
// HTTP version and keep-alive, and where to send it. Errors in jupyter_server's shape, with
// `extra` fields beside message and reason.
struct Replier {
  unsigned version;
  bool keep_alive;
  Respond respond;
  Request shape() const;
  void ok(const json& body, http::status st = http::status::ok) const;
  void error(http::status st, const std::string& msg, json extra = json::object()) const;
};
Replier replier(const Request& req, Respond respond);

// Interrupts `job`, as its `agent`, because its input() waited past its input_timeout
// (JobStore::sweep noted why); the outcome is logged.  On the Asio thread (jobs_api.cpp).
void interrupt_unanswered(Server& server, const std::string& job, const std::string& agent);

// The kernel model in jupyter_server's shape.
json kernel_model_json(const KernelModel& m);
// DELETE / interrupt / restart of a kernel; replies like jupyter_server.  `gated`: the caller
// already checked the claim (the kgate restart); else a restart clears it (a person's).
void kernel_action(Server& server, const Request& req, const std::string& id, const std::string& action,
                   Respond respond, bool gated = false);

// ASCII lowercase (host names, kernelspec names).
std::string lowercase(std::string_view s);
// Whether a bind address is loopback ("localhost", "::1", 127.0.0.0/8).
bool is_loopback_address(const std::string& ip);

// A path's segments, split at '/' (empty ones dropped).
std::vector<std::string> split_path(std::string_view path);
// Splits a target into its path (percent-decoded) and query; false if a %-escape is bad or the
// path, or any query key or value, does not decode to UTF-8.
bool split_target(std::string_view target, std::string& path, std::string& query);
// The value of `key` in a query string ("" if absent).
std::string query_param(std::string_view query, std::string_view key);
// The token a request presents, "" for none, read in jupyter_server's order for every route
// (REST, websockets, the observe page, the agent socket): the target's `token` argument first
// (the last one when repeated, whitespace stripped); only when it is absent or empty, an
// `Authorization` header `token T` or `bearer T`, the scheme in any case, then any whitespace.
std::string request_token(std::string_view target, std::string_view authorization);

}  // namespace kgate::gw
