// Job records: every cell run in kgate's kernels, built from the protocol, kept in memory.
//
// The store is fed by the kernel I/O thread (it is a KernelObserver) and read by the gateway's
// Asio thread; one mutex guards it.  Every read is a read of memory, never a kernel round trip.
// The agent path (submit, interrupt, claims, the digest) lives here too, so that a check and
// the action it guards happen under the same lock the records are changed under.  docs/dev/records.md
// describes the algorithms.
#pragma once

#include <array>
#include <chrono>
#include <deque>
#include <cstdint>
#include <functional>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kgate/kernel/kernel.hpp"
#include "kgate/records/outputs.hpp"
#include "kgate/records/record_log.hpp"

namespace kgate {

enum class JobOrigin { mcp, user, host };
enum class JobStatus { running, ok, error, interrupted, aborted, kernel_lost, end_not_recorded, culled };
std::string_view origin_name(JobOrigin o) noexcept;
std::string_view status_name(JobStatus s) noexcept;

// Limits of the records.  Defaults are documented in config/kgate.toml and DEV.md.
struct RecordLimits {
  bool enabled = true;                        // off: nothing is recorded, the agent path refuses
  std::size_t max_jobs = 1000;                // records kept, all kernels (finished ones evicted)
  std::size_t job_output_bytes = 256u << 10;  // stream text kept per job (the tail)
  std::size_t job_code_bytes = 64u << 10;     // code kept per job (the head)
  std::size_t budget_bytes = 64u << 20;       // code + output + result + traceback, all records
  std::size_t max_unseen_jobs = 10000;        // foreign jobs kept for the digest past the caps
  std::chrono::milliseconds claim_grace{10000};  // a dropped agent connection stays alive this long
  std::chrono::milliseconds reply_grace{5000};   // execute_reply without its idle: ended after this
  std::size_t max_restart_marks = 1000;
  // Records on disk, for a later kgate that re-adopts the kernels (docs/dev/readoption.md): each change is
  // written at once, and fdatasync'd within sync_interval.
  bool persist = true;
  std::chrono::milliseconds sync_interval{500};
  OutputLimits outputs;  // every output of a cell, as nbformat outputs (outputs.hpp)
};

// Text capped at a byte budget that keeps the tail (cut at a UTF-8 boundary).
class TailText {
 public:
  TailText() = default;
  explicit TailText(std::size_t cap) : cap_(cap) {}
  void append(std::string_view s);
  // Text that at least cap() more bytes will follow: counted, not kept (none of it can be in
  // the tail).  What was kept before goes too, as the text after it will push it out anyway.
  void skip(std::size_t n);
  std::size_t cap() const { return cap_; }
  std::string_view text() const;  // at most cap bytes: the tail
  std::size_t cut() const { return total_ - text().size(); }  // bytes cut from the front
  std::size_t held() const { return buf_.capacity(); }        // bytes in memory
  std::size_t total() const { return total_; }
  void release();  // drops the text (budget pressure); what was held counts as cut
  // Text read back from the records on disk: `text` is the tail of `total` bytes.
  void restore(std::string text, std::size_t total);

