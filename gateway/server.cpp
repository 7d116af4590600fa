// The daemon: owns the Asio context, the listener, the hub and the kernel manager.
#include "server.hpp"

#include <unistd.h>

#include <csignal>
#include <set>

#include <fmt/ranges.h>

#include <spdlog/spdlog.h>

#include "api/api.hpp"
#include "config.hpp"
#include "http/http_session.hpp"
#include "routes.hpp"
#include "systemd.hpp"
#include "http/stream.hpp"

namespace kgate::gw {

namespace {
std::filesystem::path resolve_state_dir(const std::filesystem::path& configured) {
  return configured.empty() ? default_state_dir() : std::filesystem::absolute(configured);
}
}  // namespace

Server::Server(GatewayOptions opts)
    : opts_(std::move(opts)),
      state_(StateDir::open(resolve_state_dir(opts_.state_dir))),
      records_(RecordLog::Options{opts_.records.enabled && opts_.records.persist ? state_.path() / "records"
                                                                                  : std::filesystem::path{},
                                  opts_.records.sync_interval}),
      hub_(ioc_, opts_),
      jobs_(opts_.records, state_.host_session()),
      waiters_(ioc_, opts_.max_waiters),
      sweep_timer_(ioc_),
      cull_timer_(ioc_),
      discovery_(DiscoveryOptions{LocatorEnv::from_process(), opts_.default_kernel, opts_.discovery.interpreters},
                 DiscoveryService::Timing{opts_.discovery.watch_interval, opts_.discovery.rescan_interval,
                                          opts_.discovery.probe_timeout}),
      acceptor_(ioc_),
      unix_(ioc_),
      http_host_{opts_, unix_.path(), gate_,
                 [this](Request& req, const RequestContext& ctx, Respond respond, std::function<Stream()> take_stream,
                        RespondInParts respond_in_parts) {
                   if (!take_stream) touch();  // a websocket's activity is its kernel's
                   route(*this, req, ctx, std::move(respond), std::move(take_stream), std::move(respond_in_parts));
                 }},
      accept_retry_tcp_(ioc_),
      accept_retry_unix_(ioc_),
      signals_(ioc_, SIGINT, SIGTERM),
      hup_(ioc_, SIGHUP) {
  opts_.state_dir = state_.path();
  if (opts_.token_source == TokenSource::automatic) {
    bool created = false;
    unsigned replaced_mode = 0;
    opts_.token = state_.token(&created, &replaced_mode);
    if (created) spdlog::info("made kgate's token, in {}", (opts_.state_dir / "token").string());
    if (replaced_mode)
      spdlog::warn("{} was mode {:04o}, readable by other users: kgate made a new token in its place (0600); "
                   "the owner's tools read the new one from there",
                   (opts_.state_dir / "token").string(), replaced_mode);
  }
  if (state_.tightened())
    spdlog::warn("state directory {} was open to other users; it is mode 0700 now", state_.path().string());
  if (opts_.runtime_dir.empty()) opts_.runtime_dir = jupyter_runtime_dir();
  if (opts_.root_dir.empty()) opts_.root_dir = std::filesystem::current_path();
  if (opts_.base_url.empty() || opts_.base_url.front() != '/') opts_.base_url = "/" + opts_.base_url;
  if (opts_.base_url.back() != '/') opts_.base_url += '/';
  // Kernels start in other cwds: a relative dir would name another place for each of them.
  opts_.runtime_dir = std::filesystem::absolute(opts_.runtime_dir).lexically_normal();
  ensure_private_dir(opts_.runtime_dir);
  if (opts_.kernel.transport == "tcp")
    spdlog::warn("[kernel] transport = \"tcp\": local kernels listen on 127.0.0.1 ports, and every local user "
                 "can read their output (iopub needs no key) and reach their other sockets");
  else if (!opts_.kernel.tcp_kernelspecs.empty())
    spdlog::warn("[kernel] tcp_kernelspecs: kernels of {} listen on 127.0.0.1 ports, and every local user can "
                 "read their output (iopub needs no key) and reach their other sockets",
                 fmt::join(opts_.kernel.tcp_kernelspecs, ", "));
  // Kernels an earlier kgate left running (docs/dev/readoption.md): their files are not stale.
  opts_.kernel.table_dir = opts_.state_dir / "kernels";
  opts_.kernel.host_session = jobs_.session();  // the kernels' host: kgate's cells carry it (docs/dev/kernel-side.md)
  opts_.kernel.remote_dir = opts_.state_dir / "remote";
  KernelTable::Loaded table = KernelTable(opts_.kernel.table_dir).load();
  for (const auto& p : table.problems) spdlog::warn("kernel table: {}", p);
  std::set<std::string> keep;
  for (const auto& e : table.entries) keep.insert(e.id);
  // A kgate that was killed (kill -9, a crash, the OOM killer) left its connection files.
  if (auto stale = remove_stale_connection_files(opts_.runtime_dir, keep); !stale.empty())
    spdlog::info("removed {} stale connection file{} of a kgate that is gone, in {}: {}", stale.size(),
                 stale.size() == 1 ? "" : "s", opts_.runtime_dir.string(), fmt::join(stale, ", "));
  // Their records, read back before the kernels are listened to again (docs/dev/readoption.md).
  if (records_.enabled()) {
    jobs_.persist_to(&records_);
    jobs_.keep_outputs_in(opts_.state_dir / "outputs");  // big output values as files (0600)
  }
  for (const auto& line : jobs_.restore(records_.load(keep))) spdlog::info("{}", line);
  if (records_.enabled()) jobs_.collect_output_files();
  // Records first: a client that sees a cell's idle finds the record already ended.
  manager_ = std::make_unique<KernelManager>(opts_.kernel, opts_.runtime_dir,
                                             std::vector<KernelObserver*>{&jobs_, &hub_});
  if (!table.entries.empty()) {
    for (const auto& line : manager_->adopt(std::move(table.entries))) spdlog::info("{}", line);
    for (const auto& k : manager_->list()) {  // listed dead: it ended while no kgate was running
      if (auto m = k->model(); m.execution_state == "dead") jobs_.lost_while_away(m.id, m.reason);
      // An auto kernel's conversation: gone unless its kgate-mcp comes back (its link reconnects).
      if (auto agent = k->conversation(); !agent.empty()) jobs_.expect_agent(agent);
    }
  }
  // The sessions of the kernels re-adopted come back; the others' end with their kernels.
  sessions_ = std::make_unique<SessionStore>(state_.path() / "sessions.json");
  if (auto n = sessions_->prune([this](const std::string& id) { return manager_->get(id) != nullptr; }); n)
    spdlog::info("{} session{} ended with kernels that did not outlive the kgate before", n, n == 1 ? "" : "s");
  mcp_ = std::make_unique<McpHttp>(*this);
  discovery_.start();  // a quick pass now; the full discovery runs on its own thread
  pool_ = std::make_unique<WarmPool>(*this);
  // A change in the records (on any thread) re-checks the waiting requests, once per burst; with
  // none waiting, the Asio thread is not woken for it (a websocket client's cell changes its
  // record twice).
  jobs_.set_on_change([this] {
    if (waiters_.any() && !poke_pending_.exchange(true))
      net::post(ioc_, [this] {
        poke_pending_ = false;
        waiters_.poke();
      });
  });
}

Server::~Server() {
  discovery_.stop();
  manager_.reset();  // stops kernels and the I/O thread before the hub goes
}

tcp::endpoint Server::listen() {
  if (!opts_.tcp && !opts_.unix_socket)
    throw std::runtime_error("TCP is off (--no-tcp or tcp = false) and there is no Unix socket (--unix or "
                             "unix_socket in kgate.toml): there would be nothing to listen on");
  if (opts_.certfile.empty() != opts_.keyfile.empty())
    throw std::runtime_error(std::string("TLS needs both a certfile and a keyfile; only the ") +
                             (opts_.certfile.empty() ? "keyfile" : "certfile") + " was given");
  if (!opts_.certfile.empty()) {
    if (!opts_.tcp) throw std::runtime_error("certfile/keyfile are for the TCP listener, and TCP is off (--no-tcp)");
    tls_ = server_tls_context(opts_.certfile, opts_.keyfile);
  }
  if (opts_.unix_socket)
    unix_.listen(opts_.unix_path.empty() ? default_unix_socket_path(opts_.runtime_dir) : opts_.unix_path);
  if (!opts_.tcp) return endpoint_;
  beast::error_code ec;
  auto addr = net::ip::make_address(opts_.ip == "localhost" ? "127.0.0.1" : opts_.ip, ec);
  if (ec) throw std::runtime_error("invalid --ip " + opts_.ip + ": " + ec.message());
  tcp::endpoint ep(addr, static_cast<unsigned short>(opts_.port));
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    throw std::runtime_error("cannot listen on " + opts_.ip + ":" + std::to_string(opts_.port) +
                             ": " + ec.message());
  endpoint_ = acceptor_.local_endpoint();
  return endpoint_;
}

void Server::run() {
  signals_.async_wait(beast::bind_front_handler(&Server::on_signal, this));
  do_accept();
  sweep_jobs();
  arm_cull_timer();
  pool_->configure();  // the first warm kernels start once the catalog is known
  warn_default_kernel(opts_.default_kernel, "");
  arm_hup();
  notify_ready(endpoint_, opts_.base_url);  // sd_notify READY=1; a no-op outside systemd
  // The last line of defence: a handler that throws is a bug (each HTTP request has its own
  // catch, HttpSession::on_read), but it must not stop the daemon and every kernel with it.
  for (;;) {
    try {
      ioc_.run();
      return;
    } catch (const std::exception& e) {
      spdlog::error("internal error (a bug, please report it): {}; kgate goes on", e.what());
    }
  }
}

void Server::stop() {
  net::post(ioc_, [this] { on_signal({}, 0); });
}

void Server::on_signal(beast::error_code ec, int sig) {
  if (ec || stopping_) return;
  stopping_ = true;
  const std::size_t pooled = pool_->stop();  // no refill from here on
  // SIGTERM (systemctl stop/restart, kill, `kgate stop`): the kernels stay for the next kgate.
  // SIGINT (^C, `kgate stop --kernels`) and stop(): they stop with kgate (docs/dev/readoption.md).
  const std::size_t left = sig == SIGTERM ? manager_->detach_all() : 0;
  const std::size_t kernels = manager_->count();
  notify_stopping(kernels);
  beast::error_code ignored;
  acceptor_.close(ignored);
  unix_.close();  // and its file
  sweep_timer_.cancel();
  cull_timer_.cancel();
  if (left > 0)
    spdlog::info("{}: left {} kernel(s) running for the next kgate on {} (each stops itself after {} s without one)",
                 strsignal(sig), left, opts_.state_dir.string(),
                 std::chrono::duration_cast<std::chrono::seconds>(opts_.kernel.orphan_timeout).count());
  spdlog::info("{}: shutting down {} kernel(s) and {} warm-pool kernel(s)", sig ? strsignal(sig) : "stop", kernels,
               pooled);
  hup_.cancel();
  const auto began = std::chrono::steady_clock::now();
  manager_->shutdown_all();
  spdlog::info("stopped {} kernel(s) in {} ms", kernels + pooled,
               std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - began).count());
  waiters_.cancel_all();
  mcp_->close_all();
  hub_.close_all("kgate is shutting down");
  signals_.cancel();
  // Let the closes go out, then stop.
  auto timer = std::make_shared<net::steady_timer>(ioc_, std::chrono::milliseconds(200));
  timer->async_wait([this, timer](beast::error_code) { ioc_.stop(); });
}

