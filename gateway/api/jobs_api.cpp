// The kgate extensions: job records, the agent path, claims, the digest, the notebook export
// and the observe page.
#include "api/jobs_api.hpp"

#include "kgate/kernel/kernel_side.hpp"

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "kgate/records/jobs.hpp"
#include "kgate/process/launcher.hpp"
#include "kgate/process/process.hpp"
#include "kgate/jupyter/utf8.hpp"
#include "kgate/version.hpp"
#include "observe_page.hpp"
#include "handlers.hpp"
#include "pool.hpp"
#include "services.hpp"

namespace kgate::gw {

// ---------------------------------------------------------------------------------------
// Waiters

bool Waiters::add(std::chrono::milliseconds timeout, std::function<bool()> ready, std::function<void()> done) {
  ++pending_;  // before ready(): a change after it pokes (any())
  if (ready() || timeout.count() <= 0) {
    --pending_;
    done();
    return true;
  }
  if (waits_.size() >= max_) {
    --pending_;
    return false;
  }
  auto w = std::make_shared<Wait>(ioc_);
  w->ready = std::move(ready);
  w->done = std::move(done);
  waits_.push_back(w);
  w->timer.expires_after(timeout);
  w->timer.async_wait([this, w](beast::error_code) { fire(w); });
  return true;
}

void Waiters::fire(const std::shared_ptr<Wait>& w) {
  if (w->fired) return;
  w->fired = true;
  w->timer.cancel();
  waits_.remove(w);
  --pending_;
  auto done = std::move(w->done);
  done();
}

void Waiters::poke() {
  std::vector<std::shared_ptr<Wait>> ready;
  for (auto& w : waits_)
    if (!w->fired && w->ready()) ready.push_back(w);
  for (auto& w : ready) fire(w);
}

void Waiters::cancel_all() {
  auto all = waits_;
  for (auto& w : all) fire(w);
}

// ---------------------------------------------------------------------------------------
// Helpers

namespace {

constexpr std::chrono::seconds kMaxWait{600};
constexpr std::size_t kMaxIdBytes = 256;
constexpr std::size_t kListCodeChars = 240;

// Builds the deferred response of a request once it has gone (version and keep-alive kept).

struct Body {
  json j = json::object();
  std::string error;
};

Body parse_body(const Request& req) {
  Body b;
  if (req.body().empty()) return b;
  json j;
  if (json_depth_within(req.body())) j = json::parse(req.body(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) b.error = "The request body must be a JSON object";
  else b.j = std::move(j);
  return b;
}

// An optional string field; sets `error` if present but not a string (or too long).
std::optional<std::string> string_field(const json& body, const char* key, std::string& error,
                                        std::size_t max = kMaxIdBytes) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) {
    error = std::string("\"") + key + "\" must be a string";
    return std::nullopt;
  }
  const auto& s = it->get_ref<const std::string&>();
  if (s.size() > max) {
    error = std::string("\"") + key + "\" is longer than " + std::to_string(max) + " bytes";
    return std::nullopt;
  }
  return s;
}

// `wait` in seconds, from the body or the query: 0 when absent.
std::optional<std::chrono::milliseconds> parse_wait(const json* body, const std::string& query,
                                                    std::string& error) {
  double secs = 0;
  if (body && body->contains("wait") && !(*body)["wait"].is_null()) {
    const auto& w = (*body)["wait"];
    if (!w.is_number()) {
      error = "\"wait\" must be a number of seconds";
      return std::nullopt;
    }
    secs = w.get<double>();
  } else {
    std::string q = query_param(query, "wait");
    if (!q.empty()) {
      char* end = nullptr;
      secs = std::strtod(q.c_str(), &end);
      if (!end || *end != '\0') {
        error = "wait=" + q + " is not a number of seconds";
        return std::nullopt;
      }
    }
  }
  if (!(secs >= 0 && secs <= double(kMaxWait.count()))) {
    error = "wait must be between 0 and " + std::to_string(kMaxWait.count()) + " seconds";
    return std::nullopt;
  }
  return std::chrono::milliseconds(static_cast<long long>(secs * 1000));
}

http::status refusal_status(Refusal r) {
  switch (r) {
    case Refusal::disabled: return http::status::service_unavailable;
    case Refusal::no_such_job:
    case Refusal::no_such_kernel: return http::status::not_found;
    case Refusal::not_owner:
    case Refusal::foreign_job: return http::status::forbidden;
    default: return http::status::conflict;
  }
}

json claim_json(const std::optional<ClaimView>& c);

json refusal_extra(const Outcome& o) {
  json j = {{"refusal", refusal_name(o.refusal)},
            {"running_job", o.running_job.empty() ? json(nullptr) : json(o.running_job)}};
  if (o.holder) j["holder"] = claim_json(o.holder);
  return j;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

// A claim as the listing and the refusals show it: both from JobStore's one liveness check.
json claim_json(const std::optional<ClaimView>& c) {
  if (!c) return nullptr;
  auto secs = [](double s) { return std::round(s * 1000) / 1000; };
  return {{"agent", c->agent},
          {"label", c->label},
          {"alive", c->alive},
          {"connected", c->connected},
          {"lapses_in_seconds", c->alive && !c->connected ? json(secs(c->lapses_in)) : json(nullptr)}};
}

json kernel_ext_json(Services& server, const KernelPtr& k) {
  json j = kernel_model_json(k->model());
  auto info = server.jobs().kernel_info(k->id());
  std::string file = k->connection_file().string();
  j["connection_file"] = file.empty() ? json(nullptr) : json(file);
  j["attach_command"] = file.empty() ? json(nullptr) : json(attach_command(k->spec(), file));
  j["claim"] = claim_json(info.claim);
  j["running_job"] = info.running_job.empty() ? json(nullptr) : json(info.running_job);
  j["restarts"] = info.restarts;
  j["kernelspec"] = k->spec().name;
  // Idle culling (docs/kernels.md "Idle culling"): seconds, to the millisecond.
  auto secs = [](auto d) {
    return double(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) / 1000.0;
  };
  j["age_seconds"] = secs(std::chrono::steady_clock::now() - k->created_at());
  j["idle_seconds"] = secs(k->idle_for());
  auto cull = server.cull_timeout(*k);
  j["cull_after_seconds"] = cull ? json(secs(cull->timeout)) : json(nullptr);
  return j;
}

std::uint64_t job_number_arg(const std::string& s) {
  std::string digits = s.rfind("job-", 0) == 0 ? s.substr(4) : s;
  if (digits.empty() || digits.size() > 19) return 0;
  std::uint64_t n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return 0;
    n = n * 10 + std::uint64_t(c - '0');
  }
  return n;
}

// The kernel's digest (GET .../digest): the jobs no agent has been told of.
json digest_json(Services& server, const std::string& kernel) {
  auto d = server.jobs().digest(kernel);
  json list = json::array();
  for (auto& e : d.jobs)
    list.push_back({{"job", e.job}, {"status", status_name(e.status)}, {"origin", origin_name(e.origin)},
                    {"elapsed", std::round(e.elapsed * 1000.0) / 1000.0}});
  return {{"kernel", kernel}, {"jobs", list}, {"evicted_unseen", d.evicted_unseen}};
}

// Answers with the job's record once it is not running, or at the deadline.  With `digest`, a
// record no longer running carries its kernel's digest as it is at that moment (the agent's
// note, without a second request: docs/records.md).
void respond_job_when_done(Services& server, const std::string& id, std::chrono::milliseconds wait, Replier r,
                           bool digest = false, bool outputs = false) {
  auto& jobs = server.jobs();
  auto done = [&server, &jobs, id, r, digest, outputs] {
    auto j = jobs.job(id);
    if (!j) return r.error(http::status::not_found, "No such job '" + id + "' (it was evicted)");
    json body = job_json(*j, true, std::chrono::steady_clock::now());
    // Every output as nbformat outputs (null: not kept, a record read back from disk).
    if (outputs) body["outputs"] = jobs.outputs(*j).value_or(json(nullptr));
    if (digest && j->status != JobStatus::running) body["digest"] = digest_json(server, j->kernel);
    r.ok(body);
  };
  // Answered when the job ends, or when it waits for input (so the agent can answer it).
  if (!server.waiters().add(wait, [&jobs, id] { return jobs.settled(id); }, done))
    r.error(http::status::service_unavailable, "Too many requests are waiting on jobs; try again");
}

// ---------------------------------------------------------------------------------------
// Handlers

void get_jobs(Services& server, const Request& req, const std::string& query, Respond respond) {
  auto r = replier(req, std::move(respond));
  std::string err;
  auto wait = parse_wait(nullptr, query, err);
  if (!wait) return r.error(http::status::bad_request, err);
  std::string kernel = query_param(query, "kernel");
  std::string after_s = query_param(query, "after");
  std::uint64_t after = 0;
  if (!after_s.empty() && (after = job_number_arg(after_s)) == 0 && after_s != "0")
    return r.error(http::status::bad_request, "after=" + after_s + " is not a job number");
  std::string version_s = query_param(query, "version");
  std::uint64_t version = 0;
  bool has_version = !version_s.empty();
  if (has_version) {
    char* end = nullptr;
    version = std::strtoull(version_s.c_str(), &end, 10);
    if (!end || *end != '\0') return r.error(http::status::bad_request, "version=" + version_s + " is not a number");
  }
  auto& jobs = server.jobs();
  auto done = [&jobs, kernel, after, r] {
    auto l = jobs.list(kernel, after, kListCodeChars);
    auto now = std::chrono::steady_clock::now();
    json list = json::array();
    for (auto& j : l.jobs) list.push_back(job_json(j, false, now));
    json restarts = json::array();
    for (auto& m : l.restarts)
      restarts.push_back({{"kernel", m.kernel}, {"after_job", "job-" + std::to_string(m.after_job)},
                          {"at", m.at}, {"reason", m.reason}});
    r.ok({{"version", l.version}, {"jobs", list}, {"restarts", restarts}});
  };
  auto ms = has_version ? *wait : std::chrono::milliseconds(0);
  if (!server.waiters().add(ms, [&jobs, version] { return jobs.version() != version; }, done))
    r.error(http::status::service_unavailable, "Too many requests are waiting on jobs; try again");
}

// A background execute on a kernel whose kernel side has not answered its install yet (a kernel
// that became ready a moment ago): looked at again every kSideRecheck, kSideRechecks times at most.
constexpr auto kSideRecheck = std::chrono::milliseconds(25);
constexpr int kSideRechecks = 200;

void post_execute(Services& server, const Request& req, const std::string& id, Respond respond, int side_waits = 0) {
  auto r = replier(req, std::move(respond));
  auto body = parse_body(req);
  if (!body.error.empty()) return r.error(http::status::bad_request, body.error);
  std::string err;
  auto code = string_field(body.j, "code", err, server.options().max_body_bytes);
  auto agent = string_field(body.j, "agent", err);
  auto label = string_field(body.j, "label", err);
  auto origin_s = string_field(body.j, "origin", err);
  auto wait = parse_wait(&body.j, "", err);
  bool digest = false;
  if (auto it = body.j.find("digest"); it != body.j.end()) {
    if (!it->is_boolean()) err = "\"digest\" must be true or false";
    else digest = it->get<bool>();
  }
  // input() and getpass() in the cell: the record shows what it asks (input_request), and
  // POST .../jobs/{job}/input answers it. Without it they raise StdinNotImplementedError.
  bool allow_stdin = false;
  if (auto it = body.j.find("allow_stdin"); it != body.j.end()) {
    if (!it->is_boolean()) err = "\"allow_stdin\" must be true or false";
    else allow_stdin = it->get<bool>();
  }
  // How long an input() may wait for its answer before kgate interrupts the cell (kgate-mcp
  // sets it when its client answers by a retry that may never come: MCP 2026-07-28's MRTR).
  std::chrono::milliseconds input_timeout{0};
  if (auto it = body.j.find("input_timeout"); it != body.j.end()) {
    if (!it->is_number() || !(it->get<double>() > 0) || it->get<double>() > 7 * 24 * 3600.0)
      err = "\"input_timeout\" must be a number of seconds, more than 0 and at most a week";
    else input_timeout = std::chrono::milliseconds(static_cast<long long>(std::ceil(it->get<double>() * 1000)));
  }
  // A background task (docs/dev/kernel-side.md): the code runs on a worker thread of the kernel, as its own
  // job that no cell ends; execute is refused while it runs.
  bool background = false;
  if (auto it = body.j.find("background"); it != body.j.end()) {
    if (!it->is_boolean()) err = "\"background\" must be true or false";
    else background = it->get<bool>();
  }
  if (!err.empty()) return r.error(http::status::bad_request, err);
  if (!code) return r.error(http::status::bad_request, "\"code\" is required");
  if (!agent || agent->empty())
    return r.error(http::status::bad_request, "\"agent\" is required: the id the agent chose for itself");
  if (code->find_first_not_of(" \t\r\n") == std::string::npos)
    return r.error(http::status::bad_request, "\"code\" is empty: empty code is never a cell");
  JobOrigin origin = JobOrigin::mcp;
  if (origin_s && *origin_s == "host") origin = JobOrigin::host;
  else if (origin_s && *origin_s != "mcp")
    return r.error(http::status::bad_request, "\"origin\" must be \"mcp\" or \"host\"");
  auto k = server.manager().get(id);
  if (!k) return r.error(http::status::not_found, "Kernel does not exist: " + id);
  if (k->execution_state() == "dead")
    return r.error(http::status::conflict, "The kernel is dead (" + k->model().reason + "); restart it",
                   {{"refusal", "dead"}, {"running_job", nullptr}});
  if (background && k->kernel_side().is_null() && side_waits < kSideRechecks) {
    auto timer = std::make_shared<net::steady_timer>(server.ioc(), kSideRecheck);
    auto again = std::make_shared<Request>(req);
    timer->async_wait([&server, timer, again, id, r, side_waits](const boost::system::error_code& ec) {
      if (ec) return r.error(http::status::service_unavailable, "kgate is stopping");
      post_execute(server, *again, id, r.respond, side_waits + 1);
    });
    return;
  }
  if (background && !kernel_side_has(k->kernel_side(), "tasks")) {
    json side = k->kernel_side();
    std::string why = side.is_object() && side["features"].is_object() && side["features"]["tasks"].is_string()
                          ? side["features"]["tasks"].get<std::string>()
                          : std::string("its kernel side is not installed yet");
    return r.error(http::status::conflict, "This kernel cannot run background tasks: " + why,
                   {{"refusal", "no_tasks"}, {"running_job", nullptr}});
  }
  if (background && allow_stdin)
    return r.error(http::status::bad_request, "\"allow_stdin\" is for cells: a background task has no stdin");
  AgentRef a{*agent, label.value_or("")};
  const std::string wire = background ? kernel_side_task_code(*code) : std::string();
  auto out = server.jobs().submit(id, a, std::move(*code), origin,
                                  [&server, &id](ClientMessage m) { server.manager().send(id, std::move(m)); },
                                  allow_stdin, wire, input_timeout);
  if (!out) return r.error(refusal_status(out.refusal), out.message, refusal_extra(out));
  respond_job_when_done(server, out.job, *wait, r, digest);
}

namespace {

// How long the kernel side has to answer a stop: its control thread serves one request at a
// time (ipykernel's own interrupts and shutdowns share it), but never waits behind a cell.
constexpr auto kStopAnswer = std::chrono::seconds(10);

// A stop through kgate's kernel side (docs/dev/kernel-side.md): kgate's records decide who may stop what (the
// claim, the job's owner, begun or queued), then the kernel checks under its own lock that the
// cell still runs before it sends SIGINT to its main thread. A stale id stops nothing, and the
// answer names what runs now.
void interrupt_in_kernel(Services& server, const std::string& job, const std::string& kernel,
                         const std::optional<AgentRef>& a, const Replier& r) {
  std::string request;
  Outcome out = server.jobs().interrupt(job, a ? &*a : nullptr, [&](const std::string& req) {
    request = req;
    return true;
  });
  if (!out) return r.error(refusal_status(out.refusal), out.message, refusal_extra(out));
  server.manager().kernel_side_call(
      kernel, {{"op", "interrupt"}, {"request", request}}, kStopAnswer,
      [&server, job, r](std::optional<json> reply) {
        Outcome o;
        o.job = job;
        if (!reply) {
          server.jobs().stop_missed(job);
          o.refusal = Refusal::no_process;
          o.message = "The kernel did not answer the stop of " + job + " within " +
                      std::to_string(kStopAnswer.count()) + " s (it is gone, restarting, or its control thread is stuck)";
        } else if (reply->value("status", "") != "ok") {
          server.jobs().stop_missed(job);
          const json running = reply->value("running", json());
          o.running_job = running.is_string() ? server.jobs().job_for_request(running.get<std::string>()) : "";
          o.refusal = Refusal::not_running;
          o.message = job + " is no longer running in the kernel; " +
                      (o.running_job.empty() ? (running.is_string() ? std::string("a cell kgate has no record of runs now.")
                                                                     : std::string("nothing runs on it now."))
                                             : o.running_job + " is running now. Look at it before deciding to stop it.");
        }
        net::post(server.ioc(), [o, r] {
          if (!o) return r.error(refusal_status(o.refusal), o.message, refusal_extra(o));
          spdlog::info("{} interrupted (in the kernel)", o.job);
          r.ok({{"interrupted", o.job}});
        });
      });
}

}  // namespace

void post_interrupt(Services& server, const Request& req, const std::string& job, Respond respond) {
  auto r = replier(req, std::move(respond));
  auto body = parse_body(req);
  if (!body.error.empty()) return r.error(http::status::bad_request, body.error);
  std::string err;
  auto agent = string_field(body.j, "agent", err);
  if (!err.empty()) return r.error(http::status::bad_request, err);
  auto rec = server.jobs().job(job);
  if (!rec) return r.error(http::status::not_found, "No such job '" + job + "'");
  std::optional<AgentRef> a;
  if (agent && !agent->empty()) a = AgentRef{*agent, ""};
  auto kernel = server.manager().get(rec->kernel);
  if (kernel && kernel_side_has(kernel->kernel_side(), "stop"))
    return interrupt_in_kernel(server, job, rec->kernel, a, r);
  // The check and the signal happen on the kernel I/O thread (it reaps the process, so the pid
  // is still the kernel's) under the records' lock.
  server.manager().with_interrupt(rec->kernel, [&server, job, a, r](const std::function<bool()>* interrupt) {
    Outcome out;
    if (!interrupt) {
      out.refusal = Refusal::no_process;
      out.message = "The kernel of " + job + " no longer exists";
    } else {
      out = server.jobs().interrupt(job, a ? &*a : nullptr, [&](const std::string&) { return (*interrupt)(); });
    }
    net::post(server.ioc(), [out, r] {
      if (!out) return r.error(refusal_status(out.refusal), out.message, refusal_extra(out));
      spdlog::info("{} interrupted", out.job);
      r.ok({{"interrupted", out.job}});
    });
  });
}

}  // namespace

