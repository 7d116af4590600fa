// JobStore's records on disk (docs/dev/readoption.md): the record log's lines, restore, and what a re-adopted kernel's history settles.
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
// JobStore: records on disk (docs/dev/readoption.md)
//
// A kernel's log holds three kinds of line, and the last line of a job wins:
//   {"t": "job", "n": N, ...}        a job as it is now (written when it is created, begins and
//                                     ends, when an agent acknowledges it, and every few seconds
//                                     while its output grows);
//   {"t": "restart", "after_job": N, "at": ..., "reason": ...}   a restart mark;
//   {"t": "kernel", "generation": G, "restarts": R, "last_count": C, "claim": {...} | null}.
// A log is compacted (rewritten with one line per live job) once it is twice its size after
// the last compaction plus kCompactSlack.

namespace {

constexpr std::uint64_t kCompactSlack = 1u << 20;

std::int64_t unix_ms(std::chrono::steady_clock::time_point t) {
  using namespace std::chrono;
  auto sys = system_clock::now() - duration_cast<system_clock::duration>(steady_clock::now() - t);
  return duration_cast<milliseconds>(sys.time_since_epoch()).count();
}

std::chrono::steady_clock::time_point steady_of(std::int64_t ms) {
  using namespace std::chrono;
  auto ago = system_clock::now() - system_clock::time_point(duration_cast<system_clock::duration>(milliseconds(ms)));
  return steady_clock::now() - duration_cast<steady_clock::duration>(ago);
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json record_line(const Job& j) {
  json l = {{"t", "job"},
            {"n", j.n},
            {"origin", origin_name(j.origin)},
            {"agent", j.agent},
            {"label", j.label},
            {"request", j.request},
            {"code", j.code},
            {"code_cut", j.code_cut},
            {"status", status_name(j.status)},
            {"began", j.began},
            {"created", j.created},
            {"began_at", j.began_at},
            {"ended_at", j.ended_at},
            {"created_ms", unix_ms(j.t_created)},
            {"logged_ms", unix_ms(std::chrono::steady_clock::now())},
            {"output", j.output.text()},
            {"output_total", j.output.total()},
            {"result", j.result.text()},
            {"result_total", j.result.total()},
            {"ename", j.ename},
            {"evalue", j.evalue},
            {"traceback", j.traceback},
            {"note", j.note},
            {"stop_note", j.stop_note},
            {"seen", j.seen_by_agent},
            {"released", j.released},
            {"reply_status", j.reply_status},
            {"generation", j.generation},
            {"task", j.task}};
  if (j.began) l["began_ms"] = unix_ms(j.t_began);
  if (!j.running()) l["ended_ms"] = unix_ms(j.t_ended);
  if (j.execution_count) l["execution_count"] = *j.execution_count;
  return l;
}

template <class E, class F>
std::optional<E> named(const std::string& name, F name_of, std::initializer_list<E> all) {
  for (E e : all)
    if (name_of(e) == name) return e;
  return std::nullopt;
}

// A job read back from its line; throws json::exception (or std::runtime_error) on a bad one.
Job job_from_record(const json& l, const std::string& kernel, const RecordLimits& limits) {
  Job j;
  j.n = l.at("n").get<std::uint64_t>();
  if (j.n == 0) throw std::runtime_error("job number 0");
  j.kernel = kernel;
  auto origin = named(l.at("origin").get<std::string>(), origin_name, {JobOrigin::mcp, JobOrigin::user, JobOrigin::host});
  auto status = named(l.at("status").get<std::string>(), status_name,
                      {JobStatus::running, JobStatus::ok, JobStatus::error, JobStatus::interrupted, JobStatus::aborted,
                       JobStatus::kernel_lost, JobStatus::end_not_recorded, JobStatus::culled});
  if (!origin || !status) throw std::runtime_error("an unknown origin or status");
  j.origin = *origin;
  j.status = *status;
  j.agent = l.value("agent", "");
  j.label = l.value("label", "");
  j.request = l.value("request", "");
  j.code = l.value("code", "");
  j.code_cut = l.value("code_cut", std::size_t{0});
  j.began = l.value("began", false);
  j.created = l.value("created", "");
  j.began_at = l.value("began_at", "");
  j.ended_at = l.value("ended_at", "");
  j.t_created = steady_of(l.at("created_ms").get<std::int64_t>());
  j.t_began = l.contains("began_ms") ? steady_of(l["began_ms"].get<std::int64_t>()) : j.t_created;
  j.t_ended = l.contains("ended_ms") ? steady_of(l["ended_ms"].get<std::int64_t>()) : j.t_began;
  if (l.contains("execution_count")) j.execution_count = l["execution_count"].get<int>();
  j.output = TailText(limits.job_output_bytes);
  j.output.restore(l.value("output", ""), l.value("output_total", std::size_t{0}));
  j.result = TailText(limits.job_output_bytes);
  j.result.restore(l.value("result", ""), l.value("result_total", std::size_t{0}));
  j.ename = l.value("ename", "");
  j.evalue = l.value("evalue", "");
  if (auto tb = l.find("traceback"); tb != l.end() && tb->is_array())
    for (auto& line : *tb)
      if (line.is_string()) j.traceback.push_back(line.get<std::string>());
  j.note = l.value("note", "");
  j.stop_note = l.value("stop_note", "");
  j.task = l.value("task", false);
  j.seen_by_agent = l.value("seen", j.origin != JobOrigin::user);
  j.released = l.value("released", false);
  j.reply_status = l.value("reply_status", "");
  j.generation = l.value("generation", std::uint64_t{0});
  j.logged_total = j.output.total();
  j.logged_at = std::chrono::steady_clock::now();
  return j;
}

}  // namespace

std::string JobStore::kernel_line_locked(const std::string&, const PerKernel& pk) const {
  json l = {{"t", "kernel"}, {"generation", pk.generation}, {"restarts", pk.restarts}, {"last_count", pk.last_count}};
  l["claim"] = pk.claim ? json{{"agent", pk.claim->agent}, {"label", pk.claim->label}} : json(nullptr);
  return dump(l);
}

void JobStore::persist_locked() {
  if (!log_ || (dirty_.empty() && dirty_kernels_.empty() && pending_lines_.empty())) return;
  std::set<std::string> touched;
  for (auto& [kernel, line] : pending_lines_)
    if (kernels_.count(kernel) && log_->append(kernel, line)) touched.insert(kernel);
  pending_lines_.clear();
  const auto now = Clock::now();
  for (auto n : dirty_) {
    auto it = jobs_.find(n);
    if (it == jobs_.end() || !kernels_.count(it->second.kernel)) continue;  // evicted, or its kernel is gone
    Job& j = it->second;
    j.logged_total = j.output.total();
    j.logged_at = now;
    if (log_->append(j.kernel, dump(with_outputs_locked(record_line(j))))) touched.insert(j.kernel);
  }
  dirty_.clear();
  for (const auto& k : dirty_kernels_)
    if (auto it = kernels_.find(k); it != kernels_.end() && log_->append(k, kernel_line_locked(k, it->second)))
      touched.insert(k);
  dirty_kernels_.clear();
  for (const auto& k : touched) {
    auto& pk = kernels_.at(k);
    if (log_->size(k) > 2 * pk.log_base + kCompactSlack) compact_locked(k, pk);
  }
}

json JobStore::with_outputs_locked(json line) const {
  const std::uint64_t n = line.value("n", std::uint64_t{0});
  if (outputs_->has(n)) line["outputs"] = outputs_->save(n);
  return line;
}

void JobStore::collect_output_files() {
  std::lock_guard lk(mu_);
  if (auto n = outputs_->collect(); n > 0)
    spdlog::info("records: removed {} output file{} no record refers to", n, n == 1 ? "" : "s");
}

void JobStore::compact_locked(const std::string& kernel, PerKernel& pk) {
  std::vector<std::string> lines;
  lines.push_back(kernel_line_locked(kernel, pk));
  for (const auto& m : marks_)
    if (m.kernel == kernel)
      lines.push_back(dump(json{{"t", "restart"}, {"after_job", m.after_job}, {"at", m.at}, {"reason", m.reason}}));
  const auto now = Clock::now();
  for (auto& [n, j] : jobs_)
    if (j.kernel == kernel) {
      j.logged_total = j.output.total();
      j.logged_at = now;
      lines.push_back(dump(with_outputs_locked(record_line(j))));
    }
  if (log_->rewrite(kernel, lines)) pk.log_base = log_->size(kernel);
  log_->save_counter(counter_);
}

std::vector<std::string> JobStore::restore(RecordLog::Loaded loaded) {
  std::vector<std::string> out;
  for (auto& p : loaded.problems) out.push_back("records: " + p);
  if (!log_ || !limits_.enabled) return out;
  {
    std::lock_guard lk(mu_);
    counter_ = std::max(counter_, loaded.counter);
    const std::string back = iso_now();
    const auto now = Clock::now();
    for (auto& [kernel, lines] : loaded.logs) {
      auto& pk = kernels_[kernel];
      pk.restored = true;
      pk.back_at = back;
      std::map<std::uint64_t, json> latest;
      std::size_t bad = 0, running = 0, jobs = 0;
      std::int64_t last_ms = 0;
      for (auto& line : lines) {
        json l = json::parse(line, nullptr, false);
        const std::string t = l.is_object() ? str_value(l, "t") : "";
        try {
          if (t == "job") {
            last_ms = std::max(last_ms, l.value("logged_ms", std::int64_t{0}));
            auto n = l.at("n").get<std::uint64_t>();
            latest[n] = std::move(l);
          } else if (t == "restart") {
            marks_.push_back(RestartMark{kernel, l.at("after_job").get<std::uint64_t>(), str_value(l, "at"),
                                         str_value(l, "reason")});
          } else if (t == "kernel") {
            pk.generation = l.value("generation", std::uint64_t{0});
            pk.restarts = l.value("restarts", std::uint64_t{0});
            pk.last_count = std::max(pk.last_count, l.value("last_count", 0));
            auto c = l.find("claim");
            if (c != l.end() && c->is_object()) {
              pk.claim = AgentRef{c->value("agent", ""), c->value("label", "")};
              if (pk.claim->agent.empty()) pk.claim.reset();
            } else {
              pk.claim.reset();
            }
          } else {
            ++bad;  // not JSON, or a kind of line a newer kgate writes
          }
        } catch (const std::exception&) {
          ++bad;
        }
      }
      std::string away = last_ms ? iso_time(std::chrono::system_clock::time_point(std::chrono::milliseconds(last_ms)))
                                 : std::string("an unknown time");
      pk.away_from = away;
      for (auto& [n, l] : latest) {
        Job j;
        try {
          j = job_from_record(l, kernel, limits_);
        } catch (const std::exception&) {
          ++bad;
          continue;
        }
        counter_ = std::max(counter_, j.n);
        if (auto o = l.find("outputs"); o != l.end()) outputs_->load(kernel, j.n, *o);  // its files held again
        if (j.execution_count && j.generation == pk.generation) pk.last_count = std::max(pk.last_count, *j.execution_count);
        if (!j.seen_by_agent) ++unseen_;
        if (j.running()) {
          ++running;
          j.gap = true;
          j.note += std::string(j.note.empty() ? "" : " ") + "kgate was away while this job ran: its records were last "
                    "written at " + away + " and read back at " + back + "; output printed between the two was not heard.";
          if (!j.request.empty()) by_request_[j.request] = j.n;
          running_.insert(j.n);
        } else if (j.seen_by_agent || j.origin != JobOrigin::user) {
          evictable_.insert(j.n);
        }
        bytes_ += j.bytes();
        ++jobs;
        jobs_.insert_or_assign(n, std::move(j));
      }
      if (pk.claim) {
        // Its agent gets the grace of a dropped connection to come back (kgate-mcp reconnects).
        auto& a = agents_[pk.claim->agent];
        a.label = pk.claim->label;
        a.ever_connected = true;
        a.last_seen = now;
      }
      out.push_back("kernel " + kernel + ": " + std::to_string(jobs) + " job record" + (jobs == 1 ? "" : "s") +
                    " read back" + (running ? " (" + std::to_string(running) + " still running)" : "") +
                    (bad ? "; " + std::to_string(bad) + " unreadable line" + (bad == 1 ? "" : "s") + " skipped" : ""));
    }
    std::stable_sort(marks_.begin(), marks_.end(),
                     [](const RestartMark& a, const RestartMark& b) { return a.after_job < b.after_job; });
    if (marks_.size() > limits_.max_restart_marks)
      marks_.erase(marks_.begin(), marks_.end() - static_cast<std::ptrdiff_t>(limits_.max_restart_marks));
    enforce_locked();
    for (auto& [kernel, _] : loaded.logs) compact_locked(kernel, kernels_[kernel]);  // drops torn and stale lines
    changed_locked();
  }
  notify();
  return out;
}

void JobStore::lost_while_away(const std::string& kernel, const std::string& reason) {
  if (!limits_.enabled) return;
  {
    std::lock_guard lk(mu_);
    lose_running_locked(kernel, JobStatus::kernel_lost, "The kernel stopped before this job finished: " + reason + ".");
    if (auto it = kernels_.find(kernel); it != kernels_.end()) it->second.restored = false;
    changed_locked();
  }
  notify();
}

void JobStore::on_kernel_readopted(const KernelPtr& kernel, const std::string& history_reply) {
  if (!limits_.enabled) return;
  json content = parse_part(history_reply);
  std::size_t added = 0;
  {
    std::lock_guard lk(mu_);
    auto pit = kernels_.find(kernel->id());
    if (pit == kernels_.end() || !pit->second.restored) return;  // no records of it were read back
    PerKernel& pk = pit->second;
    pk.restored = false;
    const auto now = Clock::now();
    // The shell answered, so the cell that ran at the gap has ended: unless its idle is heard
    // (it races the reply across two sockets), it ended while kgate was away.
    std::vector<Job*> gap_jobs;
    for (auto n : running_) {
      Job& j = jobs_.at(n);
      if (j.kernel != kernel->id() || !j.gap || j.task) continue;  // a task's end: the kernel side says
      j.gap_end_at = now + std::chrono::seconds(1);
      gap_jobs.push_back(&j);
    }
    // The history: [session, line, input] or [session, line, [input, output]] per cell.
    std::map<int, std::pair<std::string, std::optional<std::string>>> cells;
    if (auto h = content.is_object() ? content.find("history") : content.end(); h != content.end() && h->is_array())
      for (auto& e : *h) {
        if (!e.is_array() || e.size() < 3 || !e[1].is_number_integer()) continue;
        int line = e[1].get<int>();
        if (line <= pk.last_count) continue;
        const json& io = e[2];
        if (io.is_string()) {
          cells[line] = {io.get<std::string>(), std::nullopt};
        } else if (io.is_array() && io.size() == 2 && io[0].is_string()) {
          cells[line] = {io[0].get<std::string>(),
                         io[1].is_string() ? std::optional<std::string>(io[1].get<std::string>()) : std::nullopt};
        }
      }
    const std::string note = "It ran while kgate was away (between " + pk.away_from + " and " + pk.back_at +
                             "), from a client holding the connection file. It is recovered from the kernel's "
                             "history, which keeps its code and result but not its output or its status.";
    for (auto& [number, cell] : cells) {
      const int line = number;  // a lambda may not capture a structured binding (clang 14)
      pk.last_count = std::max(pk.last_count, line);
      auto same = std::find_if(gap_jobs.begin(), gap_jobs.end(),
                               [&](Job* j) { return j->execution_count && *j->execution_count == line; });
      if (same != gap_jobs.end()) {  // the cell that ran at the gap: its result, if it had one
        if (cell.second && (*same)->result.total() == 0) {
          std::size_t before = (*same)->bytes();
          append_valid((*same)->result, *cell.second);
          add_bytes(before, **same);
        }
        continue;
      }
      if (cell.first.empty()) continue;
      Job& j = create_locked(kernel->id(), JobOrigin::user, {}, cell.first);
      std::size_t before = j.bytes();
      j.began = true;
      j.t_began = j.t_ended = now;
      j.execution_count = line;
      if (cell.second) append_valid(j.result, *cell.second);
      j.status = JobStatus::end_not_recorded;
      j.ended_at = iso_now();
      j.note = note;
      add_bytes(before, j);
      finished_locked(j);
      ++added;
    }
    dirty_kernel_locked(kernel->id());
    changed_locked();
    if (jobs_.size() > limits_.max_jobs || bytes_ > limits_.budget_bytes) enforce_locked();
  }
  if (added)
    spdlog::info("kernel {}: {} cell{} ran while kgate was away; recorded from the kernel's history", kernel->id(),
                 added, added == 1 ? "" : "s");
  notify();
}

}  // namespace kgate