void Server::sweep_jobs() {
  for (const auto& [job, agent] : jobs_.sweep()) interrupt_unanswered(*this, job, agent);
  stop_orphaned_auto_kernels();
  sweep_timer_.expires_after(std::chrono::seconds(1));
  sweep_timer_.async_wait([this](beast::error_code ec) {
    if (!ec && !stopping_) sweep_jobs();
  });
}

const std::string& Server::kernelspecs_body(const std::shared_ptr<const Catalog>& cat) {
  if (specs_cat_ != cat) {
    specs_body_ = kernelspecs_body_of(*this, *cat);
    specs_cat_ = cat;
  }
  return specs_body_;
}

std::optional<Server::CullTimeout> Server::cull_timeout(const Kernel& k) const {
  using std::chrono::milliseconds;
  auto pick = [](milliseconds t, const char* setting) -> std::optional<CullTimeout> {
    if (t.count() <= 0) return std::nullopt;
    return CullTimeout{t, setting};
  };
  if (const auto& own = k.cull_idle_timeout()) return pick(*own, "kgate_cull_idle_timeout");
  if (auto it = k.spec().metadata.find("cull_idle_timeout");
      it != k.spec().metadata.end() && it->is_number() && it->get<double>() >= 0 && it->get<double>() < 1e9)
    return pick(milliseconds(static_cast<std::int64_t>(it->get<double>() * 1000)), "kernelspec cull_idle_timeout");
  return pick(opts_.culling.idle_timeout, "cull_idle_timeout");
}

