// The TCP connection under one of kgate's ZMQ sockets, for the socket options libzmq does not
// expose (SO_RCVLOWAT: io_loop.cpp, iopub batching; DEV.md §3).
#pragma once

#include <cstddef>
#include <string>

namespace kgate {

// A close-on-exec duplicate of the descriptor libzmq holds for a connection it made to
// `ip:port`. An option set through it is set on that connection and on no other: a number
// libzmq closed, and the system then gave to another socket, is never touched. While held it
// keeps the connection's socket open after libzmq closes its own descriptor, so the owner drops
// it whenever it closes the ZMQ socket (KernelManager::Impl::close_sockets).
class TcpUnder {
 public:
  TcpUnder() = default;
  ~TcpUnder();
  TcpUnder(TcpUnder&& o) noexcept;
  TcpUnder& operator=(TcpUnder&& o) noexcept;
  TcpUnder(const TcpUnder&) = delete;
  TcpUnder& operator=(const TcpUnder&) = delete;

  // Looks through this process's descriptors (/proc/self/fd) for an established TCP connection
  // to `ip:port` (a numeric IPv4 or IPv6 address). None (not TCP, not connected yet, an address
  // that is a name): an empty TcpUnder.
  static TcpUnder find(const std::string& ip, int port);

  bool valid() const { return fd_ >= 0; }
  // SO_RCVLOWAT: the connection is readable (to libzmq's I/O thread) only once this many bytes
  // wait, or at once when they already do (Linux wakes its waiters when the mark is lowered).
  // false when the option cannot be set (then this is emptied: the connection is left alone).
  bool set_rcvlowat(int bytes);
  // Bytes waiting in the connection's receive queue, not yet read by libzmq (SIOCINQ); 0 when
  // empty or unknown.
  std::size_t unread() const;
  void reset();

 private:
  explicit TcpUnder(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace kgate