void interrupt_unanswered(Services& server, const std::string& job, const std::string& agent, const std::string& why) {
  Request shape;
  shape.version(11);
  Replier r = replier(shape, [job, why](Response res) {
    if (res.result() == http::status::ok) spdlog::info("{}: {}; interrupted", job, why);
    else spdlog::warn("{}: {}, and it could not be interrupted: {}", job, why, res.body());
  });
  auto rec = server.jobs().job(job);
  if (!rec) return;
  const AgentRef a{agent, ""};
  auto kernel = server.manager().get(rec->kernel);
  if (kernel && kernel_side_has(kernel->kernel_side(), "stop")) return interrupt_in_kernel(server, job, rec->kernel, a, r);
  server.manager().with_interrupt(rec->kernel, [&server, job, a, r](const std::function<bool()>* interrupt) {
    if (!interrupt) return;
    Outcome out = server.jobs().interrupt(job, &a, [&](const std::string&) { return (*interrupt)(); });
    net::post(server.ioc(), [out, r] {
      if (!out) return r.error(refusal_status(out.refusal), out.message);
      r.ok({{"interrupted", out.job}});
    });
  });
}

namespace {

void post_restart(Services& server, const Request& req, const std::string& id, Respond respond) {
  auto r = replier(req, std::move(respond));
  auto body = parse_body(req);
  if (!body.error.empty()) return r.error(http::status::bad_request, body.error);
  std::string err;
  auto agent = string_field(body.j, "agent", err);
  auto label = string_field(body.j, "label", err);
  if (!err.empty()) return r.error(http::status::bad_request, err);
  if (!server.manager().get(id)) return r.error(http::status::not_found, "Kernel does not exist: " + id);
  std::optional<AgentRef> a;
  if (agent && !agent->empty()) a = AgentRef{*agent, label.value_or("")};
  auto out = server.jobs().restart_gate(id, a ? &*a : nullptr);
  if (!out) return r.error(refusal_status(out.refusal), out.message, refusal_extra(out));
  kernel_action(server, req, id, "restart", r.respond, /*gated=*/true);
}

void get_digest(Services& server, const Request& req, const std::string& id, const std::string& query,
                Respond respond) {
  auto r = replier(req, std::move(respond));
  if (!server.manager().get(id)) return r.error(http::status::not_found, "Kernel does not exist: " + id);
  std::string agent = query_param(query, "agent");
  if (!agent.empty()) server.jobs().touch_agent(AgentRef{agent, ""});
  r.ok(digest_json(server, id));
}

void post_ack(Services& server, const Request& req, const std::string& id, Respond respond) {
  auto r = replier(req, std::move(respond));
  auto body = parse_body(req);
  if (!body.error.empty()) return r.error(http::status::bad_request, body.error);
  std::string err;
  auto agent = string_field(body.j, "agent", err);
  if (!err.empty()) return r.error(http::status::bad_request, err);
  if (!agent || agent->empty()) return r.error(http::status::bad_request, "\"agent\" is required");
  auto it = body.j.find("jobs");
  if (it == body.j.end() || !it->is_array())
    return r.error(http::status::bad_request, "\"jobs\" must be an array of job ids");
  std::vector<std::string> ids;
  for (auto& e : *it) {
    if (!e.is_string()) return r.error(http::status::bad_request, "\"jobs\" must be an array of job ids");
    ids.push_back(e.get<std::string>());
  }
  if (!server.manager().get(id)) return r.error(http::status::not_found, "Kernel does not exist: " + id);
  auto res = server.jobs().ack(id, AgentRef{*agent, ""}, ids);
  if (!res.outcome) return r.error(refusal_status(res.outcome.refusal), res.outcome.message, refusal_extra(res.outcome));
  json kept = json::array();
  for (auto& [job, why] : res.kept) kept.push_back({{"job", job}, {"reason", why}});
  r.ok({{"acked", res.acked}, {"kept", kept}});
}

void get_notebook(Services& server, const Request& req, const std::string& id, Respond respond) {
  auto k = server.manager().get(id);
  auto jobs = server.jobs().kernel_jobs(id);
  if (!k && jobs.empty()) return respond(json_error(req, http::status::not_found, "Kernel does not exist: " + id));
  json nb = notebook_json(jobs, server.jobs().restarts(id), k ? &k->spec() : nullptr,
                          [&server](const Job& j) { return server.jobs().outputs(j); });
  Response res = json_response(req, http::status::ok, dump_json(nb, 1));
  res.set(http::field::content_type, "application/x-ipynb+json");
  res.set(http::field::content_disposition, "attachment; filename=\"kernel-" + id + ".ipynb\"");
  respond(std::move(res));
}

}  // namespace

