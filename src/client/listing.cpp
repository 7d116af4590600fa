// Listing a gateway's kernelspecs, kernels and sessions (see remote.hpp).
#include "kgate/client/listing.hpp"

#include "kgate/client/gateways_toml.hpp"

#include <utility>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/tcp_stream.hpp>

#include "kgate/jupyter/utf8.hpp"

namespace kgate::client {

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr const char* kSpecs = "api/kernelspecs";
constexpr const char* kKernels = "api/kernels";
constexpr const char* kSessions = "api/sessions";
constexpr const char* kKgateKernels = "api/kgate/kernels";
constexpr const char* kKgateLaunchers = "api/kgate/launchers";
constexpr auto kTlsProbeTimeout = std::chrono::seconds(2);

// JSON reads that never throw on a wrong type.
std::string str(const json& o, const char* key, const std::string& fallback = "") {
  if (!o.is_object()) return fallback;
  auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : fallback;
}

int num(const json& o, const char* key) {
  if (!o.is_object()) return 0;
  auto it = o.find(key);
  return it != o.end() && it->is_number_integer() ? it->get<int>() : 0;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// What the gateway's token comes from, for the message about a refused one.
bool named_entry(const Endpoint& ep) { return !ep.is_default && !ep.name.empty() && !contains(ep.name, "://"); }

std::string token_advice(const Endpoint& ep) {
  if (named_entry(ep)) return "check token / token_env of [gateways." + ep.name + "] in gateways.toml";
  if (!ep.is_default && !contains(ep.name, "://")) return "check $KGATE_TOKEN (or name the gateway in gateways.toml with its token)";
  if (!ep.is_default) return "check the token of the gateways.toml entry with this URL";
  return "check $KGATE_TOKEN (or name the gateway in gateways.toml with its token)";
}

std::string auth_message(const Endpoint& ep, int status, const std::string& server_message) {
  std::string code = "HTTP " + std::to_string(status);
  if (send_token(ep).empty())
    return "the gateway at " + ep.url + " requires a token (" + code + ") and none was sent: " +
           (named_entry(ep) ? "set token or token_env in [gateways." + ep.name + "] of gateways.toml"
            : ep.is_default ? "set $KGATE_TOKEN (kgate's own token goes only to a kgate of this user's on "
                              "loopback), or name the gateway in gateways.toml with its token"
                            : "a URL given as host gets no token; name the gateway in gateways.toml with its "
                              "token (its url = this URL), or make it the default with $KGATE_URL and $KGATE_TOKEN");
  // kgate's 403 for a Host or Origin it does not allow is not about the token: say what it said.
  if (status == 403 && !server_message.empty() && server_message != "Forbidden" && !contains(server_message, "token"))
    return "the gateway at " + ep.url + " refused the request (" + code + ": " + server_message + "); if it is the token, " +
           token_advice(ep);
  return "the gateway at " + ep.url + " refused the token (" + code + "): " + token_advice(ep);
}

// A few printable characters of a body, for "not JSON" messages.
std::string excerpt(const std::string& body) {
  std::string out;
  for (char c : body.substr(0, 60)) out += (c >= 0x20 && c < 0x7f) ? c : ' ';
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return body.size() > 60 ? out + "..." : out;
}

std::string seconds(double s) {
  return std::to_string(std::max(1, static_cast<int>(std::lround(s)))) + " s";
}

// Sends the start of a TLS ClientHello and looks at the first bytes of the answer: a TLS record
// (handshake 0x16 or alert 0x15, then version 3.x) means an https server.  Bounded by 2 s.
bool speaks_tls(const Endpoint& ep) {
  static const unsigned char hello[] = {
      0x16, 0x03, 0x01, 0x00, 0x3b,                      // record: handshake, TLS 1.0, 59 bytes
      0x01, 0x00, 0x00, 0x37,                            // ClientHello, 55 bytes
      0x03, 0x03,                                        // TLS 1.2
      0x6b, 0x67, 0x61, 0x74, 0x65, 0x2d, 0x74, 0x6c, 0x73, 0x2d, 0x70, 0x72, 0x6f, 0x62, 0x65, 0x2d,  // random
      0x6b, 0x67, 0x61, 0x74, 0x65, 0x2d, 0x74, 0x6c, 0x73, 0x2d, 0x70, 0x72, 0x6f, 0x62, 0x65, 0x21,
      0x00,                                              // no session id
      0x00, 0x10, 0xc0, 0x2f, 0xc0, 0x30, 0xc0, 0x2b, 0xc0, 0x2c, 0x00, 0x9c, 0x00, 0x9d, 0x00, 0x2f, 0x00, 0x35,
      0x01, 0x00,                                        // compression: null
  };
  net::io_context ioc{1};
  beast::tcp_stream stream(ioc);
  tcp::resolver resolver(ioc);
  std::array<unsigned char, 8> answer{};
  std::size_t got = 0;
  resolver.async_resolve(ep.host, ep.port, [&](beast::error_code ec, tcp::resolver::results_type results) {
    if (ec) return;
    stream.expires_after(kTlsProbeTimeout);
    stream.async_connect(results, [&](beast::error_code cec, const tcp::endpoint&) {
      if (cec) return;
      net::async_write(stream, net::buffer(hello), [&](beast::error_code wec, std::size_t) {
        if (wec) return;
        net::async_read(stream, net::buffer(answer), net::transfer_at_least(3),
                        [&](beast::error_code, std::size_t n) { got = n; });
      });
    });
  });
  ioc.run_for(kTlsProbeTimeout + std::chrono::milliseconds(500));
  return got >= 3 && (answer[0] == 0x16 || answer[0] == 0x15) && answer[1] == 0x03 && answer[2] <= 0x04;
}

std::string tls_message(const Endpoint& ep) {
  std::string https = ep.url;
  https.replace(0, https.find("://"), "https");
  return "the server at " + ep.url + " speaks TLS (it is an https server): use " + https;
}

// Transport failures (no HTTP answer) as one clear sentence naming the URL.  `maybe_tls` is set
// when the server answered something that is not HTTP, or hung up: worth a TLS probe.
std::string transport_message(const Endpoint& ep, const std::string& error, double elapsed, bool& maybe_tls) {
  maybe_tls = false;
  if (starts_with(error, "no answer from ")) return "cannot reach " + ep.url + ": no answer within " + seconds(elapsed);
  if (starts_with(error, "connection refused"))
    return "cannot reach " + ep.url + ": connection refused (is the gateway running, on that port?)";
  std::string what = starts_with(error, ep.url + ": ") ? error.substr(ep.url.size() + 2) : error;
  if (starts_with(what, "TLS: ")) return "cannot reach " + ep.url + ": " + what;  // names the failure itself
  if (starts_with(what, "cannot connect to ")) return what;  // a unix:// socket: names the path and the fix
  if (contains(what, "Host not found") || contains(what, "not known") || contains(what, "resolve"))
    return "cannot reach " + ep.url + ": the name '" + ep.host + "' does not resolve (" + what + ")";
  if (contains(what, "unreachable") || contains(what, "No route"))
    return "cannot reach " + ep.url + ": " + what;
  if (starts_with(what, "bad ") || contains(what, "end of stream") || contains(what, "partial message") ||
      contains(what, "short read") || contains(what, "reset by peer") || contains(what, "End of file")) {
    maybe_tls = true;
    return "the server at " + ep.url + " did not answer HTTP (" + what +
           "): is it a Jupyter server, and is it plain http (not https/TLS)?";
  }
  return "cannot reach " + ep.url + ": " + what;
}

struct Fetched {
  HttpResult r;
  double elapsed = 0;  // seconds
  bool done = false;
};

// Runs the GETs in parallel; a request still out after `total` is left to finish on its own
// thread (it holds `http`) and reported as unanswered.  The threads that answered are joined,
// so their thread-local state (OpenSSL's per-thread random generator) is freed before the
// caller goes on and, in the CLI, exits.
std::vector<Fetched> fetch_all(const std::shared_ptr<HttpClient>& http, const std::vector<std::string>& paths,
                               const RemoteOptions& opts) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Fetched> out;
    std::size_t left = 0;
  };
  auto sh = std::make_shared<Shared>();
  sh->out.resize(paths.size());
  sh->left = paths.size();
  auto began = Clock::now();
  std::vector<std::thread> threads;
  threads.reserve(paths.size());
  for (std::size_t i = 0; i < paths.size(); ++i) {
    threads.emplace_back([sh, http, path = paths[i], i, timeout = opts.per_request, began] {
      HttpResult r = http->get(path, timeout);
      double elapsed = std::chrono::duration<double>(Clock::now() - began).count();
      std::lock_guard lk(sh->mu);
      sh->out[i] = Fetched{std::move(r), elapsed, true};
      --sh->left;
      sh->cv.notify_all();
    });
  }
  std::unique_lock lk(sh->mu);
  sh->cv.wait_until(lk, began + opts.total, [&] { return sh->left == 0; });
  std::vector<Fetched> out = sh->out;
  lk.unlock();
  for (std::size_t i = 0; i < threads.size(); ++i) {
    if (out[i].done) threads[i].join();  // past its last lock: returns at once
    else threads[i].detach();
  }
  double total = std::chrono::duration<double>(opts.total).count();
  for (auto& f : out)
    if (!f.done) {
      f.r.status = 0;
      f.r.error = "no answer from " + http->endpoint().url;
      f.elapsed = total;
    }
  return out;
}

