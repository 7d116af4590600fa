// The kernel runtime: one I/O thread owns every kernel's sockets, process and timers.
//
// Threading: every zmq socket, ChildProcess and KernelIo below is touched only by the I/O
// thread ("kgate-io").  Other threads reach it through Impl::post(), which queues a closure
// and wakes the poll loop through an eventfd.  Kernel objects (the models) are shared and
// guard their own fields with a mutex.
#include "kgate/kernel.hpp"
#include "kgate/kernel_side.hpp"
#include "kgate/utf8.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <future>
#include <queue>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "kgate/process.hpp"
#include "kgate/supervisor.hpp"

namespace kgate {

using Clock = std::chrono::steady_clock;

// A re-adopted kernel's clients' shell requests wait at most this long for its history reply (a
// kernel that does not answer history_request delays them once, by this much).
constexpr std::chrono::seconds kHistoryHold{5};

// A starting kernel that answers kernel_info and iopub but not its heartbeat within this is
// relaunched on fresh ports (its heartbeat thread died on a taken port).
constexpr std::chrono::seconds kHeartbeatGrace{3};

std::string_view channel_name(Channel c) noexcept {
  switch (c) {
    case Channel::shell: return "shell";
    case Channel::control: return "control";
    case Channel::stdin_: return "stdin";
    case Channel::iopub: return "iopub";
  }
  return "shell";
}

std::optional<Channel> parse_channel(std::string_view name) noexcept {
  if (name == "shell") return Channel::shell;
  if (name == "control") return Channel::control;
  if (name == "stdin") return Channel::stdin_;
  if (name == "iopub") return Channel::iopub;
  return std::nullopt;
}

KernelMessage synthesize_message(Channel channel, std::string_view msg_type,
                                 std::string_view session, std::string parent_header,
                                 const json& content) {
  KernelMessage m;
  m.channel = channel;
  m.synthesized = true;
  m.msg_type = std::string(msg_type);
  json header = make_header(msg_type, session);
  m.msg_id = header["msg_id"].get<std::string>();
  json parent = json::parse(parent_header, nullptr, false);
  if (parent.is_object()) m.parent_msg_id = parent.value("msg_id", "");
  m.wire.header = header.dump();
  m.wire.parent_header = std::move(parent_header);
  m.wire.metadata = "{}";
  m.wire.content = content.dump();
  return m;
}

// Sends one encoded message without blocking.  False when the socket's pipe is full (only the
// first frame can fail that way: a full pipe accepts no new message).
static bool send_frames(zmq::socket_t& s, const std::vector<std::string>& frames) {
  for (std::size_t i = 0; i < frames.size(); ++i) {
    auto flags = zmq::send_flags::dontwait;
    if (i + 1 < frames.size()) flags = flags | zmq::send_flags::sndmore;
    if (!s.send(zmq::buffer(frames[i]), flags)) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// Kernel (the shared model)

KernelModel Kernel::model() const {
  std::lock_guard lk(mu_);
  KernelModel m;
  m.id = id_;
  m.name = spec_.name;
  m.execution_state = state_;
  m.last_activity = last_activity_ ? iso_time(*last_activity_) : std::string();
  m.connections = connections_.load();
  m.reason = reason_;
  m.placement = placement_;
  m.kernel_side = kernel_side_locked();
  m.conversation = conversation_;
  m.responsive = responsive_ && state_ != "dead";
  if (!responsive_ && state_ != "dead")
    m.silent_seconds = std::chrono::duration<double>(Clock::now() - silent_since_).count();
  return m;
}

void Kernel::update_placement(const json& fields) {
  std::lock_guard lk(mu_);
  if (!placement_.is_object()) placement_ = json::object();
  for (const auto& [key, value] : fields.items()) {
    if (value.is_null()) placement_.erase(key);
    else placement_[key] = value;
  }
}

void Kernel::set_kernel_side(json state) {
  std::lock_guard lk(mu_);
  kernel_side_ = std::move(state);
}

void Kernel::add_refused(json who) {
  std::lock_guard lk(mu_);
  refused_.push_back(std::move(who));
  if (refused_.size() > kMaxRefused) refused_.erase(refused_.begin());
}

json Kernel::kernel_side() const {
  std::lock_guard lk(mu_);
  return kernel_side_locked();
}

json Kernel::kernel_side_locked() const {
  if (kernel_side_.is_null()) return nullptr;
  json out = kernel_side_;
  out["refused"] = refused_;
  return out;
}

json Kernel::placement() const {
  std::lock_guard lk(mu_);
  return placement_;
}

std::string Kernel::execution_state() const {
  std::lock_guard lk(mu_);
  return state_;
}

std::filesystem::path Kernel::connection_file() const {
  std::lock_guard lk(mu_);
  return connection_file_;
}

ConnectionInfo Kernel::connection_info() const {
  std::lock_guard lk(mu_);
  return conn_;
}

int Kernel::pid() const {
  std::lock_guard lk(mu_);
  return pid_;
}

void Kernel::set_state(std::string state, std::string reason) {
  std::lock_guard lk(mu_);
  state_ = std::move(state);
  reason_ = std::move(reason);
}

void Kernel::set_responsive(bool responsive, Clock::time_point silent_since) {
  std::lock_guard lk(mu_);
  responsive_ = responsive;
  silent_since_ = silent_since;
}

void Kernel::touch() {
  auto now = std::chrono::system_clock::now();
  auto t = Clock::now();
  std::lock_guard lk(mu_);
  last_activity_ = now;
  last_touch_ = t;
}

void Kernel::touch_at(std::chrono::system_clock::time_point when) {
  auto now = std::chrono::system_clock::now();
  auto t = Clock::now();
  if (when > now) when = now;
  std::lock_guard lk(mu_);
  last_activity_ = when;
  last_touch_ = t - std::chrono::duration_cast<Clock::duration>(now - when);
}

void Kernel::set_created(std::chrono::system_clock::time_point when) {
  auto now = std::chrono::system_clock::now();
  if (when > now) when = now;
  auto t = Clock::now() - std::chrono::duration_cast<Clock::duration>(now - when);
  std::lock_guard lk(mu_);
  created_ = t;
}

std::optional<std::chrono::system_clock::time_point> Kernel::last_activity_time() const {
  std::lock_guard lk(mu_);
  return last_activity_;
}

Kernel::Clock::time_point Kernel::created_at() const {
  std::lock_guard lk(mu_);
  return created_;
}

std::optional<std::chrono::milliseconds> Kernel::cull_idle_timeout() const {
  std::lock_guard lk(mu_);
  return cull_idle_timeout_;
}

void Kernel::set_cull_idle_timeout(std::optional<std::chrono::milliseconds> t) {
  std::lock_guard lk(mu_);
  cull_idle_timeout_ = t;
}

void Kernel::set_conversation(std::string agent) {
  std::lock_guard lk(mu_);
  conversation_ = std::move(agent);
}

std::string Kernel::conversation() const {
  std::lock_guard lk(mu_);
  return conversation_;
}

void Kernel::handed_out() {
  auto now = std::chrono::system_clock::now();
  auto t = Clock::now();
  {
    std::lock_guard lk(mu_);
    created_ = t;
    last_touch_ = t;
    last_activity_ = now;
  }
  pooled_.store(false);
}

Kernel::Clock::duration Kernel::idle_for() const {
  auto now = Clock::now();
  std::lock_guard lk(mu_);
  return now - last_touch_;
}

void Kernel::set_process(int pid, std::filesystem::path file, ConnectionInfo conn) {
  std::lock_guard lk(mu_);
  pid_ = pid;
  connection_file_ = std::move(file);
  conn_ = std::move(conn);
}

// ---------------------------------------------------------------------------------------
// I/O-thread state of one kernel

namespace {

enum class Phase { launching, ready, restarting, stopping, dead };

struct Pending {
  Channel channel;
  std::string msg_type;
  std::string header;  // the request's header text: the parent of a synthesized reply
  std::string route;
};

std::string reply_type(const std::string& request_type) {
  static constexpr std::string_view suffix = "_request";
  if (request_type.size() > suffix.size() &&
      request_type.compare(request_type.size() - suffix.size(), suffix.size(), suffix) == 0)
    return request_type.substr(0, request_type.size() - suffix.size()) + "_reply";
  return request_type + "_reply";
}

}  // namespace

struct KernelIo {
  KernelPtr kernel;
  StartRequest request;
  std::unique_ptr<Signer> signer;
  ConnectionInfo conn;
  std::filesystem::path file;
  ChildProcess proc;
  std::string sup_name;  // the supervisor's socket name (kernel table)
  pid_t sup_pid = 0;     // the supervisor's pid (kernel table): the only peer trusted on sup_name
  bool adopted = false;  // re-adopted from an earlier kgate's table, not yet ready (adopt())
  std::string history_probe;  // re-adopted: the history_request whose reply goes to observers
  std::string quiet_parent;   // iopub under this parent (the history probe) is not activity
  // Re-adopted, history probe out: clients' shell requests wait in `held` until its reply (so
  // the records know the gap's cells before any new cell ends), at most kHistoryHold.
  bool hold_shell = false;
  // The kernel side (DEV.md §14): the kernel_info_reply's implementation ("ipython" for
  // ipykernel), and the install request in flight.
  std::string implementation;
  std::string side_install;
  // kgate_requests to the kernel side awaiting their kgate_reply (KernelManager::kernel_side_call).
  std::map<std::string, std::function<void(std::optional<json>)>> side_calls;
  std::string closing;  // the close sent before this stop's shutdown_request (begin_stop)
  // The background task that runs (its starting request, from task_start to task_end): the
  // kernel is busy for culling while it runs, though its shell is idle.
  std::string task;
  std::int64_t created_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch()).count();
  std::unique_ptr<zmq::socket_t> shell, control, stdin_, iopub, hb;
  // Watches stdin's handshake: the kernel's stdin ROUTER drops an input_request for a peer
  // it has not met yet, so a kernel is not ready until our stdin DEALER is connected.
  std::unique_ptr<zmq::socket_t> stdin_monitor;
  bool stdin_up = false;
  std::string session;  // kgate's own session id with this kernel (Impl::kernel_session)
  // Bumped each time the sockets are opened anew after a remote kernel's link came back: their
  // routing identity is session-gen, because the kernel's ROUTER may still hold the old
  // connection under the old identity (no handover) and would route our replies there.
  unsigned socket_gen = 0;
  Phase phase = Phase::launching;
  int attempts = 0;
  std::uint64_t epoch = 0;  // bumped per launch: stale timers check it

  // Readiness, per launch: a kernel_info_reply to any of this launch's requests, any iopub
  // message, and stdin's handshake. Each fact, once seen, stays seen for the launch: a reply
  // that comes after the next resend still counts (a loaded kernel can take longer than the
  // resend interval to answer, and only the newest request used to count).
  std::uint64_t info_seq = 0;  // bumped per kernel_info_request: an older resend timer is stale
  bool ready_reply = false;
  bool iopub_seen = false;
  int info_sent = 0;           // kernel_info_requests of this launch, for the diagnosis
  // Their msg_ids: the busy/idle they cause may come after the kernel is ready (iopub and shell
  // are separate connections, and ipykernel sends iopub from a thread of its own), and must not
  // move the execution state a ready kernel starts with (idle) to busy.
  std::set<std::string> readiness_ids;
  bool stall_relaunched = false;  // one relaunch of a kernel that started but never got ready
  Clock::time_point ready_deadline;
  Clock::time_point stall_deadline;  // launch + ready_timeout / 3: then relaunch once
  std::vector<std::function<void(StartResult)>> start_waiters;
  std::vector<std::function<void(bool)>> stop_waiters;
  bool restart_requested = false;
  bool culled = false;  // culled: nothing more of it goes to observers (clients were told dead)

  // A hand-out from the pool in progress (KernelManager::hand_out): done once the execute's
  // reply and its idle status are both in, or on error/timeout.
  struct HandOutWait {
    std::string msg_id;
    bool replied = false;
    bool idle = false;
    std::string error;
    std::optional<std::chrono::milliseconds> cull_idle_timeout;
    std::function<void(StartResult)> done;
  };
  std::optional<HandOutWait> handout;

  std::deque<ClientMessage> held;  // client messages waiting for readiness
  std::unordered_map<std::string, Pending> pending;
  std::unordered_set<std::string> internal;  // msg_ids of kgate's own requests
  std::deque<std::string> recent_control;    // control msg_ids whose statuses are ignored

  void remember_control(const std::string& msg_id) {
    recent_control.push_back(msg_id);
    if (recent_control.size() > 64) recent_control.pop_front();
  }

  // Heartbeat.
  bool hb_waiting = false;
  // Readiness: the heartbeat echoed once.  ipykernel binds it in a thread of its own, and a
  // port taken in the bind/close window kills only that thread: the kernel answers everything
  // else and is never heard on its heartbeat (relaunched on fresh ports, see send_kernel_info).
  bool hb_ok = false;
  Clock::time_point hb_wait_since{};  // the rest of readiness was there, the echo was not
  int hb_misses = 0;
  bool hb_warned = false;
  std::uint64_t hb_seq = 0;
  std::chrono::steady_clock::time_point hb_silent_since;  // the first unanswered ping

  // A remote launcher's kernel (DEV.md §4f).
  bool remote() const { return request.launcher != nullptr; }
  std::string reg_secret;             // the one-time registration secret; "" once registered
  std::set<std::string> reg_nonces;   // msg_ids of the registrations tried with it
  std::string slurm_job;              // its Slurm job id, once sbatch answered
  Clock::time_point running_since{};  // its job RUNNING, not registered: registration_timeout runs
  std::filesystem::path spec_file;    // the launch spec (the node removes it once read)
  int control_link_port = 0;          // the node launcher's, once registered
  // Where the node launcher put it: its address as reported, and shell, iopub, stdin, control,
  // hb and the control link on the node; where kgate connects (the node's address, the SSH
  // host's, or 127.0.0.1 through the forwards); the forwards' local ports and their ssh.
  std::string node_ip, connect_ip, host_addr;
  std::vector<int> node_ports, local_ports;
  ChildProcess tunnel;
  // The control link (or the SSH forwarding) dropped: reconnecting until link_timeout.
  bool link_down = false, link_out = false;
  // Reconnected, sockets open anew: held messages wait until iopub is heard again (a SUB
  // misses what is published before its subscription reaches the kernel).
  bool relinking = false;
  bool interrupt_on_relink = false;  // an interrupt asked for while it was unreachable
  Clock::time_point link_down_since{};
  std::string link_why;

  bool sockets_open() const { return shell != nullptr; }
  std::string routing_id() const { return socket_gen ? session + "-" + std::to_string(socket_gen) : session; }

  // Sockets to read on the next pass without waiting for their ZMQ_FD (poll_once), one bit per
  // poll slot kind (1 << 0 shell ... 1 << 4 hb, 1 << 7 stdin monitor): a socket just sent on
  // (libzmq may then have taken in the signal of a message that arrived), one whose read stopped
  // at its bound with messages left, and every socket after connect().
  std::uint8_t recheck = 0xff;
  static constexpr std::uint8_t kHbBit = 1 << 4, kStdinMonitorBit = 1 << 7;
  static std::uint8_t bit(Channel ch) {
    switch (ch) {
      case Channel::shell: return 1 << 0;
      case Channel::control: return 1 << 1;
      case Channel::stdin_: return 1 << 2;
      case Channel::iopub: return 1 << 3;
    }
    return 0;
  }
};

// ---------------------------------------------------------------------------------------

struct KernelManager::Impl {
  Impl(KernelOptions o, std::filesystem::path rd, std::vector<KernelObserver*> ob)
      : opts(o), runtime_dir(std::move(rd)), observers(std::move(ob)), table(opts.table_dir) {}

  KernelOptions opts;
  // kgate's own session with one kernel: the host's, with a suffix of its own (DEV.md §14).
  std::string kernel_session() const { return opts.host_session + "." + new_hex_id().substr(0, 12); }
  std::filesystem::path runtime_dir;
  // KernelManager::counters(): written on kgate-io, read anywhere.
  std::atomic<std::uint64_t> started{0}, start_failures{0}, restarts{0};
  std::atomic<std::uint64_t> refused_shutdowns{0}, tasks_started{0}, closes_answered{0}, closes_unanswered{0};
  std::vector<KernelObserver*> observers;
  KernelTable table;  // I/O thread only

  zmq::context_t ctx{1};
  int wake_fd = -1;
  std::mutex qmu;
  std::deque<std::function<void()>> queue;
  std::atomic<bool> stopping{false};
  std::thread thread;

  mutable std::mutex kmu;
  std::map<std::string, KernelPtr> kernels;  // every live or dead kernel, by id

  // ---- I/O thread only ----
  std::map<std::string, std::unique_ptr<KernelIo>> io;
  struct Timer {
    Clock::time_point when;
    std::uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Timer& o) const { return when != o.when ? when > o.when : seq > o.seq; }
  };
  std::priority_queue<Timer, std::vector<Timer>, std::greater<>> timers;
  std::uint64_t timer_seq = 0;
  std::set<int> reserved_ports;
  std::uint64_t dropped_invalid = 0;

  // Remote launchers (DEV.md §4f): the registration ROUTER (bound at the first remote start),
  // the scheduler poll, and the worker threads that run the scheduler's commands (sbatch,
  // squeue, scancel block; kgate-io never waits on them).
  std::unique_ptr<zmq::socket_t> reg;
  std::string reg_endpoint;
  bool reg_recheck = false;
  bool sched_timer = false, sched_out = false;
  std::atomic<int> workers{0};
  void spawn(std::function<void()> fn) {
    ++workers;
    std::thread([this, fn = std::move(fn)] {
      block_async_signals_in_this_thread();
      fn();
      --workers;
    }).detach();
  }
  void ensure_registration();
  void launch_remote(KernelIo& k);
  void on_registration();
  void registered(KernelIo& k, const json& c);
  // Checks a registration (frames [ids..., delimiter, signature, header, parent, metadata,
  // content]) against k's one-time secret: "" and `c` (its content) when it is good, else why
  // not; `signed_ok` says whether it was at least signed with the secret (the answer is then
  // signed too).  A good one uses the secret up.
  std::string verify_registration(KernelIo& k, const std::vector<std::string_view>& views, json& c,
                                  bool& signed_ok);
  // The node launcher's report through the SSH launch's stdout (one JSON line of frames).
  void ssh_reported(KernelIo& k, const std::string& line);
  // Connects the control link (after starting the SSH forwarding, when the launcher forwards)
  // on a worker; on_link takes it on kgate-io.
  void open_link(KernelIo& k, bool reconnect);
  void on_link(KernelIo& k, ChildProcess::SupervisorHello hello, bool reconnect);
  void link_lost(KernelIo& k, const std::string& why);
  void relink_probe(const std::string& id, std::uint64_t epoch);
  void relinked(KernelIo& k);
  void reconnect_try(const std::string& id, std::uint64_t epoch);
  bool start_tunnel(KernelIo& k, std::string& why);
  // A restart of a remote kernel: its node launcher started it again on the same ports, in the
  // same job; false when it did not (then a new job is submitted).
  bool relaunched_in_place(KernelIo& k);
  // Listening to a kernel kgate did not launch just now (re-adopted, a remote one registered or
  // restarted in place): its sockets, and readiness from scratch, in the phase it is in.
  void await_ready(KernelIo& k);
  void scheduler_arm();
  void scheduler_tick();
  void on_scheduler(const std::vector<std::string>& jobs,
                    const std::optional<std::vector<SlurmJobState>>& res, const std::string& why);

  void post(std::function<void()> fn) {
    {
      std::lock_guard lk(qmu);
      queue.push_back(std::move(fn));
    }
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd, &one, sizeof one);
  }

