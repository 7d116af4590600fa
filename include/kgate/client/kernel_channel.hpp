// A kernel's channels websocket, as a client (every output of a cell, in order: records keep
// no display_data). One background thread with its own io_context.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kgate/client/endpoint.hpp"
#include "kgate/client/outputs.hpp"
#include "kgate/jupyter/wire.hpp"

namespace kgate::client {

// A kernel's channels websocket, read in the background: keeps the outputs of recent requests
// (by parent msg_id, in the order the kernel sent them, bounded) so that a cell's every output
// can be rendered, and can run a cell directly (a stock Jupyter server without kgate's agent
// path).
class KernelChannel {
 public:
  KernelChannel() = default;
  ~KernelChannel();
  // Connects (blocking up to `timeout`); false and `error` if it could not.
  bool open(const Endpoint& ep, const std::string& kernel, const std::string& session,
            std::chrono::milliseconds timeout, std::string& error);
  void close();
  bool is_open() const { return open_; }
  const std::string& kernel() const { return kernel_; }

  // Sends a message on a channel ("shell"); false if not connected.
  bool send(const std::string& channel, const json& msg);

  // What was seen of one request.  Consecutive stream messages of one name are one output.
  // Bounds: stream text past kMaxStreamBytes is cut from the front of the oldest streams (their
  // `cut` counts it); other outputs past kMaxOutputs or kMaxDataBytes are not kept (`dropped`).
  struct Collected {
    std::vector<CellOutput> outputs;
    bool began = false;       // its status: busy or execute_input was seen: `outputs` has all
    bool idle = false;        // status: idle for the request was seen
    bool replied = false;     // its execute_reply was seen
    json reply;               // the execute_reply content
    std::size_t dropped = 0;  // outputs not kept (over the bounds)
    std::size_t stream_bytes = 0, data_bytes = 0;
  };
  static constexpr std::size_t kMaxStreamBytes = std::size_t(4) << 20;
  static constexpr std::size_t kMaxDataBytes = std::size_t(32) << 20;   // messages of other outputs
  static constexpr std::size_t kMaxOutputs = 1000;
  static constexpr std::size_t kMaxRequests = 64;                       // requests kept
  static constexpr std::size_t kMaxKeptBytes = std::size_t(256) << 20;  // in all requests kept
  // What was seen for `msg_id` so far; waits up to `timeout` until `done(collected)` holds.
  Collected wait_for(const std::string& msg_id, std::chrono::milliseconds timeout,
                     const std::function<bool(const Collected&)>& done,
                     const std::atomic<bool>* cancelled = nullptr);
  // Makes the entry of `msg_id` before it is sent (the outputs of every request with iopub
  // traffic are kept anyway, from its first message on).  Past kMaxRequests or kMaxKeptBytes,
  // the oldest finished request is forgotten first (then the oldest).
  void expect(const std::string& msg_id);
  void forget(const std::string& msg_id);

 private:
  void reader();
  void on_message(const std::string& text);
  void keep(Collected& c, CellOutput o, std::size_t message_bytes);  // mu_ held
  void evict();                                                       // mu_ held

  struct Impl;
  std::shared_ptr<Impl> impl_;
  std::thread thread_;
  std::atomic<bool> open_{false};
  std::string kernel_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Collected> seen_;  // recent requests, bounded
  std::deque<std::string> order_;          // their ids, oldest first
  std::size_t kept_bytes_ = 0;             // stream_bytes + data_bytes of all in seen_
};

}  // namespace kgate::client
