// JobStore's agent path (submit, interrupt, the restart gate, claims and their refusals) and its reads.
#include "jobs_impl.hpp"
#include "kgate/kernel/kernel_side.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <memory>
#include <optional>
#include <sstream>

#include <simdjson.h>
#include <spdlog/spdlog.h>

#include "kgate/jupyter/connection.hpp"
#include "kgate/jupyter/utf8.hpp"

namespace kgate {

// ---------------------------------------------------------------------------------------
// JobStore: the agent path

ClaimView JobStore::claim_view_locked(const AgentRef& ref, Clock::time_point now) const {
  ClaimView v{ref.agent, ref.label};
  auto it = agents_.find(ref.agent);
  if (it == agents_.end()) return v;
  const Agent& a = it->second;
  v.ever_connected = a.ever_connected;
  v.connected = a.connections > 0;
  if (v.connected) {
    v.alive = true;
    return v;
  }
  auto idle = now - a.last_seen;
  v.idle_seconds = std::chrono::duration<double>(idle).count();
  v.alive = !a.exited && idle < limits_.claim_grace;
  if (v.alive) v.lapses_in = std::chrono::duration<double>(limits_.claim_grace - idle).count();
  return v;
}

bool JobStore::alive_locked(const std::string& agent, Clock::time_point now) const {
  return claim_view_locked(AgentRef{agent, ""}, now).alive;
}

static std::string holder_text(const ClaimView& h) {
  return h.label.empty() ? "agent " + h.agent : h.label + " (agent " + h.agent + ")";
}

// Why a live holder still counts, in words: connected, or within its grace (with when it lapses).
static std::string grace_text(const ClaimView& h) {
  return std::string(h.ever_connected ? "its connection to kgate dropped " : "it has no connection to kgate and made its last request ") +
         seconds_text(h.idle_seconds) + " ago; its claim lapses in " + seconds_text(h.lapses_in) +
         " unless it comes back";
}

Outcome JobStore::submit(const std::string& kernel, const AgentRef& agent, std::string code,
                         JobOrigin origin, const std::function<void(ClientMessage)>& send, bool allow_stdin,
                         const std::string& wire_code, std::chrono::milliseconds input_timeout) {
  Outcome out;
  make_valid_utf8(code);  // it is recorded and sent as JSON (from HTTP it is valid already)
  if (!limits_.enabled) {
    out.refusal = Refusal::disabled;
    out.message = "Job records are switched off in this kgate ([records] enabled = false)";
    return out;
  }
  {
    std::lock_guard lk(mu_);
    auto now = Clock::now();
    auto& ag = agents_[agent.agent];
    ag.last_seen = now;
    ag.exited = false;
    if (!agent.label.empty()) ag.label = agent.label;
    auto& pk = kernels_[kernel];
    if (pk.claim && pk.claim->agent != agent.agent && alive_locked(pk.claim->agent, now)) {
      out.refusal = Refusal::claimed;
      out.holder = claim_view_locked(*pk.claim, now);
      out.message = out.holder->connected
                        ? "This kernel is in use by another agent, " + holder_text(*out.holder) +
                              ", and only one agent runs code in a kernel. It cannot be taken over while "
                              "that agent is connected; the person at the machine can restart it from the "
                              "observe page."
                        : "This kernel is held by another agent, " + holder_text(*out.holder) + ": " +
                              grace_text(*out.holder) + ". Retry after that: the next execute then takes "
                              "the kernel over.";
      return out;
    }
    if (Job* r = running_locked(kernel)) {
      out.refusal = Refusal::busy;
      out.running_job = r->id();
      bool own = r->origin != JobOrigin::user && r->agent == agent.agent;
      const std::string who = r->origin == JobOrigin::user ? "user" : "other agent";
      out.message = r->task && own ? r->id() + " (yours), a background task, is running on this kernel; execute is "
                                               "refused while it runs: wait for it (poll_job) or stop it (interrupt)."
                    : r->task ? "The " + who + "'s background task " + r->id() +
                                    " is running on this kernel; execute is refused while it runs: wait for it "
                                    "(poll_job), or ask the " + who + " to stop it (it is not yours to stop)."
                    : own ? r->id() + " (yours) is still running on this kernel; wait for it or stop it "
                              "before starting another."
                        : "The " + who + " is running a cell (" + r->id() + ") in this kernel. Only one job runs "
                              "at a time and the agent does not queue: wait for it to end.";
      return out;
    }
    if (!pk.inflight.empty()) {
      out.refusal = Refusal::busy;
      out.message = "A client of this kernel has a cell queued or running (request " +
                    *pk.inflight.begin() + "); the agent does not queue: wait for it to end.";
      return out;
    }
    if (pk.claim && pk.claim->agent != agent.agent)
      spdlog::info("kernel {}: agent {} takes the claim over from {} (gone)", kernel, agent.agent,
                   pk.claim->agent);
    if (!pk.claim || pk.claim->agent != agent.agent) dirty_kernel_locked(kernel);
    pk.claim = agent;
    if (pk.claim->label.empty()) pk.claim->label = ag.label;

    json header = make_header("execute_request", session_);
    std::string msg_id = header["msg_id"].get<std::string>();
    // A background task's starting cell is kgate's call, not the agent's code: kept out of the
    // kernel's history.
    json content = {{"code", wire_code.empty() ? code : wire_code}, {"silent", false},
                    {"store_history", wire_code.empty()},
                    {"user_expressions", json::object()}, {"allow_stdin", allow_stdin},
                    {"stop_on_error", false}};
    Job& j = create_locked(kernel, origin, msg_id, code);
    j.agent = valid_utf8(agent.agent);  // an agent's id and label may come from a URL's query
    j.label = valid_utf8(pk.claim->label);
    if (allow_stdin) j.input_timeout = input_timeout;
    out.job = j.id();
    ClientMessage cm;
    cm.channel = Channel::shell;
    cm.msg_id = msg_id;
    cm.msg_type = "execute_request";
    cm.route = std::string(kAgentRoute);
    cm.wire.header = header.dump();
    cm.wire.parent_header = "{}";
    cm.wire.metadata = "{}";
    cm.wire.content = content.dump();
    send(std::move(cm));  // posts to the I/O thread: the record exists before any reply can
  }
  notify();
  return out;
}

Outcome JobStore::interrupt(const std::string& id, const AgentRef* agent,
                            const std::function<bool(const std::string& request)>& interrupt) {
  Outcome out;
  out.job = id;
  {
    std::lock_guard lk(mu_);
    auto now = Clock::now();
    if (agent) {
      auto& ag = agents_[agent->agent];
      ag.last_seen = now;
      ag.exited = false;
    }
    Job* j = find_locked(id);
    if (!j) {
      out.refusal = Refusal::no_such_job;
      out.message = "No such job '" + id + "'.";
      return out;
    }
    Job* now_running = running_locked(j->kernel);
    if (now_running && now_running != j) out.running_job = now_running->id();
    if (!j->running()) {
      out.refusal = Refusal::not_running;
      out.message = id + " is no longer running (it ended " + std::string(status_name(j->status)) + ")" +
                    (out.running_job.empty() ? "; nothing runs on its kernel now."
                                             : "; " + out.running_job + " is running now. Look at it before deciding to stop it.");
      return out;
    }
    if (agent) {
      auto& pk = kernels_[j->kernel];
      if (pk.claim && pk.claim->agent != agent->agent && alive_locked(pk.claim->agent, now)) {
        out.refusal = Refusal::not_owner;
        out.holder = claim_view_locked(*pk.claim, now);
        out.message = "This kernel is held by another agent, " + holder_text(*out.holder) +
                      (out.holder->connected ? "" : " (" + grace_text(*out.holder) + ")") +
                      "; only its holder (or the person at the machine) may stop its jobs.";
        return out;
      }
      if (j->origin == JobOrigin::user || j->agent != agent->agent) {
        out.refusal = Refusal::foreign_job;
        out.message = "Refused: " + id + " was started by " +
                      (j->origin == JobOrigin::user ? std::string("the user") : "another agent") +
                      ", not by you; it is not yours to stop. Wait for it (the user can stop it).";
        return out;
      }
    }
    if (!j->began) {
      out.refusal = Refusal::not_begun;
      out.message = id + " has not begun: it is queued in the kernel behind another request, and a "
                         "stop now would interrupt that one instead.";
      return out;
    }
    if (!interrupt(j->request)) {
      out.refusal = Refusal::no_process;
      out.message = "The kernel process of " + id + " is not running.";
      return out;
    }
    if (!agent) j->stop_note = "Stopped by the person at the machine.";
    changed_locked();
  }
  notify();
  return out;
}

void JobStore::stop_missed(const std::string& id) {
  std::lock_guard lk(mu_);
  if (Job* j = find_locked(id)) j->stop_note.clear();
}

std::string JobStore::job_for_request(const std::string& msg_id) const {
  std::lock_guard lk(mu_);
  auto it = by_request_.find(msg_id);
  if (msg_id.empty() || it == by_request_.end()) return {};
  auto j = jobs_.find(it->second);
  return j == jobs_.end() ? std::string() : j->second.id();
}

Outcome JobStore::restart_gate(const std::string& kernel, const AgentRef* agent) {
  Outcome out;
  {
    std::lock_guard lk(mu_);
    auto now = Clock::now();
    auto& pk = kernels_[kernel];
    if (agent) {
      auto& ag = agents_[agent->agent];
      ag.last_seen = now;
      ag.exited = false;
      if (pk.claim && pk.claim->agent != agent->agent && alive_locked(pk.claim->agent, now)) {
        out.refusal = Refusal::not_owner;
        out.holder = claim_view_locked(*pk.claim, now);
        out.message = "This kernel is held by another agent, " + holder_text(*out.holder) +
                      (out.holder->connected ? "" : " (" + grace_text(*out.holder) + ")") +
                      "; only its holder may restart it. Restarting it is the user's to do, from the "
                      "observe page.";
        return out;
      }
      if (pk.claim && pk.claim->agent != agent->agent) {
        pk.claim.reset();
        dirty_kernel_locked(kernel);
      }
    } else {
      if (pk.claim) dirty_kernel_locked(kernel);
      pk.claim.reset();  // the person at the machine clears a stale claim
    }
    changed_locked();
  }
  notify();
  return out;
}

void JobStore::agent_connected(const AgentRef& agent) {
  std::lock_guard lk(mu_);
  auto& a = agents_[agent.agent];
  ++a.connections;
  a.exited = false;
  a.ever_connected = true;
  a.last_seen = Clock::now();
  if (!agent.label.empty()) a.label = agent.label;
}

void JobStore::agent_disconnected(const std::string& agent, bool clean) {
  {
    std::lock_guard lk(mu_);
    auto it = agents_.find(agent);
    if (it == agents_.end()) return;
    auto& a = it->second;
    if (a.connections > 0) --a.connections;
    a.last_seen = Clock::now();
    if (a.connections == 0 && clean) a.exited = true;
    changed_locked();
  }
  notify();
}

std::vector<std::string> JobStore::agent_process_gone(const std::string& agent) {
  std::vector<std::string> out;
  {
    std::lock_guard lk(mu_);
    if (auto a = agents_.find(agent); a != agents_.end() && a->second.connections > 0) return out;  // another link lives
    for (auto& [n, j] : jobs_) {
      if (!j.running() || j.task || j.origin != JobOrigin::mcp || j.agent != agent) continue;
      j.stop_note = "Its agent's connection to kgate dropped (kgate-mcp's process is gone: killed, or crashed), "
                    "so kgate interrupted it at once.";
      out.push_back(j.id());
    }
    if (!out.empty()) changed_locked();
  }
  if (!out.empty()) notify();
  return out;
}

std::optional<JobStore::Gone> JobStore::agent_gone(const std::string& agent) const {
  std::lock_guard lk(mu_);
  auto it = agents_.find(agent);
  if (it == agents_.end()) return std::nullopt;
  const Agent& a = it->second;
  if (a.connections > 0) return std::nullopt;
  const auto now = Clock::now();
  const auto since = a.exited ? a.last_seen : a.last_seen + limits_.claim_grace;
  if (now < since) return std::nullopt;
  return Gone{std::chrono::duration_cast<std::chrono::milliseconds>(now - since), a.label};
}

void JobStore::expect_agent(const std::string& agent) {
  std::lock_guard lk(mu_);
  auto [it, added] = agents_.try_emplace(agent);
  if (added) it->second.last_seen = Clock::now();
}

void JobStore::touch_agent(const AgentRef& agent) {
  std::lock_guard lk(mu_);
  auto& a = agents_[agent.agent];
  a.last_seen = Clock::now();
  a.exited = false;
  if (!agent.label.empty()) a.label = agent.label;
}

// ---------------------------------------------------------------------------------------
// JobStore: reads

std::optional<Job> JobStore::job(const std::string& id) const {
  std::lock_guard lk(mu_);
  auto* j = const_cast<JobStore*>(this)->find_locked(id);
  if (!j) return std::nullopt;
  return *j;
}

bool JobStore::settled(const std::string& id) const {
  std::lock_guard lk(mu_);
  auto* j = const_cast<JobStore*>(this)->find_locked(id);
  return !j || !j->running() || j->input.has_value();
}

Outcome JobStore::answer_input(const std::string& id, const AgentRef& agent, const std::string& value,
                               const std::function<void(ClientMessage)>& send) {
  Outcome out;
  out.job = id;
  {
    std::lock_guard lk(mu_);
    Job* j = find_locked(id);
    if (!j) {
      out.refusal = Refusal::no_such_job;
      out.message = "No such job '" + id + "'.";
      return out;
    }
    if (!j->running() || !j->input) {
      out.refusal = Refusal::no_input_request;
      out.message = id + " is not waiting for input (" + std::string(status_name(j->status)) + ").";
      return out;
    }
    if (j->agent != agent.agent) {
      out.refusal = Refusal::not_owner;
      out.message = id + " is not yours: only the agent that ran it answers its input().";
      return out;
    }
    ClientMessage cm;
    cm.channel = Channel::stdin_;
    cm.msg_type = "input_reply";
    json header = make_header("input_reply", session_);
    cm.msg_id = header["msg_id"].get<std::string>();
    cm.route = std::string(kAgentRoute);
    cm.wire.header = header.dump();
    cm.wire.parent_header = j->input->header;
    cm.wire.metadata = "{}";
    cm.wire.content = json{{"value", value}}.dump();
    j->input.reset();
    changed_locked();
    send(std::move(cm));
  }
  notify();
  return out;
}

bool JobStore::is_running(const std::string& id) const {
  std::lock_guard lk(mu_);
  auto* j = const_cast<JobStore*>(this)->find_locked(id);
  return j && j->running();
}

JobStore::Listing JobStore::list(const std::string& kernel, std::uint64_t after, std::size_t code_chars) const {
  Listing out;
  std::lock_guard lk(mu_);
  out.version = version_;
  for (auto it = jobs_.upper_bound(after); it != jobs_.end(); ++it) {
    const Job& j = it->second;
    if (!kernel.empty() && j.kernel != kernel) continue;
    Job s;
    s.n = j.n;
    s.kernel = j.kernel;
    s.origin = j.origin;
    s.agent = j.agent;
    s.label = j.label;
    s.request = j.request;
    std::size_t keep = utf8_head(j.code, code_chars);
    s.code = j.code.substr(0, keep);
    s.code_cut = j.code_cut + (j.code.size() - keep);
    s.status = j.status;
    s.began = j.began;
    s.created = j.created;
    s.began_at = j.began_at;
    s.ended_at = j.ended_at;
    s.t_created = j.t_created;
    s.t_began = j.t_began;
    s.t_ended = j.t_ended;
    s.execution_count = j.execution_count;
    s.ename = j.ename;
    s.note = j.note;
    s.seen_by_agent = j.seen_by_agent;
    s.released = j.released;
    s.generation = j.generation;
    s.task = j.task;
    out.jobs.push_back(std::move(s));
  }
  for (auto& r : marks_)
    if (kernel.empty() || r.kernel == kernel) out.restarts.push_back(r);
  return out;
}

std::vector<Job> JobStore::kernel_jobs(const std::string& kernel) const {
  std::lock_guard lk(mu_);
  std::vector<Job> out;
  for (auto& [n, j] : jobs_)
    if (j.kernel == kernel) out.push_back(j);
  return out;
}

std::vector<RestartMark> JobStore::restarts(const std::string& kernel) const {
  std::lock_guard lk(mu_);
  std::vector<RestartMark> out;
  for (auto& r : marks_)
    if (r.kernel == kernel) out.push_back(r);
  return out;
}

Digest JobStore::digest(const std::string& kernel) const {
  std::lock_guard lk(mu_);
  Digest d;
  auto now = Clock::now();
  for (auto& [n, j] : jobs_)
    if (j.kernel == kernel && !j.seen_by_agent)
      d.jobs.push_back(DigestEntry{j.id(), j.status, j.origin, j.elapsed(now)});
  if (auto it = kernels_.find(kernel); it != kernels_.end()) d.evicted_unseen = it->second.evicted_unseen;
  return d;
}

AckResult JobStore::ack(const std::string& kernel, const AgentRef& agent, const std::vector<std::string>& ids) {
  AckResult r;
  {
    std::lock_guard lk(mu_);
    auto now = Clock::now();
    auto& ag = agents_[agent.agent];
    ag.last_seen = now;
    ag.exited = false;
    auto& pk = kernels_[kernel];
    if (pk.claim && pk.claim->agent != agent.agent && alive_locked(pk.claim->agent, now)) {
      r.outcome.refusal = Refusal::not_owner;
      r.outcome.holder = claim_view_locked(*pk.claim, now);
      r.outcome.message = "Only the kernel's holder, " + holder_text(*r.outcome.holder) +
                          ", may acknowledge its digest.";
      return r;
    }
    for (auto& id : ids) {
      Job* j = find_locked(id);
      if (!j || j->kernel != kernel) {
        r.kept.emplace_back(id, "no such job on this kernel");
      } else if (j->running()) {
        r.kept.emplace_back(id, "still running: it is reported again once it has ended");
      } else {
        if (!j->seen_by_agent) {
          j->seen_by_agent = true;
          --unseen_;
          evictable_.insert(j->n);
          changed_locked();
          dirty_locked(*j);
        }
        r.acked.push_back(id);
      }
    }
    if (jobs_.size() > limits_.max_jobs) enforce_locked();
    pk.evicted_unseen = 0;
  }
  notify();
  return r;
}

KernelRecordInfo JobStore::kernel_info(const std::string& kernel) const {
  std::lock_guard lk(mu_);
  KernelRecordInfo info;
  auto now = Clock::now();
  if (auto it = kernels_.find(kernel); it != kernels_.end()) {
    if (it->second.claim) info.claim = claim_view_locked(*it->second.claim, now);
    info.restarts = it->second.restarts;
  }
  if (auto* j = const_cast<JobStore*>(this)->running_locked(kernel)) info.running_job = j->id();
  return info;
}

std::uint64_t JobStore::version() const {
  std::lock_guard lk(mu_);
  return version_;
}

std::size_t JobStore::bytes() const {
  std::lock_guard lk(mu_);
  return bytes_;
}

JobStats JobStore::stats() const {
  std::lock_guard lk(mu_);
  JobStats s = stats_;
  s.jobs = jobs_.size();
  s.bytes = bytes_;
  return s;
}

}  // namespace kgate
