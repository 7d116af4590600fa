// `kgate proxy-kernel`'s side of the gateway (see proxy_link.hpp).
#include "kgate/client/proxy_link.hpp"

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "kgate/jupyter/connection.hpp"
#include "connect.hpp"
#include "kgate/client/websocket.hpp"
#include "kgate/jupyter/ws_codec.hpp"

namespace kgate::client::proxy {

namespace ssl = net::ssl;
using namespace std::chrono_literals;

namespace {

constexpr auto kGetTimeout = 5s;        // a listing or a model: kgate answers from memory
constexpr auto kCreateTimeout = 120s;   // POST api/kernels waits for the kernel to be ready
constexpr auto kInterruptTimeout = 10s;
constexpr auto kWsOpenTimeout = 10s;

bool is_dead(const json& k) { return k.is_object() && k.value("execution_state", "") == "dead"; }

std::string auth_hint(const kgate::client::Endpoint& ep) {
  return ep.name.empty() || ep.name.find("://") != std::string::npos
             ? "set $KGATE_TOKEN to the gateway's token"
             : "check the token of [gateways." + ep.name + "] in gateways.toml";
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Link

struct Link::Conn {
  Conn(const kgate::client::Endpoint& ep, std::shared_ptr<ssl::context> tls, net::io_context& io)
      : ioc(io), ws(Websocket::client(ep, std::move(tls), io)) {}
  net::io_context& ioc;
  std::unique_ptr<Websocket> ws;  // over TCP, over TLS, or over a Unix socket
  beast::flat_buffer buf;
  std::deque<std::string> outq;  // ioc thread only; the front is being written
  bool writing = false;
  bool dead = false;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> guard;
};

Link::Link(LinkOptions opts, std::function<void()> wake)
    : opts_(std::move(opts)), wake_(std::move(wake)), session_(new_hex_id()) {}

Link::~Link() { stop(std::chrono::milliseconds(0)); }

void Link::start() {
  http_ = std::make_unique<kgate::client::HttpClient>(opts_.ep);
  threads_left_ = 2;
  thread_ = std::thread([this] {
    run();
    std::lock_guard lk(mu_);
    --threads_left_;
    done_cv_.notify_all();
  });
  http_thread_ = std::thread([this] {
    http_worker();
    std::lock_guard lk(mu_);
    --threads_left_;
    done_cv_.notify_all();
  });
}

bool Link::stop(std::chrono::milliseconds grace) {
  if (!thread_.joinable() && !http_thread_.joinable()) return true;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    if (conn_) {
      auto c = conn_;
      net::post(c->ioc, [c] {
        if (c->dead) return;
        c->ws->async_close(websocket::close_code::normal, [c](beast::error_code) {
          c->dead = true;
          c->guard.reset();
          c->ioc.stop();
        });
      });
    }
  }
  cv_.notify_all();
  bool ended;
  {
    std::unique_lock lk(mu_);
    ended = done_cv_.wait_for(lk, std::max(grace, std::chrono::milliseconds(1)), [this] { return threads_left_ == 0; });
    if (!ended && conn_) conn_->ioc.stop();  // a peer that never answers the close
  }
  if (!ended) {
    std::unique_lock lk(mu_);
    ended = done_cv_.wait_for(lk, 500ms, [this] { return threads_left_ == 0; });
  }
  if (ended) {
    thread_.join();
    http_thread_.join();
  } else {
    // A blocking HTTP call (its own deadline) still runs: the process is exiting anyway.
    thread_.detach();
    http_thread_.detach();
  }
  return ended;
}

void Link::push(LinkEvent e) {
  {
    std::lock_guard lk(mu_);
    if (e.kind == LinkEvent::Kind::message) ++in_messages_;
    events_.push_back(std::move(e));
  }
  if (!stopping_) wake_();  // after stop() the ZMQ side is gone
}

std::deque<LinkEvent> Link::take() {
  std::deque<LinkEvent> out;
  std::shared_ptr<Conn> resume;
  {
    std::lock_guard lk(mu_);
    out.swap(events_);
    in_messages_ = 0;
    if (paused_ && conn_) {
      paused_ = false;
      resume = conn_;
    }
  }
  if (resume) net::post(resume->ioc, [this, resume] { start_read(resume); });
  return out;
}

Link::Sent Link::send(Channel channel, const WireMessage& wire) {
  KernelMessage m;
  m.channel = channel;
  m.wire = wire;
  m.wire.identities.clear();
  WsFrame f = encode_v1(m);
  std::lock_guard lk(mu_);
  if (!conn_) return Sent::down;
  if (out_messages_ >= opts_.limits.max_out_messages || out_bytes_ + f.data.size() > opts_.limits.max_out_bytes ||
      f.data.size() > opts_.limits.max_ws_message_bytes)
    return Sent::full;
  ++out_messages_;
  out_bytes_ += f.data.size();
  auto c = conn_;
  net::post(c->ioc, [this, c, data = std::move(f.data)]() mutable {
    c->outq.push_back(std::move(data));
    if (!c->writing) write_next(c);
  });
  return Sent::ok;
}

bool Link::interrupt(std::uint64_t tag) {
  {
    std::lock_guard lk(mu_);
    if (attached_.empty() || http_jobs_.size() >= opts_.limits.max_http_jobs) return false;
    http_jobs_.push_back(tag);
  }
  cv_.notify_all();
  return true;
}

void Link::http_worker() {
  while (true) {
    std::uint64_t tag;
    std::string kernel;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [this] { return stopping_ || !http_jobs_.empty(); });
      if (stopping_) return;
      tag = http_jobs_.front();
      http_jobs_.pop_front();
      kernel = attached_;
    }
    LinkEvent e;
    e.kind = LinkEvent::Kind::interrupt_done;
    e.tag = tag;
    if (kernel.empty()) {
      e.evalue = "the proxy is not attached to a kgate kernel";
    } else {
      auto r = http_->request("POST", "api/kernels/" + kernel + "/interrupt", nullptr, kInterruptTimeout);
      e.ok = r.status == 204 || r.status == 200;
      if (!e.ok)
        e.evalue = r.status == 0 ? "no running kgate at " + opts_.ep.url + " (" + r.error + ")"
                                 : "kgate refused the interrupt of kernel " + kernel + ": " + r.message();
    }
    push(std::move(e));
  }
}

