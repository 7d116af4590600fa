// The kernel runtime: launching kernels and owning their ZMQ channel sets on one I/O thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kgate/jupyter/connection.hpp"
#include "kgate/kernel/kernel_table.hpp"
#include "kgate/jupyter/kernelspec.hpp"
#include "kgate/process/launcher.hpp"
#include "kgate/jupyter/messages.hpp"
#include "kgate/jupyter/wire.hpp"

namespace kgate {

class Kernel;
using KernelPtr = std::shared_ptr<Kernel>;

enum class KernelLifecycle {
  restarting,  // a restart began: the old process is going (or already gone)
  died,        // the process exited on its own, or a restart failed
  culled,      // kgate culls it for idleness (KernelManager::cull): it is being shut down
  stopping,    // a shutdown began (DELETE, kgate stop --kernels): what runs is stopped by its close
};

// Receives everything kernels send.  Called on the I/O thread only: implementations must
// not block (post the work elsewhere).
class KernelObserver {
 public:
  virtual ~KernelObserver() = default;
  virtual void on_kernel_message(const KernelPtr& kernel, const KernelMessagePtr& msg) = 0;
  // The kernel was removed (deleted, or gateway shutdown): drop every client of it.
  virtual void on_kernel_removed(const KernelPtr& kernel) = 0;
  // A client's message went to the kernel (after it was written to the socket).
  virtual void on_client_message(const KernelPtr&, const ClientMessage&) {}
  virtual void on_kernel_lifecycle(const KernelPtr&, KernelLifecycle, const std::string& /*reason*/) {}
  // A kernel an earlier kgate left running was re-adopted, and its shell answered a history
  // request (range, this session, with output): `history_reply` is the reply's content.  The
  // shell answers only once the cell it ran at the re-adoption, if any, has ended.
  virtual void on_kernel_readopted(const KernelPtr&, const std::string& /*history_reply*/) {}
  // kgate's kernel side announced something on iopub (a kgate_event, docs/dev/kernel-side.md): its content.
  // Such messages go to observers only through here, never to clients.
  virtual void on_kernel_side_event(const KernelPtr&, const json& /*content*/) {}
  // The kernel I/O thread finished a pass of its loop: what it handed over since the last call
  // (messages, removals) is a batch an observer that hands it on may now send as one.
  virtual void on_pass_end() {}
};

struct KernelModel {
  std::string id;
  std::string name;
  std::string execution_state;  // starting, idle, busy, restarting, dead
  std::string last_activity;    // "%Y-%m-%dT%H:%M:%S.%fZ"
  int connections = 0;
  std::string reason;           // why it is dead, when it is
  // The heartbeat's verdict: false once heartbeat_misses pings in a row went unanswered (a
  // stopped or wedged process), true again at the next answer; false when dead.
  bool responsive = true;
  double silent_seconds = 0;    // when not responsive and alive: since the first unanswered ping
  // Where it runs (docs/dev/remote-launchers.md): null for a local kernel; for a launcher's, an object with
  // launcher, kind, host/node, and for Slurm job_id, state and reason.
  json placement;
  // kgate's kernel side in it (docs/dev/kernel-side.md, kernel_side.hpp): null until known, then
  // {"installed", "features": {name: true | "why off"}, "refused": [who tried to shut it down]}.
  json kernel_side;
  // The agent (AgentRef::agent) whose conversation made it as its auto kernel, "" for none: it is
  // stopped once that agent is gone (README "The end of a conversation").
  std::string conversation;
};

// One kernel.  Created and driven by KernelManager; the gateway reads its model (from any
// thread, O(1), no ZMQ round trip) and holds shared pointers to it.
class Kernel {
 public:
  using Clock = std::chrono::steady_clock;
  Kernel(std::string id, KernelSpec spec) : id_(std::move(id)), spec_(std::move(spec)) {}
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  const std::string& id() const noexcept { return id_; }
  const KernelSpec& spec() const noexcept { return spec_; }

  // Thread-safe snapshot of the model.
  KernelModel model() const;
  std::string execution_state() const;
  std::filesystem::path connection_file() const;
  ConnectionInfo connection_info() const;
  int pid() const;
  // The gateway counts websocket connections here.
  void add_connection(int delta) { connections_.fetch_add(delta); }
  int connections() const { return connections_.load(); }
  // Since when the kernel exists, and how long since its last activity (a message from the
  // kernel on iopub, or a client's message sent to it): what idle culling measures.
  Clock::time_point created_at() const;
  Clock::duration idle_for() const;
  // The per-kernel idle timeout asked for at create time (POST /api/kernels
  // "kgate_cull_idle_timeout"): nullopt = the gateway's, 0 = never culled.  Fixed at start.
  std::optional<std::chrono::milliseconds> cull_idle_timeout() const;
  // A warm-pool kernel (KernelManager::start with StartRequest::pooled) until it is handed out:
  // hidden from get/list/count and from the observers.
  bool pooled() const noexcept { return pooled_.load(); }

