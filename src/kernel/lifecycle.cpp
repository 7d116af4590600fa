// The kernel runtime: launch, readiness, heartbeat, exit, stop and restart, idle culling (docs/dev/kernel-lifecycle.md, docs/dev/kernel-lifecycle.md).
#include "kernel_impl.hpp"

namespace kgate {

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
    std::vector<int> ports;
    if (k.conn.transport == "ipc") {
      // Fresh names after the last ones (a kernel still dying keeps its own), none of them in use.
      remove_ipc_sockets(k.conn);
      int n = std::max({k.conn.shell_port, k.conn.iopub_port, k.conn.stdin_port, k.conn.control_port,
                        k.conn.hb_port});
      std::error_code ec;
      while (ports.size() < 5) {
        ++n;
        if (!std::filesystem::exists(k.conn.ip + "-" + std::to_string(n), ec)) ports.push_back(n);
      }
      const std::string longest = k.conn.ip + "-" + std::to_string(n);
      if (longest.size() > kMaxUnixSocketPath)
        throw std::runtime_error("the kernel's ipc socket path " + longest + " is " + std::to_string(longest.size()) +
                                 " bytes, past the " + std::to_string(kMaxUnixSocketPath) +
                                 " a Unix socket allows: give kgate a shorter --runtime-dir, or set [kernel] "
                                 "transport = \"tcp\"");
    } else {
      release_ports(k);
      ports = pick_ports(k.conn.ip, 5, reserved_ports);
      for (int p : ports) reserved_ports.insert(p);
    }
    k.conn.shell_port = ports[0];
    k.conn.iopub_port = ports[1];
    k.conn.stdin_port = ports[2];
    k.conn.control_port = ports[3];
    k.conn.hb_port = ports[4];
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
  k.phase = k.phase == KernelPhase::restarting ? KernelPhase::restarting : KernelPhase::launching;
  k.ready_reply = false;
  k.iopub_seen = false;
  k.info_sent = 0;
  k.readiness_ids.clear();
  k.ready_deadline = Clock::now() + opts.ready_timeout;
  k.stall_deadline = Clock::now() + opts.ready_timeout / 3;
  k.stall_warned = false;
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
  // Held, the copy would keep iopub's connection open after libzmq let it go.
  k.iopub_tcp.reset();
  k.iopub_tcp_looked = false;
  k.iopub_lowat = k.iopub_lowered = false;
  k.iopub_drain_until = {};
  k.iopub_waiting = 0;
  k.iopub_drained = 0;
  ++k.sockets_gen;
  for (int kind : {0, 1, 2, 3, 4}) k.polled[kind].leave();  // borrowed: out before they close
  k.shell.reset();
  k.control.reset();
  k.stdin_.reset();
  k.iopub.reset();
  k.hb.reset();
}

void KernelManager::Impl::stop_stdin_monitor(KernelIo& k) {
  if (!k.stdin_monitor) return;
  if (k.stdin_) zmq_socket_monitor(k.stdin_->handle(), nullptr, 0);
  k.polled[7].leave();  // borrowed by the poll set: out of it before it closes
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
  if (k.phase != KernelPhase::launching && k.phase != KernelPhase::restarting) return;
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
  if (now > k.stall_deadline && !k.stall_warned) {
    // Not relaunched (a remote kernel's relaunch is another job; a re-adopted kernel or a second
    // launch is not relaunched again): the log says what is missing while it waits on.
    k.stall_warned = true;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - (k.ready_deadline - opts.ready_timeout));
    spdlog::warn("kernel {}: not ready after {:.1f} s ({}); its start fails if it is not within {} s", k.kernel->id(),
                 waited.count() / 1000.0, readiness_missing(k), opts.ready_timeout.count() / 1000);
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
  if ((k.phase == KernelPhase::launching || k.phase == KernelPhase::restarting) && k.ready_reply &&
      k.iopub_seen && k.stdin_up && (k.hb_ok || k.adopted))
    became_ready(k);
}

