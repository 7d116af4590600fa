// How many bytes a TCP socket has taken from its writer (Websocket::bytes_taken in websocket_impl.hpp).  A
// unit of its own: glibc's <netinet/tcp.h> has no tcpi_bytes_acked, and the kernel's
// <linux/tcp.h>, which has it, clashes with it in one unit.
#include <linux/sockios.h>
#include <netinet/in.h>
#include <linux/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace kgate::client {

// Everything written to the socket since it was opened, counted from an arbitrary origin: the
// bytes the peer acknowledged (TCP_INFO) plus those still in the send queue (SIOCOUTQ: sent
// and not yet acknowledged, or not yet sent).  A difference of two readings is what was
// written in between.  nullopt when the kernel will not say.
std::optional<std::uint64_t> tcp_bytes_taken(int fd) {
  tcp_info ti{};
  socklen_t len = sizeof ti;
  int queued = 0;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_bytes_acked) + sizeof ti.tcpi_bytes_acked || ::ioctl(fd, SIOCOUTQ, &queued) != 0 ||
      queued < 0)
    return std::nullopt;
  return ti.tcpi_bytes_acked + static_cast<std::uint64_t>(queued);
}

}  // namespace kgate::client
