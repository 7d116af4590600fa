// The REST surface: /api, /api/status, /api/kernels..., /api/kernelspecs..., /kernelspecs/...
#include "api/api.hpp"

#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "api/jobs_api.hpp"
#include "kgate/jupyter/utf8.hpp"
#include "kgate/version.hpp"
#include "handlers.hpp"
#include "pool.hpp"
#include "services.hpp"
#include "ws/hub.hpp"

namespace kgate::gw {

json kernel_model_json(const KernelModel& m) {
  json j = {{"id", m.id},
            {"name", m.name},
            {"last_activity", m.last_activity},
            {"execution_state", m.execution_state},
            {"connections", m.connections}};
  if (!m.reason.empty()) j["reason"] = m.reason;
  // kgate's own fields (jupyter_server has none of these; clients ignore unknown keys).
  if (!m.placement.is_null()) j["kgate_placement"] = m.placement;
  if (!m.kernel_side.is_null()) j["kgate_kernel_side"] = m.kernel_side;
  if (!m.conversation.empty()) j["kgate_conversation"] = m.conversation;
  j["responsive"] = m.responsive;
  if (!m.responsive && m.execution_state != "dead") j["silent_seconds"] = std::round(m.silent_seconds * 10) / 10;
  return j;
}

namespace {

json model_json(const KernelModel& m) { return kernel_model_json(m); }

}  // namespace

namespace {

struct CwdResult {
  std::filesystem::path cwd;
  std::string error;
};

CwdResult resolve_cwd(const Services& server, const json& body, const std::map<std::string, std::string>& env) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (auto it = body.find("cwd"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return {{}, "\"cwd\" must be a string"};
    fs::path p = it->get<std::string>();
    if (!fs::is_directory(p, ec)) return {{}, "cwd " + p.string() + " is not a directory"};
    return {p, {}};
  }
  if (auto it = env.find("KERNEL_WORKING_DIR"); it != env.end() && !it->second.empty()) {
    fs::path p = it->second;
    if (fs::is_directory(p, ec)) return {p, {}};
    spdlog::info("KERNEL_WORKING_DIR {} does not exist here; ignored", p.string());
  }
  if (auto it = body.find("path"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return {{}, "\"path\" must be a string"};
    fs::path rel = it->get<std::string>();
    fs::path p = rel.is_absolute() ? rel : server.options().root_dir / rel;
    // A notebook path names a file: walk up to the nearest existing directory.
    while (!p.empty() && !fs::is_directory(p, ec)) {
      if (p == p.parent_path()) break;
      p = p.parent_path();
    }
    if (fs::is_directory(p, ec)) return {p, {}};
  }
  return {{}, {}};
}

void start_kernel(Services& server, StartRequest sr, Respond respond, bool keep_alive, unsigned version,
                  const std::string& base, const std::string& conversation = {});

// max_kernels refusals: a slot frees when a kernel is shut down, culled or fails to start.
constexpr int kRetryAfterSeconds = 5;

void api_kernels_post(Services& server, const Request& req, const RequestContext& ctx, Respond respond) {
  json body = json::object();
  if (!req.body().empty()) {
    if (json_depth_within(req.body())) body = json::parse(req.body(), nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      respond(json_error(req, http::status::bad_request, "The request body must be a JSON object"));
      return;
    }
  }
  const auto& opts = server.options();
  std::string name;  // "" = the catalog's default
  if (auto it = body.find("name"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) {
      respond(json_error(req, http::status::bad_request, "\"name\" must be a string"));
      return;
    }
    name = it->get<std::string>();
  }
  // jupyter_server 2.x: the client may choose the kernel's id.  It must be a UUID no kernel has.
  std::string kernel_id;
  if (auto it = body.find("kernel_id"); it != body.end() && !it->is_null()) {
    if (!it->is_string() || !is_uuid(it->get_ref<const std::string&>())) {
      respond(json_error(req, http::status::bad_request,
                         "\"kernel_id\" must be a UUID string such as 9078f9cc-81b1-4a03-95af-2ea4ca17b4b3, not " +
                             it->dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 100)));
      return;
    }
    kernel_id = lowercase(it->get<std::string>());
    if (server.manager().get_any(kernel_id) || server.kernel_id_reserved(kernel_id)) {
      respond(json_error(req, http::status::bad_request,
                         "A kernel with id " + kernel_id + " exists already: \"kernel_id\" must be a new UUID"));
      return;
    }
  }
  std::map<std::string, std::string> env;
  if (auto it = body.find("env"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) {
      respond(json_error(req, http::status::bad_request, "\"env\" must be an object of strings"));
      return;
    }
    bool whole = opts.env_policy == EnvPolicy::all ||
                 (opts.env_policy == EnvPolicy::automatic && ctx.peer_loopback);
    for (auto& [k, v] : it->items()) {
      if (!v.is_string()) {
        respond(json_error(req, http::status::bad_request, "env value of " + k + " must be a string"));
        return;
      }
      bool allowed = whole || k.starts_with("KERNEL_") ||
                     std::find(opts.env_allow.begin(), opts.env_allow.end(), k) != opts.env_allow.end();
      if (allowed) env[k] = v.get<std::string>();
    }
  }
  auto cwd = resolve_cwd(server, body, env);
  if (!cwd.error.empty()) {
    respond(json_error(req, http::status::bad_request, cwd.error));
    return;
  }
  StartRequest sr;
  sr.id = kernel_id;
  sr.env = std::move(env);
  sr.cwd = cwd.cwd;
  // kgate's per-kernel idle timeout (docs/kernels.md "Idle culling"): seconds, 0 = never culled, null or
  // absent = the gateway's.
  if (auto it = body.find("kgate_cull_idle_timeout"); it != body.end() && !it->is_null()) {
    constexpr double kMax = 31536000;  // a year
    double v = it->is_number() ? it->get<double>() : -1;
    if (!(v == 0 || (v >= 1 && v <= kMax))) {
      respond(json_error(req, http::status::bad_request,
                         "\"kgate_cull_idle_timeout\" must be a number of seconds: 0 (never cull this "
                         "kernel) or from 1 to 31536000"));
      return;
    }
    sr.cull_idle_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(v * 1000 + 0.5));
  }
  // The agent whose conversation makes this kernel as its auto kernel (README "The end of a
  // conversation"): stopped once that agent is gone, unless kept or attached.
  std::string conversation;
  if (auto it = body.find("kgate_conversation"); it != body.end() && !it->is_null()) {
    if (!it->is_string() || it->get_ref<const std::string&>().empty() || it->get_ref<const std::string&>().size() > 128) {
      respond(json_error(req, http::status::bad_request,
                         "\"kgate_conversation\" must be the agent id (1 to 128 characters) whose auto kernel this is"));
      return;
    }
    conversation = it->get<std::string>();
  }
  // A remote launcher (docs/dev/remote-launchers.md): by name here, else the kernelspec's metadata.kgate.launcher.
  std::string launcher_name;
  json launcher_options;
  if (auto it = body.find("kgate_launcher"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) {
      respond(json_error(req, http::status::bad_request, "\"kgate_launcher\" must be a launcher's name"));
      return;
    }
    launcher_name = it->get<std::string>();
  }
  if (auto it = body.find("kgate_launcher_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) {
      respond(json_error(req, http::status::bad_request, "\"kgate_launcher_options\" must be an object"));
      return;
    }
    launcher_options = *it;
  }
  // max_kernels: from here on every path gives the slot back or hands it to the kernel.
  if (auto refusal = server.admit()) {
    auto res = json_error(req, http::status::service_unavailable, *refusal);
    res.set(http::field::retry_after, std::to_string(kRetryAfterSeconds));
    respond(std::move(res));
    return;
  }
  // Until its start is over, no other POST may take the same id.
  if (!sr.id.empty()) server.reserve_kernel_id(sr.id, true);
  auto keep_alive = req.keep_alive();
  auto version = req.version();
  std::string base = opts.base_url;
  server.with_catalog([&server, name, sr = std::move(sr), respond, keep_alive, version, base, launcher_name,
                       launcher_options, conversation](std::shared_ptr<const Catalog> cat) mutable {
    Request fake;
    fake.version(version);
    fake.keep_alive(keep_alive);
    const std::string want = name.empty() ? cat->default_name : name;
    const CatalogEntry* entry = cat->find(want);
    if (!entry) {
      server.admitted("");
      if (!sr.id.empty()) server.reserve_kernel_id(sr.id, false);
      respond(json_error(fake, http::status::not_found, "No such kernel named " + want));
      return;
    }
    if (!entry->launchable) {
      server.admitted("");
      if (!sr.id.empty()) server.reserve_kernel_id(sr.id, false);
      respond(json_error(fake, http::status::bad_request,
                         "Kernel spec " + entry->spec.name + " cannot be launched: " + entry->reason));
      return;
    }
    sr.spec = entry->spec;
    std::string lname = launcher_name;
    if (lname.empty() && sr.spec.metadata.is_object()) {
      auto kg = sr.spec.metadata.find("kgate");
      if (kg != sr.spec.metadata.end() && kg->is_object() && kg->contains("launcher") && (*kg)["launcher"].is_string())
        lname = (*kg)["launcher"].get<std::string>();
    }
    std::string bad;
    if (!lname.empty() && lname != "local") {
      const auto& ls = server.options().launchers;
      auto it = ls.find(lname);
      if (it == ls.end()) {
        std::string names = "local";
        for (const auto& [n, l] : ls) names += ", " + n;
        bad = "No launcher named " + lname + " (configured: " + names + ")";
      } else {
        try {
          sr.launcher = with_overrides(*it->second, launcher_options);
        } catch (const std::invalid_argument& e) {
          bad = e.what();
        }
      }
    } else if (!launcher_options.is_null() && !launcher_options.empty()) {
      bad = "\"kgate_launcher_options\" needs a launcher: the local one takes none";
    }
    if (!bad.empty()) {
      server.admitted("");
      if (!sr.id.empty()) server.reserve_kernel_id(sr.id, false);
      respond(json_error(fake, http::status::bad_request, bad));
      return;
    }
    start_kernel(server, std::move(sr), respond, keep_alive, version, base, conversation);
  }, name);
}

void start_kernel(Services& server, StartRequest sr, Respond respond, bool keep_alive, unsigned version,
                  const std::string& base, const std::string& conversation) {
  const std::string chosen_id = sr.id;
  // A remote kernel may wait in a scheduler's queue: after ready_timeout the POST is answered
  // 202 Accepted with the kernel's model (state starting, kgate_placement saying where it
  // waits), and the start goes on (docs/remote-kernels.md).  `answered` is set by whichever
  // comes first, on the Asio thread.
  auto answered = std::make_shared<bool>(false);
  const bool remote = sr.launcher != nullptr;
  if (remote) {
    if (sr.id.empty()) sr.id = kgate::new_uuid();
    auto timer = std::make_shared<net::steady_timer>(server.ioc(), server.options().kernel.ready_timeout);
    const std::string id = sr.id;
    timer->async_wait([timer, answered, &server, respond, keep_alive, version, base, id, chosen_id, conversation](
                          const boost::system::error_code& ec) {
      if (ec || *answered) return;
      auto k = server.manager().get(id);
      if (!k) return;  // it failed meanwhile: the start's answer is on its way
      *answered = true;
      if (!conversation.empty()) {
        k->set_conversation(conversation);
        server.manager().remember(id);
        server.jobs().expect_agent(conversation);  // see below
      }
      server.admitted(id);
      if (!chosen_id.empty()) server.reserve_kernel_id(chosen_id, false);
      Request fake;
      fake.version(version);
      fake.keep_alive(keep_alive);
      Response res = json_response(fake, http::status::accepted, kgate::dump_json(model_json(k->model())));
      res.set(http::field::location, base + "api/kernels/" + id);
      respond(std::move(res));
    });
  }
  auto done = [&server, respond, keep_alive, version, base, chosen_id, answered, conversation](StartResult r) {
    net::post(server.ioc(), [r = std::move(r), respond, keep_alive, version, base, chosen_id, &server, answered,
                             conversation] {
      if (*answered) return;  // answered 202 already; the kernel's model tells the rest
      *answered = true;
      if (r.kernel && !conversation.empty()) {
        r.kernel->set_conversation(conversation);
        server.manager().remember(r.kernel->id());
        // Known from the answer on: if that agent's link never opens (its process killed before
        // it could), it is gone claim_grace later and the kernel culled as an orphan, not kept
        // for ever. Not from the POST: a start can outlast claim_grace + auto_kernel_grace.
        server.jobs().expect_agent(conversation);
      }
      Request fake;
      fake.version(version);
      fake.keep_alive(keep_alive);
      server.admitted(r.kernel ? r.kernel->id() : "");
      if (!chosen_id.empty()) server.reserve_kernel_id(chosen_id, false);
      if (!r.kernel) {
        respond(json_error(fake, http::status::internal_server_error, "Kernel failed to start: " + r.error));
        return;
      }
      server.touch();
      Response res = json_response(fake, http::status::created, kgate::dump_json(model_json(r.kernel->model())));
      res.set(http::field::location, base + "api/kernels/" + r.kernel->id());
      respond(std::move(res));
    });
  };
  // A pooled kernel has its id already: a start with the client's id is a cold one (docs/dev/kernel-lifecycle.md).
  // The pool's kernels are local ones.
  if (!chosen_id.empty() || remote) return server.manager().start(std::move(sr), std::move(done));
  server.pool().start(std::move(sr), std::move(done));
}

// Whether the request's Prefer header (RFC 7240) asks for `respond-async`. Each preference is
// read on its own: Beast's ext_list takes `token *(; param)` and stops at a `wait=5`.
bool prefers_async(const Request& req) {
  std::string_view prefer = req["Prefer"];
  while (!prefer.empty()) {
    const auto comma = prefer.find(',');
    for (auto& pref : http::ext_list{prefer.substr(0, comma)})
      if (beast::iequals(pref.first, "respond-async")) return true;
    prefer = comma == std::string_view::npos ? std::string_view{} : prefer.substr(comma + 1);
  }
  return false;
}

}  // namespace

