// The daemon: owns the Asio context, the listeners, the hub, the kernel manager and every other
// service, and hands the handlers those services (services.hpp), never itself.
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

#include "kgate/discovery/discovery.hpp"
#include "kgate/jupyter/state_dir.hpp"
#include "kgate/records/jobs.hpp"
#include "api/jobs_api.hpp"
#include "api/mcp_http.hpp"
#include "http/http_session.hpp"
#include "http/listener.hpp"
#include "http/net.hpp"
#include "options.hpp"
#include "pool.hpp"
#include "services.hpp"
#include "sessions.hpp"
#include "ws/hub.hpp"

namespace kgate::gw {

class Server final : public Services {
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

  // ---- Services (services.hpp says what each is) ----
  const GatewayOptions& options() const override { return opts_; }
  net::io_context& ioc() override { return ioc_; }
  Hub& hub() override { return hub_; }
  KernelManager& manager() override { return *manager_; }
  JobStore& jobs() override { return jobs_; }
  Waiters& waiters() override { return waiters_; }
  WarmPool& pool() override { return *pool_; }
  SessionStore& sessions() override { return *sessions_; }
  McpHttp& mcp() override { return *mcp_; }
  DiscoveryService& discovery() override { return discovery_; }
  void with_catalog(std::function<void(std::shared_ptr<const Catalog>)> fn, const std::string& name = "") override;
  void when_catalog(std::uint64_t gen, std::chrono::milliseconds bound,
                    std::function<void(std::shared_ptr<const Catalog>)> fn) override;
  const std::string& kernelspecs_body(const std::shared_ptr<const Catalog>& cat) override;
  std::optional<std::string> admit() override;
  void admitted(const std::string& id) override;
  void reserve_kernel_id(const std::string& id, bool on) override;
  bool kernel_id_reserved(const std::string& id) const override { return reserved_ids_.count(id) > 0; }
  std::optional<CullTimeout> cull_timeout(const Kernel& k) const override;
  tcp::endpoint endpoint() const override { return endpoint_; }
  bool tls() const override { return tls_ != nullptr; }
  const std::filesystem::path& unix_socket() const override { return unix_.path(); }
  const std::string& started() const override { return started_; }
  double started_unix() const override { return started_unix_; }
  std::string last_activity() const override;
  void touch() override { last_activity_ = iso_now(); }
  void interrupt_as_agent(const std::string& job, const std::string& agent, const std::string& why) override;

  // SIGHUP: `load` reads kgate.toml again with the command line's flags applied over it (main
  // provides it) and reload() takes on what can change in a running kgate: tokens, limits,
  // max_kernels, culling, the pool sizes (docs/kernels.md "Reloading").  A bad file changes nothing.
  void set_reloader(std::function<GatewayOptions()> load) { reloader_ = std::move(load); }
  void reload();  // Asio thread

 private:
  void do_accept();  // starts the accept loop of each listener
  void accept_tcp();
  void accept_unix();
  // An accept that failed (out of descriptors, say) or a connection refused for want of a place:
  // logged at most once a second. Returns how long to wait before the next accept.
  std::chrono::milliseconds on_accept_error(const beast::error_code& ec, const std::string& where);
  void note_refused_connection();
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
  // Every connection's place (http/connection_gate.hpp): before ioc_, so that the sessions its
  // handlers still hold give theirs back to it.
  ConnectionGate gate_{opts_.max_connections, opts_.max_unauthenticated_connections};
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
  HttpHost http_host_;  // every HttpSession's: the options, and route() as its dispatch
  net::steady_timer accept_retry_tcp_;   // an accept retried after a pause (on_accept_error)
  net::steady_timer accept_retry_unix_;
  std::chrono::steady_clock::time_point accept_logged_{};  // the last accept line logged
  std::size_t accept_unlogged_ = 0;                         // failures and refusals since then
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