// One kernel model of a list; false if it is not one.
bool parse_kernel(const json& k, RemoteKernel& out) {
  if (!k.is_object() || str(k, "id").empty()) return false;
  out.id = str(k, "id");
  out.name = str(k, "name");
  out.execution_state = str(k, "execution_state", "unknown");
  out.connections = num(k, "connections");
  out.last_activity = str(k, "last_activity");
  if (k.contains("kgate_placement") && k["kgate_placement"].is_object()) out.placement = k["kgate_placement"];
  return true;
}

// 42 s, 3 min, 2.5 h, 3 d: a duration for the table.
std::string duration_text(double s) {
  char buf[32];
  if (s < 120) std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s < 7200) std::snprintf(buf, sizeof buf, "%.0f min", s / 60);
  else if (s < 172800) std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  else std::snprintf(buf, sizeof buf, "%.0f d", s / 86400);
  return buf;
}

std::string short_time(const std::string& iso) {
  // 2024-05-01T10:00:00.123456Z -> 2024-05-01T10:00:00Z
  if (iso.size() > 19 && iso[10] == 'T' && iso[19] == '.') return iso.substr(0, 19) + "Z";
  return iso;
}

}  // namespace

std::vector<std::string> kernels_matching(const json& kernels, const std::string& prefix) {
  std::vector<std::string> hits;
  if (!kernels.is_array()) return hits;
  for (const auto& k : kernels) {
    if (!k.is_object() || !k.contains("id") || !k["id"].is_string()) continue;
    const auto& id = k["id"].get_ref<const std::string&>();
    if (id == prefix) return {id};
    if (starts_with(id, prefix)) hits.push_back(id);
  }
  return hits;
}