void KernelManager::Impl::became_ready(KernelIo& k) {
  bool was_restart = k.phase == KernelPhase::restarting;
  k.phase = KernelPhase::ready;
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

// kgate's half of the session kernel inside the kernel (docs/dev/kernel-side.md): one silent execute, sent
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
  if (k.phase == KernelPhase::dead) {  // every request gets its one reply
    for (auto& m : held) refuse(k, m, "KernelDied", "kgate: the kernel died");
    return;
  }
  if (k.phase != KernelPhase::ready) {  // restarting or stopping meanwhile: they wait for that instead
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
  k.phase = KernelPhase::dead;
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
// Heartbeat, exit, stop

void KernelManager::Impl::heartbeat_tick(const std::string& id, std::uint64_t epoch) {
  KernelIo* k = find(id);
  if (!k || k->epoch != epoch || k->phase != KernelPhase::ready || !k->hb) return;
  heartbeat_ping(*k);
  heartbeat_arm();
}

void KernelManager::Impl::heartbeat_ping(KernelIo& k) {
  if (k.hb_waiting) {
    ++k.hb_misses;
    if (k.hb_misses >= opts.heartbeat_misses && !k.hb_warned) {
      k.hb_warned = true;
      k.kernel->set_responsive(false, k.hb_silent_since);
      spdlog::warn("kernel {}: unresponsive: no heartbeat for {} ms (process {} still running)", k.kernel->id(),
                   k.hb_misses * opts.heartbeat_interval.count(), k.proc.pid());
    }
  }
  std::string ping = std::to_string(++k.hb_seq);
  k.hb_sent_at = Clock::now();
  if (!k.hb_waiting) k.hb_silent_since = std::chrono::steady_clock::now();
  k.recheck |= KernelIo::kHbBit;
  if (k.hb->send(zmq::buffer(ping), zmq::send_flags::dontwait)) k.hb_waiting = true;
}

void KernelManager::Impl::heartbeat_arm() {
  if (hb_round_armed) return;
  hb_round_armed = true;
  after(opts.heartbeat_interval, [this] { heartbeat_round(); });
}

void KernelManager::Impl::heartbeat_round() {
  hb_round_armed = false;
  auto now = Clock::now();
  bool any = false;
  for (auto& [id, k] : io) {
    if (k->phase != KernelPhase::ready || !k->hb) continue;
    any = true;
    // Pinged in the last half interval (it became ready just now): its echo may be on its way,
    // so no miss is counted and no second ping sent; the next round has it.
    if (now - k->hb_sent_at < opts.heartbeat_interval / 2) continue;
    heartbeat_ping(*k);
  }
  if (any) heartbeat_arm();
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
  if (k.remote() && k.proc.lost() && k.phase == KernelPhase::ready) {
    // A remote kernel's link ended without its end: the network, or the SSH forwarding.  It is
    // unreachable, not dead, until link_timeout (or its scheduler says its job ended).
    link_lost(k, "its control link dropped");
    return;
  }
  std::string how = k.proc.describe_exit();
  auto id = k.kernel->id();
  switch (k.phase) {
    case KernelPhase::launching:
    case KernelPhase::restarting:
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
    case KernelPhase::ready: {
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
            if (!kk || kk->epoch != epoch || kk->phase != KernelPhase::ready) return;
            if (!sched.empty()) kk->kernel->update_placement({{"state", sched.substr(0, sched.find(' '))}});
            die(*kk, how + "; Slurm job " + job + (sched.empty() ? " ended" : ": " + sched));
          });
        });
        return;
      }
      die(k, how);
      return;
    }
    case KernelPhase::stopping:
      if (k.restart_requested && k.remote() && relaunched_in_place(k)) return;
      if (k.restart_requested) {
        k.phase = KernelPhase::restarting;
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
    case KernelPhase::dead:
      return;
  }
}

void KernelManager::Impl::die(KernelIo& k, const std::string& how) {
  const std::string id = k.kernel->id();
  k.link_down = false;
  if (k.tunnel.running()) k.tunnel.signal(SIGTERM);
  spdlog::error("kernel {}: died ({})", id, how);
  close_sockets(k);
  k.phase = KernelPhase::dead;
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
      k.phase = KernelPhase::restarting;
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
  k.phase = KernelPhase::stopping;
  ++k.epoch;
  if (restart && k.remote()) k.proc.request_relaunch();  // in the same allocation (docs/dev/remote-launchers.md)
  // The graceful close first (docs/dev/kernel-side.md): the kernel side stops the cell and the task that run
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
        if (!kk || kk->closing != sent || kk->phase != KernelPhase::stopping || !kk->sockets_open()) return;
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
    if (!kk || kk->epoch != epoch || kk->phase != KernelPhase::stopping) return;
    spdlog::info("kernel {}: no exit after shutdown_request; SIGTERM", id);
    kk->proc.signal_group(SIGTERM);
    after(opts.terminate_grace, [this, id, epoch] {
      KernelIo* k3 = find(id);
      if (!k3 || k3->epoch != epoch || k3->phase != KernelPhase::stopping) return;
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
  remove_ipc_sockets(k.conn);  // a kernel killed before its own cleanup leaves them
  release_ports(k);
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
  if (k.phase == KernelPhase::dead) {
    // jupyter_server's culler shuts dead kernels down at its next pass; so does kgate's.
    spdlog::info("kernel {}: culling the dead kernel ({})", id, k.kernel->model().reason);
    begin_stop(k, /*restart=*/false);  // not running: removed at once
    return true;
  }
  if (k.phase != KernelPhase::ready) return false;
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

}  // namespace kgate
