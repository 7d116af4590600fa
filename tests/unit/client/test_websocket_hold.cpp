// Websocket::hold_message (src/client/websocket_impl.hpp, Holding): a batch of messages leaves in
// the write of the message after them, kgate's own websocket client on 127.0.0.1 reads them all
// in order, and the socket took none of them before that write.
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket/error.hpp>
#include <gtest/gtest.h>

#include "kgate/client/endpoint.hpp"
#include "kgate/client/websocket.hpp"

namespace kgate::client {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = net::ip::tcp;

std::uint64_t frame_bytes(const std::string& payload) { return payload.size() + 2; }  // < 126 bytes, unmasked

// kgate's own client on a thread of its own: connects, reads every message until the server
// closes.
struct Client {
  std::vector<std::string> got;
  std::string error;
  std::thread t;
  explicit Client(unsigned short port) {
    t = std::thread([this, port] {
      net::io_context ioc;
      Endpoint ep;
      if (!parse_endpoint_url("http://127.0.0.1:" + std::to_string(port), ep, error)) return;
      auto ws = Websocket::client(ep, nullptr, ioc);
      beast::error_code ec;
      error = ws->open(ioc, ep, "/", "", std::chrono::seconds(10), ec);
      if (!error.empty() || ec) {
        error += ec.message();
        return;
      }
      beast::flat_buffer b;
      std::function<void()> next = [&] {
        ws->async_read(b, [&](beast::error_code rec, std::size_t) {
          if (rec) {
            if (rec != websocket::error::closed) error = rec.message();
            return;
          }
          got.push_back(beast::buffers_to_string(b.data()));
          b.consume(b.size());
          next();
        });
      };
      next();
      ioc.run();
    });
  }
  void join() {
    if (t.joinable()) t.join();
  }
  ~Client() { join(); }
};

TEST(WebsocketHold, ABatchLeavesInTheWriteAfterItAndTheCloseFrameTakesWhatIsLeft) {
  net::io_context ioc;
  tcp::acceptor acceptor(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  Client client(acceptor.local_endpoint().port());
  beast::tcp_stream stream(acceptor.accept());
  beast::flat_buffer buf;
  http::request<http::string_body> req;
  http::read(stream, buf, req);
  auto ws = Websocket::over(std::move(stream));
  ws->text(true);

  std::optional<std::uint64_t> origin, after_hold, after_write, after_second_hold;
  beast::error_code write_ec, close_ec;
  const std::vector<std::string> first = {"one", "two", "three"};
  ws->async_accept(req, [&](beast::error_code ec) {
    ASSERT_FALSE(ec) << ec.message();
    origin = ws->bytes_taken();
    ASSERT_TRUE(ws->hold_message({net::buffer(first[0])}));
    ASSERT_TRUE(ws->hold_message({net::buffer(first[1])}));
    after_hold = ws->bytes_taken();
    ws->async_write(net::buffer(first[2]), [&](beast::error_code ec2, std::size_t) {
      write_ec = ec2;
      after_write = ws->bytes_taken();
      static const std::string fourth = "four";
      ASSERT_TRUE(ws->hold_message({net::buffer(fourth)}));
      after_second_hold = ws->bytes_taken();
      ws->async_close(websocket::close_code::normal, [&](beast::error_code ec3) { close_ec = ec3; });
    });
  });
  ioc.run();
  client.join();

  ASSERT_TRUE(origin && after_hold && after_write && after_second_hold);
  EXPECT_EQ(*after_hold, *origin) << "held messages reached the socket before the write after them";
  EXPECT_FALSE(write_ec) << write_ec.message();
  EXPECT_EQ(*after_write - *origin, frame_bytes("one") + frame_bytes("two") + frame_bytes("three"));
  EXPECT_EQ(*after_second_hold, *after_write);
  EXPECT_FALSE(close_ec) << close_ec.message();
  EXPECT_EQ(client.error, "");
  EXPECT_EQ(client.got, (std::vector<std::string>{"one", "two", "three", "four"}));
}

}  // namespace
}  // namespace kgate::client