// ---------------------------------------------------------------------------------------

std::string attach_command(const KernelSpec& spec, const std::string& connection_file) {
  // The kernel's own interpreter when it is a Python one, else Debian's.  Which of qtconsole and
  // jupyter_console it has is looked up once per interpreter (an import check in a thread of
  // its own).  A call while that runs waits for it, until kProbeWait after it started, so the
  // first answer is already right (the check takes some 80 ms) and a slow or hung interpreter
  // holds up the callers for kProbeWait once in all, not each call.
  constexpr auto kProbeWait = std::chrono::seconds(2);
  std::string python = "/usr/bin/python3";
  if (!spec.argv.empty()) {
    std::string base = std::filesystem::path(spec.argv[0]).filename().string();
    if (base.rfind("python", 0) == 0) python = spec.argv[0];
  }
  // The probe thread is detached and may still run while kgate exits, so the table it writes
  // into is never destroyed (a static object would be, under the thread's feet: TSan found it).
  struct ConsoleTable {
    std::mutex mu;
    std::condition_variable probed;
    std::map<std::string, std::string> modules;  // python -> module ("" = none, "?" = probing)
    std::map<std::string, std::chrono::steady_clock::time_point> waits;  // python -> no waits after
  };
  static ConsoleTable* const table = new ConsoleTable;
  auto& mu = table->mu;
  auto& probed = table->probed;
  auto& modules = table->modules;
  std::string module;
  {
    std::unique_lock lk(mu);
    if (!modules.contains(python)) {
      modules[python] = "?";
      table->waits[python] = std::chrono::steady_clock::now() + kProbeWait;
      std::thread([python, &mu, &probed, &modules] {
        std::string cmd = shell_quote(python) +
                          " -c 'import importlib.util as u; print(\"qtconsole\" if u.find_spec(\"qtconsole\") else "
                          "\"jupyter_console\" if u.find_spec(\"jupyter_console\") else \"\")' 2>/dev/null";
        std::string found;
        if (FILE* p = ::popen(cmd.c_str(), "r")) {
          char buf[64] = {};
          if (std::fgets(buf, sizeof buf, p)) found = buf;
          ::pclose(p);
        }
        while (!found.empty() && (found.back() == '\n' || found.back() == '\r')) found.pop_back();
        {
          std::lock_guard lk2(mu);
          modules[python] = found;
        }
        probed.notify_all();
      }).detach();
    }
    probed.wait_until(lk, table->waits[python], [&] { return modules[python] != "?"; });
    module = modules[python];
  }
  if (module == "qtconsole") return shell_quote(python) + " -m qtconsole --existing " + shell_quote(connection_file);
  // jupyter_console, or not known yet / neither installed: the console is the usual one.
  return shell_quote(python) + " -m jupyter_console --existing " + shell_quote(connection_file);
}