  // Written by the I/O thread only.
  void set_state(std::string state, std::string reason = {});
  // The heartbeat: `silent_since` is when the first unanswered ping was sent.
  void set_responsive(bool responsive, Clock::time_point silent_since = {});
  void touch();  // last_activity = now
  // last_activity = `when` (a re-adopted kernel's, as the kgate before saved it), never later
  // than now; idle_for() counts from it.
  void touch_at(std::chrono::system_clock::time_point when);
  std::optional<std::chrono::system_clock::time_point> last_activity_time() const;
  // A re-adopted kernel's age counts from when the kgate before started it.
  void set_created(std::chrono::system_clock::time_point when);
  void set_process(int pid, std::filesystem::path file, ConnectionInfo conn);
  // Merges `fields` into the placement (docs/dev/remote-launchers.md); null removes a field.
  void update_placement(const json& fields);
  json placement() const;
  // At start, or at hand-out from the pool (before anyone else sees the kernel).
  void set_cull_idle_timeout(std::optional<std::chrono::milliseconds> t);
  // The conversation whose auto kernel it is (KernelModel::conversation); "" when it is kept.
  void set_conversation(std::string agent);
  std::string conversation() const;
  // At hand-out: the kernel's age and idle time start now; it becomes visible.
  void handed_out();
  void set_pooled(bool p) noexcept { pooled_.store(p); }
  // The kernel side's state (kernel_side.hpp), set when its install is answered; a refused
  // shutdown_request is added to its "refused" list (the last kMaxRefused).
  static constexpr std::size_t kMaxRefused = 20;
  void set_kernel_side(json state);
  void add_refused(json who);
  json kernel_side() const;

 private:
  json kernel_side_locked() const;

