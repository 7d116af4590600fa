// The warm pool: per kernelspec, a few kernels started ahead of time, hidden, and handed to
// POST /api/kernels, then refilled in the background (docs/dev/kernel-lifecycle.md "Warm pool").
//
// Lives on the Asio thread.  The kernels themselves are KernelManager's (StartRequest::pooled,
// KernelManager::hand_out); the pool only keeps their ids, per kernelspec, and posts every
// callback from kgate-io back to the Asio thread.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "kgate/kernel/kernel.hpp"
#include "http/net.hpp"

namespace kgate::gw {

class Services;

// Whether a start of `spec` with `env` can be served by a kernel that is already running, and if
// not, why (a sentence).  Only ipykernel specs (the hand-out is Python code), and no variable that
// a Python process reads only at start (PYTHON*, LD_*, DYLD_*) unless it has the value the warm
// kernels started with (kgate's environment, then the spec's env).
std::string pool_refusal(const KernelSpec& spec, const std::map<std::string, std::string>& env);

class WarmPool {
 public:
  explicit WarmPool(Services& server);
  WarmPool(const WarmPool&) = delete;
  WarmPool& operator=(const WarmPool&) = delete;

  // Reads options().pool (at start and after a reload): grows or trims every kernelspec's pool.
  void configure();
  // Starts `sr` (spec already looked up): a pooled kernel of that spec when one is ready and the
  // request can take it (pool_refusal), else a cold start.  A failed hand-out falls back to a
  // cold start.  `done` runs on any thread, exactly once.
  void start(StartRequest sr, std::function<void(StartResult)> done);
  // {"kernels": {name: {"size", "ready", "starting", "handed_out", "cold_starts", "error"?}}}
  nlohmann::json status() const;
  // No more refills (the gateway is stopping); the manager stops the pooled kernels. Returns
  // how many pooled kernels were ready, for the shutdown log.
  std::size_t stop();

 private:
  struct SpecPool {
    std::size_t want = 0;
    std::string fingerprint;           // of the spec the ready kernels were started from
    std::deque<std::string> ready;     // kernel ids, oldest first
    std::size_t starting = 0;
    std::uint64_t handed_out = 0;
    std::uint64_t cold_starts = 0;
    std::string error;                 // the last start failure, "" once one succeeded
    std::chrono::seconds backoff{0};   // after a failure: wait this long before the next start
    std::chrono::steady_clock::time_point retry_at{};
    bool fill_pending = false;         // a fill waits for the catalog or the backoff timer
    // After a hand-out or a cold start: the refill waits until the gateway's kernels are quiet
    // (refill_when_quiet), at most until this instant.
    std::optional<std::chrono::steady_clock::time_point> quiet_deadline;
  };

  void fill(const std::string& name);  // name "" = the catalog's default
  // The refill after a hand-out or a cold start: a kernel start takes a core for about a second,
  // so it waits until no visible kernel is busy or has had activity for kQuiet, checking every
  // kQuietPoll, and starts anyway after kMaxRefillDelay (docs/dev/kernel-lifecycle.md "Warm pool").
  void refill_when_quiet(const std::string& name);
  void check_quiet(const std::string& name);
  bool kernels_quiet() const;
  void fill_from(const std::string& name, const KernelSpec& spec);
  void discard(SpecPool& p, std::size_t keep, const std::string& why);  // stops the oldest ready ones
  void on_started(const std::string& name, const std::string& fingerprint, StartResult r);
  void on_lost(const std::string& name, const std::string& id, const std::string& why);
  void cold(StartRequest sr, std::function<void(StartResult)> done);
  std::size_t want_for(const std::string& name) const;

  Services& server_;
  std::map<std::string, SpecPool> pools_;  // by kernelspec name ("" never: resolved first)
  std::string default_name_;               // the catalog's default, once known
  bool stopping_ = false;
};

}  // namespace kgate::gw
