// The agent's liveness websocket to kgate (api/kgate/agent). One background thread with its
// own io_context.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "kgate/client/endpoint.hpp"

namespace kgate::client {

// The agent's liveness connection to kgate (GET api/kgate/agent): kgate holds the agent's claim
// while it is open.  Reconnects with backoff while started; stop() closes it with code 1000
// ("exited"), which frees the claim at once.
class AgentLink {
 public:
  AgentLink() = default;
  ~AgentLink();
  void start(const Endpoint& ep, const std::string& agent, const std::string& label);
  void stop();
  bool connected() const { return connected_; }

 private:
  void run(Endpoint ep, std::string agent, std::string label);
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> connected_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> close_;  // set while connected: closes from another thread
};

}  // namespace kgate::client