void kernel_action(Services& server, const Request& req, const std::string& id, const std::string& action,
                   Respond respond, bool gated) {
  auto keep_alive = req.keep_alive();
  auto version = req.version();
  auto reply = [&server, respond, keep_alive, version](http::status st, std::string body) {
    net::post(server.ioc(), [respond, keep_alive, version, st, body = std::move(body)] {
      Request fake;
      fake.version(version);
      fake.keep_alive(keep_alive);
      if (st == http::status::no_content || st == http::status::accepted) {
        Response res{st, version};
        res.keep_alive(keep_alive);
        res.set(http::field::server, kgate::server_header());
        if (st == http::status::accepted) res.content_length(0);  // 204 has no body by definition
        respond(std::move(res));
      } else if (st == http::status::ok) {
        respond(json_response(fake, st, body));
      } else {
        respond(json_error(fake, st, body));
      }
    });
  };
  std::string missing = "Kernel does not exist: " + id;
  if (action == "delete" && prefers_async(req)) {
    // RFC 7240 `Prefer: respond-async`: 202 once the stop has begun, not when the kernel is down
    // (kgate-mcp's end, which must be over before its client's SIGKILL, docs/dev/mcp.md).
    if (!server.manager().get(id)) return reply(http::status::not_found, missing);
    server.manager().shutdown(id, [](bool) {});
    return reply(http::status::accepted, "");
  }
  if (action == "delete") {
    server.manager().shutdown(id, [reply, missing](bool ok) {
      reply(ok ? http::status::no_content : http::status::not_found, ok ? "" : missing);
    });
  } else if (action == "interrupt") {
    server.manager().interrupt(id, [reply, missing](bool ok) {
      reply(ok ? http::status::no_content : http::status::not_found, ok ? "" : missing);
    });
  } else {
    if (!gated && server.manager().get(id)) server.jobs().restart_gate(id, nullptr);
    server.manager().restart(id, [reply, missing](StartResult r) {
      if (r.kernel)
        reply(http::status::ok, kgate::dump_json(model_json(r.kernel->model())));
      else if (r.error.empty())
        reply(http::status::not_found, missing);
      else
        reply(http::status::internal_server_error, "Exception restarting kernel: " + r.error);
    });
  }
}

