// One websocket connection to /api/kernels/{id}/channels.
//
// Threading: lives on the gateway's single Asio thread, like the hub.  Writes: one
// async_write at a time from `queue_` (a batch of queued messages in one: do_write), bounded by
// GatewayOptions::client_queue_bytes and client_queue_messages.  Past that bound a slow
// reader's messages wait in `spill_`, bounded by replay_bytes/replay_messages (the oldest
// dropped and counted); they move into the queue as it drains, so order is kept and nothing is
// sent twice.  If the spill had to drop, the
// client gets a "[kgate] N message(s) dropped" stderr note where the gap is.  Nothing is
// dropped while the client keeps up; the connection is never closed for being slow (a client
// that stops answering pings is closed by the websocket idle timeout, and its unsent
// messages go to its session's replay buffer).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "ws/hub.hpp"
#include "http/stream.hpp"

namespace kgate::gw {

class Services;

class WsSession final : public WsClient, public std::enable_shared_from_this<WsSession> {
 public:
  WsSession(Stream stream, Services& server, KernelPtr kernel, std::string session_id);
  ~WsSession() override;

  // Completes the handshake for `req` (already authorised), then reads and writes.
  void run(http::request<http::string_body> req);

  void deliver(const OutPtr& m) override;
  Unsent replace() override;
  void kernel_gone(const std::string& why) override;

  // The connection's place among those kgate holds (RequestContext::connection), kept with it.
  void hold_place(std::shared_ptr<void> place) { connection_ = std::move(place); }

 private:
  void on_accept(beast::error_code ec);
  void do_read();
  void on_read(beast::error_code ec, std::size_t n);
  void send_error(const std::string& text);
  void do_write();
  void on_write(beast::error_code ec, std::size_t n);
  void close(websocket::close_code code, const std::string& reason);
  void finish();  // the connection is over: closes it, then detach() (at once, or after the write in flight)
  void detach();  // from the hub, exactly once, with what was not sent

  std::unique_ptr<Websocket> ws_;  // over TCP, TLS or the Unix socket
  Services& server_;
  std::shared_ptr<void> connection_;  // the connection's place (http/connection_gate.hpp), held with it
  KernelPtr kernel_;
  std::string session_id_;
  std::string route_;
  WsProtocol proto_ = WsProtocol::legacy;
  beast::flat_buffer rbuf_;
  void refill();
  Unsent take_unsent();
  bool fits(const OutPtr& m) const;
  void uncork();
  void delivered(std::size_t n);  // the first n of the queue reached the socket

  std::deque<OutPtr> queue_;  // the held ones (held_), then the one being written while writing_
  std::size_t queued_bytes_ = 0;
  std::deque<OutPtr> spill_;  // waiting for room in queue_
  std::size_t spill_bytes_ = 0;
  std::size_t spill_dropped_ = 0;
  std::size_t spill_dropped_bytes_ = 0;
  bool warned_slow_ = false;
  bool writing_ = false;
  // What the socket has taken, for finish(): its count (Websocket::bytes_taken) before the first
  // message, read once; the wire bytes of the messages written since and of the pongs Beast may
  // have sent.  finish() sets `taken_`: how many of the batch the socket had taken whole.
  // Counted, not read per write: a reading costs two syscalls.
  std::optional<std::uint64_t> taken_origin_;
  bool origin_read_ = false;
  std::uint64_t wire_written_ = 0;
  std::uint64_t pong_wire_ = 0;
  std::size_t taken_ = 0;  // finish(): how many of the batch in flight the socket took whole
  // The batch (do_write): the first held_ messages of the queue are framed and held
  // (Websocket::hold_message) until the write of the one after them takes them.
  std::size_t held_ = 0;
  bool corked_ = false;    // TCP_CORK on while a batch of queued messages is written (do_write)
  bool attached_ = false;  // owns its route in the hub (false once replaced)
  bool counted_ = false;   // the hub counts this connection: detach() exactly once
  bool closing_ = false;
  bool finished_ = false;
  bool detached_ = false;  // deliver() queues nothing more
  bool close_sent_ = false;
  websocket::close_code close_code_ = websocket::close_code::normal;
  std::string close_reason_;
};

}  // namespace kgate::gw
