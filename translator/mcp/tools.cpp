// The Translator: the current-kernel pointer, the agent links, the gateway a call means, and
// the kernels it makes (see tools.hpp).  The tools are one table, tool_table.cpp; their bodies
// are tool_execute.cpp, tool_kernels.cpp and tool_verify.cpp.
#include "tool_util.hpp"
#include "install_inspectors_py.hpp"
#include "startup_wrapper_py.hpp"

namespace kgate::mcp {

// ---------------------------------------------------------------------------------------

Hosting Hosting::stdio_process() { return Hosting{"kgate-mcp pid " + std::to_string(::getpid()), true, false}; }

Translator::Translator(Config cfg, Hosting hosting)
    : cfg_(std::move(cfg)), hosting_(std::move(hosting)), agent_("kgate-mcp-" + new_hex_id().substr(0, 12)) {
  label_ = "an MCP client (" + hosting_.where + ")";  // until the client names itself
}

Translator::~Translator() {
  drop_links();
  channel_.close();
}

void Translator::cancelled(Call& c) {
  // The waiting execute sees call.cancelled within a slice and stops its job itself.
  spdlog::info("call {} cancelled", c.id.dump());
}

void Translator::ending() {
  std::vector<std::pair<std::string, Target>> calls;  // (its job, or "" before the POST answered)
  {
    std::lock_guard lk(calls_mu_);
    for (const auto& [call, t] : call_targets_)
      if (t.cur.kgate) {
        auto it = call_jobs_.find(call);
        calls.emplace_back(it == call_jobs_.end() ? "" : it->second, t);
      }
  }
  // Each call would interrupt its job itself, but only once its wait's slice (1 s) ends, and the
  // end must be over well before that (ServerOptions::eof_grace).
  std::set<std::string> done;
  for (auto& [job, t] : calls) {
    if (job.empty()) {
      // The execute POST has not answered (kgate holds it up to a slice for a quick cell): its
      // job is the kernel's running one if that is this agent's foreground cell. (Another cell
      // of this agent cannot be running there: the POST would have been refused as busy.)
      auto k = t.http->get("api/kgate/kernels/" + t.cur.kernel, 2s).json_body();
      if (!k.is_object() || !k["running_job"].is_string()) continue;
      std::string running = k["running_job"].get<std::string>();
      auto j = t.http->get("api/kgate/jobs/" + running, 2s).json_body();
      if (!j.is_object() || j.value("agent", json()) != json(agent_) || j.value("task", false)) continue;
      job = running;
    }
    if (!done.insert(job).second) continue;
    auto r = t.http->post("api/kgate/jobs/" + job + "/interrupt", json{{"agent", agent_}}, 2s);
    spdlog::info("{}: interrupted, as the conversation ends ({})", job, r.status == 200 ? "done" : r.message());
  }
}

void Translator::client_info(const std::string& name, const std::string& /*version*/) {
  if (name.empty() || name == "?") return;
  std::lock_guard lk(mu_);
  label_ = name.substr(0, 64) + " (" + hosting_.where + ")";
}

std::string Translator::label() {
  std::lock_guard lk(mu_);
  return label_;
}

void Translator::shutdown() {
  // A kernel whose POST is in flight becomes current when it returns, so it is stopped below, not
  // leaked. Setup (startup.py) that runs after it is not waited for.
  std::optional<Current> cur;
  {
    std::unique_lock lk(mu_);
    // kgate culls what a marked POST makes once this agent is gone, so that wait is short: the
    // end must be over before the client's SIGKILL (ServerOptions::eof_grace).
    if (!posted_.wait_for(lk, posting_marked_ ? 200ms : kCreateTimeout + 5s, [this] { return !posting_; }))
      spdlog::warn(posting_marked_ ? "a kernel create is still in flight; kgate stops the kernel it makes, as this "
                                     "conversation's, once the conversation is gone"
                                   : "a kernel create did not answer in time; a kernel it makes may be left running");
    cur = current_;
    current_.reset();
    if (cur && !cur->auto_kernel && cur->kernel == setting_up_) {
      spdlog::info("kernel {}: its connect had not answered (setup still running), so it is stopped", cur->kernel);
      cur->auto_kernel = true;
    }
  }
  if (cur && cur->auto_kernel) {
    // kgate answers 202 once the stop has begun, not when the kernel is down (which can take a
    // second or more). Another gateway answers when it is down; the request is sent in full
    // long before the timeout, and that gateway goes on with it after it.
    auto r = client(cur->ep)->request("DELETE", "api/kernels/" + cur->kernel, nullptr, cur->kgate ? 3s : 1s,
                                      {{"Prefer", "respond-async"}});
    if (r.status == 202)
      spdlog::info("stopping the auto kernel {}", cur->kernel);
    else if (r.status == 204 || r.status == 404)
      spdlog::info("stopped the auto kernel {}", cur->kernel);
    else
      spdlog::warn("could not stop the auto kernel {}: {}", cur->kernel, r.message());
  }
  channel_.close();
  drop_links();  // closed with 1000: kgate frees this agent's claims at once
}

void Translator::hold_link(const Endpoint& ep) {
  // How long the first call on a gateway waits for its link. Until it is up, a claim this call
  // takes would outlive the process by claim_grace, since the exit's close frame cannot be sent.
  constexpr auto kFirstConnect = 3s;
  std::shared_ptr<AgentLink> link;
  std::chrono::steady_clock::time_point started;
  {
    std::lock_guard lk(links_mu_);
    auto& l = links_[ep.url];
    if (!l.link) {
      l.link = std::make_shared<AgentLink>();
      l.link->start(ep, agent_, label());
      l.started = std::chrono::steady_clock::now();
    }
    link = l.link;
    started = l.started;
  }
  while (!link->connected() && std::chrono::steady_clock::now() < started + kFirstConnect)
    std::this_thread::sleep_for(10ms);
}

void Translator::drop_links() {
  std::map<std::string, Link> links;
  {
    std::lock_guard lk(links_mu_);
    links.swap(links_);
  }
  for (auto& [url, l] : links) l.link->stop();
}

std::optional<Translator::Current> Translator::current() {
  std::lock_guard lk(mu_);
  return current_;
}

bool Translator::endpoint_for(const std::string& host, const std::optional<Current>& cur, Endpoint& ep,
                              std::string& error) {
  if (host.empty() && cur) {
    ep = cur->ep;
    return true;
  }
  return resolve(host, ep, error);
}

bool Translator::resolve(const std::string& host, Endpoint& ep, std::string& error) {
  if (hosting_.this_gateway_only && !host.empty()) {
    error = "host '" + host + "': this MCP server is kgate's own /mcp, which serves this kgate's kernels only "
            "(leave host empty). For other gateways, run kgate-mcp with their gateways.toml entries.";
    return false;
  }
  return resolve_gateway(cfg_, host, ep, error);
}

std::shared_ptr<HttpClient> Translator::client(const Endpoint& ep) {
  std::lock_guard lk(clients_mu_);
  auto& c = clients_[ep.url + "#" + ep.name];
  if (!c) c = std::make_shared<HttpClient>(ep);
  return c;
}

void Translator::make_current(Current cur) {
  {
    std::lock_guard lk(mu_);
    current_ = cur;
  }
  if (cur.kgate) hold_link(cur.ep);
  std::string err;
  if (!channel_.open(cur.ep, cur.kernel, agent_, 10s, err))
    spdlog::warn("kernel {}: {} (images will be missing)", cur.kernel, err);
}

std::optional<Translator::Target> Translator::target(const json& args, std::string& error) {
  std::string prefix = str_arg(args, "kernel");
  std::optional<Current> cur = current();
  if (prefix.empty()) {
    if (!cur) {
      error = hosting_.stateless
                  ? "pass kernel: this MCP server keeps nothing between requests (MCP 2026-07-28, stateless); "
                    "connect names a kernel id, list_kernels lists them"
                  : "no current kernel: call connect (or execute, which makes one), or pass a kernel id from list_kernels";
      return std::nullopt;
    }
    return Target{*cur, client(cur->ep)};
  }
  Endpoint ep;
  if (!endpoint_for("", cur, ep, error)) return std::nullopt;
  auto http = client(ep);
  auto r = http->get("api/kernels");
  if (r.status != 200) {
    error = "cannot list the kernels of " + ep.url + ": " + r.message();
    return std::nullopt;
  }
  const std::vector<std::string> matches = kgate::client::kernels_matching(r.json_body(), prefix);
  if (matches.empty()) {
    error = "no kernel matching '" + prefix + "' on " + ep.url;
    return std::nullopt;
  }
  if (matches.size() > 1) {
    error = "'" + prefix + "' matches " + std::to_string(matches.size()) + " kernels; give more of the id";
    return std::nullopt;
  }
  Current t;
  t.ep = ep;
  t.kernel = matches[0];
  if (cur) {
    t.kgate = cur->kgate;
  } else {
    auto api = http->get("api", 10s);
    json apij = api.json_body();
    t.kgate = api.status != 200 || (apij.is_object() && apij.contains("extensions") && apij["extensions"].contains("kgate"));
  }
  if (cur && cur->kernel == t.kernel) t = *cur;
  // Acting on a kernel by id, without connect, is acting as this agent all the same: its claim
  // must end with this process, so the link is held from here on.
  if (t.kgate) hold_link(ep);
  // A stateless request has no current kernel, whose websocket would bring the cell's outputs
  // as they are (streams by name, images): it opens one for the kernel it acts on.
  if (hosting_.stateless && t.kgate && (!channel_.is_open() || channel_.kernel() != t.kernel)) {
    std::string err;
    if (!channel_.open(ep, t.kernel, agent_, 10s, err))
      spdlog::warn("kernel {}: {} (outputs come from the records: no images)", t.kernel, err);
  }
  return Target{t, http};
}

bool Translator::run_setup(const Target& t, std::string& output, std::string& error) {
  auto run_snippet = [&](const std::string& code, const std::string& what) -> std::optional<json> {
    std::string job, refusal;
    bool still = false;
    std::vector<CellOutput> direct;
    json rec = run_cell(t, code, kSetupTimeout, /*host=*/true, nullptr, job, still, refusal, &direct);
    if (!t.cur.kgate) {
      // A stock server has no records: keep the outputs in the record's shape.
      std::string text;
      for (auto& o : direct) {
        if (o.kind == CellOutput::Kind::stream) text += o.text;
        if (o.kind == CellOutput::Kind::error) text += o.ename + ": " + o.evalue + "\n";
      }
      rec["output"] = text;
      rec["status"] = rec.value("status", "ok") == "ok" && !std::any_of(direct.begin(), direct.end(), [](auto& o) {
        return o.kind == CellOutput::Kind::error; }) ? "ok" : "error";
    }
    if (!refusal.empty()) {
      error = what + " could not run: " + refusal;
      return std::nullopt;
    }
    if (still) {
      error = what + " was still running after " + std::to_string(int(kSetupTimeout)) + " s (" + job + ")";
      return std::nullopt;
    }
    return rec;
  };
  if (auto src = read_file(cfg_.startup_file())) {
    auto rec = run_snippet(py_template(kStartupWrapperPy, *src, cfg_.startup_file().string()), "startup.py");
    if (!rec) return false;
    if (rec->is_object() && rec->contains("output")) {
      std::string text = render_text(outputs_from_record(*rec));
      if (!text.empty()) output += text;
    }
  }
  if (auto src = read_file(cfg_.inspectors_file())) {
    auto rec = run_snippet(py_template(kInstallInspectorsPy, *src, cfg_.inspectors_file().string()), "inspectors.py");
    if (!rec) return false;
    if (rec->is_object() && status_of(*rec) != "ok") {
      error = "inspectors.py failed to load:\n" + render_text(outputs_from_record(*rec));
      return false;
    }
  }
  return true;
}

bool Translator::is_token_env(const std::string& name) const {
  for (const auto& [gname, g] : cfg_.gateways)
    if (g.token_env == name) return true;
  return false;
}

json Translator::own_environment(const Endpoint& ep) const {
  json body = json::object();
  if (!ep.is_default || !hosting_.send_environment) return body;
  json env = json::object();
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    std::string name = kv.substr(0, eq);
    // kgate-mcp's own settings and every gateway's token stay here: a kernel's code (and so the
    // model) would read them (docs/dev/security.md, "Tokens a client sends").
    if (name.rfind("KGATE_", 0) == 0 || is_token_env(name)) continue;
    env[name] = kv.substr(eq + 1);
  }
  body["env"] = env;
  std::error_code ec;
  auto cwd = std::filesystem::current_path(ec);
  if (!ec) body["cwd"] = cwd.string();
  return body;
}

