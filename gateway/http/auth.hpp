// Who may be served: the Host, Origin and token checks every request passes first, and CORS
// for the origins in allow_origins.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "http/request.hpp"
#include "options.hpp"

namespace kgate::gw {

// Checks Host, Origin and the token.  Returns the response to send instead of serving the
// request (a refusal, or the answer to a CORS preflight: cors_preflight), or nothing when allowed.
// The Host check applies on a loopback bind and on the Unix socket (both local listeners).
std::optional<Response> check_request(const GatewayOptions& opts, const Request& req, const RequestContext& ctx = {});

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

}  // namespace kgate::gw
