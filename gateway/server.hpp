// The daemon: owns the Asio context, the listener, the hub and the kernel manager.
//
// Threads: the caller of run() is the one Asio thread (HTTP, websockets, hub, REST); the
// kernel manager runs the kernel I/O thread; libzmq runs its own I/O thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "hub.hpp"
#include "jobs_api.hpp"
#include "kgate/discovery.hpp"
#include "kgate/jobs.hpp"
#include "net.hpp"
#include "options.hpp"

namespace kgate::gw {

class Server {
 public:
  explicit Server(GatewayOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and listens.  Throws std::runtime_error with a clear message on failure.
  tcp::endpoint listen();
  // Serves until SIGINT/SIGTERM or stop(), then shuts every kernel down.
  void run();
  // Thread-safe.
  void stop();

  const GatewayOptions& options() const { return opts_; }
  net::io_context& ioc() { return ioc_; }
  Hub& hub() { return hub_; }
  KernelManager& manager() { return *manager_; }
  JobStore& jobs() { return jobs_; }
  Waiters& waiters() { return waiters_; }
  tcp::endpoint endpoint() const { return endpoint_; }

  // The kernel catalog (kernelspecs and Python environments, kgate/discovery.hpp). Calls `fn`
  // on the Asio thread with the newest catalog: at once when the first full discovery is done,
  // else when it is, or after options().discovery.request_wait with what is known by then.
  // With `name`: a catalog without that entry is not taken as final; a rediscovery runs first
  // (bounded the same way), so a kernelspec installed a moment ago is found.
  void with_catalog(std::function<void(std::shared_ptr<const Catalog>)> fn, const std::string& name = "");
  // Calls `fn` on the Asio thread with the newest catalog once discovery generation `gen` is out
  // (at once if it is), or after `bound` with what there is by then.
  void when_catalog(std::uint64_t gen, std::chrono::milliseconds bound,
                    std::function<void(std::shared_ptr<const Catalog>)> fn);
  DiscoveryService& discovery() { return discovery_; }
  // GET /api/kernelspecs's body for `cat` (cached per catalog; Asio thread only).
  const std::string& kernelspecs_body(const std::shared_ptr<const Catalog>& cat);

  // The idle timeout that applies to kernel `k`: its POST's "kgate_cull_idle_timeout", else its
  // kernelspec's metadata.cull_idle_timeout, else [culling] cull_idle_timeout; `setting` names
  // which.  nullopt: it is never culled for idleness (off, or 0).  Any thread.
  struct CullTimeout {
    std::chrono::milliseconds timeout;
    std::string setting;
  };
  std::optional<CullTimeout> cull_timeout(const Kernel& k) const;

  const std::string& started() const { return started_; }
  std::string last_activity() const;
  void touch() { last_activity_ = iso_now(); }

 private:
  void do_accept();
  void on_signal(beast::error_code ec, int sig);
  void sweep_jobs();
  void arm_cull_timer();
  void cull_kernels();  // every [culling] cull_interval, on the Asio thread

  GatewayOptions opts_;
  net::io_context ioc_{1};
  Hub hub_;  // after ioc_, before manager_: the manager's thread posts into both
  JobStore jobs_;  // before manager_: the I/O thread feeds it
  Waiters waiters_;
  net::steady_timer sweep_timer_;
  net::steady_timer cull_timer_;
  std::atomic<bool> poke_pending_{false};
  std::unique_ptr<KernelManager> manager_;
  DiscoveryService discovery_;  // after ioc_: its callbacks post into it
  std::shared_ptr<const Catalog> specs_cat_;  // the catalog specs_body_ was made from
  std::string specs_body_;
  tcp::acceptor acceptor_;
  net::signal_set signals_;
  tcp::endpoint endpoint_;
  std::string started_ = iso_now();
  std::string last_activity_ = started_;
  bool stopping_ = false;
};

}  // namespace kgate::gw
