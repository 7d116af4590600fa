// The kernel runtime: supervisor links, and the re-adoption of kernels an earlier kgate left (docs/dev/readoption.md, docs/dev/readoption.md).
#include "kernel_impl.hpp"

namespace kgate {

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
  if (!k || k->epoch != epoch || !k->link_down || k->link_out || k->phase != KernelPhase::ready) return;
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
  k.stall_deadline = Clock::now() + opts.ready_timeout / 3;  // a warning then: no relaunch (another job)
  k.stall_warned = false;
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
  k.phase = KernelPhase::restarting;
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
      if (hello.impostor || hello.no_answer) {  // never adopted, so never signalled
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
      if (k->conn.transport == "tcp")
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
        ref.phase = KernelPhase::dead;
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

}  // namespace kgate