  const std::string id_;
  const KernelSpec spec_;
  mutable std::mutex mu_;
  std::string state_ = "starting";
  std::string reason_;
  bool responsive_ = true;
  Clock::time_point silent_since_{};
  // Formatted only when the model is read: touch() runs for every iopub message.
  std::optional<std::chrono::system_clock::time_point> last_activity_;
  Clock::time_point created_ = Clock::now();
  Clock::time_point last_touch_ = created_;
  std::optional<std::chrono::milliseconds> cull_idle_timeout_;
  std::string conversation_;
  std::filesystem::path connection_file_;
  ConnectionInfo conn_;
  int pid_ = -1;
  json placement_;
  json kernel_side_;
  json refused_ = json::array();
  std::atomic<int> connections_{0};
  std::atomic<bool> pooled_{false};
};

// Per-kernel limits and timeouts.  Defaults are documented in DEV.md.
struct KernelOptions {
  std::chrono::milliseconds ready_timeout{60000};      // launch -> kernel_info_reply + iopub
  std::chrono::milliseconds close_grace{2000};         // the kernel side's close: a cell's, a task's end
  std::chrono::milliseconds shutdown_grace{2500};      // shutdown_request -> SIGTERM
  std::chrono::milliseconds terminate_grace{2500};     // SIGTERM -> SIGKILL
  // hb ping period, and missed pings in a row -> "unresponsive": 4-6 s of silence.  The pings are
  // most of what an idle kernel costs kgate (docs/dev/kernel-lifecycle.md); death itself is seen
  // through the pidfd, not the heartbeat.
  std::chrono::milliseconds heartbeat_interval{2000};
  int heartbeat_misses = 2;
  // A kernel streaming output (16 small iopub messages in a row, each within 2 ms of the one
  // before, no status between) has its iopub read once per this long instead of once per
  // message, until a status, a large message or a read that finds nothing; a lone message is
  // read at once.  0 = every message at once.  (io_loop.cpp read_iopub, docs/dev/limits.md)
  std::chrono::milliseconds iopub_batch{10};
  int launch_attempts = 3;              // relaunches on fresh ports after an early exit
  // Local kernels' sockets (docs/kernels.md "Kernel sockets"): "ipc" = Unix sockets in the 0700
  // runtime dir, which only this uid can reach; "tcp" = 127.0.0.1 ports, which every local user
  // can connect to (iopub needs no key).  `tcp_kernelspecs` get tcp whatever `transport` says (a
  // kernel that cannot speak ipc).  Remote kernels are on tcp always.
  std::string transport = "ipc";
  std::vector<std::string> tcp_kernelspecs;
  std::size_t max_pending = 10000;      // requests awaiting a reply, per kernel
  std::size_t max_held = 1000;          // client messages held while starting/restarting
  std::size_t max_message_bytes = std::size_t{1} << 30;  // one message from a kernel
  // Supervision (docs/dev/readoption.md): the kgate-supervise binary each kernel is started under, so it
  // can outlive this process; empty = kernels are direct children that die with it.
  std::filesystem::path supervisor;
  // How long a supervised kernel waits for a kgate to come back before it stops itself.
  std::chrono::milliseconds orphan_timeout{std::chrono::hours(1)};
  // The kernel table (docs/dev/readoption.md): <state dir>/kernels; empty = none kept.
  std::filesystem::path table_dir;
  // Remote launchers (docs/dev/remote-launchers.md): the registration endpoint's address (bound at the first
  // remote start; port 0 = any) and where launch specs and job logs go (0700).
  std::string registration_ip = "127.0.0.1";
  int registration_port = 0;
  std::filesystem::path remote_dir;
  // A running job whose launcher has not registered within this long fails the start.
  std::chrono::milliseconds registration_timeout{120000};
  // A remote kernel whose control link (or SSH forwarding) dropped is reconnected for this long,
  // then it is dead.
  std::chrono::milliseconds link_timeout{60000};
  // How often queued and running Slurm jobs are looked up with squeue.
  std::chrono::milliseconds scheduler_poll{2000};
  // kgate's session id as the kernels' host (docs/dev/kernel-side.md): handed to each kernel at launch
  // (KGATE_HOST_SESSION) and to its kernel side; kgate's own requests to a kernel carry it, or
  // it + "." + a per-kernel suffix. Kept in the state dir so re-adopted kernels know it; "" = a
  // fresh one for this manager.
  std::string host_session;
};

// What POST /api/kernels asks for, after the gateway applied its policies.
struct StartRequest {
  KernelSpec spec;                            // the kernelspec to launch, already looked up
  std::string id;                             // the kernel's id (a client's uuid); "" = a fresh uuid4
  std::map<std::string, std::string> env;     // applied over kgate's env and the spec's env
  std::filesystem::path cwd;                  // empty = kgate's cwd
  // Idle timeout of this kernel (overrides the gateway's): nullopt = the gateway's, 0 = never.
  std::optional<std::chrono::milliseconds> cull_idle_timeout;
  // A warm-pool kernel: started hidden (not in get/list/count, nothing to the observers, its
  // connection file named pool-<id>.json so `jupyter console --existing` does not pick it),
  // until KernelManager::hand_out.  `on_pool_lost` runs on the I/O thread if it dies or is
  // removed while still pooled.
  bool pooled = false;
  std::function<void(const std::string& id, const std::string& why)> on_pool_lost;
  // A remote launcher (docs/dev/remote-launchers.md), its POST overrides applied; null = a local kernel.
  LauncherPtr launcher;
};

// What a pooled kernel takes on at hand-out (docs/dev/kernel-lifecycle.md "Warm pool"): run in the kernel as one
// silent execute (no history, no execution count, no output) before anyone sees it.
struct HandOut {
  std::map<std::string, std::string> env;  // set in os.environ
  std::filesystem::path cwd;               // os.chdir; empty = stays in kgate's cwd
  std::optional<std::chrono::milliseconds> cull_idle_timeout;
  std::chrono::milliseconds timeout{10000};  // the execute must answer within this
};

// What an idle cull may take, re-checked on the I/O thread when the cull happens (activity
// may have come since the gateway's check).
struct CullRequest {
  std::chrono::milliseconds idle_timeout{0};  // idle for longer than this (> 0)
  bool cull_busy = false;                     // also while execution_state is busy
  bool cull_connected = false;                // also with websocket clients connected
  std::string setting;  // the setting that culls it, named to clients: "cull_idle_timeout"
  // An auto kernel whose conversation is gone (README "The end of a conversation"): stopped
  // whatever its idle time and state, unless a client is connected; `setting` is the reason.
  bool orphan = false;
};

struct StartResult {
  KernelPtr kernel;    // set on success
  std::string error;   // set on failure
};

// Owns the I/O thread and every kernel.  All public methods are thread-safe; callbacks run
// on the I/O thread.
class KernelManager {
 public:
  // Observers are called in order, on the I/O thread; they must outlive the manager.
  KernelManager(KernelOptions opts, std::filesystem::path runtime_dir,
                std::vector<KernelObserver*> observers);
  ~KernelManager();  // stops every kernel (bounded), then the thread
  KernelManager(const KernelManager&) = delete;
  KernelManager& operator=(const KernelManager&) = delete;

