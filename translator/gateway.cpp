// kgate-mcp's side of a gateway: HTTP calls, the agent link, a kernel's channels websocket.
#include "gateway.hpp"

#include <sys/un.h>

#include <algorithm>
#include <utility>  // Boost 1.74 asio/awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <spdlog/spdlog.h>

#include "tls.hpp"
#include "version_info.hpp"

namespace kgate::mcp {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

namespace {

constexpr auto kConnectTimeout = std::chrono::seconds(5);
constexpr std::size_t kMaxResponseBytes = 256u << 20;   // a notebook export can be large
constexpr std::size_t kMaxWsMessageBytes = 256u << 20;

std::string user_agent() { return std::string(server_name()) + "/" + std::string(server_version()); }

std::string percent_encode(std::string_view s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') out += char(c);
    else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// A failed connect to a Unix socket as one sentence naming the path.
std::string unix_connect_message(const Endpoint& ep, const beast::error_code& ec) {
  std::string hint = ec == net::error::access_denied ? "the socket is its owner's only (mode 0600): run as kgate's user"
                     : ec == net::error::connection_refused ? "nobody accepts on it: a stale socket; is kgate running?"
                     : ec == beast::error::timeout ? "no answer: is kgate busy or stopped?"
                                                   : "is kgate serving with --unix?";
  return "cannot connect to " + ep.url + ": " + ec.message() + " (" + hint + ")";
}

// Resolves `ep`, connects the TCP layer of `s` (deadline `timeout`) and, when `s` is a TLS stream,
// does the TLS handshake (deadline `timeout` again).  Then done(ec, open_error): `open_error`
// names a failed handshake, else it is "".  The caller runs the io_context.
template <class Stream>
void async_open(Stream& s, tcp::resolver& resolver, const Endpoint& ep, std::chrono::milliseconds timeout,
                std::function<void(beast::error_code, std::string)> done) {
  resolver.async_resolve(ep.host, ep.port, [&s, &ep, timeout, done](beast::error_code rec,
                                                                   tcp::resolver::results_type results) {
    if (rec) return done(rec, "");
    beast::get_lowest_layer(s).expires_after(timeout);
    beast::get_lowest_layer(s).async_connect(results, [&s, &ep, timeout, done](beast::error_code cec,
                                                                               const tcp::endpoint&) {
      if (cec) return done(cec, "");
      tls::TlsStream* t = tls::tls_layer(s);
      if (!t) return done({}, "");
      std::string error;
      if (!tls::set_peer(*t, ep, error)) return done(net::error::invalid_argument, error);
      beast::get_lowest_layer(s).expires_after(timeout);
      t->async_handshake(ssl::stream_base::client, [t, &ep, timeout, done](beast::error_code hec) {
        done(hec, hec ? tls::handshake_message(ep, *t, hec, timeout) : "");
      });
    });
  });
}

// The same for a unix:// endpoint: connects to its socket path; `open_error` names the path.
void async_open(tls::UnixStream& s, tcp::resolver&, const Endpoint& ep, std::chrono::milliseconds timeout,
                std::function<void(beast::error_code, std::string)> done) {
  s.expires_after(timeout);
  s.async_connect(net::local::stream_protocol::endpoint(ep.socket_path),
                  [&ep, done](beast::error_code ec) { done(ec, ec ? unix_connect_message(ep, ec) : ""); });
}

void set_no_delay(beast::tcp_stream& s) {
  beast::error_code ignored;
  s.socket().set_option(tcp::no_delay(true), ignored);
}
void set_no_delay(tls::UnixStream&) {}

}  // namespace

bool parse_endpoint_url(const std::string& url, Endpoint& ep, std::string& error) {
  auto sep = url.find("://");
  if (sep == std::string::npos) {
    error = "'" + url + "' is not a URL (expected http://host:port/)";
    return false;
  }
  ep.url = url;
  ep.scheme = url.substr(0, sep);
  for (auto& c : ep.scheme) c = char(std::tolower(static_cast<unsigned char>(c)));
  ep.socket_path.clear();
  if (ep.scheme == "unix") {
    // unix:///path: everything after the (empty) authority is the socket's path.
    std::string path = url.substr(sep + 3);
    if (path.empty() || path.front() != '/') {
      error = "'" + url + "' has no absolute socket path (expected unix:///path/to/kgate.sock: three slashes)";
      return false;
    }
    if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
      error = "the socket path in " + url + " is too long (" + std::to_string(path.size()) + " bytes; at most " +
              std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + ")";
      return false;
    }
    ep.socket_path = path;
    ep.host = "localhost";
    ep.port.clear();
    ep.base = "/";
    return true;
  }
  if (ep.scheme != "http" && ep.scheme != "https") {
    error = "unsupported URL scheme '" + ep.scheme + "' in " + url + " (expected http, https or unix)";
    return false;
  }
  const std::string default_port = ep.scheme == "https" ? "443" : "80";
  std::string rest = url.substr(sep + 3);
  auto slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  ep.base = slash == std::string::npos ? "/" : rest.substr(slash);
  if (ep.base.back() != '/') ep.base += '/';
  if (hostport.empty()) {
    error = "no host in " + url;
    return false;
  }
  if (hostport.front() == '[') {
    auto close = hostport.find(']');
    if (close == std::string::npos) {
      error = "bad IPv6 address in " + url;
      return false;
    }
    ep.host = hostport.substr(1, close - 1);
    ep.port = close + 1 < hostport.size() && hostport[close + 1] == ':' ? hostport.substr(close + 2) : default_port;
  } else {
    auto colon = hostport.rfind(':');
    ep.host = hostport.substr(0, colon);
    ep.port = colon == std::string::npos ? default_port : hostport.substr(colon + 1);
  }
  if (ep.port.empty() || ep.port.find_first_not_of("0123456789") != std::string::npos) {
    error = "bad port in " + url;
    return false;
  }
  return true;
}

json HttpResult::json_body() const { return json::parse(body, nullptr, false); }

std::string HttpResult::message() const {
  if (status == 0) return error;
  json j = json_body();
  if (j.is_object() && j.contains("message") && j["message"].is_string()) return j["message"].get<std::string>();
  return "HTTP " + std::to_string(status);
}

// ---------------------------------------------------------------------------------------
// HttpClient

struct HttpClient::Conn {
  Conn(const Endpoint& ep, std::shared_ptr<ssl::context> tls) : stream(ep, std::move(tls), ioc) {}
  net::io_context ioc{1};
  tls::Stream stream;  // TCP, TLS over TCP, or a Unix socket
  beast::flat_buffer buffer;
  bool connected = false;
};

HttpClient::HttpClient(Endpoint ep) : ep_(std::move(ep)) { tls_ = tls::client_context(ep_, tls_error_); }
HttpClient::~HttpClient() = default;

std::unique_ptr<HttpClient::Conn> HttpClient::take() {
  std::lock_guard lk(mu_);
  if (idle_.empty()) return std::make_unique<Conn>(ep_, tls_);
  auto c = std::move(idle_.back());
  idle_.pop_back();
  return c;
}

void HttpClient::give_back(std::unique_ptr<Conn> c) {
  std::lock_guard lk(mu_);
  if (idle_.size() < 4) idle_.push_back(std::move(c));
}

HttpResult HttpClient::request(const std::string& method, const std::string& path, const json* body,
                               std::chrono::milliseconds timeout) {
  HttpResult out;
  if (!tls_error_.empty()) {
    out.error = tls_error_;
    return out;
  }
  http::request<http::string_body> req{http::string_to_verb(method), ep_.base + path, 11};
  req.set(http::field::host, ep_.host_header());
  req.set(http::field::user_agent, user_agent());
  if (!ep_.token.empty()) req.set(http::field::authorization, "token " + ep_.token);
  if (body) {
    req.set(http::field::content_type, "application/json");
    req.body() = body->dump();
  }
  req.keep_alive(true);
  req.prepare_payload();

  for (int attempt = 0; attempt < 2; ++attempt) {
    auto c = take();
    bool reused = c->connected;
    beast::error_code ec;
    std::size_t response_bytes = 0;
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxResponseBytes);
    c->ioc.restart();
    std::string tls_error;
    auto do_exchange = [&] {
      c->stream.visit([&](auto& s) {
        beast::get_lowest_layer(s).expires_after(timeout + std::chrono::seconds(5));
        http::async_write(s, req, [&, ps = &s](beast::error_code wec, std::size_t) {
          if (wec) {
            ec = wec;
            return;
          }
          http::async_read(*ps, c->buffer, parser, [&](beast::error_code rec, std::size_t n) {
            ec = rec;
            response_bytes = n;
          });
        });
      });
    };
    tcp::resolver resolver(c->ioc);  // outlives run(): destroying it would cancel the resolve
    if (!c->connected) {
      c->stream.visit([&](auto& s) {
        async_open(s, resolver, ep_, kConnectTimeout, [&, ps = &s](beast::error_code oec, std::string terr) {
          if (oec) {
            ec = oec;
            tls_error = std::move(terr);  // a failed handshake or Unix connect, named
            return;
          }
          c->connected = true;
          set_no_delay(beast::get_lowest_layer(*ps));
          do_exchange();
        });
      });
    } else {
      do_exchange();
    }
    c->ioc.run();
    if (!ec) {
      auto& res = parser.get();
      out.status = static_cast<int>(res.result_int());
      out.body = std::move(res.body());
      out.error.clear();
      if (res.keep_alive()) give_back(std::move(c));
      return out;
    }
    // A kept-alive connection the server had closed fails before any response: retry once on a
    // fresh one (the request was not processed).
    if (reused && response_bytes == 0 &&
        (ec == http::error::end_of_stream || ec == net::error::connection_reset || ec == net::error::broken_pipe ||
         ec == net::error::eof || ec == ssl::error::stream_truncated) &&
        attempt == 0)
      continue;
    out.status = 0;
    if (!tls_error.empty())
      out.error = tls_error;
    else if (ec == beast::error::timeout)
      out.error = "no answer from " + ep_.url + " within " + std::to_string(timeout.count() / 1000) + " s";
    else if (ec == net::error::connection_refused)
      out.error = "connection refused by " + ep_.url + " (is the gateway running?)";
    else
      out.error = ep_.url + ": " + ec.message();
    return out;
  }
  return out;
}

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
    tls::Websocket wsock(ep, tls_ctx, ioc);
    beast::flat_buffer buf;
    tcp::resolver resolver(ioc);
    std::string target = ep.base + "api/kgate/agent?agent=" + percent_encode(agent) + "&label=" + percent_encode(label);
    beast::error_code ec;
    tls_error.clear();
    bool up = false;
    wsock.visit([&](auto& ws) {  // runs the loop: `ws` outlives every handler
      std::function<void()> read;  // lives as long as the loop runs its reads
      async_open(ws.next_layer(), resolver, ep, kConnectTimeout, [&](beast::error_code oec, std::string terr) {
        if (oec) {
          ec = oec;
          tls_error = std::move(terr);
          return;
        }
        ws.set_option(websocket::stream_base::decorator([&ep](websocket::request_type& r) {
          r.set(http::field::user_agent, user_agent());
          if (!ep.token.empty()) r.set(http::field::authorization, "token " + ep.token);
        }));
        ws.async_handshake(ep.host_header(), target, [&](beast::error_code hec) {
          if (hec) return void(ec = hec);
          beast::get_lowest_layer(ws).expires_never();
          ws.set_option(websocket::stream_base::timeout::suggested(beast::role_type::client));
          up = true;
          connected_ = true;
          backoff = std::chrono::milliseconds(200);
          {
            std::lock_guard lk(mu_);
            close_ = [&ioc, &ws] {
              net::post(ioc, [&ws] { ws.async_close(websocket::close_code::normal, [](beast::error_code) {}); });
            };
            if (stopping_) close_();
          }
          read = [&] {
            ws.async_read(buf, [&](beast::error_code rec2, std::size_t) {
              buf.clear();
              if (rec2) return void(ec = rec2);
              read();
            });
          };
          read();
        });
      });
      ioc.run();
      std::lock_guard lk(mu_);
      close_ = nullptr;
    });
    connected_ = false;
    if (stopping_) break;
    if (!up) spdlog::debug("agent link to {}: {}", ep.url, tls_error.empty() ? ec.message() : tls_error);
    else spdlog::info("agent link to {} dropped ({}); reconnecting", ep.url, ec.message());
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, backoff, [this] { return stopping_.load(); });
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