// Which kernel to (re)attach to: the one attached before while it exists (unless one was
// named, which is the only one), else choose_kernel, else a new one.
bool Link::resolve(kgate::client::HttpClient& http, std::string& id, std::string& ename, std::string& evalue) {
  const std::string& url = opts_.ep.url;
  auto unreachable = [&](const kgate::client::HttpResult& r) {
    ename = "NoKgate";
    evalue = "no running kgate at " + url + " (" + r.error + ")";
    return false;
  };
  auto refused = [&](const kgate::client::HttpResult& r, const std::string& what) {
    ename = r.status == 401 || r.status == 403 ? "KgateAuth" : "KgateError";
    evalue = r.status == 401 || r.status == 403
                 ? "kgate at " + url + " refused the token (HTTP " + std::to_string(r.status) + "): " + auth_hint(opts_.ep)
                 : "kgate at " + url + " answered " + what + " with HTTP " + std::to_string(r.status) + ": " + r.message();
    return false;
  };
  std::string previous = id;
  if (!previous.empty() && opts_.kernel.empty()) {
    auto r = http.get("api/kernels/" + previous, kGetTimeout);
    if (r.status == 0) return unreachable(r);
    if (r.status == 200 && !is_dead(r.json_body())) return true;
    spdlog::warn("proxy-kernel: kgate kernel {} is gone (HTTP {}); looking for another", previous, r.status);
  }
  if (!opts_.kernel.empty()) {
    auto r = http.get("api/kernels", kGetTimeout);
    if (r.status == 0) return unreachable(r);
    if (r.status != 200) return refused(r, "GET api/kernels");
    std::string error;
    id = match_kernel(r.json_body(), opts_.kernel, error);
    if (id.empty()) {
      ename = "KgateKernelGone";
      evalue = error + " on " + url;
    }
    return !id.empty();
  }
  auto r = http.get("api/kgate/kernels", kGetTimeout);
  if (r.status == 0) return unreachable(r);
  if (r.status == 404) r = http.get("api/kernels", kGetTimeout);  // a Jupyter server without kgate's extensions
  if (r.status == 0) return unreachable(r);
  if (r.status != 200) return refused(r, "the kernel listing");
  id = choose_kernel(r.json_body());
  if (!id.empty()) return true;
  // No kernel at all: start one (the gateway's default kernelspec), so a notebook opened before
  // any agent ran has somewhere to run.  It is an ordinary kernel: it outlives the proxy.
  auto c = http.post("api/kernels", json::object(), kCreateTimeout);
  if (c.status == 0) return unreachable(c);
  json model = c.json_body();
  if (c.status != 201 || !model.is_object() || !model.contains("id") || !model["id"].is_string()) {
    ename = "NoKgateKernel";
    evalue = "kgate at " + url + " has no kernel, and starting one failed: " + c.message();
    return false;
  }
  id = model["id"].get<std::string>();
  spdlog::info("proxy-kernel: kgate at {} had no kernel; started {} (it outlives this proxy)", url, id);
  return true;
}

