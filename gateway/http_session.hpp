// One HTTP connection: reads requests one at a time, checks them, dispatches them.  Runs over
// any of the gateway's streams (stream.hpp): on a TLS one it does the handshake first, with a
// deadline; on a Unix one the peer's uid was checked when it was accepted.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <boost/beast/http/parser.hpp>

#include "stream.hpp"

namespace kgate::gw {

class Server;

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(Stream stream, Server& server);
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

  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Server& server_;
  bool peer_loopback_ = false;  // a loopback TCP address, or the Unix socket
  bool plain_on_tls_ = false;   // a plain http client on the TLS port: answered with a 400
  std::string refused_;         // a Unix peer that is not served: why (answered with a 403)
  std::shared_ptr<http::response<http::string_body>> res_;
};

}  // namespace kgate::gw
