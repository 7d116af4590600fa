// The HTTP surface as one table: every route kgate serves, as (methods, path pattern, handler),
// in routes.cpp, and the one function that resolves a request against it.  The handlers are
// declared in handlers.hpp and live beside what they serve (api/, ws/).
//
// Threading: route() and every handler run on the gateway's Asio thread.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "handlers.hpp"

namespace kgate::gw {

// The methods a route answers, as bits.  `ws` is a GET with a websocket upgrade.
namespace on {
constexpr unsigned get = 1, head = 2, post = 4, put = 8, patch = 16, del = 32, ws = 64;
}  // namespace on

struct Route {
  unsigned methods;
  // '/'-separated segments after base_url: a literal, "{name}" (one segment), or, last only,
  // "{name*}" (one segment or more, joined with '/').  "" is base_url itself.
  std::string_view pattern;
  Handler handler;
  bool records = false;  // needs the job records: 503 while [records] enabled = false
};

// Every route, in the order they are tried.
const std::vector<Route>& routes();

// What `segments` (a path split at '/') resolves to for `method` (one on:: bit).
struct RouteMatch {
  const Route* route = nullptr;     // the first route with this path and method
  std::vector<std::string> params;  // its {name} segments
  unsigned path_methods = 0;        // every method some route answers at this path (405's Allow)
};
RouteMatch match_route(const std::vector<Route>& table, const std::vector<std::string>& segments, unsigned method);
// "GET, HEAD, POST": an Allow header's value for `methods` (websocket left out).
std::string allow_list(unsigned methods);

// Resolves one checked request (check_request passed) and calls its handler, or answers it:
// 400 for a bad target or a "." / ".." segment, 404 for no route, 405 with Allow for a method
// the path does not take, 400 for a plain request to a websocket-only path, 503 for a records
// route with the records off.  A HEAD is answered without the body GET would send.
// `take_stream` is null for a request that is not a websocket upgrade; `respond_in_parts` is
// null where the connection cannot send an answer in parts.
void route(Services& services, Request& req, const RequestContext& ctx, Respond respond,
           std::function<Stream()> take_stream = nullptr, RespondInParts respond_in_parts = nullptr);

}  // namespace kgate::gw
