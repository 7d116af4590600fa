// The kernel runtime's private parts, shared by its sources (src/kernel/*.cpp): the I/O-thread
// state of one kernel (KernelIo) and KernelManager::Impl, whose methods are defined by concern:
//   kernel.cpp     the shared Kernel model and the public KernelManager facade
//   lifecycle.cpp  launch, readiness, heartbeat, exit, stop and restart, idle culling
//   io_loop.cpp    messages to and from kernels, and the poll loop
//   remote.cpp     remote launchers: registration, the scheduler poll, SSH tunnels (docs/dev/remote-launchers.md)
//   readopt.cpp    supervisor links and the re-adoption of kernels an earlier kgate left (docs/dev/readoption.md, docs/dev/readoption.md)
//
// Threading: every zmq socket, ChildProcess and KernelIo below is touched only by the I/O
// thread ("kgate-io").  Other threads reach it through Impl::post(), which queues a closure
// and wakes the poll loop through an eventfd.  Kernel objects (the models) are shared and
// guard their own fields with a mutex.
#pragma once

#include "kgate/kernel/kernel.hpp"
#include "kgate/kernel/kernel_side.hpp"
#include "kgate/jupyter/utf8.hpp"

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

#include "kgate/kernel/poll_set.hpp"
#include "kgate/kernel/tcp_under.hpp"
#include "kgate/process/process.hpp"
#include "kgate/process/supervisor.hpp"

namespace kgate {


using Clock = std::chrono::steady_clock;

// A re-adopted kernel's clients' shell requests wait at most this long for its history reply (a
// kernel that does not answer history_request delays them once, by this much).
constexpr std::chrono::seconds kHistoryHold{5};

// A starting kernel that answers kernel_info and iopub but not its heartbeat within this is
// relaunched on fresh ports (its heartbeat thread died on a taken port).
constexpr std::chrono::seconds kHeartbeatGrace{3};

// Sends one encoded message without blocking.  False when the socket's pipe is full (only the
// first frame can fail that way: a full pipe accepts no new message).
inline bool send_frames(zmq::socket_t& s, const std::vector<std::string>& frames) {
  for (std::size_t i = 0; i < frames.size(); ++i) {
    auto flags = zmq::send_flags::dontwait;
    if (i + 1 < frames.size()) flags = flags | zmq::send_flags::sndmore;
    if (!s.send(zmq::buffer(frames[i]), flags)) return false;
  }
  return true;
}


// An SSH forwarding's local end accepts connections once ssh is connected: waits for that, at
// most 15 s, or until `gone` (remote.cpp).
void wait_forwarding(int local_port, const std::function<bool()>& gone);

// ---------------------------------------------------------------------------------------
// I/O-thread state of one kernel

enum class KernelPhase { launching, ready, restarting, stopping, dead };

struct PendingRequest {  // a client request awaiting its reply
  Channel channel;
  std::string msg_type;
  std::string header;  // the request's header text: the parent of a synthesized reply
  std::string route;
};

inline std::string reply_type(const std::string& request_type) {
  static constexpr std::string_view suffix = "_request";
  if (request_type.size() > suffix.size() &&
      request_type.compare(request_type.size() - suffix.size(), suffix.size(), suffix) == 0)
    return request_type.substr(0, request_type.size() - suffix.size()) + "_reply";
  return request_type + "_reply";
}

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
  // The kernel side (docs/dev/kernel-side.md): the kernel_info_reply's implementation ("ipython" for
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
  KernelPhase phase = KernelPhase::launching;
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
  bool stall_warned = false;  // the warning of a stall that is not relaunched, once a launch
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
  std::unordered_map<std::string, PendingRequest> pending;
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
  Clock::time_point hb_sent_at{};  // the last ping (a round skips a kernel pinged in its last half)

  // A remote launcher's kernel (docs/dev/remote-launchers.md).
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

  // What poll_once waits on for this kernel, by slot kind (0 shell ... 4 hb, 5 its exit, 7 the
  // stdin monitor, 9 its SSH forwarding's exit), in Impl::poll_set under the tag
  // (poll_serial << 4 | kind).  The sockets' and the monitor's members are borrowed (PollSet):
  // they leave before those close (close_sockets, stop_stdin_monitor) and, declared after them,
  // are destroyed first.  sockets_gen is bumped whenever the sockets close, so new sockets
  // (open_sockets closes the old ones first) replace their members.
  std::uint64_t poll_serial = 0;
  std::uint64_t sockets_gen = 0;
  PollSet::Member polled[10];

