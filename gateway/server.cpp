// The daemon: owns the Asio context, the listener, the hub and the kernel manager.
#include "server.hpp"

#include <csignal>

#include <spdlog/spdlog.h>

#include "api.hpp"
#include "http_session.hpp"
#include "service.hpp"

namespace kgate::gw {

Server::Server(GatewayOptions opts)
    : opts_(std::move(opts)),
      hub_(ioc_, opts_),
      jobs_(opts_.records),
      waiters_(ioc_, opts_.max_waiters),
      sweep_timer_(ioc_),
      cull_timer_(ioc_),
      discovery_(DiscoveryOptions{LocatorEnv::from_process(), opts_.default_kernel, opts_.discovery.interpreters},
                 DiscoveryService::Timing{opts_.discovery.watch_interval, opts_.discovery.rescan_interval,
                                          opts_.discovery.probe_timeout}),
      acceptor_(ioc_),
      signals_(ioc_, SIGINT, SIGTERM) {
  if (opts_.runtime_dir.empty()) opts_.runtime_dir = jupyter_runtime_dir();
  if (opts_.root_dir.empty()) opts_.root_dir = std::filesystem::current_path();
  if (opts_.base_url.empty() || opts_.base_url.front() != '/') opts_.base_url = "/" + opts_.base_url;
  if (opts_.base_url.back() != '/') opts_.base_url += '/';
  ensure_private_dir(opts_.runtime_dir);
  // Records first: a client that sees a cell's idle finds the record already ended.
  manager_ = std::make_unique<KernelManager>(opts_.kernel, opts_.runtime_dir,
                                             std::vector<KernelObserver*>{&jobs_, &hub_});
  discovery_.start();  // a quick pass now; the full discovery runs on its own thread
  // A change in the records (on any thread) re-checks the waiting requests, once per burst.
  jobs_.set_on_change([this] {
    if (!poke_pending_.exchange(true))
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
  notify_ready(endpoint_, opts_.base_url);  // sd_notify READY=1; a no-op outside systemd
  ioc_.run();
}

void Server::stop() {
  net::post(ioc_, [this] { on_signal({}, 0); });
}

void Server::on_signal(beast::error_code ec, int sig) {
  if (ec || stopping_) return;
  stopping_ = true;
  notify_stopping(manager_->count());
  spdlog::info("{}: shutting down {} kernel(s)", sig ? strsignal(sig) : "stop", manager_->count());
  beast::error_code ignored;
  acceptor_.close(ignored);
  sweep_timer_.cancel();
  cull_timer_.cancel();
  manager_->shutdown_all();
  waiters_.cancel_all();
  hub_.close_all("kgate is shutting down");
  signals_.cancel();
  // Let the closes go out, then stop.
  auto timer = std::make_shared<net::steady_timer>(ioc_, std::chrono::milliseconds(200));
  timer->async_wait([this, timer](beast::error_code) { ioc_.stop(); });
}

void Server::sweep_jobs() {
  jobs_.sweep();
  sweep_timer_.expires_after(std::chrono::seconds(1));
  sweep_timer_.async_wait([this](beast::error_code ec) {
    if (!ec && !stopping_) sweep_jobs();
  });
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
  acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted) return;
      spdlog::warn("accept: {}", ec.message());
    } else {
      std::make_shared<HttpSession>(std::move(socket), *this)->run();
    }
    if (acceptor_.is_open()) do_accept();
  });
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

std::string Server::last_activity() const { return last_activity_; }

}  // namespace kgate::gw
