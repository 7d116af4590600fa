// `kgate proxy-kernel`'s side of the gateway: which kgate kernel to attach to (REST), and that
// kernel's channels websocket (the v1 protocol), as any Jupyter client uses it.
//
// Threading: a Link owns two threads: "link" (finds the kernel, holds the websocket, reconnects
// with backoff) and "link-http" (interrupts, so a slow POST never holds the websocket up).
// send(), interrupt(), take() and stop() may be called from any thread; the proxy's ZMQ thread
// calls them.  Events are queued (bounded) and announced through the `wake` callback.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "kgate/client/http_client.hpp"
#include "kgate/jupyter/messages.hpp"
#include "kgate/jupyter/wire.hpp"
#include "kgate/client/proxy_wire.hpp"

namespace kgate::client::proxy {

// Limits of the link (DEV.md "kgate proxy-kernel").
struct LinkLimits {
  std::size_t max_out_messages = 10'000;          // queued for the websocket; past it send() says full
  std::size_t max_out_bytes = std::size_t{256} << 20;
  std::size_t max_in_messages = 10'000;           // queued for the ZMQ side; past it reading pauses
  std::size_t max_ws_message_bytes = std::size_t{256} << 20;  // kgate's own limit
  std::size_t max_http_jobs = 16;                 // interrupts waiting for their POST
};

struct LinkEvent {
  enum class Kind {
    message,    // `channel` + `wire`: a message from the kernel (via kgate)
    attached,   // the websocket to `kernel` is up; `resumed`: same kernel and session as before
                // the drop, so kgate replays what this side missed
    dropped,    // the websocket went down; the link reconnects at once (hold new requests)
    detached,   // no kernel to talk to: `ename`/`evalue` say why; the link keeps retrying
    interrupt_done,  // the POST .../interrupt for `tag` finished: ok, or `evalue` says why not
  };
  Kind kind = Kind::message;
  Channel channel = Channel::iopub;
  WireMessage wire;
  std::string kernel;
  bool resumed = false;
  std::string ename, evalue;
  std::uint64_t tag = 0;
  bool ok = false;
};

struct LinkOptions {
  kgate::client::Endpoint ep;
  std::string kernel;  // a kernel id or a unique prefix of one; "" = choose (choose_kernel)
  LinkLimits limits;
  std::chrono::milliseconds max_backoff{5000};
};

class Link {
 public:
  Link(LinkOptions opts, std::function<void()> wake);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  void start();
  // Closes the websocket (code 1000) and ends both threads; waits at most `grace` for them.
  // False if a thread did not end in time (it is detached: the process is about to exit).
  bool stop(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));

  enum class Sent { ok, full, down };
  // Queues a client message for the kernel's websocket.
  Sent send(Channel channel, const WireMessage& wire);
  // POST api/kernels/{attached kernel}/interrupt in the background; an interrupt_done event
  // with `tag` follows.  False when no kernel is attached or too many are queued.
  bool interrupt(std::uint64_t tag);
  // Everything queued since the last call, in order; lets a paused reader go on.
  std::deque<LinkEvent> take();

  std::string url() const { return opts_.ep.url; }

 private:
  struct Conn;
  void run();
  void http_worker();
  void push(LinkEvent e);
  bool resolve(kgate::client::HttpClient& http, std::string& id, std::string& ename, std::string& evalue);
  bool open_ws(const std::shared_ptr<Conn>& c, const std::string& kernel, std::string& error);
  void start_read(const std::shared_ptr<Conn>& c);
  void write_next(const std::shared_ptr<Conn>& c);
  void fail(const std::shared_ptr<Conn>& c);

  LinkOptions opts_;
  std::function<void()> wake_;
  std::string session_;  // the websocket's session_id, the same for the proxy's life (replay)
  std::thread thread_, http_thread_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<kgate::client::HttpClient> http_;

  std::mutex mu_;
  std::condition_variable cv_;  // backoff waits, the HTTP queue, stop
  std::deque<LinkEvent> events_;
  std::size_t in_messages_ = 0;  // message events in events_
  bool paused_ = false;          // reading stopped at max_in_messages
  std::shared_ptr<Conn> conn_;   // set while the websocket is up
  std::string attached_;         // the kernel of conn_
  std::size_t out_messages_ = 0, out_bytes_ = 0;
  std::deque<std::string> carry_;  // unsent frames of a dropped connection, for a resume
  std::deque<std::uint64_t> http_jobs_;
  std::atomic<int> threads_left_{0};
  std::condition_variable done_cv_;
};

}  // namespace kgate::client::proxy