void Server::arm_cull_timer() {
  // Cheap when nothing is culled (one pass over the kernel list), so it always runs: a kernel
  // may carry its own timeout with the gateway's off.
  cull_timer_.expires_after(opts_.culling.interval);
  cull_timer_.async_wait([this](beast::error_code ec) {
    if (!ec && !stopping_) cull_kernels();
  });
}

void Server::stop_orphaned_auto_kernels() {
  const auto grace = opts_.culling.auto_kernel_grace;
  if (grace.count() <= 0) return;
  for (const auto& k : manager_->list()) {
    const std::string agent = k->conversation();
    if (agent.empty() || k->connections() > 0) continue;
    auto gone = jobs_.agent_gone(agent);
    if (!gone || gone->for_ < grace) continue;
    CullRequest req;
    req.orphan = true;
    req.setting = "stopped: it was the auto kernel of a conversation that ended without stopping it (" +
                  (gone->label.empty() ? agent : gone->label) + ", gone " +
                  std::to_string(gone->for_.count() / 1000) + " s; auto_kernel_grace_seconds = " +
                  std::to_string(grace.count()) + ")";
    manager_->cull(k->id(), std::move(req), {});  // a stop under way is not started again
  }
}

void Server::interrupt_as_agent(const std::string& job, const std::string& agent, const std::string& why) {
  interrupt_unanswered(*this, job, agent, why);
}