 private:
  std::size_t cap_ = 0;
  std::string buf_;
  std::size_t total_ = 0;
};

struct Job {
  std::uint64_t n = 0;     // job-N
  std::string kernel;
  JobOrigin origin = JobOrigin::user;
  std::string agent, label;  // mcp/host jobs
  std::string request;       // the execute_request's msg_id
  std::string code;
  std::size_t code_cut = 0;
  JobStatus status = JobStatus::running;
  bool began = false;
  std::string created, began_at, ended_at;  // ISO times ("" until then)
  std::chrono::steady_clock::time_point t_created, t_began, t_ended;
  std::optional<int> execution_count;
  TailText output, result;
  std::string ename, evalue;
  std::vector<std::string> traceback;
  std::string note;
  std::string stop_note;  // set by a person's stop, shown if the job did not end ok
  bool seen_by_agent = false;
  bool released = false;  // its text was dropped under budget pressure
  std::string reply_status;
  std::optional<std::chrono::steady_clock::time_point> reply_at;
  std::uint64_t generation = 0;
  // Read back from the records on disk while it still ran: kgate was away for part of it.
  bool gap = false;
  // Its kernel's shell answered after the gap, so it has ended: ended end_not_recorded at this
  // time unless its idle comes first (the idle and the shell's answer race across two sockets).
  std::optional<std::chrono::steady_clock::time_point> gap_end_at;
  // What of its output the records on disk hold (a running job is written again as it grows).
  std::size_t logged_total = 0;
  std::chrono::steady_clock::time_point logged_at{};
  // An input() or getpass() of an agent's cell (allow_stdin) waiting for its answer.
  struct PendingInput {
    std::string prompt;
    bool password = false;
    std::string header;  // the input_request's header: the input_reply's parent
    // Past this, kgate interrupts the cell (sweep): the job's input_timeout after the request.
    std::optional<std::chrono::steady_clock::time_point> deadline;
  };
  std::optional<PendingInput> input;
  // How long an input() may wait for its answer before kgate interrupts the cell (execute's
  // input_timeout; zero: as long as the cell runs).
  std::chrono::milliseconds input_timeout{0};
  // A background task (docs/dev/kernel-side.md): its starting cell's request announced it (task_start), so
  // its end is the task's (task_end), never the starting cell's idle, and no cell ends it.
  bool task = false;

  std::string id() const { return "job-" + std::to_string(n); }
  bool running() const { return status == JobStatus::running; }
  double elapsed(std::chrono::steady_clock::time_point now) const;
  std::size_t bytes() const;
};

struct RestartMark {
  std::string kernel;
  std::uint64_t after_job = 0;  // the restart came after job-N (by number: eviction cannot lose it)
  std::string at;
  std::string reason;
};

// Why an agent-path call was refused.
enum class Refusal { none, disabled, busy, claimed, not_running, not_begun, not_owner, foreign_job,
                     no_such_job, no_such_kernel, no_process, no_input_request };
std::string_view refusal_name(Refusal r) noexcept;

struct AgentRef {
  std::string agent;  // chosen by the client; required on the agent path
  std::string label;  // shown to others ("Claude Code (conversation 3)")
};

// A claim's holder, and whether it still counts (JobStore::liveness_locked decides, for the
// listing and for every refusal alike).
struct ClaimView {
  std::string agent, label;
  bool alive = false;      // the claim gates other agents
  bool connected = false;  // its agent websocket is open: its process runs
  bool ever_connected = false;  // it had an agent websocket (else it only made requests)
  double idle_seconds = 0;      // not connected: since its link dropped, or its last request
  double lapses_in = 0;         // alive but not connected: seconds until the claim lapses
};

struct Outcome {
  Refusal refusal = Refusal::none;
  std::string message;      // for a refusal: what to tell the caller
  std::string job;          // the job concerned (submitted, interrupted)
  std::string running_job;  // what runs on the kernel now ("" = nothing)
  std::optional<ClaimView> holder;
  explicit operator bool() const { return refusal == Refusal::none; }
};

struct DigestEntry {
  std::string job;
  JobStatus status;
  JobOrigin origin;
  double elapsed;
};
struct Digest {
  std::vector<DigestEntry> jobs;
  std::size_t evicted_unseen = 0;
};
struct AckResult {
  Outcome outcome;
  std::vector<std::string> acked;
  std::vector<std::pair<std::string, std::string>> kept;  // job, why not retired
};

// What the store saw since kgate started, for /metrics (gateway/api/metrics.cpp).
struct JobStats {
  // Upper bounds (seconds) of the duration histogram's buckets; +Inf follows.
  static constexpr std::array<double, 14> kBuckets{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                  1,     2.5,  5,     10,   60,  300, 3600};
  struct Histogram {
    std::array<std::uint64_t, kBuckets.size()> bucket{};  // jobs in (kBuckets[i-1], kBuckets[i]]
    std::uint64_t count = 0;                              // all jobs, +Inf's included
    double sum = 0;
  };
  std::array<Histogram, 3> duration;  // by JobOrigin: began (else created) to ended
  std::map<std::pair<JobOrigin, JobStatus>, std::uint64_t> ended;
  std::uint64_t evicted = 0;  // records dropped to stay within max_jobs and the budget
  std::size_t jobs = 0;       // records held now
  std::size_t bytes = 0;      // what they hold (budget_bytes bounds it)
};

struct KernelRecordInfo {
  std::optional<ClaimView> claim;
  std::string running_job;
  std::uint64_t restarts = 0;
};

// The route replies to agent-path requests carry: the store consumes them; no client has it.
inline constexpr std::string_view kAgentRoute = "@kgate-agent";

class JobStore final : public KernelObserver {
 public:
  using Clock = std::chrono::steady_clock;
  // `session`: kgate's own session id for the agent's cells (the kernels' host session,
  // docs/dev/kernel-side.md); "" = a fresh one.
  explicit JobStore(RecordLimits limits, std::string session = {});

