// `kgate proxy-kernel`: the ZMQ side, a Jupyter kernel to its client (see proxy_kernel.hpp).
#include "cli/proxy_kernel.hpp"

#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <cstdlib>
#include <iostream>
#include <unordered_map>

#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "kgate/jupyter/connection.hpp"
#include "kgate/version.hpp"
#include "kgate/client/gateways_toml.hpp"
#include "kgate/client/proxy_link.hpp"

namespace kgate::gw::proxy {

using client::proxy::Link;
using client::proxy::LinkEvent;
using client::proxy::LinkOptions;

namespace {

// Bounds of the ZMQ side (DEV.md "kgate proxy-kernel"); each one, when hit, is told to the client.
constexpr std::size_t kMaxPending = 10'000;                   // requests awaiting a reply
constexpr std::size_t kMaxHeldMessages = 1'000;               // held while (re)connecting
constexpr std::size_t kMaxHeldBytes = std::size_t{64} << 20;
constexpr std::size_t kMaxMessageBytes = std::size_t{256} << 20;  // kgate's websocket limit
constexpr int kIopubHwm = 100'000;  // per subscriber; past it iopub waits (XPUB_NODROP), never drops
constexpr std::size_t kMaxDrain = 256;  // messages read from one socket per poll round (fairness)

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

std::string reply_type(const std::string& request_type) {
  return ends_with(request_type, "_request") ? request_type.substr(0, request_type.size() - 8) + "_reply"
                                             : request_type + "_reply";
}

bool send_frames(zmq::socket_t& s, const std::vector<std::string>& frames) {
  for (std::size_t i = 0; i < frames.size(); ++i) {
    auto flags = zmq::send_flags::dontwait;
    if (i + 1 < frames.size()) flags = flags | zmq::send_flags::sndmore;
    if (!s.send(zmq::buffer(frames[i]), flags)) return false;
  }
  return true;
}

// One multipart message; false when there is none.
bool recv_parts(zmq::socket_t& s, std::vector<zmq::message_t>& parts) {
  parts.clear();
  while (true) {
    zmq::message_t m;
    if (!s.recv(m, zmq::recv_flags::dontwait)) return !parts.empty();
    bool more = m.more();
    parts.push_back(std::move(m));
    if (!more) return true;
  }
}

struct Route {
  Channel channel = Channel::shell;
  std::vector<std::string> ids;  // the client's routing identities
  std::string header;            // the request's header (the parent of what answers it)
  std::string msg_type;
};

struct Held {
  Channel channel;
  WireMessage wire;
  std::string msg_id, msg_type;
};

enum class State { connecting, attached, detached };

class Proxy {
 public:
  Proxy(ConnectionInfo conn, LinkOptions lo)
      : conn_(std::move(conn)),
        signer_(conn_.key, conn_.signature_scheme),
        session_(new_hex_id()),
        wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
        link_(std::move(lo), [this] {
          std::uint64_t one = 1;
          [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
        }) {
    lang_ = {{"name", "python"}, {"mimetype", "text/x-python"}, {"file_extension", ".py"}};
  }
  ~Proxy() {
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  int run(int signal_fd);

 private:
  zmq::socket_t& socket(Channel ch) {
    switch (ch) {
      case Channel::shell: return shell_;
      case Channel::control: return control_;
      case Channel::stdin_: return stdin_;
      case Channel::iopub: return iopub_;
    }
    return shell_;
  }
  void bind(zmq::socket_t& s, int port, const char* what);
  void on_client(Channel ch);
  void handle(Channel ch, WireMessage w, const std::string& msg_id, const std::string& msg_type);
  void forward(Channel ch, WireMessage w, const std::string& msg_id, const std::string& msg_type);
  void hold(Channel ch, WireMessage w, const std::string& msg_id, const std::string& msg_type);
  void answer_locally(Channel ch, const WireMessage& w, const std::string& msg_type);
  void refuse(const Route& r, const std::string& ename, const std::string& evalue);
  void fail_pending(const std::string& ename, const std::string& evalue);
  void on_link_events();
  bool on_kernel_message(LinkEvent& e);  // false: iopub is full, retry later
  void send_msg(Channel ch, const std::vector<std::string>& ids, const std::string& type, const std::string& parent,
                const json& content);
  void status(const std::string& parent, const char* state) {
    send_msg(Channel::iopub, {}, "status", parent, {{"execution_state", state}});
  }
  json kernel_info(const std::string& banner) const;
  std::string detached_banner() const;

  ConnectionInfo conn_;
  Signer signer_;
  std::string session_;  // the session of the messages the proxy makes itself
  int wake_fd_;
  Link link_;
  zmq::context_t ctx_{1};
  zmq::socket_t shell_{ctx_, zmq::socket_type::router};
  zmq::socket_t control_{ctx_, zmq::socket_type::router};
  zmq::socket_t stdin_{ctx_, zmq::socket_type::router};
  zmq::socket_t iopub_{ctx_, zmq::socket_type::xpub};
  zmq::socket_t hb_{ctx_, zmq::socket_type::rep};

  State state_ = State::connecting;
  std::string kernel_;             // the kgate kernel attached (or last attached)
  std::string ename_ = "NoKgate";  // why detached
  std::string evalue_;
  std::unordered_map<std::string, Route> pending_;  // request msg_id -> its client
  std::deque<Held> held_;
  std::size_t held_bytes_ = 0;
  std::unordered_map<std::uint64_t, Route> interrupts_;
  std::uint64_t next_tag_ = 0;
  std::deque<LinkEvent> backlog_;  // taken from the link, not yet delivered (iopub was full)
  json lang_;                      // language_info of the kernel's last kernel_info_reply
  int execution_count_ = 0;        // for the error replies the proxy makes
  std::uint64_t bad_signatures_ = 0;
  std::uint64_t unroutable_ = 0;
  bool exit_ = false;
};

void Proxy::bind(zmq::socket_t& s, int port, const char* what) {
  std::string ep = conn_.endpoint(port);
  try {
    s.bind(ep);
  } catch (const zmq::error_t& e) {
    throw std::runtime_error(std::string("cannot bind ") + what + " on " + ep + ": " + e.what());
  }
}

void Proxy::send_msg(Channel ch, const std::vector<std::string>& ids, const std::string& type,
                     const std::string& parent, const json& content) {
  WireMessage w;
  w.identities = ch == Channel::iopub ? std::vector<std::string>{"kernel." + session_ + "." + type} : ids;
  w.header = make_header(type, session_).dump();
  w.parent_header = parent.empty() ? "{}" : parent;
  w.metadata = "{}";
  w.content = content.dump();
  if (!send_frames(socket(ch), encode(w, signer_)) && ch == Channel::iopub)
    spdlog::warn("proxy-kernel: iopub is full; a {} the proxy made was not sent", type);
}

json Proxy::kernel_info(const std::string& banner) const {
  return {{"status", "ok"},
          {"protocol_version", "5.3"},
          {"implementation", "kgate-proxy"},
          {"implementation_version", kgate::version()},
          {"language_info", lang_},
          {"banner", banner},
          {"help_links", json::array()},
          {"debugger", false}};
}

std::string Proxy::detached_banner() const {
  return "kgate proxy kernel: " + evalue_ +
         ".\nEvery request gets an error until then; the proxy keeps retrying and attaches by itself.";
}

// The one reply a request gets when it cannot go to kgate (for an execute_request also an
// error on iopub between busy and idle, so a notebook shows it under the cell).
void Proxy::refuse(const Route& r, const std::string& ename, const std::string& evalue) {
  if (!ends_with(r.msg_type, "_request")) {
    // No reply to send (input_reply, comm messages): say it where the client can see it.
    spdlog::warn("proxy-kernel: a {} was not delivered: {}", r.msg_type, evalue);
    send_msg(Channel::iopub, {}, "stream", r.header,
             {{"name", "stderr"}, {"text", "[kgate proxy] a " + r.msg_type + " was not delivered: " + evalue + "\n"}});
    return;
  }
  json content = {{"status", "error"}, {"ename", ename}, {"evalue", evalue}, {"traceback", {ename + ": " + evalue}}};
  bool shell = r.channel == Channel::shell;
  if (shell) status(r.header, "busy");
  if (r.msg_type == "execute_request") {
    content["execution_count"] = ++execution_count_;
    content["user_expressions"] = json::object();
    content["payload"] = json::array();
    send_msg(Channel::iopub, {}, "error", r.header,
             {{"ename", ename}, {"evalue", evalue}, {"traceback", {ename + ": " + evalue}}});
  }
  send_msg(r.channel, r.ids, reply_type(r.msg_type), r.header, content);
  if (shell) status(r.header, "idle");
}

void Proxy::fail_pending(const std::string& ename, const std::string& evalue) {
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [id, r] : pending) refuse(r, ename, evalue);
}

void Proxy::answer_locally(Channel ch, const WireMessage& w, const std::string& msg_type) {
  Route r{ch, w.identities, w.header, msg_type};
  if (msg_type == "kernel_info_request") {  // so the client considers the kernel alive
    if (ch == Channel::shell) status(w.header, "busy");
    send_msg(ch, w.identities, "kernel_info_reply", w.header, kernel_info(detached_banner()));
    if (ch == Channel::shell) status(w.header, "idle");
    return;
  }
  refuse(r, ename_, evalue_);
}

void Proxy::hold(Channel ch, WireMessage w, const std::string& msg_id, const std::string& msg_type) {
  std::size_t bytes = w.header.size() + w.content.size() + w.metadata.size() + w.parent_header.size();
  for (auto& b : w.buffers) bytes += b.size();
  if (held_.size() >= kMaxHeldMessages || held_bytes_ + bytes > kMaxHeldBytes) {
    refuse(Route{ch, w.identities, w.header, msg_type}, "ProxyBusy",
           "the kgate proxy already holds " + std::to_string(held_.size()) +
               " messages while it connects to kgate at " + link_.url() + "; try again");
    return;
  }
  held_bytes_ += bytes;
  held_.push_back(Held{ch, std::move(w), msg_id, msg_type});
}

void Proxy::forward(Channel ch, WireMessage w, const std::string& msg_id, const std::string& msg_type) {
  bool request = ends_with(msg_type, "_request");
  if (request) {
    if (pending_.size() >= kMaxPending && !pending_.count(msg_id)) {
      refuse(Route{ch, w.identities, w.header, msg_type}, "TooManyRequests",
             std::to_string(kMaxPending) + " requests already await their reply through the kgate proxy");
      return;
    }
    pending_[msg_id] = Route{ch, w.identities, w.header, msg_type};
  }
  switch (link_.send(ch, w)) {
    case Link::Sent::ok: return;
    case Link::Sent::full:
      if (request) pending_.erase(msg_id);
      refuse(Route{ch, w.identities, w.header, msg_type}, "ProxyQueueFull",
             "the kgate proxy's queue to kgate is full (kgate reads too slowly); try again");
      return;
    case Link::Sent::down:  // the websocket just went; its `dropped` event is on its way
      if (request) pending_.erase(msg_id);
      state_ = State::connecting;
      hold(ch, std::move(w), msg_id, msg_type);
      return;
  }
}

void Proxy::handle(Channel ch, WireMessage w, const std::string& msg_id, const std::string& msg_type) {
  if (ch == Channel::control && msg_type == "shutdown_request") {
    // Answered here: closing or restarting the notebook's kernel stops only the proxy.
    json content = json::parse(w.content, nullptr, false);
    bool restart = content.is_object() && content.value("restart", false);
    json reply = {{"status", "ok"}, {"restart", restart}};
    send_msg(Channel::control, w.identities, "shutdown_reply", w.header, reply);
    send_msg(Channel::iopub, {}, "shutdown_reply", w.header, reply);
    spdlog::info("proxy-kernel: shutdown_request (restart {}): exiting; kgate kernel {} keeps running", restart,
                 kernel_.empty() ? "(none)" : kernel_);
    exit_ = true;
    return;
  }
  if (ch == Channel::control && msg_type == "interrupt_request") {
    Route r{ch, w.identities, w.header, msg_type};
    if (state_ != State::attached) {
      refuse(r, ename_, state_ == State::detached ? evalue_ : "the kgate proxy is still connecting to " + link_.url());
      return;
    }
    std::uint64_t tag = ++next_tag_;
    if (!link_.interrupt(tag)) {
      refuse(r, "ProxyBusy", "too many interrupts are waiting for kgate; try again");
      return;
    }
    interrupts_[tag] = std::move(r);
    return;
  }
  switch (state_) {
    case State::attached: return forward(ch, std::move(w), msg_id, msg_type);
    case State::connecting: return hold(ch, std::move(w), msg_id, msg_type);
    case State::detached: return answer_locally(ch, w, msg_type);
  }
}

void Proxy::on_client(Channel ch) {
  zmq::socket_t& s = socket(ch);
  std::vector<zmq::message_t> parts;
  for (std::size_t n = 0; n < kMaxDrain && !exit_ && recv_parts(s, parts); ++n) {
    std::vector<std::string_view> frames;
    frames.reserve(parts.size());
    std::size_t total = 0;
    for (auto& p : parts) {
      frames.emplace_back(static_cast<const char*>(p.data()), p.size());
      total += p.size();
    }
    WireMessage w;
    DecodeLimits limits;
    limits.max_message_bytes = kMaxMessageBytes;
    auto ec = decode(frames, signer_, w, limits);
    if (ec == wire_errc::frame_too_large) {
      // Too big for kgate's websocket: answer it (unverified, so only with an error).
      auto d = std::find(frames.begin(), frames.end(), kDelimiter);
      if (d != frames.end() && frames.end() - d > 2) {
        std::vector<std::string> ids(frames.begin(), d);
        std::string header(*(d + 2));
        json h = json::parse(header, nullptr, false);
        if (h.is_object())
          refuse(Route{ch, ids, header, h.value("msg_type", "")}, "MessageTooLarge",
                 "a message of " + std::to_string(total) + " bytes is over the kgate proxy's limit of " +
                     std::to_string(kMaxMessageBytes) + " bytes");
      }
      continue;
    }
    if (ec) {
      if (ec == wire_errc::bad_signature || ec == wire_errc::missing_signature)
        spdlog::warn("proxy-kernel: dropped a {} message with a bad signature ({} so far)", channel_name(ch),
                     ++bad_signatures_);
      else
        spdlog::warn("proxy-kernel: dropped a {} message that does not decode: {}", channel_name(ch), ec.message());
      continue;
    }
    json h = json::parse(w.header, nullptr, false);
    std::string msg_id = h.is_object() ? h.value("msg_id", "") : "";
    std::string msg_type = h.is_object() ? h.value("msg_type", "") : "";
    if (msg_id.empty() || msg_type.empty()) {
      spdlog::warn("proxy-kernel: dropped a {} message without msg_id or msg_type", channel_name(ch));
      continue;
    }
    handle(ch, std::move(w), msg_id, msg_type);
  }
}

bool Proxy::on_kernel_message(LinkEvent& e) {
  WireMessage& w = e.wire;
  if (e.channel == Channel::iopub) {
    json h = json::parse(w.header, nullptr, false);
    std::string type = h.is_object() ? h.value("msg_type", "") : "";
    w.identities = {"kernel." + kernel_ + "." + type};
    // XPUB_NODROP: a full subscriber makes the send fail instead of dropping; try again later.
    return send_frames(iopub_, encode(w, signer_));
  }
  json parent = json::parse(w.parent_header, nullptr, false);
  std::string pid = parent.is_object() ? parent.value("msg_id", "") : "";
  auto it = pending_.find(pid);
  if (it == pending_.end()) {
    // A reply to a request this proxy already answered (it failed it when kgate went away).
    spdlog::debug("proxy-kernel: no client waits for the {} message with parent {} ({} so far)",
                  channel_name(e.channel), pid, ++unroutable_);
    return true;
  }
  json h = json::parse(w.header, nullptr, false);
  std::string type = h.is_object() ? h.value("msg_type", "") : "";
  w.identities = it->second.ids;  // stdin: the ids of the client that sent the execute_request
  if (type == "kernel_info_reply") {
    json c = json::parse(w.content, nullptr, false);
    if (c.is_object()) {
      if (c.contains("language_info") && c["language_info"].is_object()) lang_ = c["language_info"];
      std::string banner = c.value("banner", "");
      c["banner"] = banner + (banner.empty() ? "" : "\n") + "kgate proxy kernel: attached to kgate kernel " +
                    kernel_ + " at " + link_.url() +
                    ". Closing or restarting this kernel stops only the proxy; the kgate kernel keeps running.";
      w.content = c.dump();
    }
  }
  send_frames(socket(e.channel), encode(w, signer_));  // ROUTER: a client that went away is skipped
  if (e.channel != Channel::stdin_ && ends_with(type, "_reply")) pending_.erase(it);
  return true;
}

void Proxy::on_link_events() {
  if (backlog_.empty()) backlog_ = link_.take();
  while (!backlog_.empty() && !exit_) {
    LinkEvent& e = backlog_.front();
    switch (e.kind) {
      case LinkEvent::Kind::message:
        if (!on_kernel_message(e)) return;  // iopub full: wait until it can take more
        break;
      case LinkEvent::Kind::attached: {
        bool changed = !kernel_.empty() && kernel_ != e.kernel;
        if (!e.resumed && !pending_.empty())
          fail_pending("KgateKernelGone", "the connection to kgate kernel " + kernel_ +
                                              " was lost before this request was answered");
        if (changed)
          spdlog::warn("proxy-kernel: now attached to kgate kernel {} (kernel {} is gone): its namespace is another",
                       e.kernel, kernel_);
        kernel_ = e.kernel;
        state_ = State::attached;
        auto held = std::move(held_);
        held_.clear();
        held_bytes_ = 0;
        for (auto& m : held) forward(m.channel, std::move(m.wire), m.msg_id, m.msg_type);
        break;
      }
      case LinkEvent::Kind::dropped:
        state_ = State::connecting;
        break;
      case LinkEvent::Kind::detached: {
        state_ = State::detached;
        ename_ = e.ename;
        evalue_ = e.evalue;
        fail_pending(ename_, evalue_);
        auto held = std::move(held_);
        held_.clear();
        held_bytes_ = 0;
        for (auto& m : held) answer_locally(m.channel, m.wire, m.msg_type);
        break;
      }
      case LinkEvent::Kind::interrupt_done: {
        auto it = interrupts_.find(e.tag);
        if (it == interrupts_.end()) break;
        if (e.ok)
          send_msg(Channel::control, it->second.ids, "interrupt_reply", it->second.header, {{"status", "ok"}});
        else
          refuse(it->second, "InterruptFailed", e.evalue);
        interrupts_.erase(it);
        break;
      }
    }
    backlog_.pop_front();
    if (backlog_.empty()) backlog_ = link_.take();
  }
}

int Proxy::run(int signal_fd) {
  for (auto* s : {&shell_, &control_, &stdin_, &iopub_, &hb_}) s->set(zmq::sockopt::linger, 1000);
  for (auto* s : {&shell_, &control_, &stdin_}) {
    s->set(zmq::sockopt::router_handover, 1);  // a client reconnecting with its identity takes over
    s->set(zmq::sockopt::sndhwm, 0);           // replies are bounded by the pending table
  }
  iopub_.set(zmq::sockopt::sndhwm, kIopubHwm);
  iopub_.set(zmq::sockopt::xpub_nodrop, 1);
  bind(shell_, conn_.shell_port, "shell");
  bind(control_, conn_.control_port, "control");
  bind(stdin_, conn_.stdin_port, "stdin");
  bind(iopub_, conn_.iopub_port, "iopub");
  bind(hb_, conn_.hb_port, "hb");

  // The parent (the client that launched us) is watched: a kernel ends with it.  Also the pid
  // in $JPY_PARENT_PID (jupyter_client sets it), which catches a parent that died before this.
  const pid_t parent = ::getppid();
  pid_t jpy_parent = 0;
  if (const char* p = std::getenv("JPY_PARENT_PID"); p && *p) jpy_parent = pid_t(std::atol(p));
  auto parent_gone = [&] {
    if (parent != 1 && ::getppid() != parent) return true;
    return jpy_parent > 0 && ::kill(jpy_parent, 0) != 0 && errno == ESRCH;
  };
  link_.start();
  spdlog::info("proxy-kernel: kernel on {} (shell {}), forwarding to kgate at {}", conn_.ip, conn_.shell_port,
               link_.url());
  std::vector<std::string> hb_frames;
  while (!exit_) {
    bool iopub_blocked = !backlog_.empty();
    zmq::pollitem_t items[] = {
        {shell_.handle(), 0, ZMQ_POLLIN, 0},
        {control_.handle(), 0, ZMQ_POLLIN, 0},
        {stdin_.handle(), 0, ZMQ_POLLIN, 0},
        {hb_.handle(), 0, ZMQ_POLLIN, 0},
        {iopub_.handle(), 0, short(ZMQ_POLLIN | (iopub_blocked ? ZMQ_POLLOUT : 0)), 0},
        {nullptr, wake_fd_, ZMQ_POLLIN, 0},
        {nullptr, signal_fd, ZMQ_POLLIN, 0},
    };
    // A blocked iopub is retried every 10 ms even if POLLOUT does not fire for the busy peer.
    try {
      zmq::poll(items, 7, std::chrono::milliseconds(iopub_blocked ? 10 : 500));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
      continue;  // a signal with a handler (SIGTERM and SIGINT come through signal_fd)
    }
    if (items[6].revents & ZMQ_POLLIN) {
      signalfd_siginfo si{};
      [[maybe_unused]] auto n = ::read(signal_fd, &si, sizeof si);
      spdlog::info("proxy-kernel: {}: exiting; the kgate kernel keeps running", ::strsignal(int(si.ssi_signo)));
      break;
    }
    if (parent_gone()) {
      spdlog::info("proxy-kernel: the process that launched it (pid {}) is gone: exiting",
                   jpy_parent > 0 ? jpy_parent : parent);
      break;
    }
    if (items[1].revents & ZMQ_POLLIN) on_client(Channel::control);  // control first: interrupts
    if (items[0].revents & ZMQ_POLLIN) on_client(Channel::shell);
    if (items[2].revents & ZMQ_POLLIN) on_client(Channel::stdin_);
    if (items[3].revents & ZMQ_POLLIN) {
      std::vector<zmq::message_t> parts;
      while (recv_parts(hb_, parts)) {  // REP: echo each ping as it came
        for (std::size_t i = 0; i < parts.size(); ++i)
          hb_.send(parts[i], i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      }
    }
    if (items[4].revents & ZMQ_POLLIN) {  // subscriptions: nothing to do but read them
      zmq::message_t sub;
      while (iopub_.recv(sub, zmq::recv_flags::dontwait)) {
      }
    }
    if (items[5].revents & ZMQ_POLLIN) {
      std::uint64_t v;
      [[maybe_unused]] auto n = ::read(wake_fd_, &v, sizeof v);
    }
    if (!exit_) on_link_events();
  }
  link_.stop();
  for (auto* s : {&shell_, &control_, &stdin_, &iopub_, &hb_}) s->close();
  ctx_.close();
  return 0;
}

}  // namespace

int run_proxy_kernel(const ProxyKernelOptions& opts) {
  ConnectionInfo conn;
  try {
    conn = load_connection_info(opts.connection_file);
  } catch (const std::exception& e) {
    std::cerr << "kgate proxy-kernel: " << e.what() << "\n";
    return 2;
  }
  LinkOptions lo;
  lo.kernel = opts.kernel;
  if (lo.kernel.empty())
    if (const char* k = std::getenv("KGATE_PROXY_KERNEL"); k && *k) lo.kernel = k;
  std::string error;
  if (!kgate::client::resolve_gateway(kgate::client::load_config(), opts.url, lo.ep, error)) {
    std::cerr << "kgate proxy-kernel: " << error << "\n";
    return 2;
  }
  // SIGTERM/SIGINT arrive on a signalfd in the poll loop; the link's threads inherit the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  ::pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  int sfd = ::signalfd(-1, &sigs, SFD_NONBLOCK | SFD_CLOEXEC);
  ::signal(SIGPIPE, SIG_IGN);
  int rc = 0;
  try {
    std::unique_ptr<Proxy> p;
    try {
      p = std::make_unique<Proxy>(std::move(conn), std::move(lo));
    } catch (const std::invalid_argument& e) {  // the signature scheme
      std::cerr << "kgate proxy-kernel: " << opts.connection_file << ": " << e.what() << "\n";
      ::close(sfd);
      return 2;
    }
    rc = p->run(sfd);
  } catch (const std::exception& e) {
    std::cerr << "kgate proxy-kernel: " << e.what() << "\n";
    rc = 2;
  }
  ::close(sfd);
  return rc;
}

}  // namespace kgate::gw::proxy