namespace {

json kernelspec_json(const Services& server, const KernelSpec& spec) {
  json resources = json::object();
  for (auto& [key, file] : spec.resources())
    resources[key] = server.options().base_url + "kernelspecs/" + spec.name + "/" + file;
  return {{"name", spec.name}, {"spec", spec.spec_json()}, {"resources", resources}};
}

}  // namespace

std::string kernelspecs_body_of(const Services& server, const Catalog& cat) {
  json specs = json::object();
  for (auto& e : cat.entries)
    if (e.launchable) specs[e.spec.name] = kernelspec_json(server, e.spec);
  return kgate::dump_json(json{{"default", cat.default_name}, {"kernelspecs", specs}});
}

std::string kernelspec_content_type(std::string_view file) {
  auto slash = file.rfind('/');
  if (slash != std::string_view::npos) file = file.substr(slash + 1);
  auto dot = file.rfind('.');
  const std::string ext = dot == std::string_view::npos ? "" : lowercase(file.substr(dot + 1));
  static const std::map<std::string, std::string, std::less<>> types = {
      {"png", "image/png"},
      {"svg", "image/svg+xml"},
      {"jpg", "image/jpeg"},
      {"jpeg", "image/jpeg"},
      {"gif", "image/gif"},
      {"ico", "image/x-icon"},
      {"webp", "image/webp"},
      {"js", "text/javascript; charset=utf-8"},
      {"mjs", "text/javascript; charset=utf-8"},
      {"css", "text/css; charset=utf-8"},
      {"json", "application/json"},
      {"map", "application/json"},
      {"txt", "text/plain; charset=utf-8"},
      {"md", "text/markdown; charset=utf-8"},
      {"wasm", "application/wasm"},
      {"woff", "font/woff"},
      {"woff2", "font/woff2"},
      {"ttf", "font/ttf"},
  };
  auto it = types.find(ext);
  return it == types.end() ? "application/octet-stream" : it->second;
}