void Server::cull_kernels() {
  const auto& c = opts_.culling;
  for (const auto& k : manager_->list()) {
    auto t = cull_timeout(*k);
    if (!t) continue;
    // jupyter_server's test, checked again on kgate-io where activity is recorded.
    std::string state = k->execution_state();
    if (state != "dead") {
      if (state == "starting" || state == "restarting" || k->idle_for() <= t->timeout) continue;
      if (!c.busy && state == "busy") continue;
      if (!c.connected && k->connections() > 0) continue;
    }
    manager_->cull(k->id(), CullRequest{t->timeout, c.busy, c.connected, t->setting}, {});
  }
  arm_cull_timer();
}

void Server::do_accept() {
  if (acceptor_.is_open()) accept_tcp();
  if (unix_.is_open()) accept_unix();
}

void Server::accept_tcp() {
  acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted) return;
    std::chrono::milliseconds pause{0};
    if (ec) {
      pause = on_accept_error(ec, "");
    } else {
      Stream stream = tls_ ? Stream(std::in_place_type<TlsStream>, std::move(socket), *tls_)
                           : Stream(std::in_place_type<TcpStream>, std::move(socket));
      if (!HttpSession::accept(std::move(stream), http_host_)) note_refused_connection();
    }
    if (!acceptor_.is_open()) return;
    if (pause.count() == 0) return accept_tcp();
    accept_retry_tcp_.expires_after(pause);
    accept_retry_tcp_.async_wait([this](beast::error_code e) {
      if (!e && acceptor_.is_open()) accept_tcp();
    });
  });
}

void Server::accept_unix() {
  unix_.acceptor().async_accept(net::make_strand(ioc_), [this](beast::error_code ec, local::socket socket) {
    if (ec == net::error::operation_aborted) return;
    std::chrono::milliseconds pause{0};
    if (ec) {
      pause = on_accept_error(ec, " on unix:" + unix_.path().string());
    } else {
      // The session checks the peer's uid (and answers a refused one with a 403).
      if (!HttpSession::accept(Stream(std::in_place_type<UnixStream>, std::move(socket)), http_host_))
        note_refused_connection();
    }
    if (!unix_.is_open()) return;
    if (pause.count() == 0) return accept_unix();
    accept_retry_unix_.expires_after(pause);
    accept_retry_unix_.async_wait([this](beast::error_code e) {
      if (!e && unix_.is_open()) accept_unix();
    });
  });
}

