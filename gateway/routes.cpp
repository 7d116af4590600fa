// The route table, and the resolution of a request against it (routes.hpp).
#include "routes.hpp"

namespace kgate::gw {

const std::vector<Route>& routes() {
  using namespace on;
  constexpr bool records = true;
  static const std::vector<Route> table = {
      // The Jupyter server API, in jupyter_server's shapes and status codes.
      {get,        "api",                                    api_root},
      {get,        "api/status",                             api_status},
      {get,        "api/kernels",                            kernels_list},
      {post,       "api/kernels",                            kernels_start},
      {get,        "api/kernels/{kernel_id}",                kernel_get},
      {del,        "api/kernels/{kernel_id}",                kernel_delete},
      {post,       "api/kernels/{kernel_id}/interrupt",      kernel_interrupt},
      {post,       "api/kernels/{kernel_id}/restart",        kernel_restart},
      {ws,         "api/kernels/{kernel_id}/channels",       kernel_channels},
      {get,        "api/kernelspecs",                        kernelspecs_list},
      {get,        "api/kernelspecs/{name}",                 kernelspec_get},
      {get | head, "kernelspecs/{name}/{file*}",             kernelspec_resource},
      {get,        "api/sessions",                           sessions_list},
      {post,       "api/sessions",                           session_create},
      {get,        "api/sessions/{session_id}",              session_get},
      {patch,      "api/sessions/{session_id}",              session_patch},
      {del,        "api/sessions/{session_id}",              session_delete},
      // kgate's own (docs/records.md, docs/kernels.md "Warm pool", docs/remote-kernels.md).
      {get,        "api/kgate/kernelspecs",                  kgate_kernelspecs},
      {get,        "api/kgate/pool",                         kgate_pool},
      {get,        "api/kgate/launchers",                    kgate_launchers},
      {get,        "api/kgate/kernels",                      kgate_kernels_list},
      {get,        "api/kgate/kernels/{kernel_id}",          kgate_kernel_get},
      {post,       "api/kgate/kernels/{kernel_id}/keep",     kgate_kernel_keep},
      {post,       "api/kgate/kernels/{kernel_id}/execute",  kgate_execute,    records},
      {post,       "api/kgate/kernels/{kernel_id}/restart",  kgate_restart,    records},
      {get,        "api/kgate/kernels/{kernel_id}/digest",   kgate_digest,     records},
      {post,       "api/kgate/kernels/{kernel_id}/digest/ack", kgate_digest_ack, records},
      {get,        "api/kgate/kernels/{kernel_id}/notebook", kgate_notebook,   records},
      {get,        "api/kgate/jobs",                         jobs_list,        records},
      {get,        "api/kgate/jobs/{job}",                   job_get,          records},
      {post,       "api/kgate/jobs/{job}/interrupt",         job_interrupt,    records},
      {post,       "api/kgate/jobs/{job}/input",             job_input,        records},
      {ws,         "api/kgate/agent",                        agent_socket},
      {get,        "metrics",                                metrics_page},
      {post,       "mcp",                                    mcp_post},
      {del,        "mcp",                                    mcp_delete},
      // The observe page.
      {get | head, "",                                       root_redirect},
      {get | head, "observe",                                observe},
  };
  return table;
}

namespace {

// Whether `pattern` matches `segments`; its {name} segments go to `params`.
bool matches(std::string_view pattern, const std::vector<std::string>& segments, std::vector<std::string>& params) {
  params.clear();
  std::size_t i = 0;
  while (!pattern.empty()) {
    auto slash = pattern.find('/');
    std::string_view seg = pattern.substr(0, slash);
    pattern = slash == std::string_view::npos ? std::string_view() : pattern.substr(slash + 1);
    bool param = seg.size() >= 2 && seg.front() == '{' && seg.back() == '}';
    if (param && seg.size() >= 3 && seg[seg.size() - 2] == '*') {  // the rest, one segment or more
      if (i >= segments.size()) return false;
      std::string rest = segments[i++];
      while (i < segments.size()) rest += "/" + segments[i++];
      params.push_back(std::move(rest));
      return true;
    }
    if (i >= segments.size()) return false;
    if (param) params.push_back(segments[i]);
    else if (seg != segments[i]) return false;
    ++i;
  }
  return i == segments.size();
}

unsigned method_bit(const Request& req, bool upgrade) {
  if (upgrade) return on::ws;
  switch (req.method()) {
    case http::verb::get: return on::get;
    case http::verb::head: return on::head;
    case http::verb::post: return on::post;
    case http::verb::put: return on::put;
    case http::verb::patch: return on::patch;
    case http::verb::delete_: return on::del;
    default: return 0;
  }
}

}  // namespace

RouteMatch match_route(const std::vector<Route>& table, const std::vector<std::string>& segments, unsigned method) {
  RouteMatch m;
  std::vector<std::string> params;
  for (const auto& r : table) {
    if (!matches(r.pattern, segments, params)) continue;
    m.path_methods |= r.methods;
    if (!m.route && (r.methods & method)) {
      m.route = &r;
      m.params = params;
    }
  }
  return m;
}

std::string allow_list(unsigned methods) {
  static constexpr std::pair<unsigned, const char*> names[] = {
      {on::get, "GET"}, {on::head, "HEAD"}, {on::post, "POST"}, {on::put, "PUT"}, {on::patch, "PATCH"}, {on::del, "DELETE"}};
  std::string out;
  for (const auto& [bit, name] : names)
    if (methods & bit) out += (out.empty() ? "" : ", ") + std::string(name);
  return out;
}

void route(Services& server, Request& req, const RequestContext& ctx, Respond respond,
           std::function<Stream()> take_stream, RespondInParts respond_in_parts) {
  const bool upgrade = take_stream != nullptr;
  std::string path, query;
  if (!split_target(req.target(), path, query))
    return respond(json_error(req, http::status::bad_request,
                              "The request target is not valid: a bad %-escape, or one that does not decode to UTF-8"));
  const std::string& base = server.options().base_url;
  if (base != "/") {
    if (path.compare(0, base.size(), base) != 0 && path + "/" != base)
      return respond(json_error(req, http::status::not_found, "Not found: " + path));
    path = "/" + path.substr(std::min(path.size(), base.size()));
  }
  auto segments = split_path(path);
  for (const auto& s : segments)
    if (s == ".." || s == ".")
      return respond(json_error(req, http::status::bad_request, "The request path may not contain . or .."));

  const unsigned method = method_bit(req, upgrade);
  RouteMatch m = match_route(routes(), segments, method);
  if (!m.route) {
    if (upgrade) return respond(json_error(req, http::status::not_found, "No websocket endpoint at " + path));
    if (m.path_methods == on::ws)
      return respond(json_error(req, http::status::bad_request, "This endpoint takes a websocket upgrade"));
    if (m.path_methods == 0) return respond(json_error(req, http::status::not_found, "Not found: " + path));
    std::string allow = allow_list(m.path_methods);
    return respond(method_not_allowed(req, allow.c_str()));
  }
  if (m.route->records && !server.jobs().limits().enabled)
    return respond(json_error(req, http::status::service_unavailable,
                              "Job records are switched off in this kgate ([records] enabled = false)"));
  if (method == on::head) {
    respond_in_parts = nullptr;
    // The answer GET would give, without its body (RFC 9110 §9.3.2); the length stays.
    respond = [respond = std::move(respond)](Response res) {
      auto length = res.body().size();
      res.body().clear();
      res.content_length(length);
      respond(std::move(res));
    };
  }
  Call call{server, req, ctx, std::move(path), std::move(query), std::move(m.params), std::move(respond),
            std::move(take_stream), std::move(respond_in_parts)};
  m.route->handler(call);
}

}  // namespace kgate::gw
