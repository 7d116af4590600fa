// The hub: which websocket clients each kernel has, reply routing, fan-out and replay.
#include "ws/hub.hpp"

#include <spdlog/spdlog.h>

namespace kgate::gw {

OutMsg::OutMsg(KernelMessagePtr m, std::uint64_t seq) : msg_(std::move(m)), seq_(seq) {
  const WireMessage& w = msg_->wire;
  bytes_ = w.header.size() + w.parent_header.size() + w.metadata.size() + w.content.size() + 64;
  for (auto& b : w.buffers) bytes_ += b.size();
}

const WsGather& OutMsg::frame(WsProtocol p) {
  if (p == WsProtocol::v1) {
    if (!v1_) v1_ = gather_v1(*msg_);
    return *v1_;
  }
  if (!legacy_) legacy_ = gather_legacy(*msg_);
  return *legacy_;
}

Hub::Hub(net::io_context& ioc, const GatewayOptions& opts)
    : ioc_(ioc), opts_(opts), sweep_timer_(ioc) {
  sweep();
}

Hub::~Hub() { *alive_ = false; }

void Hub::on_kernel_message(const KernelPtr& kernel, const KernelMessagePtr& msg) { take({kernel, msg}); }

void Hub::on_kernel_removed(const KernelPtr& kernel) { take({kernel, nullptr}); }

void Hub::take(Inbound in) {
  std::lock_guard lk(inbox_mu_);
  inbox_.push_back(std::move(in));
}

void Hub::on_pass_end() {
  {
    std::lock_guard lk(inbox_mu_);
    if (inbox_.empty() || drain_posted_) return;
    drain_posted_ = true;
  }
  net::post(ioc_, [this, alive = alive_] {
    if (*alive) drain();
  });
}

void Hub::drain() {
  {
    std::lock_guard lk(inbox_mu_);
    std::swap(inbox_, draining_);
    drain_posted_ = false;
  }
  for (auto& in : draining_) {
    if (in.msg) route(in.kernel, in.msg);
    else removed(in.kernel);
  }
  draining_.clear();
}

void Hub::keep(Replay& r, const OutPtr& m) {
  if (r.expired) {
    ++r.dropped;
    r.dropped_bytes += m->bytes();
    return;
  }
  r.msgs.push_back(m);
  r.bytes += m->bytes();
  while (!r.msgs.empty() &&
         (r.bytes > opts_.replay_bytes || r.msgs.size() > opts_.replay_messages)) {
    r.bytes -= r.msgs.front()->bytes();
    r.dropped_bytes += r.msgs.front()->bytes();
    ++r.dropped;
    r.msgs.pop_front();
  }
}

void Hub::route(const KernelPtr& kernel, const KernelMessagePtr& msg) {
  auto it = kernels_.find(kernel->id());
  if (it == kernels_.end()) return;  // nobody has connected to this kernel yet
  Clients& c = it->second;
  auto out = std::make_shared<OutMsg>(msg, ++seq_);
  if (msg->route.empty()) {
    for (auto& [route, weak] : c.live)
      if (auto client = weak.lock()) client->deliver(out);
    for (auto& [route, replay] : c.detached) keep(replay, out);
    return;
  }
  if (auto l = c.live.find(msg->route); l != c.live.end()) {
    if (auto client = l->second.lock()) {
      client->deliver(out);
      return;
    }
  }
  if (auto d = c.detached.find(msg->route); d != c.detached.end()) {
    keep(d->second, out);
    return;
  }
  spdlog::debug("kernel {}: {} for route {} that is gone; dropped", kernel->id(), msg->msg_type,
                msg->route);
}

void Hub::removed(const KernelPtr& kernel) {
  auto it = kernels_.find(kernel->id());
  if (it == kernels_.end()) return;
  auto live = std::move(it->second.live);
  kernels_.erase(it);
  for (auto& [route, weak] : live)
    if (auto client = weak.lock()) client->kernel_gone("kernel " + kernel->id() + " was shut down");
}

Hub::Attached Hub::attach(const KernelPtr& kernel, const std::shared_ptr<WsClient>& client,
                          const std::string& session_id) {
  Clients& c = kernels_[kernel->id()];
  Attached a;
  bool noticed = false;  // a drop notice is in the replay
  if (session_id.empty()) {
    // A sessionless client adopts the replay of the last sessionless one, if it is fresh.
    if (!c.sessionless_route.empty() && c.detached.count(c.sessionless_route)) {
      a.route = c.sessionless_route;
    } else {
      a.route = "anon-" + std::to_string(++anon_counter_);
    }
    c.sessionless_route.clear();
  } else {
    a.route = session_id;
  }
  if (auto l = c.live.find(a.route); l != c.live.end()) {
    if (auto old = l->second.lock()) {
      spdlog::info("kernel {}: session {} reconnected; closing its older connection",
                   kernel->id(), a.route);
      Unsent u = old->replace();
      a.replay = std::move(u.msgs);
      if (u.dropped) {
        a.replay.push_back(drop_notice(kernel, u.dropped, u.dropped_bytes,
                                       "the connection read too slowly"));
        noticed = true;
      }
    }
    c.live.erase(l);
  }
  if (auto d = c.detached.find(a.route); d != c.detached.end()) {
    Replay& r = d->second;
    std::deque<OutPtr> kept = std::move(r.msgs);
    for (auto& m : kept) a.replay.push_back(m);
    if (r.dropped) {
      a.replay.push_back(drop_notice(kernel, r.dropped, r.dropped_bytes,
                                     r.expired ? "it was away longer than the replay window"
                                               : "the replay buffer limit was reached"));
      noticed = true;
    }
    c.detached.erase(d);
  }
  // A client that missed messages may have missed the kernel's last status too (the idle that
  // ended a cell): after the notice it gets one with the state the kernel is in now.
  if (noticed) a.replay.push_back(state_notice(kernel));
  c.live[a.route] = client;
  ++connections_;
  kernel->add_connection(1);
  ++counters_.opened;
  counters_.replayed += a.replay.size();
  return a;
}

OutPtr Hub::drop_notice(const KernelPtr& kernel, std::size_t dropped, std::size_t bytes,
                        const std::string& why) {
  counters_.dropped += dropped;  // every gap gets exactly one notice, with its count
  std::string text = "[kgate] " + std::to_string(dropped) + " message(s) (" + std::to_string(bytes) +
                     " bytes) for this session were dropped: " + why +
                     ". Current kernel state: " + kernel->execution_state() + ".\n";
  auto m = std::make_shared<KernelMessage>(synthesize_message(
      Channel::iopub, "stream", "kgate", "{}", json{{"name", "stderr"}, {"text", text}}));
  spdlog::warn("kernel {}: {}", kernel->id(), text.substr(0, text.size() - 1));
  return std::make_shared<OutMsg>(std::move(m), ++seq_);
}

OutPtr Hub::state_notice(const KernelPtr& kernel) {
  auto m = std::make_shared<KernelMessage>(synthesize_message(
      Channel::iopub, "status", "kgate", "{}", json{{"execution_state", kernel->execution_state()}}));
  return std::make_shared<OutMsg>(std::move(m), ++seq_);
}

void Hub::detach(const KernelPtr& kernel, const WsClient* client, const std::string& route,
                 Unsent unsent) {
  --connections_;
  kernel->add_connection(-1);
  auto it = kernels_.find(kernel->id());
  if (it == kernels_.end()) return;
  Clients& c = it->second;
  auto l = c.live.find(route);
  if (l == c.live.end() || l->second.lock().get() != client) return;  // replaced meanwhile
  c.live.erase(l);
  Replay& r = c.detached[route];
  r.since = std::chrono::steady_clock::now();
  r.sessionless = route.rfind("anon-", 0) == 0;
  r.dropped += unsent.dropped;
  r.dropped_bytes += unsent.dropped_bytes;
  for (auto& m : unsent.msgs) keep(r, m);
  if (r.sessionless) {
    // Only the newest sessionless client's output is kept for adoption.
    if (!c.sessionless_route.empty() && c.sessionless_route != route)
      c.detached.erase(c.sessionless_route);
    c.sessionless_route = route;
  }
  // Bound the number of detached sessions per kernel: the oldest go first.
  while (c.detached.size() > opts_.max_detached_sessions) {
    auto oldest = c.detached.begin();
    for (auto d = c.detached.begin(); d != c.detached.end(); ++d)
      if (d->second.since < oldest->second.since) oldest = d;
    c.detached.erase(oldest);
  }
}

void Hub::sweep() {
  auto now = std::chrono::steady_clock::now();
  for (auto& [id, c] : kernels_) {
    for (auto d = c.detached.begin(); d != c.detached.end();) {
      Replay& r = d->second;
      auto ttl = r.sessionless ? opts_.sessionless_window : opts_.replay_ttl;
      if (!r.expired && now - r.since > ttl) {
        // Forget the messages but remember how many were lost, for one more window.
        r.expired = true;
        r.dropped += r.msgs.size();
        r.dropped_bytes += r.bytes;
        r.msgs.clear();
        r.bytes = 0;
        r.since = now;
        ++d;
      } else if (r.expired && now - r.since > ttl) {
        if (c.sessionless_route == d->first) c.sessionless_route.clear();
        d = c.detached.erase(d);
      } else {
        ++d;
      }
    }
  }
  sweep_timer_.expires_after(std::chrono::seconds(2));
  sweep_timer_.async_wait([this, alive = alive_](beast::error_code ec) {
    if (!ec && *alive) sweep();
  });
}

void Hub::close_all(const std::string& why) {
  auto kernels = std::move(kernels_);
  kernels_.clear();
  for (auto& [id, c] : kernels)
    for (auto& [route, weak] : c.live)
      if (auto client = weak.lock()) client->kernel_gone(why);
  sweep_timer_.cancel();
}

}  // namespace kgate::gw
