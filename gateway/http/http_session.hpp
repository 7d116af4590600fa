// One HTTP connection: reads requests one at a time, checks them, dispatches them.  Runs over
// any of the gateway's streams (stream.hpp): on a TLS one it does the handshake first, with a
// deadline; on a Unix one the peer's uid was checked when it was accepted.
#pragma once

#include <array>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <boost/beast/http/parser.hpp>

#include "http/auth.hpp"
#include "http/connection_gate.hpp"
#include "http/request.hpp"
#include "http/stream.hpp"
#include "options.hpp"

namespace kgate::gw {

// What a connection needs of the daemon that accepted it.  The daemon owns it and outlives
// every connection.
struct HttpHost {
  const GatewayOptions& options;            // read at each use: a reload (SIGHUP) changes them
  const std::filesystem::path& unix_socket;  // for the log lines of a refused Unix peer
  ConnectionGate& gate;                      // every connection's place (connection_gate.hpp)
  // Where a request goes once it passed check_request (the route table, routes.hpp).
  // `take_stream` is set for a websocket upgrade only; `respond_in_parts` where the connection
  // can send an answer in parts.
  std::function<void(Request& req, const RequestContext& ctx, Respond respond, std::function<Stream()> take_stream,
                     RespondInParts respond_in_parts)>
      dispatch;
};

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(Stream stream, const HttpHost& host);
  // A connection just accepted: given a place by host.gate (the oldest unauthenticated
  // connection may be closed for it), then run; closed at once when there is no place.
  // Returns false for a connection closed that way.
  static bool accept(Stream stream, const HttpHost& host);
  void run();

 private:
  void on_detect(beast::error_code ec, bool tls);
  void on_handshake(beast::error_code ec, std::size_t used);
  // A request is read in two steps: its header, which must pass check_request before a byte
  // of its body is read (an unauthenticated client gets its 401 for the header alone), then
  // its body.
  void do_read();
  void on_header(beast::error_code ec, std::size_t n);
  void on_read(beast::error_code ec, std::size_t n);
  // The answer to a request whose header was refused: the connection closes after it when the
  // body was not read (and reads what is left of it for a while, so the client gets the answer
  // rather than a reset).
  void refuse(http::response<http::string_body> res);
  void linger();
  void evict();  // the gate's close: out of places, this connection is the oldest unauthenticated
  void dispatch(http::request<http::string_body> req);  // a request read whole, its header checked
  void write(http::response<http::string_body> res);
  void on_write(bool keep_alive, beast::error_code ec, std::size_t n);
  void do_close();
  // An answer in parts (request.hpp PartsWriter): its header, then the parts as they come, coalesced
  // into one chunk per write, then the last chunk; then the next request, as after write().
  class Parts;
  std::shared_ptr<PartsWriter> open_parts(http::response<http::string_body> head);
  void queue_part(std::string part);
  void end_parts();
  void pump_parts();
  void on_part_written(beast::error_code ec, std::size_t n);

  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  const HttpHost& host_;
  bool peer_loopback_ = false;  // a loopback TCP address, or the Unix socket
  bool plain_on_tls_ = false;   // a plain http client on the TLS port: answered with a 400
  std::string refused_;         // a Unix peer that is not served: why (answered with a 403)
  std::shared_ptr<ConnectionGate::Slot> slot_;  // this connection's place; a websocket keeps it
  bool linger_ = false;         // a refused request's body is unread: drain it before closing
  std::shared_ptr<std::array<char, 16384>> scratch_;  // what linger() reads, and drops
  std::shared_ptr<http::response<http::string_body>> res_;
  struct {
    bool open = false;         // a response in parts is being sent (no other write, no read)
    bool writing = false;      // a write is in flight
    bool ended = false;        // end() was called
    bool last_sent = false;    // the write in flight carries the last chunk
    bool failed = false;       // a write failed: the connection is closing, parts are dropped
    bool keep_alive = true;
    std::string queued;        // parts not yet written
    std::string in_flight;     // the bytes of the write in flight
  } parts_;
  std::function<void()> parts_gone_;  // PartsWriter::on_gone
};

}  // namespace kgate::gw