  void after(std::chrono::milliseconds d, std::function<void()> fn) {
    timers.push(Timer{Clock::now() + d, timer_seq++, std::move(fn)});
  }

  KernelIo* find(const std::string& id) {
    auto it = io.find(id);
    return it == io.end() ? nullptr : it->second.get();
  }

  void run();
  void poll_once();
  void on_readable(KernelIo& k, zmq::socket_t& sock, Channel ch);
  void on_hb(KernelIo& k);
  void on_exit(KernelIo& k);
  // The kernel died on its own (`how`: "exited with code 1", ...): dead, with what was pending failed.
  void die(KernelIo& k, const std::string& how);
  void handle_message(KernelIo& k, Channel ch, KernelMessage&& m);

  void launch(KernelIo& k, bool fresh_ports);
  void open_sockets(KernelIo& k);
  void close_sockets(KernelIo& k);
  void stop_stdin_monitor(KernelIo& k);
  void on_stdin_monitor(KernelIo& k);
  std::string send_internal(KernelIo& k, Channel ch, const std::string& msg_type, json content);
  void check_handout(KernelIo& k);
  void send_kernel_info(KernelIo& k);
  std::string readiness_missing(const KernelIo& k) const;  // what readiness still waits for
  void check_ready(KernelIo& k);
  void became_ready(KernelIo& k);
  void install_kernel_side(KernelIo& k);
  // A kgate_event on iopub: the kernel side tells kgate something (not passed to clients).
  void kernel_side_event(KernelIo& k, const KernelMessage& m);
  // Sends the shell requests held while a re-adopted kernel's history probe was out.
  void release_shell(KernelIo& k);
  void fail_start(KernelIo& k, const std::string& why);
  void send_now(KernelIo& k, ClientMessage& m);
  void refuse(KernelIo& k, const ClientMessage& m, const std::string& ename,
              const std::string& evalue);
  void fail_pending(KernelIo& k, const std::string& ename, const std::string& evalue);
  void broadcast_status(KernelIo& k, const std::string& state);
  void deliver(KernelIo& k, KernelMessage&& m);
  void lifecycle(KernelIo& k, KernelLifecycle ev, const std::string& reason);
  bool interrupt_now(KernelIo& k);
  void begin_stop(KernelIo& k, bool restart);
  void send_shutdown(KernelIo& k);
  // Sends kgate_request `content` on control; `done` gets its kgate_reply's content, or nullopt
  // after `timeout` (or from fail_pending). The request's msg_id, or "" when it was not sent
  // (then `done` is not kept).
  std::string side_call(KernelIo& k, json content, std::chrono::milliseconds timeout,
                        std::function<void(std::optional<json>)> done);
  bool answer_side_call(KernelIo& k, const KernelMessage& m);  // a kgate_reply's waiter: whether one was
  void finish_removal(KernelIo& k);
  // The kernel table (DEV.md §4e): its entry, rewritten when it became ready or was handed out.
  void save_entry(KernelIo& k, bool with_activity = false);
  // Listening to a kernel an earlier kgate started (adopt()): sockets and readiness, no launch.
  void attach(KernelIo& k);
  bool cull_now(KernelIo& k, const CullRequest& req);
  void heartbeat_tick(const std::string& id, std::uint64_t epoch);
};

// ---------------------------------------------------------------------------------------
// Launch and readiness

void KernelManager::Impl::launch(KernelIo& k, bool fresh_ports) {
  // A new process: the last one's kernel side is not this one's (until its install answers,
  // nothing is sent to it, a close included).
  k.kernel->set_kernel_side(json());
  k.side_install.clear();
  k.task.clear();
  k.closing.clear();
  if (k.remote()) {
    launch_remote(k);
    return;
  }
  ++k.epoch;
  ++k.attempts;
  if (fresh_ports || k.conn.shell_port == 0) {
    for (int p : {k.conn.shell_port, k.conn.iopub_port, k.conn.stdin_port, k.conn.control_port,
                  k.conn.hb_port})
      reserved_ports.erase(p);
    auto ports = pick_ports(k.conn.ip, 5, reserved_ports);
    k.conn.shell_port = ports[0];
    k.conn.iopub_port = ports[1];
    k.conn.stdin_port = ports[2];
    k.conn.control_port = ports[3];
    k.conn.hb_port = ports[4];
    for (int p : ports) reserved_ports.insert(p);
  }
  write_connection_file(k.file, k.conn);
  write_owner_file(runtime_dir, k.kernel->id());  // a later kgate can tell whose files these are

  const KernelSpec& spec = k.kernel->spec();
  LaunchOptions lo;
  lo.env = current_environment();
  for (const auto& [name, value] : spec.env) lo.env[name] = expand_env(value, lo.env);
  for (const auto& [name, value] : k.request.env) lo.env[name] = value;
  lo.env["JPY_PARENT_PID"] = std::to_string(::getpid());
  lo.env[kHostSessionEnv] = opts.host_session;  // the kernel side's host, known before anyone connects
  for (const auto& a : spec.argv) {
    std::string arg = a;
    for (auto [key, val] : {std::pair<std::string_view, std::string>{"{connection_file}", k.file.string()},
                            {"{resource_dir}", spec.resource_dir.string()}}) {
      for (auto pos = arg.find(key); pos != std::string::npos; pos = arg.find(key, pos + val.size()))
        arg.replace(pos, key.size(), val);
    }
    lo.argv.push_back(std::move(arg));
  }
  lo.cwd = k.request.cwd;
  lo.die_with_parent = true;
  if (!opts.supervisor.empty()) {
    lo.supervisor = opts.supervisor;
    lo.orphan_timeout = opts.orphan_timeout;
    lo.terminate_grace = opts.terminate_grace;
  }
  // One name per launch, so a restart's new supervisor never meets the old one's socket, with
  // 128 random bits, so no other user can bind it first (abstract names are anyone's). A name
  // that is taken all the same (it shows in ps once the supervisor runs) gets a fresh one.
  constexpr int kNameTries = 4;
  for (int tries = 1;; ++tries) {
    if (!lo.supervisor.empty())
      lo.supervisor_name = supervisor_socket_name(k.kernel->id()) + "/" + std::to_string(k.attempts) + "-" +
                           std::to_string(k.epoch) + "-" + random_hex(16);
    try {
      k.proc = ChildProcess::launch(lo);  // throws std::system_error when exec fails
      break;
    } catch (const LaunchError& e) {
      if (lo.supervisor.empty() || e.stage != 0 || e.code().value() != EADDRINUSE || tries == kNameTries) throw;
      spdlog::warn("kernel {}: its supervisor's socket name was taken by another process; trying a fresh name",
                   k.kernel->id());
    }
  }
  k.sup_name = lo.supervisor_name;
  k.sup_pid = k.proc.supervisor_pid();
  k.kernel->set_process(k.proc.pid(), k.file, k.conn);
  spdlog::info("kernel {}: launched {} (pid {}, attempt {})", k.kernel->id(), spec.name,
               k.proc.pid(), k.attempts);

  open_sockets(k);
  k.phase = k.phase == Phase::restarting ? Phase::restarting : Phase::launching;
  k.ready_reply = false;
  k.iopub_seen = false;
  k.info_sent = 0;
  k.readiness_ids.clear();
  k.ready_deadline = Clock::now() + opts.ready_timeout;
  k.stall_deadline = Clock::now() + opts.ready_timeout / 3;
  send_kernel_info(k);
}

void KernelManager::Impl::open_sockets(KernelIo& k) {
  close_sockets(k);
  auto make = [&](zmq::socket_type t, int port) {
    auto s = std::make_unique<zmq::socket_t>(ctx, t);
    s->set(zmq::sockopt::linger, 0);
    if (t == zmq::socket_type::dealer) s->set(zmq::sockopt::routing_id, k.routing_id());
    if (t == zmq::socket_type::sub) {
      s->set(zmq::sockopt::rcvhwm, 0);  // never shed here: clients' queues are the bound
      s->set(zmq::sockopt::subscribe, "");
    }
    s->connect(k.conn.endpoint(port));
    return s;
  };
  k.shell = make(zmq::socket_type::dealer, k.conn.shell_port);
  k.control = make(zmq::socket_type::dealer, k.conn.control_port);
  {
    // The monitor is attached before connect() so the handshake event cannot be missed.
    k.stdin_ = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
    k.stdin_->set(zmq::sockopt::linger, 0);
    k.stdin_->set(zmq::sockopt::routing_id, k.routing_id());
    std::string mon = "inproc://kgate-stdin-" + k.kernel->id() + "-" + std::to_string(k.epoch);
    if (zmq_socket_monitor(k.stdin_->handle(), mon.c_str(), ZMQ_EVENT_HANDSHAKE_SUCCEEDED) == 0) {
      k.stdin_monitor = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::pair);
      k.stdin_monitor->set(zmq::sockopt::linger, 0);
      k.stdin_monitor->connect(mon);
      k.stdin_up = false;
    } else {
      spdlog::warn("kernel {}: cannot monitor stdin ({}); readiness will not wait for it",
                   k.kernel->id(), zmq_strerror(zmq_errno()));
      k.stdin_up = true;
    }
    k.stdin_->connect(k.conn.endpoint(k.conn.stdin_port));
  }
  k.iopub = make(zmq::socket_type::sub, k.conn.iopub_port);
  k.hb = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
  k.hb->set(zmq::sockopt::linger, 0);
  k.hb->connect(k.conn.endpoint(k.conn.hb_port));
  k.hb_waiting = false;
  k.hb_misses = 0;
  k.hb_warned = false;
  k.hb_ok = false;
  k.hb_wait_since = {};
  k.recheck = 0xff;  // connect() may have taken in their first signals
  k.kernel->set_responsive(true);  // a new process: not judged until it misses pings
}

void KernelManager::Impl::close_sockets(KernelIo& k) {
  stop_stdin_monitor(k);
  k.shell.reset();
  k.control.reset();
  k.stdin_.reset();
  k.iopub.reset();
  k.hb.reset();
}

void KernelManager::Impl::stop_stdin_monitor(KernelIo& k) {
  if (!k.stdin_monitor) return;
  if (k.stdin_) zmq_socket_monitor(k.stdin_->handle(), nullptr, 0);
  k.stdin_monitor.reset();
}

void KernelManager::Impl::on_stdin_monitor(KernelIo& k) {
  for (int n = 0; k.stdin_monitor; ++n) {
    if (n == 16) {
      k.recheck |= KernelIo::kStdinMonitorBit;
      return;
    }
    std::vector<zmq::message_t> parts;
    zmq::message_t part;
    if (!k.stdin_monitor->recv(part, zmq::recv_flags::dontwait)) return;
    bool more = part.more();
    parts.push_back(std::move(part));
    while (more) {
      zmq::message_t p2;
      if (!k.stdin_monitor->recv(p2, zmq::recv_flags::dontwait)) break;
      more = p2.more();
      parts.push_back(std::move(p2));
    }
    std::uint16_t event = 0;
    if (parts[0].size() >= 2) std::memcpy(&event, parts[0].data(), 2);
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      k.stdin_up = true;
      stop_stdin_monitor(k);  // one event is all it is for
      check_ready(k);
      return;
    }
  }
}

std::string KernelManager::Impl::send_internal(KernelIo& k, Channel ch, const std::string& msg_type,
                                               json content) {
  if (!k.sockets_open()) return {};
  json header = make_header(msg_type, k.session);
  WireMessage w;
  w.header = header.dump();
  w.parent_header = "{}";
  w.metadata = "{}";
  w.content = content.dump();
  std::string id = header["msg_id"].get<std::string>();
  k.internal.insert(id);
  if (ch == Channel::control) k.remember_control(id);
  zmq::socket_t& s = ch == Channel::control ? *k.control : *k.shell;
  k.recheck |= KernelIo::bit(ch);
  if (!send_frames(s, encode(w, *k.signer))) {
    spdlog::warn("kernel {}: {} queue full, {} not sent", k.kernel->id(), channel_name(ch), msg_type);
    k.internal.erase(id);
    return {};
  }
  return id;
}

std::string KernelManager::Impl::readiness_missing(const KernelIo& k) const {
  std::vector<std::string> missing;
  if (!k.ready_reply) missing.push_back("no kernel_info_reply to " + std::to_string(k.info_sent) + " request(s)");
  if (!k.iopub_seen) missing.push_back("no iopub message");
  if (!k.stdin_up) missing.push_back("stdin never connected");
  if (!k.hb_ok && !k.adopted) missing.push_back("no heartbeat echo (its heartbeat port may have been taken)");
  std::string out;
  for (const auto& m : missing) out += (out.empty() ? "" : ", ") + m;
  return out;
}