  // Sockets to read on the next pass without waiting for their ZMQ_FD (poll_once), one bit per
  // poll slot kind (1 << 0 shell ... 1 << 4 hb, 1 << 7 stdin monitor): a socket just sent on
  // (libzmq may then have taken in the signal of a message that arrived), one whose read stopped
  // at its bound with messages left, and every socket after connect().
  std::uint8_t recheck = 0xff;
  // iopub batching (read_iopub, DEV.md §3): a kernel streaming output has its iopub read once
  // per KernelOptions::iopub_batch instead of once per message.  iopub_run counts the small
  // messages of the current stream (count_stream); from kStreamRun on, iopub's ZMQ_FD stays out
  // of the poll until iopub_held_until.
  Clock::time_point iopub_last{}, iopub_held_until{};
  std::size_t iopub_run = 0;
  bool iopub_held() const { return iopub_held_until != Clock::time_point{}; }
  // While a stream is held, iopub's TCP connection (tcp_under.hpp: looked for once per opening
  // of the sockets, at the first hold) has SO_RCVLOWAT kIopubLowat, so libzmq's I/O thread
  // wakes once per that many bytes, not once per message; it is lowered whenever the hold ends.
  // Lowered with bytes libzmq had not read yet, the channels that must not overtake iopub
  // (shell, control, stdin) wait out of the poll until libzmq has read them (drain_iopub), at
  // most until iopub_drain_until.
  TcpUnder iopub_tcp;
  bool iopub_tcp_looked = false;
  bool iopub_lowat = false;
  bool iopub_lowered = false;  // lowered since the last read (read_iopub)
  Clock::time_point iopub_drain_until{};
  std::uint8_t iopub_waiting = 0;  // the channels (KernelIo::bit) to read when the drain ends
  std::size_t iopub_drained = 0;  // iopub's messages read during the drain, counted by read_iopub
  bool iopub_draining() const { return iopub_drain_until != Clock::time_point{}; }
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
  // kgate's own session with one kernel: the host's, with a suffix of its own (docs/dev/kernel-side.md).
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
  // What kgate-io waits on (poll_once), declared before what has members in it (io, below), so
  // it outlives them.  A member's tag is (poll_serial << 4 | kind): serial 0 is kgate's own
  // (kind 6 the wake eventfd, 8 the registration socket); each kernel's serial names its id in
  // poll_ids, so an event for a kernel removed earlier in the same pass finds nothing.
  PollSet poll_set;
  PollSet::Member wake_polled, reg_polled;
  std::unordered_map<std::uint64_t, std::string> poll_ids;
  std::uint64_t poll_serial_seq = 0;
  std::map<std::string, std::unique_ptr<KernelIo>> io;
  // poll_once's working set, kept across passes so that a pass allocates nothing.
  struct Recheck {
    std::uint64_t serial;
    std::uint8_t bits;
  };
  std::vector<Recheck> rechecks_;
  std::vector<epoll_event> events_;
  struct Timer {
    Clock::time_point when;
    std::uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Timer& o) const { return when != o.when ? when > o.when : seq > o.seq; }
  };
  std::priority_queue<Timer, std::vector<Timer>, std::greater<>> timers;
  std::uint64_t timer_seq = 0;
  std::set<int> reserved_ports;  // the TCP ports of kernels on tcp, kept from the next pick
  std::uint64_t dropped_invalid = 0;

  // Remote launchers (docs/dev/remote-launchers.md): the registration ROUTER (bound at the first remote start),
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
  // Reads what `sock` has, up to its per-pass bound: the number of messages read.
  std::size_t on_readable(KernelIo& k, zmq::socket_t& sock, Channel ch);
  void read_iopub(KernelIo& k);
  void raise_iopub_lowat(KernelIo& k);
  // Lowers it (if raised); true when libzmq has bytes of iopub still to read: then the kernel
  // drains (KernelIo::iopub_drain_until) before iopub and the channels after it are read.
  bool lower_iopub_lowat(KernelIo& k, bool drain);
  // iopub signalled while its drain lasts: ends the drain if libzmq has read all that waited.
  void drain_iopub(KernelIo& k);
  void end_iopub_hold(KernelIo& k);
  void count_stream(KernelIo& k, const KernelMessage& m, Clock::time_point now);
  void on_hb(KernelIo& k);
  void on_exit(KernelIo& k);
  // The kernel died on its own (`how`: "exited with code 1", ...): dead, with what was pending failed.
  void die(KernelIo& k, const std::string& how);
  void handle_message(KernelIo& k, Channel ch, KernelMessage&& m);

  void launch(KernelIo& k, bool fresh_ports);
  // A tcp kernel's five ports out of reserved_ports (a no-op for ipc, whose "ports" are names).
  void release_ports(KernelIo& k) {
    if (k.conn.transport != "tcp") return;
    for (int p : {k.conn.shell_port, k.conn.iopub_port, k.conn.stdin_port, k.conn.control_port, k.conn.hb_port})
      reserved_ports.erase(p);
  }
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
  // The kernel table (docs/dev/readoption.md): its entry, rewritten when it became ready or was handed out.
  void save_entry(KernelIo& k, bool with_activity = false);
  // Listening to a kernel an earlier kgate started (adopt()): sockets and readiness, no launch.
  void attach(KernelIo& k);
  bool cull_now(KernelIo& k, const CullRequest& req);
  // Heartbeats (docs/dev/kernel-lifecycle.md, "Heartbeat"): a kernel is pinged once when it
  // becomes ready (or its link is back), then in the one round that pings every ready kernel
  // each heartbeat_interval: one timer and one burst of sends for all of them, not a timer
  // each at its own phase (60 idle kernels woke kgate-io 60 times a second).
  void heartbeat_tick(const std::string& id, std::uint64_t epoch);
  void heartbeat_ping(KernelIo& k);
  void heartbeat_arm();
  void heartbeat_round();
  bool hb_round_armed = false;
};


}  // namespace kgate