std::chrono::milliseconds Server::on_accept_error(const beast::error_code& ec, const std::string& where) {
  // Out of descriptors: the connection waits in the listen queue, and accept would fail again at
  // once, in a loop. The oldest unauthenticated connection gives its descriptor back and accept
  // goes on; with none to close, it pauses.
  const int e = ec.value();
  const bool no_fds = ec.category() == boost::system::system_category() &&
                      (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM);
  const bool evicted = no_fds && gate_.evict_oldest();
  ++accept_unlogged_;
  const auto now = std::chrono::steady_clock::now();
  if (now - accept_logged_ >= std::chrono::seconds(1)) {
    spdlog::warn("accept{}: {} ({} time{} since the last line; {} connections open, {} not yet authenticated){}", where,
                 ec.message(), accept_unlogged_, accept_unlogged_ == 1 ? "" : "s", gate_.open(),
                 gate_.unauthenticated(),
                 no_fds ? evicted ? "; closed the oldest unauthenticated connection"
                                  : "; every descriptor is held by authenticated connections and kernels"
                        : "");
    accept_logged_ = now;
    accept_unlogged_ = 0;
  }
  if (evicted) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(no_fds ? 100 : 10);
}

void Server::note_refused_connection() {
  ++accept_unlogged_;
  const auto now = std::chrono::steady_clock::now();
  if (now - accept_logged_ < std::chrono::seconds(1)) return;
  spdlog::warn("refused a connection: {} are open, the limit (max_connections), all past the token check "
               "({} refusals and accept errors since the last line)",
               gate_.open(), accept_unlogged_);
  accept_logged_ = now;
  accept_unlogged_ = 0;
}

void Server::with_catalog(std::function<void(std::shared_ptr<const Catalog>)> fn, const std::string& name) {
  auto cat = discovery_.full_snapshot();
  if (cat && (name.empty() || cat->find(name))) return fn(std::move(cat));
  // The first discovery is still running, or the name is not in the catalog yet: wait for a
  // (new) discovery, within the bound.
  when_catalog(cat ? discovery_.refresh() : DiscoveryService::kFirstFull, opts_.discovery.request_wait, std::move(fn));
}

void Server::when_catalog(std::uint64_t gen, std::chrono::milliseconds bound,
                          std::function<void(std::shared_ptr<const Catalog>)> fn) {
  struct Pending {
    explicit Pending(net::io_context& io) : timer(io) {}
    net::steady_timer timer;
    std::function<void(std::shared_ptr<const Catalog>)> fn;
    bool done = false;
  };
  auto p = std::make_shared<Pending>(ioc_);
  p->fn = std::move(fn);
  auto finish = [this, p] {  // on the Asio thread, whichever comes first: the catalog or the bound
    if (p->done) return;
    p->done = true;
    p->timer.cancel();
    p->fn(discovery_.snapshot());
  };
  p->timer.expires_after(bound);
  p->timer.async_wait([finish](beast::error_code ec) {
    if (ec != net::error::operation_aborted) finish();
  });
  discovery_.when_generation(gen, [this, finish] { net::post(ioc_, finish); });
}

void Server::arm_hup() {
  hup_.async_wait([this](beast::error_code ec, int) {
    if (ec || stopping_) return;
    reload();
    arm_hup();
  });
}