void KernelManager::Impl::send_kernel_info(KernelIo& k) {
  if (k.phase != Phase::launching && k.phase != Phase::restarting) return;
  const auto now = Clock::now();
  if (now > k.ready_deadline) {
    fail_start(k, "kernel did not become ready within " + std::to_string(opts.ready_timeout.count() / 1000) +
                      " s (" + readiness_missing(k) + ")");
    return;
  }
  if (!k.hb_ok && !k.adopted && k.ready_reply && k.iopub_seen && k.stdin_up) {
    // Everything but the heartbeat: its thread is gone (a taken port) or not yet echoing.
    if (k.hb_wait_since == Clock::time_point{}) k.hb_wait_since = now;
    else if (now - k.hb_wait_since >= kHeartbeatGrace) k.stall_deadline = now - Clock::duration(1);
  }
  if (now > k.stall_deadline && !k.stall_relaunched && !k.adopted) {
    // The process is alive but one half of the handshake never came (a socket that connected to
    // something else than the kernel, a kernel wedged in its start): start it again, once, on
    // fresh ports, rather than wait out the whole deadline and fail the request.
    k.stall_relaunched = true;
    spdlog::warn("kernel {}: not ready ({}); relaunching it once on fresh ports", k.kernel->id(),
                 readiness_missing(k));
    if (k.proc.running()) {
      k.proc.signal_group(SIGKILL);
      k.proc.wait_for_exit(1000);
    }
    try {
      launch(k, /*fresh_ports=*/true);
    } catch (const std::exception& e) {
      fail_start(k, e.what());
    }
    return;
  }
  ++k.info_sent;
  if (!k.hb_ok && k.hb) {  // a ping with every round of readiness requests
    k.recheck |= KernelIo::kHbBit;
    (void)k.hb->send(zmq::buffer(std::string_view("ready")), zmq::send_flags::dontwait);
  }
  // An adopted kernel may be running a cell: its shell answers only after it, its control at once.
  if (auto sent = send_internal(k, k.adopted ? Channel::control : Channel::shell, "kernel_info_request", json::object());
      !sent.empty())
    k.readiness_ids.insert(std::move(sent));
  // Resend until both halves of readiness are seen: every request produces busy/idle on
  // iopub, so a reply without iopub means the subscription was not live yet (then the reply
  // itself resends at once, see handle_message; this timer covers a kernel still starting).
  auto id = k.kernel->id();
  auto epoch = k.epoch;
  auto seq = ++k.info_seq;
  after(std::chrono::milliseconds(500), [this, id, epoch, seq] {
    KernelIo* kk = find(id);
    if (kk && kk->epoch == epoch && kk->info_seq == seq) send_kernel_info(*kk);
  });
}

void KernelManager::Impl::check_ready(KernelIo& k) {
  // A re-adopted kernel is not held to its heartbeat: one that never had one was running so.
  if ((k.phase == Phase::launching || k.phase == Phase::restarting) && k.ready_reply &&
      k.iopub_seen && k.stdin_up && (k.hb_ok || k.adopted))
    became_ready(k);
}

void KernelManager::Impl::became_ready(KernelIo& k) {
  bool was_restart = k.phase == Phase::restarting;
  k.phase = Phase::ready;
  k.restart_requested = false;
  ++k.epoch;  // cancels the readiness resend timer
  k.attempts = 0;
  k.stall_relaunched = false;  // a later restart may relaunch once too
  if (!k.adopted) k.kernel->touch();  // a re-adopted kernel's clock goes on (adopt())
  if (!k.adopted) ++(was_restart ? restarts : started);
  spdlog::info("kernel {}: {}", k.kernel->id(),
               k.adopted ? "re-adopted" : was_restart ? "ready after restart" : "ready");
  // A restart that came before the history probe's reply: that probe is moot, nothing waits on it.
  k.hold_shell = false;
  k.history_probe.clear();
  if (k.adopted) {
    // What ran while no kgate listened is in the kernel's history (this session's, in memory:
    // IPython's get_range).  Sent before any held request, so it names only cells run before.
    k.history_probe = send_internal(k, Channel::shell, "history_request",
                                    json{{"output", true}, {"raw", true}, {"hist_access_type", "range"},
                                         {"session", 0}, {"start", 1}, {"stop", nullptr}});
    k.quiet_parent = k.history_probe;
    // It may be running a cell from before: busy until its shell answers (or the cell's idle).
    if (!k.history_probe.empty()) {
      k.kernel->set_state("busy");
      k.hold_shell = true;
      auto id = k.kernel->id();
      auto epoch = k.epoch;
      after(kHistoryHold, [this, id, epoch] {
        KernelIo* kk = find(id);
        if (kk && kk->epoch == epoch && kk->hold_shell) release_shell(*kk);
      });
    }
  }
  install_kernel_side(k);
  // Set once: a re-adopted kernel whose shell is held goes from starting straight to busy,
  // never through an idle that a client could read in between (test_readopt_records saw it).
  if (!k.hold_shell) k.kernel->set_state("idle");
  k.adopted = false;
  save_entry(k);
  auto held = std::move(k.held);
  k.held.clear();
  for (auto& m : held) {
    if (k.hold_shell && m.channel == Channel::shell) k.held.push_back(std::move(m));
    else send_now(k, m);
  }
  auto waiters = std::move(k.start_waiters);
  k.start_waiters.clear();
  for (auto& w : waiters) w(StartResult{k.kernel, {}});
  heartbeat_tick(k.kernel->id(), k.epoch);
}

// kgate's half of the session kernel inside the kernel (DEV.md §14): one silent execute, sent
// before any client's request, so it runs before anyone else's. Its reply says what is on.
void KernelManager::Impl::install_kernel_side(KernelIo& k) {
  k.side_install.clear();
  if (k.implementation != "ipython") {
    k.kernel->set_kernel_side(kernel_side_off(
        k.implementation.empty() ? "the kernel did not name its implementation, so it is not known to be an ipykernel"
                                 : "not an ipykernel (its implementation is '" + k.implementation + "')"));
    return;
  }
  k.side_install = send_internal(k, Channel::shell, "execute_request", kernel_side_install_request(opts.host_session));
  // Its busy and idle are not the shell's state for clients, nor activity.
  if (!k.side_install.empty()) k.readiness_ids.insert(k.side_install);
  else k.kernel->set_kernel_side(kernel_side_off("its install request could not be sent"));
}

void KernelManager::Impl::kernel_side_event(KernelIo& k, const KernelMessage& m) {
  json content = json::parse(m.wire.content, nullptr, false);
  if (!content.is_object()) return;
  const std::string event = content.value("event", "");
  if (event == "shutdown_refused") {
    json who = {{"at", iso_now()},
                {"session", content.value("session", "")},
                {"username", content.value("username", "")},
                {"channel", content.value("channel", "")},
                {"restart", content.value("restart", false)}};
    spdlog::warn("kernel {}: refused a {} from session {} (user '{}'): only kgate shuts it down", k.kernel->id(),
                 who["restart"].get<bool>() ? "restart (shutdown_request)" : "shutdown_request",
                 who["session"].get<std::string>(), who["username"].get<std::string>());
    k.kernel->add_refused(std::move(who));
    ++refused_shutdowns;
  } else if (event == "task_start") {
    k.task = content.value("request", "");
    ++tasks_started;
  } else if (event == "task_end" && content.value("request", "") == k.task) {
    k.task.clear();
  }
  for (auto* o : observers) o->on_kernel_side_event(k.kernel, content);
}

void KernelManager::Impl::release_shell(KernelIo& k) {
  k.hold_shell = false;
  auto held = std::move(k.held);
  k.held.clear();
  if (k.phase == Phase::dead) {  // every request gets its one reply
    for (auto& m : held) refuse(k, m, "KernelDied", "kgate: the kernel died");
    return;
  }
  if (k.phase != Phase::ready) {  // restarting or stopping meanwhile: they wait for that instead
    k.held = std::move(held);
    return;
  }
  for (auto& m : held) send_now(k, m);
}

void KernelManager::Impl::fail_start(KernelIo& k, const std::string& why) {
  spdlog::error("kernel {}: start failed: {}", k.kernel->id(), why);
  ++start_failures;
  if (k.tunnel.running()) k.tunnel.signal(SIGTERM);
  if (k.proc.running()) {
    k.proc.signal_group(SIGKILL);
    k.proc.wait_for_exit(1000);
  }
  close_sockets(k);
  k.phase = Phase::dead;
  k.kernel->set_state("dead", why);
  fail_pending(k, "KernelStartFailed", why);
  for (auto& m : k.held) refuse(k, m, "KernelStartFailed", why);
  k.held.clear();
  broadcast_status(k, "dead");
  std::error_code ec;
  std::filesystem::remove(k.file, ec);
  auto waiters = std::move(k.start_waiters);
  k.start_waiters.clear();
  bool was_restart = k.restart_requested;
  k.restart_requested = false;
  if (was_restart) lifecycle(k, KernelLifecycle::died, "the restart failed: " + why);
  if (!was_restart) {
    // A kernel that never started is not kept: the POST that asked for it gets the error.
    finish_removal(k);  // k is gone after this
  }
  for (auto& w : waiters) w(StartResult{nullptr, why});
}

// ---------------------------------------------------------------------------------------
// Messages