std::optional<std::filesystem::path> kernelspec_file(const std::filesystem::path& dir, std::string_view rel) {
  namespace fs = std::filesystem;
  if (dir.empty() || rel.empty() || rel.front() == '/' || rel.find('\0') != std::string_view::npos)
    return std::nullopt;
  fs::path p = dir;
  for (const auto& part : split_path(rel)) {
    if (part == "." || part == "..") return std::nullopt;
    p /= part;
  }
  std::error_code ec;
  const fs::path root = fs::canonical(dir, ec);
  if (ec) return std::nullopt;
  const fs::path real = fs::canonical(p, ec);  // every symlink resolved: where the bytes really are
  if (ec || !fs::is_regular_file(real, ec)) return std::nullopt;
  // Inside the directory: real is root followed by at least one more element.
  auto r = root.begin(), f = real.begin();
  for (; r != root.end(); ++r, ++f)
    if (f == real.end() || *r != *f) return std::nullopt;
  if (f == real.end()) return std::nullopt;
  return real;
}

bool is_uuid(std::string_view s) {
  if (s.size() != 36) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (s[i] != '-') return false;
    } else if (!std::isxdigit(static_cast<unsigned char>(s[i]))) {
      return false;
    }
  }
  return true;
}

std::string default_kernel_warning(const Catalog& cat, const std::string& default_kernel) {
  const CatalogEntry* e = cat.find(default_kernel);
  if (e && e->launchable) return {};
  std::string names;
  for (const auto& entry : cat.entries)
    if (entry.launchable) names += (names.empty() ? "" : ", ") + entry.spec.name;
  std::string what = e ? "names kernelspec " + e->spec.name + ", which cannot be launched (" + e->reason + ")"
                       : "names no kernelspec";
  std::string instead = cat.default_name.empty() || cat.default_name == default_kernel
                            ? "a POST /api/kernels without \"name\" fails"
                            : "kernels without a \"name\" start " + cat.default_name + " instead";
  return "default_kernel = \"" + default_kernel + "\" (kgate.toml [server]) " + what + "; " + instead +
         ". Kernelspecs: " + (names.empty() ? "none" : names) + " (kgate kernelspecs lists them)";
}