  const RecordLimits& limits() const { return limits_; }
  // The session id of kgate's own execute requests: an execute_input from any other session is
  // a foreign cell.
  const std::string& session() const { return session_; }

  // KernelObserver: called on the kernel I/O thread.
  void on_kernel_message(const KernelPtr& kernel, const KernelMessagePtr& msg) override;
  void on_kernel_removed(const KernelPtr& kernel) override;
  void on_client_message(const KernelPtr& kernel, const ClientMessage& msg) override;
  void on_kernel_lifecycle(const KernelPtr& kernel, KernelLifecycle event,
                           const std::string& reason) override;

  // Runs `code` as `agent`: refused while anything runs on the kernel or another live agent holds
  // it; else records the job, takes the claim and calls `send` with the execute_request, all under
  // the store's lock.
  // `wire_code`: what the execute_request carries instead of `code` (a background task's
  // starting cell); "" = `code`.
  Outcome submit(const std::string& kernel, const AgentRef& agent, std::string code, JobOrigin origin,
                 const std::function<void(ClientMessage)>& send, bool allow_stdin = false,
                 const std::string& wire_code = "", std::chrono::milliseconds input_timeout = {});
  // Answers the input() that `job` (an agent's cell run with allow_stdin) waits on: `send` gets
  // the input_reply (stdin channel), under the lock. Refused: no such job, it is not running or
  // asks for nothing, or `agent` is not the job's.
  Outcome answer_input(const std::string& job, const AgentRef& agent, const std::string& value,
                       const std::function<void(ClientMessage)>& send);
  // Whether `job` has ended or waits for input (what a waiting request returns on).
  bool settled(const std::string& job) const;
  // Stops `job` if it still runs: `interrupt` (SIGINT to the kernel process, or the kernel
  // side's stop sent for the job's execute_request, whose msg_id it gets) is called under the
  // lock the job is ended under.  `agent` null = the person at the machine (may stop anything).
  Outcome interrupt(const std::string& job, const AgentRef* agent,
                    const std::function<bool(const std::string& request)>& interrupt);
  // The kernel side found `job` no longer running: a person's stop leaves no note on it.
  void stop_missed(const std::string& job);
  // The job of an execute_request, by its msg_id ("" when none is recorded).
  std::string job_for_request(const std::string& msg_id) const;
  // May `agent` restart `kernel`?  A person's restart (agent null) is never refused and clears
  // the claim; an agent's is refused while another live agent holds the kernel.
  Outcome restart_gate(const std::string& kernel, const AgentRef* agent);

  // Agent liveness: the agent websocket opened / closed (clean = it closed with code 1000).
  // An agent is alive while its websocket is open. One that closed it (code 1000: it exited) is
  // gone at once. One whose websocket dropped without a close frame, or that never had one, is
  // alive for claim_grace after that (or after its last request), in case it comes back.
  void agent_connected(const AgentRef& agent);
  void agent_disconnected(const std::string& agent, bool clean);
  // The agent's link dropped where a drop means its process is gone (a loopback or Unix
  // connection): its running foreground cells (not its background tasks, meant to outlive a
  // call) are noted so, and returned for the caller to interrupt as the agent.
  std::vector<std::string> agent_process_gone(const std::string& agent);
  void touch_agent(const AgentRef& agent);
  // An agent a re-adopted kernel names (its conversation) that this kgate has not met: seen now,
  // so it counts as gone once claim_grace passes without it coming back (agent_gone).
  void expect_agent(const std::string& agent);  // any request that names the agent
  // How long `agent` has been gone (no longer alive, as above), with its label; nullopt while it
  // is alive, and for an agent kgate never heard of (nothing to go by: never taken for gone).
  struct Gone {
    std::chrono::milliseconds for_{0};
    std::string label;
  };
  std::optional<Gone> agent_gone(const std::string& agent) const;