// Only *_request messages get a reply; comm_open/comm_msg/comm_close and input_reply do not,
// so tracking them would fill the pending table.
static bool expects_reply(const ClientMessage& m) {
  static constexpr std::string_view suffix = "_request";
  return (m.channel == Channel::shell || m.channel == Channel::control) &&
         m.msg_type.size() > suffix.size() &&
         m.msg_type.compare(m.msg_type.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void KernelManager::Impl::send_now(KernelIo& k, ClientMessage& m) {
  if (expects_reply(m)) {
    if (k.pending.size() >= opts.max_pending) {
      refuse(k, m, "TooManyRequests",
             "kgate: " + std::to_string(opts.max_pending) +
                 " requests to this kernel are awaiting replies; wait for some to finish");
      return;
    }
  }
  zmq::socket_t* s = nullptr;
  switch (m.channel) {
    case Channel::shell: s = k.shell.get(); break;
    case Channel::control: s = k.control.get(); break;
    case Channel::stdin_: s = k.stdin_.get(); break;
    case Channel::iopub: return;  // clients do not publish
  }
  if (!s) {
    refuse(k, m, "KernelNotRunning", "kgate: the kernel is not running");
    return;
  }
  k.recheck |= KernelIo::bit(m.channel);
  if (!send_frames(*s, encode(m.wire, *k.signer))) {
    refuse(k, m, "KernelBusy", "kgate: the kernel's " + std::string(channel_name(m.channel)) +
                                   " queue is full; try again");
    return;
  }
  if (expects_reply(m)) {
    k.pending.emplace(m.msg_id, Pending{m.channel, m.msg_type, m.wire.header, m.route});
    if (m.channel == Channel::control) k.remember_control(m.msg_id);
  }
  k.kernel->touch();  // a client's message is activity too (idle culling)
  if (!k.kernel->pooled())
    for (auto* o : observers) o->on_client_message(k.kernel, m);
}

void KernelManager::Impl::refuse(KernelIo& k, const ClientMessage& m, const std::string& ename,
                                 const std::string& evalue) {
  if (!expects_reply(m)) {
    spdlog::warn("kernel {}: dropped {} from {}: {}", k.kernel->id(), m.msg_type, m.route, evalue);
    return;
  }
  KernelMessage r = synthesize_message(
      m.channel, reply_type(m.msg_type), k.session, m.wire.header,
      json{{"status", "error"}, {"ename", ename}, {"evalue", evalue}, {"traceback", json::array()}});
  r.route = m.route;
  r.parent_msg_id = m.msg_id;
  deliver(k, std::move(r));
}

void KernelManager::Impl::fail_pending(KernelIo& k, const std::string& ename,
                                       const std::string& evalue) {
  auto pending = std::move(k.pending);
  k.pending.clear();
  for (auto& [id, p] : pending) {
    ClientMessage m;
    m.channel = p.channel;
    m.msg_id = id;
    m.msg_type = p.msg_type;
    m.route = p.route;
    m.wire.header = p.header;
    refuse(k, m, ename, evalue);
  }
  k.internal.clear();
  auto calls = std::move(k.side_calls);
  k.side_calls.clear();
  for (auto& [id, done] : calls) done(std::nullopt);
}

void KernelManager::Impl::broadcast_status(KernelIo& k, const std::string& state) {
  deliver(k, synthesize_message(Channel::iopub, "status", k.session, "{}",
                                json{{"execution_state", state}}));
}

void KernelManager::Impl::lifecycle(KernelIo& k, KernelLifecycle ev, const std::string& reason) {
  if (k.kernel->pooled()) return;  // nobody knows of it yet
  for (auto* o : observers) o->on_kernel_lifecycle(k.kernel, ev, reason);
}

void KernelManager::Impl::deliver(KernelIo& k, KernelMessage&& m) {
  if (k.kernel->pooled()) return;  // its startup and hand-out chatter is kgate's own
  auto msg = std::make_shared<const KernelMessage>(std::move(m));
  for (auto* o : observers) o->on_kernel_message(k.kernel, msg);
}

void KernelManager::Impl::on_readable(KernelIo& k, zmq::socket_t& sock, Channel ch) {
  DecodeLimits limits;
  limits.max_message_bytes = opts.max_message_bytes;
  // Bounded per pass so one flooding kernel cannot starve the others; what is left is read on
  // the next pass (recheck: the socket's ZMQ_FD will not signal it again).
  for (int n = 0;; ++n) {
    if (n == 256) {
      k.recheck |= KernelIo::bit(ch);
      return;
    }
    std::vector<zmq::message_t> parts;
    while (true) {
      zmq::message_t part;
      auto r = sock.recv(part, zmq::recv_flags::dontwait);
      if (!r) break;
      bool more = part.more();
      parts.push_back(std::move(part));
      if (!more) break;
    }
    if (parts.empty()) return;
    std::vector<std::string_view> frames;
    frames.reserve(parts.size());
    for (auto& p : parts) frames.emplace_back(static_cast<const char*>(p.data()), p.size());
    KernelMessage m;
    m.channel = ch;
    if (auto ec = decode(frames, *k.signer, m.wire, limits)) {
      ++dropped_invalid;
      spdlog::warn("kernel {}: dropped a message on {}: {} ({} dropped so far)", k.kernel->id(),
                   channel_name(ch), ec.message(), dropped_invalid);
      continue;
    }
    m.wire.identities.clear();
    // A kernel may send bytes that are not UTF-8 (ipykernel packs with surrogateescape, so a str
    // holding '\udcff' goes out as the byte 0xFF). Past the signature check, every JSON part is
    // made valid here, once, so no reader downstream (the records, the websocket clients' text
    // frames, the JSON parsers) ever sees an invalid byte; binary buffers stay as they are.
    for (std::string* part : {&m.wire.header, &m.wire.parent_header, &m.wire.metadata, &m.wire.content})
      make_valid_utf8(*part);
    MessageIds ids;
    if (!read_message_ids(m.wire.header, m.wire.parent_header, ids)) continue;
    m.msg_id = std::move(ids.msg_id);
    m.msg_type = std::move(ids.msg_type);
    m.parent_msg_id = std::move(ids.parent_msg_id);
    // The KernelIo may be removed while handling (a dead kernel); stop reading then.
    auto id = k.kernel->id();
    handle_message(k, ch, std::move(m));
    if (!find(id) || !k.sockets_open()) return;
  }
}

bool KernelManager::Impl::answer_side_call(KernelIo& k, const KernelMessage& m) {
  auto call = k.side_calls.find(m.parent_msg_id);
  if (call == k.side_calls.end()) return false;
  auto done = std::move(call->second);
  k.side_calls.erase(call);
  json content = json::parse(m.wire.content, nullptr, false);
  done(content.is_object() ? std::optional<json>(std::move(content)) : std::nullopt);
  return true;
}

void KernelManager::Impl::handle_message(KernelIo& k, Channel ch, KernelMessage&& m) {
  // A culled kernel's clients were told it is dead: what it says while it exits (the busy and
  // idle around shutdown_request, a cell's last output) is not passed on.  Its requests were
  // answered by fail_pending, and shutdown_reply is kgate's own.
  if (k.culled) {
    if (ch != Channel::iopub && k.internal.erase(m.parent_msg_id)) answer_side_call(k, m);  // the close's
    return;
  }
  if (ch == Channel::iopub) {
    // kgate's own requests to a re-adopted kernel (readiness, the history probe) are not
    // activity: its cull clock goes on from what the kgate before saved.
    const bool ours = k.readiness_ids.count(m.parent_msg_id) ||
                      (!k.quiet_parent.empty() && m.parent_msg_id == k.quiet_parent);
    if (!k.adopted && !ours) k.kernel->touch();
    if (m.msg_type == "status") {
      bool control_parent = std::find(k.recent_control.begin(), k.recent_control.end(),
                                      m.parent_msg_id) != k.recent_control.end();
      json content = json::parse(m.wire.content, nullptr, false);
      std::string state = content.is_object() ? content.value("execution_state", "") : "";
      // The busy/idle around a control request says nothing about the shell: skip it.
      if (k.phase == Phase::ready && !control_parent && !k.readiness_ids.count(m.parent_msg_id) &&
          (state == "busy" || state == "idle"))
        k.kernel->set_state(state);
      if (k.handout && state == "idle" && m.parent_msg_id == k.handout->msg_id) {
        k.handout->idle = true;
        deliver(k, std::move(m));  // pooled still: goes nowhere
        check_handout(k);
        return;
      }
    }
    if (k.phase == Phase::launching || k.phase == Phase::restarting) {
      k.iopub_seen = true;
      check_ready(k);
    }
    if (k.relinking) relinked(k);
    if (m.msg_type == "kgate_event") return kernel_side_event(k, m);
    deliver(k, std::move(m));
    return;
  }
  if (ch == Channel::stdin_) {
    auto it = k.pending.find(m.parent_msg_id);
    if (it == k.pending.end()) {
      spdlog::warn("kernel {}: {} for an unknown request {}; dropped", k.kernel->id(), m.msg_type,
                   m.parent_msg_id);
      return;
    }
    m.route = it->second.route;
    deliver(k, std::move(m));
    return;
  }
  // shell / control replies
  if (k.internal.erase(m.parent_msg_id)) {
    if (!k.history_probe.empty() && m.parent_msg_id == k.history_probe) {
      k.history_probe.clear();
      if (k.phase == Phase::ready && k.kernel->execution_state() == "busy") k.kernel->set_state("idle");
      for (auto* o : observers) o->on_kernel_readopted(k.kernel, m.wire.content);
      if (k.hold_shell) release_shell(k);
      return;
    }
    if (answer_side_call(k, m)) return;
    if (!k.side_install.empty() && m.parent_msg_id == k.side_install) {
      k.side_install.clear();
      json side = kernel_side_from_reply(json::parse(m.wire.content, nullptr, false));
      if (!side.value("installed", false))
        spdlog::warn("kernel {}: kgate's kernel side is off: {}", k.kernel->id(), side.value("reason", ""));
      // The task that runs now (a re-adopted kernel's, started under the kgate before): the
      // records keep its job running, and end any other task's whose end was not heard.
      const bool says = side.contains("running_task");
      json running = side.value("running_task", json());
      side.erase("running_task");
      k.task = running.is_string() ? running.get<std::string>() : std::string();
      if (!k.task.empty()) spdlog::info("kernel {}: its background task {} still runs", k.kernel->id(), k.task);
      k.kernel->set_kernel_side(std::move(side));
      if (says) {
        json event = {{"event", "task_running"}, {"request", k.task}};
        for (auto* o : observers) o->on_kernel_side_event(k.kernel, event);
      }
      return;
    }
    if (m.msg_type == "kernel_info_reply" && (k.phase == Phase::launching || k.phase == Phase::restarting)) {
      json info = json::parse(m.wire.content, nullptr, false);
      if (info.is_object()) k.implementation = info.value("implementation", "");
      k.ready_reply = true;
      check_ready(k);
      if ((k.phase == Phase::launching || k.phase == Phase::restarting) && !k.iopub_seen) {
        // The kernel answers, but its busy/idle went out before our SUB was live: ask again
        // soon (the kernel is up now) instead of at the 500 ms resend.
        auto id = k.kernel->id();
        auto epoch = k.epoch;
        auto seq = k.info_seq;
        after(std::chrono::milliseconds(20), [this, id, epoch, seq] {
          KernelIo* kk = find(id);
          if (kk && kk->epoch == epoch && kk->info_seq == seq && !kk->iopub_seen) send_kernel_info(*kk);
        });
      }
    }
    if (k.handout && m.parent_msg_id == k.handout->msg_id) {
      json content = json::parse(m.wire.content, nullptr, false);
      std::string status = content.is_object() ? content.value("status", "") : "";
      if (status != "ok") {
        std::string what = content.is_object() ? content.value("ename", "") + ": " + content.value("evalue", "")
                                               : "an unreadable reply";
        k.handout->error = "applying cwd/env to the pooled kernel failed (" + what + ")";
      }
      k.handout->replied = true;
      check_handout(k);
    }
    return;
  }
  auto it = k.pending.find(m.parent_msg_id);
  if (it == k.pending.end()) {
    spdlog::debug("kernel {}: {} for an unknown request {}; dropped", k.kernel->id(), m.msg_type,
                  m.parent_msg_id);
    return;
  }
  m.route = it->second.route;
  k.pending.erase(it);
  deliver(k, std::move(m));
}

// ---------------------------------------------------------------------------------------
// Heartbeat, exit, stop

void KernelManager::Impl::heartbeat_tick(const std::string& id, std::uint64_t epoch) {
  KernelIo* k = find(id);
  if (!k || k->epoch != epoch || k->phase != Phase::ready || !k->hb) return;
  if (k->hb_waiting) {
    ++k->hb_misses;
    if (k->hb_misses >= opts.heartbeat_misses && !k->hb_warned) {
      k->hb_warned = true;
      k->kernel->set_responsive(false, k->hb_silent_since);
      spdlog::warn("kernel {}: unresponsive: no heartbeat for {} ms (process {} still running)", id,
                   k->hb_misses * opts.heartbeat_interval.count(), k->proc.pid());
    }
  }
  std::string ping = std::to_string(++k->hb_seq);
  if (!k->hb_waiting) k->hb_silent_since = std::chrono::steady_clock::now();
  k->recheck |= KernelIo::kHbBit;
  if (k->hb->send(zmq::buffer(ping), zmq::send_flags::dontwait)) k->hb_waiting = true;
  after(opts.heartbeat_interval, [this, id, epoch] { heartbeat_tick(id, epoch); });
}

void KernelManager::Impl::on_hb(KernelIo& k) {
  zmq::message_t msg;
  while (k.hb->recv(msg, zmq::recv_flags::dontwait)) {
    if (!k.hb_ok) {
      k.hb_ok = true;
      check_ready(k);
      if (!k.hb) return;  // (became_ready never closes it; defensive)
    }
    k.hb_waiting = false;
    if (k.hb_warned) {
      k.kernel->set_responsive(true);
      spdlog::info("kernel {}: heartbeat is back", k.kernel->id());
    }
    k.hb_misses = 0;
    k.hb_warned = false;
  }
}

void KernelManager::Impl::on_exit(KernelIo& k) {
  if (!k.proc.try_reap()) return;
  if (k.remote() && k.proc.lost() && k.phase == Phase::ready) {
    // A remote kernel's link ended without its end: the network, or the SSH forwarding.  It is
    // unreachable, not dead, until link_timeout (or its scheduler says its job ended).
    link_lost(k, "its control link dropped");
    return;
  }
  std::string how = k.proc.describe_exit();
  auto id = k.kernel->id();
  switch (k.phase) {
    case Phase::launching:
    case Phase::restarting:
      if (k.remote()) {  // a new job would fail the same way: say why, with the job's log
        fail_start(k, "the kernel " + how + " during startup on " +
                          k.kernel->placement().value("host", std::string("its node")) + " (see " +
                          k.kernel->placement().value("log", std::string("the job's log")) + ")");
        return;
      }
      if (k.attempts < opts.launch_attempts) {
        spdlog::warn("kernel {}: exited during startup ({}); relaunching on fresh ports", id, how);
        try {
          launch(k, /*fresh_ports=*/true);
        } catch (const std::exception& e) {
          fail_start(k, e.what());
        }
      } else {
        fail_start(k, "kernel " + how + " during startup (" + std::to_string(k.attempts) +
                          " attempts)");
      }
      return;
    case Phase::ready: {
      if (k.kernel->pooled()) {  // nobody used it: drop it, the pool starts another
        spdlog::warn("kernel {}: pooled kernel {}; removed", id, how);
        finish_removal(k);
        return;
      }
      if (!k.slurm_job.empty()) {
        // The scheduler's word on why (TIMEOUT, PREEMPTED, NODE_FAIL, CANCELLED) goes into the
        // records' note: asked on a worker (scontrol; the job may still be COMPLETING for a
        // moment), and the death is processed when it answers (bounded: ~15 s).
        auto epoch = k.epoch;
        spawn([this, id, epoch, how, job = k.slurm_job] {
          std::string sched;
          for (int i = 0; i < 10; ++i) {
            sched = slurm_end_reason(job);
            if (!sched.empty() && sched.rfind("COMPLETING", 0) != 0 && sched.rfind("RUNNING", 0) != 0) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
          }
          post([this, id, epoch, how, job, sched] {
            KernelIo* kk = find(id);
            if (!kk || kk->epoch != epoch || kk->phase != Phase::ready) return;
            if (!sched.empty()) kk->kernel->update_placement({{"state", sched.substr(0, sched.find(' '))}});
            die(*kk, how + "; Slurm job " + job + (sched.empty() ? " ended" : ": " + sched));
          });
        });
        return;
      }
      die(k, how);
      return;
    }
    case Phase::stopping:
      if (k.restart_requested && k.remote() && relaunched_in_place(k)) return;
      if (k.restart_requested) {
        k.phase = Phase::restarting;
        k.attempts = 0;
        try {
          launch(k, /*fresh_ports=*/false);
        } catch (const std::exception& e) {
          fail_start(k, e.what());
        }
        return;
      }
      finish_removal(k);
      return;
    case Phase::dead:
      return;
  }
}

void KernelManager::Impl::die(KernelIo& k, const std::string& how) {
  const std::string id = k.kernel->id();
  k.link_down = false;
  if (k.tunnel.running()) k.tunnel.signal(SIGTERM);
  spdlog::error("kernel {}: died ({})", id, how);
  close_sockets(k);
  k.phase = Phase::dead;
  k.kernel->set_state("dead", "kernel " + how);
  lifecycle(k, KernelLifecycle::died, "the kernel " + how);
  fail_pending(k, "KernelDied", "kgate: the kernel " + how);
  // Shell requests held for a re-adopted kernel's history probe (hold_shell).
  for (auto& m : k.held) refuse(k, m, "KernelDied", "kgate: the kernel " + how);
  k.held.clear();
  k.hold_shell = false;
  broadcast_status(k, "dead");
  std::error_code ec;
  std::filesystem::remove(k.file, ec);
}

void KernelManager::Impl::begin_stop(KernelIo& k, bool restart) {
  auto id = k.kernel->id();
  if (restart) lifecycle(k, KernelLifecycle::restarting, "the kernel was restarted");
  if (!k.proc.running()) {
    if (restart) {
      k.restart_requested = true;
      k.phase = Phase::restarting;
      k.kernel->set_state("restarting");
      broadcast_status(k, "restarting");
      k.attempts = 0;
      try {
        launch(k, false);
      } catch (const std::exception& e) {
        fail_start(k, e.what());
      }
    } else {
      finish_removal(k);
    }
    return;
  }
  // The records first: a job that runs is lost to the shutdown, not "interrupted" by the close
  // that stops it (a culled kernel's jobs already ended "culled").
  if (!restart) lifecycle(k, KernelLifecycle::stopping, "the kernel was shut down");
  k.restart_requested = restart;
  k.closing.clear();  // a close still out for an earlier stop ends nothing now
  fail_pending(k, restart ? "KernelRestarted" : "KernelShutdown",
               restart ? "kgate: the kernel was restarted" : "kgate: the kernel was shut down");
  for (auto& m : k.held) refuse(k, m, "KernelShutdown", "kgate: the kernel was shut down");
  k.held.clear();
  k.kernel->set_state(restart ? "restarting" : k.kernel->execution_state());
  if (restart) broadcast_status(k, "restarting");
  k.phase = Phase::stopping;
  ++k.epoch;
  if (restart && k.remote()) k.proc.request_relaunch();  // in the same allocation (DEV.md §4f)
  // The graceful close first (DEV.md §14): the kernel side stops the cell and the task that run
  // and waits for them to end, so the shutdown_request below ends the process normally.  Its
  // answer, or close_grace and a second without one, sends the shutdown_request.
  if (opts.close_grace.count() > 0 && kernel_side_has(k.kernel->kernel_side(), "close") && k.sockets_open() &&
      !k.link_down) {
    // The answer waits for the cell and the task up to close_grace, and comes a moment later.
    std::string sent = side_call(k, json{{"op", "close"}, {"wait_ms", opts.close_grace.count()}},
                                 opts.close_grace + std::chrono::seconds(1), nullptr);
    if (!sent.empty()) {
      k.closing = sent;
      // Its waiter names its own msg_id, so it is set once the request is out.
      k.side_calls[sent] = [this, id, sent](std::optional<json> answer) {
        KernelIo* kk = find(id);
        // Gone, superseded by another stop, or its process already exited (being removed).
        if (!kk || kk->closing != sent || kk->phase != Phase::stopping || !kk->sockets_open()) return;
        kk->closing.clear();
        ++(answer ? closes_answered : closes_unanswered);
        if (!answer)
          spdlog::warn("kernel {}: no answer to the close within {} ms; shutting it down", id,
                       opts.close_grace.count() + 1000);
        else if (!answer->value("stopped", json::array()).empty() || !answer->value("still_running", json::array()).empty())
          spdlog::info("kernel {}: closed; stopped {}, still running {}, after {} ms", id,
                       answer->value("stopped", json::array()).dump(), answer->value("still_running", json::array()).dump(),
                       answer->value("waited_ms", 0));
        send_shutdown(*kk);
      };
      return;
    }
  }
  send_shutdown(k);
}

std::string KernelManager::Impl::side_call(KernelIo& k, json content, std::chrono::milliseconds timeout,
                                           std::function<void(std::optional<json>)> done) {
  std::string sent = send_internal(k, Channel::control, "kgate_request", std::move(content));
  if (sent.empty()) return sent;
  k.side_calls.emplace(sent, std::move(done));
  after(timeout, [this, id = k.kernel->id(), sent] {
    KernelIo* kk = find(id);
    if (!kk) return;
    auto it = kk->side_calls.find(sent);
    if (it == kk->side_calls.end()) return;
    auto late = std::move(it->second);
    kk->side_calls.erase(it);
    kk->internal.erase(sent);
    late(std::nullopt);
  });
  return sent;
}

void KernelManager::Impl::send_shutdown(KernelIo& k) {
  auto id = k.kernel->id();
  send_internal(k, Channel::control, "shutdown_request", json{{"restart", k.restart_requested}});
  auto epoch = k.epoch;
  after(opts.shutdown_grace, [this, id, epoch] {
    KernelIo* kk = find(id);
    if (!kk || kk->epoch != epoch || kk->phase != Phase::stopping) return;
    spdlog::info("kernel {}: no exit after shutdown_request; SIGTERM", id);
    kk->proc.signal_group(SIGTERM);
    after(opts.terminate_grace, [this, id, epoch] {
      KernelIo* k3 = find(id);
      if (!k3 || k3->epoch != epoch || k3->phase != Phase::stopping) return;
      spdlog::warn("kernel {}: no exit after SIGTERM; SIGKILL", id);
      k3->proc.signal_group(SIGKILL);
    });
  });
}

void KernelManager::Impl::finish_removal(KernelIo& k) {
  auto id = k.kernel->id();
  if (k.proc.running()) {
    k.proc.signal_group(SIGKILL);
    k.proc.wait_for_exit(1000);
  }
  close_sockets(k);
  fail_pending(k, "KernelShutdown", "kgate: the kernel was shut down");
  std::error_code ec;
  std::filesystem::remove(k.file, ec);
  for (int p : {k.conn.shell_port, k.conn.iopub_port, k.conn.stdin_port, k.conn.control_port,
                k.conn.hb_port})
    reserved_ports.erase(p);
  KernelPtr kernel = k.kernel;
  // A start still waiting (a queued remote job deleted before it ran): its one answer.
  auto start_waiters = std::move(k.start_waiters);
  k.start_waiters.clear();
  auto waiters = std::move(k.stop_waiters);
  auto k_lost = std::move(k.request.on_pool_lost);
  if (k.handout) {
    auto h = std::move(*k.handout);
    k.handout.reset();
    if (h.done) h.done(StartResult{nullptr, "the pooled kernel was removed during the hand-out"});
  }
  {
    std::lock_guard lk(kmu);
    kernels.erase(id);
  }
  remove_owner_file(runtime_dir, id);
  table.remove(id);
  if (k.remote()) {
    std::filesystem::remove(k.spec_file, ec);
    if (k.tunnel.running()) {
      k.tunnel.signal(SIGTERM);
      k.tunnel.wait_for_exit(1000);
    }
    for (int p : k.local_ports) reserved_ports.erase(p);
    if (!k.slurm_job.empty()) {  // its steps and whatever is left of it: the allocation goes
      spawn([job = k.slurm_job, id] {
        if (auto err = slurm_cancel(job); !err.empty()) spdlog::warn("kernel {}: {}", id, err);
      });
    }
  }
  io.erase(id);  // k is gone from here on
  spdlog::info("kernel {}: removed", id);
  if (kernel->pooled()) {
    if (k_lost) k_lost(id, "it exited or was removed");
  } else {
    for (auto* o : observers) o->on_kernel_removed(kernel);
  }
  for (auto& w : start_waiters) w(StartResult{nullptr, "the kernel was shut down before it was ready"});
  for (auto& w : waiters) w(true);
}

// ---------------------------------------------------------------------------------------
// Idle culling

static std::string seconds_text(std::chrono::milliseconds d) {
  auto ms = d.count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", double(ms) / 1000.0);
  return buf;
}

bool KernelManager::Impl::cull_now(KernelIo& k, const CullRequest& req) {
  auto id = k.kernel->id();
  if (k.phase == Phase::dead) {
    // jupyter_server's culler shuts dead kernels down at its next pass; so does kgate's.
    spdlog::info("kernel {}: culling the dead kernel ({})", id, k.kernel->model().reason);
    begin_stop(k, /*restart=*/false);  // not running: removed at once
    return true;
  }
  if (k.phase != Phase::ready) return false;
  int connections = k.kernel->connections();
  auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(k.kernel->idle_for());
  std::string reason;
  if (req.orphan) {
    if (connections > 0 || k.kernel->conversation().empty()) return false;  // a person came, or it was kept
    reason = req.setting;
  } else {
    if (req.idle_timeout.count() <= 0) return false;
    if (idle <= req.idle_timeout) return false;  // activity since the gateway looked
    if (!req.cull_busy && (k.kernel->execution_state() == "busy" || !k.task.empty())) return false;
    if (!req.cull_connected && connections > 0) return false;
    reason = "culled after " + std::to_string(idle.count() / 1000) + " s idle (" + req.setting + " = " +
             seconds_text(req.idle_timeout) + " s)";
  }
  spdlog::warn("kernel {}: {} with {} connection(s), state {}", id, reason, connections,
               k.kernel->execution_state());
  // The records first (a client that sees dead finds its cell ended), then the clients: the
  // note, then dead, then the error replies to whatever was pending (begin_stop).
  lifecycle(k, KernelLifecycle::culled, reason);
  deliver(k, synthesize_message(Channel::iopub, "stream", k.session, "{}",
                                json{{"name", "stderr"},
                                     {"text", "[kgate] kernel " + reason + "; shutting it down\n"}}));
  k.kernel->set_state("dead", "kernel " + reason);
  broadcast_status(k, "dead");
  k.restart_requested = false;
  begin_stop(k, /*restart=*/false);
  if (!find(id)) return true;  // removed at once (its process was already gone)
  k.culled = true;
  k.kernel->set_state("dead", "kernel " + reason);  // begin_stop keeps the state, not the reason
  return true;
}

// ---------------------------------------------------------------------------------------
// Remote launchers (DEV.md §4f)

namespace {

// header.date ("2026-12-05T07:00:00.123456Z", or with an offset of +00:00) as a time point;
// nullopt when it is not that.
std::optional<std::chrono::system_clock::time_point> parse_header_date(const std::string& d) {
  int y, mo, da, h, mi;
  double sec;
  if (std::sscanf(d.c_str(), "%d-%d-%dT%d:%d:%lf", &y, &mo, &da, &h, &mi, &sec) != 6) return std::nullopt;
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = da;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = 0;
  const time_t t = ::timegm(&tm);
  if (t == static_cast<time_t>(-1)) return std::nullopt;
  return std::chrono::system_clock::from_time_t(t) +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(sec));
}

// An SSH forwarding's local end accepts connections once ssh is connected: waits for that, at
// most 15 s, or until `gone()` says ssh exited.
void wait_forwarding(int local_port, const std::function<bool()>& gone) {
  for (auto until = Clock::now() + std::chrono::seconds(15); Clock::now() < until && !gone();) {
    if (tcp_accepts("127.0.0.1", local_port)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

bool slurm_state_live(const std::string& st) {
  static const std::set<std::string> live = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING",
                                             "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                                             "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"};
  return live.count(st) > 0;
}

}  // namespace

void KernelManager::Impl::ensure_registration() {
  if (reg) return;
  auto s = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::router);
  s->set(zmq::sockopt::linger, 0);
  s->set(zmq::sockopt::maxmsgsize, std::int64_t{64} << 10);  // a registration is a few hundred bytes
  const std::string port = opts.registration_port > 0 ? std::to_string(opts.registration_port) : "*";
  try {
    s->bind("tcp://" + opts.registration_ip + ":" + port);
  } catch (const zmq::error_t& e) {
    throw std::runtime_error("cannot bind the registration endpoint on " + opts.registration_ip + ":" + port +
                             " ([remote] registration_ip/registration_port): " + e.what());
  }
  reg_endpoint = s->get(zmq::sockopt::last_endpoint);
  reg = std::move(s);
  spdlog::info("remote launchers register at {}", reg_endpoint);
}

void KernelManager::Impl::launch_remote(KernelIo& k) {
  ++k.epoch;
  ++k.attempts;
  const LauncherConfig& l = *k.request.launcher;
  const bool ssh = l.kind == LauncherConfig::Kind::ssh;
  if (!ssh) ensure_registration();
  close_sockets(k);
  k.reg_secret = new_hex_id() + new_hex_id();  // 256 bits, for this launch only
  k.reg_nonces.clear();
  k.slurm_job.clear();
  k.running_since = {};
  k.link_down = false;
  k.stall_relaunched = true;  // no stall relaunch: that would be another job
  k.phase = k.phase == Phase::restarting ? Phase::restarting : Phase::launching;
  if (k.tunnel.running()) {  // a new launch has new ports: the old forwards go
    k.tunnel.signal(SIGTERM);
    k.tunnel.wait_for_exit(1000);
  }
  k.tunnel = ChildProcess{};
  for (int p : k.local_ports) reserved_ports.erase(p);
  k.local_ports.clear();
  const std::string id = k.kernel->id();
  ensure_private_dir(opts.remote_dir);
  k.spec_file = opts.remote_dir / (id + "-" + std::to_string(k.attempts) + ".json");
  const std::filesystem::path log = opts.remote_dir / (id + ".log");
  const KernelSpec& spec = k.kernel->spec();
  auto here = current_environment();
  json env = json::object();
  for (const auto& [name, value] : spec.env) env[name] = expand_env(value, here);
  for (const auto& [name, value] : k.request.env) env[name] = value;
  json argv = json::array();
  for (auto arg : spec.argv) {
    const std::string key = "{resource_dir}", val = spec.resource_dir.string();
    for (auto pos = arg.find(key); pos != std::string::npos; pos = arg.find(key, pos + val.size()))
      arg.replace(pos, key.size(), val);
    argv.push_back(arg);
  }
  json launch = {{"format", "kgate-node-launch"},
                 {"version", 1},
                 {"kernel_id", id},
                 {"attempt", k.attempts},
                 // SSH: the report comes back on the SSH channel; Slurm: to kgate's endpoint.
                 {"registration", ssh ? std::string("stdout") : reg_endpoint},
                 {"secret", k.reg_secret},
                 {"key", k.conn.key},
                 {"signature_scheme", k.conn.signature_scheme},
                 {"kernel_name", spec.name},
                 {"argv", argv},
                 {"env", env},
                 {"cwd", k.request.cwd.string()},
                 {"connection_dir", l.connection_dir.string()},
                 {"orphan_timeout_ms", opts.orphan_timeout.count()},
                 {"terminate_grace_ms", opts.terminate_grace.count()}};
  if (ssh) launch["ip"] = l.forward ? std::string("127.0.0.1") : l.bind_ip;
  write_file_atomically(k.spec_file, launch.dump());
  k.kernel->update_placement({{"launcher", l.name},
                              {"kind", l.kind_name()},
                              {"state", ssh ? "CONNECTING" : "SUBMITTING"},
                              {"job_id", nullptr},
                              {"reason", nullptr},
                              {"host", ssh ? json(l.host) : json(nullptr)},
                              {"link", nullptr},
                              {"log", ssh ? json(nullptr) : json(log.string())}});
  const auto epoch = k.epoch;
  if (ssh) {
    spdlog::info("kernel {}: starting on {} over ssh (launcher {}, attempt {})", id, l.host, l.name, k.attempts);
    spawn([this, id, epoch, launcher = k.request.launcher, spec_file = k.spec_file] {
      auto r = ssh_launch(*launcher, spec_file);
      std::error_code ec;
      std::filesystem::remove(spec_file, ec);  // it held the secret; ssh has sent it
      std::string why;
      std::string addr = launcher->forward ? std::string() : resolve_ipv4(launcher->host, &why);
      post([this, id, epoch, r, addr, why] {
        KernelIo* kk = find(id);
        if (!kk || kk->epoch != epoch || !kk->remote()) return;  // deleted meanwhile: its orphan timeout ends it
        if (!r.error.empty()) return fail_start(*kk, r.error);
        if (!kk->request.launcher->forward && addr.empty()) return fail_start(*kk, why);
        kk->host_addr = addr;
        ssh_reported(*kk, r.line);
      });
    });
    return;
  }
  auto argv_sbatch = sbatch_argv(l, id, k.spec_file, log);
  spdlog::info("kernel {}: submitting to Slurm (launcher {}, attempt {})", id, l.name, k.attempts);
  spawn([this, id, epoch, argv_sbatch] {
    auto r = slurm_submit(argv_sbatch);
    post([this, id, epoch, r] {
      KernelIo* kk = find(id);
      if (!kk || kk->epoch != epoch || !kk->remote()) {  // deleted (or relaunched) meanwhile
        if (!r.job_id.empty()) spawn([job = r.job_id] { slurm_cancel(job); });
        return;
      }
      if (r.job_id.empty()) {
        fail_start(*kk, r.error);
        return;
      }
      kk->slurm_job = r.job_id;
      kk->kernel->update_placement({{"job_id", r.job_id}, {"state", "PENDING"}});
      save_entry(*kk);  // a later kgate cancels it if it is still queued then
      spdlog::info("kernel {}: Slurm job {}", id, r.job_id);
      scheduler_arm();
    });
  });
}

void KernelManager::Impl::scheduler_arm() {
  if (sched_timer) return;
  sched_timer = true;
  after(opts.scheduler_poll, [this] {
    sched_timer = false;
    scheduler_tick();
  });
}

void KernelManager::Impl::scheduler_tick() {
  std::vector<std::string> jobs;
  for (auto& [id, kp] : io)
    if (kp->remote() && !kp->slurm_job.empty() && kp->phase != Phase::dead) jobs.push_back(kp->slurm_job);
  if (jobs.empty()) return;
  scheduler_arm();
  if (sched_out) return;  // one squeue at a time
  sched_out = true;
  spawn([this, jobs] {
    std::string why;
    auto res = slurm_query(jobs, &why);
    post([this, jobs, res, why] {
      sched_out = false;
      on_scheduler(jobs, res, why);
    });
  });
}

void KernelManager::Impl::on_scheduler(const std::vector<std::string>& jobs,
                                       const std::optional<std::vector<SlurmJobState>>& res,
                                       const std::string& why) {
  if (!res) {
    spdlog::warn("scheduler poll: {}", why);
    return;
  }
  std::map<std::string, SlurmJobState> by_id;
  for (const auto& j : *res) by_id[j.job_id] = j;
  const auto now = Clock::now();
  std::vector<std::string> ids;
  for (auto& [id, kp] : io) ids.push_back(id);
  for (const auto& id : ids) {
    KernelIo* k = find(id);
    if (!k || !k->remote() || k->slurm_job.empty() ||
        std::find(jobs.begin(), jobs.end(), k->slurm_job) == jobs.end())
      continue;
    auto it = by_id.find(k->slurm_job);
    const std::string state = it == by_id.end() ? "GONE" : it->second.state;
    json fields = {{"state", state}};
    if (it != by_id.end()) {
      const std::string& reason = it->second.reason;
      fields["reason"] = reason.empty() || reason == "None" ? json(nullptr) : json(reason);
      if (!it->second.node.empty() && it->second.node != "(null)") fields["node"] = it->second.node;
    }
    k->kernel->update_placement(fields);
    if (k->link_down && !slurm_state_live(state) && k->phase == Phase::ready) {
      std::string reason = it == by_id.end() ? "" : it->second.reason;
      die(*k, "unreachable (" + k->link_why + "), and its Slurm job " + k->slurm_job + " ended: " + state +
                  (reason.empty() || reason == "None" ? "" : " (" + reason + ")"));
      continue;
    }
    if (k->reg_secret.empty()) continue;  // registered: the control link tells of its end
    const std::string log = k->kernel->placement().value("log", std::string());
    if (!slurm_state_live(state)) {
      std::string reason = it == by_id.end() ? "" : it->second.reason;
      fail_start(*k, "Slurm job " + k->slurm_job + " ended before its kernel registered: " + state +
                         (reason.empty() || reason == "None" ? "" : " (" + reason + ")") + "; see " + log);
      continue;
    }
    if (state == "RUNNING") {
      if (k->running_since == Clock::time_point{}) k->running_since = now;
      else if (now - k->running_since > opts.registration_timeout)
        fail_start(*k, "Slurm job " + k->slurm_job + " runs, but its launcher did not register within " +
                           std::to_string(opts.registration_timeout.count() / 1000) + " s; see " + log);
    }
  }
}

std::string KernelManager::Impl::verify_registration(KernelIo& k, const std::vector<std::string_view>& views,
                                                     json& c, bool& signed_ok) {
  signed_ok = false;
  const std::string id = k.kernel->id();
  if (!k.remote() || k.reg_secret.empty()) return "no registration is expected for this kernel";
  Signer signer(k.reg_secret);
  WireMessage w;
  DecodeLimits lim;
  lim.max_message_bytes = std::size_t{64} << 10;
  if (auto ec = decode(views, signer, w, lim, /*validate_json=*/true); ec)
    return "bad signature (" + ec.message() + "): forged, or not signed with this kernel's secret";
  signed_ok = true;
  json h = json::parse(w.header, nullptr, false);
  c = json::parse(w.content, nullptr, false);
  std::string refuse;
  const std::string nonce = h.value("msg_id", std::string());
  auto date = parse_header_date(h.value("date", std::string()));
  const auto skew = date ? std::chrono::abs(std::chrono::system_clock::now() - *date) : std::chrono::system_clock::duration::max();
  auto port_ok = [&](const char* key) {
    return c.contains(key) && c[key].is_number_integer() && c[key].get<int>() > 0 && c[key].get<int>() < 65536;
  };
  if (h.value("msg_type", std::string()) != kRegisterType) refuse = "not a " + std::string(kRegisterType) + " message";
  else if (nonce.empty() || k.reg_nonces.count(nonce)) refuse = "replayed (its nonce was used already)";
  else if (!date || skew > kRegistrationMaxSkew)
    refuse = "late: its date is more than " + std::to_string(kRegistrationMaxSkew.count()) + " s from kgate's clock";
  else if (!c.is_object() || c.value("kernel_id", std::string()) != id) refuse = "it names another kernel";
  else if (c.value("attempt", -1) != k.attempts) refuse = "it is for an earlier launch of this kernel";
  else if (!c.contains("ip") || !c["ip"].is_string()) refuse = "no ip";
  else {
    for (const char* key : {"shell_port", "iopub_port", "stdin_port", "control_port", "hb_port", "control_link_port"})
      if (!port_ok(key)) refuse = std::string("no valid ") + key;
  }
  if (!nonce.empty()) k.reg_nonces.insert(nonce);
  if (refuse.empty()) k.reg_secret.clear();  // one registration per secret: a replay finds nothing to register
  return refuse;
}

void KernelManager::Impl::on_registration() {
  reg_recheck = false;
  for (int n = 0; reg; ++n) {
    if (n == 64) {  // the rest on the next pass: kernels' sockets get their turn
      reg_recheck = true;
      return;
    }
    std::vector<zmq::message_t> parts;
    zmq::message_t part;
    if (!reg->recv(part, zmq::recv_flags::dontwait)) return;
    bool more = part.more();
    parts.push_back(std::move(part));
    while (more && parts.size() < 32) {
      zmq::message_t p2;
      if (!reg->recv(p2, zmq::recv_flags::dontwait)) break;
      more = p2.more();
      parts.push_back(std::move(p2));
    }
    if (parts.size() < 7) continue;  // not a Jupyter message: nothing to answer
    std::vector<std::string_view> views;
    for (auto& p : parts) views.emplace_back(static_cast<const char*>(p.data()), p.size());
    const std::string identity(views[0]);
    auto answer = [&](const Signer& signer, const std::string& status, const std::string& reason) {
      WireMessage w;
      w.identities = {identity};
      w.header = make_header(kRegisterReplyType, "kgate").dump();
      w.parent_header = "{}";
      w.metadata = "{}";
      w.content = json{{"status", status}, {"reason", reason}}.dump();
      auto frames = encode(w, signer);
      for (std::size_t i = 0; i < frames.size(); ++i)
        (void)reg->send(zmq::buffer(frames[i]),
                        (i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none) |
                            zmq::send_flags::dontwait);
      reg_recheck = true;  // a send may have taken in the next message's signal
    };
    // Which kernel it claims to be, unverified: only to pick the secret to verify it with.
    std::size_t delim = 0;  // [identity, delimiter, signature, header, ...]
    while (delim < views.size() && views[delim] != "<IDS|MSG>") ++delim;
    if (delim + 2 >= views.size()) continue;
    json peek = json::parse(views[delim + 2], nullptr, false);
    const std::string id = peek.is_object() && peek.contains("session") && peek["session"].is_string()
                               ? peek["session"].get<std::string>() : std::string();
    KernelIo* k = find(id);
    static const Signer unsigned_signer;
    if (!k || !k->remote() || k->reg_secret.empty()) {
      spdlog::warn("registration refused: no registration is expected for kernel '{}' (unknown, or registered already)",
                   id.substr(0, 64));
      answer(unsigned_signer, "error", "no registration is expected for this kernel");
      continue;
    }
    Signer signer(k->reg_secret);  // before verify_registration uses the secret up
    json c;
    bool signed_ok = false;
    std::string refuse = verify_registration(*k, views, c, signed_ok);
    if (!refuse.empty()) {
      spdlog::warn("kernel {}: registration refused: {}", id, refuse);
      answer(signed_ok ? signer : unsigned_signer, "error", signed_ok ? refuse : "bad signature");
      continue;
    }
    answer(signer, "ok", "");
    registered(*k, c);
  }
}

void KernelManager::Impl::ssh_reported(KernelIo& k, const std::string& line) {
  json j = json::parse(line, nullptr, false);
  if (!j.is_object() || !j.contains("kgate_register") || !j["kgate_register"].is_array())
    return fail_start(k, "the node launcher on " + k.request.launcher->host + " answered '" + line.substr(0, 200) +
                             "', not its report (is kgate_path a kgate of this version?)");
  std::vector<std::string> frames;
  for (const auto& f : j["kgate_register"]) frames.push_back(f.is_string() ? f.get<std::string>() : std::string());
  std::vector<std::string_view> views(frames.begin(), frames.end());
  json c;
  bool signed_ok = false;
  std::string refuse = verify_registration(k, views, c, signed_ok);
  if (!refuse.empty()) return fail_start(k, "the node launcher's report was refused: " + refuse);
  registered(k, c);
}

void KernelManager::Impl::registered(KernelIo& k, const json& c) {
  const std::string id = k.kernel->id();
  const LauncherConfig& l = *k.request.launcher;
  k.node_ip = c["ip"].get<std::string>();
  k.node_ports.clear();
  for (const char* key : {"shell_port", "iopub_port", "stdin_port", "control_port", "hb_port", "control_link_port"})
    k.node_ports.push_back(c[key].get<int>());
  k.control_link_port = k.node_ports[5];
  // Where kgate reaches them: the node's address as reported; a host that bound every address
  // (SSH, bind_ip 0.0.0.0) at the address kgate resolved its name to; forwarded, 127.0.0.1.
  k.connect_ip = k.node_ip == "0.0.0.0" ? k.host_addr : k.node_ip;
  const std::string host = c.value("hostname", std::string());
  k.kernel->update_placement({{"host", host}, {"ip", k.node_ip}});
  if (l.kind == LauncherConfig::Kind::ssh) k.kernel->update_placement({{"state", "RUNNING"}});
  spdlog::info("kernel {}: registered from {} ({}), pid {}{}", id, host, k.node_ip, c.value("pid", 0),
               k.slurm_job.empty() ? "" : ", Slurm job " + k.slurm_job);
  open_link(k, /*reconnect=*/false);
}

bool KernelManager::Impl::start_tunnel(KernelIo& k, std::string& why) {
  const LauncherConfig& l = *k.request.launcher;
  if (k.local_ports.empty()) {
    try {
      k.local_ports = pick_ports("127.0.0.1", 6, reserved_ports);
    } catch (const std::exception& e) {
      why = e.what();
      return false;
    }
    for (int p : k.local_ports) reserved_ports.insert(p);
  }
  LaunchOptions lo;
  lo.env = current_environment();
  lo.argv = ssh_tunnel_argv(l, k.local_ports, k.node_ports);
  lo.argv[0] = find_program(lo.argv[0], lo.env);
  // Started from kgate-io, which lives as long as kgate: PR_SET_PDEATHSIG follows the thread.
  lo.die_with_parent = true;
  try {
    k.tunnel = ChildProcess::launch(lo);
  } catch (const std::exception& e) {
    why = std::string("ssh: ") + e.what();
    return false;
  }
  spdlog::info("kernel {}: forwarding its ports through ssh to {} (pid {})", k.kernel->id(), l.host, k.tunnel.pid());
  return true;
}

void KernelManager::Impl::open_link(KernelIo& k, bool reconnect) {
  const LauncherConfig& l = *k.request.launcher;
  const bool forwarded = l.kind == LauncherConfig::Kind::ssh && l.forward;
  std::string ip = k.connect_ip;
  int port = k.node_ports.size() == 6 ? k.node_ports[5] : 0;
  if (forwarded) {
    if (!k.tunnel.running()) {
      std::string why;
      if (!start_tunnel(k, why)) {
        if (reconnect) {
          k.link_why = why;
          auto id = k.kernel->id();
          auto epoch = k.epoch;
          after(std::chrono::seconds(2), [this, id, epoch] { reconnect_try(id, epoch); });
        } else {
          fail_start(k, why);
        }
        return;
      }
    }
    ip = "127.0.0.1";
    port = k.local_ports[5];
  }
  if (!reconnect) {  // kgate's view of the ports: the connection file here, the sockets
    k.conn.ip = ip;
    const auto& ports = forwarded ? k.local_ports : k.node_ports;
    k.conn.shell_port = ports[0];
    k.conn.iopub_port = ports[1];
    k.conn.stdin_port = ports[2];
    k.conn.control_port = ports[3];
    k.conn.hb_port = ports[4];
  }
  k.link_out = true;
  const auto id = k.kernel->id();
  const auto epoch = k.epoch;
  spawn([this, id, epoch, ip, port, key = k.conn.key, forwarded, reconnect] {
    if (forwarded) wait_forwarding(port, [] { return false; });  // ssh listens once it is connected
    auto hello = ChildProcess::connect_node(ip, port, key, id, 5000);
    post([this, id, epoch, hello, reconnect]() mutable {
      KernelIo* kk = find(id);
      if (!kk || kk->epoch != epoch) {
        if (hello.fd >= 0) ::close(hello.fd);
        return;
      }
      kk->link_out = false;
      on_link(*kk, std::move(hello), reconnect);
    });
  });
}

void KernelManager::Impl::on_link(KernelIo& k, ChildProcess::SupervisorHello hello, bool reconnect) {
  const std::string id = k.kernel->id();
  const LauncherConfig& l = *k.request.launcher;
  const std::string where = (l.kind == LauncherConfig::Kind::ssh ? l.host : k.kernel->placement().value("host", k.node_ip)) +
                            " (" + k.node_ip + ":" + std::to_string(k.control_link_port) + ")";
  if (hello.fd < 0) {
    std::string why = "the node launcher on " + where + ": " + hello.why;
    if (k.tunnel.running() && l.forward) why += " (through the SSH forwarding)";
    if (!reconnect) return fail_start(k, why);
    k.link_why = why;
    auto epoch = k.epoch;
    after(std::chrono::seconds(2), [this, id, epoch] { reconnect_try(id, epoch); });
    return;
  }
  if (reconnect) {
    if (hello.pid != k.proc.pid() || hello.start_time != k.proc.start_time()) {
      ::close(hello.fd);
      return die(k, "gone: its node launcher on " + where + " now holds another process (pid " +
                        std::to_string(hello.pid) + ")");
    }
    k.proc = ChildProcess::adopt(hello.fd, hello.pid, hello.start_time, std::move(hello.rest));
    k.proc.set_remote();
    ++k.epoch;
    ++k.socket_gen;
    open_sockets(k);
    k.stdin_up = true;  // not waited for: the kernel is ready
    k.relinking = true;
    relink_probe(id, k.epoch);
    return;
  }
  k.proc = ChildProcess::adopt(hello.fd, hello.pid, hello.start_time, std::move(hello.rest));
  k.proc.set_remote();
  try {
    write_connection_file(k.file, k.conn);  // kgate's copy: attach from this host
    write_owner_file(runtime_dir, id);
  } catch (const std::exception& e) {
    spdlog::warn("kernel {}: {}", id, e.what());
  }
  k.kernel->set_process(k.proc.pid(), k.file, k.conn);
  await_ready(k);
}

void KernelManager::Impl::relink_probe(const std::string& id, std::uint64_t epoch) {
  KernelIo* k = find(id);
  if (!k || k->epoch != epoch || !k->relinking) return;
  if (Clock::now() - k->link_down_since > opts.link_timeout)
    return die(*k, "unreachable for " + std::to_string(opts.link_timeout.count() / 1000) +
                       " s (reconnected, but its iopub was never heard again)");
  // Any iopub message will do: this request's busy/idle are there for that.
  if (auto sent = send_internal(*k, Channel::control, "kernel_info_request", json::object()); !sent.empty())
    k->readiness_ids.insert(std::move(sent));
  after(std::chrono::milliseconds(250), [this, id, epoch] { relink_probe(id, epoch); });
}

void KernelManager::Impl::relinked(KernelIo& k) {
  k.relinking = false;
  k.link_down = false;
  k.kernel->update_placement({{"link", nullptr}, {"link_error", nullptr}});
  heartbeat_tick(k.kernel->id(), k.epoch);
  if (k.interrupt_on_relink) {
    k.interrupt_on_relink = false;
    interrupt_now(k);
  }
  auto held = std::move(k.held);
  k.held.clear();
  for (auto& m : held) send_now(k, m);
  const auto secs = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - k.link_down_since).count() / 1000.0;
  spdlog::info("kernel {}: reachable again after {:.1f} s", k.kernel->id(), secs);
}

void KernelManager::Impl::link_lost(KernelIo& k, const std::string& why) {
  if (k.relinking) {  // dropped again before it was heard: reconnect again, same clock
    k.relinking = false;
    k.link_why = why;
    close_sockets(k);
    auto id = k.kernel->id();
    auto epoch = k.epoch;
    after(std::chrono::milliseconds(500), [this, id, epoch] { reconnect_try(id, epoch); });
    return;
  }
  if (k.link_down) return;
  k.link_down = true;
  k.link_down_since = Clock::now();
  k.link_why = why;
  k.kernel->set_responsive(false, k.link_down_since);
  k.kernel->update_placement({{"link", "down"}, {"link_error", why}});
  // The replies to what is pending are lost with the connections (the kernel routes them to
  // the old ones): each request gets its one reply now.  Clients' new messages wait (held)
  // for the link; the kernel runs on, and its output reaches clients once the link is back.
  fail_pending(k, "KernelUnreachable",
               "kgate: the link to the kernel dropped (" + why + "); this request's reply is lost, the cell may still be running");
  close_sockets(k);
  spdlog::warn("kernel {}: unreachable ({}); reconnecting for up to {} s", k.kernel->id(), why,
               opts.link_timeout.count() / 1000);
  auto id = k.kernel->id();
  auto epoch = k.epoch;
  after(std::chrono::milliseconds(500), [this, id, epoch] { reconnect_try(id, epoch); });
}

void KernelManager::Impl::reconnect_try(const std::string& id, std::uint64_t epoch) {
  KernelIo* k = find(id);
  if (!k || k->epoch != epoch || !k->link_down || k->link_out || k->phase != Phase::ready) return;
  if (Clock::now() - k->link_down_since > opts.link_timeout)
    return die(*k, "unreachable for " + std::to_string(opts.link_timeout.count() / 1000) + " s (" + k->link_why + ")");
  open_link(*k, /*reconnect=*/true);
}

void KernelManager::Impl::await_ready(KernelIo& k) {
  open_sockets(k);
  k.ready_reply = false;
  k.iopub_seen = false;
  k.info_sent = 0;
  k.readiness_ids.clear();
  k.ready_deadline = Clock::now() + opts.ready_timeout;
  k.stall_deadline = k.ready_deadline;
  send_kernel_info(k);
}

bool KernelManager::Impl::relaunched_in_place(KernelIo& k) {
  int fd = -1;
  std::string rest;
  if (!k.proc.take_link(fd, rest)) return false;
  // The node launcher starts the kernel again at once (~10 ms) and says so on the link.
  auto hello = ChildProcess::read_hello(fd, std::move(rest), 10000);
  if (hello.fd < 0) {
    spdlog::warn("kernel {}: its node launcher did not restart it in place ({}); submitting a new job",
                 k.kernel->id(), hello.why);
    return false;
  }
  k.phase = Phase::restarting;
  k.attempts = 1;
  ++k.epoch;
  k.proc = ChildProcess::adopt(hello.fd, hello.pid, hello.start_time, std::move(hello.rest));
  k.proc.set_remote();
  k.kernel->set_process(k.proc.pid(), k.file, k.conn);
  spdlog::info("kernel {}: restarted in place (pid {}{})", k.kernel->id(), hello.pid,
               k.slurm_job.empty() ? "" : ", Slurm job " + k.slurm_job);
  await_ready(k);
  return true;
}

// ---------------------------------------------------------------------------------------
// The loop

void KernelManager::Impl::run() {
  while (true) {
    std::deque<std::function<void()>> work;
    {
      std::lock_guard lk(qmu);
      work.swap(queue);
    }
    for (auto& fn : work) fn();
    while (!timers.empty() && timers.top().when <= Clock::now()) {
      auto fn = timers.top().fn;
      timers.pop();
      fn();
    }
    if (stopping.load() && io.empty()) {
      std::lock_guard lk(qmu);
      if (queue.empty()) return;
    }
    poll_once();
  }
}

// One pass: wait for a kernel socket, a kernel's exit, the wake eventfd or the next timer, then
// read what is ready.  Not zmq_poll: it asks every ZMQ socket for its events before and after
// its poll(), and each ask is a getpid() and a poll() of that socket's mailbox (fork detection and
// command processing in libzmq 4.3), so a pass cost 2 x 5 syscalls per kernel, ready or not:
// ~75 poll() and ~80 getpid() per `1+1` with two kernels, and more with every kernel added.
// Here each ZMQ socket's ZMQ_FD (its mailbox's eventfd) is in one ::poll(), and only a socket
// whose FD fired is read, to EAGAIN, which re-arms the FD for the next message.  libzmq may
// take a message's signal in while sending on that socket, so a socket just sent on, or whose
// read stopped at its bound, is read on the next pass without waiting (KernelIo::recheck).
void KernelManager::Impl::poll_once() {
  struct Slot {
    std::string id;
    int kind;  // 0 shell 1 control 2 stdin 3 iopub 4 hb 5 exit 6 wake 7 stdin monitor 8 registration 9 ssh forwarding
  };
  std::vector<pollfd> fds;
  std::vector<Slot> slots;
  std::vector<std::pair<std::string, std::uint8_t>> rechecks;
  fds.push_back({wake_fd, POLLIN, 0});
  slots.push_back({{}, 6});
  if (reg) {
    fds.push_back({reg->get(zmq::sockopt::fd), POLLIN, 0});
    slots.push_back({{}, 8});
  }
  for (auto& [id, kp] : io) {
    KernelIo& k = *kp;
    if (k.sockets_open()) {
      if (k.recheck) rechecks.emplace_back(id, k.recheck);
      zmq::socket_t* socks[] = {k.shell.get(), k.control.get(), k.stdin_.get(), k.iopub.get(),
                                k.hb.get()};
      for (int i = 0; i < 5; ++i) {
        fds.push_back({socks[i]->get(zmq::sockopt::fd), POLLIN, 0});
        slots.push_back({id, i});
      }
    }
    if (k.proc.running() && k.proc.exit_fd() >= 0) {
      fds.push_back({k.proc.exit_fd(), POLLIN, 0});
      slots.push_back({id, 5});
    }
    if (k.stdin_monitor) {
      fds.push_back({k.stdin_monitor->get(zmq::sockopt::fd), POLLIN, 0});
      slots.push_back({id, 7});
    }
    if (k.tunnel.running() && k.tunnel.exit_fd() >= 0) {
      fds.push_back({k.tunnel.exit_fd(), POLLIN, 0});
      slots.push_back({id, 9});
    }
  }
  long timeout = 1000;
  if (!timers.empty()) {
    // Rounded up: a timer due in 0.4 ms waits 1 ms, not 0 ms again and again until it is due.
    auto d = std::chrono::ceil<std::chrono::milliseconds>(timers.top().when - Clock::now()).count();
    timeout = std::clamp<long>(d, 0, 1000);
  }
  // Without pidfds, exits are found by polling waitpid.
  bool have_nopidfd = false;
  for (auto& [id, kp] : io)
    if (kp->proc.running() && kp->proc.exit_fd() < 0) have_nopidfd = true;
  if (have_nopidfd) timeout = std::min(timeout, 100L);
  if (!rechecks.empty() || reg_recheck) timeout = 0;

  // EINTR (a signal sent to this thread alone: it blocks async signals) is a pass with nothing
  // ready; the rechecks still run.
  int rc = ::poll(fds.data(), fds.size(), int(timeout));
  if (have_nopidfd) {
    std::vector<std::string> ids;
    for (auto& [id, kp] : io)
      if (kp->proc.running() && kp->proc.exit_fd() < 0) ids.push_back(id);
    for (auto& id : ids)
      if (KernelIo* k = find(id)) on_exit(*k);
  }
  auto read_socket = [this](KernelIo& k, int kind) {
    switch (kind) {
      case 0: if (k.shell) on_readable(k, *k.shell, Channel::shell); break;
      case 1: if (k.control) on_readable(k, *k.control, Channel::control); break;
      case 2: if (k.stdin_) on_readable(k, *k.stdin_, Channel::stdin_); break;
      case 3: if (k.iopub) on_readable(k, *k.iopub, Channel::iopub); break;
      case 4: if (k.hb) on_hb(k); break;
      case 7: if (k.stdin_monitor) on_stdin_monitor(k); break;
    }
  };
  // The sockets to read anyway: cleared first, so a send or a bounded read while reading sets
  // them again for the next pass.
  for (const auto& [id, bits] : rechecks) {
    KernelIo* k = find(id);
    if (!k) continue;
    k->recheck = 0;
    for (int kind : {3, 0, 1, 2, 4, 7}) {
      if (!(bits & (1 << kind))) continue;
      if (!find(id) || !k->sockets_open()) break;
      read_socket(*k, kind);
    }
  }
  if (reg_recheck) on_registration();
  if (rc <= 0) return;
  for (std::size_t i = 0; i < fds.size(); ++i) {
    if (!fds[i].revents) continue;
    const Slot& s = slots[i];
    if (s.kind == 8) {
      on_registration();
      continue;
    }
    if (s.kind == 6) {
      std::uint64_t v;
      [[maybe_unused]] auto n = ::read(wake_fd, &v, sizeof v);
      continue;
    }
    KernelIo* k = find(s.id);
    if (!k) continue;
    bool read_already = std::any_of(rechecks.begin(), rechecks.end(), [&](const auto& r) {
      return r.first == s.id && s.kind != 5 && (r.second & (1 << s.kind));
    });
    if (read_already) continue;
    if (s.kind == 9) {
      if (k->tunnel.try_reap()) {
        spdlog::warn("kernel {}: its SSH forwarding ended ({})", s.id, k->tunnel.describe_exit());
        if (k->phase == Phase::ready) link_lost(*k, "the SSH connection dropped");
      }
      continue;
    }
    if (s.kind == 5) on_exit(*k);
    else if (k->sockets_open()) read_socket(*k, s.kind);
  }
}

// ---------------------------------------------------------------------------------------
// Public API

KernelManager::KernelManager(KernelOptions opts, std::filesystem::path runtime_dir,
                             std::vector<KernelObserver*> observers)
    : impl_(std::make_unique<Impl>(opts, std::move(runtime_dir), std::move(observers))) {
  if (impl_->opts.host_session.empty()) impl_->opts.host_session = "kgate-" + new_hex_id();
  impl_->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl_->wake_fd < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  impl_->thread = std::thread([this] {
    pthread_setname_np(pthread_self(), "kgate-io");
    block_async_signals_in_this_thread();
    impl_->run();
  });
}

KernelManager::~KernelManager() {
  shutdown_all();
  // Scheduler commands still out (a scancel at a DELETE): each is bounded by its run() timeout,
  // 60 s at most (sbatch, the ssh launch), so this wait outlasts every one of them.
  for (int i = 0; i < 6500 && impl_->workers.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  impl_->stopping = true;
  impl_->post([] {});
  if (impl_->thread.joinable()) impl_->thread.join();
  ::close(impl_->wake_fd);
}

void KernelManager::Impl::save_entry(KernelIo& k, bool with_activity) {
  if (!table.enabled()) return;
  if (!k.remote() && !k.proc.supervised()) return;  // a direct child cannot outlive kgate
  KernelTableEntry e;
  e.id = k.kernel->id();
  e.pooled = k.kernel->pooled();
  e.spec = k.kernel->spec();
  e.conn = k.conn;
  e.connection_file = k.file;
  e.pid = k.proc.pid();
  e.pid_start = k.proc.start_time();
  e.supervisor = k.sup_name;
  e.supervisor_pid = k.sup_pid;
  e.cull_idle_timeout = k.kernel->cull_idle_timeout();
  e.conversation = k.kernel->conversation();
  e.created_unix_ms = k.created_unix_ms;
  if (k.remote())
    e.remote = {{"launcher", launcher_to_json(*k.request.launcher)},
                {"slurm_job", k.slurm_job},
                {"registered", k.reg_secret.empty() && k.proc.pid() > 0},
                {"control_link_port", k.control_link_port},
                {"node_ip", k.node_ip},
                {"connect_ip", k.connect_ip},
                {"host_addr", k.host_addr},
                {"node_ports", k.node_ports},
                {"local_ports", k.local_ports},
                {"placement", k.kernel->placement()}};
  if (auto t = k.kernel->last_activity_time(); with_activity && t)
    e.last_activity_unix_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(t->time_since_epoch()).count();
  try {
    table.save(e);
  } catch (const std::exception& ex) {
    spdlog::warn("kernel {}: cannot write its kernel table entry ({}); a later kgate will not re-adopt it",
                 e.id, ex.what());
  }
}

void KernelManager::Impl::attach(KernelIo& k) {
  ++k.epoch;
  k.phase = Phase::launching;
  await_ready(k);
}

std::size_t KernelManager::detach_all() {
  std::promise<std::size_t> done;
  auto fut = done.get_future();
  impl_->post([this, &done] {
    Impl& m = *impl_;
    std::size_t n = 0;
    for (auto it = m.io.begin(); it != m.io.end();) {
      KernelIo& k = *it->second;
      if (!m.table.enabled() || k.phase != Phase::ready || !k.proc.supervised() || k.kernel->pooled() || k.handout) {
        ++it;
        continue;
      }
      const std::string id = k.kernel->id();
      m.save_entry(k, /*with_activity=*/true);  // the next kgate's cull clock goes on from it
      m.close_sockets(k);
      // Its own name: the records keep what runs as running, for the next kgate to end or go on
      // with (JobStore::on_kernel_message); a shutdown's KernelShutdown ends them kernel_lost.
      m.fail_pending(k, "GatewayStopping", "kgate is stopping; the kernel goes on, for the next kgate");
      {
        std::lock_guard lk(m.kmu);
        m.kernels.erase(id);
      }
      spdlog::info("kernel {}: left running for the next kgate (pid {})", id, k.proc.pid());
      it = m.io.erase(it);  // its ChildProcess closes the supervisor's socket: the orphan timeout starts
      ++n;
    }
    done.set_value(n);
  });
  return fut.get();
}

std::vector<std::string> KernelManager::adopt(std::vector<KernelTableEntry> entries) {
  std::promise<std::vector<std::string>> done;
  auto fut = done.get_future();
  impl_->post([this, entries = std::move(entries), &done]() mutable {
    Impl& m = *impl_;
    std::vector<std::string> log;
    for (auto& e : entries) {
      auto forget = [&](const std::string& why) {
        log.push_back("kernel " + e.id + ": not re-adopted: " + why);
        m.table.remove(e.id);
        std::error_code ec;
        std::filesystem::remove(e.connection_file, ec);
        remove_owner_file(m.runtime_dir, e.id);
      };
      if (m.io.count(e.id)) {
        log.push_back("kernel " + e.id + ": already known; its table entry is ignored");
        continue;
      }
      LauncherPtr launcher;
      if (!e.remote.is_null()) {
        try {
          launcher = launcher_from_json(e.remote["launcher"]);
        } catch (const std::exception& ex) {
          forget(ex.what());
          continue;
        }
        if (!e.remote.value("registered", false)) {
          // Its job was still queued: the launcher would register with the kgate that is gone.
          const std::string job = e.remote.value("slurm_job", std::string());
          if (!job.empty()) m.spawn([job] { slurm_cancel(job); });
          forget(job.empty() ? "it was being submitted" : "its Slurm job " + job + " was still queued; cancelled");
          continue;
        }
      }
      // A kernel behind SSH forwarding: its forwards first (same local ports as before).
      ChildProcess tunnel;
      std::vector<int> node_ports, local_ports;
      if (launcher) {
        node_ports = e.remote.value("node_ports", std::vector<int>{});
        local_ports = e.remote.value("local_ports", std::vector<int>{});
      }
      const bool forwarded = launcher && launcher->kind == LauncherConfig::Kind::ssh && launcher->forward &&
                             node_ports.size() == 6 && local_ports.size() == 6;
      if (forwarded) {
        LaunchOptions lo;
        lo.env = current_environment();
        lo.argv = ssh_tunnel_argv(*launcher, local_ports, node_ports);
        lo.argv[0] = find_program(lo.argv[0], lo.env);
        lo.die_with_parent = true;
        try {
          tunnel = ChildProcess::launch(lo);
          wait_forwarding(local_ports[5], [&tunnel] { return tunnel.try_reap(); });
        } catch (const std::exception& ex) {
          spdlog::warn("kernel {}: cannot forward its ports through ssh: {}", e.id, ex.what());
        }
      }
      auto hello = launcher ? ChildProcess::connect_node(e.conn.ip, forwarded ? local_ports[5] : e.remote.value("control_link_port", 0),
                                                         e.conn.key, e.id, 3000)
                            : ChildProcess::connect_supervisor(e.supervisor, 2000, e.supervisor_pid);
      if (hello.fd < 0 && tunnel.running()) tunnel.signal(SIGTERM);
      std::string dead;  // why the kernel is gone: it is listed dead, never re-adopted
      if (hello.impostor) {  // never adopted, so never signalled
        spdlog::error("kernel {}: {}", e.id, hello.why);
        dead = "the kernel is not re-adopted: " + hello.why;
      } else if (hello.fd < 0) {
        dead = "the kernel ended while no kgate was running (" + hello.why + ")";
      } else if (hello.pid != e.pid || hello.start_time != e.pid_start) {
        ::close(hello.fd);
        hello.fd = -1;
        dead = "the kernel is gone: its supervisor holds another process (pid " + std::to_string(hello.pid) +
               ", not " + std::to_string(e.pid) + ")";
      }
      ChildProcess proc = dead.empty() ? ChildProcess::adopt(hello.fd, hello.pid, hello.start_time, std::move(hello.rest)) : ChildProcess{};
      if (launcher) proc.set_remote();
      if (e.pooled) {  // a warm kernel not handed out: not worth keeping, the pool starts fresh ones
        proc.signal_group(SIGTERM);  // nothing if it is gone
        forget(dead.empty() ? "a warm-pool kernel; stopped" : "a warm-pool kernel that ended while no kgate was running");
        continue;
      }
      auto kernel = std::make_shared<Kernel>(e.id, e.spec);
      kernel->set_cull_idle_timeout(e.cull_idle_timeout);
      kernel->set_conversation(e.conversation);
      auto k = std::make_unique<KernelIo>();
      k->session = m.kernel_session();
      k->kernel = kernel;
      k->request.spec = e.spec;
      k->request.id = e.id;
      k->request.cull_idle_timeout = e.cull_idle_timeout;
      k->request.launcher = launcher;
      if (launcher) {
        k->slurm_job = e.remote.value("slurm_job", std::string());
        k->control_link_port = e.remote.value("control_link_port", 0);
        k->node_ip = e.remote.value("node_ip", std::string());
        k->connect_ip = e.remote.value("connect_ip", std::string());
        k->host_addr = e.remote.value("host_addr", std::string());
        k->node_ports = node_ports;
        k->local_ports = local_ports;
        for (int p : local_ports) m.reserved_ports.insert(p);
        k->tunnel = std::move(tunnel);
        if (e.remote.contains("placement")) kernel->update_placement(e.remote["placement"]);
      }
      k->conn = e.conn;
      k->signer = std::make_unique<Signer>(k->conn.key, k->conn.signature_scheme);
      k->file = e.connection_file;
      k->proc = std::move(proc);
      k->sup_name = e.supervisor;
      k->sup_pid = e.supervisor_pid;
      k->adopted = true;
      k->created_unix_ms = e.created_unix_ms;
      for (int p : {k->conn.shell_port, k->conn.iopub_port, k->conn.stdin_port, k->conn.control_port,
                    k->conn.hb_port})
        m.reserved_ports.insert(p);
      kernel->set_process(k->proc.pid(), k->file, k->conn);
      if (e.created_unix_ms > 0)
        kernel->set_created(std::chrono::system_clock::time_point(std::chrono::milliseconds(e.created_unix_ms)));
      if (e.last_activity_unix_ms > 0)
        kernel->touch_at(std::chrono::system_clock::time_point(std::chrono::milliseconds(e.last_activity_unix_ms)));
      else
        kernel->touch();  // not known (its kgate was killed): the cull clock starts now
      KernelIo& ref = *k;
      m.io.emplace(e.id, std::move(k));
      {
        std::lock_guard lk(m.kmu);
        m.kernels.emplace(e.id, kernel);
      }
      if (!dead.empty()) {
        // Listed dead until DELETE (or restarted in place), as a kernel that died under this
        // kgate would be; its table entry stays until then, so another restart reports it too.
        ref.adopted = false;
        ref.phase = Phase::dead;
        if (ref.tunnel.running()) ref.tunnel.signal(SIGTERM);
        kernel->set_state("dead", dead);
        std::error_code ec;
        std::filesystem::remove(ref.file, ec);
        remove_owner_file(m.runtime_dir, e.id);  // launch() writes both again at a restart
        log.push_back("kernel " + e.id + " (" + e.spec.name + ", pid " + std::to_string(e.pid) + "): listed dead: " + dead);
        continue;
      }
      try {
        write_owner_file(m.runtime_dir, e.id);  // this kgate owns its files now
      } catch (const std::exception& ex) {
        spdlog::warn("kernel {}: {}", e.id, ex.what());
      }
      log.push_back("kernel " + e.id + " (" + e.spec.name + ", pid " + std::to_string(e.pid) +
                    "): re-adopting it from an earlier kgate");
      ref.start_waiters.push_back([](StartResult) {});
      m.attach(ref);
      if (ref.remote()) m.scheduler_arm();
    }
    done.set_value(std::move(log));
  });
  return fut.get();
}

void KernelManager::start(StartRequest req, std::function<void(StartResult)> done) {
  auto kernel = std::make_shared<Kernel>(req.id.empty() ? new_uuid() : req.id, std::move(req.spec));
  kernel->set_cull_idle_timeout(req.cull_idle_timeout);
  kernel->set_pooled(req.pooled);
  impl_->post([this, kernel, req = std::move(req), done = std::move(done)]() mutable {
    Impl& m = *impl_;
    if (m.stopping) {
      done(StartResult{nullptr, "kgate is shutting down"});
      return;
    }
    auto k = std::make_unique<KernelIo>();
    k->session = m.kernel_session();
    k->kernel = kernel;
    k->request = std::move(req);
    k->conn.key = new_uuid();
    k->conn.kernel_name = kernel->spec().name;
    k->conn.ip = "127.0.0.1";
    k->signer = std::make_unique<Signer>(k->conn.key, k->conn.signature_scheme);
    k->file = m.runtime_dir / ((k->request.pooled ? "pool-" : "kernel-") + kernel->id() + ".json");
    k->start_waiters.push_back(std::move(done));
    KernelIo& ref = *k;
    m.io.emplace(kernel->id(), std::move(k));
    {
      std::lock_guard lk(m.kmu);
      m.kernels.emplace(kernel->id(), kernel);
    }
    kernel->touch();
    try {
      write_owner_file(m.runtime_dir, kernel->id());  // a later kgate can tell its files are stale
      m.launch(ref, /*fresh_ports=*/true);
    } catch (const std::exception& e) {
      m.fail_start(ref, e.what());
    }
  });
}

namespace {
// The hand-out as Python: one exec() of a fixed script in a throwaway namespace, so nothing is
// bound in the user's.  The values are JSON literals, which Python reads as its own (nlohmann
// escapes control characters as \n, \t or \u00XX).  A `python -m` kernel has the cwd it started
// in on sys.path (besides IPython's ''): that entry follows the chdir, as in a cold start there.
std::string handout_code(const HandOut& h) {
  auto lit = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
  std::string script = "import os, sys\n";
  if (!h.env.empty()) script += "os.environ.update(env)\n";
  // The one start-only variable whose effect Python also exposes at run time (pool_refusal).
  if (h.env.count("PYTHONDONTWRITEBYTECODE"))
    script += "sys.dont_write_bytecode = bool(env['PYTHONDONTWRITEBYTECODE'])\n";
  if (!h.cwd.empty())
    script += "old = os.getcwd()\nos.chdir(cwd)\nsys.path[:] = [cwd if p == old else p for p in sys.path]\n";
  json ns = {{"env", h.env}, {"cwd", h.cwd.string()}};
  return "exec(" + lit(script) + ", " + lit(ns) + ")\n";
}
}  // namespace

void KernelManager::Impl::check_handout(KernelIo& k) {
  if (!k.handout) return;
  auto& h = *k.handout;
  bool failed = !h.error.empty();
  if (!failed && !(h.replied && h.idle)) return;
  auto done = std::move(h.done);
  auto cull = h.cull_idle_timeout;
  std::string error = h.error;
  k.handout.reset();  // the timeout finds no hand-out and does nothing
  if (failed) {
    spdlog::warn("kernel {}: hand-out failed: {}; stopping it", k.kernel->id(), error);
    k.request.on_pool_lost = nullptr;  // the pool hears of it through `done`
    begin_stop(k, /*restart=*/false);
    done(StartResult{nullptr, error});
    return;
  }
  // kernel-<id>.json from now on: `jupyter console --existing` may find it.
  auto file = runtime_dir / ("kernel-" + k.kernel->id() + ".json");
  std::error_code ec;
  std::filesystem::rename(k.file, file, ec);
  if (ec) {
    spdlog::warn("kernel {}: cannot rename {} to {}: {}; keeping the pool name", k.kernel->id(),
                 k.file.string(), file.string(), ec.message());
  } else {
    k.file = file;
  }
  k.kernel->set_process(k.proc.pid(), k.file, k.conn);
  k.kernel->set_cull_idle_timeout(cull);
  k.request.pooled = false;
  k.request.on_pool_lost = nullptr;
  k.kernel->handed_out();
  k.created_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();  // its age starts now
  save_entry(k);
  spdlog::info("kernel {}: handed out from the pool", k.kernel->id());
  done(StartResult{k.kernel, {}});
}

void KernelManager::hand_out(const std::string& id, HandOut h, std::function<void(StartResult)> done) {
  impl_->post([this, id, h = std::move(h), done = std::move(done)]() mutable {
    Impl& m = *impl_;
    KernelIo* k = m.find(id);
    if (!k || !k->kernel->pooled()) return done(StartResult{nullptr, "no such pooled kernel"});
    if (k->phase != Phase::ready || k->handout)
      return done(StartResult{nullptr, "the pooled kernel is not ready"});
    json content = {{"code", handout_code(h)}, {"silent", true},       {"store_history", false},
                    {"user_expressions", json::object()}, {"allow_stdin", false}, {"stop_on_error", true}};
    std::string msg_id = m.send_internal(*k, Channel::shell, "execute_request", std::move(content));
    if (msg_id.empty()) return done(StartResult{nullptr, "the pooled kernel's shell queue is full"});
    k->handout = KernelIo::HandOutWait{msg_id, false, false, {}, h.cull_idle_timeout, std::move(done)};
    auto timeout = h.timeout;
    m.after(timeout, [&m, id, msg_id, timeout] {
      KernelIo* kk = m.find(id);
      if (!kk || !kk->handout || kk->handout->msg_id != msg_id) return;
      kk->handout->error = "the pooled kernel did not answer the hand-out within " +
                           std::to_string(timeout.count()) + " ms";
      m.check_handout(*kk);
    });
  });
}

void KernelManager::remember(const std::string& id) {
  impl_->post([this, id] {
    KernelIo* k = impl_->find(id);
    if (k && k->phase == Phase::ready && !k->kernel->pooled()) impl_->save_entry(*k);
  });
}

void KernelManager::shutdown(const std::string& id, std::function<void(bool)> done) {
  impl_->post([this, id, done = std::move(done)]() mutable {
    KernelIo* k = impl_->find(id);
    if (!k) {
      done(false);
      return;
    }
    k->stop_waiters.push_back(std::move(done));
    if (k->phase == Phase::stopping && !k->restart_requested) return;  // already on its way
    k->restart_requested = false;
    impl_->begin_stop(*k, /*restart=*/false);
  });
}

void KernelManager::restart(const std::string& id, std::function<void(StartResult)> done) {
  impl_->post([this, id, done = std::move(done)]() mutable {
    KernelIo* k = impl_->find(id);
    if (!k) {
      done(StartResult{nullptr, {}});
      return;
    }
    if (k->phase == Phase::stopping && !k->restart_requested) {
      done(StartResult{nullptr, "kernel is shutting down"});
      return;
    }
    k->start_waiters.push_back(std::move(done));
    if (k->phase == Phase::stopping || k->phase == Phase::restarting) return;  // joins it
    impl_->begin_stop(*k, /*restart=*/true);
  });
}

void KernelManager::interrupt(const std::string& id, std::function<void(bool)> done) {
  impl_->post([this, id, done = std::move(done)]() mutable {
    KernelIo* k = impl_->find(id);
    if (!k) {
      done(false);
      return;
    }
    impl_->interrupt_now(*k);
    done(true);
  });
}

bool KernelManager::Impl::interrupt_now(KernelIo& k) {
  if (k.remote() && k.link_down) {  // unreachable for now: sent once the link is back
    k.interrupt_on_relink = true;
    return true;
  }
  if (k.kernel->spec().interrupt_mode == "message") {
    if (!k.sockets_open()) return false;
    send_internal(k, Channel::control, "interrupt_request", json::object());
    return true;
  }
  if (!k.proc.running()) return false;
  k.proc.signal(SIGINT);
  return true;
}

void KernelManager::kernel_side_call(const std::string& id, json content, std::chrono::milliseconds timeout,
                                     std::function<void(std::optional<json>)> done) {
  impl_->post([this, id, content = std::move(content), timeout, done = std::move(done)]() mutable {
    Impl& m = *impl_;
    KernelIo* k = m.find(id);
    if (!k || k->phase != Phase::ready) return done(std::nullopt);
    if (m.side_call(*k, std::move(content), timeout, done).empty()) done(std::nullopt);
  });
}

void KernelManager::with_interrupt(const std::string& id,
                                   std::function<void(const std::function<bool()>*)> fn) {
  impl_->post([this, id, fn = std::move(fn)] {
    KernelIo* k = impl_->find(id);
    if (!k) {
      fn(nullptr);
      return;
    }
    std::function<bool()> interrupt = [this, k] { return impl_->interrupt_now(*k); };
    fn(&interrupt);
  });
}

void KernelManager::send(const std::string& id, ClientMessage msg) {
  impl_->post([this, id, msg = std::move(msg)]() mutable {
    KernelIo* k = impl_->find(id);
    if (!k) return;  // removed: its clients are being closed
    switch (k->phase) {
      case Phase::ready:
        if (k->link_down) {  // a remote kernel's link is being reconnected
          if (k->held.size() >= impl_->opts.max_held)
            impl_->refuse(*k, msg, "KernelUnreachable", "kgate: too many messages held while the kernel is unreachable");
          else
            k->held.push_back(std::move(msg));
        } else if (k->hold_shell && msg.channel == Channel::shell) {  // a re-adopted kernel's history first
          if (k->held.size() >= impl_->opts.max_held)
            impl_->refuse(*k, msg, "KernelStarting", "kgate: too many messages held during the re-adoption");
          else
            k->held.push_back(std::move(msg));
        } else {
          impl_->send_now(*k, msg);
        }
        break;
      case Phase::launching:
      case Phase::restarting:
        if (k->held.size() >= impl_->opts.max_held)
          impl_->refuse(*k, msg, "KernelStarting",
                        "kgate: " + std::to_string(impl_->opts.max_held) +
                            " messages are already waiting for this kernel to start");
        else
          k->held.push_back(std::move(msg));
        break;
      case Phase::stopping:
        if (k->restart_requested) {
          if (k->held.size() >= impl_->opts.max_held)
            impl_->refuse(*k, msg, "KernelStarting", "kgate: too many messages held during restart");
          else
            k->held.push_back(std::move(msg));
        } else {
          impl_->refuse(*k, msg, "KernelShutdown", "kgate: the kernel is shutting down");
        }
        break;
      case Phase::dead: {
        std::string reason = k->kernel->model().reason;
        impl_->refuse(*k, msg, "KernelDied", "kgate: the kernel is dead (" + reason + ")");
        break;
      }
    }
  });
}

void KernelManager::cull(const std::string& id, CullRequest req, std::function<void(bool)> done) {
  impl_->post([this, id, req = std::move(req), done = std::move(done)] {
    KernelIo* k = impl_->find(id);
    bool culled = k && impl_->cull_now(*k, req);
    if (done) done(culled);
  });
}

KernelPtr KernelManager::get_any(const std::string& id) const {
  std::lock_guard lk(impl_->kmu);
  auto it = impl_->kernels.find(id);
  return it == impl_->kernels.end() ? nullptr : it->second;
}

KernelPtr KernelManager::get(const std::string& id) const {
  auto k = get_any(id);
  return k && !k->pooled() ? k : nullptr;
}

std::vector<KernelPtr> KernelManager::list() const {
  std::lock_guard lk(impl_->kmu);
  std::vector<KernelPtr> out;
  out.reserve(impl_->kernels.size());
  for (auto& [id, k] : impl_->kernels)
    if (!k->pooled()) out.push_back(k);
  return out;
}

KernelManager::Counters KernelManager::counters() const {
  Counters c;
  c.started = impl_->started.load();
  c.start_failures = impl_->start_failures.load();
  c.restarts = impl_->restarts.load();
  c.refused_shutdowns = impl_->refused_shutdowns.load();
  c.tasks_started = impl_->tasks_started.load();
  c.closes_answered = impl_->closes_answered.load();
  c.closes_unanswered = impl_->closes_unanswered.load();
  return c;
}

std::size_t KernelManager::count() const {
  std::lock_guard lk(impl_->kmu);
  std::size_t n = 0;
  for (auto& [id, k] : impl_->kernels) n += !k->pooled();
  return n;
}

void KernelManager::shutdown_all() {
  std::vector<KernelPtr> ids;
  {
    std::lock_guard lk(impl_->kmu);
    for (auto& [id, k] : impl_->kernels) ids.push_back(k);
  }
  if (ids.empty()) return;
  struct Countdown {
    std::mutex mu;
    std::condition_variable cv;
    std::size_t remaining;
  };
  auto c = std::make_shared<Countdown>();
  c->remaining = ids.size();
  for (auto& k : ids) {
    shutdown(k->id(), [c](bool) {
      std::lock_guard lk(c->mu);
      --c->remaining;
      c->cv.notify_all();
    });
  }
  auto bound = impl_->opts.close_grace + std::chrono::seconds(1) + impl_->opts.shutdown_grace +
               impl_->opts.terminate_grace + std::chrono::seconds(2);
  std::unique_lock lk(c->mu);
  if (!c->cv.wait_for(lk, bound, [&] { return c->remaining == 0; }))
    spdlog::error("{} kernel(s) did not stop within {} ms", c->remaining, bound.count());
}

}  // namespace kgate
