// The daemon: owns the Asio context, the listener, the hub and the kernel manager.
//
// Threads: the caller of run() is the one Asio thread (HTTP, websockets, hub, REST); the
// kernel manager runs the kernel I/O thread; libzmq runs its own I/O thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include <boost/asio/signal_set.hpp>

#include "ws/hub.hpp"
#include "api/jobs_api.hpp"
#include "kgate/discovery/discovery.hpp"
#include "kgate/records/jobs.hpp"
#include "kgate/jupyter/state_dir.hpp"
#include "http/listener.hpp"
#include "api/mcp_http.hpp"
#include "http/net.hpp"
#include "options.hpp"
#include "pool.hpp"
#include "sessions.hpp"

namespace kgate::gw {

class Server {
 public:
  explicit Server(GatewayOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and listens: on ip:port (unless options().tcp is off; TLS with certfile/keyfile) and on
  // the Unix socket when options().unix_socket.  Throws std::runtime_error with a clear message
  // on failure.  Returns the TCP endpoint (unspecified without TCP).
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
  bool tls() const { return tls_ != nullptr; }
  // The Unix socket's path ("" when there is none).
  const std::filesystem::path& unix_socket() const { return unix_.path(); }

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

  WarmPool& pool() { return *pool_; }
  McpHttp& mcp() { return *mcp_; }  // {base}mcp (Asio thread only)
  // The sessions API's sessions (Asio thread only).
  SessionStore& sessions() { return *sessions_; }

  // SIGHUP: `load` reads kgate.toml again with the command line's flags applied over it (main
  // provides it) and reload() takes on what can change in a running kgate: tokens, limits,
  // max_kernels, culling, the pool sizes (docs/kernels.md "Reloading").  A bad file changes nothing.
  void set_reloader(std::function<GatewayOptions()> load) { reloader_ = std::move(load); }
  void reload();  // Asio thread

  // max_kernels, on the Asio thread: a POST /api/kernels takes a slot before anything else
  // (nullopt), or gets the refusal to send with 503; the slot becomes the kernel's when its
  // start finished (admitted(id)) or is given back (admitted("")).
  std::optional<std::string> admit();
  void admitted(const std::string& id);
  // Client-chosen kernel ids (POST /api/kernels "kernel_id") whose start is not done: taken (on)
  // or given back; Asio thread.
  void reserve_kernel_id(const std::string& id, bool on);
  bool kernel_id_reserved(const std::string& id) const { return reserved_ids_.count(id) > 0; }

  const std::string& started() const { return started_; }
  double started_unix() const { return started_unix_; }  // seconds since the Unix epoch
  std::string last_activity() const;
  void touch() { last_activity_ = iso_now(); }

 private:
  void do_accept();  // starts the accept loop of each listener
  void accept_tcp();
  void accept_unix();
  void on_signal(beast::error_code ec, int sig);
  void arm_hup();
  void sweep_jobs();
  void arm_cull_timer();
  void cull_kernels();
  // Stops the auto kernels whose conversation's agent is gone for auto_kernel_grace (each second).
  void stop_orphaned_auto_kernels();  // every [culling] cull_interval, on the Asio thread
  // Logs default_kernel_warning (api.hpp) once the catalog is known, `when` before it.
  void warn_default_kernel(const std::string& default_kernel, const char* when);

  GatewayOptions opts_;
  // Taken first, before anything else starts: a second kgate on the same state directory
  // stops here, before it touches the runtime dir or a kernel (docs/dev/kernel-lifecycle.md).
  StateDir state_;
  RecordLog records_;  // the job records on disk (<state>/records), fed by jobs_
  net::io_context ioc_{1};
  Hub hub_;  // after ioc_, before manager_: the manager's thread posts into both
  JobStore jobs_;  // before manager_: the I/O thread feeds it
  Waiters waiters_;
  net::steady_timer sweep_timer_;
  net::steady_timer cull_timer_;
  std::atomic<bool> poke_pending_{false};
  std::unique_ptr<KernelManager> manager_;
  DiscoveryService discovery_;  // after ioc_: its callbacks post into it
  std::unique_ptr<WarmPool> pool_;
  std::unique_ptr<SessionStore> sessions_;
  std::unique_ptr<McpHttp> mcp_;  // after the kernels are re-adopted: it drops those of the others
  std::function<GatewayOptions()> reloader_;
  std::size_t starts_pending_ = 0;             // admitted POSTs whose start is not done
  std::vector<std::string> admitted_kernels_;  // kernels those POSTs made (pruned in admit)
  std::set<std::string> reserved_ids_;         // reserve_kernel_id
  std::shared_ptr<const Catalog> specs_cat_;  // the catalog specs_body_ was made from
  std::string specs_body_;
  std::shared_ptr<net::ssl::context> tls_;  // before the acceptors: every TLS stream points at it
  tcp::acceptor acceptor_;
  UnixListener unix_;
  net::signal_set signals_;
  net::signal_set hup_;  // SIGHUP: reload()
  tcp::endpoint endpoint_;
  std::string started_ = iso_now();
  double started_unix_ =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string last_activity_ = started_;
  bool stopping_ = false;
};

// "token kgate's own (STATE/token)", "token required" or "token OFF": for the listening lines.
std::string token_summary(const GatewayOptions& o);
// Logs where the observe page is, for a person to open: with ?token= for kgate's own token
// (as jupyter_server prints its URL), except under journald, where the line names the token's
// file instead (the journal is kept, and read by more than the owner's terminal).
void log_observe_url(const GatewayOptions& o, const std::string& base);

}  // namespace kgate::gw