  std::optional<Job> job(const std::string& id) const;
  // The outputs of `j` (a record read from this store) as nbformat outputs, in the order they
  // came, its note last; nullopt for a job whose outputs were not kept (one read back from disk).
  std::optional<json> outputs(const Job& j) const;
  // Keep big output values in files in `dir` (0700; content-addressed, 0600) instead of memory.
  // Call before any kernel message.
  void keep_outputs_in(const std::filesystem::path& dir);
  // After restore(): removes the files in the outputs folder that no record refers to (an
  // earlier kgate's, whose records went while it was away, or a write it did not finish).
  void collect_output_files();
  struct Listing {
    std::uint64_t version = 0;
    std::vector<Job> jobs;  // summaries: output/result/traceback empty, code cut
    std::vector<RestartMark> restarts;
  };
  Listing list(const std::string& kernel, std::uint64_t after, std::size_t code_chars) const;
  std::vector<Job> kernel_jobs(const std::string& kernel) const;  // full records, oldest first
  std::vector<RestartMark> restarts(const std::string& kernel) const;
  Digest digest(const std::string& kernel) const;
  AckResult ack(const std::string& kernel, const AgentRef& agent, const std::vector<std::string>& jobs);
  KernelRecordInfo kernel_info(const std::string& kernel) const;
  bool is_running(const std::string& job) const;

  // Bumped on every lifecycle change (a job created, begun, ended, acked; a restart; a claim).
  std::uint64_t version() const;
  // Called (on whichever thread changed the store, outside the lock) when version() changed.
  void set_on_change(std::function<void()> fn) { on_change_ = std::move(fn); }
  // Ends cells whose execute_reply came reply_grace ago without their idle.  Call periodically.
  // Returns the jobs (id, agent) whose input() waited past their input_timeout: each is noted
  // so in its record, and the caller interrupts it as its agent.
  std::vector<std::pair<std::string, std::string>> sweep();

  std::size_t bytes() const;  // what the records hold (for the budget)
  JobStats stats() const;

  // Records on disk (docs/dev/readoption.md).  `log` outlives the store; set before restore() and before any
  // kernel message arrives.
  void persist_to(RecordLog* log) { log_ = log; }
  // Reads back the records an earlier kgate left for the kernels it is re-adopting (`loaded`,
  // from RecordLog::load), and rewrites each log compacted.  Jobs that were running stay running
  // with a note of the gap; numbering continues after the highest job number seen.  Returns
  // lines for the log.
  std::vector<std::string> restore(RecordLog::Loaded loaded);
  // A re-adopted kernel turned out to be dead: its running jobs end kernel_lost with `reason`.
  void lost_while_away(const std::string& kernel, const std::string& reason);
  // KernelObserver: the kernel's history, asked for when it was re-adopted.  Cells it ran that
  // the records do not hold ran while kgate was away: they are recorded as user jobs.
  void on_kernel_readopted(const KernelPtr& kernel, const std::string& history_reply) override;
  void on_kernel_side_event(const KernelPtr& kernel, const json& content) override;

 private:
  struct Agent {
    std::string label;
    int connections = 0;
    bool exited = false;
    bool ever_connected = false;
    Clock::time_point last_seen{};
  };
  struct PerKernel {
    std::uint64_t generation = 0;
    std::optional<AgentRef> claim;
    std::set<std::string> inflight;  // execute_requests from kgate's clients awaiting a reply
    std::size_t evicted_unseen = 0;
    std::uint64_t restarts = 0;
    std::uint64_t last_ended = 0;  // its job that ended last (spared by the count cap)
    int last_count = 0;        // the highest execution_count heard since the last restart
    bool restored = false;     // its records were read back from disk (re-adopted)
    std::string away_from;     // restored: when kgate last wrote its records before the gap
    std::string back_at;       // restored: when this kgate read them back
    std::uint64_t log_base = 0;  // the log's size after its last compaction
  };