std::string RemoteListing::error_text() const {
  std::vector<std::string> seen;
  std::string out;
  for (auto& e : errors) {
    if (std::find(seen.begin(), seen.end(), e.message) != seen.end()) continue;
    seen.push_back(e.message);
    out += (out.empty() ? "" : "\n") + e.message;
  }
  return out;
}

RemoteListing list_remote(const Endpoint& ep, const RemoteOptions& opts) {
  return list_remote(std::make_shared<HttpClient>(ep), opts);
}

RemoteListing list_remote(const std::shared_ptr<HttpClient>& http, const RemoteOptions& opts) {
  const Endpoint& ep = http->endpoint();
  RemoteListing l;
  l.url = ep.url;
  l.name = ep.name;
  const std::vector<std::string> paths = {kSpecs, kKernels, kSessions, kKgateKernels, kKgateLaunchers};
  auto got = fetch_all(http, paths, opts);

  bool probe_tls = false;
  // Why `path` failed, as one sentence naming the URL.
  auto error_of = [&](const std::string& path, const Fetched& f) -> std::string {
    const HttpResult& r = f.r;
    if (r.status == 0) {
      bool maybe_tls = false;
      std::string m = transport_message(ep, r.error, f.elapsed, maybe_tls);
      probe_tls = probe_tls || maybe_tls;
      return m;
    }
    if (r.status == 401 || r.status == 403) return auth_message(ep, r.status, r.message());
    if (r.status == 400 && (contains(r.body, "HTTPS port") || contains(r.body, "plain HTTP request")))
      return tls_message(ep);
    if (r.status == 404)
      return "GET " + path + " on " + ep.url + ": HTTP 404 (" + r.message() +
             "): is this a Jupyter server, and is the base path right?";
    return "GET " + path + " on " + ep.url + ": HTTP " + std::to_string(r.status) +
           (r.message() != "HTTP " + std::to_string(r.status) ? " (" + r.message() + ")" : "");
  };
  const std::string sent = send_token(ep);
  auto add_error = [&](const std::string& path, int status, std::string message) {
    if (!sent.empty())  // a server could echo what it was sent: the token never leaves
      for (std::size_t p; (p = message.find(sent)) != std::string::npos;) message.replace(p, sent.size(), "***");
    l.errors.push_back(RemoteError{path, status, std::move(message)});
  };
  // The JSON body of a 200 answer, or nothing with an error recorded for `path`.
  auto body_of = [&](const std::string& path, const Fetched& f) -> std::optional<json> {
    if (f.r.status != 200) {
      add_error(path, f.r.status, error_of(path, f));
      return std::nullopt;
    }
    json j = f.r.json_body();
    if (j.is_discarded()) {
      add_error(path, 200,
                "GET " + path + " on " + ep.url + " answered a body that is not JSON (" +
                    std::to_string(f.r.body.size()) + " bytes: '" + excerpt(f.r.body) +
                    "'): is this a Jupyter server, and is the base path right?");
      return std::nullopt;
    }
    return j;
  };
  auto wrong_shape = [&](const std::string& path, const std::string& expected) {
    add_error(path, 200, "GET " + path + " on " + ep.url + " answered JSON that is not " + expected);
  };

  // Kernelspecs: {"default", "kernelspecs": {name: {"name", "spec": {...}, "resources"}}}.
  if (auto body = body_of(kSpecs, got[0])) {
    const json& j = *body;
    if (!j.is_object() || !j.contains("kernelspecs") || !j["kernelspecs"].is_object()) {
      wrong_shape(kSpecs, "a kernelspec catalog ({\"default\", \"kernelspecs\": {...}})");
    } else {
      l.specs_listed = true;
      l.default_spec = str(j, "default");
      for (auto& [key, s] : j.at("kernelspecs").items()) {
        RemoteSpec spec;
        spec.name = str(s, "name", key);
        json inner = s.is_object() && s.contains("spec") ? s.at("spec") : json();
        spec.display_name = str(inner, "display_name", spec.name);
        spec.language = str(inner, "language");
        spec.is_default = spec.name == l.default_spec;
        l.specs.push_back(std::move(spec));
      }
    }
  }

  // kgate's extension: 404 (or anything but a list) means a stock server, which is no error;
  // a refusal or no answer is said once with the others.
  std::map<std::string, json> ext;
  {
    const Fetched& f = got[3];
    json j = f.r.status == 200 ? f.r.json_body() : json();
    if (j.is_array()) {
      l.kgate = true;
      for (auto& k : j)
        if (k.is_object() && !str(k, "id").empty()) ext[str(k, "id")] = k;
    } else if (f.r.status == 0 || f.r.status == 401 || f.r.status == 403) {
      add_error(kKgateKernels, f.r.status, error_of(kKgateKernels, f));
    }
  }

  // Kernels: [kernel model, ...]; kgate's list stands in if only it answered.
  {
    if (auto body = body_of(kKernels, got[1])) {
      const json& j = *body;
      bool ok = j.is_array();
      std::vector<RemoteKernel> ks;
      for (std::size_t i = 0; ok && i < j.size(); ++i) {
        RemoteKernel k;
        ok = parse_kernel(j[i], k);
        ks.push_back(std::move(k));
      }
      if (!ok) wrong_shape(kKernels, "a list of kernel models ([{\"id\", \"name\", \"execution_state\", ...}])");
      else {
        l.kernels_listed = true;
        l.kernels = std::move(ks);
      }
    }
    if (!l.kernels_listed && l.kgate) {
      for (auto& [id, k] : ext) {
        RemoteKernel rk;
        if (parse_kernel(k, rk)) l.kernels.push_back(std::move(rk));
      }
      l.kernels_listed = true;
    }
    for (auto& k : l.kernels) {
      auto it = ext.find(k.id);
      if (it == ext.end()) continue;
      k.claim = it->second.contains("claim") && it->second["claim"].is_object() ? it->second["claim"] : json(nullptr);
      k.running_job = str(it->second, "running_job");
      auto secs = [&](const char* key) {
        auto v = it->second.find(key);
        return v != it->second.end() && v->is_number() ? v->get<double>() : -1.0;
      };
      k.age_seconds = secs("age_seconds");
      k.idle_seconds = secs("idle_seconds");
      k.cull_after_seconds = secs("cull_after_seconds");
    }
  }

  // kgate's launchers: {"launchers": [{"name", "kind", "usable", "reason"}]}; none elsewhere.
  if (l.kgate && got[4].r.status == 200) {
    json j = got[4].r.json_body();
    if (j.is_object() && j.contains("launchers") && j["launchers"].is_array())
      for (auto& x : j["launchers"]) {
        if (!x.is_object()) continue;
        RemoteLauncher rl{str(x, "name"), str(x, "kind"), str(x, "reason"),
                          x.contains("usable") && x["usable"].is_boolean() && x["usable"].get<bool>()};
        if (!rl.name.empty()) l.launchers.push_back(std::move(rl));
      }
  }

  // Sessions: [{"id", "path", "name", "type", "kernel": {...}}]; kgate keeps none (404).
  {
    const Fetched& f = got[2];
    if (f.r.status == 404) {
      l.sessions_supported = false;
    } else if (auto body = body_of(kSessions, f)) {
      const json& j = *body;
      if (!j.is_array()) {
        wrong_shape(kSessions, "a list of sessions");
      } else {
        l.sessions_supported = true;
        for (auto& s : j) {
          if (!s.is_object()) continue;
          RemoteSession rs;
          rs.id = str(s, "id");
          json nb = s.contains("notebook") ? s.at("notebook") : json();
          rs.path = str(s, "path", str(nb, "path"));
          rs.name = str(s, "name", str(nb, "name"));
          rs.type = str(s, "type", "notebook");
          rs.kernel = s.contains("kernel") ? str(s.at("kernel"), "id") : "";
          l.sessions.push_back(std::move(rs));
        }
      }
    }
  }

  if (probe_tls && ep.scheme == "http" && speaks_tls(ep))
    for (auto& e : l.errors)
      if (e.status == 0) e.message = tls_message(ep);
  return l;
}

