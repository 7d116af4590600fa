// /api/sessions (routes.hpp): jupyter_server's sessions API, in its shapes and status codes,
// over SessionStore (sessions.hpp).  docs/api.md "Sessions" says where kgate differs, and why.
#include <spdlog/spdlog.h>

#include "kgate/jupyter/connection.hpp"
#include "kgate/jupyter/utf8.hpp"
#include "kgate/version.hpp"
#include "kgate/jupyter/wire.hpp"
#include "api/api.hpp"
#include "handlers.hpp"
#include "services.hpp"
#include "sessions.hpp"

namespace kgate::gw {

namespace {

bool kernel_alive(Services& server, const std::string& id) { return server.manager().get(id) != nullptr; }

void prune(Services& server) {
  server.sessions().prune([&server](const std::string& id) { return kernel_alive(server, id); });
}

json session_json(Services& server, const Session& s) {
  json kernel = nullptr;
  if (auto k = server.manager().get(s.kernel_id)) kernel = kernel_model_json(k->model());
  json j = {{"id", s.id}, {"path", s.path}, {"name", s.name}, {"type", s.type}, {"kernel", kernel}};
  if (s.type == "notebook") j["notebook"] = {{"path", s.path}, {"name", s.name}};  // the older clients' shape
  return j;
}

// The request's JSON object, or the 400 to send ("No JSON data provided", as jupyter_server).
std::optional<json> body_object(const Request& req, const Replier& r) {
  if (req.body().empty()) {
    r.error(http::status::bad_request, "No JSON data provided");
    return std::nullopt;
  }
  json body = json_depth_within(req.body()) ? json::parse(req.body(), nullptr, false) : json();
  if (body.is_discarded() || !body.is_object()) {
    r.error(http::status::bad_request, "The request body must be a JSON object");
    return std::nullopt;
  }
  // The sessions API before notebook 5: {"notebook": {"path": ...}}.
  if (auto nb = body.find("notebook"); nb != body.end() && nb->is_object() && nb->contains("path")) {
    body["path"] = (*nb)["path"];
    body["type"] = "notebook";
  }
  return body;
}

// A string field of `obj`: absent or null → nullopt; not a string → nullopt and `error` naming
// it (`where` + key: "kernel.name").
std::optional<std::string> string_of(const json& obj, const char* key, std::string& error, const char* where = "") {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) {
    error = std::string("\"") + where + key + "\" must be a string";
    return std::nullopt;
  }
  return it->get<std::string>();
}

// The kernel a session asks for: {"id": ...} (a running kernel) or {"name": ...} (a new one
// of that kernelspec); neither: a new kernel of the default kernelspec.
struct KernelChoice {
  std::string id;
  std::string name;
};
std::optional<KernelChoice> kernel_choice(const json& body, std::string& error) {
  KernelChoice k;
  auto it = body.find("kernel");
  if (it == body.end() || it->is_null()) return k;
  if (!it->is_object()) {
    error = "\"kernel\" must be an object: {\"id\": ...} or {\"name\": ...}";
    return std::nullopt;
  }
  auto id = string_of(*it, "id", error, "kernel.");
  auto name = string_of(*it, "name", error, "kernel.");
  if (!error.empty()) return std::nullopt;
  k.id = id.value_or("");
  k.name = name.value_or("");
  return k;
}

// Starts a kernel for session `path` as POST /api/kernels would (max_kernels, the catalog, the
// kernelspec's launcher, the warm pool): cwd from the path under root_dir, JPY_SESSION_NAME =
// the path, as jupyter_server sets it.  `done` gets the kernel's id, or the answer to send.
void start_session_kernel(Services& server, const std::string& path, const std::string& kernel_name, unsigned version,
                          std::function<void(std::string id, std::optional<Response> failure)> done) {
  json body = {{"path", path}, {"env", {{"JPY_SESSION_NAME", path}}}};
  if (!kernel_name.empty()) body["name"] = kernel_name;
  start_kernel_as_post(server, body, version, [done, kernel_name](Response res) {
    auto st = res.result();
    if (st == http::status::created || st == http::status::accepted) {
      json model = json::parse(res.body(), nullptr, false);
      if (model.is_object() && model.contains("id")) return done(model["id"].get<std::string>(), std::nullopt);
    }
    if (st == http::status::not_found && !kernel_name.empty()) {
      // No such kernelspec: jupyter_server's 501, with its short message.
      res.result(http::status::not_implemented);
      res.body() = json{{"message", "The '" + kernel_name +
                                        "' kernel is not available. Please pick another suitable kernel instead, "
                                        "or install that kernel."},
                        {"short_message", kernel_name + " not found"},
                        {"reason", "Not Implemented"}}
                       .dump();
      res.prepare_payload();
    }
    done("", std::move(res));
  });
}

// Shuts `kernel_id` down when session `s` started it and no other session uses it; then `then`.
// `why`: "ended", "moved to another kernel".
void release_kernel(Services& server, const Session& s, const char* why, std::function<void()> then) {
  if (!s.started_kernel || server.sessions().kernel_shared(s.kernel_id, s.id) || !kernel_alive(server, s.kernel_id))
    return then();
  spdlog::info("session {} ({}) {}: shutting down kernel {}, which it started", s.id, s.path, why, s.kernel_id);
  server.manager().shutdown(s.kernel_id, [&server, then = std::move(then)](bool) { net::post(server.ioc(), then); });
}

// Why `s` may not be kept (413), replacing a session of `replaced` bytes, or "".
std::string too_big(const SessionStore& store, const Session& s, std::size_t replaced = 0) {
  const std::pair<const char*, const std::string*> fields[] = {{"path", &s.path}, {"name", &s.name}, {"type", &s.type}};
  for (const auto& [name, value] : fields)
    if (value->size() > SessionStore::kMaxFieldBytes)
      return std::string("the session's ") + name + " is " + std::to_string(value->size()) + " bytes; at most " +
             std::to_string(SessionStore::kMaxFieldBytes) + " are kept";
  if (store.bytes() - replaced + SessionStore::bytes_of(s) > SessionStore::kMaxTotalBytes)
    return "kgate's sessions hold " + std::to_string(store.bytes()) + " bytes of paths, names and types, and " +
           std::to_string(SessionStore::kMaxTotalBytes) + " is their limit: delete one first (DELETE /api/sessions/{id})";
  return "";
}

}  // namespace

