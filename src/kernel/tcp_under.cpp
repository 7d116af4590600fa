// The TCP connection under a ZMQ socket (tcp_under.hpp).
#include "kgate/kernel/tcp_under.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

namespace kgate {
namespace {

// Is `fd` an established TCP connection whose peer is `want` (`want_len` bytes)?
bool connected_to(int fd, const sockaddr_storage& want, socklen_t want_len) {
  sockaddr_storage peer{};
  socklen_t len = sizeof peer;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0 || len != want_len) return false;
  if (peer.ss_family != want.ss_family) return false;
  if (peer.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(peer);
    const auto& b = reinterpret_cast<const sockaddr_in&>(want);
    if (a.sin_port != b.sin_port || a.sin_addr.s_addr != b.sin_addr.s_addr) return false;
  } else {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(peer);
    const auto& b = reinterpret_cast<const sockaddr_in6&>(want);
    if (a.sin6_port != b.sin6_port || std::memcmp(&a.sin6_addr, &b.sin6_addr, sizeof a.sin6_addr) != 0) return false;
  }
  int type = 0;
  socklen_t tlen = sizeof type;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 || type != SOCK_STREAM) return false;
  tcp_info info{};
  socklen_t ilen = sizeof info;
  return ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &ilen) == 0 && info.tcpi_state == TCP_ESTABLISHED;
}

}  // namespace

TcpUnder::~TcpUnder() { reset(); }

TcpUnder::TcpUnder(TcpUnder&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}

TcpUnder& TcpUnder::operator=(TcpUnder&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

void TcpUnder::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

TcpUnder TcpUnder::find(const std::string& ip, int port) {
  if (port <= 0 || port > 65535) return {};
  sockaddr_storage want{};
  socklen_t want_len = 0;
  if (auto* v4 = reinterpret_cast<sockaddr_in*>(&want); ::inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<std::uint16_t>(port));
    want_len = sizeof(sockaddr_in);
  } else if (auto* v6 = reinterpret_cast<sockaddr_in6*>(&want); ::inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<std::uint16_t>(port));
    want_len = sizeof(sockaddr_in6);
  } else {
    return {};
  }
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    char* stop = nullptr;
    const long fd = std::strtol(name.c_str(), &stop, 10);
    if (stop == name.c_str() || *stop != '\0' || fd < 0) continue;
    if (!connected_to(static_cast<int>(fd), want, want_len)) continue;
    // The number may have been closed and given to another socket since the check: the copy is
    // checked again, and only the copy is ever used.
    TcpUnder copy(::fcntl(static_cast<int>(fd), F_DUPFD_CLOEXEC, 0));
    if (copy.valid() && connected_to(copy.fd_, want, want_len)) return copy;
  }
  return {};
}

bool TcpUnder::set_rcvlowat(int bytes) {
  if (fd_ < 0) return false;
  if (::setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof bytes) == 0) return true;
  reset();
  return false;
}

std::size_t TcpUnder::unread() const {
  int n = 0;
  if (fd_ < 0 || ::ioctl(fd_, SIOCINQ, &n) != 0 || n < 0) return 0;
  return static_cast<std::size_t>(n);
}

}  // namespace kgate