void Server::reload() {
  if (!reloader_) {
    spdlog::info("SIGHUP: nothing to reload (no config loader)");
    return;
  }
  GatewayOptions n;
  try {
    n = reloader_();
  } catch (const std::exception& e) {
    spdlog::error("SIGHUP: {}; keeping the running settings", e.what());
    return;
  }
  if (n.token_source == TokenSource::automatic) n.token = state_.token();
  GatewayOptions served = n;  // ip and tcp are read at start only: check the ones kgate serves
  served.ip = opts_.ip;
  served.tcp = opts_.tcp;
  if (auto why = unsafe_settings(served); !why.empty()) {
    spdlog::error("SIGHUP: {}; keeping the running settings", why);
    return;
  }
  std::vector<std::string> restart;  // read once at start: named, not changed
  auto needs_restart = [&restart](bool differs, const char* key) {
    if (differs) restart.push_back(key);
  };
  needs_restart(n.ip != opts_.ip, "ip");
  needs_restart(n.port != opts_.port, "port");
  std::string base = n.base_url;  // normalised as the constructor does
  if (base.empty() || base.front() != '/') base = "/" + base;
  if (base.back() != '/') base += '/';
  needs_restart(base != opts_.base_url, "base_url");
  needs_restart(!n.runtime_dir.empty() && n.runtime_dir != opts_.runtime_dir, "runtime_dir");
  needs_restart(resolve_state_dir(n.state_dir) != opts_.state_dir, "state_dir");
  needs_restart(n.default_kernel != opts_.default_kernel, "default_kernel");
  needs_restart(n.max_waiters != opts_.max_waiters, "records.max_waiters");
  needs_restart(n.kernel.ready_timeout != opts_.kernel.ready_timeout ||
                    n.kernel.close_grace != opts_.kernel.close_grace ||
                    n.kernel.shutdown_grace != opts_.kernel.shutdown_grace ||
                    n.kernel.terminate_grace != opts_.kernel.terminate_grace ||
                    n.kernel.heartbeat_interval != opts_.kernel.heartbeat_interval ||
                    n.kernel.heartbeat_misses != opts_.kernel.heartbeat_misses ||
                    n.kernel.iopub_batch != opts_.kernel.iopub_batch ||
                    n.kernel.launch_attempts != opts_.kernel.launch_attempts ||
                    n.kernel.transport != opts_.kernel.transport ||
                    n.kernel.tcp_kernelspecs != opts_.kernel.tcp_kernelspecs ||
                    n.kernel.max_pending != opts_.kernel.max_pending || n.kernel.max_held != opts_.kernel.max_held ||
                    n.kernel.max_message_bytes != opts_.kernel.max_message_bytes ||
                    n.kernel.orphan_timeout != opts_.kernel.orphan_timeout,
                "[kernel] and the kernel limits");
  needs_restart(n.records.enabled != opts_.records.enabled || n.records.max_jobs != opts_.records.max_jobs ||
                    n.records.job_output_bytes != opts_.records.job_output_bytes ||
                    n.records.job_code_bytes != opts_.records.job_code_bytes ||
                    n.records.budget_bytes != opts_.records.budget_bytes ||
                    n.records.max_unseen_jobs != opts_.records.max_unseen_jobs ||
                    n.records.claim_grace != opts_.records.claim_grace ||
                    n.records.reply_grace != opts_.records.reply_grace ||
                    n.records.persist != opts_.records.persist ||
                    n.records.sync_interval != opts_.records.sync_interval ||
                    n.records.outputs.output_bytes != opts_.records.outputs.output_bytes ||
                    n.records.outputs.cell_bytes != opts_.records.outputs.cell_bytes ||
                    n.records.outputs.kernel_disk_bytes != opts_.records.outputs.kernel_disk_bytes,
                "[records]");
  needs_restart(n.discovery.interpreters != opts_.discovery.interpreters ||
                    n.discovery.watch_interval != opts_.discovery.watch_interval ||
                    n.discovery.rescan_interval != opts_.discovery.rescan_interval ||
                    n.discovery.probe_timeout != opts_.discovery.probe_timeout,
                "[discovery]");
  bool token_changed = n.token != opts_.token;
  opts_.token = std::move(n.token);
  opts_.token_source = n.token_source;
  opts_.allow_origins = std::move(n.allow_origins);
  opts_.allow_hosts = std::move(n.allow_hosts);
  opts_.env_policy = n.env_policy;
  opts_.env_allow = std::move(n.env_allow);
  opts_.max_body_bytes = n.max_body_bytes;
  opts_.max_header_bytes = n.max_header_bytes;
  opts_.max_connections = n.max_connections;
  opts_.max_unauthenticated_connections = n.max_unauthenticated_connections;
  gate_.set_limits(opts_.max_connections, opts_.max_unauthenticated_connections);
  opts_.max_ws_message_bytes = n.max_ws_message_bytes;  // for websockets opened from now on
  opts_.client_queue_bytes = n.client_queue_bytes;
  opts_.client_queue_messages = n.client_queue_messages;
  opts_.replay_bytes = n.replay_bytes;
  opts_.replay_messages = n.replay_messages;
  opts_.replay_ttl = n.replay_ttl;
  opts_.sessionless_window = n.sessionless_window;
  opts_.max_detached_sessions = n.max_detached_sessions;
  opts_.max_kernels = n.max_kernels;
  opts_.discovery.request_wait = n.discovery.request_wait;
  bool cull_changed = n.culling.interval != opts_.culling.interval;
  opts_.culling = n.culling;
  if (cull_changed) {
    cull_timer_.cancel();  // its handler sees operation_aborted and does not re-arm
    arm_cull_timer();
  }
  opts_.pool = std::move(n.pool);
  pool_->configure();
  spdlog::info("SIGHUP: settings reloaded ({}{}, max_kernels {}, pool size {})",
               token_summary(opts_), token_changed ? ", changed" : "",
               opts_.max_kernels, opts_.pool.size);
  for (const auto& key : restart) spdlog::warn("SIGHUP: {} changed; it takes a restart of kgate", key);
  warn_default_kernel(n.default_kernel, "SIGHUP: ");
}