void sessions_list(Call& c) {
  prune(c.services);
  json list = json::array();
  for (const auto& s : c.services.sessions().all()) list.push_back(session_json(c.services, s));
  c.respond(json_response(c.req, http::status::ok, dump_json(list)));
}

void session_create(Call& c) {
  Services& server = c.services;
  Replier r = replier(c.req, std::move(c.respond));
  auto body = body_object(c.req, r);
  if (!body) return;
  std::string error;
  auto path = string_of(*body, "path", error);
  if (!error.empty()) return r.error(http::status::bad_request, error);
  if (!path) return r.error(http::status::bad_request, "Missing field in JSON data: path");
  auto type = string_of(*body, "type", error);
  if (!error.empty()) return r.error(http::status::bad_request, error);
  if (!type) return r.error(http::status::bad_request, "Missing field in JSON data: type");
  auto name = string_of(*body, "name", error);
  if (!error.empty()) return r.error(http::status::bad_request, error);
  auto kernel = kernel_choice(*body, error);
  if (!kernel) return r.error(http::status::bad_request, error);

  const std::string base = server.options().base_url;
  auto created = [&server, r, base](const Session& s) {
    Response res = json_response(r.shape(), http::status::created, dump_json(session_json(server, s)));
    res.set(http::field::location, base + "api/sessions/" + s.id);
    r.respond(std::move(res));
  };
  prune(server);
  // One session per path, as in jupyter_server: a second POST gets the first one.
  if (const Session* s = server.sessions().find_path(*path)) return created(*s);
  if (server.sessions().full())
    return r.error(http::status::service_unavailable,
                   "kgate holds " + std::to_string(SessionStore::kMaxSessions) +
                       " sessions, its limit: delete one first (DELETE /api/sessions/{id})");
  Session s{new_uuid(), *path, name.value_or(""), *type, "", false};
  if (auto why = too_big(server.sessions(), s); !why.empty()) return r.error(http::status::payload_too_large, why);
  if (!kernel->id.empty()) {
    // On a running kernel, an agent's for instance: it is shared, never shut down by the session.
    if (!kernel_alive(server, kernel->id)) return r.error(http::status::bad_request, "No such kernel: " + kernel->id);
    s.kernel_id = kernel->id;
    server.sessions().add(s);
    return created(s);
  }
  start_session_kernel(server, *path, kernel->name, r.version,
                       [&server, r, s, created](std::string id, std::optional<Response> failure) mutable {
                         if (failure) return r.respond(std::move(*failure));
                         // Two POSTs for one path at once: the first to finish makes the session;
                         // the other's kernel is not needed.
                         if (const Session* first = server.sessions().find_path(s.path)) {
                           server.manager().shutdown(id, [](bool) {});
                           return created(*first);
                         }
                         if (server.sessions().full()) {
                           server.manager().shutdown(id, [](bool) {});
                           return r.error(http::status::service_unavailable, "kgate's session limit was reached");
                         }
                         if (auto why = too_big(server.sessions(), s); !why.empty()) {  // others came first
                           server.manager().shutdown(id, [](bool) {});
                           return r.error(http::status::payload_too_large, why);
                         }
                         s.kernel_id = id;
                         s.started_kernel = true;
                         server.sessions().add(s);
                         created(s);
                       });
}