std::string placement_text(const json& p) {
  std::string where = "on " + str(p, "launcher", "?");
  const std::string job = str(p, "job_id"), state = str(p, "state"), reason = str(p, "reason");
  const std::string host = str(p, "node", str(p, "host"));
  if (!job.empty()) where += ": Slurm job " + job;
  if (!state.empty()) where += " " + state + (reason.empty() ? "" : " (" + reason + ")");
  if (!host.empty()) where += " on " + host;
  return where;
}

std::string render_text(const RemoteListing& l, const RenderMarks& marks) {
  std::string out = "gateway ";
  if (!l.name.empty() && l.name != l.url) out += l.name + ": ";
  out += l.url + (l.kgate ? " (kgate)" : " (a Jupyter server without kgate's extensions: no claims or records)") + "\n";

  if (l.specs_listed) {
    out += "kernelspecs";
    if (!l.default_spec.empty()) out += " (default: " + l.default_spec + ")";
    if (l.specs.empty()) out += ": none\n";
    else {
      out += ":\n";
      std::vector<std::vector<std::string>> rows;
      for (auto& s : l.specs) rows.push_back({s.name, s.display_name, s.language});
      out += format_table(rows, "  ");
    }
  }

  std::map<std::string, std::vector<const RemoteSession*>> by_kernel;
  for (auto& s : l.sessions) by_kernel[s.kernel].push_back(&s);
  if (l.kernels_listed) {
    if (l.kernels.empty()) out += "kernels: none\n";
    else {
      out += "kernels (" + std::to_string(l.kernels.size()) + "):\n";
      std::vector<std::vector<std::string>> rows;
      for (auto& k : l.kernels) {
        std::string notes;
        auto add = [&](const std::string& n) { notes += (notes.empty() ? "" : "  ") + n; };
        if (k.claim.is_object()) {
          std::string agent = str(k.claim, "agent");
          std::string who = !marks.self_agent.empty() && agent == marks.self_agent ? "you" : str(k.claim, "label", agent);
          bool alive = k.claim.contains("alive") && k.claim["alive"].is_boolean() && k.claim["alive"].get<bool>();
          add("held by " + who + (alive ? "" : " (gone)"));
        }
        if (!k.running_job.empty()) add("running " + k.running_job);
        if (k.age_seconds >= 0) add("age " + duration_text(k.age_seconds));
        if (k.idle_seconds >= 0) add("idle " + duration_text(k.idle_seconds));
        if (k.cull_after_seconds >= 0) add("culled after " + duration_text(k.cull_after_seconds) + " idle");
        if (k.placement.is_object()) add(placement_text(k.placement));
        auto it = by_kernel.find(k.id);
        if (it != by_kernel.end())
          for (auto* s : it->second) add("session " + (s->path.empty() ? s->name : s->path));
        if (!marks.current_kernel.empty() && k.id == marks.current_kernel) add("<- current");
        rows.push_back({k.id, k.name, k.execution_state, "connections=" + std::to_string(k.connections),
                        k.last_activity.empty() ? "" : "active " + short_time(k.last_activity), notes});
      }
      out += format_table(rows, "  ");
    }
  }

  if (l.launchers.size() > 1) {  // "local" alone goes without saying
    out += "launchers (connect(launcher=NAME) or POST kgate_launcher):\n";
    std::vector<std::vector<std::string>> rows;
    for (auto& x : l.launchers)
      rows.push_back({x.name, x.kind, x.usable ? "usable" : "not usable: " + x.reason});
    out += format_table(rows, "  ");
  }

  if (l.sessions_supported) {
    if (l.sessions.empty()) out += "sessions: none\n";
    else {
      out += "sessions (" + std::to_string(l.sessions.size()) + "):\n";
      std::vector<std::vector<std::string>> rows;
      for (auto& s : l.sessions)
        rows.push_back({s.path.empty() ? s.name : s.path, s.type, "kernel " + (s.kernel.empty() ? "?" : s.kernel)});
      out += format_table(rows, "  ");
    }
  } else if (l.kernels_listed) {
    out += "sessions: this server keeps none\n";
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

json render_json(const RemoteListing& l) {
  json specs = json::array(), kernels = json::array(), sessions = json::array(), errors = json::array();
  for (auto& s : l.specs)
    specs.push_back({{"name", s.name}, {"display_name", s.display_name}, {"language", s.language}, {"default", s.is_default}});
  for (auto& k : l.kernels) {
    json j = {{"id", k.id}, {"name", k.name}, {"execution_state", k.execution_state},
              {"connections", k.connections}, {"last_activity", k.last_activity}};
    if (l.kgate) {
      j["claim"] = k.claim.is_object() ? k.claim : json(nullptr);
      j["running_job"] = k.running_job.empty() ? json(nullptr) : json(k.running_job);
      auto secs = [](double v) { return v >= 0 ? json(v) : json(nullptr); };
      j["age_seconds"] = secs(k.age_seconds);
      j["idle_seconds"] = secs(k.idle_seconds);
      j["cull_after_seconds"] = secs(k.cull_after_seconds);
      j["placement"] = k.placement;
    }
    json paths = json::array();
    for (auto& s : l.sessions)
      if (s.kernel == k.id) paths.push_back(s.path.empty() ? s.name : s.path);
    j["sessions"] = paths;
    kernels.push_back(std::move(j));
  }
  for (auto& s : l.sessions)
    sessions.push_back({{"id", s.id}, {"path", s.path}, {"name", s.name}, {"type", s.type}, {"kernel", s.kernel}});
  for (auto& e : l.errors)
    errors.push_back({{"endpoint", e.endpoint}, {"status", e.status}, {"message", e.message}});
  return {{"url", l.url},
          {"name", l.name},
          {"kgate", l.kgate},
          {"sessions_supported", l.sessions_supported},
          {"default_kernelspec", l.default_spec.empty() ? json(nullptr) : json(l.default_spec)},
          {"kernelspecs", l.specs_listed ? specs : json(nullptr)},
          {"kernels", l.kernels_listed ? kernels : json(nullptr)},
          {"sessions", sessions},
          {"launchers", [&] {
             json a = json::array();
             for (auto& x : l.launchers) {
               json j = {{"name", x.name}, {"kind", x.kind}, {"usable", x.usable}};
               if (!x.reason.empty()) j["reason"] = x.reason;
               a.push_back(std::move(j));
             }
             return a;
           }()},
          {"errors", errors}};
}

std::string known_gateways_hint(const Config& cfg) {
  if (!cfg.gateways_error.empty()) return "";
  std::string file = cfg.gateways_file().string();
  if (cfg.gateways.empty()) {
    std::error_code ec;
    return std::filesystem::exists(cfg.gateways_file(), ec) ? "no gateways are configured in " + file
                                                             : "no gateways are configured (" + file + " does not exist)";
  }
  std::string names;
  for (auto& [name, g] : cfg.gateways) names += (names.empty() ? "" : ", ") + name;
  return "known gateways: " + names + " (in " + file + ")";
}

}  // namespace kgate::client
