// Requests and responses as the gateway's handlers see them (request.hpp).
#include "http/request.hpp"

#include <cctype>

#include "kgate/client/endpoint.hpp"
#include "kgate/jupyter/utf8.hpp"
#include "kgate/version.hpp"

namespace kgate::gw {

using client::percent_decode;  // uriparser

namespace {

std::string reason_phrase(http::status s) { return std::string(http::obsolete_reason(s)); }

}  // namespace

std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> parts;
  std::size_t i = 0;
  while (i < path.size()) {
    while (i < path.size() && path[i] == '/') ++i;
    if (i >= path.size()) break;
    auto j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    parts.emplace_back(path.substr(i, j - i));
    i = j;
  }
  return parts;
}

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool is_loopback_address(const std::string& ip) {
  return ip == "localhost" || ip == "::1" || ip.starts_with("127.");
}

Response json_response(const Request& req, http::status status, const std::string& body) {
  Response res{status, req.version()};
  res.set(http::field::server, kgate::server_header());
  res.set(http::field::content_type, "application/json");
  res.set(http::field::cache_control, "no-store");
  res.keep_alive(req.keep_alive());
  res.body() = body;
  res.prepare_payload();
  return res;
}

Response json_error(const Request& req, http::status status, const std::string& message) {
  json j = {{"message", message}, {"reason", reason_phrase(status)}};
  // A message may quote what the client sent (a path, a header): never let a byte that is not
  // UTF-8 turn an error reply into an exception.
  return json_response(req, status, j.dump(-1, ' ', false, json::error_handler_t::replace));
}

Response method_not_allowed(const Request& req, const char* allow) {
  Response res = json_error(req, http::status::method_not_allowed,
                            std::string(req.method_string()) + " is not allowed here");
  res.set(http::field::allow, allow);
  return res;
}

bool split_target(std::string_view target, std::string& path, std::string& query) {
  auto q = target.find('?');
  std::string_view raw = target.substr(0, q);
  query = q == std::string_view::npos ? "" : std::string(target.substr(q + 1));
  if (!percent_decode(raw, path, false) || !is_valid_utf8(path)) return false;
  // Every query key and value must decode to UTF-8 too: they end up in JSON replies and records.
  std::string part;
  for (std::size_t i = 0; i <= query.size();) {
    auto amp = std::min(query.find('&', i), query.size());
    auto kv = std::string_view(query).substr(i, amp - i);
    auto eq = kv.find('=');
    if (!percent_decode(kv.substr(0, eq), part, true) || !is_valid_utf8(part)) return false;
    if (eq != std::string_view::npos && (!percent_decode(kv.substr(eq + 1), part, true) || !is_valid_utf8(part)))
      return false;
    i = amp + 1;
  }
  return true;
}

std::string query_param(std::string_view query, std::string_view key) {
  std::size_t i = 0;
  while (i <= query.size()) {
    auto amp = query.find('&', i);
    if (amp == std::string_view::npos) amp = query.size();
    auto kv = query.substr(i, amp - i);
    auto eq = kv.find('=');
    std::string k, v;
    if (percent_decode(kv.substr(0, eq), k, true) && k == key) {
      if (eq == std::string_view::npos) return "";
      if (percent_decode(kv.substr(eq + 1), v, true)) return v;
      return "";
    }
    i = amp + 1;
  }
  return "";
}

Request Replier::shape() const {
  Request r;
  r.version(version);
  r.keep_alive(keep_alive);
  return r;
}
void Replier::ok(const json& body, http::status st) const { respond(json_response(shape(), st, dump_json(body))); }
void Replier::error(http::status st, const std::string& msg, json extra) const {
  json j = {{"message", msg}, {"reason", std::string(http::obsolete_reason(st))}};
  for (auto& [k, v] : extra.items()) j[k] = v;
  respond(json_response(shape(), st, dump_json(j)));
}
Replier replier(const Request& req, Respond respond) {
  return Replier{req.version(), req.keep_alive(), std::move(respond)};
}

}  // namespace kgate::gw