Response observe_page(const Request& req) {
  Response res{http::status::ok, req.version()};
  res.set(http::field::server, kgate::server_header());
  res.set(http::field::content_type, "text/html; charset=utf-8");
  res.set(http::field::cache_control, "no-store");
  // The page has Stop and Restart buttons: no framing by other sites, no foreign scripts.
  res.set("X-Frame-Options", "DENY");
  res.set("Content-Security-Policy",
          "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
          "img-src 'self' data:; frame-ancestors 'none'");
  res.set("Referrer-Policy", "no-referrer");
  res.keep_alive(req.keep_alive());
  res.body() = std::string(kObservePage);
  res.prepare_payload();
  return res;
}

// ---- The handlers of the kgate routes (routes.cpp) ----

void kgate_pool(Call& c) {  // the warm pool and max_kernels (docs/kernels.md "Warm pool")
  json body = c.services.pool().status();
  body["max_kernels"] = c.services.options().max_kernels;
  c.respond(json_response(c.req, http::status::ok, dump_json(body)));
}

void kgate_launchers(Call& c) {  // remote launchers and whether each works now (docs/dev/remote-launchers.md)
  // Probing runs the scheduler's commands (squeue, ssh): on a thread of its own, never the
  // Asio one.  The thread touches only `st` (shared), never the server: kgate may exit while
  // an ssh probe still waits; the Asio thread looks at `st` every 50 ms.
  struct Probe {
    std::mutex mu;
    bool done = false;
    json list;
  };
  auto st = std::make_shared<Probe>();
  std::vector<LauncherPtr> ls;
  for (const auto& [name, l] : c.services.options().launchers) ls.push_back(l);
  std::thread([st, ls = std::move(ls)] {
    block_async_signals_in_this_thread();
    json list = json::array();
    list.push_back({{"name", "local"}, {"kind", "local"}, {"usable", true}, {"default", true}});
    for (const auto& l : ls) {
      auto pr = probe_launcher(*l);
      json j = {{"name", l->name}, {"kind", l->kind_name()}, {"usable", pr.usable}};
      if (l->kind == LauncherConfig::Kind::slurm) j["options"] = l->slurm;
      else j["host"] = l->host, j["forward"] = l->forward;
      j["allow_override"] = l->allow_override;
      if (!pr.usable) j["reason"] = pr.reason;
      list.push_back(std::move(j));
    }
    std::lock_guard lk(st->mu);
    st->list = std::move(list);
    st->done = true;
  }).detach();
  Request fake;
  fake.version(c.req.version());
  fake.keep_alive(c.req.keep_alive());
  auto timer = std::make_shared<net::steady_timer>(c.services.ioc());
  auto check = std::make_shared<std::function<void()>>();
  *check = [st, timer, fake, respond = c.respond, weak = std::weak_ptr<std::function<void()>>(check)]() {
    {
      std::lock_guard lk(st->mu);
      if (st->done) return respond(json_response(fake, http::status::ok, dump_json(json{{"launchers", st->list}})));
    }
    auto self = weak.lock();  // the running handler holds it
    if (!self) return;
    timer->expires_after(std::chrono::milliseconds(50));
    timer->async_wait([self, timer](const boost::system::error_code& ec) {
      if (!ec) (*self)();
    });
  };
  // Each pending wait holds `check`; it refers to itself weakly, so nothing is left once answered.
  timer->expires_after(std::chrono::milliseconds(20));
  timer->async_wait([check, timer](const boost::system::error_code& ec) {
    if (!ec) (*check)();
  });
}

