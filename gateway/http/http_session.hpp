// One HTTP connection: reads requests one at a time, checks them, dispatches them.  Runs over
// any of the gateway's streams (stream.hpp): on a TLS one it does the handshake first, with a
// deadline; on a Unix one the peer's uid was checked when it was accepted.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <boost/beast/http/parser.hpp>

#include "http/auth.hpp"
#include "http/request.hpp"
#include "http/stream.hpp"
#include "options.hpp"

namespace kgate::gw {

// What a connection needs of the daemon that accepted it.  The daemon owns it and outlives
// every connection.
struct HttpHost {
  const GatewayOptions& options;            // read at each use: a reload (SIGHUP) changes them
  const std::filesystem::path& unix_socket;  // for the log lines of a refused Unix peer
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
  void run();

 private:
  void on_detect(beast::error_code ec, bool tls);
  void on_handshake(beast::error_code ec, std::size_t used);
  void do_read();
  void on_read(beast::error_code ec, std::size_t n);
  void dispatch(http::request<http::string_body> req);  // a request read and checked for the TLS/Unix refusals
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
