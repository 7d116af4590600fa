// One HTTP connection: reads requests one at a time, checks them, dispatches them.
#pragma once

#include <memory>
#include <optional>

#include "net.hpp"

namespace kgate::gw {

class Server;

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket socket, Server& server);
  void run();

 private:
  void do_read();
  void on_read(beast::error_code ec, std::size_t n);
  void write(http::response<http::string_body> res);
  void on_write(bool keep_alive, beast::error_code ec, std::size_t n);
  void do_close();

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Server& server_;
  bool peer_loopback_ = false;
  std::shared_ptr<http::response<http::string_body>> res_;
};

}  // namespace kgate::gw