json Translator::new_kernel_body(const Endpoint& ep, const std::string& launcher) const {
  if (launcher.empty()) return own_environment(ep);
  // Another machine: this conversation's environment is not its own (PATH, a venv), only its
  // working directory may be (a shared filesystem).
  json body = {{"kgate_launcher", launcher}};
  std::error_code ec;
  auto cwd = std::filesystem::current_path(ec);
  if (!ec && ep.is_default && hosting_.send_environment) body["cwd"] = cwd.string();
  return body;
}

std::string Translator::create_kernel(const Endpoint& ep, bool auto_kernel, std::string& error, bool& fatal,
                                      const std::string& launcher) {
  fatal = false;
  auto http = client(ep);
  auto api = http->get("api", 10s);
  if (api.status != 200) {
    error = "cannot reach the gateway at " + ep.url + ": " + api.message() +
            (ep.is_default ? ". Start it (scripts/start.sh or `kgate serve`), or set KGATE_URL." : "");
    return "";
  }
  json apij = api.json_body();
  bool kgate = apij.is_object() && apij.contains("extensions") && apij["extensions"].contains("kgate");
  json body = new_kernel_body(ep, launcher);
  // kgate stops it if this process dies without doing so (README "The end of a conversation").
  if (auto_kernel && kgate && !hosting_.stateless) body["kgate_conversation"] = agent_;
  // Stateless (/mcp, 2026-07-28): the conversation's end is never seen, so kgate culls the kernel
  // once it has been idle this long (unless a client is attached), and this request does not stop it.
  const bool culled_later = auto_kernel && hosting_.stateless;
  if (culled_later && kgate) body["kgate_cull_idle_timeout"] = kStatelessKernelIdle;
  if (culled_later) auto_kernel = false;
  // The agent's link is open before the POST, so kgate never takes this agent for gone while
  // the kernel starts (a start can outlast claim_grace + auto_kernel_grace when those are short).
  if (body.contains("kgate_conversation")) hold_link(ep);
  {
    std::lock_guard lk(mu_);
    posting_ = true;
    posting_marked_ = body.contains("kgate_conversation");
  }
  auto r = http->post("api/kernels", body, kCreateTimeout);
  const bool queued = r.status == 202;  // kgate: a launcher's job still waits in its queue
  std::string id = r.status == 201 || r.status == 200 || queued ? r.json_body().value("id", "") : "";
  Current cur{ep, id, auto_kernel, true, kgate, launcher, queued};
  if (!id.empty()) make_current(cur);
  {
    std::lock_guard lk(mu_);
    posting_ = false;
    setting_up_ = id;
  }
  posted_.notify_all();
  struct SetupDone {
    Translator* t;
    ~SetupDone() {
      std::lock_guard lk(t->mu_);
      t->setting_up_.clear();
    }
  } setup_done{this};
  if (id.empty()) {
    error = "could not create a kernel on " + ep.url + ": " +
            (r.status == 201 || r.status == 200 ? std::string("the reply names no kernel id") : r.message());
    return "";
  }
  std::string out = (auto_kernel ? "(created an auto kernel " : culled_later ? "(created kernel " : "created kernel ") +
                    id + " on " + ep.url + (launcher.empty() ? "" : " (launcher " + launcher + ")") +
                    (auto_kernel ? " for this conversation; it stops when the conversation ends unless you connect to it)"
                     : culled_later
                         ? " for this conversation: pass kernel='" + id + "' to the calls that follow. This server "
                           "keeps nothing between requests, so the kernel is stopped after " +
                           std::to_string(kStatelessKernelIdle / 60) + " min idle)"
                         : "");
  if (queued)
    return out + "\nqueued as " + queue_text(r.json_body()) +
           "; poll with server_status. execute works once it runs (startup.py runs first).";
  std::string setup_out, setup_err;
  if (!run_setup(Target{cur, http}, setup_out, setup_err)) {
    http->request("DELETE", "api/kernels/" + id, nullptr, 15s);
    {
      std::lock_guard lk(mu_);
      if (current_ && current_->kernel == id) current_.reset();
    }
    channel_.close();
    error = setup_err + "\nThe kernel was stopped.";
    fatal = true;
    return "";
  }
  if (!kgate) out += "\nnote: " + ep.url + " is not a kgate gateway: claims, job records and notes about the user's cells are unavailable.";
  if (!setup_out.empty()) out += "\n" + setup_out;
  return out;
}

}  // namespace kgate::mcp