  Job* find_locked(const std::string& id);
  Job* by_request_locked(const std::string& request);
  Job* running_locked(const std::string& kernel);
  // The one place that decides whether an agent is alive (see agent_connected).
  ClaimView claim_view_locked(const AgentRef& a, Clock::time_point now) const;
  bool alive_locked(const std::string& agent, Clock::time_point now) const;
  Job& create_locked(const std::string& kernel, JobOrigin origin, std::string request, std::string_view code);
  void end_locked(Job& j, JobStatus status, std::string note = {});
  // `j` began now (its execute_input, or its first busy): it ends the cells that began before.
  void begin_locked(Job& j);
  void close_earlier_locked(const Job& j, Clock::time_point since);
  void finished_locked(Job& j);  // bookkeeping of a job that stopped running
  // Ends every running job of `kernel` as `status` (kernel_lost, or culled) with `note`.
  void lose_running_locked(const std::string& kernel, JobStatus status, const std::string& note);
  void add_bytes(std::size_t before, const Job& j);
  void enforce_locked();
  void changed_locked() { ++version_; changed_ = true; }
  // Records on disk: a job (or a kernel's claim and counts) to be written at the next persist.
  void dirty_locked(const Job& j) {
    if (log_) dirty_.insert(j.n);
  }
  void dirty_kernel_locked(const std::string& kernel) {
    if (log_) dirty_kernels_.insert(kernel);
  }
  void persist_locked();
  std::string kernel_line_locked(const std::string& kernel, const PerKernel& pk) const;
  void compact_locked(const std::string& kernel, PerKernel& pk);
  // A job's disk line with its outputs (OutputStore::save), when it has any.
  json with_outputs_locked(json line) const;
  void notify();

  const RecordLimits limits_;
  const std::string session_;
  mutable std::mutex mu_;
  std::uint64_t counter_ = 0;
  std::uint64_t version_ = 0;
  bool changed_ = false;
  std::unique_ptr<OutputStore> outputs_;  // every output of the jobs in jobs_, by number
  std::map<std::uint64_t, Job> jobs_;
  std::map<std::string, std::uint64_t> by_request_;
  std::set<std::uint64_t> running_;    // running jobs (a handful: at most a few per kernel)
  std::set<std::uint64_t> evictable_;  // finished jobs that may be evicted, oldest first
  std::uint64_t release_from_ = 0;     // the budget's release scan resumes here
  std::deque<std::pair<std::string, std::uint64_t>> recent_;  // requests of jobs just finished
  std::map<std::string, PerKernel> kernels_;
  std::map<std::string, Agent> agents_;
  std::vector<RestartMark> marks_;
  std::size_t bytes_ = 0;
  JobStats stats_;  // its jobs and bytes are filled in by stats()
  std::size_t unseen_ = 0;  // finished-or-not foreign jobs not seen by an agent
  std::function<void()> on_change_;
  RecordLog* log_ = nullptr;
  std::set<std::uint64_t> dirty_;
  std::set<std::string> dirty_kernels_;
  std::vector<std::pair<std::string, std::string>> pending_lines_;  // kernel, line (restart marks)
};

// The kernel's records as an nbformat 4.5 notebook.
// `outputs_of` gives a job's kept outputs (JobStore::outputs); without them (nullopt, or no
// function) its text, result and error are shown as before.
json notebook_json(const std::vector<Job>& jobs, const std::vector<RestartMark>& marks,
                   const KernelSpec* spec,
                   const std::function<std::optional<json>(const Job&)>& outputs_of = nullptr);
// A record as the API shows it (`full` = with output, result and error).
json job_json(const Job& j, bool full, std::chrono::steady_clock::time_point now);

}  // namespace kgate