void start_kernel_as_post(Services& server, const json& body, unsigned version, Respond respond) {
  Request req{http::verb::post, "/api/kernels", version};
  req.body() = body.dump();
  req.prepare_payload();
  api_kernels_post(server, req, RequestContext{true, false, nullptr}, std::move(respond));
}

// ---- The handlers of the Jupyter API's routes (routes.cpp) ----

void api_root(Call& c) {
  json ext = {{"version", 1},
              {"base", c.services.options().base_url + "api/kgate/"},
              {"records", c.services.jobs().limits().enabled},
              {"features", {"jobs", "agent", "claims", "stop", "digest", "notebook", "observe", "attach"}}};
  c.respond(json_response(c.req, http::status::ok,
                          json{{"version", kgate::version()}, {"server", "kgate"}, {"extensions", {{"kgate", ext}}}}.dump()));
}

void api_status(Call& c) {
  json j = {{"started", c.services.started()},
            {"last_activity", c.services.last_activity()},
            {"kernels", c.services.manager().count()},
            {"connections", c.services.hub().connections()}};
  c.respond(json_response(c.req, http::status::ok, j.dump()));
}

void kernels_list(Call& c) {
  json list = json::array();
  for (auto& k : c.services.manager().list()) list.push_back(model_json(k->model()));
  c.respond(json_response(c.req, http::status::ok, kgate::dump_json(list)));
}

