// The agent's liveness websocket (api/kgate/agent), reconnected with backoff while started.
#include "kgate/client/agent_link.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "connect.hpp"
#include "kgate/client/websocket.hpp"

namespace kgate::client {

namespace {

constexpr auto kConnectTimeout = std::chrono::seconds(5);

}  // namespace

// ---------------------------------------------------------------------------------------
// AgentLink

AgentLink::~AgentLink() { stop(); }

void AgentLink::start(const Endpoint& ep, const std::string& agent, const std::string& label) {
  stop();
  stopping_ = false;
  thread_ = std::thread([this, ep, agent, label] { run(ep, agent, label); });
}

void AgentLink::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    if (close_) close_();
  }
  cv_.notify_all();
  thread_.join();
}

void AgentLink::run(Endpoint ep, std::string agent, std::string label) {
  std::string tls_error;
  auto tls_ctx = tls::client_context(ep, tls_error);
  if (!tls_error.empty()) {
    spdlog::warn("agent link to {}: {}", ep.url, tls_error);
    return;
  }
  auto backoff = std::chrono::milliseconds(200);
  while (!stopping_) {
    net::io_context ioc{1};
    auto wsock = Websocket::client(ep, tls_ctx, ioc);
    Websocket& ws = *wsock;  // outlives every handler of the loop below
    beast::flat_buffer buf;
    std::string target = ep.base + "api/kgate/agent?agent=" + percent_encode(agent) + "&label=" + percent_encode(label);
    beast::error_code ec;
    const std::string why = ws.open(ioc, ep, target, "", kConnectTimeout, ec);
    const bool up = !ec;
    if (up) {
      connected_ = true;
      backoff = std::chrono::milliseconds(200);
      {
        std::lock_guard lk(mu_);
        close_ = [&ioc, &ws] {
          net::post(ioc, [&ws] { ws.async_close(websocket::close_code::normal, [](beast::error_code) {}); });
        };
        if (stopping_) close_();
      }
      std::function<void()> read;  // lives as long as the loop runs its reads
      read = [&] {
        ws.async_read(buf, [&](beast::error_code rec, std::size_t) {
          buf.clear();
          if (rec) return void(ec = rec);
          read();
        });
      };
      read();
      ioc.run();
      std::lock_guard lk(mu_);
      close_ = nullptr;
    }
    connected_ = false;
    if (stopping_) break;
    if (!up) spdlog::debug("agent link to {}: {}", ep.url, why);
    else spdlog::info("agent link to {} dropped ({}); reconnecting", ep.url, ec.message());
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, backoff, [this] { return stopping_.load(); });
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}
}  // namespace kgate::client
