// Host, Origin and token checks, and CORS (auth.hpp).
#include "http/auth.hpp"

#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <spdlog/spdlog.h>

#include "kgate/client/endpoint.hpp"
#include "kgate/version.hpp"

namespace kgate::gw {

using client::percent_decode;  // uriparser

namespace {

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// host[:port] -> host, lowercased, brackets kept for IPv6.
std::string host_only(std::string_view hostport) {
  std::string h = lowercase(hostport);
  if (!h.empty() && h[0] == '[') {
    auto e = h.find(']');
    return e == std::string::npos ? h : h.substr(0, e + 1);
  }
  auto colon = h.find(':');
  return colon == std::string::npos ? h : h.substr(0, colon);
}

// localhost, *.localhost (RFC 6761 keeps them on loopback), [::1] and 127.0.0.0/8 in
// dotted form.  "127.0.0.1.evil.example" is a DNS name, not an address: refused.
bool is_loopback_name(const std::string& host) {
  if (host == "localhost" || host == "[::1]") return true;
  if (host.size() > 10 && host.substr(host.size() - 10) == ".localhost") return true;
  in_addr a{};
  return ::inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

bool host_allowed(const std::vector<std::string>& allowed, const std::string& host) {
  for (const auto& h : allowed)
    if (lowercase(h) == host) return true;
  return false;
}

}  // namespace

OriginListing origin_listing(const GatewayOptions& opts, std::string_view origin) {
  if (origin.empty()) return OriginListing::none;
  const std::string o = lowercase(origin);
  OriginListing found = OriginListing::none;
  for (const auto& entry : opts.allow_origins) {
    if (entry == "*") {
      found = OriginListing::any;
      continue;
    }
    std::string e = lowercase(entry);
    if (!e.empty() && e.back() == '/') e.pop_back();
    if (e == o) return OriginListing::exact;
  }
  return found;
}

bool is_cors_preflight(const Request& req) {
  return req.method() == http::verb::options && req.find(http::field::origin) != req.end() &&
         req.find(http::field::access_control_request_method) != req.end();
}

namespace {
constexpr const char* kCorsMethods = "GET, HEAD, POST, PATCH, DELETE, OPTIONS";
constexpr const char* kCorsHeaders = "Authorization, Content-Type, X-XSRFToken, X-Requested-With, Accept";
constexpr const char* kCorsExpose = "Location, Retry-After, Mcp-Session-Id";
constexpr int kCorsMaxAgeSeconds = 7200;  // Chromium's cap
}  // namespace

void add_cors_headers(const GatewayOptions& opts, std::string_view origin, Response& res) {
  const OriginListing l = origin_listing(opts, origin);
  if (l == OriginListing::none) return;
  if (l == OriginListing::exact) {
    res.set(http::field::access_control_allow_origin, origin);
    res.set(http::field::access_control_allow_credentials, "true");
  } else {
    res.set(http::field::access_control_allow_origin, "*");  // never * with credentials
  }
  res.set(http::field::access_control_expose_headers, kCorsExpose);
  res.set(http::field::vary, "Origin");
}

Response cors_preflight(const GatewayOptions& opts, const Request& req) {
  const std::string origin(req[http::field::origin]);
  if (origin_listing(opts, origin) == OriginListing::none) {
    spdlog::warn("refused OPTIONS {}: Origin {} is not allowed", std::string(req.target().substr(0, req.target().find('?'))), origin);
    return json_error(req, http::status::forbidden,
                      "Origin " + origin + " is not allowed (add it to allow_origins in kgate.toml)");
  }
  Response res{http::status::no_content, req.version()};
  res.set(http::field::server, kgate::server_header());
  res.keep_alive(req.keep_alive());
  add_cors_headers(opts, origin, res);
  res.erase(http::field::access_control_expose_headers);  // for actual responses only
  res.set(http::field::access_control_allow_methods, kCorsMethods);
  // The headers the page asked for (the request's own field, so a well-formed list), else a list
  // that covers what Jupyter clients send.
  const std::string asked(req[http::field::access_control_request_headers]);
  res.set(http::field::access_control_allow_headers, asked.empty() ? std::string(kCorsHeaders) : asked);
  res.set(http::field::access_control_max_age, std::to_string(kCorsMaxAgeSeconds));
  res.set(http::field::vary, "Origin, Access-Control-Request-Method, Access-Control-Request-Headers");
  return res;
}

namespace {
bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
std::string_view trim_spaces(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}
}  // namespace

std::string request_token(std::string_view target, std::string_view authorization) {
  // 1. The URL's `token` argument, as tornado's get_argument gives it to jupyter_server's
  //    IdentityProvider.get_token: the last one when repeated, surrounding whitespace stripped.
  std::string token;
  if (auto q = target.find('?'); q != std::string_view::npos) {
    std::string_view query = target.substr(q + 1);
    std::string key, value;
    for (std::size_t i = 0; i <= query.size();) {
      auto amp = std::min(query.find('&', i), query.size());
      auto pair = query.substr(i, amp - i);
      auto eq = pair.find('=');
      if (eq != std::string_view::npos && percent_decode(pair.substr(0, eq), key, true) && key == "token")
        token = percent_decode(pair.substr(eq + 1), value, true) ? std::string(trim_spaces(value)) : "";
      i = amp + 1;
    }
  }
  if (!token.empty()) return token;
  // 2. Only then the Authorization header: `token T` or `bearer T`, the scheme in any case
  //    (RFC 7235 DEV.md §2.1), then any run of whitespace: jupyter_server's (token|bearer)\s+(.+).
  std::string_view auth = trim_spaces(authorization);
  std::size_t scheme_end = 0;
  while (scheme_end < auth.size() && !is_space(auth[scheme_end])) ++scheme_end;
  const std::string scheme = lowercase(auth.substr(0, scheme_end));
  if (scheme_end == auth.size() || (scheme != "token" && scheme != "bearer")) return "";
  return std::string(trim_spaces(auth.substr(scheme_end)));
}

std::optional<Response> check_request(const GatewayOptions& opts, const Request& req, const RequestContext& ctx) {
  std::string host = host_only(req[http::field::host]);
  // DNS rebinding: a loopback server answers only to loopback names (or configured ones).
  if ((ctx.unix_socket || is_loopback_address(opts.ip)) && !host.empty() && !is_loopback_name(host) &&
      !host_allowed(opts.allow_hosts, host)) {
    spdlog::warn("refused {} {}: Host {} is not a loopback name", std::string(req.method_string()),
                 std::string(req.target().substr(0, req.target().find('?'))), host);
    return json_error(req, http::status::forbidden,
                      "Host " + host + " is not allowed (add it to allow_hosts in kgate.toml)");
  }
  // A CORS preflight is answered without auth (a browser sends no credentials with it), as by
  // Kernel Gateway and jupyter_server; only a listed origin gets the Allow headers.
  if (is_cors_preflight(req)) return cors_preflight(opts, req);
  // Browser CSRF: a page from another origin may not drive the API.
  auto origin_it = req.find(http::field::origin);
  if (origin_it != req.end()) {
    std::string origin(origin_it->value());
    bool allowed = origin_listing(opts, origin) != OriginListing::none;
    if (!allowed) {
      auto scheme_end = origin.find("://");
      std::string o_host = scheme_end == std::string::npos ? "" : lowercase(origin.substr(scheme_end + 3));
      std::string req_host = lowercase(req[http::field::host]);
      allowed = !o_host.empty() && o_host == req_host;
    }
    if (!allowed) {
      spdlog::warn("refused {} {}: Origin {} is not allowed", std::string(req.method_string()),
                   std::string(req.target().substr(0, req.target().find('?'))), origin);
      return json_error(req, http::status::forbidden,
                        "Origin " + origin + " is not allowed (add it to allow_origins in kgate.toml)");
    }
  }
  // kgate's own token is not asked on the Unix socket: its mode and the peer's uid (checked
  // before this) already say the client is the owner. A token that was given is asked everywhere.
  const bool token_needed =
      !opts.token.empty() && !(ctx.unix_socket && opts.token_source == TokenSource::automatic);
  if (token_needed) {
    const std::string given = request_token(req.target(), req[http::field::authorization]);
    if (!constant_time_equal(given, opts.token)) {
      return json_error(req, http::status::unauthorized,
                        given.empty() ? "A token is required: send 'Authorization: token <token>' or ?token=<token>"
                                      : "The token is not valid");
    }
  }
  return std::nullopt;
}

}  // namespace kgate::gw