  // Launches a kernel; `done` runs once it answered kernel_info with a live iopub, or failed.
  void start(StartRequest req, std::function<void(StartResult)> done);
  // Graceful shutdown (control shutdown_request, SIGTERM, SIGKILL), then the kernel is
  // removed.  `done(false)` if no such kernel.
  void shutdown(const std::string& id, std::function<void(bool)> done);
  // shutdown_request{restart:true}, relaunch on the same ports, key and connection file.
  void restart(const std::string& id, std::function<void(StartResult)> done);
  // SIGINT to the kernel process (signal mode; never its process group, so its children are
  // not hit) or interrupt_request on control (message mode).
  void interrupt(const std::string& id, std::function<void(bool)> done);
  // Runs `fn` on the I/O thread with a function that interrupts the kernel as above and returns
  // whether it could (false once the process is gone); `fn` gets nullptr if there is no such
  // kernel.  The I/O thread reaps kernels, so the pid cannot be reused under `fn`.
  void with_interrupt(const std::string& id, std::function<void(const std::function<bool()>*)> fn);
  // Sends kgate's kernel side (docs/dev/kernel-side.md) a kgate_request with `content` on control; `done`
  // gets its kgate_reply's content, or nullopt: no answer within `timeout`, the kernel is not
  // ready, or it died or stopped first. `done` runs on the I/O thread, exactly once.
  void kernel_side_call(const std::string& id, json content, std::chrono::milliseconds timeout,
                        std::function<void(std::optional<json>)> done);
  // Sends a client's message.  Requests are tracked until their reply; a dead kernel or a
  // full table answers them with an error reply (exactly one reply per request).
  void send(const std::string& id, ClientMessage msg);
  // Idle culling.  A ready kernel that still qualifies under `req` is culled: observers get
  // KernelLifecycle::culled, its clients a "[kgate] kernel culled ..." stderr stream on iopub
  // and `status: dead`, and it is shut down and removed as by shutdown() (nothing more of it
  // reaches clients).  A dead kernel is removed (jupyter_server's culler does the same).
  // `done(true)` when the shutdown began, `done(false)` when it no longer qualifies or is gone
  // (may be empty).
  void cull(const std::string& id, CullRequest req, std::function<void(bool)> done);

  // Hands a ready pooled kernel out: applies `h` (HandOut), renames its connection file to
  // kernel-<id>.json and makes it visible.  `done` gets the kernel, or an error (not pooled,
  // not ready, gone, the execute failed or timed out: then the kernel is stopped and removed).
  void hand_out(const std::string& id, HandOut h, std::function<void(StartResult)> done);
  // A kernel by id, pooled ones included (the pool's own bookkeeping).
  KernelPtr get_any(const std::string& id) const;

  KernelPtr get(const std::string& id) const;
  std::vector<KernelPtr> list() const;
  std::size_t count() const;

  // Since this kgate started (for /metrics): kernels that became ready after a launch (pooled
  // ones included; a re-adopted one is not launched), launches that failed (a failed restart
  // too), and restarts that came back ready; from the kernel side (docs/dev/kernel-side.md): shutdown
  // requests it refused to other clients, background tasks started, and closes before a stop,
  // answered or not.  Any thread.
  struct Counters {
    std::uint64_t started = 0, start_failures = 0, restarts = 0;
    std::uint64_t refused_shutdowns = 0, tasks_started = 0, closes_answered = 0, closes_unanswered = 0;
  };
  Counters counters() const;

  // Stops every kernel concurrently and waits (bounded by the shutdown graces).
  void shutdown_all();

  // kgate stops, its kernels stay (SIGTERM, docs/dev/readoption.md): every ready, supervised kernel that
  // is not pooled is let go: its sockets close, its pending requests get an error reply, its
  // supervisor starts the orphan timeout, and its table entry and files stay for the next kgate.
  // The others (pooled, starting, restarting, direct children) are left for shutdown_all().
  // Returns how many were let go.
  std::size_t detach_all();
  // Writes the kernel's table entry again (its conversation mark changed), if it is ready: the
  // next kgate re-adopts it as it is now, even after a kill -9.
  void remember(const std::string& id);

  // Re-adopts kernels that outlived an earlier kgate (docs/dev/readoption.md), from its kernel table: each
  // one's supervisor is reached and must still hold the same process (pid and start time); the
  // kernel is then listed at once (`starting`) with its id, spec, ports, key and connection
  // file, and becomes `idle` when it answers kernel_info on control.  Pooled ones are stopped.
  // Entries whose kernel is gone are dropped.  Returns one line per entry, for the log.
  std::vector<std::string> adopt(std::vector<KernelTableEntry> entries);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kgate