void kernels_start(Call& c) { api_kernels_post(c.services, c.req, c.ctx, std::move(c.respond)); }

void kernel_get(Call& c) {
  auto k = c.services.manager().get(c.param(0));
  if (!k) return c.respond(json_error(c.req, http::status::not_found, "Kernel does not exist: " + c.param(0)));
  c.respond(json_response(c.req, http::status::ok, kgate::dump_json(model_json(k->model()))));
}

void kernel_delete(Call& c) { kernel_action(c.services, c.req, c.param(0), "delete", std::move(c.respond)); }
void kernel_interrupt(Call& c) { kernel_action(c.services, c.req, c.param(0), "interrupt", std::move(c.respond)); }
void kernel_restart(Call& c) { kernel_action(c.services, c.req, c.param(0), "restart", std::move(c.respond)); }

namespace {

// GET /api/kernelspecs[/{name}]: from the catalog once discovery has one (Server::with_catalog).
void answer_kernelspecs(Call& c, const std::string& name) {
  Request fake;
  fake.version(c.req.version());
  fake.keep_alive(c.req.keep_alive());
  Services& server = c.services;
  server.with_catalog([&server, name, fake = std::move(fake), respond = std::move(c.respond)](
                          std::shared_ptr<const Catalog> cat) {
    if (name.empty()) return respond(json_response(fake, http::status::ok, server.kernelspecs_body(cat)));
    const CatalogEntry* e = cat->find(name);
    if (!e || !e->launchable)
      return respond(json_error(fake, http::status::not_found,
                                "Kernel spec " + name + " not found" + (e ? " (" + e->reason + ")" : "")));
    respond(json_response(fake, http::status::ok, kgate::dump_json(kernelspec_json(server, e->spec))));
  }, name);
}

}  // namespace

void kernelspecs_list(Call& c) { answer_kernelspecs(c, ""); }
void kernelspec_get(Call& c) { answer_kernelspecs(c, c.param(0)); }

void kernelspec_resource(Call& c) {
  // Any regular file of the kernelspec's directory, subdirectories too; the file must really be
  // inside it (kernelspec_file).  From the newest catalog there is: no wait for a logo.
  auto cat = c.services.discovery().snapshot();
  const std::string& name = c.param(0);
  const std::string& file = c.param(1);
  const CatalogEntry* entry = cat->find(name);
  auto real = entry ? kernelspec_file(entry->spec.resource_dir, file) : std::nullopt;
  std::ifstream in;
  if (real) in.open(*real, std::ios::binary);
  if (!real || !in)
    return c.respond(json_error(c.req, http::status::not_found, "No file " + file + " in kernel spec " + name));
  std::ostringstream ss;
  ss << in.rdbuf();
  Response res{http::status::ok, c.req.version()};
  res.set(http::field::server, kgate::server_header());
  res.set(http::field::content_type, kernelspec_content_type(file));
  res.set("X-Content-Type-Options", "nosniff");
  res.set(http::field::cache_control, "max-age=2592000");
  res.keep_alive(c.req.keep_alive());
  res.body() = ss.str();
  res.prepare_payload();
  c.respond(std::move(res));
}

void root_redirect(Call& c) {
  Response res{http::status::found, c.req.version()};
  res.set(http::field::server, kgate::server_header());
  res.set(http::field::location, c.services.options().base_url + "observe" + (c.query.empty() ? "" : "?" + c.query));
  res.keep_alive(c.req.keep_alive());
  res.prepare_payload();
  c.respond(std::move(res));
}

void observe(Call& c) { c.respond(observe_page(c.req)); }

}  // namespace kgate::gw
