// The TCP connection under a ZMQ socket (tcp_under.hpp): found among this process's
// descriptors by its peer, held as a copy of its own, and what its mark does to readiness.
// Real sockets on 127.0.0.1; the batching that uses it is tested in test_kernel.cpp (KernelRuntime,
// a stream of small outputs from the fake kernel's real sockets) and with ipykernel in the
// integration tests (test_backpressure, test_ws).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>

#include "kgate/kernel/tcp_under.hpp"

namespace kgate {
namespace {

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// A listener on 127.0.0.1 (port 0), a client connected to it and the accepted end.
struct Pair {
  Fd listener{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  Fd client{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  Fd server{-1};
  int port = 0;
  Pair() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listener.fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(listener.fd, 1) != 0 ||
        ::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    port = ntohs(a.sin_port);
    if (::connect(client.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    server.fd = ::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC);
  }
  void send(std::size_t n) const {
    const std::string bytes(n, 'x');
    ASSERT_EQ(::send(server.fd, bytes.data(), n, 0), static_cast<ssize_t>(n));
  }
};

bool readable(int fd, int ms = 50) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

TEST(TcpUnder, FindsTheConnectionToAPeerAndCountsWhatIsUnread) {
  Pair p;
  ASSERT_GE(p.server.fd, 0);
  TcpUnder t = TcpUnder::find("127.0.0.1", p.port);
  ASSERT_TRUE(t.valid());
  EXPECT_EQ(t.unread(), 0u);
  p.send(100);
  ASSERT_TRUE(readable(p.client.fd, 1000));
  EXPECT_EQ(t.unread(), 100u);  // the client's bytes: the copy is of the client's end
}

TEST(TcpUnder, ItsMarkHoldsReadinessBackUntilThatManyBytesWaitAndLoweringItWakes) {
  Pair p;
  ASSERT_GE(p.server.fd, 0);
  TcpUnder t = TcpUnder::find("127.0.0.1", p.port);
  ASSERT_TRUE(t.valid());
  ASSERT_TRUE(t.set_rcvlowat(1000));
  p.send(600);
  EXPECT_FALSE(readable(p.client.fd));  // set through the copy, it holds for the original too
  EXPECT_EQ(t.unread(), 600u);
  p.send(600);
  EXPECT_TRUE(readable(p.client.fd, 1000));
  char buf[2048];
  ASSERT_EQ(::recv(p.client.fd, buf, sizeof buf, 0), 1200);
  p.send(10);
  EXPECT_FALSE(readable(p.client.fd));
  ASSERT_TRUE(t.set_rcvlowat(1));
  EXPECT_TRUE(readable(p.client.fd, 0));  // at once: the 10 bytes waiting are enough now
}

TEST(TcpUnder, FindsNothingWhereThereIsNoSuchConnection) {
  Pair p;
  ASSERT_GE(p.server.fd, 0);
  EXPECT_FALSE(TcpUnder::find("127.0.0.1", p.port == 65535 ? 1 : p.port + 1).valid());
  EXPECT_FALSE(TcpUnder::find("127.0.0.2", p.port).valid());
  EXPECT_FALSE(TcpUnder::find("localhost", p.port).valid());  // names are not looked up
  EXPECT_FALSE(TcpUnder::find("::1", p.port).valid());
  EXPECT_FALSE(TcpUnder::find("127.0.0.1", 0).valid());
  EXPECT_FALSE(TcpUnder::find("127.0.0.1", 70000).valid());
  TcpUnder none;
  EXPECT_FALSE(none.set_rcvlowat(10));
  EXPECT_EQ(none.unread(), 0u);
}

TEST(TcpUnder, TheCopyOutlivesTheOriginalsNumberAndClosesWithIt) {
  Pair p;
  ASSERT_GE(p.server.fd, 0);
  TcpUnder t = TcpUnder::find("127.0.0.1", p.port);
  ASSERT_TRUE(t.valid());
  ::close(p.client.fd);
  p.client.fd = -1;
  // The number may now be anything else's; the copy still names the same connection.
  p.send(5);
  for (int i = 0; i < 100 && t.unread() < 5; ++i) ::usleep(1000);
  EXPECT_EQ(t.unread(), 5u);
  TcpUnder moved = std::move(t);
  EXPECT_FALSE(t.valid());
  EXPECT_TRUE(moved.valid());
  moved.reset();  // the last descriptor: the connection closes, the peer reads its end
  ASSERT_TRUE(readable(p.server.fd, 1000));
  char c;
  EXPECT_LE(::recv(p.server.fd, &c, 1, 0), 0);
}

}  // namespace
}  // namespace kgate
