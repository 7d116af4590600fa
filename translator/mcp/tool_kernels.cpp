// The tools that act on kernels rather than run cells: connect, list_kernels, stop_kernel,
// restart, interrupt and server_status.
#include "tool_util.hpp"

namespace kgate::mcp {

// ---------------------------------------------------------------------------------------
// Tools

bool Translator::finish_pending_setup(const Target& t, std::string& error) {
  auto k = t.http->get("api/kernels/" + t.cur.kernel, 10s);
  if (k.status != 200) {
    error = "kernel " + t.cur.kernel + ": " + k.message();
    return false;
  }
  json kj = k.json_body();
  const std::string state = kj.value("execution_state", "");
  if (state == "starting") {
    error = "kernel " + t.cur.kernel + " is still queued as " + queue_text(kj) +
            ": nothing ran. Poll with server_status, or stop_kernel it.";
    return false;
  }
  if (state == "dead") {
    error = "kernel " + t.cur.kernel + " is dead: " + kj.value("reason", std::string("no reason given"));
    return false;
  }
  std::string out, err;
  if (!run_setup(t, out, err)) {
    error = "kernel " + t.cur.kernel + " runs now, but its setup failed: " + err;
    return false;
  }
  std::lock_guard lk(mu_);
  if (current_ && current_->kernel == t.cur.kernel) current_->setup_pending = false;
  return true;
}

ToolReply Translator::connect(Call& c) {
  std::string host = str_arg(c.arguments, "host");
  std::string prefix = str_arg(c.arguments, "kernel");
  std::string launcher = str_arg(c.arguments, "launcher");
  if (!prefix.empty() && !launcher.empty())
    return text_reply("launcher is for a new kernel; kernel attaches to an existing one: give one of them", true);
  Endpoint ep;
  std::string error;
  if (!resolve(host, ep, error)) return text_reply(error, true);
  std::lock_guard create(create_mu_);
  std::string note;
  std::optional<Current> old;
  {
    std::lock_guard lk(mu_);
    old = current_;
  }
  auto http = client(ep);
  if (!prefix.empty()) {
    auto api = http->get("api", 10s);
    if (api.status != 200) return text_reply("cannot reach the gateway at " + ep.url + ": " + api.message(), true);
    json apij = api.json_body();
    bool kgate = apij.is_object() && apij.contains("extensions") && apij["extensions"].contains("kgate");
    auto r = http->get("api/kernels");
    if (r.status != 200) return text_reply("cannot list the kernels of " + ep.url + ": " + r.message(), true);
    const std::vector<std::string> matches = kgate::client::kernels_matching(r.json_body(), prefix);
    if (matches.empty()) {
      std::string ids;
      for (auto& k : r.json_body()) ids += (ids.empty() ? "" : ", ") + short_id(k.value("id", ""));
      return text_reply("no kernel matching '" + prefix + "' on " + ep.url + (ids.empty() ? " (it has none)" : ": " + ids), true);
    }
    if (matches.size() > 1) return text_reply("'" + prefix + "' matches several kernels; give more of the id", true);
    bool keep_auto = old && old->auto_kernel && old->kernel == matches[0];
    if (old && old->auto_kernel && !keep_auto) {
      auto d = client(old->ep)->request("DELETE", "api/kernels/" + old->kernel, nullptr, 15s);
      if (d.status != 204 && d.status != 404) note = "\nnote: stopping the auto kernel failed (" + d.message() + ")";
    }
    Current cur{ep, matches[0], false, old && old->kernel == matches[0] && old->made, kgate, "", false};
    // Connected to by id, it outlives every conversation: kgate stops it with none (its own
    // auto kernel, or another conversation's, resumed in time).
    if (kgate) http->post("api/kgate/kernels/" + cur.kernel + "/keep", json::object(), 10s);
    make_current(cur);
    std::vector<std::string> to_ack;
    std::string fnote = foreign_note(Target{cur, http}, to_ack);
    std::string text = "connected to existing kernel " + cur.kernel + " on " + ep.url +
                       (keep_auto ? " (it is no longer the auto kernel: it stays after this conversation)" : "") + note +
                       fnote;
    ack(Target{cur, http}, to_ack);
    return text_reply(text);
  }
  if (old && old->auto_kernel) {
    auto d = client(old->ep)->request("DELETE", "api/kernels/" + old->kernel, nullptr, 15s);
    if (d.status != 204 && d.status != 404) note = "\nnote: stopping the auto kernel failed (" + d.message() + ")";
    std::lock_guard lk(mu_);
    current_.reset();
  }
  bool fatal = false;
  std::string text = create_kernel(ep, false, error, fatal, launcher);
  if (!error.empty()) return text_reply(error + note, true);
  return text_reply(text + note);
}

ToolReply Translator::list_kernels(Call& c) {
  std::string host = str_arg(c.arguments, "host");
  std::optional<Current> cur = current();
  Endpoint ep;
  std::string error;
  if (!endpoint_for(host, cur, ep, error)) {
    std::string hint = error.rfind("unknown gateway", 0) == 0 ? known_gateways_hint(cfg_) : "";
    return text_reply(hint.empty() ? error : error + "; " + hint, true);
  }
  RemoteListing l = list_remote(client(ep));
  if (!l.listed_anything()) return text_reply(l.error_text(), true);
  RenderMarks marks;
  marks.self_agent = agent_;
  if (cur && cur->ep.url == ep.url) marks.current_kernel = cur->kernel;
  std::string out = render_text(l, marks);
  if (!l.complete()) out += "\nincomplete: " + l.error_text();
  return text_reply(out);
}

ToolReply Translator::stop_kernel(Call& c) {
  std::string error;
  auto t = target(c.arguments, error);
  if (!t) return text_reply(error, true);
  auto r = t->http->request("DELETE", "api/kernels/" + t->cur.kernel, nullptr, 15s);
  if (r.status != 204 && r.status != 404)
    return text_reply("could not stop kernel " + t->cur.kernel + ": " + r.message(), true);
  bool was_current;
  {
    std::lock_guard lk(mu_);
    was_current = current_ && current_->kernel == t->cur.kernel;
    if (was_current) current_.reset();
  }
  if (was_current) channel_.close();  // the agent link stays: this agent's other claims live on
  return text_reply((r.status == 404 ? "kernel " + t->cur.kernel + " was already gone" : "stopped kernel " + t->cur.kernel) +
                    (was_current ? " (it was the current kernel: the next execute makes a new one)" : ""));
}

ToolReply Translator::restart(Call& c) {
  std::string error;
  auto t = target(c.arguments, error);
  if (!t) return text_reply(error, true);
  HttpResult r = t->cur.kgate
                     ? t->http->post("api/kgate/kernels/" + t->cur.kernel + "/restart", json{{"agent", agent_}, {"label", label()}}, 90s)
                     : t->http->post("api/kernels/" + t->cur.kernel + "/restart", json::object(), 90s);
  if (r.status == 404) {
    // Gone: a fresh kernel on the same gateway, if it was the current one.
    bool current;
    {
      std::lock_guard lk(mu_);
      current = current_ && current_->kernel == t->cur.kernel;
    }
    if (!current) return text_reply("kernel " + t->cur.kernel + " no longer exists", true);
    bool fatal = false;
    std::string text = create_kernel(t->cur.ep, t->cur.auto_kernel, error, fatal, t->cur.launcher);
    if (!error.empty()) return text_reply("kernel " + t->cur.kernel + " was gone, and a fresh one could not be made: " + error, true);
    return text_reply("kernel " + t->cur.kernel + " was gone; " + text +
                      "\nNOTE: this is a fresh interpreter: all earlier state is lost.");
  }
  if (r.status == 0)
    return text_reply("restart did not complete (" + r.error + "): retry, or connect for a fresh kernel; check the gateway if this persists", true);
  if (r.status != 200)
    return text_reply("restart failed: " + sentence(r.message()) + " The kernel is still listed: retry, stop it, or connect for a fresh one.", true);
  // Restarts keep the websocket's kernel; reopen ours so no stale state lingers.
  std::string err;
  if (channel_.kernel() == t->cur.kernel) channel_.open(t->cur.ep, t->cur.kernel, agent_, 10s, err);
  if (!t->cur.made)
    return text_reply("NOTE: the kernel restarted with a fresh interpreter: all state is lost (imports, variables, "
                      "monkeypatches). Redo any setup the task still needs.");
  std::string out, serr;
  if (!run_setup(*t, out, serr)) return text_reply("the kernel restarted, but its setup failed: " + serr, true);
  return text_reply("NOTE: the kernel restarted with a fresh interpreter: startup.py has been re-run (its imports are "
                    "back), but all other state is lost (variables, monkeypatches, other imports). Redo what the task "
                    "still needs." + (out.empty() ? "" : "\n" + out));
}

json Translator::wait_ended(const Target& t, const std::string& job, std::chrono::milliseconds bound, Call& c) {
  auto deadline = std::chrono::steady_clock::now() + bound;
  json rec;
  while (true) {
    double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    auto p = t.http->get("api/kgate/jobs/" + job + "?wait=" + fmt_seconds(std::max(0.0, std::min(left, kSlice))), 30s);
    if (p.status != 200) return rec;
    rec = p.json_body();
    if (!running(rec) || left <= 0 || c.cancelled) return rec;
  }
}

ToolReply Translator::interrupt(Call& c) {
  constexpr auto kEndBound = 5s;  // how long the reply waits for the interrupted job to end
  std::string error;
  auto t = target(c.arguments, error);
  if (!t) return text_reply(error, true);
  if (!t->cur.kgate) {
    auto r = t->http->post("api/kernels/" + t->cur.kernel + "/interrupt", json::object());
    if (r.status != 204) return text_reply("interrupt failed: " + sentence(r.message()), true);
    // No records on a stock server: wait for the kernel to be idle again.
    auto deadline = std::chrono::steady_clock::now() + kEndBound;
    std::string state;
    while (true) {
      auto k = t->http->get("api/kernels/" + t->cur.kernel, 5s);
      state = k.status == 200 ? k.json_body().value("execution_state", "") : "";
      if (state != "busy" || std::chrono::steady_clock::now() >= deadline || c.cancelled) break;
      std::this_thread::sleep_for(100ms);
    }
    if (state == "busy")
      return text_reply("Sent a KeyboardInterrupt, but the kernel is still busy 5 s later (it may be in code that "
                        "does not check for signals). Wait, or restart the kernel.", true);
    return text_reply("Interrupted: the kernel is " + (state.empty() ? std::string("no longer busy") : state) +
                      " again; its state is intact.");
  }
  auto k = t->http->get("api/kgate/kernels/" + t->cur.kernel);
  if (k.status != 200) return text_reply("cannot read kernel " + t->cur.kernel + ": " + k.message(), true);
  json kj = k.json_body();
  std::string job = str_arg(c.arguments, "job");  // a background task beside a user's cell, say
  if (job.empty() && (!kj.contains("running_job") || !kj["running_job"].is_string()))
    return text_reply("nothing is running on kernel " + short_id(t->cur.kernel) + ": there is nothing to interrupt", true);
  if (job.empty()) job = kj["running_job"].get<std::string>();
  auto r = t->http->post("api/kgate/jobs/" + job + "/interrupt", json{{"agent", agent_}});
  if (r.status != 200) return text_reply(sentence(r.message()), true);
  // The reply waits for the end, so the next execute is not refused by the job it stopped.
  json rec = wait_ended(*t, job, kEndBound, c);
  if (!rec.is_object())
    return text_reply("Sent a KeyboardInterrupt to " + job + ", but cannot read it now: check it with poll_job('" + job + "').", true);
  if (running(rec))
    return text_reply(job + " is still running 5 s after the KeyboardInterrupt (it may be in code that does not "
                      "check for signals, such as a long C call). Wait for it with poll_job('" + job +
                      "'), or restart the kernel.", true);
  std::string how = status_of(rec);
  std::string text = job + " ended " + how + " after " + fmt_seconds(rec.value("elapsed", 0.0)) + " s";
  if (how == "interrupted")
    text += " (KeyboardInterrupt). The kernel and its state survive: you can run the next cell.";
  else if (how == "ok")
    text += ": it finished before the interrupt took effect. The kernel is free.";
  else if (how == "error")
    text += ", raising " + rec.value("ename", std::string("an error")) +
            (rec.value("evalue", "").empty() ? "" : ": " + rec.value("evalue", "")) + ". The kernel is free.";
  else
    text += ". See poll_job('" + job + "').";
  return text_reply(text);
}

namespace {

// server_status's lines on kgate's kernel side (docs/dev/kernel-side.md): which features are on, which are off
// and why, and who was refused a shutdown.
std::string kernel_side_text(const json& side) {
  std::string on, off;
  if (const auto f = side.find("features"); f != side.end() && f->is_object())
    for (const auto& [name, v] : f->items()) {
      if (v == true) on += (on.empty() ? "" : ", ") + name;
      else off += "\n  off: " + name + (v.is_string() ? " (" + v.get<std::string>() + ")" : "");
    }
  std::string out = "\nkernel side: " + (on.empty() ? std::string("off") : "on (" + on + ")");
  if (on.empty() && side.value("reason", "").size()) out += ": " + side.value("reason", "");
  else out += off;
  if (const auto r = side.find("refused"); r != side.end() && r->is_array() && !r->empty()) {
    const json& last = r->back();
    out += "\nrefused shutdowns: " + std::to_string(r->size()) + ", the last from session " +
           last.value("session", "?") + (last.value("username", "").empty() ? "" : " (user " + last.value("username", "") + ")") +
           " at " + last.value("at", "?");
  }
  return out;
}

}  // namespace

ToolReply Translator::server_status(Call&) {
  std::optional<Current> cur = current();
  Endpoint ep;
  std::string error;
  if (!endpoint_for("", cur, ep, error)) return text_reply(error, true);
  auto http = client(ep);
  std::string out = "gateway: " + ep.url;
  auto api = http->get("api", 5s);
  if (api.status != 200) return text_reply(out + " (unreachable: " + api.message() + ")", true);
  json apij = api.json_body();
  out += " (" + apij.value("server", std::string("jupyter")) + " " + apij.value("version", "") + ")";
  if (!cur) return text_reply(out + "\nno current kernel: connect, or execute (which makes an auto kernel)");
  out += "\nkernel: " + cur->kernel + (cur->auto_kernel ? " (auto kernel of this conversation)" : "");
  auto k = http->get((cur->kgate ? "api/kgate/kernels/" : "api/kernels/") + cur->kernel, 5s);
  if (k.status == 404) return text_reply(out + " — gone (connect to create or attach to another)", true);
  json kj = k.json_body();
  // What runs, named in the state: a background task leaves the kernel idle for cells.
  std::string state = kj.value("execution_state", "?");
  if (kj.contains("running_job") && kj["running_job"].is_string()) {
    const std::string job = kj["running_job"].get<std::string>();
    auto r = http->get("api/kgate/jobs/" + job, 5s);
    json rec = r.status == 200 ? r.json_body() : json();
    const bool task = rec.is_object() && rec.value("task", false);
    const std::string whose = !rec.is_object()                      ? ""
                              : rec.value("origin", "") == "user"   ? ", the user's"
                              : rec.value("agent", "") == agent_    ? (task ? ", yours: interrupt(job='" + job + "') stops it" : ", yours")
                                                                    : ", another agent's";
    state = "busy (" + std::string(task ? "background task " : "") + job + whose + ")";
  }
  out += "\nstate: " + state;
  if (kj.value("responsive", true) == false && kj.value("execution_state", "") != "dead")
    out += " — UNRESPONSIVE: no heartbeat for " + fmt_seconds(kj.value("silent_seconds", 0.0)) +
           " s (the process is stopped or frozen: send it SIGCONT, or restart the kernel)";
  if (kj.contains("kgate_placement") && kj["kgate_placement"].is_object())
    out += "\nruns " + kgate::client::placement_text(kj["kgate_placement"]) +
           (kj.value("execution_state", "") == "starting" ? " — queued: execute works once it runs" : "");
  if (kj.contains("kgate_kernel_side") && kj["kgate_kernel_side"].is_object()) out += kernel_side_text(kj["kgate_kernel_side"]);
  if (kj.contains("claim") && kj["claim"].is_object()) {
    auto& cl = kj["claim"];
    out += "\nheld by: " + (cl.value("agent", "") == agent_ ? std::string("you") : cl.value("label", "") + " (" + cl.value("agent", "") + ")");
  }
  if (kj.contains("connection_file") && kj["connection_file"].is_string())
    out += "\nconnection file: " + kj["connection_file"].get<std::string>();
  if (kj.contains("attach_command") && kj["attach_command"].is_string())
    out += "\nattach a console: " + kj["attach_command"].get<std::string>();
  Target t{*cur, http};
  std::vector<std::string> to_ack;
  out += foreign_note(t, to_ack);
  ack(t, to_ack);
  return text_reply(out);
}

}  // namespace kgate::mcp
