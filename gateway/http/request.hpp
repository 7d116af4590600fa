// Requests and responses as the gateway's handlers see them: the types, JSON replies in
// jupyter_server's shape, and the target's path and query.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "http/net.hpp"
#include "kgate/jupyter/wire.hpp"

namespace kgate::gw {

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
  // The connection's place among those kgate holds (http/connection_gate.hpp): a websocket
  // session keeps it for as long as it holds the connection.
  std::shared_ptr<void> connection;
};

// A JSON error in jupyter_server's shape: {"message": ..., "reason": ...}.
Response json_error(const Request& req, http::status status, const std::string& message);
// 405 with an Allow header listing `allow` ("GET", "GET, POST").
Response method_not_allowed(const Request& req, const char* allow);
Response json_response(const Request& req, http::status status, const std::string& body);

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
