// tcp_bytes_taken (src/client/tcp_sent.cpp): what a TCP socket has taken from its writer, which
// a websocket session reads when a write in flight is cut short (gateway/ws/ws_session.cpp).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace kgate::client {
std::optional<std::uint64_t> tcp_bytes_taken(int fd);  // private to src/client
}

namespace {

struct LoopbackPair {
  int writer = -1, reader = -1;
  LoopbackPair() {
    const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 1) != 0 ||
        ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    writer = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(writer, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    reader = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    ::close(lfd);
  }
  ~LoopbackPair() {
    if (writer >= 0) ::close(writer);
    if (reader >= 0) ::close(reader);
  }
};

}  // namespace

TEST(TcpBytesTaken, CountsWhatWasWrittenWhetherReadOrNot) {
  LoopbackPair p;
  ASSERT_GE(p.reader, 0);
  const auto start = kgate::client::tcp_bytes_taken(p.writer);
  ASSERT_TRUE(start.has_value());
  const std::string block(1000, 'x');
  ASSERT_EQ(::write(p.writer, block.data(), block.size()), 1000);
  ASSERT_EQ(::write(p.writer, block.data(), 500), 500);
  EXPECT_EQ(*kgate::client::tcp_bytes_taken(p.writer) - *start, 1500u);  // the peer has read none
  std::string got(1500, '\0');
  std::size_t have = 0;
  while (have < got.size()) {
    const ssize_t n = ::read(p.reader, got.data() + have, got.size() - have);
    ASSERT_GT(n, 0);
    have += static_cast<std::size_t>(n);
  }
  EXPECT_EQ(*kgate::client::tcp_bytes_taken(p.writer) - *start, 1500u);  // read: the count stays
}

TEST(TcpBytesTaken, NothingForWhatIsNotATcpSocket) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  EXPECT_FALSE(kgate::client::tcp_bytes_taken(sv[0]).has_value());
  ::close(sv[0]);
  ::close(sv[1]);
  EXPECT_FALSE(kgate::client::tcp_bytes_taken(-1).has_value());
}
