// The bound on the connections kgate holds (docs/dev/limits.md "Connections"): at most
// `max_open` in all, HTTP and websockets, and at most `max_unauthenticated` that have not yet
// passed the Host, Origin and token checks.  A stranger without the token can hold only the
// second kind: when they are all taken, the oldest is closed to admit the newest, so the owner's
// new connection still gets through however many another user opens.  Asio thread only.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <memory>

namespace kgate::gw {

class ConnectionGate {
 public:
  ConnectionGate(std::size_t max_open, std::size_t max_unauthenticated)
      : max_open_(max_open), max_unauthenticated_(max_unauthenticated) {}
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  // One connection's place, held as long as its socket: by its HttpSession, then by the
  // websocket session it became.  Its end frees the place.
  class Slot {
   public:
    ~Slot();
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    // The connection passed the checks: it is no longer a candidate for eviction.
    void authenticated();
    bool is_authenticated() const { return authenticated_; }

   private:
    friend class ConnectionGate;
    Slot(ConnectionGate& gate, std::function<void()> close) : gate_(&gate), close_(std::move(close)) {}
    ConnectionGate* gate_;  // null once the place was given back (evicted)
    std::function<void()> close_;
    bool authenticated_ = false;
    std::list<Slot*>::iterator pos_;  // in gate_->waiting_ while not authenticated
  };

  // Admits a new connection, closing the oldest unauthenticated one first when there is no room
  // for it.  `close` closes its socket (called at most once, if it is evicted).  Null when every
  // place is held by an authenticated connection: the caller closes the new one.
  std::shared_ptr<Slot> admit(std::function<void()> close);
  // Closes the oldest unauthenticated connection, if there is one (kgate is out of descriptors).
  bool evict_oldest();

  std::size_t open() const { return open_; }
  std::size_t unauthenticated() const { return waiting_.size(); }
  std::size_t evicted() const { return evicted_; }  // since start
  void set_limits(std::size_t max_open, std::size_t max_unauthenticated) {
    max_open_ = max_open;
    max_unauthenticated_ = max_unauthenticated;
  }

 private:
  void release(Slot& s);

  std::size_t max_open_, max_unauthenticated_;
  std::size_t open_ = 0;
  std::size_t evicted_ = 0;
  std::list<Slot*> waiting_;  // unauthenticated, oldest first
};

}  // namespace kgate::gw
