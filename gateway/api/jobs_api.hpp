// The kgate extensions: job records, the agent path, claims, the digest, the notebook export,
// the agent liveness websocket and the observe page (README "Session records").
//
// Threading: the handlers and Waiters run on the gateway's Asio thread; the JobStore they read
// is shared with the kernel I/O thread under its own lock.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "api/api.hpp"
#include "http/net.hpp"

namespace kgate::gw {

// Requests waiting for the records to change (a job to end, a long poll).  Each has a deadline;
// a change in the store re-checks them all.  Bounded: past `max` a wait is refused (503).
class Waiters {
 public:
  Waiters(net::io_context& ioc, std::size_t max) : ioc_(ioc), max_(max) {}
  // Calls `done` once, when `ready()` is true (now or after a change) or at the deadline.
  // False (and `done` not called) when `max` waits are pending.
  bool add(std::chrono::milliseconds timeout, std::function<bool()> ready, std::function<void()> done);
  void poke();  // the store changed
  void cancel_all();
  std::size_t size() const { return waits_.size(); }
  // Whether a wait is pending or being added: read on any thread (Server's on_change posts no
  // poke without one).  add() counts a wait before it asks ready(), so a change made after that
  // ask sees it counted.
  bool any() const { return pending_.load() > 0; }

 private:
  struct Wait {
    net::steady_timer timer;
    std::function<bool()> ready;
    std::function<void()> done;
    bool fired = false;
    explicit Wait(net::io_context& ioc) : timer(ioc) {}
  };
  void fire(const std::shared_ptr<Wait>& w);

  net::io_context& ioc_;
  std::size_t max_;
  std::list<std::shared_ptr<Wait>> waits_;
  std::atomic<std::size_t> pending_{0};  // waits_.size(), plus an add() under way
};

// GET {base}observe: the observe page.
Response observe_page(const Request& req);
// The shell command that attaches qtconsole / jupyter console to a kernel's connection file.
std::string attach_command(const kgate::KernelSpec& spec, const std::string& connection_file);

}  // namespace kgate::gw
