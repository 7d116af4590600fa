// The hub: which websocket clients each kernel has, reply routing, fan-out and replay.
//
// Threading: everything here runs on the gateway's single Asio thread.  The kernel I/O thread
// reaches it only through KernelObserver, whose methods post onto that thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "http/net.hpp"
#include "options.hpp"
#include "kgate/jupyter/ws_codec.hpp"

namespace kgate::gw {

// One message from a kernel on its way to clients, encoded at most once per protocol.  The
// encoded frames are views of the message's parts plus kgate's few bytes around them (WsGather):
// the parts are sent from where they are, never copied into a frame.
class OutMsg {
 public:
  OutMsg(KernelMessagePtr m, std::uint64_t seq);
  const KernelMessage& msg() const { return *msg_; }
  std::uint64_t seq() const { return seq_; }
  // Bytes this message holds (its parts), the unit of every queue and replay limit.
  std::size_t bytes() const { return bytes_; }
  const WsGather& frame(WsProtocol p);

 private:
  KernelMessagePtr msg_;
  std::uint64_t seq_;
  std::size_t bytes_;
  std::optional<WsGather> legacy_, v1_;
};
using OutPtr = std::shared_ptr<OutMsg>;

// Messages a connection had not written when it went away, oldest first, and how many it
// had to drop on top of them (its bounded spill overflowed).
struct Unsent {
  std::deque<OutPtr> msgs;
  std::size_t dropped = 0;
  std::size_t dropped_bytes = 0;
};

// What the hub needs of a websocket connection.
class WsClient {
 public:
  virtual ~WsClient() = default;
  virtual void deliver(const OutPtr& m) = 0;
  // Closes the connection because another one took over its session id.  Returns what it
  // had not written yet; that goes to the new connection first.
  virtual Unsent replace() = 0;
  // Closes the connection because its kernel is gone.
  virtual void kernel_gone(const std::string& why) = 0;
};

class Hub final : public KernelObserver {
 public:
  Hub(net::io_context& ioc, const GatewayOptions& opts);
  ~Hub() override;

  // KernelObserver (called on the kernel I/O thread; posts to the Asio thread).
  void on_kernel_message(const KernelPtr& kernel, const KernelMessagePtr& msg) override;
  void on_kernel_removed(const KernelPtr& kernel) override;
  void on_pass_end() override;

  struct Attached {
    std::string route;           // the route the client's requests carry
    std::deque<OutPtr> replay;   // messages kept for it while it was away, oldest first
  };
  // A connection opened.  session_id "" = a sessionless client (a jupyter_server relay).
  Attached attach(const KernelPtr& kernel, const std::shared_ptr<WsClient>& client,
                  const std::string& session_id);
  // A connection closed.  `unsent` is what it had queued but not written: it is kept in the
  // route's replay buffer (bounded) for a reconnect.
  void detach(const KernelPtr& kernel, const WsClient* client, const std::string& route,
              Unsent unsent);
  // A "[kgate] N message(s) dropped" stderr stream message for a client.
  OutPtr drop_notice(const KernelPtr& kernel, std::size_t dropped, std::size_t bytes,
                     const std::string& why);
  // A `status` iopub message with the kernel's execution state now; follows a drop notice.
  OutPtr state_notice(const KernelPtr& kernel);
  int connections() const { return connections_; }
  void close_all(const std::string& why);

  // For /metrics, since kgate started; Asio thread (the hub's and the websocket sessions').
  struct Counters {
    std::uint64_t opened = 0;           // websocket connections to kernels
    std::uint64_t bytes_out = 0;        // websocket bytes written to clients
    std::uint64_t dropped = 0;          // messages dropped (a slow reader's spill, a replay buffer)
    std::uint64_t replayed = 0;         // messages replayed to a client that came back
  };
  Counters& counters() { return counters_; }

 private:
  Counters counters_;
  struct Replay {
    std::deque<OutPtr> msgs;
    std::size_t bytes = 0;
    std::size_t dropped = 0;
    std::size_t dropped_bytes = 0;
    std::chrono::steady_clock::time_point since;
    bool sessionless = false;
    bool expired = false;  // only counts what it misses now
  };
  struct Clients {
    std::map<std::string, std::weak_ptr<WsClient>> live;  // by route
    std::map<std::string, Replay> detached;               // by route
    std::string sessionless_route;  // the route whose replay the next sessionless client adopts
  };

  // What kgate-io hands over (a message, or with msg null the kernel's removal), in its order.
  // One post per batch, not per message: take() only adds to the inbox, and at the end of
  // kgate-io's pass (on_pass_end) one `drain` is posted if none is pending, so a pass's
  // messages (a held iopub's batch, DEV.md §3) share a wake of the Asio thread.  A lone
  // message is posted at the end of the pass that read it, microseconds later.
  struct Inbound {
    KernelPtr kernel;
    KernelMessagePtr msg;
  };
  void take(Inbound in);
  void drain();
  void route(const KernelPtr& kernel, const KernelMessagePtr& msg);
  void removed(const KernelPtr& kernel);
  void keep(Replay& r, const OutPtr& m);
  void sweep();

  net::io_context& ioc_;
  const GatewayOptions& opts_;
  net::steady_timer sweep_timer_;
  std::map<std::string, Clients> kernels_;
  std::uint64_t seq_ = 0;
  std::uint64_t anon_counter_ = 0;
  int connections_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::mutex inbox_mu_;
  std::vector<Inbound> inbox_;     // kgate-io adds, under inbox_mu_
  bool drain_posted_ = false;      // under inbox_mu_: a drain is queued and has not swapped yet
  std::vector<Inbound> draining_;  // the Asio thread's, swapped with inbox_ by drain()
};

}  // namespace kgate::gw
