// What the listeners need besides the acceptors: the Unix socket file (made private, a stale
// one replaced, removed at exit), the peer check on it, and the server's TLS context.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "http/net.hpp"

namespace boost::asio::ssl {
class context;
}

namespace kgate::gw {

// $XDG_RUNTIME_DIR/kgate/kgate.sock (that directory made 0700), else <runtime_dir>/kgate.sock.
std::filesystem::path default_unix_socket_path(const std::filesystem::path& runtime_dir);

// A listening Unix stream socket at a path.  listen() checks what is at the path first: nothing
// or a stale socket (connect() is refused: nobody accepts) is fine and replaced; a live socket
// or anything that is not a socket is an error.  The socket file is mode 0600 before it
// accepts anything: bind, chmod, then listen (a connect() before listen() is refused).  The
// file is removed by close() and the destructor, if it is still the one this made.
class UnixListener {
 public:
  explicit UnixListener(net::io_context& ioc) : acceptor_(ioc) {}
  ~UnixListener() { close(); }
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Throws std::runtime_error naming the path and what to do.
  void listen(const std::filesystem::path& path);
  void close();
  bool is_open() const { return acceptor_.is_open(); }
  net::local::stream_protocol::acceptor& acceptor() { return acceptor_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  net::local::stream_protocol::acceptor acceptor_;
  std::filesystem::path path_;
  dev_t dev_ = 0;  // the socket file made by listen(): only that one is removed
  ino_t ino_ = 0;
  bool owned_ = false;
};

// The uid at the other end of a connected Unix socket (SO_PEERCRED; getpeereid on the BSDs);
// nullopt if the system does not say.
std::optional<uid_t> unix_peer_uid(int fd);
// Whether a Unix peer is served: kgate's own uid, or one in `allowed` (root is not implied).
bool unix_peer_allowed(uid_t uid, const std::vector<uid_t>& allowed);

// The server's TLS context (TLS >= 1.2) from a PEM certificate chain and its key.  Throws
// std::runtime_error for an unreadable file, a file that is not PEM, an encrypted key (there is
// no one to ask for the passphrase) or a key that does not match the certificate.
std::shared_ptr<boost::asio::ssl::context> server_tls_context(const std::filesystem::path& certfile,
                                                              const std::filesystem::path& keyfile);

}  // namespace kgate::gw
