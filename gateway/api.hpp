// The REST surface: /api, /api/status, /api/kernels..., /api/kernelspecs..., /kernelspecs/...
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "kgate/kernel.hpp"
#include "net.hpp"

namespace kgate::gw {

class Server;

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;
using Respond = std::function<void(Response)>;

struct RequestContext {
  bool peer_loopback = false;  // the client connected from a loopback address (or the Unix socket)
  bool unix_socket = false;    // the client connected to the Unix socket
};

// A JSON error in jupyter_server's shape: {"message": ..., "reason": ...}.
Response json_error(const Request& req, http::status status, const std::string& message);
Response json_response(const Request& req, http::status status, const std::string& body);

// Checks Host, Origin and the token.  Returns an error response, or nothing when allowed.
// The Host check applies on a loopback bind and on the Unix socket (both local listeners).
std::optional<Response> check_request(const Server& server, const Request& req, const RequestContext& ctx = {});

// Handles one (already checked, non-upgrade) request; calls `respond` exactly once, maybe
// later (POST /api/kernels waits for the kernel to be ready).
void handle_api(Server& server, const Request& req, const RequestContext& ctx, Respond respond);

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

// Whether `s` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool valid_utf8(std::string_view s) noexcept;
// Splits a target into its path (percent-decoded) and query; false if a %-escape is bad or the
// path, or any query key or value, does not decode to UTF-8.
bool split_target(std::string_view target, std::string& path, std::string& query);
// The value of `key` in a query string ("" if absent).
std::string query_param(std::string_view query, std::string_view key);

}  // namespace kgate::gw
