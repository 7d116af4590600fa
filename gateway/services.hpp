// What a handler may use of the daemon: the services that Server owns, behind one interface.
// The handlers (api/, ws/), the warm pool and the route table get a Services&, never the
// Server: they depend on this header, which names the services and includes none of their
// rooms, and not on server.hpp, which includes them all (DEV.md §2, "gateway's rooms").
//
// Threading: every member is for the Asio thread, except where it says "any thread".
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "kgate/discovery/discovery.hpp"
#include "kgate/kernel/kernel.hpp"
#include "kgate/records/jobs.hpp"
#include "http/net.hpp"
#include "options.hpp"

namespace kgate::gw {

class Hub;           // ws/hub.hpp: the kernels' messages to their websocket clients
class Waiters;       // api/jobs_api.hpp: requests waiting for a job to end
class WarmPool;      // pool.hpp
class SessionStore;  // sessions.hpp: the sessions API's sessions
class McpHttp;       // api/mcp_http.hpp: {base}mcp

class Services {
 public:
  // ---- The parts: each one's header says what it does ----
  virtual const GatewayOptions& options() const = 0;  // as reloaded (SIGHUP) last
  virtual net::io_context& ioc() = 0;                 // the one Asio thread's context
  virtual Hub& hub() = 0;
  virtual KernelManager& manager() = 0;
  virtual JobStore& jobs() = 0;
  virtual Waiters& waiters() = 0;
  virtual WarmPool& pool() = 0;
  virtual SessionStore& sessions() = 0;
  virtual McpHttp& mcp() = 0;
  virtual DiscoveryService& discovery() = 0;

  // ---- The kernel catalog (kgate/discovery/discovery.hpp) ----
  // Calls `fn` on the Asio thread with the newest catalog: at once when the first full discovery
  // is done, else when it is, or after options().discovery.request_wait with what is known by
  // then.  With `name`: a catalog without that entry is not taken as final; a rediscovery runs
  // first (bounded the same way), so a kernelspec installed a moment ago is found.
  virtual void with_catalog(std::function<void(std::shared_ptr<const Catalog>)> fn, const std::string& name = "") = 0;
  // Calls `fn` on the Asio thread with the newest catalog once discovery generation `gen` is out
  // (at once if it is), or after `bound` with what there is by then.
  virtual void when_catalog(std::uint64_t gen, std::chrono::milliseconds bound,
                            std::function<void(std::shared_ptr<const Catalog>)> fn) = 0;
  // GET /api/kernelspecs's body for `cat` (cached per catalog).
  virtual const std::string& kernelspecs_body(const std::shared_ptr<const Catalog>& cat) = 0;

  // ---- Kernels: admission, chosen ids, culling ----
  // max_kernels: a POST /api/kernels takes a slot before anything else (nullopt), or gets the
  // refusal to send with 503; the slot becomes the kernel's when its start finished
  // (admitted(id)) or is given back (admitted("")).
  virtual std::optional<std::string> admit() = 0;
  virtual void admitted(const std::string& id) = 0;
  // Client-chosen kernel ids (POST /api/kernels "kernel_id") whose start is not done: taken (on)
  // or given back.
  virtual void reserve_kernel_id(const std::string& id, bool on) = 0;
  virtual bool kernel_id_reserved(const std::string& id) const = 0;
  // The idle timeout that applies to kernel `k`: its POST's "kgate_cull_idle_timeout", else its
  // kernelspec's metadata.cull_idle_timeout, else [culling] cull_idle_timeout; `setting` names
  // which.  nullopt: it is never culled for idleness (off, or 0).  Any thread.
  struct CullTimeout {
    std::chrono::milliseconds timeout;
    std::string setting;
  };
  virtual std::optional<CullTimeout> cull_timeout(const Kernel& k) const = 0;
  // Stops `job` as its agent would (the kernel side's stop, else SIGINT under the records' lock),
  // and logs `why` with the outcome.  Asio thread.
  virtual void interrupt_as_agent(const std::string& job, const std::string& agent, const std::string& why) = 0;

  // ---- The daemon itself: where it listens, since when, last active ----
  virtual tcp::endpoint endpoint() const = 0;
  virtual bool tls() const = 0;
  virtual const std::filesystem::path& unix_socket() const = 0;  // "" when there is none
  virtual const std::string& started() const = 0;
  virtual double started_unix() const = 0;  // seconds since the Unix epoch
  virtual std::string last_activity() const = 0;
  virtual void touch() = 0;

 protected:
  ~Services() = default;  // not owned through this interface
};

}  // namespace kgate::gw