void session_get(Call& c) {
  prune(c.services);
  const Session* s = c.services.sessions().find(c.param(0));
  if (!s) return c.respond(json_error(c.req, http::status::not_found, "Session not found: session_id=" + c.param(0)));
  c.respond(json_response(c.req, http::status::ok, dump_json(session_json(c.services, *s))));
}

void session_patch(Call& c) {
  Services& server = c.services;
  const std::string id = c.param(0);
  Replier r = replier(c.req, std::move(c.respond));
  auto body = body_object(c.req, r);
  if (!body) return;
  prune(server);
  const Session* found = server.sessions().find(id);
  if (!found) return r.error(http::status::not_found, "Session not found: session_id=" + id);
  Session before = *found, after = *found;
  std::string error;
  const std::pair<const char*, std::string*> fields[] = {{"path", &after.path}, {"name", &after.name}, {"type", &after.type}};
  for (const auto& f : fields) {
    auto v = string_of(*body, f.first, error);
    if (!error.empty()) return r.error(http::status::bad_request, error);
    if (v) *f.second = *v;
  }
  auto kernel = kernel_choice(*body, error);
  if (!kernel) return r.error(http::status::bad_request, error);
  if (auto why = too_big(server.sessions(), after, SessionStore::bytes_of(before)); !why.empty())
    return r.error(http::status::payload_too_large, why);

  // Saves `after`, then shuts the old kernel down if the session started it and nothing else uses it.
  auto finish = [&server, r, before](Session s) {
    if (!server.sessions().find(s.id)) {
      // Deleted while its new kernel started: that kernel has no session to serve.
      if (s.started_kernel && s.kernel_id != before.kernel_id) server.manager().shutdown(s.kernel_id, [](bool) {});
      return r.error(http::status::not_found, "Session not found: session_id=" + s.id);
    }
    server.sessions().update(s);
    if (s.kernel_id == before.kernel_id) return r.ok(session_json(server, s));
    release_kernel(server, before, "moved to another kernel", [&server, r, id = s.id] {
      const Session* now = server.sessions().find(id);
      if (!now) return r.error(http::status::not_found, "Session not found: session_id=" + id);
      r.ok(session_json(server, *now));
    });
  };
  if (!kernel->id.empty()) {  // the id wins over a name, as in jupyter_server
    if (!kernel_alive(server, kernel->id)) return r.error(http::status::bad_request, "No such kernel: " + kernel->id);
    if (kernel->id != after.kernel_id) after.started_kernel = false;
    after.kernel_id = kernel->id;
    return finish(after);
  }
  if (kernel->name.empty()) return finish(after);
  start_session_kernel(server, after.path, kernel->name, r.version,
                       [r, after, finish](std::string kid, std::optional<Response> failure) mutable {
                         if (failure) return r.respond(std::move(*failure));
                         after.kernel_id = kid;
                         after.started_kernel = true;
                         finish(after);
                       });
}

void session_delete(Call& c) {
  Services& server = c.services;
  Replier r = replier(c.req, std::move(c.respond));
  prune(server);
  const Session* found = server.sessions().find(c.param(0));
  if (!found) return r.error(http::status::not_found, "Session not found: session_id=" + c.param(0));
  Session s = *found;
  // Out of the list at once; answered once its kernel is down, if the session started that
  // kernel and no other session uses it (sessions.hpp: jupyter_server shuts it down always).
  server.sessions().remove(s.id);
  release_kernel(server, s, "ended", [r] {
    Response res{http::status::no_content, r.version};
    res.keep_alive(r.keep_alive);
    res.set(http::field::server, kgate::server_header());
    r.respond(std::move(res));
  });
}

}  // namespace kgate::gw
