// The kernel runtime: the shared Kernel model and the public KernelManager facade.  Threading and
// the map of the other sources: kernel_impl.hpp.
#include "kernel_impl.hpp"

namespace kgate {

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
  k.phase = KernelPhase::launching;
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
      if (!m.table.enabled() || k.phase != KernelPhase::ready || !k.proc.supervised() || k.kernel->pooled() || k.handout) {
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
    const auto& tcp_specs = m.opts.tcp_kernelspecs;
    if (m.opts.transport == "ipc" && !k->request.launcher &&
        std::find(tcp_specs.begin(), tcp_specs.end(), kernel->spec().name) == tcp_specs.end()) {
      // Unix sockets in the 0700 runtime dir, "<ip>-<n>": named by the id's head, so the paths
      // stay short (sun_path holds 107 bytes) under a long runtime dir.
      k->conn.transport = "ipc";
      k->conn.ip = (m.runtime_dir / ((k->request.pooled ? "pool-" : "kernel-") + kernel->id().substr(0, 8) + "-ipc"))
                       .string();
    } else {
      k->conn.ip = "127.0.0.1";
    }
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
    if (k->phase != KernelPhase::ready || k->handout)
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
    if (k && k->phase == KernelPhase::ready && !k->kernel->pooled()) impl_->save_entry(*k);
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
    if (k->phase == KernelPhase::stopping && !k->restart_requested) return;  // already on its way
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
    if (k->phase == KernelPhase::stopping && !k->restart_requested) {
      done(StartResult{nullptr, "kernel is shutting down"});
      return;
    }
    k->start_waiters.push_back(std::move(done));
    if (k->phase == KernelPhase::stopping || k->phase == KernelPhase::restarting) return;  // joins it
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
    if (!k || k->phase != KernelPhase::ready) return done(std::nullopt);
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
      case KernelPhase::ready:
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
      case KernelPhase::launching:
      case KernelPhase::restarting:
        if (k->held.size() >= impl_->opts.max_held)
          impl_->refuse(*k, msg, "KernelStarting",
                        "kgate: " + std::to_string(impl_->opts.max_held) +
                            " messages are already waiting for this kernel to start");
        else
          k->held.push_back(std::move(msg));
        break;
      case KernelPhase::stopping:
        if (k->restart_requested) {
          if (k->held.size() >= impl_->opts.max_held)
            impl_->refuse(*k, msg, "KernelStarting", "kgate: too many messages held during restart");
          else
            k->held.push_back(std::move(msg));
        } else {
          impl_->refuse(*k, msg, "KernelShutdown", "kgate: the kernel is shutting down");
        }
        break;
      case KernelPhase::dead: {
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