void jobs_list(Call& c) { get_jobs(c.services, c.req, c.query, std::move(c.respond)); }

void job_get(Call& c) {
  const std::string& job = c.param(0);
  std::string err;
  auto wait = parse_wait(nullptr, c.query, err);
  if (!wait) return c.respond(json_error(c.req, http::status::bad_request, err));
  if (!c.services.jobs().job(job)) return c.respond(json_error(c.req, http::status::not_found, "No such job '" + job + "'"));
  std::string dg = query_param(c.query, "digest");
  if (!dg.empty() && dg != "0" && dg != "1")
    return c.respond(json_error(c.req, http::status::bad_request, "digest=" + dg + ": expected 0 or 1"));
  std::string outs = query_param(c.query, "outputs");
  if (!outs.empty() && outs != "0" && outs != "1")
    return c.respond(json_error(c.req, http::status::bad_request, "outputs=" + outs + ": expected 0 or 1"));
  if (std::string agent = query_param(c.query, "agent"); !agent.empty()) c.services.jobs().touch_agent(AgentRef{agent, ""});
  respond_job_when_done(c.services, job, *wait, replier(c.req, std::move(c.respond)), dg == "1", outs == "1");
}

void job_interrupt(Call& c) { post_interrupt(c.services, c.req, c.param(0), std::move(c.respond)); }