void Link::run() {
  std::string tls_error;
  auto tls_ctx = tls::client_context(opts_.ep, tls_error);
  std::string kernel;  // the kernel attached last (kept across drops)
  bool was_up = false; // the previous connection was up: an immediate retry may resume it
  auto backoff = std::chrono::milliseconds(250);
  while (!stopping_) {
    std::string ename, evalue;
    std::string previous = kernel;
    bool ok = tls_error.empty();
    if (!ok) {
      ename = "KgateTls";
      evalue = tls_error;
    }
    if (ok) ok = resolve(*http_, kernel, ename, evalue);
    net::io_context ioc{1};
    std::shared_ptr<Conn> c;
    if (ok && !stopping_) {
      c = std::make_shared<Conn>(opts_.ep, tls_ctx, ioc);
      std::string error;
      if (!open_ws(c, kernel, error)) {
        ok = false;
        ename = "NoKgate";
        evalue = "cannot open kgate kernel " + kernel + "'s websocket at " + opts_.ep.url + ": " + error;
      }
    }
    if (stopping_) break;
    if (!ok) {
      if (was_up || backoff == std::chrono::milliseconds(250))
        spdlog::warn("proxy-kernel: {}; retrying (up to every {} s)", evalue, opts_.max_backoff.count() / 1000);
      was_up = false;
      LinkEvent e;
      e.kind = LinkEvent::Kind::detached;
      e.ename = ename;
      e.evalue = evalue;
      {
        std::lock_guard lk(mu_);
        // A resume is no longer possible: the ZMQ side fails what was pending.
        for (auto& f : carry_) out_bytes_ -= std::min(out_bytes_, f.size());
        out_messages_ -= std::min(out_messages_, carry_.size());
        carry_.clear();
      }
      push(std::move(e));
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, backoff, [this] { return stopping_.load(); });
      backoff = std::min(backoff * 2, opts_.max_backoff);
      continue;
    }
    backoff = std::chrono::milliseconds(250);
    bool resumed = was_up && kernel == previous;
    ioc.restart();
    c->guard.emplace(ioc.get_executor());
    {
      std::lock_guard lk(mu_);
      conn_ = c;
      attached_ = kernel;
      paused_ = false;
      // Frames a dropped connection did not write go first, on a resume only.
      for (auto& f : carry_) c->outq.push_back(std::move(f));
      if (!resumed) {
        out_messages_ -= std::min(out_messages_, c->outq.size());
        for (auto& f : c->outq) out_bytes_ -= std::min(out_bytes_, f.size());
        c->outq.clear();
      }
      carry_.clear();
    }
    spdlog::info("proxy-kernel: attached to kgate kernel {} at {}{}", kernel, opts_.ep.url,
                 resumed ? " (reconnected)" : "");
    LinkEvent up;
    up.kind = LinkEvent::Kind::attached;
    up.kernel = kernel;
    up.resumed = resumed;
    push(std::move(up));
    net::post(ioc, [this, c] {
      start_read(c);
      // A send() between `conn_ = c` and this post has already started the writer: one
      // async_write at a time (two at once trip Beast's assertion, or interleave frames).
      if (!c->writing && !c->outq.empty()) write_next(c);
    });
    ioc.run();
    {
      std::lock_guard lk(mu_);
      conn_.reset();
      attached_.clear();
      for (auto& f : c->outq) carry_.push_back(std::move(f));  // the unwritten front included
      c->outq.clear();
    }
    if (stopping_) break;
    was_up = true;
    spdlog::warn("proxy-kernel: the websocket to kgate kernel {} closed; reconnecting", kernel);
    LinkEvent down;
    down.kind = LinkEvent::Kind::dropped;
    push(std::move(down));
  }
}

