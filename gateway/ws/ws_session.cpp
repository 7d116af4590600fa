// One websocket connection to /api/kernels/{id}/channels.
#include "ws/ws_session.hpp"

#include "kgate/kernel/kernel_side.hpp"

#include <spdlog/spdlog.h>

#include "kgate/version.hpp"
#include "handlers.hpp"
#include "services.hpp"

namespace kgate::gw {

namespace {
// A server frame's size on the wire: unmasked, a 2-byte header plus 2 or 8 for a longer length.
// kgate's sessions write each message as one frame (auto_fragment off).
std::uint64_t frame_wire_bytes(std::size_t payload) {
  return payload + 2 + (payload > 65535 ? 8 : payload > 125 ? 2 : 0);
}
}  // namespace

WsSession::WsSession(Stream stream, Services& server, KernelPtr kernel, std::string session_id)
    : ws_(to_websocket(std::move(stream))),
      server_(server),
      kernel_(std::move(kernel)),
      session_id_(std::move(session_id)) {}

WsSession::~WsSession() = default;

void WsSession::run(http::request<http::string_body> req) {
  // The v1 protocol when the client offers it; otherwise legacy, with no subprotocol header
  // (a client that offered none must not get one).
  std::string offered(req[http::field::sec_websocket_protocol]);
  bool v1 = false;
  for (std::size_t pos = 0; pos < offered.size();) {
    auto comma = offered.find(',', pos);
    std::string item = offered.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (item == kV1Protocol) v1 = true;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  proto_ = v1 ? WsProtocol::v1 : WsProtocol::legacy;
  ws_->expires_never();
  ws_->set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
  ws_->set_option(websocket::stream_base::decorator([v1](websocket::response_type& res) {
    res.set(http::field::server, kgate::server_header());
    if (v1) res.set(http::field::sec_websocket_protocol, kV1Protocol);
  }));
  ws_->read_message_max(server_.options().max_ws_message_bytes);
  ws_->auto_fragment(false);
  ws_->on_ping([this](std::size_t payload) { pong_wire_ += frame_wire_bytes(payload); });
  ws_->async_accept(req, beast::bind_front_handler(&WsSession::on_accept, shared_from_this()));
}

void WsSession::on_accept(beast::error_code ec) {
  if (ec) {
    spdlog::info("kernel {}: websocket handshake failed: {}", kernel_->id(), ec.message());
    return;
  }
  if (!server_.manager().get(kernel_->id())) {  // deleted during the handshake
    close(websocket::close_code::going_away, "kgate: kernel " + kernel_->id() + " was shut down");
    return;
  }
  auto a = server_.hub().attach(kernel_, shared_from_this(), session_id_);
  attached_ = true;
  counted_ = true;
  route_ = a.route;
  spdlog::info("kernel {}: websocket opened (session {}, {} protocol, {} replayed)", kernel_->id(),
               route_, proto_ == WsProtocol::v1 ? "v1" : "legacy", a.replay.size());
  for (auto& m : a.replay) deliver(m);
  do_read();
}

void WsSession::do_read() {
  ws_->async_read(rbuf_, beast::bind_front_handler(&WsSession::on_read, shared_from_this()));
}

void WsSession::on_read(beast::error_code ec, std::size_t) {
  if (ec) {
    if (ec == websocket::error::message_too_big) {
      spdlog::warn("kernel {}: session {} sent a message over {} bytes; closing", kernel_->id(),
                   route_, server_.options().max_ws_message_bytes);
    } else if (ec != websocket::error::closed && ec != net::error::operation_aborted) {
      spdlog::debug("kernel {}: websocket read: {}", kernel_->id(), ec.message());
    }
    finish();
    return;
  }
  auto data = rbuf_.cdata();
  std::string_view payload(static_cast<const char*>(data.data()), data.size());
  ClientMessage m;
  std::string err = decode_client(payload, proto_, m);
  rbuf_.consume(rbuf_.size());
  if (!err.empty()) {
    spdlog::warn("kernel {}: session {}: bad websocket message: {}", kernel_->id(), route_, err);
    close(websocket::close_code::bad_payload, "kgate: " + err);
    return;
  }
  // kgate's own session is the kernels' host (docs/dev/kernel-side.md): its cells go unrecorded and it passes
  // the shutdown guard, so no client may send as it (docs/dev/security.md).
  if (is_host_session(m.session, server_.options().kernel.host_session)) {
    spdlog::warn("kernel {}: session {} sent a {} claiming kgate's own session; closing", kernel_->id(), route_,
                 m.msg_type);
    close(websocket::close_code::policy_error, "kgate: header.session may not be kgate's own session");
    return;
  }
  m.route = route_;
  server_.manager().send(kernel_->id(), std::move(m));
  do_read();
}

bool WsSession::fits(const OutPtr& m) const {
  const auto& o = server_.options();
  return queue_.empty() ||
         (queue_.size() < o.client_queue_messages && queued_bytes_ + m->bytes() <= o.client_queue_bytes);
}

void WsSession::deliver(const OutPtr& m) {
  if (detached_) return;  // the hub no longer routes here
  if (spill_.empty() && fits(m)) {
    queue_.push_back(m);
    queued_bytes_ += m->bytes();
    if (!writing_ && !closing_ && !finished_) do_write();
    return;
  }
  if (!warned_slow_) {
    warned_slow_ = true;
    spdlog::warn("kernel {}: session {} reads slowly ({} messages, {} bytes queued); holding "
                 "further output for it (up to {} bytes)",
                 kernel_->id(), route_, queue_.size(), queued_bytes_, server_.options().replay_bytes);
  }
  spill_.push_back(m);
  spill_bytes_ += m->bytes();
  const auto& o = server_.options();
  while (!spill_.empty() && (spill_bytes_ > o.replay_bytes || spill_.size() > o.replay_messages)) {
    spill_bytes_ -= spill_.front()->bytes();
    spill_dropped_bytes_ += spill_.front()->bytes();
    ++spill_dropped_;
    spill_.pop_front();
  }
}

// Moves spilled messages into the write queue as it drains; a gap left by dropping is marked
// with a notice at the point where it happened.
void WsSession::refill() {
  if (spill_dropped_ && queue_.size() < 2) {
    queue_.push_back(server_.hub().drop_notice(kernel_, spill_dropped_, spill_dropped_bytes_,
                                               "the client read too slowly"));
    queued_bytes_ += queue_.back()->bytes();
    spill_dropped_ = spill_dropped_bytes_ = 0;
  }
  while (!spill_.empty() && !spill_dropped_ && fits(spill_.front())) {
    queued_bytes_ += spill_.front()->bytes();
    spill_bytes_ -= spill_.front()->bytes();
    queue_.push_back(std::move(spill_.front()));
    spill_.pop_front();
  }
  if (spill_.empty() && !spill_dropped_ && warned_slow_) {
    warned_slow_ = false;
    spdlog::info("kernel {}: session {} caught up", kernel_->id(), route_);
  }
}

// A batch (more than one message queued, as the hub hands them over) is written as one: each
// message but the last is framed and held (Websocket::hold_message: no I/O), and the last
// one's write takes them all to the socket. So a batch costs one write and one pass of the
// event loop, not one each (DEV.md §3). The held ones stay at the front of the queue until that
// write is done, and count as delivered only then. A batch holds at most kHoldBytes of frames,
// each at most kHoldOne; past that, the batch goes and the next one begins, with the socket
// corked until the queue is empty, so the whole leaves in full segments.
namespace {
constexpr std::size_t kHoldOne = 64 * 1024;
constexpr std::uint64_t kHoldBytes = 256 * 1024;

Websocket::Buffers pieces_of(const WsGather& f) {
  Websocket::Buffers pieces;
  pieces.reserve(f.count());
  for (std::size_t i = 0; i < f.count(); ++i) pieces.emplace_back(net::buffer(f.piece(i)));
  return pieces;
}
}  // namespace

void WsSession::do_write() {
  // Nothing is held here: a batch's held messages always have its last write in flight.
  if (queue_.empty() || closing_) {
    uncork();
    return;
  }
  if (!origin_read_) {
    origin_read_ = true;
    taken_origin_ = ws_->bytes_taken();
  }
  std::uint64_t held_wire = 0;
  while (queue_.size() > held_ + 1) {
    const WsGather& f = queue_[held_]->frame(proto_);
    const std::uint64_t wire = frame_wire_bytes(f.size());
    if (f.size() > kHoldOne || held_wire + wire > kHoldBytes) break;
    ws_->binary(f.binary());
    if (!ws_->hold_message(pieces_of(f))) return finish();  // the stream failed: all of it is unsent
    ++held_;
    held_wire += wire;
  }
  if (!corked_ && queue_.size() > held_ + 1) {
    ws_->cork(true);
    corked_ = true;
  }
  writing_ = true;
  const WsGather& f = queue_[held_]->frame(proto_);
  taken_ = 0;
  ws_->binary(f.binary());
  ws_->async_write(pieces_of(f), beast::bind_front_handler(&WsSession::on_write, shared_from_this()));
}

void WsSession::delivered(std::size_t n) {
  for (std::size_t i = 0; i < n && !queue_.empty(); ++i) {
    wire_written_ += frame_wire_bytes(queue_.front()->frame(proto_).size());
    queued_bytes_ -= queue_.front()->bytes();
    queue_.pop_front();
  }
  held_ = 0;
}

void WsSession::on_write(beast::error_code ec, std::size_t n) {
  writing_ = false;
  server_.hub().counters().bytes_out += n;
  if (ec) {
    // Not (wholly) sent. finish() asked the socket which of the batch it had taken all of
    // (`taken_`; Beast says operation_aborted either way once the stream failed): those the
    // client reads before kgate's FIN. The rest stay queued, and so go to the session's replay.
    delivered(taken_);
    if (finished_) return detach();
    finish();
    return;
  }
  delivered(held_ + 1);
  if (finished_) return detach();  // the connection ended while this write was in flight
  refill();
  if (closing_) {
    close(close_code_, close_reason_);
    return;
  }
  do_write();
}

// Everything not yet written, oldest first: the queue (its front too when a write failed),
// then the spill; the counters start again from zero.
Unsent WsSession::take_unsent() {
  Unsent u;
  u.msgs = std::move(queue_);
  queue_.clear();
  held_ = 0;
  for (auto& m : spill_) u.msgs.push_back(std::move(m));
  spill_.clear();
  queued_bytes_ = spill_bytes_ = 0;
  u.dropped = spill_dropped_;
  u.dropped_bytes = spill_dropped_bytes_;
  spill_dropped_ = spill_dropped_bytes_ = 0;
  return u;
}

Unsent WsSession::replace() {
  // A write in flight (with the batch it takes) may or may not reach the old client; it is
  // counted as delivered and stays in the old queue until its write completes.
  std::deque<OutPtr> in_flight;
  const std::size_t held = held_;
  if (writing_)
    for (std::size_t i = 0; i <= held && !queue_.empty(); ++i) {
      in_flight.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
  Unsent u = take_unsent();
  for (auto& m : in_flight) {
    queued_bytes_ += m->bytes();
    queue_.push_back(std::move(m));
  }
  held_ = held;
  attached_ = false;  // the new connection owns the route now
  close(websocket::close_code::policy_error, "kgate: replaced by a newer connection with the same session_id");
  return u;
}

void WsSession::kernel_gone(const std::string& why) {
  close(websocket::close_code::going_away, "kgate: " + why);
}

void WsSession::close(websocket::close_code code, const std::string& reason) {
  if (finished_ || close_sent_) return;
  if (!closing_) {
    closing_ = true;
    close_code_ = code;
    close_reason_ = reason.substr(0, 120);  // a close frame's reason is at most 123 bytes
  }
  if (writing_) return;  // on_write calls back here once the write in flight is done
  uncork();
  close_sent_ = true;
  ws_->async_close(websocket::close_reason(close_code_, close_reason_),
                   [self = shared_from_this()](beast::error_code) { self->finish(); });
}

void WsSession::uncork() {
  if (!corked_) return;
  corked_ = false;
  ws_->cork(false);
}

void WsSession::finish() {
  if (finished_) return;
  finished_ = true;
  // A write in flight ends now.  Its bytes may all have gone to the socket already (its completion
  // queued behind the read error that brought us here), and then the client reads them before
  // kgate's FIN; but Beast ends it with operation_aborted either way once the stream has failed.
  // So the socket's own count says how many of the batch went whole (taken_, on plain TCP), and
  // on_write detaches then: a message the client got is not also counted as unsent (replayed
  // twice, or reported dropped).
  if (writing_ && taken_origin_) {
    // The pongs are counted as sent, though one may still wait behind this write: the count
    // for this write is then too low, and a message that went whole is replayed, as before.
    const auto now = ws_->bytes_taken();
    const std::uint64_t before = *taken_origin_ + wire_written_ + pong_wire_;
    if (now && *now >= before) {
      const std::uint64_t took = *now - before;
      std::uint64_t sum = 0;
      for (std::size_t i = 0; i <= held_ && i < queue_.size(); ++i) {
        sum += frame_wire_bytes(queue_[i]->frame(proto_).size());
        if (sum > took) break;
        taken_ = i + 1;
      }
    }
  }
  ws_->close_transport();
  if (!writing_) detach();
}

void WsSession::detach() {
  if (detached_) return;
  detached_ = true;
  Unsent unsent;
  if (attached_) {
    attached_ = false;
    unsent = take_unsent();
  }
  if (counted_) server_.hub().detach(kernel_, this, route_, std::move(unsent));
  spdlog::info("kernel {}: websocket closed (session {})", kernel_->id(), route_);
}

// The route (routes.hpp): ?session_id= names the Jupyter session, as jupyter_server reads it.
void kernel_channels(Call& c) {
  auto kernel = c.services.manager().get(c.param(0));
  if (!kernel) return c.respond(json_error(c.req, http::status::not_found, "Kernel does not exist: " + c.param(0)));
  std::string session = query_param(c.query, "session_id");
  auto s = std::make_shared<WsSession>(c.take_stream(), c.services, kernel, session);
  s->hold_place(c.ctx.connection);
  s->run(std::move(c.req));
}

}  // namespace kgate::gw