void kgate_kernels_list(Call& c) {
  json list = json::array();
  for (auto& k : c.services.manager().list()) list.push_back(kernel_ext_json(c.services, k));
  c.respond(json_response(c.req, http::status::ok, dump_json(list)));
}

void kgate_kernel_get(Call& c) {
  auto k = c.services.manager().get(c.param(0));
  if (!k) return c.respond(json_error(c.req, http::status::not_found, "Kernel does not exist: " + c.param(0)));
  c.respond(json_response(c.req, http::status::ok, dump_json(kernel_ext_json(c.services, k))));
}

// POST /api/kgate/kernels/{kernel_id}/keep: the kernel is no longer a conversation's auto kernel
// (its agent connected to it by id), so it outlives the conversation. 200 with the kernel.
void kgate_kernel_keep(Call& c) {
  auto k = c.services.manager().get(c.param(0));
  if (!k) return c.respond(json_error(c.req, http::status::not_found, "Kernel does not exist: " + c.param(0)));
  if (!k->conversation().empty()) spdlog::info("kernel {}: kept past its conversation", k->id());
  k->set_conversation("");
  c.services.manager().remember(k->id());
  c.respond(json_response(c.req, http::status::ok, dump_json(kernel_ext_json(c.services, k))));
}

// POST /api/kgate/jobs/{job}/input {"value", "agent"}: the answer to the job's input().
void job_input(Call& c) {
  auto r = replier(c.req, std::move(c.respond));
  auto body = parse_body(c.req);
  if (!body.error.empty()) return r.error(http::status::bad_request, body.error);
  std::string err;
  auto value = string_field(body.j, "value", err, c.services.options().max_body_bytes);
  auto agent = string_field(body.j, "agent", err);
  if (!err.empty()) return r.error(http::status::bad_request, err);
  if (!value) return r.error(http::status::bad_request, "\"value\" (a string) is required");
  if (!agent || agent->empty()) return r.error(http::status::bad_request, "\"agent\" is required");
  const std::string job = c.param(0);
  auto rec = c.services.jobs().job(job);
  if (!rec) return r.error(http::status::not_found, "No such job '" + job + "'");
  Services& server = c.services;
  const std::string kernel = rec->kernel;
  auto out = server.jobs().answer_input(job, AgentRef{*agent, ""}, *value,
                                        [&server, &kernel](ClientMessage m) { server.manager().send(kernel, std::move(m)); });
  if (!out) return r.error(refusal_status(out.refusal), out.message, refusal_extra(out));
  r.ok({{"answered", job}});
}

void kgate_execute(Call& c) { post_execute(c.services, c.req, c.param(0), std::move(c.respond)); }
void kgate_restart(Call& c) { post_restart(c.services, c.req, c.param(0), std::move(c.respond)); }
void kgate_digest(Call& c) { get_digest(c.services, c.req, c.param(0), c.query, std::move(c.respond)); }
void kgate_digest_ack(Call& c) { post_ack(c.services, c.req, c.param(0), std::move(c.respond)); }
void kgate_notebook(Call& c) { get_notebook(c.services, c.req, c.param(0), std::move(c.respond)); }

}  // namespace kgate::gw