bool Link::open_ws(const std::shared_ptr<Conn>& c, const std::string& kernel, std::string& error) {
  const auto& ep = opts_.ep;
  std::string target = ep.base + "api/kernels/" + kernel + "/channels?session_id=" + session_;
  c->ws->read_message_max(opts_.limits.max_ws_message_bytes);
  beast::error_code ec;
  std::string protocol;
  const std::string why = c->ws->open(c->ioc, ep, target, std::string(kV1Protocol), kWsOpenTimeout, ec, &protocol);
  if (ec) {
    if (why != ec.message()) error = why;  // a failed TLS handshake or Unix connect, named
    else if (ec == websocket::error::upgrade_declined) error = "the gateway declined the websocket (is the kernel gone?)";
    else if (ec == beast::error::timeout) error = "no answer within " + std::to_string(kWsOpenTimeout.count()) + " s";
    else error = why;
    return false;
  }
  // Pings every 30 s; a kgate that stops answering for 60 s is dropped and looked for again.
  websocket::stream_base::timeout t{};
  t.handshake_timeout = std::chrono::seconds(10);
  t.idle_timeout = std::chrono::seconds(60);
  t.keep_alive_pings = true;
  c->ws->set_option(t);
  if (protocol != kV1Protocol) {
    error = "the gateway does not speak the " + std::string(kV1Protocol) + " websocket protocol";
    c->ws->async_close(websocket::close_code::normal, [](beast::error_code) {});
    c->ioc.restart();
    c->ioc.run_for(1s);
    return false;
  }
  return true;
}

void Link::fail(const std::shared_ptr<Conn>& c) {
  if (c->dead) return;
  c->dead = true;
  c->guard.reset();
  c->ioc.stop();  // pending handlers are destroyed with the io_context
}

void Link::start_read(const std::shared_ptr<Conn>& c) {
  if (c->dead) return;
  {
    Websocket& ws = *c->ws;
    ws.async_read(c->buf, [this, c, &ws](beast::error_code ec, std::size_t) {
      if (ec) {
        if (ec != websocket::error::closed && ec != net::error::operation_aborted)
          spdlog::debug("proxy-kernel: websocket read: {}", ec.message());
        return fail(c);
      }
      auto data = c->buf.cdata();
      std::string_view payload(static_cast<const char*>(data.data()), data.size());
      LinkEvent e;
      std::string err = ws.got_binary() ? decode_v1_frame(payload, e.channel, e.wire)
                                        : std::string("a text frame on a v1 websocket");
      c->buf.consume(c->buf.size());
      if (!err.empty()) {
        spdlog::warn("proxy-kernel: dropped a message from kgate that does not decode: {}", err);
      } else {
        push(std::move(e));
      }
      {
        std::lock_guard lk(mu_);
        if (in_messages_ >= opts_.limits.max_in_messages) {
          paused_ = true;  // take() resumes: kgate holds further output (bounded, and says so)
          return;
        }
      }
      start_read(c);
    });
  }
}

void Link::write_next(const std::shared_ptr<Conn>& c) {
  if (c->dead || c->outq.empty()) {
    c->writing = false;
    return;
  }
  c->writing = true;
  {
    Websocket& ws = *c->ws;
    ws.binary(true);
    ws.async_write(net::buffer(c->outq.front()), [this, c](beast::error_code ec, std::size_t) {
      if (ec) {
        c->writing = false;
        return fail(c);
      }
      {
        std::lock_guard lk(mu_);
        out_messages_ -= std::min<std::size_t>(out_messages_, 1);
        out_bytes_ -= std::min(out_bytes_, c->outq.front().size());
      }
      c->outq.pop_front();
      write_next(c);
    });
  }
}

}  // namespace kgate::client::proxy