// ---------------------------------------------------------------------------------------
// KernelChannel

struct KernelChannel::Impl {
  Impl(const Endpoint& ep, std::shared_ptr<ssl::context> tls) : ws(ep, std::move(tls), ioc) {}
  net::io_context ioc{1};
  tls::Websocket ws;  // over TCP, over TLS, or over a Unix socket
  beast::flat_buffer buf;
  std::deque<std::string> outq;
  bool writing = false;
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
  beast::error_code ec;
  bool up = false;
  tcp::resolver resolver(impl->ioc);
  impl->ws.visit([&](auto& ws) {  // runs the loop: `ws` outlives every handler
    async_open(ws.next_layer(), resolver, ep, timeout, [&](beast::error_code oec, std::string terr) {
      if (oec) {
        ec = oec;
        tls_error = std::move(terr);
        return;
      }
      ws.set_option(websocket::stream_base::decorator([&ep](websocket::request_type& r) {
        r.set(http::field::user_agent, user_agent());
        if (!ep.token.empty()) r.set(http::field::authorization, "token " + ep.token);
      }));
      ws.read_message_max(kMaxWsMessageBytes);
      ws.async_handshake(ep.host_header(), target, [&](beast::error_code hec) {
        if (hec) return void(ec = hec);
        beast::get_lowest_layer(ws).expires_never();
        ws.set_option(websocket::stream_base::timeout::suggested(beast::role_type::client));
        up = true;
      });
    });
    impl->ioc.run();
  });
  if (!up) {
    error = "cannot open the kernel's websocket: " + (tls_error.empty() ? ec.message() : tls_error);
    impl_.reset();
    return false;
  }
  open_ = true;
  impl->ioc.restart();
  thread_ = std::thread([this] { reader(); });
  return true;
}

void KernelChannel::reader() {
  auto impl = impl_;
  impl->ws.visit([&](auto& ws) {  // runs the loop: `ws` outlives every handler
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
  });
  open_ = false;
  cv_.notify_all();
}

void KernelChannel::close() {
  if (!impl_) return;
  auto impl = impl_;
  net::post(impl->ioc, [impl] {
    impl->ws.visit([&](auto& ws) {
      ws.async_close(websocket::close_code::normal, [impl](beast::error_code) { impl->ioc.stop(); });
    });
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
    std::function<void()> next;
    auto write_next = std::make_shared<std::function<void()>>();
    *write_next = [impl, write_next] {
      if (impl->outq.empty()) {
        impl->writing = false;
        return;
      }
      impl->writing = true;
      impl->ws.visit([&](auto& ws) {
        ws.text(true);
        ws.async_write(net::buffer(impl->outq.front()), [impl, write_next](beast::error_code ec, std::size_t) {
          impl->outq.pop_front();
          if (ec) {
            impl->outq.clear();
            impl->writing = false;
            return;
          }
          (*write_next)();
        });
      });
    };
    (*write_next)();
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

}  // namespace kgate::mcp