std::optional<std::string> Server::admit() {
  const std::size_t max = opts_.max_kernels;
  if (max == 0) {
    ++starts_pending_;
    return std::nullopt;
  }
  // Kernels that were deleted, culled or died no longer take a slot.
  std::erase_if(admitted_kernels_, [this](const std::string& id) {
    auto k = manager_->get(id);
    return !k || k->execution_state() == "dead";
  });
  std::size_t running = admitted_kernels_.size();
  if (running + starts_pending_ < max) {
    ++starts_pending_;
    return std::nullopt;
  }
  return "kgate runs its maximum of " + std::to_string(max) + " kernels (max_kernels: " + std::to_string(running) +
         " running, " + std::to_string(starts_pending_) +
         " starting); shut one down (DELETE /api/kernels/{id}) or raise max_kernels in kgate.toml";
}

void Server::admitted(const std::string& id) {
  if (starts_pending_ > 0) --starts_pending_;
  if (!id.empty()) admitted_kernels_.push_back(id);
}

void Server::reserve_kernel_id(const std::string& id, bool on) {
  if (on) reserved_ids_.insert(id);
  else reserved_ids_.erase(id);
}

void Server::warn_default_kernel(const std::string& default_kernel, const char* when) {
  // Once the full discovery is done: a first quick pass does not know every kernelspec yet.
  with_catalog([default_kernel, when](std::shared_ptr<const Catalog> cat) {
    if (!cat) return;
    if (auto w = default_kernel_warning(*cat, default_kernel); !w.empty()) spdlog::warn("{}{}", when, w);
  }, default_kernel);
}

std::string Server::last_activity() const { return last_activity_; }

std::string token_summary(const GatewayOptions& o) {
  switch (o.token_source) {
    case TokenSource::automatic: return "token kgate's own, in " + (o.state_dir / "token").string();
    case TokenSource::given: return "token required";
    case TokenSource::none: break;
  }
  return "token OFF";
}

void log_observe_url(const GatewayOptions& o, const std::string& base) {
  const std::string url = base + "observe";
  switch (o.token_source) {
    case TokenSource::automatic:
      if (stderr_is_journal())
        spdlog::info("observe page: {}?token=<the token in {}>", url, (o.state_dir / "token").string());
      else
        spdlog::info("observe page: {}?token={}", url, o.token);
      return;
    case TokenSource::given:
      spdlog::info("observe page: {}?token=<your token>", url);
      return;
    case TokenSource::none:
      break;
  }
  spdlog::info("observe page: {}", url);
  spdlog::warn("serving without a token (--no-token or token = \"\"): every local user of this machine can "
               "run code as uid {} through it; the Unix socket alone checks who connects", ::geteuid());
}

}  // namespace kgate::gw
