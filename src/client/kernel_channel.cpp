// A kernel's channels websocket as a client: sends requests, keeps each request's outputs.
#include "kgate/client/kernel_channel.hpp"

#include <algorithm>

#include "connect.hpp"
#include "kgate/client/websocket.hpp"

namespace kgate::client {

namespace {

constexpr std::size_t kMaxWsMessageBytes = 256u << 20;

}  // namespace

// ---------------------------------------------------------------------------------------
// KernelChannel

struct KernelChannel::Impl {
  Impl(const Endpoint& ep, std::shared_ptr<ssl::context> tls) : ws(Websocket::client(ep, std::move(tls), ioc)) {}
  net::io_context ioc{1};
  std::unique_ptr<Websocket> ws;  // over TCP, over TLS, or over a Unix socket
  beast::flat_buffer buf;
  std::deque<std::string> outq;  // the front is being written while `writing`
  bool writing = false;

  // Writes the queue's front, then the next, one async_write at a time (on the loop's thread).
  static void write_next(const std::shared_ptr<Impl>& impl) {
    if (impl->outq.empty()) {
      impl->writing = false;
      return;
    }
    impl->writing = true;
    impl->ws->text(true);
    impl->ws->async_write(net::buffer(impl->outq.front()), [impl](beast::error_code ec, std::size_t) {
      impl->outq.pop_front();
      if (ec) {
        impl->outq.clear();
        impl->writing = false;
        return;
      }
      write_next(impl);
    });
  }
};

KernelChannel::~KernelChannel() { close(); }

bool KernelChannel::open(const Endpoint& ep, const std::string& kernel, const std::string& session,
                         std::chrono::milliseconds timeout, std::string& error) {
  close();
  std::string tls_error;
  auto tls_ctx = tls::client_context(ep, tls_error);
  if (!tls_error.empty()) {
    error = "cannot open the kernel's websocket: " + tls_error;
    return false;
  }
  impl_ = std::make_shared<Impl>(ep, tls_ctx);
  kernel_ = kernel;
  auto impl = impl_;
  std::string target = ep.base + "api/kernels/" + kernel + "/channels?session_id=" + percent_encode(session);
  impl->ws->read_message_max(kMaxWsMessageBytes);
  beast::error_code ec;
  const std::string why = impl->ws->open(impl->ioc, ep, target, "", timeout, ec);
  if (ec) {
    error = "cannot open the kernel's websocket: " + why;
    impl_.reset();
    return false;
  }
  open_ = true;
  thread_ = std::thread([this] { reader(); });
  return true;
}

void KernelChannel::reader() {
  auto impl = impl_;
  {  // runs the loop: `ws` outlives every handler
    Websocket& ws = *impl->ws;
    std::function<void()> read;
    read = [&] {
      ws.async_read(impl->buf, [&](beast::error_code ec, std::size_t) {
        if (ec) {
          open_ = false;
          cv_.notify_all();
          return;
        }
        if (ws.got_text()) on_message(beast::buffers_to_string(impl->buf.data()));
        impl->buf.consume(impl->buf.size());
        read();
      });
    };
    read();
    impl->ioc.run();
  }
  open_ = false;
  cv_.notify_all();
}

void KernelChannel::close() {
  if (!impl_) return;
  auto impl = impl_;
  net::post(impl->ioc, [impl] {
    impl->ws->async_close(websocket::close_code::normal, [impl](beast::error_code) { impl->ioc.stop(); });
  });
  if (thread_.joinable()) {
    // A peer that never answers the close: stop the loop after a second.
    std::thread guard([impl] {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      impl->ioc.stop();
    });
    thread_.join();
    guard.detach();
  }
  impl_.reset();
  open_ = false;
  std::lock_guard lk(mu_);
  seen_.clear();
  order_.clear();
  kept_bytes_ = 0;
}

bool KernelChannel::send(const std::string& channel, const json& msg) {
  if (!open_ || !impl_) return false;
  json m = msg;
  m["channel"] = channel;
  auto impl = impl_;
  net::post(impl->ioc, [impl, text = m.dump()]() mutable {
    impl->outq.push_back(std::move(text));
    if (impl->writing) return;
    Impl::write_next(impl);
  });
  return true;
}

void KernelChannel::expect(const std::string& msg_id) {
  std::lock_guard lk(mu_);
  if (seen_.count(msg_id)) return;
  seen_[msg_id];
  order_.push_back(msg_id);
  evict();
}

void KernelChannel::forget(const std::string& msg_id) {
  std::lock_guard lk(mu_);
  auto it = seen_.find(msg_id);
  if (it == seen_.end()) return;
  kept_bytes_ -= it->second.stream_bytes + it->second.data_bytes;
  seen_.erase(it);
  order_.erase(std::remove(order_.begin(), order_.end(), msg_id), order_.end());
}

void KernelChannel::evict() {
  while (order_.size() > 1 && (order_.size() > kMaxRequests || kept_bytes_ > kMaxKeptBytes)) {
    // The oldest finished request, else the oldest (never the newest).
    auto victim = std::find_if(order_.begin(), std::prev(order_.end()), [&](const std::string& id) {
      auto it = seen_.find(id);
      return it == seen_.end() || it->second.idle;
    });
    if (victim == std::prev(order_.end())) victim = order_.begin();
    if (auto it = seen_.find(*victim); it != seen_.end()) {
      kept_bytes_ -= it->second.stream_bytes + it->second.data_bytes;
      seen_.erase(it);
    }
    order_.erase(victim);
  }
}

void KernelChannel::keep(Collected& c, CellOutput o, std::size_t message_bytes) {
  if (o.kind == CellOutput::Kind::stream) {
    const std::size_t n = o.text.size();
    CellOutput* last = c.outputs.empty() ? nullptr : &c.outputs.back();
    if (last && last->kind == CellOutput::Kind::stream && last->name == o.name) {
      last->text += o.text;
    } else if (c.outputs.size() < kMaxOutputs) {
      c.outputs.push_back(std::move(o));
    } else {
      ++c.dropped;
      return;
    }
    c.stream_bytes += n;
    kept_bytes_ += n;
    if (c.stream_bytes <= kMaxStreamBytes) return;
    // Over the bound: cut the oldest stream text (at character starts) down to 3/4 of it, so
    // that a cell printing without end costs a cut now and then, not one per message.
    const std::size_t target = kMaxStreamBytes / 4 * 3;
    for (auto& out : c.outputs) {
      if (c.stream_bytes <= target) break;
      if (out.kind != CellOutput::Kind::stream || out.text.empty()) continue;
      std::size_t cut = std::min(out.text.size(), c.stream_bytes - target);
      while (cut < out.text.size() && (static_cast<unsigned char>(out.text[cut]) & 0xC0) == 0x80) ++cut;
      out.text.erase(0, cut);
      out.cut += cut;
      c.stream_bytes -= cut;
      kept_bytes_ -= cut;
    }
    return;
  }
  if (c.outputs.size() >= kMaxOutputs || c.data_bytes + message_bytes > kMaxDataBytes) {
    ++c.dropped;
    return;
  }
  c.outputs.push_back(std::move(o));
  c.data_bytes += message_bytes;
  kept_bytes_ += message_bytes;
}

void KernelChannel::on_message(const std::string& text) {
  json m = json::parse(text, nullptr, false);
  if (!m.is_object()) return;
  const json& parent = m.value("parent_header", json::object());
  if (!parent.is_object() || !parent.contains("msg_id") || !parent["msg_id"].is_string()) return;
  std::string pid = parent["msg_id"].get<std::string>();
  auto str_of = [](const json& j, const char* key) {
    const auto f = j.is_object() ? j.find(key) : j.end();
    return j.is_object() && f != j.end() && f->is_string() ? f->get<std::string>() : std::string();
  };
  std::string type = str_of(m.value("header", json::object()), "msg_type");
  if (type.empty()) type = str_of(m, "msg_type");
  std::string channel = str_of(m, "channel");
  std::lock_guard lk(mu_);
  auto it = seen_.find(pid);
  if (it == seen_.end()) {
    if (channel != "iopub") return;
    it = seen_.emplace(pid, Collected{}).first;
    order_.push_back(pid);
  }
  auto& c = it->second;
  const json& content = m.value("content", json::object());
  if (channel == "iopub") {
    const std::string state = type == "status" ? str_of(content, "execution_state") : "";
    if (type == "status") {
      if (state == "busy") c.began = true;
      if (state == "idle") c.idle = true;
    } else if (type == "execute_input") {
      c.began = true;
    } else if (auto o = output_from_iopub(type, content)) {
      keep(c, std::move(*o), text.size());
    }
  } else if (channel == "shell" && type == "execute_reply") {
    c.replied = true;
    c.reply = content;
  }
  evict();
  cv_.notify_all();
}

KernelChannel::Collected KernelChannel::wait_for(const std::string& msg_id, std::chrono::milliseconds timeout,
                                                 const std::function<bool(const Collected&)>& done,
                                                 const std::atomic<bool>* cancelled) {
  std::unique_lock lk(mu_);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto it = seen_.find(msg_id);
    if (it != seen_.end() && done(it->second)) return it->second;
    if (!open_ || (cancelled && *cancelled)) break;
    if (cv_.wait_until(lk, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(200))) ==
            std::cv_status::timeout &&
        std::chrono::steady_clock::now() >= deadline)
      break;
  }
  auto it = seen_.find(msg_id);
  return it == seen_.end() ? Collected{} : it->second;
}

}  // namespace kgate::client
