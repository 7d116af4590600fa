// The kernel runtime: messages to and from kernels, and the one poll loop of kgate-io (DEV.md §3, DEV.md §4).
#include "kernel_impl.hpp"

namespace kgate {

// ---------------------------------------------------------------------------------------
// Messages

// Only *_request messages get a reply; comm_open/comm_msg/comm_close and input_reply do not,
// so tracking them would fill the pending table.
static bool expects_reply(const ClientMessage& m) {
  static constexpr std::string_view suffix = "_request";
  return (m.channel == Channel::shell || m.channel == Channel::control) &&
         m.msg_type.size() > suffix.size() &&
         m.msg_type.compare(m.msg_type.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void KernelManager::Impl::send_now(KernelIo& k, ClientMessage& m) {
  if (expects_reply(m)) {
    if (k.pending.size() >= opts.max_pending) {
      refuse(k, m, "TooManyRequests",
             "kgate: " + std::to_string(opts.max_pending) +
                 " requests to this kernel are awaiting replies; wait for some to finish");
      return;
    }
  }
  zmq::socket_t* s = nullptr;
  switch (m.channel) {
    case Channel::shell: s = k.shell.get(); break;
    case Channel::control: s = k.control.get(); break;
    case Channel::stdin_: s = k.stdin_.get(); break;
    case Channel::iopub: return;  // clients do not publish
  }
  if (!s) {
    refuse(k, m, "KernelNotRunning", "kgate: the kernel is not running");
    return;
  }
  k.recheck |= KernelIo::bit(m.channel);
  if (!send_frames(*s, encode(m.wire, *k.signer))) {
    refuse(k, m, "KernelBusy", "kgate: the kernel's " + std::string(channel_name(m.channel)) +
                                   " queue is full; try again");
    return;
  }
  if (expects_reply(m)) {
    k.pending.emplace(m.msg_id, PendingRequest{m.channel, m.msg_type, m.wire.header, m.route});
    if (m.channel == Channel::control) k.remember_control(m.msg_id);
  }
  k.kernel->touch();  // a client's message is activity too (idle culling)
  if (!k.kernel->pooled())
    for (auto* o : observers) o->on_client_message(k.kernel, m);
}

void KernelManager::Impl::refuse(KernelIo& k, const ClientMessage& m, const std::string& ename,
                                 const std::string& evalue) {
  if (!expects_reply(m)) {
    spdlog::warn("kernel {}: dropped {} from {}: {}", k.kernel->id(), m.msg_type, m.route, evalue);
    return;
  }
  KernelMessage r = synthesize_message(
      m.channel, reply_type(m.msg_type), k.session, m.wire.header,
      json{{"status", "error"}, {"ename", ename}, {"evalue", evalue}, {"traceback", json::array()}});
  r.route = m.route;
  r.parent_msg_id = m.msg_id;
  deliver(k, std::move(r));
}

void KernelManager::Impl::fail_pending(KernelIo& k, const std::string& ename,
                                       const std::string& evalue) {
  auto pending = std::move(k.pending);
  k.pending.clear();
  for (auto& [id, p] : pending) {
    ClientMessage m;
    m.channel = p.channel;
    m.msg_id = id;
    m.msg_type = p.msg_type;
    m.route = p.route;
    m.wire.header = p.header;
    refuse(k, m, ename, evalue);
  }
  k.internal.clear();
  auto calls = std::move(k.side_calls);
  k.side_calls.clear();
  for (auto& [id, done] : calls) done(std::nullopt);
}

void KernelManager::Impl::broadcast_status(KernelIo& k, const std::string& state) {
  deliver(k, synthesize_message(Channel::iopub, "status", k.session, "{}",
                                json{{"execution_state", state}}));
}

void KernelManager::Impl::lifecycle(KernelIo& k, KernelLifecycle ev, const std::string& reason) {
  if (k.kernel->pooled()) return;  // nobody knows of it yet
  for (auto* o : observers) o->on_kernel_lifecycle(k.kernel, ev, reason);
}

void KernelManager::Impl::deliver(KernelIo& k, KernelMessage&& m) {
  if (k.kernel->pooled()) return;  // its startup and hand-out chatter is kgate's own
  auto msg = std::make_shared<const KernelMessage>(std::move(m));
  for (auto* o : observers) o->on_kernel_message(k.kernel, msg);
}

std::size_t KernelManager::Impl::on_readable(KernelIo& k, zmq::socket_t& sock, Channel ch) {
  DecodeLimits limits;
  limits.max_message_bytes = opts.max_message_bytes;
  const auto now = Clock::now();
  // Bounded per pass so one flooding kernel cannot starve the others; what is left is read on
  // the next pass (recheck: the socket's ZMQ_FD will not signal it again).
  for (std::size_t n = 0;; ++n) {
    if (n == 256) {
      k.recheck |= KernelIo::bit(ch);
      return n;
    }
    std::vector<zmq::message_t> parts;
    while (true) {
      zmq::message_t part;
      auto r = sock.recv(part, zmq::recv_flags::dontwait);
      if (!r) break;
      bool more = part.more();
      parts.push_back(std::move(part));
      if (!more) break;
    }
    if (parts.empty()) return n;
    std::vector<std::string_view> frames;
    frames.reserve(parts.size());
    for (auto& p : parts) frames.emplace_back(static_cast<const char*>(p.data()), p.size());
    KernelMessage m;
    m.channel = ch;
    if (auto ec = decode(frames, *k.signer, m.wire, limits)) {
      ++dropped_invalid;
      spdlog::warn("kernel {}: dropped a message on {}: {} ({} dropped so far)", k.kernel->id(),
                   channel_name(ch), ec.message(), dropped_invalid);
      continue;
    }
    m.wire.identities.clear();
    // A kernel may send bytes that are not UTF-8 (ipykernel packs with surrogateescape, so a str
    // holding '\udcff' goes out as the byte 0xFF). Past the signature check, every JSON part is
    // made valid here, once, so no reader downstream (the records, the websocket clients' text
    // frames, the JSON parsers) ever sees an invalid byte; binary buffers stay as they are.
    for (std::string* part : {&m.wire.header, &m.wire.parent_header, &m.wire.metadata, &m.wire.content})
      make_valid_utf8(*part);
    MessageIds ids;
    if (!read_message_ids(m.wire.header, m.wire.parent_header, ids)) continue;
    m.msg_id = std::move(ids.msg_id);
    m.msg_type = std::move(ids.msg_type);
    m.parent_msg_id = std::move(ids.parent_msg_id);
    if (ch == Channel::iopub) count_stream(k, m, now);
    // The KernelIo may be removed while handling (a dead kernel); stop reading then.
    auto id = k.kernel->id();
    handle_message(k, ch, std::move(m));
    if (!find(id) || !k.sockets_open()) return n + 1;
  }
}

// Each message read alone costs three threads a wake (libzmq's I/O thread, this one, the Asio
// thread): ~75 us of kgate's CPU per small message on the 2-core VM, most of it the wakes.  So
// a kernel that streams output has iopub's ZMQ_FD left out of the poll for opts.iopub_batch
// after each read: what arrives meanwhile waits in libzmq's pipe (which then does not signal us
// per message) and is read, and handed on, as one batch (29-41 us per message at 10 ms, most
// of it libzmq's I/O thread, which still wakes per message; bench/README).
//
// Streaming is kStreamRun small messages in a row (content up to kSmallContent bytes), each
// read within kStreamGap of the one before, with no status between: a loop printing lines.  A
// status or a large message ends the run, and so does a read that finds nothing; so a lone
// message, a request's busy / result / idle, back-to-back requests and a flood of large
// outputs (whose cost is their bytes, not their count) are read at once, as before.  Only
// iopub is held; a kernel's held iopub is read before its other channels (read_socket), so its
// outputs still go ahead of the reply and the input_request that follow them.
static constexpr std::size_t kStreamRun = 16;
static constexpr std::size_t kSmallContent = 1024;
static constexpr auto kStreamGap = std::chrono::milliseconds(2);

void KernelManager::Impl::count_stream(KernelIo& k, const KernelMessage& m, Clock::time_point now) {
  if (m.msg_type == "status" || m.wire.content.size() > kSmallContent) k.iopub_run = 0;
  else if (k.iopub_held() || now - k.iopub_last <= kStreamGap) ++k.iopub_run;
  else k.iopub_run = 1;
  k.iopub_last = now;
}

void KernelManager::Impl::read_iopub(KernelIo& k) {
  const bool was_held = k.iopub_held();
  const bool lowered = std::exchange(k.iopub_lowered, false);
  auto id = k.kernel->id();
  std::size_t n = std::exchange(k.iopub_drained, 0);
  n += on_readable(k, *k.iopub, Channel::iopub);
  if (!find(id) || !k.sockets_open()) return;
  if (was_held && n == 0 && lowered && opts.iopub_batch.count() > 0) {
    // The mark came down just now: what waited under it may be read by libzmq but not yet in
    // its pipe.  Not a pause, then: one more hold, with the mark down.
    k.iopub_held_until = Clock::now() + opts.iopub_batch;
    return;
  }
  if (n == 0 && was_held) k.iopub_run = 0;  // the stream has paused
  if (opts.iopub_batch.count() > 0 && k.iopub_run >= kStreamRun) {
    k.iopub_held_until = Clock::now() + opts.iopub_batch;
    raise_iopub_lowat(k);
  } else {
    end_iopub_hold(k);
  }
}

// Held, a stream's messages still woke libzmq's I/O thread one by one as they came (a kernel
// flushes each print as its own TCP segment): half of kgate's CPU per small message, most of it
// the wake (bench/README.md, "The I/O thread's wakes").  So while a stream is held, iopub's
// connection is readable only once kIopubLowat bytes wait (SO_RCVLOWAT), a dozen prints; the
// hold's end lowers the mark, which Linux answers by waking libzmq if anything waits at all.
// A message waits one hold, as before; at most two and the drain (kIopubDrain) when libzmq had
// not yet put what was under the mark in its pipe as the hold ended (read_iopub keeps holding,
// with the mark down, rather than take that for a pause).  A kernel whose connection is not
// found (a transport other than TCP, an address that is a name) is batched as before.
static constexpr int kIopubLowat = 8 * 1024;
// How long the channels wait, at most, for libzmq to read what waited under the mark.
static constexpr auto kIopubDrain = std::chrono::milliseconds(5);

void KernelManager::Impl::raise_iopub_lowat(KernelIo& k) {
  if (k.iopub_lowat) return;
  if (!k.iopub_tcp.valid()) {
    if (k.iopub_tcp_looked || k.conn.transport != "tcp") return;
    k.iopub_tcp_looked = true;
    k.iopub_tcp = TcpUnder::find(k.conn.ip, k.conn.iopub_port);
    if (!k.iopub_tcp.valid()) {
      spdlog::debug("kernel {}: iopub's TCP connection not found; its streams are batched without it",
                    k.kernel->id());
      return;
    }
  }
  k.iopub_lowat = k.iopub_tcp.set_rcvlowat(kIopubLowat);
}

bool KernelManager::Impl::lower_iopub_lowat(KernelIo& k, bool drain) {
  if (!k.iopub_lowat) return false;
  k.iopub_lowat = false;
  k.iopub_lowered = true;
  if (!k.iopub_tcp.set_rcvlowat(1) || !drain || k.iopub_tcp.unread() == 0) return false;
  k.iopub_drain_until = Clock::now() + kIopubDrain;
  return true;
}

// During a drain, iopub stays in the poll: libzmq signals it once it has put what it read in
// its pipe, and the drain ends as soon as nothing waits in the connection any more.  So a drain
// takes as long as libzmq's read, not the 1 ms steps of the re-check in poll_once, which is
// left for what never signals (bytes that end part-way through a message).  iopub is read on
// the next pass (recheck), then the channels that waited, in that order.  What is read while the
// drain lasts counts in that read (iopub_drained): a stream that went on is held again with the
// mark up, not taken for one whose rest has not reached libzmq's pipe yet.
void KernelManager::Impl::drain_iopub(KernelIo& k) {
  if (k.iopub_tcp.unread() == 0) {
    k.iopub_drain_until = {};
    k.recheck |= KernelIo::bit(Channel::iopub) | std::exchange(k.iopub_waiting, 0);
    return;
  }
  // Part of it came: read, so that iopub's ZMQ_FD signals the rest.
  auto id = k.kernel->id();
  std::size_t n = on_readable(k, *k.iopub, Channel::iopub);
  if (find(id) && k.sockets_open()) k.iopub_drained += n;
}

void KernelManager::Impl::end_iopub_hold(KernelIo& k) {
  k.iopub_held_until = {};
  lower_iopub_lowat(k, false);
}

bool KernelManager::Impl::answer_side_call(KernelIo& k, const KernelMessage& m) {
  auto call = k.side_calls.find(m.parent_msg_id);
  if (call == k.side_calls.end()) return false;
  auto done = std::move(call->second);
  k.side_calls.erase(call);
  json content = json::parse(m.wire.content, nullptr, false);
  done(content.is_object() ? std::optional<json>(std::move(content)) : std::nullopt);
  return true;
}

void KernelManager::Impl::handle_message(KernelIo& k, Channel ch, KernelMessage&& m) {
  // A culled kernel's clients were told it is dead: what it says while it exits (the busy and
  // idle around shutdown_request, a cell's last output) is not passed on.  Its requests were
  // answered by fail_pending, and shutdown_reply is kgate's own.
  if (k.culled) {
    if (ch != Channel::iopub && k.internal.erase(m.parent_msg_id)) answer_side_call(k, m);  // the close's
    return;
  }
  if (ch == Channel::iopub) {
    // kgate's own requests to a re-adopted kernel (readiness, the history probe) are not
    // activity: its cull clock goes on from what the kgate before saved.
    const bool ours = k.readiness_ids.count(m.parent_msg_id) ||
                      (!k.quiet_parent.empty() && m.parent_msg_id == k.quiet_parent);
    if (!k.adopted && !ours) k.kernel->touch();
    if (m.msg_type == "status") {
      bool control_parent = std::find(k.recent_control.begin(), k.recent_control.end(),
                                      m.parent_msg_id) != k.recent_control.end();
      json content = json::parse(m.wire.content, nullptr, false);
      std::string state = content.is_object() ? content.value("execution_state", "") : "";
      // The busy/idle around a control request says nothing about the shell: skip it.
      if (k.phase == KernelPhase::ready && !control_parent && !k.readiness_ids.count(m.parent_msg_id) &&
          (state == "busy" || state == "idle"))
        k.kernel->set_state(state);
      if (k.handout && state == "idle" && m.parent_msg_id == k.handout->msg_id) {
        k.handout->idle = true;
        deliver(k, std::move(m));  // pooled still: goes nowhere
        check_handout(k);
        return;
      }
    }
    if (k.phase == KernelPhase::launching || k.phase == KernelPhase::restarting) {
      k.iopub_seen = true;
      check_ready(k);
    }
    if (k.relinking) relinked(k);
    if (m.msg_type == "kgate_event") return kernel_side_event(k, m);
    deliver(k, std::move(m));
    return;
  }
  if (ch == Channel::stdin_) {
    auto it = k.pending.find(m.parent_msg_id);
    if (it == k.pending.end()) {
      spdlog::warn("kernel {}: {} for an unknown request {}; dropped", k.kernel->id(), m.msg_type,
                   m.parent_msg_id);
      return;
    }
    m.route = it->second.route;
    deliver(k, std::move(m));
    return;
  }
  // shell / control replies
  if (k.internal.erase(m.parent_msg_id)) {
    if (!k.history_probe.empty() && m.parent_msg_id == k.history_probe) {
      k.history_probe.clear();
      if (k.phase == KernelPhase::ready && k.kernel->execution_state() == "busy") k.kernel->set_state("idle");
      for (auto* o : observers) o->on_kernel_readopted(k.kernel, m.wire.content);
      if (k.hold_shell) release_shell(k);
      return;
    }
    if (answer_side_call(k, m)) return;
    if (!k.side_install.empty() && m.parent_msg_id == k.side_install) {
      k.side_install.clear();
      json side = kernel_side_from_reply(json::parse(m.wire.content, nullptr, false));
      if (!side.value("installed", false))
        spdlog::warn("kernel {}: kgate's kernel side is off: {}", k.kernel->id(), side.value("reason", ""));
      else if (k.conn.transport == "ipc" && side.value("ipc_pipe", json(true)).is_string())
        spdlog::warn("kernel {}: ipykernel's IOPub pipe (output of forked subprocesses) still listens on a "
                     "127.0.0.1 TCP port, where other users can send it messages it drops: {}",
                     k.kernel->id(), side["ipc_pipe"].get<std::string>());
      // The task that runs now (a re-adopted kernel's, started under the kgate before): the
      // records keep its job running, and end any other task's whose end was not heard.
      const bool says = side.contains("running_task");
      json running = side.value("running_task", json());
      side.erase("running_task");
      k.task = running.is_string() ? running.get<std::string>() : std::string();
      if (!k.task.empty()) spdlog::info("kernel {}: its background task {} still runs", k.kernel->id(), k.task);
      k.kernel->set_kernel_side(std::move(side));
      if (says) {
        json event = {{"event", "task_running"}, {"request", k.task}};
        for (auto* o : observers) o->on_kernel_side_event(k.kernel, event);
      }
      return;
    }
    if (m.msg_type == "kernel_info_reply" && (k.phase == KernelPhase::launching || k.phase == KernelPhase::restarting)) {
      json info = json::parse(m.wire.content, nullptr, false);
      if (info.is_object()) k.implementation = info.value("implementation", "");
      k.ready_reply = true;
      check_ready(k);
      if ((k.phase == KernelPhase::launching || k.phase == KernelPhase::restarting) && !k.iopub_seen) {
        // The kernel answers, but its busy/idle went out before our SUB was live: ask again
        // soon (the kernel is up now) instead of at the 500 ms resend.
        auto id = k.kernel->id();
        auto epoch = k.epoch;
        auto seq = k.info_seq;
        after(std::chrono::milliseconds(20), [this, id, epoch, seq] {
          KernelIo* kk = find(id);
          if (kk && kk->epoch == epoch && kk->info_seq == seq && !kk->iopub_seen) send_kernel_info(*kk);
        });
      }
    }
    if (k.handout && m.parent_msg_id == k.handout->msg_id) {
      json content = json::parse(m.wire.content, nullptr, false);
      std::string status = content.is_object() ? content.value("status", "") : "";
      if (status != "ok") {
        std::string what = content.is_object() ? content.value("ename", "") + ": " + content.value("evalue", "")
                                               : "an unreadable reply";
        k.handout->error = "applying cwd/env to the pooled kernel failed (" + what + ")";
      }
      k.handout->replied = true;
      check_handout(k);
    }
    return;
  }
  auto it = k.pending.find(m.parent_msg_id);
  if (it == k.pending.end()) {
    spdlog::debug("kernel {}: {} for an unknown request {}; dropped", k.kernel->id(), m.msg_type,
                  m.parent_msg_id);
    return;
  }
  m.route = it->second.route;
  k.pending.erase(it);
  deliver(k, std::move(m));
}

// ---------------------------------------------------------------------------------------
// The loop

void KernelManager::Impl::run() {
  while (true) {
    std::deque<std::function<void()>> work;
    {
      std::lock_guard lk(qmu);
      work.swap(queue);
    }
    for (auto& fn : work) fn();
    while (!timers.empty() && timers.top().when <= Clock::now()) {
      auto fn = timers.top().fn;
      timers.pop();
      fn();
    }
    for (auto* o : observers) o->on_pass_end();
    if (stopping.load() && io.empty()) {
      std::lock_guard lk(qmu);
      if (queue.empty()) return;
    }
    poll_once();
    for (auto* o : observers) o->on_pass_end();
  }
}

// One pass: wait for a kernel socket, a kernel's exit, the wake eventfd or the next timer, then
// read what is ready.  Not zmq_poll: it asks every ZMQ socket for its events before and after
// its poll(), and each ask is a getpid() and a poll() of that socket's mailbox (fork detection and
// command processing in libzmq 4.3), so a pass cost 2 x 5 syscalls per kernel, ready or not:
// ~75 poll() and ~80 getpid() per `1+1` with two kernels, and more with every kernel added.
// Here each ZMQ socket's ZMQ_FD (its mailbox's eventfd) is in one epoll set (poll_set), and only
// a socket whose FD fired is read, to EAGAIN, which re-arms the FD for the next message.  libzmq may
// take a message's signal in while sending on that socket, so a socket just sent on, or whose
// read stopped at its bound, is read on the next pass without waiting (KernelIo::recheck).
void KernelManager::Impl::poll_once() {
  // What to wait on is kept in poll_set across passes; a pass tells it only what changed (a
  // stream held or let go, a drain, sockets or a process that came or went), so its cost does
  // not grow with the kernels held: with 60 idle kernels poll() walked ~370 descriptors each
  // pass, half of kgate-io's CPU (bench/README.md, "A pass's cost").
  auto& rechecks = rechecks_;
  rechecks.clear();
  const auto now = Clock::now();
  auto next_hold = Clock::time_point::max();
  constexpr auto tag = [](std::uint64_t serial, int kind) { return serial << 4 | std::uint64_t(kind); };
  wake_polled.want(poll_set, wake_fd, 0, true, tag(0, 6));
  if (!reg) reg_polled.leave();
  else reg_polled.want(poll_set, reg->get(zmq::sockopt::fd), 0, true, tag(0, 8));
  if (poll_ids.size() > 2 * io.size() + 16) {  // kernels removed since: forget them
    poll_ids.clear();
    for (auto& [id, kp] : io)
      if (kp->poll_serial) poll_ids.emplace(kp->poll_serial, id);
  }
  for (auto& [id, kp] : io) {
    KernelIo& k = *kp;
    if (!k.poll_serial) {
      k.poll_serial = ++poll_serial_seq;
      poll_ids.emplace(k.poll_serial, id);
    }
    if (k.sockets_open()) {
      // A held iopub (read_iopub) is out of the poll until its time, then read without waiting.
      std::uint8_t bits = k.recheck;
      bool held = false;
      constexpr std::uint8_t kOrdered = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 3);  // shell ... iopub
      if (k.iopub_draining() && (k.iopub_drain_until <= now || k.iopub_tcp.unread() == 0)) {
        // libzmq has read what waited: iopub, then the channels that waited for it
        k.iopub_drain_until = {};
        bits |= KernelIo::bit(Channel::iopub) | std::exchange(k.iopub_waiting, 0);
      }
      if (!k.iopub_draining() && k.iopub_held() && k.iopub_held_until <= now &&
          !lower_iopub_lowat(k, true))
        bits |= KernelIo::bit(Channel::iopub);
      const bool draining = k.iopub_draining();
      if (draining) {
        // shell, control and stdin are read when it ends; iopub as libzmq passes it on (drain_iopub)
        const auto behind_iopub = static_cast<std::uint8_t>(kOrdered & ~KernelIo::bit(Channel::iopub));
        k.iopub_waiting |= bits & behind_iopub;
        bits &= static_cast<std::uint8_t>(~behind_iopub);
        next_hold = std::min(next_hold, std::min(k.iopub_drain_until, now + std::chrono::milliseconds(1)));
      } else if (k.iopub_held() && k.iopub_held_until > now) {
        held = true;
        next_hold = std::min(next_hold, k.iopub_held_until);
      }
      if (bits) rechecks.push_back({k.poll_serial, bits});
      zmq::socket_t* socks[] = {k.shell.get(), k.control.get(), k.stdin_.get(), k.iopub.get(),
                                k.hb.get()};
      for (int i = 0; i < 5; ++i) {
        const bool on = !((i == 3 && held) || (i <= 2 && draining));
        auto& m = k.polled[i];
        if (m.holds(k.sockets_gen)) m.enable(on);
        else m.want(poll_set, socks[i]->get(zmq::sockopt::fd), k.sockets_gen, on, tag(k.poll_serial, i), true);
      }
    } else {
      for (int i = 0; i < 5; ++i) k.polled[i].leave();
    }
    // A process is told apart by its pid, and the stdin monitor goes with the sockets.  The
    // sockets and the monitor are borrowed (PollSet): their members leave before they close.
    if (k.proc.running() && k.proc.exit_fd() >= 0)
      k.polled[5].want(poll_set, k.proc.exit_fd(), std::uint64_t(k.proc.pid()), true, tag(k.poll_serial, 5));
    else
      k.polled[5].leave();
    if (!k.stdin_monitor) k.polled[7].leave();
    else if (!k.polled[7].holds(k.sockets_gen))
      k.polled[7].want(poll_set, k.stdin_monitor->get(zmq::sockopt::fd), k.sockets_gen, true, tag(k.poll_serial, 7),
                       true);
    if (k.tunnel.running() && k.tunnel.exit_fd() >= 0)
      k.polled[9].want(poll_set, k.tunnel.exit_fd(), std::uint64_t(k.tunnel.pid()), true, tag(k.poll_serial, 9));
    else
      k.polled[9].leave();
  }
  long timeout = 1000;
  auto next_due = std::min(next_hold, timers.empty() ? Clock::time_point::max() : timers.top().when);
  if (next_due != Clock::time_point::max()) {
    // Rounded up: a timer due in 0.4 ms waits 1 ms, not 0 ms again and again until it is due.
    auto d = std::chrono::ceil<std::chrono::milliseconds>(next_due - Clock::now()).count();
    timeout = std::clamp<long>(d, 0, 1000);
  }
  // Without pidfds, exits are found by polling waitpid.
  bool have_nopidfd = false;
  for (auto& [id, kp] : io)
    if (kp->proc.running() && kp->proc.exit_fd() < 0) have_nopidfd = true;
  if (have_nopidfd) timeout = std::min(timeout, 100L);
  if (!rechecks.empty() || reg_recheck) timeout = 0;

  // EINTR (a signal sent to this thread alone: it blocks async signals) is a pass with nothing
  // ready; the rechecks still run.
  if (events_.size() < 64) events_.resize(64);
  int rc = poll_set.wait(events_.data(), int(events_.size()), int(timeout));
  // In the order a kernel's channels are read in (its sockets, then its exit), as poll() gave them.
  std::sort(events_.begin(), events_.begin() + rc,
            [](const epoll_event& a, const epoll_event& b) { return a.data.u64 < b.data.u64; });
  if (have_nopidfd) {
    std::vector<std::string> ids;
    for (auto& [id, kp] : io)
      if (kp->proc.running() && kp->proc.exit_fd() < 0) ids.push_back(id);
    for (auto& id : ids)
      if (KernelIo* k = find(id)) on_exit(*k);
  }
  auto read_socket = [this](KernelIo& k, int kind) {
    if (kind <= 2 && k.iopub && k.iopub_held()) {
      // What the kernel said on iopub goes ahead of the reply or input_request that follows it,
      // and that reply ends the stream: the idle status after it is not held.  What libzmq has
      // not read yet under the mark is waited for first (the drain ends in poll_once).
      if (k.iopub_draining() || lower_iopub_lowat(k, true)) {
        k.iopub_waiting |= static_cast<std::uint8_t>(1 << kind);
        return;
      }
      auto id = k.kernel->id();
      read_iopub(k);
      if (!find(id) || !k.sockets_open()) return;
      k.iopub_run = 0;
      end_iopub_hold(k);
    }
    switch (kind) {
      case 0: if (k.shell) on_readable(k, *k.shell, Channel::shell); break;
      case 1: if (k.control) on_readable(k, *k.control, Channel::control); break;
      case 2: if (k.stdin_) on_readable(k, *k.stdin_, Channel::stdin_); break;
      case 3:
        if (!k.iopub) break;
        if (k.iopub_draining()) drain_iopub(k);
        else read_iopub(k);
        break;
      case 4: if (k.hb) on_hb(k); break;
      case 7: if (k.stdin_monitor) on_stdin_monitor(k); break;
    }
  };
  // The sockets to read anyway: cleared first, so a send or a bounded read while reading sets
  // them again for the next pass.
  auto kernel_of = [this](std::uint64_t serial) -> KernelIo* {
    auto it = poll_ids.find(serial);
    if (it == poll_ids.end()) return nullptr;
    KernelIo* k = find(it->second);
    return k && k->poll_serial == serial ? k : nullptr;  // not one removed in this pass
  };
  for (const auto& [serial, bits] : rechecks) {
    KernelIo* k = kernel_of(serial);
    if (!k) continue;
    const KernelPtr kernel = k->kernel;  // its id stays readable if a read removes k
    const std::string& id = kernel->id();
    k->recheck = 0;
    for (int kind : {3, 0, 1, 2, 4, 7}) {
      if (!(bits & (1 << kind))) continue;
      if (!find(id) || !k->sockets_open()) break;
      read_socket(*k, kind);
    }
  }
  if (reg_recheck) on_registration();
  for (int i = 0; i < rc; ++i) {
    const std::uint64_t serial = events_[i].data.u64 >> 4;
    const int kind = int(events_[i].data.u64 & 15);
    if (serial == 0) {
      if (kind == 8) {
        if (reg) on_registration();
      } else {
        std::uint64_t v;
        [[maybe_unused]] auto n = ::read(wake_fd, &v, sizeof v);
      }
      continue;
    }
    KernelIo* k = kernel_of(serial);
    if (!k) continue;
    bool read_already = std::any_of(rechecks.begin(), rechecks.end(), [&](const auto& r) {
      return r.serial == serial && kind != 5 && (r.bits & (1 << kind));
    });
    if (read_already) continue;
    if (kind == 9) {
      if (k->tunnel.try_reap()) {
        spdlog::warn("kernel {}: its SSH forwarding ended ({})", k->kernel->id(), k->tunnel.describe_exit());
        if (k->phase == KernelPhase::ready) link_lost(*k, "the SSH connection dropped");
      }
      continue;
    }
    if (kind == 5) on_exit(*k);
    else if (k->sockets_open()) read_socket(*k, kind);
  }
}

}  // namespace kgate
